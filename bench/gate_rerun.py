"""How often does the gate fail an identical rerun on a busy box, and how often does it catch a
real regression? (issue #39 item 3: 20 identical reruns, 0 fail; SCHED_FIFO bursts on the
probe CPU, ≥ 95 % fail.)

Run (root for SCHED_FIFO; without it the bursts run SCHED_OTHER and the line says so):

    .venv/bin/python bench/gate_rerun.py --reruns 20 --bursts 20 [--cpu N] [--json OUT]

On one fresh history database the whole time (a temporary directory):

1. a busy loop is pinned on each housekeeping CPU (every CPU this process may use but the
   probe's) for the whole run: the busy box;
2. one ``hftagent gate`` run records the baseline (probed now; no baseline of its own);
3. ``--reruns`` identical gate runs, each against that first run (``--baseline ID``, so that
   every one has short history and runs its interleaved control; ``--against last-pass``
   lets history grow as in CI instead): each failure is a false fail;
4. ``--bursts`` gate runs against the same baseline while a periodic hog bursts on the probe
   CPU as tests/test_gate_e2e.py makes it (SCHED_FIFO 1 where permitted: it preempts the
   probe at once; busy 2.5 × the baseline's P99, at least 2 ms, then idle 4 × that or 25 ×
   its P50, whichever is shorter): each pass is a regression missed.

Every gate is the command as a user runs it (``--model numpy``, TF-free, by default; gate
options after ``--`` are passed on). Printed: each run's status, which comparison decided
(``history`` or ``control``), the failing checks, and the two rates with their exact 95 %
intervals (Clopper-Pearson).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
RT_HOG = 1
BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
if int(sys.argv[4]):
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(sys.argv[4])))
    except OSError:
        print("sched_other", flush=True)
busy, idle = int(sys.argv[2]), int(sys.argv[3])
clock = time.perf_counter_ns
print("ready", flush=True)
while True:
    end = clock() + busy
    while clock() < end:
        pass
    time.sleep(idle / 1e9)
"""


def gate(db: Path, cpu: int, extra: list[str], baseline: str | None) -> dict:
    """One ``hftagent gate --json`` run: its exit status and its one verdict."""
    args = ["gate", "--db", str(db), "--cpus", str(cpu), "--json", *extra]
    if baseline is not None:
        args += ["--baseline", baseline]
    p = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)
    try:
        (v,) = json.loads(p.stdout)["verdicts"]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"gate gave no verdict (exit {p.returncode}): {p.stderr[-800:]}") from None
    return {"exit": p.returncode, "status": v["status"], "decided_by": v.get("decided_by"),
            "current": v["current"], "failed": [c["name"] for c in v["checks"]
                                                if c["status"] == "fail"]}


@contextlib.contextmanager
def busy_loops(cpus: list[int]) -> Iterator[None]:
    """A busy loop pinned on each CPU of ``cpus``, ended on every exit path."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(c)]) for c in cpus]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def bursts(cpu: int, p50_ns: int, p99_ns: int) -> Iterator[str]:
    """The periodic hog of tests/test_gate_e2e.py (start_hog) on ``cpu``; yields its policy."""
    busy = max(2_000_000, int(2.5 * p99_ns))
    idle = min(4 * busy, 25 * int(p50_ns))
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpu), str(busy), str(idle),
                            str(RT_HOG)], stdout=subprocess.PIPE, text=True)
    try:
        first = hog.stdout.readline().strip()
        policy = "SCHED_OTHER (SCHED_FIFO refused)" if first == "sched_other" else "SCHED_FIFO"
        if first == "sched_other":
            first = hog.stdout.readline().strip()
        if first != "ready":
            raise SystemExit(f"the hog did not start (status {hog.poll()})")
        yield f"{policy}, busy {busy / 1e6:.1f} ms, idle {idle / 1e6:.1f} ms"
    finally:
        hog.kill()
        hog.wait()
        hog.stdout.close()


def rate(k: int, n: int) -> str:
    from agent.stats import clopper_pearson
    if not n:
        return "no runs"
    lo, hi = clopper_pearson(k, n, 0.95)
    return f"{k}/{n} = {k / n:.0%} (exact 95% [{lo:.0%}, {hi:.0%}])"


def baseline_latency(db: Path, run: str) -> tuple[int, int]:
    from agent.history import History
    with History(db, create=False) as h:
        r = h.get(int(run.split()[-1]))
        return int(r.p50_ns), int(r.p99_ns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reruns", type=int, default=20)
    ap.add_argument("--bursts", type=int, default=20)
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the probe CPU (default: the highest this process may use)")
    ap.add_argument("--against", choices=("first", "last-pass"), default="first")
    ap.add_argument("--json", metavar="OUT", help="write every run's result here")
    ap.add_argument("gate_args", nargs="*", help="after --: options for every gate run "
                    "(default: --model numpy)")
    a = ap.parse_args()
    extra = a.gate_args or ["--model", "numpy"]
    house = sorted(set(os.sched_getaffinity(0)) - {a.cpu})
    out: dict = {"probe_cpu": a.cpu, "busy_cpus": house, "gate_args": extra, "reruns": [],
                 "bursts": []}
    with tempfile.TemporaryDirectory() as td, busy_loops(house):
        db = Path(td) / "history.sqlite"
        first = gate(db, a.cpu, extra, None)
        rid = first["current"].split()[-1]
        print(f"baseline {first['current']}: {first['status']} (busy loops on CPUs {house})")
        base = rid if a.against == "first" else None
        for i in range(a.reruns):
            r = gate(db, a.cpu, extra, base)
            out["reruns"].append(r)
            print(f"rerun {i + 1}: {r['status']} by {r['decided_by']} {r['failed'] or ''}")
        p50, p99 = baseline_latency(db, first["current"])
        with bursts(a.cpu, p50, p99) as how:
            print(f"bursts on CPU {a.cpu}: {how}")
            out["hog"] = how
            for i in range(a.bursts):
                r = gate(db, a.cpu, extra, rid)
                out["bursts"].append(r)
                print(f"burst run {i + 1}: {r['status']} by {r['decided_by']} {r['failed']}")
    false_fails = sum(r["status"] == "fail" for r in out["reruns"])
    caught = sum(r["status"] == "fail" for r in out["bursts"])
    print(f"identical reruns failed: {rate(false_fails, len(out['reruns']))}")
    print(f"runs with bursts failed: {rate(caught, len(out['bursts']))}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
