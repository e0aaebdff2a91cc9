"""agent.trace.parse: format files, binary ring-buffer pages and ``trace`` text.

Three layers: the real kernel's output captured on the development VM (kernel 6.18,
tests/fixtures/events, made by its capture.py: the same 1,075 events read as text and as
binary pages must decode identically), pages written byte by byte from the real format
files (tests/eventpages.py) for every record type and edge, and canned ``trace`` text for
every event type and marker.
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.trace.event import Event, FormatError, parse_format, task_state
from agent.trace.pages import (
    PageLayout,
    check_header_event,
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


# --- format files -----------------------------------------------------------------------------

def test_every_captured_format_parses_with_its_fields():
    # the capture's events, and the formats of signal_generate, block_rq_issue/complete and
    # hrtimer_start copied from the same kernel (6.18) for the not-runnable events
    assert {f"{f.system}:{f.name}" for f in FMTS.values()} == \
        set(META["events"]) | {"signal:signal_generate", "block:block_rq_issue",
                                "block:block_rq_complete", "timer:hrtimer_start"}
    sw = FMTS["sched_switch"]
    offs = {f.name: (f.offset, f.size) for f in sw.fields}
    assert offs["prev_comm"] == (8, 16) and offs["next_pid"] == (56, 4)
    assert sw.pid_offset == 4
    assert sw.flags["prev_state"][0x80] == "I"
    assert FMTS["softirq_entry"].symbols["vec"][3] == "NET_RX"
    assert FMTS["tlb_flush"].symbols["reason"][1] == "remote shootdown"
    loc = {f.name: f.ctype for f in FMTS["irq_handler_entry"].fields}
    assert loc["name"].startswith("__data_loc")


def test_format_without_id_is_an_error_not_a_crash():
    with pytest.raises(FormatError):
        parse_format("name: x\nformat:\n\tfield:int a;\toffset:8;\tsize:4;\tsigned:1;\n")


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


def test_wake_up_and_signal_carry_the_context_they_fired_in_from_both_readers():
    # common_flags TRACE_FLAG_HARDIRQ (0x08): a timer's wake-up runs in its interrupt, on
    # whatever task the interrupt landed on; the text shows it as 'h' in the flags column
    t0 = 100_000_000_000
    wk = FMTS["sched_waking"]
    sig = FMTS["signal_generate"]
    page = (PageWriter(t0)
            .event(t0 + 1000, payload(wk, 0, common_flags=0x09, comm="probe", pid=4242,
                                      prio=120, target_cpu=1))
            .event(t0 + 2000, payload(wk, 77, common_flags=0x10, comm="probe", pid=4242,
                                      prio=120, target_cpu=1))
            .event(t0 + 3000, payload(wk, 99, common_flags=0x01, comm="probe", pid=4242,
                                      prio=120, target_cpu=1))
            .event(t0 + 4000, payload(sig, 555, sig=19, errno=0, code=0, comm="my probe",
                                      pid=4242, group=1, result=0))
            .build())
    evs = list(iter_page(page, 1, BY_ID))
    assert [e.fields["irq_ctx"] for e in evs] == ["hardirq", "softirq", "", ""]
    text = "\n".join([
        "          <idle>-0     [001] d.h2.   100.000001: sched_waking: comm=probe pid=4242 "
        "prio=120 target_cpu=001",
        "          python-77    [001] ..s2.   100.000002: sched_waking: comm=probe pid=4242 "
        "prio=120 target_cpu=001",
        "          python-99    [001] d..2.   100.000003: sched_waking: comm=probe pid=4242 "
        "prio=120 target_cpu=001",
        "          stopper-555  [001] d..2.   100.000004: signal_generate: sig=19 errno=0 "
        "code=0 comm=my probe pid=4242 grp=1 res=0",
    ])
    tev = parse_text(text.splitlines())
    assert [e.fields for e in tev] == [e.fields for e in evs]
    assert tev[3].fields["sig"] == 19 and tev[3].pid == 555 and tev[3].fields["group"] == 1


def test_block_requests_decode_alike_from_both_readers():
    t0 = 100_000_000_000
    issue, done = FMTS["block_rq_issue"], FMTS["block_rq_complete"]
    dev = (8 << 20) | 16
    page = (PageWriter(t0)
            .event(t0 + 1000, payload(issue, 4242, dev=dev, sector=2048, nr_sector=8,
                                      bytes=4096, ioprio=0, rwbs="R", comm="probe", cmd=""))
            .event(t0 + 9000, payload(done, 0, dev=dev, sector=2048, nr_sector=8, error=0,
                                      ioprio=0, rwbs="R", cmd=""))
            .build())
    evs = list(iter_page(page, 1, BY_ID))
    text = "\n".join([
        "           probe-4242  [001] d..2.   100.000001: block_rq_issue: 8,16 R 4096 () "
        "2048 + 8 none,0,0 [probe]",
        "          <idle>-0     [001] d.h2.   100.000009: block_rq_complete: 8,16 R () 2048 "
        "+ 8 none,0,0 [0]",
    ])
    tev = parse_text(text.splitlines())
    want = {"dev": "8,16", "rwbs": "R", "sector": 2048, "nr_sector": 8}
    assert [e.fields for e in evs] == [want, want] == [e.fields for e in tev]


def test_a_sleeps_timer_decodes_alike_from_both_readers():
    """hrtimer_start of a sleeping thread: its callback by name, the expiry it asked for
    (softexpires) and the latest (expires: + its slack); the hashed pointer and mode are
    dropped by both."""
    t0 = 100_000_000_000
    res = SymbolResolver(lambda: b"ffffffff814204b0 t hrtimer_wakeup\n")
    assert res.address("hrtimer_wakeup") is None  # not loaded yet: never waits
    res(0)
    assert res.address("hrtimer_wakeup") == 0xffffffff814204b0
    assert res.address("hrtimer") is None and res.address("wakeup") is None
    fmt = FMTS["hrtimer_start"]
    page = (PageWriter(t0)
            .event(t0 + 1000, payload(fmt, 4242, hrtimer=0xffff888812345678,
                                      function=0xffffffff814204b0, expires=105_050_000_000,
                                      softexpires=105_000_000_000, mode=1, was_armed=0))
            .build())
    (ev,) = iter_page(page, 1, BY_ID, symbols=res)
    text = ("           probe-4242  [001] d..1.   100.000001: hrtimer_start: "
            "hrtimer=00000000deadbeef function=hrtimer_wakeup expires=105050000000 "
            "softexpires=105000000000 mode=REL was_armed=0")
    (tev,) = parse_text([text])
    want = {"function": "hrtimer_wakeup", "expires": 105_050_000_000,
            "softexpires": 105_000_000_000}
    assert ev.fields == want == tev.fields and ev.pid == tev.pid == 4242


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


# --- text --------------------------------------------------------------------------------------

CANNED = """\
# tracer: nop
#
# entries-in-buffer/entries-written: 20/25   #P:2
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
##### CPU 1 buffer started ####
   my probe thr-4242    [001] d..2.  100.000010: sched_switch: prev_comm=my probe thr prev_pid=4242 prev_prio=120 prev_state=R+ ==> next_comm=kworker/1:0-mm_percpu_wq next_pid=45 next_prio=120
 kworker/1:0-mm_percpu_wq-45 [001] .....  100.000011: workqueue_execute_start: work struct 00000000c0ffee00: function vmstat_update
 kworker/1:0-mm_percpu_wq-45 [001] .....  100.001211: workqueue_execute_end: work struct 00000000c0ffee00: function vmstat_update
 kworker/1:0-mm_percpu_wq-45 [001] dN.4.  100.001212: sched_waking: comm=my probe thr pid=4242 prio=120 target_cpu=001
 kworker/1:0-mm_percpu_wq-45 [001] dN.5.  100.001213: sched_wakeup: comm=my probe thr pid=4242 prio=120 target_cpu=001
          <idle>-0       [001] d.h1.  100.002000: irq_handler_entry: irq=24 name=virtio0-input.0
          <idle>-0       [001] d.h1.  100.002004: irq_handler_exit: irq=24 ret=handled
          <idle>-0       [001] ..s1.  100.002005: softirq_entry: vec=3 [action=NET_RX]
          <idle>-0       [001] ..s1.  100.002405: softirq_exit: vec=3 [action=NET_RX]
          <idle>-0       [001] d.h1.  100.003000: local_timer_entry: vector=236
          <idle>-0       [001] d.h1.  100.003009: local_timer_exit: vector=236
          <idle>-0       [001] d.h1.  100.003100: call_function_entry: vector=251
          <idle>-0       [001] d.h1.  100.003101: tlb_flush: pages:-1 reason:remote shootdown (1)
          <idle>-0       [001] d.h1.  100.003120: call_function_exit: vector=251
