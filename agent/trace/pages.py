"""The binary ring-buffer pages of ``per_cpu/cpuN/trace_pipe_raw``: their layout, the walk
of their record headers, and the per-page index that lets overlapping windows decode each
record once.

Binary pages (kernel/trace/ring_buffer.c; Documentation/trace/ring-buffer-design.rst): a
sub-buffer ("page", ``buffer_subbuf_size_kb``, 4 KiB by default) starts with a header
described by ``events/header_page`` — u64 ``timestamp`` (the full clock value of its first
event), ``commit`` (a ``local_t``: bytes of data, plus two flags in bits 31/30: events were
lost before this page / their count is stored as an ``unsigned long`` after the data) — then
the events. Each event has a 32-bit header (``events/header_event``): ``type_len`` in the
low 5 bits and ``time_delta`` (ns since the previous event) in the high 27:

- ``type_len`` 1..28: a data record of ``4 * type_len`` bytes right after the header;
- ``type_len`` 0: the record's length is in the next u32 (that u32 included), data after it;
- 29 padding: ``time_delta`` 0 means the rest of the page is empty; otherwise a discarded
  record whose length is in the next u32 (its delta is not added: ``rb_update_read_stamp``);
- 30 time extend: delta = ``array[0] << 27 | time_delta`` (gaps over 2^27 ns, ~134 ms);
- 31 time stamp: an absolute clock value, ``array[0] << 27 | time_delta``, that drops the 5
  most significant bits; they are taken from the running clock (``rb_fix_abs_ts``, 5.16+).

Timestamps have ns resolution. Each record's fields are decoded by its
:class:`agent.trace.event.EventFormat`; where the layout is not the one above (another word
size or endianness, a future header), :mod:`.text` is the reader.
"""

from __future__ import annotations

import struct
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .event import FIELD_RE, Event, EventFormat, FormatError

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")

RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
_TS_MSB = 0xF8 << 56  # the 5 bits an absolute time stamp drops (ring_buffer.c TS_MSB)
_PADDING, _TIME_EXTEND, _TIME_STAMP = 29, 30, 31


@dataclass(frozen=True)
class PageLayout:
    """Where ``events/header_page`` puts the page's timestamp, commit and data."""

    ts_offset: int = 0
    commit_offset: int = 8
    commit_size: int = 8
    data_offset: int = 16
    page_size: int = 4096


def parse_header_page(text: str) -> PageLayout:
    """Parse ``events/header_page``; raises :class:`FormatError` for a layout this reader
    does not know (e.g. a 32-bit ``commit``: then the text reader is used)."""
    found = {}
    for m in FIELD_RE.finditer(text):
        decl = m.group("decl").strip()
        fname = decl.split()[-1].split("[")[0]
        found[fname] = (int(m.group("off")), int(m.group("size")))
    try:
        ts_off, ts_size = found["timestamp"]
        c_off, c_size = found["commit"]
        d_off, d_size = found["data"]
    except KeyError as exc:
        raise FormatError(f"header_page without field {exc}") from None
    if ts_size != 8 or c_size != 8:
        raise FormatError(f"header_page: timestamp {ts_size} B, commit {c_size} B "
                          "(this reader knows 8 and 8)")
    return PageLayout(ts_off, c_off, c_size, d_off, d_off + d_size)


def check_header_event(text: str) -> None:
    """Check ``events/header_event`` describes the 5-bit type_len / 27-bit time_delta
    header with padding 29, time extend 30 and time stamp 31; raise FormatError if not."""
    norm = " ".join(text.split())
    want = ("type_len : 5 bits", "time_delta : 27 bits", "padding : type == 29",
            "time_extend : type == 30", "time_stamp : type == 31")
    missing = [w for w in want if w not in norm]
    if missing:
        raise FormatError(f"header_event: not the known layout (missing {missing[0]!r})")


@dataclass
class Page:
    """One page read from ``trace_pipe_raw``: its first timestamp, its events' bytes (kept
    raw: decoded only when a window needs them) and the events lost before it (``-1``: lost,
    count not stored)."""

    cpu: int
    ts_ns: int
    data: bytes
    lost: int = 0
    # what header walks of this page found already (page_last_of), by event-id set
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    # its PageIndex while the page is hot (the reader bounds how many pages keep one)
    index: PageIndex | None = field(default=None, repr=False, compare=False)


