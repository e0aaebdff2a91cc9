"""`hftagent tune plan|apply|rollback|status` through the CLI, always with --root on a writable
copy (tree copies of real captures, the lead's synthetic bare-metal trees, or our own)."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

import tuning.tunables.base as tunables_base
from agent.cli import get_app
from tests.treecopy import KernelSim, copy_fixture, diff, make_synthetic, snapshot

runner = CliRunner()


@pytest.fixture(autouse=True)
def kernel_sim(monkeypatch):
    """Every write of these tests goes through the kernel simulation (on the tree copy)."""
    monkeypatch.setattr(tunables_base, "default_writer", KernelSim)


def tune(*args: str):
    return runner.invoke(get_app(), ["tune", *args])


@pytest.fixture
def syn(tmp_path):
    return make_synthetic(tmp_path / "syn")


def test_plan_writes_nothing_and_exits_2(syn):
    before = snapshot(syn, exclude=())
    res = tune("plan", "--root", str(syn), "--cpus", "2-3", "--json")
    assert res.exit_code == 2, res.output
    data = json.loads(res.stdout)
    items = {i["id"]: i for i in data["items"]}
    gov = items["cpu.governor"]
    assert gov["state"] == "planned" and len(gov["changes"]) == 4
    assert items["irq.irqbalance"]["state"] == "unavailable"
    assert snapshot(syn, exclude=()) == before


def test_plan_human_groups_cpus(syn):
    res = tune("plan", "--root", str(syn), "--cpus", "2-3")
    assert res.exit_code == 2
    assert "cpu 0-3" in res.stdout and "irq 24-26" in res.stdout
    assert "irq 27" in res.stdout  # nvme0q1: a managed queue, the kernel will likely refuse
    assert "grubby --update-kernel=ALL" in res.stdout


def test_apply_status_rollback_roundtrip(syn):
    before = snapshot(syn)
    res = tune("apply", "--root", str(syn), "--cpus", "2-3", "--json")
    # 2: boot args are pending-reboot (never applied)
    assert res.exit_code == 2, res.output
    data = json.loads(res.stdout)
    assert {o["result"] for o in data["outcomes"]} == {"applied", "pending-reboot"}
    assert {f["status"] for f in data["findings"]} == {"ok", "pending-reboot"}
    assert data["journal"].endswith("run/hftagent/journal.json")
    st = tune("status", "--root", str(syn), "--json")
    assert st.exit_code == 0 and json.loads(st.stdout)["all_hold"]
    again = tune("apply", "--root", str(syn), "--cpus", "2-3", "--json")
    assert not [o for o in json.loads(again.stdout)["outcomes"] if o["result"] == "applied"]
    rb = tune("rollback", "--root", str(syn))
    assert rb.exit_code == 0, rb.output
    assert diff(before, snapshot(syn)) == []
    rb2 = tune("rollback", "--root", str(syn), "--json")
    assert rb2.exit_code == 0 and json.loads(rb2.stdout)["items"] == []
    st = tune("status", "--root", str(syn))
    assert st.exit_code == 0 and "nothing applied" in st.stdout


def test_dry_run_writes_nothing(syn):
    before = snapshot(syn, exclude=())
    res = tune("apply", "--dry-run", "--root", str(syn), "--cpus", "2-3")
    assert res.exit_code == 2
    assert snapshot(syn, exclude=()) == before


def test_state_dir_overrides(syn, tmp_path):
    sd = tmp_path / "state"
    res = tune("apply", "--root", str(syn), "--only", "memory", "--state-dir", str(sd))
    assert res.exit_code == 0, res.output
    assert (sd / "journal.json").exists() and not (syn / "run").exists()
    assert tune("rollback", "--root", str(syn), "--state-dir", str(sd)).exit_code == 0


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_state_dir_that_is_not_a_directory(syn, tmp_path, where):
    f = tmp_path / "afile"
    f.write_text("x\n")
    sd = f if where == "file" else f / "sub"
    before = snapshot(syn, exclude=())
    for args in (["apply", "--only", "memory"], ["rollback"])[:2 if where == "file" else 1]:
        _one_line_error(tune(*args, "--root", str(syn), "--state-dir", str(sd)),
                        "state directory")
    assert snapshot(syn, exclude=()) == before and f.read_text() == "x\n"


def test_state_dir_journal_is_tied_to_its_tree(syn, tmp_path):
    """`apply --root C --state-dir S` then `status --state-dir S` without --root must not
    check C's entries against the live kernel (nor may rollback write them there: that is
    shown on a second copy standing in for it)."""
    sd = tmp_path / "state"
    assert tune("apply", "--root", str(syn), "--only", "memory", "--state-dir",
                str(sd)).exit_code == 0
    _one_line_error(tune("status", "--state-dir", str(sd)), "was written against procfs")
    other = make_synthetic(tmp_path / "other")
    before = snapshot(other, exclude=())
    _one_line_error(tune("rollback", "--root", str(other), "--state-dir", str(sd), "--force"),
                    "was written against procfs")
    assert snapshot(other, exclude=()) == before
    assert tune("rollback", "--root", str(syn), "--state-dir", str(sd)).exit_code == 0


def test_drift_exit_codes(syn):
    tune("apply", "--root", str(syn), "--only", "memory.swappiness")
    (syn / "proc/sys/vm/swappiness").write_text("33\n")
    assert tune("status", "--root", str(syn)).exit_code == 2
    rb = tune("rollback", "--root", str(syn))
    assert rb.exit_code == 2 and "drift" in rb.stdout
    assert tune("rollback", "--root", str(syn), "--force").exit_code == 0
    assert (syn / "proc/sys/vm/swappiness").read_text() == "60\n"


@pytest.mark.parametrize("tree", ["gpu-h200", "vm-dev", "synthetic-2socket", "synthetic-tuned"])
def test_cli_roundtrip_on_fixture_copies(tmp_path, tree):
    root = copy_fixture(tree, tmp_path / tree)
    before = snapshot(root)
    res = tune("apply", "--root", str(root), "--profile", "bench", "--cpus", "1", "--json")
    assert res.exit_code in (0, 2), res.output
    outcomes = json.loads(res.stdout)["outcomes"]
    assert not [o for o in outcomes if o["result"] == "failed"], outcomes
    assert tune("status", "--root", str(root)).exit_code == 0
    assert tune("rollback", "--root", str(root)).exit_code == 0
    assert diff(before, snapshot(root)) == []


# -- bad input: one line on stderr, exit 1, nothing written -----------------------------------


def _one_line_error(res, needle: str):
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert lines[0].startswith("hftagent: error: ")


@pytest.mark.parametrize("args,needle", [
    (["--profile", "nope"], "unknown profile"),
    (["--cpus", "9"], "past the last CPU"),
    (["--cpus", "0-3"], "every online CPU"),
])
def test_bad_input(syn, args, needle):
    before = snapshot(syn, exclude=())
    for cmd in ("plan", "apply"):
        _one_line_error(tune(cmd, "--root", str(syn), *args), needle)
    assert snapshot(syn, exclude=()) == before


@pytest.mark.parametrize("opt,value", [("--skip", "gpus"), ("--only", "memory.swapiness"),
                                       ("--only", "irq.affinty")])
def test_only_skip_typo_is_refused(syn, opt, value):
    before = snapshot(syn, exclude=())
    for cmd in ("plan", "apply"):
        _one_line_error(tune(cmd, "--root", str(syn), "--cpus", "2-3", opt, value),
                        f"{opt} {value!r} matches no tunable")
    assert snapshot(syn, exclude=()) == before


def test_only_skip_accept_ids_and_families(syn):
    res = tune("plan", "--root", str(syn), "--cpus", "2-3", "--only", "kernel", "--only",
               "memory.swappiness", "--skip", "kernel.nmi_watchdog", "--json")
    assert res.exit_code == 2, res.output
    planned = {i["id"] for i in json.loads(res.stdout)["items"] if i["state"] == "planned"}
    assert planned == {"memory.swappiness", "kernel.timer_migration", "kernel.stat_interval",
                       "kernel.sched_rt_runtime_us", "kernel.perf_event_paranoid"}


def test_malformed_profile_file(syn, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[settings.governor\nexpected=")
    _one_line_error(tune("apply", "--root", str(syn), "--profile", str(bad)), "not valid TOML")
    bad.write_text('[settings.governor]\nexpected = "schedutil"\n')
    before = snapshot(syn, exclude=())
    _one_line_error(tune("apply", "--root", str(syn), "--profile", str(bad)), "not offered")
    assert snapshot(syn, exclude=()) == before


def test_corrupt_journal_cli(syn):
    tune("apply", "--root", str(syn), "--only", "memory")
    j = syn / "run/hftagent/journal.json"
    j.write_text(j.read_text()[:40])
    before = snapshot(syn, exclude=())
    for cmd in ("rollback", "status", "apply"):
        _one_line_error(tune(cmd, "--root", str(syn)), "corrupt")
    assert snapshot(syn, exclude=()) == before


def test_stale_journal_cli(syn):
    tune("apply", "--root", str(syn), "--only", "memory")
    (syn / "proc/sys/kernel/random/boot_id").write_text("another-boot\n")
    _one_line_error(tune("rollback", "--root", str(syn)), "earlier boot")
    st = tune("status", "--root", str(syn))
    assert st.exit_code == 2 and "earlier boot" in st.stdout
    assert tune("rollback", "--root", str(syn), "--discard-stale").exit_code == 0
    assert not (syn / "run/hftagent/journal.json").exists()


def test_refuses_without_root_on_the_live_kernel(syn, monkeypatch):
    """Privilege is checked before anything else. Simulated on a tree copy (Host.touches_live
    forced True, euid forced 1000) so that even a bug here could only write the copy."""
    import tuning.apply as ap
    from collectors.host import Host

    monkeypatch.setattr(Host, "touches_live", property(lambda self: True))
    # and no real service manager behind it, whatever happens
    monkeypatch.setattr("tuning.tunables.irq.SystemctlServices", lambda *a, **k: None)
    monkeypatch.setattr(ap.os, "geteuid", lambda: 1000)
    before = snapshot(syn, exclude=())
    for cmd in ("apply", "rollback"):
        _one_line_error(tune(cmd, "--root", str(syn)), "needs root")
    assert snapshot(syn, exclude=()) == before
    # plan and status only read: no privilege needed
    assert tune("plan", "--root", str(syn), "--cpus", "2").exit_code == 2


def test_tree_copy_needs_no_root():
    from collectors.host import Host
    from tuning.apply import require_privilege

    require_privilege(Host(str(make_synthetic.__globals__["FIXTURES"] / "vm-dev")), euid=1000)


# -- tune threads (from a saved `probe --sweep threads --json` result; no TF needed) ----------


def _sweep_doc(tmp_path):
    from agent.probe.result import ProbeResult, RunResult
    from agent.probe.runner import finish

    def run(intra, inter, cpus, p99):
        lat = {"p99_ns": p99, "count": 7000, "sufficient": {"p99": True, "p999": True},
               "required": {"p99": 662, "p999": 6636}}
        cid = f"intra={intra} inter={'caller' if inter == -1 else inter} cpus={cpus[0]}" \
            if len(cpus) == 1 else f"intra={intra} inter={inter} cpus=0-1"
        return RunResult("xla", 1, {"id": cid, "intra": intra, "inter": inter, "cpus": cpus},
                         latency=lat)

    res = ProbeResult(host={}, model={}, settings={}, created_utc="2026-11-29T00:00:00Z",
                      runs=[run(2, 1, [0, 1], 900_000), run(1, -1, [1], 450_000),
                            run(1, 1, [1], 470_000)])
    finish(res)
    p = tmp_path / "sweep.json"
    p.write_text(json.dumps(res.to_dict()))
    return p


def test_threads_prints_a_reproducible_run_line(tmp_path):
    """The caller-thread run is fastest here, but TF reads TF_NUM_INTEROP_THREADS=-1 as its
    default, so `hftagent run --inter -1` would not reproduce it: the best run that `run`
    can reproduce is printed, and the caller-thread result is mentioned separately."""
    doc = _sweep_doc(tmp_path)
    res = tune("threads", "--from", str(doc), "--json", "--", "python3", "serve.py", "--port",
               "a b")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["command"] == ("hftagent run --cpus 1 --intra 1 --inter 1 -- python3 serve.py "
                              "--port 'a b'")
    assert out["recommendation"]["p99_ns"] == 470_000
    assert out["faster_unreproducible"]["p99_ns"] == 450_000
    assert "set_inter_op_parallelism_threads" in out["faster_unreproducible"]["note"]
    human = tune("threads", "--from", str(doc))
    assert "best" in human.stdout and "--inter 1" in human.stdout
    assert "--inter -1" not in human.stdout and "faster: intra=1 inter=caller" in human.stdout


def test_threads_run_line_is_accepted_by_run(tmp_path):
    from collectors.host import Host
    from tuning.launcher import LaunchError, build_launch

    launch = build_launch(Host("/"), ["true"], cpus="0", intra=1, inter=1)
    assert launch.env["TF_NUM_INTEROP_THREADS"] == "1"
    with pytest.raises(LaunchError, match="set_inter_op_parallelism_threads"):
        build_launch(Host("/"), ["true"], cpus="0", intra=1, inter=-1)


def test_threads_bad_file(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    _one_line_error(tune("threads", "--from", str(bad)), "not a saved probe result")


# -- --root containment: a symlink in the tree never takes a write outside it ------------------


def _outside(tmp_path, syn):
    """A directory outside the tree holding what a planted symlink would point at: copies of
    cpu1's cpufreq directory, IRQ 24, the whole sys tree, and a swappiness file."""
    import shutil

    out = tmp_path / "outside"
    out.mkdir()
    shutil.copytree(syn / "sys/devices/system/cpu/cpu1/cpufreq", out / "cpufreq")
    shutil.copytree(syn / "proc/irq/24", out / "irq24")
    shutil.copytree(syn / "sys", out / "sys")
    (out / "swappiness").write_text("60\n")
    (out / "run").mkdir()
    (out / "state").mkdir(mode=0o700)
    return out


