"""The attribution engine: :class:`Attributor` builds each collector ring's view of one
spike (:class:`~agent.watch.attribution.window.RingView`), asks every cause family for its
score (:data:`FAMILIES`, one module each) and combines them (:mod:`agent.watch.attribution.
rules`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import numpy as np

from agent.watch.attribution import (
    cpu,
    freq,
    gpu,
    irq,
    memory,
    migration,
    numa,
    pcie,
    rules,
    steal,
)
from agent.watch.attribution.spike import Attribution, CauseScore, Context, Spike
from agent.watch.attribution.window import RingView, median_mad
from agent.watch.ring import SignalRing

# The cause families, in the order their scores are merged (a tie keeps the earlier one).
FAMILIES: tuple[Callable[[Context], CauseScore | list[CauseScore] | None], ...] = (
    cpu.contention, irq.interrupts, steal.steal, freq.frequency, migration.migration,
    memory.page_faults, numa.numa_remote, gpu.gpu, pcie.pcie_errors)


class Attributor:
    """Maps a :class:`Spike` to ranked causes using the collector rings.

    ``rings``: collector name → SignalRing (or a callable returning them). ``probe_cpus``:
    the CPUs the latency source runs on. ``who_ran(t0, t1, cpus)`` (optional): tasks that
    ran on those CPUs in the window (``SchedCollector.who_ran``). ``others_share(t0, t1,
    cpus)`` (optional): the share of those CPUs' time other tasks took in the scans around
    the window (``SchedCollector.others_share``). ``irq_desc()`` (optional): IRQ row → its
    /proc/interrupts text after the counts. ``gpu_detail(t0_ns, t1_ns)`` (optional): the GPU
    collector's named causes for a window (``GpuCollector.causes``: who the foreign process
    is, which throttle reason).
    """

    def __init__(self, rings: Mapping[str, SignalRing] | Callable[[], Mapping[str, SignalRing]],
                 probe_cpus: list[int], *, who_ran=None, others_share=None, irq_desc=None,
                 gpu_detail=None,
                 baseline_s: float = 10.0, exclude_s: float = 0.1,
                 slack_ns: int = 1_000_000, baseline_quantum_s: float = 1.0) -> None:
        self._rings = rings
        self.probe_cpus = list(probe_cpus)
        self.who_ran = who_ran
        self.others_share = others_share
        self.irq_desc = irq_desc
        self.gpu_detail = gpu_detail
        self.baseline_s = baseline_s
        self.exclude_s = exclude_s
        self.slack_ns = slack_ns
        self.baseline_quantum_ns = int(baseline_quantum_s * 1e9)
        self._stats_cache: dict = {}  # ring name → its baseline of the current quantum
        self._recent_memo: tuple | None = None  # (recent array, {column: (median, MAD)})
        self._views: dict = {}  # ring name → (key, its view of the last spike window)

    def rings(self) -> Mapping[str, SignalRing]:
        return self._rings() if callable(self._rings) else self._rings

    def attribute(self, spike: Spike, recent: np.ndarray | None = None) -> Attribution:
        """``recent``: in-process evidence of recent non-spike samples, rows of
        (minflt, majflt, nivcsw[, nvcsw]) for the fault and blocking baselines (None: no
        baseline)."""
        t_from, t_to, b_to = self._bounds(spike)
        views = {name: self._view(r, t_from, t_to, b_to)
                 for name, r in self.rings().items() if r.rows}
        cpus = set(self.probe_cpus)
        if spike.cpu_start >= 0:
            cpus.add(spike.cpu_start)
        if spike.cpu_end >= 0:
            cpus.add(spike.cpu_end)
        ctx = Context(spike, views, cpus, self.probe_cpus, recent,
                      partial(self._recent_stat, recent), who_ran=self.who_ran,
                      others_share=self.others_share, irq_desc=self.irq_desc,
                      gpu_detail=self.gpu_detail, slack_ns=self.slack_ns)
        scores: list[CauseScore] = []
        for family in FAMILIES:
            found = family(ctx)
            scores.extend(found if isinstance(found, list) else [found])
        return rules.combine([s for s in scores if s is not None and s.strength > 0], spike)

    def _bounds(self, spike: Spike) -> tuple[int, int, int]:
        """The spike's window (less and plus the slack) and the end of its baseline.

        The baseline ends at least exclude_s before the window, on a quantum boundary:
        spikes of one storm share their baselines' statistics (computed once per ring per
        quantum, all columns at a time) instead of one median per signal per spike. A 1 s
        quantum (0.25 s before issue #38): natural spikes a second or two apart share them
        too (the baselines' medians were ~40 % of a spike's polled rules, recomputed for
        nearly every spike of a quiet run); a 10 s baseline that ends up to 1.1 s before
        the window instead of 0.35 s."""
        t_from, t_to = spike.start_ns - self.slack_ns, spike.end_ns + self.slack_ns
        q = self.baseline_quantum_ns
        b_to = t_from - int(self.exclude_s * 1e9)
        if q > 0:
            b_to -= b_to % q
        return t_from, t_to, b_to

    def same_rows(self, a: Spike, b: Spike) -> bool:
        """Whether the polled rules of spikes ``a`` and ``b`` weigh the same host evidence:
        every ring's rows in their windows are the same rows, against the same baseline
        (what the CPU budget asks before it sheds a storm's polled rules: schedule.py)."""
        (a0, a1, ab), (b0, b1, bb) = self._bounds(a), self._bounds(b)
        if ab != bb:
            return False
        for r in self.rings().values():
            if r.rows:
                sa = r.span(a0, a1)
                if sa is None or sa != r.span(b0, b1):
                    return False
        return True

    def _view(self, ring: SignalRing, t_from: int, t_to: int, b_to: int) -> RingView:
        """The ring's view of a spike window: the one made for an earlier spike whose window
        covers the same rows against the same baseline while the ring has no new row (a
        storm's spikes within one sampler round: 0.2 s rounds with the events on), else a
        new one. A view is read-only once made (its sums are the rows'), so spikes share it."""
        span = ring.span(t_from, t_to)  # (None: rows out of order, no key: a new view)
        key = (id(ring), ring.rows, b_to, span)
        hit = self._views.get(ring.name)
        if span is not None and hit is not None and hit[0] == key:
            return hit[1]
        v = RingView(ring, t_from, t_to, self.baseline_s, self.exclude_s, b_to,
                     self._stats_cache,
                     win=ring.window(t_from, t_to) if span is None else ring.indices(span))
        self._views[ring.name] = (key, v)
        return v

    def _recent_stat(self, recent: np.ndarray | None, col: int) -> tuple[float, float]:
        """median_mad of the in-process baseline, once per ``recent`` array (watch passes
        the same array for every spike it attributes in one step)."""
        memo = self._recent_memo
        if memo is None or memo[0] is not recent:
            memo = self._recent_memo = (recent, {})
        if col not in memo[1]:
            memo[1][col] = median_mad(recent, col)
        return memo[1][col]
