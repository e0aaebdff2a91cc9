"""Interrupts: counts per CPU and affinity, read through a :class:`Host`.

Sources:
- /proc/interrupts                      counts per CPU, names   [cat /proc/interrupts]
- /proc/irq/N/smp_affinity_list         CPUs an IRQ may run on  [cat /proc/irq/N/smp_affinity_list]
- /proc/irq/N/effective_affinity_list   where it does run (x86 with generic irq)
- /proc/irq/default_smp_affinity        mask new IRQs get

The watch's signals (:func:`files`, :func:`parse`, :func:`layout`): ``irq.<cpu>.<row>``
counters (row = IRQ number or LOC/RES/CAL/TLB/...), ``irq.all.ERR`` [watch -n1 cat
/proc/interrupts]; /proc/softirqs is collectors/softirq.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host, Reading
from collectors.layout import LayoutBuilder, TokenLayout, parser_text
from collectors.parsers import (
    IrqRow,
    is_uint,
    parse_cpulist,
    parse_cpumask,
    parse_interrupts,
)


@dataclass(frozen=True)
class IrqAffinity:
    irq: int
    name: str  # devices from /proc/interrupts ("nvme0q1", "ehci_hcd:usb1,mmc0"); "" if none
    affinity: list[int] | None
    effective: list[int] | None
    path: str
    reason: str | None = None


def interrupts(host: Host) -> Reading[tuple[list[int], list[IrqRow]]]:
    return host.read(host.proc("interrupts")).map(parse_interrupts)


# The descriptor kernel/irq/proc.c show_interrupts prints between the counts and the action
# names: the chip name, then the hwirq (with an irq domain), "Level"/"Edge"
# (CONFIG_GENERIC_IRQ_SHOW_LEVEL: arm, arm64, powerpc) and "-<flow handler>" (x86: "-edge",
# glued to the hwirq, "65536-edge"; to the chip on kernels before 4.x, "IO-APIC-edge").
_HWIRQ = re.compile(r"[0-9]+(?:-[a-z_]+)?")
_FLOW = re.compile(r"-[a-z_]+")


def action_names(desc: str) -> str:
    """The action (device) names in the text after a numbered row's counts, comma-separated
    without spaces ("ehci_hcd:usb1,mmc0" for a shared line printed "ehci_hcd:usb1, mmc0");
    "" when the IRQ has no action (the text ends with its descriptor, "PCI-MSI 65536-edge")."""
    tok = desc.split()
    i = 1  # tok[0]: the chip (irq_chip.name or its irq_print_chip)
    if i < len(tok) and _HWIRQ.fullmatch(tok[i]):
        i += 1
    if i < len(tok) and tok[i] in ("Level", "Edge"):
        i += 1
    if i < len(tok) and _FLOW.fullmatch(tok[i]):
        i += 1
    # actions are printed "  a, b, c"; a name may hold a space ("PCIe PME")
    names = (n.strip() for n in " ".join(tok[i:]).split(","))
    return ",".join(n for n in names if n)


def _irq_name(row: IrqRow | None) -> str:
    return "" if row is None else action_names(row.desc)


def irq_affinities(host: Host) -> list[IrqAffinity]:
    """Every /proc/irq/N directory with its affinity and name (from /proc/interrupts)."""
    rows = {}
    r = interrupts(host)
    if r.ok:
        rows = {row.irq: row for row in r.value[1] if row.numeric}
    out = []
    for name in host.listdir(host.proc("irq")):
        if not is_uint(name):
            continue
        d = host.proc("irq", name)
        aff = host.read(d / "smp_affinity_list").map(parse_cpulist)
        eff = host.read(d / "effective_affinity_list").map(parse_cpulist)
        out.append(IrqAffinity(int(name), _irq_name(rows.get(name)), aff.value, eff.value,
                               aff.path, aff.reason))
    return sorted(out, key=lambda a: a.irq)


def default_affinity(host: Host) -> Reading[list[int]]:
    return host.read(host.proc("irq/default_smp_affinity")).map(parse_cpumask)


# ----------------------------------------------------------------------------------------------
# The watch's interrupt signals: files(), parse() and layout() (sampled by
# agent/watch/sampling/sources/irq.py)
# ----------------------------------------------------------------------------------------------


def files(host: Host) -> dict[str, Path]:
    """The file of the watch's interrupt signals: ``interrupts`` (/proc/interrupts)."""
    return {"interrupts": host.proc("interrupts")}


