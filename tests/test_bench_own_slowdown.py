"""bench/own_slowdown.py refuses CPUs it cannot use with one line and exit 2 (before it
builds the probe or starts any load)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "own_slowdown.py"


def test_the_same_cpu_twice_or_one_not_online_is_one_line():
    for args in (["--cpu", "0", "--other", "0"], ["--cpu", "4096", "--other", "0"]):
        p = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith("own_slowdown: ") and p.stderr.count("\n") == 1
        assert p.stdout == ""
