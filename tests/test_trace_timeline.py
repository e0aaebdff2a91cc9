"""agent.trace.timeline: per-sample accounting, breakdown and hw_or_hypervisor noise.

Scenarios are written as ``trace`` text (the kernel's own format, parsed by parse_text) so
each reads as what the kernel would show; the probe thread is pid 4242 on CPU 1 and every
window is [100.001000, 100.003000] s unless a test says otherwise.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.trace.event import Event
from agent.trace.pages import iter_page
from agent.trace.text import parse_text
from agent.trace.timeline import (
    BACKLOG,
    EXITED,
    HW,
    IDLE_BEFORE_WAKE,
    UNEXPLAINED,
    Entity,
    backlog,
    breakdown,
    format_breakdown,
    hw_noise,
    timeline,
)
from tests.eventpages import FIXTURE, load_formats
from tests.eventpages import trace_line as line
from tests.eventpages import trace_switch as sw

PROBE = 4242
T0 = 100_001_000_000
T1 = 100_003_000_000
US = 1000


def evs(text: str) -> list[Event]:
    out = parse_text(text.splitlines())
    assert out, "scenario text did not parse"
    return out


def totals_by_label(tl):
    return {e.label: ns for e, ns in tl.totals.items()}


def test_kworker_running_vmstat_update_preempts_the_probe():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001500", "kworker/1:0", 45, "R+"),
        line("kworker/1:0", 45, "100.001510", "workqueue_execute_start: work struct "
             "00000000c0ffee00: function vmstat_update", "....."),
        line("kworker/1:0", 45, "100.002710", "workqueue_execute_end: work struct "
             "00000000c0ffee00: function vmstat_update", "....."),
        sw("kworker/1:0", 45, "100.002720", "probe", PROBE, "I"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t["kworker/1:0 (vmstat_update)"] == 1200 * US
    assert t["kworker/1:0[45]"] == 20 * US  # before and after the work item
    assert t["probe probe[4242]"] == 500 * US + 280 * US
    assert sum(tl.totals.values()) == T1 - T0  # every ns of the window is accounted for
    assert tl.preemptions == 1 and tl.blocks == 0
    assert tl.start_delay_ns == 0
    items = breakdown(tl, 1_300 * US)
    assert items[0] == ("kworker/1:0 (vmstat_update)", 1200 * US)
    assert items[-1] == (UNEXPLAINED, 80 * US)
    assert format_breakdown(items) == "1.2 ms kworker/1:0 (vmstat_update), 20 µs kworker/1:0[45], 80 µs unexplained"


def test_irq_then_net_rx_softirq_while_the_probe_runs_and_a_nested_irq():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, "100.001100", "irq_handler_entry: irq=24 name=virtio0-input.0",
             "d.h1."),
        line("probe", PROBE, "100.001104", "irq_handler_exit: irq=24 ret=handled", "d.h1."),
        line("probe", PROBE, "100.001105", "softirq_entry: vec=3 [action=NET_RX]", "..s1."),
        line("probe", PROBE, "100.001300", "irq_handler_entry: irq=25 name=virtio0-output.0",
             "d.h1."),
        line("probe", PROBE, "100.001310", "irq_handler_exit: irq=25 ret=handled", "d.h1."),
        line("probe", PROBE, "100.001505", "softirq_exit: vec=3 [action=NET_RX]", "..s1."),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t["IRQ 24 virtio0-input.0"] == 4 * US
    assert t["softirq NET_RX"] == 400 * US - 10 * US  # minus the nested IRQ
    assert t["IRQ 25 virtio0-output.0"] == 10 * US
    # the probe was current all along: interrupts count in probe_current, not probe_run
    assert tl.probe_current_ns == T1 - T0
    assert tl.probe_run_ns == T1 - T0 - 404 * US
    assert tl.anomalies == 0


def test_late_wake_up_idle_before_the_probe_woke_and_its_wake_latency():
    text = "\n".join([
        sw("probe", PROBE, "100.000500", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.001600", "local_timer_entry: vector=236", "d.h1."),
        line("<idle>", 0, "100.001605", "sched_waking: comm=probe pid=4242 prio=120 "
             "target_cpu=001", "d.h2."),
        line("<idle>", 0, "100.001607", "sched_wakeup: comm=probe pid=4242 prio=120 "
             "target_cpu=001", "d.h2."),
        line("<idle>", 0, "100.001610", "local_timer_exit: vector=236", "d.h1."),
        sw("swapper/1", 0, "100.001640", "probe", PROBE, "R"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t[IDLE_BEFORE_WAKE] == 600 * US + 30 * US  # the CPU's view (hftagent cpus)
    assert t["local timer tick"] == 10 * US and not tl.parts and not tl.state_ns
    assert tl.wake_ns == 100_001_605_000 and tl.wake_latency_ns == 35 * US
    tl = timeline(evs(text), 1, {PROBE}, T0, T1, follow=True)
    t = totals_by_label(tl)
    # following the thread: asleep (S since before t0) until its timer's waking, the tick
    # included up to the waking: a pacing sleep that overshot the start; then idle from the
    # waking to the run
    assert t[IDLE_BEFORE_WAKE] == 600 * US + 5 * US + 30 * US
    assert t["local timer tick"] == 5 * US  # the rest of the tick, after the waking
    (part,) = tl.parts
    assert (part.kind, part.state, part.waker, part.waker_ctx, part.ended_by) == \
        ("idle", "S", "timer", "timer", "waking")
    assert part.in_ns == 605 * US and part.waker_tid is None
    assert tl.state_ns == {"on_cpu": T1 - T0 - 640 * US, "not_runnable": 0,
                           "wakeup": 635 * US, "unknown": 0, "runnable": 5 * US}
    assert tl.wake_ns == 100_001_605_000 and tl.wake_latency_ns == 35 * US
    assert tl.switch_in_ns == 100_001_640_000
    assert tl.start_delay_ns == 640 * US
    assert tl.blocks == 0  # the switch-out was before the window


def test_wake_up_picked_is_the_one_that_started_this_sample():
    # the previous sample's wake-up and switch-in lie in the margin before t0; this sample's
    # switch-in is on time (before t0): that one's latency is reported
    text = "\n".join([
        line("<idle>", 0, "100.000100", "sched_waking: comm=probe pid=4242 prio=120 target_cpu=001"),
        sw("swapper/1", 0, "100.000150", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.000400", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.000800", "sched_waking: comm=probe pid=4242 prio=120 target_cpu=001"),
        sw("swapper/1", 0, "100.000820", "probe", PROBE, "R"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    assert tl.switch_in_ns == 100_000_820_000 and tl.wake_latency_ns == 20 * US
    assert tl.start_delay_ns == 0 and tl.probe_run_ns == T1 - T0


def test_tlb_shootdown_ipi_is_named_and_counted():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, "100.001200", "call_function_entry: vector=251", "d.h1."),
        line("probe", PROBE, "100.001201", "tlb_flush: pages:-1 reason:remote shootdown (1)",
             "d.h1."),
        line("probe", PROBE, "100.001230", "call_function_exit: vector=251", "d.h1."),
        line("probe", PROBE, "100.001300", "reschedule_entry: vector=253", "d.h1."),
        line("probe", PROBE, "100.001302", "reschedule_exit: vector=253", "d.h1."),
        line("probe", PROBE, "100.001400", "ipi_send_cpu: cpu=0 callsite=x+0x1/0x2 callback=0x0"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t["IPI call_function (TLB shootdown)"] == 30 * US
    assert "IPI call_function" not in t
    assert t["IPI reschedule"] == 2 * US
    assert tl.counts["tlb_shootdown"] == 1 and tl.counts["ipi_sent"] == 1
    assert tl.counts["call_function"] == 1 and tl.counts["reschedule"] == 1


def test_the_switchs_own_tlb_flush_does_not_give_the_cpu_back_to_the_old_task():
    """The GPU machine's kernel (6.18): switch_mm flushes the TLB on every switch between
    processes, and its tlb_flush event ("flush on task switch (0)") carries the task being
    switched out. After an RT hog hands the CPU back to the probe with nothing else firing
    until the sample ends, the probe's run is the probe's, not the hog's."""
    text = "\n".join([
        sw("probe", PROBE, "100.000100", "hog", 540, "R+"),
        sw("hog", 540, "100.002800", "probe", PROBE, "S"),
        line("hog", 540, "100.002801", "tlb_flush: pages:-1 reason:flush on task switch (0)"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t["hog[540]"] == 1_800 * US and t[f"probe probe[{PROBE}]"] == 200 * US
    assert tl.probe_run_ns == 200 * US and tl.anomalies == 0
    # a flush for another reason still says who is current (common_pid)
    other = text.replace("flush on task switch (0)", "local MM shootdown (3)")
    assert totals_by_label(timeline(evs(other), 1, {PROBE}, T0, T1))["hog[540]"] == 2_000 * US


def test_counts_are_the_samples_own_not_the_margins():
    """Events read before the intended start set the walk's state only: a tick, a TLB flush
    and an IPI there are not counted as the sample's (its record shows them as such)."""
    text = "\n".join([
        sw("swapper/1", 0, "100.000500", "probe", PROBE, "R"),
        line("probe", PROBE, "100.000600", "local_timer_entry: vector=236", "d.h1."),
        line("probe", PROBE, "100.000605", "local_timer_exit: vector=236", "d.h1."),
        line("probe", PROBE, "100.000700", "tlb_flush: pages:12 reason:local MM shootdown (3)"),
        line("probe", PROBE, "100.000800", "ipi_send_cpu: cpu=0 callsite=x+0x1/0x2 callback=0x0"),
        line("probe", PROBE, "100.001100", "local_timer_entry: vector=236", "d.h1."),
        line("probe", PROBE, "100.001105", "local_timer_exit: vector=236", "d.h1."),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    assert tl.counts == {"local_timer": 1}
    assert sum(tl.probe_interrupts.values()) == 1


def test_exit_whose_entry_is_before_the_window_charges_the_time_before_it():
    text = "\n".join([
        line("probe", PROBE, "100.001050", "softirq_exit: vec=1 [action=TIMER]", "..s1."),
        line("probe", PROBE, "100.001060", "irq_handler_exit: irq=9 ret=handled", "d.h1."),
        line("probe", PROBE, "100.001080", "local_timer_exit: vector=236", "d.h1."),
        line("kworker/1:1", 40, "100.001500", "workqueue_execute_end: work struct 0000000000000001: "
             "function flush_to_ldisc", "....."),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1, comms={40: "kworker/1:1"})
    t = totals_by_label(tl)
    assert t["softirq TIMER"] == 50 * US
    assert t["IRQ 9 ?"] == 10 * US
    assert t["local timer tick"] == 20 * US
    assert t["kworker/1:1 (flush_to_ldisc)"] == 420 * US
    assert sum(tl.totals.values()) == T1 - T0


def test_no_events_at_all_is_unknown_not_the_probe():
    tl = timeline([], 1, {PROBE}, T0, T1)
    assert [(e.kind, ns) for e, ns in tl.totals.items()] == [("unknown", T1 - T0)]
    items = breakdown(tl, 1_000 * US)
    assert items[0][0] == "no events (task unknown)"


def test_a_lost_switch_is_corrected_by_common_pid():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        # the switch probe -> stress[99] was lost; stress's own events show it ran
        line("stress", 99, "100.001500", "tlb_flush: pages:0 reason:local MM shootdown (3)"),
        line("stress", 99, "100.002500", "local_timer_entry: vector=236", "d.h1."),
        line("stress", 99, "100.002510", "local_timer_exit: vector=236", "d.h1."),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1, comms={99: "stress"})
    t = totals_by_label(tl)
    assert tl.anomalies >= 1
    # the interval before stress's first event cannot be split: it went to stress (the
    # task current when the event fired); what follows is stress's too
    assert t["stress[99]"] == (500 + 1000 + 490) * US
    assert t["local timer tick"] == 10 * US


def test_events_before_t0_only_set_state_and_after_t1_are_ignored():
    text = "\n".join([
        sw("swapper/1", 0, "100.000100", "stress", 99, "R"),
        sw("stress", 99, "100.002000", "probe", PROBE, "R+"),
        sw("probe", PROBE, "100.004000", "stress", 99, "R+"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t == {"stress[99]": 1000 * US, "probe probe[4242]": 1000 * US}
    assert tl.preemptions == 0  # the switch-out at 100.004 is after the window
    assert tl.start_delay_ns == 1000 * US


def test_other_cpus_events_are_ignored():
    a = evs(sw("stress", 99, "100.001500", "probe", PROBE, "R+"))
    b = [Event(100_001_200_000, 0, "irq_handler_entry", 99, {"irq": 5, "name": "x"})]
    tl = timeline(a + b, 1, {PROBE}, T0, T1)
    assert all(e.kind != "irq" for e in tl.totals)


def test_breakdown_residual_never_negative_and_min_ns():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "stress", 99, "R"),
        line("stress", 99, "100.002999", "tlb_flush: pages:0 reason:flush on task switch (0)"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    items = breakdown(tl, 500 * US)
    assert items[-1] == (UNEXPLAINED, 0)
    assert items[0] == ("stress[99]", 2000 * US)
    assert breakdown(tl, 500 * US, min_ns=10_000_000) == [(UNEXPLAINED, 500 * US)]


def _quiet_probe(cpu_ns, steal=None, **kw):
    text = sw("swapper/1", 0, "100.000900", "probe", PROBE, "R")
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    return tl, hw_noise(tl, cpu_ns, steal_ns=steal, **kw)


def test_hw_noise_hidden_time_in_a_quiet_gap_correlated_with_steal():
    tl, hw = _quiet_probe(1_200 * US, steal=700 * US)
    assert hw.hidden_ns == 800 * US and hw.gaps_ns == [T1 - T0]
    assert hw.correlated is True and "hypervisor" in hw.note
    items = breakdown(tl, 1_000 * US, hw=hw)
    assert (HW, 800 * US) in items and items[-1] == (UNEXPLAINED, 200 * US)
    assert hw.to_dict()["hidden_us"] == 800.0


def test_hw_noise_without_steal_points_at_firmware():
    _, hw = _quiet_probe(1_200 * US, steal=0)
    assert hw.hidden_ns == 800 * US and hw.correlated is False and "SMI" in hw.note


def test_hw_noise_none_when_cpu_time_matches_or_is_unknown():
    _, hw = _quiet_probe(T1 - T0 - 5 * US)
    assert hw.hidden_ns == 0
    _, hw = _quiet_probe(None)
    assert hw.hidden_ns is None and "not measurable" in hw.note


def test_hw_noise_irq_time_is_not_hidden_by_default():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, "100.001100", "irq_handler_entry: irq=24 name=eth0", "d.h1."),
        line("probe", PROBE, "100.001600", "irq_handler_exit: irq=24 ret=handled", "d.h1."),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    # a kernel without CONFIG_IRQ_TIME_ACCOUNTING charges the IRQ to the probe's CPU time
    cpu = T1 - T0
    assert hw_noise(tl, cpu).hidden_ns == 0
    assert hw_noise(tl, cpu, cpu_includes_irq=True).hidden_ns == 0
    # a kernel with it leaves the IRQ out: CPU time = run time, nothing hidden either
    assert hw_noise(tl, tl.probe_run_ns).hidden_ns == 0
    # and 300 µs missing from the CPU time on top of it is found in the quiet gaps
    got = hw_noise(tl, tl.probe_run_ns - 300 * US)
    assert got.hidden_ns == 300 * US and got.gaps_ns == [1400 * US, 100 * US]


def test_hw_noise_missing_cpu_time_without_any_quiet_gap_is_not_hardware():
    text = sw("swapper/1", 0, "100.000900", "stress", 99, "R")
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    hw = hw_noise(tl, 0, min_gap_ns=1)
    assert hw.hidden_ns == 0  # the probe never ran: nothing to hide in


def test_timeline_to_dict_is_json_ready():
    import json
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001500", "kworker/1:0", 45, "R+"),
        sw("kworker/1:0", 45, "100.001700", "probe", PROBE, "I"),
        line("probe", PROBE, "100.001800", "sched_migrate_task: comm=probe pid=4242 prio=120 "
             "orig_cpu=0 dest_cpu=1"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1, complete=False, reason="cpu 1: lost")
    d = json.loads(json.dumps(tl.to_dict(max_spans=2)))
    assert d["entities"][0]["label"] == "probe probe[4242]"
    assert d["spans"][0] == [0.0, 500.0, "probe probe[4242]"] and d["spans_left_out"] == 1
    assert d["migrations"] == [[800.0, 0, 1]]
    assert d["complete"] is False and d["reason"] == "cpu 1: lost"


def test_entity_labels_and_culprits():
    assert Entity("workqueue", "kworker/1:0 (vmstat_update)", 45).culprit == "vmstat_update"
    assert Entity("irq", "eth0", num=24).label == "IRQ 24 eth0"
    assert Entity("vector", "thermal_apic").label == "vector thermal_apic"


def test_real_capture_accounts_for_every_ns():
    fmts = {f.id: f for f in load_formats().values()}
    data = (FIXTURE / "pages.bin").read_bytes()
    events = [e for i in range(0, len(data), 4096) for e in iter_page(data[i:i + 4096], 1, fmts)]
    t0, t1 = events[0].ts_ns, events[-1].ts_ns
    pids = sorted({e.pid for e in events if e.pid})
    # no thread's state followed: the CPU's view as it ran
    tl = timeline(events, 1, {pids[0]}, t0, t1)
    assert sum(tl.totals.values()) == t1 - t0
    assert all(iv.ns > 0 for iv in tl.intervals)
    assert all(a.end_ns <= b.start_ns for a, b in zip(tl.intervals, tl.intervals[1:]))
    kinds = {e.kind for e in tl.totals}
    assert {"task", "irq", "softirq", "timer"} <= kinds
    assert not tl.parts and not tl.state_ns
    # each thread followed in turn: the same exact accounting, its states summing to the wall
    for pid in pids:
        tl = timeline(events, 1, {pid}, t0, t1, follow=True)
        assert sum(tl.totals.values()) == t1 - t0
        assert sum(tl.state_ns.values()) == t1 - t0
        assert all(p.in_ns >= 0 for p in tl.parts)


_NAMES = ["sched_switch", "irq_handler_entry", "irq_handler_exit", "softirq_entry",
          "softirq_exit", "local_timer_entry", "local_timer_exit", "workqueue_execute_start",
          "workqueue_execute_end", "call_function_entry", "call_function_exit", "tlb_flush",
          "sched_waking", "signal_generate", "block_rq_issue", "block_rq_complete",
          "hrtimer_start"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3_000_000), st.sampled_from(_NAMES),
                          st.sampled_from([0, 7, 99, PROBE])), max_size=60),
       st.integers(0, 2**32))
def test_any_event_soup_is_accounted_exactly_once(raw, seed):
    rnd = random.Random(seed)
    base = 100_000_000_000
    events = []
    for dt, name, pid in sorted(raw):
        f = {"sched_switch": {"prev_pid": pid, "prev_comm": "a",
                              "prev_state": rnd.choice(["R", "R+", "S", "D", "T", "t", "X"]),
                              "next_pid": rnd.choice([0, 7, 99, PROBE]), "next_comm": "b"},
             "irq_handler_entry": {"irq": 5, "name": "x"}, "irq_handler_exit": {"irq": 5, "ret": 1},
             "softirq_entry": {"vec": 3, "action": "NET_RX"},
             "softirq_exit": {"vec": 3, "action": "NET_RX"},
             "workqueue_execute_start": {"function": "f"}, "workqueue_execute_end": {"function": "f"},
             "tlb_flush": {"reason": 1, "pages": 1},
             "sched_waking": {"pid": PROBE, "comm": "p",
                              "irq_ctx": rnd.choice(["", "hardirq", "softirq"])},
             "signal_generate": {"pid": PROBE, "sig": rnd.choice([18, 19]), "result": 0},
             "hrtimer_start": {"function": "hrtimer_wakeup",
                               "softexpires": base + rnd.randrange(0, 3_000_000)},
             }.get(name, {"vector": 1})
        # wake-ups and signals from another CPU too (the wake instance's)
        cpu = rnd.choice([0, 1]) if name in ("sched_waking", "signal_generate") else 1
        events.append(Event(base + dt, cpu, name, pid, f))
    t0, t1 = base + 1_000_000, base + 2_000_000
    for follow in (True, False):
        tl = timeline(events, 1, {PROBE}, t0, t1, probe_pid=PROBE, follow=follow)
        assert sum(tl.totals.values()) == t1 - t0
        assert all(ns > 0 for ns in tl.totals.values())
        if follow:
            assert sum(tl.state_ns.values()) == t1 - t0 and min(tl.state_ns.values()) >= 0
            assert sum(p.in_ns for p in tl.parts) <= t1 - t0
        else:
            assert not tl.parts and not tl.state_ns
    tl = timeline(events, 1, {PROBE}, t0, t1, probe_pid=PROBE)
    assert 0 <= tl.probe_run_ns <= tl.probe_current_ns <= t1 - t0
    assert breakdown(tl, 500_000)[-1][1] >= 0
    # the spans a record shows: a prefix of all of them, counted without making them
    spans = tl.spans()
    assert tl.span_count() == len(spans)
    assert sum(s.ns for s in spans) == t1 - t0
    for keep in (0, 1, 3):
        assert [(s.start_ns, s.end_ns, s.entity) for s in tl.spans(keep)] == \
            [(s.start_ns, s.end_ns, s.entity) for s in spans[:keep]]
    d = tl.to_dict(max_spans=3)
    assert len(d["spans"]) == min(3, len(spans))
    assert d.get("spans_left_out", 0) == max(0, len(spans) - 3)


def test_a_probe_that_never_ran_in_the_window_is_not_a_late_wake_up():
    from agent.trace.timeline import IDLE_ABSENT
    text = "\n".join([
        sw("probe", PROBE, "100.000900", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.002000", "local_timer_entry: vector=236", "d.h1."),
        line("<idle>", 0, "100.002004", "local_timer_exit: vector=236", "d.h1."),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    labels = totals_by_label(tl)
    assert IDLE_ABSENT in labels and IDLE_BEFORE_WAKE not in labels


def test_a_switch_in_the_kernel_did_not_record_is_inferred_from_the_next_event():
    """The dev VM's kernel (6.18) records no sched_switch from idle: the probe's
    switch-in is missing, its switch-out after the window says it was current at the end."""
    text = "\n".join([
        sw("probe", PROBE, "100.000900", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.001100", "local_timer_entry: vector=236", "d.h1."),
        line("<idle>", 0, "100.001104", "local_timer_exit: vector=236", "d.h1."),
        # (swapper/1 -> probe at ~100.0016 not recorded)
        sw("probe", PROBE, "100.003500", "swapper/1", 0, "S"),
    ])
    tl = timeline(evs(text), 1, {PROBE}, T0, T1)
    t = totals_by_label(tl)
    assert t["probe probe[4242]"] == 1896 * US  # from the tick's exit to the window's end
    assert tl.probe_run_ns == 1896 * US


# --- the probe thread's own states (issue #26): R, S, D, T, waking without a switch, switch
# without a waking, an exit. The probe is pid 4242 of process 4240; CPU 0 is another CPU
# whose events (wake-ups, signals) come from the source's wake instance.

PROC = 4240


def wake(comm, pid, ts, flags="d..2.", cpu=1, who=PROBE):
    return line(comm, pid, ts, f"sched_waking: comm=probe pid={who} prio=120 target_cpu=001",
                flags, cpu=cpu)


def tgids(tid):
    return {PROBE: PROC, 4243: PROC, 777: 777, 900: 900}.get(tid)


def follow(text, **kw):
    return timeline(evs(text), 1, {PROBE}, T0, T1, follow=True, probe_pid=PROC,
                    tgid_of=tgids, **kw)


def test_blocked_s_woken_by_a_sibling_thread_on_the_same_cpu_is_a_lock_handed_over():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001200", "holder", 4243, "S"),   # futex wait
        sw("holder", 4243, "100.001210", "swapper/1", 0, "S"),   # the holder sleeps too
        line("<idle>", 0, "100.002000", "local_timer_entry: vector=236", "d.h1."),
        wake("<idle>", 0, "100.002001", "d.h2.", who=4243),      # the holder's own timer
        line("<idle>", 0, "100.002004", "local_timer_exit: vector=236", "d.h1."),
        # (swapper -> holder not recorded: 6.18 records no switch from idle)
        wake("holder", 4243, "100.002100"),                      # futex_wake: the handover
        sw("holder", 4243, "100.002110", "probe", PROBE, "S"),
    ])
    tl = follow(text)
    (part,) = tl.parts
    assert (part.kind, part.state, part.ended_by) == ("blocked", "S", "waking")
    assert part.waker_tid == 4243 and part.same_process and part.waker_ctx == "task"
    assert part.waker == "thread 4243 of the same process (holder)"
    assert part.in_ns == 900 * US and part.start_ns == 100_001_200_000
    t = totals_by_label(tl)
    label = "blocked (S), woken by thread 4243 of the same process (holder)"
    # what ran while it could not run (the holder, a tick, idle) is the part's, not contention
    assert t[label] == 900 * US and "holder[4243]" in t and t["holder[4243]"] == 10 * US
    assert sum(tl.state_ns.values()) == T1 - T0 and tl.state_ns["not_runnable"] == 900 * US
    assert tl.state_ns["runnable"] == 10 * US  # woken, the holder still on the CPU
    items = dict(breakdown(tl, 1_000 * US))
    assert items[label] == 900 * US
    d = tl.to_dict()
    assert d["parts"][0]["kind"] == "blocked" and d["parts"][0]["same_process"] is True
    assert d["state_us"]["not_runnable"] == 900.0


def test_blocked_s_woken_from_another_cpu_names_the_writer_there():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        wake("writer", 777, "100.002500", cpu=0),                # pipe_write on CPU 0
        line("<idle>", 0, "100.002510", "reschedule_entry: vector=253", "d.h1."),
        line("<idle>", 0, "100.002512", "reschedule_exit: vector=253", "d.h1."),
        sw("probe", PROBE, "100.002900", "swapper/1", 0, "S"),   # (its run: no switch-in)
    ])
    comms = {777: "writer"}
    tl = follow(text, comms=comms)
    (part,) = tl.parts[:1]
    assert (part.kind, part.state, part.waker, part.waker_cpu, part.same_process) == \
        ("blocked", "S", "writer[777]", 0, False)
    assert part.in_ns == 1_400 * US
    # waking -> running on an idle CPU (the IPI's delivery and the idle exit): wake-up latency
    t = totals_by_label(tl)
    assert t[IDLE_BEFORE_WAKE] == 10 * US + 0 and t["IPI reschedule"] == 2 * US
    assert tl.state_ns["wakeup"] == 10 * US


def test_d_with_its_own_block_request_ended_by_the_disk_interrupt_is_io_wait():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, "100.001100", "block_rq_issue: 8,0 R 4096 () 2048 + 8 none,0,0 "
             "[probe]"),
        sw("probe", PROBE, "100.001150", "swapper/1", 0, "D"),
        line("<idle>", 0, "100.002300", "irq_handler_entry: irq=36 name=virtio1-req.0", "d.h1."),
        line("<idle>", 0, "100.002301", "block_rq_complete: 8,0 R () 2048 + 8 none,0,0 [0]",
             "d.h1."),
        wake("<idle>", 0, "100.002302", "d.h2."),
        line("<idle>", 0, "100.002305", "irq_handler_exit: irq=36 ret=handled", "d.h1."),
        sw("probe", PROBE, "100.002950", "swapper/1", 0, "S"),
    ])
    tl = follow(text)
    part = tl.parts[0]
    assert (part.kind, part.state, part.io, part.waker_ctx) == ("io_wait", "D", True, "io")
    assert part.waker == "block I/O completion (IRQ 36 virtio1-req.0)"
    assert part.waker_tid is None and part.in_ns == 1_152 * US
    assert any(label.startswith("I/O wait (D)") for label, _ in breakdown(tl, 1_500 * US))


def test_d_woken_by_a_task_is_blocked_on_a_kernel_lock_not_io():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "other", 900, "D"),     # a mutex
        wake("other", 900, "100.001900"),                        # its unlock
        sw("other", 900, "100.001950", "probe", PROBE, "S"),
    ])
    tl = follow(text)
    part = tl.parts[0]
    assert (part.kind, part.state, part.waker, part.io) == ("blocked", "D", "other[900]", False)
    assert part.in_ns == 800 * US
    assert totals_by_label(tl)["other[900]"] == 50 * US  # woken, waiting for the CPU: runnable
    assert tl.state_ns["runnable"] == 50 * US


