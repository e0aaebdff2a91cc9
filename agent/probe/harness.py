"""The timing harness: a tight hot loop writing int64 ns into preallocated numpy arrays.

Reusable on its own (``hftagent watch`` uses :func:`time_loop` for its open-loop probe):
``time_loop(fn, n, rate_hz=None)`` calls the zero-argument ``fn`` ``n`` times and returns a
:class:`Samples` of raw per-sample columns; :func:`concurrent_loop` runs the closed loop in
several caller threads sharing ``fn`` (gate's concurrentN). No TensorFlow here.

Per sample the loop records (all int64):

=============  =============================================================================
intended_ns    scheduled start (open loop); equals start_ns in closed loop
start_ns       ``time.perf_counter_ns()`` just before the call
end_ns         ``time.perf_counter_ns()`` just after the call
nivcsw         involuntary context switches of the calling thread (getrusage RUSAGE_THREAD)
nvcsw          voluntary context switches of the calling thread
minflt         minor page faults of the calling thread
majflt         major page faults of the calling thread
cpu_ns         process CPU time (all threads: TF's pools included), ``time.process_time_ns``
=============  =============================================================================

Rusage / CPU deltas: in closed loop the "after" reading of sample i is the "before" reading of
sample i + 1 (one getrusage per sample instead of two, measured at 0.47 µs each here), so a
delta covers the call plus the few stores after the previous call. In open loop the "before"
reading is taken after the wait, so sleeping between samples is never charged to a sample.

The hot loop allocates nothing per sample beyond the ints the clock and getrusage return: the
columns are written through memoryviews of the preallocated arrays (cheaper than numpy item
assignment), and there is no histogram or progress work inside it.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

COLUMNS: tuple[str, ...] = ("intended_ns", "start_ns", "end_ns", "nivcsw", "nvcsw", "minflt",
                            "majflt", "cpu_ns")

# Open loop: sleep until this close to the intended start, then spin (sleep overshoots by
# ~50-100 µs on a VM; spinning the last stretch keeps the start on schedule).
_SPIN_NS = 200_000
_NEVER = 1 << 62


@dataclass
class Samples:
    """Raw per-sample columns of one timed run (views trimmed to ``count``)."""

    data: np.ndarray  # int64 [len(COLUMNS), count]
    open_loop: bool
    rate_hz: float | None = None
    # open loop: requests scheduled before the deadline that never started (saturation)
    unserved: int = 0

    @property
    def count(self) -> int:
        return int(self.data.shape[1])

    def column(self, name: str) -> np.ndarray:
        return self.data[COLUMNS.index(name)]

    @property
    def latency_ns(self) -> np.ndarray:
        """Service time: end − actual start."""
        return self.column("end_ns") - self.column("start_ns")

    @property
    def response_ns(self) -> np.ndarray:
        """Response time from the intended start (coordinated-omission free in open loop)."""
        return self.column("end_ns") - self.column("intended_ns")

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: self.data[i] for i, name in enumerate(COLUMNS)}


def allocate(n: int) -> np.ndarray:
    """Preallocate the columns for ``n`` samples (touched once so faults happen here, not in
    the loop)."""
    buf = np.zeros((len(COLUMNS), max(int(n), 0)), dtype=np.int64)
    buf.fill(0)
    return buf


def time_loop(fn: Callable[[], object], n: int, rate_hz: float | None = None, *,
              deadline_ns: int | None = None, buf: np.ndarray | None = None) -> Samples:
    """Call ``fn()`` up to ``n`` times and time every call.

    Closed loop (back-to-back) when ``rate_hz`` is None; otherwise open loop on a fixed schedule
    of ``rate_hz`` starts per second: a late call starts at once and its queueing shows in
    ``response_ns`` (from the intended start) but not in ``latency_ns``. ``deadline_ns`` (a
    ``perf_counter_ns`` value) stops the run early: at least one sample is always taken.

    Open loop with a deadline: every request *scheduled* before the deadline is served, the
    backlog included (stopping at the deadline would drop exactly the slowest responses), for
    at most as long again as the run; requests still not started then are counted in
    ``Samples.unserved`` — the offered rate exceeds capacity and the response percentiles are
    lower bounds.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    if rate_hz is not None and not rate_hz > 0:
        raise ValueError("rate_hz must be > 0")
    data = buf if buf is not None else allocate(n)
    if data.shape[0] != len(COLUMNS) or data.shape[1] < n:
        raise ValueError("buffer too small")
    deadline = _NEVER if deadline_ns is None else int(deadline_ns)
    if rate_hz is None:
        count = _closed(fn, n, deadline, data)
        data[0, :count] = data[1, :count]
    else:
        count, unserved = _open(fn, n, deadline, data, int(round(1e9 / rate_hz)))
        return Samples(data[:, :count], open_loop=True, rate_hz=rate_hz, unserved=unserved)
    return Samples(data[:, :count], open_loop=False, rate_hz=None)


