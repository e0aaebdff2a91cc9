"""Are the kernel events of a sample there when watch reads its window, and on the probe's
clock? For the CPU the probe uses (default: the last one).

    sudo .venv/bin/python bench/events_fresh.py [--cpu N] [--sleeps 200] [--json F]

Opens watch's event source (agent.trace.EventSource, ``--trace mount`` semantics)
on ``--cpu``; a child pinned there sleeps 1 ms ``--sleeps`` times, reading
CLOCK_MONOTONIC before and after each sleep, and then sleeps 0.1 ms in a loop (a switch
every ~0.1-0.2 ms). Each sleep's switch-out
(``sched_switch`` with the child as ``prev``) must lie between the two clock reads around
it (the trace clock is ``mono``); the bench reports how many do and the offsets. Then,
while the child spins, it reads windows ending ``--lag-ms`` ago (0, 1, 5, 20, 60) and
reports how far each window's events reach: the time from the newest event to the
window's end (~0.1-0.2 ms where the read gets what the kernel holds; up to a ring page's
worth of events, ~10 ms at that rate, where it only gets full pages). Touches only its own instance and child.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.trace import EventSource  # noqa: E402
from agent.trace.tracefs import Unsupported  # noqa: E402
from collectors.host import Host  # noqa: E402

CHILD = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
n = int(sys.argv[2])
t = []
for _ in range(n):
    t.append(time.monotonic_ns())
    time.sleep(0.001)
t.append(time.monotonic_ns())
print(*t, flush=True)
end = time.monotonic_ns() + int(float(sys.argv[3]) * 1e9)
while time.monotonic_ns() < end:
    time.sleep(0.0001)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    ap.add_argument("--sleeps", type=int, default=200)
    ap.add_argument("--spin-s", type=float, default=3.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.cpu not in os.sched_getaffinity(0):
        print(f"events_fresh: CPU {args.cpu} is not one of this process's", file=sys.stderr)
        return 2
    src = EventSource.open(Host(), [args.cpu], buffer_s=5.0, mount=True)
    if isinstance(src, Unsupported):
        print(f"events_fresh: {src.reason}", file=sys.stderr)
        return 2
    out: dict = {"cpu": args.cpu, "source": src.describe()}
    try:
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(args.cpu),
                                  str(args.sleeps), str(args.spin_s)],
                                 stdout=subprocess.PIPE, text=True)
        stamps = list(map(int, child.stdout.readline().split()))
        first, last = stamps[0], stamps[-1]
        time.sleep(0.1)
        win = src.window(first, last)
        outs = sorted(e.ts_ns for e in win.events if e.name == "sched_switch"
                      and e.fields.get("prev_pid") == child.pid)
        inside, offsets = 0, []
        for a, b in zip(stamps, stamps[1:]):
            got = [ts for ts in outs if a - 5_000_000 < ts < b + 5_000_000]
            if any(a < ts < b for ts in got):
                inside += 1
            elif got:
                ts = min(got, key=lambda x: min(abs(x - a), abs(x - b)))
                offsets.append(ts - a if ts < a else ts - b)
        out["sleeps"] = len(stamps) - 1
        out["switch_outs_between_the_clock_reads"] = inside
        out["outside_offsets_us"] = [round(o / 1e3, 1) for o in offsets[:20]]
        # the sleep loop: windows ending lag ms ago, how far their events reach
        fresh = {}
        for lag_ms in (0, 1, 5, 20, 60):
            gaps = []
            for _ in range(10):
                time.sleep(0.03)
                end = time.monotonic_ns() - lag_ms * 1_000_000
                w = src.window(end - 5_000_000, end, margin_ns=0)
                evs = [e.ts_ns for e in w.events]
                gaps.append((end - max(evs)) / 1e3 if evs else None)
            have = [g for g in gaps if g is not None]
            fresh[str(lag_ms)] = {"newest_event_before_end_us_median":
                                  round(statistics.median(have), 1) if have else None,
                                  "max": round(max(have), 1) if have else None,
                                  "windows_without_events": gaps.count(None)}
        out["freshness"] = fresh
        out["rate_per_s"] = {str(c): round(r) for c, r in src.rate().items()}
        child.wait(timeout=30)
    finally:
        src.close()
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