def test_t_by_sigstop_from_another_cpu_and_continued_by_its_sigcont():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("stopper", 900, "100.001000", "signal_generate: sig=19 errno=0 code=0 "
             "comm=probe pid=4240 grp=1 res=0", cpu=0),
        line("probe", PROBE, "100.001001", "reschedule_entry: vector=253", "d.h1."),
        line("probe", PROBE, "100.001002", "reschedule_exit: vector=253", "d.h1."),
        sw("probe", PROBE, "100.001010", "swapper/1", 0, "T"),
        wake("stopper", 900, "100.002600", cpu=0),               # SIGCONT: wake_up_state
        line("stopper", 900, "100.002601", "signal_generate: sig=18 errno=0 code=0 "
             "comm=probe pid=4240 grp=1 res=1", cpu=0),
        line("<idle>", 0, "100.002640", "reschedule_entry: vector=253", "d.h1."),
        line("<idle>", 0, "100.002641", "reschedule_exit: vector=253", "d.h1."),
    ])
    tl = follow(text, comms={900: "stopper"})
    part = tl.parts[0]
    assert (part.kind, part.state, part.signal, part.sender_tid, part.sender) == \
        ("stopped", "T", 19, 900, "stopper[900]")
    assert part.waker == "stopper[900]" and part.in_ns == 1_590 * US
    label = "stopped (T) by SIGSTOP from stopper[900], continued by stopper[900]"
    assert totals_by_label(tl)[label] == 1_590 * US
    d = part.to_dict(T0)
    assert d["signal"] == "SIGSTOP" and d["sender_tid"] == 900


