"""Kernel trace events from tracefs: the event format files, the binary ring-buffer pages of
``per_cpu/cpuN/trace_pipe_raw``, and the text of ``trace`` — all into one :class:`Event`.

Formats (kernel Documentation/trace/events.rst, "Event formats"): each event's
``events/<system>/<name>/format`` file gives its numeric id and, per field, its C type,
offset, size and signedness; the decoder here is built from those files, never from offsets
written in this module, so a kernel that adds or moves a field still decodes.

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

The text of ``trace`` (kernel/trace/trace_output.c) is parsed too: it is the fallback reader
where the binary layout is not the one above (another word size or endianness, a future
header), and the readable form the canned tests use. Its timestamps have µs resolution only
(``%5lu.%06lu``); binary ones have ns.

Both parsers give the same field names (those of the format files) and the same derived
fields, so the timeline (:mod:`agent.trace.timeline`) never knows which reader ran:
``sched_switch.prev_state`` as letters (``R``, ``R+``, ``S``, ``D``...), ``softirq_*.action``
(the vector's name), ``tlb_flush.reason_str``, ``workqueue_execute_*.function`` and
``ipi_send_*.callback``/``callsite`` as symbol names (through a :class:`SymbolResolver`, binary only).
"""

from __future__ import annotations

import re
import struct
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

# --- events ---------------------------------------------------------------------------------


class Event:
    """One trace event: when (``ts_ns``, the instance's trace clock: ``mono`` =
    CLOCK_MONOTONIC, comparable with ``time.monotonic_ns``), where (``cpu``), what (``name``,
    e.g. ``sched_switch``), who was current on that CPU (``pid``, the event's
    ``common_pid``; 0 = idle) and the event's own fields by their format-file names.

    Read-only: events decoded from identical records share one ``fields`` dict
    (:meth:`EventFormat.make_event`), and a window's events may be those of an earlier
    window over the same page (:class:`PageIndex`)."""

    __slots__ = ("ts_ns", "cpu", "name", "pid", "fields")

    def __init__(self, ts_ns: int, cpu: int, name: str, pid: int, fields: dict) -> None:
        self.ts_ns = ts_ns
        self.cpu = cpu
        self.name = name
        self.pid = pid
        self.fields = fields

    def __repr__(self) -> str:
        return f"Event({self.ts_ns}, cpu={self.cpu}, {self.name}, pid={self.pid}, {self.fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (self.ts_ns, self.cpu, self.name, self.pid, self.fields) == (
            other.ts_ns, other.cpu, other.name, other.pid, other.fields)

    def get(self, key: str, default=None):
        return self.fields.get(key, default)


class FormatError(ValueError):
    """A format, header or page that this module cannot decode (the message says what)."""


# --- format files ---------------------------------------------------------------------------

_FIELD_RE = re.compile(
    r"field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);"
    r"(?:\s*signed:(?P<signed>-?\d+);)?")
_SYMBOLIC_RE = re.compile(r"__print_symbolic\(\s*REC->(\w+)\s*,((?:\s*\{[^}]*\}\s*,?)+)\)")
_FLAGS_RE = re.compile(r"__print_flags\(\s*REC->(\w+)[^,]*,\s*\"[^\"]*\"\s*,((?:\s*\{[^}]*\}\s*,?)+)\)")
_PAIR_RE = re.compile(r"\{\s*(0x[0-9a-fA-F]+|-?\d+)\s*,\s*\"([^\"]*)\"\s*\}")

# kinds of field decoders
_INT, _STR, _LOC_STR, _LOC_BYTES, _BYTES = range(5)


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int
    signed: bool
    kind: int
    ctype: str


