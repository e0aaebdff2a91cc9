"""WatchMetrics: the state `hftagent watch` feeds and the Prometheus exporter reads.

Contract (for the watch loop; the exporter in :mod:`agent.export.server` only reads this object)
--------------------------------------------------------------------------------------------
One ``WatchMetrics`` per process, built in the composition function (nothing at import)::

    m = WatchMetrics(thresholds_ns=(500_000, 1_000_000, 5_000_000), source="probe",
                     variant="xla", p99_budget_us=2000)  # optional: the box's P99 budget

``service``: the service a source times, by the name watch was given (``--attach-name``,
``--attach-unit``, ``--attach-cgroup``), never a pid, so its series survive the service's
restarts: ``hftagent_probe_info``'s ``service`` label (absent for a source without one; at
most :data:`MAX_SERVICE_LABEL` characters, control characters replaced).

``thresholds_ns``: the exceedance counters' thresholds, whole ns (1 ns to 1e9 µs), labelled in
µs as the fleet's rules name them (``threshold_us="5000"``, or ``"2500.5"`` for 2,500,500 ns);
`hftagent watch` passes :data:`DEFAULT_THRESHOLDS_NS` plus its ``--threshold-us``, converted
to ns once, when the option is parsed (agent/watch/options.py, agent/watch/metrics_feed.py).

Every method is thread-safe. Writers and the scrape never block each other for long: each
write holds one uncontended lock for a few list/array stores; a scrape copies the state under
that lock and does all formatting and quantile work outside it.

Hot path (probe thread, up to ~1 kHz)
    ``observe(latency_ns)``        one probe sample, int nanoseconds, wall time of one call.
                                   Updates the histogram, the sample count, the exceedance
                                   counts (a sample *over* a threshold, strictly) and the
                                   rolling window (the last window_s seconds, at most
                                   window_capacity = 65,536 samples: 60 s at 1 kHz); stamps
                                   the last-sample time. No allocation
                                   beyond Python ints; ~1 µs.
    ``observe_many(latencies_ns)`` the same for a batch (numpy int64 array), if the probe
                                   prefers to flush its preallocated buffer periodically.

Probe state
    ``probe_up(up)``               True once the probe is warmed and timing; False while
                                   warming, restarting or after it died. Starts False.
                                   Staleness (no sample for a while) is visible separately
                                   through the last-sample timestamp; nothing to call.

Attribution and sampler (slow path: Hz, not kHz)
    ``spike(cause)``               one attributed slow sample. ``cause`` is one of
                                   :data:`CAUSES`; anything else is counted as "other" (the
                                   label set stays bounded whatever the engine emits).
    ``exemplar(spike_id, latency_ns, unix_s)``
                                   one logged spike's sample as an OpenMetrics exemplar
                                   ``{spike_id="…"}`` on the histogram bucket its latency
                                   falls in (the latest per bucket is kept; exported on
                                   OpenMetrics scrapes only, the classic text has none).
                                   ``spike_id``: the spike-log record's ``seq``
                                   (agent/watch/metrics_feed.py).
    ``spike_causes(items)``        the kernel-event breakdown of one spike: (cause, culprit,
                                   ns) triples (agent/trace); feeds
                                   ``hftagent_spike_cause_seconds_total{cause,culprit}``.
                                   Culprit labels are bounded: the first
                                   :data:`CULPRIT_TOP_K` culprits by time (the largest of a
                                   spike first) keep a label of their own for the life of
                                   the process, every other one is counted as "other" (a
                                   counter never moves between series, so a label once given
                                   stays); causes outside :data:`EVENT_CAUSES` are "other".
    ``gpu_split(parts_us)``        one spike's GPU split (agent/watch/attribution/
                                   gpu_split.py: enqueue, copies, gpu_wait, completion_lag,
                                   rest, µs each); feeds
                                   ``hftagent_spike_gpu_seconds_total{part}`` (a fixed label
                                   set: :data:`GPU_PARTS`; exported once a split was seen).
    ``set_collector(name, success, duration_s)``
                                   outcome of one collector run (collectors.base.CollectorResult
                                   has exactly these fields; ``set_collector_result(r)`` takes
                                   one directly). Up to :data:`MAX_COLLECTORS` names.
    ``set_gauge(name, value, **labels)``
                                   a host/GPU reading attribution relies on. ``name`` and the
                                   label names must be in :data:`GAUGES`; label values are
                                   validated (CPU/GPU indices, PCI addresses, fixed enums).
                                   ``value=None`` means "cannot be read now": the series is
                                   removed, never exported as 0. A bad name/label raises
                                   ValueError (a programming error: tests catch it).
    ``set_gpu_clock_event_reasons(gpu, mask)``
                                   decodes NVML's clock-event-reason bitmask
                                   (``gpu.N.clock_event_reasons``) into one 0/1 gauge per
                                   reason; None removes them.
    ``set_own_cost(cpu_ns_by_part, *, budget_share, exact, skipped, cost_us_per_call)``
                                   watch's own CPU time so far, ns by part (agent/watch/budget.py:
                                   sampler, source, detection, attribution, events, flight,
                                   other; up to :data:`MAX_OWN_PARTS` names), its CPU budget
                                   (a share of one CPU, None: none), the spikes the budget
                                   gave exact attribution, those it refused it and those
                                   whose polled rules it shed (totals so far), and what
                                   each timed call costs the watched service (µs; None:
                                   nothing charged, e.g. the built-in probe).
                                   Feeds ``hftagent_watch_cpu_seconds_total{part}``,
                                   ``hftagent_watch_cpu_budget_ratio``,
                                   ``hftagent_watch_budget_spikes_total{decision}``,
                                   ``hftagent_attach_cost_per_call_seconds`` and
                                   ``hftagent_attach_charged_cpu_seconds_total`` (the cost ×
                                   the samples timed). Totals only grow: a smaller one than
                                   already set is kept at the larger (counters never go back).
    ``set_audit(findings)``        the latest audit result (list of tuning.findings.Finding);
                                   replaces the previous one. Up to :data:`MAX_AUDIT_CHECKS`.

Reading (exporter, tests, benchmarks)
    ``snapshot()``                 a consistent, immutable :class:`Snapshot` of everything.

Units: latencies in int nanoseconds on the way in, seconds in the snapshot (base units at the
edge). Series bounds: see docs/fleet.md for the count per box.
"""