def test_the_stop_signal_recorded_after_the_stop_still_names_its_sender():
    # the sender's signal_generate fires after complete_signal(): another CPU's target can
    # switch out (T) before the event is written
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001010", "swapper/1", 0, "T"),
        line("stopper", 900, "100.001012", "signal_generate: sig=19 errno=0 code=0 "
             "comm=probe pid=4242 grp=0 res=0", cpu=0),
        wake("stopper", 900, "100.002000", cpu=0),
    ])
    part = follow(text, comms={900: "stopper"}).parts[0]
    assert part.kind == "stopped" and part.sender_tid == 900 and part.signal == 19


def test_a_sleep_inside_the_call_on_its_timer_is_blocked_not_a_late_wake_up():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "busy", 900, "S"),       # nanosleep in the call
        line("busy", 900, "100.002000", "local_timer_entry: vector=236", "d.h1."),
        wake("busy", 900, "100.002001", "d.h2."),                # common_pid: interrupted task
        line("busy", 900, "100.002004", "local_timer_exit: vector=236", "d.h1."),
        sw("busy", 900, "100.002010", "probe", PROBE, "R+"),
    ])
    tl = follow(text)
    part = tl.parts[0]
    # the interrupt's common_pid (busy) is not the waker: the timer is
    assert (part.kind, part.waker, part.waker_tid, part.waker_ctx) == \
        ("blocked", "timer", None, "timer")
    assert part.in_ns == 901 * US
    t = totals_by_label(tl)
    assert t["busy[900]"] == 6 * US and t["local timer tick"] == 3 * US  # after the waking


