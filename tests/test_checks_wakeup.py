"""Wake-up: the audit's wakeup family (tuning/checks/wakeup.py) on fixture trees, and that every
command the audit suggests is accepted by the command it names. Nothing here writes the real
/proc or /sys. The PM QoS tunable it suggests is in tests/test_tunables_pmqos.py."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors import wakeup as wk
from collectors.host import Host
from tests.isotree import IsoSim, iso_tree
from tests.treecopy import diff, make_synthetic, snapshot
from tuning.audit import run_audit
from tuning.findings import Status
from tuning.profiles import load_profile

runner = CliRunner()


def _profile(tmp_path: Path, **settings) -> str:
    f = tmp_path / "p.toml"
    body = 'extends = "hft-cpu"\nname = "mine"\n' + "".join(
        f"[settings.{k}]\nexpected = {json.dumps(v)}\n" for k, v in settings.items())
    f.write_text(body)
    return str(f)


def _findings(root: Path, profile: str = "hft-cpu", cpus: str = "1") -> dict:
    rep = run_audit(Host(root), load_profile(profile), cpus, families=["virt", "wakeup"])
    return {f.id: f for f in rep.findings}


def test_vm_dev_haltpoll_without_polling_warns_and_isolates_before_keeping_awake(tmp_path):
    """CPU 1 not isolated: keep-awake is not recommended there (the call waits behind the
    CPU's other tasks whatever keeps it awake), the isolation is, and the finding says why."""
    root = iso_tree(tmp_path / "t")  # vm-dev capture: haltpoll, guest_halt_poll_ns 0
    f = _findings(root)
    c = f["wakeup.cpuidle"]
    assert c.status == Status.WARN
    assert "driver haltpoll, governor haltpoll" in c.current and "halts at once" in c.current
    assert c.fix == "hftagent tune apply --isolate --only isolate --cpus 1"
    assert ("keep-awake not recommended yet: CPU 1 is not isolated (on a CPU other tasks may "
            "use, the call waits behind them whatever keeps it awake") in c.current
    assert c.current.endswith("isolate it first, then measure the wake-up levers: hftagent "
                              "tune try")
    hp = f["wakeup.guest_halt_poll"]
    assert hp.status == Status.WARN and hp.current.startswith("guest_halt_poll_ns 0")
    assert hp.fix == "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns"
    assert f["wakeup.pm_qos"].status == Status.UNSUPPORTED  # a tree has no processes
    r = f["wakeup.pm_qos_resume_latency"]
    assert r.status == Status.WARN and r.current == "1=0 (no constraint)"
    assert r.fix == ("hftagent tune apply --profile hft-cpu --cpus 1 --only "
                     "wakeup.pm_qos_resume_latency")


def test_the_suggested_tune_command_is_accepted_and_then_the_audit_passes(tmp_path,
                                                                           monkeypatch):
    root = iso_tree(tmp_path / "t")
    before = snapshot(root)
    fix = _findings(root)["wakeup.pm_qos_resume_latency"].fix
    argv = shlex.split(fix)
    assert argv[:3] == ["hftagent", "tune", "apply"]
    res = runner.invoke(get_app(), argv[1:] + ["--root", str(root)])
    assert res.exit_code == 0, res.output
    assert (root / "sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"
            ).read_text() == "10\n"
    assert _findings(root)["wakeup.pm_qos_resume_latency"].status == Status.OK
    res = runner.invoke(get_app(), ["tune", "rollback", "--root", str(root)])
    assert res.exit_code == 0 and diff(before, snapshot(root)) == []


def test_the_isolation_fix_is_accepted_and_then_tune_try_is_recommended(tmp_path,
                                                                        monkeypatch):
    root = iso_tree(tmp_path / "t")
    before = snapshot(root)
    monkeypatch.setattr("tuning.tunables.base.default_writer", IsoSim)
    argv = shlex.split(_findings(root)["wakeup.cpuidle"].fix)
    res = runner.invoke(get_app(), argv[1:] + ["--root", str(root)])
    assert res.exit_code == 0, res.output
    c = _findings(root)["wakeup.cpuidle"]
    assert c.status == Status.WARN
    assert c.fix == "hftagent tune try --cpus 1"  # no tune try on this tree: measure first
    assert "CPU 1 isolated by the isolated cpuset /sys/fs/cgroup/cpuset/hftagent-isolated" \
        in c.current
    res = runner.invoke(get_app(), ["tune", "rollback", "--root", str(root)])
    assert res.exit_code == 0 and diff(before, snapshot(root)) == []


def test_isolcpus_counts_as_isolated_for_keep_awake(tmp_path):
    root = iso_tree(tmp_path / "t")
    (root / "sys/devices/system/cpu/isolated").write_text("1\n")
    f = _findings(root)
    assert f["wakeup.cpuidle"].fix == "hftagent tune try --cpus 1"
    assert "CPU 1 isolated by isolcpus" in f["wakeup.cpuidle"].current
    assert f["wakeup.guest_halt_poll"].fix.endswith("(or: hftagent tune try --cpus 1)")


def test_the_suggested_run_commands_are_accepted(tmp_path):
    from tuning.trial_state import write_state
    root = iso_tree(tmp_path / "t")
    (root / "sys/devices/system/cpu/isolated").write_text("1\n")
    # the lever comes from the last tune try on this box (tests/test_trial_audit.py)
    write_state(Host(root), {"cpus": [1], "winner": "keep-awake", "clear": True})
    f = _findings(root)
    for fid in ("wakeup.cpuidle", "wakeup.guest_halt_poll"):
        line = f[fid].fix.split("(or: ")[-1].rstrip(")")
        argv = shlex.split(line)
        assert argv[:2] == ["hftagent", "run"] and argv[-1] == "CMD"
        i = argv.index("--")
        res = runner.invoke(get_app(), argv[1:i] + ["--dry-run", "--root", str(root)]
                            + argv[i:-1] + ["true"])
        assert res.exit_code == 0, res.output
        assert "keep-awake spinner on CPU 1" in res.stdout


def test_a_user_profile_fix_names_the_profile_file(tmp_path):
    root = iso_tree(tmp_path / "t")
    prof = _profile(tmp_path, pm_qos_resume_latency_us=20)
    r = _findings(root, prof)["wakeup.pm_qos_resume_latency"]
    assert f"--profile {prof} " in r.fix and r.expected == "20 µs on every target CPU"
    argv = shlex.split(r.fix)
    res = runner.invoke(get_app(), argv[1:] + ["--root", str(root)])
    assert res.exit_code == 0, res.output
    assert _findings(root, prof)["wakeup.pm_qos_resume_latency"].status == Status.OK


def test_keep_awake_any_reports_without_warning(tmp_path):
    root = iso_tree(tmp_path / "t")
    f = _findings(root, "bench")
    assert f["wakeup.cpuidle"].status == Status.OK and "halts at once" in f[
        "wakeup.cpuidle"].current
    assert f["wakeup.guest_halt_poll"].status == Status.OK


def test_halt_polling_on_is_ok_and_no_module_means_no_finding(tmp_path):
    root = iso_tree(tmp_path / "t")
    (root / "sys/module/haltpoll/parameters/guest_halt_poll_ns").write_text("200000\n")
    f = _findings(root)
    assert f["wakeup.guest_halt_poll"].status == Status.OK
    assert "polls up to 200 µs" in f["wakeup.guest_halt_poll"].current
    assert f["wakeup.cpuidle"].status == Status.OK
    import shutil
    shutil.rmtree(root / "sys/module/haltpoll")
    assert "wakeup.guest_halt_poll" not in _findings(root)


def test_idle_poll_on_the_command_line_never_halts(tmp_path):
    root = iso_tree(tmp_path / "t")
    cl = root / "proc/cmdline"
    cl.write_text(cl.read_text().replace("quiet", "quiet idle=poll"))
    c = _findings(root)["wakeup.cpuidle"]
    assert c.status == Status.OK and "idle=poll" in c.current


def test_bare_metal_intel_idle_is_judged_by_its_states(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    d = root / "sys/devices/system/cpu/cpuidle"
    d.mkdir(parents=True, exist_ok=True)
    (d / "current_driver").write_text("intel_idle\n")
    (d / "current_governor").write_text("menu\n")
    rep = run_audit(Host(root), load_profile("hft-cpu"), "2-3", families=["virt", "wakeup"])
    f = {x.id: x for x in rep.findings}
    assert f["wakeup.cpuidle"].status == Status.OK
    assert "driver intel_idle, governor menu" in f["wakeup.cpuidle"].current
    assert "wakeup.guest_halt_poll" not in f


def test_cpuidle_absent_from_a_tree_is_unsupported_not_ok(tmp_path):
    root = iso_tree(tmp_path / "t")
    (root / "sys/devices/system/cpu/cpuidle/current_driver").unlink()
    c = _findings(root)["wakeup.cpuidle"]
    assert c.status == Status.UNSUPPORTED and "absent from this tree" in c.current


def test_unreadable_resume_latency_of_one_cpu_is_an_error_not_ok(tmp_path):
    root = iso_tree(tmp_path / "t")
    ctxp = load_profile("hft-cpu")
    for c in (0, 1):
        (root / f"sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us"
         ).write_text("10\n")
    (root / "sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us").write_text("x\n")
    rep = run_audit(Host(root), ctxp, "0-1", families=["virt", "wakeup"])
    r = {x.id: x for x in rep.findings}["wakeup.pm_qos_resume_latency"]
    assert r.status == Status.ERROR and "1=unreadable" in r.current


# ----------------------------------------------------------------------------------------------
# live, read-only
# ----------------------------------------------------------------------------------------------


def test_live_pm_qos_finding_names_who_holds_the_device():
    if os.geteuid() != 0 or not os.path.exists("/dev/cpu_dma_latency"):
        pytest.skip("needs root and /dev/cpu_dma_latency")
    fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    try:
        os.write(fd, (1000).to_bytes(4, "little", signed=True))  # a loose request: no effect
        h = wk.pm_qos_holders(Host())
        assert os.getpid() in {p for p, _ in h.held_by}
        eff = wk.cpu_dma_latency(Host())
        assert eff.ok and eff.value <= 1000
        rep = run_audit(Host(), load_profile("hft-cpu"), "1" if os.cpu_count() > 1 else "0",
                        families=["virt", "wakeup"])
        f = {x.id: x for x in rep.findings}["wakeup.pm_qos"]
        assert f"[{os.getpid()}]" in f.current and "held by " in f.current
        assert "nobody" not in f.current and "no request" not in f.current
    finally:
        os.close(fd)


def test_halt_poll_from_the_command_line_when_the_module_file_is_absent(tmp_path):
    """A capture may lack /sys/module/haltpoll while the kernel command line sets it."""
    import shutil
    root = iso_tree(tmp_path / "t")
    shutil.rmtree(root / "sys/module/haltpoll")
    c = _findings(root)["wakeup.cpuidle"]
    assert c.status == Status.WARN and "haltpoll.guest_halt_poll_ns=0" in c.evidence
    cl = root / "proc/cmdline"
    cl.write_text(cl.read_text().replace("haltpoll.guest_halt_poll_ns=0 ", ""))
    c = _findings(root)["wakeup.cpuidle"]
    assert c.status == Status.ERROR and "unknown" in c.current  # never "ok" unread
    assert _findings(root, "bench")["wakeup.cpuidle"].status == Status.ERROR  # even "any"


# ----------------------------------------------------------------------------------------------
# the default idle, named for the tree's architecture (not HLT/MWAIT everywhere)
# ----------------------------------------------------------------------------------------------

CPUINFO = {  # abridged from each architecture's /proc/cpuinfo (arch/*/kernel/ cpuinfo/setup)
    "arm": "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 "
           "sha2 crc32 atomics cpuid asimdrdm lrcpc dcpop asimddp ssbs\nCPU implementer\t: "
           "0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: "
           "1\n",
    "riscv": "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdc_zicntr_zicsr_zifencei_zihpm\n"
             "mmu\t\t: sv39\nuarch\t\t: sifive,u74-mc\n",
    "powerpc": "processor\t: 0\ncpu\t\t: POWER9 (architected), altivec supported\nclock\t\t: "
               "2200.000000MHz\nrevision\t: 2.2 (pvr 004e 1202)\n\ntimebase\t: 512000000\n"
               "platform\t: pSeries\nmodel\t\t: IBM,9009-22A\nmachine\t\t: CHRP IBM,9009-22A\n",
    "s390": "vendor_id       : IBM/S390\n# processors    : 2\nbogomips per cpu: 3241.00\n"
            "features\t: esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx sie\n"
            "processor 0: version = FF,  identification = 0133E8,  machine = 8561\n",
}
MACHINE = {"arm": "aarch64", "riscv": "riscv64", "powerpc": "ppc64le", "s390": "s390x"}


def _arch_tree(tmp_path: Path, fam: str, with_sysctl: bool) -> Path:
    """The vm-dev copy made to look like another architecture: its cpuinfo, kernel.arch (or
    none: cpuinfo alone decides), and no cpuidle driver (the default idle)."""
    root = iso_tree(tmp_path / "t")
    (root / "proc/cpuinfo").write_text(CPUINFO[fam])
    sysctl = root / "proc/sys/kernel/arch"
    if with_sysctl:
        sysctl.write_text(MACHINE[fam] + "\n")
    elif sysctl.exists():
        sysctl.unlink()
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text("none\n")
    return root


@pytest.mark.parametrize("with_sysctl", [True, False])
@pytest.mark.parametrize("fam", sorted(CPUINFO))
def test_the_default_idle_is_named_for_a_non_x86_tree(tmp_path, fam, with_sysctl):
    root = _arch_tree(tmp_path, fam, with_sysctl)
    assert wk.arch(Host(root)).value == fam
    c = _findings(root)["wakeup.cpuidle"]
    assert wk.DEFAULT_IDLE[fam] in c.current, c.current
    assert "HLT" not in c.current and "MWAIT" not in c.current


def test_x86_trees_keep_hlt_mwait_and_an_unknown_arch_says_so(tmp_path):
    root = iso_tree(tmp_path / "t")
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text("none\n")
    assert wk.arch(Host(root)).value == "x86"
    assert "HLT/MWAIT" in _findings(root)["wakeup.cpuidle"].current
    (root / "proc/cpuinfo").write_text("processor\t: 0\nsomething\t: else\n")
    (root / "proc/sys/kernel/arch").write_text("sparc64\n")
    r = wk.arch(Host(root))
    assert r.value is None and r.reason.startswith("unsupported")
    c = _findings(root)["wakeup.cpuidle"].current
    assert wk.UNKNOWN_IDLE in c and "HLT" not in c


@pytest.mark.parametrize("machine,fam", [("x86_64", "x86"), ("i686", "x86"),
                                         ("aarch64", "arm"), ("armv7l", "arm"),
                                         ("ppc64le", "powerpc"), ("ppc64", "powerpc"),
                                         ("s390x", "s390"), ("riscv64", "riscv"),
                                         ("loongarch64", "loongarch"), ("mips64", None)])
def test_arch_from_machine(machine, fam):
    assert wk.arch_from_machine(machine) == fam
