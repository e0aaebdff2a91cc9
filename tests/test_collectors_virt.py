"""When no source can tell a guest from bare metal (collectors/virt.py: ``known`` False), the
audit header, its JSON and the host fingerprint say "unknown", never "none" (bare metal):
issue #28."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.cli import get_app
from agent.gate import fingerprint
from collectors.host import Host
from collectors.system import virtualization
from tests.conftest import FIXTURES

runner = CliRunner()


def _unknown_host(tmp_path) -> tuple[str, str]:
    """A tuned bare-metal-shaped tree whose procfs has an unreadable cpuinfo: the CPUID test
    cannot be made and DMI alone is not enough (collectors/virt.py)."""
    (tmp_path / "proc/cpuinfo").mkdir(parents=True)
    return str(FIXTURES / "synthetic-tuned"), str(tmp_path / "proc")


def test_the_tree_is_unknown_and_the_untouched_one_is_bare_metal(tmp_path):
    root, procfs = _unknown_host(tmp_path)
    assert not virtualization(Host(root, procfs=procfs)).known
    v = virtualization(Host(root))
    assert v.known and v.kind is None


def test_audit_header_and_json_say_unknown(tmp_path):
    root, procfs = _unknown_host(tmp_path)
    res = runner.invoke(get_app(), ["audit", "--root", root, "--procfs", procfs, "--json"])
    assert json.loads(res.stdout)["host"]["virtualization"] == "unknown"
    res = runner.invoke(get_app(), ["audit", "--root", root, "--procfs", procfs],
                        env={"COLUMNS": "200"})
    header = res.stdout.splitlines()[1]
    assert "virt unknown" in header and "virt none" not in header
    res = runner.invoke(get_app(), ["audit", "--root", root], env={"COLUMNS": "200"})
    assert "virt none" in res.stdout.splitlines()[1]  # bare metal shown by CPUID stays none


def test_fingerprint_says_unknown(tmp_path):
    root, procfs = _unknown_host(tmp_path)
    assert fingerprint.collect(Host(root, procfs=procfs))["virtualization"] == "unknown"
    assert fingerprint.collect(Host(root))["virtualization"] == "none"


def _vbox_tree(tmp_path, devices: dict[str, tuple[str, str]], *, sysfs_pci: bool = True):
    """A bare-metal-shaped tree (CPUID's hypervisor bit clear, a board vendor's DMI) whose PCI
    bus has ``devices`` {addr: (vendor, device)}: a VirtualBox guest configured to hide the
    CPUID bit and pass the host's SMBIOS through (issue #39)."""
    import shutil
    root = tmp_path / "t"
    shutil.copytree(FIXTURES / "synthetic-baremetal", root, symlinks=True)
    proc_lines = []
    for i, (addr, (vendor, device)) in enumerate(sorted(devices.items())):
        if sysfs_pci:
            d = root / "sys/devices/pci0000:00" / addr
            d.mkdir(parents=True)
            (d / "vendor").write_text(vendor + "\n")
            (d / "device").write_text(device + "\n")
            (root / "sys/bus/pci/devices" / addr).symlink_to(
                f"../../../devices/pci0000:00/{addr}")
        proc_lines.append(f"{i * 8:04x}\t{vendor[2:]}{device[2:]}\t0\t0")
    if not sysfs_pci:
        shutil.rmtree(root / "sys/bus/pci")
    (root / "proc/bus/pci").mkdir(parents=True, exist_ok=True)
    (root / "proc/bus/pci/devices").write_text("\n".join(proc_lines) + "\n")
    return Host(str(root))


def test_virtualbox_with_the_cpuid_bit_clear_is_named_from_its_pci_device(tmp_path):
    # VirtualBox 6+ gives its guests VMware's SVGA adapter (0x15ad:0x0405) on 00:02.0, before
    # its own guest service device (0x80ee:0xcafe): the vendor's own device names it
    host = _vbox_tree(tmp_path, {"0000:00:02.0": ("0x15ad", "0x0405"),
                                 "0000:00:04.0": ("0x80ee", "0xcafe")})
    v = virtualization(host)
    assert v.kind == "virtualbox" and "0x80ee" in v.evidence


def test_pci_ids_from_proc_when_sysfs_shows_no_bus(tmp_path):
    # lscpu's source: /proc/bus/pci/devices, "vendor+device" as 8 hex digits
    host = _vbox_tree(tmp_path, {"0000:00:04.0": ("0x80ee", "0xcafe")}, sysfs_pci=False)
    v = virtualization(host)
    assert v.kind == "virtualbox" and "bus/pci/devices" in v.evidence


def test_a_real_board_with_no_virtual_device_stays_bare_metal(tmp_path):
    host = _vbox_tree(tmp_path, {"0000:00:1f.0": ("0x8086", "0xa382")})
    v = virtualization(host)
    assert v.known and v.kind is None


def test_parse_proc_pci():
    from collectors.virt import parse_proc_pci
    text = "0000\t80860d57\t0\t0\n0008\t1af41045\t0\t4000000004\tvirtio-pci\nbad line\n"
    assert parse_proc_pci(text) == [("0x8086", "0x0d57"), ("0x1af4", "0x1045")]