def test_waking_without_a_switch_the_first_event_of_the_probe_is_its_run():
    """The dev VM's 6.18 kernel records no switch from idle: the waking is the witness that
    it became runnable, the next event in its context that it ran."""
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.001500", "local_timer_entry: vector=236", "d.h1."),
        wake("<idle>", 0, "100.001501", "d.h2."),
        line("<idle>", 0, "100.001504", "local_timer_exit: vector=236", "d.h1."),
        line("probe", PROBE, "100.002500", "local_timer_entry: vector=236", "d.h1."),
        line("probe", PROBE, "100.002504", "local_timer_exit: vector=236", "d.h1."),
    ])
    tl = follow(text)
    (part,) = tl.parts
    assert (part.kind, part.ended_by, part.in_ns) == ("blocked", "waking", 401 * US)
    assert tl.probe_run_ns == 100 * US + 996 * US + 496 * US  # the run after the tick too
    assert sum(tl.state_ns.values()) == T1 - T0


def test_switch_without_a_waking_ends_the_part_with_an_unknown_waker():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        sw("swapper/1", 0, "100.002300", "probe", PROBE, "R"),  # its waking was not recorded
    ])
    tl = follow(text, wake_reason="no wake-ups from other CPUs: unsupported: test")
    (part,) = tl.parts
    assert (part.kind, part.state, part.ended_by, part.waker_tid, part.waker_ctx) == \
        ("blocked", "S", "switch", None, "")
    assert part.waker == "unknown (no wake-up event)" and part.in_ns == 1_200 * US
    assert tl.to_dict()["wake_reason"].startswith("no wake-ups from other CPUs")


