"""The built-in open-loop probe of ``hftagent watch``, in its own process pinned to the probe
CPUs.

Run as ``python -m agent.watch.probe_worker --ring PATH --rate HZ --cpus LIST --probe KIND``.
It pins itself, applies thread settings before TensorFlow initialises, builds the callable
(``tf``: :mod:`agent.probe`'s models and variants — built-in LSTM, ``build_callable`` variant
``xla`` by default; ``numpy``: a numpy LSTM-shaped recurrence, no TensorFlow, for CI and
boxes without TF), warms it up with ``agent.probe.harness.warm_up``, prints one JSON "ready"
line on stdout, then calls it on a fixed schedule of ``rate`` starts per second and writes
every sample into the shared-memory latency ring (:mod:`agent.client`), with its in-process
evidence: involuntary/voluntary switches and faults of the thread (getrusage RUSAGE_THREAD),
process CPU time, run-queue delay of the thread (pread of /proc/thread-self/schedstat on a
kept-open descriptor, 0.6 µs) and the CPU at start and end (sched_getcpu).

Why not ``agent.probe.harness.time_loop``: it fills a preallocated array and returns at the
end of a run, while watch must see every sample within a second, and it does not record the
run-queue delay or the CPU; this loop keeps its open-loop schedule and recording rules: each
sample runs from its intended start to its end (response time: a late start is part of the
latency), its evidence is taken from the end of the sleep before it (a preemption while it
spun up to the start counts; the sleep itself is never charged to a sample).

Exits 0 at ``--duration`` or on SIGTERM/SIGINT, 2 when the ring cannot be created or the
probe cannot be built (one JSON ``{"error": ...}`` line), and by itself when its parent
(watch) goes away. The ring (``--ring``, created first) is :class:`agent.client.LatencyRing`'s:
a random temporary name, ``O_EXCL|O_NOFOLLOW``, mode 0600, renamed into place; watch removes
it when it stops the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def _setup_threads(ncpu: int) -> None:
    # Must precede the numpy/TF imports: BLAS pools read these once at load.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(ncpu))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_numpy_probe(steps: int = 64, features: int = 32, hidden: int = 128):
    """A numpy LSTM-shaped recurrence ([1, steps, features] → hidden): ~0.3-1 ms here, the
    same order as the XLA LSTM, with no TensorFlow (fast start for CI). The computation is
    agent/probe/numpy_model.py's, which `hftagent probe --model numpy` times too."""
    from agent.probe.numpy_model import NumpyLSTM
    m = NumpyLSTM(steps, features, hidden)
    return m.bind(m.sample), f"numpy-lstm [1,{steps},{features}]→{hidden}"


def build_tf_probe(model: str, variant: str, ncpu: int):
    """A built-in model (or a model path) and a variant, built by :mod:`agent.probe`.

    A ``.tflite`` file needs LiteRT only: TensorFlow is imported (for its thread pools) only
    for a model that is not one, so a box with LiteRT and no TensorFlow runs
    ``watch --probe tf --model m.tflite --variant tflite``."""
    import numpy as np

    from agent.probe.models import ModelSpec, load_model, resolve_shape, tf_missing
    from agent.probe.variants import build_callable
    spec = ModelSpec(path=model) if os.path.exists(model) else ModelSpec(builtin=model)
    if not model.endswith(".tflite"):
        try:
            import tensorflow as tf
        except ModuleNotFoundError as exc:
            raise tf_missing(exc, spec) from None
        tf.config.threading.set_intra_op_parallelism_threads(ncpu)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    m = load_model(spec)
    shape, _warnings = resolve_shape(m.input_shape, None)
    built = build_callable(m, variant, shape, threads=ncpu)
    x = np.random.default_rng(1).standard_normal(shape).astype(m.input_dtype)
    return built.bind(x), f"{m.name} {variant} {list(shape)}"


def _sched_getcpu():
    import ctypes
    import ctypes.util
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.sched_getcpu
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


def await_ready(stream, progress=None) -> dict:
    """The worker's "ready" line (or its "error" line) from its stdout ``stream``, each
    "phase" line before it told to ``progress(str)``; {} when the worker ended first."""
    while True:
        line = stream.readline()
        try:
            msg = json.loads(line) if line else {}
        except json.JSONDecodeError:
            msg = {}
        if "phase" not in msg:
            return msg
        if progress is not None:
            progress(str(msg["phase"]))


def auto_rate(p50_ns: int, busy: float = 0.25, cap: float = 500.0) -> float:
    """Calls per second that keep the probe's CPU ``busy`` (25 %) busy at its warm P50, at
    most ``cap``: a probe whose calls fill its CPU measures the queue it builds itself."""
    return float(max(1, min(cap, int(busy * 1e9 / max(p50_ns, 1)))))


