"""Faults with a known cause, for bench/attribution.py and the CI watch test.

Every fault is a context manager: ``with cpu_hog(cpu=1): ...``; it starts its helpers as
child processes (or changes one kernel knob, restored on exit) and stops them on exit, by
their own pid, never by name.

==================  ==================================================  =================
fault               what it does                                        expected cause
==================  ==================================================  =================
cpu_hog             a busy process pinned to the probe CPU, at normal   cpu_contention
                    priority: CFS shares the CPU, the probe is
                    preempted at each slice
softirq_flood       a loopback UDP flood whose receive processing is    softirq
                    steered to the probe CPU with RPS
                    (/sys/class/net/lo/queues/rx-0/rps_cpus, restored)
                    while sender and receiver run on the housekeeping
                    CPU: NET_RX softirqs (and ksoftirqd) on the probe
                    CPU
memory_pressure     the probe's own memory is reclaimed: the target     page_faults
                    process is put in a memory cgroup (v1) whose limit
                    is set just above its usage and then squeezed, so
                    its file-backed pages are evicted and re-faulted
oversubscription    more busy threads than CPUs (2 × online, unpinned)  cpu_contention
migration           the probe thread's affinity is flipped between two  migration
                    CPUs at ``hz`` (sched_setaffinity on its tids)
==================  ==================================================  =================
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

EXPECTED = {"cpu_hog": "cpu_contention", "softirq_flood": "softirq",
            "memory_pressure": "page_faults", "oversubscription": "cpu_contention",
            "migration": "migration"}

_HOG = "import os,sys\nif sys.argv[1]: os.sched_setaffinity(0,[int(c) for c in " \
       "sys.argv[1].split(',')])\nos.nice(int(sys.argv[2]))\nx=0\nwhile True:\n    x+=1\n"


def _spawn_hog(cpus: str | None, nice: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _HOG, cpus or "", str(nice)])


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
def cpu_hog(cpu: int, nice: int = 0, count: int = 1) -> Iterator[list[int]]:
    """``count`` busy-loop processes pinned to ``cpu`` at ``nice``."""
    procs = [_spawn_hog(str(cpu), nice) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        _stop(procs)


@contextlib.contextmanager
def oversubscription(threads: int | None = None, nice: int = 0) -> Iterator[list[int]]:
    """``threads`` (default 2 × CPUs) unpinned busy processes."""
    n = threads or 2 * (os.cpu_count() or 1)
    procs = [_spawn_hog(None, nice) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        _stop(procs)


_FLOOD = r"""
import os, socket, sys
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
    while True:
        try:
            s.sendto(msg, ("127.0.0.1", port))
        except OSError:
            pass
"""


@contextlib.contextmanager
def softirq_flood(probe_cpu: int, housekeeping_cpu: int, port: int = 39555,
                  size: int = 1024, senders: int = 1) -> Iterator[list[int]]:
    """Loopback UDP flood with receive softirqs steered to ``probe_cpu`` by RPS (needs root
    and CONFIG_RPS; restores rps_cpus on exit)."""
    rps = Path("/sys/class/net/lo/queues/rx-0/rps_cpus")
    old = rps.read_text().strip()
    rps.write_text(format(1 << probe_cpu, "x"))
    hk = str(housekeeping_cpu)
    procs = [subprocess.Popen([sys.executable, "-c", _FLOOD, hk, str(port), "rx"])]
    time.sleep(0.2)
    procs += [subprocess.Popen([sys.executable, "-c", _FLOOD, hk, str(port), "tx", str(size)])
              for _ in range(senders)]
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


_CG = Path("/sys/fs/cgroup/memory")


def _rss_file_bytes(pid: int) -> tuple[int, int]:
    anon = file = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            anon = int(line.split()[1]) * 1024
        elif line.startswith("RssFile:"):
            file = int(line.split()[1]) * 1024
    return anon, file


@contextlib.contextmanager
def memory_pressure(pid: int, hz: float = 5.0, keep_file_mib: int = 4) -> Iterator[list[int]]:
    """Put ``pid`` in a fresh memory cgroup (v1) and, ``hz`` times a second, squeeze its limit
    to its anonymous memory + ``keep_file_mib`` so the kernel reclaims its file-backed pages
    (the code of numpy/TF libraries), then relax it: the process re-faults them (major/minor
    faults, direct reclaim in its own context). Needs root and cgroup v1 memory (this VM).
    The process is moved back to its original cgroup on exit."""
    if not (_CG / "cgroup.procs").exists():
        raise RuntimeError("memory_pressure needs the cgroup v1 memory controller")
    cg = _CG / f"hftagent-fault-{os.getpid()}"
    cg.mkdir(exist_ok=True)
    orig = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        parts = line.split(":", 2)
        if "memory" in parts[1].split(","):
            orig = _CG / parts[2].lstrip("/")
    stop = threading.Event()
    (cg / "memory.limit_in_bytes").write_text("-1")
    for t in _tids(pid):
        with contextlib.suppress(OSError):
            (cg / "tasks").write_text(str(t))

    def squeeze() -> None:
        while not stop.wait(1.0 / hz):
            with contextlib.suppress(OSError):
                anon, _file = _rss_file_bytes(pid)
                usage = int((cg / "memory.usage_in_bytes").read_text())
                target = max(anon + keep_file_mib * 2**20, usage // 4)
                (cg / "memory.limit_in_bytes").write_text(str(target))
                time.sleep(0.02)
                (cg / "memory.limit_in_bytes").write_text("-1")
    th = threading.Thread(target=squeeze, daemon=True)
    th.start()
    try:
        yield []
    finally:
        stop.set()
        th.join()
        with contextlib.suppress(OSError):
            (cg / "memory.limit_in_bytes").write_text("-1")
        dest = orig if orig is not None and (orig / "tasks").exists() else _CG
        for t in _tids(pid):
            with contextlib.suppress(OSError):
                (dest / "tasks").write_text(str(t))
        for _ in range(20):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def udp_port_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