def test_no_switch_and_no_waking_is_unknown_never_guessed():
    """Asleep since before the window, no waking and no run seen while the call ended at t1
    (both missing): the time is unknown, the CPU's own view kept, no cause."""
    text = "\n".join([
        sw("probe", PROBE, "100.000900", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.002000", "local_timer_entry: vector=236", "d.h1."),
        line("<idle>", 0, "100.002004", "local_timer_exit: vector=236", "d.h1."),
    ])
    tl = follow(text)
    (part,) = tl.parts
    assert part.kind == "unknown" and part.ended_by == "window"
    assert tl.state_ns["unknown"] == T1 - T0 and tl.state_ns["not_runnable"] == 0
    assert not any(e.kind in ("blocked", "io_wait", "stopped") for e in tl.totals)
    assert sum(tl.totals.values()) == T1 - T0


def test_a_waking_with_no_switch_of_it_in_the_window_makes_a_part_of_unknown_state():
    text = "\n".join([
        line("<idle>", 0, "100.000100", "local_timer_entry: vector=236", "d.h1."),
        line("<idle>", 0, "100.000104", "local_timer_exit: vector=236", "d.h1."),
        wake("other", 900, "100.001700", cpu=0),
        sw("swapper/1", 0, "100.001720", "probe", PROBE, "R"),
    ])
    tl = follow(text, comms={900: "other"})
    (part,) = tl.parts
    assert (part.kind, part.state, part.waker, part.in_ns) == \
        ("blocked", None, "other[900]", 700 * US)
    assert "blocked (state unknown), woken by other[900]" in totals_by_label(tl)


def test_preempted_r_is_runnable_and_what_ran_is_named():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "hog", 540, "R+"),
        sw("hog", 540, "100.002100", "probe", PROBE, "S"),
    ])
    tl = follow(text)
    assert not tl.parts and totals_by_label(tl)["hog[540]"] == 1_000 * US
    assert tl.state_ns["runnable"] == 1_000 * US and tl.state_ns["not_runnable"] == 0


