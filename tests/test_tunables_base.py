"""Every tunable round-trips plan → apply → verify → rollback byte for byte on writable copies of
fixture trees (real captures and a SYNTHETIC bare-metal tree), including EIO, EPERM, EINVAL,
EBUSY and read-only attributes. Nothing here touches the real /proc or /sys."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from collectors.host import Host
from tests.treecopy import KernelSim, copy_fixture, diff, make_synthetic, snapshot
from tuning.apply import (
    ALREADY,
    APPLIED,
    FAILED,
    IN_PLACE,
    PLANNED,
    UNCHANGEABLE,
    apply_plan,
    build_context,
    make_plan,
    rollback,
    status,
)
from tuning.findings import Status
from tuning.profiles import load_profile
from tuning.tunables import TuneError, all_tunables
from tuning.tunables.boot import boot_args, grub_commands
from tuning.tunables.gpu import NvmlControl


class FakeServices:
    def __init__(self, active: bool = True) -> None:
        self.active = active
        self.calls: list[str] = []

    def is_active(self, name: str) -> bool | None:
        return self.active

    def stop(self, name: str) -> None:
        self.calls.append(f"stop {name}")
        self.active = False

    def start(self, name: str) -> None:
        self.calls.append(f"start {name}")
        self.active = True


class FakeGpu:
    """GpuControl fake: two GPUs, persistence off, compute mode DEFAULT."""

    def __init__(self, n: int = 2, refuse: bool = False) -> None:
        self.pm = [False] * n
        self.cm = ["DEFAULT"] * n
        self.refuse = refuse

    def device_count(self) -> int:
        return len(self.pm)

    def persistence_mode(self, i: int) -> bool | None:
        return self.pm[i]

    def set_persistence_mode(self, i: int, on: bool) -> None:
        if self.refuse:
            raise OSError(errno.EPERM, "NVML: permission")
        self.pm[i] = on

    def compute_mode(self, i: int) -> str | None:
        return self.cm[i]

    def set_compute_mode(self, i: int, mode: str) -> None:
        self.cm[i] = mode


def _ctx(root: Path, profile: str = "hft-cpu", cpus: str | None = "2-3", writer=None, **kw):
    host = Host(root)
    ctx = build_context(host, load_profile(profile), cpus, **kw)
    ctx.writer = writer or KernelSim()
    return ctx


def _roundtrip(root: Path, profile: str, cpus: str | None, writer=None, **kw):
    before = snapshot(root)
    ctx = _ctx(root, profile, cpus, writer, **kw)
    plan = make_plan(ctx)
    assert diff(before, snapshot(root)) == [], "planning wrote something"
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, plan, sd, profile=profile)
    st = status(ctx, sd)
    rb = rollback(ctx, sd)
    assert rb.remaining == 0, [i.to_dict() for i in rb.items]
    assert diff(before, snapshot(root)) == []
    assert not (sd / "journal.json").exists()
    return plan, rep, st


@pytest.mark.parametrize("profile", ["hft-cpu", "hft-gpu", "bench"])
def test_synthetic_roundtrip_every_profile(tmp_path, profile):
    root = make_synthetic(tmp_path / "syn")
    plan, rep, st = _roundtrip(root, profile, "2-3")
    assert rep.ok and plan.writes
    assert all(o.result == APPLIED for o in rep.outcomes if o.change.kind == "write")
    bad = [f for f in rep.findings if f.status not in (Status.OK, Status.PENDING_REBOOT)]
    assert bad == []
    assert st.all_hold and len(st.items) == len(plan.writes)


@pytest.mark.parametrize("fixture", ["gpu-h200", "vm-dev"])
def test_real_fixture_roundtrip(tmp_path, fixture):
    root = copy_fixture(fixture, tmp_path / fixture)
    online = Host(root).read(Host(root).sys("devices/system/cpu/online")).value
    cpus = "8-15" if online == "0-15" else "1"
    plan, rep, _ = _roundtrip(root, "hft-cpu", cpus)
    ids = {c.tunable for c in plan.writes}
    # what these VMs expose: THP, sysctls, IRQ affinity (no cpufreq on either)
    assert {"memory.swappiness", "irq.affinity", "irq.default_affinity"} <= ids
    assert "cpu.governor" not in ids
    assert rep.ok


# isolate.* needs tasks and cgroups, which the synthetic tree has not: tests/test_tunables_isolate.py
@pytest.mark.parametrize("tid", [t.id for t in all_tunables()
                                 if not t.id.startswith(("gpu.", "irq.irqbalance", "isolate."))])
def test_each_tunable_roundtrips_alone(tmp_path, tid):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = _ctx(root, "bench")
    plan = make_plan(ctx, only=[tid])
    assert {c.tunable for c in plan.changes} == {tid}
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, plan, sd)
    if tid != "isolation.boot_args":
        assert [f.status for f in rep.findings] == [Status.OK]
        assert diff(before, snapshot(root)) != []
    else:  # never applied: nothing written, reported pending-reboot
        assert [f.status for f in rep.findings] == [Status.PENDING_REBOOT]
        assert diff(before, snapshot(root)) == []
    rollback(ctx, sd)
    assert diff(before, snapshot(root)) == []


def test_bench_min_freq_follows_turbo_off(tmp_path):
    """bench: turbo off lowers scaling_max_freq to the base frequency, so min_freq = "max"
    must be the max *after* that write (the turbo maximum would be clamped by the kernel and
    never hold)."""
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = _ctx(root, "bench")
    plan = make_plan(ctx)
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, plan, sd)
    mins = {o.change.target: o for o in rep.outcomes if o.change.tunable == "cpu.min_freq"}
    assert len(mins) == 4
    assert {(o.result, o.change.desired) for o in mins.values()} == {(APPLIED, "2000000")}
    cpu1 = root / "sys/devices/system/cpu/cpu1/cpufreq"
    assert (cpu1 / "scaling_min_freq").read_text() == (cpu1 / "scaling_max_freq").read_text() \
        == "2000000\n"
    f = {f.id: f for f in rep.findings}["cpu.min_freq"]
    assert f.status == Status.OK and f.expected == "cpu 0-3=2000000"
    assert status(ctx, sd).all_hold
    assert rollback(ctx, sd).remaining == 0
    assert diff(before, snapshot(root)) == []


def test_malformed_file_reads_as_unreadable_not_a_value(tmp_path):
    from tuning.tunables.irq import DefaultIrqAffinity, IrqAffinity
    from tuning.tunables.memory import ThpEnabled

    root = make_synthetic(tmp_path / "syn")
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text("always madvise never\n")
    (root / "proc/irq/24/smp_affinity_list").write_text("zz\n")
    (root / "proc/irq/default_smp_affinity").write_text("zz\n")
    ctx = _ctx(root)
    for t, target in ((ThpEnabled(), "/sys/kernel/mm/transparent_hugepage/enabled"),
                      (IrqAffinity(), "/proc/irq/24/smp_affinity_list"),
                      (DefaultIrqAffinity(), "/proc/irq/default_smp_affinity")):
        assert t.read_target(ctx, target) is None


def test_plan_is_pure():
    t = all_tunables()[0]
    want = {"/a": "performance", "/b": "performance"}
    have = {"/a": "performance", "/b": "powersave"}
    changes = t.plan(want, have)
    assert [(c.target, c.current, c.desired) for c in changes] == \
        [("/b", "powersave", "performance")]
    assert want == {"/a": "performance", "/b": "performance"}  # inputs untouched


def test_apply_twice_is_a_noop(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "bench")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx), sd)
    after_first = snapshot(root, exclude=())
    plan2 = make_plan(ctx)
    assert plan2.writes == []
    assert all(it.state != PLANNED or not it.changes or
               all(c.kind != "write" for c in it.changes) for it in plan2.items)
    rep2 = apply_plan(ctx, plan2, sd)
    assert not [o for o in rep2.outcomes if o.result == APPLIED]
    assert snapshot(root, exclude=()) == after_first  # journal included: not even rewritten


def test_second_profile_keeps_first_original(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx), sd)
    # an operator edits the profile: swappiness 5 instead of 1
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "hft-cpu"\n[settings.swappiness]\nexpected = 5\n')
    ctx2 = _ctx(root, str(prof))
    apply_plan(ctx2, make_plan(ctx2), sd)
    st = status(ctx2, sd)
    sw = [i for i in st.items if i.target == "/proc/sys/vm/swappiness"][0]
    assert (sw.original, sw.written, sw.result) == ("60", "5", "holds")
    rollback(ctx2, sd)
    assert diff(before, snapshot(root)) == []


@pytest.mark.parametrize("err", [errno.EIO, errno.EPERM])
def test_irq_eio_eperm_is_unchangeable_not_failure(tmp_path, err):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    sim = KernelSim(fail={"irq/27/smp_affinity_list": err})
    ctx = _ctx(root, "hft-cpu", writer=sim)
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx, only=["irq"]), sd)
    res = {o.change.target: o.result for o in rep.outcomes}
    assert res["/proc/irq/27/smp_affinity_list"] == UNCHANGEABLE
    assert res["/proc/irq/24/smp_affinity_list"] == APPLIED
    assert rep.ok
    irq = [f for f in rep.findings if f.id == "irq.affinity"][0]
    assert irq.status == Status.OK and irq.data["unchangeable"] == ["/proc/irq/27/smp_affinity_list"]
    st = status(ctx, sd)
    assert "/proc/irq/27/smp_affinity_list" not in {i.target for i in st.items}
    rollback(ctx, sd)
    assert diff(before, snapshot(root)) == []


def test_einval_is_a_failure_and_not_journalled(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = _ctx(root, "hft-cpu", writer=KernelSim(fail={"vm/swappiness": errno.EINVAL}))
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx), sd)
    res = {o.change.target: o for o in rep.outcomes}
    assert res["/proc/sys/vm/swappiness"].result == FAILED
    assert "Invalid argument" in res["/proc/sys/vm/swappiness"].message
    assert not rep.ok
    assert "/proc/sys/vm/swappiness" not in {i.target for i in status(ctx, sd).items}
    rollback(ctx, sd)
    assert diff(before, snapshot(root)) == []


def test_write_that_changes_the_value_then_fails_stays_journalled(tmp_path):
    """sysfs can take the bytes and still report EIO (short write): the original must not be
    lost. Rollback's write fails the same way and still counts as restored."""
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    sim = KernelSim(fail_after={"vm/swappiness": errno.EIO})
    ctx = _ctx(root, "hft-cpu", writer=sim)
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx, only=["memory"]), sd)
    o = {o.change.target: o for o in rep.outcomes}["/proc/sys/vm/swappiness"]
    assert o.result == FAILED and "changed anyway" in o.message and o.readback == "1"
    st = {i.target: i for i in status(ctx, sd).items}["/proc/sys/vm/swappiness"]
    assert (st.original, st.written, st.result) == ("60", "1", "holds")
    rb = rollback(ctx, sd)
    assert rb.remaining == 0, [i.to_dict() for i in rb.items]
    assert diff(before, snapshot(root)) == []


