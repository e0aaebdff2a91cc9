"""Audit and capture on bare-metal-shaped trees (issue #14 defects 1-4, 8-10).

The trees synthetic-baremetal and synthetic-hybrid (tests/fixtures/make_synthetic.py) are laid
out as a 6.x kernel lays out sysfs on bare metal: cpuN/cpufreq links to cpufreq/policyN, the
GPU and NIC behind PCIe bridges (bus/pci/devices/<addr> links into devices/pci*/...), NUMA
nodes 1 and 2 with no node0, per-core and P/E-core maximum frequencies, an empty hot-plug
slot. Each test below breaks one thing on a copy and names the defect it reproduces.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors import pcie, system
from collectors.capture import capture_result
from collectors.host import Host
from tests.conftest import FIXTURES
from tuning.checks.base import why

runner = CliRunner()
BM = "synthetic-baremetal"
CPU = "sys/devices/system/cpu"


def audit(root: Path, *args: str) -> tuple[int, dict]:
    res = runner.invoke(get_app(), ["audit", "--root", str(root), "--json", *args])
    assert res.exit_code in (0, 1, 2), res.output
    assert "Traceback" not in res.output
    return res.exit_code, json.loads(res.stdout)


def by_id(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"]}


def replace_with_dir(p: Path) -> None:
    """Make ``p`` unreadable as a file (reading it is EISDIR), even for root."""
    if p.is_symlink() or p.is_file():
        p.unlink()
    p.mkdir()


def test_the_tree_looks_like_bare_metal():
    root = FIXTURES / BM
    assert os.readlink(root / CPU / "cpu5/cpufreq") == "../cpufreq/policy5"
    gpu = root / "sys/bus/pci/devices/0000:af:00.0"
    assert gpu.is_symlink() and "pci0000:ae/0000:ae:00.0/0000:af:00.0" in os.readlink(gpu)
    assert sorted(p.name for p in (root / "sys/devices/system/node").glob("node*")) == \
        ["node1", "node2"]
    assert not (root / CPU / "cpu0/online").exists()  # x86: CPU 0 cannot go offline


# -- defect 1: capture drops PCIe devices behind a bridge ---------------------------------------

def test_capture_keeps_devices_behind_bridges(tmp_path):
    out = tmp_path / "cap"
    out.mkdir()
    capture_result(Host(FIXTURES / BM), out)
    want = {d.address: d for d in pcie.pci_devices(Host(FIXTURES / BM))}
    got = {d.address: d for d in pcie.pci_devices(Host(out))}
    assert sorted(got) == sorted(want)
    for addr in ("0000:af:00.0", "0000:da:00.0", "0000:da:00.1"):  # GPU, NIC behind a switch
        assert got[addr].link_str() == want[addr].link_str()
        assert got[addr].numa_node == 2
        link = out / "sys/bus/pci/devices" / addr
        assert link.is_symlink() and link.resolve().is_relative_to(out.resolve())
    assert (out / "sys/devices/pci0000:d7/0000:d7:00.0/0000:d8:00.0/0000:d9:00.0/0000:da:00.0"
            "/class").is_file()
    assert not (out / "sys/devices/pci0000:ae/0000:ae:00.0/config").exists()  # binary: not taken


# -- defect 2: capture does not follow cpuN/cpufreq; never follows a link out of the root ------

def test_capture_keeps_cpufreq_policy_links(tmp_path):
    out = tmp_path / "cap"
    out.mkdir()
    capture_result(Host(FIXTURES / BM), out)
    link = out / CPU / "cpu5/cpufreq"
    assert link.is_symlink() and os.readlink(link) == "../cpufreq/policy5"
    assert (link / "scaling_governor").read_text() == "performance\n"
    _, rep = audit(out)
    assert by_id(rep)["cpu.governor"]["status"] == "ok"
    assert by_id(rep)["cpu.min_freq"]["status"] == "warn"
    # links into trees the capture does not take are left out, not dangling
    assert not os.path.lexists(out / "sys/devices/system/node/node1/memory2")
    assert not (out / "sys/devices/system/memory").exists()


def test_capture_never_follows_a_link_out_of_the_tree(tree_copy, tmp_path):
    root = tree_copy(BM)
    secret = tmp_path / "secret"
    (secret / "sub").mkdir(parents=True)
    (secret / "scaling_governor").write_text("SECRET\n")
    (secret / "sub" / "x").write_text("SECRET\n")
    cf = root / CPU / "cpu6/cpufreq"
    cf.unlink()
    os.symlink(secret, cf)  # a directory link out of the tree
    status = root / "proc/812/status"
    status.unlink()
    os.symlink(secret / "scaling_governor", status)  # a file link out of the tree
    dmi = root / "sys/class/dmi/id"
    dmi.unlink()
    os.symlink(secret, dmi)  # a top-level item that is a link out of the tree
    pci = root / "sys/bus/pci/devices/0000:18:00.0"
    pci.unlink()
    os.symlink(secret, pci)
    (secret / "comm").write_text("SECRET\n")
    shutil.rmtree(root / "proc/1")
    os.symlink(secret, root / "proc/1")  # a process directory that is a link out
    out = tmp_path / "cap"
    out.mkdir()
    res = capture_result(Host(root), out)
    for dirpath, _dirs, files in os.walk(out):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                assert b"SECRET" not in p.read_bytes(), p
    for p in out.rglob("*"):
        if p.is_symlink():
            assert p.resolve().is_relative_to(out.resolve()), p
    text = (out / "CAPTURE-SKIPPED").read_text()
    for shown in ("/sys/devices/system/cpu/cpu6/cpufreq", "/proc/812/status", "/proc/1/comm",
                  "/sys/class/dmi/id", "/sys/bus/pci/devices/0000:18:00.0"):
        assert shown in text and any(shown in s and "out of the tree" in s
                                     for s in res.skipped), shown


# -- defect 3: numa with node0 absent; --pid findings survive --------------------------------

def test_numa_without_node0(tree_copy):
    _, rep = audit(FIXTURES / BM)
    f = by_id(rep)["numa.target_nodes"]
    assert f["status"] == "ok" and "target CPUs on node(s) 2" in f["current"]
    # the target's CPUs on no readable node: was KeyError: 0 (node0 assumed), and with --pid
    # every process.* finding went with it
    root = tree_copy(BM)
    (root / "sys/devices/system/node/node2/cpulist").write_text("garbage\n")
    (root / "proc/812/environ").write_bytes(b"TF_NUM_INTRAOP_THREADS=3\0")
    code, rep = audit(root, "--pid", "812")
    f = by_id(rep)
    assert "numa.check" not in f and "process.check" not in f
    assert f["numa.target_nodes"]["status"] == "error"
    assert "node2: cpulist error: cannot parse" in f["numa.target_nodes"]["current"]
    assert "5-7 on no readable node" in f["numa.target_nodes"]["current"]
    for pid_check in ("process.affinity", "process.tf_threads"):
        assert pid_check in f
    assert "--membind=0" not in f.get("process.membind", {}).get("fix", "")


def test_process_is_its_own_family_after_numa():
    ids = [f["family"] for f in audit(FIXTURES / "synthetic-tuned", "--pid", "812")[1]["findings"]]
    assert ids.index("process") == ids.index("numa") + 1
    assert ids[ids.index("process"):].count("process") == \
        len([i for i in ids if i == "process"])  # grouped


# -- defect 4: missing or unreadable data is never ok ------------------------------------------

def _floor_all_at_max(root: Path) -> None:
    """Raise every CPU's floor to its own maximum: cpu.min_freq is ok on this copy."""
    for pol in (root / CPU / "cpufreq").glob("policy*"):
        (pol / "scaling_min_freq").write_text((pol / "cpuinfo_max_freq").read_text())


