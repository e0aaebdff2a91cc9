"""The kernel events decide a spike's cause where they see it directly (agent/trace/
wiring.py event_verdict / apply_verdict): another task, an IRQ or a softirq that ran on the
probe CPU for most of the excess corrects a polled verdict of contention, IRQ, softirq or
nothing; what happens inside the probe's own time (page faults, migration, steal, frequency)
stays the polled rules'."""

from __future__ import annotations

from agent.watch.attribution.events import apply_verdict, event_verdict

US = 1_000


def test_a_softirq_that_covers_the_excess_decides():
    triples = [("softirq", "NET_RX", 1_200 * US), ("task", "kworker/1:0", 100 * US),
               ("unexplained", "unexplained", 50 * US)]
    assert event_verdict(triples, 1_400 * US) == ("softirq", "NET_RX", 1_200 * US)


def test_kinds_sum_per_cause_and_the_top_culprit_is_named():
    triples = [("task", "stress", 400 * US), ("workqueue", "kworker/1:0 (vmstat_update)",
                                               300 * US), ("timer", "local timer tick", 20 * US)]
    assert event_verdict(triples, 900 * US) == ("cpu_contention", "stress", 700 * US)


def test_no_verdict_when_events_cover_too_little_or_two_causes_are_close():
    assert event_verdict([("task", "x", 300 * US)], 1_000 * US) is None       # 30 % only
    assert event_verdict([("task", "x", 600 * US), ("softirq", "NET_RX", 400 * US)],
                         1_000 * US) is None                                  # lead < 2×
    assert event_verdict([("idle", "idle", 900 * US), ("unknown", "?", 900 * US),
                          ("unexplained", "unexplained", 900 * US)],
                         1_000 * US) is None                                  # decide nothing
    assert event_verdict([("task", "x", 900 * US)], 0) is None


def _body(cause: str, complete: bool = True) -> dict:
    return {"cause": cause, "causes": [{"cause": cause, "detail": "polled"}],
            "events": {"complete": complete, "breakdown": [{"what": "softirq NET_RX",
                                                            "us": 1200.0}]}}


def test_events_correct_a_polled_contention_verdict_and_keep_it():
    b = _body("cpu_contention")
    apply_verdict(b, [("softirq", "NET_RX", 1_200 * US)], 1_300 * US)
    assert b["cause"] == "softirq" and b["polled_cause"] == "cpu_contention"
    assert b["decided_by"] == "events"
    assert b["causes"][0]["cause"] == "softirq" and "NET_RX" in b["causes"][0]["detail"]
    assert b["causes"][0]["evidence"] == {"events_us": 1200.0, "excess_us": 1300.0,
                                          "culprit": "NET_RX"}
    assert b["causes"][1]["detail"] == "polled"


def test_agreeing_events_leave_the_record_as_it_was_but_say_they_decided():
    b = _body("softirq")
    apply_verdict(b, [("softirq", "NET_RX", 1_200 * US)], 1_300 * US)
    assert b["cause"] == "softirq" and "polled_cause" not in b and b["decided_by"] == "events"
    assert len(b["causes"]) == 1


def test_polled_causes_events_cannot_see_stand():
    for polled in ("page_faults", "migration", "steal", "freq_drop", "numa_remote"):
        b = _body(polled)
        apply_verdict(b, [("task", "kswapd0", 1_200 * US)], 1_300 * US)
        assert b["cause"] == polled and b["decided_by"] == "polled"


def test_steal_stands_unless_the_sample_hid_no_time():
    """A polled steal verdict (a steal tick in the rows around the spike) is corrected by
    the events only where hw_noise measured the probe's CPU time equal to its time on the
    CPU: nothing was stolen inside the sample."""
    for hidden, corrected in ((0.0, True), (0, True), (450.0, False), (None, False)):
        b = _body("steal")
        b["events"]["hw_noise"] = {"hidden_us": hidden}
        hw = [("hw_or_hypervisor", "hw_or_hypervisor", int(hidden * US))] if hidden else []
        apply_verdict(b, [("task", "hog", 1_200 * US), *hw], 1_300 * US)
        assert (b["cause"] == "cpu_contention") is corrected, hidden
        assert (b.get("polled_cause") == "steal") is corrected
    b = _body("steal")  # no hw_noise at all: it stands
    apply_verdict(b, [("task", "hog", 1_200 * US)], 1_300 * US)
    assert b["cause"] == "steal"


def test_an_incomplete_timeline_never_decides():
    b = _body("cpu_contention", complete=False)
    apply_verdict(b, [("softirq", "NET_RX", 1_200 * US)], 1_300 * US)
    assert b["cause"] == "cpu_contention" and b["decided_by"] == "polled"