from __future__ import annotations

import math
import re
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from agent import stats
from agent.causes import CAUSES as ATTRIBUTION_CAUSES
from agent.causes import EVENT_KINDS, EVENT_RESIDUALS
from agent.defaults import EXCEEDANCE_THRESHOLDS_US, MAX_THRESHOLD_US

MAX_THRESHOLD_NS = int(MAX_THRESHOLD_US * 1000)

if TYPE_CHECKING:
    from tuning.findings import Finding

# Histogram bucket upper bounds, µs. Fit for 10 µs–100 ms with the resolution where inference
# budgets sit (0.3–5 ms), so histogram_quantile() over a fleet lands close to the true P99.
# The thresholds are merged in: the exceedance counters then equal count − bucket{le=threshold}.
DEFAULT_BUCKETS_US: tuple[int, ...] = (
    10, 20, 50, 100, 200, 300, 400, 500, 600, 800, 1000, 1500, 2000, 3000, 5000, 7500,
    10_000, 20_000, 50_000, 100_000)

# The exceedance counters' thresholds (ns) when none are given: agent.defaults' fleet set
# (the jitter threshold among them). `hftagent watch` adds its --threshold-us.
DEFAULT_THRESHOLDS_NS: tuple[int, ...] = tuple(t * 1000 for t in EXCEEDANCE_THRESHOLDS_US)

# Rolling-window quantiles exported as gauges (fractions: the Prometheus quantile labels), each
# claimed only with the samples agent.stats.required_samples asks for (99 % confidence: 14 for
# P50, DESIGN.md's 662 for P99 and 6,636 for P99.9). Below that the gauge is absent rather than
# a guess.
QUANTILES: tuple[float, ...] = (0.5, 0.99, 0.999)

# Causes of the attribution engine (the one list, agent/causes.py). Anything else is
# counted as "other".
CAUSES: tuple[str, ...] = (*ATTRIBUTION_CAUSES, "other")

