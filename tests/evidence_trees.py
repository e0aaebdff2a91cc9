"""SYNTHETIC trees laid out as other machines lay them out, for the rule that an audit says
nothing is fine without evidence (tests/test_audit_evidence.py). Not captures of real machines.

Each builder writes a tree under ``dst`` and returns it. Those made from a fixture start from
a copy of it (synthetic-tuned: a box that passes hft-cpu, so one change shows alone) and
change what the case needs; the architecture trees are small and written whole, with the
files those kernels really have (formats from the kernel sources named at each one):

- :func:`managed_irq`: a managed virtio-blk (or NVMe) queue IRQ on an otherwise tuned box;
- :func:`s390`: /proc/sysinfo of an LPAR, a z/VM guest, a KVM guest (arch/s390/kernel/sysinfo.c);
- :func:`power`: a PowerVM LPAR (shared or dedicated), a KVM pseries guest, a PowerNV host
  (/proc/powerpc/lparcfg, the device tree);
- :func:`arm64`, :func:`riscv`: no x86 flags; DMI, a device tree, or nothing to tell;
- :func:`pci_guest`: an x86 guest that hides the CPUID hypervisor bit, known by a virtual
  PCI device (VirtualBox 0x80ee, VMware 0x15ad);
- :func:`no_processes`, :func:`cpumap_only`, :func:`offline_cpus`: a capture without a
  process table, NUMA nodes with only ``cpumap``, CPUs listed in cpu/offline.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from collectors.parsers import format_cpulist, format_cpumask, parse_cpulist
from tests.conftest import FIXTURES

TUNED = "synthetic-tuned"
CPU = "sys/devices/system/cpu"


def w(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n")


def copy(name: str, dst: Path) -> Path:
    shutil.copytree(FIXTURES / name, dst, symlinks=True)
    (dst / "SYNTHETIC").write_text(f"synthetic tree built by tests/evidence_trees.py from "
                                   f"tests/fixtures/{name}; not a capture\n")
    return dst


# -- IRQs ----------------------------------------------------------------------------------------


def add_irq(root: Path, irq: int, name: str, chip: str, hwirq: str, affinity: str,
            effective: str, fired_on: int | None = None) -> None:
    """One more line in /proc/interrupts (a count per CPU column, then the chip, hwirq and
    action as x86's show_interrupts prints them) and its /proc/irq/N directory."""
    path = root / "proc/interrupts"
    lines = path.read_text().rstrip("\n").split("\n")
    ncpu = len(lines[0].split())
    counts = "".join(f"{(1234 if c == fired_on else 0):>11}" for c in range(ncpu))
    lines.append(f"{irq:>4}:{counts}  {chip}  {hwirq}  {name}")
    path.write_text("\n".join(lines) + "\n")
    d = f"proc/irq/{irq}"
    w(root, f"{d}/smp_affinity_list", affinity)
    w(root, f"{d}/effective_affinity_list", effective)


def managed_irq(dst: Path, *, managed_irq_flag: bool = False, affinity: str = "0-15",
                effective: str = "5", name: str = "virtio2-req.0",
                chip: str = "PCI-MSIX-0000:00:07.0", debugfs: str | None = None) -> Path:
    """synthetic-tuned with one more IRQ: by default virtio-blk's request queue 0 of a
    device at 0000:00:07.0 (the vector the kernel spread over CPUs 0-15, running on CPU 5, a
    target), booted without ``managed_irq`` in isolcpus. ``debugfs``: the dstate lines of
    /sys/kernel/debug/irq/irqs/160 (kernel/irq/debugfs.c), e.g. "IRQD_AFFINITY_MANAGED"."""
    root = copy(TUNED, dst)
    add_irq(root, 160, name, chip, "1-edge", affinity, effective, fired_on=5)
    if not managed_irq_flag:
        cl = (root / "proc/cmdline").read_text().replace("isolcpus=managed_irq,domain,",
                                                         "isolcpus=domain,")
        (root / "proc/cmdline").write_text(cl)
    if debugfs is not None:
        states = "".join(f"            {s}\n" for s in debugfs.split())
        w(root, "sys/kernel/debug/irq/irqs/160",
          "handler:  handle_edge_irq\ndevice:   0000:00:07.0\nstatus:   0x00004000\n"
          "istate:   0x00000000\nddepth:   0\nwdepth:   0\ndstate:   0x31600200\n"
          f"{states}node:     0\naffinity: {affinity}\neffectiv: {effective}\n"
          "domain:  PCI-MSIX-0000:00:07.0-12\n")
        for other in (0, 120, 121, 122, 123, 124, 125, 126, 127, 130, 131):
            w(root, f"sys/kernel/debug/irq/irqs/{other}",
              "handler:  handle_edge_irq\ndstate:   0x00400000\n            IRQD_ACTIVATED\n"
              "node:     0\n")
    return root


# -- a small tree of another architecture ---------------------------------------------------------


def small(dst: Path, ncpu: int, cpuinfo: str, *, kernel: str, cmdline: str,
          interrupts: str | None = None) -> Path:
    """The files every kernel has that the audit reads: the CPU lists and cpuN directories,
    /proc/stat, cmdline, osrelease, PID 1, /proc/irq. No cpufreq, no cpuidle, no DMI, no NUMA
    directory: each architecture builder adds what its kernels show."""
    dst.mkdir(parents=True)
    w(dst, "SYNTHETIC", "synthetic tree built by tests/evidence_trees.py; not a capture")
    allc = f"0-{ncpu - 1}"
    for name in ("online", "present", "possible"):
        w(dst, f"{CPU}/{name}", allc)
    for c in range(ncpu):
        w(dst, f"{CPU}/cpu{c}/topology/thread_siblings_list", str(c))
        w(dst, f"{CPU}/cpu{c}/topology/core_id", str(c))
    w(dst, "proc/cpuinfo", cpuinfo)
    stat = ["cpu  " + " ".join(["400"] * 10)]
    stat += [f"cpu{c} 100 0 50 10000 5 1 2 0 0 0" for c in range(ncpu)]
    w(dst, "proc/stat", "\n".join(stat + ["ctxt 123456", "btime 1764000000",
                                          "processes 4321", "procs_running 1",
                                          "procs_blocked 0"]))
    w(dst, "proc/cmdline", cmdline)
    w(dst, "proc/sys/kernel/osrelease", kernel)
    w(dst, "proc/1/comm", "systemd")
    w(dst, "proc/1/status", "Name:\tsystemd\nPid:\t1\nCpus_allowed_list:\t" + allc)
    w(dst, "proc/irq/default_smp_affinity", format_cpumask(range(ncpu)).lstrip("0") or "0")
    header = "".join(f"{'CPU' + str(c):>11}" for c in range(ncpu))
    w(dst, "proc/interrupts", header + "\n" + (interrupts or ""))
    return dst


def _dt(root: Path, props: dict[str, str]) -> None:
    """A device tree under /sys/firmware/devicetree/base, /proc/device-tree linking to it as
    on a running kernel (fs/proc/root.c proc_symlink("device-tree", ...)); string
    properties are NUL-terminated."""
    base = "sys/firmware/devicetree/base"
    for rel, value in props.items():
        p = root / base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(value.encode() + b"\0" if value else b"")
    os.symlink("../sys/firmware/devicetree/base", root / "proc/device-tree")


S390_CPUINFO = """vendor_id       : IBM/S390
# processors    : 4
bogomips per cpu: 3241.00
max thread id   : 0
features\t: esan3 zarch stfle msa ldisp eimm dfp edat etf3eh highgprs te vx vxd vxe gs sie
facilities      : 0 1 2 3 4 6 7 8 9 10 12 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28
cache0          : level=1 type=Data scope=Private size=128K line_size=256 associativity=8
processor 0: version = FF,  identification = 0133E8,  machine = 8561
processor 1: version = FF,  identification = 0133E8,  machine = 8561
processor 2: version = FF,  identification = 0133E8,  machine = 8561
processor 3: version = FF,  identification = 0133E8,  machine = 8561

cpu number      : 0
physical id     : 0
core id         : 0
book id         : 0
drawer id       : 0
dedicated       : 0
address         : 0
siblings        : 1
cpu cores       : 1
version         : FF
identification  : 0133E8
machine         : 8561
"""

S390_MACHINE = """Manufacturer:         IBM
Type:                 8561
Model:                703              T01
Sequence Code:        00000000000A1B2C
Plant:                02
Model Capacity:       703              00000000
Capacity Adj. Ind.:   100
Capacity Ch. Reason:  0
Capacity Transient:   0
Type 1 Percentage:    0
Type 2 Percentage:    0
Type 3 Percentage:    0
Type 4 Percentage:    0
Type 5 Percentage:    0

CPUs Total:           190
CPUs Configured:      0
CPUs Standby:         0
CPUs Reserved:        190
CPUs G-MTID:          0
CPUs S-MTID:          1
Capability:           3085
Nominal Capability:   3085
Secondary Capability: 416
Adjustment 02-way:    62750
Adjustment 03-way:    61302

"""


def _s390_lpar(dedicated: int, shared: int) -> str:
    return (f"LPAR Number:          31\nLPAR Characteristics: "
            f"{'Dedicated' if dedicated else 'Shared'}\nLPAR Name:            LP31\n"
            f"LPAR Adjustment:      250\nLPAR CPUs Total:      8\n"
            f"LPAR CPUs Configured: 4\nLPAR CPUs Standby:    4\nLPAR CPUs Reserved:   0\n"
            f"LPAR CPUs Dedicated:  {dedicated}\nLPAR CPUs Shared:     {shared}\n"
            f"LPAR CPUs G-MTID:     0\nLPAR CPUs S-MTID:     1\nLPAR CPUs PS-MTID:    1\n")


def _s390_vm(level: int, name: str, program: str) -> str:
    n = f"VM{level:02d}"
    return (f"\n{n} Name:            {name}\n{n} Control Program: {program}\n"
            f"{n} Adjustment:      83\n{n} CPUs Total:      4\n{n} CPUs Configured: 4\n"
            f"{n} CPUs Standby:    0\n{n} CPUs Reserved:   0\n")


def s390(dst: Path, layers: str) -> Path:
    """An s390x guest. ``layers``: "lpar-shared", "lpar-dedicated" (Linux in an LPAR),
    "zvm" (a z/VM 7.3 guest in a shared LPAR), "kvm" (a KVM guest, its host in an LPAR),
    "kvm-on-zvm" (KVM nested in a z/VM guest). /proc/sysinfo as arch/s390/kernel/sysinfo.c
    prints it: the machine (stsi 1.1.1), the LPAR (2.2.2), then one block per VM level
    (3.2.2), VM00 the innermost."""
    root = small(dst, 4, S390_CPUINFO, kernel="6.8.0-40-generic",
                 cmdline="root=/dev/disk/by-path/ccw-0.0.0100-part1 crashkernel=196M",
                 interrupts="EXT:        100        200        300        400\n"
                            "I/O:         10         20         30         40\n")
    info = S390_MACHINE + _s390_lpar(4 if layers == "lpar-dedicated" else 0,
                                     0 if layers == "lpar-dedicated" else 4)
    if layers == "zvm":
        info += _s390_vm(0, "LINUX01", "z/VM    7.3.0")
    elif layers == "kvm":
        info += _s390_vm(0, "guest1", "KVM/Linux")
    elif layers == "kvm-on-zvm":
        info += _s390_vm(0, "guest1", "KVM/Linux") + _s390_vm(1, "LINUX01", "z/VM    7.3.0")
    w(root, "proc/sysinfo", info)
    return root


POWER_CPUINFO = "".join(
    f"processor\t: {c}\ncpu\t\t: POWER9 (architected), altivec supported\n"
    "clock\t\t: 2750.000000MHz\nrevision\t: 2.2 (pvr 004e 0202)\n\n" for c in range(4)) + (
    "timebase\t: 512000000\nplatform\t: {platform}\nmodel\t\t: {model}\n"
    "machine\t\t: {machine}\nMMU\t\t: Radix\n")


def power(dst: Path, mode: str) -> Path:
    """A POWER9 box. ``mode``: "powervm-shared", "powervm-dedicated" (a PowerVM LPAR),
    "kvm" (a pseries guest under KVM: QEMU's spapr adds the device tree's /hypervisor node),
    "powernv" (the host itself: OPAL firmware, no partition)."""
    nv = mode == "powernv"
    model = "IBM,9009-42A" if mode != "kvm" else "IBM pSeries (emulated by qemu)"
    cpuinfo = POWER_CPUINFO.format(
        platform="PowerNV" if nv else "pSeries", model="9006-22P" if nv else model,
        machine="PowerNV 9006-22P" if nv else f"CHRP {model}")
    root = small(dst, 4, cpuinfo, kernel="6.8.0-40-generic",
                 cmdline="BOOT_IMAGE=/vmlinux-6.8.0 root=/dev/sda2 ro quiet",
                 interrupts="LOC:       1000       1000       1000       1000   Local timer "
                            "interrupts for timer event device\n")
    if nv:
        _dt(root, {"compatible": "ibm,powernv", "model": "9006-22P",
                   "ibm,opal/compatible": "ibm,opal-v3"})
        return root
    props = {"compatible": "qemu,pseries" if mode == "kvm" else "IBM,9009-42A",
             "ibm,partition-name": "lpar5" if mode != "kvm" else "guest1"}
    if mode == "kvm":
        props["hypervisor/compatible"] = "linux,kvm"
    _dt(root, props)
    shared = "0" if mode == "powervm-dedicated" else "1"
    w(root, "proc/powerpc/lparcfg",
      f"lparcfg 1.9\nserial_number=IBM,02123456A\nsystem_type={model}\npartition_id=5\n"
      "R4=0x190\nR5=0x0\nR6=0x80050000\nR7=0x8000000000000000\nBoundThrds=1\n"
      "CapInc=1\nDisWheRotPer=5120000\nMinEntCap=10\nMinEntCapPerVP=5\nMinMem=4096\n"
      f"MinProcs=1\npartition_max_entitled_capacity=400\nsystem_potential_processors=32\n"
      f"partition_entitled_capacity=400\nsystem_active_processors=32\npool=0\n"
      f"pool_capacity=3200\npool_idle_time=0\npool_num_procs=0\nunallocated_capacity_weight=0\n"
      f"capacity_weight=128\ncapped=0\nunallocated_capacity=0\npurr=12345678\n"
      f"partition_active_processors=4\npartition_potential_processors=8\n"
      f"shared_processor_mode={shared}\nslb_size=32\n")
    return root


ARM_CPUINFO = "".join(
    f"processor\t: {c}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 "
    "crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\n"
    "CPU revision\t: 1\n\n" for c in range(4))


def arm64(dst: Path, evidence: str) -> Path:
    """An arm64 (Neoverse N1) box. ``evidence``: "dmi-metal" (an ACPI server's DMI),
    "dmi-kvm" (a cloud guest's DMI: QEMU), "dt-virt" (QEMU's virt machine: the device
    tree's root compatible "linux,dummy-virt", no DMI), "none" (no DMI, no device tree:
    nothing tells a guest from the hardware)."""
    root = small(dst, 4, ARM_CPUINFO, kernel="6.8.0-1012-aws",
                 cmdline="BOOT_IMAGE=/boot/vmlinuz-6.8.0 root=LABEL=root ro",
                 interrupts=" 11:       9000       9000       9000       9000     GICv3  27 "
                            "Level     arch_timer\n")
    if evidence == "dmi-metal":
        for name, value in (("sys_vendor", "Ampere Computing"), ("product_name", "Mt.Jade"),
                            ("board_vendor", "WIWYNN"), ("bios_vendor", "Ampere(R)")):
            w(root, f"sys/class/dmi/id/{name}", value)
    elif evidence == "dmi-kvm":
        for name, value in (("sys_vendor", "QEMU"), ("product_name", "KVM Virtual Machine"),
                            ("bios_vendor", "EFI Development Kit II / OVMF")):
            w(root, f"sys/class/dmi/id/{name}", value)
    elif evidence == "dt-virt":
        _dt(root, {"compatible": "linux,dummy-virt", "model": "linux,dummy-virt"})
    return root


RISCV_CPUINFO = "".join(
    f"processor\t: {c}\nhart\t\t: {c}\nisa\t\t: rv64imafdc_zicntr_zicsr_zifencei_zihpm\n"
    "mmu\t\t: sv39\nuarch\t\t: sifive,u74-mc\nmvendorid\t: 0x489\n"
    "marchid\t\t: 0x8000000000000007\nmimpid\t\t: 0x4210427\n\n" for c in range(4))


def riscv(dst: Path, evidence: str) -> Path:
    """A RISC-V board. ``evidence``: "dt-virt" (QEMU's virt machine: root compatible
    "riscv-virtio"), "dt-board" (a StarFive VisionFive 2's device tree: hardware, but a
    device tree names no hypervisor either way), "none"."""
    root = small(dst, 4, RISCV_CPUINFO, kernel="6.8.0-31-generic",
                 cmdline="root=/dev/mmcblk1p4 rw console=ttyS0,115200 earlycon")
    if evidence == "dt-virt":
        _dt(root, {"compatible": "riscv-virtio", "model": "riscv-virtio,qemu"})
    elif evidence == "dt-board":
        _dt(root, {"compatible": "starfive,visionfive-2-v1.3b",
                   "model": "StarFive VisionFive 2 v1.3B"})
    return root


# -- x86 guests and captures of real-machine shape ---------------------------------------------


PCI_GUESTS = {"virtualbox": ("0x80ee", "0xcafe", "0x088000"),  # VirtualBox Guest Service
              "vmware": ("0x15ad", "0x0740", "0x088000")}  # VMware VMCI


def pci_guest(dst: Path, which: str) -> Path:
    """synthetic-tuned as an x86 guest whose hypervisor hides CPUID's hypervisor bit (no
    "hypervisor" flag: VMware ``hypervisor.cpuid.v0 = FALSE``, VirtualBox before 5.0) and
    whose capture has no DMI: only the hypervisor's own PCI device shows it."""
    root = copy(TUNED, dst)
    shutil.rmtree(root / "sys/class/dmi")
    vendor, device, klass = PCI_GUESTS[which]
    d = "sys/bus/pci/devices/0000:00:04.0"
    for name, value in (("vendor", vendor), ("device", device), ("class", klass),
                        ("subsystem_vendor", vendor), ("numa_node", "-1")):
        w(root, f"{d}/{name}", value)
    return root


def no_processes(dst: Path) -> Path:
    """synthetic-2socket (irqbalance and tuned running) captured without /proc/<pid>."""
    root = copy("synthetic-2socket", dst)
    for p in (root / "proc").iterdir():
        if p.name.isdigit():
            shutil.rmtree(p)
    return root


def cpumap_only(dst: Path) -> Path:
    """synthetic-2socket whose NUMA nodes carry ``cpumap`` (hex words) but no ``cpulist``."""
    root = copy("synthetic-2socket", dst)
    for node in sorted((root / "sys/devices/system/node").glob("node[0-9]*")):
        cpus = (node / "cpulist").read_text()
        (node / "cpumap").write_text(format_cpumask(parse_cpulist(cpus)) + "\n")
        (node / "cpulist").unlink()
    return root


def offline_cpus(dst: Path, offline: list[int]) -> Path:
    """synthetic-tuned captured without cpu/online, with ``offline`` in cpu/offline (and no
    cpuN/online files, as a dump that kept only the lists)."""
    root = copy(TUNED, dst)
    (root / CPU / "online").unlink()
    w(root, f"{CPU}/offline", format_cpulist(offline))
    for f in (root / CPU).glob("cpu[0-9]*/online"):
        f.unlink()
    return root
