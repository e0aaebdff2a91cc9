"""Test helper: writes ring-buffer pages the way kernel/trace/ring_buffer.c lays them out,
from the real format files in tests/fixtures/events (so tests feed the binary parser
records whose every byte they chose: lengths, deltas, extends, absolute stamps, padding,
lost-event flags)."""

from __future__ import annotations

import struct
from pathlib import Path

from agent.trace.event import EventFormat, parse_format
from agent.trace.pages import RB_MISSED_EVENTS, RB_MISSED_STORED

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "events"


def load_formats() -> dict[str, EventFormat]:
    """name -> format of every event in the fixture."""
    out = {}
    for f in sorted((FIXTURE / "formats").glob("*/*/format")):
        fmt = parse_format(f.read_text(), f.parent.parent.name)
        out[fmt.name] = fmt
    return out


def payload(fmt: EventFormat, common_pid: int, /, *, common_flags: int = 0,
            **values) -> bytes:
    """One record's bytes: common fields (``common_flags``: TRACE_FLAG_* bits, e.g. 0x08 in a
    hard IRQ), then ``values`` by format-file name (ints, str for char arrays and __data_loc
    strings)."""
    fixed = max([f.offset + f.size for f in fmt.fields] + [8])
    buf = bytearray(fixed)
    struct.pack_into("<HBBi", buf, 0, fmt.id, common_flags, 0, common_pid)
    tail = bytearray()
    for f in fmt.fields:
        if f.name not in values:
            continue
        v = values[f.name]
        if f.ctype.startswith("__data_loc"):
            raw = (v.encode() if isinstance(v, str) else bytes(v)) + (
                b"\0" if isinstance(v, str) else b"")
            off = fixed + len(tail)
            tail += raw
            struct.pack_into("<I", buf, f.offset, (len(raw) << 16) | off)
        elif isinstance(v, str):
            raw = v.encode()[: f.size - 1]
            buf[f.offset:f.offset + f.size] = raw.ljust(f.size, b"\0")
        else:
            fmtc = {1: "b", 2: "h", 4: "i", 8: "q"}[f.size]
            if not f.signed:
                fmtc = fmtc.upper()
            struct.pack_into("<" + fmtc, buf, f.offset, v)
    return bytes(buf + tail)


class PageWriter:
    """Records appended in time order; :meth:`build` gives the page bytes."""

    def __init__(self, ts0: int, page_size: int = 4096) -> None:
        self.ts0 = ts0
        self.last = ts0
        self.body = bytearray()
        self.page_size = page_size

    def _delta(self, ts: int) -> int:
        delta = ts - self.last
        assert delta >= 0
        if delta >= 1 << 27:  # a time extend carries it; the record's own delta is 0
            self.body += struct.pack("<II", 30 | ((delta & ((1 << 27) - 1)) << 5), delta >> 27)
            delta = 0
        self.last = ts
        return delta

    def event(self, ts: int, data: bytes, long_form: bool = False) -> PageWriter:
        delta = self._delta(ts)
        data = data + b"\0" * (-len(data) % 4)
        if long_form or len(data) > 112:  # RB_MAX_SMALL_DATA
            self.body += struct.pack("<II", (delta << 5) | 0, len(data) + 4) + data
        else:
            self.body += struct.pack("<I", (delta << 5) | (len(data) // 4)) + data
        return self

    def time_stamp(self, abs_ts: int) -> PageWriter:
        """An absolute stamp, stored without its 5 top bits (as the kernel does)."""
        low = abs_ts & ((1 << 59) - 1)
        self.body += struct.pack("<II", 31 | ((low & ((1 << 27) - 1)) << 5), low >> 27)
        self.last = abs_ts
        return self

    def discarded(self, nbytes: int, delta: int = 5) -> PageWriter:
        """A discarded record (padding with a non-zero delta): skipped, delta not added."""
        self.body += struct.pack("<II", 29 | (delta << 5), nbytes + 4) + b"\0" * nbytes
        return self

    def null_padding(self) -> PageWriter:
        self.body += struct.pack("<I", 29)
        return self

    def raw(self, data: bytes) -> PageWriter:
        self.body += data
        return self

    def build(self, lost: int | None = None, stored: bool = True, commit: int | None = None) -> bytes:
        size = len(self.body) if commit is None else commit
        flags = 0
        tail = b""
        if lost is not None:
            flags |= RB_MISSED_EVENTS
            if stored:
                flags |= RB_MISSED_STORED
                tail = struct.pack("<Q", lost)
        page = struct.pack("<QQ", self.ts0, size | flags) + bytes(self.body) + tail
        assert len(page) <= self.page_size
        return page + b"\0" * (self.page_size - len(page))


# -- the instance's ``trace`` text, as agent.trace.text.parse_text reads it ------------

def trace_line(comm, pid, ts, body, flags="d..2.", cpu=1):
    """One line of ``trace`` (on CPU 1 unless ``cpu``): ``<comm>-<pid> [001] <flags> <ts>:
    <body>``."""
    return f"{comm:>16}-{pid:<6} [{cpu:03d}] {flags} {ts}: {body}"


def trace_switch(comm, pid, ts, nxt, npid, state="R+"):
    """A ``sched_switch`` line from ``comm[pid]`` to ``nxt[npid]``."""
    return trace_line(comm, pid, ts, f"sched_switch: prev_comm={comm} prev_pid={pid} "
                                     f"prev_prio=120 prev_state={state} ==> next_comm={nxt} "
                                     f"next_pid={npid} next_prio=120")
