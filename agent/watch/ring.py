"""Fixed-size ring buffers for collector signals and latency samples (memory bounded for days).

A :class:`SignalRing` holds one collector's rounds: per row the interval it covers
(``t0_ns``, ``t1_ns``, CLOCK_MONOTONIC) and one float64 column per signal (NaN = not read that
round). Counters are stored as deltas over the row's interval (see :func:`counter_delta`),
gauges as read. Columns are added as signals appear, up to ``max_signals``; memory is
``capacity × max_signals × 8`` bytes at most. A signal its collector says is gone for good (an
exited thread's ``sched.<tid>.*``: :meth:`SignalRing.retire`) gives its column to a new one
:attr:`SignalRing.stale_s` later, before the ring grows; a full ring also takes the column of
any signal silent that long. A service restarted for days keeps rows for its new threads, in a
ring a few threads wide.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from operator import itemgetter, sub

import numpy as np

NAN = float("nan")


def counter_delta(prev: float | None, cur: float | None) -> float:
    """Delta of a monotonically increasing counter between two reads.

    * normal: ``cur - prev``
    * 32-bit wrap (``/proc/interrupts`` counts are ``unsigned int`` per CPU): prev in the upper
      half of the 32-bit range and cur below it → ``cur + 2**32 - prev``
    * reset (the source restarted: a thread re-created, a driver reloaded): NaN, never a
      negative or a made-up value
    * either read missing: NaN
    """
    if prev is None or cur is None or prev != prev or cur != cur:
        return NAN
    if cur >= prev:
        return cur - prev
    if 2**31 <= prev < 2**32 and cur < 2**31:
        return cur + 2**32 - prev
    return NAN


class DeltaTracker:
    """Turns one collector's raw samples into per-interval values (counter deltas, gauges).

    :meth:`update` returns them as a dict; :meth:`SignalRing.append_raw` does the same while
    writing the ring row, in one pass (the sampler's path: no intermediate dict)."""

    def __init__(self, is_counter) -> None:
        self.is_counter = is_counter
        self._prev: dict[str, float] = {}
        self._kind: dict[str, bool] = {}
        self.resets = 0

    def forget(self, names) -> None:
        """Drop ``names``' last reads and kinds (signals gone for good: an exited thread's)."""
        for name in names:
            self._prev.pop(name, None)
            self._kind.pop(name, None)

    def update(self, values: dict[str, float | None]) -> dict[str, float]:
        out: dict[str, float] = {}
        prev = self._prev
        kind = self._kind
        for name, v in values.items():
            if v is None:
                continue
            c = kind.get(name)
            if c is None:
                c = kind[name] = bool(self.is_counter(name))
            if c:
                p = prev.get(name)
                if p is not None:
                    d = counter_delta(p, v)
                    if d != d:
                        self.resets += 1
                    out[name] = d
                prev[name] = v
            else:
                out[name] = v
        return out


class SignalRing:
    """Rows of (t0_ns, t1_ns, values...) for one collector, newest overwriting oldest.

    Storage is ``array.array`` (C doubles / int64) with numpy views over the same memory
    (:attr:`t0`, :attr:`t1`, :attr:`data`): the sampler writes a row with plain array stores
    and one slice copy — a numpy store right after the sampler wakes costs microseconds of
    dispatch and cold cache each (~19 µs per appended row measured at 100 Hz on a 2-vCPU VM,
    against ~5 µs now) — while readers (attribution, the flight recorder) use numpy."""

    def __init__(self, name: str, capacity: int = 3000, max_signals: int = 512) -> None:
        self.name = name
        self.capacity = int(capacity)
        self.max_signals = int(max_signals)
        self._t0 = array("q", bytes(8 * self.capacity))
        self._t1 = array("q", bytes(8 * self.capacity))
        self.t0 = np.frombuffer(self._t0, dtype=np.int64)
        self.t1 = np.frombuffer(self._t1, dtype=np.int64)
        self._alloc(8)
        self.cols: dict[str, int] = {}
        # bumped when a column is added or given to another signal: what caches a column's
        # meaning keys on it (cols_like here, the attribution's baseline statistics)
        self.layout = 0
        self._like: dict = {}  # (prefix, suffixes) → [(name, column)], for layout _like_n
        self._like_n = 0
        self.rows = 0  # total rows ever written
        self.dropped_signals = 0  # new signals refused: every column held data
        self.reused_signals = 0  # columns given to a new signal (see _reuse)
        self._free: list[int] = []  # columns found empty at the last look, lowest last
        self._free_look_at = 0  # the row count before which a look for them is not repeated
        self._retired: dict[int, int] = {}  # column → when its signal was said gone (retire)

    def _alloc(self, width: int, old: np.ndarray | None = None) -> None:
        buf = array("d", [NAN]) * (self.capacity * width)
        data = np.frombuffer(buf, dtype=np.float64).reshape(self.capacity, width)
        if old is not None:
            data[:, :old.shape[1]] = old
        self._buf, self.data, self.width = buf, data, width
        self._blank = array("d", [NAN]) * width

    def _col(self, name: str, row: list[int], t_ns: int) -> int | None:
        """``name``'s column, added now where it has none; ``row``: the columns the row
        being written (ending at ``t_ns``) already uses, never given away under it. None:
        the ring is full and every signal had a value lately (``dropped_signals``)."""
        i = self.cols.get(name)
        if i is not None:
            return i
        # Before the ring grows, a retired signal's column (the sched ring of a service
        # restarted for days stays a few threads wide, not 12 MB); when it is full, also one
        # whose signal was silent for stale_s (its held values dropped, rather than the new
        # signal refused).
        n = len(self.cols)
        full = n >= self.max_signals
        i = self._reuse(row, t_ns, full) if full or (n >= self.width and self._retired) \
            else None
        if i is None:
            if full:
                self.dropped_signals += 1
                return None
            i = n
            if i >= self.width:
                self._alloc(min(self.max_signals, self.width * 2), self.data)
        self.cols[name] = i
        self.layout += 1
        return i

    # A retired signal's column goes to a new one this long after, and a full ring's signal
    # with no value for this long gives its column too (their held values dropped): the
    # attribution holds a spike's record back ≤ ~0.6 s (bench/attribution.py) and reads its
    # window's rows. Every signal of a sampler's ring comes at least every 2 s (the task
    # scan's) but the GPU's while the probe is on none (every 10 s: collectors/gpu.py
    # idle_full_s), in a ring never full.
    stale_s = 5.0

    def retire(self, names, t_ns: int) -> None:
        """``names`` are gone for good as of ``t_ns`` (an exited thread's signals): their
        columns go to new signals :attr:`stale_s` later (their values read until then)."""
        for name in names:
            i = self.cols.get(name)
            if i is not None and i not in self._retired:
                self._retired[i] = t_ns

    def _reuse(self, row, t_ns: int, full: bool) -> int | None:
        """A column taken from its signal (its name no longer reads; its held values
        dropped), or None: a retired one :attr:`stale_s` after its retirement, or where the
        ring is ``full``, one with no value in the rows ending in the :attr:`stale_s`
        before ``t_ns`` (a row after a gap with no rows spans it: its end is the time). The
        look over every column (~0.3 ms at 500 rows × 512) runs at most once in
        ``capacity // 30`` rows (1 s at 100 Hz) while a new signal waits for one; a column
        it found is checked again when taken."""
        stale = int(self.stale_s * 1e9)
        data = self.data
        for i, t in list(self._retired.items()):
            if t_ns - t < stale:
                break  # (oldest first)
            if i in row:
                continue
            if not np.isnan(data[self.window(t + 1, t_ns), i]).all():
                del self._retired[i]  # a value since: not gone after all
                continue
            return self._take(i)
        if not full:
            return None
        free = self._free
        recent = self.window(t_ns - stale, t_ns)
        while True:
            while free:
                i = free.pop()
                if i not in row and np.isnan(data[recent, i]).all():
                    return self._take(i)
            if self.rows < self._free_look_at:
                return None
            self._free_look_at = self.rows + max(1, self.capacity // 30)
            n = len(self.cols)
            free[:] = np.flatnonzero(np.isnan(data[recent, :n]).all(axis=0))[::-1].tolist()

    def _take(self, i: int) -> int:
        """Column ``i``, its signal's name and values gone (for :meth:`_col` to give)."""
        name = next(n for n, j in self.cols.items() if j == i)
        del self.cols[name]
        self._retired.pop(i, None)
        self.data[:, i] = NAN
        self._seqs = None  # (their column indices)
        self.reused_signals += 1
        return i

    def _store(self, t0_ns: int, t1_ns: int, idx: list[int], vals: list[float]) -> None:
        row = self._blank[:]
        for i, v in zip(idx, vals):
            row[i] = v
        r = self.rows % self.capacity
        self._t0[r] = t0_ns
        self._t1[r] = t1_ns
        w = self.width
        self._buf[r * w:r * w + w] = row
        self.rows += 1

    def append(self, t0_ns: int, t1_ns: int, values: dict[str, float]) -> None:
        cols = self.cols
        idx: list[int] = []
        vals: list[float] = []
        for name, v in values.items():
            i = cols.get(name)
            if i is None:
                i = self._col(name, idx, t1_ns)
                if i is None:
                    continue
            if v is None:
                continue  # not measured: the row's NaN
            idx.append(i)
            vals.append(v)
        self._store(t0_ns, t1_ns, idx, vals)

    def append_raw(self, t0_ns: int, t1_ns: int, values: dict[str, float | None],
                   tracker: DeltaTracker) -> None:
        """``append(t0, t1, tracker.update(values))`` in one pass over ``values`` (the
        sampler's path: no intermediate dict)."""
        cols = self.cols
        prev = tracker._prev
        kind = tracker._kind
        is_counter = tracker.is_counter
        idx: list[int] = []
        out: list[float] = []
        for name, v in values.items():
            if v is None:
                continue
            c = kind.get(name)
            if c is None:
                c = kind[name] = bool(is_counter(name))
            if c:
                p = prev.get(name)
                prev[name] = v
                if p is None:
                    continue
                if v >= p:
                    v = v - p
                else:
                    v = counter_delta(p, v)
                    if v != v:
                        tracker.resets += 1
            i = cols.get(name)
            if i is None:
                i = self._col(name, idx, t1_ns)
                if i is None:
                    continue
            idx.append(i)
            out.append(v)
        self._store(t0_ns, t1_ns, idx, out)

    def append_seq(self, t0_ns: int, t1_ns: int, keys: tuple[str, ...], vals,
                   tracker: DeltaTracker) -> None:
        """One row of :meth:`append_seqs`."""
        self.append_seqs([(t0_ns, t1_ns, vals)], keys, tracker)

    def append_seqs(self, rows: list[tuple[int, int, tuple]], keys: tuple[str, ...],
                    tracker: DeltaTracker) -> None:
        """``append_raw(t0, t1, dict(zip(keys, vals)), tracker)`` for each ``(t0, t1, vals)``
        of ``rows``, in order (the native sampler's layout rows: ``keys`` is the same tuple
        object batch after batch).

        Fast path, once every counter has a previous value and every key a column: the
        counters' deltas as one ``map(sub, ...)`` against the previous row's values (kept
        here across the batch; the tracker gets them once, at its end) and, when the row's
        columns are contiguous, one slice store (a gauge, when there are any, is stored as
        read). A counter that went backwards (wrap, reset), a NaN, a new key: that row goes
        through ``append_raw``, which defines the semantics (both paths store the same rows,
        tests/test_sampling_sources.py)."""
        f = self._seqs.get(id(keys)) if self._seqs is not None else None
        if f is None or f[0] is not keys or f[1] is not tracker:
            f = self._seq_prepare(keys, tracker)
        if f is None:
            for t0, t1, vals in rows:
                self.append_raw(t0, t1, dict(zip(keys, vals)), tracker)
            return
        _, _, get, c0, ckeys, cidx, cpos, colidx = f
        prev = tracker._prev
        try:
            p = get(prev)
        except KeyError:
            p = None
        cap, w, buf, blank = self.capacity, self.width, self._buf, self._blank
        ta, tb = self._t0, self._t1
        n = self.rows
        dirty = False
        for t0, t1, vals in rows:
            if p is not None:
                cv = vals if cidx is None else cidx(vals)
                d = list(map(sub, cv, p))
                s = sum(d)
                if s == s and min(d) >= 0:
                    p = cv
                    dirty = True
                    if cidx is not None:  # gauges as read, counters as deltas
                        full = list(vals)
                        for j, x in zip(cpos, d):
                            full[j] = x
                        d = full
                    r = n % cap
                    base = r * w
                    buf[base:base + w] = blank
                    if c0 >= 0:
                        buf[base + c0:base + c0 + len(d)] = array("d", d)
                    else:
                        for c, x in zip(colidx, d):
                            buf[base + c] = x
                    ta[r] = t0
                    tb[r] = t1
                    n += 1
                    continue
            if dirty:
                prev.update(zip(ckeys, p))
                dirty = False
            self.rows = n
            self.append_raw(t0, t1, dict(zip(keys, vals)), tracker)
            n = self.rows
            w, buf, blank = self.width, self._buf, self._blank  # a column may have come
            try:
                p = get(prev)
            except KeyError:
                p = None
        if dirty:
            prev.update(zip(ckeys, p))
        self.rows = n

    # (keys, tracker, getter of the counters' previous values, first column (-1: the columns
    #  are not contiguous), counter keys, getter of the counters among a row's values (None:
    #  all counters), their positions, the columns), by id(keys): a collector may alternate
    #  between a few key tuples (sched's rows with and without stat and status)
    _seqs: dict | None = None

    def _seq_prepare(self, keys: tuple[str, ...], tracker: DeltaTracker) -> tuple | None:
        """The fast path's constants for ``keys``, or None (not every key with a column yet,
        or no counter: ``append_raw`` then)."""
        if self._seqs is None or len(self._seqs) > 8:
            self._seqs = {}
        self._seqs.pop(id(keys), None)
        cols, kind = self.cols, tracker._kind
        if not keys or any(k not in cols for k in keys):
            return None
        for k in keys:
            if kind.get(k) is None:
                kind[k] = bool(tracker.is_counter(k))
        pos = tuple(j for j, k in enumerate(keys) if kind[k])
        if not pos:
            return None
        colidx = tuple(cols[k] for k in keys)
        c0 = colidx[0] if colidx == tuple(range(colidx[0], colidx[0] + len(keys))) else -1
        ckeys = tuple(keys[j] for j in pos)

        def getter(idx):
            return itemgetter(*idx) if len(idx) > 1 else (lambda d, i=idx[0]: (d[i],))
        f = self._seqs[id(keys)] = (keys, tracker, getter(ckeys), c0, ckeys,
                                    None if len(pos) == len(keys) else getter(pos), pos,
                                    colidx)
        return f

    def cols_like(self, prefix: str = "", suffixes: tuple[str, ...] = ()) -> list[tuple[str, int]]:
        """(name, column) of every signal named ``prefix``… (and …one of ``suffixes`` when
        given), in column order; kept until a column is added or given to another signal
        (:attr:`layout`), so the rules that weigh "every IRQ row of CPU 3" do not test each
        name per spike."""
        like = self._like
        if self._like_n != self.layout:
            like.clear()
            self._like_n = self.layout
        key = (prefix, suffixes)
        got = like.get(key)
        if got is None:
            # (a copy first, made in one C call: the sampler's thread adds columns and
            # gives them away while the attribution reads)
            got = like[key] = sorted(
                ((n, i) for n, i in list(self.cols.items()) if n.startswith(prefix)
                 and (not suffixes or n.endswith(suffixes))), key=itemgetter(1))
        return got

    def cols_at(self, prefix: str) -> tuple[list[str], np.ndarray | slice]:
        """:meth:`cols_like`'s names and their columns, as a slice where they are
        contiguous (the usual case: a collector adds a CPU's rows together), else an index
        array; kept as :meth:`cols_like` is."""
        key = (prefix, None)
        got = self._like.get(key) if self._like_n == self.layout else None
        if got is None:
            like = self.cols_like(prefix)
            at = [i for _, i in like]
            cols: np.ndarray | slice = slice(at[0], at[-1] + 1) \
                if at and at == list(range(at[0], at[-1] + 1)) else np.array(at, dtype=np.intp)
            got = self._like[key] = ([n for n, _ in like], cols)
        return got

    def _order(self) -> np.ndarray:
        n = min(self.rows, self.capacity)
        return (np.arange(self.rows - n, self.rows) % self.capacity).astype(np.int64)

    @property
    def latest_t1(self) -> int:
        return int(self.t1[(self.rows - 1) % self.capacity]) if self.rows else 0

    def window(self, t_from: int, t_to: int) -> np.ndarray:
        """Ring indices (chronological) of rows whose interval overlaps [t_from, t_to]. Rows
        appended in time order (every sampler's: :meth:`_in_order`) are found by binary
        search on each of the ring's two segments, not by a pass over all of them (the
        attribution asks each ring once per spike: issue #38)."""
        sp = self.span(t_from, t_to)
        if sp is None:
            idx = self._order()
            return idx[(self.t1[idx] >= t_from) & (self.t0[idx] <= t_to)]
        return self.indices(sp)

    def indices(self, span: tuple[int, int]) -> np.ndarray:
        """The ring indices of a :meth:`span`."""
        first, count = span
        if first + count <= self.capacity:
            return np.arange(first, first + count, dtype=np.int64)
        return np.arange(first, first + count, dtype=np.int64) % self.capacity

    def span(self, t_from: int, t_to: int) -> tuple[int, int] | None:
        """(physical index of the first, count) of the rows :meth:`window` returns — they
        are consecutive modulo the capacity — or None for a ring whose rows are not in time
        order. Two ints: the attribution's key for a view it made already."""
        n = min(self.rows, self.capacity)
        if not n:
            return 0, 0
        if not self._in_order():
            return None
        # (bisect on the int64 arrays behind t0/t1: a dozen plain-int probes cost less than
        # numpy's searchsorted wrappers, four of them per ring per spike in a storm)
        t0, t1, cap = self._t0, self._t1, self.capacity
        if self.rows <= cap:
            lo = bisect_left(t1, t_from, 0, n)
            return lo, max(0, bisect_right(t0, t_to, 0, n) - lo)
        r = self.rows % cap  # the oldest row; logical j is physical (r + j) % cap
        lo = bisect_left(t1, t_from, r, cap) - r + bisect_left(t1, t_from, 0, r)
        hi = bisect_right(t0, t_to, r, cap) - r + bisect_right(t0, t_to, 0, r)
        return (r + lo) % cap, max(0, hi - lo)

    _checked = 0  # rows whose order :meth:`_in_order` has checked
    _unordered = False  # a row started or ended before its predecessor (then: full passes)

    def _in_order(self) -> bool:
        """Whether every held row's t0 and t1 are ≥ its predecessor's (checked for the rows
        written since the last call only)."""
        if self._unordered:
            return False
        if self._checked < self.rows:
            first = max(self._checked - 1, self.rows - self.capacity, 0)
            # (plain ints: a look finds a few new rows, where numpy's arange and diffs cost
            # as much as the pass they save; a whole ring once is ~1 ms)
            cap, a, b = self.capacity, self._t0, self._t1
            p = first % cap
            for j in range(first + 1, self.rows):
                k = j % cap
                if a[k] < a[p] or b[k] < b[p]:
                    self._unordered = True
                    return False
                p = k
            self._checked = self.rows
        return True

    def column(self, name: str, idx: np.ndarray) -> np.ndarray:
        i = self.cols.get(name)
        if i is None:
            return np.full(len(idx), np.nan)
        return self.data[idx, i]

    def dump(self, t_from: int, t_to: int) -> dict:
        """Rows in [t_from, t_to] as JSON-ready lists (for the flight recorder)."""
        idx = self.window(t_from, t_to)
        sig = {}
        for name, i in list(self.cols.items()):
            col = self.data[idx, i]
            if np.isnan(col).all():
                continue
            sig[name] = [None if v != v else float(v) for v in col]
        return {"t0_ns": self.t0[idx].tolist(), "t1_ns": self.t1[idx].tolist(), "signals": sig}

    def nbytes(self) -> int:
        return self.data.nbytes + self.t0.nbytes + self.t1.nbytes


class LatencyRing:
    """The last ``capacity`` latency records (client ring rows) for rolling statistics and the
    flight recorder."""

    def __init__(self, capacity: int = 20000, width: int = 14) -> None:
        self.capacity = capacity
        self.data = np.zeros((capacity, width), dtype=np.int64)
        self.rows = 0

    def extend(self, recs: np.ndarray) -> None:
        n = len(recs)
        if not n:
            return
        if n >= self.capacity:
            recs = recs[-self.capacity:]
            n = self.capacity
        start = self.rows % self.capacity
        first = min(n, self.capacity - start)
        self.data[start:start + first] = recs[:first]
        if first < n:
            self.data[:n - first] = recs[first:]
        self.rows += len(recs) if len(recs) < self.capacity else self.capacity

    def last(self, n: int) -> np.ndarray:
        n = min(n, self.rows, self.capacity)
        idx = (np.arange(self.rows - n, self.rows) % self.capacity)
        return self.data[idx]
