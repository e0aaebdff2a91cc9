"""Runtime CPU isolation (tuning/tunables/isolate.py): plan, apply, verify and rollback on tree
copies (tests/isotree.py: vm-dev + SYNTHETIC tasks, workqueues, cgroup v1/v2), kill -9 at every
step of an apply or a rollback, and real task moves — only of `sleep` children this test
starts (``isolate.task_filter``), never of the machine's other tasks. Nothing here writes the
real /proc or /sys."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors.host import Host
from collectors.tasks import find_task, parse_stat_identity, task_key, tasks
from tests.isotree import MOVABLE, PER_CPU, IsoSim, iso_tree
from tests.treecopy import diff, snapshot
from tuning.apply import (
    APPLIED,
    MANUAL,
    UNAVAILABLE,
    UNCHANGEABLE,
    apply_plan,
    build_context,
    make_plan,
    rollback,
    status,
)
from tuning.findings import Status
from tuning.journal import load
from tuning.profiles import load_profile
from tuning.tunables import TuneError
from tuning.tunables import isolate as iso
from tuning.tunables.isolate import (
    V1,
    V2,
    IsolateTasks,
    cpuset_layout,
    isolated_cpuset,
    with_isolation,
)

runner = CliRunner()
ONLY = ["isolate"]
# pinned[907] is a user task pinned to CPU 1 (the target) on purpose: kept unless
# --include-pinned (issue #25: `tune apply` moved the inference service off its CPU)
PINNED = "pinned[907]"
MOVED = tuple(n for n in MOVABLE if n != PINNED)


def _ctx(root: Path, cpus: str = "1", writer=None, procfs: str | None = None,
         include_pinned: bool = False, **sim):
    host = Host(root, procfs=procfs) if procfs else Host(root)
    ctx = build_context(host, with_isolation(load_profile("bench"),
                                             include_pinned=include_pinned), cpus)
    ctx.writer = writer or IsoSim(**sim)
    return ctx


def _state(ctx) -> Path:
    return ctx.host.run_dir("hftagent")


def _affinity(root: Path, tid: int) -> str:
    t = find_task(Host(root), tid)
    assert t is not None
    return ",".join(map(str, t.affinity))


# ----------------------------------------------------------------------------------------------
# collectors/tasks.py
# ----------------------------------------------------------------------------------------------


def test_stat_identity_survives_parentheses_and_spaces_in_comm():
    line = "42 (a (b) c) S 1 42 42 0 -1 69238848 " + " ".join(["0"] * 12) + " 777 0 0"
    ident = parse_stat_identity(line)
    assert (ident.tid, ident.comm, ident.state, ident.flags, ident.starttime) == \
        (42, "a (b) c", "S", 69238848, 777)
    with pytest.raises(ValueError):
        parse_stat_identity("42 (x) S 1 2")


def test_task_list_from_the_tree_reads_every_thread(tmp_path):
    root = iso_tree(tmp_path / "t")
    ts = {t.tid: t for t in tasks(Host(root))}
    assert {900, 901, 902, 903} <= set(ts)
    assert ts[901].pid == 900 and ts[901].comm == "supervisor"
    assert ts[903].no_setaffinity and ts[903].kthread and ts[903].affinity == [1]
    assert not ts[900].kthread and ts[900].affinity == [0, 1]
    # the capture's own processes have no stat file: they cannot be identified, so they are
    # not listed (a live task always has one)
    assert 1 not in ts


# ----------------------------------------------------------------------------------------------
# plan
# ----------------------------------------------------------------------------------------------


def test_plan_moves_movable_tasks_and_lists_what_stays_by_name(tmp_path):
    root = iso_tree(tmp_path / "t")
    before = snapshot(root)
    ctx = _ctx(root)
    plan = make_plan(ctx, only=ONLY)
    assert diff(before, snapshot(root)) == []  # planning writes nothing
    t = next(it for it in plan.items if it.tunable.id == "isolate.tasks")
    names = {f"{x.comm}[{x.tid}]" for x, _ in t.tunable.survey.moves}
    # zombie, housekeeper, cpuset member, kthreads bound, a user task pinned to CPU 1: not
    assert names == set(MOVED)
    moves = {c.target: c.desired for c in t.changes if c.kind == "write"}
    assert moves[task_key(900, 1900)] == "0" and task_key(907, 1907) not in moves
    assert t.note.startswith(f"{len(MOVED)} task(s) will move off CPU 1; kept: pinned inside "
                             "the target CPUs: pinned[907] (CPU 1) (--include-pinned moves")
    manual = [c for c in t.changes if c.kind == MANUAL]
    assert len(manual) == 1
    for name in PER_CPU + ("kworker/u4:0[905]", "irq/25-ACPI:Ged[906]"):
        assert name in manual[0].detail
    s = t.tunable.survey.summary()
    assert s["per_cpu_kthreads"] == list(PER_CPU)
    assert s["in_isolated_cpuset"] == ["inference[909]"]
    wq = next(it for it in plan.items if it.tunable.id == "isolate.workqueue")
    assert {c.target: c.desired for c in wq.changes} == {
        "/sys/devices/virtual/workqueue/cpumask": "00000001",
        "/sys/devices/virtual/workqueue/writeback/cpumask": "00000001",
        "/sys/devices/virtual/workqueue/blkcg_punt_bio/cpumask": "00000001"}
    assert "scsi_tmf_0" in wq.changes[0].detail  # not on the allowlist: said, not written


def test_v1_cpuset_plan_says_which_method_and_why(tmp_path):
    root = iso_tree(tmp_path / "t", cgroup="v1")
    plan = make_plan(_ctx(root), only=ONLY)
    cg = next(it for it in plan.items if it.tunable.id == "isolate.cgroup")
    assert [c.target for c in cg.changes] == [
        "cgroup:/sys/fs/cgroup/cpuset/hftagent-isolated",
        "cgroup:/sys/fs/cgroup/cpuset/hftagent-housekeeping"]
    assert "cgroup v1 cpuset" in cg.changes[0].detail
    assert "cgroup2 at /sys/fs/cgroup/unified offers no cpuset" in cg.changes[0].detail
    cs = next(it for it in plan.items if it.tunable.id == "isolate.cpuset")
    assert {c.target.rsplit("cgroup/", 1)[1]: c.desired for c in cs.changes} == {
        "cpuset/hftagent-isolated/cpuset.mems": "0",
        "cpuset/hftagent-isolated/cpuset.cpus": "1",
        "cpuset/hftagent-isolated/cpuset.sched_load_balance": "0",
        "cpuset/hftagent-housekeeping/cpuset.mems": "0",
        "cpuset/hftagent-housekeeping/cpuset.cpus": "0",
        "cpuset/cpuset.sched_load_balance": "0"}


@pytest.mark.parametrize("osrelease,want", [("6.18.44", "isolated"), ("6.1.0", "root"),
                                            ("5.10.0", None)])
def test_v2_partition_type_follows_the_kernel(tmp_path, osrelease, want):
    root = iso_tree(tmp_path / "t", cgroup="v2", osrelease=osrelease)
    lay = cpuset_layout(Host(root))
    if want is None:
        assert isinstance(lay, str) and lay.startswith("unsupported:") and "5.13" in lay
        return
    assert lay.method == V2 and lay.partition == want and lay.mount == "/sys/fs/cgroup"


def test_cpuset_layout_reasons(tmp_path):
    root = iso_tree(tmp_path / "none", cgroup="none")
    lay = cpuset_layout(Host(root))
    assert isinstance(lay, str) and lay.startswith("unsupported: no cpuset controller")
    root = iso_tree(tmp_path / "elsewhere", cgroup="none")
    (root / "proc/self/mounts").write_text("cgroup /dev/cpuset cgroup rw,cpuset 0 0\n")
    lay = cpuset_layout(Host(root))
    assert isinstance(lay, str) and "/dev/cpuset" in lay and "not where tuning may" in lay
    root = iso_tree(tmp_path / "v1", cgroup="v1")
    (root / "proc/self/mounts").unlink()  # a capture without a mount table: usual places
    assert cpuset_layout(Host(root)).method == V1


def test_no_cpuset_or_workqueue_is_unsupported_and_the_rest_applies(tmp_path):
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)
    ctx = _ctx(root)
    plan = make_plan(ctx, only=ONLY)
    reasons = {it.tunable.id: it.reason for it in plan.items if it.state == UNAVAILABLE}
    assert reasons["isolate.workqueue"].startswith("unsupported: no /sys/devices/virtual/")
    assert reasons["isolate.cgroup"].startswith("unsupported: no cpuset controller")
    assert reasons["isolate.cpuset"].startswith("unsupported: no cpuset controller")
    rep = apply_plan(ctx, plan, _state(ctx))
    assert rep.ok and _affinity(root, 900) == "0"
    assert rollback(ctx, _state(ctx)).remaining == 0 and _affinity(root, 900) == "0,1"


@pytest.mark.parametrize("cpus", ["0-1", "0,1"])
def test_isolating_every_online_cpu_is_refused_in_one_line(tmp_path, cpus):
    root = iso_tree(tmp_path / "t")
    with pytest.raises(TuneError, match="covers every online CPU .*housekeeping CPU"):
        make_plan(_ctx(root, cpus), only=ONLY)
    res = runner.invoke(get_app(), ["tune", "plan", "--isolate", "--only", "isolate", "--cpus",
                                    cpus, "--root", str(root)])
    assert res.exit_code == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hftagent: error: ") and "housekeeping" in err[0]


def test_no_target_cpus_leaves_isolation_alone(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root, None)
    assert ctx.cpus == [1]  # the one rule (tuning/targets.py): all but the housekeeping core
    ctx.cpus = []  # a resolver that found none
    plan = make_plan(ctx, only=ONLY)
    assert all(it.state == UNAVAILABLE and "no target CPUs" in it.reason for it in plan.items
               if it.tunable.id.startswith("isolate."))


def test_profile_that_does_not_ask_is_not_isolated_unless_isolate(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = build_context(Host(root), load_profile("bench"), "1")
    plan = make_plan(ctx, only=ONLY)
    assert not plan.changes  # bench: runtime_isolation = "any"
    assert load_profile("hft-cpu").expected("runtime_isolation") == "on"


# ----------------------------------------------------------------------------------------------
# round trips on tree copies
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cgroup", ["v1", "v2"])
def test_roundtrip_restores_every_file_byte_for_byte(tmp_path, cgroup):
    root = iso_tree(tmp_path / "t", cgroup=cgroup)
    before = snapshot(root)
    ctx = _ctx(root)
    plan = make_plan(ctx, only=ONLY)
    rep = apply_plan(ctx, plan, _state(ctx))
    assert rep.ok, [o.to_dict() for o in rep.outcomes if o.result not in (APPLIED, MANUAL)]
    assert all(f.status == Status.OK for f in rep.findings), [f.to_dict() for f in rep.findings]
    tf = next(f for f in rep.findings if f.id == "isolate.tasks")
    assert tf.data["after"]["movable_on_targets"] == 0
    assert tf.data["before"]["movable_on_targets"] == len(MOVED)
    assert tf.current.startswith(f"0 movable task(s) allowed on CPU 1 (before: {len(MOVED)}); "
                                 "kept: pinned inside the target CPUs: pinned[907] (CPU 1)")
    assert tf.data["after"]["pinned_kept"] == [PINNED]
    for tid in (900, 901, 902):
        assert _affinity(root, tid) == "0"
    assert _affinity(root, 903) == "1" and _affinity(root, 909) == "1"
    assert _affinity(root, 907) == "1"  # pinned there on purpose: kept
    cg = root / "sys/fs/cgroup" / ("cpuset" if cgroup == "v1" else "")
    iso_dir = cg / "hftagent-isolated"
    assert (iso_dir / "cpuset.cpus").read_text() == "1\n"
    if cgroup == "v1":
        assert (cg / "cpuset.sched_load_balance").read_text() == "0\n"
        assert (iso_dir / "cpuset.sched_load_balance").read_text() == "0\n"
        assert (cg / "hftagent-housekeeping/cpuset.cpus").read_text() == "0\n"
    else:
        assert (iso_dir / "cpuset.cpus.partition").read_text() == "isolated\n"
        assert "cpuset" in (cg / "cgroup.subtree_control").read_text().split()
    assert (root / "sys/devices/virtual/workqueue/cpumask").read_text() == "1\n"
    found = isolated_cpuset(Host(root))
    assert found is not None and found.cpus == [1] and found.method == (V1 if cgroup == "v1"
                                                                       else V2)
    st = status(ctx, _state(ctx))
    assert st.all_hold, [i.to_dict() for i in st.items if i.result != "holds"]
    # the journal names tasks by TID and starttime, and only allowlisted targets
    j = load(_state(ctx))
    assert task_key(900, 1900) in {e.target for e in j.entries}
    rb = rollback(ctx, _state(ctx))
    assert rb.remaining == 0, [i.to_dict() for i in rb.items if i.result != "restored"]
    assert diff(before, snapshot(root)) == []
    assert not iso_dir.exists()


def test_apply_twice_changes_nothing_the_second_time(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root)
    apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    plan = make_plan(_ctx(root), only=ONLY)
    assert [c for c in plan.changes if c.kind == "write"] == []


def test_a_task_the_kernel_refuses_is_unchangeable_not_fatal(tmp_path):
    root = iso_tree(tmp_path / "t")
    before = snapshot(root)
    refused = "proc/907/task/907/status"
    ctx = _ctx(root, include_pinned=True, fail={refused: errno.EINVAL})
    rep = apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    by = {o.change.target: o for o in rep.outcomes}
    assert by[task_key(907, 1907)].result == UNCHANGEABLE
    assert by[task_key(900, 1900)].result == APPLIED
    assert rep.ok and all(f.status == Status.OK for f in rep.findings)
    assert rollback(ctx, _state(ctx)).remaining == 0
    assert diff(before, snapshot(root)) == []


def test_a_task_that_appears_after_the_plan_is_named_with_the_command_that_moves_it(tmp_path):
    from tests.isotree import add_tasks
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root)
    plan = make_plan(ctx, only=["isolate.tasks"])
    t = plan.items[[i.tunable.id for i in plan.items].index("isolate.tasks")].tunable
    add_tasks(root, ((960, "latecomer", 0x400100, "0-1", (960,), "S", "/"),))
    f = t.verify(ctx, {c.target: c.desired for c in plan.changes if c.kind == "write"})
    assert f.status == Status.WARN and "new since planning: latecomer[960]" in f.current
    assert f.fix == "hftagent tune apply --isolate --only isolate --cpus 1"
    res = runner.invoke(get_app(), f.fix.split()[1:] + ["--root", str(root), "--dry-run"])
    assert res.exit_code == 2, res.output  # accepted; changes pending


def test_eperm_is_reported_not_fatal(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root, fail={"proc/902/task/902/status": errno.EPERM})
    rep = apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    by = {o.change.target: o.result for o in rep.outcomes}
    assert by[task_key(902, 1902)] == UNCHANGEABLE and rep.ok


def test_a_reused_tid_is_not_the_task_that_was_moved(tmp_path):
    root = iso_tree(tmp_path / "t")
    t = IsolateTasks()
    ctx = _ctx(root)
    key = task_key(900, 1900)
    assert t.read_target(ctx, key) == "0-1"
    assert not t.gone(ctx, key)
    # the kernel reuses TID 900 for a new task: another starttime
    stat = root / "proc/900/task/900/stat"
    stat.write_text(stat.read_text().replace(" 1900 ", " 5555 "))
    assert t.read_target(ctx, key) is None and t.gone(ctx, key)
    with pytest.raises(ProcessLookupError):
        t.write(ctx, key, "0")
    assert t.gone(ctx, task_key(4242, 1))  # no such task at all


def test_rollback_leaves_a_drifted_task_unless_force(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root)
    apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    st = root / "proc/900/task/900/status"  # someone pinned it elsewhere meanwhile
    st.write_text(st.read_text().replace("Cpus_allowed_list:\t0", "Cpus_allowed_list:\t1"))
    rb = rollback(ctx, _state(ctx))
    assert [i.target for i in rb.items if i.result == "drift"] == [task_key(900, 1900)]
    assert rollback(ctx, _state(ctx), force=True).remaining == 0
    assert _affinity(root, 900) == "0,1"


def test_a_busy_isolated_cpuset_is_kept_and_reported(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root)
    apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    procs = root / "sys/fs/cgroup/cpuset/hftagent-isolated/cgroup.procs"
    procs.write_text("4321\n")  # `hftagent run` put its command there; it still runs
    rb = rollback(ctx, _state(ctx))
    assert rb.remaining > 0
    failed = {i.target for i in rb.items if i.result == "failed"}
    assert "cgroup:/sys/fs/cgroup/cpuset/hftagent-isolated" in failed
    procs.write_text("")  # it exits
    assert rollback(ctx, _state(ctx)).remaining == 0
    assert not procs.parent.exists()


# ----------------------------------------------------------------------------------------------
# kill -9 at every step (tree copies: tasks live in their status files there)
# ----------------------------------------------------------------------------------------------


def _dying_at(k: int, fn) -> int:
    """Run fn(checkpoint) in a forked child that os._exit()s (like SIGKILL: no cleanup) at its
    k-th checkpoint."""
    pid = os.fork()
    if pid == 0:
        try:
            n = 0

            def cp(_step: str) -> None:
                nonlocal n
                n += 1
                if n == k:
                    os._exit(137)

            fn(cp)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - never return into pytest from the child
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)


def _count(fn) -> int:
    steps: list[str] = []
    fn(steps.append)
    return len(steps)


@pytest.mark.parametrize("cgroup", ["v1", "v2"])
def test_kill_at_every_isolate_apply_step_then_rollback_restores_everything(tmp_path, cgroup):
    pristine = snapshot(iso_tree(tmp_path / "proto", cgroup=cgroup))

    def apply_on(root):
        return lambda cp: apply_plan(_ctx(root), make_plan(_ctx(root), only=ONLY),
                                     _state(_ctx(root)), checkpoint=cp)

    total = _count(apply_on(iso_tree(tmp_path / "count", cgroup=cgroup)))
    assert total >= 8  # a journal save and the writes of each of the four tunables
    for k in range(1, total + 1):
        root = iso_tree(tmp_path / f"k{k}", cgroup=cgroup)
        assert _dying_at(k, apply_on(root)) == 137
        ctx = _ctx(root)
        rb = rollback(ctx, _state(ctx))
        assert rb.remaining == 0, (k, [i.to_dict() for i in rb.items])
        assert diff(pristine, snapshot(root)) == [], f"killed at step {k}"


def test_kill_at_every_isolate_rollback_step_then_rollback_again(tmp_path):
    pristine = snapshot(iso_tree(tmp_path / "proto"))

    def applied(name: str) -> Path:
        root = iso_tree(tmp_path / name)
        ctx = _ctx(root)
        apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
        return root

    def rollback_on(root):
        return lambda cp: rollback(_ctx(root), _state(_ctx(root)), checkpoint=cp)

    total = _count(rollback_on(applied("count")))
    assert total >= 10
    for k in range(1, total + 1):
        root = applied(f"k{k}")
        assert _dying_at(k, rollback_on(root)) == 137
        assert rollback(_ctx(root), _state(_ctx(root))).remaining == 0
        assert diff(pristine, snapshot(root)) == [], f"rollback killed at step {k}"


# ----------------------------------------------------------------------------------------------
# real task moves: only `sleep` children started here
# ----------------------------------------------------------------------------------------------


def _need_two_cpus() -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")


@pytest.fixture
def children(monkeypatch):
    """Three `sleep` children allowed on CPUs 0-1; isolation may move only them."""
    _need_two_cpus()
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    for p in procs:
        os.sched_setaffinity(p.pid, {0, 1})
    pids = {p.pid for p in procs}
    monkeypatch.setattr(iso, "task_filter", lambda t: t.pid in pids)
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _real_ctx(root: Path):
    # files from the tree copy, tasks from the live /proc (filtered to our children)
    return _ctx(root, procfs="/proc")


def test_real_children_are_moved_and_restored(tmp_path, children):
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)
    ctx = _real_ctx(root)
    plan = make_plan(ctx, only=["isolate.tasks"])
    assert len([c for c in plan.changes if c.kind == "write"]) == 3
    rep = apply_plan(ctx, plan, _state(ctx))
    assert rep.ok and all(f.status == Status.OK for f in rep.findings)
    assert rep.findings[0].data["after"]["movable_on_targets"] == 0
    assert all(os.sched_getaffinity(p.pid) == {0} for p in children)
    rb = rollback(_real_ctx(root), _state(ctx))
    assert rb.remaining == 0
    assert all(os.sched_getaffinity(p.pid) == {0, 1} for p in children)


def test_real_children_kill_at_every_apply_step_then_rollback(tmp_path, children):
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)

    def apply_it(cp):
        ctx = _real_ctx(root)
        apply_plan(ctx, make_plan(ctx, only=["isolate.tasks"]), _state(ctx), checkpoint=cp)

    total = _count(apply_it)
    rollback(_real_ctx(root), _state(_real_ctx(root)))
    assert all(os.sched_getaffinity(p.pid) == {0, 1} for p in children)
    for k in range(1, total + 1):
        assert _dying_at(k, apply_it) == 137
        rb = rollback(_real_ctx(root), _state(_real_ctx(root)))
        assert rb.remaining == 0, k
        assert all(os.sched_getaffinity(p.pid) == {0, 1} for p in children), k


def test_a_task_that_exited_is_gone_not_unreadable(tmp_path, children):
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)
    ctx = _real_ctx(root)
    apply_plan(ctx, make_plan(ctx, only=["isolate.tasks"]), _state(ctx))
    dead = children[0]
    t = find_task(Host(), dead.pid)
    key = task_key(dead.pid, t.starttime)
    dead.kill()
    dead.wait()
    assert IsolateTasks().gone(_real_ctx(root), key)
    assert not IsolateTasks().gone(_real_ctx(root), task_key(children[1].pid,
                                                            find_task(Host(), children[1].pid)
                                                            .starttime))


def test_rollback_after_a_task_exited_restores_the_rest_and_is_not_an_error(tmp_path,
                                                                             children):
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)
    ctx = _real_ctx(root)
    apply_plan(ctx, make_plan(ctx, only=["isolate.tasks"]), _state(ctx))
    children[0].kill()
    children[0].wait()
    rb = rollback(_real_ctx(root), _state(ctx))
    assert all(os.sched_getaffinity(p.pid) == {0, 1} for p in children[1:])
    assert rb.remaining == 0 and not [i for i in rb.items if i.result == "failed"]


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def test_cli_plan_apply_rollback_with_isolate_on_a_tree(tmp_path, monkeypatch):
    root = iso_tree(tmp_path / "t")
    before = snapshot(root)
    monkeypatch.setattr("tuning.tunables.base.default_writer", IsoSim)
    res = runner.invoke(get_app(), ["tune", "plan", "--isolate", "--only", "isolate", "--cpus",
                                    "1", "--root", str(root)], env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert "isolate.tasks" in res.stdout and "manual: isolate.tasks" in res.stdout
    assert "ksoftirqd/1[903]" in res.stdout and "cgroup v1 cpuset" in res.stdout
    assert "swappiness" not in res.stdout  # --only isolate: only isolation
    assert (f"isolate.tasks: {len(MOVED)} task(s) will move off CPU 1; kept: pinned inside the "
            "target CPUs: pinned[907] (CPU 1)") in res.stdout
    res = runner.invoke(get_app(), ["tune", "apply", "--isolate", "--only", "isolate", "--cpus",
                                    "1", "--root", str(root), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {f["id"] for f in out["findings"]} == {"isolate.tasks", "isolate.workqueue",
                                                  "isolate.cgroup", "isolate.cpuset"}
    res = runner.invoke(get_app(), ["tune", "rollback", "--root", str(root)])
    assert res.exit_code == 0, res.output
    assert diff(before, snapshot(root)) == []


def test_isolate_with_only_adds_to_it(tmp_path):
    root = iso_tree(tmp_path / "t")
    res = runner.invoke(get_app(), ["tune", "plan", "--isolate", "--only", "memory",
                                    "--cpus", "1", "--root", str(root), "--json"])
    assert res.exit_code == 2
    states = {i["id"]: i["state"] for i in json.loads(res.stdout)["items"]}
    assert states["isolate.tasks"] == "planned" and states["memory.swappiness"] != "skipped"
    assert states["irq.affinity"] == "skipped"


def test_run_joins_the_isolated_cpuset_when_its_cpus_are_inside(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctx = _ctx(root)
    apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    res = runner.invoke(get_app(), ["run", "--cpus", "1", "--dry-run", "--root", str(root),
                                    "--json", "--", "true"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["cpuset"] == "/sys/fs/cgroup/cpuset/hftagent-isolated"
    res = runner.invoke(get_app(), ["run", "--cpus", "0", "--dry-run", "--root", str(root),
                                    "--", "true"])
    assert "note: not joining the isolated cpuset" in res.stdout
    from tuning.launcher import _join, build_launch
    launch = build_launch(Host(root), ["true"], cpus="1")
    _join(launch)  # into the tree copy's cgroup.procs
    procs = root / "sys/fs/cgroup/cpuset/hftagent-isolated/cgroup.procs"
    assert procs.read_text().strip() == str(os.getpid())


def test_spinner_and_signal_free_helpers_are_not_moved_by_name(tmp_path):
    """The survey never needs a process name to decide: flags and affinity do (a user task
    called "ksoftirqd/1" is moved like any other)."""
    from tests.isotree import NOAFF
    fake = ((950, "ksoftirqd/1", 0x400100, "0-1", (950,), "S", "/"),
            (951, "kworker/1:9", NOAFF, "1", (951,), "I", "/"))
    root = iso_tree(tmp_path / "t", tasks=fake)
    t = IsolateTasks()
    t.desired(_ctx(root))
    assert [x.tid for x, _ in t.survey.moves] == [950]
    assert [x.tid for x in t.survey.per_cpu] == [951]


def test_live_survey_is_read_only_and_sees_per_cpu_kthreads():
    """On this host (read only): per-CPU kernel threads of CPU 1 are found as such."""
    if 1 not in os.sched_getaffinity(0):
        pytest.skip("needs CPU 1")
    s = iso.survey_tasks(Host(), [1], [0])
    if not s.per_cpu:
        pytest.skip("no per-CPU kernel thread on CPU 1 visible here")
    assert all(t.no_setaffinity and t.affinity == [1] for t in s.per_cpu)
    assert any(t.comm.startswith(("ksoftirqd/", "migration/", "cpuhp/")) for t in s.per_cpu)


def test_sleeping_child_stays_put_without_a_filter_match(tmp_path, children, monkeypatch):
    monkeypatch.setattr(iso, "task_filter", lambda t: False)
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)
    ctx = _real_ctx(root)
    rep = apply_plan(ctx, make_plan(ctx, only=["isolate.tasks"]), _state(ctx))
    assert rep.outcomes == [] and all(os.sched_getaffinity(p.pid) == {0, 1} for p in children)


def test_an_irq_thread_the_partition_reset_is_restored_by_rollback(tmp_path):
    # cgroup v2: removing the isolated partition resets the affinity of the kernel threads in
    # the root cgroup (seen on 6.18 with irq/48-nvidia pinned to CPU 4, back on 0-15), though
    # isolation never moved them: isolate.tasks journals every pinned IRQ thread at its own
    # value so that rollback puts it back
    from tests.isotree import KT, TASKS, add_tasks
    root = iso_tree(tmp_path / "t", cgroup="v2")
    add_tasks(root, TASKS + ((911, "irq/48-nvidia", KT, "0", (911,), "S", "/"),))
    ctx = _ctx(root)
    apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    keys = {e.target for e in load(_state(ctx)).entries}
    t = find_task(Host(root), 911)
    assert t is not None and task_key(911, t.starttime) in keys
    status = root / "proc/911/task/911/status"
    status.write_text(status.read_text().replace("Cpus_allowed_list:\t0",
                                                 "Cpus_allowed_list:\t0-1"))
    assert _affinity(root, 911) == "0,1"          # what the partition's removal does
    rb = rollback(ctx, _state(ctx))
    assert rb.remaining == 0
    assert _affinity(root, 911) == "0"


@pytest.mark.parametrize("cgroup", ["v1", "v2"])
def test_workers_join_the_isolated_cpuset_to_pin_themselves(tmp_path, cgroup):
    """The probe's and watch's workers pin through tuning.tunables.isolate.pin_self: inside
    the isolated cpuset when the CPUs are in it (after a cgroup v2 isolation their parent's
    cgroup has lost those CPUs: `gate --cpus 15` was refused on a 16-CPU box), left alone
    otherwise."""
    from tuning.tunables.isolate import join_isolated, pin_self
    root = iso_tree(tmp_path / "t", cgroup=cgroup)
    ctx = _ctx(root)
    apply_plan(ctx, make_plan(ctx, only=ONLY), _state(ctx))
    cg = root / "sys/fs/cgroup" / ("cpuset" if cgroup == "v1" else "")
    procs = cg / "hftagent-isolated/cgroup.procs"
    before = procs.read_text()
    assert join_isolated(Host(root), [0]) is None and procs.read_text() == before
    assert join_isolated(Host(root), [0, 1]) is None  # not all inside
    iso = join_isolated(Host(root), [1], pid=4321)
    assert iso is not None and iso.cpus == [1]
    assert procs.read_text().strip().endswith("4321")
    mine = sorted(os.sched_getaffinity(0))
    try:
        # the real pinning is to CPUs this test already has: only the join is in the tree
        assert pin_self(mine, Host(root)) is None
        if 1 in mine:
            assert pin_self([1], Host(root)) == iso.path  # joined (the tree's file), pinned
            assert os.sched_getaffinity(0) == {1}
            assert procs.read_text().strip().endswith(str(os.getpid()))
    finally:
        os.sched_setaffinity(0, mine)


# ----------------------------------------------------------------------------------------------
# the user's own pinned work (issue #25): kept unless --include-pinned; --isolate adds
# ----------------------------------------------------------------------------------------------


def _plan_states(*args: str) -> dict[str, dict]:
    res = runner.invoke(get_app(), ["tune", "plan", *args, "--json"])
    assert res.exit_code == 2, res.output
    return {i["id"]: i for i in json.loads(res.stdout)["items"]}


def test_isolate_adds_to_the_profile_and_only_isolate_narrows(tmp_path):
    """`--isolate` used to narrow the plan to isolation; it adds isolation to the profile's
    plan (the bench profile does not ask for it), and `--only isolate` narrows."""
    root = iso_tree(tmp_path / "t")
    tree = ("--cpus", "1", "--root", str(root))
    items = _plan_states("--profile", "bench", "--isolate", *tree)
    assert items["isolate.tasks"]["state"] == "planned"
    assert items["memory.swappiness"]["state"] == "planned"
    items = _plan_states("--profile", "bench", *tree)
    assert items["isolate.tasks"]["state"] == "not-asked"
    items = _plan_states(*tree)  # hft-cpu asks for isolation itself
    assert items["isolate.tasks"]["state"] == "planned"
    assert items["memory.swappiness"]["state"] == "planned"
    items = _plan_states("--only", "isolate", *tree)
    assert items["isolate.tasks"]["state"] == "planned"
    assert items["memory.swappiness"]["state"] == "skipped"
    assert items["isolate.tasks"]["note"].startswith(f"{len(MOVED)} task(s) will move off CPU 1")


def test_include_pinned_moves_them_too_and_rollback_restores(tmp_path):
    root = iso_tree(tmp_path / "t")
    before = snapshot(root)
    ctx = _ctx(root, include_pinned=True)
    plan = make_plan(ctx, only=ONLY)
    t = next(it for it in plan.items if it.tunable.id == "isolate.tasks")
    assert {f"{x.comm}[{x.tid}]" for x, _ in t.tunable.survey.moves} == set(MOVABLE)
    assert "pinned by their own choice, moved anyway (--include-pinned): pinned[907] " \
           "(CPU 1 → 0)" in t.note and "kept" not in t.note
    rep = apply_plan(ctx, plan, _state(ctx))
    assert rep.ok and all(f.status == Status.OK for f in rep.findings)
    assert _affinity(root, 907) == "0"
    assert rollback(_ctx(root), _state(ctx)).remaining == 0
    assert diff(before, snapshot(root)) == []


def test_plan_names_tasks_pinned_by_their_own_choice(tmp_path):
    """On four CPUs with targets 2-3: a task pinned to 2-3 stays, one pinned to 1-2 is moved
    to CPU 1 and named, one allowed everywhere moves without a word; kernel threads are not
    the user's work and move whatever their mask."""
    from tests.isotree import KT, add_tasks
    from tests.treecopy import make_synthetic
    root = make_synthetic(tmp_path / "syn")
    add_tasks(root, ((970, "svc", 0x400100, "1-2", (970,), "S", "/"),
                     (971, "infer", 0x400100, "2-3", (971, 972), "S", "/"),
                     (973, "shell", 0x400100, "0-3", (973,), "S", "/"),
                     (974, "kbound", KT, "2-3", (974,), "S", "/")))
    items = _plan_states("--only", "isolate", "--cpus", "2-3", "--root", str(root))
    note = items["isolate.tasks"]["note"]
    assert note == ("3 task(s) will move off CPU 2-3; kept: pinned inside the target CPUs: "
                    "infer[971] (CPU 2-3), infer[972] (CPU 2-3) (--include-pinned moves them "
                    "too); pinned by their own choice to CPUs that include the targets, moved "
                    "to the rest of them: svc[970] (CPU 1-2 → 1)"), note
    moves = {c["target"]: c["desired"] for c in items["isolate.tasks"]["changes"]
             if c["kind"] == "write"}
    assert moves == {task_key(970, 1970): "1", task_key(973, 1973): "0-1",
                     task_key(974, 1974): "0-1"}
    res = runner.invoke(get_app(), ["tune", "plan", "--only", "isolate", "--cpus", "2-3",
                                    "--root", str(root)], env={"COLUMNS": "80"})
    assert "kept: pinned inside the target CPUs" in " ".join(res.stdout.split())


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("`tune apply` on the live procfs needs root")


