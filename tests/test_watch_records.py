"""ExactStories: a record the kernel events did not decide names its CPU's latest exact
story as context where its cause is `unexplained` or the story's (issue #38: past watch's CPU
budget)."""

from agent.watch.attribution import Spike
from agent.watch.records import NEAREST_EXACT_S, ExactStories

MS = 1_000_000


def _sp(seq: int, end_ms: int, cpu: int = 1) -> Spike:
    return Spike(seq, (end_ms - 3) * MS, end_ms * MS, 10, 10, 400_000, cpu_start=cpu,
                 cpu_end=cpu)


def _exact(cause: str, detail: str | None = "cpu_hog (pid 7) ran 2.9 ms on CPU 1") -> dict:
    return {"cause": cause, "decided_by": "events",
            "causes": [{"cause": cause, "detail": detail}] if detail else []}


def test_an_unexplained_polled_record_names_the_latest_exact_story_on_its_cpu():
    st = ExactStories()
    st.remember(_sp(1, 1000), _exact("cpu_contention", "old"))
    st.remember(_sp(2, 2000), _exact("cpu_contention"))
    polled = {"cause": "unexplained", "decided_by": "polled", "causes": []}
    st.annotate(_sp(3, 3500), polled)
    assert polled["nearest_exact"] == {"spike": 2, "before_ms": 1500.0,
                                       "cause": "cpu_contention",
                                       "detail": "cpu_hog (pid 7) ran 2.9 ms on CPU 1"}
    inherited = {"cause": "unexplained", "causes": [], "inherited_from": 3}  # (a shed one)
    st.annotate(_sp(4, 3510), inherited)
    assert inherited["nearest_exact"]["spike"] == 2 and st.annotated == 2


def test_a_polled_record_of_the_storys_cause_takes_it_for_who_ran():
    """Past the budget the polled rules see the thread's run-queue wait, not who ran: the
    latest exact story of the same cause names it (not counted as an unexplained one)."""
    st = ExactStories()
    st.remember(_sp(1, 1000), _exact("cpu_contention"))
    polled = {"cause": "cpu_contention", "decided_by": "polled",
              "causes": [{"cause": "cpu_contention", "detail": "thread waited 3 ms"}]}
    st.annotate(_sp(2, 1800), polled)
    assert polled["nearest_exact"]["detail"] == "cpu_hog (pid 7) ran 2.9 ms on CPU 1"
    assert polled["nearest_exact"]["before_ms"] == 800.0 and st.annotated == 0


def test_no_context_where_it_would_say_nothing_or_something_else():
    st = ExactStories()
    st.remember(_sp(1, 1000), _exact("cpu_contention"))
    named = {"cause": "irq", "decided_by": "polled", "causes": []}  # another cause: its own
    other_cpu = {"cause": "unexplained", "causes": []}
    too_old = {"cause": "unexplained", "causes": []}
    events = {"cause": "unexplained", "decided_by": "events", "causes": []}
    st.annotate(_sp(2, 1100), named)
    st.annotate(_sp(3, 1100, cpu=0), other_cpu)
    st.annotate(_sp(4, 1000 + int(NEAREST_EXACT_S * 1000) + 1), too_old)
    st.annotate(_sp(5, 1100), events)  # the events' own timeline said unexplained
    assert not any("nearest_exact" in b for b in (named, other_cpu, too_old, events))
    # the latest exact story said unexplained itself: nothing to add
    st.remember(_sp(6, 1200), {"cause": "unexplained", "decided_by": "events"})
    later = {"cause": "unexplained", "causes": []}
    st.annotate(_sp(7, 1300), later)
    assert "nearest_exact" not in later and st.annotated == 0
    # a polled record is never remembered as a story
    st.remember(_sp(8, 1400), {"cause": "cpu_contention", "decided_by": "polled"})
    st.annotate(_sp(9, 1500), later)
    assert "nearest_exact" not in later


def test_the_report_says_how_many_unexplained_records_name_an_exact_story():
    from agent.watch.report import spikes
    s = {"spikes": 9, "attributed": 9, "queued": 0, "inherited": 0, "not_attributed": 0,
         "unexplained_with_nearest_exact": 4}
    assert spikes(s)[1] == ("  4 unexplained by the polled rules name their CPU's latest "
                            "exact story (nearest_exact)")
    assert len(spikes({**s, "unexplained_with_nearest_exact": 0})) == 1