@dataclass
class EventFormat:
    """One ``events/<system>/<name>/format``: id, fields (common_* ones apart) and the value
    tables of its print format (``__print_symbolic`` / ``__print_flags``) by field."""

    id: int
    system: str
    name: str
    fields: list[Field]
    symbols: dict[str, dict[int, str]] = field(default_factory=dict)
    flags: dict[str, dict[int, str]] = field(default_factory=dict)
    pid_offset: int = 4  # common_pid's offset (every event starts with the common fields)
    flags_offset: int = 2  # common_flags' (TRACE_FLAG_* of the context it fired in)
    _plan: list | None = field(default=None, repr=False)
    # (Struct of common_pid and every field, its size, names, the non-int fields) or False
    # where the fields overlap or come before common_pid: then the per-field plan only
    _fast: tuple | bool | None = field(default=None, repr=False, compare=False)
    # derived values already computed (sched_switch's prev_state letters by value)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)
    _maker: Callable | None = field(default=None, repr=False, compare=False)

    def make_event(self, buf: bytes, start: int, length: int, ts: int, cpu: int,
                   symbols: Callable[[int], str] | None = None) -> Event:
        """The :class:`Event` of the record at ``buf[start:start+length]`` (decode, then
        normalize): the same as ``Event(ts, cpu, name, *decode(...))`` normalized, through a
        closure built once per format (one unpack, fixed strings decoded once per value,
        normalize only for the events it changes, identical records decoded once)."""
        maker = self._maker
        if maker is None:
            maker = self._maker = _make_maker(self)
        return maker(buf, start, length, ts, cpu, symbols)

    @property
    def maker(self) -> Callable:
        """:meth:`make_event`'s closure itself (for loops over many records)."""
        maker = self._maker
        if maker is None:
            maker = self._maker = _make_maker(self)
        return maker

    def decode(self, buf: bytes | memoryview, start: int, length: int) -> tuple[int, dict]:
        """(common_pid, fields) of the record at ``buf[start:start+length]`` (with
        ``irq_ctx`` for :data:`CTX_EVENTS`, from common_flags)."""
        pid, out = self._decode(buf, start, length)
        if self.name in CTX_EVENTS and 0 <= self.flags_offset < length:
            out["irq_ctx"] = irq_ctx(buf[start + self.flags_offset])
        return pid, out

    def _decode(self, buf: bytes | memoryview, start: int, length: int) -> tuple[int, dict]:
        fast = self._fast
        if fast is None:
            fast = self._fast = _make_fast(self.fields, self.pid_offset)
        if fast and length >= fast[1]:
            # the whole record in one unpack_from; the same values as the per-field plan
            vals = fast[0].unpack_from(buf, start)
            out = dict(zip(fast[2], vals[1:]))
            for name, kind, off, rel in fast[3]:
                if kind == _STR:
                    out[name] = out[name].split(b"\0", 1)[0].decode("utf-8", "replace")
                elif kind != _BYTES:  # __data_loc / __rel_loc (see below)
                    out[name] = _loc_value(buf, start, length, out[name],
                                           off + 4 if rel else 0, kind == _LOC_STR)
            return vals[0], out
        plan = self._plan
        if plan is None:
            plan = self._plan = _make_plan(self.fields)
        end = start + length
        pid = _I32.unpack_from(buf, start + self.pid_offset)[0]
        out: dict = {}
        for name, kind, off, size, unpack in plan:
            p = start + off
            if p + size > end:
                break  # a truncated record: keep what fits (never read the next one's bytes)
            if kind == _INT:
                out[name] = unpack(buf, p)[0]
            elif kind == _STR:
                raw = bytes(buf[p:p + size])
                out[name] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == _BYTES:
                out[name] = bytes(buf[p:p + size])
            else:  # __data_loc / __rel_loc (unpack None: relative to this field's end, 5.19+)
                out[name] = _loc_value(buf, start, length, _U32.unpack_from(buf, p)[0],
                                       off + 4 if unpack is None else 0, kind == _LOC_STR)
        return pid, out


_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INT_STRUCTS = {(1, False): struct.Struct("<B"), (1, True): struct.Struct("<b"),
                (2, False): struct.Struct("<H"), (2, True): struct.Struct("<h"),
                (4, False): struct.Struct("<I"), (4, True): struct.Struct("<i"),
                (8, False): struct.Struct("<Q"), (8, True): struct.Struct("<q")}


_INT_CODES = {(1, False): "B", (1, True): "b", (2, False): "H", (2, True): "h",
              (4, False): "I", (4, True): "i", (8, False): "Q", (8, True): "q"}


def _loc_value(buf: bytes, start: int, length: int, loc: int, base: int, as_str: bool):
    """A ``__data_loc`` / ``__rel_loc`` field's value: ``loc`` holds the offset in its low 16
    bits and the length in its high 16; the offset counts from the record's start
    (``base`` 0) or, for ``__rel_loc``, from the end of the field (``base``: its offset + 4).
    Clipped to the record; a string ends at its first NUL."""
    d_off, d_len = (loc & 0xFFFF) + base, loc >> 16
    if d_off + d_len > length:
        d_len = max(0, length - d_off)
    raw = bytes(buf[start + d_off:start + d_off + d_len])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") if as_str else raw


