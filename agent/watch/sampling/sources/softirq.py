"""SoftirqCollector: per-CPU deltas of /proc/softirqs (collectors/softirq.py: files, parse,
layout): ``softirq.<cpu>.<NAME>`` (NET_RX, TIMER, SCHED, RCU, ...; counters). Cheap (~3 µs a
read), sampled every round. [cat /proc/softirqs]"""

from __future__ import annotations

from functools import partial

from agent.watch.sampling.sources.base import HotSource
from collectors import softirq as softmod
from collectors.base import Availability
from collectors.host import Host


class SoftirqCollector(HotSource):
    name = "softirq"
    what = "/proc/softirqs"
    period_s = 0.0

    def __init__(self, host: Host, cpus: list[int] | None = None) -> None:
        super().__init__(host)
        self._want = frozenset(cpus) if cpus else None

    def _open_tracks(self) -> None:
        for key, path in softmod.files(self.host).items():
            self._add(key, path, partial(softmod.parse_softirq_counts, cpus=self._want),
                      partial(softmod.softirqs_layout, cpus=self._want))

    def available(self) -> Availability:
        if not self.host.exists(self.host.proc("softirqs")):
            return Availability.no("absent: no /proc/softirqs")
        return super().available()
