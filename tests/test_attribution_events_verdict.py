"""Verdicts that agree with the call's own timeline (issue #35 item 1): built from the
kernel's event text through watch's wiring (SpikeEvents.for_spike + apply_verdict), with
the polled verdicts that went wrong on the GPU box and the dev VM, and bench/attribution.py's
count of verdicts that contradict a complete timeline (0 after, 1 before)."""

from __future__ import annotations

import copy

import pytest

from agent.trace.text import parse_text
from agent.trace.tracefs import Window
from agent.watch.attribution import verdict
from agent.watch.attribution.events import SpikeEvents, apply_verdict
from agent.watch.attribution.spike import Spike
from bench.attribution import contradiction
from tests.eventpages import trace_line as line
from tests.eventpages import trace_switch as sw

PROBE, PROC = 4242, 4240
T0, T1 = 100_001_000_000, 100_003_000_000  # a 2 ms call, P50 400 µs: 1.6 ms excess
P50 = 400_000


class Source:
    def __init__(self, text: str, complete: bool = True) -> None:
        self.events = parse_text(text.splitlines())
        self.complete = complete

    def __bool__(self) -> bool:
        return True

    def window(self, t_from, t_to, *, margin_ns=0, after_ns=0):
        return Window(t_from, t_to, self.events, read_ns=1_000, complete=self.complete,
                      reason=None if self.complete else "CPU 1: 12 events lost")


def _ticks(cpu: int, *at: str) -> list[str]:
    out = []
    for ts in at:
        out += [line("probe", PROBE, ts, "local_timer_entry: vector=236", "d.h1.", cpu=cpu),
                line("probe", PROBE, ts[:-1] + "3", "local_timer_exit: vector=236", "d.h1.",
                     cpu=cpu)]
    return out


def on_cpu_all_along(cpu: int = 1) -> str:
    """The call's thread on its CPU from before the call to after it: ticks only."""
    return "\n".join([sw(f"swapper/{cpu}", 0, "100.000500", "probe", PROBE, "R")
                      .replace("[001]", f"[{cpu:03d}]"),
                      *_ticks(cpu, "100.001500", "100.002500", "100.003200")])


WAITED = "\n".join([
    sw("swapper/1", 0, "100.000500", "probe", PROBE, "R"),
    sw("probe", PROBE, "100.001200", "tokio-rt-worker", 5150, "R+"),   # preempted
    sw("tokio-rt-worker", 5150, "100.002600", "probe", PROBE, "S"),
    *_ticks(1, "100.003200"),
])


def polled(cause: str, detail: str, evidence: dict | None = None, *more) -> dict:
    causes = [{"cause": cause, "score": 0.6, "strength": 0.8, "detail": detail,
               "evidence": evidence or {}}, *more]
    return {"cause": cause, "causes": causes, "latency_us": (T1 - T0) / 1e3,
            "p50_us": P50 / 1e3}


def attribute(text: str, body: dict, cpu: int = 1, complete: bool = True, **kw) -> dict:
    ev = SpikeEvents("on", None, [cpu], opener=lambda *a, **k: Source(text, complete))
    assert ev.open(0) is None
    sp = Spike(1, T0, T1, PROC, PROBE, P50, cpu_start=cpu, cpu_end=cpu, **kw)
    body = copy.deepcopy(body)
    body["seq"] = 1
    body["events"], triples = ev.for_spike(sp)
    before = copy.deepcopy(body)
    apply_verdict(body, triples, sp.excess_ns, lambda t: {5150: 5100}.get(t, t))
    body["_before"] = before
    return body


HEAVY_RQ = polled("cpu_contention", "thread waited 7651 µs on the run queue in the window; "
                  "kdamond.0 (pid 78) ran on CPU 1",
                  {"thread_rq_delay_window_us": 7651.0,
                   "ran_on_cpu": [{"comm": "kdamond.0", "pid": 78, "tid": 78, "cpu": 1}]})


