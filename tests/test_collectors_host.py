"""Host model: path resolution under a root, readings with reasons, never 0 for missing."""

from __future__ import annotations

import shutil

import pytest

from collectors import cpu as cpuc
from collectors import kernel, pcie, system
from collectors.host import ABSENT, Host, HostError
from tests.conftest import FIXTURES


def test_bad_roots():
    with pytest.raises(HostError):
        Host("/nonexistent-root")
    with pytest.raises(HostError):
        Host(FIXTURES / "vm-dev", procfs="/nonexistent-proc")


def test_paths_resolve_under_root_and_overrides(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()
    h = Host(FIXTURES / "vm-dev", procfs=tmp_path / "p", sysfs=tmp_path / "s")
    assert h.proc("irq", 5) == tmp_path / "p" / "irq" / "5"
    assert h.sys("devices/system/cpu") == tmp_path / "s" / "devices/system/cpu"
    assert not h.live


def test_missing_is_none_with_reason_and_display_path():
    h = Host(FIXTURES / "vm-dev")
    r = h.read_int(h.sys("devices/system/cpu/cpu0/cpufreq/scaling_min_freq"))
    assert r.value is None and r.reason == ABSENT
    assert r.path == "/sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq"


def test_garbage_is_error_not_zero(tree_copy):
    root = tree_copy("synthetic-2socket")
    (root / "proc/sys/vm/swappiness").write_text("lots\n")
    r = kernel.sysctl_int(Host(root), "vm.swappiness")
    assert r.value is None and r.reason.startswith("error")


def test_readers_on_synthetic_tree():
    h = Host(FIXTURES / "synthetic-2socket")
    assert cpuc.online_cpus(h).value == list(range(16))
    assert cpuc.isolated_cpus(h) == [2, 3, 4, 5, 6, 7]
    f = cpuc.cpufreq(h, 4)
    assert f.governor == "powersave" and f.min_hz == 800_000_000 and f.cpuinfo_max_hz == 3_900_000_000
    states = cpuc.cpuidle_states(h, 2)
    assert [(s.name, s.latency_us) for s in states][-1] == ("C6", 133)
    assert cpuc.turbo(h).enabled is True
    assert system.numa_nodes(h) == {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    gpu = [d for d in pcie.pci_devices(h) if d.klass == "gpu-3d"][0]
    assert gpu.width_degraded and gpu.cur_gen == 3 and gpu.max_gen == 5 and gpu.numa_node == 1
    assert system.find_processes(h, {"irqbalance"}) == {"irqbalance": [640]}


def test_vm_capture_has_no_cpufreq():
    h = Host(FIXTURES / "vm-dev")
    assert cpuc.cpufreq(h, 0) is None
    assert system.virtualization(h).kind == "firecracker"


def test_bus_id_normalisation():
    assert pcie.normalize_bus_id("00000000:00:06.0") == "0000:00:06.0"
    assert pcie.normalize_bus_id("0000:3B:00.0") == "0000:3b:00.0"
    assert pcie.normalize_bus_id("3b:00.0") == "0000:3b:00.0"


def test_hot_file_pread(tmp_path):
    p = tmp_path / "f"
    p.write_text("1 2 3\n")
    h = Host(FIXTURES / "vm-dev")
    hf = h.open_hot(p)
    assert hf.read() == b"1 2 3\n"
    p.write_text("4 5 6\n")  # same inode, rewritten: pread sees the new content
    assert hf.read() == b"4 5 6\n"
    hf.close()


def test_hot_file_open_failure_raises_cleanly(tmp_path):
    import gc
    import warnings

    h = Host(FIXTURES / "vm-dev")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FileNotFoundError):
            h.open_hot(tmp_path / "missing")
        gc.collect()  # the half-built HotFile's __del__ must not raise


def test_numa_node_ids_need_not_start_at_0(tree_copy):
    h = Host(FIXTURES / "synthetic-baremetal")
    r = system.numa_node_cpulists(h)
    assert sorted(r) == [1, 2] and r[2].value == [4, 5, 6, 7, 12, 13, 14, 15]
    root = tree_copy("synthetic-baremetal")
    (root / "sys/devices/system/node/node2/cpulist").write_text("x\n")
    r = system.numa_node_cpulists(Host(root))
    assert r[2].value is None and r[2].reason.startswith("error")
    assert system.numa_nodes(Host(root))[2] == []  # the old view, for the launcher


def test_cpufreq_through_the_policy_link_with_reasons(tree_copy):
    h = Host(FIXTURES / "synthetic-baremetal")
    assert cpuc.cpufreq(h, 5).cpuinfo_max_hz == 3_900_000_000
    assert cpuc.cpufreq(h, 6).cpuinfo_max_hz == 3_700_000_000
    root = tree_copy("synthetic-baremetal")
    (root / "sys/devices/system/cpu/cpufreq/policy6/cpuinfo_max_freq").unlink()
    f = cpuc.cpufreq(Host(root), 6)
    assert f.cpuinfo_max_hz is None and f.reasons["cpuinfo_max_hz"] == ABSENT


def test_pci_bridges_behind_links_and_empty_slots(tree_copy):
    devs = {d.address: d for d in pcie.pci_devices(Host(FIXTURES / "synthetic-baremetal"))}
    assert devs["0000:00:1c.4"].empty_bridge is True and devs["0000:00:1c.4"].link_unknown
    assert devs["0000:d8:00.0"].empty_bridge is False  # the NIC is two bridges below
    assert devs["0000:af:00.0"].numa_node == 2 and devs["0000:af:00.0"].cur_gen == 5
    # without the bus numbers the tree's hierarchy still tells
    root = tree_copy("synthetic-baremetal")
    for p in root.glob("sys/devices/pci*/**/s*_bus_number"):
        p.unlink()
    devs = {d.address: d for d in pcie.pci_devices(Host(root))}
    assert devs["0000:00:1c.4"].empty_bridge is True
    assert devs["0000:ae:00.0"].empty_bridge is False
    # a flat tree without bus numbers cannot tell: unknown, so the link is an error
    flat = {d.address: d for d in pcie.pci_devices(Host(FIXTURES / "synthetic-2socket"))}
    assert all(d.empty_bridge is None for d in flat.values())


def test_online_cpus_live_and_in_trees():
    r = system.online_cpus(Host("/"))
    assert r.ok and r.value.derived is None and r.value.cpus
    assert system.online_cpus(Host(FIXTURES / "vm-dev")).value.cpus == [0, 1]


def test_cpu_online_cpus_is_derived_where_a_capture_lacks_cpu_online(tree_copy):
    """Defect: collectors.cpu.online_cpus read only cpu/online, so watch, tune, run and the
    CPU collector stopped on a capture without it while audit derived the CPUs."""
    root = tree_copy("synthetic-baremetal")
    (root / "sys/devices/system/cpu/online").unlink()
    (root / "sys/devices/system/cpu/cpu15/online").write_text("0\n")
    h = Host(root)
    r = cpuc.online_cpus(h)
    assert r.ok and r.value == list(range(15)) == system.online_cpus(h).value.cpus
    for name in ("present", "possible"):
        (root / "sys/devices/system/cpu" / name).unlink()
    for n in range(16):
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{n}")
    r = cpuc.online_cpus(Host(root))  # nothing left to say which CPUs exist
    assert r.value is None and r.reason == "absent"
