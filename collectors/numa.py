"""Per-node NUMA allocation counters for the probe's node(s).

Source: /sys/devices/system/node/node<N>/numastat: numa_hit, numa_miss, numa_foreign,
interleave_hit, local_node, other_node (pages, counters) [numastat -n].
Signals (:func:`files`, :func:`parse`, :func:`layout`; sampled by
agent/watch/sampling/sources/numa.py): ``numa.<node>.<key>`` (counters). A box without the
node directory (non-NUMA kernels) is unsupported, not zeros.
"""

from __future__ import annotations

from pathlib import Path

from collectors.host import Host
from collectors.layout import LayoutBuilder, TokenLayout, parser_text
from collectors.parsers import ParseError, parse_uint


def files(host: Host, nodes: list[int]) -> dict[str, Path]:
    """The numastat file of each node, by key ``node<N>``."""
    return {f"node{n}": host.sys("devices/system/node", f"node{n}", "numastat")
            for n in nodes}


def parse_numastat(data: bytes, node: int) -> dict[str, float]:
    """numastat bytes ("numa_hit 123" lines, drivers/base/node.c) → ``numa.<node>.<key>``.
    A line of another shape or a count that is not one (parse_uint) raises
    :class:`~collectors.parsers.ParseError`, as does an empty file. Pure."""
    out: dict[str, float] = {}
    for line in parser_text(data, "numastat").split("\n"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ParseError(f"bad numastat line {line[:40]!r}")
        out[f"numa.{node}.{parts[0]}"] = float(parse_uint(parts[1], f"numastat {parts[0]}"))
    if not out:
        raise ParseError("empty numastat")
    return out


def numastat_layout(data: bytes, node: int) -> TokenLayout | None:
    """The token layout of one numastat read giving :func:`parse_numastat`'s values (names:
    every key). Pure."""
    b = LayoutBuilder()
    for line in data.split(b"\n"):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            return None
        b.name(0, parts[0])
        b.value(1, f"numa.{node}.{parts[0].decode(errors='replace')}")
        b.advance(2)
    return b.build(data)


def parse(reads: dict[str, bytes]) -> dict[str, float]:
    """The NUMA counters of one read of :func:`files`. Pure."""
    out: dict[str, float] = {}
    for key, data in reads.items():
        out.update(parse_numastat(data, int(key[4:])))
    return out


def layout(key: str, data: bytes) -> TokenLayout | None:
    return numastat_layout(data, int(key[4:]))


def nodes_of_cpus(host: Host, cpus: list[int]) -> list[int]:
    """NUMA nodes holding ``cpus`` (from nodeN/cpulist, else nodeN/cpumap:
    collectors.system.node_cpus); [] when there is no node directory."""
    from collectors.system import numa_node_cpulists  # (collectors.system imports cpu, not us)
    return sorted(n for n, r in numa_node_cpulists(host).items()
                  if r.ok and (not cpus or set(r.value) & set(cpus)))