def test_service_stop_that_fails_but_stopped_is_restarted(tmp_path):
    """`systemctl stop` can exit non-zero although the unit stopped."""
    root = make_synthetic(tmp_path / "syn")

    class FlakyServices(FakeServices):
        def stop(self, name: str) -> None:
            super().stop(name)
            raise OSError(errno.EIO, f"systemctl stop {name}: Job failed")

    svc = FlakyServices(active=True)
    ctx = _ctx(root, "hft-cpu", services=svc)
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx, only=["irq.irqbalance"]), sd)
    assert [o.result for o in rep.outcomes] == [FAILED]
    rollback(ctx, sd)
    assert svc.calls == ["stop irqbalance", "start irqbalance"] and svc.active


def test_read_only_attribute_fails_cleanly(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ksm = root / "sys/kernel/mm/ksm/run"
    os.chmod(ksm, 0o444)  # kernfs: no store() → EACCES even for root (KernelSim enforces it)
    before = snapshot(root)
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx), sd)
    o = [o for o in rep.outcomes if o.change.target == "/sys/kernel/mm/ksm/run"][0]
    assert o.result == FAILED and "Permission denied" in o.message
    ksm_f = [f for f in rep.findings if f.id == "memory.ksm"][0]
    assert ksm_f.status != Status.OK
    rollback(ctx, sd)
    assert diff(before, snapshot(root)) == []