@pytest.mark.parametrize("cpu_ns", [-1, 1_990_000])  # attached (none), the probe's own
def test_a_call_on_its_cpu_all_along_is_not_contention_whatever_the_window_polled(cpu_ns):
    rec = attribute(on_cpu_all_along(), HEAVY_RQ, cpu_ns=cpu_ns)
    assert rec["events"]["complete"] and rec["events"]["timeline"]["state_us"]["on_cpu"] == \
        2_000.0
    assert rec["cause"] == "unexplained" and rec["decided_by"] == "events"
    assert rec["polled_cause"] == "cpu_contention"
    assert "0 µs of time another task ran" in rec["contradicted"]["why"]
    lead = rec["causes"][0]
    assert lead["evidence"]["on_cpu_us"] == 2_000.0 and lead["evidence"]["runnable_us"] == 0
    assert lead["evidence"]["unexplained_us"] == pytest.approx(1_600, abs=10)
    assert "7651" not in lead["detail"] and "kdamond" not in lead["detail"]
    # bench/attribution.py: the polled verdict contradicted the timeline; the record does not
    assert contradiction(rec["_before"]) == "culprit not on the call's CPU"
    assert contradiction(rec) is None


def test_a_page_fault_call_keeps_the_polled_on_cpu_cause_not_contention():
    """The dev VM's page faults inside the calls: the in-process faults name it (the
    timeline cannot see them, so it does not contradict them); contention is ruled out."""
    body = polled("cpu_contention", "thread waited 2575 µs on the run queue in the window",
                  {"thread_rq_delay_window_us": 2575.0},
                  {"cause": "page_faults", "score": 0.3, "strength": 0.6,
                   "detail": "412 minor faults in the call", "evidence": {"minflt": 412}})
    rec = attribute(on_cpu_all_along(), body, cpu_ns=1_990_000, minflt=412)
    assert rec["cause"] == "page_faults" and rec["decided_by"] == "events+polled"
    assert rec["polled_cause"] == "cpu_contention"
    assert contradiction(rec) is None
    assert contradiction({**rec["_before"], "causes": rec["_before"]["causes"][:1]}) == \
        "cpu_contention not in the timeline"


def test_an_on_cpu_rule_decides_before_the_polled_causes(monkeypatch):
    """The place the on-CPU breakdown (issue #35 item 2) plugs in: a rule that names a cause
    from inside the thread's time on the CPU decides, ``decided_by: events``."""
    seen = []

    def hidden(body, ev, per, excess_ns):
        seen.append(ev["timeline"]["state_us"]["on_cpu"])
        return {"cause": "hidden", "score": 1.0, "strength": 1.0, "detail": "hidden",
                "evidence": {}}
    monkeypatch.setattr(verdict, "ON_CPU_RULES", [hidden])
    rec = attribute(on_cpu_all_along(), HEAVY_RQ, cpu_ns=-1)
    assert rec["cause"] == "hidden" and rec["decided_by"] == "events" and seen == [2_000.0]


def test_a_call_that_waited_is_contention_with_the_hog_the_timeline_shows():
    rec = attribute(WAITED, HEAVY_RQ, cpu_ns=600_000, nivcsw=1, rq_delay_ns=1_400_000)
    assert rec["cause"] == "cpu_contention" and rec["decided_by"] == "events"
    lead = rec["causes"][0]
    ran = lead["evidence"]["ran_on_cpu"]
    assert (ran[0]["comm"], ran[0]["tid"], ran[0]["pid"], ran[0]["cpu"]) == \
        ("tokio-rt-worker", 5150, 5100, 1)
    assert lead["evidence"]["polled_ran_on_cpu"][0]["comm"] == "kdamond.0"
    assert lead["detail"] == ("waited 1,400 µs for CPU 1 (kernel events); tokio-rt-worker "
                              "(pid 5100) ran on CPU 1")
    assert lead["polled_detail"].startswith("thread waited 7651 µs")
    assert contradiction(rec) is None
    assert contradiction(rec["_before"]) == "culprit not on the call's CPU"


STOPPER = polled("migration", "migration/1 stopper thread preempted the probe (13 "
                 "involuntary switch(es) in the window; migration/1 (pid 93) ran on CPU 1)",
                 {"thread_nivcsw_window": 13.0,
                  "ran_on_cpu": [{"comm": "migration/1", "pid": 93, "tid": 93, "cpu": 1}]})