CPU:1 [LOST 17 EVENTS]
          <idle>-0       [001] d..2.  100.003200: sched_migrate_task: comm=my probe thr pid=4242 prio=120 orig_cpu=0 dest_cpu=1
          <idle>-0       [001] d..3.  100.003300: ipi_send_cpu: cpu=0 callsite=ttwu_queue_wakelist+0x11d/0x150 callback=generic_smp_call_function_single_interrupt+0x0/0x10
          <idle>-0       [001] d..3.  100.003301: ipi_send_cpumask: cpumask=0-1 callsite=on_each_cpu_cond_mask+0x24/0x40 callback=flush_tlb_func+0x0/0x230
          <idle>-0       [001] d..3.  100.003302: sched_wakeup_new: comm=bash pid=77 prio=120 target_cpu=001
          <idle>-0       [001] d..3.  100.003303: some_new_event: foo=1 bar=baz
          <idle>-0       [001] d..2.  100.003310: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_c
          <idle>-0       [001] d..2.  100.003000: local_timer_entry: vector=236
          <idle>-0  (    0) [001] d..2.  100.004000: local_timer_entry: vector=236
          <idle>-0       [001]  100.004100: local_timer_exit: vector=236
   garbage line without a timestamp
"""


def test_canned_text_every_event_type_and_marker():
    known = {"sched_switch", "workqueue_execute_start", "workqueue_execute_end",
             "sched_waking", "sched_wakeup", "irq_handler_entry", "irq_handler_exit",
             "softirq_entry", "softirq_exit", "local_timer_entry", "local_timer_exit",
             "call_function_entry", "call_function_exit", "tlb_flush", "sched_migrate_task",
             "ipi_send_cpu", "ipi_send_cpumask", "sched_wakeup_new"}
    stats = TextStats()
    evs = parse_text(CANNED.splitlines(), known, stats=stats)
    by = {}
    for e in evs:
        by.setdefault(e.name, e)
    sw = by["sched_switch"]
    assert sw.pid == 4242 and sw.ts_ns == 100_000_010_000
    assert sw.fields["prev_comm"] == "my probe thr" and sw.fields["prev_state"] == "R+"
    assert sw.fields["next_comm"] == "kworker/1:0-mm_percpu_wq" and sw.fields["next_pid"] == 45
    assert by["workqueue_execute_start"].pid == 45
    assert by["workqueue_execute_start"].fields == {"function": "vmstat_update"}
    # (irq_ctx: the flags column's third character, "." = task context)
    assert by["sched_waking"].fields == {"comm": "my probe thr", "pid": 4242, "prio": 120,
                                         "target_cpu": 1, "irq_ctx": ""}
    assert by["irq_handler_entry"].fields == {"irq": 24, "name": "virtio0-input.0"}
    assert by["softirq_entry"].fields == {"vec": 3, "action": "NET_RX"}
    assert by["local_timer_entry"].fields == {"vector": 236}
    assert by["tlb_flush"].fields == {"pages": -1, "reason_str": "remote shootdown", "reason": 1}
    assert by["sched_migrate_task"].fields["dest_cpu"] == 1
    assert by["ipi_send_cpu"].fields["callback"] == "generic_smp_call_function_single_interrupt"
    assert by["ipi_send_cpumask"].fields["callback"] == "flush_tlb_func"
    assert by["sched_wakeup_new"].fields["pid"] == 77
    # markers and edges
    assert stats.lost == {1: 17}
    assert stats.started == {1: 100_000_010_000}
    assert stats.unknown == 1  # some_new_event
    assert stats.bad_lines == 2  # the truncated sched_switch, the garbage line
    assert stats.backwards == 1  # 100.003000 after 100.003310 on CPU 1
    # the record-tgid column and a line without the flags column still parse
    tail = [e for e in evs if e.ts_ns >= 100_004_000_000]
    assert [(e.name, e.ts_ns) for e in tail] == [("local_timer_entry", 100_004_000_000),
                                                 ("local_timer_exit", 100_004_100_000)]


def test_text_time_window_and_unknown_events_kept_when_no_filter():
    evs = parse_text(CANNED.splitlines(), t_from=100_002_000_000, t_to=100_002_405_000)
    assert [e.name for e in evs] == ["irq_handler_entry", "irq_handler_exit", "softirq_entry",
                                     "softirq_exit"]
    every = parse_text(CANNED.splitlines())
    assert any(e.name == "some_new_event" and e.fields == {"foo": "1", "bar": "baz"}
               for e in every)


def test_text_parser_never_raises_on_cut_lines():
    lines = CANNED.splitlines()
    for line in lines:
        for cut in range(0, len(line), 7):
            parse_text([line[:cut]])


# --- smaller pieces -----------------------------------------------------------------------------

def test_task_state_letters_as_the_kernel_prints_them():
    table = FMTS["sched_switch"].flags["prev_state"]
    assert task_state(0, table) == "R"
    assert task_state(0x100, table) == "R+"
    assert task_state(1, table) == "S"
    assert task_state(2, table) == "D"
    assert task_state(0x80, table) == "I"
    assert task_state(0x1, None) == "S"


def test_symbol_resolver_nearest_symbol_hex_fallback_and_restricted_addresses():
    text = (b"ffffffff81000000 T _stext\nffffffff815d6170 t vmstat_update\n"
            b"0000000000000000 t hidden_by_kptr_restrict\nffffffffc0000000 d some_data\n")
    res = SymbolResolver(lambda: text)
    assert res(0xFFFFFFFF815D6170) == "vmstat_update"
    assert res(0xFFFFFFFF815D6180) == "vmstat_update"  # inside it
    assert res(0x1234) == "0x1234"  # below every symbol
    assert res(0xFFFFFFFFC0000000) == "0xffffffffc0000000"  # data, not text: not resolved
    empty = SymbolResolver(lambda: None)
    assert empty(0xFFFFFFFF815D6170) == "0xffffffff815d6170"


def test_symbol_resolver_loads_in_the_background():
    res = SymbolResolver(lambda: b"ffffffff815d6170 t vmstat_update\n")
    res.load_async()
    assert res(0xFFFFFFFF815D6170) == "vmstat_update"


def test_event_equality_and_repr():
    a = Event(1, 0, "x", 2, {"k": 1})
    assert a == Event(1, 0, "x", 2, {"k": 1}) and a != Event(1, 0, "x", 3, {"k": 1})
    assert "x" in repr(a) and a.get("k") == 1