def _live_tasks_cli(cmd: str, root: Path, state: Path, *extra: str):
    """`tune CMD` with the tasks of the live /proc (isolate.task_filter keeps only the test's
    own children) and every file from the tree copy; `--only isolate` so that nothing but
    task affinities can reach the live kernel (the tree has no cpuset or workqueue files)."""
    args = ["tune", cmd, "--root", str(root), "--procfs", "/proc", "--state-dir", str(state),
            "--json", *extra]
    if cmd == "apply":
        args += ["--only", "isolate", "--cpus", "1"]
    return runner.invoke(get_app(), args)


def test_real_child_pinned_to_the_target_cpu_stays_and_rollback_restores(tmp_path, children,
                                                                         monkeypatch):
    """Issue #25: plain `tune apply` (hft-cpu asks for runtime isolation) moved a worker
    started with `--cpus 1` onto the housekeeping CPU. A real round trip on this host's
    kernel, moving only children of this test: the one pinned to CPU 1 stays there, the
    others move to CPU 0, rollback puts them back."""
    _need_root()
    monkeypatch.setattr("tuning.tunables.base.default_writer", IsoSim)
    pinned, *others = children
    os.sched_setaffinity(pinned.pid, {1})
    # the cpuset method follows this host's mount table (read-only): the tree copy gets the
    # files of that method, so the cgroups and workqueue masks round-trip there too
    live = cpuset_layout(Host())
    flavour = "none" if isinstance(live, str) else {V1: "v1", V2: "v2"}[live.method]
    root = iso_tree(tmp_path / "t", cgroup=flavour)
    before = snapshot(root)
    state = tmp_path / "state"
    res = _live_tasks_cli("apply", root, state)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    item = next(i for i in out["items"] if i["id"] == "isolate.tasks")
    assert item["note"].startswith(f"{len(others)} task(s) will move off CPU 1; kept: pinned "
                                   f"inside the target CPUs: sleep[{pinned.pid}] (CPU 1)")
    moved = {o["target"] for o in out["outcomes"]
             if o["result"] == APPLIED and o["tunable"] == "isolate.tasks"}
    assert len(moved) == len(others) and not any(f":{pinned.pid}:" in t for t in moved)
    assert os.sched_getaffinity(pinned.pid) == {1}
    assert all(os.sched_getaffinity(p.pid) == {0} for p in others)
    f = next(f for f in out["findings"] if f["id"] == "isolate.tasks")
    assert f["status"] == "ok" and f["data"]["after"]["pinned_kept"] == [f"sleep[{pinned.pid}]"]
    if flavour != "none":
        assert isolated_cpuset(Host(root)) is not None  # made in the tree copy
    res = _live_tasks_cli("rollback", root, state)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["remaining"] == 0
    assert os.sched_getaffinity(pinned.pid) == {1}
    assert all(os.sched_getaffinity(p.pid) == {0, 1} for p in others)
    assert diff(before, snapshot(root)) == []


