"""watch never shares the source's CPUs with itself (issue #39 item 3): `hftagent run --cpus 15
-- hftagent watch` under isolation put watch's sampler on the probe's CPU (P99.9 44-55 ms)
without a word. An inherited affinity is left by pinning; an isolated cpuset by leaving it
where watch may; else one line and no run. The affinity calls and the cgroup move are
injected (agent.watch.placement.OwnCpus) and the cpusets are a tree: no process but the
test's own is moved."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.watch.placement import OwnCpus, place
from collectors.host import Host


class Fake:
    """This process as the kernel would treat it: ``allowed`` (its cpuset's CPUs; None: all),
    its affinity, and whether it may leave the cpuset (root)."""

    def __init__(self, affinity: set[int], allowed: set[int] | None = None,
                 may_leave: bool = True) -> None:
        self.affinity, self.allowed, self.may_leave = set(affinity), allowed, may_leave
        self.joined: list[Path] = []

    def get(self) -> set[int]:
        return set(self.affinity)

    def set(self, cpus: list[int]) -> None:
        ok = set(cpus) & self.allowed if self.allowed is not None else set(cpus)
        if not ok:  # sched_setaffinity: no CPU of the mask in the cpuset
            raise OSError(errno.EINVAL, "Invalid argument")
        self.affinity = ok

    def join(self, procs: Path) -> None:
        if not self.may_leave:
            raise PermissionError(errno.EACCES, "Permission denied")
        self.joined.append(procs)
        self.allowed = None

    def own(self) -> OwnCpus:
        return OwnCpus(get=self.get, set=self.set, join=self.join)


@pytest.fixture
def isolated(tmp_path) -> Host:
    """A tree with the isolated cpuset `tune apply --isolate` makes (cgroup v2): CPU 3."""
    cg = tmp_path / "sys/fs/cgroup"
    (cg / "hftagent-isolated").mkdir(parents=True)
    (cg / "cgroup.procs").write_text("1\n")
    (cg / "hftagent-isolated/cgroup.procs").write_text("")
    (cg / "hftagent-isolated/cpuset.cpus").write_text("3\n")
    (tmp_path / "proc").mkdir()
    return Host(tmp_path)


def test_an_inherited_affinity_is_left_by_pinning(isolated):
    me = Fake({3})  # taskset -c 3 / hftagent run --cpus 3 without a cpuset
    assert place(isolated, [3], [0, 1], me.own()) == []
    assert me.affinity == {0, 1} and not me.joined


def test_an_isolated_cpuset_is_left_where_watch_may(isolated):
    me = Fake({3}, allowed={3})
    (w,) = place(isolated, [3], [0, 1], me.own())
    assert me.joined == [isolated.sysfs.resolve() / "fs/cgroup/cgroup.procs"]
    assert me.affinity == {0, 1}
    assert w == ("watch left the cpuset /sys/fs/cgroup/hftagent-isolated (CPUs 3) it "
                 "inherited for /sys/fs/cgroup: it runs on CPUs 0-1, the source on 3")


def test_no_cpu_but_the_source_s_is_one_line_and_no_run(isolated):
    me = Fake({3}, allowed={3}, may_leave=False)
    with pytest.raises(AgentError) as e:
        place(isolated, [3], [0, 1], me.own())
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("watch may run only on CPU 3, the latency "
                                              "source's (its inherited affinity or cpuset)")
    assert "housekeeping CPUs 0-1 (Invalid argument)" in msg
    assert me.affinity == {3}


def test_another_cpu_it_may_use_is_used_and_said(isolated):
    me = Fake({2, 3}, allowed={2, 3}, may_leave=False)  # a cpuset of two CPUs, one the probe's
    (w,) = place(isolated, [3], [0, 1], me.own())
    assert me.affinity == {2}
    assert w == ("cannot pin watch to CPUs 0-1: Invalid argument; it runs on CPU 2 (its "
                 "inherited affinity or cpuset), not the source's")


def test_a_plan_that_shares_keeps_its_warning(isolated):
    me = Fake({0})
    assert place(isolated, [0], [0], me.own()) == \
        ["one CPU only: the sampler shares the probe's CPU"]


def test_the_session_refuses_before_the_source_starts(isolated, tmp_path):
    from agent.watch.config import WatchConfig
    from agent.watch.latency.probe import BuiltinProbe
    from agent.watch.session import WatchSession
    me = Fake({3}, allowed={3}, may_leave=False)
    cfg = WatchConfig(source=BuiltinProbe("numpy"), probe_cpus=[3], housekeeping_cpus=[0, 1],
                      trace="off", spike_log=str(tmp_path / "s.jsonl"))
    s = WatchSession(cfg, isolated, own_cpus=me.own())
    with pytest.raises(AgentError, match="watch may run only on CPU 3"):
        s.run()
    assert s.source.proc is None and s.sampler is None  # nothing started


def test_the_summary_says_where_watch_ran(isolated):
    from agent.watch.config import WatchConfig
    from agent.watch.latency.probe import BuiltinProbe
    from agent.watch.session import WatchSession
    me = Fake({2, 3}, allowed={2, 3}, may_leave=False)
    cfg = WatchConfig(source=BuiltinProbe("numpy"), probe_cpus=[3], housekeeping_cpus=[0, 1])
    s = WatchSession(cfg, isolated, own_cpus=me.own())
    s.place_self()
    assert s.pinned_to == [2] and "it runs on CPU 2" in s.warnings[-1]
