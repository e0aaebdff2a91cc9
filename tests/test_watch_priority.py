"""watch's own priority (agent/watch/priority.py, ``hftagent watch --nice``): parsed with one
line on bad input, applied to the thread ids and helper pids given and nothing else, and
refused with one warning where the process may not lower its nice value."""

from __future__ import annotations

import os
import threading

import pytest

from agent.errors import AgentError
from agent.watch.priority import own_threads, parse_nice, renice
from collectors.host import Host


def test_parse_nice_bounds_and_garbage():
    assert parse_nice("-10") == -10 and parse_nice(" 0 ") == 0 and parse_nice(19) == 19
    for bad in ("", "x", "-21", "20", "1.5", "nan", "\u0663", "1_0", "+"):
        with pytest.raises(AgentError, match="--nice must be an integer from -20 to 19"):
            parse_nice(bad)


def test_renice_sets_exactly_the_ids_given_and_nothing_at_zero():
    calls = []
    set_ = lambda which, who, n: calls.append((which, who, n))  # noqa: E731
    assert renice(0, [1, 2], [3], setpriority=set_) is None and calls == []
    assert renice(-10, [11, 12], [30], setpriority=set_) is None
    assert calls == [(os.PRIO_PROCESS, 11, -10), (os.PRIO_PROCESS, 12, -10),
                     (os.PRIO_PROCESS, 30, -10)]


def test_renice_without_permission_is_one_warning_and_gone_threads_are_skipped():
    def refuse(which, who, n):
        raise PermissionError(1, "Operation not permitted")
    w = renice(-10, [11], setpriority=refuse)
    assert w.startswith("--nice -10: not permitted") and "CAP_SYS_NICE" in w

    def gone(which, who, n):
        if who == 11:
            raise ProcessLookupError(3, "No such process")
    assert renice(-5, [11, 12], setpriority=gone) is None


def test_own_threads_lists_this_process_s_threads(tmp_path):
    ev = threading.Event()
    t = threading.Thread(target=ev.wait, daemon=True)
    t.start()
    try:
        tids = own_threads(Host())
        assert threading.get_native_id() in tids and t.native_id in tids
    finally:
        ev.set()
        t.join()
    assert own_threads(Host(procfs=str(tmp_path))) == []  # no self/task there


def test_watch_renices_its_own_threads_and_helper_not_the_probe(monkeypatch):
    """The session passes its own threads and the native helper's pid; the probe is another
    process and is not among them; a refusal becomes one warning."""
    from agent.watch import session as session_mod
    from tests.test_watch_session import _storm_session
    seen = {}

    def fake_renice(nice, threads, processes=()):
        seen["args"] = (nice, list(threads), list(processes))
        return "--nice -7: not permitted (test)"
    monkeypatch.setattr(session_mod, "renice", fake_renice)
    s, _, _ = _storm_session(0, 0.0, nice=-7)

    class Feed:
        proc = type("P", (), {"pid": 424242})()
    s.sampler.feed = Feed()
    s.renice_own()
    nice, threads, procs = seen["args"]
    assert nice == -7 and procs == [424242]
    assert threading.get_native_id() in threads and os.getpid() in threads
    assert s.warnings[-1] == "--nice -7: not permitted (test)"
    seen.clear()
    plain, _, _ = _storm_session(0, 0.0)  # --nice 0: nothing is asked
    plain.renice_own()
    assert not seen
