"""Issue #25, "immovable IRQs", "'ok' without evidence" and "topology from captures of real
machines": each test reproduces one defect on a SYNTHETIC tree laid out as that machine lays
out /proc and /sys (tests/evidence_trees.py) and fails without its fix.

- A managed queue IRQ (virtio-blk, NVMe) is ``irq.managed`` ``unsupported`` with the boot
  argument that helps, not an ``irq.affinity`` fail with an ``echo`` the kernel refuses: an
  audit of an otherwise tuned box exits 0, also after ``tune apply`` met the EIO.
- ``virt.hypervisor`` names the hypervisor from s390's /proc/sysinfo, POWER's lparcfg and
  device tree, QEMU's virt machines, VirtualBox/VMware PCI IDs; with nothing to tell it is
  ``unsupported``, never "bare metal".
- ``irq.irqbalance`` and ``tuners.others`` without a process table are ``unsupported``.
- cpu/offline is honoured, NUMA nodes fall back to cpumap, the NUMA fixes never propose the
  housekeeping core, and a tree without /proc/stat makes ``virt.steal`` ``unsupported``.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors import irq as irqc
from collectors import system
from collectors.host import Host
from collectors.parsers import parse_cpulist
from tests import evidence_trees as trees
from tests.treecopy import KernelSim
from tuning.apply import UNCHANGEABLE, apply_plan, build_context, make_plan
from tuning.profiles import load_profile
from tuning.targets import housekeeping_core, resolve

runner = CliRunner()


def audit(root: Path, *args: str) -> tuple[int, dict[str, dict], dict]:
    res = runner.invoke(get_app(), ["audit", "--root", str(root), "--json", *args])
    assert res.exit_code in (0, 1, 2), res.output
    assert "Traceback" not in res.output
    rep = json.loads(res.stdout)
    found = {f["id"]: f for f in rep["findings"]}
    assert not [i for i in found if i.endswith(".check")], found  # no family broke
    return res.exit_code, found, rep


# -- immovable IRQs ----------------------------------------------------------------------------


def test_managed_virtio_queue_irq_is_unsupported_and_the_tuned_box_passes(tmp_path):
    root = trees.managed_irq(tmp_path / "t")
    code, f, _ = audit(root)
    assert code == 0, {k: v["status"] for k, v in f.items() if v["status"] not in ("ok",)}
    assert f["irq.affinity"]["status"] == "ok"
    assert "160" not in f["irq.affinity"]["fix"]
    m = f["irq.managed"]
    assert m["status"] == "unsupported" and m["fix"] == ""
    assert "160 (virtio2-req.0)" in m["current"] and "EIO" in m["current"]
    assert "isolcpus=managed_irq,domain,4-7" in m["current"]
    assert m["data"]["kernel_arg"] == "isolcpus=managed_irq,domain,4-7"
    assert "managed queue vector: virtio2-req.0 on PCI-MSIX-0000:00:07.0" in m["evidence"]


def test_managed_irq_flag_keeps_it_off_the_targets(tmp_path):
    """isolcpus=managed_irq (5.6+) runs a managed IRQ on a housekeeping CPU of its mask: the
    effective affinity shows it, so there is nothing to report."""
    root = trees.managed_irq(tmp_path / "t", managed_irq_flag=True, effective="1")
    code, f, _ = audit(root)
    assert code == 0
    assert "irq.managed" not in f
    assert f["irq.affinity"]["status"] == "ok"
    assert f["irq.affinity"]["data"]["kept_by_managed_irq"] == ["160 (virtio2-req.0)"]


def test_managed_irq_whose_mask_holds_only_targets_has_no_boot_argument(tmp_path):
    root = trees.managed_irq(tmp_path / "t", managed_irq_flag=True, affinity="5",
                             effective="5", name="nvme0q6", chip="IR-PCI-MSIX-0000:18:00.0")
    code, f, _ = audit(root)
    assert code == 0
    m = f["irq.managed"]
    assert m["status"] == "unsupported" and "no boot argument moves it" in m["current"]
    assert "kernel_arg" not in m["data"]


@pytest.mark.parametrize("name,chip", [
    ("virtio2-input.0", "PCI-MSIX-0000:00:07.0"),  # virtio-net: affinity hints, movable
    ("virtio2-config", "PCI-MSIX-0000:00:07.0"),   # the config vector is a pre_vector
    ("nvme0q0,nvme0q1", "PCI-MSI"),                # one vector for admin and I/O queue
    ("virtio2-req.0", "IO-APIC"),                  # not an MSI vector: nothing spread
])
def test_movable_irqs_still_fail_with_their_fix(tmp_path, name, chip):
    root = trees.managed_irq(tmp_path / "t", name=name, chip=chip)
    code, f, _ = audit(root)
    assert code == 2
    assert f["irq.affinity"]["status"] == "fail"
    assert "for i in 160;" in f["irq.affinity"]["fix"]
    assert "irq.managed" not in f


def test_debugfs_state_decides_over_names(tmp_path):
    """The kernel's own IRQD_* state (CONFIG_GENERIC_IRQ_DEBUGFS) marks a managed IRQ whose
    name is no known queue, and clears one whose name looks managed."""
    root = trees.managed_irq(tmp_path / "a", name="mpt3sas0-msix3",
                             chip="IR-PCI-MSIX-0000:3b:00.0",
                             debugfs="IRQD_ACTIVATED IRQD_IRQ_STARTED IRQD_AFFINITY_MANAGED")
    code, f, _ = audit(root)
    assert code == 0 and f["irq.managed"]["status"] == "unsupported"
    assert "IRQD_AFFINITY_MANAGED in /sys/kernel/debug/irq/irqs/160" in f["irq.managed"][
        "evidence"]
    root = trees.managed_irq(tmp_path / "b", debugfs="IRQD_ACTIVATED IRQD_IRQ_STARTED")
    code, f, _ = audit(root)
    assert code == 2 and "for i in 160;" in f["irq.affinity"]["fix"]


def test_after_tune_apply_meets_eio_the_audit_passes(tmp_path):
    """The issue's round trip: tune apply reports the managed IRQ unchangeable (EIO) and
    exits 0; the next audit must not fail on it."""
    root = trees.managed_irq(tmp_path / "t")
    ctx = build_context(Host(root), load_profile("hft-cpu"), None)
    ctx.writer = KernelSim(fail={"irq/160/smp_affinity_list": errno.EIO})
    plan = make_plan(ctx, only=["irq"])
    change = [c for it in plan.items for c in it.changes
              if c.target == "/proc/irq/160/smp_affinity_list"]
    assert change and "the kernel will likely refuse (EIO)" in change[0].detail
    rep = apply_plan(ctx, plan, ctx.host.run_dir("hftagent"))
    res = {o.change.target: o.result for o in rep.outcomes}
    assert res["/proc/irq/160/smp_affinity_list"] == UNCHANGEABLE and rep.ok
    assert (root / "proc/irq/160/smp_affinity_list").read_text() == "0-15\n"
    code, f, _ = audit(root)
    assert code == 0 and f["irq.managed"]["status"] == "unsupported"


def test_the_real_captures_name_their_managed_queue_irqs():
    """vm-dev and gpu-h200 (virtio-blk on PCI-MSIX, kernel 6.x): the queue vectors are the
    ones the issue saw refused."""
    from tests.conftest import FIXTURES
    got = {t: [a.irq for a in irqc.irq_affinities(Host(FIXTURES / t)) if a.managed]
           for t in ("vm-dev", "gpu-h200")}
    assert got == {"vm-dev": [36], "gpu-h200": [31, 33]}


def test_irq_parsers():
    text = ("handler:  handle_edge_irq\ndstate:   0x3160\n            IRQD_ACTIVATED\n"
            "            IRQD_AFFINITY_MANAGED\nnode:     0\n            IRQD_PER_CPU\n")
    assert irqc.debug_states(text) == {"IRQD_ACTIVATED", "IRQD_AFFINITY_MANAGED"}
    assert irqc.queue_vector("PCI-MSI", "nvme0q1")
    assert irqc.queue_vector("ITS-MSI", "virtio0-request")
    assert not irqc.queue_vector("PCI-MSI", "nvme0q0")
    assert not irqc.queue_vector("PCI-MSIX-0000:00:02.0", "virtio1-req.0,eth0")
    assert not irqc.queue_vector("PCI-MSI", "")
    assert irqc.isolcpus_flags("managed_irq,domain,2-7") == {"managed_irq", "domain"}
    assert irqc.isolcpus_flags("2-7") == set() and irqc.isolcpus_flags(None) == set()


# -- hypervisor detection ---------------------------------------------------------------------


def virt(root: Path) -> dict:
    return audit(root)[1]["virt.hypervisor"]


@pytest.mark.parametrize("layers,status,kind,shows", [
    ("lpar-shared", "warn", "lpar", "LPAR LP31 (CPUs dedicated 0, shared 4)"),
    ("lpar-dedicated", "ok", "lpar partition with dedicated CPUs", "dedicated 4, shared 0"),
    ("zvm", "warn", "zvm", "z/VM 7.3.0 on LPAR LP31"),
    ("kvm", "warn", "kvm", "KVM/Linux on LPAR LP31"),
    ("kvm-on-zvm", "warn", "kvm", "KVM/Linux on z/VM 7.3.0 on LPAR LP31"),
])
def test_s390_sysinfo_layers(tmp_path, layers, status, kind, shows):
    f = virt(trees.s390(tmp_path / "s", layers))
    assert (f["status"], f["current"]) == (status, kind)
    assert "/proc/sysinfo" in f["evidence"] and shows in f["evidence"]


@pytest.mark.parametrize("mode,status,current,shows", [
    ("powervm-shared", "warn", "powervm", "shared_processor_mode=1"),
    ("powervm-dedicated", "ok", "powervm partition with dedicated CPUs",
     "shared_processor_mode=0"),
    ("kvm", "warn", "kvm", "linux,kvm"),
    ("powernv", "ok", "bare metal", "ibm,opal"),
])
def test_power_partitions(tmp_path, mode, status, current, shows):
    f = virt(trees.power(tmp_path / "p", mode))
    assert (f["status"], f["current"]) == (status, current)
    assert shows in f["evidence"]


@pytest.mark.parametrize("build,evidence,status,current", [
    (trees.arm64, "dmi-metal", "ok", "bare metal"),
    (trees.arm64, "dmi-kvm", "warn", "kvm"),
    (trees.arm64, "dt-virt", "warn", "qemu"),
    (trees.arm64, "none", "unsupported", None),
    (trees.riscv, "dt-virt", "warn", "qemu"),
    (trees.riscv, "dt-board", "unsupported", None),
    (trees.riscv, "none", "unsupported", None),
])
def test_arm_and_riscv_say_nothing_without_evidence(tmp_path, build, evidence, status, current):
    f = virt(build(tmp_path / "a", evidence))
    assert f["status"] == status
    if current is not None:
        assert f["current"] == current
    else:
        assert f["current"].startswith("unsupported: nothing shows a hypervisor or bare metal")
        assert "bare metal" not in f["current"].removeprefix(
            "unsupported: nothing shows a hypervisor or bare metal")


@pytest.mark.parametrize("which,vendor", [("virtualbox", "0x80ee"), ("vmware", "0x15ad")])
def test_virtual_pci_device_shows_a_guest_without_the_cpuid_bit(tmp_path, which, vendor):
    f = virt(trees.pci_guest(tmp_path / "g", which))
    assert (f["status"], f["current"]) == ("warn", which)
    assert f"0000:00:04.0 vendor {vendor}" in f["evidence"]


def test_x86_tree_without_cpuinfo_is_unsupported_not_bare_metal(tmp_path):
    """No cpuinfo in the capture: the CPUID test cannot be made; DMI naming a server vendor
    is not enough on x86 (hypervisors can pass the host's SMBIOS through)."""
    root = trees.copy(trees.TUNED, tmp_path / "t")
    (root / "proc/cpuinfo").unlink()
    f = virt(root)
    assert f["status"] == "unsupported" and "CPUID test cannot be made" in f["current"]
    shutil.rmtree(root / "sys/class/dmi")
    f = virt(root)
    assert f["status"] == "unsupported" and "bare metal:" in f["current"]


def test_dmi_rules():
    from collectors.virt import parse_dmi
    assert parse_dmi({"sys_vendor": "Microsoft Corporation",
                      "product_name": "Virtual Machine"}).kind == "hyperv"
    surface = parse_dmi({"sys_vendor": "Microsoft Corporation", "product_name": "Surface Pro"})
    assert surface.kind is None and surface.metal
    metal = parse_dmi({"sys_vendor": "Amazon EC2", "product_name": "c7g.metal"})
    assert metal.kind is None and metal.metal
    assert parse_dmi({"sys_vendor": "Amazon EC2", "product_name": "c7g.large"}).kind == "kvm"
    assert parse_dmi({"sys_vendor": "innotek GmbH"}).kind == "virtualbox"


def test_every_architecture_tree_audits_without_a_broken_family(tmp_path):
    for i, root in enumerate([trees.s390(tmp_path / "s", "zvm"),
                              trees.power(tmp_path / "p", "powervm-shared"),
                              trees.arm64(tmp_path / "a", "none"),
                              trees.riscv(tmp_path / "r", "none")]):
        code, f, rep = audit(root)
        assert rep["target_cpus"] == "1-3", i
        assert f["virt.steal"]["status"] == "ok"


# -- process-based checks -----------------------------------------------------------------------


def test_no_process_table_is_unsupported(tmp_path):
    root = trees.no_processes(tmp_path / "t")
    _, f, _ = audit(root)
    assert f["irq.irqbalance"]["status"] == "unsupported"
    assert "no process table" in f["irq.irqbalance"]["current"]
    t = f["tuners.others"]
    assert t["status"] == "unsupported" and "running daemons unknown" in t["current"]
    assert "tuned profile throughput-performance" in t["current"]


def test_partial_process_table_cannot_say_not_running(tmp_path):
    root = trees.copy(trees.TUNED, tmp_path / "t")
    shutil.rmtree(root / "proc/1")  # hidepid= for another user hides PID 1 too
    _, f, _ = audit(root)
    assert f["irq.irqbalance"]["status"] == "error"
    assert "PID 1 is not in it" in f["irq.irqbalance"]["current"]
    assert f["tuners.others"]["status"] == "error"


def test_process_table_reading():
    from tests.conftest import FIXTURES
    t = system.process_table(Host(FIXTURES / "synthetic-2socket"))
    assert t.ok and t.value.partial is None and 640 in t.value.names


# -- topology ---------------------------------------------------------------------------------


def test_offline_cpus_are_never_targets(tmp_path):
    root = trees.offline_cpus(tmp_path / "t", [6, 7, 14, 15])
    plan = resolve(Host(root))
    assert plan.cpus == [4, 5] and not {6, 7, 14, 15} & set(plan.online)
    assert "cpu/offline (6-7,14-15)" in plan.notes[0]
    code, f, rep = audit(root)
    assert rep["target_cpus"] == "4-5"
    res = runner.invoke(get_app(), ["audit", "--root", str(root), "--cpus", "6"])
    assert res.exit_code == 1 and "6 not online" in res.output


def test_numa_nodes_from_cpumap(tmp_path):
    root = trees.cpumap_only(tmp_path / "t")
    nodes = {n: r.value for n, r in system.numa_node_cpulists(Host(root)).items()}
    assert nodes == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    _, f, _ = audit(root)
    n = f["numa.target_nodes"]
    assert n["status"] == "fail" and "node0: 0-3,8-11; node1: 4-7,12-15" in n["current"]
    from collectors.numa import nodes_of_cpus
    assert nodes_of_cpus(Host(root), [5]) == [1]


def _proposed(fix: str) -> list[int]:
    return parse_cpulist(re.search(r"--cpus (?:within one node, e\.g\. )?([0-9,-]+)",
                                   fix).group(1))


def test_numa_fixes_never_propose_the_housekeeping_core(tmp_path):
    from tests.conftest import FIXTURES
    host_core = set(housekeeping_core(Host(FIXTURES / "synthetic-2socket"), list(range(16))))
    assert host_core == {0, 8}
    _, f, _ = audit(FIXTURES / "synthetic-2socket", "--cpus", "2-5")  # straddles both nodes
    cpus = _proposed(f["numa.target_nodes"]["fix"])
    assert cpus and not set(cpus) & host_core and set(cpus) <= {1, 2, 3, 9, 10, 11}
    assert f"--physcpubind={f['numa.target_nodes']['fix'].split('e.g. ')[1].split(';')[0]}" \
        in f["numa.target_nodes"]["fix"]
    # the NIC on node 0, inference on node 1: the device's node less the housekeeping core
    root = trees.copy("synthetic-2socket", tmp_path / "t")
    (root / "sys/bus/pci/devices/0000:5e:00.0/numa_node").write_text("0\n")
    _, f, _ = audit(root, "--cpus", "4-7")
    p = f["pcie.numa_locality"]
    assert p["status"] == "fail"
    assert _proposed(p["fix"]) == [1, 2, 3, 9, 10, 11]


def test_missing_proc_stat_is_unsupported_and_a_missing_target_line_an_error(tmp_path):
    root = trees.copy(trees.TUNED, tmp_path / "t")
    (root / "proc/stat").unlink()
    _, f, _ = audit(root)
    s = f["virt.steal"]
    assert s["status"] == "unsupported" and "/proc/stat absent from this tree" in s["current"]
    root = trees.copy(trees.TUNED, tmp_path / "u")
    stat = root / "proc/stat"
    stat.write_text("".join(ln + "\n" for ln in stat.read_text().splitlines()
                            if not ln.startswith("cpu6 ")))
    _, f, _ = audit(root)
    s = f["virt.steal"]
    assert s["status"] == "error" and "CPU 6 not in /proc/stat" in s["current"]