def _plant(syn, out, kind: str) -> None:
    import shutil

    def swap(rel: str, target) -> None:
        p = syn / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        p.symlink_to(target)

    if kind == "file":
        swap("proc/sys/vm/swappiness", out / "swappiness")
    elif kind == "dir-component":
        swap("sys/devices/system/cpu/cpu1/cpufreq", out / "cpufreq")
    elif kind == "relative-dir-component":  # ../../ out of the tree, as a capture would not
        depth = len((syn / "sys/devices/system/cpu/cpu1").relative_to(syn.parent).parts)
        swap("sys/devices/system/cpu/cpu1/cpufreq", "../" * depth + "outside/cpufreq")
    elif kind == "chain":  # cpu1/cpufreq -> ../cpufreq/policy1 (inside) -> outside
        pol = syn / "sys/devices/system/cpu/cpufreq"
        pol.mkdir(exist_ok=True)
        (pol / "policy1").symlink_to(out / "cpufreq")
        swap("sys/devices/system/cpu/cpu1/cpufreq", "../cpufreq/policy1")
    elif kind == "irq-dir":
        swap("proc/irq/24", out / "irq24")
    elif kind == "mount":
        swap("sys", out / "sys")
    else:
        raise AssertionError(kind)


TARGET_PLANTS = ["file", "dir-component", "relative-dir-component", "chain", "irq-dir", "mount"]