# Causes of the kernel-event breakdown (the one list, agent/causes.py: the timeline's
# entity kinds but the probe, then hw_or_hypervisor and unexplained); anything else is "other".
EVENT_CAUSES: tuple[str, ...] = (*(k for k in EVENT_KINDS if k != "probe"), *EVENT_RESIDUALS,
                                 "other")
CULPRIT_TOP_K = 8  # culprit label values per process, plus "other"
MAX_SPIKE_ID_LEN = 64  # an exemplar's spike_id (OpenMetrics: ≤ 128 characters of labels)
MAX_CULPRIT_LEN = 64

AUDIT_STATUSES: tuple[str, ...] = (
    "ok", "warn", "fail", "unsupported", "pending-reboot", "error")

MAX_COLLECTORS = 32
# the parts of an attached GPU call's split (agent/watch/attribution/gpu_split.py PARTS)
GPU_PARTS = ("enqueue", "copies", "gpu_wait", "completion_lag", "rest")
MAX_OWN_PARTS = 16  # watch's own-cost parts (agent/watch/budget.py PARTS: 7)
# exact: the kernel-event window read; skipped: the polled rules' cause only; shed: the cause
# of a spike ms away on the same CPU (the always-on parts spent the budget)
BUDGET_DECISIONS: tuple[str, ...] = ("exact", "skipped", "shed")
MAX_AUDIT_CHECKS = 256
MAX_SERIES_PER_GAUGE = 512

# NVML clock-event ("throttle") reason bits, nvml.h nvmlClocksEventReason*.
GPU_CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

_CPU = re.compile(r"^(0|[1-9][0-9]{0,3})$")           # 0..9999
_GPU = re.compile(r"^(0|[1-9][0-9]?)$")               # 0..99
_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")  # 0000:17:00.0
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_SERVICE_LABEL = 128


def service_label(name: str) -> str:
    """The ``service`` label of ``name`` (what the options named: a regex, a unit, a cgroup
    path): control characters replaced by ``?``, at most :data:`MAX_SERVICE_LABEL`."""
    return "".join("?" if ord(c) < 32 or c == "\x7f" else c for c in name)[:MAX_SERVICE_LABEL]
_CHECK = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,63}$")


def _enum(*values: str) -> re.Pattern[str]:
    return re.compile("^(" + "|".join(re.escape(v) for v in values) + ")$")


@dataclass(frozen=True)
class GaugeSpec:
    """One allowed gauge: exported as ``hftagent_<name>``; labels in this order."""
    help: str
    labels: tuple[tuple[str, re.Pattern[str]], ...]


# The host and GPU gauges attribution relies on. Fixed: adding one is a code change, so the
# series count per box stays known (docs/fleet.md).
GAUGES: dict[str, GaugeSpec] = {
    "cpu_frequency_hertz": GaugeSpec(
        "Current frequency of a probe CPU (cpufreq scaling_cur_freq).",
        (("cpu", _CPU),)),
    "gpu_clock_hertz": GaugeSpec(
        "Current GPU clock (NVML nvmlDeviceGetClockInfo; nvidia-smi --query-gpu=clocks.sm).",
        (("gpu", _GPU), ("clock", _enum("graphics", "sm", "memory", "video")))),
    "gpu_clock_event_reason": GaugeSpec(
        "1 when the NVML clock-event (throttle) reason is active "
        "(nvidia-smi --query-gpu=clocks_event_reasons.active).",
        (("gpu", _GPU), ("reason", _enum(*GPU_CLOCK_EVENT_REASONS)))),
    "gpu_temperature_celsius": GaugeSpec(
        "GPU core temperature (nvidia-smi --query-gpu=temperature.gpu).", (("gpu", _GPU),)),
    "gpu_power_watts": GaugeSpec(
        "GPU power draw (nvidia-smi --query-gpu=power.draw).", (("gpu", _GPU),)),
    "gpu_foreign_processes": GaugeSpec(
        "Compute processes on the GPU other than the probe's.", (("gpu", _GPU),)),
    "pcie_link_degraded": GaugeSpec(
        "1 when the PCIe link runs below its maximum speed or width "
        "(current_link_speed/width vs max_link_speed/width in sysfs).", (("device", _PCI),)),
    "pcie_link_speed_transfers_per_second": GaugeSpec(
        "Current PCIe link speed per lane (sysfs current_link_speed, GT/s × 1e9).",
        (("device", _PCI),)),
    "pcie_link_width": GaugeSpec(
        "Current PCIe link width in lanes (sysfs current_link_width).", (("device", _PCI),)),
}


