"""The watch loop: latency source → spike detection → attribution → JSONL log, flight
recorder, metrics, live view, summary.

One :class:`WatchSession` owns the parts and runs the loop; each part is a module of its own
(docs/design.md): config, latency/ (the latency sources: the probe worker, an external
client's ring, an attached process), wiring (the host collectors), detect, schedule,
attribution/, output and flight, metrics_feed, summary, view.
Every ``loop_s`` (50 ms) while a spike waits, else every :data:`QUIET_LOOPS` × that (each step
runs cold after its sleep: its fixed cost is most of watch's own CPU, and a spike read up to
150 ms late still has its record within the 200 ms target — by then the sampler's round after
it has come, so only its replay is waited for: max 153 ms measured under SCHED_FIFO bursts
beside an attached 500 calls/s service on a 2-vCPU Linux 6.18 guest, 143 ms at 100 ms;
just after each of the native helper's rounds, with none asked of it and its rounds twice
as far apart, where watch's always-on parts alone spend its CPU budget: records ~0.4 s late
at most in such a storm),
on a housekeeping CPU, :meth:`WatchSession.step` drains the latency
ring, marks spikes (asking the sched collector for a task scan), attributes, inherits or drops
what is ready — each record written to the spike log, flushed, and fed to the metrics, the
live view and the flight recorder — and writes the flight records whose "after" part has been
sampled. :meth:`WatchSession.run` loops and watches the source: a probe or watched process
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

import gc
import time
from collections.abc import Callable

import numpy as np

from agent.client import FIELDS, RingError
from agent.watch import summary as summary_
from agent.watch.attribution import Attributor, Spike
from agent.watch.attribution.events import SpikeEvents, apply_verdict
from agent.watch.attribution.spike import RECENT_FIELDS
from agent.watch.budget import CpuBudget, OwnCpu, thread_clock
from agent.watch.config import WatchConfig
from agent.watch.detect import SpikeDetector
from agent.watch.flight import FlightRecorder
from agent.watch.output import SpikeLog
from agent.watch.placement import OwnCpus, place
from agent.watch.priority import own_threads, renice
from agent.watch.records import ExactStories, SpikeRecords
from agent.watch.ring import LatencyRing
from agent.watch.sampling import open_sampler
from agent.watch.sampling.native.sampler import NativeSampler
from agent.watch.sampling.python import Sampler
from agent.watch.schedule import AttributionScheduler
from agent.watch.wiring import attributor_for, build_collectors
from collectors.host import Host

F = {name: i for i, name in enumerate(FIELDS)}
_START, _END, _TID = F["start_ns"], F["end_ns"], F["tid"]
EXIT_SOURCE_DIED = 3
EXIT_OUTPUT_FAILED = 1  # the spike log could not be written
RECENT_EVIDENCE = 500  # latest samples whose faults and switches are the in-process baseline
# ... taken again for a step's spikes once this old (a full one): the spikes of a storm share
# it and its medians, as they share the rings' baselines (a 1 s quantum, engine.py), instead of
# a copy of 500 rows and a median per column every step (~0.1 ms of CPU a step, issue #38)
RECENT_EVERY_S = 1.0
QUIET_LOOPS = 3        # no spike waiting: a step every 3 loop_s (150 ms; module docstring)
QUIET_AFTER_S = 0.0    # ... and none detected for this long
ROUND_AFTER_S = 0.005  # past the CPU budget, a step this long after the helper's next round
SPENT_PAUSE_MAX_S = 0.45  # ... and never further apart (the latency source's reads)
# A batch of calls without a spike (SpikeDetector.quiet), of threads already followed, is
# held and ingested with the next batch that has one, a spike waiting, the stop, or this long
# after the first held one: its counts, histogram, latency ring and metrics are at most this
# late, its scan marks nothing whenever it comes (no P50 moves in between), and a quiet step
# costs a subtraction and a max instead of an ingest (watch's own CPU, issue #38).
HOLD_S = 1.0
STARTUP_WAIT_S = 2.0   # background start-up work waited for before the costs' zero


def _polled_only(body: dict, why: str) -> None:
    """A record without its kernel-event window: the polled rules' cause, and why."""
    body["events"] = {"complete": False, "reason": why}
    body["decided_by"] = "polled"


