"""The watch loop: latency source → spike detection → attribution → JSONL log, flight
recorder, metrics, live view, summary.

One :class:`WatchSession` owns the parts and runs the loop; each part is a module of its own
(docs/design.md): config, source (the probe worker or an external ring), wiring (the host
collectors), detect, schedule, attribution/, output and flight, metrics_feed, summary, view.
Every ``loop_s`` (50 ms), on a housekeeping CPU, :meth:`WatchSession.step` drains the latency
ring, marks spikes (asking the sched collector for a task scan), attributes, inherits or drops
what is ready — each record written to the spike log, flushed, and fed to the metrics, the
live view and the flight recorder — and writes the flight records whose "after" part has been
sampled. :meth:`WatchSession.run` loops and watches the source: a probe or external process
that dies, or a latency ring that becomes unreadable (truncated under us: a clean error,
never a SIGBUS), ends the run with exit code 3, the spike log kept and closed; a spike log
that cannot be written ends it with exit code 1.

A requested stop (:meth:`WatchSession.request_stop`, which the CLI calls from its SIGTERM and
SIGINT handlers) ends the loop at its next turn: pending spikes are attributed, the spike log
is flushed and closed, the worker is stopped and :meth:`run` returns 0. The handler only sets
a flag while the loop runs (never an exception in the middle of a log write); during start-up
(TF import and warm-up can take seconds) it raises :class:`StopRequested` so a stop is not
delayed until the probe is ready.

``clock`` (monotonic ns) is what detection, scheduling and the bookkeeping read: tests pass a
virtual one and drive :meth:`ingest` and :meth:`attribute_pending` directly. :meth:`run` and
:meth:`stop` keep their deadlines and sleep in real time.
"""

from __future__ import annotations

import os
import time
from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np

from agent.client import FIELDS, RingError
from agent.errors import AgentError
from agent.watch import summary as summary_
from agent.watch.attribution import Attributor, Spike
from agent.watch.config import WatchConfig
from agent.watch.detect import SpikeDetector
from agent.watch.events.wiring import SpikeEvents
from agent.watch.flight import FlightRecorder
from agent.watch.output import SpikeLog
from agent.watch.ring import LatencyRing
from agent.watch.sampling.native.feed import Feed, NativeUnavailable
from agent.watch.sampling.native.sampler import NativeSampler
from agent.watch.sampling.python import Sampler
from agent.watch.schedule import AttributionScheduler
from agent.watch.source import LatencySource
from agent.watch.wiring import build_collectors
from collectors.host import Host

F = {name: i for i, name in enumerate(FIELDS)}
EXIT_SOURCE_DIED = 3
EXIT_OUTPUT_FAILED = 1  # the spike log could not be written
RECENT_EVIDENCE = 500  # latest samples whose faults and switches are the in-process baseline


class StopRequested(Exception):
    """A stop (SIGTERM/SIGINT) arrived while the session was still starting."""


def _iso(wall_ns: int) -> str:
    return datetime.fromtimestamp(wall_ns / 1e9, tz=UTC).isoformat(
        timespec="microseconds")


