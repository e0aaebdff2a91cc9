"""Faults with a known cause, for bench/attribution.py and the CI watch test.

Every fault is a context manager: ``with cpu_hog(cpu=1): ...``; it starts its helpers as
child processes (or changes one kernel knob, restored on exit) and stops them on exit, by
their own pid, never by name.

==================  ==================================================  =================
fault               what it does                                        expected cause
==================  ==================================================  =================
cpu_hog             a busy process pinned to the probe CPU, at normal   cpu_contention
                    priority: CFS shares the CPU, the probe is
                    preempted at each slice; or (``burst_ms``) busy
                    in bursts, optionally SCHED_FIFO (``rt_prio``):
                    a periodic task that preempts the probe mid-call
softirq_flood       bursts of a loopback UDP flood whose receive        softirq
                    processing is steered to the probe CPU with RPS
                    (/sys/class/net/lo/queues/rx-0/rps_cpus, restored)
                    while sender and receiver run on the housekeeping
                    CPU. On this kernel (6.18) loopback's netif_rx()
                    honours RPS: NET_RX runs on the probe CPU in IRQ
                    exit after the RPS IPI, interrupting the probe
                    without a context switch (measured: NET_RX
                    count and softirq ticks on the probe CPU, see
                    :func:`softirq_counts`). Bursts (``on_ms`` every
                    ``period_ms``), not a constant flood: a constant
                    one is a level shift that the k × rolling-P50
                    detector absorbs within seconds.
memory_pressure     the probe's own pages are reclaimed: ``hz`` times   page_faults
                    a second process_madvise(MADV_PAGEOUT) on its
                    private anonymous mappings (weights, activations)
                    and file-backed ones (code of numpy, OpenBLAS,
                    TF...), as memory-cgroup or kswapd reclaim would;
                    the probe swaps them back in (major faults, seen
                    in its own getrusage delta). This VM has no swap:
                    the fault adds a swap file for its duration
                    (swapon, removed on exit) — without swap only the
                    file pages not shared with another process (watch
                    maps the same numpy) are reclaimed, and their
                    re-faults from the host's cache are too cheap to
                    make spikes (measured: 0 of 2).
oversubscription    more busy threads than CPUs (2 × online, allowed    cpu_contention
                    on every online CPU: a child would otherwise
                    inherit the caller's affinity — watch pins itself
                    to the housekeeping CPUs — and never reach the
                    probe's)
migration           the probe thread's affinity is flipped between two  migration
                    CPUs at ``hz`` (sched_setaffinity on its tids)
lock_holder         (bench/service.py) a second thread of the service   blocked (S; waker:
                    takes the lock its call path takes, at random       the service, the
                    moments, and holds it ``hold_ms`` asleep: the       holding thread)
                    call thread blocks on the lock's futex until the
                    holder's release wakes it
pipe_late           (service) ``per_s`` calls a second write a request  blocked (S; waker:
                    to a FIFO and block reading the answer from         the helper that
                    another; the kit's helper process answers           writes the pipe)
                    ``hold_ms`` late
sigstop             a helper process sends SIGSTOP to the service (or   stopped (T; sender:
                    any pid: the probe worker too) and SIGCONT          the helper)
                    ``hold_ms`` later, ``per_s`` times a second
sleep_in_call       (service) ``per_s`` calls a second sleep            blocked (S; waker:
                    ``hold_ms`` in the call path (``time.sleep``)       "timer")
idle_wakeup         (service) the service sleeps until each call's      wakeup_latency
                    start (no spin) on its otherwise idle CPU, and      (waker: "timer")
                    ``per_s`` of those sleeps a second carry a timer
                    slack of ``slack_us``: see :func:`idle_wakeup`
weights_pageout     (service ``--mapped-weights``, or a .tflite LiteRT  page_faults (a
                    maps) a helper drops the pages of the file the      fault count:
                    service's weights are mapped from, ``hz`` times a   the pages read
                    second (process_madvise(MADV_PAGEOUT) on that       back)
                    mapping): the next call reads them back in major
                    page faults inside it (getrusage's majflt delta)
smt_sibling_hog     a memory-bound (or busy) helper pinned to the SMT   smt_sibling
                    sibling of the probe CPU (thread_siblings_list),
                    in bursts: the call keeps its CPU and runs slower;
                    "unsupported: no SMT sibling" without SMT
gpu_other_process   (GPU) a second process runs JAX matmuls in bursts   gpu_foreign_process
                    on the same GPU
gpu_long_kernel     (bench/gpu_service.py) ``per_s`` calls a second     gpu_kernel (the
                    run the model on a big device-resident input:       GPU wait part)
                    longer kernels, the caller waits longer
gpu_enqueue_hog     (GPU) the RT burst hog of cpu_hog_rt on the         cpu_contention (the
                    service's CPU: the launches are late                enqueue part)
gpu_big_copy        (gpu_service) ``per_s`` calls a second copy         gpu_copy (the
                    ``--copy-mb`` MiB device-to-host                    copies part)
==================  ==================================================  =================

The GPU faults need JAX and a GPU (:func:`jax_gpu_missing` says why not); gpu_kernel and
gpu_copy are causes of issue #36's GPU split (agent/watch/attribution/gpu_verdict.py).
smt_sibling and the page fault count are issue #35's on-CPU breakdown.

The last five make the service not runnable for a known time (``hold_ms``, default 5 ms,
``per_s`` = 4 times a second at random moments: intervals uniform in 0.5-1.5 × the mean, never
in phase with the call schedule), so each is a spike of its own (> 3 × a P50 of 0.4-1.5 ms).
:data:`EXPECTED_BY` says who the kernel events should name for each (bench/attribution.py's
docstring has the evidence keys it reads). The service's switches are driven through its
control FIFO (bench/service.py's docstring); each fault turns its switch off on exit and
keeps the counts (:class:`Injected`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

EXPECTED = {"cpu_hog": "cpu_contention", "cpu_hog_rt": "cpu_contention",
            "softirq_flood": "softirq",
            "memory_pressure": "page_faults", "oversubscription": "cpu_contention",
            "migration": "migration",
            "lock_holder": "blocked", "pipe_late": "blocked", "sigstop": "stopped",
            "sleep_in_call": "blocked", "idle_wakeup": "wakeup_latency",
            "weights_pageout": "page_faults", "smt_sibling_hog": "smt_sibling",
            "gpu_other_process": "gpu_foreign_process", "gpu_long_kernel": "gpu_kernel",
            "gpu_enqueue_hog": "cpu_contention", "gpu_big_copy": "gpu_copy"}

# Who the kernel events should name as the end of each not-runnable stretch: the waker
# (sched_waking's task) or the sender of the stopping signal (signal_generate's), as
# ("waker" | "sender", whom, the state the call thread left the CPU in). ``whom``: "service"
# (the service's own process: the thread that held the lock), "helper" (the kit's helper
# process), "timer" (an hrtimer expiry: no task woke it; the waking runs in the timer's
# interrupt on the sleeper's CPU, which was idle).
EXPECTED_BY = {"lock_holder": ("waker", "service", "S"), "pipe_late": ("waker", "helper", "S"),
               "sigstop": ("sender", "helper", "T"), "sleep_in_call": ("waker", "timer", "S"),
               "idle_wakeup": ("waker", "timer", "S")}
# the faults that need bench/service.py's switches (sigstop takes any pid)
SERVICE_FAULTS = ("lock_holder", "pipe_late", "sleep_in_call", "idle_wakeup",
                  "weights_pageout")
# the faults of bench/gpu_service.py (bench/attribution.py --gpu): JAX and a GPU
GPU_FAULTS = ("gpu_other_process", "gpu_long_kernel", "gpu_enqueue_hog", "gpu_big_copy")

_HOG = "import os,sys\nif sys.argv[1]: os.sched_setaffinity(0,[int(c) for c in " \
       "sys.argv[1].split(',')])\nos.setpriority(os.PRIO_PROCESS,0,int(sys.argv[2]))\nx=0\nwhile True:\n    x+=1\n"
# Busy ``busy_ms`` of every ``period_ms``: a freshly woken task that EEVDF lets preempt the
# probe (a hog that never sleeps has no lag credit left and rarely wins against it).
# The sleep between bursts is jittered ±20 % so the bursts never lock in phase with the
# probe's schedule (a locked phase gives all or no spikes for seconds).
# With an RT priority (argv[5] > 0) the hog is SCHED_FIFO: each burst preempts the probe at
# once if it is mid-call (a real-time periodic task — an RT daemon, a threaded IRQ handler —
# on the probe CPU), instead of depending on EEVDF's wake-up placement.
_BURST_HOG = "import os,sys,time\nos.sched_setaffinity(0,[int(c) for c in sys.argv[1].split(',')])" \
    "\nos.setpriority(os.PRIO_PROCESS,0,int(sys.argv[2]))\nb,p=float(sys.argv[3])/1e3,float(sys.argv[4])/1e3\n" \
    "rt=int(sys.argv[5]) if len(sys.argv)>5 else 0\n" \
    "if rt: os.sched_setscheduler(0,os.SCHED_FIFO,os.sched_param(rt))\n" \
    "import random\nc=time.monotonic\nwhile True:\n    e=c()+b\n    while c()<e: pass\n" \
    "    time.sleep((p-b)*random.uniform(0.8,1.2))\n"


def _spawn_hog(cpus: str | None, nice: int = 0, burst: tuple[float, float] | None = None,
               rt_prio: int = 0) -> subprocess.Popen:
    if burst is not None:
        return subprocess.Popen([sys.executable, "-c", _BURST_HOG, cpus or "", str(nice),
                                 str(burst[0]), str(burst[1]), str(rt_prio)])
    if rt_prio:
        raise ValueError("an RT hog must be a burst hog (an always-busy one starves the CPU)")
    return subprocess.Popen([sys.executable, "-c", _HOG, cpus or "", str(nice)])


def rt_burst_for(p50_ms: float) -> tuple[float, float]:
    """(busy, period) ms of the periodic RT hog for a probe whose calls take ``p50_ms``.

    A SCHED_FIFO burst that starts mid-call delays the call by the whole burst, so the call
    is a spike (> 3 × P50) only when the burst exceeds 2 × P50: 3 × P50 (at least 1.5 ms)
    makes every overlapping burst one, whatever the host's speed (the numpy probe's P50 is
    0.38 ms on one dev VM host and 1.5 ms on another). The period keeps the hog at ~20 % of
    the CPU and is not a multiple of the probe's 2 ms period."""
    b = max(1.5, 3.0 * float(p50_ms))
    return round(b, 3), round(b * 4.87, 3)


