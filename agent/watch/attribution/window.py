"""Window and baseline statistics of one collector ring for one spike (:class:`RingView`):
each signal's rows overlapping the spike window against its own recent baseline — the rows
of the preceding ``baseline_s`` seconds, excluding the last ``exclude_s`` — as median/MAD
z-scores and excess counts (:class:`SignalWindow`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.stats import median
from agent.watch.ring import SignalRing


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
        return {"window": rnd(self.window), "baseline_rate_per_s": rnd(self.base_rate),
                "z": rnd(self.z), "excess": rnd(self.excess)}


def median_mad(recent: np.ndarray | None, col: int) -> tuple[float, float]:
    """Median and MAD of one in-process column of recent non-spike samples (0, 0 without
    20 of them or without that column)."""
    if recent is None or len(recent) < 20 or recent.ndim != 2 or recent.shape[1] <= col:
        return 0.0, 0.0
    c = recent[:, col]
    c = c[c >= 0]
    if not len(c):
        return 0.0, 0.0
    med = median(c)
    return med, median(np.abs(c - med))


def rnd(x: float) -> float | None:
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
    n = a.shape[0] - np.isnan(srt).sum(axis=0)
    # (indexing by (row, column) arrays: np.clip and np.take_along_axis are Python wrappers,
    # four of them ~40 % of a baseline's cost; n // 2 ≤ rows - 1 for any rows ≥ 1)
    cols = np.arange(a.shape[1])
    med = (srt[np.maximum(n - 1, 0) // 2, cols] + srt[n // 2, cols]) / 2.0
    med[n == 0] = np.nan
    return med, n


class BaselineStats:
    """Median and MAD of every column of one ring's baseline rows, as rates per second,
    computed at once (columns with fewer than 5 non-NaN rows: 0, 0 — "nothing happening")."""

    __slots__ = ("med", "mad", "med_l", "mad_l")

    def __init__(self, ring: SignalRing, base: np.ndarray, base_dt: np.ndarray) -> None:
        width = len(ring.cols)
        if len(base) < 5 or not width:
            self.med = np.zeros(width)
            self.mad = np.zeros(width)
            self.med_l = self.mad_l = [0.0] * width
            return
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = ring.data[base, :width] / base_dt[:, None]
        med, n = col_median(rates)
        mad, _ = col_median(np.abs(rates - med[None, :]))
        few = n < 5
        self.med = np.where(few, 0.0, med)
        self.mad = np.where(few, 0.0, mad)
        self.med_l, self.mad_l = self.med.tolist(), self.mad.tolist()  # (counter's floats)


class _Baseline:
    """One ring's baseline rows for one baseline end (shared by the spikes of a quantum)."""

    __slots__ = ("base", "base_dt", "row_s", "_stats", "_ring", "rows_then", "_sums")

    def __init__(self, ring: SignalRing, b_from: int, b_to: int) -> None:
        self.rows_then = ring.rows
        base = ring.window(b_from, b_to)
        self.base = base[ring.t1[base] <= b_to] if len(base) else base
        dt_b = (ring.t1[self.base] - ring.t0[self.base]) / 1e9
        self.base_dt = np.where(dt_b > 0, dt_b, np.nan)
        ok = self.base_dt[~np.isnan(self.base_dt)]
        self.row_s = median(ok) if len(ok) else None
        self._ring = ring
        self._stats: BaselineStats | None = None
        self._sums: dict[int, float] = {}

    @property
    def stats(self) -> BaselineStats:
        if self._stats is None:
            self._stats = BaselineStats(self._ring, self.base, self.base_dt)
        return self._stats

    def col_sum(self, i: int) -> float:
        """Column ``i``'s sum over the baseline rows, NaN as 0 (once per column)."""
        got = self._sums.get(i)
        if got is None:
            got = self._sums[i] = float(np.nansum(self._ring.data[self.base, i])) \
                if len(self.base) else 0.0
        return got