def _make_fast(fields: list[Field], pid_offset: int) -> tuple | bool:
    """One little-endian Struct for common_pid (i32) and every field, in offset order:
    ints by size and sign, char arrays and other fixed bytes as ``Ns``, __data_loc /
    __rel_loc as their u32. False where fields overlap or precede common_pid's end."""
    code, pos = ["<", "x" * pid_offset, "i"], pid_offset + 4
    names, post = [], []
    for f in fields:
        if f.offset < pos:
            return False
        code.append("x" * (f.offset - pos))
        if f.kind == _INT:
            code.append(_INT_CODES[(f.size, f.signed)])
        elif f.kind in (_STR, _BYTES):
            code.append(f"{f.size}s")
            post.append((f.name, f.kind, f.offset, False))
        else:
            if f.size != 4:
                return False
            code.append("I")
            post.append((f.name, f.kind, f.offset, f.ctype.startswith("__rel_loc")))
        names.append(f.name)
        pos = f.offset + f.size
    st = struct.Struct("".join(code))
    return st, st.size, tuple(names), tuple(post)


# the events normalize() changes (every other one's fields are returned as decoded)
def _normalized(name: str) -> bool:
    return name in ("sched_switch", "tlb_flush", "hrtimer_start") or name in _BLOCK_EVENTS \
        or name.startswith(
        ("softirq_", "workqueue_execute", "ipi_send"))


# The events that also get ``irq_ctx``: the context they fired in, from the record's
# ``common_flags`` (kernel/trace/trace.h enum trace_flag_type: TRACE_FLAG_HARDIRQ 0x08,
# TRACE_FLAG_SOFTIRQ 0x10 — serving a softirq, not merely BH disabled —, TRACE_FLAG_NMI
# 0x40, unchanged since 2.6). A wake-up or a signal raised in an interrupt carries as
# ``common_pid`` whatever task the interrupt landed on, not a waker: ``irq_ctx`` says so.
CTX_EVENTS = frozenset({"sched_waking", "sched_wakeup", "sched_wakeup_new", "signal_generate"})
_FLAG_HARDIRQ, _FLAG_SOFTIRQ, _FLAG_NMI = 0x08, 0x10, 0x40


def irq_ctx(flags: int) -> str:
    """``"nmi"``, ``"hardirq"``, ``"softirq"`` or ``""`` (task context) from common_flags."""
    if flags & _FLAG_NMI:
        return "nmi"
    if flags & _FLAG_HARDIRQ:
        return "hardirq"
    if flags & _FLAG_SOFTIRQ:
        return "softirq"
    return ""


# The same from the text's flags column (trace_output.c trace_print_lat_fmt): its third
# character is 'Z' (NMI in a hard IRQ), 'z' (NMI), 'H' (hard IRQ in a softirq), 'h', 's', '.'.
_CTX_CHAR = {"Z": "nmi", "z": "nmi", "H": "hardirq", "h": "hardirq", "s": "softirq"}


_STR_MEMO_MAX = 4096


def _make_maker(fmt: EventFormat) -> Callable:
    """EventFormat.make_event's closure for ``fmt``."""
    fast = fmt._fast
    if fast is None:
        fast = fmt._fast = _make_fast(fmt.fields, fmt.pid_offset)
    name, decode = fmt.name, fmt.decode
    norm = _normalized(name)
    ctx_at = fmt.flags_offset if name in CTX_EVENTS else -1

    def slow(buf, start, length, ts, cpu, symbols):
        pid, fields = decode(buf, start, length)
        if norm:
            normalize(name, fields, fmt, symbols)
        return Event(ts, cpu, name, pid, fields)

    if not fast or any(kind not in (_STR, _BYTES) for _, kind, _, _ in fast[3]):
        return _memoized(name, slow)  # __data_loc strings: decode's own path
    unpack, size, names = fast[0].unpack_from, fast[1], fast[2]
    strs = tuple(n for n, kind, _, _ in fast[3] if kind == _STR)
    memo: dict[bytes, str] = {}

    def make(buf, start, length, ts, cpu, symbols):
        if length < size:
            return slow(buf, start, length, ts, cpu, symbols)
        vals = unpack(buf, start)
        fields = dict(zip(names, vals[1:]))
        for key in strs:  # char arrays (comms): the same 16 bytes decode to the same str
            raw = fields[key]
            text = memo.get(raw)
            if text is None:
                if len(memo) >= _STR_MEMO_MAX:
                    memo.clear()
                text = memo[raw] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            fields[key] = text
        if norm:
            normalize(name, fields, fmt, symbols)
        if ctx_at >= 0:
            fields["irq_ctx"] = irq_ctx(buf[start + ctx_at])
        return Event(ts, cpu, name, vals[0], fields)

    return _memoized(name, make)