def test_absent_cpuinfo_max_freq_is_not_ok(tree_copy):
    root = tree_copy(BM)
    _floor_all_at_max(root)
    assert by_id(audit(root)[1])["cpu.min_freq"]["status"] == "ok"
    (root / CPU / "cpufreq/policy6/cpuinfo_max_freq").unlink()
    code, rep = audit(root)
    f = by_id(rep)["cpu.min_freq"]
    assert f["status"] == "error" and code == 1
    assert "6=cpufreq/cpuinfo_max_freq absent from this tree" in f["current"]
    assert "(0 MHz)" not in f["expected"]


def test_unreadable_scaling_min_freq_is_not_ok(tree_copy):
    root = tree_copy(BM)
    _floor_all_at_max(root)
    replace_with_dir(root / CPU / "cpufreq/policy7/scaling_min_freq")
    f = by_id(audit(root)[1])["cpu.min_freq"]
    assert f["status"] == "error" and "7=cpufreq/scaling_min_freq error" in f["current"]


def test_cpu_without_cpufreq_or_cpuidle_is_not_ok(tree_copy):
    root = tree_copy(BM)
    _floor_all_at_max(root)
    (root / CPU / "cpu7/cpufreq").unlink()
    shutil.rmtree(root / CPU / "cpu6/cpuidle")
    f = by_id(audit(root)[1])
    for fid in ("cpu.governor", "cpu.min_freq", "cpu.epp"):
        assert f[fid]["status"] == "error", fid
        assert "7=cpufreq absent from this tree" in f[fid]["current"], fid
    assert f["cpu.cstates"]["status"] == "error"
    assert "cpuidle absent from this tree on 6" in f["cpu.cstates"]["current"]
    # what was read and is wrong still fails, with the unknown CPU named
    (root / CPU / "cpufreq/policy6/scaling_governor").write_text("powersave\n")
    g = by_id(audit(root)[1])["cpu.governor"]
    assert g["status"] == "fail" and "7=cpufreq absent" in g["current"]
    assert g["fix"] == "cpupower -c 6 frequency-set -g performance"


