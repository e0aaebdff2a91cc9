"""Benchmark: `hftagent audit` as a whole process (Python start included), median of N.

    .venv/bin/python bench/audit_bench.py [--runs 5]

Side by side in one run, to read ratios on a noisy shared machine:
  - bare `python -c pass` (interpreter start floor)
  - `hftagent --help` (CLI import cost; target: <= 0.2 s median, issue #15)
  - `hftagent audit --json` on this host (target: <= 0.5 s median, issue #15)
  - `hftagent audit --json --steal-window 0` (without the 0.2 s steal-measurement window)
  - py-cpuinfo's get_cpu_info() alone (why it is kept off the critical path)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
HFT = str(VENV_BIN / "hftagent")

CASES = [
    ("python -c pass", [sys.executable, "-c", "pass"]),
    ("hftagent --help", [HFT, "--help"]),
    ("hftagent audit --json", [HFT, "audit", "--json"]),
    ("hftagent audit --json --steal-window 0", [HFT, "audit", "--json", "--steal-window", "0"]),
    ("py-cpuinfo get_cpu_info()", [sys.executable, "-c",
                                   "import cpuinfo; cpuinfo.get_cpu_info()"]),
]

# Start-up targets, seconds of wall time (median), on the 2-core development VM
TARGETS = {"hftagent --help": 0.2, "hftagent audit --json": 0.5}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {name: [] for name, _ in CASES}
    for _ in range(args.runs):  # interleaved: each round runs every case once
        for name, cmd in CASES:
            t0 = time.perf_counter()
            rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            dt = time.perf_counter() - t0
            if rc not in (0, 2):
                sys.exit(f"{name}: exit {rc}")
            times[name].append(dt)
    print(f"{'case':45s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for name, ts in times.items():
        print(f"{name:45s} {statistics.median(ts):9.3f} {min(ts):7.3f} {max(ts):7.3f}")
    failed = False
    print()
    for name, target in TARGETS.items():
        med = statistics.median(times[name])
        ok = med <= target
        failed |= not ok
        print(f"{name}: median {med:.3f} s: {'PASS' if ok else 'FAIL'} (target <= {target} s)")
    sys.exit(1 if failed else 0)

if __name__ == "__main__":
    main()