def test_unexplained_becomes_the_cause_the_events_show():
    b = _body("unexplained")
    apply_verdict(b, [("irq", "nvme0q3", 800 * US)], 1_000 * US)
    assert b["cause"] == "irq" and b["polled_cause"] == "unexplained"


def _tl(*entities) -> dict:
    return {"cpu": 1, "entities": [{"label": lb, "kind": k, "us": us} for lb, k, us in entities]}


def test_events_name_the_task_where_no_scan_covered_the_spike():
    """With kernel events the records no longer wait for a task scan (wiring.py
    reduce_for_events): a polled contention verdict without ``ran_on_cpu`` gets the tasks
    the events saw, largest first, and the detail names the top one."""
    from agent.watch.attribution.events import name_tasks
    b = _body("cpu_contention")
    b["causes"][0]["detail"] = "waited 1500 µs on the run queue"
    b["events"]["timeline"] = _tl(("probe numpy[4242]", "probe", 300.0),
                                  ("kworker/1:0[55]", "task", 20.0),
                                  ("hog[777]", "task", 1200.0),
                                  ("softirq NET_RX", "softirq", 30.0))
    apply_verdict(b, [("task", "hog", 1_200 * US), ("task", "kworker/1:0", 20 * US)],
                  1_300 * US)
    assert b["decided_by"] == "events" and b["cause"] == "cpu_contention"
    ran = b["causes"][0]["evidence"]["ran_on_cpu"]
    assert [(r["comm"], r["tid"], r["run_us"]) for r in ran] == [("hog", 777, 1200),
                                                                ("kworker/1:0", 55, 20)]
    assert all(r["from"] == "kernel events" and r["cpu"] == 1 for r in ran)
    assert b["causes"][0]["detail"] == ("other tasks ran 1,220 µs on CPU 1 (kernel events); "
                                        "hog (pid 777) ran on CPU 1")
    assert b["causes"][0]["polled_detail"] == "waited 1500 µs on the run queue"
    # a scan that named another task (it ran on the probe CPUs in the scan's rows, not in
    # the call: a kdamond while the timeline showed tokio-rt-worker) is replaced, and kept
    b2 = _body("cpu_contention")
    b2["causes"][0]["evidence"] = {"ran_on_cpu": [{"comm": "kdamond", "pid": 1}]}
    b2["events"]["timeline"] = b["events"]["timeline"]
    name_tasks(b2, b2["events"])
    assert [r["comm"] for r in b2["causes"][0]["evidence"]["ran_on_cpu"]] == \
        ["hog", "kworker/1:0"]
    assert b2["causes"][0]["evidence"]["polled_ran_on_cpu"] == [{"comm": "kdamond", "pid": 1}]
    assert "kdamond" not in b2["causes"][0]["detail"]
    # the thread group where /proc has it
    b3 = _body("cpu_contention")
    b3["events"]["timeline"] = _tl(("worker[778]", "task", 900.0))
    name_tasks(b3, b3["events"], tgid_of=lambda tid: 777)
    assert b3["causes"][0]["evidence"]["ran_on_cpu"][0]["pid"] == 777


def test_a_corrected_verdict_of_contention_names_the_tasks_too():
    b = _body("softirq")
    b["events"]["timeline"] = _tl(("hog[777]", "task", 1200.0))
    apply_verdict(b, [("task", "hog", 1_200 * US)], 1_300 * US)
    assert b["cause"] == "cpu_contention" and b["polled_cause"] == "softirq"
    assert b["causes"][0]["evidence"]["ran_on_cpu"][0]["comm"] == "hog"
    # the summary's example (summary.short) is the stable "who ran" part
    from agent.watch.summary import short
    assert short(b["causes"][0]["detail"]) == "hog (pid 777) ran on CPU 1"


def test_watch_looks_the_thread_group_up_through_its_host():
    """SpikeEvents.tgid (what the session gives apply_verdict) reads through the Host model
    (collectors.tasks.find_task), never /proc directly: a thread of ours maps to our pid, a
    task that is gone to itself."""
    import os
    import threading

    from agent.watch.attribution.events import SpikeEvents
    from collectors.host import Host
    ev = SpikeEvents("off", Host(), [0])
    assert ev.tgid(threading.get_native_id()) == os.getpid()
    assert ev.tgid(2**22 + 12345) == 2**22 + 12345