@pytest.mark.adversarial
@pytest.mark.parametrize("kind", TARGET_PLANTS)
def test_symlink_out_of_the_root_is_refused_nothing_written_outside(syn, tmp_path, kind):
    out = _outside(tmp_path, syn)
    _plant(syn, out, kind)
    outside, inside = snapshot(out, exclude=()), snapshot(syn, exclude=())
    for cmd in ("plan", "apply"):
        res = tune(cmd, "--root", str(syn), "--cpus", "2-3")
        _one_line_error(res, "refusing" if kind != "mount" else "outside the root")
        assert "symlink" in res.stderr
    assert snapshot(out, exclude=()) == outside and sorted(p.name for p in out.iterdir()) == \
        ["cpufreq", "irq24", "run", "state", "swappiness", "sys"]
    assert snapshot(syn, exclude=()) == inside  # nothing written in the tree either


@pytest.mark.adversarial
@pytest.mark.parametrize("where", ["run", "run/hftagent"])
def test_state_dir_symlink_out_of_the_root_is_refused(syn, tmp_path, where):
    """ROOT/run (or ROOT/run/hftagent) planted as a symlink: the journal and its lock would
    have been created outside the tree."""
    out = _outside(tmp_path, syn)
    (syn / "run").mkdir(exist_ok=True) if where == "run/hftagent" else None
    (syn / where).symlink_to(out / ("run" if where == "run" else "state"))
    outside, inside = snapshot(out, exclude=()), snapshot(syn, exclude=())
    _one_line_error(tune("apply", "--root", str(syn), "--cpus", "2-3"), "is a symlink: refused")
    _one_line_error(tune("rollback", "--root", str(syn)), "is a symlink: refused")
    _one_line_error(tune("status", "--root", str(syn)), "is a symlink: refused")
    assert snapshot(out, exclude=()) == outside
    assert list((out / "run").iterdir()) == [] and list((out / "state").iterdir()) == []
    assert snapshot(syn, exclude=()) == inside


