"""Interrupts: counts per CPU and affinity, read through a :class:`Host`.

Sources:
- /proc/interrupts                      counts per CPU, names   [cat /proc/interrupts]
- /proc/irq/N/smp_affinity_list         CPUs an IRQ may run on  [cat /proc/irq/N/smp_affinity_list]
- /proc/irq/N/effective_affinity_list   where it does run (x86 with generic irq)
- /proc/irq/default_smp_affinity        mask new IRQs get
- /sys/kernel/debug/irq/irqs/N          the kernel's IRQD_* state (CONFIG_GENERIC_IRQ_DEBUGFS,
                                        root only): which IRQs it will not let user space move

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
    chip: str = ""  # the irq_chip /proc/interrupts names ("PCI-MSIX-0000:00:02.0", "IO-APIC")
    # The IRQD_* state that makes the kernel refuse to move it from user space (one of
    # IMMOVABLE_STATES) and what showed it (:func:`immovable`); None: movable as far as the
    # host shows.
    immovable: str | None = None
    immovable_evidence: str = ""

    @property
    def managed(self) -> bool:
        """Its affinity is managed by the kernel (the one kind ``isolcpus=managed_irq``
        steers off isolated CPUs)."""
        return self.immovable == MANAGED


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


def _chip(row: IrqRow | None) -> str:
    tok = row.desc.split() if row is not None else []
    return tok[0] if tok else ""


# -- IRQs the kernel will not move ----------------------------------------------------------
#
# A write to /proc/irq/N/smp_affinity{,_list} fails with EIO (kernel/irq/proc.c
# write_irq_affinity) when irq_can_set_affinity_usr() is false: the IRQ's affinity is
# *managed* (IRQD_AFFINITY_MANAGED: the driver asked the kernel to spread its queue vectors
# over the CPUs, pci_alloc_irq_vectors_affinity() with PCI_IRQ_AFFINITY, 4.8+), it is per-CPU
# (IRQD_PER_CPU) or it may not be balanced (IRQD_NO_BALANCING). /proc/irq/N shows none of
# this, so the evidence is, in order:
#
# 1. the kernel's own state: /sys/kernel/debug/irq/irqs/N lists the IRQD_* bits under
#    "dstate" (CONFIG_GENERIC_IRQ_DEBUGFS, 4.14+; debugfs is root only). When it can be
#    read it decides, and the names below are not consulted;
# 2. the queue names of the drivers that allocate managed vectors, on an MSI/MSI-X chip
#    (every chip name the kernel prints for one holds "MSI": "PCI-MSI", "IR-PCI-MSI",
#    "PCI-MSIX-0000:00:02.0" since 6.2's per-device MSI domains, arm64's "ITS-MSI"):
#    - ``nvmeNqM`` with M >= 1: NVMe I/O queues (drivers/nvme/host/pci.c nvme_setup_irqs;
#      queue 0, the admin queue, is a pre_vector and movable);
#    - ``virtioN-req.M``: virtio-blk request queues (drivers/block/virtio_blk.c init_vq
#      passes an irq_affinity to virtio_find_vqs since 4.11; virtio-pci makes the config
#      vector a pre_vector, so ``virtioN-config`` stays movable);
#    - ``virtioN-request``: virtio-scsi request queues (drivers/scsi/virtio_scsi.c,
#      pre_vectors = 2 for control and event, since 4.11).
#    Every action on the line must be such a queue: a vector shared with the admin queue
#    ("nvme0q0,nvme0q1", one vector for the whole device) gets no managed affinity.
#    Not managed, so not listed: virtio-net's ``-input.N``/``-output.N`` (it only sets
#    affinity hints, virtnet_set_affinity), mlx5 and other NICs (affinity hints since 4.16),
#    virtio-mmio devices (one legacy line per device, no MSI).
#
# Rejected as evidence: an effective_affinity_list narrower than smp_affinity_list. On x86
# the vector allocator gives every IRQ, movable or not, one effective CPU out of its mask
# (CONFIG_GENERIC_IRQ_EFFECTIVE_AFF_MASK, 4.15+), so that difference says nothing about
# managed-ness. What effective_affinity_list does show is where a managed IRQ runs once
# ``isolcpus=managed_irq,...`` (5.6+, kernel/irq/manage.c irq_do_set_affinity) has steered
# it to a housekeeping CPU of its mask: tuning/checks/irq.py reads it for that.

_MANAGED_QUEUE = re.compile(r"nvme[0-9]+q[1-9][0-9]*|virtio[0-9]+-req\.[0-9]+"
                            r"|virtio[0-9]+-request")
# IRQD_* bits (include/linux/irq.h) that make irq_can_set_affinity_usr() false
MANAGED = "IRQD_AFFINITY_MANAGED"
IMMOVABLE_STATES = (MANAGED, "IRQD_PER_CPU", "IRQD_NO_BALANCING")


def debug_states(text: str) -> set[str]:
    """The IRQD_* names the "dstate:" block of /sys/kernel/debug/irq/irqs/N lists (one per
    line, indented under it, kernel/irq/debugfs.c irq_debug_show_bits). Pure."""
    out: set[str] = set()
    inside = False
    for line in text.splitlines():
        if line.startswith("dstate:"):
            inside = True
            continue
        if inside:
            word = line.strip()
            if line[:1].isspace() and word.startswith("IRQD_"):
                out.add(word)
            elif not line[:1].isspace():
                break
    return out


def queue_vector(chip: str, name: str) -> bool:
    """Whether /proc/interrupts shows a managed queue vector: an MSI chip and only queue
    names of drivers that spread their vectors (see above). Pure."""
    names = [n for n in name.split(",") if n]
    return "MSI" in chip and bool(names) and all(_MANAGED_QUEUE.fullmatch(n) for n in names)


def immovable(host: Host, irq: int, chip: str, name: str,
              debug: bool | None = None) -> tuple[str, str] | None:
    """(the IRQD_* state that makes the kernel refuse to move IRQ ``irq`` from user space,
    the evidence), or None when nothing the host shows says so. ``debug``: whether the
    debugfs IRQ directory can be listed (None: look)."""
    if debug is None:
        debug = bool(host.listdir(host.sys("kernel/debug/irq/irqs")))
    if debug:
        r = host.read(host.sys("kernel/debug/irq/irqs", str(irq)))
        if r.ok:
            states = debug_states(r.value)
            found = [s for s in IMMOVABLE_STATES if s in states]
            return (found[0], f"{found[0]} in {r.path}") if found else None
    if queue_vector(chip, name):
        return MANAGED, f"managed queue vector: {name} on {chip}"
    return None


def isolcpus_flags(value: str | None) -> set[str]:
    """The flags of an ``isolcpus=`` value ("managed_irq,domain,2-7" → {managed_irq,
    domain}): its leading words, as kernel/sched/isolation.c reads them. None or a value of
    CPUs only ("2-7": domain isolation) gives {}. Pure."""
    out: set[str] = set()
    s = value or ""
    while s[:1].isascii() and s[:1].isalpha():
        flag, comma, s = s.partition(",")
        if not comma:
            break
        out.add(flag)
    return out


def irq_affinities(host: Host) -> list[IrqAffinity]:
    """Every /proc/irq/N directory with its affinity, name and chip (from /proc/interrupts)
    and whether the kernel will move it (:func:`immovable`)."""
    rows = {}
    r = interrupts(host)
    if r.ok:
        rows = {row.irq: row for row in r.value[1] if row.numeric}
    debug = bool(host.listdir(host.sys("kernel/debug/irq/irqs")))
    out = []
    for name in host.listdir(host.proc("irq")):
        if not is_uint(name):
            continue
        d = host.proc("irq", name)
        aff = host.read(d / "smp_affinity_list").map(parse_cpulist)
        eff = host.read(d / "effective_affinity_list").map(parse_cpulist)
        row = rows.get(name)
        dev, chip = _irq_name(row), _chip(row)
        state, why = immovable(host, int(name), chip, dev, debug) or (None, "")
        out.append(IrqAffinity(int(name), dev, aff.value, eff.value, aff.path, aff.reason,
                               chip, state, why))
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

