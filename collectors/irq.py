"""Interrupts: counts per CPU and affinity, read through a :class:`Host`.

Sources:
- /proc/interrupts                      counts per CPU, names   [cat /proc/interrupts]
- /proc/softirqs                        softirq counts per CPU  [cat /proc/softirqs]
- /proc/irq/N/smp_affinity_list         CPUs an IRQ may run on  [cat /proc/irq/N/smp_affinity_list]
- /proc/irq/N/effective_affinity_list   where it does run (x86 with generic irq)
- /proc/irq/default_smp_affinity        mask new IRQs get
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collectors.host import Host, Reading
from collectors.layout import LayoutBuilder, TokenLayout
from collectors.parsers import (
    MAX_CPUS,
    IrqRow,
    ParseError,
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
# IrqCollector: per-CPU interrupt and softirq counts for `hftagent watch`
# ----------------------------------------------------------------------------------------------


def _cpu_columns(line: bytes, what: str) -> list[int]:
    """CPU ids of a "CPU0 CPU1 CPU4" header (the online CPUs)."""
    header = line.split()
    if not header or len(header) > MAX_CPUS or not all(
            h.startswith(b"CPU") and h[3:].isdigit() and len(h) <= 7 for h in header):
        raise ParseError(f"bad {what} header")
    cols = [int(h[3:]) for h in header]
    if len(set(cols)) != len(cols) or max(cols) >= MAX_CPUS:
        raise ParseError(f"bad {what} header")
    return cols


def _count(tok: bytes, what: str) -> float:
    """A counter value: ASCII digits, at most 20 (a u64); not nan, inf or negative."""
    if not tok.isdigit() or len(tok) > 20:
        raise ParseError(f"bad count {tok[:24]!r} in {what}")
    return float(tok)


def _row_name(name: bytes, what: str) -> str:
    try:
        return name.strip().decode()
    except UnicodeDecodeError:
        raise ParseError(f"bad row name {name[:24]!r} in {what}") from None


def fast_interrupts(data: bytes, want: frozenset[int] | None
                    ) -> tuple[dict[str, float], dict[str, str]]:
    """/proc/interrupts bytes → (``irq.<cpu>.<row>`` counters for CPUs in ``want`` (all when
    None), {row: description}). Rows are the IRQ number ("39") or the per-CPU row name
    ("LOC", "RES", "CAL", "TLB"); single-column rows (ERR, MIS) are ``irq.all.<row>``; a row
    with fewer counts than CPUs is left out (absent, not 0), as :func:`interrupts_layout`
    does. Pure; raises :class:`~collectors.parsers.ParseError` on a bad header or count."""
    lines = data.split(b"\n")
    cols = _cpu_columns(lines[0], "/proc/interrupts")
    ncol = len(cols)
    pick = [(i, c) for i, c in enumerate(cols) if want is None or c in want]
    out: dict[str, float] = {}
    desc: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, rest = line.partition(b":")
        if not sep:
            continue
        row = _row_name(name, "/proc/interrupts")
        fields = rest.split()
        if len(fields) < ncol or not fields[ncol - 1].isdigit():
            if fields and fields[0].isdigit():  # ERR / MIS: one total column
                out[f"irq.all.{row}"] = _count(fields[0], "/proc/interrupts")
            continue
        for i, c in pick:
            out[f"irq.{c}.{row}"] = _count(fields[i], "/proc/interrupts")
        if fields[ncol:]:
            desc[row] = b" ".join(fields[ncol:]).decode(errors="replace")
    return out, desc


def fast_softirqs(data: bytes, want: frozenset[int] | None) -> dict[str, float]:
    """/proc/softirqs bytes → ``softirq.<cpu>.<NAME>`` counters (NET_RX, TIMER, SCHED...).
    Every row has a count for every CPU of the header. Pure; raises
    :class:`~collectors.parsers.ParseError`."""
    lines = data.split(b"\n")
    cols = _cpu_columns(lines[0], "/proc/softirqs")
    pick = [(i, c) for i, c in enumerate(cols) if want is None or c in want]
    out: dict[str, float] = {}
    for line in lines[1:]:
        name, sep, rest = line.partition(b":")
        if not sep:
            if line.strip():
                raise ParseError("bad /proc/softirqs line")
            continue
        fields = rest.split()
        row = _row_name(name, "/proc/softirqs")
        if len(fields) != len(cols):
            raise ParseError(f"/proc/softirqs row {row[:24]!r}: {len(fields)} counts for "
                             f"{len(cols)} CPUs")
        for i, c in pick:
            out[f"softirq.{c}.{row}"] = _count(fields[i], "/proc/softirqs")
    return out


def interrupts_layout(data: bytes, want: frozenset[int] | None) -> TokenLayout:
    """The :class:`~collectors.layout.TokenLayout` of /proc/interrupts for the same signals
    as :func:`fast_interrupts` (descriptions aside). Pure."""
    lines = data.split(b"\n")
    header = lines[0].split()
    if not header or not header[0].startswith(b"CPU"):
        raise ValueError("bad /proc/interrupts header")
    cols = [int(h[3:]) for h in header]
    ncol = len(cols)
    pick = [(i, c) for i, c in enumerate(cols) if want is None or c in want]
    b = LayoutBuilder()
    b.advance(ncol)
    for line in lines[1:]:
        toks = line.split()
        name, sep, rest = line.partition(b":")
        if sep and toks:
            row = name.strip().decode()
            fields = rest.split()
            b.name(0, toks[0])
            if len(fields) < ncol or not fields[ncol - 1].isdigit():
                if fields and fields[0].isdigit():
                    b.value(1, f"irq.all.{row}")
            else:
                for i, c in pick:
                    b.value(1 + i, f"irq.{c}.{row}")
        b.advance(len(toks))
    return b.build()


def softirqs_layout(data: bytes, want: frozenset[int] | None) -> TokenLayout:
    """The :class:`~collectors.layout.TokenLayout` of /proc/softirqs for the same signals as
    :func:`fast_softirqs`. Pure."""
    lines = data.split(b"\n")
    header = lines[0].split()
    cols = [int(h[3:]) for h in header]
    pick = [(i, c) for i, c in enumerate(cols) if want is None or c in want]
    b = LayoutBuilder()
    b.advance(len(header))
    for line in lines[1:]:
        toks = line.split()
        name, sep, rest = line.partition(b":")
        if sep and toks:
            row = name.strip().decode()
            b.name(0, toks[0])
            n = len(rest.split())
            for i, c in pick:
                if i < n:
                    b.value(1 + i, f"softirq.{c}.{row}")
        b.advance(len(toks))
    return b.build()


class IrqCollector:
    """Per-CPU deltas of /proc/interrupts, naming the IRQ.

    Signals (counters): ``irq.<cpu>.<row>`` (row = IRQ number or LOC/RES/CAL/TLB/...),
    ``irq.all.ERR``. :attr:`descriptions` maps an IRQ row to its chip/device text
    ("PCI-MSIX-0000:00:03.0 2-edge virtio2-output.0") so a cause can say which device
    interrupted. [watch -n1 cat /proc/interrupts]

    Cost: the kernel generates /proc/interrupts on every read and the cost grows with CPUs ×
    IRQs (~60 µs for the read plus ~30 µs of parsing on this 2-CPU VM), so it is sampled at
    20 Hz (``period_s``); /proc/softirqs (3 µs) is sampled every round by
    :class:`SoftirqCollector`. ``cpus`` restricts the signals kept (the probe CPUs), not the
    read.
    """

    name = "irq"
    replayable = True  # reads only host.open_hot files: the native sampler can feed it
    period_s = 0.05
    desc_every = 100  # full parse (device names) every 100th read: 5 s at 20 Hz

    def __init__(self, host: Host, cpus: list[int] | None = None) -> None:
        self.host = host
        self._want = frozenset(cpus) if cpus else None
        self._irq = None
        self._layout: TokenLayout | None = None
        self._calls = 0
        self._plan: tuple | None = None
        self._planned = False
        self.descriptions: dict[str, str] = {}

    def available(self):
        from collectors.base import Availability
        try:
            self._open()
        except OSError as exc:
            return Availability.no(f"/proc/interrupts: {exc.strerror}")
        return Availability.yes()

    def _open(self) -> None:
        if self._irq is None:
            self._irq = self.host.open_hot(self.host.proc("interrupts"))

    def is_counter(self, name: str) -> bool:
        return True

    def sample(self) -> dict[str, float | None]:
        self._open()
        data = self._irq.read()
        tok = data.split()
        if self._planned:  # this row's plan was not used: it counted already
            self._planned = False
        else:
            self._calls += 1
        out = self._layout.values(tok) if self._layout is not None else None
        if out is None or self._calls % self.desc_every == 0:
            # First read, a changed layout (an IRQ came or went), or time to refresh the
            # device names (a driver rebound to the same IRQ number): the full parse.
            out, desc = fast_interrupts(data, self._want)
            if desc:
                self.descriptions = desc
            new = interrupts_layout(data, self._want)
            if not new.same_as(self._layout):  # (the same one kept: the reader has it)
                self._layout = new
        return out  # type: ignore[return-value]

    def replay_plan(self) -> tuple | None:
        """The native sampler's shortcut (agent/watch/feed.py): this row is the layout's
        values, as :meth:`sample` would return them. Asked once per row: a plan counts as a
        read (and the sample() that follows an unused plan does not count again), and every
        ``desc_every``-th read is None, so :meth:`sample` runs the full parse that refreshes
        the device names."""
        self._planned = False
        if self._layout is None or self._irq is None or \
                (self._calls + 1) % self.desc_every == 0:
            return None
        self._calls += 1
        self._planned = True
        p = self._plan
        if p is None or p[0][1] is not self._layout:
            p = self._plan = ((self._irq, self._layout),)
        return p

    def close(self) -> None:
        self._plan = None
        if self._irq is not None:
            self._irq.close()
        self._irq = None


class SoftirqCollector:
    """Per-CPU deltas of /proc/softirqs: ``softirq.<cpu>.<NAME>`` (NET_RX, TIMER, SCHED,
    RCU, ...; counters). Cheap (~3 µs read), sampled every round. [cat /proc/softirqs]"""

    name = "softirq"
    replayable = True  # reads only host.open_hot files: the native sampler can feed it
    period_s = 0.0

    def __init__(self, host: Host, cpus: list[int] | None = None) -> None:
        self.host = host
        self._want = frozenset(cpus) if cpus else None
        self._soft = None
        self._layout: TokenLayout | None = None
        self._plan: tuple | None = None

    def available(self):
        from collectors.base import Availability
        if not self.host.exists(self.host.proc("softirqs")):
            return Availability.no("absent: no /proc/softirqs")
        try:
            self._open()
        except OSError as exc:
            return Availability.no(f"/proc/softirqs: {exc.strerror}")
        return Availability.yes()

    def _open(self) -> None:
        if self._soft is None:
            self._soft = self.host.open_hot(self.host.proc("softirqs"))

    def is_counter(self, name: str) -> bool:
        return True

    def sample(self) -> dict[str, float | None]:
        self._open()
        data = self._soft.read()
        tok = data.split()
        out = self._layout.values(tok) if self._layout is not None else None
        if out is None:
            self._layout = softirqs_layout(data, self._want)
            out = self._layout.values(tok)
            if out is None:  # a file the layout cannot describe: the line-wise parser
                out = fast_softirqs(data, self._want)
        return out  # type: ignore[return-value]

    def replay_plan(self) -> tuple | None:
        """The native sampler's shortcut (agent/watch/feed.py): this row is the layout's
        values, as :meth:`sample` returns them."""
        if self._layout is None or self._soft is None:
            return None
        p = self._plan
        if p is None or p[0][1] is not self._layout:
            p = self._plan = ((self._soft, self._layout),)
        return p

    def close(self) -> None:
        self._plan = None
        if self._soft is not None:
            self._soft.close()
        self._soft = None
