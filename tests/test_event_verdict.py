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
        apply_verdict(b, [("task", "hog", 1_200 * US)], 1_300 * US)
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
    assert b["causes"][0]["detail"].endswith("hog (pid 777) ran on CPU 1")
    # a scan that named them already is kept as it was
    b2 = _body("cpu_contention")
    b2["causes"][0]["evidence"] = {"ran_on_cpu": [{"comm": "x", "pid": 1}]}
    b2["events"]["timeline"] = b["events"]["timeline"]
    name_tasks(b2, b2["events"])
    assert b2["causes"][0]["evidence"]["ran_on_cpu"] == [{"comm": "x", "pid": 1}]
    assert b2["causes"][0]["detail"] == "polled"
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
    assert b["causes"][0]["detail"] == "hog ran on CPU 1 (kernel events)"  # stable


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
