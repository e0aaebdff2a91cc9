"""The work of an EventSource window read is bounded by the window, not by the event rate
or the pages kept: the pages it covers are walked once (and stay indexed for the next
windows, at most INDEXED_PAGES per CPU), each record decoded at most once while indexed,
and the search back for the task current at the window's start stops at the last
sched_switch before it. Counted (Window.walked / Window.decoded), not timed. Also: the
record memo of EventFormat.make_event and the page index give exactly what the plain decode
(EventFormat.decode + normalize) and scan_page give."""

from __future__ import annotations

import random
import threading

from agent.trace.event import Event, normalize
from agent.trace.pages import (
    Page,
    PageIndex,
    PageLayout,
    _records,
    page_info,
    page_may_hold,
    scan_page,
)
from agent.trace.symbols import SymbolResolver
from agent.trace.window import INDEXED_PAGES
from tests.eventpages import FIXTURE, PageWriter, load_formats, payload
from tests.test_trace_window import (
    BY_ID,
    FMTS,
    SWITCH,
    fixture_pages,
    reference_window,
    same,
    source_over,
    sparse_ring,
)

IDS = frozenset(SWITCH)


def flood_ring(n_pages: int, seed: int = 11) -> list[Page]:
    """Softirq NET_RX entry/exit pairs 1-2 µs apart in one task (identical records, as under
    a softirq flood), one sched_switch per page: ~200 records a page."""
    rng = random.Random(seed)
    sw, ent, ex = FMTS["sched_switch"], FMTS["softirq_entry"], FMTS["softirq_exit"]
    pages, ts = [], 5_000_000_000
    for k in range(n_pages):
        w = PageWriter(ts)
        for j in range(100):
            ts += 1_000 + rng.randrange(0, 1_000)
            w.event(ts, payload(ent, 77, vec=3))
            ts += 500
            w.event(ts, payload(ex, 77, vec=3))
            if j == 50:
                ts += 300
                w.event(ts, payload(sw, 77, prev_comm="probe", prev_pid=77, prev_prio=120,
                                    prev_state=1, next_comm=f"t{k}", next_pid=1000 + k,
                                    next_prio=120))
        buf = w.build()
        pages.append(Page(1, page_info(buf)[0], buf, 0))
        ts += 2_000
    return pages


def records(pg: Page) -> int:
    return sum(1 for r in _records(pg.data, PageLayout()) if r[2] >= 8)


def window_over(pages: list[Page], first: int, last: int, at: int = 150_000
                ) -> tuple[int, int]:
    """A window from inside page ``first`` to inside page ``last`` (``at`` ns into each:
    150 µs is after the page's switch, 40 µs before it)."""
    return pages[first].ts_ns + at, pages[last].ts_ns + at


def test_a_windows_work_is_its_pages_whatever_the_pages_kept():
    short, long_ = flood_ring(100), flood_ring(1500)
    lo, hi = window_over(short, 50, 53)
    assert window_over(long_, 50, 53) == (lo, hi)  # the same pages in both
    got = {}
    for name, pages in (("short", short), ("long", long_)):
        src = source_over(pages, 1)
        win = src._window_raw(lo, lo, hi)
        want, _lost, _unknown = reference_window(pages, 1, lo, hi)
        assert same(win.events, want)
        got[name] = (win.walked, win.decoded, len(win.events))
    assert got["short"] == got["long"]
    walked, decoded, n = got["long"]
    # pages 50-53 (the bisection starts on the page holding lo): nothing else walked, the
    # switch before lo is in page 50's own walk; records decoded: those pages' at most
    assert walked == 4
    assert n <= decoded <= sum(records(p) for p in short[50:54])
    assert n > 500
    # a window opening before its first page's switch: one page back (page 49's switch)
    lo, hi = window_over(long_, 50, 53, at=40_000)
    win = source_over(long_, 1)._window_raw(lo, lo, hi)
    assert win.walked == 5 and win.events[0].fields["next_pid"] == 1049


