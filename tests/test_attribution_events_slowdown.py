"""The probe's own slowdown after interrupts, estimated in situ from earlier spikes.

agent/watch/attribution/events.py :class:`SlowdownEstimate` takes one observation per complete
timeline with ≥ 20 interrupts of the probe (its run time over P50, less the measured entry
and exit, per interrupt) and gives the median of the earlier ones while three in four of them show a slowdown;
``breakdown(..., slowdown_ns=)`` charges it per interrupt, capped at what is left. The
scenarios are tests/test_trace_timeline_interrupts.py's RPS storms (probe pid 4242 on CPU 1).
"""

from __future__ import annotations

from agent.trace.timeline import HIDDEN_IRQ, SLOWED, UNEXPLAINED, breakdown
from agent.watch.attribution.events import (
    SLOWDOWN_MIN_SPIKES,
    SlowdownEstimate,
    _triples,
    event_verdict,
)
from tests.test_trace_timeline_interrupts import US, rps_storm, tl_of


def _observe(est: SlowdownEstimate, tl, per_irq_us: float, cost_us: float = 6) -> None:
    """An observation whose probe ran P50 + (cost + ``per_irq_us``) × interrupts."""
    n = sum(tl.probe_interrupts.values())
    p50 = tl.probe_run_ns - int(n * (cost_us + per_irq_us) * US)
    est.observe(1, tl, p50, int(cost_us * US))


def test_the_estimate_needs_enough_agreeing_spikes_and_is_their_median():
    tl = tl_of(rps_storm(40))
    est = SlowdownEstimate()
    for i in range(SLOWDOWN_MIN_SPIKES - 1):
        _observe(est, tl, 3 + 0.1 * i)
        assert est.per_interrupt(1) == (None, i + 1)
    _observe(est, tl, 3.2)
    ns, n = est.per_interrupt(1)
    assert n == SLOWDOWN_MIN_SPIKES and abs(ns - 3200) <= 100
    assert est.per_interrupt(0) == (None, 0)  # per CPU


def test_observations_that_mostly_show_no_slowdown_give_no_estimate():
    tl = tl_of(rps_storm(40))
    est = SlowdownEstimate()
    for v in (-1, 3, -0.5, 4, -2, 5, 0.0, 6):  # the lower quartile is not above 0
        _observe(est, tl, v)
    assert est.per_interrupt(1)[0] is None
    est = SlowdownEstimate()  # spread, but all show one: the median of the recent ones
    for v in (0.4, 3.4, 1.0, 2.5, 1.2, 0.8):
        _observe(est, tl, v)
    assert abs(est.per_interrupt(1)[0] - 1100) <= 60
    est = SlowdownEstimate()
    for _ in range(8):  # the probe ran no longer than its entry/exit explains
        _observe(est, tl, -0.5)
    assert est.per_interrupt(1)[0] is None
    # too few interrupts, or an incomplete timeline: not an observation
    est = SlowdownEstimate()
    few = tl_of(rps_storm(10))
    for _ in range(8):
        _observe(est, few, 3)
    assert est.per_interrupt(1) == (None, 0)
    tl.complete = False
    for _ in range(8):
        _observe(est, tl, 3)
    assert est.per_interrupt(1) == (None, 0)


def test_breakdown_charges_the_slowdown_after_the_entry_exit_and_caps_it():
    tl = tl_of(rps_storm(40))
    visible = 40 * 1000 + 40 * 2000
    items = dict(breakdown(tl, visible + 400 * US, irq_cost_ns=6 * US, slowdown_ns=3 * US))
    assert items[HIDDEN_IRQ] == 240 * US and items[SLOWED] == 120 * US
    assert items[UNEXPLAINED] == 40 * US
    # capped at what the entry/exit leaves: nothing explained twice
    items = dict(breakdown(tl, visible + 300 * US, irq_cost_ns=6 * US, slowdown_ns=3 * US))
    assert items[SLOWED] == 60 * US and items[UNEXPLAINED] == 0
    items = dict(breakdown(tl, visible + 200 * US, irq_cost_ns=6 * US, slowdown_ns=3 * US))
    assert SLOWED not in items and items[UNEXPLAINED] == 0
    # no estimate: the residual stays unexplained
    items = dict(breakdown(tl, visible + 400 * US, irq_cost_ns=6 * US))
    assert SLOWED not in items and items[UNEXPLAINED] == 160 * US


