"""Interrupts: counts per CPU and affinity, read through a :class:`Host`.

Sources:
- /proc/interrupts                      counts per CPU, names   [cat /proc/interrupts]
- /proc/softirqs                        softirq counts per CPU  [cat /proc/softirqs]
- /proc/irq/N/smp_affinity_list         CPUs an IRQ may run on  [cat /proc/irq/N/smp_affinity_list]
- /proc/irq/N/effective_affinity_list   where it does run (x86 with generic irq)
- /proc/irq/default_smp_affinity        mask new IRQs get
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.host import Host, Reading
from collectors.parsers import IrqRow, parse_cpulist, parse_cpumask, parse_interrupts


@dataclass(frozen=True)
class IrqAffinity:
    irq: int
    name: str  # devices from /proc/interrupts ("nvme0q1", "eth0-TxRx-3"); "" if unnamed
    affinity: list[int] | None
    effective: list[int] | None
    path: str
    reason: str | None = None


def interrupts(host: Host) -> Reading[tuple[list[int], list[IrqRow]]]:
    return host.read(host.proc("interrupts")).map(parse_interrupts)


def _irq_name(row: IrqRow | None) -> str:
    """Last word of the description is the device/action name on x86 and arm64."""
    if row is None or not row.desc:
        return ""
    return row.desc.split()[-1]


def irq_affinities(host: Host) -> list[IrqAffinity]:
    """Every /proc/irq/N directory with its affinity and name (from /proc/interrupts)."""
    rows = {}
    r = interrupts(host)
    if r.ok:
        rows = {row.irq: row for row in r.value[1] if row.numeric}
    out = []
    for name in host.listdir(host.proc("irq")):
        if not name.isdigit():
            continue
        d = host.proc("irq", name)
        aff = host.read(d / "smp_affinity_list").map(parse_cpulist)
        eff = host.read(d / "effective_affinity_list").map(parse_cpulist)
        out.append(IrqAffinity(int(name), _irq_name(rows.get(name)), aff.value, eff.value,
                               aff.path, aff.reason))
    return sorted(out, key=lambda a: a.irq)


def default_affinity(host: Host) -> Reading[list[int]]:
    return host.read(host.proc("irq/default_smp_affinity")).map(parse_cpumask)