def page_info(buf: bytes, layout: PageLayout = PageLayout()) -> tuple[int, int, int]:
    """(timestamp, data size, lost events before the page) from a page's header."""
    if len(buf) < layout.data_offset:
        raise FormatError(f"short page: {len(buf)} bytes")
    ts = _U64.unpack_from(buf, layout.ts_offset)[0]
    commit = _U64.unpack_from(buf, layout.commit_offset)[0]
    size = commit & 0xFFFFFFFF & ~(RB_MISSED_EVENTS | RB_MISSED_STORED)
    lost = 0
    if commit & RB_MISSED_EVENTS:
        lost = -1
        if commit & RB_MISSED_STORED:
            p = layout.data_offset + size
            if p + 8 <= len(buf):
                lost = _U64.unpack_from(buf, p)[0]
    return ts, size, lost


def _abs_ts(ts: int, abs_ts: int) -> int:
    """A TIME_STAMP record's clock value, its 5 dropped top bits taken from the running
    clock ``ts`` with carry (ring_buffer.c ``rb_fix_abs_ts``, 5.16+)."""
    if ts & _TS_MSB:
        abs_ts |= ts & _TS_MSB
        if abs_ts < ts:
            abs_ts += 1 << 59
    return abs_ts


def _records(buf: bytes, layout: PageLayout) -> Iterator[tuple[int, int, int]]:
    """Walk one page's record headers (the ring buffer's format: kernel/trace/ring_buffer.c,
    Documentation/trace/ring-buffer-design.rst): ``(ts, start, length)`` of every data
    record in order, and ``(ts, -1, 0)`` after each time record (TIME_EXTEND, TIME_STAMP),
    so that the last ``ts`` yielded is the page's last timestamp. Padding is skipped; null
    padding, a corrupt length or a record past the page's data end the walk (a truncated
    page, never an exception). The one header walk of every reader below."""
    ts, size, _lost = page_info(buf, layout)
    pos = layout.data_offset
    end = min(pos + size, len(buf))
    unpack_u32 = _U32.unpack_from
    while pos + 4 <= end:
        hdr = unpack_u32(buf, pos)[0]
        type_len = hdr & 0x1F
        delta = hdr >> 5
        if type_len == _PADDING:
            if delta == 0 or pos + 8 > end:
                return  # null padding: the rest of the page is unused
            pos += 4 + unpack_u32(buf, pos + 4)[0]
            continue
        if type_len == _TIME_EXTEND:
            if pos + 8 > end:
                return
            ts += (unpack_u32(buf, pos + 4)[0] << 27) | delta
            pos += 8
            yield ts, -1, 0
            continue
        if type_len == _TIME_STAMP:
            if pos + 8 > end:
                return
            ts = _abs_ts(ts, (unpack_u32(buf, pos + 4)[0] << 27) | delta)
            pos += 8
            yield ts, -1, 0
            continue
        if type_len == 0:
            if pos + 8 > end:
                return
            rlen = unpack_u32(buf, pos + 4)[0]
            if rlen < 4:
                return  # corrupt length: stop this page rather than loop
            start, length = pos + 8, rlen - 4
            nxt = pos + 4 + rlen
        else:
            start, length = pos + 4, type_len * 4
            nxt = start + length
        if nxt > end:
            return  # truncated record
        ts += delta
        pos = nxt
        yield ts, start, length


def id_hits(buf: bytes, ids: set[int] | frozenset[int],
            layout: PageLayout = PageLayout()) -> list[tuple[int, int, int, int, int]]:
    """``(ts, id, common_pid, start, length)`` of the page's records of an id in ``ids``,
    in page order (``start``, ``length``: the record's data, for :func:`decode_record`):
    what ``[(e.ts_ns, id, e.pid) for e in iter_page(..., only=ids)]`` gives for formats
    with common_pid at byte 4 (every kernel's common header), without making an event
    per record. The always-on read of watch --attach (its uprobe hits among every kernel
    event of the probe CPU): the page's data is read as u32 words once (one C call) and
    the header walk is a tight loop over ints, ~3× the generator walk's speed. A page whose
    data is not a whole number of words, or with a record length that is not (never seen:
    the ring buffer aligns records to 4 bytes), is walked by :func:`_records` instead, with
    the same answer."""
    _ts0, size, _lost = page_info(buf, layout)
    d0 = layout.data_offset
    nbytes = min(d0 + size, len(buf)) - d0
    if nbytes <= 0:
        return []
    if nbytes & 3 or sys.byteorder != "little":
        return _id_hits_walk(buf, ids, layout)
    out = _id_hits_words(memoryview(buf)[d0:d0 + nbytes].cast("I").tolist(), _ts0, ids, d0)
    return _id_hits_walk(buf, ids, layout) if out is None else out