@pytest.mark.adversarial
def test_state_dir_symlink_with_a_journal_outside_is_not_replayed(syn, tmp_path):
    """A journal waiting outside the tree (reached through ROOT/run) is never read, let alone
    written back."""
    import shutil

    other = make_synthetic(tmp_path / "other")
    assert tune("apply", "--root", str(other), "--only", "memory").exit_code == 0
    out = tmp_path / "outside-run"
    shutil.copytree(other / "run", out)
    (syn / "run").symlink_to(out)
    inside = snapshot(syn, exclude=())
    _one_line_error(tune("rollback", "--root", str(syn), "--force"), "is a symlink: refused")
    assert snapshot(syn, exclude=()) == inside


@pytest.mark.adversarial
@pytest.mark.parametrize("kind", ["dir-component", "file", "irq-dir"])
def test_symlink_planted_after_apply_refuses_the_whole_rollback(syn, tmp_path, kind):
    out = _outside(tmp_path, syn)
    assert tune("apply", "--root", str(syn), "--cpus", "2-3").exit_code == 2
    _plant(syn, out, kind)
    outside, inside = snapshot(out, exclude=()), snapshot(syn, exclude=())
    for cmd in (["rollback", "--force"], ["status"]):
        res = tune(*cmd, "--root", str(syn))
        _one_line_error(res, "is refused")
        assert "nothing was changed" in res.stderr
    assert snapshot(out, exclude=()) == outside
    assert snapshot(syn, exclude=()) == inside  # nothing restored half-way either