def test_unparsable_cstate_latency_is_not_within_budget(tree_copy):
    root = tree_copy(BM)
    for c in (5, 6, 7):
        (root / CPU / f"cpu{c}/cpuidle/state3/disable").write_text("0\n")  # C6 enabled
        (root / CPU / f"cpu{c}/cpuidle/state3/latency").write_text("n/a\n")
    f = by_id(audit(root)[1])["cpu.cstates"]
    assert f["status"] == "error"
    assert "None" not in f["current"]
    assert "C6 latency error: cannot parse" in f["current"] and "on 5-7" in f["current"]


def test_unreadable_node_cpulist_is_not_one_node(tree_copy):
    root = tree_copy(BM)
    replace_with_dir(root / "sys/devices/system/node/node2/cpulist")
    f = by_id(audit(root, "--cpus", "0-7")[1])["numa.target_nodes"]
    assert f["status"] == "error"  # was: ok, "node(s) 1" (node2's [] covered nothing)
    assert "4-7 on no readable node" in f["current"]
    # a node that cannot be read does not matter when every target CPU is on a read one
    f = by_id(audit(root, "--cpus", "0-3")[1])["numa.target_nodes"]
    assert f["status"] == "ok" and "node2: cpulist error" in f["current"]


def test_pcie_link_unknown_is_not_at_max(tree_copy):
    _, rep = audit(FIXTURES / BM)
    f = by_id(rep)["pcie.links"]
    # the empty hot-plug slot's link is down because nothing is there: named, not an error
    assert "1 empty slot with the link down: 0000:00:1c.4" in f["current"]
    root = tree_copy(BM)
    gpu = root / "sys/devices/pci0000:ae/0000:ae:00.0/0000:af:00.0"
    (gpu / "current_link_speed").write_text("Unknown\n")
    (gpu / "current_link_width").write_text("0\n")
    for d in root.glob("sys/devices/pci0000:d7/**/current_link_speed"):
        d.write_text("16.0 GT/s PCIe\n")  # no downtrained link left to warn about
    f = by_id(audit(root)[1])["pcie.links"]
    assert f["status"] == "error"
    assert "0000:af:00.0 gpu-3d link state unknown" in f["current"]
    assert "'Unknown'" in f["current"] and "all" not in f["current"].split()[0]
    assert by_id(audit(root)[1])["gpu.0.pcie_link"]["status"] != "ok"


