"""The interrupts' hidden cost in a spike's breakdown, and the IPIs that raise a softirq.

agent/trace/timeline.py counts the hard interrupts that entered while the probe ran
(``probe_interrupts``), names an IPI after whose returns a softirq starts at once as that
softirq's raise (RPS steering), and ``breakdown(..., irq_cost_ns=)`` charges each counted
interrupt the CPU's measured cost (agent/trace/irqcost.py), never more than the residual.
Scenarios are ``trace`` text as in tests/test_trace_timeline.py: the probe is pid 4242 on
CPU 1, the window [100.001000, 100.003000] s.
"""

from __future__ import annotations

import pytest

from agent.errors import AgentError
from agent.trace.irqcost import IrqCost, parse_output
from agent.trace.text import parse_text
from agent.trace.timeline import (
    HIDDEN_IRQ,
    UNEXPLAINED,
    breakdown,
    interrupt_overhead,
    timeline,
)
from agent.watch.attribution.events import SpikeEvents, _triples, event_verdict, parse_irq_cost
from bench.attribution import background
from tests.eventpages import trace_line as line
from tests.eventpages import trace_switch as sw

PROBE = 4242
T0, T1 = 100_001_000_000, 100_003_000_000
US = 1000


def rps_storm(n: int, *, start_us: int = 1100, every_us: int = 15) -> str:
    """``n`` RPS rounds while the probe runs: an IPI (1 µs), then NET_RX (2 µs) 1 µs after
    it returned (its irq_exit)."""
    out = [sw("swapper/1", 0, "100.000900", "probe", PROBE, "R")]
    for i in range(n):
        t = start_us + i * every_us
        out.append(line("probe", PROBE, _ts(t), "call_function_single_entry: vector=251",
                        "d.h1."))
        out.append(line("probe", PROBE, _ts(t + 1), "call_function_single_exit: vector=251",
                        "d.h1."))
        out.append(line("probe", PROBE, _ts(t + 2), "softirq_entry: vec=3 [action=NET_RX]",
                        "..s1."))
        out.append(line("probe", PROBE, _ts(t + 4), "softirq_exit: vec=3 [action=NET_RX]",
                        "..s1."))
    return "\n".join(out)


def _ts(us: int) -> str:
    """``us`` µs after 100 s, as trace prints it."""
    return f"100.{us:06d}"


def tl_of(text: str, t0: int = T0, t1: int = T1):
    return timeline(parse_text(text.splitlines()), 1, {PROBE}, t0, t1)


def test_ipis_that_raise_net_rx_are_the_softirq_s_and_are_counted_on_the_probe():
    tl = tl_of(rps_storm(40))
    labels = {e.label: ns for e, ns in tl.totals.items()}
    raise_label = "softirq NET_RX raise (IPI call_function_single)"
    assert labels[raise_label] == 40 * 1000
    assert "IPI call_function_single" not in labels
    assert labels["softirq NET_RX"] == 40 * 2000
    assert sum(tl.probe_interrupts.values()) == 40
    (ent,) = tl.probe_interrupts
    assert ent.label == raise_label and ent.kind == "softirq"


def test_an_ipi_without_a_softirq_after_it_stays_an_ipi():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, _ts(1200), "call_function_single_entry: vector=251", "d.h1."),
        line("probe", PROBE, _ts(1201), "call_function_single_exit: vector=251", "d.h1."),
        # a softirq long after (the tick's): not raised by the IPI
        line("probe", PROBE, _ts(1300), "softirq_entry: vec=1 [action=TIMER]", "..s1."),
        line("probe", PROBE, _ts(1301), "softirq_exit: vec=1 [action=TIMER]", "..s1."),
    ])
    tl = tl_of(text)
    labels = {e.label for e in tl.totals}
    assert "IPI call_function_single" in labels
    assert {e.label for e in tl.probe_interrupts} == {"IPI call_function_single"}


