"""The uniform collector interface used by `hftagent watch` and the exporter.

A collector reads one source (cpu, sched, irq, softirq, memory, numa, pcie, gpu, perf) and
returns raw counters and gauges named ``family.scope.signal`` (``cpu.3.freq_hz``,
``irq.3.NET_RX``, ``gpu.0.clock_event_reasons``). Rates and deltas are computed downstream. A
collector that fails is reported (success flag, duration) and skipped; it never stops the
others (:func:`run_collector`).

The sources whose signals are /proc and /sys files read every round (cpu, irq, softirq, memory,
numa, sched) are pure here: their modules give ``files(host)`` (the paths), ``parse(reads)``
(the signals of one read of them, built on collectors/parsers.py) and ``layout(key, data)``
(a collectors/layout.py TokenLayout: the same values without a parse). Their collectors, which
hold the files open and read them, are watch's (agent/watch/sampling/sources/).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str | None = None  # "unsupported: no cpufreq driver", "permission: ..."

    @classmethod
    def yes(cls) -> Availability:
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


@runtime_checkable
class Collector(Protocol):
    name: str

    def available(self) -> Availability: ...

    def sample(self) -> dict[str, float | None]: ...

    def close(self) -> None: ...


@dataclass
class CollectorResult:
    name: str
    success: bool
    duration_s: float
    values: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None


def run_collector(c: Collector) -> CollectorResult:
    """Sample one collector, isolating its failure from the others."""
    t0 = time.perf_counter()
    try:
        values = c.sample()
        return CollectorResult(c.name, True, time.perf_counter() - t0, values)
    except Exception as exc:  # noqa: BLE001 - a broken collector must never stop the others
        return CollectorResult(c.name, False, time.perf_counter() - t0, {},
                               f"{type(exc).__name__}: {exc}")