def _policy_tree(syn):
    """cpuN/cpufreq as the kernel lays it out: a relative symlink to ../cpufreq/policyN."""
    cpu = syn / "sys/devices/system/cpu"
    (cpu / "cpufreq").mkdir(exist_ok=True)
    for d in sorted(cpu.glob("cpu[0-9]*")):
        n = d.name[3:]
        (d / "cpufreq").rename(cpu / "cpufreq" / f"policy{n}")
        (d / "cpufreq").symlink_to(f"../cpufreq/policy{n}")
    return syn


def test_policy_symlinks_inside_the_tree_apply_and_roll_back(syn):
    _policy_tree(syn)
    before = snapshot(syn)
    res = tune("apply", "--root", str(syn), "--cpus", "2-3", "--json")
    assert res.exit_code == 2, res.output
    out = json.loads(res.stdout)["outcomes"]
    gov = [o for o in out if o["tunable"] == "cpu.governor"]
    assert len(gov) == 4 and {o["result"] for o in gov} == {"applied"}
    assert (syn / "sys/devices/system/cpu/cpufreq/policy3/scaling_governor").read_text() == \
        "performance\n"
    assert tune("status", "--root", str(syn)).exit_code == 0
    assert tune("rollback", "--root", str(syn)).exit_code == 0
    assert diff(before, snapshot(syn)) == []
    assert all((syn / f"sys/devices/system/cpu/cpu{c}/cpufreq").is_symlink() for c in range(4))


# -- odd trees and inputs: one line, never an internal error ----------------------------------


def test_plan_on_a_tree_of_empty_files(syn):
    for p in syn.rglob("*"):
        if p.is_file():
            p.write_text("")
    for cmd in ("plan", "apply"):
        res = tune(cmd, "--root", str(syn), "--cpus", "1")
        assert res.exit_code == 1 and "internal error" not in res.stderr, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hftagent: error: "), res.stderr
    res = tune("plan", "--root", str(syn))
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1, res.output


@pytest.mark.parametrize("value", ["", " ", "a\x00b"])
def test_empty_state_dir_is_refused_not_default(syn, value):
    for cmd in (["apply", "--only", "memory"], ["rollback"], ["status"]):
        _one_line_error(tune(*cmd, "--root", str(syn), "--state-dir", value), "--state-dir")
    assert not (syn / "run").exists()


@pytest.mark.adversarial
@pytest.mark.parametrize("what", ["dev-zero", "fifo", "dir", "nested", "empty", "huge"])
def test_bad_profile_files(syn, tmp_path, what):
    import os

    p = tmp_path / "p.toml"
    if what == "dev-zero":
        p = "/dev/zero"
    elif what == "fifo":
        os.mkfifo(p)
    elif what == "dir":
        p.mkdir()
    elif what == "nested":
        p.write_text("x = " + "[" * 50000 + "]" * 50000 + "\n")
    elif what == "huge":
        with open(p, "wb") as fh:
            fh.truncate(2 << 20)
    else:
        p = ""
    for cmd in ("plan", "apply"):
        _one_line_error(tune(cmd, "--root", str(syn), "--profile", str(p)), "profile")


