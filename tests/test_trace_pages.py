"""agent.trace.pages: the binary ring-buffer pages of ``trace_pipe_raw``.

Two layers: the real kernel's output captured from a 6.18 kernel (tests/fixtures/events,
made by its capture.py: the same 1,075 events read as text and as binary pages must decode
identically), and pages written byte by byte from the real format files
(tests/eventpages.py) for every record type and edge.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.trace.event import FormatError
from agent.trace.pages import (
    PageLayout,
    check_header_event,
    decode_record,
    id_hits,
    iter_page,
    page_info,
    page_last_ts,
    parse_header_page,
)
from agent.trace.symbols import SymbolResolver
from agent.trace.text import TextStats, parse_text
from tests.eventpages import FIXTURE, PageWriter, load_formats, payload

FMTS = load_formats()
BY_ID = {f.id: f for f in FMTS.values()}
META = json.loads((FIXTURE / "meta.json").read_text())


def _resolver() -> SymbolResolver:
    return SymbolResolver(lambda: (FIXTURE / "kallsyms").read_bytes())


def _fixture_pages() -> list[bytes]:
    data = (FIXTURE / "pages.bin").read_bytes()
    ps = META["page_size"]
    return [data[i:i + ps] for i in range(0, len(data), ps)]


# --- header page and event ----------------------------------------------------------------

def test_header_page_and_event_of_this_kernel_are_the_known_layout():
    lay = parse_header_page((FIXTURE / "header_page").read_text())
    assert lay == PageLayout(0, 8, 8, 16, 4096)
    check_header_event((FIXTURE / "header_event").read_text())


def test_a_32_bit_commit_or_another_event_header_is_refused():
    text = (FIXTURE / "header_page").read_text().replace(
        "local_t commit;\toffset:8;\tsize:8", "local_t commit;\toffset:8;\tsize:4")
    with pytest.raises(FormatError, match="commit 4 B"):
        parse_header_page(text)
    with pytest.raises(FormatError):
        check_header_event("# compressed entry header\n\ttype_len    :    6 bits\n")


# --- the real kernel's output: binary and text agree ------------------------------------------

def test_captured_pages_and_text_decode_to_the_same_events():
    res = _resolver()
    binary = [e for p in _fixture_pages() for e in iter_page(p, META["cpu"], BY_ID, symbols=res)]
    stats = TextStats()
    text = parse_text((FIXTURE / "trace.txt").read_text().splitlines(), stats=stats)
    assert stats.bad_lines == 0 and stats.backwards == 0
    assert len(binary) == len(text) > 1000
    for b, t in zip(binary, text):
        # the text prints µs rounded to nearest (ns2usecs adds 500)
        assert (b.ts_ns + 500) // 1000 * 1000 == t.ts_ns
        assert (b.cpu, b.name, b.pid, b.fields) == (t.cpu, t.name, t.pid, t.fields), (b, t)
    names = {e.name for e in binary}
    for want in ("sched_switch", "sched_waking", "sched_wakeup", "irq_handler_entry",
                 "irq_handler_exit", "softirq_entry", "softirq_exit", "local_timer_entry",
                 "local_timer_exit", "workqueue_execute_start", "workqueue_execute_end",
                 "tlb_flush", "ipi_send_cpu"):
        assert want in names
    wq = next(e for e in binary if e.name == "workqueue_execute_start")
    assert not wq.fields["function"].startswith("0x")  # resolved through kallsyms
    assert all(b.ts_ns <= a.ts_ns for b, a in zip(binary, binary[1:]))


def test_captured_first_page_reports_its_lost_events():
    pages = _fixture_pages()
    ts, size, lost = page_info(pages[0])
    assert lost > 0  # the 32 KiB ring was overwritten while the capture loaded the CPU
    assert all(page_info(p)[2] == 0 for p in pages[1:])
    assert page_last_ts(pages[0]) <= page_info(pages[1])[0]


# --- pages written byte by byte ---------------------------------------------------------------

def _switch(pid, prev, nxt, state=0):
    return payload(FMTS["sched_switch"], pid, prev_comm=prev[0], prev_pid=prev[1],
                   prev_prio=120, prev_state=state, next_comm=nxt[0], next_pid=nxt[1],
                   next_prio=120)


def test_small_and_long_records_deltas_and_data_loc_strings():
    t0 = 5_000_000_000
    irq = payload(FMTS["irq_handler_entry"], 7, irq=24, name="virtio0-input.0")
    page = (PageWriter(t0)
            .event(t0 + 10, _switch(7, ("probe", 7), ("kworker/1:0", 45), state=0x100))
            .event(t0 + 25, irq)
            .event(t0 + 40, irq, long_form=True)
            .build())
    evs = list(iter_page(page, 1, BY_ID))
    assert [e.ts_ns - t0 for e in evs] == [10, 25, 40]
    assert evs[0].fields["prev_state"] == "R+" and evs[0].fields["next_comm"] == "kworker/1:0"
    assert evs[1].fields == {"irq": 24, "name": "virtio0-input.0"} == evs[2].fields
    assert evs[1].pid == 7


def test_time_extend_over_2_27_ns():
    t0 = 1_000
    ev = payload(FMTS["local_timer_entry"], 0, vector=236)
    page = PageWriter(t0).event(t0 + 5, ev).event(t0 + 5 + (3 << 27) + 77, ev).build()
    assert [e.ts_ns for e in iter_page(page, 0, BY_ID)] == [t0 + 5, t0 + 5 + (3 << 27) + 77]


def test_absolute_time_stamp_restores_its_top_bits_across_a_wrap():
    # the clock's 5 top bits are dropped in a TIME_STAMP record (rb_fix_abs_ts); a stamp
    # whose low 59 bits wrapped past the page's must carry into the top bits
    top = 0b00001 << 59
    t0 = top | ((1 << 59) - 100)  # just below a 2^59 boundary
    after = t0 + 300  # crosses it
    ev = payload(FMTS["local_timer_entry"], 0, vector=236)
    page = PageWriter(t0).event(t0 + 1, ev).time_stamp(after).event(after + 2, ev).build()
    assert [e.ts_ns for e in iter_page(page, 0, BY_ID)] == [t0 + 1, after + 2]


def test_discarded_records_are_skipped_and_null_padding_ends_the_page():
    t0 = 10_000
    ev = payload(FMTS["local_timer_entry"], 0, vector=236)
    page = (PageWriter(t0).event(t0 + 1, ev).discarded(12).event(t0 + 3, ev).null_padding()
            .raw(struct.pack("<I", 1 | (9 << 5)) + b"\xff" * 4).build())
    evs = list(iter_page(page, 0, BY_ID))
    assert [e.ts_ns for e in evs] == [t0 + 1, t0 + 3]


def test_a_record_cut_by_the_page_end_is_dropped_not_read_past():
    t0 = 10_000
    ev = payload(FMTS["sched_switch"], 1)
    w = PageWriter(t0).event(t0 + 1, ev).event(t0 + 2, ev)
    page = w.build(commit=len(w.body) - 8)  # the commit ends inside the second record
    assert [e.ts_ns for e in iter_page(page, 0, BY_ID)] == [t0 + 1]
    # a long-form length that runs past the data, and one below its own size
    bad = PageWriter(t0).raw(struct.pack("<II", 0, 5000)).build()
    assert list(iter_page(bad, 0, BY_ID)) == []
    bad = PageWriter(t0).raw(struct.pack("<II", 0, 2)).build()
    assert list(iter_page(bad, 0, BY_ID)) == []
    with pytest.raises(FormatError):
        page_info(b"\0" * 8)


def test_unknown_event_ids_are_counted_and_skipped():
    t0 = 0
    known = payload(FMTS["local_timer_entry"], 0, vector=236)
    unknown = struct.pack("<HBBi", 9999, 0, 0, 3) + b"\0" * 8
    page = PageWriter(t0).event(1, unknown).event(2, known).build()
    count = [0]
    evs = list(iter_page(page, 0, BY_ID, unknown=count))
    assert [e.name for e in evs] == ["local_timer_entry"] and count == [1]


def test_lost_events_flags_stored_and_not_stored():
    ev = payload(FMTS["local_timer_entry"], 0, vector=236)
    assert page_info(PageWriter(0).event(1, ev).build(lost=1234))[2] == 1234
    assert page_info(PageWriter(0).event(1, ev).build(lost=1234, stored=False))[2] == -1
    p = PageWriter(0).event(1, ev).build(lost=5)
    assert [e.ts_ns for e in iter_page(p, 0, BY_ID)] == [1]  # the count is not a record


def test_time_filter_and_only_ids():
    ev = payload(FMTS["local_timer_entry"], 0, vector=236)
    sw = _switch(0, ("swapper/1", 0), ("probe", 7))
    w = PageWriter(0)
    for i in range(1, 11):
        w.event(i * 100, sw if i % 2 else ev)
    page = w.build()
    assert [e.ts_ns for e in iter_page(page, 0, BY_ID, t_from=300, t_to=600)] == [300, 400,
                                                                                     500, 600]
    only = {FMTS["sched_switch"].id}
    assert {e.name for e in iter_page(page, 0, BY_ID, only=only)} == {"sched_switch"}
    assert page_last_ts(page) == 1000


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=4096))
def test_garbage_pages_never_raise_or_hang(body):
    page = PageWriter(0).raw(body[:4080]).build()
    for _ in iter_page(page, 0, BY_ID):
        pass
    page_last_ts(page)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 33), st.booleans()), min_size=1, max_size=40))
def test_any_delta_sequence_round_trips(steps):
    ev = payload(FMTS["irq_handler_exit"], 3, irq=5, ret=1)
    t = 1 << 40
    w = PageWriter(t)
    want = []
    for delta, long_form in steps:
        t += delta
        w.event(t, ev, long_form=long_form)
        want.append(t)
    assert [e.ts_ns for e in iter_page(w.build(), 0, BY_ID)] == want


# --- id_hits: the always-on uprobe read (watch --attach) gives iter_page's answer ---------------

def _hits_by_events(page: bytes, ids) -> list[tuple[int, int, int]]:
    return [(e.ts_ns, BY_ID_NAME[e.name], e.pid) for e in iter_page(page, 0, BY_ID, only=ids)]


def _hits(page: bytes, ids) -> list[tuple[int, int, int]]:
    """id_hits' (ts, id, pid), each record's (start, length) checked to decode to the same
    event as iter_page's."""
    got = id_hits(page, ids)
    for ts, _i, _pid, start, length in got:
        assert decode_record(page, 0, BY_ID, (ts, start, length)) in list(
            iter_page(page, 0, BY_ID, t_from=ts, t_to=ts))
    return [h[:3] for h in got]


