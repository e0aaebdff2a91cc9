"""Spike detection for ``hftagent watch``: which latency samples are slow, and which of them
only waited for the slow one before them.

A sample is a spike when its latency is over ``threshold_ns`` (``--threshold-us``), or over
``k_p50`` × the rolling P50 once ``min_samples`` normal samples have been seen (``--k``). The
rolling P50 is the median of the last :data:`RECENT_SAMPLES` samples that were not spikes,
recomputed after each batch (once :data:`MIN_RECENT_FOR_P50` are there): a storm of spikes
does not raise the bar it is measured against.

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
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from agent.client import FIELDS
from agent.watch.attribution import Spike

F = {name: i for i, name in enumerate(FIELDS)}
RECENT_SAMPLES = 2000  # normal samples the rolling P50 is the median of
MIN_RECENT_FOR_P50 = 20  # fewer: the P50 stays where it was (0 at first: no k × P50 yet)
QUEUE_WAIT_SHARE = 0.5  # the wait behind the previous spike must be this much of the excess
_EVIDENCE = ("nivcsw", "nvcsw", "minflt", "majflt", "cpu_ns", "rq_delay_ns", "cpu_start",
             "cpu_end")


class SpikeDetector:
    """Marks the spikes of each batch of latency records (rows of :data:`agent.client.FIELDS`).

    ``queueing``: infer "queued behind" (the built-in probes; False for external sources).
    ``clock``: monotonic ns, the detection time given with each spike.
    """

    def __init__(self, threshold_ns: int | None, k_p50: float, min_samples: int, *,
                 queueing: bool, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.threshold_ns = threshold_ns or None
        self.k_p50 = k_p50
        self.min_samples = min_samples
        self.queueing = queueing
        self.clock = clock
        self.p50_ns = 0  # the rolling P50 (0 until MIN_RECENT_FOR_P50 normal samples)
        self._recent: deque[int] = deque(maxlen=RECENT_SAMPLES)
        self._prev_end: dict[int, tuple[int, int, bool]] = {}  # tid → (seq, end_ns, spike)

    @property
    def baseline_samples(self) -> int:
        """Normal samples in the rolling window (k × P50 applies from ``min_samples``)."""
        return len(self._recent)

    def seed(self, lat_ns: Iterable[int]) -> None:
        """Add normal samples' latencies to the rolling window and recompute the P50, as a
        batch of normal samples would (tests and replays start from a known baseline)."""
        self._recent.extend(int(x) for x in lat_ns)
        self._update_p50()

    def scan(self, recs: np.ndarray, lat: np.ndarray) -> list[tuple[Spike, int]]:
        """The spikes among ``recs`` (``lat``: their latencies, ns), oldest first, each with
        its detection time."""
        thr = self.threshold_ns
        prev_end = self._prev_end
        track = self.queueing
        out: list[tuple[Spike, int]] = []
        for i in range(len(recs)):
            li = int(lat[i])
            p50 = self.p50_ns
            r = recs[i]
            tid, start, end = int(r[F["tid"]]), int(r[F["start_ns"]]), int(r[F["end_ns"]])
            over_abs = thr is not None and li > thr
            over_rel = p50 > 0 and li > self.k_p50 * p50 and len(self._recent) >= \
                self.min_samples
            spike = over_abs or over_rel
            if spike:
                # Open loop: a sample whose intended start fell inside the previous slow
                # sample of its thread waited for it — its cause is that sample's.
                prev = prev_end.get(tid) if track else None
                queued = prev[0] if prev is not None and prev[2] and start < prev[1] and \
                    prev[1] - start >= QUEUE_WAIT_SHARE * (li - p50) else -1
                sp = Spike(int(r[F["seq"]]), start, end, int(r[F["pid"]]), tid, p50,
                           *(int(r[F[k]]) for k in _EVIDENCE), queued_behind=queued)
                out.append((sp, self.clock()))
            else:
                self._recent.append(li)
            if track:
                prev_end[tid] = (int(r[F["seq"]]), end, spike)
        self._update_p50()
        return out

    def _update_p50(self) -> None:
        if len(self._recent) >= MIN_RECENT_FOR_P50:
            self.p50_ns = int(np.median(np.fromiter(self._recent, dtype=np.int64)))
