"""A quiet step holds its calls (agent/watch/session.py HOLD_S): a batch without a spike, of
threads already followed, is ingested with the next batch that has a spike, a spike waiting,
the stop, or HOLD_S after the first held one; the spikes found and the latency ring's order
are what ingesting every batch at once gives. Virtual clocks (tests/test_watch_budget.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from agent.client import FIELDS
from agent.watch import session as session_mod
from tests.test_watch_budget import MS, Clocks, S, _session

F = {name: i for i, name in enumerate(FIELDS)}


def _batch(seq0: int, lats_us: list[int], tid: int = 7, t0: int = 10 * S) -> np.ndarray:
    rows = np.full((len(lats_us), len(FIELDS)), -1, dtype=np.int64)
    for i, us in enumerate(lats_us):
        r = rows[i]
        r[F["seq"]] = r[F["seq2"]] = seq0 + i + 1
        r[F["start_ns"]] = t0 + (seq0 + i) * MS
        r[F["end_ns"]] = r[F["start_ns"]] + us * 1000
        r[F["pid"]], r[F["tid"]], r[F["cpu_start"]], r[F["cpu_end"]] = 99, tid, 1, 1
    return rows


def _held_session(c: Clocks):
    s, recs, _spike = _session(c, pct=None)
    s.sched = SimpleNamespace(latest_scan_ns=lambda: c.wall + S, watch_tids=lambda t, p=None: None,
                              request_scan=lambda: None)
    # an external source's detector (no queueing) with a baseline: P50 100 µs, k = 3
    s.detector = type(s.detector)(None, 3.0, 1000, queueing=False, clock=lambda: c.wall)
    s.detector.seed([100_000] * 2000)
    batches: list[np.ndarray] = []
    s.source.reader = SimpleNamespace(read=lambda: batches.pop(0) if batches else
                                      np.empty((0, len(FIELDS)), dtype=np.int64))
    return s, batches


def test_quiet_batches_are_held_then_ingested_in_order():
    c = Clocks()
    s, batches = _held_session(c)
    s.ingest(_batch(0, [100] * 10))  # thread 7 followed
    assert s.samples == 10
    batches += [_batch(10, [100] * 10), _batch(20, [110] * 10)]
    s.step()
    c.wall += 150 * MS
    s.step()
    assert s.samples == 10 and len(s._held) == 2  # held: no spike, thread followed
    c.wall += int(session_mod.HOLD_S * S)  # held long enough: ingested
    s.step()
    assert s.samples == 30 and not s._held
    assert s.lat.last(30)[:, F["seq"]].tolist() == list(range(1, 31))


def test_a_batch_with_a_spike_takes_the_held_ones_first():
    c = Clocks()
    s, batches = _held_session(c)
    s.ingest(_batch(0, [100] * 10))
    batches += [_batch(10, [100] * 10), _batch(20, [100] * 5 + [5000] + [100] * 4)]
    s.step()
    assert s._held
    s.step()
    assert s.samples == 30 and s.spikes == 1 and not s._held
    assert s.lat.last(30)[:, F["seq"]].tolist() == list(range(1, 31))


def test_a_new_thread_is_followed_at_once_and_the_stop_takes_what_is_held():
    c = Clocks()
    s, batches = _held_session(c)
    s.ingest(_batch(0, [100] * 10))
    batches += [_batch(10, [100] * 10, tid=8)]  # a thread not followed yet: no hold
    s.step()
    assert s.samples == 20 and 8 in s._followed
    batches += [_batch(20, [100] * 10, tid=8)]
    s.step()
    assert s.samples == 20 and s._held
    s._stopping = True  # (what stop() sets before its last step)
    s.step()
    assert s.samples == 30 and not s._held


def test_before_the_baseline_every_batch_is_ingested():
    c = Clocks()
    s, batches = _held_session(c)
    s.detector = type(s.detector)(None, 3.0, 10**6, queueing=False, clock=lambda: c.wall)
    s.detector.seed([100_000] * 2000)  # (short of its min_samples)
    s.ingest(_batch(0, [100] * 10))
    batches += [_batch(10, [100] * 10)]
    s.step()
    assert s.samples == 20 and not s._held
    s.detector.queueing, s.detector.min_samples = True, 1000  # a probe's: sample by sample
    batches += [_batch(20, [100] * 10)]
    s.step()
    assert s.samples == 30 and not s._held
