"""Spike detection for ``hftagent watch``: which latency samples are slow, and which of them
only waited for the slow one before them.

A sample is a spike when its latency is over ``threshold_ns`` (``--threshold-us``), or over
``k_p50`` × the rolling P50 once ``min_samples`` normal samples have been seen (``--k``). The
rolling P50 is the median of the last :data:`RECENT_SAMPLES` samples that were not spikes,
recomputed after a batch once :data:`MIN_RECENT_FOR_P50` are there and the normal samples
since the last time are at least 1/:data:`P50_EVERY` of the window (every batch while it
fills; every 250 samples once full, where so few more cannot move a median of 2,000 far: at
500 calls a second, every half second rather than every loop step, whose cold partition was
a third of the detection's CPU): a storm of spikes does not raise the bar it is measured
against.

Queueing (built-in probes only, open loop): a spike whose intended start fell inside the
previous slow sample of its thread, by at least :data:`QUEUE_WAIT_SHARE` of its own excess
over P50, waited for it; it is marked ``queued_behind`` that sample, and the scheduler
(:mod:`agent.watch.schedule`) gives it that sample's cause. External records may nest or
overlap (concurrent requests, asyncio) without one waiting for another: no queueing is
inferred there, and no per-thread map grows for a thread-per-request server.

The clock (monotonic ns) that stamps each spike's detection time is injected, so the loop's
logic runs on virtual time in tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from agent.client import FIELDS
from agent.stats import median
from agent.watch.attribution import Spike

F = {name: i for i, name in enumerate(FIELDS)}
RECENT_SAMPLES = 2000  # normal samples the rolling P50 is the median of
MIN_RECENT_FOR_P50 = 20  # fewer: the P50 stays where it was (0 at first: no k × P50 yet)
P50_EVERY = 8  # the P50 is recomputed once 1/8 of the window is new (module docstring)
QUEUE_WAIT_SHARE = 0.5  # the wait behind the previous spike must be this much of the excess
_EVIDENCE = ("nivcsw", "nvcsw", "minflt", "majflt", "cpu_ns", "rq_delay_ns", "cpu_start",
             "cpu_end")


class _Recent:
    """The last :data:`RECENT_SAMPLES` normal samples' latencies (ns): a numpy ring, so that
    a batch joins it in one copy and the median reads it without a conversion."""

    def __init__(self, size: int = RECENT_SAMPLES) -> None:
        self.buf = np.zeros(size, dtype=np.int64)
        self.n = 0    # held (≤ size)
        self.at = 0   # where the next one goes

    def __len__(self) -> int:
        return self.n

    def extend(self, lat_ns: np.ndarray) -> None:
        size = len(self.buf)
        lat_ns = lat_ns[-size:]
        k = len(lat_ns)
        if not k:
            return
        first = min(k, size - self.at)
        self.buf[self.at:self.at + first] = lat_ns[:first]
        self.buf[:k - first] = lat_ns[first:]
        self.at = (self.at + k) % size
        self.n = min(size, self.n + k)

    def median(self) -> float:
        """np.median's value (:func:`agent.stats.median`: one np.partition; np.median goes
        through several Python layers, ~0.1 ms a call in a loop step that runs cold, several
        a second)."""
        return median(self.buf[:self.n] if self.n < len(self.buf) else self.buf)


class SpikeDetector:
    """Marks the spikes of each batch of latency records (rows of :data:`agent.client.FIELDS`).

    ``queueing``: infer "queued behind" (the built-in probes; False for external sources).
    ``clock``: monotonic ns, the detection time given with each spike.

    Once the rolling window holds ``min_samples`` (so that k × P50 applies to every sample
    of a batch) and without queueing, a batch is marked in a few array operations and only
    its spikes are looked at one by one (:meth:`_scan_batch`: the always-on cost of a
    watch that sees hundreds of calls a second); before that, and with queueing (a
    sample's verdict depends on its thread's previous one), sample by sample.
    """

    def __init__(self, threshold_ns: int | None, k_p50: float, min_samples: int, *,
                 queueing: bool, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.threshold_ns = threshold_ns or None
        self.k_p50 = k_p50
        self.min_samples = min_samples
        self.queueing = queueing
        self.clock = clock
        self.p50_ns = 0  # the rolling P50 (0 until MIN_RECENT_FOR_P50 normal samples)
        self._recent = _Recent()
        self._new: list[np.ndarray] = []  # normal samples not in the window yet
        self._n_new = 0
        self._prev_end: dict[int, tuple[int, int, bool]] = {}  # tid → (seq, end_ns, spike)

    @property
    def baseline_samples(self) -> int:
        """Normal samples in the rolling window (k × P50 applies from ``min_samples``)."""
        return min(RECENT_SAMPLES, len(self._recent) + self._n_new)

    def seed(self, lat_ns: Iterable[int]) -> None:
        """Add normal samples' latencies to the rolling window and recompute the P50, as a
        batch of normal samples would (tests and replays start from a known baseline)."""
        self._keep(np.fromiter((int(x) for x in lat_ns), dtype=np.int64))
        self._update_p50(now=True)

    def scan(self, recs: np.ndarray, lat: np.ndarray) -> list[tuple[Spike, int]]:
        """The spikes among ``recs`` (``lat``: their latencies, ns), oldest first, each with
        its detection time."""
        if not self.queueing and self.baseline_samples >= self.min_samples:
            out = self._scan_batch(recs, lat)
        else:
            out = self._scan_each(recs, lat)
        self._update_p50()
        return out

    def _scan_batch(self, recs: np.ndarray, lat: np.ndarray) -> list[tuple[Spike, int]]:
        """:meth:`_scan_each`'s answer where the relative rule applies to the whole batch
        and nothing is queued: a sample is a spike when it is over the lower of the two
        bars in force (one comparison over the batch; most batches have no spike)."""
        lat = np.asarray(lat, dtype=np.int64)
        bar = self._bar()
        if bar is None or not len(lat) or not lat.max() > bar:
            self._keep(lat)
            return []
        spike = lat > bar
        self._keep(lat[~spike])
        return [(self._spike(recs[i], int(lat[i]), -1), self.clock())
                for i in np.flatnonzero(spike).tolist()]

    def _bar(self) -> float | None:
        """The lower of the two bars in force (None: neither yet)."""
        bars = [b for b in (self.threshold_ns, self.k_p50 * self.p50_ns if self.p50_ns > 0
                            else None) if b is not None]
        return min(bars) if bars else None

    def quiet(self, lat: np.ndarray) -> bool:
        """Whether :meth:`scan` would find no spike in a batch of these latencies, as
        :meth:`_scan_batch` decides it; False where that rule does not apply (queueing, or
        a baseline short of ``min_samples``). The session holds such a batch for a while
        (agent/watch/session.py ``HOLD_S``): its scan, whenever it comes, marks nothing."""
        if self.queueing or self.baseline_samples < self.min_samples:
            return False
        bar = self._bar()
        return bar is None or not len(lat) or not lat.max() > bar

    def _keep(self, lat_ns: np.ndarray) -> None:
        """Normal samples for the window (joined at the next P50)."""
        if len(lat_ns):
            self._new.append(lat_ns)
            self._n_new += len(lat_ns)

    def _spike(self, r: np.ndarray, li: int, queued: int) -> Spike:
        return Spike(int(r[F["seq"]]), int(r[F["start_ns"]]), int(r[F["end_ns"]]),
                     int(r[F["pid"]]), int(r[F["tid"]]), self.p50_ns,
                     *(int(r[F[k]]) for k in _EVIDENCE), queued_behind=queued)

    def _scan_each(self, recs: np.ndarray, lat: np.ndarray) -> list[tuple[Spike, int]]:
        thr = self.threshold_ns
        prev_end = self._prev_end
        track = self.queueing
        out: list[tuple[Spike, int]] = []
        normal: list[int] = []
        for i in range(len(recs)):
            li = int(lat[i])
            p50 = self.p50_ns
            r = recs[i]
            tid, start = int(r[F["tid"]]), int(r[F["start_ns"]])
            over_abs = thr is not None and li > thr
            over_rel = p50 > 0 and li > self.k_p50 * p50 and \
                min(RECENT_SAMPLES, self.baseline_samples + len(normal)) >= self.min_samples
            spike = over_abs or over_rel
            if spike:
                # Open loop: a sample whose intended start fell inside the previous slow
                # sample of its thread waited for it — its cause is that sample's.
                prev = prev_end.get(tid) if track else None
                queued = prev[0] if prev is not None and prev[2] and start < prev[1] and \
                    prev[1] - start >= QUEUE_WAIT_SHARE * (li - p50) else -1
                out.append((self._spike(r, li, queued), self.clock()))
            else:
                normal.append(li)
            if track:
                prev_end[tid] = (int(r[F["seq"]]), int(r[F["end_ns"]]), spike)
        self._keep(np.array(normal, dtype=np.int64))
        return out

    def _update_p50(self, now: bool = False) -> None:
        """Join the new normal samples to the window and take its median, when they are
        1/:data:`P50_EVERY` of it (``now``: whatever their number)."""
        if not self._n_new or not (now or self._n_new * P50_EVERY >= len(self._recent)):
            return
        new = np.concatenate(self._new) if len(self._new) > 1 else self._new[0]
        self._new, self._n_new = [], 0
        self._recent.extend(new)
        if len(self._recent) >= MIN_RECENT_FOR_P50:
            self.p50_ns = int(self._recent.median())