def run(args: argparse.Namespace) -> int:
    cpus = [int(c) for c in args.cpus.split(",") if c != ""]
    if cpus:
        from tuning.tunables.isolate import pin_self
        pin_self(cpus)  # (inside the isolated cpuset when the CPUs are isolated)
    _setup_threads(len(cpus) or os.cpu_count() or 1)
    stop = {"flag": False}

    def _stop(*_):
        stop["flag"] = True
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # The ring first: a ring that cannot be created (a name in the way, a full /dev/shm) is
    # reported before seconds of TF import and warm-up, as one line.
    from agent.client import LatencyRing, RingError
    try:
        ring = LatencyRing(args.ring, capacity=args.capacity)
    except (RingError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    def phase(what: str) -> None:  # watch prints these while it waits (seconds with TF)
        print(json.dumps({"phase": what}), flush=True)

    try:
        if args.probe == "numpy":
            fn, desc = build_numpy_probe()
        else:
            phase(f"loading and building the {args.variant} probe ({args.model})")
            fn, desc = build_tf_probe(args.model, args.variant, len(cpus) or 1)
        phase(f"warming up {desc} (at least {args.warmup} calls, until steady)")
        from agent.probe.harness import warm_up
        wu = warm_up(fn, min_calls=args.warmup, budget_ns=int(20e9))
    except Exception as exc:  # noqa: BLE001 - reported to watch as one line
        from agent.errors import AgentError
        why = str(exc) if isinstance(exc, AgentError) else f"{type(exc).__name__}: {exc}"
        print(json.dumps({"error": f"cannot build the {args.probe} probe: {why}"}),
              flush=True)
        ring.close(unlink=True)
        return 2
    import resource
    import threading
    tid = threading.get_native_id()
    from collectors.host import Host
    # this thread's own schedstat (the live kernel: the worker measures itself), kept open;
    # ss_file must live as long as the loop (closing it would close ss_fd)
    host = Host()
    ss_file = host.open_hot(host.proc("thread-self", "schedstat"))
    ss_fd = ss_file.fd
    getcpu = _sched_getcpu()
    rate = args.rate
    if rate <= 0:  # --rate auto: keep the probe CPU ≤ 25 % busy, at most 500 calls a second
        import numpy as np
        rate = auto_rate(wu.window_p50_ns[-1] if wu.window_p50_ns else
                         int(np.median(wu.latency_ns)))
    print(json.dumps({"ready": True, "pid": os.getpid(), "tid": tid, "probe": desc,
                      "rate_hz": rate,
                      "warmup": wu.to_dict()}), flush=True)

    clock = time.monotonic_ns
    cpu = time.process_time_ns
    getru = resource.getrusage
    who = resource.RUSAGE_THREAD
    pread = os.pread
    sleep = time.sleep
    period = int(round(1e9 / rate))
    parent = os.getppid()
    begin = clock() + period
    end_at = begin + int(args.duration * 1e9) if args.duration else 1 << 62
    spin = 200_000
    i = 0
    record = ring.record
    while not stop["flag"]:
        intended = begin + i * period
        if intended >= end_at:
            break
        ahead = intended - clock()
        q_sleep = -1
        if ahead > spin:
            q_sleep = int(pread(ss_fd, 64, 0).split()[1])
            sleep((ahead - spin) * 1e-9)
        # A sample is timed from its intended start (response time, as `hftagent probe`):
        # a stall before the call — preempted while spinning up to it, woken late, queued
        # behind the previous slow call — belongs to it, and its in-process evidence starts
        # here, after the sleep (the sleep itself is never charged to a sample) — except
        # the run-queue wait of a wake-up that came after the intended start: that wait
        # delayed the sample, so it counts (a timely wake-up's wait, absorbed by the spin
        # before the start, does not).
        r0 = getru(who)
        q0 = int(pread(ss_fd, 64, 0).split()[1])
        if q_sleep >= 0 and clock() > intended:
            q0 = q_sleep
        while clock() < intended:
            pass
        c_a = getcpu()
        p0 = cpu()  # CPU time: the call's own (not the spin before it)
        fn()
        t1 = clock()
        p1 = cpu()
        q1 = int(pread(ss_fd, 64, 0).split()[1])
        r1 = getru(who)
        c_b = getcpu()
        record(intended, t1, tid, r1.ru_nivcsw - r0.ru_nivcsw, r1.ru_nvcsw - r0.ru_nvcsw,
               r1.ru_minflt - r0.ru_minflt, r1.ru_majflt - r0.ru_majflt, p1 - p0, q1 - q0,
               c_a, c_b)
        i += 1
        if i % 512 == 0 and os.getppid() != parent:
            break  # watch is gone
        if t1 > intended + 50 * period:
            # Far behind (a long stall): restart the schedule instead of a burst of
            # back-to-back calls that would measure the backlog, not the host.
            begin = clock() + period
            i = 0
    ring.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hftagent-probe-worker")
    ap.add_argument("--ring", required=True)
    ap.add_argument("--rate", type=float, default=500.0, help="calls per second; 0 = auto")
    ap.add_argument("--cpus", default="")
    ap.add_argument("--probe", choices=("tf", "numpy"), default="tf")
    ap.add_argument("--model", default="lstm")
    ap.add_argument("--variant", default="xla")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--duration", type=float, default=0.0)
    ap.add_argument("--capacity", type=int, default=1 << 15)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