def numpy_probe_p50_ms(cpu: int, calls: int = 300) -> float:
    """Median ms of the watch numpy probe's call on ``cpu`` (a child pinned there), paced at
    500 Hz as watch paces it (back-to-back calls run up to 1.6× faster: warm caches)."""
    code = ("import os,sys,time\nos.sched_setaffinity(0,[int(sys.argv[1])])\n"
            "from agent.watch.probe_worker import build_numpy_probe\n"
            "fn,_=build_numpy_probe()\nfor _ in range(50): fn()\nt=[]\n"
            "n=time.perf_counter_ns()\nfor _ in range(int(sys.argv[2])):\n"
            " n+=2_000_000\n while time.perf_counter_ns()<n-300_000: time.sleep(0.0002)\n"
            " a=time.perf_counter_ns(); fn(); t.append(time.perf_counter_ns()-a)\n"
            "t.sort(); print(t[len(t)//2]/1e6)")
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code, str(cpu), str(calls)], cwd=root,
                         capture_output=True, text=True, check=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=root))
    return float(out.stdout.split()[-1])


_RT_OK: bool | None = None


def rt_permitted() -> bool:
    """Whether a child may switch itself to SCHED_FIFO: tried once, in a child (root alone
    is not enough in a container without CAP_SYS_NICE, or under a cgroup with no RT
    runtime — the RT hog then died at once and its fault ran with no fault)."""
    global _RT_OK
    if _RT_OK is None:
        code = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
        _RT_OK = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                timeout=30).returncode == 0
    return _RT_OK