def parse_interrupt_counts(data: bytes, cpus: frozenset[int] | None = None
                           ) -> tuple[dict[str, float], dict[str, str]]:
    """/proc/interrupts bytes → (``irq.<cpu>.<row>`` counters for the CPUs in ``cpus`` (all
    when None), {row: description}). Rows are the IRQ number ("39") or the per-CPU row name
    ("LOC", "RES", "CAL", "TLB"); a row with fewer counts than CPUs (ERR, MIS) is
    ``irq.all.<row>``. :func:`collectors.parsers.parse_interrupts` reads the file (what it
    refuses, such as a numbered row without a count per CPU, raises ParseError). Pure."""
    cols, rows = parse_interrupts(parser_text(data, "/proc/interrupts"))
    pick = [(i, c) for i, c in enumerate(cols) if cpus is None or c in cpus]
    out: dict[str, float] = {}
    desc: dict[str, str] = {}
    for row in rows:
        if len(row.counts) == len(cols):
            for i, c in pick:
                out[f"irq.{c}.{row.irq}"] = float(row.counts[i])
            if row.desc:
                desc[row.irq] = row.desc
        else:
            out[f"irq.all.{row.irq}"] = float(row.counts[0])
    return out, desc


def cpu_header_names(header: list[bytes]) -> list[int] | None:
    """CPU ids of a "CPU0 CPU1 CPU4" header's tokens; None when a token is not one."""
    if not all(h.startswith(b"CPU") and is_uint(h[3:]) for h in header):
        return None
    return [int(h[3:]) for h in header]


def interrupts_layout(data: bytes, cpus: frozenset[int] | None = None) -> TokenLayout | None:
    """The token layout of /proc/interrupts giving :func:`parse_interrupt_counts`' values
    (names: the header's CPUs, a CPU swapped for another is another layout, and every row's
    name); None for a read it cannot describe. Pure."""
    lines = data.split(b"\n")
    header = lines[0].split()
    cols = cpu_header_names(header)
    if not cols:
        return None
    ncol = len(cols)
    pick = [(i, c) for i, c in enumerate(cols) if cpus is None or c in cpus]
    b = LayoutBuilder()
    for i, h in enumerate(header):
        b.name(i, h)
    b.advance(ncol)
    for line in lines[1:]:
        toks = line.split()
        name, sep, rest = line.partition(b":")
        if sep:
            if not toks or toks[0] != name.strip() + b":":
                return None  # a name glued to its counts: the parser's fields are not tokens
            row = name.strip().decode(errors="replace")
            b.name(0, toks[0])
            k = 0
            while k < min(ncol, len(toks) - 1) and is_uint(toks[1 + k]):
                k += 1  # the counts, as parse_interrupts takes them
            if k == ncol:
                for i, c in pick:
                    b.value(1 + i, f"irq.{c}.{row}")
            elif k and not is_uint(name.strip()):  # ERR, MIS: one total column
                b.value(1, f"irq.all.{row}")
                if 1 + k < len(toks):  # the parser stops at it: it must stay a non-count
                    b.name(1 + k, toks[1 + k])
            else:
                return None
        b.advance(len(toks))
    return b.build(data)


def parse(reads: dict[str, bytes], cpus: frozenset[int] | None = None) -> dict[str, float]:
    """The interrupt counters of one read of :func:`files`. Pure."""
    return parse_interrupt_counts(reads["interrupts"], cpus)[0]


def layout(key: str, data: bytes, cpus: frozenset[int] | None = None) -> TokenLayout | None:
    return interrupts_layout(data, cpus)