class RingView:
    """Window/baseline statistics over one SignalRing for one spike, computed once per ring
    for all columns at a time. ``stats_cache`` (optional): a dict the :class:`Attributor`
    keeps across spikes, so the spikes whose baselines end at the same ``b_to`` (a quantum
    boundary) share one baseline selection and one median/MAD computation — a spike storm
    costs one window sum per ring per spike, not two medians per signal per spike."""

    def __init__(self, ring: SignalRing, t_from: int, t_to: int, baseline_s: float,
                 exclude_s: float, b_to: int | None = None,
                 stats_cache: dict | None = None, win: np.ndarray | None = None) -> None:
        self.ring = ring
        self.win = ring.window(t_from, t_to) if win is None else win
        if b_to is None:
            b_to = t_from - int(exclude_s * 1e9)
        # The key names the ring object and its columns' layout (a column added or given to
        # another signal since: computed again); the entry is dropped once the ring has
        # written over any of its baseline rows since (a run paused longer than the ring
        # holds, then a spike from the same quantum).
        key = (id(ring), b_to, int(baseline_s * 1e9), ring.layout)
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
        if len(self.win) <= self.FEW_ROWS:  # (a row or two: plain ints, no numpy calls)
            t0, t1 = ring._t0, ring._t1
            self.win_dt = sum([t1[k] - t0[k] for k in self.win.tolist()]) / 1e9
        else:
            self.win_dt = float((ring.t1[self.win] - ring.t0[self.win]).sum()) / 1e9
        self.row_s = bl.row_s if bl.row_s is not None else \
            (self.win_dt / max(1, len(self.win)) or 0.01)
        self._rows: list[list[float]] | None = None  # the window's rows (a few)
        self._wsum: list[float] | None = None  # or every column's window sum (many rows)
        self._wseen: list[bool] | None = None  # and whether it was read there
        self._med: list[float] = []
        self._mad: list[float] = []
        self._floor = 1.0 / max(self.row_s, 1e-3)  # one event per row

    @property
    def stats(self) -> BaselineStats:
        return self._bl.stats

    def base_sum(self, name: str) -> float:
        """The named column's sum over the baseline rows (NaN as 0; 0 without the column)."""
        i = self.ring.cols.get(name)
        return 0.0 if i is None else self._bl.col_sum(i)

    def _load(self) -> None:
        """The window's values and the baseline's statistics, at the first counter asked. A
        spike window covers a row or two: its rows as plain floats (one ``tolist``), each
        asked column summed from those — the rules ask for a few of a ring's columns (issue
        #38: they run for every spike of a storm). A longer window: every column's sum at
        once."""
        n = len(self.ring.cols)
        w = self.ring.data[self.win, :n]
        if len(self.win) > self.FEW_ROWS:
            nan = np.isnan(w)
            self._wseen = (~nan).any(axis=0).tolist()
            self._wsum = np.where(nan, 0.0, w).sum(axis=0).tolist()
        else:
            self._rows = w.tolist()
        st = self._bl.stats
        self._med, self._mad = st.med_l, st.mad_l

    FEW_ROWS = 8  # windows of at most this many rows are kept as plain rows

    def _sum(self, i: int) -> float | None:
        """Column ``i``'s window sum, None where no row of the window read it."""
        rows = self._rows
        if rows is None:
            return self._wsum[i] if self._wseen[i] else None
        total = None
        for row in rows:
            x = row[i]
            if x == x:
                total = x if total is None else total + x
        return total

    def counter(self, name: str) -> SignalWindow | None:
        i = self.ring.cols.get(name)
        if i is None or not len(self.win):
            return None
        if self._rows is None and self._wsum is None:
            self._load()
        total = self._sum(i)
        return None if total is None else self._counter_at(i, name, total)

    def _counter_at(self, i: int, name: str, total: float) -> SignalWindow:
        """Column ``i``'s window sum ``total`` against its baseline."""
        dt = self.win_dt
        rate = total / dt if dt > 0 else float("nan")
        med, mad = self._med[i], self._mad[i]
        scale = max(1.4826 * mad, 0.1 * abs(med), self._floor)
        z = (rate - med) / scale if rate == rate else float("nan")
        return SignalWindow(name, total, rate, med, mad, z, total - med * dt)

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
        med = median(b)
        mad = median(np.abs(b - med))
        z = (val - med) / max(1.4826 * mad, 1e-9) if len(b) else float("nan")
        return SignalWindow(name, val, val, med, mad, z, val - med if len(b) else float("nan"))

    def names(self, prefix: str = "", suffixes: tuple[str, ...] = ()) -> list[str]:
        return [n for n, _ in self.ring.cols_like(prefix, suffixes)]

    def hot(self, prefix: str, z_min: float, excess_min: float) -> list[SignalWindow]:
        """:meth:`counter` of each column named ``prefix``… (in column order) whose window is
        at least ``z_min`` over its baseline and ``excess_min`` above what it predicts: the
        interrupt rows a spike's rule weighs, without a SignalWindow for each of the dozens
        whose excess alone rules them out (issue #38)."""
        if not len(self.win):
            return []
        cols = self.ring.cols_like(prefix)
        if len(cols) >= self.HOT_ARRAYS_MIN:
            cols = self._may_reach(prefix, excess_min)
            if not cols:
                return []
        if self._rows is None and self._wsum is None:
            self._load()
        med, dt = self._med, self.win_dt
        out = []
        for name, i in cols:
            total = self._sum(i)
            if total is not None and total - med[i] * dt >= excess_min:
                w = self._counter_at(i, name, total)
                if w.z >= z_min:
                    out.append(w)
        return out

    # hot() over this many columns or more: an array pass picks the columns whose excess may
    # reach excess_min (a host's /proc/interrupts has hundreds of rows: ~0.5 µs a column in
    # Python, for every spike of a storm, issue #38), then those are weighed as hot() weighs
    # every column; under it column by column (a VM's few dozen: cheaper than the arrays)
    HOT_ARRAYS_MIN = 80

    def _may_reach(self, prefix: str, excess_min: float) -> list[tuple[str, int]]:
        """The (name, column) of ``prefix``'s columns whose window excess may reach
        ``excess_min``, by one array pass: a column whose sum falls short (less a margin for
        the order of the sums) is left out; one with NaN (a row did not read it) is kept, for
        :meth:`hot` to weigh exactly as it weighs every column."""
        names, cols = self.ring.cols_at(prefix)
        ex = self.ring.data[self.win][:, cols].sum(axis=0) - \
            self._bl.stats.med[cols] * self.win_dt
        maybe = np.flatnonzero(~(ex < excess_min - 1e-6 * (1.0 + abs(excess_min)))).tolist()
        at = range(cols.start, cols.stop) if isinstance(cols, slice) else cols.tolist()
        return [(names[j], at[j]) for j in maybe]
