"""Statistics for an alternating A/B benchmark made of pairs of adjacent blocks (pure numpy).

The estimate is the ratio of *pooled* quantiles (all of A's samples against all of B's), and
its confidence interval comes from a **paired block bootstrap**: pairs of adjacent A/B blocks
are resampled with replacement (a pair's two blocks always together, so drift that both
blocks of a pair share cancels out of the ratio), and the pooled quantile ratio is computed
again for every resample.

A resample is a vector of counts (how many times each pair was drawn). The pooled quantile of
a resample is the quantile of the multiset in which block k appears ``counts[k]`` times; it is
found exactly, without building that multiset, by a binary search over the sorted pool of all
samples, vectorised over resamples: for a candidate position ``j`` the weight at or below it
is ``counts · M[j]``, ``M[j]`` being how many of each block's samples sit at or below ``j``.
The pooled quantile of a mixture lies between its blocks' own quantiles, so ``M`` is only built
on that window of the pool (a few percent of it for P99); each result is checked against the
window's edges and redone on the whole pool if it fails (float rounding of ``p * n``).

Quantile definition (the one ``bench/sampler_ab.py`` always used, and agent.stats' nearest
rank): the ``ceil(p * n)``-th smallest value, no interpolation, ``p`` a fraction here (0.99).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent import stats

VERDICT_WITHIN = "within {tol:g} %"
VERDICT_DIFFERS = "differs"
VERDICT_INCONCLUSIVE = "inconclusive at this noise"


def rank(p: float, n: np.ndarray | int) -> np.ndarray:
    """1-based rank of the p-quantile (a fraction) among n values: agent.stats.nearest_ranks,
    ceil(p * n) clamped to [1, n]."""
    return stats.nearest_ranks(stats.percent(p), n)


def quantile(a: np.ndarray, p: float) -> float:
    """The ceil(p * n)-th smallest value of ``a`` (agent.stats.quantile; p a fraction)."""
    a = np.asarray(a)
    if a.size == 0:
        raise ValueError("quantile of an empty array")
    return float(stats.quantile(a, stats.percent(p)))


def qkey(p: float) -> str:
    """0.5 -> "p50", 0.99 -> "p99", 0.999 -> "p99.9"."""
    return f"p{round(p * 100, 6):g}"


class Pool:
    """All samples of a list of blocks, sorted once, for pooled quantiles of block resamples."""

    def __init__(self, blocks: Sequence[np.ndarray]) -> None:
        if not blocks:
            raise ValueError("no blocks")
        self.sizes = np.array([len(b) for b in blocks], dtype=np.int64)
        if (self.sizes == 0).any():
            raise ValueError(f"empty block(s): {np.flatnonzero(self.sizes == 0).tolist()}")
        self.k = len(blocks)
        vals = np.concatenate([np.asarray(b) for b in blocks])
        gid = np.repeat(np.arange(self.k, dtype=np.int32), self.sizes)
        order = np.argsort(vals, kind="stable")
        self.v = vals[order]
        self.g = gid[order]
        # each block sorted, concatenated: block k is sorted_blocks[starts[k]:starts[k] + n_k]
        self.sorted_blocks = np.concatenate([np.sort(np.asarray(b)) for b in blocks])
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    def pooled(self, p: float) -> float:
        """The p-quantile of all samples (every block once)."""
        return float(self.v[int(rank(p, len(self.v))) - 1])

    def _window_matrix(self, lo: int, hi: int) -> np.ndarray:
        """Row i: per-block count of pool positions < lo + i, for i = 0 .. hi - lo + 1."""
        base = np.bincount(self.g[:lo], minlength=self.k).astype(np.int32)
        w = hi - lo + 1
        m = np.zeros((w + 1, self.k), dtype=np.int32)
        m[0] = base
        m[np.arange(1, w + 1), self.g[lo:hi + 1]] = 1
        return np.cumsum(m, axis=0, out=m)

    def _search(self, counts: np.ndarray, target: np.ndarray, lo: int, hi: int):
        """Smallest pool position j in [lo, hi] whose cumulative weight reaches target, per
        row of counts, and whether the window was right for that row."""
        m = self._window_matrix(lo, hi)
        c = counts.astype(np.int64)

        def weight(rows: np.ndarray) -> np.ndarray:  # cumulative weight through lo + rows - 1
            return np.einsum("bk,bk->b", m[rows], c)

        nb = len(c)
        ok = (weight(np.zeros(nb, dtype=np.int64)) < target) & \
            (weight(np.full(nb, hi - lo + 1, dtype=np.int64)) >= target)
        left = np.zeros(nb, dtype=np.int64)
        right = np.full(nb, hi - lo, dtype=np.int64)
        while (left < right).any():
            mid = (left + right) // 2
            reached = weight(mid + 1) >= target
            right = np.where(reached, mid, right)
            left = np.where(reached, left, mid + 1)
        return lo + left, ok

    def quantiles(self, counts: np.ndarray, p: float) -> np.ndarray:
        """Pooled p-quantile for each row of ``counts`` ([n_resamples, n_blocks] ints: how many
        times each block is in the resample)."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.int64))
        if counts.shape[1] != self.k:
            raise ValueError(f"counts has {counts.shape[1]} columns for {self.k} blocks")
        total = counts @ self.sizes
        if (total == 0).any():
            raise ValueError("a resample with no samples")
        target = rank(p, total)
        per_block = self.sorted_blocks[self.starts + rank(p, self.sizes) - 1]
        lo = int(np.searchsorted(self.v, per_block.min(), "left"))
        hi = int(np.searchsorted(self.v, per_block.max(), "right")) - 1
        pos, ok = self._search(counts, target, lo, hi)
        if not ok.all():  # float rounding put a row's answer outside the window: whole pool
            bad = np.flatnonzero(~ok)
            pos[bad], _ = self._search(counts[bad], target[bad], 0, len(self.v) - 1)
        return self.v[pos]