@dataclass(frozen=True)
class CollectorState:
    success: bool
    duration_s: float


@dataclass(frozen=True)
class Snapshot:
    """Everything the exporter prints, copied consistently at one instant."""
    source: str
    variant: str
    p99_budget_s: float | None
    bucket_bounds_s: tuple[float, ...]      # finite upper bounds; +Inf implied
    bucket_cumulative: tuple[int, ...]      # len(bounds) + 1 cumulative counts (last = count)
    count: int
    sum_s: float
    exceedances: dict[int | float, int]     # threshold µs -> samples strictly over it
    window_s: float
    window_samples: int
    quantiles: dict[float, float]           # only the ones the window has enough samples for
    probe_up: bool
    last_sample_unix_s: float | None        # None: no sample yet
    spikes: dict[str, int]                  # every cause in CAUSES, 0 included
    cause_seconds: dict[tuple[str, str], float]  # (cause, culprit) -> s; only those seen
    collectors: dict[str, CollectorState]
    audit: dict[str, str] | None            # check id -> status; None: no audit yet
    audit_unix_s: float | None
    gauges: dict[str, dict[tuple[str, ...], float]]
    dropped: dict[str, int]                 # label values refused because a bound was hit
    # per bucket (len(bounds) + 1, the last +Inf): the latest spike whose latency falls in it,
    # (spike_id, latency s, unix time s or None), or None
    bucket_exemplars: tuple[tuple[str, float, float | None] | None, ...] = ()
    # watch's own cost (set_own_cost): s by part, its budget (share of one CPU), the spikes
    # the budget decided, and what the watched service is charged (s a call; s in all)
    own_cpu_s: tuple[tuple[str, float], ...] = ()
    cpu_budget_ratio: float | None = None
    budget_spikes: tuple[tuple[str, int], ...] = ()
    attach_cost_per_call_s: float | None = None
    attach_charged_cpu_s: float | None = None
    service: str = ""                       # hftagent_probe_info's service label ("": none)
    # --gpu-probes: the spikes' GPU split, s by part (empty until a split was seen)
    gpu_split_s: tuple[tuple[str, float], ...] = ()


