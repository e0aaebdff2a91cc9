"""How often the watch numpy probe's own call runs far over its usual CPU time with nothing
else to show for it, and whether the other CPU's load changes that.

    .venv/bin/python bench/own_slowdown.py [--cpu 1] [--other 0] [--blocks 10] [--calls 400]

The probe's call (agent.watch.probe_worker.build_numpy_probe) runs pinned to ``--cpu`` at
500 Hz, paced as watch paces it (sleep, then spin up to the start), in blocks of ``--calls``
calls while ``--other`` is idle, runs a busy loop, or runs a numpy loop over 64 MiB (memory
traffic); the blocks' order is shuffled (``--seed``). Per load: the calls' CPU time
(CLOCK_THREAD_CPUTIME) P50 / P99 / P99.9 and how many ran over 2× the idle P50. Such calls
are the ones watch leaves unexplained when no event, fault or move shows a cause
(docs/benchmarks.md). Needs no root; starts only its own children, killed after each block.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.watch.probe_worker import build_numpy_probe  # noqa: E402

LOADS = {
    "idle": None,
    "spin": "import os,sys\nos.sched_setaffinity(0,[int(sys.argv[1])])\nx=0\nwhile True: x+=1\n",
    "memory": "import os,sys,numpy as np\nos.sched_setaffinity(0,[int(sys.argv[1])])\n"
              "a=np.ones(64*1024*1024//8)\nwhile True: a+=1.0\n",
}


def block(fn, calls: int, period_ns: int = 2_000_000, spin_ns: int = 300_000) -> list[int]:
    out = []
    n = time.monotonic_ns()
    for _ in range(calls):
        n += period_ns
        while time.monotonic_ns() < n - spin_ns:
            time.sleep(0.0002)
        while time.monotonic_ns() < n:
            pass
        c = time.thread_time_ns()
        fn()
        out.append(time.thread_time_ns() - c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=1, help="the probe's CPU")
    ap.add_argument("--other", type=int, default=0, help="the CPU the load runs on")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per load")
    ap.add_argument("--calls", type=int, default=400, help="calls per block")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    online = os.sched_getaffinity(0)
    if args.cpu not in online or args.other not in online or args.cpu == args.other:
        print(f"own_slowdown: --cpu and --other must be two CPUs of {sorted(online)}",
              file=sys.stderr)
        return 2
    os.sched_setaffinity(0, [args.cpu])
    fn, _ = build_numpy_probe()
    for _ in range(100):
        fn()
    res: dict[str, list[int]] = {k: [] for k in LOADS}
    order = list(LOADS) * args.blocks
    random.Random(args.seed).shuffle(order)
    for k in order:
        child = subprocess.Popen([sys.executable, "-c", LOADS[k], str(args.other)]) \
            if LOADS[k] else None
        try:
            time.sleep(0.3)
            res[k].extend(block(fn, args.calls))
        finally:
            if child is not None:
                child.kill()
                child.wait()
    idle_p50 = statistics.median(res["idle"])
    out = {}
    for k, v in res.items():
        v.sort()
        out[k] = {"calls": len(v), "p50_us": round(v[len(v) // 2] / 1e3, 1),
                  "p99_us": round(v[int(len(v) * 0.99)] / 1e3, 1),
                  "p999_us": round(v[int(len(v) * 0.999)] / 1e3, 1),
                  "over_2x_idle_p50": sum(1 for x in v if x > 2 * idle_p50)}
        o = out[k]
        print(f"{k:7} calls {o['calls']}  CPU time P50 {o['p50_us']} P99 {o['p99_us']} "
              f"P99.9 {o['p999_us']} µs  over 2× the idle P50: {o['over_2x_idle_p50']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": out}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
