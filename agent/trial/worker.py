"""The probe child of one ``tune try`` block (started through ``hftagent run``, which pinned it
and holds the block's PM QoS request or keep-awake spinners while it lives).

``python -m agent.trial.worker --rate R --seconds S --out FILE [--workload numpy|tflite]``:
builds watch's numpy LSTM-shaped probe (agent/watch/probe_worker.py; ``tflite``: the bundled
LSTM .tflite on LiteRT, no TensorFlow), warms it up, then calls it open loop at R calls/s for
S seconds (agent/probe/harness.time_loop: a fixed schedule, so the CPU idles between calls —
wake-up levers only matter then) and saves every call's response time (ns, from its intended
start) to FILE as a .npy array, created O_EXCL|O_NOFOLLOW (FILE's directory is the parent's
private temporary one). Exit 0, or 2 with one line on stderr. SIGINT/SIGTERM: exit 1 quietly
(the parent is stopping too).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

TFLITE_MODEL = Path(__file__).resolve().parents[2] / "bench" / "models" / "lstm-64x32.tflite"


def build(workload: str):
    from agent.watch.probe_worker import build_numpy_probe, build_tf_probe
    if workload == "tflite":
        return build_tf_probe(str(TFLITE_MODEL), "tflite", 1)[0]
    return build_numpy_probe()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hftagent-try-worker")
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workload", choices=("numpy", "tflite"), default="numpy")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(1))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # before numpy: one CPU, one BLAS thread
    try:
        import numpy as np

        from agent.probe.harness import time_loop, warm_up
        fn = build(args.workload)
        warm_up(fn, 200, budget_ns=5_000_000_000)
        n = int(args.seconds * args.rate) + 1
        s = time_loop(fn, n, args.rate,
                      deadline_ns=time.perf_counter_ns() + int(args.seconds * 1e9))
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(s.response_ns, dtype=np.int64))
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        print(f"hftagent-try-worker: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