def _alive(procs: list[subprocess.Popen], what: str) -> None:
    """Raise when a fault helper died right after its start (the fault would not run)."""
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            _stop(procs)
            raise RuntimeError(f"{what}: helper pid {dead[0].pid} exited at once "
                               f"(status {dead[0].returncode})")
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def cpu_hog(cpu: int, nice: int = 0, count: int = 1,
            burst_ms: tuple[float, float] | None = None, rt_prio: int = 0
            ) -> Iterator[list[int]]:
    """``count`` busy-loop processes pinned to ``cpu`` at ``nice``; with ``burst_ms``
    (busy, period) each is busy ``busy`` ms of every ``period`` ms instead of always; with
    ``rt_prio`` (burst only) each runs SCHED_FIFO at that priority."""
    procs = [_spawn_hog(str(cpu), nice, burst_ms, rt_prio) for _ in range(count)]
    _alive(procs, "cpu_hog")
    try:
        yield [p.pid for p in procs]
    finally:
        _stop(procs)


def preempting_hog(probe_cpu: int):
    """(context manager, minimum spikes to expect in a few seconds) of the CPU-contention
    fault the watch tests use: a periodic hog on the probe CPU, busy 3 × the numpy probe's
    P50 on this host (at least 1.5 ms) of every ~4.9 × that, jittered (never a multiple of
    the probe's 2 ms period, so the two never lock in phase). SCHED_FIFO where permitted:
    every burst that starts while the probe is mid-call preempts it at once and delays it by
    the whole burst, a spike however fast or slow the host is (the probe's P50 was 0.38 ms
    on one 2-vCPU VM and 1.5 ms on another, where a fixed 1.5 ms burst gave 3 spikes in
    20 s). An always-busy nice 0 hog depends on EEVDF's wake-up placement: 0-7 spikes in
    8 s where the probe mostly sleeps, and none in 3 s on one CI host. Without RT
    permission: the same bursts at nice -10."""
    burst = rt_burst_for(numpy_probe_p50_ms(probe_cpu))
    if rt_permitted():
        return cpu_hog(probe_cpu, burst_ms=burst, rt_prio=1), 15
    return cpu_hog(probe_cpu, nice=-10, burst_ms=burst), 5


@contextlib.contextmanager
def oversubscription(threads: int | None = None, nice: int = 0) -> Iterator[list[int]]:
    """``threads`` (default 2 × CPUs) unpinned busy processes."""
    n = threads or 2 * (os.cpu_count() or 1)
    from collectors.host import Host
    from collectors.parsers import parse_cpulist
    host = Host()
    online = host.read(host.sys("devices", "system", "cpu", "online"))
    cpus = parse_cpulist(online.value.strip()) if online.ok else range(os.cpu_count() or 1)
    every = ",".join(str(c) for c in cpus)
    procs = [_spawn_hog(every, nice) for _ in range(n)]
    _alive(procs, "oversubscription")
    try:
        yield [p.pid for p in procs]
    finally:
        _stop(procs)


_FLOOD = r"""
import os, socket, sys, time
os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')])
port = int(sys.argv[2])
if sys.argv[3] == "rx":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.bind(("127.0.0.1", port))
    while True:
        s.recv(2048)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    msg = b"x" * int(sys.argv[4])
    on_s, period_s = float(sys.argv[5]) / 1e3, float(sys.argv[6]) / 1e3
    clock = time.monotonic
    while True:
        t_end = clock() + on_s
        while clock() < t_end:
            for _ in range(64):
                try:
                    s.sendto(msg, ("127.0.0.1", port))
                except OSError:
                    pass
        if period_s > on_s:
            time.sleep(period_s - on_s)
"""


def softirq_counts(cpus: int = 0) -> dict[str, list[int]]:
    """NET_RX / NET_TX rows of /proc/softirqs (per CPU) and the softirq ticks of /proc/stat:
    what the flood's check compares before/after."""
    out: dict[str, list[int]] = {}
    for line in Path("/proc/softirqs").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        if name.strip() in ("NET_RX", "NET_TX"):
            out[name.strip()] = [int(x) for x in rest.split()]
    ticks = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3] != " ":
            ticks.append(int(line.split()[7]))
    out["softirq_ticks"] = ticks
    return out


@contextlib.contextmanager
def softirq_flood(probe_cpu: int, housekeeping_cpu: int, port: int = 39555,
                  size: int = 1024, senders: int = 1, on_ms: float = 40.0,
                  period_ms: float = 250.0) -> Iterator[list[int]]:
    """Bursts of a loopback UDP flood (``on_ms`` of every ``period_ms``) with receive
    softirqs steered to ``probe_cpu`` by RPS (needs root and CONFIG_RPS; restores rps_cpus on
    exit). Sender and receiver stay on ``housekeeping_cpu``: what reaches the probe CPU is the
    softirq work only, not a competing task."""
    rps = Path("/sys/class/net/lo/queues/rx-0/rps_cpus")
    old = rps.read_text().strip()
    rps.write_text(format(1 << probe_cpu, "x"))
    hk = str(housekeeping_cpu)
    procs = [subprocess.Popen([sys.executable, "-c", _FLOOD, hk, str(port), "rx"])]
    time.sleep(0.2)
    procs += [subprocess.Popen([sys.executable, "-c", _FLOOD, hk, str(port), "tx", str(size),
                                str(on_ms), str(period_ms)]) for _ in range(senders)]
    try:
        yield [p.pid for p in procs]
    finally:
        _stop(procs)
        rps.write_text(old)


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


