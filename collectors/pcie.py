"""PCI Express devices: link speed/width current vs max, NUMA node, AER counters.

Sources (per device under /sys/bus/pci/devices/DDDD:BB:DD.F):
  class, vendor, device, current_link_speed, max_link_speed, current_link_width,
  max_link_width, numa_node, local_cpulist, aer_dev_{correctable,nonfatal,fatal},
  and for bridges secondary_bus_number / subordinate_bus_number   [lspci -vv: LnkCap / LnkSta]

On bare metal each /sys/bus/pci/devices entry is a link into /sys/devices/pci<dom>:<bus>/,
where a device behind a bridge is a directory inside the bridge's; flat trees (older
captures) have a directory per address. Both read the same here.

A current link the kernel cannot state ("Unknown" speed, width 0: the link is down, or the
config read failed) is not "at max": :attr:`PciDevice.link_unknown`, with the reason in
:attr:`PciDevice.unreadable`. A bridge with no device behind it (an empty hot-plug slot) is
:attr:`PciDevice.empty_bridge`: its link is down because nothing is there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collectors.host import Host
from collectors.parsers import (
    parse_aer,
    parse_cpulist,
    parse_pci_speed,
    parse_pci_width,
    pci_class_name,
    pcie_generation,
)


@dataclass
class PciDevice:
    address: str  # sysfs form, lower case: 0000:00:06.0
    klass: str  # class name (network, gpu-3d, ...)
    vendor: str | None
    device: str | None
    cur_speed_gts: float | None
    max_speed_gts: float | None
    cur_width: int | None
    max_width: int | None
    numa_node: int | None  # None for -1 (no NUMA affinity reported)
    local_cpus: list[int] | None
    aer: dict[str, int] = field(default_factory=dict)
    path: str = ""
    # attribute -> why it could not be read ("absent", "error: cannot parse: ...")
    unreadable: dict[str, str] = field(default_factory=dict)
    is_bridge: bool = False
    # a bridge: True when no device sits on the buses behind it, None when unknown
    empty_bridge: bool | None = None

    @property
    def has_link(self) -> bool:
        return self.max_speed_gts is not None and self.max_width is not None

    @property
    def link_unknown(self) -> bool:
        """The device has a link (max readable) whose current speed or width is unknown."""
        return self.has_link and (self.cur_speed_gts is None or self.cur_width is None)

    @property
    def cur_gen(self) -> int | None:
        return pcie_generation(self.cur_speed_gts)

    @property
    def max_gen(self) -> int | None:
        return pcie_generation(self.max_speed_gts)

    @property
    def speed_degraded(self) -> bool:
        return (self.cur_speed_gts is not None and self.max_speed_gts is not None
                and self.cur_speed_gts < self.max_speed_gts)

    @property
    def width_degraded(self) -> bool:
        return (self.cur_width is not None and self.max_width is not None
                and self.cur_width < self.max_width)

    def link_str(self) -> str:
        def one(s, w):
            g = pcie_generation(s)
            return f"gen{g if g else '?'} x{w if w else '?'}"
        return f"{one(self.cur_speed_gts, self.cur_width)} (max {one(self.max_speed_gts, self.max_width)})"


# Classes of the devices inference traffic goes through (collectors.parsers.PCI_CLASSES names)
GPU_CLASSES = ("gpu-3d", "display-vga", "display", "accelerator")
NIC_CLASSES = ("network", "network-infiniband")
NVIDIA_VENDOR = "0x10de"
# Server BMCs show their VGA function as a PCI display device on one socket's root complex;
# it carries no inference traffic, so its NUMA node is no locality problem.
BMC_VGA_VENDORS = {"0x1a03": "ASPEED", "0x102b": "Matrox"}


def is_gpu(dev: PciDevice) -> bool:
    """A GPU or accelerator (3D controller: H100/H200 are class 0x0302; VGA; display), not a
    BMC's VGA function."""
    return dev.klass in GPU_CLASSES and not (
        dev.klass.startswith("display") and (dev.vendor or "").lower() in BMC_VGA_VENDORS)


def is_nic(dev: PciDevice) -> bool:
    return dev.klass in NIC_CLASSES


