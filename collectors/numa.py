"""Per-node NUMA allocation counters for the probe's node(s).

Source: /sys/devices/system/node/node<N>/numastat: numa_hit, numa_miss, numa_foreign,
interleave_hit, local_node, other_node (pages, counters) [numastat -n].
Signals: ``numa.<node>.<key>`` (counters). A box without the node directory (non-NUMA
kernels) is unsupported, not zeros.
"""

from __future__ import annotations

from collectors.base import Availability
from collectors.host import Host
from collectors.layout import LayoutBuilder, TokenLayout
from collectors.parsers import parse_cpulist


def parse_numastat(data: bytes, node: int) -> dict[str, float]:
    """numastat bytes → ``numa.<node>.<key>``. Pure."""
    out: dict[str, float] = {}
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[f"numa.{node}.{parts[0].decode()}"] = float(parts[1])
    if not out:
        raise ValueError("empty numastat")
    return out


def numastat_layout(data: bytes, node: int) -> TokenLayout:
    """The :class:`~collectors.layout.TokenLayout` of one numastat read: the same values as
    :func:`parse_numastat` on any read with this layout. Pure."""
    b = LayoutBuilder()
    for line in data.split(b"\n"):
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            b.name(0, parts[0])
            b.value(1, f"numa.{node}.{parts[0].decode()}")
        b.advance(len(parts))
    return b.build()


def nodes_of_cpus(host: Host, cpus: list[int]) -> list[int]:
    """NUMA nodes holding ``cpus`` (from nodeN/cpulist); [] when there is no node directory."""
    base = host.sys("devices/system/node")
    out = []
    for name, d in host.glob_dirs(base, "node"):
        if not name[4:].isdigit():
            continue
        r = host.read(d / "cpulist").map(parse_cpulist)
        if r.ok and (not cpus or set(r.value) & set(cpus)):
            out.append(int(name[4:]))
    return sorted(out)


class NumaCollector:
    """numastat of the nodes holding the probe CPUs (see module docstring). 10 Hz."""

    name = "numa"
    replayable = True  # reads only host.open_hot files: the native sampler can feed it
    period_s = 0.1

    def __init__(self, host: Host, cpus: list[int]) -> None:
        self.host = host
        self.nodes = nodes_of_cpus(host, cpus)
        self._files: dict[int, object] = {}
        self._layouts: dict[int, TokenLayout] = {}
        self._plan: tuple | None = None

    def available(self) -> Availability:
        if not self.nodes:
            return Availability.no("unsupported: no /sys/devices/system/node")
        try:
            self._open()
        except OSError as exc:
            return Availability.no(f"numastat: {exc.strerror}")
        return Availability.yes()

    def _open(self) -> None:
        for n in self.nodes:
            if n not in self._files:
                self._files[n] = self.host.open_hot(
                    self.host.sys("devices/system/node", f"node{n}", "numastat"))

    def is_counter(self, name: str) -> bool:
        return True

    def sample(self) -> dict[str, float | None]:
        self._open()
        out: dict[str, float | None] = {}
        for n, hf in self._files.items():
            data = hf.read()
            lay = self._layouts.get(n)
            vals = lay.values(data.split()) if lay is not None else None
            if vals is None:  # first read, or the file changed shape: parse, new layout
                vals = parse_numastat(data, n)
                self._layouts[n] = numastat_layout(data, n)
                self._plan = None
            out.update(vals)
        if self._plan is None:
            self._plan = tuple((hf, self._layouts[n]) for n, hf in self._files.items())
        return out

    def replay_plan(self) -> tuple | None:
        """The native sampler's shortcut (agent/watch/feed.py): this row is each node's
        numastat layout values, as :meth:`sample` returns them."""
        return self._plan

    def close(self) -> None:
        self._plan = None
        self._layouts.clear()
        for hf in self._files.values():
            hf.close()
        self._files.clear()
