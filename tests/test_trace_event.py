"""agent.trace.event: the format files parsed into decoders, and the derived fields both
readers share (a wake-up's context, block requests, a sleep's timer: the binary pages and
the ``trace`` text give the same fields), task states as the kernel prints them, Event.
"""

from __future__ import annotations

import json

import pytest

from agent.trace.event import Event, FormatError, parse_format, task_state
from agent.trace.pages import (
    iter_page,
)
from agent.trace.symbols import SymbolResolver
from agent.trace.text import parse_text
from tests.eventpages import FIXTURE, PageWriter, load_formats, payload

FMTS = load_formats()
BY_ID = {f.id: f for f in FMTS.values()}
META = json.loads((FIXTURE / "meta.json").read_text())


# --- format files ----------------------------------------------------------------------------

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


# --- derived fields: both readers give the same ---------------------------------------------

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


def test_task_state_letters_as_the_kernel_prints_them():
    table = FMTS["sched_switch"].flags["prev_state"]
    assert task_state(0, table) == "R"
    assert task_state(0x100, table) == "R+"
    assert task_state(1, table) == "S"
    assert task_state(2, table) == "D"
    assert task_state(0x80, table) == "I"
    assert task_state(0x1, None) == "S"


def test_event_equality_and_repr():
    a = Event(1, 0, "x", 2, {"k": 1})
    assert a == Event(1, 0, "x", 2, {"k": 1}) and a != Event(1, 0, "x", 3, {"k": 1})
    assert "x" in repr(a) and a.get("k") == 1
