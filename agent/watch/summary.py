"""What ``hftagent watch`` reports about a run: the run's latency histogram
(:class:`LatencyHistogram`), the summary at the end (:func:`build`, printed by
agent/commands/watch.py or as ``--json``), and the rolling figures of the live view
(:func:`rolling`).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from agent import stats
from agent.causes import CAUSES
from agent.client import FIELDS
from agent.watch.budget import cost_summary

F = {name: i for i, name in enumerate(FIELDS)}
ROLLING_SAMPLES = 10_000  # the live view's window


class LatencyHistogram:
    """Log-bucketed latency counts (1 % wide buckets from 1 µs to ~100 s): bounded memory for
    a days-long run; percentiles within 1 %.

    :meth:`add` only keeps the batch: the batches are bucketed together once
    :data:`FLUSH_SAMPLES` wait, or when a figure is read (``counts``, ``total``, ``max_ns``,
    :meth:`quantile`) — the same counts, in a few array operations every few seconds
    instead of at each of watch's loop steps (each runs cold after its sleep, where a
    dozen small array operations cost ~0.15 ms of CPU on a 2-vCPU VM)."""

    BASE = 1.01
    LO_NS = 1000.0
    FLUSH_SAMPLES = 4096

    def __init__(self) -> None:
        self.n_buckets = int(math.log(1e11 / self.LO_NS) / math.log(self.BASE)) + 2
        self._counts = np.zeros(self.n_buckets, dtype=np.int64)
        self._total = 0
        self._max_ns = 0
        self._pending: list[np.ndarray] = []
        self._n_pending = 0

    def add(self, lat_ns: np.ndarray) -> None:
        if not len(lat_ns):
            return
        self._pending.append(lat_ns)
        self._n_pending += len(lat_ns)
        if self._n_pending >= self.FLUSH_SAMPLES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        lat_ns = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._n_pending = [], 0
        idx = np.floor(np.log(np.maximum(lat_ns, self.LO_NS) / self.LO_NS)
                       / math.log(self.BASE)).astype(np.int64) + 1
        idx = np.clip(idx, 0, self.n_buckets - 1)
        self._counts += np.bincount(idx, minlength=self.n_buckets)
        self._total += len(lat_ns)
        self._max_ns = max(self._max_ns, int(lat_ns.max()))

    @property
    def counts(self) -> np.ndarray:
        self._flush()
        return self._counts

    @property
    def total(self) -> int:
        return self._total + self._n_pending

    @property
    def max_ns(self) -> int:
        self._flush()
        return self._max_ns

    def quantile(self, q: float) -> float | None:
        """The nearest-rank quantile ``q`` (a fraction: 0.99) to within 1 %; None when empty."""
        self._flush()
        if not self._total:
            return None
        rank = stats.nearest_rank(stats.percent(q), self._total)
        i = int(np.searchsorted(np.cumsum(self._counts), rank))
        # the bucket's upper edge (within 1 % above the true value), never above the maximum
        return min(self.LO_NS * self.BASE ** i, float(self._max_ns))


def build(s, *, native: bool, now_ns: int) -> dict:
    """The summary of session ``s`` (a :class:`agent.watch.session.WatchSession`);
    ``native``: its sampler is the native reader's; ``now_ns``: the session clock's now."""
    h = s.hist
    dur = ((s.ended_ns or now_ns) - s.started_ns) / 1e9 if s.started_ns else 0.0
    col = {}
    smp = s.sampler
    if smp is not None:
        for name, st in smp.stats.per_collector.items():
            col[name] = st.to_dict()
        for e in getattr(smp, "entries", ()):
            r = e.ring
            if (r.dropped_signals or r.reused_signals) and e.state.name in col:
                # a full ring: new signals without a column (their values not kept), and
                # the columns given to a new signal by one silent for ring.stale_s
                col[e.state.name].update(signals_refused=r.dropped_signals,
                                         columns_reused=r.reused_signals)
            if getattr(e, "adapt", None) is not None and e.state.name in col:
                # an adaptive period (gpu: 1 s while the probe is on no GPU) as it ends
                col[e.state.name]["period_s_now"] = round(smp.period_now_ns(e) / 1e9, 3)
        st = smp.stats
        sampler = {"mode": smp.mode, "rounds": st.rounds, "late_rounds": st.late_rounds,
                   "cpu_share_of_one_cpu": round(st.cpu_ns / 1e9 / dur, 4) if dur else None,
                   "cpu_us_per_round": round(st.cpu_ns / st.rounds / 1e3, 1) if st.rounds
                   else None,
                   "mean_round_us": round(st.busy_ns / st.rounds / 1e3, 1) if st.rounds
                   else None,
                   "pinned_to": s.pinned_to, "pin_error": smp.pin_error,
                   "note": s.sampler_note,
                   # the sources polled less because kernel events cover them (from, to Hz)
                   "reduced_by_events": getattr(s, "reduced_by_events", None) or {}}
        if native:
            fs = smp.feed.stats()
            sampler.update({
                "note": smp.native_error,
                "helper_pid": fs["pid"], "ring_overruns": fs["overruns"],
                "helper_cpu_share": round(fs["cpu_ns"] / 1e9 / dur, 4) if dur else None,
                "drain_cpu_share": round(smp.drain_cpu_ns / 1e9 / dur, 4) if dur else None})
    else:
        sampler = {}
    for name, reason in s.unavailable.items():
        col[name] = {"state": "unsupported", "reason": reason}
    delays = sorted(s.attr_delays_ms)
    cpu_busy = cpu_busy_share(s)
    native_error = smp.native_error if native else None
    own = s.source.summary(s.lat)  # the source's own lines (agent/watch/latency/)
    return {
        "source": own["source"], "source_kind": own["source_kind"], "pid": own["pid"],
        "probe_cpus": s.cfg.probe_cpus, "rate_hz": own["rate_hz"],
        "rate_auto": own["rate_auto"], "probe_cpu_busy": cpu_busy,
        "probe_calls_busy": own["probe_calls_busy"],
        "duration_s": round(dur, 2),
        "samples": s.samples, "lost_records": s.reader.lost if s.reader else 0,
        "invalid_records": s.reader.invalid if s.reader else 0,
        "p50_us": us(h.quantile(0.5)), "p99_us": us(h.quantile(0.99)),
        "p999_us": us(h.quantile(0.999)), "max_us": us(h.max_ns or None),
        # enough samples to claim the percentile at 99 % confidence (as the probe's)
        "sufficient": stats.sufficient(s.samples),
        "spikes": s.spikes, "attributed": s.attributed,
        "not_attributed": s.not_attributed, "inherited": s.inherited,
        "queued": s.queued, "attributed_without_events": s.without_events,
        "unexplained_with_nearest_exact": s.stories.annotated,
        "causes": {c: {"count": n, "share": round(n / s.attributed, 3),
                       "label": CAUSES.get(c, c),
                       "top": [d for d, _ in s.cause_details.get(c, Counter())
                               .most_common(3)]}
                   for c, n in s.cause_counts.most_common()},
        "attribution_delay_ms": {"p50": delays[len(delays) // 2] if delays else None,
                                 "max": delays[-1] if delays else None},
        "flight_records": s.flight_files, "collectors": col, "sampler": sampler,
        "own_cpu": own_cost(s, dur),
        # --attach --gpu-probes: the hits paid per call, the spikes' split (gpu_probes.py)
        **({"gpu": own["gpu"]} if "gpu" in own else {}),
        # --attach --pmu: the calls counted, or why not (agent/watch/attribution/pmu.py)
        **({"pmu": s.pmu.stats()} if getattr(s, "pmu", None) is not None else {}),
        # a service followed by identity: each of its processes (calls timed, re-arm delay,
        # calls missed before its timing: agent/watch/latency/identity.py)
        **{k: own[k] for k in ("processes", "processes_earlier") if k in own},
        "source_error": s.source_error, "stopped_by": s.stopped_by,
        "output_error": s.output_error,
        "warnings": s.warnings + _invalid_warning(s) + s.source.end_warnings(s.lat, h, cpu_busy)
        + ([native_error] if native_error else []),
    }


def own_cost(s, dur: float) -> dict:
    """Watch's own CPU by part, its budget and what the budget decided (the spikes whose
    polled rules it shed and how long the sampler's rounds were slowed included), and for a source that charges the watched service a cost
    per call (an attached process: the uprobes' ``cost_us_per_call`` in its attach plan) that
    cost × its calls a second (:func:`agent.watch.budget.cost_summary`)."""
    charged = (s.source.info.get("attach") or {}).get("cost_us_per_call")
    slow_s = getattr(s.sampler, "slow_s", None)  # (None: no sampler, or a test's stand-in)
    return cost_summary(s.own, s.budget, dur, charged, s.samples, s.schedule.shed_n,
                        slow_s() if slow_s is not None else 0.0)


def rolling(s) -> dict:
    """The live view's figures over the last :data:`ROLLING_SAMPLES` samples of session
    ``s``: nearest-rank P50/P99/P99.9 (µs) and the share over the spike threshold."""
    last = s.lat.last(ROLLING_SAMPLES)
    if not len(last):
        return {}
    lat = np.sort(last[:, F["end_ns"]] - last[:, F["start_ns"]])
    n = len(lat)

    def q(p):
        return float(stats.quantile_sorted(lat, stats.percent(p))) / 1e3
    out = {"n": n, "p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999)}
    thr = s.cfg.threshold_ns or s.cfg.k_p50 * s.detector.p50_ns
    out["jitter_rate"] = float((lat > thr).mean()) if thr else 0.0
    return out


def _invalid_warning(s) -> list[str]:
    n = s.reader.invalid if s.reader is not None else 0
    if not n:
        return []
    return [f"{n} record(s) of the latency ring {s.reader.path} failed validation "
            "(impossible timestamps, pids, CPUs or evidence, or a corrupt slot): dropped, "
            "not counted in the percentiles"]


def cpu_busy_share(s) -> float | None:
    """The probe CPUs' measured busy share over the sampler's rows (its rings keep the last
    30 s or more): the /proc/stat ticks of those CPUs that were neither idle nor iowait, over
    all their ticks [mpstat -P N: 100 − %idle − %iowait] — steal counts as busy (the CPU was
    not free for the probe). At most 1. None without the cpu collector's rows."""
    ring = s.sampler.ring("cpu") if s.sampler is not None else None
    if ring is None or not ring.rows:
        return None
    from collectors.cpu import STAT_FIELDS
    idx = ring.window(0, ring.latest_t1)
    busy = total = 0.0
    for c in s.cfg.probe_cpus:
        ticks = {f: float(np.nansum(ring.column(f"cpu.{c}.{f}_ticks", idx)))
                 for f in STAT_FIELDS}
        total += sum(ticks.values())
        busy += sum(ticks.values()) - ticks["idle"] - ticks["iowait"]
    return min(1.0, busy / total) if total > 0 else None


def us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 1)


def short(detail: str) -> str:
    """The example of a cause for the summary: who ran on the CPU, else the detail's head.
    A detail wrapped by a re-labelled cause ("softirq work in ksoftirqd/1 preempted the probe
    (…; X ran on CPU 1)") loses the wrapper's closing parenthesis with its head."""
    if "ran on CPU" not in detail:
        return detail.split(":")[0]
    tail = detail.split(";")[-1].strip()
    while tail.endswith(")") and tail.count(")") > tail.count("("):
        tail = tail[:-1]
    return tail