def test_a_task_gone_between_survey_and_save_is_gone_not_an_error(tmp_path, children,
                                                                  monkeypatch):
    """Issue #30: under process churn `tune apply --isolate` exited 1 ("unreadable: original
    cannot be saved") for a task that exited between the survey and the read of its original.
    Here one child is killed right after apply's own survey (the plan's survey saw it too)."""
    _need_root()
    monkeypatch.setattr("tuning.tunables.base.default_writer", IsoSim)
    real_survey = iso.survey_tasks
    calls = []

    def survey_then_exit(*a, **kw):
        s = real_survey(*a, **kw)
        calls.append(len(s.moves))
        if len(calls) == 2:  # apply's survey (the 1st is the plan's): the task exits now
            children[0].kill()
            children[0].wait()
        return s

    monkeypatch.setattr(iso, "survey_tasks", survey_then_exit)
    root = iso_tree(tmp_path / "t", cgroup="none", workqueue=False)
    state = tmp_path / "state"
    res = _live_tasks_cli("apply", root, state)
    assert res.exit_code == 0, (res.output, res.stderr)
    assert calls[:2] == [3, 3]
    out = json.loads(res.stdout)
    by = {o["target"].split(":")[1]: o for o in out["outcomes"] if o["kind"] == "write"}
    assert by[str(children[0].pid)]["result"] == "gone"
    assert "exited before its original could be read" in by[str(children[0].pid)]["message"]
    assert all(by[str(p.pid)]["result"] == APPLIED for p in children[1:])
    res = _live_tasks_cli("rollback", root, state)
    assert res.exit_code == 0 and json.loads(res.stdout)["remaining"] == 0
    assert all(os.sched_getaffinity(p.pid) == {0, 1} for p in children[1:])