def _id_hits_words(w: list[int], ts: int, ids, d0: int
                   ) -> list[tuple[int, int, int, int, int]] | None:
    """:func:`id_hits` on the data area as u32 words (None: a length that is not a whole
    number of words; the caller walks by bytes). Each branch mirrors :func:`_records`."""
    out: list[tuple[int, int, int, int, int]] = []
    append = out.append
    n = len(w)
    i = 0
    while i < n:
        h = w[i]
        t = h & 0x1F
        if 0 < t < _PADDING:  # (most records: a small one, its data right after)
            nxt = i + 1 + t
            if nxt > n:
                return out
            ts += h >> 5
            if t > 1 and (ev := w[i + 1] & 0xFFFF) in ids:
                pid = w[i + 2]
                append((ts, ev, pid - (1 << 32) if pid & 0x80000000 else pid,
                        d0 + 4 * i + 4, 4 * t))
            i = nxt
            continue
        if t == 0:
            if i + 2 > n:
                return out
            rlen = w[i + 1]
            if rlen < 4:
                return out
            if rlen & 3:
                return None
            d, nxt = i + 2, i + 1 + (rlen >> 2)
        elif t == _PADDING:
            if not h >> 5 or i + 2 > n:
                return out
            if w[i + 1] & 3:
                return None
            i += 1 + (w[i + 1] >> 2)
            continue
        else:
            if i + 2 > n:
                return out
            if t == _TIME_EXTEND:
                ts += (w[i + 1] << 27) | (h >> 5)
            else:
                ts = _abs_ts(ts, (w[i + 1] << 27) | (h >> 5))
            i += 2
            continue
        if nxt > n:
            return out
        ts += h >> 5
        i = nxt
        if nxt - d >= 2 and (ev := w[d] & 0xFFFF) in ids:
            pid = w[d + 1]
            append((ts, ev, pid - (1 << 32) if pid & 0x80000000 else pid, d0 + 4 * d,
                    4 * (nxt - d)))
    return out


def _id_hits_walk(buf: bytes, ids, layout: PageLayout
                  ) -> list[tuple[int, int, int, int, int]]:
    out = []
    for ts, start, length in _records(buf, layout):
        if length >= 8 and (ev := buf[start] | (buf[start + 1] << 8)) in ids:
            out.append((ts, ev, _I32.unpack_from(buf, start + 4)[0], start, length))
    return out


def iter_page(buf: bytes, cpu: int, formats: dict[int, EventFormat], *,
              layout: PageLayout = PageLayout(), t_from: int = 0, t_to: int = 1 << 63,
              symbols: Callable[[int], str] | None = None,
              unknown: list | None = None, only: set[int] | None = None) -> Iterator[Event]:
    """The events of one page with ``t_from <= ts <= t_to`` (records outside are skipped
    without decoding; ``only``: decode just these event ids). A record of an id not in
    ``formats`` is counted in ``unknown`` (``[count]``) and skipped. A record running past the
    page's data ends the page (a truncated page, never an exception): the events before it
    are kept."""
    for ts, start, length in _records(buf, layout):
        if ts < t_from or length < 8:
            continue
        if ts > t_to:
            return
        ev_id = buf[start] | (buf[start + 1] << 8)
        if only is not None and ev_id not in only:
            continue
        fmt = formats.get(ev_id)
        if fmt is None:
            if unknown is not None:
                unknown[0] += 1
            continue
        yield fmt.make_event(buf, start, length, ts, cpu, symbols)


def scan_page(buf: bytes, cpu: int, formats: dict[int, EventFormat], *,
              layout: PageLayout = PageLayout(), t_from: int = 0, t_to: int = 1 << 63,
              symbols: Callable[[int], str] | None = None, unknown: list | None = None,
              before_ids: set[int] | None = None) -> tuple[list[Event], Event | None]:
    """What ``list(iter_page(...))`` gives (same events, same ``unknown`` count) and, in
    the same walk of the record headers, the last record of an id in ``before_ids`` with
    ``ts < t_from``, decoded (None without one): the window's first page gives both the
    window's events and who was switched in before it, without a second walk."""
    recs: list[tuple[int, int, int]] = []
    before = None
    track = before_ids is not None  # until the first record at or after t_from
    for ts, start, length in _records(buf, layout):
        if length < 8:
            continue
        if ts < t_from:
            if track and (buf[start] | (buf[start + 1] << 8)) in before_ids:
                before = (ts, start, length)
            continue
        track = False
        if ts > t_to:
            break
        recs.append((ts, start, length))
    out: list[Event] = []
    get = formats.get
    for ts, start, length in recs:
        fmt = get(buf[start] | (buf[start + 1] << 8))
        if fmt is None:
            if unknown is not None:
                unknown[0] += 1
            continue
        out.append(fmt.make_event(buf, start, length, ts, cpu, symbols))
    return out, (decode_record(buf, cpu, formats, before, symbols) if before else None)