def test_a_call_on_its_cpu_all_along_is_not_a_migration_the_window_polled():
    """The GPU box's gpu_big_copy spike: a stopper thread ran on the call's CPU somewhere in
    the polled window, the call's timeline shows it there throughout, never preempted by it:
    the verdict is contradicted (bench/attribution.py: "culprit not on the call's CPU")."""
    rec = attribute(on_cpu_all_along(), STOPPER, cpu_ns=-1)
    assert rec["cause"] != "migration" and rec["polled_cause"] == "migration"
    assert rec["contradicted"]["why"] == ("the timeline shows the thread on CPU 1 throughout "
                                          "and migration/1 running 0 µs in a 1,600 µs excess")
    assert contradiction(rec["_before"]) == "culprit not on the call's CPU"
    assert contradiction(rec) is None


def test_a_call_the_stopper_thread_preempted_keeps_its_migration_verdict():
    stopped = "\n".join([
        sw("swapper/1", 0, "100.000500", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001200", "migration/1", 93, "R+"),
        sw("migration/1", 93, "100.002600", "probe", PROBE, "S"),
        *_ticks(1, "100.003200")])
    rec = attribute(stopped, STOPPER, cpu_ns=-1)
    assert rec["cause"] == "migration" and "contradicted" not in rec


STEAL_CPU1 = polled("steal", "3 steal ticks on CPU 1 in the window: at least 20 ms stolen",
                    {"cpu.1.steal_ticks": {"window": 3.0}})


def test_steal_counted_on_another_cpu_never_names_a_call_on_cpu_14():
    rec = attribute(on_cpu_all_along(14), STEAL_CPU1, cpu=14, cpu_ns=-1)
    assert rec["events"]["timeline"]["cpu"] == 14
    assert rec["cause"] != "steal" and rec["decided_by"] == "events"
    assert rec["contradicted"]["why"] == "steal was counted on CPU 1; the call ran on CPU 14"
    assert contradiction(rec["_before"]) == "steal on another CPU"
    assert contradiction(rec) is None


def test_steal_on_the_calls_cpu_with_time_hidden_in_it_stands_in_the_timelines_words():
    rec = attribute(on_cpu_all_along(), STEAL_CPU1, cpu_ns=700_000)
    assert rec["events"]["hw_noise"]["hidden_us"] > 1_000
    assert rec["cause"] == "steal" and rec["decided_by"] == "polled"
    lead = rec["causes"][0]
    assert "hidden from the thread while it was on CPU 1" in lead["detail"]
    assert lead["polled_detail"].startswith("3 steal ticks")
    # nothing hidden in it (its CPU time = its time on the CPU): the steal was elsewhere
    rec = attribute(on_cpu_all_along(), STEAL_CPU1, cpu_ns=2_000_000)
    assert rec["cause"] == "unexplained" and rec["polled_cause"] == "steal"
    assert contradiction(rec["_before"]) == "steal not in the timeline"


def test_an_incomplete_timeline_leaves_the_polled_verdict():
    rec = attribute(on_cpu_all_along(), HEAVY_RQ, complete=False, cpu_ns=-1)
    assert rec["events"]["complete"] is False
    assert rec["cause"] == "cpu_contention" and rec["decided_by"] == "polled"
    assert rec["causes"][0]["detail"] == HEAVY_RQ["causes"][0]["detail"]
    assert contradiction(rec) is None  # (the bench counts complete timelines only)


def test_contention_where_the_timeline_cannot_account_the_time_is_not_contradicted():
    """Hidden time while the thread was current can be a switch the window lacks (the dev
    VM's kernel records none from idle): contention stays the polled rules'."""
    rec = attribute(on_cpu_all_along(), polled("cpu_contention", "2 involuntary switches"),
                    cpu_ns=500_000)
    assert rec["cause"] == "cpu_contention" and rec["decided_by"] == "polled"
    assert contradiction(rec) is None