def test_overlapping_windows_decode_each_record_once():
    pages = flood_ring(300)
    src = source_over(pages, 1)
    lo, hi = window_over(pages, 100, 102)
    first = src._window_raw(lo, lo, hi)
    # the next spike's window overlaps: the shared pages are neither walked nor decoded again
    lo2, hi2 = window_over(pages, 101, 103)
    second = src._window_raw(lo2, lo2, hi2)
    want, _, _ = reference_window(pages, 1, lo2, hi2)
    assert same(second.events, want)
    assert second.walked == 1  # page 103, beyond the first window's
    # each record decoded once over both windows (plus each window's prelude switch)
    kept = src._rings[1].pages
    assert first.decoded + second.decoded <= sum(records(kept[k]) for k in range(100, 104)) + 2
    assert second.decoded <= len(second.events) // 2 + 2  # half of it was the first's
    # the same window again: nothing walked, nothing decoded (a prelude record at most)
    again = src._window_raw(lo, lo, hi)
    assert same(again.events, first.events) and again.walked == 0 and again.decoded <= 1


def test_the_search_back_stops_at_the_last_switch():
    pages = sparse_ring()  # switches on pages 0, 5, 30, 31 only
    src = source_over(pages, 1)
    # page 20: its walk, then back to page 5's switch: pages 19..6 hold no switch record
    # (a byte search says so, no header walk), page 5's headers are walked
    t = pages[20].ts_ns + 50_000
    win = src._window_raw(t, t, t + 40_000)
    assert win.events[0].name == "sched_switch" and win.events[0].fields["next_pid"] == 105
    assert win.walked == 1 + 1
    # a window on page 21 walks its own page only: 20 is indexed, 5 answers from its memo
    t = pages[21].ts_ns + 50_000
    assert src._window_raw(t, t, t + 40_000).walked == 1
    # page 100: no switch within 64 pages (30 and 31 are further back): none found, and
    # nothing walked but the window's pages (99, whose end is the bisection's start, and 100)
    t = pages[100].ts_ns
    win = src._window_raw(t, t, t + 30_000)
    assert all(e.name != "sched_switch" for e in win.events) and win.walked == 2


def test_the_byte_search_never_misses_a_switch():
    layout = PageLayout()
    seen = {True: 0, False: 0}
    for pages in (fixture_pages(), sparse_ring(), flood_ring(20)):
        for pg in pages:
            has = any((pg.data[r[1]] | (pg.data[r[1] + 1] << 8)) in IDS
                      for r in _records(pg.data, layout) if r[2] >= 8)
            may = page_may_hold(pg.data, IDS, layout)
            assert may or not has
            seen[may] += 1
    assert seen[False] > 100 and seen[True] > 20  # it does pass pages over


def test_indexed_pages_are_bounded_per_cpu():
    pages = flood_ring(200)
    src = source_over(pages, 1)
    for k in range(0, 198, 2):
        lo, hi = window_over(pages, k, k + 1)
        src._window_raw(lo, lo, hi)
    kept = src._rings[1].pages
    assert sum(p.index is not None for p in kept) == len(src._rings[1].indexed) \
        == INDEXED_PAGES
    # a page whose index was dropped is answered again, the same way
    lo, hi = window_over(pages, 3, 5)
    assert same(src._window_raw(lo, lo, hi).events, reference_window(pages, 1, lo, hi)[0])


def plain_event(fmt, buf, start, length, ts, cpu, symbols) -> Event:
    pid, fields = fmt.decode(buf, start, length)
    return Event(ts, cpu, fmt.name, pid, normalize(fmt.name, fields, fmt, symbols))


def test_the_record_memo_gives_the_plain_decode():
    res = SymbolResolver(lambda: (FIXTURE / "kallsyms").read_bytes())
    res(0)  # loaded
    fmts = {f.id: f for f in load_formats().values()}
    n = 0
    for _rnd in range(2):  # the second round answers from the memo
        for pg in fixture_pages():
            for ts, start, length in _records(pg.data, PageLayout()):
                fmt = fmts.get(pg.data[start] | (pg.data[start + 1] << 8)) if length >= 8 \
                    else None
                if fmt is None:
                    continue
                got = fmt.make_event(pg.data, start, length, ts, 1, res)
                assert got == plain_event(fmt, pg.data, start, length, ts, 1, res)
                n += 1
    assert n > 2000
    names = {f.name for f in fmts.values()}
    assert {"workqueue_execute_start", "ipi_send_cpu"} <= names