def test_interrupts_while_another_task_runs_or_outside_the_window_are_not_the_probe_s():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, _ts(900), "local_timer_entry: vector=236", "d.h1."),  # before t0
        line("probe", PROBE, _ts(905), "local_timer_exit: vector=236", "d.h1."),
        line("probe", PROBE, _ts(1200), "local_timer_entry: vector=236", "d.h1."),
        line("probe", PROBE, _ts(1205), "local_timer_exit: vector=236", "d.h1."),
        sw("probe", PROBE, _ts(1300), "hog", 77, "R+"),
        line("hog", 77, _ts(1400), "local_timer_entry: vector=236", "d.h1."),  # the hog's
        line("hog", 77, _ts(1405), "local_timer_exit: vector=236", "d.h1."),
        sw("hog", 77, _ts(1500), "probe", PROBE, "R"),
    ])
    tl = tl_of(text)
    assert sum(tl.probe_interrupts.values()) == 1


def test_breakdown_charges_the_measured_cost_and_never_more_than_the_residual():
    tl = tl_of(rps_storm(40))
    visible = 40 * 1000 + 40 * 2000
    # 40 × 6 µs hidden fits in an excess of visible + 300 µs: 240 µs charged, 60 left
    items = dict(breakdown(tl, visible + 300 * US, irq_cost_ns=6 * US))
    assert items[HIDDEN_IRQ] == 240 * US
    assert items[UNEXPLAINED] == 60 * US
    # a smaller excess caps it: nothing is explained twice
    items = dict(breakdown(tl, visible + 100 * US, irq_cost_ns=6 * US))
    assert items[HIDDEN_IRQ] == 100 * US and items[UNEXPLAINED] == 0
    # no cost measured: the residual stays unexplained
    items = dict(breakdown(tl, visible + 300 * US))
    assert HIDDEN_IRQ not in items and items[UNEXPLAINED] == 300 * US
    assert interrupt_overhead(tl, None, 10**9) == {}


def test_the_flood_s_hidden_time_makes_the_events_decide_softirq_with_net_rx():
    tl = tl_of(rps_storm(100, every_us=18))  # 1.8 ms of RPS rounds in a 2 ms sample
    visible = 100 * 1000 + 100 * 2000
    excess = visible + 600 * US
    items = breakdown(tl, excess, irq_cost_ns=6 * US)
    triples = _triples(tl, items, 6 * US)
    assert sum(ns for k, _, ns in triples if k == "softirq") == visible + 600 * US
    cause, culprit, _ = event_verdict(triples, excess)
    assert cause == "softirq" and "NET_RX" in culprit
    # without the cost the softirq alone (300 µs of 900) cannot decide
    assert event_verdict(_triples(tl, breakdown(tl, excess)), excess) is None


def test_irq_cost_option_and_measurement_wiring(tmp_path):
    assert parse_irq_cost("auto") == "auto" and parse_irq_cost("off") == "off"
    assert parse_irq_cost("6.5") == 6500
    for bad in ("", "x", "0", "-1", "5000", "nan"):
        with pytest.raises(AgentError, match="--irq-cost"):
            parse_irq_cost(bad)
    calls = []

    def coster(cpu, sender):
        calls.append((cpu, sender))
        return IrqCost(cpu, 6100, "6.1 µs", 5900, 7000, 200, 200)

    fake = lambda *a, **k: None  # noqa: E731 - a fake opener: the source may open
    ev = SpikeEvents("on", None, [3], housekeeping=[0, 3], irq_cost="auto", irq_coster=coster,
                     opener=fake)
    ev.measure_irq_cost()  # (before the source opens: the session's order)
    assert calls == [(3, 0)] and ev.irq_cost_ns == {3: 6100}
    given = SpikeEvents("on", None, [3], housekeeping=[0], irq_cost="2.5", opener=fake)
    given.source = object()
    given.measure_irq_cost()
    assert given.irq_cost_ns == {3: 2500}
    alone = SpikeEvents("on", None, [0], housekeeping=[0], irq_cost="auto", irq_coster=coster,
                        opener=fake)
    alone.source = object()
    alone.measure_irq_cost()
    assert alone.irq_cost_ns == {} and "housekeeping" in alone.irq_cost_info[0]["note"]
    off = SpikeEvents("on", None, [3], housekeeping=[0], irq_cost="off", irq_coster=coster,
                      opener=fake)
    off.source = object()
    off.measure_irq_cost()
    assert off.irq_cost_ns == {} and len(calls) == 1
    # the real opener where tracefs is not there: no measurement spent
    from collectors.host import Host
    bare = SpikeEvents("auto", Host(sysfs=str(tmp_path)), [3], housekeeping=[0],
                       irq_cost="auto", irq_coster=coster)
    bare.measure_irq_cost()
    assert len(calls) == 1 and bare.irq_cost_info == []
    assert "irq_cost" not in bare.info()  # no events ran: nothing to say about their cost
    ev._ran = True  # (the source opened)
    assert ev.info()["irq_cost"][0]["cost_us"] == 6.1
    ext = SpikeEvents("on", None, [3], housekeeping=[0], irq_cost="auto", opener=fake)
    ext._ran = True  # an external client: the session never asks for a measurement
    assert "external" in ext.info()["irq_cost"][0]["note"]


