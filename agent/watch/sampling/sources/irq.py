"""IrqCollector: per-CPU interrupt counts from /proc/interrupts, naming the IRQ
(collectors/irq.py: files, parse, layout).

Signals (counters): ``irq.<cpu>.<row>`` (row = IRQ number or LOC/RES/CAL/TLB/...),
``irq.all.ERR``. :attr:`IrqCollector.descriptions` maps an IRQ row to its chip/device text
("PCI-MSIX-0000:00:03.0 2-edge virtio2-output.0") so a cause can say which device interrupted.
[watch -n1 cat /proc/interrupts]

Cost: the kernel generates /proc/interrupts on every read and the cost grows with CPUs ×
IRQs (~60 µs for the read plus ~30 µs of parsing on a 2-CPU VM), so it is sampled at 20 Hz;
/proc/softirqs (3 µs) every round by the softirq source. ``cpus`` restricts the signals kept
(the probe CPUs), not the read.
"""

from __future__ import annotations

from functools import partial

from agent.watch.sampling.sources.base import HotSource
from collectors import irq as irqmod
from collectors.host import Host


class IrqCollector(HotSource):
    name = "irq"
    what = "/proc/interrupts"
    period_s = 0.05
    desc_every = 100  # full parse (device names) every 100th row: 5 s at 20 Hz

    def __init__(self, host: Host, cpus: list[int] | None = None) -> None:
        super().__init__(host)
        self._want = frozenset(cpus) if cpus else None
        self.descriptions: dict[str, str] = {}

    def _open_tracks(self) -> None:
        for key, path in irqmod.files(self.host).items():
            self._add(key, path, self._counts, partial(irqmod.interrupts_layout, cpus=self._want))

    def _counts(self, data: bytes) -> dict[str, float]:
        return irqmod.parse_interrupt_counts(data, self._want)[0]

    def next_row_parses(self) -> bool:
        return (self.rows + 1) % self.desc_every == 0

    def row(self, reads: dict) -> dict[str, float | None]:
        data = reads.get("interrupts")
        if data is None:
            return {}
        if isinstance(data, OSError):
            raise data
        t = self.tracks["interrupts"]
        if t.layout is not None and self.rows % self.desc_every:
            out = t.layout.values(data)
            if out is not None:
                return out  # type: ignore[return-value]
        # First read, a changed layout (an IRQ came or went), or time to refresh the device
        # names (a driver rebound to the same IRQ number): the full parse.
        out, desc = irqmod.parse_interrupt_counts(data, self._want)
        if desc:
            self.descriptions = desc
        t.layout = t.build(data)
        return out  # type: ignore[return-value]