@contextlib.contextmanager
def migration(pid: int, cpus: tuple[int, int], hz: float = 20.0) -> Iterator[list[int]]:
    """Flip the affinity of every thread of ``pid`` between ``cpus[0]`` and ``cpus[1]`` at
    ``hz``; the original affinity is restored on exit."""
    stop = threading.Event()
    orig = {t: os.sched_getaffinity(t) for t in _tids(pid)}

    def flip() -> None:
        i = 0
        while not stop.wait(1.0 / hz):
            i += 1
            for t in _tids(pid):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(t, [cpus[i % 2]])
    th = threading.Thread(target=flip, daemon=True)
    th.start()
    try:
        yield []
    finally:
        stop.set()
        th.join()
        for t, a in orig.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(t, a)


# -- not runnable for a known time: the service's switches and two helpers --------------------


class ServiceLike(Protocol):
    """What the service faults drive: bench/service.py's :class:`Service` handle."""

    pid: int
    dir: Path

    def command(self, line: str, timeout: float = 10.0) -> dict: ...


class Injected(list):
    """What the not-runnable faults yield: their helpers' pids (a list, as every fault
    yields) and ``info``: the fault's settings, who the events should name (``service_pid``,
    ``holder_tid``, the helper's pid) and, once the fault has ended, ``injected`` (the stalls
    it made: counted by the service's switch or the helper) or ``error``."""

    def __init__(self, pids: list[int] | tuple[int, ...] = (), **info: object) -> None:
        super().__init__(pids)
        self.info: dict = dict(info)


# Each helper: pinned to argv[1] (a CPU list, "" to inherit), "ready" on stdout once set up,
# "injected N" on stdout when SIGTERM ends it, and gone by itself when its parent is (a
# getppid() check each round: PR_SET_PDEATHSIG would fire when the *thread* that started it
# ends, and bench/attribution.py starts faults from a short-lived thread).
_HELPER_HEAD = """import os, random, select, signal, sys, time
if sys.argv[1]: os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')])
parent, n, stopped = os.getppid(), 0, False
"""
# SIGSTOP, ``hold`` s, SIGCONT, at random moments ``per_s`` times a second. Leaving (SIGTERM,
# the parent gone) continues the target first when it is stopped.
_STOPPER = _HELPER_HEAD + """pid, hold = int(sys.argv[2]), float(sys.argv[3]) / 1e3
per_s = float(sys.argv[4])
def leave(*_):
    if stopped:
        try: os.kill(pid, signal.SIGCONT)
        except ProcessLookupError: pass
    print("injected", n, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, leave)
print("ready", flush=True)
try:
    while os.getppid() == parent:
        time.sleep(random.uniform(0.5, 1.5) / per_s)
        stopped = True  # before the signal: a SIGTERM right after it still continues it
        os.kill(pid, signal.SIGSTOP)
        time.sleep(hold)
        os.kill(pid, signal.SIGCONT)
        stopped = False
        n += 1
except ProcessLookupError:
    pass
leave()
"""
# The other end of the service's pipe switch: read a request from FIFO argv[2], answer it on
# FIFO argv[3] ``hold`` s later. Both opened O_RDWR, which never waits for the other end
# (fifo(7)), so the service finds a reader and a writer there when it opens its ends.
_ANSWER_LATE = _HELPER_HEAD + """req, rsp, hold = sys.argv[2], sys.argv[3], float(sys.argv[4]) / 1e3
r = os.open(req, os.O_RDWR | os.O_NOFOLLOW)
w = os.open(rsp, os.O_RDWR | os.O_NOFOLLOW)
stop = []
def leave():
    print("injected", n, flush=True)
    os._exit(0)
# SIGTERM ends the loop after the answer in hand and any request already asked: a call the
# service made just before its switch went off is answered, not left to a broken pipe
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
while os.getppid() == parent:
    if not select.select([r], [], [], 0 if stop else 0.5)[0]:
        if stop:
            break
        continue
    k = len(os.read(r, 64))
    time.sleep(hold)
    os.write(w, b"!" * k)
    n += k
leave()
"""