def test_pcie_garbage_class_does_not_hide_the_other_devices(tree_copy):
    root = tree_copy(BM)
    (root / "sys/bus/pci/devices/0000:18:00.0/class").write_text("nonsense\n")
    devs = {d.address: d for d in pcie.pci_devices(Host(root))}
    assert devs["0000:18:00.0"].klass == "unknown" and "class" in devs["0000:18:00.0"].unreadable
    assert devs["0000:af:00.0"].klass == "gpu-3d"
    assert "pcie.check" not in by_id(audit(root)[1])


# -- defect 8: messages that state a guess as a fact ---------------------------------------

def test_file_missing_from_a_tree_is_absent_from_this_tree(tree_copy):
    root = tree_copy(BM)
    (root / "proc/sys/kernel/timer_migration").unlink()
    (root / "sys/kernel/mm/ksm/run").unlink()
    f = by_id(audit(root)[1])
    for fid in ("kernel.timer_migration", "kernel.ksm"):
        assert f[fid]["status"] == "unsupported"
        assert "absent from this tree" in f[fid]["current"], fid
        assert "does not offer" not in f[fid]["current"] and "without" not in f[fid]["current"]
    # the live wording is kept for the live kernel
    live = Host("/")
    assert why(live, "absent", "/proc/sys/kernel/x") == "absent"
    assert why(Host(root), "absent", "/proc/sys/kernel/x") == "absent from this tree"
    assert why(Host(root), "permission", "/proc/x") == "permission denied (retry as root)"


def test_garbage_sysctl_is_an_error_not_an_unsupported_kernel(tree_copy):
    root = tree_copy(BM)
    (root / "proc/sys/vm/swappiness").write_text("lots\n")
    f = by_id(audit(root)[1])["kernel.swappiness"]
    assert f["status"] == "error" and "cannot parse" in f["current"]


def test_irq_findings_with_the_same_cause_report_the_same_status(tree_copy):
    root = tree_copy(BM)
    shutil.rmtree(root / "proc/irq")
    f = by_id(audit(root)[1])
    a, d = f["irq.affinity"], f["irq.default_affinity"]
    assert a["status"] == d["status"] == "unsupported"  # was: error vs unsupported
    assert a["current"] == d["current"] == "unsupported: /proc/irq absent from this tree"


def test_unreadable_irq_affinity_is_not_ok(tree_copy):
    root = tree_copy(BM)
    replace_with_dir(root / "proc/irq/150/smp_affinity_list")
    f = by_id(audit(root)[1])["irq.affinity"]
    assert f["status"] == "error" and "1 unreadable" in f["current"] and "IRQ 150" in f["current"]


def test_smt_pairs_are_on_whatever_smt_control_says(tree_copy):
    root = tree_copy(BM)
    (root / CPU / "smt/control").write_text("notsupported\n")
    (root / CPU / "smt/active").unlink()
    f = by_id(audit(root)[1])["cpu.smt"]
    assert not f["current"].startswith("not supported")
    assert f["current"].startswith("on") and "13-15" in f["current"]
    assert f["status"] == "warn"


def test_isolcpus_from_sysfs_is_not_not_set(tree_copy):
    root = tree_copy(BM)
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/nvme0n1p2 ro\n")
    f = by_id(audit(root)[1])["isolation.isolcpus"]
    assert f["status"] == "ok"
    assert f["current"] == ("not on the kernel command line; /sys/devices/system/cpu/isolated "
                            "lists 5-7")
    assert "/sys/devices/system/cpu/isolated" in f["evidence"]