class WatchMetrics:
    """Thread-safe metric state for `hftagent watch` (see the module docstring)."""

    def __init__(self, thresholds_ns: Iterable[int] = DEFAULT_THRESHOLDS_NS, *,
                 source: str = "probe", variant: str = "", service: str = "",
                 buckets_us: Iterable[int] = DEFAULT_BUCKETS_US,
                 window_s: float = 60.0, window_capacity: int = 1 << 16,
                 quantile_refresh_s: float = 1.0, p99_budget_us: int | None = None) -> None:
        thr_ns = sorted({_threshold_ns(t) for t in thresholds_ns})
        if not thr_ns:
            raise ValueError("thresholds_ns must not be empty")
        # the label (µs): an int where whole ("5000"), else to the ns ("2500.5")
        self.thresholds_us = tuple(_us_key(t) for t in thr_ns)
        if not _NAME.match(source) or (variant and not re.match(r"^[A-Za-z0-9_.-]{1,32}$",
                                                                 variant)):
            raise ValueError(f"bad source/variant label: {source!r}/{variant!r}")
        if window_s <= 0 or window_capacity < 1024:
            raise ValueError("window_s must be > 0 and window_capacity >= 1024")
        self.source = source
        self.variant = variant
        self.service = service_label(service)
        # Exported as hftagent_probe_p99_budget_seconds; HftP99OverBudget compares the
        # histogram P99 with it (and with a 2 ms default where a box exports none).
        self.p99_budget_us = None if p99_budget_us is None else int(p99_budget_us)
        self._bounds_ns: list[int] = sorted({int(b) * 1000 for b in buckets_us} | set(thr_ns))
        self._bounds_s = tuple(b / 1e9 for b in self._bounds_ns)
        self._thr_index = {_us_key(t): self._bounds_ns.index(t) for t in thr_ns}
        self.window_s = float(window_s)
        self._window_ns = int(window_s * 1e9)
        self._cap = int(window_capacity)
        self._q_refresh_ns = int(quantile_refresh_s * 1e9)

        self._lock = threading.Lock()
        # Hot state: plain Python ints and typed arrays (no per-sample allocation).
        self._counts: list[int] = [0] * (len(self._bounds_ns) + 1)  # last: over the top bound
        self._n = 0
        self._sum_ns = 0
        self._ring_lat = array("q", bytes(8 * self._cap))
        self._ring_t = array("q", bytes(8 * self._cap))
        self._pos = 0
        self._last_mono_ns: int | None = None
        self._up = False
        # Slow state.
        self._spikes: dict[str, int] = dict.fromkeys(CAUSES, 0)
        self._cause_ns: dict[tuple[str, str], int] = {}
        self._culprits: set[str] = set()  # the culprits with a label of their own
        self._collectors: dict[str, CollectorState] = {}
        self._audit: dict[str, str] | None = None
        self._audit_unix_s: float | None = None
        self._gauges: dict[str, dict[tuple[str, ...], float]] = {g: {} for g in GAUGES}
        self._dropped: dict[str, int] = {}
        # the latest logged spike per bucket (exemplar): (spike_id, latency s, unix s)
        self._exemplars: list[tuple[str, float, float | None] | None] = \
            [None] * (len(self._bounds_ns) + 1)
        self._own_ns: dict[str, int] = {}
        self._budget_share: float | None = None
        self._budget_spikes: dict[str, int] = {}
        self._cost_per_call_ns: float | None = None
        self._gpu_ns: dict[str, int] = {}
        # Quantile cache: at most one window computation per quantile_refresh_s, however many
        # scrapers there are (50 concurrent scrapers must not multiply the work).
        self._q_lock = threading.Lock()
        self._q_at_ns: int | None = None
        self._q_value: tuple[int, dict[float, float]] = (0, {})

    # ---- hot path -------------------------------------------------------------------------

    def observe(self, latency_ns: int) -> None:
        """Record one probe sample (int ns). Called from the probe thread at up to ~1 kHz."""
        i = bisect_left(self._bounds_ns, latency_ns)
        now = time.monotonic_ns()
        with self._lock:
            self._counts[i] += 1
            self._n += 1
            self._sum_ns += latency_ns
            p = self._pos
            self._ring_lat[p] = latency_ns
            self._ring_t[p] = now
            p += 1
            self._pos = p if p < self._cap else 0
            self._last_mono_ns = now

    def observe_many(self, latencies_ns: np.ndarray) -> None:
        """Record a batch of samples (int64 ns), all stamped now."""
        lat = np.asarray(latencies_ns, dtype=np.int64)
        if lat.size == 0:
            return
        if lat.size > self._cap:  # only the newest fit in the window; all are counted
            head, lat_w = lat, lat[-self._cap:]
        else:
            head = lat_w = lat
        idx = np.searchsorted(np.asarray(self._bounds_ns, dtype=np.int64), head, side="left")
        add = np.bincount(idx, minlength=len(self._counts)).tolist()
        total = int(head.sum())
        now = time.monotonic_ns()
        with self._lock:
            for k, c in enumerate(add):
                if c:
                    self._counts[k] += c
            self._n += int(head.size)
            self._sum_ns += total
            ring_lat = np.frombuffer(self._ring_lat, dtype=np.int64)
            ring_t = np.frombuffer(self._ring_t, dtype=np.int64)
            p, m = self._pos, lat_w.size
            first = min(m, self._cap - p)
            ring_lat[p:p + first] = lat_w[:first]
            ring_t[p:p + first] = now
            if m > first:
                ring_lat[:m - first] = lat_w[first:]
                ring_t[:m - first] = now
            self._pos = (p + m) % self._cap
            self._last_mono_ns = now
            del ring_lat, ring_t  # release the buffer exports

    # ---- probe state ----------------------------------------------------------------------

    def probe_up(self, up: bool) -> None:
        """Whether the probe is warmed and producing samples."""
        with self._lock:
            self._up = bool(up)

    # ---- slow path ------------------------------------------------------------------------

    def spike(self, cause: str) -> None:
        """Count one attributed spike; causes outside CAUSES count as "other"."""
        key = cause if cause in self._spikes else "other"
        with self._lock:
            self._spikes[key] += 1

    def exemplar(self, spike_id: str, latency_ns: int, unix_s: float | None = None) -> None:
        """Put one logged spike on the histogram bucket its latency (int ns) falls in, as
        that bucket's exemplar ``{spike_id="…"}`` (replacing the previous one). ValueError
        for an empty, unprintable or over-long id or a negative latency."""
        sid = str(spike_id)
        if not 0 < len(sid) <= MAX_SPIKE_ID_LEN or not sid.isprintable():
            raise ValueError(f"bad spike_id {spike_id!r}")
        ns = int(latency_ns)
        if ns < 0:
            raise ValueError(f"bad latency_ns {latency_ns!r}")
        at = None if unix_s is None else float(unix_s)
        i = bisect_left(self._bounds_ns, ns)  # as observe(): le is inclusive
        with self._lock:
            self._exemplars[i] = (sid, ns / 1e9, at)

    def spike_causes(self, items: Iterable[tuple[str, str, int]]) -> None:
        """Add one spike's kernel-event breakdown: ``(cause, culprit, ns)`` triples (see
        the module docstring for the bounds). Culprits get their labels largest first."""
        rows = sorted(((c if c in EVENT_CAUSES else "other",
                        _culprit_label(k), int(ns)) for c, k, ns in items if ns > 0),
                      key=lambda r: -r[2])
        if not rows:
            return
        with self._lock:
            for cause, culprit, ns in rows:
                if culprit not in self._culprits:
                    if culprit != "other" and len(self._culprits) < CULPRIT_TOP_K:
                        self._culprits.add(culprit)
                    else:
                        culprit = "other"
                key = (cause, culprit)
                self._cause_ns[key] = self._cause_ns.get(key, 0) + ns

    def gpu_split(self, parts_us: dict[str, float]) -> None:
        """Add one spike's GPU split (µs per part; parts outside :data:`GPU_PARTS` are
        dropped: the label set stays fixed)."""
        with self._lock:
            for part, us in parts_us.items():
                if part in GPU_PARTS and us > 0:
                    self._gpu_ns[part] = self._gpu_ns.get(part, 0) + int(us * 1e3)

    def set_collector(self, name: str, success: bool, duration_s: float) -> None:
        """Outcome of one collector run (CollectorResult.name/.success/.duration_s)."""
        if not _NAME.match(name):
            raise ValueError(f"bad collector name {name!r}")
        with self._lock:
            if name not in self._collectors and len(self._collectors) >= MAX_COLLECTORS:
                self._drop_locked("collector")
                return
            self._collectors[name] = CollectorState(bool(success), float(duration_s))

    def set_collector_result(self, result: Any) -> None:
        """Same as set_collector, from a collectors.base.CollectorResult (duck-typed)."""
        self.set_collector(result.name, result.success, result.duration_s)

    def set_own_cost(self, cpu_ns_by_part: Mapping[str, int], *, budget_share: float | None,
                     exact: int = 0, skipped: int = 0, shed: int = 0,
                     cost_us_per_call: float | None = None) -> None:
        """Watch's own cost so far (see the module docstring). ValueError for a bad part
        name, a negative figure or a budget outside (0, 1]."""
        parts = {}
        for name, ns in cpu_ns_by_part.items():
            if not _NAME.match(name) or int(ns) < 0:
                raise ValueError(f"bad own-cost part {name!r}: {ns!r}")
            parts[name] = int(ns)
        if budget_share is not None and not 0 < budget_share <= 1:
            raise ValueError(f"bad budget_share {budget_share!r}")
        if min(exact, skipped, shed) < 0 or (cost_us_per_call is not None and
                                        not cost_us_per_call >= 0):
            raise ValueError("own-cost counts and the cost per call must be >= 0")
        with self._lock:
            for name, ns in parts.items():
                if name not in self._own_ns and len(self._own_ns) >= MAX_OWN_PARTS:
                    self._drop_locked("own_cpu_part")
                    continue
                self._own_ns[name] = max(ns, self._own_ns.get(name, 0))
            self._budget_share = None if budget_share is None else float(budget_share)
            for k, v in (("exact", exact), ("skipped", skipped), ("shed", shed)):
                self._budget_spikes[k] = max(int(v), self._budget_spikes.get(k, 0))
            self._cost_per_call_ns = None if cost_us_per_call is None else \
                float(cost_us_per_call) * 1e3

    def set_audit(self, findings: Iterable[Finding]) -> None:
        """Replace the audit state with these findings (check id -> status)."""
        state, dropped = audit_state(findings)
        with self._lock:
            self._audit = state
            self._audit_unix_s = time.time()
            if dropped:
                self._drop_locked("audit", dropped)

    def set_gauge(self, name: str, value: float | None, **labels: Any) -> None:
        """Set (or with None, remove) one allowlisted gauge series. See :data:`GAUGES`."""
        spec = GAUGES.get(name)
        if spec is None:
            raise ValueError(f"unknown gauge {name!r}; allowed: {', '.join(GAUGES)}")
        if set(labels) != {ln for ln, _ in spec.labels}:
            raise ValueError(f"gauge {name}: labels must be {[ln for ln, _ in spec.labels]}, "
                             f"got {sorted(labels)}")
        key = []
        for ln, pat in spec.labels:
            v = str(labels[ln])
            if not pat.match(v):
                raise ValueError(f"gauge {name}: bad {ln}={v!r}")
            key.append(v)
        k = tuple(key)
        with self._lock:
            series = self._gauges[name]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                series.pop(k, None)
            elif k in series or len(series) < MAX_SERIES_PER_GAUGE:
                series[k] = float(value)
            else:
                self._drop_locked(name)

    def set_gpu_clock_event_reasons(self, gpu: int | str, mask: int | None) -> None:
        """Decode NVML's clock-event-reason bitmask into one 0/1 gauge per reason."""
        for reason, bit in GPU_CLOCK_EVENT_REASONS.items():
            self.set_gauge("gpu_clock_event_reason",
                           None if mask is None else float(bool(int(mask) & bit)),
                           gpu=gpu, reason=reason)

    def _drop_locked(self, what: str, n: int = 1) -> None:
        self._dropped[what] = self._dropped.get(what, 0) + n

    # ---- reading --------------------------------------------------------------------------

    def audit_state(self) -> tuple[dict[str, str] | None, float | None]:
        """The audit statuses (a copy) and when they were set (for the exporter's cache)."""
        with self._lock:
            return (None if self._audit is None else dict(self._audit)), self._audit_unix_s

    def snapshot(self) -> Snapshot:
        """A consistent copy of the state. Quantiles are recomputed at most once per
        ``quantile_refresh_s``; everything else is exact at the time of the call."""
        with self._lock:
            counts = list(self._counts)
            n, sum_ns, up = self._n, self._sum_ns, self._up
            last = self._last_mono_ns
            spikes = dict(self._spikes)
            cause_s = {k: v / 1e9 for k, v in self._cause_ns.items()}
            collectors = dict(self._collectors)
            audit = None if self._audit is None else dict(self._audit)
            audit_ts = self._audit_unix_s
            gauges = {g: dict(s) for g, s in self._gauges.items()}
            dropped = dict(self._dropped)
            exemplars = tuple(self._exemplars)
            own = tuple(sorted((k, v / 1e9) for k, v in self._own_ns.items()))
            budget = self._budget_share
            decided = tuple((k, self._budget_spikes.get(k, 0)) for k in BUDGET_DECISIONS) \
                if self._budget_spikes else ()
            per_call = self._cost_per_call_ns
            gpu = tuple((p, self._gpu_ns.get(p, 0) / 1e9) for p in GPU_PARTS) \
                if self._gpu_ns else ()
        now_mono = time.monotonic_ns()
        cum, acc = [], 0
        for c in counts:
            acc += c
            cum.append(acc)
        exceed = {t: n - cum[i] for t, i in self._thr_index.items()}
        wn, quant = self._window_quantiles(now_mono)
        last_unix = None if last is None else time.time() - (now_mono - last) / 1e9
        return Snapshot(
            source=self.source, variant=self.variant, service=self.service,
            p99_budget_s=None if self.p99_budget_us is None else self.p99_budget_us / 1e6,
            bucket_bounds_s=self._bounds_s,
            bucket_cumulative=tuple(cum), count=n, sum_s=sum_ns / 1e9, exceedances=exceed,
            window_s=self.window_s, window_samples=wn, quantiles=quant, probe_up=up,
            last_sample_unix_s=last_unix, spikes=spikes, cause_seconds=cause_s,
            collectors=collectors,
            audit=audit, audit_unix_s=audit_ts, gauges=gauges, dropped=dropped,
            bucket_exemplars=exemplars, own_cpu_s=own, cpu_budget_ratio=budget,
            budget_spikes=decided,
            attach_cost_per_call_s=None if per_call is None else per_call / 1e9,
            attach_charged_cpu_s=None if per_call is None else per_call * n / 1e9,
            gpu_split_s=gpu)

    def _window_quantiles(self, now_mono: int) -> tuple[int, dict[float, float]]:
        with self._q_lock:
            if self._q_at_ns is not None and now_mono - self._q_at_ns < self._q_refresh_ns:
                return self._q_value
            with self._lock:  # one memcpy of each ring (≤ 1 MiB), nothing else under the lock
                lat = np.frombuffer(self._ring_lat, dtype=np.int64).copy()
                ts = np.frombuffer(self._ring_t, dtype=np.int64).copy()
            # Unwritten slots have t = 0 and fall out with the window test (monotonic_ns is
            # far above window_ns on any booted machine; guard anyway with t > 0).
            sel = lat[(ts > 0) & (ts >= now_mono - self._window_ns)]
            out: dict[float, float] = {}
            if sel.size:
                ks = {q: stats.nearest_rank_index(stats.percent(q), sel.size)
                      for q in QUANTILES if sel.size >= stats.required_samples(stats.percent(q))}
                if ks:
                    # A full sort beats np.partition with three kth on these sizes (measured).
                    srt = np.sort(sel)
                    out = {q: float(srt[k]) / 1e9 for q, k in ks.items()}
            self._q_at_ns = now_mono
            self._q_value = (int(sel.size), out)
            return self._q_value


