"""Virtualization: whether a hypervisor runs this kernel, and which, from every source a live
host or a captured tree can show [systemd-detect-virt; lscpu "Hypervisor vendor"].

Sources, asked in this order; the first that names a hypervisor decides the kind:

1. /sys/hypervisor/type: "xen" (drivers/xen/sys-hypervisor.c; dom0 and domU alike).
2. DMI, /sys/class/dmi/id/{sys_vendor,product_name,board_vendor,bios_vendor}: the vendor a
   hypervisor's firmware writes (QEMU, VMware, innotek/VirtualBox, Xen, Microsoft "Virtual
   Machine", Amazon EC2, Google, OpenStack...). "Amazon EC2" is also on EC2's bare-metal
   instances, whose product name ends in ".metal" (systemd's detect-virt makes the same
   exception).
3. /proc/sysinfo (s390, arch/s390/kernel/sysinfo.c): "VMnn Control Program:" lines name each
   hypervisor layer, VM00 the innermost ("z/VM    7.3.0", "KVM/Linux"); without them the
   kernel runs in an LPAR under PR/SM, whose "LPAR CPUs Dedicated/Shared" say whether its
   CPUs are its own. s390 has no bare metal: an LPAR with dedicated CPUs is the best there is.
4. The device tree, /proc/device-tree (= /sys/firmware/devicetree/base): a ``hypervisor``
   node (compatible "linux,kvm", "xen,xen"), ``ibm,partition-name`` (a PowerVM LPAR), the
   root's compatible "linux,dummy-virt" / "riscv-virtio" (QEMU's arm and RISC-V ``virt``
   machines), ``ibm,opal`` (PowerNV: OPAL firmware, the kernel runs on the hardware).
5. POWER's /proc/powerpc/lparcfg (pseries, arch/powerpc/platforms/pseries/lparcfg.c: a
   PowerVM or KVM partition; ``shared_processor_mode``, ``system_type`` "... emulated by
   qemu" under KVM), which also says whether a PowerVM LPAR's processors are dedicated.
6. x86 CPUID: /proc/cpuinfo's "flags" shows ``hypervisor`` (CPUID.1:ECX bit 31, which KVM,
   Hyper-V, VMware, Xen HVM and VirtualBox 5+ set). The kind then comes from the boot
   arguments (Firecracker), the paravirt clocksource the kernel picked after reading the
   hypervisor's CPUID leaf 0x40000000 (kvm-clock, hyperv_clocksource_*, xen), or the PCI IDs.
7. PCI vendor IDs of virtual devices under /sys/bus/pci/devices (else /proc/bus/pci/devices,
   lscpu's source): VirtualBox 0x80ee, VMware
   0x15ad, virtio 0x1af4 (also QEMU's subsystem vendor for emulated devices), QEMU 0x1234
   (stdvga) and 0x1b36, Hyper-V 0x1414, Xen platform 0x5853, Parallels 0x1ab8.

Bare metal needs evidence too: on x86 a "flags" line without ``hypervisor`` (DMI alone is
not enough there: a hypervisor can pass the host's SMBIOS through, and CPUID is the
kernel's own test); elsewhere ``ibm,opal`` in the device tree or DMI that names a vendor
and no hypervisor. With none of these and no hypervisor named, the answer is unknown
(``known`` False), never "bare metal": an arm64 or RISC-V tree without DMI or device tree
cannot tell.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from collectors.host import ABSENT, Host, Reading


@dataclass(frozen=True)
class Virt:
    """``kind`` is None on bare metal (or when not ``known``); ``evidence`` says what showed
    it. ``dedicated``: for a partition (s390 LPAR, PowerVM), whether its CPUs are its own
    (True) or shared with others (False); None when not a partition or not shown."""

    kind: str | None
    evidence: str
    known: bool = True  # False: no source could tell a guest from bare metal
    dedicated: bool | None = None
    # sources that exist but could not be read ("path (reason)"): with ``known`` False they
    # make the answer an error rather than a box that shows nothing
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Says:
    """What one source shows: a hypervisor (``kind``), bare metal (``metal``), or nothing."""

    kind: str | None = None
    metal: bool = False
    evidence: str = ""
    dedicated: bool | None = None


_NOTHING = _Says()


def _note(r: Reading, unread: list[str]) -> None:
    """Remember a source that exists but could not be read (absent ones are not sources)."""
    if r.reason is not None and r.reason != ABSENT:
        unread.append(f"{r.path} ({r.reason})")


# -- 1. Xen ------------------------------------------------------------------------------------


def _xen(host: Host, unread: list[str]) -> _Says:
    r = host.read(host.sys("hypervisor/type"))
    _note(r, unread)
    if r.ok and r.value.strip():
        return _Says(r.value.strip(), evidence=f"{r.path}={r.value.strip()}")
    return _NOTHING


# -- 2. DMI -------------------------------------------------------------------------------------

# (substring of the lower-cased DMI field, kind); the fields are searched in DMI_FIELDS order
DMI_HINTS: tuple[tuple[str, str], ...] = (
    ("qemu", "kvm"), ("kvm", "kvm"), ("vmware", "vmware"), ("virtualbox", "virtualbox"),
    ("innotek", "virtualbox"), ("xen", "xen"), ("amazon ec2", "kvm"),
    ("google compute engine", "kvm"), ("google", "kvm"), ("openstack", "kvm"),
    ("firecracker", "firecracker"), ("bochs", "bochs"), ("parallels", "parallels"),
    ("bhyve", "bhyve"), ("apple virtualization", "apple"),
)
DMI_FIELDS = ("sys_vendor", "product_name", "board_vendor", "bios_vendor")


def parse_dmi(fields: dict[str, str]) -> _Says:
    """{DMI field: value} → what DMI shows. Pure."""
    low = {k: v.strip().lower() for k, v in fields.items()}
    if low.get("sys_vendor") == "microsoft corporation":
        # Hyper-V guests say "Virtual Machine"; Surface devices are Microsoft hardware
        if low.get("product_name") == "virtual machine":
            return _Says("hyperv", evidence="DMI Microsoft Corporation Virtual Machine")
        return _Says(metal=True, evidence="DMI Microsoft Corporation "
                     f"{fields.get('product_name', '').strip()} (not a Virtual Machine)")
    if "amazon ec2" in low.get("sys_vendor", "") and low.get("product_name", "").endswith(
            ".metal"):
        return _Says(metal=True, evidence=f"DMI Amazon EC2 {fields['product_name'].strip()} "
                                          "(a bare-metal instance)")
    for name in DMI_FIELDS:
        for hint, kind in DMI_HINTS:
            if hint in low.get(name, ""):
                return _Says(kind, evidence=f"DMI {name}={fields[name].strip()}")
    vendor = fields.get("sys_vendor", "").strip() or fields.get("board_vendor", "").strip()
    if vendor:
        return _Says(metal=True, evidence=f"DMI vendor {vendor!r}, no hypervisor's")
    return _NOTHING


def _dmi(host: Host, unread: list[str]) -> _Says:
    fields = {}
    for name in DMI_FIELDS:
        r = host.read(host.sys("class/dmi/id", name))
        _note(r, unread)
        if r.ok:
            fields[name] = r.value
    says = parse_dmi(fields)
    if says.evidence:
        shown = host.display(host.sys("class/dmi/id"))
        return _Says(says.kind, says.metal, f"{shown}: {says.evidence}")
    return _NOTHING


# -- 3. s390 ------------------------------------------------------------------------------------

_VM_LEVEL = re.compile(r"VM(\d\d) Control Program:\s*(.*\S)")


def parse_sysinfo(text: str) -> _Says:
    """/proc/sysinfo (s390) → the hypervisor layers, innermost first. Pure."""
    levels: dict[int, str] = {}
    lpar: dict[str, str] = {}
    for line in text.splitlines():
        m = _VM_LEVEL.match(line)
        if m:
            levels[int(m.group(1))] = " ".join(m.group(2).split())
        elif line.startswith("LPAR "):
            key, _, value = line.partition(":")
            lpar[key.strip()] = value.strip()
    if not levels and not lpar:
        return _NOTHING
    layers = [levels[k] for k in sorted(levels)]
    dedicated = None
    if lpar:
        name = lpar.get("LPAR Name", "")
        layers.append(f"LPAR {name}".strip())
        ded, shr = lpar.get("LPAR CPUs Dedicated", ""), lpar.get("LPAR CPUs Shared", "")
        if ded.isdigit() and shr.isdigit() and not levels:
            dedicated = int(shr) == 0 and int(ded) > 0
    first = layers[0]
    kind = ("zvm" if first.startswith("z/VM") else "kvm" if first.startswith("KVM")
            else "lpar" if first.startswith("LPAR") else first.split()[0].lower())
    ev = " on ".join(layers)
    if dedicated is not None:
        ev += (f" (CPUs dedicated {lpar['LPAR CPUs Dedicated']}, "
               f"shared {lpar['LPAR CPUs Shared']})")
    return _Says(kind, evidence=ev, dedicated=dedicated)


def _s390(host: Host, unread: list[str]) -> _Says:
    r = host.read(host.proc("sysinfo"))
    _note(r, unread)
    if not r.ok:
        return _NOTHING
    says = parse_sysinfo(r.value)
    return _Says(says.kind, evidence=f"{r.path}: {says.evidence}",
                 dedicated=says.dedicated) if says.kind else _NOTHING


# -- 4, 5. POWER and the device tree ------------------------------------------------------------


def parse_lparcfg(text: str) -> dict[str, str]:
    """/proc/powerpc/lparcfg's ``key=value`` lines (the first line, "lparcfg 1.9", has
    none). Pure."""
    out = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            out[key.strip()] = value.strip()
    return out


def _lparcfg(host: Host, unread: list[str]) -> _Says:
    r = host.read(host.proc("powerpc/lparcfg"))
    _note(r, unread)
    if not r.ok:
        return _NOTHING
    kv = parse_lparcfg(r.value)
    system = kv.get("system_type", "")
    kind = "kvm" if "qemu" in system.lower() else "powervm"
    mode = kv.get("shared_processor_mode")
    dedicated = None if mode not in ("0", "1") else mode == "0"
    ev = f"{r.path}: a pseries partition" + (f" ({system})" if system else "") \
        + (f", shared_processor_mode={mode}" if mode is not None else "")
    return _Says(kind, evidence=ev, dedicated=dedicated)


def _dt_strings(host: Host, path, unread: list[str]) -> list[str] | None:
    """A device-tree property of NUL-separated strings ("compatible"); None when absent."""
    r = host.read(path)
    _note(r, unread)
    if not r.ok:
        return None
    return [s for s in r.value.split("\0") if s]


def _device_tree(host: Host, unread: list[str]) -> _Says:
    base = host.proc("device-tree")
    if not host.exists(base):
        base = host.sys("firmware/devicetree/base")
        if not host.exists(base):
            return _NOTHING
    shown = host.display(base)
    hv = _dt_strings(host, base / "hypervisor" / "compatible", unread)
    if hv is not None:
        text = " ".join(hv)
        kind = ("kvm" if "linux,kvm" in hv else "xen" if any("xen" in s for s in hv)
                else "vmware" if "vmware" in text else hv[0] if hv else "unknown-hypervisor")
        return _Says(kind, evidence=f"{shown}/hypervisor compatible {text!r}")
    root = _dt_strings(host, base / "compatible", unread) or []
    for board, name in (("linux,dummy-virt", "QEMU's arm virt machine"),
                        ("riscv-virtio", "QEMU's RISC-V virt machine")):
        if board in root:
            return _Says("qemu", evidence=f"{shown}/compatible {board!r} ({name})")
    if host.exists(base / "ibm,partition-name"):
        name = (host.read(base / "ibm,partition-name").value or "").strip("\0\n ")
        return _Says("powervm", evidence=f"{shown}/ibm,partition-name"
                     + (f" {name!r}" if name else "") + " (a PowerVM LPAR)")
    if host.exists(base / "ibm,opal"):
        return _Says(metal=True, evidence=f"{shown}/ibm,opal (PowerNV: OPAL firmware, no "
                                          "hypervisor)")
    return _NOTHING


# -- 6. x86 CPUID --------------------------------------------------------------------------------

_CLOCKSOURCE_KIND = (("kvm-clock", "kvm"), ("hyperv_clocksource", "hyperv"), ("xen", "xen"))
# what the CPUID test says when it cannot be made: cpuinfo unreadable, or read and without a
# "flags" line (not x86: the architecture has no such bit)
_X86_UNKNOWN = _Says(evidence="cpuinfo unreadable")
_NOT_X86 = _Says(evidence="not x86")


def _x86(host: Host, unread: list[str]) -> _Says:
    """What the CPUID flags show; nothing on a kernel whose cpuinfo has no "flags" line."""
    r = host.read(host.proc("cpuinfo"))
    _note(r, unread)
    if not r.ok:
        return _X86_UNKNOWN
    flags = None
    for line in r.value.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    if flags is None:  # arm64 "Features", s390 "features", RISC-V "isa", POWER "cpu"
        return _NOT_X86
    if "hypervisor" not in flags:
        return _Says(metal=True, evidence=f"{r.path} flags: no hypervisor (CPUID.1:ECX[31] "
                                          "clear)")
    ev = f"{r.path} flags: hypervisor"
    cmd = host.read(host.proc("cmdline")).value or ""
    if "firecracker" in cmd:
        return _Says("firecracker", evidence=ev)
    cs = host.read(host.sys("devices/system/clocksource/clocksource0/available_clocksource"))
    for name, kind in _CLOCKSOURCE_KIND:
        if cs.ok and any(w.startswith(name) for w in cs.value.split()):
            return _Says(kind, evidence=f"{ev}; {cs.path} offers {name}")
    return _Says("unknown-hypervisor", evidence=ev)


# -- 7. PCI ---------------------------------------------------------------------------------------

PCI_VENDORS = {"0x80ee": "virtualbox", "0x15ad": "vmware", "0x1af4": "kvm", "0x1234": "qemu",
               "0x1b36": "qemu", "0x1414": "hyperv", "0x5853": "xen", "0x1ab8": "parallels"}
PCI_NAMES = {"0x80ee": "VirtualBox", "0x15ad": "VMware", "0x1af4": "virtio/QEMU",
             "0x1234": "QEMU stdvga", "0x1b36": "QEMU", "0x1414": "Hyper-V",
             "0x5853": "Xen platform", "0x1ab8": "Parallels"}


def parse_proc_pci(text: str) -> list[tuple[str, str]]:
    """/proc/bus/pci/devices (drivers/pci/proc.c: one device a line, the second field the
    vendor and device IDs as 8 hex digits) → [(vendor "0x80ee", device "0xbeef")]. Pure."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 2 and re.fullmatch(r"[0-9a-fA-F]{8}", f[1]):
            out.append((f"0x{f[1][:4].lower()}", f"0x{f[1][4:].lower()}"))
    return out