def test_the_slowdown_goes_to_the_interrupting_softirq_in_the_verdict():
    tl = tl_of(rps_storm(40))
    visible = 40 * 1000 + 40 * 2000
    excess = visible + 400 * US
    items = breakdown(tl, excess, irq_cost_ns=6 * US, slowdown_ns=3 * US)
    triples = _triples(tl, items, 6 * US)
    assert sum(ns for k, _, ns in triples if k == "softirq") == excess - 40 * US
    cause, culprit, _ = event_verdict(triples, excess)
    assert cause == "softirq" and "NET_RX" in culprit


def test_watch_uses_earlier_spikes_only_and_says_what_the_estimate_rests_on():
    from agent.trace.text import parse_text
    from agent.watch.attribution import Spike
    from agent.watch.attribution.events import SpikeEvents
    from tests.test_trace_timeline_interrupts import PROBE, T0, T1
    from tests.test_watch_events import FakeSource

    events = parse_text(rps_storm(40).splitlines())
    ev = SpikeEvents("on", None, [1], irq_cost="6",
                     opener=lambda *a, **k: FakeSource(lambda i: events))
    ev.measure_irq_cost()
    assert ev.open(0) is None
    # the probe ran 1,880 µs of a 2 ms sample: P50 1,520 µs leaves 9 µs per interrupt, 6 of
    # them the measured entry/exit, 3 the slowdown
    sp = lambda i: Spike(i, T0, T1, 99, PROBE, 1_520_000, cpu_end=1)  # noqa: E731
    outs = [ev.for_spike(sp(i))[0] for i in range(SLOWDOWN_MIN_SPIKES + 1)]
    for out in outs[:SLOWDOWN_MIN_SPIKES]:
        assert "slowdown_us_per_irq" not in out
        assert not any(b["what"] == SLOWED for b in out["breakdown"])
    last = outs[-1]
    assert last["slowdown_us_per_irq"] == 3.0
    assert last["slowdown_from_spikes"] == SLOWDOWN_MIN_SPIKES
    items = {b["what"]: b["us"] for b in last["breakdown"]}
    assert items[SLOWED] == 120.0 and items[HIDDEN_IRQ] == 240.0 and items[UNEXPLAINED] == 0
    assert "probe slowed after interrupts (est.)" in last["summary"]


def test_lost_events_grow_the_rings_at_most_once_a_second():
    from agent.watch.attribution.events import GROW_EVERY_NS, SpikeEvents

    class Src:
        lost_n, grown = 0, 0

        def lost(self):
            return self.lost_n

        def grow(self):
            self.grown += 1
            return f"grown {self.grown}"

    ev = SpikeEvents("on", None, [1], opener=lambda *a, **k: None)
    ev.source = src = Src()
    ev.maybe_grow(10)
    assert src.grown == 0  # nothing lost
    src.lost_n = 100
    ev.maybe_grow(20)
    src.lost_n = 200
    ev.maybe_grow(30)  # within the second: not again
    assert src.grown == 1 and ev.grow_notes == ["grown 1"]
    ev.maybe_grow(20 + GROW_EVERY_NS)
    assert src.grown == 2
    ev.maybe_grow(40 + 2 * GROW_EVERY_NS)  # no new loss
    assert src.grown == 2
    ev._ran = True
    assert ev.info()["grown"] == ["grown 1", "grown 2"]


def test_whether_cpu_time_includes_interrupts_is_voted_by_the_spikes():
    from agent.watch.attribution.events import IRQ_IN_CPU_VOTES, IrqInCpuTime
    tl = tl_of(rps_storm(40))  # 120 µs of interrupts on top of the probe
    assert tl.probe_current_ns - tl.probe_run_ns == 120 * US
    v = IrqInCpuTime()
    for _ in range(IRQ_IN_CPU_VOTES - 1):
        v.vote(tl, tl.probe_current_ns - 5 * US)  # a kernel without IRQ_TIME_ACCOUNTING
    assert v.includes is None
    v.vote(tl, tl.probe_run_ns + 3 * US)  # one pulled down (steal)
    assert v.includes is True
    w = IrqInCpuTime()
    for _ in range(IRQ_IN_CPU_VOTES):
        w.vote(tl, tl.probe_run_ns)  # with it: the probe's own time only
    assert w.includes is False
    few = tl_of(rps_storm(10))  # 30 µs of interrupts: says nothing
    x = IrqInCpuTime()
    for _ in range(10):
        x.vote(few, few.probe_current_ns)
        x.vote(tl, -1)  # no CPU time
    assert x.includes is None