_REC_MEMO_MAX = 1024  # records per format (~0.2-0.5 KiB each with their fields)


def _uses_symbols(name: str) -> bool:
    """Whether normalize() resolves this event's fields through the symbol resolver."""
    return name.startswith(("workqueue_execute", "ipi_send")) or name == "hrtimer_start"


def _memoized(name: str, inner: Callable) -> Callable:
    """``inner`` (a make_event closure) behind a memo of the record's bytes: a record's
    fields are a function of its bytes (the timestamp is outside it, in the record header),
    and under a flood most records repeat byte for byte (softirq entry/exit of one vector
    in one task, the same IPI callback), so identical records decode once and share their
    fields dict (read-only: :class:`Event`). Fields resolved through ``symbols`` are
    remembered only for the resolver they were resolved with, once it has loaded
    (:attr:`SymbolResolver.ready`; before that a lookup may answer the hex address), and
    never for another callable. Bounded: cleared at :data:`_REC_MEMO_MAX` records."""
    memo: dict[bytes, tuple[int, dict]] = {}
    sym_dep = _uses_symbols(name)
    memo_sym: list = [None]

    def make(buf, start, length, ts, cpu, symbols):
        if sym_dep and symbols is not memo_sym[0]:
            if symbols is not None and not getattr(symbols, "ready", False):
                return inner(buf, start, length, ts, cpu, symbols)
            memo.clear()
            memo_sym[0] = symbols
        key = buf[start:start + length]
        if type(key) is not bytes:  # a memoryview or bytearray page
            key = bytes(key)
        hit = memo.get(key)
        if hit is not None:
            return Event(ts, cpu, name, hit[0], hit[1])
        ev = inner(buf, start, length, ts, cpu, symbols)
        if len(memo) >= _REC_MEMO_MAX:
            memo.clear()
        memo[key] = (ev.pid, ev.fields)
        return ev

    return make


def _make_plan(fields: list[Field]) -> list:
    plan = []
    for f in fields:
        if f.kind == _INT:
            unpack = _INT_STRUCTS[(f.size, f.signed)].unpack_from
        elif f.kind in (_LOC_STR, _LOC_BYTES):
            unpack = None if f.ctype.startswith("__rel_loc") else _U32.unpack_from
        else:
            unpack = None
        plan.append((f.name, f.kind, f.offset, f.size, unpack))
    return plan


def _field_kind(decl: str, size: int) -> tuple[str, int]:
    """(name, kind) of a field declaration such as ``char prev_comm[16]``."""
    m = re.match(r"(?P<type>.*?)(?P<name>\w+)\s*(?:\[(?P<n>\w*)\])?\s*$", decl.strip())
    if not m:
        raise FormatError(f"cannot read field declaration {decl!r}")
    ctype, name, arr = m.group("type").strip(), m.group("name"), m.group("n")
    if ctype.startswith(("__data_loc", "__rel_loc")):
        return name, _LOC_STR if "char" in ctype else _LOC_BYTES
    if arr is not None:
        return name, _STR if ctype.endswith("char") else _BYTES
    if size in (1, 2, 4, 8):
        return name, _INT
    return name, _BYTES


def _pairs(body: str) -> dict[int, str]:
    return {int(v, 0): s for v, s in _PAIR_RE.findall(body)}