# -- defect 9: hybrid CPUs: each CPU's own maximum ---------------------------------------------

def test_min_freq_fix_uses_each_cpus_own_max():
    f = by_id(audit(FIXTURES / "synthetic-hybrid", "--cpus", "0-11")[1])["cpu.min_freq"]
    assert f["fix"] == ("cpupower -c 0-3 frequency-set -d 5000MHz; "
                        "cpupower -c 4-7 frequency-set -d 4900MHz; "
                        "cpupower -c 8-11 frequency-set -d 3600MHz")
    assert f["expected"] == ("cpuinfo_max_freq of each CPU (0-3=5000 MHz; 4-7=4900 MHz; "
                             "8-11=3600 MHz)")
    # the favoured core's floor was set to the others' maximum: only it is low
    g = by_id(audit(FIXTURES / BM)[1])["cpu.min_freq"]
    assert g["status"] == "warn" and g["fix"] == "cpupower -c 5 frequency-set -d 3900MHz"


def test_min_freq_fix_in_khz_when_the_max_is_not_whole_mhz(tree_copy):
    root = tree_copy("synthetic-hybrid")
    (root / CPU / "cpufreq/policy8/cpuinfo_max_freq").write_text("3600500\n")
    f = by_id(audit(root, "--cpus", "8")[1])["cpu.min_freq"]
    assert f["fix"] == "cpupower -c 8 frequency-set -d 3600500kHz"


# -- defect 10: a missing cpu/online ----------------------------------------------------------

def test_missing_online_file_derives_the_cpus(tree_copy):
    root = tree_copy(BM)
    (root / CPU / "online").unlink()
    (root / CPU / "cpu15/online").write_text("0\n")
    code, rep = audit(root)
    f = by_id(rep)
    assert rep["host"]["online_cpus"] == "0-14" and rep["target_cpus"] == "5-7"
    o = f["cpu.online"]
    assert o["status"] == "error" and code == 1
    assert "/sys/devices/system/cpu/online absent from this tree" in o["evidence"]
    assert "present" in o["evidence"] and "cpuN/online = 0 (15)" in o["evidence"]
    assert f["cpu.governor"]["status"] == "ok"  # the rest of the audit ran
    r = system.online_cpus(Host(root))
    assert r.value.cpus == list(range(15)) and r.value.reason == "absent"
    human = runner.invoke(get_app(), ["audit", "--root", str(root)]).output
    assert "online 0-14 (derived: see cpu.online)" in " ".join(human.split())


def test_online_cpus_from_the_cpu_dirs_alone(tree_copy):
    root = tree_copy(BM)
    for name in ("online", "present", "possible"):
        (root / CPU / name).unlink()
    r = system.online_cpus(Host(root))
    assert r.value.cpus == list(range(16)) and "cpuN directories" in r.value.derived


def test_nothing_to_derive_online_cpus_from_is_one_line(tree_copy):
    root = tree_copy(BM)
    for name in ("online", "present", "possible"):
        (root / CPU / name).unlink()
    for d in (root / CPU).glob("cpu[0-9]*"):
        shutil.rmtree(d)
    res = runner.invoke(get_app(), ["audit", "--root", str(root)])
    assert res.exit_code == 1 and "online CPUs" in res.output
    assert len(res.output.strip().splitlines()) == 1


# -- bare-metal realism ------------------------------------------------------------------------

def test_bmc_vga_is_not_a_numa_locality_problem():
    f = by_id(audit(FIXTURES / BM)[1])["pcie.numa_locality"]
    assert f["status"] == "ok" and "0000:01:00.0" not in f["current"]
    assert "0000:af:00.0 gpu-3d node 2" in f["current"]


@pytest.mark.parametrize("tree", [BM, "synthetic-hybrid"])
def test_no_check_is_ok_on_a_value_it_could_not_read(tree, tree_copy):
    """Every finding's data came from the tree: nothing on the pristine trees is an error."""
    _, rep = audit(FIXTURES / tree)
    assert rep["summary"]["error"] == 0
