"""agent/stats.py: nearest-rank quantiles (arrays, sequences, vectorised ranks), the sample
minimums, intervals and exact count tests; and that the modules which had their own copies
now answer with its numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent import stats


# -- nearest rank -------------------------------------------------------------------------------
def brute_rank(q: float, n: int) -> int:
    """ceil(q/100 · n) in integers, from q's decimal digits (q has at most 3 decimals here)."""
    num = round(q * 1000)
    return max(-(-num * n // 100_000), 1)


@pytest.mark.parametrize("q", [0.0, 0.1, 1.0, 50.0, 55.0, 90.0, 99.0, 99.9, 99.99, 100.0])
def test_nearest_rank_is_the_ceil_rank_exactly(q):
    for n in list(range(0, 300)) + [662, 1000, 6636, 10_000, 12_345, 1_000_000]:
        assert stats.nearest_rank(q, n) == brute_rank(q, n), (q, n)
        if n:
            assert stats.nearest_rank_index(q, n) == brute_rank(q, n) - 1


def test_nearest_rank_no_float_roundoff():
    # float 99.9 / 100 * 10000 is 9990.000000000002, whose ceil is 9991
    assert math.ceil(99.9 / 100 * 10000) == 9991
    assert stats.nearest_rank_index(99.9, 10_000) == 9989
    assert stats.nearest_rank_index(99.0, 100) == 98
    assert stats.nearest_rank_index(50.0, 2) == 0 and stats.nearest_rank_index(50.0, 3) == 1


def test_edges_n0_n1_and_range():
    with pytest.raises(ValueError):
        stats.nearest_rank_index(50.0, 0)
    for q in (0.0, 50.0, 99.0, 99.9, 100.0):
        assert stats.nearest_rank_index(q, 1) == 0
        assert stats.quantile(np.array([7]), q) == 7 and stats.quantile([7], q) == 7
    for bad in (-0.1, 100.1, float("nan")):
        with pytest.raises(ValueError):
            stats.nearest_rank(bad, 10)
    with pytest.raises(ValueError):
        stats.quantile(np.array([], dtype=np.int64), 99.0)
    with pytest.raises(ValueError):
        stats.quantile([], 99.0)
    with pytest.raises(ValueError):
        stats.quantile_sorted([], 50.0)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 661, 662, 1000, 6636, 10_000, 12_345])
def test_array_and_sequence_versions_agree(n):
    rng = np.random.default_rng(n)
    v = rng.integers(1, 10_000_000, n)
    srt = np.sort(v)
    for q in (50.0, 90.0, 99.0, 99.9):
        want = int(srt[brute_rank(q, n) - 1])
        a = stats.quantile(v, q)
        s = stats.quantile(v.tolist(), q)
        assert type(a) is int and type(s) is int
        assert a == s == want == stats.quantile_sorted(srt, q) == \
            stats.quantile_sorted(srt.tolist(), q), (n, q)
        if (q * n) % 100:  # numpy's inverted_cdf rounds q·n in floats: equal off the integers
            assert want == int(np.percentile(v, q, method="inverted_cdf")), (n, q)


def test_quantile_of_floats_and_a_2d_array():
    v = np.array([[0.5, 3.25], [1.5, 2.0]])
    assert stats.quantile(v, 50.0) == 1.5 and type(stats.quantile(v, 50.0)) is float
    assert stats.quantile((3, 1, 2), 100.0) == 3 and stats.quantile((3, 1, 2), 0.0) == 1


