"""The event model: one :class:`Event` per kernel trace event, whichever reader produced it,
and the decoder of its fields, built from the kernel's own format files.

Formats (kernel Documentation/trace/events.rst, "Event formats"): each event's
``events/<system>/<name>/format`` file gives its numeric id and, per field, its C type,
offset, size and signedness; :func:`parse_format` builds an :class:`EventFormat` from those
files, never from offsets written in this module, so a kernel that adds or moves a field
still decodes. :meth:`EventFormat.make_event` turns one binary record into an
:class:`Event` (the record walk is :mod:`.pages`'s). Both readers (:mod:`.pages`, binary;
:mod:`.text`, the ``trace`` text) give the same field names (those of the format files) and
the same derived fields (:func:`normalize`), so the timeline (:mod:`.timeline`) never knows
which reader ran: ``sched_switch.prev_state`` as letters (``R``, ``R+``, ``S``, ``D``...),
``softirq_*.action`` (the vector's name), ``tlb_flush.reason_str``,
``workqueue_execute_*.function`` and ``ipi_send_*.callback``/``callsite`` as symbol names
(through a :class:`agent.trace.symbols.SymbolResolver`, binary only).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

# --- events ---------------------------------------------------------------------------------


class Event:
    """One trace event: when (``ts_ns``, the instance's trace clock: ``mono`` =
    CLOCK_MONOTONIC, comparable with ``time.monotonic_ns``), where (``cpu``), what (``name``,
    e.g. ``sched_switch``), who was current on that CPU (``pid``, the event's
    ``common_pid``; 0 = idle) and the event's own fields by their format-file names.

    Read-only: events decoded from identical records share one ``fields`` dict
    (:meth:`EventFormat.make_event`), and a window's events may be those of an earlier
    window over the same page (:class:`agent.trace.pages.PageIndex`)."""

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

FIELD_RE = re.compile(
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
    return name in ("sched_switch", "tlb_flush", "hrtimer_start") or name in BLOCK_EVENTS \
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
    (:attr:`agent.trace.symbols.SymbolResolver.ready`; before that a lookup may answer the
    hex address), and never for another callable. Bounded: cleared at :data:`_REC_MEMO_MAX` records."""
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
            m = FIELD_RE.match(s)
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


BLOCK_EVENTS = frozenset({"block_rq_issue", "block_rq_complete"})
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
    elif name in BLOCK_EVENTS:
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
