"""Watch → Prometheus: builds the :class:`agent.export.metrics.WatchMetrics` a watch run exports
(:func:`watch_metrics`) and feeds it from the session (:class:`MetricsFeed`).

The exceedance counters (``hftagent_probe_exceedances_total{threshold_us}``) are the fleet
defaults (:data:`agent.export.metrics.DEFAULT_THRESHOLDS_NS`) plus the run's own
``--threshold-us`` (``WatchConfig.threshold_ns``) when one is given, so the spikes watch logs
and the share the exporter counts over the same line agree.

Exemplars: :meth:`MetricsFeed.on_record` is the session's ``on_record`` hook (every
spike-log record, agent/watch/output.py SpikeLog): a spike logged with a cause (attributed or
inherited) becomes the exemplar ``{spike_id="<seq>"}`` of the latency-histogram bucket its
sample fell in, so an OpenMetrics scrape links a slow bucket to the spike record that
explains it. The spike is known only after its sample was observed (detection and
attribution come later), hence a hook on the record rather than on the observation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime

import numpy as np


def watch_metrics(*, threshold_ns: int | None, source: str, variant: str,
                  p99_budget_us: int | None, service: str = ""):
    """The WatchMetrics of one watch run (``source``: "probe" or "client")."""
    from agent.export.metrics import DEFAULT_THRESHOLDS_NS, WatchMetrics
    thresholds = (*DEFAULT_THRESHOLDS_NS, threshold_ns) if threshold_ns else \
        DEFAULT_THRESHOLDS_NS
    return WatchMetrics(thresholds_ns=thresholds, source=source, variant=variant,
                        p99_budget_us=p99_budget_us, service=service)


class MetricsFeed:
    """Feeds an :class:`agent.export.metrics.WatchMetrics` from the session (every sample, every
    attributed spike, every collector result) at the rates its contract expects."""

    def __init__(self, metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.m = metrics
        self.clock = clock
        self._last_gauges = 0.0
        self._up = False

    def set_collector_result(self, res) -> None:
        self.m.set_collector(res.name, res.success, res.duration_s)

    def observe_many(self, lat_ns: np.ndarray) -> None:
        if not self._up:
            self.m.probe_up(True)
            self._up = True
        self.m.observe_many(lat_ns)

    def spike(self, cause: str) -> None:
        self.m.spike(cause)

    def on_record(self, rec: dict) -> None:
        """One spike-log record (WatchSession's ``on_record``). A spike logged with a cause
        puts its ``seq`` as the exemplar ``spike_id`` on the bucket of its ``latency_us``
        (the record's 0.1 µs rounding), stamped with its ``time``; records without a cause
        (not attributed) and flight-record notes are skipped."""
        seq, lat = rec.get("seq"), rec.get("latency_us")
        if rec.get("cause") is None or not isinstance(seq, int) or isinstance(seq, bool) \
                or not isinstance(lat, int | float) or not (math.isfinite(lat) and lat >= 0):
            return
        self.m.exemplar(str(seq), round(lat * 1000), _unix_s(rec.get("time")))

    def spike_causes(self, items: list[tuple[str, str, int]]) -> None:
        """One spike's kernel-event breakdown, (cause, culprit, ns) (agent/trace)."""
        self.m.spike_causes(items)

    def down(self) -> None:
        self.m.probe_up(False)
        self._up = False

    def set_gauges(self, session) -> None:
        """Once a second: the allowlisted host/GPU gauges (agent.export.metrics.GAUGES) from the
        latest row of each collector ring."""
        t = self.clock()
        if t - self._last_gauges < 1.0 or session.sampler is None:
            return
        self._last_gauges = t
        self.set_own_cost(session)
        for c in session.cfg.probe_cpus:
            v = _latest(session.sampler.ring("cpu"), f"cpu.{c}.freq_hz")
            if v is not None:
                self.m.set_gauge("cpu_frequency_hertz", v, cpu=str(c))
        gpu = session.sampler.ring("gpu")
        if gpu is not None:
            for g in sorted({n.split(".")[1] for n in list(gpu.cols) if n.count(".") == 2}):
                p = f"gpu.{g}."
                full = _full_row(gpu, p)
                for clock, key in (("sm", "sm_clock_hz"), ("memory", "mem_clock_hz")):
                    self.m.set_gauge("gpu_clock_hertz", _latest(gpu, p + key, full), gpu=g,
                                     clock=clock)
                mask = _latest(gpu, p + "clock_event_reasons", full)
                self.m.set_gpu_clock_event_reasons(g, None if mask is None else int(mask))
                self.m.set_gauge("gpu_foreign_processes", _latest(gpu, p + "foreign_processes"),
                                 gpu=g)
        pcie = session.sampler.ring("pcie")
        if pcie is not None:
            for dev in sorted({n[5:].rsplit(".", 1)[0] for n in list(pcie.cols)}):
                p = f"pcie.{dev}."
                speed, width = _latest(pcie, p + "speed_gts"), _latest(pcie, p + "width")
                mspeed, mwidth = _latest(pcie, p + "max_speed_gts"), _latest(pcie, p + "max_width")
                self.m.set_gauge("pcie_link_speed_transfers_per_second",
                                 None if speed is None else speed * 1e9, device=dev)
                self.m.set_gauge("pcie_link_width", width, device=dev)
                known = None not in (speed, mspeed) or None not in (width, mwidth)
                degraded = (speed is not None and mspeed is not None and speed < mspeed) or \
                    (width is not None and mwidth is not None and width < mwidth)
                self.m.set_gauge("pcie_link_degraded", float(degraded) if known else None,
                                 device=dev)


    def set_own_cost(self, session) -> None:
        """Watch's own CPU by part, its budget and what it decided, and the cost charged to
        an attached service (agent/watch/budget.py; the summary's ``own_cpu``)."""
        own, b = getattr(session, "own", None), getattr(session, "budget", None)
        if own is None:
            return
        info = getattr(session.source, "info", None) or {}
        self.m.set_own_cost(own.by_part(), budget_share=b.share if b is not None else None,
                            exact=b.exact if b is not None else 0,
                            skipped=b.skipped if b is not None else 0,
                            shed=session.schedule.shed_n if b is not None else 0,
                            cost_us_per_call=(info.get("attach") or {}).get("cost_us_per_call"))


def _unix_s(iso) -> float | None:
    """A spike record's ``time`` (ISO 8601 with its offset) as Unix seconds; None if absent
    or unreadable."""
    try:
        return datetime.fromisoformat(iso).timestamp() if isinstance(iso, str) else None
    except ValueError:
        return None


def _latest(ring, name: str, row: int | None = None) -> float | None:
    """The value of ``name`` in the ring's latest row, or in ring row ``row`` (None: not
    measured)."""
    if ring is None or not ring.rows:
        return None
    idx = ring.window(ring.latest_t1, ring.latest_t1) if row is None else np.array([row])
    v = ring.column(name, idx)
    return float(v[-1]) if len(v) and v[-1] == v[-1] else None


def _full_row(gpu, p: str) -> int | None:
    """The ring row of GPU ``p``'s newest sample that read every signal: the latest, unless
    the GPU collector read the process lists only there (``gpu.N.full_sample`` 0: the probe
    on no GPU, collectors/gpu.py ``idle_full_s``); then the newest with ``full_sample`` 1
    within the ring (None: the latest row's values)."""
    i = gpu.cols.get(p + "full_sample")
    if i is None:
        return None
    idx = gpu._order()
    flags = gpu.data[idx, i]
    if not len(flags) or flags[-1] != 0:
        return None
    hit = np.flatnonzero(flags == 1)
    return int(idx[hit[-1]]) if len(hit) else None