def parse_format(text: str, system: str = "") -> EventFormat:
    """Parse one format file. Raises :class:`FormatError` when it has no name, id or
    fields (a truncated read)."""
    name = ev_id = None
    fields: list[Field] = []
    pid_offset = None
    flags_offset = 2
    print_fmt = ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("name:"):
            name = s.split(":", 1)[1].strip()
        elif s.startswith("ID:"):
            ev_id = int(s.split(":", 1)[1])
        elif s.startswith("field:"):
            m = _FIELD_RE.match(s)
            if not m:
                raise FormatError(f"cannot read field line {s!r}")
            size = int(m.group("size"))
            fname, kind = _field_kind(m.group("decl").replace("field:", ""), size)
            signed = m.group("signed") == "1"
            if fname == "common_pid":
                pid_offset = int(m.group("off"))
            elif fname == "common_flags" and size == 1:
                flags_offset = int(m.group("off"))
            if fname.startswith("common_"):
                continue
            decl = m.group("decl").strip()
            fields.append(Field(fname, int(m.group("off")), size, signed, kind, decl))
        elif s.startswith("print fmt:"):
            print_fmt = s
    if name is None or ev_id is None or pid_offset is None:
        raise FormatError("format file without name, ID or common_pid")
    fmt = EventFormat(ev_id, system, name, fields, pid_offset=pid_offset,
                      flags_offset=flags_offset)
    for fname, body in _SYMBOLIC_RE.findall(print_fmt):
        fmt.symbols[fname] = _pairs(body)
    for fname, body in _FLAGS_RE.findall(print_fmt):
        fmt.flags[fname] = _pairs(body)
    return fmt


# --- derived fields (the same for both readers) -----------------------------------------------

# The softirq vectors of include/linux/interrupt.h (softirq_to_name): the fallback where a
# format's print fmt has no __print_symbolic table.
SOFTIRQ_NAMES = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED",
                 "HRTIMER", "RCU")
# TASK_REPORT states of include/linux/sched.h as sched_switch prints them (6.x); used only
# where the format has no __print_flags table for prev_state.
_STATE_FLAGS = {0x01: "S", 0x02: "D", 0x04: "T", 0x08: "t", 0x10: "X", 0x20: "Z", 0x40: "P",
                0x80: "I"}


def task_state(value: int, table: dict[int, str] | None = None) -> str:
    """sched_switch's ``prev_state`` as the kernel prints it: ``R`` (preempted while
    runnable), ``S``, ``D``..., with ``+`` when the preempted bit above the states is set."""
    table = table or _STATE_FLAGS
    top = max(table)
    mask = (top << 1) - 1
    bits = value & mask
    letters = "|".join(s for v, s in sorted(table.items()) if bits & v) if bits else "R"
    return letters + ("+" if value & (top << 1) else "")


class SymbolResolver:
    """Kernel text addresses to names through ``/proc/kallsyms``.

    The table is read once: ~0.3 s on a 2-vCPU guest (0.15 s of it the kernel
    formatting 122k lines), so :meth:`load_async` starts it in a thread when the event
    source opens, off the spike path; a lookup before it is done waits for it (at most
    ``wait_s``) and then answers the hex address. Addresses shown as 0 (a
    ``kptr_restrict`` the reader cannot see through) resolve to their hex form. Memory:
    the addresses in an ``array('Q')`` and the names in one bytes blob (~3 MiB here)."""

    def __init__(self, read_bytes: Callable[[], bytes | None], wait_s: float = 2.0) -> None:
        self._read = read_bytes
        self._addrs: array | None = None
        self._offs: array = array("I")
        self._blob = b""
        self._cache: dict[int, str] = {}
        self._done = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self._wait_s = wait_s

    @property
    def ready(self) -> bool:
        """Whether the table is loaded (from then on a lookup's answer never changes)."""
        return self._done.is_set()

    def load_async(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._load, name="hftagent-kallsyms", daemon=True).start()

    def _load(self) -> None:
        try:
            data = self._read() or b""
            pairs = [(int(a, 16), n) for a, n in _KALLSYMS_RE.findall(data)]
            pairs = [p for p in pairs if p[0]]
            pairs.sort()
            addrs = array("Q", (a for a, _ in pairs))
            offs = array("I")
            pos = 0
            for _, n in pairs:
                offs.append(pos)
                pos += len(n) + 1
            self._blob = b"\0".join(n for _, n in pairs) + b"\0"
            self._offs = offs
            self._addrs = addrs
        except (OSError, ValueError, OverflowError):
            self._addrs = array("Q")
        finally:
            self._done.set()

    def address(self, name: str) -> int | None:
        """The address of the text symbol ``name`` once the table is loaded (never waits:
        None before, or where it is absent or hidden by kptr_restrict)."""
        if not self.ready or not self._addrs:
            return None
        key = name.encode() + b"\0"
        if self._blob.startswith(key):
            at = 0
        else:
            at = self._blob.find(b"\0" + key) + 1
            if at <= 0:
                return None
        i = bisect_left(self._offs, at)
        return self._addrs[i] if i < len(self._offs) and self._offs[i] == at else None

    def __call__(self, addr: int) -> str:
        hit = self._cache.get(addr)
        if hit is not None:
            return hit
        with self._lock:
            start = not self._started
            self._started = True
        if start:
            self._load()
        elif not self._done.wait(self._wait_s):
            return hex(addr)
        addrs = self._addrs if self._addrs is not None else array("Q")
        i = bisect_right(addrs, addr) - 1
        if i >= 0 and addr - addrs[i] < (1 << 20):
            o = self._offs[i]
            name = self._blob[o:self._blob.index(b"\0", o)].decode("utf-8", "replace")
        else:
            name = hex(addr)
        if len(self._cache) < 4096:
            self._cache[addr] = name
        return name