def test_nearest_ranks_vectorised_equals_scalar():
    n = np.array([0, 1, 2, 9, 10, 11, 99, 100, 101, 662, 6636, 9999, 10_000, 10_001])
    for q in (0.0, 1.0, 50.0, 55.0, 99.0, 99.9, 100.0):
        got = stats.nearest_ranks(q, n)
        assert got.dtype == np.int64
        assert got.tolist() == [min(stats.nearest_rank(q, int(x)), max(int(x), 1)) for x in n]
    assert int(stats.nearest_ranks(99.9, 10_000)) == 9990
    # a count so large that num · n would overflow int64: still exact (Python ints)
    big = np.array([2**62], dtype=np.int64)
    assert int(stats.nearest_ranks(99.9, big)[0]) == -(-999 * 2**62 // 1000)


def test_percent_keys_fractions_exactly():
    assert stats.percent(0.5) == 50.0 and stats.percent(0.99) == 99.0
    assert stats.percent(0.999) == 99.9 and stats.percent(1) == 100.0
    assert 0.29 * 100 != 29.0 and stats.percent(0.29) == 29.0  # not a multiplication
    with pytest.raises(ValueError):
        stats.percent(1.5)
    assert stats.pkey(50.0) == "p50" and stats.pkey(99.9) == "p999" and stats.pkey(99) == "p99"


# -- minimums ------------------------------------------------------------------------------------
def test_required_samples_are_designs_figures():
    assert stats.REQUIRED_SAMPLES == {50.0: 14, 90.0: 67, 99.0: 662, 99.9: 6636}
    assert stats.P99_MIN_SAMPLES == 662 and stats.P999_MIN_SAMPLES == 6636
    assert stats.required_samples(99.0) == 662 and stats.required_samples(99.9) == 6636
    assert stats.required_samples(stats.percent(0.999)) == 6636
    assert stats.required_samples(95.0) == math.ceil(6.62 / 0.05)
    # P50/P90 follow the rule n·(1 − q) ≥ 6.62 that the DESIGN.md figures imply
    for q in (50.0, 90.0):
        assert stats.REQUIRED_SAMPLES[q] == math.ceil(6.62 / (1 - q / 100))


def test_sufficient_switches_at_the_minimums():
    assert stats.sufficient(0) == {"p99": False, "p999": False}
    assert stats.sufficient(661) == {"p99": False, "p999": False}
    assert stats.sufficient(662) == {"p99": True, "p999": False}
    assert stats.sufficient(6635) == {"p99": True, "p999": False}
    assert stats.sufficient(6636) == {"p99": True, "p999": True}


# -- intervals and tests -------------------------------------------------------------------------
def test_wilson_interval():
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = stats.wilson_interval(0, 100)
    assert lo == pytest.approx(0.0, abs=1e-12) and 0.03 < hi < 0.04
    lo, hi = stats.wilson_interval(50, 100)
    assert lo < 0.5 < hi and hi - 0.5 == pytest.approx(0.5 - lo)


def test_binom_sf_against_the_sum_of_terms():
    for n, p in ((10, 0.3), (50, 0.02), (200, 0.5)):
        for k in range(0, n + 2):
            want = sum(math.comb(n, j) * p**j * (1 - p)**(n - j) for j in range(k, n + 1))
            assert stats.binom_sf(k, n, p) == pytest.approx(want, rel=1e-9, abs=1e-300), (n, p, k)
    assert stats.binom_sf(1, 10, 0.0) == 0.0 and stats.binom_sf(1, 10, 1.0) == 1.0


def test_clopper_pearson_bounds_solve_their_equations():
    assert stats.clopper_pearson(0, 0) == (0.0, 1.0)
    lo, hi = stats.clopper_pearson(3, 6636)
    assert lo < 3 / 6636 < hi
    assert stats.binom_sf(3, 6636, lo) == pytest.approx(0.025, rel=1e-6)
    assert 1 - stats.binom_sf(4, 6636, hi) == pytest.approx(0.025, rel=1e-6)
    lo0, hi0 = stats.clopper_pearson(0, 100)
    assert lo0 == 0.0 and hi0 == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-6)
    assert stats.clopper_pearson(100, 100)[1] == 1.0


def test_fisher_greater_against_the_hypergeometric_sum():
    def want(kc, nc, kb, nb):
        K, N = kc + kb, nc + nb
        return sum(math.comb(nc, x) * math.comb(nb, K - x) for x in range(kc, min(K, nc) + 1)) \
            / math.comb(N, K)
    for args in ((5, 100, 1, 100), (0, 50, 3, 60), (7, 30, 7, 30), (2, 1000, 0, 1000)):
        assert stats.fisher_greater(*args) == pytest.approx(want(*args), rel=1e-9)
    assert stats.fisher_greater(0, 10, 0, 10) == 1.0


# -- the former copies answer with this module ------------------------------------------------
def test_users_share_the_one_module():
    from agent.export import metrics
    from agent.gate import evaluate as gate
    from agent.probe import config
    from agent.probe import stats as probe_stats
    from agent.watch import summary

    assert gate.nearest_rank_index is stats.nearest_rank_index
    assert gate.binom_sf is stats.binom_sf and gate.clopper_pearson is stats.clopper_pearson
    assert gate.fisher_greater is stats.fisher_greater and gate.quantile_nr is stats.quantile
    assert gate.P99_MIN_SAMPLES == 662
    assert probe_stats.nearest_rank_index is stats.nearest_rank_index
    assert probe_stats.REQUIRED_SAMPLES is stats.REQUIRED_SAMPLES
    assert probe_stats.wilson_interval is stats.wilson_interval
    assert config.DEFAULT_SAMPLES == stats.P999_MIN_SAMPLES
    assert not hasattr(metrics, "REQUIRED_SAMPLES") and not hasattr(metrics, "_nearest_rank_index")
    h = summary.LatencyHistogram()
    h.add(np.arange(1, 10_001, dtype=np.int64) * 1000)
    # rank 9,990 of 1 µs … 10 ms: the bucket edge at most 1 % above 9.99 ms
    assert 9_990_000 <= h.quantile(0.999) <= 9_990_000 * 1.01


