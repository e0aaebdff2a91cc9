"""EventSource's window reads over kept pages: the fast path (bisect to the first page, one
header walk of it for both the window and the switch before it, page memos for the search
back, one-unpack decoding) gives exactly the events the straightforward reading gives —
every page in turn through iter_page, then iter_page again page by page backwards for the
last sched_switch — on the captured pages of tests/fixtures/events and on synthetic rings
whose switches are sparse (the search back crosses many pages, or runs out)."""

from __future__ import annotations

import dataclasses
import random
from collections import deque

from agent.trace import tracefs as tfs
from agent.trace.pages import Page, iter_page, page_info
from agent.trace.window import _CpuRing
from tests.eventpages import FIXTURE, PageWriter, load_formats, payload

FMTS = load_formats()
BY_ID = {f.id: f for f in FMTS.values()}
SWITCH = {FMTS["sched_switch"].id}


def reference_window(pages: list[Page], cpu: int, lo: int, hi: int, max_pages: int = 64):
    """The events of [lo, hi] and the last switch before lo, read the plain way (the
    reading agent/trace/tracefs.py did before its fast path)."""
    evs, first, lost, unknown = [], None, 0, [0]
    for i, pg in enumerate(pages):
        nxt = pages[i + 1].ts_ns if i + 1 < len(pages) else None
        if nxt is not None and nxt < lo:
            continue
        if pg.ts_ns > hi:
            break
        if first is None:
            first = i
            lost += max(pg.lost, 0)
        evs.extend(iter_page(pg.data, cpu, BY_ID, t_from=lo, t_to=hi, unknown=unknown))
    end = len(pages) if first is None else first + 1
    prelude = None
    for i in range(end - 1, max(-1, end - 1 - max_pages), -1):
        best = None
        for ev in iter_page(pages[i].data, cpu, BY_ID, t_to=lo - 1, only=SWITCH):
            if ev.name == "sched_switch":
                best = ev
        if best is not None:
            prelude = best
            break
    if prelude is not None:
        evs.insert(0, prelude)
    evs.sort(key=lambda e: e.ts_ns)
    return evs, lost, unknown[0]


def source_over(pages: list[Page], cpu: int) -> tfs.EventSource:
    """An EventSource whose kept pages are ``pages`` (no tracefs: nothing to drain)."""
    src = tfs.EventSource()
    src._closed = False
    src.reader = "raw"
    src._formats = BY_ID
    src._switch_ids = set(SWITCH)
    src.keep_ns = src.keep_bytes = 1 << 62
    ring = _CpuRing(cpu)
    ring.pages = deque(Page(p.cpu, p.ts_ns, p.data, p.lost) for p in pages)
    ring.cover_from_ns = 0
    src._rings = {cpu: ring}
    return src


def same(got, want) -> bool:
    key = lambda evs: [(e.ts_ns, e.cpu, e.name, e.pid, e.fields) for e in evs]  # noqa: E731
    return key(got) == key(want)


def fixture_pages() -> list[Page]:
    data = (FIXTURE / "pages.bin").read_bytes()
    out = []
    for i in range(0, len(data), 4096):
        buf = data[i:i + 4096]
        ts, _size, lost = page_info(buf)
        out.append(Page(1, ts, buf, lost))
    return out


def sparse_ring(n_pages: int = 120, switch_pages=(0, 5, 30, 31), seed: int = 7) -> list[Page]:
    """Pages of IRQ entry/exit pairs 10 µs apart, with sched_switches only on
    ``switch_pages`` (one mid-page, one at a page's end), a lost-events flag on one page."""
    rng = random.Random(seed)
    sw, ent, ex = FMTS["sched_switch"], FMTS["irq_handler_entry"], FMTS["irq_handler_exit"]
    pages, ts = [], 1_000_000_000
    for k in range(n_pages):
        w = PageWriter(ts)
        for j in range(40):
            ts += 10_000 + rng.randrange(0, 3_000)
            w.event(ts, payload(ent, 11, irq=9, name="acpi"))
            ts += 2_000
            w.event(ts, payload(ex, 11, irq=9, ret=1))
            if k in switch_pages and j in (17, 39):
                ts += 1_000
                w.event(ts, payload(sw, 11, prev_comm="hog", prev_pid=11, prev_prio=120,
                                    prev_state=0, next_comm=f"t{k}.{j}", next_pid=100 + k,
                                    next_prio=120))
        buf = w.build(lost=3 if k == 60 else None)
        pages.append(Page(1, page_info(buf)[0], buf, page_info(buf)[2]))
        ts += 5_000
    return pages