_KALLSYMS_RE = re.compile(rb"^([0-9a-fA-F]+) [tTwW] (\S+)", re.M)


_BLOCK_EVENTS = frozenset({"block_rq_issue", "block_rq_complete"})
_BLOCK_KEEP = frozenset({"dev", "rwbs", "sector", "nr_sector"})


def normalize(name: str, fields: dict, fmt: EventFormat | None = None,
              symbols: Callable[[int], str] | None = None) -> dict:
    """Add the derived fields both readers share (see the module docstring)."""
    if name == "sched_switch":
        st = fields.get("prev_state")
        if isinstance(st, int):
            if fmt is None:
                fields["prev_state"] = task_state(st)
            else:
                letters = fmt._memo.get(st)
                if letters is None:
                    if len(fmt._memo) > 256:
                        fmt._memo.clear()
                    letters = fmt._memo[st] = task_state(st, fmt.flags.get("prev_state"))
                fields["prev_state"] = letters
    elif name.startswith("softirq_"):
        vec = fields.get("vec")
        if isinstance(vec, int) and "action" not in fields:
            table = fmt.symbols.get("vec") if fmt else None
            fields["action"] = (table or {}).get(vec) or (
                SOFTIRQ_NAMES[vec] if 0 <= vec < len(SOFTIRQ_NAMES) else f"vec{vec}")
    elif name == "tlb_flush":
        pages = fields.get("pages")
        if isinstance(pages, int) and pages >= 1 << 63:
            fields["pages"] = pages - (1 << 64)  # "%ld": TLB_FLUSH_ALL is -1
        r = fields.get("reason")
        if isinstance(r, int) and "reason_str" not in fields and fmt is not None:
            fields["reason_str"] = fmt.symbols.get("reason", {}).get(r, str(r))
    elif name in _BLOCK_EVENTS:
        # both readers: the device as the text prints it ("8,0": MAJOR/MINOR of a kernel
        # dev_t, 12/20 bits), the request's first sector, its length and its rwbs
        dev = fields.get("dev")
        if isinstance(dev, int):
            fields["dev"] = f"{dev >> 20},{dev & ((1 << 20) - 1)}"
        for key in [k for k in fields if k not in _BLOCK_KEEP]:
            del fields[key]
    elif name.startswith("workqueue_execute") or name.startswith("ipi_send") or \
            name == "hrtimer_start":
        # the text prints the work struct (and the hrtimer) as a hashed %p: neither reader
        # keeps it, so both give the same fields (items are paired by the kworker's pid);
        # hrtimer_start keeps its callback and expiry (softexpires: asked; expires: + slack)
        fields.pop("work", None)
        if name == "hrtimer_start":
            for key in ("hrtimer", "mode", "was_armed"):
                fields.pop(key, None)
        for key in ("function", "callback", "callsite"):
            v = fields.get(key)
            if isinstance(v, int):
                fields[key] = symbols(v) if symbols is not None else hex(v)
    return fields


# --- binary pages ---------------------------------------------------------------------------

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
    for m in _FIELD_RE.finditer(text):
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
            abs_ts = (unpack_u32(buf, pos + 4)[0] << 27) | delta
            if ts & _TS_MSB:  # rb_fix_abs_ts: restore the dropped bits, with carry
                abs_ts |= ts & _TS_MSB
                if abs_ts < ts:
                    abs_ts += 1 << 59
            ts = abs_ts
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


# --- text (the instance's ``trace`` file) ---------------------------------------------------