def test_light_import():
    import subprocess
    import sys
    code = ("import sys, agent.stats; "
            "bad = [m for m in ('tensorflow', 'scipy', 'agent.gate.evaluate', 'agent.probe') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


# -- a quantile's distribution-free interval ---------------------------------------------------
def pmf(k: int, n: int, p: float) -> float:
    """Binomial(n, p) at k, in logs (math.comb(7000, k) overflows a float)."""
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + k * math.log(p) + (n - k) * math.log1p(-p))


def cdf(k: int, n: int, p: float) -> float:
    """P(B ≤ k), by plain summation."""
    return sum(pmf(j, n, p) for j in range(k + 1))


def coverage(lo: int, hi: int, n: int, p: float) -> float:
    """P(lo ≤ B ≤ hi − 1), B ~ Binomial(n, p): the exact coverage of [X(lo), X(hi)]."""
    return sum(pmf(k, n, p) for k in range(lo, hi))


def test_quantile_interval_exact_small_cases():
    # median of 6: [X(1), X(6)], coverage 1 − 2/64; of 5: P(B = 0) = 1/32 > 2.5 %: no bound
    assert stats.quantile_interval_ranks(6, 50.0) == (1, 6)
    assert coverage(1, 6, 6, 0.5) == pytest.approx(1 - 2 / 64)
    assert stats.quantile_interval_ranks(5, 50.0) == (None, None)
    # median of 9: P(B ≤ 1) = 10/512 ≤ 2.5 % < P(B ≤ 2) = 46/512: [X(2), X(8)]
    assert stats.quantile_interval_ranks(9, 50.0) == (2, 8)
    assert stats.quantile_interval_ranks(0, 50.0) == (None, None)
    # P99.9 of 1,000: 0.999^1000 = 37 % that every sample lies below it: no upper bound
    assert stats.quantile_interval_ranks(1000, 99.9)[1] is None


@pytest.mark.parametrize("n,q", [(20, 50.0), (100, 90.0), (700, 99.0), (7000, 99.9),
                                 (150, 10.0)])
def test_quantile_interval_ranks_are_the_tightest_that_cover(n, q):
    lo, hi = stats.quantile_interval_ranks(n, q)
    p = q / 100
    assert lo is not None and hi is not None
    below, above = cdf(lo - 1, n, p), 1 - cdf(hi - 1, n, p)
    assert below <= 0.025 + 1e-9 and above <= 0.025 + 1e-9
    assert coverage(lo, hi, n, p) >= 0.95 - 1e-9
    # one rank further in on either side breaks its tail's share
    assert cdf(lo, n, p) > 0.025
    assert 1 - cdf(hi - 2, n, p) > 0.025


@pytest.mark.parametrize("dist", ["exponential", "lognormal", "uniform"])
def test_quantile_interval_covers_known_quantiles(dist):
    rng = np.random.default_rng(7)
    n, q, trials = 8000, 99.9, 400
    true = {"exponential": -math.log(1 - q / 100),
            "lognormal": math.exp(3.090232306167813),   # Φ⁻¹(0.999)
            "uniform": q / 100}[dist]
    draw = {"exponential": lambda: rng.exponential(1.0, n),
            "lognormal": lambda: rng.lognormal(0.0, 1.0, n),
            "uniform": lambda: rng.random(n)}[dist]
    hits = 0
    for _ in range(trials):
        lo, hi = stats.quantile_interval(np.sort(draw()), q)
        hits += lo <= true <= hi
    # nominal ≥ 95 %: 400 trials put 3 sd at ±3.3 points
    assert hits / trials >= 0.91


def test_quantile_interval_values_are_samples():
    v = list(range(1, 101))
    lo, hi = stats.quantile_interval(v, 50.0)
    assert (lo, hi) == (v[stats.quantile_interval_ranks(100, 50.0)[0] - 1],
                        v[stats.quantile_interval_ranks(100, 50.0)[1] - 1])
    assert lo < 50 < hi
    assert stats.quantile_interval(np.arange(10, dtype=np.int64), 99.9) == (None, None) or \
        stats.quantile_interval(np.arange(10, dtype=np.int64), 99.9)[1] is None
    assert isinstance(stats.quantile_interval(np.arange(100, dtype=np.int64), 50.0)[0], int)
    with pytest.raises(ValueError):
        stats.quantile_interval_ranks(10, 50.0, confidence=1.0)