def nvidia_gpus(host: Host) -> list[PciDevice]:
    """NVIDIA GPUs in PCI address order: nvidia-smi's and NVML's index order (the CUDA
    order too under CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    return [d for d in pci_devices(host)
            if is_gpu(d) and (d.vendor or "").lower() == NVIDIA_VENDOR]


def normalize_bus_id(bus_id: str) -> str:
    """NVML's "00000000:00:06.0" and sysfs's "0000:00:06.0" to one form (sysfs, lower case)."""
    b = bus_id.strip().lower()
    dom, _, rest = b.partition(":")
    if rest.count(":") == 1:  # domain present
        return f"{int(dom, 16):04x}:{rest}"
    return f"0000:{b}"


PCI_ADDR = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def _bus(address: str) -> tuple[str, int]:
    dom, bus, _ = address.split(":")
    return dom, int(bus, 16)


def pci_devices(host: Host) -> list[PciDevice]:
    """Every PCI function under /sys/bus/pci/devices (``lspci -vv``), in address order."""
    out = []
    bridges: dict[str, tuple[int | None, int | None, bool | None]] = {}
    base = host.sys("bus/pci/devices")
    for addr in host.listdir(base):
        d = base / addr
        unreadable: dict[str, str] = {}

        def rd(name, parser, need=True, d=d, unreadable=unreadable):
            """The parsed attribute; a missing one is noted only where it ``need``s to be."""
            r = host.read(d / name)
            v = r.map(parser)
            if v.reason is not None and (need or v.reason != "absent"):
                unreadable[name] = v.reason
            elif v.value is None and r.value is not None and need:
                unreadable[name] = f"the kernel says {r.value.strip()!r}"  # "Unknown", "0"
            return v.value

        klass = rd("class", pci_class_name)
        numa = host.read_int(d / "numa_node").value
        aer: dict[str, int] = {}
        for kind in ("correctable", "nonfatal", "fatal"):
            aer.update(rd(f"aer_dev_{kind}", parse_aer, need=False) or {})
        max_speed = rd("max_link_speed", parse_pci_speed, need=False)
        max_width = rd("max_link_width", parse_pci_width, need=False)
        # the current link matters only where there is a link: legacy and virtual PCI
        # devices have none of these files, a host bridge says "Unknown" everywhere
        has_link = max_speed is not None and max_width is not None
        cur_speed = rd("current_link_speed", parse_pci_speed, need=has_link)
        cur_width = rd("current_link_width", parse_pci_width, need=has_link)
        address = normalize_bus_id(addr)
        if klass == "bridge-pci":
            sec = host.read_int(d / "secondary_bus_number").value
            sub = host.read_int(d / "subordinate_bus_number").value
            # Without the bus numbers, a hierarchical tree (live, or a capture that kept the
            # links) still shows the devices behind a bridge as its subdirectories; a flat
            # one cannot tell.
            child = (any(PCI_ADDR.fullmatch(n.lower()) for n in host.listdir(d))
                     if host.readlink(d) is not None else None)
            bridges[address] = (sec, sub, child)
        out.append(PciDevice(
            address=address, klass=klass or "unknown",
            vendor=host.read(d / "vendor").value, device=host.read(d / "device").value,
            cur_speed_gts=cur_speed, max_speed_gts=max_speed,
            cur_width=cur_width, max_width=max_width,
            numa_node=None if numa is None or numa < 0 else numa,
            local_cpus=rd("local_cpulist", parse_cpulist, need=False),
            aer=aer, path=host.display(d), unreadable=unreadable,
            is_bridge=klass == "bridge-pci"))
    on_bus = {_bus(dev.address) for dev in out}
    for dev in out:
        if dev.address not in bridges:
            continue
        sec, sub, child = bridges[dev.address]
        dom = dev.address.split(":")[0]
        if sec is not None and sub is not None and 0 < sec <= sub:
            dev.empty_bridge = not any((dom, b) in on_bus for b in range(sec, sub + 1))
        elif child is not None:
            dev.empty_bridge = not child
    return out


# ----------------------------------------------------------------------------------------------
# PcieCollector: link state and AER counters of GPU/NIC devices for `hftagent watch`
# ----------------------------------------------------------------------------------------------

WATCHED_CLASSES = ("gpu-3d", "display-vga", "display", "accelerator", "network",
                   "network-infiniband")


class PcieCollector:
    """Link speed/width current vs max and AER error counters of GPU and NIC devices.

    Signals per device (address in sysfs form): ``pcie.<addr>.speed_gts``,
    ``pcie.<addr>.max_speed_gts``, ``pcie.<addr>.width``, ``pcie.<addr>.max_width`` (gauges;
    absent when the device reports no link) and ``pcie.<addr>.aer_<NAME>_total`` (counters from
    aer_dev_{correctable,nonfatal,fatal}; absent without AER). [lspci -vv: LnkCap/LnkSta]
    Sampled slowly (1 Hz): these change on link retraining or errors, not per request.
    """

    name = "pcie"
    period_s = 1.0

    def __init__(self, host: Host) -> None:
        self.host = host
        self.devices: list[str] = []
        # (signal prefix/key, kept-open file, parser, is_aer) per file that exists: a sysfs
        # attribute re-read with pread is regenerated by the kernel; open + read + close of
        # 7 paths per device (and failed opens of absent ones) cost ~3 ms per round on a
        # 16-CPU guest with one GPU (docs/gpu-validation.md).
        self._files: list[tuple[str, object, object, bool]] = []

    def available(self):
        from collectors.base import Availability
        devs = [d for d in pci_devices(self.host) if d.klass in WATCHED_CLASSES]
        self.devices = [d.address for d in devs]
        if not devs:
            return Availability.no("unsupported: no GPU or NIC PCI device")
        self._open()
        return Availability.yes()

    def _open(self) -> None:
        self.close()
        base = self.host.sys("bus/pci/devices")
        for addr in self.devices:
            d = base / addr
            p = f"pcie.{addr}"
            for key, fname, parser in (("speed_gts", "current_link_speed", parse_pci_speed),
                                       ("max_speed_gts", "max_link_speed", parse_pci_speed),
                                       ("width", "current_link_width", parse_pci_width),
                                       ("max_width", "max_link_width", parse_pci_width)):
                self._add(f"{p}.{key}", d / fname, parser, False)
            for kind in ("correctable", "nonfatal", "fatal"):
                self._add(f"{p}.aer_", d / f"aer_dev_{kind}", parse_aer, True)

    def _add(self, key: str, path, parser, aer: bool) -> None:
        if not self.host.exists(path):
            return
        try:
            hf = self.host.open_hot(path)
        except OSError:
            return
        self._files.append((key, hf, parser, aer))

    def is_counter(self, name: str) -> bool:
        return name.endswith("_total")

    def sample(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key, hf, parser, aer in self._files:
            try:
                text = hf.read().decode(errors="replace")
                v = parser(text)
            except (OSError, ValueError):
                continue  # a link that went away / unreadable now: absent, never 0
            if aer:
                for k, n in v.items():
                    out[f"{key}{k}_total"] = float(n)
            elif v is not None:
                out[key] = float(v)
        return out

    def close(self) -> None:
        for _key, hf, _parser, _aer in self._files:
            hf.close()
        self._files = []