# "          <idle>-0       [001] d.h1.   547.390127: irq_handler_entry: irq=36 name=virtio1"
# comm may hold spaces and dashes (the last "-<digits>" before the CPU column is the pid); the
# optional "(tgid)" column (option record-tgid) and the flags column (irq-info) may be absent.
_LINE_RE = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:(?P<flags>[\w.]{4,6})\s+)?(?P<sec>\d+)\.(?P<usec>\d{6}):\s+(?P<event>\w+):\s?(?P<rest>.*)$")
_LOST_RE = re.compile(r"CPU:(?P<cpu>\d+) \[LOST (?P<n>\d+) EVENTS\]")
_STARTED_RE = re.compile(r"#{5} CPU (?P<cpu>\d+) buffer started #{4}")

_SWITCH_RE = re.compile(
    r"prev_comm=(?P<prev_comm>.*) prev_pid=(?P<prev_pid>-?\d+) prev_prio=(?P<prev_prio>-?\d+) "
    r"prev_state=(?P<prev_state>\S+) ==> next_comm=(?P<next_comm>.*) "
    r"next_pid=(?P<next_pid>-?\d+) next_prio=(?P<next_prio>-?\d+)$")
_WAKE_RE = re.compile(r"comm=(?P<comm>.*) pid=(?P<pid>-?\d+) prio=(?P<prio>-?\d+)"
                      r"(?: target_cpu=(?P<target_cpu>\d+))?(?: success=\d+)?$")
_MIGRATE_RE = re.compile(r"comm=(?P<comm>.*) pid=(?P<pid>-?\d+) prio=(?P<prio>-?\d+) "
                         r"orig_cpu=(?P<orig_cpu>-?\d+) dest_cpu=(?P<dest_cpu>-?\d+)$")
_IRQ_ENTRY_RE = re.compile(r"irq=(?P<irq>-?\d+) name=(?P<name>.*)$")
_IRQ_EXIT_RE = re.compile(r"irq=(?P<irq>-?\d+) ret=(?P<ret>\w+)$")
_SOFTIRQ_RE = re.compile(r"vec=(?P<vec>\d+) \[action=(?P<action>\w+)\]$")
_WQ_RE = re.compile(r"work struct (?:0x)?(?P<work>[0-9a-fA-F]+): function (?P<function>\S+)")
_TLB_RE = re.compile(r"pages:(?P<pages>-?\d+) reason:(?P<reason_str>.*) \((?P<reason>-?\d+)\)$")
_SIGNAL_RE = re.compile(r"sig=(?P<sig>-?\d+) errno=(?P<errno>-?\d+) code=(?P<code>-?\d+) "
                        r"comm=(?P<comm>.*) pid=(?P<pid>-?\d+) grp=(?P<group>-?\d+) "
                        r"res=(?P<result>-?\d+)$")
# block_rq_issue / block_rq_complete: "8,0 R 4096 () 2048 + 8 none,0,0 [comm]" (the bytes
# column on issue only; the ioprio column since 6.5)
_BLOCK_RE = re.compile(r"^(?P<dev>\d+,\d+) (?P<rwbs>\S+) (?:\d+ )?\(.*?\) (?P<sector>\d+) "
                       r"\+ (?P<nr_sector>\d+)")
_KV_RE = re.compile(r"(\w+)=(\S*)")
_INT_KEYS = {"prev_pid", "prev_prio", "next_pid", "next_prio", "pid", "prio", "target_cpu",
             "orig_cpu", "dest_cpu", "irq", "vec", "pages", "reason", "vector", "cpu",
             "sig", "errno", "code", "group", "result", "sector", "nr_sector", "expires",
             "softexpires"}


def _int_or_str(key: str, v: str):
    if key in _INT_KEYS:
        try:
            return int(v, 10)
        except ValueError:
            return v
    return v


