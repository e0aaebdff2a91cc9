"""agent.trace.uprobe.UprobeEvents.uprobe_events: the always-on read of watch --attach's
uprobe hits from the calls instance's pages (agent.trace.pages.id_hits) gives, per hit, what
the events decoded whole say (time, CPU, thread, name), in time order across CPUs, each page
read once; an event with arguments of its own (a GPU copy's size) comes whole, fields and
all; the kernel-event rings are drained only every KERNEL_DRAIN_S. Pages written byte by
byte (tests/eventpages.py) with format files of the kernel's uprobe shape."""

from __future__ import annotations

from agent.trace import uprobe
from agent.trace.event import parse_format
from agent.trace.pages import Page, PageLayout, iter_page
from agent.trace.uprobe import UprobeEvents
from agent.trace.window import _CpuRing
from tests.eventpages import PageWriter, load_formats, payload

COMMON = """\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

"""


def _fmt(name: str, eid: int, fields: list[tuple[str, int]]):
    body = "".join(f"\tfield:unsigned long {f};\toffset:{o};\tsize:8;\tsigned:0;\n"
                   for f, o in fields)
    return parse_format(f"name: {name}\nID: {eid}\nformat:\n{COMMON}{body}\nprint fmt: \"\"\n",
                        "hftagent_1")


CALL = _fmt("call0", 3001, [("__probe_ip", 8)])
RET = _fmt("ret0", 3002, [("__probe_func", 8), ("__probe_ret_ip", 16)])
COPY = _fmt("gpu0", 3003, [("__probe_ip", 8), ("bytes", 16)])
SWITCH = load_formats()["sched_switch"]


class _Source(UprobeEvents):
    """The part of EventSource that uprobe_events reads: the calls rings' pages (each
    handed out once, as a drain does), and the kernel-event drain it asks for."""

    def __init__(self, rings: dict) -> None:
        super().__init__()
        self._closed, self.reader, self._layout = False, "raw", PageLayout()
        self._formats = {f.id: f for f in (CALL, RET, COPY, SWITCH)}
        self._uprobe_ids = {CALL.id: False, RET.id: True, COPY.id: False}
        self._uprobe_names = {"call0": False, "ret0": True, "gpu0": False}
        self._rings = rings
        self.drains = 0
        self.drained_ns = 0

    def _calls_pages(self) -> list[tuple[int, bytes]]:
        out = [(r.cpu, p.data) for r in self._rings.values() for p in r.pages]
        for r in self._rings.values():
            r.pages.clear()
        return out

    def drain(self) -> int:
        self.drains += 1
        self.drained_ns = uprobe.time.monotonic_ns()
        return 0


def _page(cpu: int, t0: int, recs: list[tuple[int, bytes]]) -> Page:
    w = PageWriter(t0)
    for t, data in recs:
        w.event(t, data, long_form=len(data) > 100)
    return Page(cpu, t0, w.build())


def test_hits_are_the_decoded_events_in_time_order_each_page_read_once():
    sw = payload(SWITCH, 0, prev_comm="swapper/1", prev_pid=0, next_comm="app", next_pid=7)
    call = lambda tid, ip: payload(CALL, tid, __probe_ip=ip)  # noqa: E731
    ret = lambda tid: payload(RET, tid, __probe_func=1, __probe_ret_ip=2)  # noqa: E731
    copy = payload(COPY, 8, __probe_ip=5, bytes=1 << 20)
    r1, r0 = _CpuRing(1), _CpuRing(0)
    r1.pages.extend([_page(1, 1000, [(1001, sw), (1002, call(7, 9)), (1010, sw),
                                     (1020, ret(7)), (1030, copy)]),
                     _page(1, 2000, [(2001, call(7, 9)), (2005, sw)])])
    r0.pages.append(_page(0, 1500, [(1500, call(8, 3)), (1600, ret(8))]))
    src = _Source({1: r1, 0: r0})
    fmts = src._formats
    want = sorted((e for r in (r1, r0) for p in r.pages
                   for e in iter_page(p.data, r.cpu, fmts, only=set(src._uprobe_ids))),
                  key=lambda e: e.ts_ns)
    got = src.uprobe_events()
    assert [(h.ts_ns, h.cpu, h.pid, h.name) for h in got] == \
        [(e.ts_ns, e.cpu, e.pid, e.name) for e in want]
    assert [h.name for h in got] == ["call0", "ret0", "gpu0", "call0", "ret0", "call0"]
    assert got[2].fields["bytes"] == 1 << 20  # an argument of its own: the whole event
    assert [src.is_return(h) for h in got] == [False, True, False, False, True, False]
    assert src.uprobe_events() == []  # read once
    r1.pages.append(_page(1, 3000, [(3001, ret(7))]))
    assert [(h.ts_ns, h.name) for h in src.uprobe_events()] == [(3001, "ret0")]


def test_the_kernel_event_rings_are_drained_once_a_kernel_drain_period(monkeypatch):
    """The calls are read every step; the kernel-event rings (drained into the kept pages,
    never walked here) only once KERNEL_DRAIN_S has passed since their last drain, so a
    quiet stretch never reads as lost events."""
    now = [10_000_000_000]
    monkeypatch.setattr(uprobe.time, "monotonic_ns", lambda: now[0])
    src = _Source({1: _CpuRing(1)})
    for _ in range(5):
        src.uprobe_events()
        now[0] += 100_000_000
    assert src.drains == 1
    now[0] += int(uprobe.KERNEL_DRAIN_S * 1e9)
    src.uprobe_events()
    src.uprobe_events()
    assert src.drains == 2


def test_without_an_event_decoded_whole_the_hits_are_the_same():
    """No GPU copy probe (the common case): every hit made straight from the page walk,
    the same time, CPU, thread and name as the events decoded whole; one CPU's hits in
    page order."""
    call = lambda tid, t: (t, payload(CALL, tid, __probe_ip=9))  # noqa: E731
    ret = lambda tid, t: (t, payload(RET, tid, __probe_func=1, __probe_ret_ip=2))  # noqa: E731
    r1 = _CpuRing(1)
    r1.pages.extend([_page(1, 1000, [call(7, 1001), ret(7, 1020), call(7, 1030)]),
                     _page(1, 2000, [ret(7, 2001), call(9, 2002), ret(9, 2003)])])
    src = _Source({1: r1})
    src._uprobe_ids = {CALL.id: False, RET.id: True}
    want = [(e.ts_ns, e.cpu, e.pid, e.name) for p in r1.pages
            for e in iter_page(p.data, 1, src._formats, only=set(src._uprobe_ids))]
    got = src.uprobe_events()
    assert [(h.ts_ns, h.cpu, h.pid, h.name) for h in got] == want and len(want) == 6
    assert all(type(h) is uprobe.UprobeHit for h in got)