def test_rollback_retries_ebusy_after_the_rest(tmp_path):
    """intel_pstate refuses a non-performance EPP while the governor is performance (EBUSY):
    rollback restores EPP before the governor (reverse order), so it must retry at the end."""
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)

    class PstateSim(KernelSim):
        def write(self, path, text):
            if path.name == "energy_performance_preference" and text != "performance":
                gov = (path.parent / "scaling_governor").read_text().strip()
                if gov == "performance":
                    raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
            super().write(path, text)

    ctx = _ctx(root, "hft-cpu", writer=PstateSim())
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx, only=["cpu.governor", "cpu.epp"]), sd)
    rb = rollback(ctx, sd)
    assert rb.remaining == 0
    assert diff(before, snapshot(root)) == []


def test_drift_is_reported_and_left_unless_force(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx, only=["memory.swappiness", "kernel"]), sd)
    (root / "proc/sys/vm/swappiness").write_text("30\n")  # someone else changed it
    st = status(ctx, sd)
    assert {i.target: i.result for i in st.items}["/proc/sys/vm/swappiness"] == "drift"
    rb = rollback(ctx, sd)
    assert rb.remaining == 1 and [i.result for i in rb.items if i.result == "drift"]
    assert (root / "proc/sys/vm/swappiness").read_text() == "30\n"
    assert (root / "proc/sys/kernel/timer_migration").read_text() == "1\n"  # others restored
    rb = rollback(ctx, sd, force=True)
    assert rb.remaining == 0
    assert (root / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_rollback_is_idempotent(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx), sd)
    assert rollback(ctx, sd).remaining == 0
    again = rollback(ctx, sd)
    assert again.items == [] and again.remaining == 0 and "nothing" in again.note


