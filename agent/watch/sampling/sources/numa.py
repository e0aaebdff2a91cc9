"""NumaCollector: numastat of the NUMA nodes holding the probe CPUs (collectors/numa.py:
files, parse, layout): ``numa.<node>.<key>`` (counters) [numastat -n]. 10 Hz. A box without
the node directory (non-NUMA kernels) is unsupported, not zeros."""

from __future__ import annotations

from functools import partial

from agent.watch.sampling.sources.base import HotSource
from collectors import numa as numamod
from collectors.base import Availability
from collectors.host import Host


class NumaCollector(HotSource):
    name = "numa"
    what = "numastat"
    period_s = 0.1

    def __init__(self, host: Host, cpus: list[int]) -> None:
        super().__init__(host)
        self.nodes = numamod.nodes_of_cpus(host, cpus)

    def _open_tracks(self) -> None:
        for key, path in numamod.files(self.host, self.nodes).items():
            node = int(key[4:])
            self._add(key, path, partial(numamod.parse_numastat, node=node),
                      partial(numamod.numastat_layout, node=node))

    def available(self) -> Availability:
        if not self.nodes:
            return Availability.no("unsupported: no /sys/devices/system/node")
        return super().available()