def verdict(lo: float, hi: float, tol: float = 0.05) -> str:
    """"within" when the whole interval lies in [1 - tol, 1 + tol]; "differs" when it lies wholly
    outside; otherwise inconclusive."""
    if lo >= 1 - tol and hi <= 1 + tol:
        return VERDICT_WITHIN.format(tol=tol * 100)
    if hi < 1 - tol or lo > 1 + tol:
        return VERDICT_DIFFERS
    return VERDICT_INCONCLUSIVE


def paired_bootstrap(a_blocks: Sequence[np.ndarray], b_blocks: Sequence[np.ndarray],
                     ps: Sequence[float] = (0.5, 0.99), n_boot: int = 2000,
                     seed: int | np.random.Generator | None = None, level: float = 0.95,
                     tol: float = 0.05) -> dict:
    """Ratio A/B of pooled quantiles with a paired block bootstrap interval.

    ``a_blocks[i]`` and ``b_blocks[i]`` are the two blocks of pair i (adjacent in time).
    Returns, per quantile (key "p50", "p99", ...): pooled A and B values, the ratio, the
    ``level`` percentile interval of the resampled ratio, its width, the verdict against
    ``tol`` and whether the interval excludes 1.
    """
    if len(a_blocks) != len(b_blocks):
        raise ValueError(f"{len(a_blocks)} A blocks vs {len(b_blocks)} B blocks: not pairs")
    if len(a_blocks) < 2:
        raise ValueError("need at least 2 pairs")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    pa, pb = Pool(a_blocks), Pool(b_blocks)
    k = pa.k
    counts = rng.multinomial(k, np.full(k, 1.0 / k), size=n_boot)
    alpha = (1 - level) / 2
    out: dict = {"pairs": k, "n_a": int(pa.sizes.sum()), "n_b": int(pb.sizes.sum()),
                 "n_boot": n_boot, "level": level, "tol": tol}
    for p in ps:
        qa, qb = pa.pooled(p), pb.pooled(p)
        ratio = pa.quantiles(counts, p).astype(np.float64) / pb.quantiles(counts, p)
        lo, hi = (float(x) for x in np.quantile(ratio, [alpha, 1 - alpha]))
        out[qkey(p)] = {"a": qa, "b": qb, "ratio": qa / qb, "ci": [lo, hi],
                        "ci_width": hi - lo, "boot_sd": float(ratio.std(ddof=1)),
                        "verdict": verdict(lo, hi, tol), "excludes_1": bool(lo > 1 or hi < 1)}
    return out


def aa_split(blocks: Sequence[np.ndarray], seed: int | np.random.Generator | None = None,
             ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """An A/A control from blocks of one mode: block 2j against block 2j+1 (the two sides
    assigned by a coin flip per pseudo-pair), K // 2 pseudo-pairs. Same treatment on both
    sides, so a ratio away from 1 is noise; with half as many pairs as the A/B comparison, its
    interval is expected about sqrt(2) wider than noise alone would make the A/B one."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    n = len(blocks) // 2
    flip = rng.random(n) < 0.5
    a = [blocks[2 * j + int(f)] for j, f in zip(range(n), flip)]
    b = [blocks[2 * j + 1 - int(f)] for j, f in zip(range(n), flip)]
    return a, b
