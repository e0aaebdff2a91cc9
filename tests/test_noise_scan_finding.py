"""`audit --noise`'s finding (agent/noise/scan.py audit_finding): a single target CPU between
the absolute limits is 'unranked', never called quiet (issue #28), quiet ones still are."""

from __future__ import annotations

import numpy as np

from agent.noise import scan as scan_mod
from agent.noise.rank import CpuNoise
from tuning.findings import Status


def _cpu(cpu: int, lost_us_per_s: float) -> CpuNoise:
    return CpuNoise(cpu=cpu, duration_s=1.0, gaps=100, sum_gap_ns=int(lost_us_per_s * 1e3),
                    max_gap_ns=50_000, gap_ns=np.full(100, int(lost_us_per_s * 10)))


def test_one_target_between_the_limits_is_unranked_not_quiet(monkeypatch):
    monkeypatch.setattr(scan_mod, "scan", lambda *a, **k: [_cpu(1, 15_000)])
    f = scan_mod.audit_finding(None, [1], [0], 2, 1.0)
    assert "all 1 quiet" not in f.current and "CPU 1 unranked" in f.current, f.current
    assert "two candidates" in f.current and f.status is Status.OK


def test_quiet_targets_are_still_quiet(monkeypatch):
    monkeypatch.setattr(scan_mod, "scan", lambda *a, **k: [_cpu(1, 20), _cpu(2, 25)])
    f = scan_mod.audit_finding(None, [1, 2], [0], 3, 1.0)
    assert f.current.startswith("all 2 quiet"), f.current