def test_idle_before_the_probe_woke_is_a_late_wake_up_and_idle_after_it_blocked_is_nothing():
    from agent.trace.timeline import IDLE_BEFORE_WAKE, IDLE_BLOCKED
    late = [("idle", IDLE_BEFORE_WAKE, 1_200 * US), ("timer", "local_timer", 20 * US)]
    assert event_verdict(late, 1_300 * US) == ("wakeup_latency", IDLE_BEFORE_WAKE, 1_200 * US)
    b = _body("unexplained")
    apply_verdict(b, late, 1_300 * US)
    assert b["cause"] == "wakeup_latency" and b["polled_cause"] == "unexplained"
    assert b["causes"][0]["detail"] == "CPU ? idle while the probe's wake-up came late " \
                                       "(kernel events)"
    # the probe's own wait (it blocked, then the CPU idled) decides nothing
    assert event_verdict([("idle", IDLE_BLOCKED, 1_200 * US)], 1_300 * US) is None


def test_absence_of_events_decides_nothing():
    """An idle CPU the probe never ran on, or the probe current with no event while its CPU
    time stood still (hw_or_hypervisor): a switch the window lacks looks the same as another
    CPU or the hypervisor would (a quiet-box run showed it), so the polled verdict stands."""
    from agent.trace.timeline import IDLE_ABSENT
    for triples in ([("idle", IDLE_ABSENT, 1_300 * US)],
                    [("hw_or_hypervisor", "hw_or_hypervisor", 1_260 * US),
                     ("irq", "virtio3-tx", 7 * US)]):
        b = _body("cpu_contention")
        apply_verdict(b, triples, 1_300 * US)
        assert b["cause"] == "cpu_contention" and b["decided_by"] == "polled"


# --- the call's thread not runnable (issue #26): blocked, io_wait, stopped, and the late
# wake-up only for what came late. Timelines from the kernel's own text, as the walk reads it.

from agent.trace.text import parse_text  # noqa: E402
from agent.trace.timeline import backlog, breakdown, timeline  # noqa: E402
from agent.watch.attribution.events import _triples  # noqa: E402
from tests.eventpages import trace_line as line  # noqa: E402
from tests.eventpages import trace_switch as sw  # noqa: E402

PROBE, PROC = 4242, 4240
T0, T1 = 100_001_000_000, 100_006_000_000  # a 5 ms call
TGIDS = {PROBE: PROC, 4243: PROC, 777: 777, 900: 905}


def _wake(comm, pid, ts, flags="d..2.", cpu=1):
    return line(comm, pid, ts, f"sched_waking: comm=probe pid={PROBE} prio=120 "
                f"target_cpu=001", flags, cpu=cpu)


def _record(text: str, polled: str, excess_ns: int, comms=None, own_ns: int = 0) -> dict:
    tl = timeline(parse_text(text.splitlines()), 1, {PROBE}, T0, T1, comms=comms or {},
                  follow=True, probe_pid=PROC, tgid_of=TGIDS.get)
    q = backlog(tl, own_ns) if own_ns else None
    items = breakdown(tl, excess_ns, queued=q)
    body = {"cause": polled, "causes": [{"cause": polled, "detail": "polled"}],
            "events": {"complete": True, "timeline": tl.to_dict(),
                       "breakdown": [{"what": k, "us": ns / 1e3} for k, ns in items]}}
    apply_verdict(body, _triples(tl, items, None, q), excess_ns, lambda t: TGIDS.get(t, t))
    return body


LOCK = "\n".join([
    sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
    sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
    _wake("holder", 4243, "100.005900"),
    sw("holder", 4243, "100.005910", "probe", PROBE, "S"),
])


def test_a_lock_held_by_a_sibling_thread_is_blocked_whatever_the_polled_rules_said():
    for polled in ("cpu_contention", "steal", "unexplained", "freq_drop", "migration"):
        b = _record(LOCK, polled, 4_800 * US, {4243: "holder"})
        assert b["cause"] == "blocked" and b["polled_cause"] == polled, polled
        ev = b["causes"][0]["evidence"]
        # bench/attribution.py's contract: state, the waker's process and thread
        assert (ev["state"], ev["waker_pid"], ev["waker_tid"], ev["same_process"]) == \
            ("S", PROC, 4243, True)
        assert b["causes"][0]["detail"] == ("blocked (S), woken by thread 4243 of the same "
                                            "process (holder) (kernel events)")


def test_a_timer_is_the_waker_of_a_sleep_in_the_call_with_no_waker_pid():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.005900", "local_timer_entry: vector=236", "d.h1."),
        _wake("<idle>", 0, "100.005901", "d.h2."),
        line("<idle>", 0, "100.005904", "local_timer_exit: vector=236", "d.h1."),
    ])
    b = _record(text, "unexplained", 4_800 * US)
    ev = b["causes"][0]["evidence"]
    assert b["cause"] == "blocked" and ev["waker"] == "timer" and ev["waker_pid"] is None


