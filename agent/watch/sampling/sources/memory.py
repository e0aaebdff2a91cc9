"""MemoryCollector: /proc/vmstat fault, reclaim, compaction, THP and NUMA counters, and PSI
stall totals (collectors/memory.py: files, parse, layout): ``mem.all.<vmstat key>``,
``psi.<res>.some_us`` / ``psi.<res>.full_us`` (counters) [vmstat 1; cat /proc/pressure/memory].
No PSI (CONFIG_PSI off, psi=0, or its files refusing reads at runtime): those signals are
absent and listed in ``unsupported``, never 0.
"""

from __future__ import annotations

from functools import partial

from agent.watch.sampling.sources.base import HotSource
from collectors import memory as memmod
from collectors.host import Host


class MemoryCollector(HotSource):
    name = "memory"
    what = "/proc/vmstat"
    # 20 Hz: generating /proc/vmstat costs ~20 µs of kernel time per read; a fault or
    # reclaim storm that hurts the tail lasts longer than 50 ms, and the probe's own
    # getrusage fault counts are the per-sample evidence.
    period_s = 0.05

    def __init__(self, host: Host) -> None:
        super().__init__(host)

    def _open_tracks(self) -> None:
        for key, path in memmod.files(self.host).items():
            if key == "vmstat":
                self._add(key, path, memmod.parse_vmstat_counters, memmod.vmstat_layout)
                continue
            res = key.split(".", 1)[1]
            if self.host.exists(path):
                self._add(key, path, partial(memmod.parse_psi, resource=res),
                          partial(memmod.psi_layout, resource=res))
            else:
                self.unsupported[f"psi.{res}"] = memmod.NO_PSI

    def row(self, reads: dict) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key, data in reads.items():
            if isinstance(data, OSError):
                if key == "vmstat":
                    raise data
                # PSI files reject reads when pressure accounting is off at runtime
                # (EOPNOTSUPP): that resource is unsupported from now on
                self.unsupported[f"psi.{key.split('.', 1)[1]}"] = \
                    f"unsupported: {data.strerror}"
                self._drop(key)
                continue
            out.update(self.values(self.tracks[key], data))
        return out
