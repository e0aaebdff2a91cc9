"""Memory signals: /proc/vmstat fault, reclaim, compaction, THP and NUMA counters, and PSI.

Sources:
- /proc/vmstat           counters [vmstat 1; sar -B]: pgfault, pgmajfault, compact_stall,
                         pgscan_direct, pgsteal_direct, allocstall_*, thp_*, numa_miss,
                         numa_foreign, numa_hint_faults, pswpin/pswpout
- /proc/pressure/{cpu,memory,io}  PSI "some"/"full" stall time totals in µs
                         [cat /proc/pressure/memory] — absent without CONFIG_PSI (or psi=0)

Signals: ``mem.all.<vmstat key>`` (counters), ``psi.<res>.some_us`` / ``psi.<res>.full_us``
(counters: cumulative stall µs). A missing key is absent from the sample, never 0.
"""

from __future__ import annotations

from collectors.base import Availability
from collectors.host import Host
from collectors.layout import LayoutBuilder, TokenLayout
from collectors.parsers import ParseError

VMSTAT_KEYS: frozenset[bytes] = frozenset(k.encode() for k in (
    "pgfault", "pgmajfault", "compact_stall", "compact_fail", "compact_success",
    "pgscan_direct", "pgsteal_direct", "pgscan_kswapd", "allocstall_normal",
    "allocstall_movable", "allocstall_dma32", "thp_fault_alloc", "thp_fault_fallback",
    "thp_collapse_alloc", "thp_split_page", "numa_miss", "numa_foreign", "numa_hint_faults",
    "numa_pages_migrated", "pswpin", "pswpout", "workingset_refault_file",
    "workingset_refault_anon", "pgmigrate_success"))


def fast_vmstat(data: bytes, keys: frozenset[bytes] = VMSTAT_KEYS) -> dict[str, float]:
    """/proc/vmstat bytes ("name value" lines) → ``mem.all.<key>`` for the keys kept. Pure;
    raises :class:`~collectors.parsers.ParseError` on an empty file, a line of another shape
    or a kept value that is not a decimal."""
    out: dict[str, float] = {}
    empty = True
    for line in data.split(b"\n"):
        kv = line.split()
        if not kv:
            continue
        empty = False
        if len(kv) != 2:
            raise ParseError(f"bad /proc/vmstat line {line[:40]!r}")
        k, v = kv
        if k in keys:
            if not v.lstrip(b"-").isdigit() or len(v) > 21:
                raise ParseError(f"bad /proc/vmstat value {v[:24]!r} for {k[:40]!r}")
            out["mem.all." + k.decode()] = float(v)
    if empty:
        raise ParseError("empty /proc/vmstat")
    return out


def vmstat_layout(data: bytes, keys: frozenset[bytes] = VMSTAT_KEYS) -> TokenLayout:
    """The :class:`~collectors.layout.TokenLayout` of /proc/vmstat for the keys kept (the
    same signals as :func:`fast_vmstat`). Pure."""
    it = data.split()
    if not it:
        raise ValueError("empty /proc/vmstat")
    b = LayoutBuilder()
    for i in range(0, len(it) - 1, 2):
        if it[i] in keys:
            b.name(i, it[i])
            b.value(i + 1, "mem.all." + it[i].decode())
    b.advance(len(it))
    return b.build(signed=True)  # parse_vmstat reads values with parse_int


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


class MemoryCollector:
    """vmstat + PSI (see module docstring)."""

    name = "memory"
    replayable = True  # reads only host.open_hot files: the native sampler can feed it
    # 20 Hz: generating /proc/vmstat costs ~20 µs of kernel time per read; a fault or
    # reclaim storm that hurts the tail lasts longer than 50 ms, and the probe's own
    # getrusage fault counts are the per-sample evidence.
    period_s = 0.05

    def __init__(self, host: Host) -> None:
        self.host = host
        self._vm = None
        self._psi: dict[str, object] = {}
        self._layout: TokenLayout | None = None
        self._psi_layouts: dict[str, TokenLayout] = {}
        self._plan: tuple | None = None
        self.unsupported: dict[str, str] = {}

    def available(self) -> Availability:
        try:
            self._open()
        except OSError as exc:
            return Availability.no(f"/proc/vmstat: {exc.strerror}")
        return Availability.yes()

    def _open(self) -> None:
        if self._vm is not None:
            return
        self._vm = self.host.open_hot(self.host.proc("vmstat"))
        for res in ("cpu", "memory", "io"):
            p = self.host.proc("pressure", res)
            if self.host.exists(p):
                self._psi[res] = self.host.open_hot(p)
                # "some avg10=… avg60=… avg300=… total=N" + the same for "full": parsed
                # with this layout in sample() and by the native reader
                self._psi_layouts[res] = TokenLayout(
                    10, (0, 5), (b"some", b"full"), (4, 9),
                    (f"psi.{res}.some_us", f"psi.{res}.full_us"), (b"total=", b"total="))
            else:
                self.unsupported[f"psi.{res}"] = "unsupported: no PSI (CONFIG_PSI off or psi=0)"

    def is_counter(self, name: str) -> bool:
        return True

    def sample(self) -> dict[str, float | None]:
        self._open()
        data = self._vm.read()
        tok = data.split()
        out: dict[str, float | None] | None = \
            self._layout.values(tok) if self._layout is not None else None
        if out is None:  # first read, or a kernel counter came or went
            self._layout = vmstat_layout(data)
            out = self._layout.values(tok)
        for res, hf in list(self._psi.items()):
            try:
                data = hf.read()
                vals = self._psi_layouts[res].values(data.split())
                out.update(vals if vals is not None else parse_psi(data, res))
            except OSError as exc:
                # PSI files reject reads when pressure accounting is off at runtime (EOPNOTSUPP)
                self.unsupported[f"psi.{res}"] = f"unsupported: {exc.strerror}"
                hf.close()
                del self._psi[res]
        return out

    def replay_plan(self) -> tuple | None:
        """The native sampler's shortcut: this row is vmstat's layout values, then each PSI
        file's some/full totals, exactly what :meth:`sample` returns while no layout
        changed (see agent/watch/feed.py). None until the first sample built the layout."""
        if self._layout is None or self._vm is None:
            return None
        p = self._plan
        if p is None or p[0][1] is not self._layout or len(p) != 1 + len(self._psi):
            p = self._plan = ((self._vm, self._layout),
                              *((hf, self._psi_layouts[res]) for res, hf in self._psi.items()))
        return p

    def close(self) -> None:
        self._plan = None
        if self._vm is not None:
            self._vm.close()
        for hf in self._psi.values():
            hf.close()
        self._vm = None
        self._psi.clear()
