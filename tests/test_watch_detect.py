"""agent.watch.detect: a batch marked in array operations (watch's always-on path once the
rolling P50 applies) gives the spikes, detection times and rolling P50 that the sample by
sample reading gives, on random batches with storms, thresholds and start-up."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.client import FIELDS
from agent.watch.detect import RECENT_SAMPLES, SpikeDetector, _Recent

F = {name: i for i, name in enumerate(FIELDS)}


def _batch(rng: np.random.Generator, n: int, seq0: int, storm: float) -> np.ndarray:
    recs = rng.integers(0, 1000, size=(n, len(FIELDS))).astype(np.int64)
    lat = rng.integers(200_000, 300_000, size=n)
    slow = rng.random(n) < storm
    lat[slow] = rng.integers(600_000, 5_000_000, size=int(slow.sum()))
    recs[:, F["seq"]] = np.arange(seq0, seq0 + n)
    recs[:, F["start_ns"]] = 10**9 + np.arange(seq0, seq0 + n) * 2_000_000
    recs[:, F["end_ns"]] = recs[:, F["start_ns"]] + lat
    recs[:, F["tid"]] = rng.integers(1, 4, size=n)
    return recs


def _spikes(d: SpikeDetector, batches: list[np.ndarray]) -> list:
    out = []
    for recs in batches:
        got = d.scan(recs, recs[:, F["end_ns"]] - recs[:, F["start_ns"]])
        out.append(([(sp, t) for sp, t in got], d.p50_ns, d.baseline_samples))
    return out


class _EachOnly(SpikeDetector):
    """The sample-by-sample reading throughout (what every batch was marked with before)."""

    def scan(self, recs, lat):
        out = self._scan_each(recs, lat)
        self._update_p50()
        return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([None, 1_000_000, 400_000]),
       st.sampled_from([20, 50, 300]), st.lists(st.tuples(st.integers(0, 400),
                                                          st.sampled_from([0.0, 0.05, 0.9])),
                                                min_size=1, max_size=12))
def test_a_batch_marked_at_once_is_marked_as_sample_by_sample(seed, thr, min_samples, sizes):
    rng = np.random.default_rng(seed)
    batches, seq = [], 0
    for n, storm in sizes:
        batches.append(_batch(rng, n, seq, storm))
        seq += n
    ticks = iter(range(10**9))
    fast = SpikeDetector(thr, 3.0, min_samples, queueing=False, clock=lambda: next(ticks))
    ticks2 = iter(range(10**9))
    slow = _EachOnly(thr, 3.0, min_samples, queueing=False, clock=lambda: next(ticks2))
    assert _spikes(fast, batches) == _spikes(slow, batches)


def test_the_rolling_window_keeps_the_latest_samples_across_its_wrap():
    r = _Recent(5)
    r.extend(np.array([1, 2, 3], dtype=np.int64))
    assert len(r) == 3 and r.median() == 2
    r.extend(np.array([10, 11, 12, 13], dtype=np.int64))  # wraps: 3, 10, 11, 12, 13 kept
    assert len(r) == 5 and sorted(r.buf.tolist()) == [3, 10, 11, 12, 13]
    r.extend(np.arange(100, 120, dtype=np.int64))  # longer than the window: its last 5
    assert sorted(r.buf.tolist()) == [115, 116, 117, 118, 119] and r.median() == 117
    assert len(_Recent()) == 0 and len(_Recent().buf) == RECENT_SAMPLES


def test_a_storm_does_not_raise_the_bar_it_is_measured_against():
    d = SpikeDetector(None, 3.0, 20, queueing=False, clock=lambda: 0)
    d.seed([250_000] * 100)
    recs = _batch(np.random.default_rng(1), 200, 0, 0.9)
    lat = recs[:, F["end_ns"]] - recs[:, F["start_ns"]]
    got = d.scan(recs, lat)
    assert len(got) == int((lat > 750_000).sum()) > 100
    assert d.p50_ns < 300_000


def test_the_rolling_median_is_numpys_for_every_fill():
    """The window's median (one np.partition, issue #38) is np.median's value: odd and even
    fills, ties, a window that wrapped."""
    import numpy as np

    from agent.watch.detect import _Recent
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 20, 21, 1999, 2000, 2001, 4500):
        for hi in (5, 10**7):
            r = _Recent()
            r.extend(rng.integers(1, hi, n))
            held = r.buf[:r.n] if r.n < len(r.buf) else r.buf
            assert r.median() == float(np.median(held)), (n, hi)