def test_symbol_names_are_not_remembered_before_the_table_is_loaded():
    fmt = load_formats()["ipi_send_cpu"]
    fmt = type(fmt)(fmt.id, fmt.system, fmt.name, fmt.fields, fmt.symbols, fmt.flags,
                    fmt.pid_offset)
    addr = 0xffffffff815d6170
    rec = payload(fmt, 5, cpu=1, callsite=addr, callback=addr)
    gate = threading.Event()

    def slow_read():
        gate.wait(5)
        return b"ffffffff815d6170 t vmstat_update\n"

    res = SymbolResolver(slow_read, wait_s=0.01)
    res.load_async()
    early = fmt.make_event(rec, 0, len(rec), 1, 0, res)
    assert early.fields["callback"] == hex(addr) and not res.ready
    gate.set()
    for _ in range(500):
        if res.ready:
            break
        threading.Event().wait(0.01)
    late = fmt.make_event(rec, 0, len(rec), 2, 0, res)
    assert late.fields["callback"] == "vmstat_update"
    # a plain callable is never remembered: its answer may change
    names = iter(("a", "b", "c", "d"))
    fresh = type(fmt)(fmt.id, fmt.system, fmt.name, fmt.fields, fmt.symbols, fmt.flags,
                      fmt.pid_offset)
    one = fresh.make_event(rec, 0, len(rec), 3, 0, lambda a: next(names))
    two = fresh.make_event(rec, 0, len(rec), 4, 0, lambda a: next(names))
    assert one.fields["callback"] != two.fields["callback"]


def test_the_page_index_selects_as_scan_page_does_on_an_unordered_page():
    sw, ent = FMTS["sched_switch"], FMTS["irq_handler_entry"]
    t0 = 1_000_000
    w = PageWriter(t0)
    sw_rec = payload(sw, 1, prev_comm="a", prev_pid=1, prev_prio=120, prev_state=0,
                     next_comm="b", next_pid=2, next_prio=120)
    for k in range(5):
        w.event(t0 + 100 * k, sw_rec if k == 2 else payload(ent, 1, irq=k, name="x"))
    w.time_stamp(t0 + 150)  # the clock goes back (never seen on a kernel; handled)
    for k in range(5):
        w.event(t0 + 150 + 100 * k, sw_rec if k == 3 else payload(ent, 1, irq=10 + k,
                                                                   name="y"))
    buf = w.build()
    idx = PageIndex(buf, IDS, PageLayout())
    assert not idx.ordered
    stamps = sorted({r[0] for r in idx.recs} | {t0 - 1, t0 + 1000})
    for lo in stamps:
        for hi in stamps:
            for store in (True, False):
                got, before, _n = idx.select(buf, 1, BY_ID, lo, hi, before=True, store=store)
                want, want_before = scan_page(buf, 1, BY_ID, t_from=lo, t_to=hi,
                                              before_ids=IDS)
                assert same(got, want) and before == want_before, (lo, hi, store)
    # and on an ordered page, with unknown ids among the records
    w = PageWriter(t0)
    for k in range(30):
        data = payload(ent, 1, irq=k, name="z") if k % 7 else \
            b"\xff\xff" + payload(ent, 1, irq=k, name="z")[2:]
        w.event(t0 + 10 * k, sw_rec if k % 9 == 4 else data)
    buf = w.build()
    idx = PageIndex(buf, IDS, PageLayout())
    assert idx.ordered
    rng = random.Random(5)
    for _ in range(300):
        lo = t0 + rng.randrange(-20, 320)
        hi = lo + rng.randrange(-5, 200)
        got, before, _n = idx.select(buf, 1, BY_ID, lo, hi, before=True)
        want, want_before = scan_page(buf, 1, BY_ID, t_from=lo, t_to=hi, before_ids=IDS)
        assert same(got, want) and before == want_before, (lo, hi)
