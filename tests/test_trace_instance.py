"""agent.trace.instance without a live tracefs: whether a stale instance's creator is gone
(from a fixture /proc: dead, a zombie, or its pid reused), and an instance's per-CPU stats;
the same rule for uprobe groups (agent.trace.uprobe.remove_stale: a live pid keeps its
group only with its instance or its guardian as witness) on a tracefs-shaped directory.
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


# -- the stale rule for uprobe groups (agent.trace.uprobe), on a fixture /proc ---------------

def _proc_tree(tmp_path, pids: dict[int, tuple[str, int, int]]):
    """A fixture /proc: pid -> (state, ppid, started s after boot), boot at 1000."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu 1 2 3\nbtime 1000\n")
    tck = os.sysconf("SC_CLK_TCK")
    for pid, (state, ppid, after) in pids.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "stat").write_text(
            f"{pid} (p) {state} {ppid} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 "
            f"{after * tck} 0 0\n")
        (proc / str(pid) / "cmdline").write_bytes(b"sleep\x0060\x00")
    return Host(root=tmp_path, procfs=proc, sysfs=tmp_path)


def _tracefs(tmp_path, instances: dict[str, float]):
    t = tmp_path / "tracing"
    (t / "instances").mkdir(parents=True)
    for name, mtime in instances.items():
        (t / "instances" / name).mkdir()
        os.utime(t / "instances" / name, (mtime, mtime))
    return t


def test_a_live_pid_owns_its_group_only_with_a_witness(tmp_path):
    from agent.trace import guardian, uprobe

    # 50: its instance made after it started (1010 s): the creator. 51: its instance made
    # before it started: a reused pid. 52: no instance, no guardian. 53: no instance, a
    # guardian child (54). 55: a zombie. 56: a child posing as 57's guardian, not 56's own.
    h = _proc_tree(tmp_path, {50: ("S", 1, 10), 51: ("S", 1, 10), 52: ("S", 1, 10),
                              53: ("S", 1, 10), 54: ("S", 53, 11), 55: ("Z", 1, 10),
                              56: ("S", 1, 10), 57: ("S", 56, 11)})
    for child, named in ((54, 53), (57, 58)):
        (h.proc(child, "cmdline")).write_bytes(b"\0".join(
            [b"python", b"-I", b"-S", guardian.SCRIPT.encode(), str(named).encode(), b"3",
             b""]))
    t = _tracefs(tmp_path, {"hftagent-50": 1015.0, "hftagent-51": 1005.0,
                            "hftagent-55": 1015.0})
    assert uprobe._alive(h, t, 50)
    assert not uprobe._alive(h, t, 51)     # the pid now runs a process started after
    assert not uprobe._alive(h, t, 52)     # alive, but nothing says it made the group
    assert uprobe._alive(h, t, 53)         # its guardian says so
    assert not uprobe._alive(h, t, 55)
    assert not uprobe._alive(h, t, 56)     # a guardian for another pid is no witness
    assert not uprobe._alive(h, t, 99)     # no such process


def test_remove_stale_appends_removals_for_dead_groups_only(tmp_path):
    from agent.trace import uprobe

    me = os.getpid()
    h = _proc_tree(tmp_path, {50: ("S", 1, 10)})
    t = _tracefs(tmp_path, {"hftagent-50": 1015.0})
    lines = ["p:hftagent_50/call0 /l.so:0x10", "p:hftagent_60/call0 /l.so:0x10",
             "r:hftagent_60/ret0 /l.so:0x10", "p:othertool/x /l.so:0x10",
             "p:hftagent_60x/x /l.so:0x10", f"p:hftagent_{me}/call0 /l.so:0x10"]
    (t / "uprobe_events").write_text("\n".join(lines) + "\n")
    (t / "instances" / "hftagent-50" / "events" / "hftagent_60").mkdir(parents=True)
    (t / "instances" / "hftagent-50" / "events" / "hftagent_60" / "enable").write_text("1")
    notes = uprobe.remove_stale(h, t)
    added = (t / "uprobe_events").read_text().splitlines()[len(lines):]
    # a dead pid's group (disabled where it was enabled first), and one named after us
    # that we do not hold (a dead process's whose pid we were given)
    assert added == ["-:hftagent_60/call0", "-:hftagent_60/ret0", f"-:hftagent_{me}/call0"]
    assert (t / "instances" / "hftagent-50" / "events" / "hftagent_60" / "enable"
            ).read_text() == "0"
    assert notes[0] == "removed stale uprobe events hftagent_60 (2 of 2: its process is gone)"

    class Held:   # a Uprobes this process holds: never taken for a dead one's
        group = f"hftagent_{me}"

    held = Held()
    uprobe._AT_EXIT.held.add(held)
    try:
        (t / "uprobe_events").write_text(lines[-1] + "\n")
        assert uprobe.remove_stale(h, t) == []
        assert (t / "uprobe_events").read_text() == lines[-1] + "\n"
    finally:
        uprobe._AT_EXIT.held.discard(held)
