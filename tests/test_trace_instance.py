"""agent.trace.instance without a live tracefs: whether a stale instance's creator is gone
(from a fixture /proc: dead, a zombie, or its pid reused), and an instance's per-CPU stats.
The instance's life on a real tracefs (create, remove, stale clean-up after kill -9, atexit,
SIGTERM) is tests/test_trace_tracefs.py's, through EventSource."""

from __future__ import annotations

import os

from agent.trace import instance
from collectors.host import Host


def test_creator_liveness_from_a_fixture_proc(tmp_path):
    proc = tmp_path / "proc"
    (proc / "50").mkdir(parents=True)
    (proc / "stat").write_text("cpu 1 2 3\nbtime 1000\n")
    tck = os.sysconf("SC_CLK_TCK")
    # started 10 s after boot; (a comm with ") " in it)
    (proc / "50" / "stat").write_text(
        f"50 (we) ird) S 1 50 50 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {10 * tck} 0 0\n")
    h = Host(root=tmp_path, procfs=proc, sysfs=tmp_path)
    assert not instance._proc_is_dead_or_reused(h, 50, created_wall=1009.5)  # its creator
    assert instance._proc_is_dead_or_reused(h, 50, created_wall=1005.0)  # started after: reused
    assert instance._proc_is_dead_or_reused(h, 51, created_wall=1005.0)  # gone
    (proc / "50" / "stat").write_text(
        f"50 (z) Z 1 50 50 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {10 * tck} 0 0\n")
    assert instance._proc_is_dead_or_reused(h, 50, created_wall=1009.5)  # a zombie


def test_stats_parse():
    st = instance.parse_stats("entries: 5\noverrun: 7\ncommit overrun: 0\nbytes: 300\n"
                         "oldest event ts:  1279.108639\nnow ts:  1280.000001\n"
                         "dropped events: 0\nread events: 9\n", 1)
    assert (st.entries, st.overrun, st.bytes, st.read) == (5, 7, 300, 9)
    assert st.oldest_ns == 1_279_108_639_000 and st.now_ns == 1_280_000_001_000