def test_a_thread_that_exits_mid_window_is_closed_not_an_error():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001500", "other", 900, "X"),
        line("other", 900, "100.002500", "local_timer_entry: vector=236", "d.h1."),
        line("other", 900, "100.002504", "local_timer_exit: vector=236", "d.h1."),
        wake("other", 900, "100.002600"),  # (a stale waking of the dead tid: ignored)
    ])
    tl = follow(text)
    (part,) = tl.parts
    assert part.kind == "unknown" and part.ended_by == "exit" and part.state == "X"
    assert totals_by_label(tl)[EXITED] == 1_500 * US
    assert tl.state_ns["unknown"] == 1_500 * US and sum(tl.state_ns.values()) == T1 - T0
    assert all(label != UNEXPLAINED or ns >= 0 for label, ns in breakdown(tl, 1_000 * US))


def test_a_stall_at_the_calls_start_gives_the_threads_backlog_to_it():
    # blocked since before t0 (the stall began between calls) until 0.5 ms into the window;
    # then the thread ran 1.5 ms: its earlier calls (queued) and this one (its own 0.4 ms)
    text = "\n".join([
        sw("probe", PROBE, "100.000600", "swapper/1", 0, "S"),
        wake("holder", 4243, "100.001500"),
        line("probe", PROBE, "100.003100", "local_timer_entry: vector=236", "d.h1."),
    ])
    tl = follow(text)
    got = backlog(tl, own_ns=400 * US)
    assert got is not None
    ent, ns = got
    assert ns == 1_100 * US and ent.kind == "blocked" and ent.label == BACKLOG
    items = dict(breakdown(tl, 1_700 * US, queued=got))
    assert items[BACKLOG] == 1_100 * US
    assert items[UNEXPLAINED] == 100 * US  # 1.7 ms excess - 0.5 blocked - 1.1 backlog
    # no stall at the start: no backlog
    assert backlog(follow(text.replace("100.000600", "100.001200")), 400 * US) is None