@pytest.mark.adversarial
@pytest.mark.parametrize("what,needle", [
    ("", "not a file path"), ("fifo", "not a regular file"), ("/dev/zero", "not a regular file"),
    ("nested", "not a saved probe result"), ("missing", "no such file"),
    ("dir", "not a regular file")])
def test_threads_from_odd_files(tmp_path, what, needle):
    import os

    p = tmp_path / "x.json"
    if what == "fifo":
        os.mkfifo(p)
    elif what == "nested":
        p.write_text("[" * 100000 + "]" * 100000)
    elif what == "dir":
        p.mkdir()
    elif what != "missing":
        p = what
    _one_line_error(tune("threads", "--from", str(p)), needle)


def test_threads_from_refuses_sweep_options(tmp_path):
    doc = _sweep_doc(tmp_path)
    _one_line_error(tune("threads", "--from", str(doc), "--duration", "3", "--cpus", "1"),
                    "--cpus, --duration would not be used")


def test_status_and_rollback_without_a_state_dir_create_nothing(syn):
    st = tune("status", "--root", str(syn))
    assert st.exit_code == 0 and "nothing applied" in st.stdout, st.output
    rb = tune("rollback", "--root", str(syn))
    assert rb.exit_code == 0 and "nothing to roll back" in rb.stdout, rb.output
    dry = tune("apply", "--root", str(syn), "--only", "memory", "--dry-run")
    assert dry.exit_code == 2, dry.output
    assert not (syn / "run").exists()


@pytest.mark.adversarial
@pytest.mark.parametrize("what", ["file", "fifo", "under-file", "loop", "/dev/null",
                                  "corrupt-journal"])
def test_dry_run_checks_the_state_dir_as_apply_would(syn, tmp_path, what):
    """--dry-run says what apply would do: a state directory (or journal) that apply would
    refuse is refused by the dry run too, and nothing is written."""
    import os

    sd = tmp_path / "sd"
    if what == "file":
        sd.write_text("x\n")
    elif what == "fifo":
        os.mkfifo(sd)
    elif what == "under-file":
        (tmp_path / "f").write_text("x\n")
        sd = tmp_path / "f" / "sd"
    elif what == "loop":
        sd.symlink_to(sd)
    elif what == "/dev/null":
        sd = "/dev/null"
    else:
        assert tune("apply", "--root", str(syn), "--only", "memory", "--state-dir",
                    str(sd)).exit_code == 0
        (sd / "journal.json").write_text("{garbage\n")
    before = snapshot(syn, exclude=())
    res = tune("apply", "--root", str(syn), "--state-dir", str(sd), "--dry-run")
    _one_line_error(res, "state directory" if what != "corrupt-journal" else "corrupt")
    assert snapshot(syn, exclude=()) == before


@pytest.mark.adversarial
@pytest.mark.parametrize("rel", ["proc/sys/vm/swappiness", "proc/irq/24/smp_affinity_list",
                                 "sys/devices/system/cpu/online",
                                 "sys/kernel/mm/transparent_hugepage/enabled"])
def test_fifo_in_the_tree_never_blocks_plan_apply_or_status(syn, rel):
    """A FIFO planted where a /proc or /sys file should be: every read used to block in
    open() forever (Host.read and the tunables' reads are non-blocking, regular files only)."""
    import os
    import signal

    (syn / rel).unlink()
    os.mkfifo(syn / rel)

    class Blocked(Exception):  # not an OSError: nothing on the way may swallow it
        pass

    def ring(*_a):
        raise Blocked(f"blocked on the FIFO at {rel}")

    old = signal.signal(signal.SIGALRM, ring)
    try:
        for cmd in (["plan"], ["apply"], ["status"], ["rollback"]):
            signal.alarm(10)
            res = tune(*cmd, "--root", str(syn), "--cpus", "2-3") if cmd[0] in (
                "plan", "apply") else tune(*cmd, "--root", str(syn))
            signal.alarm(0)
            assert res.exception is None or isinstance(res.exception, SystemExit), \
                (cmd, repr(res.exception))
            assert res.exit_code in (0, 1, 2), res.output
            assert "internal error" not in res.stderr and "Traceback" not in res.output
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert (syn / rel).is_fifo()  # never written, never replaced


