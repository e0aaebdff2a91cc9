"""Capture the /proc and /sys files the agent reads into a directory tree.

``hftagent capture --out DIR`` copies them so the same box can be audited later with
``hftagent audit --root DIR`` (bug reports, golden tests, comparing boxes). Only small,
readable regular files are copied; sysfs symlinks are followed into real directories;
write-only and unreadable files are skipped (listed in CAPTURE-SKIPPED). Process entries keep
only ``comm`` and ``status`` (no environment, no command lines: nothing secret leaves the box).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from collectors.host import Host

MAX_FILE = 1 << 20
MEMORY_BLOCK = re.compile(r"memory\d+")

# (relative path under procfs, recurse depth); depth 0 = the file itself.
PROC_ITEMS = [
    ("cmdline", 0), ("stat", 0), ("interrupts", 0), ("softirqs", 0), ("swaps", 0),
    ("meminfo", 0), ("vmstat", 0), ("cpuinfo", 0), ("version", 0), ("loadavg", 0),
    ("pressure", 1), ("sys/kernel", 1), ("sys/vm", 1), ("sys/kernel/random/boot_id", 0),
    ("irq", 2), ("driver/nvidia/version", 0), ("driver/nvidia/gpus", 2),
]
SYS_ITEMS = [
    ("devices/system/cpu", 4), ("devices/system/node", 2), ("devices/system/clocksource", 2),
    ("kernel/mm/transparent_hugepage", 1), ("kernel/mm/ksm", 1), ("hypervisor", 1),
    ("class/dmi/id", 1), ("bus/pci/devices", 2),
]
# /sys/bus/pci/devices/*: only these attributes (config space and resources are big and binary)
PCI_ATTRS = {"class", "vendor", "device", "subsystem_vendor", "subsystem_device",
             "current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
             "numa_node", "local_cpulist", "aer_dev_correctable", "aer_dev_nonfatal",
             "aer_dev_fatal", "enable", "irq"}
SKIP_NAMES = {"uevent", "modalias", "subsystem", "driver", "firmware_node", "power", "of_node",
              "config", "resource", "rom", "remove", "rescan", "reset", "iommu", "iommu_group",
              "msi_bus", "msi_irqs", "consumer", "supplier", "hotplug", "cpuidle_driver"}


def _copy_file(src: Path, dst: Path, skipped: list[str]) -> None:
    try:
        st = src.stat()
        if not os.access(src, os.R_OK) or not (st.st_mode & 0o444):
            skipped.append(f"{src} (not readable)")
            return
        with open(src, "rb") as fh:
            data = fh.read(MAX_FILE)
    except OSError as exc:
        skipped.append(f"{src} ({exc.strerror})")
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)


def _walk(src: Path, dst: Path, depth: int, skipped: list[str], only: set[str] | None = None,
          seen: set[str] | None = None, follow_links: bool = False) -> None:
    seen = set() if seen is None else seen
    try:
        real = os.path.realpath(src)
    except OSError:
        return
    if src.is_dir():
        if real in seen or depth < 0:
            return
        seen.add(real)
        try:
            names = sorted(os.listdir(src))
        except OSError as exc:
            skipped.append(f"{src} ({exc.strerror})")
            return
        dst.mkdir(parents=True, exist_ok=True)
        for n in names:
            if n in SKIP_NAMES:
                continue
            child = src / n
            if only is not None and child.is_file() and n not in only:
                continue
            if child.is_dir():
                # Follow directory symlinks only where the layout is made of them
                # (/sys/bus/pci/devices/*); elsewhere they lead into huge unrelated trees
                # (cpuN/node0 -> the node's memory blocks).
                if depth > 0 and (follow_links or not child.is_symlink()) \
                        and not MEMORY_BLOCK.fullmatch(n):
                    _walk(child, dst / n, depth - 1, skipped, only, seen)
            elif child.is_file():
                _copy_file(child, dst / n, skipped)
    elif src.is_file():
        _copy_file(src, dst, skipped)


def capture(host: Host, out: Path) -> list[str]:
    """Copy the host's relevant files under ``out/proc`` and ``out/sys``; return skipped."""
    skipped: list[str] = []
    for rel, depth in PROC_ITEMS:
        _walk(host.proc(rel), out / "proc" / rel, depth, skipped)
    for rel, depth in SYS_ITEMS:
        only = PCI_ATTRS if rel == "bus/pci/devices" else None
        _walk(host.sys(rel), out / "sys" / rel, depth, skipped, only,
              follow_links=rel == "bus/pci/devices")
    for pid in host.pids():
        for name in ("comm", "status"):
            _copy_file(host.proc(pid, name), out / "proc" / str(pid) / name, [])
    tuned = host.etc("tuned", "active_profile")
    if tuned.is_file():
        _copy_file(tuned, out / "etc/tuned/active_profile", skipped)
    (out / "CAPTURE-SKIPPED").write_text("\n".join(skipped) + ("\n" if skipped else ""))
    return skipped
