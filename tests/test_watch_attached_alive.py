"""Whether a watched process still runs (agent/watch/latency/base.py ProcessLife, used by
``watch --attach PID``'s check and by a followed service's polls): its pidfd — alive while it
runs, gone once it exits, a zombie not yet reaped included (as process_alive says) — closed
with the run; no pidfd for a --root tree's pid, which is not this system's. Children of the
test only."""

from __future__ import annotations

import os
import subprocess

from agent.watch.latency.attached import Attached, AttachedRun
from agent.watch.latency.base import ProcessLife
from collectors.host import Host


def _is_pidfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
    except OSError:
        return False


def test_the_process_is_alive_until_it_exits_zombie_included_and_the_pidfd_closes():
    child = subprocess.Popen(["sleep", "60"])
    run = AttachedRun(Attached(process=child.pid, comm="sleep"), Host(), [0], [])
    try:
        assert run.check() is None and run.check() is None
        fd = run._life._fd
        assert fd is not None and fd >= 0 and _is_pidfd(fd)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: Z
        assert run.check() == f"attached process {child.pid} exited"
    finally:
        child.kill()
        child.wait()
    run.close()
    assert run._life._fd == -1 and not _is_pidfd(fd)


def test_a_process_gone_before_the_first_check_is_gone_without_a_pidfd():
    child = subprocess.Popen(["true"])
    child.wait()
    run = AttachedRun(Attached(process=child.pid, comm="true"), Host(), [0], [])
    assert run.check() == f"attached process {child.pid} exited"
    assert run._life._fd == -1
    run.close()


def test_a_life_closed_answers_from_proc_and_a_root_trees_pid_gets_no_pidfd(tmp_path):
    child = subprocess.Popen(["sleep", "60"])
    try:
        life = ProcessLife(Host(), child.pid)
        assert life.alive() and _is_pidfd(fd := life._fd)
        life.close()
        assert not _is_pidfd(fd) and life._fd == -1
        assert life.alive()                      # (process_alive from here on)
        (tmp_path / "proc" / str(child.pid)).mkdir(parents=True)
        (tmp_path / "sys").mkdir()
        (tmp_path / "proc" / str(child.pid) / "stat").write_text(
            f"{child.pid} (sleep) Z 1 1 1 0 -1 0\n")
        tree = ProcessLife(Host(root=tmp_path), child.pid)
        assert not tree.alive() and tree._fd == -1  # its stat says zombie: no pidfd asked
        child.kill()
        child.wait()
        assert not life.alive()
    finally:
        child.kill()
        child.wait()