def _culprit_label(name: str) -> str:
    """A culprit (comm, IRQ name, vector, work function) as a label value: printable,
    at most MAX_CULPRIT_LEN characters; empty is "unknown"."""
    s = "".join(ch if ch.isprintable() else "?" for ch in str(name))[:MAX_CULPRIT_LEN]
    return s or "unknown"


def _threshold_ns(t_ns: float) -> int:
    """A threshold, whole ns; ValueError unless 1 ≤ it ≤ MAX_THRESHOLD_NS (1e9 µs)."""
    t = float(t_ns)
    if not (math.isfinite(t) and t.is_integer() and 1 <= t <= MAX_THRESHOLD_NS):
        raise ValueError(f"thresholds_ns must be whole ns from 1 to {MAX_THRESHOLD_NS:g}, "
                         f"not {t_ns!r}")
    return int(t)


def _us_key(t_ns: int) -> int | float:
    """The µs a threshold is labelled and keyed with: an int where whole, else a float."""
    return t_ns // 1000 if t_ns % 1000 == 0 else t_ns / 1000


def audit_state(findings: Iterable[Finding]) -> tuple[dict[str, str], int]:
    """(check id -> status value, number dropped over MAX_AUDIT_CHECKS). Raises ValueError on
    an id or status outside the bounded label set. Shared with agent.export.textfile."""
    state: dict[str, str] = {}
    dropped = 0
    for f in findings:
        status = getattr(f.status, "value", f.status)
        if not _CHECK.match(f.id) or status not in AUDIT_STATUSES:
            raise ValueError(f"bad finding id/status: {f.id!r}/{status!r}")
        if f.id not in state and len(state) >= MAX_AUDIT_CHECKS:
            dropped += 1
            continue
        state[f.id] = status
    return state, dropped
