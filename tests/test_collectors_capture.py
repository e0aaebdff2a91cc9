"""capture copies a file whole or not at all (issue #28): /proc/interrupts of a 256-CPU box
(~2.8 MB) was cut at 1 MiB without a word. Files are now read up to the Host's bound for
them (collectors/host.py ``Host.limit_for``: 64 MiB for interrupts and the like, 4 MiB for
the rest); a file over it is listed in CAPTURE-SKIPPED and left out, never cut."""

from __future__ import annotations

import os

from collectors.capture import capture_result
from collectors.host import LARGE_READ_LIMIT, READ_LIMIT, Host


def _interrupts(cpus: int, irqs: int) -> bytes:
    """A /proc/interrupts in the kernel's layout (show_interrupts(): a header of CPU names,
    one line per IRQ with a 10-wide count per CPU, then the chip and the name)."""
    head = " " * 11 + "".join(f"CPU{c:<7d}" for c in range(cpus)) + "\n"
    lines = [head]
    for i in range(irqs):
        counts = "".join(f"{(i * 7 + c) % 100000:10d} " for c in range(cpus))
        lines.append(f"{i:4d}: {counts} PCI-MSIX-0000:17:00.0 {i}-edge mlx5_comp{i}\n")
    return "".join(lines).encode()


def _skipped(out) -> str:
    return (out / "CAPTURE-SKIPPED").read_text()


def test_a_256_cpu_interrupts_file_is_captured_whole(tree_copy, tmp_path):
    root = tree_copy("synthetic-2socket")
    big = _interrupts(256, 1000)
    assert 2_500_000 < len(big) < LARGE_READ_LIMIT
    (root / "proc/interrupts").write_bytes(big)
    out = tmp_path / "cap"
    out.mkdir()
    capture_result(Host(root), out)
    assert (out / "proc/interrupts").read_bytes() == big
    assert "interrupts" not in _skipped(out)


def test_a_file_over_its_bound_is_listed_not_cut(tree_copy, tmp_path):
    root = tree_copy("synthetic-2socket")
    # a sysfs attribute over the 4 MiB bound (read whole), and a sparse /proc/cpuinfo over
    # 64 MiB (refused on its size before a byte is read)
    attr = root / "sys/devices/system/cpu/big_attribute"
    attr.write_bytes(b"x" * (READ_LIMIT + 1))
    with open(root / "proc/cpuinfo", "r+b") as fh:
        fh.truncate(LARGE_READ_LIMIT + 1)
    out = tmp_path / "cap"
    out.mkdir()
    res = capture_result(Host(root), out)
    assert not (out / "sys/devices/system/cpu/big_attribute").exists()
    assert not (out / "proc/cpuinfo").exists()
    skipped = _skipped(out)
    assert (f"/sys/devices/system/cpu/big_attribute (too large ({READ_LIMIT + 1:,} bytes > "
            f"{READ_LIMIT:,}), not captured)") in skipped.splitlines()
    assert (f"/proc/cpuinfo (too large ({LARGE_READ_LIMIT + 1:,} bytes > "
            f"{LARGE_READ_LIMIT:,}), not captured)") in skipped.splitlines()
    assert len(res.skipped) == len(skipped.splitlines())
    assert os.path.getsize(root / "proc/cpuinfo") == LARGE_READ_LIMIT + 1  # the source untouched
