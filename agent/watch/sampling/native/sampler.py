"""The native sampler: the same rings as :class:`~agent.watch.sampling.python.Sampler`,
filled from the native reader's recorded rounds (:mod:`agent.watch.sampling.native.feed`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from agent.watch.sampling.native.feed import Feed
from agent.watch.sampling.native.plans import ReplayPlan
from agent.watch.sampling.python import Sampler, _Entry, retire_gone
from agent.watch.sampling.sources.base import HotSource
from collectors.base import CollectorResult


class NativeSampler(Sampler):
    """The same rings, filled from the native reader (:mod:`agent.watch.sampling.native.feed`).

    The helper process, pinned to the housekeeping CPUs, reads the hot sources' files at
    ``hz`` (each source's files on its own rounds: ``round % div == 0``, div = period /
    sampler period, times a file's ``every``). This thread replays every recorded round
    (warm caches, one wake-up per batch) and appends the rows at the rounds' own times: at
    ``drain_hz`` (1 Hz) while nobody waits for rows, and at once (at most one replay per
    :data:`POKE_GAP_NS`) when :meth:`poke` says someone does: watch pokes once per loop step
    while a spike waits for its rows and waits for that replay (:meth:`wait_replay`), so a
    storm costs a replay per step and a quiet run one replay a second.
    Between replays it wakes only for the live collectors. Each hot source has a
    :class:`~agent.watch.sampling.native.plans.ReplayPlan`: a round whose files all came with
    their layouts' values (extracted by the helper) is appended from those
    (:meth:`SignalRing.append_seqs`) without calling the source, any other round through the
    source's :meth:`~agent.watch.sampling.sources.base.HotSource.replay` of its bytes.
    Collectors that read no hot files (gpu, perf, pcie) are sampled live here at their
    period. The sampler's cost is the helper's CPU time plus this thread's.

    If the helper dies mid-run, stops making rounds for :attr:`STALL_NS` (it is then
    killed), or a replay fails, :attr:`native_error` says why and this thread goes on as the
    Python sampler (the sources' files read live again, sched's scan in its sample()):
    watch never stops for it.
    """

    mode = "native"

    def __init__(self, collectors: list, feed: Feed, hz: float = 100.0,
                 cpus: list[int] | None = None, capacity_s: float = 30.0,
                 max_failures: int = 3,
                 on_result: Callable[[CollectorResult], None] | None = None,
                 drain_hz: float | None = None) -> None:
        super().__init__(collectors, hz, cpus, capacity_s, max_failures, on_result)
        self.feed = feed
        self.replayed: list[_Entry] = []
        self.live: list[_Entry] = []
        self.plans: dict[int, ReplayPlan] = {}  # id(entry) → its source's plan
        # on_result wants every row's CollectorResult: no values rows
        self._values_rows = on_result is None
        rounds_ns = self._round_period()
        if rounds_ns != self.period_ns and feed.proc is None:  # (read when the helper starts)
            self.period_ns = rounds_ns
            feed.set_period(rounds_ns)
        for e in self.entries:
            e.div = max(1, round(e.period_ns / self.period_ns))
            if isinstance(e.collector, HotSource):
                self.replayed.append(e)
                plan = self.plans[id(e)] = ReplayPlan(e.collector, feed, e.div)
                try:
                    plan.sync()  # registered before the helper starts: read from round 0
                except OSError:
                    pass  # (sched attaching a thread that went: the next drain says so)
            else:
                self.live.append(e)
        # Live parts of replayed sources (sched's task scan): read after each batch and
        # merged into the source's newest row, not stamped with an older round's time.
        self._extras = [e for e in self.replayed if hasattr(e.collector, "live_extra")]
        # 1 Hz while nobody waits: each Python wake-up runs cold (~0.3-0.7 ms of CPU on a
        # 2-CPU VM) and a replay has fixed costs, so fewer, larger batches cost less (drain
        # 0.58-0.62 % of one CPU at 1 Hz against 0.73-0.77 % at 5 Hz there, A/B in one
        # run); a spike pokes (POKE_GAP_NS).
        self.drain_ns = int(1e9 / (drain_hz or 1.0))
        self._poke = threading.Event()
        self._overruns_seen = 0
        self.native_error: str | None = None
        self.drain_cpu_ns = 0
        self._fed_rounds = 0
        self._why: str | None = None  # why the replay stopped (helper died, stalled, error)
        self._last_round_at = time.monotonic_ns()
        self.replays = 0  # replays done (wait_replay waits for the count to move)
        self.asked_rounds = 0  # rounds asked of the helper (ask_round)
        self._asked_ns = -self.ASK_GAP_NS
        self._asked_rounds: int | None = None  # the helper's count when a round was asked
        self._replayed = threading.Condition()
        self.slow_ns = 0  # time the helper's rounds were slowed (slow), ended stretches
        self._slow_since: int | None = None  # monotonic ns: slowed since then

    STALL_NS = 2_000_000_000  # no new round for this long from a live helper: stuck
    # The helper's rounds are as far apart as the hot sources allow, up to this: a round
    # costs its wake-up and record whether or not a file is due in it (~70 µs of the
    # helper's and the replay's CPU a round on a 2-vCPU VM), and a spike's attribution
    # waits for the round after it anyway (Sampler.covered_ns); with the kernel events on,
    # every hot source is polled at 5 Hz or slower (agent/watch/wiring.py): 5 rounds a
    # second, and a spike whose round after it has not come asks for one (ask_round)
    MAX_ROUND_NS = 200_000_000

    def _round_period(self) -> int:
        """The helper's round period: ``hz``'s, times the largest common divisor of the hot
        sources' periods in those rounds that keeps it ≤ :data:`MAX_ROUND_NS` — each file
        is read at the very times it would be at ``hz`` (with the events on, every hot
        source runs at 5 Hz or slower: 5 rounds a second instead of 100)."""
        divs = [max(1, round(e.period_ns / self.period_ns)) for e in self.entries
                if isinstance(e.collector, HotSource)]
        k = math.gcd(*divs) if divs else 1
        best = max(d for d in range(1, k + 1)
                   if k % d == 0 and (d == 1 or d * self.period_ns <= self.MAX_ROUND_NS))
        return best * self.period_ns
    # A poked replay comes at least this long after the previous one. It was 200 ms: with
    # the task scan's gap that held a spike's record back 0.25-0.6 s (bench/attribution.py);
    # watch pokes at most once per 50 ms loop step, so the replays stay ≤ ~20 a second.
    POKE_GAP_NS = 20_000_000

    def poke(self) -> None:
        """Replay now (at most one per :data:`POKE_GAP_NS`): a spike waits for rows."""
        self._poke.set()

    # A round asked for (ask_round) comes at least this long after the previous one asked: a
    # storm's steps (every 50 ms while spikes wait) do not make the helper's rounds more
    # frequent than they were before the rounds went to 5 a second with the events on.
    ASK_GAP_NS = 100_000_000
    ASKED_WAIT_NS = 10_000_000  # a replay after an ask waits this long at most for its round

    def ask_round(self, need_ns: int) -> bool:
        """A spike waits for rows up to ``need_ns`` (monotonic): where the newest round
        replayed is older, none is due before the next step could replay it and ``need_ns``
        has passed, the helper makes a round now (:meth:`Feed.ask_round`), and the replay
        the caller's :meth:`poke` brings waits for it. True when one was asked."""
        now = time.monotonic_ns()
        if need_ns > now or self._latest >= need_ns or \
                now - self._asked_ns < self.ASK_GAP_NS or self._asked_rounds is not None:
            return False
        rounds = self.feed.rounds()
        if not self.feed.ask_round():
            return False
        self._asked_ns, self._asked_rounds = now, rounds
        self.asked_rounds += 1
        return True

    def _await_asked(self) -> None:
        """Before a replay: the round asked for, once the helper has recorded it (at most
        :data:`ASKED_WAIT_NS`: the round is a few hundred µs of reads)."""
        if self._asked_rounds is None:
            return
        deadline = time.monotonic_ns() + self.ASKED_WAIT_NS
        while self.feed.rounds() <= self._asked_rounds and time.monotonic_ns() < deadline:
            time.sleep(0.0005)
        self._asked_rounds = None

    def wait_replay(self, seen: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a replay after the ``seen``-th (:attr:`replays`
        read before the :meth:`poke`); True when one came. False at once when the drain
        thread is not running (nothing would come)."""
        t = self._thread
        if t is None or not t.is_alive() or self.native_error is not None:
            return False
        with self._replayed:
            return self._replayed.wait_for(
                lambda: self.replays != seen or self._stop.is_set(), timeout_s) and \
                self.replays != seen

    def start(self) -> None:
        """Start the helper (raises :class:`~agent.watch.sampling.native.feed.NativeUnavailable`),
        then the drain thread."""
        if self.feed.proc is None:
            self.feed.start(self.cpus)
        for e in self.replayed:  # the reader is not a task competing with the probe
            exclude = getattr(e.collector, "exclude_pids", None)
            if exclude is not None and self.feed.proc is not None:
                exclude.add(self.feed.proc.pid)
        self._last_round_at = time.monotonic_ns()
        super().start()

    def drain(self) -> bool:
        """Replay the rounds recorded since the last call, then sample the live collectors.
        False when the helper has died (the caller switches to Python rounds)."""
        feed = self.feed
        t_start = time.perf_counter_ns()
        buf, rounds = feed.read_rounds()
        pending: dict[int, list] = {id(e): [] for e in self.replayed}
        pc = time.perf_counter_ns
        try:
            # Source by source (each has its own ring and tracker; the rows of one stay in
            # round order), so that the per-row work is a few local operations.
            for e in self.replayed:
                st, div, rows, src = e.state, e.div, pending[id(e)], e.collector
                if st.state != "ok":
                    continue
                plan = self.plans[id(e)]
                plan.sync()
                quick = self._values_rows
                for rnd, t, files in rounds:
                    if rnd % div or st.state != "ok":
                        continue
                    e.last_ns = t
                    if quick and not src.next_row_parses():
                        t0 = pc()
                        got = plan.values(files, buf)
                        if got is not None:  # the helper's values: no parse, no dict
                            rows.append((e.prev_t_ns or t, t, got[1], got[0]))
                            e.prev_t_ns = t
                            src.rows += 1
                            st.runs += 1
                            st.layout_rows += 1
                            st.consecutive_failures = 0
                            st.busy_ns += pc() - t0
                            continue
                    reads = plan.reads(files, buf)
                    if not reads:  # none of its files in the round (registered since)
                        st.dropped_rows += 1
                        continue
                    if self._sample_entry(e, t, rows, reads):
                        plan.learn(files, buf)
                    if src.gen != plan.gen:  # a thread came or went, a PSI file was dropped
                        plan.sync()
            self._fed_rounds += len(rounds)
        finally:
            for e in self._extras:
                rows = pending[id(e)]
                if rows and e.state.state == "ok":
                    self._merge_extra(e, rows)
            with self._lock:  # once per drain, not per row
                for e in self.replayed:
                    rows = pending[id(e)]
                    self._append_rows(e, rows)
                    if rows:
                        retire_gone(e, rows[-1][1])
            if rounds:
                self._latest = rounds[-1][1]
        self._sample_due(self.live, time.monotonic_ns())
        fs = feed.stats()
        self.stats.rounds = self._fed_rounds
        self.stats.late_rounds = fs["late_rounds"]
        self.stats.busy_ns += time.perf_counter_ns() - t_start
        now = time.monotonic_ns()
        if rounds or feed.overruns != self._overruns_seen:
            # (a whole ring of rounds lost is an overrun, counted and reported: not a stall)
            self._overruns_seen = feed.overruns
            self._last_round_at = now
        elif not feed.alive():
            self._why = f"native sampler stopped ({feed.exit_reason()})"
            return False
        elif now - self._last_round_at > self.STALL_NS:
            self._why = (f"native sampler stalled (no round for "
                         f"{(now - self._last_round_at) / 1e9:.1f} s; killed)")
            return False
        return True

    @staticmethod
    def _append_rows(e: _Entry, rows: list) -> None:
        """Append a drain's rows of one collector in order: a run of values rows (keys set)
        in one :meth:`SignalRing.append_seqs`, a parsed row with ``append_raw``."""
        ring, deltas = e.ring, e.deltas
        i, n = 0, len(rows)
        while i < n:
            keys = rows[i][3]
            if keys is None:
                t0, t1, values, _ = rows[i]
                ring.append_raw(t0, t1, values, deltas)
                i += 1
                continue
            j = i
            while j < n and rows[j][3] is keys:
                j += 1
            ring.append_seqs([(t0, t1, v) for t0, t1, v, _ in rows[i:j]], keys, deltas)
            i = j

    def _drain_or_stop(self) -> bool:
        """:meth:`drain`, with any error ending the replay (said, never a dead thread)."""
        try:
            return self.drain()
        except Exception as exc:  # noqa: BLE001 - the Python sampler takes over
            self._why = f"native replay failed ({type(exc).__name__}: {exc})"
            return False

    @staticmethod
    def _merge_extra(e: _Entry, rows: list) -> None:
        """The collector's live part (sched's task scan, when due) into its newest row (a
        values row becomes a parsed one for it)."""
        t0 = time.perf_counter_ns()
        try:
            extra = e.collector.live_extra()
        except Exception as exc:  # noqa: BLE001 - a failed scan never loses the rows
            e.state.failures += 1
            e.state.reason = f"{type(exc).__name__}: {exc}"
            extra = None
        if extra:
            a, b, values, keys = rows[-1]
            if keys is not None:
                values = dict(zip(keys, values))
                rows[-1] = (a, b, values, None)
            values.update(extra)
        e.state.busy_ns += time.perf_counter_ns() - t0

    def _account(self) -> None:
        """Called on the sampler thread: its CPU time plus the helper's (the helper writes
        its own every 32 rounds and when it exits)."""
        self.drain_cpu_ns = time.thread_time_ns() - self._cpu0
        self.stats.cpu_ns = self.drain_cpu_ns + self.helper_cpu_ns()

    def helper_cpu_ns(self) -> int:
        return self.feed.cpu_ns()

    # Past watch's CPU budget (its always-on parts alone spend it: a storm, issue #38) the
    # helper's rounds come this many times further apart: every hot file is read at half its
    # rate (0.4 s rounds with the events on) and each replay brings as many rounds as before
    # in half as many wake-ups. Beside an attached LiteRT service in SCHED_FIFO bursts on a
    # 2-vCPU Linux 6.18 guest, the sampler's share went 0.25 → 0.18-0.20 % of one CPU; more of
    # a storm's spikes share a round's rows (schedule.py sheds their polled rules); a spike's
    # record waits for the round after it, up to 0.4 s instead of 0.2 s.
    SLOW_FACTOR = 2

    def slow(self, on: bool) -> None:
        """The helper's rounds :data:`SLOW_FACTOR` times further apart while ``on`` (the CPU
        budget spent), its regular period after (:meth:`Feed.set_period`, read after each
        round). Each source keeps its rounds (``round % div``) and the rows their rounds'
        own times."""
        if on == (self._slow_since is not None):
            return
        now = time.monotonic_ns()
        if on:
            self._slow_since = now
            self.feed.set_period(self.period_ns * self.SLOW_FACTOR)
        else:
            self.slow_ns += now - self._slow_since
            self._slow_since = None
            self.feed.set_period(self.period_ns)

    def next_round_s(self) -> float | None:
        """When the helper's next round is due (monotonic s): the newest replayed round's
        time plus its period now (None before the first)."""
        if not self._latest:
            return None
        return (self._latest + self.feed.period_ns()) / 1e9

    def slow_s(self) -> float:
        """Seconds the helper's rounds were slowed so far (:meth:`slow`)."""
        since = self._slow_since
        return (self.slow_ns + (time.monotonic_ns() - since if since is not None else 0)) / 1e9

    def unreplayed(self) -> bool:
        """Whether the helper has recorded rounds that no replay has appended yet."""
        return self.feed.unread()

    def _next_live_ns(self, default: int) -> int:
        """When the next live collector is due (by its current period: the gpu collector
        waits a second while the probe is on no GPU, collectors/gpu.py); ``default`` when
        none works. Each wake-up of this thread costs a cold Python pass (above)."""
        nxt = default
        for e in self.live:
            if e.state.state == "ok":
                due = e.due_ns if e.adapt is None else self._due_now(e)
                nxt = min(nxt, e.last_ns + due)
        return nxt

    def _native_loop(self) -> None:
        """Replay every ``drain_ns``, or POKE_GAP_NS after the last replay when poked;
        sample the live collectors at their period in between. Returns at stop() or when a
        replay fails (the helper died or stalled)."""
        mono = time.monotonic_ns
        stop, poke, feed = self._stop, self._poke, self.feed
        gap = min(self.POKE_GAP_NS, self.drain_ns)
        last = mono()
        every = self.drain_ns
        n = 0
        while not stop.is_set():
            now = mono()
            since = now - last
            if since >= every or (poke.is_set() and since >= gap):
                poke.clear()
                self._await_asked()
                r0 = feed.rpos
                if self._drain_or_stop() is False:
                    return
                with self._replayed:
                    self.replays += 1
                    self._replayed.notify_all()
                # Replay often enough that a quarter of the ring holds the rounds between
                # two replays (a big box's /proc/interrupts: megabytes a second).
                rate = (feed.rpos - r0) / max(since, 1)
                every = self.drain_ns if rate <= 0 else \
                    max(50_000_000, min(self.drain_ns, int(feed.capacity / 4 / rate)))
                last = now
            elif self.live:
                self._sample_due(self.live, now)
            nxt = last + (gap if poke.is_set() else every)
            if self.live:
                nxt = min(nxt, self._next_live_ns(nxt))
            timeout = max(0, nxt - mono()) / 1e9
            if stop.is_set():
                break
            if poke.is_set():
                time.sleep(min(timeout, 0.1))  # poked already: wait out the gap
            else:
                poke.wait(timeout)  # a poke (or stop) ends the wait
            n += 1
            if not n & 31:  # a syscall: every 32nd wake-up, and at the end
                self._account()

    def _run(self) -> None:
        self._begin()
        self._native_loop()
        if not self._stop.is_set():
            # The helper died, stalled, or the replay failed: say why, then carry on as the
            # Python sampler (every collector's files read live from here on, sched's task
            # scan inside its sample() again).
            self.feed.kill()
            self.native_error = f"{self._why}; the Python sampler took over"
            self.mode = "python (native reader stopped)"
            for e in self.entries:
                e.last_ns = 0
            self._loop(self.period_ns, self.round)
        self._account()

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()  # ends the loop's wait now
        with self._replayed:
            self._replayed.notify_all()  # (and a wait_replay's)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.slow(False)  # (the slowed stretch ends here: slow_s stays as it is)
        self.feed.stop()
        # the helper's final CPU time is in the header now; the thread's was taken at its end
        self.stats.cpu_ns = self.drain_cpu_ns + self.helper_cpu_ns()
        super().stop()  # closes the collectors
        self.feed.close()