def _text_fields(name: str, rest: str) -> dict | None:
    """Fields of one event from its printed form; None when the text does not match the
    event's print format (a truncated or garbled line)."""
    if name == "sched_switch":
        m = _SWITCH_RE.match(rest)
    elif name in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
        m = _WAKE_RE.match(rest)
    elif name == "sched_migrate_task":
        m = _MIGRATE_RE.match(rest)
    elif name == "irq_handler_entry":
        m = _IRQ_ENTRY_RE.match(rest)
    elif name == "irq_handler_exit":
        m = _IRQ_EXIT_RE.match(rest)
        if m:  # printed as ret ? "handled" : "unhandled": the binary field is the int
            return {"irq": int(m.group("irq")), "ret": int(m.group("ret") == "handled")}
        return None
    elif name.startswith("softirq_"):
        m = _SOFTIRQ_RE.match(rest)
    elif name.startswith("workqueue_execute"):
        m = _WQ_RE.match(rest)
        if m:
            return {"function": m.group("function")}
        return None
    elif name == "tlb_flush":
        m = _TLB_RE.match(rest)
    elif name == "signal_generate":
        m = _SIGNAL_RE.match(rest)
    elif name in _BLOCK_EVENTS:
        m = _BLOCK_RE.match(rest)
    elif name == "hrtimer_start":
        out = {k: _int_or_str(k, v) for k, v in _KV_RE.findall(rest)}
        if isinstance(out.get("function"), str):  # "%ps": "hrtimer_wakeup" (or +0x0/0x10)
            out["function"] = out["function"].split("+", 1)[0]
        for key in ("hrtimer", "mode", "was_armed"):
            out.pop(key, None)
        return out if "softexpires" in out else None
    elif name.startswith("ipi_send"):
        out = {k: _int_or_str(k, v) for k, v in _KV_RE.findall(rest)}
        for key in ("callsite", "callback"):  # "%pS": "func+0x0/0x10" -> "func"
            if isinstance(out.get(key), str):
                out[key] = out[key].split("+", 1)[0]
        return out if "callback" in out else None
    else:  # irq_vectors *_entry/_exit ("vector=236") and anything printed as key=value
        return {k: _int_or_str(k, v) for k, v in _KV_RE.findall(rest)}
    if not m:
        return None
    return {k: _int_or_str(k, v) for k, v in m.groupdict().items() if v is not None}


@dataclass
class TextStats:
    """What a text parse met besides events: lost-event markers (per CPU), CPUs whose
    buffer starts later than the others (the older part overwritten), lines it could not
    read, events it does not know, and timestamps that went backwards on one CPU."""

    lost: dict[int, int] = field(default_factory=dict)
    started: dict[int, int] = field(default_factory=dict)  # cpu -> ts of its first event
    bad_lines: int = 0
    unknown: int = 0
    backwards: int = 0


def parse_text(lines: Iterable[str], known: set[str] | None = None, *, t_from: int = 0,
               t_to: int = 1 << 63, stats: TextStats | None = None) -> list[Event]:
    """Events of ``trace`` text (header comments skipped), in ``[t_from, t_to]`` ns.

    ``known``: the event names to keep (others are counted in ``stats.unknown``); None keeps
    every event whose text parses. A line that does not parse is counted in
    ``stats.bad_lines``, never raised. A timestamp below the previous one on the same CPU
    (a clock that wrapped or was reset under the reader) is counted in ``stats.backwards``
    and that event dropped: durations never go negative."""
    st = stats if stats is not None else TextStats()
    out: list[Event] = []
    last: dict[int, int] = {}
    pending_start: set[int] = set()
    for line in lines:
        if not line or line.startswith("#"):
            m = _STARTED_RE.search(line) if line else None
            if m:
                pending_start.add(int(m.group("cpu")))
            continue
        m = _LOST_RE.search(line)
        if m:
            c = int(m.group("cpu"))
            st.lost[c] = st.lost.get(c, 0) + int(m.group("n"))
            continue
        m = _LINE_RE.match(line)
        if not m:
            st.bad_lines += 1
            continue
        name = m.group("event")
        if known is not None and name not in known:
            st.unknown += 1
            continue
        ts = int(m.group("sec")) * 1_000_000_000 + int(m.group("usec")) * 1000
        cpu = int(m.group("cpu"))
        if ts < last.get(cpu, -1):
            st.backwards += 1
            continue
        last[cpu] = ts
        if cpu in pending_start:
            pending_start.discard(cpu)
            st.started[cpu] = ts
        if ts < t_from or ts > t_to:
            continue
        fields = _text_fields(name, m.group("rest"))
        if fields is None:
            st.bad_lines += 1
            continue
        if name in CTX_EVENTS and m.group("flags") and len(m.group("flags")) >= 3:
            fields["irq_ctx"] = _CTX_CHAR.get(m.group("flags")[2], "")
        out.append(Event(ts, cpu, name, int(m.group("pid")), normalize(name, fields)))
    return out
