"""The kernel events decide a spike's cause where they see it directly (agent/watch/events/
wiring.py event_verdict / apply_verdict): another task, an IRQ or a softirq that ran on the
probe CPU for most of the excess corrects a polled verdict of contention, IRQ, softirq or
nothing; what happens inside the probe's own time (page faults, migration, steal, frequency)
stays the polled rules'."""

from __future__ import annotations

from agent.watch.events.wiring import apply_verdict, event_verdict

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
                          ("hw_or_hypervisor", "hw_or_hypervisor", 900 * US)],
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


def test_an_incomplete_timeline_never_decides():
    b = _body("cpu_contention", complete=False)
    apply_verdict(b, [("softirq", "NET_RX", 1_200 * US)], 1_300 * US)
    assert b["cause"] == "cpu_contention" and b["decided_by"] == "polled"


def test_unexplained_becomes_the_cause_the_events_show():
    b = _body("unexplained")
    apply_verdict(b, [("irq", "nvme0q3", 800 * US)], 1_000 * US)
    assert b["cause"] == "irq" and b["polled_cause"] == "unexplained"