def _most_specific(found: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The (vendor, evidence) that names the hypervisor best: VirtualBox emulates VMware's
    SVGA (0x15ad) and virtio (0x1af4) devices too, and virtio is QEMU's, KVM's and
    Firecracker's alike, so a vendor's own device outranks an emulated one
    (:data:`PCI_SPECIFICITY`), whatever the bus order."""
    known = [f for f in found if f[0] in PCI_VENDORS]
    return min(known, key=lambda f: PCI_SPECIFICITY.index(f[0]), default=None)


# most specific first: a device only that hypervisor has, before the ones others emulate too
PCI_SPECIFICITY = ("0x80ee", "0x1414", "0x5853", "0x1ab8", "0x15ad", "0x1234", "0x1b36",
                   "0x1af4")


def _proc_pci(host: Host, unread: list[str]) -> _Says:
    """The PCI IDs from /proc/bus/pci/devices, where lscpu reads them: a tree or a box whose
    /sys/bus/pci shows nothing (sysfs not captured, or not mounted) still has them."""
    r = host.read(host.proc("bus/pci/devices"))
    _note(r, unread)
    best = _most_specific([(vid, f"{r.path} vendor {vid} (device {dev})")
                           for vid, dev in parse_proc_pci(r.value or "")])
    if best is None:
        return _NOTHING
    return _Says(PCI_VENDORS[best[0]], evidence=f"{best[1]}: a {PCI_NAMES[best[0]]} virtual "
                 "device")


def _pci(host: Host, unread: list[str]) -> _Says:
    base = host.sys("bus/pci/devices")
    if not host.listdir(base):
        return _proc_pci(host, unread)
    found: list[tuple[str, str]] = []
    for addr in host.listdir(base):
        for attr in ("vendor", "subsystem_vendor"):
            r = host.read(base / addr / attr)
            _note(r, unread)
            vid = (r.value or "").strip().lower()
            if vid in PCI_VENDORS:
                dev = (host.read(base / addr / "device").value or "").strip().lower()
                what = f"{attr} {vid}" + (f" (device {dev})" if attr == "vendor" and dev else "")
                found.append((vid, f"{host.display(base / addr)} {what}"))
    best = _most_specific(found)
    if best is None:
        return _NOTHING
    return _Says(PCI_VENDORS[best[0]], evidence=f"{best[1]}: a {PCI_NAMES[best[0]]} virtual "
                 "device")


# -- all of them ------------------------------------------------------------------------------------


def _sources(host: Host, unread: list[str]) -> Iterator[_Says]:
    """What each source shows, in the module docstring's order, read only when asked."""
    yield _xen(host, unread)
    yield _dmi(host, unread)
    yield _s390(host, unread)
    lpar = _lparcfg(host, unread)
    dt = _device_tree(host, unread)
    if dt.kind == "powervm" and lpar.kind:  # lparcfg says more (KVM or not, dedication)
        dt = _Says(lpar.kind, evidence=f"{dt.evidence}; {lpar.evidence}",
                   dedicated=lpar.dedicated)
    yield dt
    yield lpar
    x86 = _x86(host, unread)
    if x86.kind == "unknown-hypervisor":  # the PCI IDs may name it
        pci = _pci(host, [])
        if pci.kind:
            x86 = _Says(pci.kind, evidence=f"{x86.evidence}; {pci.evidence}")
    yield x86
    yield _pci(host, unread)


def virtualization(host: Host) -> Virt:
    """Which hypervisor runs this kernel, from the sources in the module docstring: the
    first that names one decides; else bare metal where some source shows it (CPUID's
    evidence first), else unknown."""
    unread: list[str] = []
    metal: list[str] = []
    cpuid: _Says | None = None
    for says in _sources(host, unread):
        if says.kind:
            return Virt(says.kind, says.evidence, dedicated=says.dedicated)
        if says is _X86_UNKNOWN or says is _NOT_X86 or "CPUID" in says.evidence:
            cpuid = says
        if says.metal:
            metal.append(says.evidence)
    # Bare metal: the CPUID bit where the architecture has one; DMI or the device tree only
    # where it has none (cpuinfo read, no x86 flags). An x86 kernel whose cpuinfo cannot be
    # read is not called bare metal on its DMI: hypervisors can pass the host's SMBIOS
    # through, and only CPUID is the kernel's own test.
    if cpuid is not None and cpuid.metal:
        return Virt(None, "; ".join(sorted(metal, key=lambda e: "CPUID" not in e)))
    if cpuid is _NOT_X86 and metal:
        return Virt(None, "; ".join(metal))
    what = ("nothing shows a hypervisor or bare metal: no x86 CPUID flags, DMI, "
            "/proc/sysinfo, device tree, lparcfg, /sys/hypervisor or virtual PCI device")
    if cpuid is _X86_UNKNOWN and metal:
        what = (f"{host.display(host.proc('cpuinfo'))} unreadable, so the CPUID test cannot "
                f"be made ({'; '.join(metal)} is not enough)")
    return Virt(None, what + (f"; unreadable: {', '.join(unread[:4])}" if unread else ""),
                known=False, unreadable=tuple(unread))
