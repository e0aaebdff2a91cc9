"""What the event source's wake instance costs the host (issue #26): its filtered
``sched_waking``, ``signal_generate`` and ``hrtimer_start`` fire their tracepoints on every
wake-up and every sleep's timer of the host, the filter evaluated per hit.

Interleaved rounds (each mode in turn, so drift hits all alike), medians:

- a pipe ping-pong pinned to one CPU (``--round-trips``, 2 wake-ups and 2 switches each),
  µs per round trip, on a CPU the source does not trace and on the probe CPU;
- ``time.sleep(10 µs)`` calls pinned to one CPU (``--sleeps``), CPU µs per call (each arms a
  sleep's hrtimer: the wake instance's ``hrtimer_start`` on the probe CPU);

with no instance, the main instance only (the wake instance left out), both, and both with
``hrtimer_start`` enabled (kallsyms loaded and one window read, as in a run).

    sudo .venv/bin/python bench/wake_cost.py [--rounds 6] [--probe-cpu 1] [--other-cpu 0]

Needs root and tracefs mounted; prints a table and, with ``--json``, the raw figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.trace import wake  # noqa: E402
from agent.trace.tracefs import EventSource  # noqa: E402
from collectors.host import Host  # noqa: E402

MODES = ("none", "main", "both", "timers")


def ping_pong(cpu: int, n: int) -> float:
    """µs per round trip of a pipe ping-pong between two processes pinned to ``cpu``."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.sched_setaffinity(0, {cpu})
        while (b := os.read(r1, 1)) and b != b"q":
            os.write(w2, b"x")
        os._exit(0)
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            os.write(w1, b"x")
            os.read(r2, 1)
        dt = time.perf_counter_ns() - t0
    finally:
        os.write(w1, b"q")
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, old)
        for fd in (r1, w1, r2, w2):
            os.close(fd)
    return dt / n / 1e3


def sleeps(cpu: int, n: int) -> float:
    """CPU µs per ``time.sleep(10 µs)`` of a process pinned to ``cpu``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.sched_setaffinity(0, {cpu})
        t0 = time.thread_time_ns()
        for _ in range(n):
            time.sleep(0.00001)
        os.write(w, str((time.thread_time_ns() - t0) / n / 1e3).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    out = float(os.read(r, 64))
    os.close(r)
    os.close(w)
    return out


def open_source(mode: str, probe_cpu: int):
    if mode == "none":
        return None
    saved = wake.WAKE_EVENTS
    if mode == "main":
        wake.WAKE_EVENTS = ()  # the wake instance then has nothing to enable: not made
    try:
        src = EventSource.open(Host(), [probe_cpu], 2.0)
    finally:
        wake.WAKE_EVENTS = saved
    if not src:
        raise SystemExit(f"wake_cost: {src.reason}")
    # kallsyms loaded first, as ~0.3 s into a run: its loader thread would otherwise hold
    # this process's GIL during the measurement (a ping-pong 2.5x slower, whatever traced)
    src._symbols(0)
    if mode == "timers":
        now = time.monotonic_ns()
        src.window(now - 1_000_000, now)  # the first window enables hrtimer_start
        if src.timer_starts != "on":
            print(f"wake_cost: hrtimer_start: {src.timer_starts}", file=sys.stderr)
    return src


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--probe-cpu", type=int, default=1)
    ap.add_argument("--other-cpu", type=int, default=0)
    ap.add_argument("--round-trips", type=int, default=20_000)
    ap.add_argument("--sleeps", type=int, default=3_000)
    ap.add_argument("--json")
    args = ap.parse_args()
    cpus = (args.other_cpu, args.probe_cpu)
    if args.rounds < 1 or any(c not in os.sched_getaffinity(0) for c in cpus):
        print("wake_cost: --rounds must be ≥ 1 and the CPUs allowed here", file=sys.stderr)
        return 2
    res: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            for cpu in cpus:
                for what, fn, n in (("ping_pong_us", ping_pong, args.round_trips),
                                    ("sleep_cpu_us", sleeps, args.sleeps)):
                    src = open_source(mode, args.probe_cpu)
                    try:
                        res.setdefault(f"{what} {mode} cpu{cpu}", []).append(fn(cpu, n))
                    finally:
                        if src is not None:
                            src.close()
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    print(f"{'':14}{'':8}" + "".join(f"{m:>10}" for m in MODES))
    for what in ("ping_pong_us", "sleep_cpu_us"):
        for cpu in cpus:
            tag = "probe" if cpu == args.probe_cpu else "other"
            print(f"{what:14}{tag + ' ' + str(cpu):8}" +
                  "".join(f"{med[f'{what} {m} cpu{cpu}']:>10.2f}" for m in MODES))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "median": med, "runs": res}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