def decode_record(buf: bytes, cpu: int, formats: dict[int, EventFormat],
                  rec: tuple[int, int, int],
                  symbols: Callable[[int], str] | None = None) -> Event | None:
    """The :class:`Event` of one record ``(ts, start, length)`` found by a header walk
    (None where its id has no format)."""
    ts, start, length = rec
    fmt = formats.get(buf[start] | (buf[start + 1] << 8))
    if fmt is None:
        return None
    return fmt.make_event(buf, start, length, ts, cpu, symbols)


_UNKNOWN = object()  # PageIndex.evs: a record whose id has no format


class PageIndex:
    """One header walk of a page (:func:`_records`), kept while the page is hot so that the
    windows over it select by bisection and decode each record at most once: ``recs``
    (``(ts, start, length)`` of every data record, in page order), ``tss`` (their
    timestamps), ``marks`` (positions of the records of an id in ``ids``: the sched_switch
    ids), ``ordered`` (timestamps never decrease: always so on the kernels seen; otherwise
    :meth:`select` filters record by record as :func:`scan_page` does) and ``evs`` (the
    events decoded so far: the run ``[da, db)``, grown to cover each selection).

    :meth:`select` gives exactly :func:`scan_page`'s answer. Made by :func:`page_index`."""

    __slots__ = ("ids", "recs", "tss", "marks", "ordered", "evs", "da", "db", "unknown",
                 "formats", "cpu")

    def __init__(self, buf: bytes, ids: frozenset[int], layout: PageLayout) -> None:
        self.ids = ids
        recs = [r for r in _records(buf, layout) if r[2] >= 8]
        self.recs = recs
        self.tss = tss = [r[0] for r in recs]
        self.marks = [k for k, r in enumerate(recs)
                      if (buf[r[1]] | (buf[r[1] + 1] << 8)) in ids]
        self.ordered = all(a <= b for a, b in zip(tss, tss[1:]))
        self.evs: list = [None] * len(recs)
        self.da = self.db = 0
        self.unknown = 0
        self.formats: dict | None = None
        self.cpu = -1

    def last_of(self) -> tuple[tuple[int, int, int] | None, int]:
        """What :func:`page_last_of` gives for ``ids``, from this walk."""
        return (self.recs[self.marks[-1]] if self.marks else None,
                max(self.tss) if self.tss else -1)

    def _decode(self, a: int, b: int, buf: bytes, cpu: int, formats: dict, symbols,
                store: bool) -> tuple[list, int, bool]:
        """(the events of records ``[a, b)``, unknown ids as _UNKNOWN; how many records were
        decoded for them; whether an unknown id is among them). With ``store`` they join
        the decoded run, and only records outside it are decoded."""
        if self.formats is not formats or self.cpu != cpu:
            self.evs = [None] * len(self.recs)
            self.da = self.db = self.unknown = 0
            self.formats, self.cpu = formats, cpu
        recs, get = self.recs, formats.get
        unknown = 0
        makers: dict = {}  # event id -> its format's maker (None: unknown id)

        def dec(x: int, y: int) -> list:
            nonlocal unknown
            out = []
            append = out.append
            for ts, start, length in recs[x:y]:
                ev_id = buf[start] | (buf[start + 1] << 8)
                mk = makers.get(ev_id, _UNKNOWN)
                if mk is _UNKNOWN:
                    fmt = get(ev_id)
                    mk = makers[ev_id] = fmt.maker if fmt is not None else None
                if mk is None:
                    unknown += 1
                    append(_UNKNOWN)
                else:
                    append(mk(buf, start, length, ts, cpu, symbols))
            return out

        if not store:
            return dec(a, b), b - a, unknown > 0
        da, db, evs = self.da, self.db, self.evs
        if da == db:
            evs[a:b] = dec(a, b)
            self.da, self.db, n = a, b, b - a
        else:  # grow the run to cover [a, b) (what lies between is decoded too: one page)
            n = 0
            if a < da:
                evs[a:da] = dec(a, da)
                n += da - a
                self.da = a
            if b > db:
                evs[db:b] = dec(db, b)
                n += b - db
                self.db = b
        self.unknown += unknown
        return evs[a:b], n, self.unknown > 0

    def first_after(self, buf: bytes, cpu: int, formats: dict, t: int, t_max: int,
                    symbols: Callable[[int], str] | None = None) -> Event | None:
        """The first event of the page with ``t < ts <= t_max`` (records of ids without a
        format passed over), decoded alone; None without one."""
        tss, recs = self.tss, self.recs
        ks = range(bisect_right(tss, t), bisect_right(tss, t_max)) if self.ordered else \
            sorted((k for k, ts in enumerate(tss) if t < ts <= t_max), key=tss.__getitem__)
        for k in ks:
            ev = decode_record(buf, cpu, formats, recs[k], symbols)
            if ev is not None:
                return ev
        return None

    def select(self, buf: bytes, cpu: int, formats: dict, t_from: int, t_to: int,
               symbols: Callable[[int], str] | None = None, *, before: bool = False,
               store: bool = True) -> tuple[list[Event], Event | None, int]:
        """(``scan_page(buf, ..., t_from, t_to)``'s events, with ``before``: its last
        record of ``ids`` before ``t_from`` decoded (else None), records decoded now)."""
        tss = self.tss
        b_at = None
        if self.ordered:
            i = bisect_left(tss, t_from)
            j = bisect_right(tss, t_to, i)
            if before and self.marks:
                m = bisect_left(self.marks, i) - 1
                if m >= 0:
                    b_at = self.marks[m]
            got, n, unk = self._decode(i, j, buf, cpu, formats, symbols, store) \
                if j > i else ([], 0, False)
        else:  # scan_page's record-by-record reading
            ks: list[int] = []
            marks = set(self.marks)
            track = before
            for k, ts in enumerate(tss):
                if ts < t_from:
                    if track and k in marks:
                        b_at = k
                    continue
                track = False
                if ts > t_to:
                    break
                ks.append(k)
            got, n, unk = self._decode(ks[0], ks[-1] + 1, buf, cpu, formats, symbols,
                                       store) if ks else ([], 0, False)
            got = [got[k - ks[0]] for k in ks]
        if unk:
            got = [e for e in got if e is not _UNKNOWN]
        prelude = decode_record(buf, cpu, formats, self.recs[b_at], symbols) \
            if b_at is not None else None
        return got, prelude, n + (b_at is not None)


