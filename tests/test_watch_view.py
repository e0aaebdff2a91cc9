"""The live view's line of where a slow call's thread spent its wall time (issue #26 item 2):
on the CPU, runnable, not runnable with its state and waker, the wake-up, unknown."""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace

from rich.console import Console

from agent.trace.text import parse_text
from agent.trace.timeline import timeline
from agent.watch.view import format_states, render
from tests.eventpages import trace_line as line
from tests.eventpages import trace_switch as sw

PROBE = 4242
T0, T1 = 100_001_000_000, 100_006_000_000


def _tl() -> dict:
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        line("holder", 4243, "100.005100", f"sched_waking: comm=probe pid={PROBE} prio=120 "
             "target_cpu=001"),
        sw("holder", 4243, "100.005150", "probe", PROBE, "S"),
    ])
    tl = timeline(parse_text(text.splitlines()), 1, {PROBE}, T0, T1, follow=True, probe_pid=4240,
                  tgid_of={4243: 4240}.get, comms={4243: "holder"})
    return tl.to_dict()


def test_the_states_line_names_the_not_runnable_part_and_its_waker():
    assert format_states(_tl()) == (
        "on CPU 0.9 ms · runnable 50 µs · not runnable 4.0 ms (S 4.0 ms, woken by thread "
        "4243 of the same process (holder))")
    assert format_states({}) == ""  # no followed thread: no line


def test_the_live_view_shows_it_under_the_spikes_breakdown():
    rec = {"time": "2026-12-01T10:00:00.123456", "latency_us": 5000.0, "cause": "blocked",
           "causes": [{"detail": "blocked (S), woken by ..."}],
           "events": {"summary": "4.0 ms blocked (S), woken by thread 4243 of the same "
                                 "process (holder)", "complete": True, "timeline": _tl()}}
    session = SimpleNamespace(
        rolling=lambda: None, probe_info={"probe": "service"},
        cfg=SimpleNamespace(probe_cpus=[1]), samples=10, spikes=1, attributed=1,
        cause_counts=Counter({"blocked": 1}), last_spikes=[rec], sampler=None)
    con = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(render(session))
    text = con.export_text()
    assert "not runnable 4.0 ms (S 4.0 ms, woken by thread 4243 of the same process" in text


def test_a_collector_that_has_not_run_shows_a_dash_not_none():
    """A collector with no run yet has no mean: the table says "—", never "None" (issue #39)."""
    class _St:
        def __init__(self, mean):
            self.mean = mean

        def to_dict(self):
            return {"state": "ok", "mean_us": self.mean}

    stats = SimpleNamespace(per_collector={"cpu": _St(None), "irq": _St(12.5)})
    session = SimpleNamespace(
        rolling=lambda: None, probe_info={"probe": "service"},
        cfg=SimpleNamespace(probe_cpus=[1]), samples=0, spikes=0, attributed=0,
        cause_counts=Counter(), last_spikes=[], sampler=SimpleNamespace(stats=stats))
    con = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(render(session))
    text = con.export_text()
    assert "None" not in text
    rows = [ln.replace("│", " ").split() for ln in text.splitlines()
            if ln.strip().startswith(("cpu", "irq"))]
    assert rows == [["cpu", "ok", "—"], ["irq", "ok", "12.5"]]
