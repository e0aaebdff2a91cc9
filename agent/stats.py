"""Tail statistics, the one module: nearest-rank quantiles, sample sufficiency, intervals for a
proportion and exact tests on counts.

numpy and the standard library only (no TensorFlow, no scipy), cheap to import: the exporter
(:mod:`agent.export.metrics`), the gate (:mod:`agent.gate.evaluate`), the probe (:mod:`agent.probe.stats`),
``hftagent watch``'s summary (:mod:`agent.watch.summary`) and ``bench/`` use it.

**Keying.** Percentiles are given in percent (50, 99.0, 99.9) throughout; a quantile given as a
fraction (0.99, 0.999, as Prometheus labels them) goes through :func:`percent` first, exactly
(0.999 → 99.9).

**Nearest rank.** For ``n`` sorted samples the P``q`` value is the sample of 1-based rank
``ceil(q/100 · n)`` (at least 1), computed in exact rational arithmetic from the decimal that
``q`` prints as, so P99.9 of 10,000 samples is rank 9,990 and not the 9,991 that float
``99.9 / 100 * 10000`` gives. It is always an observed sample and equals
``numpy.percentile(..., method="inverted_cdf")``. :func:`nearest_rank_index`,
:func:`nearest_ranks` (vectorised over n), :func:`quantile` (an array or a plain sequence) and
:func:`quantile_sorted` all use it.

**Sufficiency.** A percentile is only claimed when enough samples lie beyond it.
:data:`REQUIRED_SAMPLES` holds DESIGN.md's figures (≥ 662 samples to claim P99, ≥ 6,636 to claim
P99.9, 99 % confidence; 6,636 is a little above the 6,620 that the rule below gives); P50/P90
and any other percentile follow the rule n·(1 − q) ≥ 6.62.

**Median.** :func:`median` (the midpoint median of an array without NaN, np.median's value,
from one ``np.partition``): watch's spike detector and attribution baselines.

**Intervals and tests.** :func:`wilson_interval` (score interval of a proportion),
:func:`binom_sf` (exact binomial upper tail), :func:`clopper_pearson` (exact interval, by
bisection on it) and :func:`fisher_greater` (one-sided Fisher exact test);
:func:`quantile_interval` (a percentile's distribution-free interval: two order statistics
whose ranks come from the binomial, :func:`quantile_interval_ranks`; ``hftagent tune try``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)

# Minimum sample count to claim each percentile (99 % confidence). P99 and P99.9 are DESIGN.md's
# figures; P50 and P90 follow n·(1 − q) ≥ 6.62, the rule those two figures imply.
REQUIRED_SAMPLES: dict[float, int] = {50.0: 14, 90.0: 67, 99.0: 662, 99.9: 6636}
P99_MIN_SAMPLES = REQUIRED_SAMPLES[99.0]
P999_MIN_SAMPLES = REQUIRED_SAMPLES[99.9]


# -- keys and sufficiency -----------------------------------------------------------------
def percent(p: float) -> float:
    """A quantile given as a fraction in percent, exactly: 0.5 → 50.0, 0.999 → 99.9."""
    f = Fraction(str(p))
    if not 0 <= f <= 1:
        raise ValueError(f"quantile out of range [0, 1]: {p}")
    return float(f * 100)


def pkey(q: float) -> str:
    """Key used in summaries: 50 → "p50", 99.9 → "p999"."""
    return "p" + f"{q:g}".replace(".", "")


def required_samples(q: float) -> int:
    """Samples needed to claim percentile ``q`` (percent; see the module docstring)."""
    if q in REQUIRED_SAMPLES:
        return REQUIRED_SAMPLES[q]
    return math.ceil(6.62 / (1.0 - q / 100.0))


def sufficient(n: int) -> dict[str, bool]:
    """Whether ``n`` samples are enough to claim P99 and P99.9: ``{"p99": .., "p999": ..}``."""
    return {pkey(q): n >= required_samples(q) for q in (99.0, 99.9)}


# -- nearest rank ---------------------------------------------------------------------------
def _exact(q: float) -> Fraction:
    f = Fraction(str(q))
    if not 0 <= f <= 100:
        raise ValueError(f"percentile out of range: {q}")
    return f


def nearest_rank(q: float, n: int) -> int:
    """1-based rank of the nearest-rank P``q`` among ``n`` samples: ceil(q/100 · n), at least 1
    (q = 0 is the minimum). ``n`` may be 0 (the rank is then 1: there is no such sample)."""
    return max(math.ceil(_exact(q) * n / 100), 1)


def nearest_rank_index(q: float, n: int) -> int:
    """0-based index into ``n`` sorted samples of the nearest-rank P``q`` (0 ≤ q ≤ 100: q = 0 is
    the minimum; n ≥ 1, else ValueError)."""
    if n < 1:
        raise ValueError("no samples")
    return nearest_rank(q, n) - 1


def nearest_ranks(q: float, n: np.ndarray | int) -> np.ndarray:
    """:func:`nearest_rank` over an array of sample counts (int64, each clamped to [1, max(n, 1)]),
    in integer arithmetic: the same ranks as the scalar version."""
    f = _exact(q)
    n = np.asarray(n, dtype=np.int64)
    num, den = f.numerator, f.denominator * 100
    if n.size and num and int(n.max()) > (2**62) // num:  # num · n would overflow int64
        r = np.array([-(-num * int(x) // den) for x in n.ravel()], dtype=np.int64).reshape(n.shape)
    else:
        r = -(-(num * n) // den)
    return np.clip(r, 1, np.maximum(n, 1))


def quantile_sorted(values: Sequence[Any] | np.ndarray, q: float) -> Any:
    """The nearest-rank P``q`` of already sorted ``values`` (array or sequence). ValueError when
    empty."""
    return values[nearest_rank_index(q, len(values))]


def quantile(values: Sequence[Any] | np.ndarray, q: float) -> Any:
    """The nearest-rank P``q`` of ``values`` (an observed sample; nothing interpolated). A numpy
    array is partitioned and its element comes back as a Python scalar (an int for an integer
    array); any other sequence is sorted and its element comes back. ValueError when empty."""
    if isinstance(values, np.ndarray):
        v = values.ravel()
        k = nearest_rank_index(q, int(v.size))
        return np.partition(v, k)[k].item()
    return quantile_sorted(sorted(values), q)


# -- the median ------------------------------------------------------------------------------
def median(a: np.ndarray) -> float:
    """np.median of a 1-D array without NaN (NaN when empty), from one ``np.partition``:
    np.median goes through several Python layers a call and checks for NaN through
    numpy.ma, whose first import (~17 ms of CPU, numpy 2) fell inside the first spike a
    watch attributed (issue #38)."""
    n = len(a)
    if not n:
        return float("nan")
    k = n // 2
    if n % 2:
        return float(np.partition(a, k)[k])
    p = np.partition(a, (k - 1, k))
    return (float(p[k - 1]) + float(p[k])) / 2.0


# -- a proportion: intervals ----------------------------------------------------------------
def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a proportion k/n (default 95 %). (0, 1) when n == 0."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _lgamma(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.lgamma, otypes=[float])(x)


def _log_binom_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    return (math.lgamma(n + 1) - _lgamma(k + 1) - _lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def binom_sf(k: int, n: int, p: float) -> float:
    """Exact P(X ≥ k) for X ~ Binomial(n, p) (the one-sided binomial test's p-value)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    # Terms beyond the mode fall off faster than geometrically: 40 sd past it is enough.
    mean = n * p
    stop = min(n, int(max(k, mean) + 40 * math.sqrt(mean * (1 - p)) + 50))
    ks = np.arange(k, stop + 1, dtype=np.float64)
    logs = _log_binom_pmf(ks, n, p)
    m = float(logs.max())
    return float(min(1.0, math.exp(m) * np.exp(logs - m).sum()))


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a proportion k/n, by bisection on binom_sf."""
    if n <= 0:
        return (0.0, 1.0)
    a = (1.0 - confidence) / 2

    def solve(f, target: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if f(mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2
    low = 0.0 if k == 0 else solve(lambda p: binom_sf(k, n, p), a)
    # upper: P(X ≤ k | p) = a  ⇔  1 − P(X ≥ k + 1 | p) = a; decreasing in p.
    high = 1.0 if k == n else solve(lambda p: -(1.0 - binom_sf(k + 1, n, p)), -a)
    return (low, high)


def fisher_greater(k_cur: int, n_cur: int, k_base: int, n_base: int) -> float:
    """One-sided Fisher exact test p-value that the current exceedance rate is higher than the
    baseline's (hypergeometric upper tail, margins fixed)."""
    total_k = k_cur + k_base
    n = n_cur + n_base
    if total_k == 0:
        return 1.0
    lo = max(0, total_k - n_base)
    hi = min(total_k, n_cur)
    xs = np.arange(max(k_cur, lo), hi + 1, dtype=np.float64)
    if xs.size == 0:
        return 0.0
    lc = math.lgamma

    def log_h(x: np.ndarray) -> np.ndarray:  # log C(n_cur, x) C(n_base, K − x) / C(n, K)
        return (lc(n_cur + 1) - _lgamma(x + 1) - _lgamma(n_cur - x + 1)
                + lc(n_base + 1) - _lgamma(total_k - x + 1) - _lgamma(n_base - total_k + x + 1)
                - (lc(n + 1) - lc(total_k + 1) - lc(n - total_k + 1)))
    logs = log_h(xs)
    m = float(logs.max())
    return float(min(1.0, math.exp(m) * np.exp(logs - m).sum()))


# -- a quantile: a distribution-free interval ------------------------------------------------
def _lower_tail(k: int, n: int, p: float) -> float:
    """Exact P(X ≤ k) for X ~ Binomial(n, p), as the upper tail of n − X (no 1 − x rounding)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return binom_sf(n - k, n, 1.0 - p)


def quantile_interval_ranks(n: int, q: float, confidence: float = 0.95
                            ) -> tuple[int | None, int | None]:
    """1-based ranks (lo, hi) of the order statistics that bound the P``q`` (percent) of a
    continuous distribution with at least ``confidence``, from ``n`` samples: distribution-free
    (the count of samples below the true quantile is Binomial(n, q/100)).

    ``lo`` is the largest rank with P(B ≤ lo − 1) ≤ α/2 and ``hi`` the smallest with
    P(B ≥ hi) ≤ α/2 (α = 1 − confidence), so P(X(lo) ≤ ξ ≤ X(hi)) = P(lo ≤ B ≤ hi − 1) ≥
    confidence. None on a side where no sample is far enough out: too few samples to bound
    the quantile there (P99.9 from 1,000 samples has no upper bound: every sample lies below
    it with probability 0.999^1000 = 37 %)."""
    if n < 1:
        return (None, None)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence out of range (0, 1): {confidence}")
    p = float(_exact(q) / 100)
    a = (1.0 - confidence) / 2
    # Both ranks lie within a few sd of n·p: search there first (a tail far from the mean
    # costs binom_sf a sum over every term in between), the whole range if that is wrong.
    c = 12 * math.sqrt(n * p * (1 - p)) + 12
    near_lo, near_hi = max(0, math.floor(n * p - c)), min(n + 1, math.ceil(n * p + c))
    # lo: P(B ≤ lo − 1) grows with lo; the largest lo in 1..n with it ≤ a
    left, right = 0, n  # invariant: rank `left` qualifies (0: none does)
    if near_lo >= 1 and _lower_tail(near_lo - 1, n, p) <= a:
        left, right = near_lo, min(n, near_hi)
    while left < right:
        mid = (left + right + 1) // 2
        if _lower_tail(mid - 1, n, p) <= a:
            left = mid
        else:
            right = mid - 1
    lo = left or None
    # hi: P(B ≥ hi) falls with hi; the smallest hi in 1..n with it ≤ a
    left, right = 1, n + 1  # n + 1: none does
    if near_hi <= n and binom_sf(near_hi, n, p) <= a:
        left, right = max(1, near_lo), near_hi
    while left < right:
        mid = (left + right) // 2
        if binom_sf(mid, n, p) <= a:
            right = mid
        else:
            left = mid + 1
    hi = left if left <= n else None
    return (lo, hi)


def quantile_interval(sorted_values: Sequence[Any] | np.ndarray, q: float,
                      confidence: float = 0.95) -> tuple[Any | None, Any | None]:
    """The distribution-free ``confidence`` interval of the P``q`` of already sorted
    ``sorted_values``: the order statistics of :func:`quantile_interval_ranks` (observed
    samples), None on a side the sample count cannot bound."""
    lo, hi = quantile_interval_ranks(len(sorted_values), q, confidence)

    def at(rank: int | None) -> Any | None:
        if rank is None:
            return None
        v = sorted_values[rank - 1]
        return v.item() if isinstance(v, np.generic) else v
    return (at(lo), at(hi))
