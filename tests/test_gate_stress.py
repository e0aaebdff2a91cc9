"""agent/gate/stress.py: the housekeeping load runs where it is told, records what it achieved,
and a part that did not run is reported short."""

from __future__ import annotations

import os
import time

import pytest

from agent.gate import stress


@pytest.mark.slow
def test_builtin_load_runs_pinned_and_reports_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTAGENT_STRESS_DIR", str(tmp_path))
    cpu = sorted(os.sched_getaffinity(0))[0]
    with stress.housekeeping_load([cpu], seconds=30, use_stress_ng=False) as rep:
        # four Python workers start on one CPU, each importing numpy: on a CPU that also
        # runs a busy loop they get a fifth of it each, so 1 s left cpu_cache nothing done
        time.sleep(4.0)
    assert rep.tool == "builtin" and set(rep.rates) == set(stress.PARTS), rep.errors
    assert not rep.short, rep.short
    assert list(tmp_path.iterdir()) == []          # the fsync file is removed


def test_short_parts_are_named():
    rep = stress.LoadReport([0], "builtin", rates={"cpu_cache": 900.0, "net": 10.0,
                                                   "disk": 40.0},
                            errors={"alloc": "MemoryError"})
    assert set(rep.short) == {"net", "alloc"}
    assert "packets/s" in rep.short["net"]


def test_stress_ng_metrics_parser():
    text = """stress-ng: info:  [812] dispatching hogs: 1 cache, 1 udp, 1 hdd, 1 vm
stress-ng: metrc: [812] stressor       bogo ops real time  usr time  sys time   bogo ops/s     bogo ops/s
stress-ng: metrc: [812]                           (secs)    (secs)    (secs)   (real time) (usr+sys time)
stress-ng: metrc: [812] cache              1234     10.00      9.90      0.01       123.40        124.52
stress-ng: metrc: [812] udp              990000     10.00      1.00      8.00     99000.00     110000.00
stress-ng: info:  [812] hdd                 500     10.01      0.10      1.00        49.95        454.00
"""
    assert stress.parse_stress_ng_metrics(text) == {"cpu_cache": 123.4, "net": 99000.0,
                                                    "disk": 50.0}  # vm: no row


def test_no_housekeeping_cpu_is_refused():
    with pytest.raises(ValueError), stress.housekeeping_load([]):
        pass
