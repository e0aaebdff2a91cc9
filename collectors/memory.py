"""Memory signals: /proc/vmstat fault, reclaim, compaction, THP and NUMA counters, and PSI.

Sources:
- /proc/vmstat           counters [vmstat 1; sar -B]: pgfault, pgmajfault, compact_stall,
                         pgscan_direct, pgsteal_direct, allocstall_*, thp_*, numa_miss,
                         numa_foreign, numa_hint_faults, pswpin/pswpout
- /proc/pressure/{cpu,memory,io}  PSI "some"/"full" stall time totals in µs
                         [cat /proc/pressure/memory] — absent without CONFIG_PSI (or psi=0)

Signals (:func:`files`, :func:`parse`, :func:`layout`; sampled by
agent/watch/sampling/sources/memory.py): ``mem.all.<vmstat key>`` (counters),
``psi.<res>.some_us`` / ``psi.<res>.full_us`` (counters: cumulative stall µs). A missing key
is absent from the sample, never 0.
"""

from __future__ import annotations

from pathlib import Path

from collectors.host import Host
from collectors.layout import LayoutBuilder, TokenLayout, parser_text
from collectors.parsers import ParseError, parse_vmstat

VMSTAT_KEYS: frozenset[bytes] = frozenset(k.encode() for k in (
    "pgfault", "pgmajfault", "compact_stall", "compact_fail", "compact_success",
    "pgscan_direct", "pgsteal_direct", "pgscan_kswapd", "allocstall_normal",
    "allocstall_movable", "allocstall_dma32", "thp_fault_alloc", "thp_fault_fallback",
    "thp_collapse_alloc", "thp_split_page", "numa_miss", "numa_foreign", "numa_hint_faults",
    "numa_pages_migrated", "pswpin", "pswpout", "workingset_refault_file",
    "workingset_refault_anon", "pgmigrate_success"))


PSI_RESOURCES = ("cpu", "memory", "io")
NO_PSI = "unsupported: no PSI (CONFIG_PSI off or psi=0)"


def files(host: Host) -> dict[str, Path]:
    """The files of the memory signals, by key: ``vmstat`` (/proc/vmstat) and
    ``pressure.<res>`` (/proc/pressure/<res>; absent without PSI: :data:`NO_PSI`)."""
    return {"vmstat": host.proc("vmstat"),
            **{f"pressure.{res}": host.proc("pressure", res) for res in PSI_RESOURCES}}


def parse_vmstat_counters(data: bytes, keys: frozenset[bytes] = VMSTAT_KEYS) -> dict[str, float]:
    """/proc/vmstat bytes → ``mem.all.<key>`` for the keys kept.
    :func:`collectors.parsers.parse_vmstat` reads the file (a line of another shape or a
    value that is not a decimal raises ParseError). Pure."""
    return {"mem.all." + k: float(v)
            for k, v in parse_vmstat(parser_text(data, "/proc/vmstat")).items()
            if k.encode() in keys}


def vmstat_layout(data: bytes, keys: frozenset[bytes] = VMSTAT_KEYS) -> TokenLayout | None:
    """The token layout of /proc/vmstat giving :func:`parse_vmstat_counters`' values (names:
    the kept keys; values signed, as parse_vmstat reads them with parse_int); None for a read
    it cannot describe. Pure."""
    b = LayoutBuilder()
    for line in data.split(b"\n"):
        kv = line.split()
        if not kv:
            continue
        if len(kv) != 2:
            return None
        if kv[0] in keys:
            b.name(0, kv[0])
            b.value(1, "mem.all." + kv[0].decode())
        b.advance(2)
    return b.build(data, signed=True)


def parse_psi(data: bytes, resource: str) -> dict[str, float]:
    """A /proc/pressure/<res> file ("some avg10=0.00 avg60=0.00 avg300=0.00 total=N" and the
    same for "full"; Documentation/accounting/psi.rst) → ``psi.<res>.some_us`` /
    ``psi.<res>.full_us``. A total is a u64 of µs: "nan", "-5" or "1e9" raise
    :class:`~collectors.parsers.ParseError`, as does a file with neither line. Pure."""
    out: dict[str, float] = {}
    for line in data.split(b"\n"):
        tok = line.split()
        if not tok:
            continue
        if tok[0] not in (b"some", b"full"):
            raise ParseError(f"bad pressure line for {resource}: {line[:40]!r}")
        totals = [t[6:] for t in tok[1:] if t.startswith(b"total=")]
        if len(totals) != 1 or not totals[0].isdigit() or len(totals[0]) > 20:
            raise ParseError(f"bad pressure total for {resource}: {line[:60]!r}")
        out[f"psi.{resource}.{tok[0].decode()}_us"] = float(totals[0])
    if not out:
        raise ParseError(f"bad pressure file for {resource}")
    return out


def psi_layout(data: bytes, resource: str) -> TokenLayout | None:
    """The token layout of a /proc/pressure/<res> read giving :func:`parse_psi`'s values: each
    line's name (some, full) and its ``total=`` token. Built from the read (the cpu file has no
    "full" line before Linux 5.13). Pure."""
    b = LayoutBuilder()
    for line in data.split(b"\n"):
        tok = line.split()
        if not tok:
            continue
        totals = [i for i, t in enumerate(tok) if t.startswith(b"total=")]
        if tok[0] not in (b"some", b"full") or len(totals) != 1:
            return None
        b.name(0, tok[0])
        b.value(totals[0], f"psi.{resource}.{tok[0].decode()}_us", b"total=")
        b.advance(len(tok))
    return b.build(data)


def parse(reads: dict[str, bytes]) -> dict[str, float]:
    """The memory signals of one read of :func:`files`. Pure."""
    out: dict[str, float] = {}
    for key, data in reads.items():
        out.update(parse_vmstat_counters(data) if key == "vmstat" else
                   parse_psi(data, key.split(".", 1)[1]))
    return out


def layout(key: str, data: bytes) -> TokenLayout | None:
    return vmstat_layout(data) if key == "vmstat" else psi_layout(data, key.split(".", 1)[1])