# -- bad input: clear error, nothing written --------------------------------------------------


def test_governor_not_offered_is_refused(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root, exclude=())
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "hft-cpu"\n[settings.governor]\nexpected = "schedutil"\n')
    with pytest.raises(TuneError, match="schedutil.*not offered.*performance powersave"):
        make_plan(_ctx(root, str(prof)))
    assert snapshot(root, exclude=()) == before


def test_thp_value_not_offered_is_refused(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    (root / "sys/kernel/mm/transparent_hugepage/defrag").write_text("[always] never\n")
    with pytest.raises(TuneError, match="thp_defrag 'madvise' is not offered"):
        make_plan(_ctx(root, "hft-cpu"))


@pytest.mark.parametrize("key,value", [
    ("swappiness", 201), ("swappiness", -1), ("numa_balancing", 4), ("stat_interval", 0),
    ("timer_migration", 2), ("nmi_watchdog", 2), ("sched_rt_runtime_us", -2),
    ("sched_rt_runtime_us", 1_000_001), ("ksm", 2)])
def test_sysctl_value_out_of_range_is_refused(tmp_path, key, value):
    root = make_synthetic(tmp_path / "syn")
    (root / "proc/sys/kernel/sched_rt_period_us").write_text("1000000\n")
    before = snapshot(root, exclude=())
    prof = tmp_path / "p.toml"
    prof.write_text(f'extends = "hft-cpu"\n[settings.{key}]\nexpected = {value}\n')
    ctx = _ctx(root, str(prof))
    with pytest.raises(TuneError, match=f"{key}.*(outside the range|not an integer|not 0)"):
        apply_plan(ctx, make_plan(ctx), ctx.host.run_dir("hftagent"))
    assert snapshot(root, exclude=()) == before


@pytest.mark.parametrize("key,value", [("swappiness", 200), ("numa_balancing", 3),
                                       ("sched_rt_runtime_us", 1_000_000),
                                       ("sched_rt_runtime_us", -1), ("stat_interval", 1)])
def test_sysctl_value_at_the_edge_is_planned(tmp_path, key, value):
    root = make_synthetic(tmp_path / "syn")
    (root / "proc/sys/kernel/sched_rt_period_us").write_text("1000000\n")
    prof = tmp_path / "p.toml"
    prof.write_text(f'extends = "hft-cpu"\n[settings.{key}]\nexpected = {value}\n')
    plan = make_plan(_ctx(root, str(prof)))
    desired = {t: v for it in plan.items for t, v in it.desired.items()}
    assert str(value) in desired.values()


@pytest.mark.parametrize("cpus,msg", [("7", "past the last CPU"), ("0-3", "every online CPU"),
                                      ("x", "bad --cpus")])
def test_bad_cpu_lists(tmp_path, cpus, msg):
    root = make_synthetic(tmp_path / "syn")
    with pytest.raises(TuneError, match=msg):
        make_plan(_ctx(root, "hft-cpu", cpus))


def test_cpuidle_by_latency_and_name_not_index(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    # a driver with a different state order: the deep state sits at index 1 here
    d = root / "sys/devices/system/cpu/cpu0/cpuidle"
    (d / "state1/name").write_text("C10\n")
    (d / "state1/latency").write_text("890\n")
    ctx = _ctx(root, "hft-cpu")
    plan = make_plan(ctx, only=["cpu.cstates"])
    cpu0 = sorted(c.detail for c in plan.changes if c.index == 0)
    assert cpu0 == ["C10 (exit latency 890 µs)", "C6 (exit latency 133 µs)"]
    assert all("POLL" not in c.detail for c in plan.changes)


def test_default_targets_leave_the_housekeeping_core(tmp_path):
    # tuning/targets.py: no isolated or nohz_full CPUs -> every online CPU but CPU 0's core
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu", None)
    assert ctx.cpus == [1, 2, 3]
    plan = make_plan(ctx)
    irq = next(it for it in plan.items if it.tunable.id == "irq.affinity")
    assert irq.state == "planned" and {c.desired for c in irq.changes} == {"0"}



def test_default_cpus_are_the_isolated_ones(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    (root / "sys/devices/system/cpu/isolated").write_text("3\n")
    (root / "proc/cmdline").write_text("ro isolcpus=managed_irq,domain,3 nohz_full=3 "
                                       "rcu_nocbs=3 irqaffinity=0-2 skew_tick=1\n")
    ctx = _ctx(root, "hft-cpu", None)
    assert ctx.cpus == [3]
    plan = make_plan(ctx)
    st = {it.tunable.id: it.state for it in plan.items}
    assert st["isolation.boot_args"] == IN_PLACE


# -- boot arguments, irqbalance, GPU ------------------------------------------------------------


def test_boot_args_are_printed_never_written(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    args = boot_args([2, 3], [0, 1, 2, 3])
    assert args == {"isolcpus": "managed_irq,domain,2-3", "nohz_full": "2-3",
                    "rcu_nocbs": "2-3", "irqaffinity": "0-1", "skew_tick": "1"}
    cmds = grub_commands(args)
    assert cmds[0] == ("grubby --update-kernel=ALL --remove-args='isolcpus nohz_full rcu_nocbs "
                       "irqaffinity skew_tick' --args='isolcpus=managed_irq,domain,2-3 "
                       "nohz_full=2-3 rcu_nocbs=2-3 irqaffinity=0-1 skew_tick=1'")
    assert "update-grub" in cmds[1]
    ctx = _ctx(root, "hft-cpu")
    rep = apply_plan(ctx, make_plan(ctx, only=["isolation"]), ctx.host.run_dir("hftagent"))
    assert {o.result for o in rep.outcomes} == {"pending-reboot"}
    assert rep.findings[0].status == Status.PENDING_REBOOT
    assert diff(before, snapshot(root)) == []


def test_irqbalance_stopped_and_restarted(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    svc = FakeServices(active=True)
    ctx = _ctx(root, "hft-cpu", services=svc)
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx, only=["irq"]), sd)
    order = [o.change.tunable for o in rep.outcomes]
    assert order[0] == "irq.irqbalance"  # stopped before any IRQ is moved
    assert svc.calls == ["stop irqbalance"]
    rollback(ctx, sd)
    assert svc.calls == ["stop irqbalance", "start irqbalance"] and svc.active


def test_irqbalance_banned_is_manual(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "hft-cpu"\n[settings.irqbalance]\nexpected = "banned"\n')
    svc = FakeServices(active=True)
    ctx = _ctx(root, str(prof), services=svc)
    plan = make_plan(ctx, only=["irq.irqbalance"])
    assert [c.kind for c in plan.changes] == ["manual"]
    assert "IRQBALANCE_BANNED_CPULIST=2-3" in plan.changes[0].detail
    apply_plan(ctx, plan, ctx.host.run_dir("hftagent"))
    assert svc.calls == []


def test_gpu_tunables_through_fake(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    gpu = FakeGpu()
    ctx = _ctx(root, "hft-gpu", gpu=gpu)
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx, only=["gpu"]), sd)
    assert gpu.pm == [True, True] and gpu.cm == ["EXCLUSIVE_PROCESS"] * 2
    assert [f.status for f in rep.findings] == [Status.OK, Status.OK]
    rollback(ctx, sd)
    assert gpu.pm == [False, False] and gpu.cm == ["DEFAULT"] * 2


def test_gpu_refused_is_a_failure_not_a_crash(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-gpu", gpu=FakeGpu(refuse=True))
    rep = apply_plan(ctx, make_plan(ctx, only=["gpu.persistence"]), ctx.host.run_dir("hftagent"))
    assert {o.result for o in rep.outcomes} == {FAILED}
    # the adapter's own reason is kept, not only the errno's name
    assert {o.message for o in rep.outcomes} == {"Operation not permitted: NVML: permission"}


def test_rollback_failure_keeps_the_services_message(tmp_path):
    root = make_synthetic(tmp_path / "syn")

    class MaskedServices(FakeServices):
        def start(self, name: str) -> None:
            raise OSError(errno.EIO, f"systemctl start {name}: Unit {name}.service is masked.")

    svc = MaskedServices(active=True)
    ctx = _ctx(root, "hft-cpu", services=svc)
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx, only=["irq.irqbalance"]), sd)
    rb = rollback(ctx, sd)
    assert [(i.result, i.message) for i in rb.items] == [
        (FAILED, "Input/output error: systemctl start irqbalance: Unit irqbalance.service is "
                 "masked.")]


def test_gpu_absent_on_a_tree_copy(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    plan = make_plan(_ctx(root, "hft-gpu", want_gpu=True))
    it = [i for i in plan.items if i.tunable.id == "gpu.persistence"][0]
    assert it.state == "unavailable" and "live host" in it.reason


def test_nvml_control_maps_readings():
    from collectors.host import Reading

    class FakeNvml:
        def __init__(self):
            self.pm = {0: False}

        def device_count(self):
            return Reading(1, "nvml:nvmlDeviceGetCount")

        def persistence_mode(self, i):
            return Reading(self.pm[i], "nvml:x")

        def set_persistence_mode(self, i, on):
            return Reading(None, "nvml:set", "permission: NoPermission")

        def compute_mode(self, i):
            return Reading(None, "nvml:x", "unsupported: NotSupported")

        def set_compute_mode(self, i, mode):
            self.mode = mode
            return Reading(True, "nvml:set")

    c = NvmlControl(FakeNvml())
    assert c.device_count() == 1 and c.persistence_mode(0) is False
    assert c.compute_mode(0) is None
    with pytest.raises(OSError) as ei:
        c.set_persistence_mode(0, True)
    assert ei.value.errno == errno.EPERM
    c.set_compute_mode(0, "EXCLUSIVE_PROCESS")


def test_already_in_place_is_not_journalled(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    (root / "proc/sys/vm/swappiness").write_text("1\n")
    ctx = _ctx(root, "hft-cpu")
    plan = make_plan(ctx, only=["memory.swappiness"])
    assert plan.changes == []
    rep = apply_plan(ctx, plan, ctx.host.run_dir("hftagent"))
    assert rep.outcomes == [] and not (ctx.host.run_dir("hftagent") / "journal.json").exists()
    assert ALREADY  # (value re-read at write time; covered by test_apply_twice_is_a_noop)


# -- containment: the production writer never follows a symlink out of the tree --------------


def test_file_writer_refuses_a_symlink_swapped_in_after_the_check(tmp_path):
    """contained() resolved the path; a directory component is then replaced with a symlink
    out of the tree (a race): the O_NOFOLLOW walk of every component refuses the write."""
    import shutil

    from tuning.tunables.base import FileWriter, contained

    root = make_synthetic(tmp_path / "syn")
    host = Host(root)
    target = "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor"
    real = contained(host, target)
    assert real == (root / "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor").resolve()
    out = tmp_path / "outside"
    shutil.copytree(root / "sys/devices/system/cpu/cpu1/cpufreq", out)
    d = root / "sys/devices/system/cpu/cpu1/cpufreq"
    shutil.rmtree(d)
    d.symlink_to(out)
    with pytest.raises(OSError) as ei:
        FileWriter().write(real, "performance")
    assert ei.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert (out / "scaling_governor").read_text() == "powersave\n"


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_file_writer_refuses_a_final_symlink_or_fifo(tmp_path, kind):
    from tuning.tunables.base import FileWriter

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    p = tmp_path / "target"
    if kind == "symlink":
        p.symlink_to(victim)
    else:
        os.mkfifo(p)  # opening it for write used to block until a reader came
    with pytest.raises(OSError):
        FileWriter().write(p, "1")
    assert victim.read_text() == "precious\n"


def test_policy_symlink_tree_roundtrips_with_the_production_writer(tmp_path):
    """The kernel's layout — cpuN/cpufreq -> ../cpufreq/policyN — through FileWriter itself
    (numeric cpu knobs only: a plain file does not rewrite a selector as sysfs does)."""
    from tests.test_commands_tune import _policy_tree
    from tuning.tunables.base import FileWriter

    root = _policy_tree(make_synthetic(tmp_path / "syn"))
    before = snapshot(root)
    ctx = _ctx(root, "hft-cpu", writer=FileWriter())
    sd = ctx.host.run_dir("hftagent")
    rep = apply_plan(ctx, make_plan(ctx, only=["cpu.governor", "cpu.min_freq", "cpu.cstates"]),
                     sd)
    assert rep.ok and {o.result for o in rep.outcomes} == {APPLIED}
    assert (root / "sys/devices/system/cpu/cpufreq/policy2/scaling_governor").read_text() == \
        "performance\n"
    assert status(ctx, sd).all_hold
    assert rollback(ctx, sd).remaining == 0
    assert diff(before, snapshot(root)) == []


def test_sysfs_symlink_outside_devices_is_refused_even_inside_the_tree(tmp_path):
    """Only the kind of link sysfs makes (into <sysfs>/devices) is followed, even when it
    stays inside the tree: cpuN/cpufreq -> ../../../../kernel/mm is not one."""
    from tuning.safepath import UnsafePath
    from tuning.tunables.base import contained

    root = make_synthetic(tmp_path / "syn")
    (root / "sys/kernel/mm/scaling_governor").write_text("x\n")
    d = root / "sys/devices/system/cpu/cpu1/cpufreq"
    os.rename(d, tmp_path / "moved")
    d.symlink_to("../../../../kernel/mm")
    with pytest.raises(UnsafePath, match="only symlinks to directories under"):
        contained(Host(root), "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor")
    with pytest.raises(TuneError, match="refusing /sys/devices/system/cpu/cpu1/cpufreq"):
        make_plan(_ctx(root, "hft-cpu"))


# -- odd trees: planning reads files no kernel writes; one clear error, never a crash ---------


@pytest.mark.adversarial
@pytest.mark.parametrize("content", ["", "x\x00\xff\n", "-1\n", "99999999999999999999999\n",
                                     "[\n", "0-\n"])
def test_plan_with_any_one_file_mangled_is_clean(tmp_path, content):
    """Each file of the synthetic tree in turn holds ``content``: planning either works or
    raises the domain error that the CLI prints as one line."""
    from collectors.host import HostError

    proto = make_synthetic(tmp_path / "proto")
    files = sorted(p.relative_to(proto) for p in proto.rglob("*") if p.is_file())
    for rel in files:
        p = proto / rel
        saved = p.read_bytes()
        p.write_bytes(content.encode("utf-8", "surrogateescape"))
        try:
            ctx = _ctx(proto, "hft-cpu")
            make_plan(ctx)
        except (TuneError, HostError):
            pass
        finally:
            p.write_bytes(saved)
