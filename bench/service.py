"""A small serving loop the bench owns: fixed-shape inference in its own process, paced open
loop at ``--rate`` calls a second on one CPU, every call recorded through :mod:`agent.client`,
with fault switches that bench/faults/kit.py drives from outside.

    .venv/bin/python bench/service.py --cpu 1 --rate 500 --seconds 60 [--model m.tflite]

What it stands for: the inference process of a real box, which ``hftagent watch --pid PID``
reads through the client's latency ring today and ``watch --attach PID`` will time without
the client (uprobes on LiteRT's invoke). The model is the numpy LSTM-shaped recurrence of
watch's built-in probe (:func:`agent.watch.probe_worker.build_numpy_probe`) by default, or a
``.tflite`` file run by LiteRT's ``ai_edge_litert.interpreter.Interpreter`` (one thread).
``--mapped-weights`` reads the numpy model's weights from a file it maps (written to
``--weights-dir``, unlinked at once: :func:`map_weights`), so reclaim of those pages
(kit.weights_pageout) makes the calls that read them take page faults.

The loop is the probe worker's (agent/watch/probe_worker.py): call ``i`` is intended to start
at ``begin + i / rate``; it sleeps until ``SPIN_US`` before that, spins up to it, and records
the call from its intended start to its end (response time: a late start is part of it), with
the same in-process evidence (getrusage RUSAGE_THREAD deltas, CPU time, run-queue delay from
schedstat, the CPU at start and end). ``--plain`` records as an application embedding the
client does (``LatencyRing.end(start)``: no evidence). Far behind (50 periods) it restarts its
schedule instead of a burst of back-to-back calls.

The call path is ``with LOCK: [injected stalls]; model()``. The lock is always taken (free:
~0.1 µs), so the lock fault only adds the holder.

Fault switches (one line each, written by the kit to the control FIFO ``DIR/ctl``; the
service reads it between calls, at least every 50 ms, and answers each line with one JSON line
on stdout, ``{"ctl": KIND, "ok": true, ...}`` or ``{"ctl": KIND, "ok": false, "error": ...}``):

=========================  ====================================================================
``lock HOLD_MS PER_S``     a second thread of this process takes the call path's lock at random
                           moments (PER_S a second on average, intervals uniform in 0.5-1.5 ×
                           1 / PER_S) and holds it HOLD_MS (asleep on a timer): the call thread
                           blocks on the lock's futex (S) and the holder's release wakes it.
                           The answer carries ``holder_tid``.
``pipe PER_S``             PER_S calls a second (at random) write one byte to the FIFO
                           ``DIR/req`` and then block reading one byte from ``DIR/rsp`` in the
                           call path (a request to another process); the kit's helper answers
                           late (kit.pipe_late). The helper must hold both FIFOs open first
                           (O_RDWR); a helper that is gone ends the switch (EOF, EPIPE).
``sleep HOLD_MS PER_S``    PER_S calls a second sleep HOLD_MS (``time.sleep``) in the call path.
``idle SLACK_US PER_S``    no spin before a call's start (it sleeps until the start, so the
                           wake-up of its idle CPU is inside every call), and PER_S of those
                           sleeps a second run with a timer slack of SLACK_US
                           (``prctl(PR_SET_TIMERSLACK)``, reset after the sleep): on an idle CPU
                           the timer fires at the end of its slack range, SLACK_US late.
``KIND off``               stop that switch; the answer carries its counts so far
``stats``                  every count so far
=========================  ====================================================================

Nothing inside the service is needed for SIGSTOP/SIGCONT (kit.sigstop sends them).

Start-up prints one JSON line on stdout: ``{"ready": true, "pid", "tid" (the call thread),
"ring", "dir", "model", "weights" (the file its weights are read from, or null), "rate_hz",
"cpu", "warmup_p50_us"}``, or ``{"error": ...}`` (and one
line on stderr) with exit 2 on bad input (a CPU not allowed, a bad rate, a missing model,
LiteRT not installed). ``DIR`` is a private directory (``mkdtemp``, mode 0700) holding the
FIFOs, removed at exit with the ring. The service stops by itself after ``--seconds``, on
SIGTERM/SIGINT, and with its parent: ``PR_SET_PDEATHSIG`` (SIGTERM) — which the kernel sends
when the *thread* that forked it exits, so start it from a thread that lives as long as it
should (:class:`Service` is started from the bench's main thread) — and a ``getppid()`` check
every 50 ms behind it. At exit it prints ``{"done": true, "calls": N, ...counts}``.

:class:`Service` is the bench's handle: start, ``command(line)`` (write the FIFO, wait for the
answer), ``stop()`` (SIGTERM, returns the exit line).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SPIN_US = 200  # the probe worker's spin before a call's intended start
CTL_POLL_NS = 50_000_000  # the control FIFO is read at least this often
BEHIND_PERIODS = 50  # this far behind, the schedule restarts (as the probe worker's)
PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29
PR_GET_TIMERSLACK = 30
KINDS = ("lock", "pipe", "sleep", "idle")


class Switches:
    """The fault switches' settings and counts (the call thread reads them, the control
    commands set them; both on the main thread, but the lock holder counts on its own)."""

    def __init__(self) -> None:
        self.rng = random.Random()
        self.lock = threading.Lock()
        self.holder: threading.Thread | None = None
        self.holder_stop = threading.Event()
        self.holder_tid = 0
        self.sleep_s = 0.0
        self.sleep_per_s = 0.0
        self.pipe_per_s = 0.0
        self.pipe_fds: tuple[int, int] | None = None  # (req writer, rsp reader)
        self.idle = False
        self.slack_ns = 0
        self.idle_per_s = 0.0
        self.gpu: dict[str, float] = {}  # bench/gpu_service.py's switches: kind → PER_S
        self.next_ns: dict[str, int] = {}  # per switch kind (a subclass's kinds too)
        self.counts = {"lock_holds": 0, "pipe_asks": 0, "pipe_broken": 0, "sleeps": 0,
                       "slack_sleeps": 0}

    def due(self, kind: str, per_s: float, now: int) -> bool:
        """Whether a stall of ``kind`` is due now (``per_s`` a second on average, each
        interval uniform in 0.5-1.5 × the mean: never in phase with the call schedule)."""
        if per_s <= 0 or now < self.next_ns.get(kind, 0):
            return False
        first = self.next_ns.get(kind, 0) == 0
        self.next_ns[kind] = now + int(self.rng.uniform(0.5, 1.5) * 1e9 / per_s)
        return not first  # the first interval starts when the switch is turned on

    def hold(self, hold_s: float, per_s: float) -> None:
        """The lock holder's loop (its own thread)."""
        while not self.holder_stop.wait(self.rng.uniform(0.5, 1.5) / per_s):
            with self.lock:
                time.sleep(hold_s)
            self.counts["lock_holds"] += 1

    def stop_holder(self) -> None:
        if self.holder is not None:
            self.holder_stop.set()
            self.holder.join(timeout=5)
            self.holder = None

    def close_pipe(self) -> None:
        if self.pipe_fds is not None:
            for fd in self.pipe_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.pipe_fds = None
        self.pipe_per_s = 0.0


