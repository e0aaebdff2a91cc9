"""PCI Express devices: link speed/width current vs max, NUMA node, AER counters.

Sources (per device under /sys/bus/pci/devices/DDDD:BB:DD.F):
  class, vendor, device, current_link_speed, max_link_speed, current_link_width,
  max_link_width, numa_node, local_cpulist, aer_dev_{correctable,nonfatal,fatal}
                                                        [lspci -vv: LnkCap / LnkSta]
"""

from __future__ import annotations

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

    @property
    def has_link(self) -> bool:
        return self.max_speed_gts is not None and self.max_width is not None

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


def normalize_bus_id(bus_id: str) -> str:
    """NVML's "00000000:00:06.0" and sysfs's "0000:00:06.0" to one form (sysfs, lower case)."""
    b = bus_id.strip().lower()
    dom, _, rest = b.partition(":")
    if rest.count(":") == 1:  # domain present
        return f"{int(dom, 16):04x}:{rest}"
    return f"0000:{b}"


def pci_devices(host: Host) -> list[PciDevice]:
    out = []
    base = host.sys("bus/pci/devices")
    for addr in host.listdir(base):
        d = base / addr

        def rd(name, parser, d=d):
            return host.read(d / name).map(parser).value

        klass = host.read(d / "class").value
        numa = host.read_int(d / "numa_node").value
        aer: dict[str, int] = {}
        for kind in ("correctable", "nonfatal", "fatal"):
            aer.update(rd(f"aer_dev_{kind}", parse_aer) or {})
        out.append(PciDevice(
            address=normalize_bus_id(addr),
            klass=pci_class_name(klass) if klass else "unknown",
            vendor=host.read(d / "vendor").value, device=host.read(d / "device").value,
            cur_speed_gts=rd("current_link_speed", parse_pci_speed),
            max_speed_gts=rd("max_link_speed", parse_pci_speed),
            cur_width=rd("current_link_width", parse_pci_width),
            max_width=rd("max_link_width", parse_pci_width),
            numa_node=None if numa is None or numa < 0 else numa,
            local_cpus=rd("local_cpulist", parse_cpulist),
            aer=aer, path=host.display(d)))
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

    def available(self):
        from collectors.base import Availability
        devs = [d for d in pci_devices(self.host) if d.klass in WATCHED_CLASSES]
        self.devices = [d.address for d in devs]
        if not devs:
            return Availability.no("unsupported: no GPU or NIC PCI device")
        return Availability.yes()

    def is_counter(self, name: str) -> bool:
        return name.endswith("_total")

    def sample(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        base = self.host.sys("bus/pci/devices")
        for addr in self.devices:
            d = base / addr
            p = f"pcie.{addr}"
            for key, fname, parser in (("speed_gts", "current_link_speed", parse_pci_speed),
                                       ("max_speed_gts", "max_link_speed", parse_pci_speed),
                                       ("width", "current_link_width", parse_pci_width),
                                       ("max_width", "max_link_width", parse_pci_width)):
                v = self.host.read(d / fname).map(parser).value
                if v is not None:
                    out[f"{p}.{key}"] = float(v)
            for kind in ("correctable", "nonfatal", "fatal"):
                for k, v in (self.host.read(d / f"aer_dev_{kind}").map(parse_aer).value
                             or {}).items():
                    out[f"{p}.aer_{k}_total"] = float(v)
        return out

    def close(self) -> None:
        pass