def test_irq_cost_helper_output_parsing():
    ok = ("hftirqcost=1 cpu=1 sender=0 sent=200 matched=198 median_ns=6020 p10_ns=5800 "
          "p90_ns=7100 step_ns=20 background=40.0\n")
    r = parse_output(1, ok)
    assert r.cost_ns == 6000 and r.matched == 198 and "6.0 µs" in r.note
    few = ok.replace("matched=198", "matched=30")
    assert parse_output(1, few).cost_ns is None
    for bad in ("", "garbage", "hftirqcost=1 cpu=1 sent=x"):
        with pytest.raises(ValueError):
            parse_output(1, bad)


def _rec(seq, cause, label=None, us=0.0, latency=3000.0, inherited=None):
    r = {"seq": seq, "cause": cause, "latency_us": latency, "p50_us": 400.0}
    if inherited is not None:
        r["inherited_from"] = inherited
    if label:
        r["events"] = {"timeline": {"entities": [
            {"label": "probe python[10]", "kind": "probe", "us": 500.0},
            {"label": label, "kind": "task", "us": us}]}}
    return r


def test_bench_counts_the_box_s_own_tasks_apart_from_the_fault():
    recs = [_rec(1, "cpu_contention", "tokio-rt-worker[76]", 2000.0),   # the box's: apart
            _rec(2, "cpu_contention", inherited=1),                      # queued behind it
            _rec(3, "cpu_contention", "flood[900]", 2500.0),             # the kit's own task
            _rec(4, "cpu_contention", "kdamond.0[78]", 500.0),           # too little of it
            _rec(5, "softirq")]
    assert background(recs, "softirq", [900]) == {1: "tokio-rt-worker[76]",
                                                  2: "tokio-rt-worker[76]"}
    # for a CPU fault too: the box's task ran instead of the kit's (none of which ran)
    assert background(recs, "cpu_contention", [900]) == {1: "tokio-rt-worker[76]",
                                                         2: "tokio-rt-worker[76]"}



def test_a_tlb_shootdown_ipi_s_hidden_cost_goes_with_its_label():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, _ts(1200), "call_function_entry: vector=251", "d.h1."),
        line("probe", PROBE, _ts(1201), "tlb_flush: pages:-1 reason:remote shootdown (1)",
             "d.h1."),
        line("probe", PROBE, _ts(1230), "call_function_exit: vector=251", "d.h1."),
    ])
    tl = tl_of(text)
    assert {e.label: n for e, n in tl.probe_interrupts.items()} == {
        "IPI call_function (TLB shootdown)": 1}