def test_watch_compares_cpu_time_with_what_the_kernel_charges_once_voted():
    """Once the spikes say the CPU time includes interrupts, time the probe was current but
    not on the CPU by its own clock is hidden (stolen) time, under the interrupts too: a
    sample whose CPU time is 10 µs under the probe's own run time (nothing, compared with
    that) lacks 131 µs against the time it was current."""
    from agent.trace.text import parse_text
    from agent.watch.attribution import Spike
    from agent.watch.attribution.events import IRQ_IN_CPU_VOTES, SpikeEvents
    from tests.test_trace_timeline_interrupts import PROBE, T0, T1, _ts, line
    from tests.test_watch_events import FakeSource

    # the RPS storm, a tick, then 300 µs with no event at all while the probe is current
    text = "\n".join([rps_storm(40),
                      line("probe", PROBE, _ts(2700), "local_timer_entry: vector=236", "d.h1."),
                      line("probe", PROBE, _ts(2701), "local_timer_exit: vector=236", "d.h1.")])
    events = parse_text(text.splitlines())
    tl = tl_of(text)
    run, current = tl.probe_run_ns, tl.probe_current_ns
    assert current - run == 121 * US

    def spikes_events():
        ev = SpikeEvents("on", None, [1], opener=lambda *a, **k: FakeSource(lambda i: events))
        assert ev.open(0) is None
        return ev

    def sp(i, cpu_ns):
        return Spike(i, T0, T1, 99, PROBE, 1_000_000, cpu_ns=cpu_ns, cpu_end=1)
    stolen = sp(99, run - 10 * US)
    fresh = spikes_events()
    assert fresh.for_spike(stolen)[0]["hw_noise"]["hidden_us"] == 0.0  # (the default)
    ev = spikes_events()
    for i in range(IRQ_IN_CPU_VOTES):
        ev.for_spike(sp(i, current))  # CPU time = current: interrupts included
    assert ev.irq_in_cpu.includes is True
    out = ev.for_spike(stolen)[0]
    assert out["hw_noise"]["hidden_us"] == 131.0
    ev._ran = True
    assert ev.info()["cpu_time_includes_irq"] is True


def test_a_timeline_without_the_switches_the_probe_counted_is_not_exact():
    """The probe's counters say it was preempted in the call; the window shows it running
    throughout with nothing else on the CPU: incomplete. With the switch in the window
    (another task ran), or no switch counted, it stands."""
    from agent.trace.text import parse_text
    from agent.watch.attribution import Spike
    from agent.watch.attribution.events import SpikeEvents
    from tests.test_trace_timeline_interrupts import PROBE, T0, T1, _ts, line, sw
    from tests.test_watch_events import FakeSource

    # (T0 is 1,000 µs after 100 s: _ts counts from there)
    alone = parse_text([sw("swapper/1", 0, _ts(500), "probe", PROBE, "R"),
                        line("probe", PROBE, _ts(1300), "local_timer_entry: vector=236"),
                        line("probe", PROBE, _ts(1305), "local_timer_exit: vector=236")])
    hog = parse_text([sw("swapper/1", 0, _ts(500), "probe", PROBE, "R"),
                      sw("probe", PROBE, _ts(1200), "hog", 777, "R+"),
                      sw("hog", 777, _ts(1900), "probe", PROBE, "R")])

    def read(events, **kw):
        ev = SpikeEvents("on", None, [1], opener=lambda *a, **k: FakeSource(lambda i: events))
        assert ev.open(0) is None
        sp = Spike(1, T0, T1, 99, PROBE, 1_000_000, cpu_ns=900_000, cpu_start=1, cpu_end=1,
                   **kw)
        return ev.for_spike(sp)[0]
    out = read(alone, nivcsw=1, nvcsw=0)
    assert out["complete"] is False and "switched out 1 time(s)" in out["reason"]
    # the switch lay in the margin before the start (the spin): the window has it
    early = parse_text([sw("probe", PROBE, _ts(600), "hog", 777, "R+"),
                        sw("hog", 777, _ts(800), "probe", PROBE, "R"),
                        line("probe", PROBE, _ts(1300), "local_timer_entry: vector=236"),
                        line("probe", PROBE, _ts(1305), "local_timer_exit: vector=236")])
    assert read(early, nivcsw=1, nvcsw=0)["complete"] is True
    assert read(alone, nivcsw=0, nvcsw=0)["complete"] is True
    assert read(hog, nivcsw=1, nvcsw=0)["complete"] is True