def test_a_failed_write_under_json_still_says_why_on_stderr(syn, monkeypatch):
    """exit 1 with the reason only inside the JSON left a script that checks the status with
    an empty stderr: the first failure is one line there too."""
    import errno
    import functools
    monkeypatch.setattr(tunables_base, "default_writer",
                        functools.partial(KernelSim, fail={"vm/swappiness": errno.EINVAL}))
    res = tune("apply", "--root", str(syn), "--cpus", "2-3", "--json")
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert [o["target"] for o in data["outcomes"] if o["result"] == "failed"] == [
        "/proc/sys/vm/swappiness"]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("hftagent: error: tune apply: /proc/sys/vm/swappiness: ")
    assert "Invalid argument" in lines[0] and "tune rollback" in lines[0]
    assert tune("rollback", "--root", str(syn)).exit_code == 0


# -- issue #25: the GRUB recipe whole, --include-pinned; issue #30: a truncated journal --------


@pytest.mark.parametrize("cmd", ["plan", "apply"])
def test_grub_recipe_one_whole_command_a_line_and_reboot_in_words(syn, cmd):
    """The recipe used to be split on "; ", which also occurs inside the sed script: pasted
    line by line, half a sed command ran. Each command is printed whole on its own line (no
    wrap at 80 columns or on a pipe, which CliRunner is), then "then reboot" once."""
    res = tune("plan", "--root", str(syn), "--cpus", "2-3", "--json")
    boot = [c for i in json.loads(res.stdout)["items"] for c in i["changes"]
            if c["kind"] == "pending-reboot"]
    recipe = boot[0]["detail"].splitlines()
    assert recipe and all(len(c) > 80 for c in recipe)  # long enough to wrap if it could
    res = runner.invoke(get_app(), ["tune", cmd, "--root", str(syn), "--cpus", "2-3"],
                        env={"COLUMNS": "80"})
    assert res.exit_code == 2, res.output
    lines = res.stdout.splitlines()
    for c in recipe:
        assert "    " + c in lines, c
    assert lines.count("then reboot") == 1
    assert not [ln for ln in lines if ln.strip() == "reboot" or ln.strip().endswith("; reboot")]


def test_include_pinned_without_isolation_is_one_line(syn):
    before = snapshot(syn, exclude=())
    for cmd in ("plan", "apply"):
        _one_line_error(tune(cmd, "--root", str(syn), "--cpus", "2-3", "--profile", "bench",
                             "--include-pinned"),
                        "--include-pinned only changes what runtime isolation moves, and "
                        "profile bench does not ask for runtime_isolation")
        _one_line_error(tune(cmd, "--root", str(syn), "--cpus", "2-3", "--only", "memory",
                             "--include-pinned"), "runtime isolation is not selected")
        _one_line_error(tune(cmd, "--root", str(syn), "--cpus", "2-3", "--isolate", "--skip",
                             "isolate", "--include-pinned"), "not selected")
    assert snapshot(syn, exclude=()) == before
    res = tune("plan", "--root", str(syn), "--cpus", "2-3", "--profile", "bench", "--isolate",
               "--include-pinned")
    assert res.exit_code == 2, res.output


def test_truncated_journal_rollback_keeps_it_and_exits_non_zero(syn):
    """Issue #30: a journal cut in half was taken as a torn append without a word: rollback
    restored the half it read, said "0 journal entries left", exited 0 and deleted the
    journal while the targets of the other half stayed modified."""
    tune("apply", "--root", str(syn), "--cpus", "2-3")
    j = syn / "run/hftagent/journal.json"
    text = j.read_text()
    cut = len(text) // 2
    cut += 5 if text[cut - 1] == "\n" else 0
    j.write_text(text[:cut])
    cut_bytes = j.read_bytes()
    st = tune("status", "--root", str(syn))
    assert st.exit_code == 2 and "torn record" in " ".join(st.stdout.split())
    rb = tune("rollback", "--root", str(syn))
    assert rb.exit_code == 2, rb.output
    out = " ".join(rb.stdout.split())
    assert "torn record" in out and "journal kept" in out and "0 journal entries" not in out
    assert j.read_bytes() == cut_bytes
    rb = tune("rollback", "--root", str(syn), "--json")
    assert rb.exit_code == 2 and json.loads(rb.stdout)["torn"] is True
    _one_line_error(tune("apply", "--root", str(syn), "--cpus", "2-3"), "apply refuses")
    assert j.read_bytes() == cut_bytes