def test_stopped_names_the_signal_and_its_senders_process():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("kit", 900, "100.001000", "signal_generate: sig=19 errno=0 code=0 comm=probe "
             f"pid={PROC} grp=1 res=0", cpu=0),
        sw("probe", PROBE, "100.001010", "swapper/1", 0, "T"),
        _wake("kit", 900, "100.005950", cpu=0),
    ])
    b = _record(text, "wakeup_latency", 4_800 * US, {900: "kit"})
    ev = b["causes"][0]["evidence"]
    assert b["cause"] == "stopped" and b["polled_cause"] == "wakeup_latency"
    assert (ev["state"], ev["signal"], ev["sender_tid"], ev["sender_pid"], ev["waker_pid"]) \
        == ("T", "SIGSTOP", 900, 905, 905)
    assert "by SIGSTOP from kit[900]" in b["causes"][0]["detail"]


def test_a_major_faults_wait_in_d_keeps_the_polled_page_faults():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        line("probe", PROBE, "100.001050", "block_rq_issue: 8,0 R 4096 () 2048 + 8 none,0,0 "
             "[probe]"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "D"),
        line("<idle>", 0, "100.005800", "irq_handler_entry: irq=36 name=virtio1-req.0", "d.h1."),
        _wake("<idle>", 0, "100.005801", "d.h2."),
        line("<idle>", 0, "100.005805", "irq_handler_exit: irq=36 ret=handled", "d.h1."),
    ])
    assert _record(text, "page_faults", 4_800 * US)["cause"] == "page_faults"
    b = _record(text, "unexplained", 4_800 * US)
    assert b["cause"] == "io_wait" and b["causes"][0]["evidence"]["state"] == "D"


def test_a_short_wait_never_explains_a_long_stall():
    """73 µs blocked in a 4.8 ms excess decides nothing; the polled verdict stands."""
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        _wake("holder", 4243, "100.001173"),
        sw("holder", 4243, "100.001180", "probe", PROBE, "S"),
    ])
    b = _record(text, "steal", 4_800 * US, {4243: "holder"})
    assert b["cause"] == "steal" and b["decided_by"] == "polled"


def test_not_runnable_most_of_the_time_with_no_lead_makes_a_host_cause_unexplained():
    text = "\n".join([
        sw("swapper/1", 0, "100.000900", "probe", PROBE, "R"),
        sw("probe", PROBE, "100.001100", "swapper/1", 0, "S"),
        _wake("holder", 4243, "100.003500"),
        sw("holder", 4243, "100.003510", "probe", PROBE, "S"),
        line("kit", 900, "100.003600", "signal_generate: sig=19 errno=0 code=0 comm=probe "
             f"pid={PROC} grp=1 res=0", cpu=0),
        sw("probe", PROBE, "100.003610", "swapper/1", 0, "T"),
        _wake("kit", 900, "100.005900", cpu=0),
    ])
    # 2.4 ms blocked and 2.3 ms stopped of 4.8: neither leads twice the other
    b = _record(text, "cpu_contention", 4_800 * US, {4243: "holder", 900: "kit"})
    assert b["cause"] == "unexplained" and b["polled_cause"] == "cpu_contention"
    assert b["causes"][0]["evidence"]["not_runnable_us"] >= 4_600
    # a polled cause of the thread's own (page faults) is left to stand
    assert _record(text, "page_faults", 4_800 * US, {4243: "holder"})["cause"] == "page_faults"


def test_a_pacing_sleep_that_overshot_the_start_is_a_late_wake_up_with_its_timer():
    text = "\n".join([
        sw("probe", PROBE, "100.000500", "swapper/1", 0, "S"),
        line("<idle>", 0, "100.005000", "local_timer_entry: vector=236", "d.h1."),
        _wake("<idle>", 0, "100.005001", "d.h2."),
        line("<idle>", 0, "100.005004", "local_timer_exit: vector=236", "d.h1."),
    ])
    b = _record(text, "unexplained", 4_200 * US)
    ev = b["causes"][0]["evidence"]
    assert b["cause"] == "wakeup_latency"
    assert ev["waker"] == "timer" and ev["waker_pid"] is None and ev["state"] == "S"


def test_a_call_queued_behind_its_threads_stall_takes_the_stalls_cause():
    text = "\n".join([
        sw("probe", PROBE, "100.000600", "swapper/1", 0, "S"),
        _wake("holder", 4243, "100.001500"),
        line("probe", PROBE, "100.006100", "local_timer_entry: vector=236", "d.h1."),
    ])
    # 0.5 ms blocked at its start, then 4.5 ms of its thread's run, 0.8 of them its own
    b = _record(text, "cpu_contention", 4_300 * US, {4243: "holder"}, own_ns=800 * US)
    assert b["cause"] == "blocked" and b["causes"][0]["evidence"]["waker_tid"] == 4243
    whats = {x["what"]: x["us"] for x in b["events"]["breakdown"]}
    assert whats["backlog: its thread's earlier calls, queued behind the stall"] == 3_700
