"""The spike log's records and the counts read from them (:class:`SpikeRecords`).

Every spike ends as one record: named (attributed, or inheriting a cause: :meth:`log`) or
"not attributed: why" (:meth:`drop`). A named one is written to the spike log (flushed),
counted (cause, delay since the spike's end on the session clock), given to the metrics and
the live view's latest spikes, and offered to the flight recorder. The summary, the live view
and the metrics read the counts (through the session's properties). :class:`ExactStories`
gives an ``unexplained`` record the events did not decide its CPU's latest exact story.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime

from agent.watch import summary as summary_
from agent.watch.attribution import Spike

DELAYS_KEPT = 10000  # attribution delays kept for the summary (the older half dropped beyond)
# an `unexplained` record the kernel events did not decide names the latest exact story on its
# CPU at most this old (the polled rules' baseline span: agent/watch/attribution/engine.py)
NEAREST_EXACT_S = 10.0


def _iso(wall_ns: int) -> str:
    return datetime.fromtimestamp(wall_ns / 1e9, tz=UTC).isoformat(
        timespec="microseconds")


class SpikeRecords:
    """``spike_log``: an :class:`~agent.watch.output.SpikeLog`; ``flight``: the
    :class:`~agent.watch.flight.FlightRecorder`; ``clock``: the session's (monotonic ns);
    ``wall_off``: wall − monotonic ns (the records' ``time``); ``metrics``: a MetricsFeed."""

    def __init__(self, spike_log, flight, clock: Callable[[], int], wall_off: int,
                 metrics=None) -> None:
        self.spike_log = spike_log
        self.flight = flight
        self.clock = clock
        self.wall_off = wall_off
        self.metrics = metrics
        self.attributed = 0  # logged with a cause (inherited ones included)
        self.not_attributed = 0
        self.cause_counts: Counter[str] = Counter()
        self.cause_details: dict[str, Counter[str]] = {}  # cause → its top details, counted
        self.last_spikes: deque[dict] = deque(maxlen=8)
        self.attr_delays_ms: list[float] = []

    def head(self, sp: Spike) -> dict:
        """The fields every spike record starts with."""
        return {"time": _iso(sp.end_ns + self.wall_off), "seq": sp.seq,
                "latency_us": round(sp.latency_ns / 1e3, 1)}

    def log(self, sp: Spike, body: dict) -> dict:
        """Write a spike record with a cause (``body``: cause, causes, evidence...) and do
        the bookkeeping every named spike gets: counts, delays, metrics, live view, the
        flight recorder."""
        delay_ms = (self.clock() - sp.end_ns) / 1e6
        rec = {**self.head(sp), "p50_us": round(sp.p50_ns / 1e3, 1), "pid": sp.pid,
               "tid": sp.tid, **body, "attributed_after_ms": round(delay_ms, 1)}
        self.spike_log.write(rec)
        self.attributed += 1
        self.attr_delays_ms.append(delay_ms)
        if len(self.attr_delays_ms) > DELAYS_KEPT:
            del self.attr_delays_ms[:DELAYS_KEPT // 2]
        self.cause_counts[rec["cause"]] += 1
        self.last_spikes.append(rec)
        if self.metrics is not None:
            self.metrics.spike(rec["cause"])
        self.flight.offer(sp, rec)
        return rec

    def detail(self, cause: str, detail: str) -> None:
        """Count an attributed spike's top detail under its cause (the summary's examples)."""
        self.cause_details.setdefault(cause, Counter())[summary_.short(detail)] += 1

    def drop(self, sp: Spike, why: str) -> None:
        """Write ``sp`` "not attributed: ``why``"."""
        self.not_attributed += 1
        self.spike_log.write({**self.head(sp), "cause": None, "note": f"not attributed: {why}"})


class ExactStories:
    """The latest exact story per CPU (a record whose cause its kernel-event timeline
    decided: ``decided_by`` events…), and the context a record the events did not decide
    takes from it where its cause is ``unexplained`` or the story's own: ``nearest_exact``
    {spike, before_ms, cause, detail}, the story of the latest such spike on the same CPU
    within :data:`NEAREST_EXACT_S` before it. Context, never the record's cause: past watch's
    CPU budget a spike gets the polled rules, which say that its thread waited on the run
    queue but not for whom (the task scans come seconds apart there), while the exact
    stories, one every ~2 s, name the task that ran (issue #38, docs/benchmarks.md)."""

    def __init__(self, max_age_s: float = NEAREST_EXACT_S) -> None:
        self.max_age_ns = int(max_age_s * 1e9)
        self._by_cpu: dict[int, tuple[int, int, str, str | None]] = {}
        self.annotated = 0  # records given a nearest_exact

    @staticmethod
    def _exact(body: dict) -> bool:
        return str(body.get("decided_by") or "").startswith("events")

    def remember(self, sp: Spike, body: dict) -> None:
        """Keep ``body``'s story as its CPU's latest when the events decided it (an
        ``unexplained`` one too: then the latest exact story adds nothing)."""
        cause = body.get("cause")
        if not self._exact(body) or cause is None:
            return
        causes = body.get("causes") or []
        detail = causes[0].get("detail") if causes else None
        self._by_cpu[sp.cpu_end] = (sp.seq, sp.end_ns, cause, detail)

    def annotate(self, sp: Spike, body: dict) -> None:
        """Give a record the events did not decide its CPU's latest exact story (when there
        is one at most ``max_age_s`` before it), where the record's cause is ``unexplained``
        (counted: :attr:`annotated`) or the story's."""
        own = body.get("cause")
        if own is None or self._exact(body):
            return
        hit = self._by_cpu.get(sp.cpu_end)
        if hit is None:
            return
        seq, end_ns, cause, detail = hit
        age = sp.end_ns - end_ns
        if cause != "unexplained" and own in ("unexplained", cause) and \
                0 <= age <= self.max_age_ns and seq != sp.seq:
            body["nearest_exact"] = {"spike": seq, "before_ms": round(age / 1e6, 1),
                                     "cause": cause, "detail": detail}
            self.annotated += own == "unexplained"
