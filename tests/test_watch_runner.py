"""agent/watch/runner.py: the summary's own-cost figures (issue #26's budget), and their line."""

from __future__ import annotations

from types import SimpleNamespace

from agent.watch import report
from agent.watch.runner import _own_cpu


def _summary(active: bool, dur: float = 10.0) -> dict:
    return {"duration_s": dur, "sampler": {"cpu_share_of_one_cpu": 0.012},
            "events": {"active": active, "windows": 4, "mean_read_us": 500.0}}


def test_own_cpu_is_the_sampler_plus_the_event_reads():
    s = _summary(True)
    _own_cpu(SimpleNamespace(trace=SimpleNamespace(read_cpu_ns=20_000_000)), s)
    assert s["events"]["read_cpu_share_of_one_cpu"] == 0.002  # 20 ms of CPU over 10 s
    assert s["own_cpu_share_of_one_cpu"] == 0.014
    assert "(0.20 % of one CPU)" in report.events(s)[0]


def test_without_events_own_cpu_is_the_samplers_and_no_share_is_invented():
    s = _summary(False)
    _own_cpu(SimpleNamespace(trace=SimpleNamespace(read_cpu_ns=0)), s)
    assert "read_cpu_share_of_one_cpu" not in s["events"]
    assert s["own_cpu_share_of_one_cpu"] == 0.012
    s = _summary(True, dur=0.0)  # stopped before the first round
    _own_cpu(SimpleNamespace(trace=SimpleNamespace(read_cpu_ns=5)), s)
    assert s["events"]["read_cpu_share_of_one_cpu"] is None
