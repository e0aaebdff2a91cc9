"""AttachedRun.check (watch --attach PID): the attached process is watched through its
pidfd — alive while it runs, gone once it exits, a zombie not yet reaped included (as
process_alive says) — and the descriptor is closed with the run. A child of the test only."""

from __future__ import annotations

import os
import subprocess

from agent.watch.latency.attached import Attached, AttachedRun
from collectors.host import Host


def test_the_process_is_alive_until_it_exits_zombie_included_and_the_pidfd_closes():
    child = subprocess.Popen(["sleep", "60"])
    run = AttachedRun(Attached(process=child.pid, comm="sleep"), Host(), [0], [])
    try:
        assert run.check() is None and run.check() is None
        fd = run._pidfd
        assert fd is not None and fd >= 0 and os.readlink(f"/proc/self/fd/{fd}") \
            == "anon_inode:[pidfd]"
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: Z
        assert run.check() == f"attached process {child.pid} exited"
    finally:
        child.kill()
        child.wait()
    run.close()
    assert run._pidfd is None and not os.path.exists(f"/proc/self/fd/{fd}") or \
        os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[pidfd]"


def test_a_process_gone_before_the_first_check_is_gone_without_a_pidfd():
    child = subprocess.Popen(["true"])
    child.wait()
    run = AttachedRun(Attached(process=child.pid, comm="true"), Host(), [0], [])
    assert run.check() == f"attached process {child.pid} exited"
    assert run._pidfd == -1
    run.close()
