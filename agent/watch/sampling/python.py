"""The sampler: a thread pinned to a housekeeping CPU that runs the collectors at
``sample_hz`` into fixed-size rings.

Each round runs every collector whose ``period_s`` has elapsed through
:func:`collectors.base.run_collector` (a failing collector is reported with its success
flag and duration and skipped; it never stops the others), turns counters into deltas and
appends a row to that collector's :class:`~agent.watch.ring.SignalRing`. A collector that
fails with a permission error, or ``max_failures`` times in a row, is closed and marked
``unsupported: <reason>`` — watch keeps going without it.

The thread pins itself with ``sched_setaffinity(0, ...)`` (on Linux pid 0 is the calling
thread), so the probe's CPUs never run the sampler.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.watch.ring import DeltaTracker, SignalRing
from collectors.base import CollectorResult


def _default_is_counter(name: str) -> bool:
    """Collectors without ``is_counter`` follow the Prometheus convention: ``_total``."""
    return name.endswith("_total")


@dataclass
class CollectorState:
    name: str
    state: str = "ok"  # ok | unsupported | failed
    reason: str | None = None
    runs: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    busy_ns: int = 0
    last_duration_s: float = 0.0
    dropped_rows: int = 0  # native replay: rounds with none of its files (registered since)
    layout_rows: int = 0  # native replay: rows appended from the helper's layout values

    def to_dict(self) -> dict:
        return {"state": self.state, "reason": self.reason, "runs": self.runs,
                "failures": self.failures,
                "mean_us": round(self.busy_ns / self.runs / 1e3, 2) if self.runs else None}


@dataclass
class _Entry:
    collector: object
    ring: SignalRing
    deltas: DeltaTracker
    state: CollectorState
    period_ns: int
    due_ns: int = 0  # sampled when at least this long since the last run (period − slack)
    div: int = 1  # native sampler: replayed on helper rounds where round % div == 0
    last_ns: int = 0
    # the collector's current_period_s (collectors/gpu.py: slower while the probe is on no
    # GPU), None for a fixed period
    adapt: Callable[[], float] | None = None
    prev_t_ns: int = 0


def retire_gone(e: _Entry, t_ns: int) -> None:
    """The signals ``e``'s collector said are gone for good (an exited thread's: the sched
    collector's ``gone``), retired in its ring as of ``t_ns``: later signals take their
    columns (agent/watch/ring.py)."""
    gone = getattr(e.collector, "gone", None)
    if gone:
        e.ring.retire(gone, t_ns)
        e.deltas.forget(gone)  # (nor their last reads: a service restarted for days)
        gone.clear()


@dataclass
class SamplerStats:
    rounds: int = 0
    late_rounds: int = 0
    busy_ns: int = 0  # wall time spent inside rounds
    cpu_ns: int = 0  # thread CPU time over the whole run
    started_ns: int = 0
    per_collector: dict[str, CollectorState] = field(default_factory=dict)


class Sampler:
    """Runs collectors at ``hz`` on a thread pinned to ``cpus`` (housekeeping).

    ``clock`` (monotonic ns) stamps the rows of :meth:`round` (tests drive rounds on virtual
    time); the thread's loop paces itself in real time. (The native sampler's rows carry the
    helper's CLOCK_MONOTONIC round times: it keeps the real clock.)"""

    mode = "python"

    def __init__(self, collectors: list, hz: float = 100.0, cpus: list[int] | None = None,
                 capacity_s: float = 30.0, max_failures: int = 3,
                 on_result: Callable[[CollectorResult], None] | None = None,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.hz = float(hz)
        self.clock = clock
        self.period_ns = int(1e9 / self.hz)
        self.cpus = list(cpus) if cpus else None
        self.max_failures = max_failures
        self.on_result = on_result
        cap = max(16, int(capacity_s * self.hz))
        self.entries: list[_Entry] = []
        for c in collectors:
            period = max(self.period_ns, int(getattr(c, "period_s", 0.0) * 1e9))
            is_counter = getattr(c, "is_counter", None) or _default_is_counter
            self.entries.append(_Entry(c, SignalRing(c.name, cap), DeltaTracker(is_counter),
                                       CollectorState(c.name), period,
                                       period - self.period_ns // 4,
                                       adapt=getattr(c, "current_period_s", None)))
        self.stats = SamplerStats(per_collector={e.state.name: e.state for e in self.entries})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pin_error: str | None = None
        self.native_id: int | None = None
        self._lock = threading.Lock()  # held while a round writes the rings

    # -- lookup -----------------------------------------------------------------------------
    def ring(self, name: str) -> SignalRing | None:
        for e in self.entries:
            if e.ring.name == name:
                return e.ring
        return None

    def collector(self, name: str):
        for e in self.entries:
            if e.state.name == name:
                return e.collector
        return None

    def rings(self) -> list[SignalRing]:
        return [e.ring for e in self.entries]

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def latest_ns(self) -> int:
        """The end of the most recent round (all due collectors have a row up to here)."""
        return self._latest

    _latest = 0

    def covered_ns(self, max_period_s: float = 0.05) -> int:
        """Time up to which every working collector with a period ≤ ``max_period_s`` has a
        row: a spike ending before it can be attributed with all its fast signals (a 20 Hz
        collector's row for the spike comes up to 50 ms after the 100 Hz rounds'). Slower
        collectors are not waited for: numa (10 Hz; the memory collector's host-wide
        numa_miss/numa_foreign come at 20 Hz) and pcie (1 Hz). Waiting for numa's row held
        records back up to 100 ms more (bench/attribution.py: the ≤ 200 ms target). An
        adaptive collector counts by its current period (gpu at 1 Hz while the probe is on no
        GPU is not waited for)."""
        lim = int(max_period_s * 1e9)
        t = self._latest
        for e in self.entries:
            if e.state.state == "ok" and e.period_ns <= lim and e.ring.rows and \
                    (e.adapt is None or self.period_now_ns(e) <= lim):
                t = min(t, e.ring.latest_t1)
        return t

    # -- running ----------------------------------------------------------------------------
    @property
    def thread(self) -> threading.Thread | None:
        """The sampler's thread once started (watch's own-cost accounting reads its CPU
        clock: agent/watch/budget.py)."""
        return self._thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hftagent-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for e in self.entries:
            try:
                e.collector.close()
            except Exception:  # noqa: BLE001 - closing must not mask the run's result
                pass

    def poke(self) -> None:
        """Someone waits for rows (a spike to attribute): the Python sampler's rows are
        always current, nothing to do (the native sampler replays sooner)."""

    def slow(self, on: bool) -> None:
        """Past watch's CPU budget the native helper's rounds come further apart
        (:meth:`NativeSampler.slow`); here each collector keeps its period."""

    def slow_s(self) -> float:
        """Seconds this sampler's rounds were slowed (:meth:`slow`): never here."""
        return 0.0

    def round(self, now_ns: int | None = None) -> None:
        """One sampling round (public for tests and benchmarks).

        Each due collector is sampled with :func:`collectors.base.run_collector`'s contract
        inlined (a failure is caught, timed and reported; it never stops the others): the
        per-call dataclass and float timing cost a measurable share of the 100 Hz budget;
        :class:`~collectors.base.CollectorResult` is only built for ``on_result``."""
        now = self.clock() if now_ns is None else now_ns
        t_start = time.perf_counter_ns()
        self._sample_due(self.entries, now)
        self._latest = now
        self.stats.rounds += 1
        self.stats.busy_ns += time.perf_counter_ns() - t_start

    def _sample_due(self, entries: list[_Entry], now: int) -> None:
        """Sample, at ``now``, each working collector whose period has elapsed."""
        for e in entries:
            if now - e.last_ns < e.due_ns or e.state.state != "ok":
                continue
            if e.adapt is not None and now - e.last_ns < self._due_now(e):
                continue
            e.last_ns = now
            self._sample_entry(e, now)

    def period_now_ns(self, e: _Entry) -> int:
        """A collector's period now: the fixed one, or an adaptive collector's
        ``current_period_s()`` (never shorter than the fixed one)."""
        if e.adapt is None:
            return e.period_ns
        try:
            return max(e.period_ns, int(e.adapt() * 1e9))
        except Exception:  # noqa: BLE001 - a broken hint means the fixed period
            return e.period_ns

    def _due_now(self, e: _Entry) -> int:
        """An adaptive collector's due time now (its current period less the slack)."""
        return max(e.due_ns, self.period_now_ns(e) - self.period_ns // 4)

    def _sample_entry(self, e: _Entry, now: int, pending: list | None = None,
                      reads: dict | None = None) -> bool:
        """Sample one collector and append its row at ``now``; True when it gave one. The
        native sampler's replay passes ``reads`` (a recorded round's bytes: the row is the
        collector's ``replay(reads)``) and ``pending`` (rows are collected there and
        appended in one batch)."""
        st = e.state
        pc = time.perf_counter_ns
        t0 = pc()
        try:
            values = e.collector.sample() if reads is None else e.collector.replay(reads)
            error = None
        except Exception as exc:  # noqa: BLE001 - a broken collector never stops the others
            values, error = {}, f"{type(exc).__name__}: {exc}"
        dt = pc() - t0
        st.runs += 1
        st.busy_ns += dt
        st.last_duration_s = dt / 1e9
        if self.on_result is not None:
            self.on_result(CollectorResult(st.name, error is None, dt / 1e9, values, error))
        if error is None:
            st.consecutive_failures = 0
            if pending is not None:
                pending.append((e.prev_t_ns or now, now, values, None))
                e.prev_t_ns = now
                return True
            with self._lock:
                e.ring.append_raw(e.prev_t_ns or now, now, values, e.deltas)
                retire_gone(e, now)
            e.prev_t_ns = now
            return True
        st.failures += 1
        st.consecutive_failures += 1
        st.reason = error
        perm = "Permission" in error or "EACCES" in error
        if perm or st.consecutive_failures >= self.max_failures:
            # Degrade, never crash: a collector that lost its permission (or keeps
            # failing) is closed and reported as unsupported from now on.
            st.state = "unsupported"
            st.reason = f"unsupported: {error}"
            try:
                e.collector.close()
            except Exception:  # noqa: BLE001
                pass
        return False

    def _run(self) -> None:
        self._begin()
        self._loop(self.period_ns, self.round)
        self._account()

    _cpu0 = 0

    def _begin(self) -> None:
        """On the sampler thread: pin it to the housekeeping CPUs, start its CPU clock."""
        self.native_id = threading.get_native_id()
        if self.cpus:
            try:
                os.sched_setaffinity(0, self.cpus)  # pid 0 = this thread on Linux
            except OSError as exc:
                self.pin_error = f"cannot pin sampler to CPUs {self.cpus}: {exc.strerror}"
        self._cpu0 = time.thread_time_ns()
        self.stats.started_ns = self.clock()

    def _account(self) -> None:
        """The sampler's CPU time so far (this thread's)."""
        self.stats.cpu_ns = time.thread_time_ns() - self._cpu0

    def _loop(self, period_ns: int, body: Callable[[], object]) -> None:
        """Call ``body`` every ``period_ns`` until stop() (or until ``body`` returns False)."""
        monotonic = time.monotonic_ns
        sleep = time.sleep
        stop = self._stop
        nxt = monotonic()
        n = 0
        # time.sleep, not Event.wait: a timed Event.wait goes through a Condition and a lock
        # with a timeout on every round; stop() is seen at the next round (≤ one period,
        # sleeps capped at 0.1 s for slow rates).
        while not stop.is_set():
            if body() is False:
                return
            nxt += period_ns
            now = monotonic()
            if now > nxt:
                self.stats.late_rounds += 1
                nxt = now  # never try to catch up in a burst
            else:
                while now < nxt and not stop.is_set():
                    sleep(min(nxt - now, 100_000_000) / 1e9)
                    now = monotonic()
            n += 1
            if not n & 31:  # a syscall: every 32nd round, and at the end
                self._account()