class StopRequested(Exception):
    """A stop (SIGTERM/SIGINT) arrived while the session was still starting."""


class WatchSession:
    """``metrics``: a :class:`~agent.watch.metrics_feed.MetricsFeed`; ``view``: a live view;
    ``collectors``: more collectors to sample; ``on_record``: given every spike-log record
    too (benchmarks keep them in memory); ``clock``: see the module docstring;
    ``trace_opener``: the event source's opener (:class:`SpikeEvents`); ``on_phase``: told
    each start-up phase (:meth:`phase`); ``sampler_factory``:
    :func:`agent.watch.sampling.open_sampler`'s signature; ``irq_coster``: the interrupt-cost
    measurement (agent.trace.irqcost.measure; tests pass fakes); ``own_cpus``: how watch
    pins itself (:class:`agent.watch.placement.OwnCpus`; tests pass fakes); ``own_cpu``:
    watch's own CPU clocks (:class:`agent.watch.budget.OwnCpu`; tests pass virtual ones).
    ``cfg.cpu_budget``: the share of one CPU the :class:`~agent.watch.budget.CpuBudget`
    allows (None: every spike gets exact attribution; the cost is still measured)."""

    def __init__(self, cfg: WatchConfig, host: Host | None = None, *, metrics=None,
                 view=None, collectors: list | None = None,
                 clock: Callable[[], int] = time.monotonic_ns,
                 on_record: Callable[[dict], None] | None = None,
                 trace_opener: Callable | None = None,
                 sampler_factory: Callable = open_sampler,
                 irq_coster: Callable | None = None,
                 on_phase: Callable[[str], None] | None = None,
                 own_cpus: OwnCpus | None = None,
                 own_cpu: OwnCpu | None = None) -> None:
        self.cfg = cfg
        self.own_cpus = own_cpus or OwnCpus()  # how watch reads and moves itself
        self.pinned_to = list(cfg.housekeeping_cpus)  # where watch runs (place_self)
        self.on_phase = on_phase
        self.host = host or Host()
        self.metrics = metrics
        self.view = view
        self.clock = clock
        self._extra_collectors = collectors
        self._open_sampler = sampler_factory
        self.warnings: list[str] = []
        self.warnings.extend(cfg.notes)
        # the latency source chosen by the options: this run's side of it
        self.source = cfg.source.open(self.host, cfg.probe_cpus, self.warnings)
        # kernel events (--trace): a timeline and breakdown per attributed spike
        self.trace = SpikeEvents(cfg.trace, self.host, cfg.probe_cpus, cfg.trace_buffer_s,
                                 opener=trace_opener, irq_cost=cfg.irq_cost,
                                 housekeeping=cfg.housekeeping_cpus, irq_coster=irq_coster)
        self.sampler: Sampler | None = None
        self.sampler_note: str | None = None  # why the Python sampler runs (auto fallback)
        self.sched = None  # sampling.sources.sched.SchedCollector (who ran; the task scans)
        self.irq = None  # sampling.sources.irq.IrqCollector (IRQ descriptions)
        self.unavailable: dict[str, str] = {}  # collector → why it does not run
        # what the kernel events made slower (wiring.reduce_for_events), for the summary
        self.reduced_by_events: dict[str, dict] = {}
        self.attributor: Attributor | None = None
        self.pmu = None  # agent.watch.attribution.pmu (PerCall, Unsupported) for --attach
        self.detector = SpikeDetector(cfg.threshold_ns, cfg.k_p50, cfg.min_samples,
                                      queueing=cfg.source.queueing,
                                      clock=clock)
        self.schedule = AttributionScheduler(max_per_s=cfg.max_attributions_per_s,
                                             loop_s=cfg.loop_s, clock=clock)
        self.spike_log = SpikeLog(cfg.spike_log, on_record)
        self._wall_off = time.time_ns() - time.monotonic_ns()
        self.flight = FlightRecorder(cfg.flight_ns, cfg.flight_dir, cfg.flight_window_s,
                                     self._wall_off, self.spike_log.write, self.warnings)
        self.lat = LatencyRing(20000)
        self.hist = summary_.LatencyHistogram()
        self.records = SpikeRecords(self.spike_log, self.flight, clock, self._wall_off, metrics)
        self.stories = ExactStories()  # the latest exact story per CPU (records.py)
        self.samples = 0
        self._held: list[np.ndarray] = []  # batches without a spike, not ingested yet
        self._held_since = 0
        self._followed: set[int] = set()  # threads an ingest gave the sched collector
        self._gone_n = 0  # the sched collector's dropped threads, as many as ingest saw
        self.spikes = 0
        self.source_error: str | None = None
        self.started_ns = 0
        self.ended_ns = 0
        self.stopped_by: str | None = None
        self._looping = False
        self._stopping = False
        self._recent: np.ndarray | None = None  # the spikes' in-process baseline
        self._recent_at = 0  # (clock ns) when it was taken
        self._busy_until = 0.0  # (monotonic s) steps every loop_s until then
        self._step_t0 = 0.0  # (monotonic s) when the latest step began
        # watch's own CPU by part, and the budget that decides exact attribution (budget.py)
        self.own = own_cpu or OwnCpu()
        self.budget = CpuBudget(cfg.cpu_budget, self.own, clock) \
            if cfg.cpu_budget is not None else None
        if self.budget is not None:  # it sheds a storm's polled rules past it (schedule.py)
            self.schedule.shed = self.budget.shed_note
            self.schedule.same_rows = self._same_rows

    # the parts' state, read by the summary, the live view and tests
    reader = property(lambda self: self.source.reader)
    proc = property(lambda self: self.source.proc)
    pid = property(lambda self: self.source.pid)
    probe_info = property(lambda self: self.source.info)
    pending = property(lambda self: self.schedule.pending)
    inherited = property(lambda self: self.schedule.inherited)
    queued = property(lambda self: self.schedule.queued)
    without_events = property(lambda self: self.schedule.light)
    flight_files = property(lambda self: self.flight.files)
    output_error = property(lambda self: self.spike_log.error)
    attributed = property(lambda self: self.records.attributed)
    not_attributed = property(lambda self: self.records.not_attributed)
    cause_counts = property(lambda self: self.records.cause_counts)
    cause_details = property(lambda self: self.records.cause_details)
    last_spikes = property(lambda self: self.records.last_spikes)
    attr_delays_ms = property(lambda self: self.records.attr_delays_ms)

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

    def check_source(self) -> str | None:
        return self.source.check()

    def open_collectors(self, host: Host | None = None) -> list:
        """The collectors that can run (:func:`agent.watch.wiring.build_collectors`), read
        through ``host`` (default: the session's); sets :attr:`sched`, :attr:`irq`,
        :attr:`unavailable`. With the event source open (:meth:`start` opens it before the
        sampler asks for the collectors), what the events cover is polled less:
        :attr:`reduced_by_events`."""
        c = build_collectors(self.cfg, host or self.host, self.host, self._extra_collectors,
                             pid=self.source.pid, events=self.trace.active)
        self.sched, self.irq, self.unavailable = c.sched, c.irq, c.unavailable
        self.reduced_by_events = c.reduced_by_events
        return c.active

    def start(self) -> None:
        cfg = self.cfg
        self.open_outputs()
        # what killed hftagents left in tracefs (uprobe groups, instances), --trace off too:
        # a note each (issue #34 Build 4; as root where tracefs is mounted, else nothing)
        from agent.trace.guardian import clean_stale
        self.warnings += clean_stale(self.host)
        self.place_self()
        # the probe CPUs are known (config.plan): the kernel ring records from before the
        # source starts; --trace on refuses here (closed by stop(), which run() always calls).
        # One interrupt's cost on the probe CPUs, while nothing runs there yet and before the
        # event source traces them (a given --irq-cost for any source)
        self.trace.measure_irq_cost(measure=cfg.source.idle_until_start)
        if (w := self.trace.open(self.clock())) is not None:
            self.warnings.append(w)
        self.source.start(self.trace, self.phase)
        from agent.watch.attribution import pmu  # --pmu: each attached call's CPU counters
        self.pmu = pmu.arm(self.source, cfg.pmu, self.warnings)
        self.trace.follow_process(self.source.pid)  # (issue #35: before its first call)
        # (a stop or an error while it starts leaves no helper and no shared file behind)
        self.sampler, self.sampler_note = self._open_sampler(
            cfg.sampler, self.open_collectors, cfg.sample_hz, cfg.housekeeping_cpus,
            capacity_s=max(30.0, cfg.baseline_s + 2 * cfg.flight_window_s + 5),
            on_result=self.metrics.set_collector_result if self.metrics is not None else None)
        self.attributor = attributor_for(cfg, self.sampler, self.sched, self.irq)
        self.sampler.start()  # a NativeSampler's helper is already running
        self.renice_own()
        self.started_ns = self.clock()
        # the kernel symbol table loads in a thread from the events' opening (~50 ms of
        # CPU): start-up's, not the run's — waited for (it is done already where the
        # attach's symbol reads took longer), so the running cost starts after it
        self.trace.startup_done(STARTUP_WAIT_S)
        self.begin_costs()
        self.phase("")  # start-up is over: nothing more to say (a pending line is dropped)

    def place_self(self) -> None:
        """Pin watch to the housekeeping CPUs, never the source's: out of an inherited
        affinity or cpuset where it may, else refused with one line
        (:func:`agent.watch.placement.place`)."""
        self.warnings += place(self.host, self.cfg.probe_cpus, self.cfg.housekeeping_cpus,
                               self.own_cpus)
        self.pinned_to = sorted(self.own_cpus.get())

    def begin_costs(self) -> None:
        """Zero watch's own-cost clocks now that start-up is over, the sampler's included
        (its thread's CPU clock; the native helper's own count), and fill the budget."""
        self.own.watch_sampler(thread_clock(getattr(self.sampler, "thread", None)),
                               getattr(self.sampler, "helper_cpu_ns", None))
        # start-up's objects (formats, symbols, collectors, plans) live as long as the run:
        # the garbage collector's older passes skip them from here on (gc.freeze) instead
        # of walking them again and again (~1 ms a pass); thawed at stop()
        gc.freeze()
        self.own.begin()
        if self.budget is not None:
            self.budget.begin()

    def phase(self, what: str) -> None:
        """A start-up phase (probe build, warm-up, symbols read for --attach): told to
        ``on_phase`` (the CLI prints it on stderr, one line each, while it waits); "" when
        start-up is over."""
        if self.on_phase is not None:
            self.on_phase(what)

    def renice_own(self) -> None:
        """``--nice``: watch's threads and its sampler's helper, once they run — never the
        probe, started before (agent/watch/priority.py); a refusal is one warning."""
        if not self.cfg.nice:
            return
        helper = getattr(getattr(self.sampler, "feed", None), "proc", None)
        w = renice(self.cfg.nice, own_threads(self.host),
                   [helper.pid] if helper is not None else [])
        if w:
            self.warnings.append(w)

    # -- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        self._step_t0 = time.monotonic()
        with self.own.part("source"):
            recs = self.reader.read()
        now = self.clock()
        with self.own.part("detection"):
            if len(recs):
                self._take(recs, now)
            if self._held and (self._stopping or self.schedule.pending or
                               now - self._held_since >= HOLD_S * 1e9):
                self._flush_held()
        self.attribute_pending(now)
        if self.budget is not None and hasattr(self.sampler, "slow"):
            self.sampler.slow(self._spent())  # past the budget: the helper's rounds slowed
        self.trace.maybe_refit(now, self.samples >= self.cfg.min_samples)
        with self.own.part("flight"):
            self._flight_step()
        if self.metrics is not None:
            self.metrics.set_gauges(self)

    def _take(self, recs: np.ndarray, now: int) -> None:
        """Ingest ``recs`` now, or hold them (:data:`HOLD_S`) when they have no spike and
        every thread of theirs is followed already."""
        lat = recs[:, _END] - recs[:, _START]
        if not self._stopping and self.detector.quiet(lat) and \
                self._followed.issuperset(recs[:, _TID].tolist()):
            if not self._held:
                self._held_since = now
            self._held.append(recs)
            return
        self._flush_held()
        self.ingest(recs)

    def _flush_held(self) -> None:
        if self._held:
            held, self._held = self._held, []
            self.ingest(held[0] if len(held) == 1 else np.concatenate(held))

    def ingest(self, recs: np.ndarray) -> None:
        """Take a batch of latency records (rows of :data:`agent.client.FIELDS`): counts,
        histogram, metrics, and the spikes among them queued for attribution."""
        lat = recs[:, F["end_ns"]] - recs[:, F["start_ns"]]
        self.samples += len(recs)
        self.hist.add(lat)
        self.lat.extend(recs)
        tids = sorted(set(recs[:, F["tid"]].tolist()))  # (np.unique: ~10 array calls, cold)
        pids = None
        gone = getattr(self.sched, "dropped", None)
        if gone is not None and len(gone) != self._gone_n:
            # threads gone since: a tid the kernel gives again (a restarted service's new
            # thread, after pid_max wraps) is a new thread, with its own process
            self._followed.difference_update(gone)
            self._gone_n = len(gone)
        if not self._followed.issuperset(tids):  # a new thread: its process, for its schedstat
            pids = dict(zip(recs[:, F["tid"]].tolist(), recs[:, F["pid"]].tolist()))
        self._followed.update(tids)
        self.sched.watch_tids(tids, pids)
        self.trace.follow_calls(tids, recs)  # their faults and runtime from now (issue #35)
        if self.metrics is not None:
            self.metrics.observe_many(lat)
        for sp, detected in self.detector.scan(recs, lat):
            self.spikes += 1
            self.schedule.add(sp, detected)
            if self._scan_for_spike():
                self.sched.request_scan()

    def _scan_for_spike(self) -> bool:
        """Whether a spike asks the sched collector for a task scan (who ran, for the polled
        rules): not where the kernel events will name who ran — they are on and the CPU
        budget has tokens for its exact attribution — nor, in a storm the budget skips,
        where its floor already pays for an exact attribution as often as the scans could
        come (one every 2 s: ``min_scan_gap_s``): with the records not waiting for a scan,
        a scan names who ran for the skipped spike that asked for it only, about one every
        2 s, as the floor's exact story does. A scan reads every task's stat: 1.3 ms of CPU
        with ~150 tasks and 2 CPUs, 3.3 ms with ~190 and 16 (issue #38); the periodic scans
        (sched.py ``scan_period_s``, every 10 s with the events) go on."""
        if not self.trace.active:
            return True
        if self.budget is None or self.budget.has_tokens():
            return False
        gap = self.budget.floor_gap_s()
        return gap is None or gap > getattr(self.sched, "min_scan_gap_s", 0.0)

    def attribute_pending(self, now: int | None = None) -> None:
        """Attribute, inherit or drop the pending spikes that are ready at ``now`` (default:
        the clock's now) — :mod:`agent.watch.schedule`."""
        if not self.schedule.pending:
            return
        if not self._schedule_step(self.clock() if now is None else now):
            return
        # Spikes wait for rows: the native sampler replays now; what that replay brings is
        # attributed in this step, not the next (half a loop period at most is spent waiting).
        # Past the budget (its always-on parts alone spend it: a storm), no round is asked of
        # the helper and a replay comes only for rounds it recorded since the last one, and
        # the loop's steps come just after the helper's own rounds (_spent_pause_s): a
        # spike's record waits for the round after it (≤ 0.4 s with the events, its rounds
        # slowed: step()), ~0.4 s at most instead of ~0.15 s, and more of a storm's spikes
        # share rows (schedule.py sheds their polled rules). Beside a stopped service on a
        # 16-CPU host, no asked round alone: 1.33 % of one CPU at 469 spikes a minute against
        # 1.47 % at 462, 1.36 % at 825 against 1.47 % at 908 (issue #38, docs/benchmarks.md).
        seen = getattr(self.sampler, "replays", None)  # (the Python sampler's rows are current)
        if seen is not None and self._spent():
            if not self.sampler.unreplayed():
                return  # past the budget: the helper's own next round, not one asked for
        elif seen is not None and self.schedule.pending:  # the native helper: a round now
            self.sampler.ask_round(max(sp.end_ns for sp, _ in self.schedule.pending)
                                   + self.attributor.slack_ns)
        self.sampler.poke()
        if seen is not None and self.sampler.wait_replay(seen, self.cfg.loop_s / 2) and \
                self.schedule.pending:
            self._schedule_step(self.clock())

    def _schedule_step(self, now: int) -> bool:
        """One :meth:`AttributionScheduler.step` on the rows and scan there are now; True
        when spikes still wait for them."""
        if self._recent is not None and (len(self._recent) < RECENT_EVIDENCE or
                                         now - self._recent_at >= RECENT_EVERY_S * 1e9):
            self._recent = None
        rows_ns = self.sampler.covered_ns() - self.attributor.slack_ns
        # with events naming the task that ran, the spike's scans are rarer and not waited for
        scan_ns = now if "sched_scan" in self.reduced_by_events else \
            self.sched.latest_scan_ns()
        return self.schedule.step(now, rows_ns, scan_ns, self)

    def _same_rows(self, a: Spike, b: Spike) -> bool:
        """Whether the polled rules of spikes ``a`` and ``b`` see the same sampler rows."""
        if self.attributor is None:
            return False
        with self.sampler.lock:
            return self.attributor.same_rows(a, b)

    # the schedule's Sink: attribute, log with an inherited cause, drop
    def attribute(self, sp: Spike, *, events: bool = True) -> dict:
        if self._recent is None:  # one in-process baseline for the spikes of a second
            self._recent = self.lat.last(RECENT_EVIDENCE)[:, [F[k] for k in RECENT_FIELDS]]
            self._recent_at = self.clock()
        with self.own.part("attribution"):
            with self.sampler.lock:
                a = self.attributor.attribute(sp, self._recent)
            body = a.to_dict()  # the polled attribution
            if self.pmu is not None:  # the call's CPU counters, for the on-CPU rules
                from agent.watch.attribution.pmu import annotate
                annotate(self.pmu, sp, body)
        if self.trace.active and not events:  # past the step budget (schedule.py)
            _polled_only(body, "not read: attribution step budget (spike storm): the polled "
                         "rules only")
        elif self.trace.active and self.budget is not None and not self.budget.allow():
            _polled_only(body, self.budget.note)  # watch's CPU budget is spent
            body["note"] = self.budget.note
        elif self.trace.active:
            self._exact(sp, body)
        if getattr(self.source, "gpu", None) is not None:  # --attach --gpu-probes
            from agent.watch.attribution import gpu_split
            split = gpu_split.annotate(self.source.gpu, sp, body)  # the call's GPU split
            if split is not None and self.metrics is not None:
                self.metrics.gpu_split(split["parts"])
        with self.own.part("attribution"):
            if self.trace.active:  # an exact story kept, or the latest one as context
                self.stories.remember(sp, body)
                self.stories.annotate(sp, body)
            rec = self.records.log(sp, body)
            if body["causes"] and body["cause"] != "unexplained":
                self.records.detail(body["cause"], body["causes"][0]["detail"])
        return rec

    def _exact(self, sp: Spike, body: dict) -> None:
        """What the kernel events show ran instead, to the µs: the window read and the
        timeline walk, their CPU time charged to the budget."""
        t = self.own.thread_ns()
        with self.own.part("events"):
            body["events"], items = self.trace.for_spike(sp)
            # where they see the cause directly (a task, IRQ or softirq on the probe CPU for
            # most of the excess) the events decide it; the polled verdict is kept
            apply_verdict(body, items, sp.excess_ns, self.trace.tgid)
        if self.budget is not None:
            self.budget.charge(self.own.thread_ns() - t)
        if items and self.metrics is not None:
            self.metrics.spike_causes(items)

    def log(self, sp: Spike, body: dict) -> dict:
        """Log ``sp`` with a cause it inherits (:meth:`SpikeRecords.log`): its record's CPU
        is the attribution part's, as an attributed spike's is."""
        with self.own.part("attribution"):
            if self.trace.active:
                self.stories.annotate(sp, body)
            return self.records.log(sp, body)

    def drop(self, sp: Spike, why: str) -> None:
        with self.own.part("attribution"):
            self.records.drop(sp, why)

    def _flight_step(self) -> None:
        if not self.flight.pending:
            return
        final = self.source_error is not None or self._stopping
        if self.flight.step(self.sampler.latest_ns(), final, self.sampler, self.lat):
            self.sampler.poke()

    def run(self) -> int:
        """Start, loop until ``duration_s``, a requested stop or the source dying; stop.
        Returns the exit code: 0 (duration reached or stop requested), 3 (source died), 1
        (the spike log could not be written), else the source's own (``exit_code``: 4 for an
        attached process of which no call was timed)."""
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
                time.sleep(max(0.0, self._pause_s() - (time.monotonic() - t)))
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
        return rc or self.source.exit_code()

    def _pause_s(self, now: float | None = None) -> float:
        """The loop's period from this step on: ``loop_s`` while spikes wait (one pending,
        a flight record to finish, or within :data:`QUIET_AFTER_S` of that), else
        :data:`QUIET_LOOPS` × ``loop_s``. A spike detected and recorded in the same step
        (most of them: the step asks the sampler for the round after it) leaves the pace
        quiet: under ~3 spikes a second the extra turns it used to bring were ~2 a second,
        ~0.1 % of one CPU (issue #38). Past the CPU budget (:meth:`_spent`) the steps follow
        the native helper's rounds, at the quiet pace or slower, while spikes wait too
        (:meth:`_spent_pause_s`, :meth:`attribute_pending`), except while the source waits
        for a process to arm (a restart: the quiet pace). ``now``: monotonic s (default:
        now)."""
        now = time.monotonic() if now is None else now
        if self.schedule.pending or self.flight.pending:
            self._busy_until = now + QUIET_AFTER_S
        if self._spent() and not self.source.arming():
            return self._spent_pause_s()
        if now > self._busy_until or self._spent():
            return self.cfg.loop_s * QUIET_LOOPS
        return self.cfg.loop_s

    def _spent_pause_s(self) -> float:
        """Past the CPU budget, from the start of the latest step: until just after the
        native helper's next round (:data:`ROUND_AFTER_S`; its rounds 0.4 s apart then), at
        least the quiet pace and at most :data:`SPENT_PAUSE_MAX_S`. A step that comes just
        after a round finds every spike before it ready and its rows in one replay, where
        steps at the quiet pace came 0-150 ms after a round, two or three to a round: side
        by side on a 2-vCPU Linux 6.18 guest under ~740 spikes a minute, the same CPU
        (1.08 / 1.10 % of one CPU against 1.09 / 1.10 %) and records P50/max 115-129 /
        407 ms late against 178-237 / 541-552 ms (issue #38)."""
        quiet = self.cfg.loop_s * QUIET_LOOPS
        nxt = getattr(self.sampler, "next_round_s", None)  # (the native sampler's)
        due = nxt() if nxt is not None else None
        if due is None:
            return quiet
        return max(quiet, min(due + ROUND_AFTER_S - self._step_t0, SPENT_PAUSE_MAX_S))

    def _spent(self) -> bool:
        """Whether watch's always-on parts alone spend its CPU budget now (then a storm's
        spikes wait for the helper's own rounds at the quiet pace: :meth:`attribute_pending`)."""
        return self.budget is not None and self.budget.spent()

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
        self.own.end()  # (before the sampler's thread, and its CPU clock, ends)
        gc.unfreeze()
        if self.metrics is not None:
            self.metrics.down()
        if self.sampler is not None:
            self.sampler.stop()
        self.source.stop()
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