def page_index(page: Page, ids: frozenset[int], layout: PageLayout = PageLayout()
               ) -> tuple[PageIndex, bool]:
    """(the page's :class:`PageIndex` for ``ids``, whether it was made now: one header
    walk), kept on the page (``page.index``; the caller drops it to bound memory)."""
    idx = page.index
    if idx is not None and idx.ids == ids:
        return idx, False
    idx = page.index = PageIndex(page.data, ids, layout)
    return idx, True


def page_may_hold(buf: bytes, ids: frozenset[int], layout: PageLayout = PageLayout()) -> bool:
    """False when no record of the page can be of an id in ``ids``, found without walking
    the headers: a record's id (``common_type``, u16 little-endian) is the first two bytes of
    its data, which starts 4 or 8 bytes after its 4-aligned header, so it lies at a 4-aligned
    offset of the data area; the bytes are searched there (``bytes.find``, C speed). True
    where they occur so aligned (a record of that id, or other bytes that happen to match:
    the caller walks the page then)."""
    d0 = layout.data_offset
    end = min(d0 + page_info(buf, layout)[1], len(buf))
    for ev_id in ids:
        pat = ev_id.to_bytes(2, "little")
        at = buf.find(pat, d0, end)
        while at >= 0:
            if not (at - d0) & 3:
                return True
            at = buf.find(pat, at + 1, end)
    return False


def page_last_of(page: Page, ids: frozenset[int], layout: PageLayout = PageLayout()
                 ) -> tuple[tuple[int, int, int] | None, int]:
    """(``(ts, start, length)`` of the page's last record of an id in ``ids`` or None, the
    latest timestamp of any record in it), headers only, remembered on the page: a page is
    immutable once drained, so the search back for the task current before a window walks
    each kept page once (not at all where its :class:`PageIndex` answers)."""
    memo = page.memo
    if ids not in memo:
        idx = page.index
        memo[ids] = idx.last_of() if idx is not None and idx.ids == ids else \
            _walk_last(page.data, layout, ids)
    return memo[ids]


def _walk_last(buf: bytes, layout: PageLayout, ids) -> tuple[tuple | None, int]:
    last = None
    latest = -1
    for ts, start, length in _records(buf, layout):
        if length >= 8:
            if ts > latest:
                latest = ts
            if (buf[start] | (buf[start + 1] << 8)) in ids:
                last = (ts, start, length)
    return last, latest


def page_last_ts(buf: bytes, layout: PageLayout = PageLayout()) -> int:
    """The timestamp of a page's last record (headers only, nothing decoded)."""
    last = page_info(buf, layout)[0]
    for ts, _start, _length in _records(buf, layout):
        last = ts
    return last