class WatchSession:
    """``metrics``: a :class:`~agent.watch.metrics_feed.MetricsFeed`; ``view``: a live view;
    ``collectors``: more collectors to sample; ``on_record``: given every spike-log record
    too (benchmarks keep them in memory); ``clock``: see the module docstring."""

    def __init__(self, cfg: WatchConfig, host: Host | None = None, *, metrics=None,
                 view=None, collectors: list | None = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 on_record: Callable[[dict], None] | None = None,
                 trace_opener: Callable | None = None) -> None:
        self.cfg = cfg
        self.host = host or Host()
        self.metrics = metrics
        self.view = view
        self.clock = clock
        self._extra_collectors = collectors
        self.warnings: list[str] = []
        self.source = LatencySource(cfg, self.host, self.warnings)
        # kernel events (--trace): a timeline and breakdown per attributed spike
        self.trace = SpikeEvents(cfg.trace, self.host, cfg.probe_cpus, cfg.trace_buffer_s,
                                 opener=trace_opener)
        self.sampler: Sampler | None = None
        self.sampler_note: str | None = None  # why the Python sampler runs (auto fallback)
        self.sched = None  # sampling.sources.sched.SchedCollector (who ran; the task scans)
        self.irq = None  # sampling.sources.irq.IrqCollector (IRQ descriptions)
        self.unavailable: dict[str, str] = {}  # collector → why it does not run
        self.attributor: Attributor | None = None
        self.detector = SpikeDetector(cfg.threshold_us, cfg.k_p50, cfg.min_samples,
                                      queueing=cfg.probe != "external", clock=clock)
        self.schedule = AttributionScheduler(max_per_s=cfg.max_attributions_per_s,
                                             loop_s=cfg.loop_s, clock=clock)
        self.spike_log = SpikeLog(cfg.spike_log, on_record)
        self._wall_off = time.time_ns() - time.monotonic_ns()
        self.flight = FlightRecorder(cfg.flight_us, cfg.flight_dir, cfg.flight_window_s,
                                     self._wall_off, self.spike_log.write, self.warnings)
        self.lat = LatencyRing(20000)
        self.hist = summary_.LatencyHistogram()
        self.samples = 0
        self.spikes = 0
        self.attributed = 0  # logged with a cause (inherited ones included)
        self.not_attributed = 0
        self.cause_counts: Counter[str] = Counter()
        self.cause_details: dict[str, Counter[str]] = {}
        self.last_spikes: deque[dict] = deque(maxlen=8)
        self.attr_delays_ms: list[float] = []
        self.source_error: str | None = None
        self.started_ns = 0
        self.ended_ns = 0
        self.stopped_by: str | None = None
        self._looping = False
        self._stopping = False
        self._recent: np.ndarray | None = None  # this step's in-process baseline

    # the parts' state, read by the summary, the live view and tests
    reader = property(lambda self: self.source.reader)
    proc = property(lambda self: self.source.proc)
    probe_info = property(lambda self: self.source.info)
    pending = property(lambda self: self.schedule.pending)
    inherited = property(lambda self: self.schedule.inherited)
    queued = property(lambda self: self.schedule.queued)
    flight_files = property(lambda self: self.flight.files)
    output_error = property(lambda self: self.spike_log.error)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask the loop to end cleanly (safe from a signal handler: sets a flag). While the
        session is still starting, raises :class:`StopRequested` instead, which :meth:`run`
        turns into the same clean stop."""
        if self.stopped_by is None:
            self.stopped_by = reason
        if not self._looping:
            raise StopRequested(reason)

    # -- set-up ------------------------------------------------------------------------------
    def open_outputs(self) -> None:
        """Open the spike log and the flight directory (:mod:`agent.watch.output`); the CLI
        calls it before anything else starts so a bad path is refused first; :meth:`start`
        calls it too (a no-op when done)."""
        self.spike_log.open()
        try:
            self.flight.open()
        except BaseException:
            self.close_outputs()
            raise

    def close_outputs(self) -> None:
        self.spike_log.close()
        self.flight.close()

    def _start_probe(self) -> None:
        self.source.start_probe()

    def _attach_external(self) -> None:
        self.source.attach_external()

    def _kill_probe(self) -> None:
        self.source.stop()

    def check_source(self) -> str | None:
        return self.source.check()

    def _native_feed(self) -> Feed | None:
        """The native reader's feed (``--sampler auto|native``), or None: ``--sampler
        python``, or auto where it cannot run (no C compiler, no shared memory; the reason
        goes to the summary). ``--sampler native`` where it cannot run is an error."""
        if self.cfg.sampler == "python":
            return None
        try:
            return Feed(int(1e9 / self.cfg.sample_hz))
        except NativeUnavailable as exc:
            if self.cfg.sampler == "native":
                raise AgentError(str(exc)) from None
            self.sampler_note = f"python (native sampler unavailable: {exc})"
            return None

    def _collectors(self, host: Host | None = None) -> list:
        """The collectors that can run (:func:`agent.watch.wiring.build_collectors`), read
        through ``host`` (default: the session's)."""
        c = build_collectors(self.cfg, host or self.host, self.host, self._extra_collectors)
        self.sched, self.irq, self.unavailable = c.sched, c.irq, c.unavailable
        return c.active

    def start(self) -> None:
        cfg = self.cfg
        self.open_outputs()
        try:
            os.sched_setaffinity(0, cfg.housekeeping_cpus)
        except OSError as exc:
            self.warnings.append(f"cannot pin watch to CPUs {cfg.housekeeping_cpus}: "
                                 f"{exc.strerror}")
        if set(cfg.housekeeping_cpus) & set(cfg.probe_cpus):
            self.warnings.append("one CPU only: the sampler shares the probe's CPU")
        # the probe CPUs are known (cpu_plan): the kernel ring records from before the probe
        # starts; --trace on refuses here (closed by stop(), which run() always calls)
        if (w := self.trace.open(self.clock())) is not None:
            self.warnings.append(w)
        if cfg.probe == "external":
            self._attach_external()
        else:
            self._start_probe()
        feed = self._native_feed()
        try:
            collectors = self._collectors()
            on_result = self.metrics.set_collector_result if self.metrics is not None else None
            kw = {"capacity_s": max(30.0, cfg.baseline_s + 2 * cfg.flight_window_s + 5),
                  "on_result": on_result}
            if feed is not None:
                self.sampler = NativeSampler(collectors, feed, cfg.sample_hz,
                                             cfg.housekeeping_cpus, **kw)
                try:
                    feed.start(cfg.housekeeping_cpus)
                except NativeUnavailable as exc:
                    feed.close()  # the collectors' files read live from here on
                    if cfg.sampler == "native":
                        raise AgentError(str(exc)) from None
                    self.sampler_note = f"python (native sampler unavailable: {exc})"
                    self.sampler = None
        except BaseException:
            # a stop or an error while starting: no helper and no shared file left behind
            if feed is not None:
                feed.close()
            raise
        if self.sampler is None:
            self.sampler = Sampler(collectors, cfg.sample_hz, cfg.housekeeping_cpus, **kw)
        rings = {e.ring.name: e.ring for e in self.sampler.entries}
        gpu = next((c for c in collectors if hasattr(c, "causes") and
                    getattr(c, "name", "") == "gpu"), None)
        self.attributor = Attributor(rings, cfg.probe_cpus, who_ran=self.sched.who_ran,
                                     others_share=self.sched.others_share,
                                     irq_desc=lambda: self.irq.descriptions,
                                     gpu_detail=gpu.causes if gpu is not None else None,
                                     baseline_s=cfg.baseline_s)
        self.sampler.start()  # a NativeSampler's helper is already running
        self.started_ns = self.clock()

    # -- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        recs = self.reader.read()
        now = self.clock()
        if len(recs):
            self.ingest(recs)
        self.attribute_pending(now)
        self.trace.maybe_refit(now, self.samples >= self.cfg.min_samples)
        self._flight_step()
        if self.metrics is not None:
            self.metrics.set_gauges(self)

    def ingest(self, recs: np.ndarray) -> None:
        """Take a batch of latency records (rows of :data:`agent.client.FIELDS`): counts,
        histogram, metrics, and the spikes among them queued for attribution."""
        lat = recs[:, F["end_ns"]] - recs[:, F["start_ns"]]
        self.samples += len(recs)
        self.hist.add(lat)
        self.lat.extend(recs)
        self.sched.watch_tids(np.unique(recs[:, F["tid"]]).tolist())
        if self.metrics is not None:
            self.metrics.observe_many(lat)
        for sp, detected in self.detector.scan(recs, lat):
            self.spikes += 1
            self.schedule.add(sp, detected)
            self.sched.request_scan()

    def attribute_pending(self, now: int | None = None) -> None:
        """Attribute, inherit or drop the pending spikes that are ready at ``now`` (default:
        the clock's now) — :mod:`agent.watch.schedule`."""
        if not self.schedule.pending:
            return
        self._recent = None
        rows_ns = self.sampler.covered_ns() - self.attributor.slack_ns
        scan_ns = self.sched.latest_scan_ns()
        if self.schedule.step(self.clock() if now is None else now, rows_ns, scan_ns, self):
            self.sampler.poke()  # spikes wait for rows (the native sampler replays sooner)

    # the schedule's Sink: attribute, log with an inherited cause, drop
    def attribute(self, sp: Spike) -> dict:
        if self._recent is None:  # one in-process baseline for the step's spikes
            self._recent = self.lat.last(RECENT_EVIDENCE)[
                :, [F["minflt"], F["majflt"], F["nivcsw"], F["nvcsw"]]]
        with self.sampler.lock:
            a = self.attributor.attribute(sp, self._recent)
        body = a.to_dict()  # the polled attribution: its verdict stands
        if self.trace.active:  # what the kernel events show ran instead (corroboration)
            body["events"], items = self.trace.for_spike(sp)
            if items and self.metrics is not None:
                self.metrics.spike_causes(items)
        rec = self.log(sp, body)
        if a.causes and a.cause != "unexplained":
            self.cause_details.setdefault(a.cause, Counter())[
                summary_.short(a.causes[0].detail)] += 1
        return rec

    def log(self, sp: Spike, body: dict) -> dict:
        """Write a spike record with a cause (``body``: cause, causes, evidence...) and do
        the bookkeeping every named spike gets: counts, delays, metrics, live view, the
        flight recorder."""
        delay_ms = (self.clock() - sp.end_ns) / 1e6
        rec = {**self._head(sp), "p50_us": round(sp.p50_ns / 1e3, 1), "pid": sp.pid,
               "tid": sp.tid, **body, "attributed_after_ms": round(delay_ms, 1)}
        self.spike_log.write(rec)
        self.attributed += 1
        self.attr_delays_ms.append(delay_ms)
        if len(self.attr_delays_ms) > 10000:
            del self.attr_delays_ms[:5000]
        self.cause_counts[rec["cause"]] += 1
        self.last_spikes.append(rec)
        if self.metrics is not None:
            self.metrics.spike(rec["cause"])
        self.flight.offer(sp, rec)
        return rec

    def drop(self, sp: Spike, why: str) -> None:
        self.not_attributed += 1
        self.spike_log.write({**self._head(sp), "cause": None, "note": f"not attributed: {why}"})

    def _head(self, sp: Spike) -> dict:
        """The fields every spike record starts with."""
        return {"time": _iso(sp.end_ns + self._wall_off), "seq": sp.seq,
                "latency_us": round(sp.latency_ns / 1e3, 1)}

    def _flight_step(self) -> None:
        if not self.flight.pending:
            return
        final = self.source_error is not None or self._stopping
        if self.flight.step(self.sampler.latest_ns(), final, self.sampler, self.lat):
            self.sampler.poke()

    def _dump_flight(self, sp: Spike, rec: dict, w: int) -> None:
        self.flight.dump(sp, rec, self.sampler, self.lat, w)

    def run(self) -> int:
        """Start, loop until ``duration_s``, a requested stop or the source dying; stop.
        Returns the exit code: 0 (duration reached or stop requested), 3 (source died) or
        1 (the spike log could not be written)."""
        cfg = self.cfg
        rc = 0
        try:
            self.start()
            end = time.monotonic() + cfg.duration_s if cfg.duration_s else float("inf")
            self._looping = True
            if self.stopped_by is not None:  # a stop that arrived between start() and here
                return 0
            while time.monotonic() < end and self.stopped_by is None:
                t = time.monotonic()
                try:
                    self.step()
                except RingError as exc:  # truncated or unreadable under us
                    self.source_error = str(exc)
                    if self.metrics is not None:
                        self.metrics.down()
                    rc = EXIT_SOURCE_DIED
                    break
                if self.output_error is not None:
                    rc = EXIT_OUTPUT_FAILED
                    break
                err = self.check_source()
                if err and self.stopped_by is None:
                    try:
                        self.step()  # drain what it wrote before dying
                    except RingError:
                        pass
                    self.source_error = err
                    if self.metrics is not None:
                        self.metrics.down()  # probe_up 0 at once, before the final drain
                    rc = EXIT_SOURCE_DIED
                    break
                if self.view is not None:
                    self.view.update(self)
                time.sleep(max(0.0, cfg.loop_s - (time.monotonic() - t)))
        except StopRequested:
            rc = 0
        except KeyboardInterrupt:  # no handler installed (library use): same clean stop
            self.stopped_by = self.stopped_by or "SIGINT"
            rc = 0
        finally:
            self._looping = True  # a second signal during the drain only sets the flag
            self.stop()
        if self.output_error is not None and rc == 0:  # (a write of the final drain)
            rc = EXIT_OUTPUT_FAILED
        return rc

    def stop(self) -> None:
        self._stopping = True
        # Attribute what is still pending (the sampler still has its rows).
        if self.sampler is not None and self.reader is not None:
            try:
                self.step()
                deadline = time.monotonic() + 1.0
                while self.schedule.pending and time.monotonic() < deadline:
                    time.sleep(0.05)
                    self.attribute_pending()
                self.schedule.drop_all(self, "the run ended first")
                self._flight_step()
            except Exception as exc:  # noqa: BLE001 - stopping must finish
                self.warnings.append(f"final drain failed: {exc}")
        self.ended_ns = self.clock()
        if self.metrics is not None:
            self.metrics.down()
        if self.sampler is not None:
            self.sampler.stop()
        self._kill_probe()
        self.trace.close()
        self.source.close()
        self.close_outputs()

    # -- reporting ---------------------------------------------------------------------------
    def rolling(self) -> dict:
        """The live view's rolling figures (:func:`agent.watch.summary.rolling`)."""
        return summary_.rolling(self)

    def summary(self) -> dict:
        """The run's summary (:func:`agent.watch.summary.build`)."""
        return summary_.build(self, native=isinstance(self.sampler, NativeSampler),
                              now_ns=self.clock())