def windows_over(pages: list[Page], n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    t0, t1 = pages[0].ts_ns, pages[-1].ts_ns + 400_000
    out = [(t0 - 5_000_000, t0 - 1_000_000), (t1 + 1_000, t1 + 9_000_000),  # outside
           (pages[3].ts_ns, pages[3].ts_ns), (t0, t1)]  # a page's first instant; everything
    for _ in range(n):
        a = rng.randrange(t0 - 1_000_000, t1)
        out.append((a, a + rng.randrange(0, 8_000_000)))
    return out


def check(pages: list[Page], wins) -> int:
    src = source_over(pages, 1)
    checked = 0
    for rnd in range(2):  # the second round answers from the pages' memos
        for lo, hi in wins:
            win = src._window_raw(lo, lo, hi)
            want, lost, _unknown = reference_window(pages, 1, lo, hi)
            assert same(win.events, want), (rnd, lo, hi)
            assert win.lost == lost
            checked += 1
    return checked


def test_window_matches_the_plain_reading_on_captured_pages():
    pages = fixture_pages()
    assert check(pages, windows_over(pages, 150, seed=1)) > 300


def test_window_matches_the_plain_reading_where_the_switch_is_pages_back():
    pages = sparse_ring()
    src = source_over(pages, 1)
    # a window on page 20 finds the switch of page 5 (15 pages back, read from memos)
    win = src._window_raw(pages[20].ts_ns + 50_000, pages[20].ts_ns + 50_000,
                          pages[20].ts_ns + 90_000)
    assert win.events[0].name == "sched_switch" and win.events[0].fields["next_pid"] == 105
    # on page 100 the last switch (page 31) is more than 64 pages back: none, as before
    win = src._window_raw(pages[100].ts_ns, pages[100].ts_ns, pages[100].ts_ns + 30_000)
    assert all(e.name != "sched_switch" for e in win.events)
    assert check(pages, windows_over(pages, 200, seed=2)) > 400


def test_window_is_unchanged_by_page_memos_and_the_decode_fast_path():
    pages = sparse_ring(n_pages=40, switch_pages=(2, 9, 10, 25))
    wins = windows_over(pages, 60, seed=3)
    a = [source_over(pages, 1)._window_raw(lo, lo, hi).events for lo, hi in wins]
    slow = {i: dataclasses.replace(f, _fast=False, _maker=None, _memo={}) for i, f in BY_ID.items()}
    assert all(f._fast is False for f in slow.values())
    src = source_over(pages, 1)
    src._formats = slow
    b = [src._window_raw(lo, lo, hi).events for lo, hi in wins]
    assert all(same(x, y) for x, y in zip(a, b))
    assert sum(len(x) for x in a) > 500


def test_one_unpack_decoding_gives_every_field_as_the_field_plan_does():
    plain = {i: dataclasses.replace(f, _fast=False, _maker=None, _memo={})
             for i, f in BY_ID.items()}
    fast = {i: dataclasses.replace(f, _fast=None, _maker=None, _memo={}) for i, f in BY_ID.items()}
    got = [e for pg in fixture_pages() for e in iter_page(pg.data, 1, fast)]
    want = [e for pg in fixture_pages() for e in iter_page(pg.data, 1, plain)]
    assert len(got) > 100 and same(got, want)
    assert sum(1 for f in fast.values() if f._fast) >= 10  # the fast path ran
    # a record shorter than its fields (the fast path needs all of it): what fits, both ways
    for i, f in fast.items():
        rec = payload(f, 42)
        for cut in (len(rec), len(rec) - 1, 12, 8):
            assert f.decode(rec, 0, cut) == plain[i].decode(rec, 0, cut), (f.name, cut)


def test_window_reports_its_cpu_time_apart_from_its_wall_time():
    src = source_over(fixture_pages(), 1)
    src.host = None
    win = src.window(0, 1 << 62)
    assert win.events and win.read_ns > 0 and win.cpu_ns > 0


def test_window_with_after_adds_only_the_first_event_past_its_end():
    """``after_ns``: the window's events as without it, then the CPU's first event in
    (hi, hi + after] and nothing more, found on the window's last page or a later one
    (the walk needs who was current at its end, not the events after it)."""
    for pages, seed in ((fixture_pages(), 5), (sparse_ring(n_pages=40), 6)):
        src = source_over(pages, 1)
        every = [e for pg in pages for e in iter_page(pg.data, 1, BY_ID)]
        checked = found = 0
        for lo, hi in windows_over(pages, 120, seed=seed):
            for after in (1, 20_000, 1_000_000):
                got = src._window_raw(lo, lo, hi, after).events
                want, _lost, _unknown = reference_window(pages, 1, lo, hi)
                nxt = [e for e in every if hi < e.ts_ns <= hi + after][:1]
                assert same(got, want + nxt), (lo, hi, after)
                checked += 1
                found += bool(nxt)
        assert checked > 300 and found > 30