def _number(text: str, what: str, lo: float, hi: float) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{what} must be a number, not {text[:20]!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{what} must be in {lo:g}..{hi:g}, not {v:g}")
    return v


class Control:
    """The control FIFO (``DIR/ctl``, opened O_RDWR|O_NONBLOCK: it never waits for a writer
    and never reads EOF), its commands, and their answers on stdout. A subclass adds
    switches: its ``KINDS`` and an ``on``/``off`` that handle them (bench/gpu_service.py)."""

    KINDS: tuple[str, ...] = KINDS

    def __init__(self, directory: Path, sw: Switches) -> None:
        self.dir = directory
        self.sw = sw
        self.fd = os.open(directory / "ctl", os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW
                          | os.O_CLOEXEC)
        self.buf = b""

    def poll(self) -> None:
        try:
            while True:
                chunk = os.read(self.fd, 4096)
                if not chunk:
                    break
                self.buf += chunk
        except BlockingIOError:
            pass
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self.buf = self.buf[-4096:]  # a writer that never ends its line is bounded
            words = line.decode("ascii", "replace").split()
            if words:
                _say(self.apply(words))

    def apply(self, words: list[str]) -> dict:
        kind = words[0]
        try:
            if kind == "stats":
                return {"ctl": kind, "ok": True, **self.sw.counts}
            if kind not in self.KINDS:
                raise ValueError(f"unknown switch {kind!r} (known: {', '.join(self.KINDS)}, "
                                 "stats)")
            if words[1:] == ["off"]:
                self.off(kind)
                return {"ctl": kind, "ok": True, "off": True, **self.sw.counts}
            before = dict(self.sw.counts)  # the answer's counts: from before the switch
            return {"ctl": kind, "ok": True, **before, **self.on(kind, words[1:])}
        except ValueError as exc:
            return {"ctl": kind, "ok": False, "error": str(exc)}
        except OSError as exc:
            return {"ctl": kind, "ok": False, "error": f"{exc.strerror or exc}"}

    def on(self, kind: str, args: list[str]) -> dict:
        sw = self.sw
        want = {"lock": 2, "pipe": 1, "sleep": 2, "idle": 2}[kind]
        if len(args) != want:
            usage = {"lock": "HOLD_MS PER_S", "pipe": "PER_S", "sleep": "HOLD_MS PER_S",
                     "idle": "SLACK_US PER_S"}[kind]
            raise ValueError(f"usage: {kind} {usage} | {kind} off")
        self.off(kind)
        sw.next_ns[kind] = 0
        if kind == "lock":
            hold = _number(args[0], "HOLD_MS", 0.01, 1000) / 1e3
            per_s = _number(args[1], "PER_S", 0.01, 100)
            sw.holder_stop = threading.Event()
            started = threading.Event()

            def run() -> None:
                sw.holder_tid = threading.get_native_id()
                started.set()
                sw.hold(hold, per_s)
            sw.holder = threading.Thread(target=run, name="lock-holder", daemon=True)
            sw.holder.start()
            started.wait(5)
            return {"holder_tid": sw.holder_tid}
        if kind == "sleep":
            sw.sleep_s = _number(args[0], "HOLD_MS", 0.01, 1000) / 1e3
            sw.sleep_per_s = _number(args[1], "PER_S", 0.01, 100)
            return {}
        if kind == "idle":
            sw.slack_ns = int(_number(args[0], "SLACK_US", 0, 1e6) * 1e3)
            sw.idle_per_s = _number(args[1], "PER_S", 0, 100)
            sw.idle = True
            return {}
        per_s = _number(args[0], "PER_S", 0.01, 100)
        # O_NONBLOCK: opening a FIFO's write end fails (ENXIO) instead of waiting when no
        # reader holds it (the helper opens both ends first); the read end then blocks.
        try:
            w = os.open(self.dir / "req", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                        | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise ValueError("no helper holds the pipe open (start it first)") from None
            raise
        r = os.open(self.dir / "rsp", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                    | os.O_CLOEXEC)
        os.set_blocking(r, True)
        sw.pipe_fds = (w, r)
        sw.pipe_per_s = per_s
        return {}

    def off(self, kind: str) -> None:
        sw = self.sw
        if kind == "lock":
            sw.stop_holder()
        elif kind == "sleep":
            sw.sleep_per_s = 0.0
        elif kind == "idle":
            sw.idle, sw.idle_per_s = False, 0.0
        elif kind == "pipe":
            sw.close_pipe()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _say(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _fail(msg: str) -> int:
    _say({"error": msg})
    print(f"service: {msg}", file=sys.stderr)
    return 2


def _online() -> list[int]:
    """The online CPUs (sysfs, through the Host), else this process's affinity."""
    from collectors.host import Host
    from collectors.parsers import parse_cpulist
    host = Host()
    r = host.read(host.sys("devices", "system", "cpu", "online"))
    try:
        return sorted(parse_cpulist(r.value.strip())) if r.ok else sorted(
            os.sched_getaffinity(0))
    except ValueError:
        return sorted(os.sched_getaffinity(0))


def _cpulist(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def map_weights(w, directory: str):
    """(a read-only array of ``w``'s values mapped from a file, the file's path): ``w``
    written to a new file in ``directory`` (``mkstemp``: O_EXCL, an unpredictable name, mode
    0600), mapped MAP_SHARED read-only, and unlinked at once — nothing is left behind on any
    exit path, and the mapping (``/proc/PID/maps``: the path with " (deleted)") keeps the
    inode. Its pages are page-cache pages of that file: reclaim (kit.weights_pageout) drops
    them and the next call that reads them takes page faults. ``directory`` must be on a
    block-backed filesystem (on tmpfs without swap the pages cannot be dropped)."""
    import mmap

    import numpy as np
    try:
        fd, path = tempfile.mkstemp(prefix="hftagent-weights-", suffix=".bin", dir=directory)
    except OSError as exc:
        raise ValueError(f"--mapped-weights: cannot create a file in {directory}: "
                         f"{exc.strerror}") from None
    try:
        data = np.ascontiguousarray(w).tobytes()
        os.write(fd, data)
        # written back now: reclaim frees a clean file page at once, a dirty one only after
        # writeback (MADV_PAGEOUT of a dirty page left it cached: minor faults, not major)
        os.fsync(fd)
        mm = mmap.mmap(fd, len(data), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        # no readahead, no fault-around: each page is read back on a major fault of its own,
        # as the pages of weights scattered over a larger model file are (with readahead the
        # 80 pages came back in 1 major and 5 minor faults: a call 2× its P50, no spike)
        mm.madvise(mmap.MADV_RANDOM)
    finally:
        os.close(fd)
        os.unlink(path)
    return np.frombuffer(mm, dtype=w.dtype).reshape(w.shape), path


def build_model(path: str | None, weights_dir: str | None = None):
    """(callable, description): the numpy LSTM-shaped probe (its weights mapped from a file
    in ``weights_dir`` when given: :func:`map_weights`), or a ``.tflite`` model on LiteRT's
    interpreter (one thread, a fixed random input of its input's shape and dtype, dynamic
    dims 1). The callable's ``weights`` attribute is the file its weights are read from (the
    mapped file; the .tflite, which LiteRT maps), None for numpy's own arrays. Raises
    ValueError with the reason."""
    if not path:
        from agent.probe.numpy_model import NumpyLSTM
        m = NumpyLSTM()
        weights = None
        if weights_dir is not None:
            m.w, weights = map_weights(m.w, weights_dir)
        fn = m.bind(m.sample)
        fn.weights = weights  # type: ignore[attr-defined]
        return fn, f"numpy-lstm [1,{m.steps},{m.features}]→{m.hidden}" + (
            " (weights mapped)" if weights else "")
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--model {path}: no such file")
    if weights_dir is not None:
        raise ValueError("--mapped-weights is for the numpy model (LiteRT maps the .tflite "
                         "itself: kit.weights_pageout targets that file)")
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise ValueError("--model needs LiteRT: pip install ai-edge-litert") from None
    import numpy as np
    try:
        it = Interpreter(model_path=str(p), num_threads=1)
        d = it.get_input_details()
        if len(d) != 1:
            raise ValueError(f"--model {path}: {len(d)} inputs (one is served)")
        shape = [1 if s < 0 else int(s) for s in d[0]["shape_signature"]]
        if list(d[0]["shape"]) != shape:
            it.resize_tensor_input(d[0]["index"], shape, strict=False)
        it.allocate_tensors()
    except Exception as exc:  # noqa: BLE001 - LiteRT's errors, as one line
        msg = str(exc).strip().splitlines()
        raise ValueError(f"--model {path}: {msg[-1] if msg else type(exc).__name__}"
                         ) from None
    x = np.random.default_rng(1).standard_normal(shape).astype(d[0]["dtype"])
    idx, set_tensor, invoke = d[0]["index"], it.set_tensor, it.invoke

    def call() -> None:
        set_tensor(idx, x)
        invoke()
    call.interpreter = it  # type: ignore[attr-defined]  # keeps it alive
    call.weights = str(p.resolve())  # type: ignore[attr-defined]
    return call, f"litert {p.name} {shape}"


def _build(args: argparse.Namespace, sw: Switches):
    """The model of the command line (:func:`build_model`); ``sw``: for a model whose call
    path has switches of its own (bench/gpu_service.py's), unused here."""
    return build_model(args.model, args.weights_dir if args.mapped_weights else None)


def serve(args: argparse.Namespace, build=_build, control=None) -> int:
    """Serve until ``--seconds``, a signal or the parent's end. ``build(args, sw)`` makes
    the model's (callable, description); ``control(dir, sw)`` the control FIFO's reader
    (:class:`Control`, or a subclass with more switches: bench/gpu_service.py)."""
    if not args.rate > 0 or args.rate > 100_000:
        return _fail(f"--rate must be in (0, 100000] calls a second, not {args.rate:g}")
    if not 0 < args.seconds <= 1e7:
        return _fail(f"--seconds must be in (0, 1e7], not {args.seconds:g}")
    if not 0 <= args.warmup <= 100_000:
        return _fail(f"--warmup must be in 0..100000 calls, not {args.warmup}")
    parent = args.parent or os.getppid()
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        return 0  # the parent went away before the death signal was armed
    online = _online()
    cpu = online[-1] if args.cpu is None else args.cpu
    if cpu not in online:
        return _fail(f"--cpu {cpu} is not online (online: {_cpulist(online)})")
    try:
        # (a parent pinned elsewhere — watch pins its own threads to the housekeeping CPUs —
        # is no limit: the affinity is set, not narrowed)
        from tuning.tunables.isolate import pin_self
        pin_self([cpu])
    except OSError as exc:
        return _fail(f"cannot run on CPU {cpu}: {exc.strerror} (a cpuset without it?)")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # before numpy/LiteRT: their pools read it once
    stop = {"flag": False}

    def _stop(*_):
        stop["flag"] = True
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sw = Switches()
    try:
        fn, desc = build(args, sw)
    except ValueError as exc:
        return _fail(str(exc))
    from agent.client import LatencyRing, RingError
    try:
        ring = LatencyRing(args.ring) if args.ring else LatencyRing()
    except (RingError, ValueError, OSError) as exc:
        return _fail(f"cannot create the latency ring: {exc}")
    directory = Path(tempfile.mkdtemp(prefix="hftagent-service-"))
    try:
        for name in ("ctl", "req", "rsp"):
            os.mkfifo(directory / name, 0o600)
        ctl = (control or Control)(directory, sw)
        try:
            try:
                n_warm, p50 = _warm_up(fn, args.warmup)
            except Exception as exc:  # noqa: BLE001 - a model that fails to run: one line
                return _fail(f"the model fails to run: {type(exc).__name__}: "
                             f"{str(exc).strip()[:200]}")
            _say({"ready": True, "pid": os.getpid(), "tid": threading.get_native_id(),
                  "ring": str(ring.path), "dir": str(directory), "model": desc,
                  "weights": getattr(fn, "weights", None),
                  "rate_hz": args.rate, "cpu": cpu, "warmup_calls": n_warm,
                  "warmup_p50_us": None if p50 is None else round(p50 / 1e3, 1)})
            calls = _loop(args, fn, ring, sw, ctl, stop, parent, libc)
        finally:
            sw.stop_holder()
            sw.close_pipe()
            ctl.close()
        _say({"done": True, "calls": calls, **sw.counts})
        return 0
    finally:
        ring.close(unlink=True)
        shutil.rmtree(directory, ignore_errors=True)


def _warm_up(fn, min_calls: int) -> tuple[int, int | None]:
    """(calls, P50 ns) of the warm-up (:func:`agent.probe.harness.warm_up`); ``min_calls``
    0: none, so every call of the model is a call of the loop, recorded in the ring (a
    count of the runtime's calls that bench/restarts.py compares with watch's)."""
    if not min_calls:
        return 0, None
    from agent.probe.harness import warm_up
    wu = warm_up(fn, min_calls=min_calls, budget_ns=int(20e9))
    import numpy as np
    return wu.calls, int(np.median(wu.latency_ns)) if len(wu.latency_ns) else 0


def _loop(args, fn, ring, sw: Switches, ctl: Control, stop: dict, parent: int, libc) -> int:
    """The paced open loop; returns the number of calls."""
    import resource

    from collectors.host import Host
    host = Host()
    ss_file = host.open_hot(host.proc("thread-self", "schedstat"))  # kept open: see worker
    ss_fd = ss_file.fd
    from agent.watch.probe_worker import _sched_getcpu
    getcpu = _sched_getcpu()
    slack0 = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    clock, cpu_ns, getru, who = time.monotonic_ns, time.process_time_ns, resource.getrusage, \
        resource.RUSAGE_THREAD
    pread, sleep = os.pread, time.sleep
    evidence = not args.plain
    period = int(round(1e9 / args.rate))
    end_at = clock() + int(args.seconds * 1e9)
    begin = clock() + period
    i = calls = 0
    next_ctl = 0
    tid = threading.get_native_id()
    lock = sw.lock
    while not stop["flag"]:
        intended = begin + i * period
        if intended >= end_at:
            break
        now = clock()
        if now >= next_ctl:
            ctl.poll()
            next_ctl = now + CTL_POLL_NS
            if os.getppid() != parent:
                break
        spin = 0 if sw.idle else SPIN_US * 1000
        ahead = intended - clock()
        q_sleep = -1
        if ahead > spin:
            if evidence:
                q_sleep = int(pread(ss_fd, 64, 0).split()[1])
            slack = sw.slack_ns > 0 and sw.idle and sw.due("idle", sw.idle_per_s, now)
            if slack:
                libc.prctl(PR_SET_TIMERSLACK, sw.slack_ns, 0, 0, 0)
            sleep((ahead - spin) * 1e-9)
            if slack:
                libc.prctl(PR_SET_TIMERSLACK, slack0, 0, 0, 0)
                sw.counts["slack_sleeps"] += 1
        if evidence:  # as the probe worker: from the end of the sleep (see its comments)
            r0 = getru(who)
            q0 = int(pread(ss_fd, 64, 0).split()[1])
            if q_sleep >= 0 and clock() > intended:
                q0 = q_sleep
        while clock() < intended:
            pass
        if evidence:
            c_a = getcpu()
            p0 = cpu_ns()
        # the call path
        with lock:
            now = clock()
            if sw.sleep_per_s and sw.due("sleep", sw.sleep_per_s, now):
                sleep(sw.sleep_s)
                sw.counts["sleeps"] += 1
            if sw.pipe_fds is not None and sw.due("pipe", sw.pipe_per_s, now):
                _ask(sw)
            fn()
        t1 = clock()
        if evidence:
            p1 = cpu_ns()
            q1 = int(pread(ss_fd, 64, 0).split()[1])
            r1 = getru(who)
            ring.record(intended, t1, tid, r1.ru_nivcsw - r0.ru_nivcsw,
                        r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_minflt - r0.ru_minflt,
                        r1.ru_majflt - r0.ru_majflt, p1 - p0, q1 - q0, c_a, getcpu())
        else:
            ring.end(intended)
        calls += 1
        i += 1
        if t1 > intended + BEHIND_PERIODS * period:
            begin = clock() + period
            i = 0
    del ss_file
    return calls


def _ask(sw: Switches) -> None:
    """One request to the helper and its (late) answer: a blocking read in the call path.
    A helper that is gone (EPIPE, EOF) ends the switch."""
    w, r = sw.pipe_fds
    try:
        os.write(w, b"?")
        if os.read(r, 1):
            sw.counts["pipe_asks"] += 1
            return
    except OSError:
        pass
    sw.counts["pipe_broken"] += 1
    sw.close_pipe()


# ----------------------------------------------------------------------------------------------
# The bench's handle
# ----------------------------------------------------------------------------------------------


class ServiceError(RuntimeError):
    """The service did not start, or did not answer a command (one line: why)."""


class Service:
    """A running bench/service.py: ``pid``, ``tid`` (its call thread), ``ring``, ``dir``,
    ``info`` (its ready line). Start it from a thread that outlives it (see the module
    docstring: PR_SET_PDEATHSIG). ``mapped_weights``: the numpy model's weights mapped from a
    file in that directory (``--mapped-weights --weights-dir``); ``extra``: more arguments of
    the ``SCRIPT`` (a subclass's: bench/gpu_service.py)."""

    SCRIPT = Path(__file__).resolve()

    def __init__(self, cpu: int | None = None, rate: float = 500.0, seconds: float = 600.0,
                 model: str | None = None, plain: bool = False, warmup: int = 200,
                 start_timeout: float = 120.0, mapped_weights: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        cmd = [sys.executable, str(self.SCRIPT), *extra, "--rate", str(rate),
               "--seconds", str(seconds), "--warmup", str(warmup),
               "--parent", str(os.getpid())]
        if cpu is not None:
            cmd += ["--cpu", str(cpu)]
        if model:
            cmd += ["--model", model]
        if plain:
            cmd.append("--plain")
        if mapped_weights:
            cmd += ["--mapped-weights", "--weights-dir", mapped_weights]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0, cwd=str(ROOT),
                                     start_new_session=True)
        self._buf = b""
        self.done: dict | None = None
        msg = self._line(start_timeout)
        if not msg or not msg.get("ready"):
            err = (msg or {}).get("error")
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            if not err:
                tail = (self.proc.stderr.read() or b"").decode(errors="replace").strip()
                err = f"exited ({self.proc.returncode}): {tail.splitlines()[-1] if tail else ''}"
            self.stop()
            raise ServiceError(f"service did not start: {err}")
        self.info = msg
        self.pid: int = msg["pid"]
        self.tid: int = msg["tid"]
        self.ring: str = msg["ring"]
        self.dir = Path(msg["dir"])

    def _line(self, timeout: float) -> dict | None:
        """The next JSON line on the service's stdout (None: it ended, or ``timeout``)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return {"error": f"not a JSON line: {line[:80]!r}"}

    def command(self, line: str, timeout: float = 10.0) -> dict:
        """Write one control line and return the service's answer; raises
        :class:`ServiceError` when it is refused or unanswered."""
        try:
            fd = os.open(self.dir / "ctl", os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW
                         | os.O_CLOEXEC)
        except OSError as exc:
            raise ServiceError(f"service {self.pid}: control FIFO: {exc.strerror}") from None
        try:
            os.write(fd, (line.strip() + "\n").encode())  # < PIPE_BUF: one atomic write
        finally:
            os.close(fd)
        kind = line.split()[0]
        deadline = time.monotonic() + timeout
        while True:
            msg = self._line(max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise ServiceError(f"service {self.pid}: no answer to {line!r}")
            if msg.get("done"):
                self.done = msg
                raise ServiceError(f"service {self.pid} ended before answering {line!r}")
            if msg.get("ctl") == kind:
                if not msg.get("ok"):
                    raise ServiceError(f"service refused {line!r}: {msg.get('error')}")
                return msg

    def stop(self, timeout: float = 10.0) -> dict | None:
        """SIGTERM, wait, and return its exit line (``{"done": true, "calls", counts}``);
        SIGKILL when it does not end in time (a SIGSTOPped service is continued first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        while self.done is None:
            msg = self._line(1.0)
            if msg is None:
                break
            if msg.get("done"):
                self.done = msg
        for f in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                f.close()
        return self.done

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parser(prog: str = "bench/service.py", description: str = "") -> argparse.ArgumentParser:
    """The options every service shares (bench/gpu_service.py adds its own)."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--cpu", type=int, help="the CPU it runs on (default: the last online)")
    ap.add_argument("--rate", type=float, default=500.0, help="calls a second (open loop)")
    ap.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    ap.add_argument("--plain", action="store_true", help="record calls as an application "
                    "does (agent.client start/end: no in-process evidence)")
    ap.add_argument("--ring", help="the latency ring's path (default: agent.client's)")
    ap.add_argument("--warmup", type=int, default=200, help="calls before the loop, at "
                    "least (0: none; every call of the model is then recorded in the ring)")
    ap.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a .tflite model run by LiteRT (default: the numpy "
                    "LSTM-shaped probe)")
    ap.add_argument("--mapped-weights", action="store_true", help="the numpy model's weights "
                    "read from a file mapped read-only (written to --weights-dir and unlinked "
                    "at once): kit.weights_pageout drops its pages, calls fault them back")
    ap.add_argument("--weights-dir", default="/var/tmp", help="where --mapped-weights writes "
                    "its file (a block-backed filesystem; default /var/tmp)")
    return serve(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