def test_watch_gives_a_given_irq_cost_to_an_external_probe_and_verdicts_take_p50():
    ev = SpikeEvents("on", None, [3], housekeeping=[0], irq_cost="4",
                     opener=lambda *a, **k: None)
    ev.measure_irq_cost(measure=False)  # the session's call under an external client
    assert ev.irq_cost_ns == {3: 4000}
    auto = SpikeEvents("on", None, [3], housekeeping=[0], irq_cost="auto",
                       opener=lambda *a, **k: None,
                       irq_coster=lambda *a: pytest.fail("measured under an external probe"))
    auto.measure_irq_cost(measure=False)
    assert auto.irq_cost_ns == {}
    with pytest.raises(AgentError, match="--irq-cost"):
        parse_irq_cost("1e-4")  # rounds to 0 ns


def test_tlb_shootdowns_of_the_probe_s_pages_decide_page_faults_not_irq():
    """memory_pressure on the GPU machine: reclaim unmapping the probe's pages sent it ~600
    shootdown IPIs in a 4 ms call; the events named them as an IPI and the record said irq.
    A shootdown while the probe runs flushes the probe's own address space: memory."""
    from agent.watch.attribution.events import apply_verdict
    out = [sw("swapper/1", 0, "100.000900", "probe", PROBE, "R")]
    for i in range(60):
        t = 1100 + i * 25
        out += [line("probe", PROBE, _ts(t), "call_function_single_entry: vector=251", "d.h1."),
                line("probe", PROBE, _ts(t + 1), "tlb_flush: pages:1 reason:remote shootdown (1)",
                     "d.h1."),
                line("probe", PROBE, _ts(t + 10), "call_function_single_exit: vector=251",
                     "d.h1.")]
    tl = tl_of("\n".join(out))
    excess = 60 * 10 * US + 200 * US
    items = breakdown(tl, excess, irq_cost_ns=3 * US)
    triples = _triples(tl, items, 3 * US)
    cause, culprit, _ = event_verdict(triples, excess)
    assert cause == "page_faults" and culprit.endswith("(TLB shootdown)")
    body = {"cause": "softirq", "causes": [], "events": {"complete": True,
                                                          "timeline": {"cpu": 1}}}
    apply_verdict(body, triples, excess)
    assert body["cause"] == "page_faults" and body["polled_cause"] == "softirq"
    assert "page tables were changed" in body["causes"][0]["detail"]
    # the polled page_faults verdict stands as it was
    kept = {"cause": "page_faults", "causes": [], "events": {"complete": True}}
    apply_verdict(kept, triples, excess)
    assert kept["cause"] == "page_faults" and "polled_cause" not in kept


def test_bench_culprit_named_by_the_kit_s_pid_or_by_any_task():
    from bench.attribution import _names_culprit
    rec = _rec(1, "cpu_contention", "cuda00001800007[825]", 800.0)
    rec["events"]["breakdown"] = [{"what": "cuda00001800007[825]", "us": 800.0},
                                  {"what": "unexplained", "us": 10.0}]
    assert not _names_culprit("oversubscription", rec, [900, 901])  # not the kit's
    assert _names_culprit("oversubscription", rec, None)           # but a task is named
    rec["events"]["breakdown"][0]["what"] = "python3[901]"
    assert _names_culprit("oversubscription", rec, [900, 901])
    quiet = _rec(2, "cpu_contention")
    quiet["events"] = {"timeline": {"entities": [{"label": "probe python[10]",
                                                  "kind": "probe", "us": 9.0}]},
                       "breakdown": []}
    assert not _names_culprit("oversubscription", quiet, None)


def test_bench_flood_helpers_run_on_a_third_cpu_where_there_is_one(monkeypatch):
    import bench.attribution as ba
    monkeypatch.setattr(ba.os, "sched_getaffinity", lambda pid: {0, 1, 2, 15})
    assert ba.helper_cpu(15, 0) == 1   # neither the probe's nor watch's
    monkeypatch.setattr(ba.os, "sched_getaffinity", lambda pid: {0, 1})
    assert ba.helper_cpu(1, 0) == 0    # a 2-CPU VM: watch's housekeeping CPU
