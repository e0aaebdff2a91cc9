"""Reading a window of events from the probe CPUs' rings: drain ``trace_pipe_raw`` into kept
pages, then give the events of ``[t_from, t_to]`` (plus who was running when it opened and,
when asked, when it closed) as a :class:`Window`.

Reading (:class:`WindowReader`, mixed into :class:`agent.trace.tracefs.EventSource`):
``per_cpu/cpuN/trace_pipe_raw`` (binary ring-buffer pages, consuming), drained non-blocking
only when a window is asked for; the pages drained are kept, raw, for ``keep_s`` seconds
(``buffer_s`` by default; bounded in bytes) so that windows overlapping an earlier read
still find their events, and only the pages that overlap a window are read: the first
found by bisecting the kept pages' timestamps; each page's record headers are walked once
into a PageIndex (pages.py) that the next windows over it bisect, and its records are
decoded once each (identical records once per format: EventFormat.make_event's memo), the
last :data:`INDEXED_PAGES` per CPU staying indexed; the last ``sched_switch`` before the
window comes from the first page's index, else from the pages before it back to that
switch, each page's last switch remembered once walked. So a read costs the window's pages
and records, not the event rate or the time since the last read (``Window.walked`` /
``Window.decoded`` count it; tests/test_trace_window_work.py): a spike window of a few ms
costs ~0.1 ms of CPU with ~50 events, ~0.5-1 ms with ~800 under a softirq flood
(bench/events_read_cost.py --windows). The instance's ``trace`` file is not used where the
binary layout is readable: it formats the whole buffer on every read — 0.28 s of kernel
time for an 8 MiB buffer (186k events) on a 2-vCPU guest against 2 ms to drain the same
buffer raw (docs/events.md, bench/events_read_cost.py). It is the fallback reader
(``reader="text"``, :mod:`.text`) where ``events/header_page`` / ``header_event`` describe a
layout the binary parser does not know.

Bounded memory whatever the event rate: the kernel ring has a fixed size; a storm
overwrites its oldest pages and the next read reports them as lost (``RB_MISSED_EVENTS``),
which moves the CPU's "continuous since" mark forward: a window that starts before the
mark is returned incomplete, with the reason, never guessed at. Kept pages are capped per
CPU; eviction moves the mark too.
"""

from __future__ import annotations

import errno
import os
import time
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

from .event import Event, EventFormat, FormatError
from .pages import (
    Page,
    PageLayout,
    decode_record,
    iter_page,
    page_index,
    page_info,
    page_last_of,
    page_last_ts,
    page_may_hold,
)
from .symbols import SymbolResolver
from .text import TextStats, parse_text

# Pages per probe CPU that keep their PageIndex (header walk + the events decoded from
# them, ~50-100 KiB each): the pages of the last few windows, so that overlapping windows
# (a burst of spikes) decode each record once.
INDEXED_PAGES = 32


@dataclass
class Window:
    """The events of the probe CPUs between ``t_from_ns - margin`` and ``t_to_ns``, sorted
    by time (plus, per CPU, the last ``sched_switch`` before that where the kept pages have
    one: who was running when the window opened; and, when the read asked for it, the first
    event after ``t_to_ns``: who was running when it closed).

    ``complete`` is False when events of ``[t_from_ns, t_to_ns]`` may be missing (``reason``
    says which CPU, since when and why: lost in a storm, evicted, before the instance
    started, or after the read); ``lost`` counts the events the kernel reported lost before
    pages this read touched. ``read_ns``: how long the call took (drain + decode + comms),
    wall clock; ``cpu_ns``: the CPU time the calling thread spent in it (what the read
    costs: on a loaded host ``read_ns`` also counts the time the thread waited to run).
    ``walked`` / ``decoded``: the pages whose record headers this read walked and the
    records it decoded (raw reader; pages and records an earlier window read are not
    counted again while their page stays indexed). The events are shared with other
    windows: read-only."""

    t_from_ns: int
    t_to_ns: int
    events: list[Event]
    complete: bool = True
    reason: str | None = None
    lost: int = 0
    read_ns: int = 0
    # pid -> comm for the tasks the events do not name themselves (an event carries only
    # common_pid): read from /proc/<pid>/comm when the window was read
    comms: dict[int, str] = field(default_factory=dict)
    cpu_ns: int = 0
    walked: int = 0  # the read's work (see above)
    decoded: int = 0
    # the wake instance's part (wake-ups and signals on the other CPUs, from
    # WAKE_LOOKBACK_NS before the window): False with the reason when it may lack some (not
    # running on this kernel, its ring overwritten); the events are in ``events``
    wake_complete: bool = True
    wake_reason: str | None = None