def _closed(fn: Callable[[], object], n: int, deadline: int, data: np.ndarray) -> int:
    st, en, iv, vv, mn, mj, cp = (memoryview(data[i]) for i in range(1, 8))
    clock = time.perf_counter_ns
    cpu = time.process_time_ns
    getru = resource.getrusage
    who = resource.RUSAGE_THREAD
    r0 = getru(who)
    c0 = cpu()
    i = 0
    while i < n:
        t0 = clock()
        fn()
        t1 = clock()
        r1 = getru(who)
        c1 = cpu()
        st[i] = t0
        en[i] = t1
        iv[i] = r1.ru_nivcsw - r0.ru_nivcsw
        vv[i] = r1.ru_nvcsw - r0.ru_nvcsw
        mn[i] = r1.ru_minflt - r0.ru_minflt
        mj[i] = r1.ru_majflt - r0.ru_majflt
        cp[i] = c1 - c0
        r0 = r1
        c0 = c1
        i += 1
        if t1 >= deadline:
            break
    return i


def _open(fn: Callable[[], object], n: int, deadline: int, data: np.ndarray,
          period_ns: int) -> tuple[int, int]:
    it, st, en, iv, vv, mn, mj, cp = (memoryview(data[i]) for i in range(8))
    clock = time.perf_counter_ns
    cpu = time.process_time_ns
    getru = resource.getrusage
    who = resource.RUSAGE_THREAD
    sleep = time.sleep
    begin = clock() + period_ns
    if deadline >= _NEVER:
        scheduled, hard_stop = n, _NEVER
    else:  # requests whose intended start falls before the deadline, and a grace period
        scheduled = min(n, max(1, -(-(deadline - begin) // period_ns)))
        hard_stop = deadline + max(1_000_000_000, deadline - begin)
    i = 0
    while i < scheduled:
        intended = begin + i * period_ns
        ahead = intended - clock()
        if ahead > _SPIN_NS:
            sleep((ahead - _SPIN_NS) * 1e-9)
        while clock() < intended:
            pass
        r0 = getru(who)
        c0 = cpu()
        t0 = clock()
        fn()
        t1 = clock()
        r1 = getru(who)
        c1 = cpu()
        it[i] = intended
        st[i] = t0
        en[i] = t1
        iv[i] = r1.ru_nivcsw - r0.ru_nivcsw
        vv[i] = r1.ru_nvcsw - r0.ru_nvcsw
        mn[i] = r1.ru_minflt - r0.ru_minflt
        mj[i] = r1.ru_majflt - r0.ru_majflt
        cp[i] = c1 - c0
        i += 1
        if t1 >= hard_stop:
            break
    return i, scheduled - i


class CallerFailed(Exception):
    """A caller thread of :func:`concurrent_loop` raised: the message names the caller."""


def concurrent_loop(fn: Callable[[], object], callers: int, per: int, *,
                    deadline_ns: int | None = None, buf: np.ndarray | None = None
                    ) -> Samples:
    """``callers`` threads, released together by a barrier, each call ``fn()`` ``per`` times
    back to back (the closed loop of :func:`time_loop`, rusage columns per calling thread).

    The callers share ``fn``: a callable that is not thread-safe must bring its own lock.
    ``deadline_ns`` stops each caller early (at least one call each); ``buf``: preallocated
    columns for ``callers * per`` samples. Returns one closed-loop
    :class:`Samples`: caller 0's samples, then caller 1's, ... Raises :class:`CallerFailed`
    with the first caller's error when any caller's ``fn`` raised."""
    if callers < 1 or per < 1:
        raise ValueError("callers and per must be >= 1")
    data = buf if buf is not None else allocate(callers * per)
    if data.shape[0] != len(COLUMNS) or data.shape[1] < callers * per:
        raise ValueError("buffer too small")
    deadline = _NEVER if deadline_ns is None else int(deadline_ns)
    barrier = threading.Barrier(callers)
    counts = [0] * callers
    errors: list[str] = []

    def caller(i: int) -> None:
        try:
            barrier.wait()
            counts[i] = _closed(fn, per, deadline, data[:, i * per:(i + 1) * per])
        except Exception as exc:  # noqa: BLE001 - reported once every caller is done
            errors.append(f"caller {i}: {type(exc).__name__}: {exc}")
    threads = [threading.Thread(target=caller, args=(i,), daemon=True,
                                name=f"probe-caller-{i}") for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise CallerFailed(errors[0])
    out = np.concatenate([data[:, i * per:i * per + counts[i]] for i in range(callers)], axis=1)
    out[0] = out[1]  # closed loop: intended start = actual start
    return Samples(out, open_loop=False, rate_hz=None)


def bare_loop(fn: Callable[[], object], n: int) -> np.ndarray:
    """Reference loop for overhead measurements: perf_counter_ns around the call, nothing
    else recorded (same memoryview store)."""
    out = np.zeros(n, dtype=np.int64)
    mv = memoryview(out)
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn()
        mv[i] = clock() - t0
    return out


@dataclass
class Warmup:
    """Warm-up outcome: calls made, per-window medians (the warm-up curve), steady or not."""

    calls: int
    window: int
    window_p50_ns: list[int]
    stable: bool
    reason: str
    latency_ns: np.ndarray

    def to_dict(self) -> dict:
        return {"calls": self.calls, "window": self.window, "window_p50_ns": self.window_p50_ns,
                "stable": self.stable, "reason": self.reason}


def warm_up(fn: Callable[[], object], min_calls: int = 200, *, window: int = 100,
            tolerance: float = 0.10, max_calls: int | None = None,
            budget_ns: int | None = None) -> Warmup:
    """Call ``fn`` at least ``min_calls`` times, then until steady.

    Steady state: the medians of the last two consecutive windows of ``window`` calls differ
    by at most ``tolerance`` (relative). Warm-up extends window by window up to ``max_calls``
    (default 10 × ``min_calls``) or the ``budget_ns`` time budget, and otherwise reports
    "unstable". A slow callable whose budget cannot hold ``min_calls`` gets smaller windows
    (≥ 5 calls) so that the check can still run.
    """
    max_calls = max_calls or max(10 * min_calls, min_calls + 2 * window)
    clock = time.perf_counter_ns
    lat = np.zeros(max_calls, dtype=np.int64)
    mv = memoryview(lat)
    start = clock()
    deadline = start + budget_ns if budget_ns else _NEVER
    # Probe a few calls to size the windows for slow callables.
    i = 0
    for _ in range(min(5, max_calls)):
        t0 = clock()
        fn()
        t1 = clock()
        mv[i] = t1 - t0
        i += 1
    per_call = int(np.median(lat[:i]))
    if budget_ns and per_call * max(min_calls, 2 * window) > budget_ns:
        window = max(5, min(window, int(budget_ns // max(per_call, 1)) // 4))
    medians: list[int] = []
    stable = False
    reason = ""
    while True:
        n_next = min(max_calls, (i // window + 1) * window)
        while i < n_next:
            t0 = clock()
            fn()
            t1 = clock()
            mv[i] = t1 - t0
            i += 1
        if i % window == 0:
            medians.append(int(np.median(lat[i - window:i])))
        over_budget = clock() >= deadline
        if len(medians) >= 2 and (i >= min_calls or over_budget):
            a, b = medians[-2], medians[-1]
            if abs(b - a) <= tolerance * a:
                stable = True
                reason = (f"steady: last two windows of {window} calls within "
                          f"{tolerance:.0%} ({a / 1e3:.1f} → {b / 1e3:.1f} µs)")
                break
        if i >= max_calls:
            reason = f"unstable: windows still moving after {i} calls (max {max_calls})"
            break
        if over_budget:
            reason = (f"unstable: warm-up time budget of {budget_ns / 1e9:.1f} s reached after "
                      f"{i} calls")
            break
    return Warmup(calls=i, window=window, window_p50_ns=medians, stable=stable, reason=reason,
                  latency_ns=lat[:i].copy())


def gap_loop(fn: Callable[[], object], gaps_ns: list[int], rounds: int, *,
             deadline_ns: int | None = None, seed: int = 7,
             sleep: Callable[[float], object] = time.sleep,
             clock: Callable[[], int] = time.perf_counter_ns) -> dict[int, np.ndarray]:
    """Time ``fn()`` after an idle gap: {gap_ns: int64 [3, count] of (gap_ns actual, start_ns,
    end_ns)}.

    Each round calls ``fn`` once per gap, in an order shuffled per round (seeded), so that the
    gaps share the host's noise instead of running one after another. Before a call the loop
    *sleeps* (never spins: the point is to let the CPU go idle, as it does between orders on
    a quiet market) until ``gap`` after the previous call ended; gap 0 is back-to-back. The
    gap actually slept is recorded, since a sleep overshoots (tens of µs on a VM). The first
    call of the run is a throw-away, so that every timed call has a predecessor.
    ``deadline_ns`` (a ``clock`` value) stops at the end of a round, after at least one round.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if not gaps_ns or any(g < 0 for g in gaps_ns):
        raise ValueError("gaps must be >= 0")
    gaps = sorted(set(int(g) for g in gaps_ns))
    out = {g: np.zeros((3, rounds), dtype=np.int64) for g in gaps}
    views = {g: [memoryview(out[g][i]) for i in range(3)] for g in gaps}
    rng = np.random.default_rng(seed)
    deadline = _NEVER if deadline_ns is None else int(deadline_ns)
    fn()
    prev_end = clock()
    done = 0
    for r in range(rounds):
        for gi in rng.permutation(len(gaps)):
            g = gaps[int(gi)]
            if g:
                ahead = prev_end + g - clock()
                if ahead > 0:
                    sleep(ahead * 1e-9)
            t0 = clock()
            fn()
            t1 = clock()
            gv, sv, ev = views[g]
            gv[r] = t0 - prev_end
            sv[r] = t0
            ev[r] = t1
            prev_end = t1
        done = r + 1
        if prev_end >= deadline:
            break
    return {g: a[:, :done] for g, a in out.items()}
