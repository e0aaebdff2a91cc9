"""Attribution: give every slow sample a named cause, a score and the evidence.

For one spike (a latency sample over the threshold), in this order:

1. **In-process evidence** of the sample itself, measured by the probe around the call (or by
   a client that records it): involuntary context switches, run-queue delay
   (/proc/thread-self/schedstat), minor/major faults (getrusage), CPU time vs wall time, the
   CPU at start and end. Cheap and strong: a sample that waited 3 ms on a run queue was
   preempted, whatever the host counters say.
2. **Host signals in the spike's window** (the collector rows overlapping
   [start, end]) against their own recent baseline — the rows of the preceding
   ``baseline_s`` seconds, excluding the last ``exclude_s`` — as median/MAD z-scores and
   excess counts: run-queue delay and switches of the thread (sched), IRQ and softirq counts
   on the probe CPUs (irq, softirq), steal and frequency (cpu), faults/reclaim/compaction and
   PSI (memory), NUMA misses (numa), GPU clock-event reasons and foreign processes on the
   probe's GPU (gpu), AER errors and link degradation (pcie), perf software events (perf).

Each named cause gets a strength s ∈ [0, 1] from its evidence; the residual
"unexplained" is Π(1 − s); scores are the strengths and the residual normalised to sum 1,
ranked. The primary cause is the top one when its strength is at least ``MIN_STRENGTH``,
otherwise "unexplained". Who/what is named when the evidence allows it: the task that ran on
the probe CPU (from the sched task scan), the IRQ or softirq and its device.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from agent.watch.ring import SignalRing

CAUSES: dict[str, str] = {
    "cpu_contention": "CPU contention on the probe CPU",
    "irq": "hardware IRQ on the probe CPU",
    "softirq": "softirq on the probe CPU",
    "steal": "hypervisor steal",
    "freq_drop": "CPU frequency drop / thermal throttle",
    "migration": "migration to another CPU",
    "page_faults": "page faults / reclaim / compaction",
    "numa_remote": "NUMA remote memory",
    "gpu_throttle": "GPU clock throttle",
    "gpu_foreign_process": "foreign GPU process",
    "pcie_errors": "PCIe errors / degraded link",
    "unexplained": "unexplained",
}
# The names are agent.metrics.CAUSES (the exporter's bounded label set).
MIN_STRENGTH = 0.35

# Interrupt and softirq rows that follow scheduling activity itself (a busy CPU takes timer
# ticks, preemption sends rescheduling IPIs): weak evidence of their own, so that a CPU hog
# is not blamed on the timer tick it causes.
HOUSEKEEPING_ROWS = frozenset({"LOC", "RES", "CAL", "TLB", "IWI", "TIMER", "SCHED", "RCU",
                               "HRTIMER", "NMI", "PMI", "HYP", "PIN", "NPI", "PIW", "SPU"})
HOUSEKEEPING_WEIGHT = 0.3

# USER_HZ: the unit of /proc/stat's time columns.
try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    CLK_TCK = 100


def _other(fam: str) -> str:
    return "softirq" if fam == "irq" else "irq"


# NVML clock-event reason bits (nvmlClocksEventReason*): idle (0x1) and application-clock
# setting (0x2) are not throttles.
GPU_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
               0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
               0x100: "display_clocks"}


@dataclass
class Spike:
    """One slow sample. Evidence fields are -1 when not measured (external clients)."""

    seq: int
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    p50_ns: int
    nivcsw: int = -1
    nvcsw: int = -1
    minflt: int = -1
    majflt: int = -1
    cpu_ns: int = -1
    rq_delay_ns: int = -1
    cpu_start: int = -1
    cpu_end: int = -1
    # seq of the slow sample of the same thread still running at this one's intended start
    # (open loop: this one waited for it), -1 when none
    queued_behind: int = -1

    @property
    def latency_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def excess_ns(self) -> int:
        return max(1, self.latency_ns - self.p50_ns)

    @property
    def off_cpu_ns(self) -> int:
        """Wall time neither on the CPU (the thread's CPU time as the kernel counts it) nor
        waiting on its run queue as schedstat counts it; -1 when not measured (external
        sources)."""
        if self.cpu_ns < 0 or self.rq_delay_ns < 0:
            return -1
        return max(0, self.latency_ns - self.cpu_ns - self.rq_delay_ns)

    def in_process(self) -> dict:
        keys = ("nivcsw", "nvcsw", "minflt", "majflt", "cpu_ns", "rq_delay_ns", "cpu_start",
                "cpu_end")
        out = {k: getattr(self, k) for k in keys if getattr(self, k) >= 0}
        if self.off_cpu_ns >= 0:
            # Sleeping (nvcsw), waiting behind the previous call, a late wake-up, interrupt
            # time, or a stopped vCPU (the hypervisor's steal): the lead for a spike that the
            # switches and run-queue figures do not explain.
            out["off_cpu_us"] = round(self.off_cpu_ns / 1e3, 1)
        return out


@dataclass
class CauseScore:
    cause: str
    strength: float
    score: float = 0.0
    detail: str = ""
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"cause": self.cause, "score": round(self.score, 3),
                "strength": round(self.strength, 3), "detail": self.detail,
                "evidence": self.evidence}


@dataclass
class Attribution:
    cause: str
    causes: list[CauseScore]
    unexplained: float
    in_process: dict

    def to_dict(self) -> dict:
        return {"cause": self.cause, "unexplained": round(self.unexplained, 3),
                "causes": [c.to_dict() for c in self.causes], "in_process": self.in_process}


@dataclass
class SignalWindow:
    """One signal in the spike window vs its baseline (rates per second)."""

    name: str
    window: float  # sum of deltas (counters) or extreme value (gauges) in the window
    window_rate: float
    base_rate: float  # baseline median rate (counters) or median value (gauges)
    mad: float
    z: float
    excess: float  # window count above what the baseline rate predicts

    def to_dict(self) -> dict:
        return {"window": _r(self.window), "baseline_rate_per_s": _r(self.base_rate),
                "z": _r(self.z), "excess": _r(self.excess)}


def _median_mad(recent: np.ndarray | None, col: int) -> tuple[float, float]:
    """Median and MAD of one in-process column of recent non-spike samples (0, 0 without
    20 of them or without that column)."""
    if recent is None or len(recent) < 20 or recent.ndim != 2 or recent.shape[1] <= col:
        return 0.0, 0.0
    c = recent[:, col]
    c = c[c >= 0]
    if not len(c):
        return 0.0, 0.0
    med = float(np.median(c))
    return med, float(np.median(np.abs(c - med)))


def _r(x: float) -> float | None:
    if x is None or x != x:
        return None
    if math.isinf(x):
        return 1e9 if x > 0 else -1e9
    return round(float(x), 3)


def col_median(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column median of a 2-D float array ignoring NaN, and each column's non-NaN count
    (median NaN where the count is 0). One sort for all columns: NaN sorts last, so the
    median of column j sits at rows (n_j - 1) // 2 and n_j // 2 — np.nanmedian(axis=0) falls
    back to a Python loop per column when NaNs are present."""
    if a.ndim != 2 or not a.shape[0] or not a.shape[1]:
        return np.full(a.shape[1] if a.ndim == 2 else 0, np.nan), \
            np.zeros(a.shape[1] if a.ndim == 2 else 0, dtype=np.int64)
    srt = np.sort(a, axis=0)
    n = (~np.isnan(a)).sum(axis=0)
    lo = np.clip((n - 1) // 2, 0, a.shape[0] - 1)[None, :]
    hi = np.clip(n // 2, 0, a.shape[0] - 1)[None, :]
    med = (np.take_along_axis(srt, lo, 0)[0] + np.take_along_axis(srt, hi, 0)[0]) / 2.0
    med[n == 0] = np.nan
    return med, n


class BaselineStats:
    """Median and MAD of every column of one ring's baseline rows, as rates per second,
    computed at once (columns with fewer than 5 non-NaN rows: 0, 0 — "nothing happening")."""

    __slots__ = ("med", "mad")

    def __init__(self, ring: SignalRing, base: np.ndarray, base_dt: np.ndarray) -> None:
        width = len(ring.cols)
        if len(base) < 5 or not width:
            self.med = np.zeros(width)
            self.mad = np.zeros(width)
            return
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = ring.data[base, :width] / base_dt[:, None]
        med, n = col_median(rates)
        mad, _ = col_median(np.abs(rates - med[None, :]))
        few = n < 5
        self.med = np.where(few, 0.0, med)
        self.mad = np.where(few, 0.0, mad)


class _Baseline:
    """One ring's baseline rows for one baseline end (shared by the spikes of a quantum)."""

    __slots__ = ("base", "base_dt", "row_s", "_stats", "_ring", "rows_then")

    def __init__(self, ring: SignalRing, b_from: int, b_to: int) -> None:
        self.rows_then = ring.rows
        base = ring.window(b_from, b_to)
        self.base = base[ring.t1[base] <= b_to] if len(base) else base
        dt_b = (ring.t1[self.base] - ring.t0[self.base]) / 1e9
        self.base_dt = np.where(dt_b > 0, dt_b, np.nan)
        ok = self.base_dt[~np.isnan(self.base_dt)]
        self.row_s = float(np.median(ok)) if len(ok) else None
        self._ring = ring
        self._stats: BaselineStats | None = None

    @property
    def stats(self) -> BaselineStats:
        if self._stats is None:
            self._stats = BaselineStats(self._ring, self.base, self.base_dt)
        return self._stats


class RingView:
    """Window/baseline statistics over one SignalRing for one spike, computed once per ring
    for all columns at a time. ``stats_cache`` (optional): a dict the :class:`Attributor`
    keeps across spikes, so the spikes whose baselines end at the same ``b_to`` (a quantum
    boundary) share one baseline selection and one median/MAD computation — a spike storm
    costs one window sum per ring per spike, not two medians per signal per spike."""

    def __init__(self, ring: SignalRing, t_from: int, t_to: int, baseline_s: float,
                 exclude_s: float, b_to: int | None = None,
                 stats_cache: dict | None = None) -> None:
        self.ring = ring
        self.win = ring.window(t_from, t_to)
        if b_to is None:
            b_to = t_from - int(exclude_s * 1e9)
        # The key names the ring object and its width; the entry is dropped once the ring
        # has written over any of its baseline rows since (a run paused longer than the
        # ring holds, then a spike from the same quantum).
        key = (id(ring), b_to, int(baseline_s * 1e9), len(ring.cols))
        hit = stats_cache.get(ring.name) if stats_cache is not None else None
        if hit is not None and hit[0] == key and \
                ring.rows - hit[1].rows_then <= ring.capacity - len(hit[1].base):
            bl = hit[1]
        else:
            bl = _Baseline(ring, b_to - int(baseline_s * 1e9), b_to)
            if stats_cache is not None:
                stats_cache[ring.name] = (key, bl)
        self._bl = bl
        self.base, self.base_dt = bl.base, bl.base_dt
        dt_w = (ring.t1[self.win] - ring.t0[self.win]) / 1e9
        self.win_dt = float(dt_w.sum()) if len(dt_w) else 0.0
        self.row_s = bl.row_s if bl.row_s is not None else \
            (self.win_dt / max(1, len(self.win)) or 0.01)
        self._wsum: np.ndarray | None = None
        self._wseen: np.ndarray | None = None

    @property
    def stats(self) -> BaselineStats:
        return self._bl.stats

    def _window_sums(self) -> None:
        w = self.ring.data[self.win, :len(self.ring.cols)]
        self._wseen = (~np.isnan(w)).any(axis=0)
        self._wsum = np.where(np.isnan(w), 0.0, w).sum(axis=0)

    def counter(self, name: str) -> SignalWindow | None:
        i = self.ring.cols.get(name)
        if i is None or not len(self.win):
            return None
        if self._wsum is None:
            self._window_sums()
        if not self._wseen[i]:
            return None
        total = float(self._wsum[i])
        rate = total / self.win_dt if self.win_dt > 0 else float("nan")
        st = self.stats
        med, mad = float(st.med[i]), float(st.mad[i])
        floor = 1.0 / max(self.row_s, 1e-3)  # one event per row
        scale = max(1.4826 * mad, 0.1 * abs(med), floor)
        z = (rate - med) / scale if rate == rate else float("nan")
        excess = total - med * self.win_dt
        return SignalWindow(name, total, rate, med, mad, z, excess)

    def gauge(self, name: str, low: bool = True) -> SignalWindow | None:
        i = self.ring.cols.get(name)
        if i is None or not len(self.win):
            return None
        w = self.ring.data[self.win, i]
        if np.isnan(w).all():
            return None
        val = float(np.nanmin(w) if low else np.nanmax(w))
        b = self.ring.data[self.base, i] if len(self.base) else np.empty(0)
        b = b[~np.isnan(b)]
        med = float(np.median(b)) if len(b) else float("nan")
        mad = float(np.median(np.abs(b - med))) if len(b) else float("nan")
        z = (val - med) / max(1.4826 * mad, 1e-9) if len(b) else float("nan")
        return SignalWindow(name, val, val, med, mad, z, val - med if len(b) else float("nan"))

    def names(self, prefix: str) -> list[str]:
        return [n for n in self.ring.cols if n.startswith(prefix)]


class Attributor:
    """Maps a :class:`Spike` to ranked causes using the collector rings.

    ``rings``: collector name → SignalRing. ``probe_cpus``: the CPUs the latency source runs
    on. ``who_ran(t0, t1, cpus)`` (optional): tasks that ran on those CPUs in the window
    (``SchedCollector.who_ran``). ``irq_desc()`` (optional): IRQ row → device description.
    """

    def __init__(self, rings: Mapping[str, SignalRing] | Callable[[], Mapping[str, SignalRing]],
                 probe_cpus: list[int], *, who_ran=None, others_share=None, irq_desc=None,
                 gpu_detail=None,
                 baseline_s: float = 10.0, exclude_s: float = 0.1,
                 slack_ns: int = 1_000_000, baseline_quantum_s: float = 0.25) -> None:
        # gpu_detail(t0_ns, t1_ns) (optional): the GPU collector's named causes for a window
        # (GpuCollector.causes): who the foreign process is, which throttle reason
        self.gpu_detail = gpu_detail
        self._rings = rings
        self.probe_cpus = list(probe_cpus)
        self.who_ran = who_ran
        # others_share(t0, t1, cpus) (optional): share of those CPUs' time other tasks took
        # in the scans around the window (SchedCollector.others_share)
        self.others_share = others_share
        self.irq_desc = irq_desc
        self.baseline_s = baseline_s
        self.exclude_s = exclude_s
        self.slack_ns = slack_ns
        self.baseline_quantum_ns = int(baseline_quantum_s * 1e9)
        self._stats_cache: dict = {}

    def _recent_stat(self, recent: np.ndarray | None, col: int) -> tuple[float, float]:
        """_median_mad of the in-process baseline, once per ``recent`` array (watch passes
        the same array for every spike it attributes in one step)."""
        memo = self._recent_memo
        if memo is None or memo[0] is not recent:
            memo = self._recent_memo = (recent, {})
        if col not in memo[1]:
            memo[1][col] = _median_mad(recent, col)
        return memo[1][col]

    _recent_memo: tuple | None = None

    def rings(self) -> Mapping[str, SignalRing]:
        return self._rings() if callable(self._rings) else self._rings

    def attribute(self, spike: Spike, recent: np.ndarray | None = None) -> Attribution:
        """``recent``: in-process evidence of recent non-spike samples, rows of
        (minflt, majflt, nivcsw[, nvcsw]) for the fault and blocking baselines (None: no
        baseline)."""
        t_from, t_to = spike.start_ns - self.slack_ns, spike.end_ns + self.slack_ns
        # The baseline ends at least exclude_s before the window, on a quantum boundary:
        # spikes of one storm share their baselines' statistics (computed once per ring per
        # quantum, all columns at a time) instead of one median per signal per spike.
        q = self.baseline_quantum_ns
        b_to = t_from - int(self.exclude_s * 1e9)
        if q > 0:
            b_to -= b_to % q
        views = {name: RingView(r, t_from, t_to, self.baseline_s, self.exclude_s, b_to,
                                self._stats_cache)
                 for name, r in self.rings().items() if r.rows}
        cpus = set(self.probe_cpus)
        if spike.cpu_start >= 0:
            cpus.add(spike.cpu_start)
        if spike.cpu_end >= 0:
            cpus.add(spike.cpu_end)
        scores = [
            self._cpu_contention(spike, views, cpus),
            self._irq(spike, views, cpus),
            self._steal(spike, views, cpus),
            self._frequency(spike, views, cpus),
            self._migration(spike, views),
            self._memory(spike, views, recent),
            self._numa(spike, views),
            *self._gpu(spike, views),
            self._pcie(spike, views),
        ]
        scores = [s for s in scores if s is not None and s.strength > 0]
        # CPU contention by a softirq or migration kernel thread is that cause, named.
        for s in list(scores):
            if s.cause == "cpu_contention" and s.evidence.get("ran_on_cpu"):
                top = s.evidence["ran_on_cpu"][0]["comm"]
                if top.startswith("ksoftirqd/"):
                    s.cause = "softirq"
                    s.detail = f"softirq work in {top} preempted the probe ({s.detail})"
                elif top.startswith("migration/"):
                    s.cause = "migration"
                    s.detail = f"{top} stopper thread preempted the probe ({s.detail})"
        # In-process placement evidence first: contention met on a CPU the probe was moved to
        # is the move's consequence, not a contender on the probe's own CPU.
        mig = next((s for s in scores if s.cause == "migration"), None)
        if mig is not None and mig.evidence.get("outside_probe_cpus"):
            for s in scores:
                if s.cause == "cpu_contention":
                    s.strength *= 0.5
                    s.detail += " (on a CPU it was moved to)"
        # A sample that slept on its own page faults: the disk interrupts, BLOCK softirqs and
        # kblockd work on its CPU are that I/O's completion, and the wait after it the
        # wake-up — consequences of the faults, not separate causes (unless a run-queue
        # wait measured in-process explains the sample by itself).
        pf = next((s for s in scores if s.cause == "page_faults"), None)
        if pf is not None and pf.evidence.get("blocked_in_call"):
            for s in scores:
                if s.cause in ("irq", "softirq") or (
                        s.cause == "cpu_contention" and not self._wait_explains(spike)):
                    s.strength *= 0.5
                    s.detail += " (completing or following the sample's own page-in I/O)"
        merged: dict[str, CauseScore] = {}
        for s in scores:
            old = merged.get(s.cause)
            if old is None or s.strength > old.strength:
                if old is not None:
                    s.evidence = {**old.evidence, **s.evidence}
                merged[s.cause] = s
            else:
                old.evidence = {**s.evidence, **old.evidence}
        ranked = sorted(merged.values(), key=lambda c: -c.strength)
        resid = 1.0
        for c in ranked:
            resid *= 1.0 - min(c.strength, 0.99)
        total = sum(c.strength for c in ranked) + resid
        for c in ranked:
            c.score = c.strength / total
        unexplained = resid / total
        primary = ranked[0].cause if ranked and ranked[0].strength >= MIN_STRENGTH \
            else "unexplained"
        return Attribution(primary, ranked, unexplained, spike.in_process())

    # -- causes ------------------------------------------------------------------------------
    def _cpu_contention(self, sp: Spike, views, cpus) -> CauseScore | None:
        s = 0.0
        ev: dict = {}
        details = []
        if sp.rq_delay_ns >= 0:
            ev["rq_delay_us"] = round(sp.rq_delay_ns / 1e3, 1)
            if sp.rq_delay_ns >= 50_000:
                s = max(s, min(0.95, 0.3 + sp.rq_delay_ns / sp.excess_ns))
                details.append(f"waited {sp.rq_delay_ns / 1e3:.0f} µs on the run queue")
        if sp.nivcsw > 0:
            ev["nivcsw"] = sp.nivcsw
            # A switch is strong evidence when its wait (measured in-process) is a good part
            # of the excess, or when the wait was not measured; a switch that got the CPU
            # back within a small part of the excess explains little of the sample.
            s = max(s, 0.7 if self._wait_explains(sp) is not False else 0.4)
            details.append(f"{sp.nivcsw} involuntary context switch(es)")
        v = views.get("sched")
        if v is not None:
            rq = v.counter(f"sched.{sp.tid}.rq_delay_ns")
            if rq is not None and rq.window == rq.window:
                ev["thread_rq_delay_window_us"] = round(rq.window / 1e3, 1)
                # Scored only without the sample's own run-queue delay (external sources):
                # the window's rows (50 ms for the built-in probes) sum many calls' ordinary
                # wake-up waits, which the sample's own figure leaves out.
                if sp.rq_delay_ns < 0 and rq.window >= 0.3 * sp.excess_ns and \
                        rq.window >= 100_000:
                    s = max(s, min(0.85, 0.3 + 0.6 * rq.window / sp.excess_ns))
                    details.append(f"thread waited {rq.window / 1e3:.0f} µs on the run "
                                   "queue in the window")
            nv = v.counter(f"sched.{sp.tid}.nivcsw")
            if nv is not None and nv.window > 0 and sp.nivcsw < 0:
                ev["thread_nivcsw_window"] = nv.window
                s = max(s, 0.55)
                details.append(f"{nv.window:.0f} involuntary switch(es) in the window")
        if s <= 0:
            s = self._late_wake_up(sp, cpus, ev, details)
        if s <= 0:
            return None
        if self.who_ran is not None:
            runs = self.who_ran(sp.start_ns - 1, sp.end_ns + 1, cpus)
            if runs:
                ev["ran_on_cpu"] = [{"comm": r.comm, "pid": r.pid, "tid": r.tid, "cpu": r.cpu,
                                     "run_us": round(r.run_ns / 1e3)} for r in runs[:3]]
                top = runs[0]
                details.append(f"{top.comm} (pid {top.pid}) ran on CPU {top.cpu}")
        return CauseScore("cpu_contention", s, detail="; ".join(details), evidence=ev)

    def _late_wake_up(self, sp: Spike, cpus, ev: dict, details: list) -> float:
        """A built-in probe's sample that lost most of its excess neither on the CPU nor on
        the run queue as schedstat counts it, without blocking, switching or queueing behind
        the previous call — it woke late — while other tasks took a good share of its CPU:
        contention whose wait schedstat missed. Seen on the GPU box's kernel under an
        always-busy nice-0 hog: wake-ups ~4 ms late (an EEVDF slice), rq_delay 0 (16-57 % of
        its hog spikes were left unexplained before). Strength 0.3 + 0.5 × share, ≤ 0.7:
        below a measured wait or switch; an IRQ or steal found in the window outranks it."""
        off = sp.off_cpu_ns
        if self.others_share is None or off < 200_000 or off < 0.5 * sp.excess_ns or \
                sp.queued_behind >= 0 or sp.nvcsw != 0 or sp.nivcsw != 0 or sp.majflt > 0:
            return 0.0
        share = self.others_share(sp.start_ns - 1, sp.end_ns + 1, cpus)
        if share is None or share < 0.2:
            return 0.0
        ev["off_cpu_us"] = round(off / 1e3, 1)
        ev["others_cpu_share"] = round(share, 3)
        details.append(f"lost {off / 1e3:.1f} ms neither running nor counted on the run queue "
                       f"(a late wake-up) while other tasks took {100 * share:.0f} % of the CPU")
        return min(0.7, 0.3 + 0.5 * share)

    @staticmethod
    def _wait_explains(sp: Spike) -> bool | None:
        """Whether the sample's run-queue wait explains a good part (≥ 30 %) of its excess
        over P50; None when the wait was not measured (then: whether it was switched out)."""
        if sp.rq_delay_ns < 0:
            return True if sp.nivcsw > 0 else None
        return sp.rq_delay_ns >= 50_000 and sp.rq_delay_ns >= 0.3 * sp.excess_ns

    def _irq_time(self, views, cpus) -> dict[str, dict[int, dict]]:
        """Per-CPU hardirq and softirq *time* in the window from /proc/stat's irq/softirq
        columns (USER_HZ ticks): {"irq"|"softirq": {cpu: {"share", "excess_share",
        "ticks"}}}. A class whose column stayed 0 over the whole baseline and window is not
        accounted by this kernel (hardirq time needs CONFIG_IRQ_TIME_ACCOUNTING; the timer
        tick alone would show): it is left out — unknown, not 0."""
        v = views.get("cpu")
        out: dict[str, dict[int, dict]] = {"irq": {}, "softirq": {}}
        if v is None or v.win_dt <= 0:
            return out
        for fam in ("irq", "softirq"):
            for c in cpus:
                name = f"cpu.{c}.{fam}_ticks"
                w = v.counter(name)
                if w is None or w.window != w.window:
                    continue
                i = v.ring.cols[name]
                seen = np.concatenate([v.ring.data[v.base, i], v.ring.data[v.win, i]])
                if not np.nansum(seen) > 0:
                    continue  # never moved: not accounted here
                tick_s = 1.0 / CLK_TCK
                out[fam][c] = {"share": w.window * tick_s / v.win_dt,
                               "excess_share": max(0.0, w.excess) * tick_s / v.win_dt,
                               "ticks": w.window, "baseline_ticks_per_s": w.base_rate}
        return out

    def _irq(self, sp: Spike, views, cpus) -> CauseScore | None:
        """Hardware IRQs and softirqs on the probe CPU(s). Each class's best named row (count
        excess over its baseline) is weighed by the *time* the class took on that CPU in the
        window (/proc/stat): a softirq flood that eats 10 % of the CPU outranks a burst of a
        few disk interrupts that cost almost nothing, whatever their counts."""
        best: dict[str, tuple[float, SignalWindow | None, str]] = {
            "irq": (0.0, None, ""), "softirq": (0.0, None, "")}
        ev: dict = {}
        for ring_name, fam in (("irq", "irq"), ("softirq", "softirq")):
            v = views.get(ring_name)
            if v is None:
                continue
            for c in cpus:
                for name in v.names(f"{fam}.{c}."):
                    w = v.counter(name)
                    if w is None or not (w.z >= 3 and w.excess >= 5):
                        continue
                    row = name.rsplit(".", 1)[1]
                    st = min(0.85, 0.2 * math.log2(1 + w.excess / 5))
                    if row in HOUSEKEEPING_ROWS:
                        st *= HOUSEKEEPING_WEIGHT
                    ev[name] = w.to_dict()
                    if st > best[fam][0]:
                        best[fam] = (st, w, row)
        times = self._irq_time(views, cpus)
        hot = {fam: {c: x for c, x in times[fam].items()
                     if x["excess_share"] >= 0.02 and x["ticks"] >= 1} for fam in times}
        cand: dict[str, tuple[float, str]] = {}
        for fam in ("irq", "softirq"):
            st, w, row = best[fam]
            for c, x in times[fam].items():
                ev[f"cpu.{c}.{fam}_time"] = {"share": _r(x["share"]),
                                             "excess_share": _r(x["excess_share"]),
                                             "ticks": _r(x["ticks"])}
            if w is not None:
                cpu = int(w.name.split(".")[1])
                detail = (f"{self._irq_label(w, row)} on CPU {cpu}: +{w.excess:.0f} over "
                          f"baseline in the window (z={w.z:.1f})")
                x = hot[fam].get(cpu)
                if x is not None:
                    # Measured time on that CPU: the class did cost the probe CPU time.
                    st = min(0.95, max(st, 0.35 + 2.5 * x["excess_share"]) + 0.1)
                    detail += f"; {fam} time {100 * x['share']:.0f} % of CPU {cpu}"
                elif cpu in times[fam] and hot[_other(fam)]:
                    # Its time is accounted and did not rise, while the other class's did.
                    st *= 0.5
                cand[fam] = (st, detail)
            elif hot[fam]:
                # Time without a named row over its threshold: still that class, by time.
                c, x = max(hot[fam].items(), key=lambda kv: kv[1]["excess_share"])
                cand[fam] = (min(0.8, 0.35 + 2.5 * x["excess_share"]),
                             f"{fam} time {100 * x['share']:.0f} % of CPU {c} in the window")
        if not cand:
            return None
        fam, (s, detail) = max(cand.items(), key=lambda kv: kv[1][0])
        if s <= 0:
            return None
        if self._wait_explains(sp):
            s *= 0.5  # a switch explains the sample better than the interrupts around it
        elif sp.nivcsw == 0:
            s = min(0.95, s * 1.2)  # slow while never leaving the CPU: interrupted
        named = sorted(((k, x) for k, x in ev.items() if "excess" in x),
                       key=lambda kv: -(kv[1]["excess"] or 0))[:5]
        ev = {**dict(named), **{k: x for k, x in ev.items() if k.endswith("_time")}}
        other = cand.get(_other(fam))
        if other is not None:
            ev["runner_up"] = {"cause": _other(fam), "strength": _r(other[0]),
                               "detail": other[1]}
        return CauseScore(fam, s, detail=detail, evidence=ev)

    def _irq_label(self, w: SignalWindow, row: str) -> str:
        if w.name.startswith("softirq."):
            return f"softirq {row}"
        if self.irq_desc is not None and row.isdigit():
            d = (self.irq_desc() or {}).get(row)
            if d:
                return f"IRQ {row} ({d.split()[-1]})"
        return row

    def _steal(self, sp: Spike, views, cpus) -> CauseScore | None:
        v = views.get("cpu")
        if v is None:
            return None
        best = None
        for c in cpus:
            w = v.counter(f"cpu.{c}.steal_ticks")
            if w is not None and w.window >= 1 and (w.z >= 2 or w.base_rate == 0):
                if best is None or w.window > best.window:
                    best = w
        if best is None:
            return None
        s = min(0.8, 0.4 + 0.2 * best.window)
        cpu = best.name.split(".")[1]
        return CauseScore("steal", s, detail=f"{best.window:.0f} steal tick(s) on CPU {cpu} "
                          "in the window", evidence={best.name: best.to_dict()})

    def _frequency(self, sp: Spike, views, cpus) -> CauseScore | None:
        v = views.get("cpu")
        if v is None:
            return None
        s, ev, detail = 0.0, {}, ""
        for c in cpus:
            f = v.gauge(f"cpu.{c}.freq_hz", low=True)
            if f is not None and f.base_rate == f.base_rate and f.base_rate > 0:
                drop = 1 - f.window / f.base_rate
                if drop >= 0.1:
                    ev[f.name] = {"window_min_hz": f.window, "baseline_hz": f.base_rate}
                    if 0.4 + drop > s:
                        s = min(0.85, 0.4 + drop)
                        detail = (f"CPU {c} at {f.window / 1e6:.0f} MHz vs "
                                  f"{f.base_rate / 1e6:.0f} MHz baseline")
            for kind in ("core", "package"):
                t = v.counter(f"cpu.{c}.{kind}_throttle_total")
                if t is not None and t.window > 0:
                    ev[t.name] = t.to_dict()
                    if s < 0.7:
                        s, detail = 0.7, f"{kind} thermal throttle on CPU {c}"
        return CauseScore("freq_drop", s, detail=detail, evidence=ev) if s > 0 else None

    def _migration(self, sp: Spike, views) -> CauseScore | None:
        s, ev, details = 0.0, {}, []
        seen_cpus = {c for c in (sp.cpu_start, sp.cpu_end) if c >= 0}
        outside = sorted(seen_cpus - set(self.probe_cpus)) if self.probe_cpus else []
        if sp.cpu_start >= 0 and sp.cpu_end >= 0 and sp.cpu_start != sp.cpu_end:
            s = 0.85
            ev["cpu_start"], ev["cpu_end"] = sp.cpu_start, sp.cpu_end
            details.append(f"moved from CPU {sp.cpu_start} to CPU {sp.cpu_end} during the call")
        if outside:
            # The sample ran (partly) outside the CPUs the probe is placed on: its affinity
            # was changed or it was migrated. Whatever it met there (a busy housekeeping CPU,
            # a cold cache) is a consequence of the move.
            s = max(s, 0.8)
            ev["outside_probe_cpus"] = outside
            details.append(f"ran on CPU {','.join(map(str, outside))}, outside its CPUs "
                           f"{','.join(map(str, self.probe_cpus))}")
        v = views.get("sched")
        if v is not None and sp.cpu_start < 0:
            i = v.ring.cols.get(f"sched.{sp.tid}.cpu")
            if i is not None and len(v.win):
                vals = v.ring.data[v.win, i]
                prev = v.ring.data[v.base[-1:], i] if len(v.base) else np.empty(0)
                seen = set(np.concatenate([prev, vals])[~np.isnan(np.concatenate([prev, vals]))]
                           .astype(int).tolist())
                if len(seen) > 1:
                    s = max(s, 0.6)
                    ev["thread_cpus_in_window"] = sorted(seen)
                    details.append(f"thread ran on CPUs {sorted(seen)} in the window")
        p = views.get("perf")
        if p is not None:
            w = p.counter(f"perf.{sp.pid}.cpu_migrations_total")
            if w is not None and w.window > 0 and w.z >= 3:
                ev[w.name] = w.to_dict()
                s = max(s, 0.5)
                details.append(f"perf: {w.window:.0f} cpu-migrations in the window")
        return CauseScore("migration", s, detail="; ".join(details), evidence=ev) if s else None

    def _memory(self, sp: Spike, views, recent) -> CauseScore | None:
        s, ev, details = 0.0, {}, []
        if sp.majflt > 0:
            s = 0.9
            ev["majflt"] = sp.majflt
            details.append(f"{sp.majflt} major fault(s) in the call")
        if sp.minflt >= 0:
            med, mad = self._recent_stat(recent, 0)
            excess = sp.minflt - med
            # Slept in the call (voluntary switches over the probe's own usual count) while
            # faulting: the thread waited for its pages (swap-in, file read-in). Swap-in
            # readahead makes most of those faults minor (swap-cache hits), so minor faults
            # count here too.
            nv_med, _ = self._recent_stat(recent, 3)
            if sp.nvcsw > nv_med and sp.nvcsw > 0 and (
                    sp.majflt > 0 or excess >= max(4.0, 5 * 1.4826 * mad)):
                s = max(s, 0.9)
                ev["blocked_in_call"] = sp.nvcsw
                details.append(f"slept {sp.nvcsw} time(s) in the call while faulting "
                               f"({sp.majflt} major, {sp.minflt} minor): waited for its pages")
            if excess >= max(8.0, 5 * 1.4826 * mad):
                st = min(0.85, 0.3 + 0.15 * math.log2(excess / 8.0 + 1))
                if st > s:
                    s = st
                ev["minflt"] = sp.minflt
                ev["minflt_baseline_median"] = med
                details.append(f"{sp.minflt} minor faults in the call (baseline {med:.0f})")
        v = views.get("sched")
        if v is not None and sp.minflt < 0:
            for k, thr, st in (("majflt", 1, 0.8), ("minflt", 16, 0.5)):
                w = v.counter(f"sched.{sp.tid}.{k}")
                if w is not None and w.excess >= thr and w.z >= 3:
                    ev[w.name] = w.to_dict()
                    s = max(s, st)
                    details.append(f"thread {k}: +{w.excess:.0f} in the window")
        m = views.get("memory")
        if m is not None:
            for k in ("pgmajfault", "pgscan_direct", "allocstall_normal", "allocstall_movable",
                      "compact_stall", "thp_fault_fallback"):
                w = m.counter(f"mem.all.{k}")
                if w is not None and w.excess >= 1 and w.z >= 3:
                    ev[w.name] = w.to_dict()
                    if s > 0:
                        s = min(0.95, s + 0.05)
                    elif k != "pgmajfault":
                        s = max(s, 0.3)  # host-wide reclaim/compaction, not seen in-process
                    details.append(f"{k} +{w.excess:.0f}")
            w = m.counter("psi.memory.some_us")
            if w is not None and w.window > 0 and w.z >= 3:
                ev[w.name] = w.to_dict()
                s = max(s, min(0.8, 0.3 + w.window * 1e3 / sp.excess_ns))
                details.append(f"memory PSI stall {w.window:.0f} µs")
        return CauseScore("page_faults", s, detail="; ".join(details), evidence=ev) if s else None

    def _numa(self, sp: Spike, views) -> CauseScore | None:
        ev, s = {}, 0.0
        for rname, names in (("numa", None), ("memory", ["mem.all.numa_miss",
                                                         "mem.all.numa_foreign"])):
            v = views.get(rname)
            if v is None:
                continue
            for name in names or [n for n in v.ring.cols
                                  if n.endswith((".numa_miss", ".other_node", ".numa_foreign"))]:
                w = v.counter(name)
                if w is not None and w.excess >= 10 and w.z >= 4:
                    ev[name] = w.to_dict()
                    s = max(s, min(0.6, 0.2 * math.log10(w.excess)))
        return CauseScore("numa_remote", s, detail="remote NUMA allocations in the window",
                          evidence=ev) if s else None

    def _gpu_foreign(self, sp: Spike, gpu: str) -> list[tuple[str, str]]:
        """Names of the foreign processes on ``gpu`` around the spike, from the collector."""
        if self.gpu_detail is None:
            return []
        try:
            causes = self.gpu_detail(sp.start_ns - self.slack_ns, sp.end_ns + self.slack_ns)
        except Exception:  # noqa: BLE001 - naming is a bonus; the count already attributes
            return []
        return [(c.cause, c.evidence) for c in causes if c.cause.startswith("GPU shared with")
                and str(c.gpu) == gpu]

    def _gpu(self, sp: Spike, views) -> list[CauseScore | None]:
        v = views.get("gpu")
        if v is None:
            return []
        out: list[CauseScore | None] = []
        for name in v.names("gpu."):
            if not name.endswith((".clock_event_reasons", ".foreign_processes")):
                continue
            # Only the probe's GPU(s) (GpuCollector's gpu.N.probe_gpu, 0 on a GPU the probe
            # has no context on): a foreign process or throttle on another GPU is not ours.
            scope = v.gauge(f"gpu.{name.split('.')[1]}.probe_gpu", low=False)
            if scope is not None and scope.window < 1:
                continue
            if name.endswith(".clock_event_reasons"):
                w = v.gauge(name, low=False)
                if w is None or w.window != w.window:
                    continue
                bits = int(w.window)
                named = [n for b, n in GPU_REASONS.items() if bits & b]
                if named:
                    out.append(CauseScore("gpu_throttle", 0.7,
                                          detail=f"GPU {name.split('.')[1]}: {', '.join(named)}",
                                          evidence={name: bits}))
            elif name.endswith(".foreign_processes"):
                w = v.gauge(name, low=False)
                if w is not None and w.window >= 1:
                    gpu = name.split(".")[1]
                    detail = f"{w.window:.0f} foreign compute process(es) on GPU {gpu}"
                    ev: dict = {name: w.window}
                    who = self._gpu_foreign(sp, gpu)
                    if who:  # "GPU shared with PID 4242 (python3)"
                        detail = "; ".join(label for label, _ in who)
                        ev["processes"] = [e for _, e in who]
                    out.append(CauseScore("gpu_foreign_process", 0.6, detail=detail,
                                          evidence=ev))
        return out

    def _pcie(self, sp: Spike, views) -> CauseScore | None:
        v = views.get("pcie")
        if v is None:
            return None
        ev, s, details = {}, 0.0, []
        for name in v.names("pcie."):
            if "_total" in name and ".aer_" in name:
                w = v.counter(name)
                if w is not None and w.window > 0:
                    ev[name] = w.window
                    s = max(s, 0.6)
                    details.append(f"{name}: +{w.window:.0f}")
        return CauseScore("pcie_errors", s, detail="; ".join(details), evidence=ev) if s else None