BY_ID_NAME = {f.name: f.id for f in FMTS.values()}


def test_id_hits_are_iter_pages_events_on_the_captured_pages():
    pages = _fixture_pages()
    seen = {BY_ID_NAME[e.name] for p in pages for e in iter_page(p, 0, BY_ID)}
    assert len(seen) > 5
    for ids in [frozenset(seen), *(frozenset({i}) for i in seen), frozenset({9999})]:
        got = [h for p in pages for h in _hits(p, ids)]
        assert got == [h for p in pages for h in _hits_by_events(p, ids)]
    switch = frozenset({FMTS["sched_switch"].id})
    assert sum(len(id_hits(p, switch)) for p in pages) > 100


def test_id_hits_through_extends_stamps_padding_and_a_cut_record():
    top = 0b00001 << 59
    t0 = top | ((1 << 59) - 100)
    ev = payload(FMTS["local_timer_entry"], -5, vector=236)  # (a negative common_pid)
    sw = _switch(7, ("probe", 7), ("kworker/1:0", 45))
    w = (PageWriter(t0).event(t0 + 1, ev).event(t0 + 2, sw, long_form=True)
         .event(t0 + 5 + (3 << 27), ev).discarded(12).time_stamp(t0 + (1 << 30))
         .event(t0 + (1 << 30) + 9, sw).event(t0 + (1 << 30) + 10, ev))
    for page in (w.build(), w.build(commit=len(w.body) - 8)):
        for ids in (frozenset({FMTS["local_timer_entry"].id}), frozenset(BY_ID)):
            assert _hits(page, ids) == _hits_by_events(page, ids)
    assert [h[2] for h in id_hits(w.build(), frozenset(BY_ID))] == [-5, 7, -5, 7, -5]
    # a discarded record of a length that is not whole words: walked by bytes, same answer
    odd = PageWriter(t0).event(t0 + 1, ev).discarded(13).event(t0 + 3, ev).build()
    assert _hits(odd, frozenset(BY_ID)) == _hits_by_events(odd, frozenset(BY_ID))


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=4096), st.integers(0, 4096))
def test_id_hits_on_garbage_pages_are_iter_pages(body, commit):
    page = PageWriter(0).raw(body[:4080]).build(commit=min(commit, len(body[:4080])))
    ids = frozenset(BY_ID)
    assert _hits(page, ids) == _hits_by_events(page, ids)