def test_perf_event_paranoid_is_a_ceiling_and_rolls_back(syn):
    """The profile's perf_event_paranoid (1) is what the audit judges as "<= 1": a host at 2
    is lowered to 1 and rollback restores 2; a host already at -1 is left there (never made
    stricter)."""
    path = syn / "proc/sys/kernel/perf_event_paranoid"
    before = snapshot(syn)
    res = tune("apply", "--root", str(syn), "--cpus", "2-3", "--only",
               "kernel.perf_event_paranoid")
    assert res.exit_code == 0, res.output
    assert path.read_text() == "1\n"
    assert tune("rollback", "--root", str(syn)).exit_code == 0
    assert diff(before, snapshot(syn)) == [] and path.read_text() == "2\n"
    path.write_text("-1\n")
    res = tune("plan", "--root", str(syn), "--cpus", "2-3", "--only",
               "kernel.perf_event_paranoid", "--json")
    assert res.exit_code == 0, res.output
    assert path.read_text() == "-1\n"


def test_a_row_of_many_targets_names_a_few_and_counts_the_rest():
    """tune plan --isolate printed 76 moved tasks as one line (issue #39): a row names at most
    LISTED_TARGETS, says how many more, and --json keeps every one."""
    from agent.commands.tune import LISTED_TARGETS, _listed
    few = [f"task:{i}:1" for i in range(LISTED_TARGETS)]
    assert _listed(few) == ", ".join(few)
    many = [f"task:{i}:1" for i in range(76)]
    shown = _listed(many)
    assert shown.startswith("76 targets: task:0:1, ")
    assert shown.endswith(f"and {76 - LISTED_TARGETS + 1} more (--json lists each)")
    assert "task:75:1" not in shown


# ---- the state directory by the one rule (issue #34 item 2) ---------------------------------
#
# Every directory from / down to the state directory must be root's or ours and writable by
# nobody else (a root-owned sticky one like /tmp excepted), and no other user's link is
# followed: the layouts of tests/test_agent_outfile.py, with a throw-away user (``user``).


def _state_refused(res, named: tuple) -> None:
    component, why = named
    _one_line_error(res, f"{component} {why}")


@pytest.mark.adversarial
def test_state_dir_below_another_users_directory_is_refused_nothing_made(syn, tmp_path, user):
    """`tune status/apply --state-dir` under a directory another user owns (or below one),
    through their link, or in a group- or world-writable directory that is not sticky: one
    line naming that component, exit 1, nothing created anywhere (the journal's directory
    was created before only its last level was checked). Root's sticky directory and
    root's own link are followed."""
    import subprocess
    import sys

    from tests.test_agent_outfile import ALLOWED, REFUSED, _layout, _tree
    _name, uid, gid = user
    cli = [sys.executable, "-c", "from agent.cli import main; main()"]
    for kind in REFUSED + ALLOWED:
        give, land, named = _layout(tmp_path / kind, kind, uid, gid)
        sd = give / "state"
        before, tree = _tree(tmp_path / kind), snapshot(syn)
        st = subprocess.run([*cli, "tune", "status", "--state-dir", str(sd)],
                            capture_output=True, text=True, timeout=120)
        ap = tune("apply", "--root", str(syn), "--cpus", "2-3", "--only", "memory",
                  "--state-dir", str(sd))
        if named is None:
            assert st.returncode == 0 and "nothing applied" in st.stdout, (kind, st.stderr)
            assert ap.exit_code == 0, (kind, ap.output)
            assert (land / "state" / "journal.json").is_file(), kind
            assert tune("rollback", "--root", str(syn), "--state-dir", str(sd)).exit_code == 0
            continue
        lines = st.stderr.strip().splitlines()
        assert st.returncode == 1 and len(lines) == 1, (kind, st.stderr)
        assert f"{named[0]} {named[1]}" in lines[0], (kind, st.stderr)
        _state_refused(ap, named)
        assert _tree(tmp_path / kind) == before, f"{kind}: something was created"
        assert diff(tree, snapshot(syn)) == [], f"{kind}: the tree was written"


@pytest.mark.adversarial
def test_the_default_state_dir_of_a_tree_below_another_users_directory_is_refused(
        tmp_path, user):
    """ROOT/run/hftagent of a --root tree that lies below another user's directory: they
    could swap the tree's run/ for a link after the check. Refused at their directory."""
    _name, uid, gid = user
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    syn = make_synthetic(theirs / "syn")
    os.chown(theirs, uid, gid)
    tree = snapshot(syn, exclude=())
    named = (theirs, f"belongs to uid {uid}, not to root or us")
    _state_refused(tune("apply", "--root", str(syn), "--only", "memory"), named)
    _state_refused(tune("status", "--root", str(syn)), named)
    assert snapshot(syn, exclude=()) == tree and not (syn / "run" / "hftagent").exists()
