"""bench/abstats.py: pooled quantiles of block resamples, the paired block bootstrap, verdicts
and the A/A split, on synthetic data (fast: no probe, no sampler)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.abstats import (
    VERDICT_DIFFERS,
    VERDICT_INCONCLUSIVE,
    Pool,
    aa_split,
    paired_bootstrap,
    quantile,
    verdict,
)


def synthetic(seed: int, pairs: int = 60, n: int = 300, shift: float = 1.0,
              drift_sd: float = 0.2, block_sd: float = 0.02):
    """Latency-like blocks (lognormal around 400 µs, in ns): a drift factor shared by the two
    blocks of a pair (±20 %, like the shared VM), independent jitter per block, and a
    multiplicative ``shift`` on the A side."""
    rng = np.random.default_rng(seed)
    drift = np.exp(rng.normal(0.0, drift_sd, pairs))
    a, b = [], []
    for d in drift:
        ja, jb = np.exp(rng.normal(0.0, block_sd, 2))
        a.append(rng.lognormal(np.log(4e5), 0.25, n) * d * ja * shift)
        b.append(rng.lognormal(np.log(4e5), 0.25, n) * d * jb)
    return a, b


def expand(blocks, counts):
    return np.concatenate([np.tile(b, c) for b, c in zip(blocks, counts)])


def test_quantile_is_the_ceil_rank_order_statistic():
    a = np.arange(1, 101)
    assert quantile(a, 0.5) == 50 and quantile(a, 0.99) == 99 and quantile(a, 1.0) == 100
    assert quantile(a, 0.0) == 1 and quantile(np.array([7]), 0.99) == 7
    b = np.arange(1, 11)[::-1]  # p * n not an integer: ceil, not floor or interpolation
    assert quantile(b, 0.55) == 6 and quantile(b, 0.99) == 10 and quantile(b, 0.01) == 1


def test_pool_quantiles_equal_the_quantile_of_the_expanded_resample():
    rng = np.random.default_rng(7)
    for _ in range(30):
        k = int(rng.integers(1, 9))
        # small integer values: many ties, blocks of very different sizes and levels
        blocks = [rng.integers(0, int(rng.integers(2, 60)), int(rng.integers(1, 40))) + 10 * j
                  for j in range(k)]
        counts = rng.integers(0, 4, (10, k))
        counts[counts.sum(1) == 0, 0] = 1
        pool = Pool(blocks)
        for p in (0.01, 0.37, 0.5, 0.9, 0.99, 0.999, 1.0):
            want = [quantile(expand(blocks, c), p) for c in counts]
            np.testing.assert_array_equal(pool.quantiles(counts, p), want)
            assert pool.pooled(p) == quantile(np.concatenate(blocks), p)


def test_pool_falls_back_to_the_whole_pool_when_the_window_is_wrong(monkeypatch):
    """The window check is what makes the fast path safe: force a wrong window and the answer
    must still be exact."""
    rng = np.random.default_rng(3)
    blocks = [rng.integers(0, 100, 50) for _ in range(6)]
    counts = rng.integers(0, 3, (30, 6))
    counts[counts.sum(1) == 0, 0] = 1
    pool = Pool(blocks)
    real = Pool._search
    seen = []

    def narrow(self, c, t, lo, hi):
        seen.append((lo, hi))
        if len(seen) == 1:  # first call: a one-position window, wrong for most rows
            return real(self, c, t, hi, hi)
        return real(self, c, t, lo, hi)

    monkeypatch.setattr(Pool, "_search", narrow)
    got = pool.quantiles(counts, 0.9)
    assert len(seen) == 2 and seen[1] == (0, len(pool.v) - 1)
    np.testing.assert_array_equal(got, [quantile(expand(blocks, c), 0.9) for c in counts])


def test_pool_rejects_empty_blocks_and_wrong_counts():
    with pytest.raises(ValueError):
        Pool([np.array([1, 2]), np.array([], dtype=np.int64)])
    with pytest.raises(ValueError):
        Pool([np.array([1, 2])]).quantiles(np.array([[1, 1]]), 0.5)


def test_verdict_boundaries():
    assert verdict(0.95, 1.05) == "within 5 %"
    assert verdict(0.97, 1.02) == "within 5 %"
    assert verdict(1.06, 1.20) == VERDICT_DIFFERS
    assert verdict(0.80, 0.949) == VERDICT_DIFFERS
    assert verdict(0.94, 1.01) == VERDICT_INCONCLUSIVE
    assert verdict(1.02, 1.07) == VERDICT_INCONCLUSIVE  # excludes 1 but not shown beyond 5 %
    assert verdict(0.90, 1.10) == VERDICT_INCONCLUSIVE
    assert verdict(0.985, 1.015, tol=0.01) == VERDICT_INCONCLUSIVE
    assert verdict(0.995, 1.005, tol=0.01) == "within 1 %"


def test_no_change_ci_contains_1_and_never_differs():
    seeds = range(20)
    res = [paired_bootstrap(*synthetic(s), ps=(0.99,), seed=100 + s)["p99"] for s in seeds]
    covered = sum(r["ci"][0] <= 1.0 <= r["ci"][1] for r in res)
    assert covered >= 16, [r["ci"] for r in res]  # nominal 95 %: 19 of 20 expected
    assert all(r["verdict"] != VERDICT_DIFFERS for r in res)
    assert sum(r["verdict"] == "within 5 %" for r in res) >= 16


def test_a_10_percent_shift_differs():
    for s in range(8):
        r = paired_bootstrap(*synthetic(s, shift=1.10), ps=(0.5, 0.99), seed=s)
        for key in ("p50", "p99"):
            assert r[key]["verdict"] == VERDICT_DIFFERS, (s, key, r[key])
            assert r[key]["ci"][0] > 1.05 and r[key]["excludes_1"]
        assert abs(r["p99"]["ratio"] - 1.10) < 0.05


def test_too_much_noise_is_inconclusive_not_within():
    # per-block jitter of 15 % and only 12 pairs: no claim either way
    res = [paired_bootstrap(*synthetic(s, pairs=12, block_sd=0.15), ps=(0.99,), seed=s)["p99"]
           for s in range(6)]
    assert all(r["verdict"] == VERDICT_INCONCLUSIVE for r in res), [r["ci"] for r in res]


def test_the_bootstrap_keeps_pairs_together():
    """With drift shared inside a pair and no other jitter, resampling pairs (A and B blocks
    together) gives a far narrower interval than the same blocks with the pairing broken."""
    a, b = synthetic(5, drift_sd=0.3, block_sd=0.0)
    paired = paired_bootstrap(a, b, ps=(0.99,), seed=1)["p99"]["ci_width"]
    perm = np.random.default_rng(2).permutation(len(b))
    broken = paired_bootstrap(a, [b[i] for i in perm], ps=(0.99,), seed=1)["p99"]["ci_width"]
    assert broken > 2 * paired, (paired, broken)


def test_paired_bootstrap_figures_and_errors():
    a, b = synthetic(1, pairs=10, n=100)
    r = paired_bootstrap(a, b, seed=1, n_boot=500)
    assert r["pairs"] == 10 and r["n_a"] == r["n_b"] == 1000 and r["n_boot"] == 500
    p99 = r["p99"]
    assert p99["a"] == quantile(np.concatenate(a), 0.99)
    assert p99["ratio"] == pytest.approx(p99["a"] / p99["b"])
    assert p99["ci"][0] <= p99["ci"][1] and p99["ci_width"] == pytest.approx(
        p99["ci"][1] - p99["ci"][0])
    assert r == paired_bootstrap(a, b, seed=1, n_boot=500)  # seeded: reproducible
    with pytest.raises(ValueError):
        paired_bootstrap(a, b[:-1])
    with pytest.raises(ValueError):
        paired_bootstrap(a[:1], b[:1])


def test_aa_split_uses_each_block_once_in_pseudo_pairs():
    blocks = [np.full(3, i) for i in range(9)]
    a, b = aa_split(blocks, seed=4)
    assert len(a) == len(b) == 4
    ids = [(int(x[0]), int(y[0])) for x, y in zip(a, b)]
    assert all({x, y} == {2 * j, 2 * j + 1} for j, (x, y) in enumerate(ids))
    assert len({x for x, _ in ids}) == 4
    flips = [x > y for x, y in ids] + [
        int(x[0]) > int(y[0]) for x, y in zip(*aa_split([np.full(3, i) for i in range(40)], 1))]
    assert any(flips) and not all(flips)  # the sides are assigned by a coin flip


def test_aa_control_on_one_mode_does_not_differ():
    a, _ = synthetic(9, pairs=80)
    x, y = aa_split(a, seed=9)
    r = paired_bootstrap(x, y, ps=(0.99,), seed=9)["p99"]
    assert r["ci"][0] <= 1.0 <= r["ci"][1]
