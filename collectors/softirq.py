"""Softirqs: how often each softirq ran on each CPU, read through a :class:`Host`.

Source: /proc/softirqs (a "CPU0 CPU1 ..." header of the online CPUs, then one row per softirq
with a count for every CPU) [cat /proc/softirqs; watch -n1 cat /proc/softirqs].
Signals (:func:`files`, :func:`parse`, :func:`layout`; sampled by
agent/watch/sampling/sources/softirq.py): ``softirq.<cpu>.<NAME>`` counters (HI, TIMER,
NET_TX, NET_RX, BLOCK, IRQ_POLL, TASKLET, SCHED, HRTIMER, RCU). A kernel without the file
(before 2.6.31) has no softirq signals, never zeros.
"""

from __future__ import annotations

from pathlib import Path

from collectors.host import Host
from collectors.irq import cpu_header_names
from collectors.layout import LayoutBuilder, TokenLayout, parser_text
from collectors.parsers import parse_softirqs


def files(host: Host) -> dict[str, Path]:
    """The file of the softirq signals: ``softirqs`` (/proc/softirqs)."""
    return {"softirqs": host.proc("softirqs")}


def parse_softirq_counts(data: bytes, cpus: frozenset[int] | None = None) -> dict[str, float]:
    """/proc/softirqs bytes → ``softirq.<cpu>.<NAME>`` for the CPUs in ``cpus`` (all when
    None). :func:`collectors.parsers.parse_softirqs` reads the file (a row without a count
    per CPU raises ParseError). Pure."""
    cols, rows = parse_softirqs(parser_text(data, "/proc/softirqs"))
    pick = [(i, c) for i, c in enumerate(cols) if cpus is None or c in cpus]
    return {f"softirq.{c}.{name}": float(counts[i])
            for name, counts in rows.items() for i, c in pick}


def softirqs_layout(data: bytes, cpus: frozenset[int] | None = None) -> TokenLayout | None:
    """The token layout of /proc/softirqs giving :func:`parse_softirq_counts`' values (names:
    the header's CPUs and every row's name); None for a read it cannot describe. Pure."""
    lines = data.split(b"\n")
    header = lines[0].split()
    cols = cpu_header_names(header)
    if not cols:
        return None
    pick = [(i, c) for i, c in enumerate(cols) if cpus is None or c in cpus]
    b = LayoutBuilder()
    for i, h in enumerate(header):
        b.name(i, h)
    b.advance(len(header))
    for line in lines[1:]:
        toks = line.split()
        name, sep, _ = line.partition(b":")
        if sep:
            if not toks or toks[0] != name.strip() + b":" or len(toks) != 1 + len(cols):
                return None
            row = name.strip().decode(errors="replace")
            b.name(0, toks[0])
            for i, c in pick:
                b.value(1 + i, f"softirq.{c}.{row}")
        elif toks:
            return None
        b.advance(len(toks))
    return b.build(data)


def parse(reads: dict[str, bytes], cpus: frozenset[int] | None = None) -> dict[str, float]:
    """The softirq counters of one read of :func:`files`. Pure."""
    return parse_softirq_counts(reads["softirqs"], cpus)


def layout(key: str, data: bytes, cpus: frozenset[int] | None = None) -> TokenLayout | None:
    return softirqs_layout(data, cpus)
