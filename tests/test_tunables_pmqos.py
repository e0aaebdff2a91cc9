"""The per-CPU PM QoS wake-up limit (tuning/tunables/pmqos.py) on tree copies: the kernel's
spelling of the limit, plan, apply and rollback byte for byte, unsupported without the files,
EINVAL as a failure, and bad values refused. Nothing here writes the real /proc or /sys.
The audit's wakeup family that suggests it is in tests/test_checks_wakeup.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors import wakeup as wk
from collectors.host import Host
from tests.isotree import IsoSim
from tests.treecopy import KernelSim, diff, make_synthetic, snapshot
from tuning.apply import apply_plan, build_context, make_plan, rollback
from tuning.findings import Status
from tuning.profiles import load_profile
from tuning.tunables import TuneError
from tuning.tunables.pmqos import kernel_value

TID = "wakeup.pm_qos_resume_latency"


def _profile(tmp_path: Path, **settings) -> str:
    f = tmp_path / "p.toml"
    body = 'extends = "hft-cpu"\nname = "mine"\n' + "".join(
        f"[settings.{k}]\nexpected = {json.dumps(v)}\n" for k, v in settings.items())
    f.write_text(body)
    return str(f)



def test_kernel_spelling_of_the_limit():
    assert kernel_value(0) == "n/a" and kernel_value(10) == "10"
    assert wk.resume_latency_us("n/a") == 0 and wk.resume_latency_us("0") == float("inf")
    assert wk.resume_latency_us("25") == 25


@pytest.mark.parametrize("want,written", [(10, "10"), (0, "n/a")])
def test_pm_qos_roundtrip_on_the_synthetic_tree(tmp_path, want, written):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = build_context(Host(root), load_profile(_profile(tmp_path,
                                                          pm_qos_resume_latency_us=want)),
                        "2-3")
    ctx.writer = IsoSim()
    plan = make_plan(ctx, only=[TID])
    assert {c.target: c.desired for c in plan.changes} == {
        f"/sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us": written
        for c in (2, 3)}
    rep = apply_plan(ctx, plan, ctx.host.run_dir("hftagent"))
    assert rep.ok and [f.status for f in rep.findings] == [Status.OK]
    p = root / "sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us"
    assert p.read_text() == f"{written}\n"
    assert (root / "sys/devices/system/cpu/cpu0/power/pm_qos_resume_latency_us"
            ).read_text() == "0\n"  # only the target CPUs
    assert rollback(ctx, ctx.host.run_dir("hftagent")).remaining == 0
    assert diff(before, snapshot(root)) == []


def test_pm_qos_unsupported_without_the_files(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    for c in range(4):
        (root / f"sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us").unlink()
    plan = make_plan(build_context(Host(root), load_profile("hft-cpu"), "2-3"), only=[TID])
    assert plan.items[[i.tunable.id for i in plan.items].index(TID)].reason.startswith(
        "unsupported: no power/pm_qos_resume_latency_us for CPU 2,3")


def test_pm_qos_einval_is_a_failure_and_rollback_is_clean(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = build_context(Host(root), load_profile("hft-cpu"), "2-3")
    ctx.writer = KernelSim(fail={"cpu3/power/pm_qos_resume_latency_us": 22})
    rep = apply_plan(ctx, make_plan(ctx, only=[TID]), ctx.host.run_dir("hftagent"))
    by = {o.change.index: o.result for o in rep.outcomes}
    assert by == {2: "applied", 3: "failed"}
    assert rollback(ctx, ctx.host.run_dir("hftagent")).remaining == 0
    assert diff(before, snapshot(root)) == []


def test_a_negative_limit_in_a_profile_is_refused(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = build_context(Host(root), load_profile(_profile(tmp_path,
                                                          pm_qos_resume_latency_us=-1)), "2-3")
    with pytest.raises(TuneError, match="pm_qos_resume_latency_us must be"):
        make_plan(ctx, only=[TID])


def test_rollback_validates_journalled_latency_values(tmp_path):
    from tuning.tunables.pmqos import PmQosResumeLatency
    t = PmQosResumeLatency()
    assert t.valid("n/a") and t.valid("0") and t.valid("10")
    assert not t.valid("-1") and not t.valid("ten") and not t.valid("")