def page_ts(page: Page) -> int:
    return page.ts_ns


event_ts = attrgetter("ts_ns")  # (the sort key of a window's events: C, not a Python call)


def named_pids(events: list[Event]) -> set[int]:
    """The pids the events name with a comm (switch, wake-up, migration)."""
    out: set[int] = set()
    for ev in events:
        f = ev.fields
        if ev.name == "sched_switch":
            out.update((f.get("prev_pid", -1), f.get("next_pid", -1)))
        elif "comm" in f and "pid" in f:
            out.add(f["pid"])
    return out


@dataclass
class _CpuRing:
    cpu: int
    fd: int = -1
    pages: deque = field(default_factory=deque)  # Page, oldest first
    kept_bytes: int = 0
    cover_from_ns: int = 0  # events are continuous from here on (see module docstring)
    cover_reason: str = "before the instance started"
    lost: int = 0  # events the kernel reported lost, in total
    evicted_pages: int = 0
    indexed: deque = field(default_factory=deque)  # Page with an index, oldest first
    keep_bytes: int = 0  # the kept pages' bound (0: the source's keep_bytes)


def _read_page(fd: int, size: int) -> bytes | None:
    """One page of a ring's trace_pipe_raw (opened non-blocking), an interrupted read tried
    again; None when the ring has no full page now (empty, would block, or an error)."""
    while True:
        try:
            return os.read(fd, size) or None
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno != errno.EINTR:
                return None


def _close_rings(rings) -> None:
    """Close each ring's trace_pipe_raw and drop its kept pages (idempotent)."""
    for ring in rings:
        if ring.fd >= 0:
            try:
                os.close(ring.fd)
            except OSError:
                pass
            ring.fd = -1
        ring.pages.clear()
        ring.indexed.clear()
        ring.kept_bytes = 0