def _start_helper(code: str, cpu: int | None, args: list[str], what: str,
                  timeout: float = 30.0) -> subprocess.Popen:
    """Start a helper and wait for its "ready" line (raises RuntimeError when it dies or
    does not say it in ``timeout``; :class:`Unsupported` when it says "unsupported: WHY").
    A helper that says "error: WHY" instead has WHY in the error."""
    p = subprocess.Popen([sys.executable, "-c", code, "" if cpu is None else str(cpu), *args],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    import select
    said = ""
    if select.select([p.stdout], [], [], timeout)[0]:
        said = p.stdout.readline().strip()
        if said == "ready":
            return p
    _stop([p])
    if said.startswith("unsupported: "):
        raise Unsupported(f"{what}: {said}")
    why = f": {said.removeprefix('error: ')}" if said.startswith("error: ") else ""
    raise RuntimeError(f"{what}: helper pid {p.pid} did not start (status {p.returncode})"
                       f"{why}")


def _stop_said(p: subprocess.Popen) -> dict[str, int] | None:
    """Stop a helper (SIGTERM, by its pid) and return what its "injected N [KEY V]..." line
    said ({"injected": N, KEY: V...}; None: killed, it said nothing)."""
    _stop([p])
    out = p.stdout.read() if p.stdout else ""
    if p.stdout:
        p.stdout.close()
    for line in out.splitlines():
        if line.startswith("injected "):
            words = line.split()
            return {k: int(v) for k, v in zip(words[::2], words[1::2])}
    return None


def _stop_counted(p: subprocess.Popen) -> int | None:
    """Stop a helper (SIGTERM, by its pid) and return the count it printed (None: killed)."""
    said = _stop_said(p)
    return None if said is None else said["injected"]


def _switch(service: ServiceLike, kind: str, settings: str, count: str, inj: Injected
            ) -> contextlib.AbstractContextManager:
    """Turn the service's ``kind`` switch on with ``settings``; on exit turn it off and put
    the stalls it made (the ``count`` it answers with, less its value before) in ``inj``."""
    @contextlib.contextmanager
    def run() -> Iterator[Injected]:
        on = service.command(f"{kind} {settings}")
        inj.info.update({k: v for k, v in on.items() if k == "holder_tid"})
        try:
            yield inj
        finally:
            try:
                off = service.command(f"{kind} off")
                inj.info["injected"] = off[count] - on[count]
            except RuntimeError as exc:  # the service is gone: nothing left to turn off
                inj.info["error"] = str(exc)
    return run()


def lock_holder(service: ServiceLike, hold_ms: float = 5.0, per_s: float = 4.0
                ) -> contextlib.AbstractContextManager[Injected]:
    """A thread of the service's own process holds the lock its call path takes, ``hold_ms``
    at a time, ``per_s`` times a second at random moments (a model lock held by a reloader,
    a GIL-like handover). Expected: blocked (S, futex), woken by the holding thread
    (``info["holder_tid"]``) of the same process."""
    inj = Injected(service_pid=service.pid, hold_ms=hold_ms, per_s=per_s)
    return _switch(service, "lock", f"{hold_ms:g} {per_s:g}", "lock_holds", inj)


def sleep_in_call(service: ServiceLike, hold_ms: float = 5.0, per_s: float = 4.0
                  ) -> contextlib.AbstractContextManager[Injected]:
    """``per_s`` calls a second sleep ``hold_ms`` in the service's call path (a retry
    back-off, a rate limiter's sleep). Expected: blocked (S, hrtimer_nanosleep), woken by its
    timer: no task is the waker."""
    inj = Injected(service_pid=service.pid, hold_ms=hold_ms, per_s=per_s)
    return _switch(service, "sleep", f"{hold_ms:g} {per_s:g}", "sleeps", inj)


def idle_wakeup(service: ServiceLike, slack_us: float = 5000.0, per_s: float = 4.0
                ) -> contextlib.AbstractContextManager[Injected]:
    """The service sleeps until each call's intended start (no spin before it), so the
    wake-up of its CPU from idle lies inside every call; ``per_s`` of those sleeps a second
    carry a timer slack of ``slack_us`` (``prctl(PR_SET_TIMERSLACK)``): the kernel may fire
    the timer anywhere in [expiry, expiry + slack] and, on a CPU with nothing else to do
    (NO_HZ idle: no tick), fires it at the end, so the call starts ``slack_us`` late while
    its CPU idles. Expected: wakeup_latency — the thread slept since *before* the call's
    intended start and was woken by its timer (no task) after it; the CPU idle in between.

    What it shows: a late wake-up of an idle CPU of a known size (timer slack is a real one:
    50 µs by default, more under systemd's ``TimerSlackNSec=`` or a cgroup's
    ``timer_slack_ns``). What it cannot: the exit latency of a deep C-state. Under a
    hypervisor whose guest idles in HLT (cpuidle driver ``none`` or ``haltpoll``) the idle
    exit is the host's wake-up of the vCPU, not under the kit's control; the kit removes the
    spin so that it is in the samples, but its size is the host's. With ``slack_us=0`` only
    that natural wake-up latency remains (a few spikes, if any). On a CPU that is busy with
    another task the tick expires the timer early (within 1/HZ): the slack, and so the
    spikes, shrink."""
    inj = Injected(service_pid=service.pid, slack_us=slack_us, per_s=per_s)
    return _switch(service, "idle", f"{slack_us:g} {per_s:g}", "slack_sleeps", inj)


@contextlib.contextmanager
def pipe_late(service: ServiceLike, hold_ms: float = 5.0, per_s: float = 4.0,
              cpu: int | None = None) -> Iterator[Injected]:
    """``per_s`` calls a second of the service send a request through a FIFO and block
    reading the answer (a feature lookup in another process); the kit's helper (pinned to
    ``cpu``) answers each ``hold_ms`` late. Expected: blocked (S, pipe_read), woken by the
    helper's write (its pid is the one yielded)."""
    p = _start_helper(_ANSWER_LATE, cpu, [str(service.dir / "req"), str(service.dir / "rsp"),
                                          str(hold_ms)], "pipe_late")
    inj = Injected([p.pid], service_pid=service.pid, hold_ms=hold_ms, per_s=per_s)
    try:
        with _switch(service, "pipe", f"{per_s:g}", "pipe_asks", inj):
            yield inj
    finally:
        # (the switch is off first: the service asks no more, so none waits on a gone helper)
        inj.info["answered"] = _stop_counted(p)


@contextlib.contextmanager
def sigstop(pid: int, hold_ms: float = 5.0, per_s: float = 4.0, cpu: int | None = None
            ) -> Iterator[Injected]:
    """A helper process (pinned to ``cpu``) sends SIGSTOP to ``pid`` and SIGCONT ``hold_ms``
    later, ``per_s`` times a second at random moments (a debugger, a job-control stop, a
    checkpointer freezing it). Nothing inside the target: any pid works (the service, watch's
    probe worker). Expected: stopped (T), the signal's sender the helper (its pid is the one
    yielded). On exit the helper continues a target it left stopped; one that had to be
    killed is continued from here."""
    p = _start_helper(_STOPPER, cpu, [str(pid), str(hold_ms), str(per_s)], "sigstop")
    inj = Injected([p.pid], target_pid=pid, hold_ms=hold_ms, per_s=per_s)
    try:
        yield inj
    finally:
        inj.info["injected"] = n = _stop_counted(p)
        if n is None:  # killed, maybe between its SIGSTOP and SIGCONT
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


_SYS_PIDFD_OPEN = 434  # x86_64 and the generic table
_SYS_PROCESS_MADVISE = 440
MADV_PAGEOUT = 21


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _mappings(pid: int, anon: bool = True) -> list[tuple[int, int]]:
    """(start, length) of the process's file-backed mappings (shared libraries, the
    interpreter) and, with ``anon``, its private writable anonymous ones (heap, stack, the
    arrays numpy and TF allocate), from /proc/PID/maps."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        name = parts[5].strip() if len(parts) > 5 else ""
        if name.startswith("/") and not name.startswith("/dev/"):
            pass  # a file mapping
        elif not (anon and parts[1][1] == "w" and parts[1][3] == "p"
                  and (name == "" or name in ("[heap]", "[stack]"))):
            continue
        a, b = (int(x, 16) for x in parts[0].split("-"))
        out.append((a, b - a))
    return out


def pageout(pid: int, anon: bool = True) -> int:
    """process_madvise(MADV_PAGEOUT) over the file-backed (and, with ``anon``, the private
    anonymous) mappings of ``pid`` (Linux ≥ 5.10, root / CAP_SYS_NICE). Pages mapped only by
    ``pid`` are reclaimed — anonymous ones only where there is swap; it faults them back in.
    Returns the bytes the kernel processed."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"pidfd_open({pid})")
    try:
        done = 0
        maps = _mappings(pid, anon)
        for i in range(0, len(maps), 512):  # IOV_MAX is 1024
            chunk = maps[i:i + 512]
            iov = (_Iovec * len(chunk))(*[_Iovec(a, n) for a, n in chunk])
            r = libc.syscall(_SYS_PROCESS_MADVISE, fd, iov, len(chunk), MADV_PAGEOUT, 0)
            if r < 0:
                err = ctypes.get_errno()
                if err in (errno.EINVAL, errno.ENOMEM):  # a mapping vanished: next round
                    continue
                raise OSError(err, "process_madvise(MADV_PAGEOUT)")
            done += r
        return done
    finally:
        os.close(fd)


def swap_total_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def swap_file(size_mb: int = 256, directory: str = "/var/tmp") -> Iterator[str | None]:
    """A swap file for the duration (root, CONFIG_SWAP, a block-backed ``directory``): what a
    box that pages under memory pressure has and this VM has not. Yields its path, or None
    when swap is already on (nothing to add); swapoff + delete on exit. Raises OSError when
    it cannot be set up."""
    if swap_total_kb() > 0:
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="hftagent-fault-", suffix=".swap", dir=directory)
    os.close(fd)
    try:
        os.chmod(path, 0o600)
        for cmd in (["fallocate", "-l", f"{size_mb}M", path], ["mkswap", path],
                    ["swapon", path]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise OSError(errno.EPERM, f"{' '.join(cmd[:1])}: {r.stderr.strip()}")
    except BaseException:
        os.unlink(path)
        raise
    try:
        yield path
    finally:
        subprocess.run(["swapoff", path], capture_output=True)
        os.unlink(path)


@contextlib.contextmanager
def memory_pressure(pid: int, hz: float = 4.0, swap: bool = True) -> Iterator[list[int]]:
    """Reclaim the pages of ``pid`` ``hz`` times a second (see :func:`pageout`): what
    memory-cgroup or kswapd reclaim does to an inference process on a box short of memory,
    without putting the rest of the machine under pressure. Its anonymous working set (the
    model's weights, activations) goes to swap — a swap file is added for the duration when
    the box has none (``swap``) — and its code pages back to the page cache; the process takes
    major faults (swap-ins) as it runs again."""
    with contextlib.ExitStack() as stack:
        if swap:
            stack.enter_context(swap_file())
        pageout(pid)  # fails here, before the run, without root or process_madvise
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(1.0 / hz):
                with contextlib.suppress(OSError):
                    pageout(pid)
        th = threading.Thread(target=loop, daemon=True)
        th.start()
        try:
            yield []
        finally:
            stop.set()
            th.join()


def thread_cpu_and_migrations(pid: int) -> dict[int, tuple[int, int | None]]:
    """tid → (last CPU from /proc/PID/task/TID/stat field 39, se.nr_migrations from
    /proc/PID/task/TID/sched or None without CONFIG_SCHED_DEBUG): the migration fault's
    check."""
    out: dict[int, tuple[int, int | None]] = {}
    for t in _tids(pid):
        d = Path(f"/proc/{pid}/task/{t}")
        try:
            stat = (d / "stat").read_text()
            cpu = int(stat[stat.rfind(")") + 2:].split()[36])
        except (OSError, ValueError, IndexError):
            continue
        mig = None
        with contextlib.suppress(OSError, ValueError):
            for line in (d / "sched").read_text().splitlines():
                if line.startswith("se.nr_migrations"):
                    mig = int(line.split(":")[1])
        out[t] = (cpu, mig)
    return out


def udp_port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


# -- on-CPU faults (issue #35): page faults inside the call, a busy SMT sibling ----------------


class Unsupported(RuntimeError):
    """The fault cannot run on this box (one line: "FAULT: unsupported: WHY"): no SMT
    sibling, no GPU for JAX. Not an error of the run: the bench reports it and goes on."""


PAGE = os.sysconf("SC_PAGE_SIZE")


def file_mappings(pid: int, path: str, host: object | None = None) -> list[tuple[int, int]]:
    """(start, length) of the mappings of the file ``path`` in process ``pid``, from
    /proc/PID/maps through the Host (also once the file is unlinked: maps then says
    "PATH (deleted)")."""
    from collectors.host import Host
    h = host or Host()
    r = h.read(h.proc(pid, "maps"))
    if not r.ok:
        raise OSError(errno.ESRCH, f"/proc/{pid}/maps: {r.reason}")
    out = []
    for line in r.value.splitlines():
        parts = line.split(None, 5)
        if len(parts) > 5 and parts[5].strip() in (path, f"{path} (deleted)"):
            a, b = (int(x, 16) for x in parts[0].split("-"))
            out.append((a, b - a))
    return out


def resident_pages(pid: int, maps: list[tuple[int, int]], host: object | None = None) -> int:
    """How many pages of ``maps`` are present in ``pid``'s page tables: bit 63 of each
    /proc/PID/pagemap entry (Documentation/admin-guide/mm/pagemap.rst; readable by root, the
    present bit also without CAP_SYS_ADMIN since Linux 4.2)."""
    from collectors.host import Host
    h = host or Host()
    fd = os.open(h.proc(pid, "pagemap"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        n = 0
        for a, length in maps:
            data = os.pread(fd, length // PAGE * 8, a // PAGE * 8)
            n += sum(1 for i in range(7, len(data), 8) if data[i] & 0x80)
        return n
    finally:
        os.close(fd)


def _pageout_ranges(pid: int, maps: list[tuple[int, int]]) -> int:
    """process_madvise(MADV_PAGEOUT) over ``maps`` of ``pid`` (see :func:`pageout`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"pidfd_open({pid})")
    try:
        iov = (_Iovec * len(maps))(*[_Iovec(a, n) for a, n in maps])
        r = libc.syscall(_SYS_PROCESS_MADVISE, fd, iov, len(maps), MADV_PAGEOUT, 0)
        if r < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_madvise(MADV_PAGEOUT): {os.strerror(err)}")
        return r
    finally:
        os.close(fd)


def weights_pageout_main(argv: list[str]) -> None:
    """The weights_pageout helper (a child process: ``CPU PID PATH HZ``): drops the pages of
    PID's mappings of PATH at random moments HZ times a second (intervals uniform in 0.5-1.5 ×
    1 / HZ) and counts the rounds that dropped any ("injected N pages M" when SIGTERM ends it;
    gone with its parent). process_madvise(MADV_PAGEOUT) on a file mapping unmaps the pages
    and frees the clean ones from the page cache (Linux ≥ 5.10; a file page only for a caller
    that may write the file or owns it, e.g. root: can_do_file_pageout), so the target's next
    read of them is a major fault (the file read again; readahead brings its neighbours, which
    fault-around maps as minor faults)."""
    import random
    if argv[0]:
        os.sched_setaffinity(0, [int(c) for c in argv[0].split(",")])
    pid, path, hz = int(argv[1]), argv[2], float(argv[3])
    parent, done = os.getppid(), {"n": 0, "pages": 0}

    def leave(*_: object) -> None:
        print(f"injected {done['n']} pages {done['pages']}", flush=True)
        os._exit(0)
    try:
        maps = file_mappings(pid, path)
        if not maps:
            print(f"error: process {pid} maps no file {path}", flush=True)
            return
        _pageout_ranges(pid, maps)  # fails here, before "ready", without root
    except OSError as exc:
        print(f"error: {exc.strerror or exc}", flush=True)
        return
    signal.signal(signal.SIGTERM, leave)
    print("ready", flush=True)
    while os.getppid() == parent:
        time.sleep(random.uniform(0.5, 1.5) / hz)
        try:
            before = resident_pages(pid, maps)
            _pageout_ranges(pid, maps)
            dropped = before - resident_pages(pid, maps)
        except OSError:  # the target is gone
            break
        if dropped > 0:
            done["n"] += 1
            done["pages"] += dropped
    leave()


_PAGEOUT = ("import sys\nsys.path.insert(0, sys.argv[-1])\n"
            "from bench.faults.kit import weights_pageout_main\n"
            "weights_pageout_main(sys.argv[1:-1])\n")
ROOT = str(Path(__file__).resolve().parents[2])


@contextlib.contextmanager
def weights_pageout(pid: int, path: str, hz: float = 4.0, cpu: int | None = None
                    ) -> Iterator[Injected]:
    """The pages of ``pid``'s mapping of the file ``path`` (the model weights it reads in
    every call: bench/service.py ``--mapped-weights``, or the .tflite LiteRT maps) dropped
    ``hz`` times a second by a helper process pinned to ``cpu`` (:func:`weights_pageout_main`),
    as reclaim drops the clean file pages of a process on a box short of memory. The next
    call reads them back: page faults inside the call (major: the file read again; minor:
    the pages readahead brought in), counted by the service's own getrusage deltas.
    Expected: page_faults, with a fault count. Needs root (process_madvise on another
    process, a file page) and a block-backed file (tmpfs pages without swap stay).
    ``info["injected"]``: rounds that dropped pages, ``info["pages"]``: pages dropped."""
    p = _start_helper(_PAGEOUT, cpu, [str(pid), path, f"{hz:g}", ROOT], "weights_pageout")
    inj = Injected([p.pid], target_pid=pid, weights=path, hz=hz)
    try:
        yield inj
    finally:
        said = _stop_said(p) or {}
        inj.info["injected"], inj.info["pages"] = said.get("injected"), said.get("pages")


def smt_siblings(cpu: int, host: object | None = None) -> list[int]:
    """The other hardware threads of ``cpu``'s core (sysfs
    devices/system/cpu/cpuN/topology/thread_siblings_list, through the Host; ``lscpu -e``'s
    CORE column): [] without SMT, or where the file is missing."""
    from collectors.host import Host
    from collectors.parsers import parse_cpulist
    h = host or Host()
    r = h.read(h.sys("devices", "system", "cpu", f"cpu{cpu}", "topology",
                     "thread_siblings_list"))
    try:
        return sorted(set(parse_cpulist(r.value.strip())) - {cpu}) if r.ok else []
    except ValueError:
        return []


# Busy ``on`` s of every ``period`` s (jittered ±20 %), on the CPU it is pinned to: a Python
# loop (the integer units) or, with argv[2] == "1", numpy copies over 2 × 16 MiB (loads and
# stores that miss the L1/L2 the two hardware threads share, and the memory bandwidth).
_SMT_HOG = _HELPER_HEAD + """memory, on, period = sys.argv[2] == "1", float(sys.argv[3]) / 1e3, \\
    float(sys.argv[4]) / 1e3
if memory:
    import numpy as np
    a, b = np.ones(4 << 20, np.float32), np.empty(4 << 20, np.float32)
def leave(*_):
    print("injected", n, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, leave)
print("ready", flush=True)
clock, x = time.monotonic, 0
while os.getppid() == parent:
    end = clock() + on
    while clock() < end:
        if memory:
            np.copyto(b, a)
        else:
            x += 1
    n += 1
    time.sleep(max(0.0, period - on) * random.uniform(0.8, 1.2))
leave()
"""


@contextlib.contextmanager
def smt_sibling_hog(cpu: int, memory: bool = True, on_ms: float = 40.0,
                    period_ms: float = 250.0, host: object | None = None
                    ) -> Iterator[Injected]:
    """A helper pinned to the SMT sibling of ``cpu`` (the other hardware thread of its core:
    :func:`smt_siblings`), busy ``on_ms`` of every ``period_ms`` (jittered), memory-bound
    (``memory``: numpy copies) or a plain busy loop: the probe keeps its CPU but shares the
    core's execution units, L1/L2 and memory bandwidth, so its calls run slower without
    leaving the CPU. Bursts, not a constant load: a constant one is a level shift the
    rolling-P50 detector absorbs. Expected: smt_sibling (what ran on the sibling during the
    call). Raises :class:`Unsupported` ("unsupported: no SMT sibling of CPU N") where the
    core has one thread. ``info["injected"]``: bursts run; ``info["sibling"]``: its CPU."""
    sib = smt_siblings(cpu, host)
    if not sib:
        raise Unsupported(f"smt_sibling_hog: unsupported: no SMT sibling of CPU {cpu}")
    p = _start_helper(_SMT_HOG, sib[0], ["1" if memory else "0", f"{on_ms:g}",
                                         f"{period_ms:g}"], "smt_sibling_hog")
    inj = Injected([p.pid], cpu=cpu, sibling=sib[0], memory=memory, on_ms=on_ms,
                   period_ms=period_ms)
    try:
        yield inj
    finally:
        inj.info["injected"] = _stop_counted(p)


# -- GPU faults (issue #36): bench/gpu_service.py's switches and a second GPU process ---------


def gpu_long_kernel(service: ServiceLike, per_s: float = 4.0
                    ) -> contextlib.AbstractContextManager[Injected]:
    """``per_s`` calls a second of bench/gpu_service.py run its model on the big input (rows
    ``--big-batch``, resident on the device): the same launches, kernels that run longer, so
    the caller waits longer for the GPU. Expected: gpu_kernel (the GPU wait part)."""
    inj = Injected(service_pid=service.pid, per_s=per_s)
    return _switch(service, "kernel", f"{per_s:g}", "big_inputs", inj)


def gpu_big_copy(service: ServiceLike, per_s: float = 4.0
                 ) -> contextlib.AbstractContextManager[Injected]:
    """``per_s`` calls a second of bench/gpu_service.py also copy ``--copy-mb`` MiB from the
    device to pageable host memory. Expected: gpu_copy (a slow copy)."""
    inj = Injected(service_pid=service.pid, per_s=per_s)
    return _switch(service, "copy", f"{per_s:g}", "big_copies", inj)


# A second process on the same GPU: JAX matmuls of [size, size] busy ``on`` s of every
# ``period`` s (jittered ±20 %), each burst's kernels queued back to back and waited for.
# Its device memory is not preallocated (XLA_PYTHON_CLIENT_PREALLOCATE=false): the service's
# JAX holds its own. "unsupported: ..." when JAX or its GPU is missing.
_GPU_OTHER = _HELPER_HEAD + """size, on, period = int(sys.argv[2]), float(sys.argv[3]) / 1e3, \\
    float(sys.argv[4]) / 1e3
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ["JAX_PLATFORMS"] = "cuda"
try:
    import jax, jax.numpy as jnp
    dev = jax.devices()[0]
except Exception as exc:
    print("unsupported: no GPU for JAX:",
          (str(exc).strip().splitlines() or [type(exc).__name__])[0], flush=True)
    sys.exit(0)
a = jax.device_put(jnp.ones((size, size), jnp.float32) / size, dev)
step = jax.jit(lambda x: jnp.tanh(x @ x))
step(a).block_until_ready()
def leave(*_):
    print("injected", n, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, leave)
print("ready", flush=True)
clock = time.monotonic
while os.getppid() == parent:
    end, x = clock() + on, a
    while clock() < end:
        x = step(x)
        x.block_until_ready()
    n += 1
    time.sleep(max(0.0, period - on) * random.uniform(0.8, 1.2))
leave()
"""


@contextlib.contextmanager
def gpu_other_process(cpu: int | None = None, size: int = 8192, on_ms: float = 40.0,
                      period_ms: float = 250.0) -> Iterator[Injected]:
    """A second process (pinned to ``cpu``) running JAX matmuls of [``size``, ``size``] on
    the same GPU, busy ``on_ms`` of every ``period_ms`` (jittered): the service's kernels wait
    for the GPU's engines behind another process's (time-sliced between contexts). Bursts,
    not a constant load (a level shift is absorbed by the rolling P50). Expected:
    gpu_foreign_process (agent/causes.py: another process on the GPU, from NVML's process
    list and utilization). :class:`Unsupported` without JAX or a GPU.
    ``info["injected"]``: bursts run."""
    p = _start_helper(_GPU_OTHER, cpu, [str(size), f"{on_ms:g}", f"{period_ms:g}"],
                      "gpu_other_process", timeout=300.0)
    inj = Injected([p.pid], size=size, on_ms=on_ms, period_ms=period_ms)
    try:
        yield inj
    finally:
        inj.info["injected"] = _stop_counted(p)


_JAX_GPU = ("import os, sys\nos.environ['JAX_PLATFORMS'] = 'cuda'\n"
            "os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')\n"
            "try:\n    import jax\nexcept ImportError as e:\n"
            "    print('no JAX (%s)' % e); sys.exit(1)\n"
            "try:\n    d = jax.devices()[0]\nexcept Exception as e:\n"
            "    print('no GPU for JAX (%s)' % (str(e).strip().splitlines() or "
            "[type(e).__name__])[0]); sys.exit(1)\nprint('ok', d)\n")


def jax_gpu_missing(python: str | None = None) -> str | None:
    """Why the GPU faults cannot run here (one line: "no JAX (...)", "no GPU for JAX (...)"),
    or None: ``import jax`` and its first CUDA device, tried in a child (nothing of JAX or
    CUDA is loaded into the caller)."""
    try:
        p = subprocess.run([python or sys.executable, "-c", _JAX_GPU], capture_output=True,
                           text=True, timeout=300, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "no GPU for JAX (its start took over 300 s)"
    out = p.stdout.strip().splitlines()
    if p.returncode == 0 and out and out[-1].startswith("ok "):
        return None
    return out[-1] if out else f"no JAX (the check exited {p.returncode})"
