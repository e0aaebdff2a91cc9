"""What ``watch --attach --pmu`` adds to each timed call (issue #35 item 2e), side by side with
the attach alone.

    sudo .venv/bin/python bench/pmu_overhead.py [--cpu N] [--pairs 10] [--calls 10000]
                                                [--rate 2000] [--counters software|hardware]

A loop in its own process pinned to ``--cpu`` calls a C function of a library built here
(``hft_infer(100)``, ~1 µs a call through ctypes, so that the blocks' own drift stays
sub-µs), ``--rate`` calls a second (paced by spinning), and times each call with
``time.perf_counter_ns``. watch's uprobes (entry + return,
agent/trace/attach.py's plan, agent/trace/uprobe.py, enabled in a private tracefs instance
as ``watch --attach`` does) stay on for the whole run; blocks of ``--calls`` calls alternate
ABBA between that alone (``attach``) and that plus the per-thread perf groups of
agent/trace/pmu.py (``attach+pmu``: perf's own entry and return uprobes sampling the group
at each hit into the thread's ring), the rings drained every 20 ms from this process on
another CPU while the block runs (as watch's loop does). ``--counters software`` (the
default: task-clock, page faults, context switches) runs on any box; ``hardware`` (cycles,
instructions, task-clock) needs a PMU.

Reported: the added µs per call at P50 and P99 (per pair of adjacent blocks, the pmu block's
quantile minus the attach block's; median over pairs with a 95 % bootstrap interval, as
bench/attach_overhead.py), both arms' P50, the samples read per call (2: none lost) and
watch's side, the drain's CPU µs per call (its thread's CPU clock over the calls).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.attach_overhead import paired_diff  # noqa: E402

LIB_C = "int hft_infer(int n) { volatile int s = 0; for (int i = 0; i < n; i++) s += i; " \
        "return s; }\n"
CHILD = r"""
import ctypes, os, sys, time, numpy as np
os.sched_setaffinity(0, {int(sys.argv[2])})
lib = ctypes.CDLL(sys.argv[1]); f = lib.hft_infer
clock = time.perf_counter_ns
for _ in range(2000):
    f(100)
print("ready", flush=True)
period = int(1e9 / float(sys.argv[3]))
for line in sys.stdin:
    n, out = line.split()
    t = np.empty((int(n), 2), dtype=np.int64)
    due = clock()
    for k in range(int(n)):
        due += period
        while clock() < due:   # paced by spinning: no sleep's wake-up in the timed call
            pass
        a = clock(); f(100); b = clock()
        t[k, 0] = a; t[k, 1] = b
    np.save(out, t)
    print("done", flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--counters", choices=("software", "hardware"), default="software")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("pmu_overhead: needs root (uprobes, perf)", file=sys.stderr)
        return 2
    from agent.trace import attach, pmu, uprobe
    from agent.trace.tracefs import EventSource
    from agent.watch.attribution.pmu import probes
    from collectors.host import Host
    counters = pmu.SOFTWARE if args.counters == "software" else pmu.HARDWARE
    host = Host()
    tmp = Path(tempfile.mkdtemp(prefix="pmu-ab-"))
    (tmp / "infer.c").write_text(LIB_C)
    lib = tmp / "libhftinfer.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp / "infer.c")],
                   check=True)
    others = sorted(os.sched_getaffinity(0) - {args.cpu})
    if others:
        os.sched_setaffinity(0, others)   # the drain runs beside the loop, not on its CPU
    src = EventSource.open(host, [args.cpu], buffer_s=4, mount=True)
    if not src:
        print(f"pmu_overhead: {src.reason}", file=sys.stderr)
        return 2
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(lib), str(args.cpu),
                              str(args.rate)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    u = None
    blocks: dict[str, list[np.ndarray]] = {"attach": [], "attach+pmu": []}
    per_call: list[float] = []
    drain_us: list[float] = []
    try:
        if child.stdout.readline().strip() != "ready":
            print("pmu_overhead: the loop did not start", file=sys.stderr)
            return 2
        why = pmu.probe(child.pid, counters)
        if why:
            print(f"pmu_overhead: {args.counters} counters: {why}", file=sys.stderr)
            return 2
        plan = attach.plan(host, child.pid, "auto", f"{lib.name}:hft_infer",
                           unsafe_return=True)
        u = uprobe.Uprobes(src.tracefs, plan.targets)
        u.define()
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        src.add_uprobes(u, tids)
        order: list[str] = []
        for j in range(args.pairs):  # ABBA
            order += ["attach", "attach+pmu"] if j % 2 == 0 else ["attach+pmu", "attach"]
        for k, arm in enumerate(order):
            c = None
            stop = threading.Event()
            read = [0, 0]
            if arm == "attach+pmu":
                c = pmu.Counters(probes(u), counters)
                c.set_threads(tids)

                def drain(c=c, stop=stop, read=read) -> None:
                    t0 = time.thread_time_ns()
                    while not stop.wait(0.02):
                        read[0] += c.read()
                    read[1] = time.thread_time_ns() - t0
                t = threading.Thread(target=drain, daemon=True)
                t.start()
            out = tmp / f"b{k}.npy"
            child.stdin.write(f"{args.calls} {out}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
            src.uprobe_events()   # watch's own read of its trace events, both arms
            if c is not None:
                stop.set()
                t.join()
                read[0] += c.read()
                per_call.append(read[0] / args.calls)
                drain_us.append(read[1] / 1e3 / args.calls)
                c.close()
            tm = np.load(out)
            lat = tm[:, 1] - tm[:, 0]
            blocks[arm].append(lat)
            print(f"block {k + 1}/{len(order)} {arm}: P50 {np.median(lat) / 1e3:.2f} µs"
                  + (f", {per_call[-1]:.2f} samples a call" if c is not None else ""),
                  file=sys.stderr, flush=True)
    finally:
        child.stdin.close()
        child.kill()
        child.wait()
        if u is not None:
            u.remove()
        src.close()
    on, off = blocks["attach+pmu"], blocks["attach"]
    p50, p99 = paired_diff(on, off, 0.5), paired_diff(on, off, 0.99)
    print(f"{args.counters} counters, {args.pairs} pairs × {args.calls} calls on CPU "
          f"{args.cpu}: P50 attach {np.median(np.concatenate(off)) / 1e3:.2f} µs, "
          f"attach+pmu {np.median(np.concatenate(on)) / 1e3:.2f} µs; added per call: P50 "
          f"{p50['added_us']:+.2f} µs [{p50['ci_us'][0]:+.2f}, {p50['ci_us'][1]:+.2f}], P99 "
          f"{p99['added_us']:+.2f} µs [{p99['ci_us'][0]:+.2f}, {p99['ci_us'][1]:+.2f}]; "
          f"{np.median(per_call):.2f} samples read a call, the drain "
          f"{np.median(drain_us):.2f} µs of watch's CPU a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