class WindowReader:
    """The page reading of :class:`agent.trace.tracefs.EventSource` (module docstring): owns
    the kept pages per CPU (``_rings``), the event formats and the symbol table the pages
    are decoded with. Uses, from the source it is mixed into: ``reader``, ``cpus``,
    ``path``, ``host``, ``buffer_kb``, ``started_ns``, ``_closed``, :meth:`cpu_stats`, and
    the wake instance's rings (``_wake_rings``, drained and evicted with the main ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.page_size = 4096
        self.keep_ns = 0
        self.keep_bytes = 0
        self._layout = PageLayout()
        self._formats: dict[int, EventFormat] = {}
        self._names: set[str] = set()
        self._switch_ids: set[int] = set()
        self._comm_cache: dict[int, str] = {}
        self._rings: dict[int, _CpuRing] = {}
        self._symbols: SymbolResolver | None = None
        self.drained_ns = 0  # (CLOCK_MONOTONIC) the last drain's

    def _page_events(self, ring: _CpuRing, pg: Page, ids: frozenset[int], lo: int, hi: int,
                     before: bool, store: bool) -> tuple[list[Event], object, int, bool]:
        """One kept page's events in [lo, hi] through its PageIndex (walked once, then kept
        hot): (events, the switch before them when ``before``, records decoded, whether the
        page was walked now). Both instances' windows read pages through it."""
        idx, made = page_index(pg, ids, self._layout)
        if made:
            self._hot(ring, pg)
        got, b, k = idx.select(pg.data, ring.cpu, self._formats, lo, hi, self._symbols,
                               before=before, store=store)
        return got, b, k, made

    def _fill_comms(self, win: Window, limit: int = 256) -> None:
        """``win.comms``: the comm of each task current in an event that no event names
        (a waker or a signal's sender on another CPU). Names as seen: a task's own
        ``sched_process_exit`` (the wake instance records every exit) in the window, else
        /proc/PID/comm now (cached), else its exit after the window (:meth:`_exit_comms`);
        only a task gone before any of these shows as "?[pid]" in the timeline."""
        for e in win.events:
            if e.name == "sched_process_exit" and isinstance(e.fields.get("pid"), int):
                win.comms.setdefault(e.fields["pid"], e.fields.get("comm", "?"))
        named = named_pids([e for e in win.events if e.name != "sched_process_exit"])
        gone: set[int] = set()
        for pid in sorted({e.pid for e in win.events} - named - set(win.comms) - {0})[:limit]:
            comm = self._comm_cache.get(pid)
            if comm is None:
                comm = self.host.read(self.host.proc(pid, "comm")).value if self.host else None
                if comm is None:
                    gone.add(pid)
                    continue
                if len(self._comm_cache) > 4096:
                    self._comm_cache.clear()
                self._comm_cache[pid] = comm
            win.comms[pid] = comm
        if gone:
            win.comms.update(self._exit_comms(gone, win.t_to_ns))

    def drain(self) -> int:
        """Move every page the kernel holds for the probe CPUs into the kept pages (raw
        reader); returns the number of pages read. Bounded: at most the ring's pages plus
        a margin per CPU per call, whatever the rate."""
        if self._closed or self.reader != "raw":
            return 0
        self.drained_ns = time.monotonic_ns()
        total = 0
        newest = 0
        for ring in (*self._rings.values(), *self._wake_rings.values()):
            n = 0
            cap = (ring.keep_bytes or self.buffer_kb * 1024) // self.page_size + 64
            while n < cap:
                buf = _read_page(ring.fd, self.page_size)
                if buf is None:
                    break
                n += 1
                try:
                    ts, _size, lost = page_info(buf, self._layout)
                except FormatError:
                    continue
                if lost:
                    ring.lost += max(lost, 0)
                    ring.cover_from_ns = ts
                    ring.cover_reason = ("events lost (ring overwritten)" if lost > 0 else
                                         "events lost (count unknown)")
                ring.pages.append(Page(ring.cpu, ts, buf, lost))
                ring.kept_bytes += len(buf)
                newest = max(newest, ts)
            total += n
        self._evict(newest or time.monotonic_ns())
        return total

    def _evict(self, newest_ns: int) -> None:
        for ring in (*self._rings.values(), *self._wake_rings.values()):
            pages = ring.pages
            limit = ring.keep_bytes or self.keep_bytes
            while pages and (ring.kept_bytes > limit or
                             (len(pages) > 1 and pages[1].ts_ns < newest_ns - self.keep_ns)):
                old = pages.popleft()
                ring.kept_bytes -= len(old.data)
                ring.evicted_pages += 1
                mark = pages[0].ts_ns if pages else page_last_ts(old.data, self._layout) + 1
                if mark > ring.cover_from_ns:
                    ring.cover_from_ns = mark
                    ring.cover_reason = "older events no longer kept"

    def _window_raw(self, t_from: int, lo: int, hi: int, after_ns: int = 0) -> Window:
        per_cpu: list[list[Event]] = []
        complete, reason, lost = True, None, 0
        ids = frozenset(self._switch_ids)
        # events decoded now are kept on their page's index for the next window, except
        # while symbol names may still be hex (kallsyms not loaded yet)
        store = self._symbols is None or self._symbols.ready
        walked = decoded = 0
        for ring in self._rings.values():
            pages = ring.pages
            n = len(pages)
            # the first page that can hold an event at or after lo: the one before the
            # first page starting at or after lo (kept pages are in time order)
            i = max(0, bisect_left(pages, lo, key=page_ts) - 1)
            evs: list[Event] = []
            first = None
            before = None
            while i < n:
                pg = pages[i]
                if pg.ts_ns > hi:
                    break
                got, b, k, made = self._page_events(ring, pg, ids, lo, hi, first is None,
                                                    store)
                walked += made
                if first is None:
                    first = i
                    lost += max(pg.lost, 0)
                    before = b
                decoded += k
                evs.extend(got)
                i += 1
            if after_ns > 0:
                nxt = self._first_after(ring, max(i - 1, 0), hi, hi + after_ns, ids)
                if nxt is not None:
                    evs.append(nxt)
            # who ran before lo: in the first page's walk, else back from the page before
            if before is not None:
                prelude = before
            else:
                prelude, w = self._last_switch_before(ring.cpu, pages, first, lo,
                                                      skip_first=first is not None)
                walked += w
            if prelude is not None:
                evs.insert(0, prelude)
            per_cpu.append(evs)
            if ring.cover_from_ns > t_from and complete:
                complete = False
                reason = (f"cpu {ring.cpu}: {ring.cover_reason}; events continuous only "
                          f"from {(ring.cover_from_ns - t_from) / 1e3:.0f} µs after the "
                          "window's start")
                if ring.lost and "lost" not in ring.cover_reason:
                    reason += f" ({ring.lost} events lost to ring overwrites so far)"
        events = [e for evs in per_cpu for e in evs]
        events.sort(key=event_ts)
        return Window(t_from, hi, events, complete, reason, lost, walked=walked,
                      decoded=decoded)

    def _first_after(self, ring: _CpuRing, i: int, t: int, t_max: int,
                     ids: frozenset[int]) -> Event | None:
        """The ring's first event with ``t < ts <= t_max``, from its kept page ``i`` on (the
        window's last page: the one that may hold records past ``t``)."""
        pages = ring.pages
        while i < len(pages):
            pg = pages[i]
            if pg.ts_ns > t_max:
                return None
            idx, made = page_index(pg, ids, self._layout)
            if made:
                self._hot(ring, pg)
            ev = idx.first_after(pg.data, ring.cpu, self._formats, t, t_max, self._symbols)
            if ev is not None:
                return ev
            i += 1
        return None

    def _hot(self, ring: _CpuRing, pg: Page) -> None:
        """``pg`` now has an index: the newest of the ring's indexed pages; the oldest
        beyond :data:`INDEXED_PAGES` drop theirs (memory stays bounded at any rate)."""
        hot = ring.indexed
        hot.append(pg)
        while len(hot) > INDEXED_PAGES:
            hot.popleft().index = None

    def _last_switch_before(self, cpu: int, pages, first: int | None, lo: int,
                            max_pages: int = 64, *, skip_first: bool = False
                            ) -> tuple[Event | None, int]:
        """(the last sched_switch on ``cpu`` before ``lo`` in the kept pages, the pages
        whose headers were walked for it): searching back at most ``max_pages`` pages from
        the window's first page ``first``, that page included (``skip_first``: its walk
        found none already), and no further back than that switch: the task current when
        the window opened. A page with no switch record at all is passed over without
        walking it (page_may_hold: a byte search); one whose records all precede ``lo``
        answers from one header walk remembered on it (page_last_of; its index where it has
        one), as the walk below would. So under a flood that leaves the CPU's task running
        (no switch for many pages) the search costs a byte search per page."""
        end = len(pages) if first is None else first + 1
        ids = frozenset(self._switch_ids)
        walked = 0
        for i in range(end - 1, max(-1, end - 1 - max_pages), -1):
            if skip_first and i == first:
                continue
            pg = pages[i]
            if ids not in pg.memo and (pg.index is None or pg.index.ids != ids):
                if not page_may_hold(pg.data, ids, self._layout):
                    continue  # no switch in it: neither the memo nor the walk finds one
                walked += 1
            rec, latest = page_last_of(pg, ids, self._layout)
            if latest < lo:
                if rec is None:
                    continue
                ev = decode_record(pg.data, cpu, self._formats, rec, self._symbols)
                if ev is not None and ev.name == "sched_switch":
                    return ev, walked
            best = None
            walked += 1
            for ev in iter_page(pg.data, cpu, self._formats, layout=self._layout,
                                t_to=lo - 1, symbols=self._symbols, only=self._switch_ids):
                if ev.name == "sched_switch":
                    best = ev
            if best is not None:
                return best, walked
        return None, walked

    def _window_text(self, t_from: int, lo: int, hi: int, after_ns: int = 0) -> Window:
        events: list[Event] = []
        complete, reason, lost = True, None, 0
        for c in self.cpus:
            st = TextStats()
            pdir = self.path / "per_cpu" / f"cpu{c}"
            try:
                with open(pdir / "trace", encoding="utf-8", errors="replace") as fh:
                    got = parse_text(fh, self._names, t_from=lo, t_to=hi + after_ns, stats=st)
                    got = sorted(got, key=event_ts)
                    k = bisect_right(got, hi, key=event_ts)
                    events.extend(got[:k + 1] if after_ns > 0 else got[:k])
            except OSError as exc:
                return Window(t_from, hi, [], False, f"cannot read {pdir}/trace: {exc}")
            lost += sum(st.lost.values())
            cs = self.cpu_stats(c)
            oldest = cs.oldest_ns if cs.oldest_ns is not None else self.started_ns
            start = oldest if cs.overrun else self.started_ns
            if start > t_from and complete:
                complete = False
                reason = (f"cpu {c}: ring overwritten; oldest event "
                          f"{(start - t_from) / 1e3:.0f} µs after the window's start")
        events.sort(key=lambda e: e.ts_ns)
        return Window(t_from, hi, events, complete, reason, lost)