def test_a_pacing_sleep_of_unknown_state_woken_late_by_its_timer_is_a_late_wake_up():
    # the switch before the window is another task's: the thread's state is unknown until
    # its timer's waking says it was asleep, since before the window (a pacing sleep)
    text = "\n".join([
        sw("other", 900, "100.000500", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.002000", "local_timer_entry: vector=236", "d.h1."),
        wake("<idle>", 0, "100.002001", "d.h2."),
        line("<idle>", 0, "100.002004", "local_timer_exit: vector=236", "d.h1."),
        line("probe", PROBE, "100.002900", "local_timer_entry: vector=236", "d.h1."),
    ])
    tl = follow(text)
    (part,) = tl.parts
    assert (part.kind, part.state, part.waker) == ("idle", None, "timer")
    assert part.start_ns < T0 and tl.state_ns["wakeup"] == 1_001 * US
    assert tl.state_ns["runnable"] == 3 * US  # the rest of the tick, after the waking


def test_a_stop_signal_without_the_switch_out_in_the_window_still_makes_it_stopped():
    text = "\n".join([
        line("kit", 900, "100.000100", "signal_generate: sig=19 errno=0 code=0 comm=probe "
             "pid=4240 grp=1 res=0", cpu=0),
        sw("other", 555, "100.000500", "swapper/1", 0, "S"),
        wake("kit", 900, "100.002000", cpu=0),  # SIGCONT's wake-up
    ])
    (part,) = follow(text, comms={900: "kit"}).parts
    assert (part.kind, part.state, part.signal, part.sender) == \
        ("stopped", None, 19, "kit[900]")


def _timer(ts, due_ts, slack_us=50):
    due = int(float(due_ts) * 1e9)
    return line("probe", PROBE, ts, f"hrtimer_start: hrtimer=00000000deadbeef "
                f"function=hrtimer_wakeup expires={due + slack_us * 1000} softexpires={due} "
                "mode=REL was_armed=0")


def test_a_sleep_the_previous_call_asked_for_past_this_start_is_blocked_then_late():
    """The previous call slept 3 ms in its call path (a retry back-off) from before this
    call's start: its timer was due at 100.0023, after the start — the sleep was asked
    for (blocked); it fired 100 µs late (a late wake-up, the rest)."""
    text = "\n".join([
        _timer("100.000700", "100.002300"),
        sw("probe", PROBE, "100.000701", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.002400", "local_timer_entry: vector=236", "d.h1."),
        wake("<idle>", 0, "100.002401", "d.h2."),
        line("<idle>", 0, "100.002404", "local_timer_exit: vector=236", "d.h1."),
        line("probe", PROBE, "100.002900", "local_timer_entry: vector=236", "d.h1."),
    ])
    tl = follow(text)
    asked, late = tl.parts
    assert (asked.kind, asked.waker, asked.timer_due_ns) == ("blocked", "timer",
                                                             100_002_300_000)
    assert asked.in_ns == 1_300 * US
    assert (late.kind, late.start_ns, late.in_ns) == ("idle", 100_002_300_000, 101 * US)
    t = totals_by_label(tl)
    assert t["blocked (S), woken by timer"] == 1_300 * US and t[IDLE_BEFORE_WAKE] == 101 * US
    assert sum(tl.totals.values()) == T1 - T0
    assert all(a.end_ns == b.start_ns for a, b in zip(tl.intervals, tl.intervals[1:]))
    assert tl.state_ns["not_runnable"] == 1_300 * US and tl.state_ns["wakeup"] == 101 * US
    assert tl.to_dict()["parts"][0]["timer_due_us"] == 1300.0
    # the call's own pacing sleep, due before its start, is all a late wake-up
    paced = follow(text.replace("softexpires=100002300000", "softexpires=100000800000"))
    (part,) = paced.parts
    assert part.kind == "idle" and part.timer_due_ns == 100_000_800_000


def test_woken_and_then_no_event_to_the_windows_end_is_unknown_not_idle():
    """6.18 records no switch from idle: after its timer's waking nothing more fired on
    the CPU up to the window's end (no event after it read either) — it ran or waited,
    no event says which."""
    from agent.trace.timeline import NO_RUN_SEEN
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.001500", "local_timer_entry: vector=236", "d.h1."),
        wake("<idle>", 0, "100.001501", "d.h2."),
        line("<idle>", 0, "100.001504", "local_timer_exit: vector=236", "d.h1."),
    ])
    tl = follow(text)
    t = totals_by_label(tl)
    assert t[NO_RUN_SEEN] == 1_496 * US and IDLE_BEFORE_WAKE not in t
    assert tl.state_ns["unknown"] == 1_496 * US and tl.state_ns["wakeup"] == 0
    # with the thread's next event after the window, that stretch is its run
    later = text + "\n" + sw("probe", PROBE, "100.003400", "swapper/1", 0, "S")
    tl = follow(later)
    assert tl.probe_run_ns == 100 * US + 1_496 * US and tl.state_ns["unknown"] == 0


def test_a_pacing_timer_due_a_few_us_after_the_start_still_aimed_at_it():
    """A pacing sleep computed as start - now lands a few µs past the start: still the
    pacing sleep's (a late wake-up), not a sleep asked for past it (up to 50 µs)."""
    text = "\n".join([
        _timer("100.000700", "100.001005"),
        sw("probe", PROBE, "100.000701", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.001400", "local_timer_entry: vector=236", "d.h1."),
        wake("<idle>", 0, "100.001401", "d.h2."),
        line("<idle>", 0, "100.001404", "local_timer_exit: vector=236", "d.h1."),
        line("probe", PROBE, "100.002900", "local_timer_entry: vector=236", "d.h1."),
    ])
    (part,) = follow(text).parts
    assert part.kind == "idle" and part.timer_due_ns == 100_001_005_000
    far = follow(text.replace("softexpires=100001005000", "softexpires=100001200000"))
    assert [p.kind for p in far.parts] == ["blocked", "idle"]
