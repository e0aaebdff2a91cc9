"""Token layouts: where the kept values of a /proc or /sys file sit in its whitespace-split
tokens, so that a read with the same shape is one ``bytes.split`` and two ``itemgetter`` calls.

The text layout of /proc/stat, /proc/interrupts, /proc/softirqs or /proc/vmstat does not change
between two reads unless a CPU, an IRQ or a counter appears or goes: only the numbers do. Each
collector module builds a :class:`TokenLayout` next to its parser (``layout(key, data)``),
from bytes the parser accepted; :meth:`TokenLayout.values` of a later read is then either None
(another shape: the caller parses the bytes and builds a new layout) or exactly what the parser
returns for them. A value token must be what the parsers accept (collectors/parsers.py
``parse_uint``: ASCII digits, at most 20; with ``signed``, ``parse_int``'s optional "-"):
"nan", "-5", "+7", "1e9" or "٣" are not a number here either.

What a layout checks: the token count, the line count, the name tokens that place the rows it
keeps, and every value it keeps. What it does not: tokens the watch does not keep (another
CPU's column when the collector follows some CPUs, a vmstat counter it leaves out, a task's
state letter), and a line break moved within a read (one removed and one added elsewhere, with
every name still in place). A read with garbage only there gives the kept values; the parser,
which reads every token and line, refuses it. The kernel prints neither.

Measured hot on a 2-CPU VM: /proc/softirqs 8.5 → 5 µs per call, /proc/interrupts 88 → 70 µs
(~60 µs of it is the kernel generating the file).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import itemgetter

from collectors.parsers import ParseError

MAX_DIGITS = 20  # collectors.parsers.parse_uint's default: any u64

# Characters on which str.split()/str.splitlines() (collectors/parsers.py) and bytes.split()
# (the layouts) disagree: line breaks for splitlines that bytes.split(b"\n") does not break at
# (\r, \v, \f, \x1c-\x1e) and \x1f, a space to str.split() only. The kernel prints none of them.
_SPLIT_DIFFERS = re.compile(rb"[\r\x0b\x0c\x1c-\x1f]")


def parser_text(data: bytes, what: str) -> str:
    """``data`` as text for collectors/parsers.py such that the parser's tokens and lines are
    ``data.split()``'s and ``data.split(b"\\n")``'s (so a layout built from the bytes puts
    its values where the parser reads them): UTF-8, an undecodable byte becoming U+FFFD; a
    character on which the two splits disagree (above, or a non-ASCII space such as U+00A0)
    raises :class:`~collectors.parsers.ParseError`. Pure."""
    if _SPLIT_DIFFERS.search(data):
        raise ParseError(f"control character in {what}")
    text = data.decode(errors="replace")
    if not text.isascii() and any(c.isspace() for c in text if not c.isascii()):
        raise ParseError(f"non-ASCII space in {what}")
    return text


def _getter(pos: Sequence[int]) -> Callable[[list[bytes]], tuple]:
    if len(pos) > 1:
        return itemgetter(*pos)
    if len(pos) == 1:
        i = pos[0]
        return lambda tok: (tok[i],)
    return lambda tok: ()


class TokenLayout:
    """Where the kept values of one file sit in its whitespace-split tokens.

    ``n``: the token count of the read the layout was built from; ``name_pos``/``names``:
    tokens that identify the layout (row names such as ``b"NET_RX:"``, ``b"cpu1"``);
    ``val_pos``/``keys``: the value tokens and the signal names they become;
    ``prefixes`` (optional, one per value): bytes the value token must start with and that
    are not part of the number (PSI's ``total=``); ``signed``: a value may start with "-"
    (/proc/vmstat, read with ``parse_int``); else values are unsigned (``parse_uint``);
    ``lines``: the read's count of b"\\n" (None: not checked).
    """

    __slots__ = ("n", "names", "keys", "name_pos", "val_pos", "prefixes", "signed", "lines",
                 "_names_at", "_vals_at", "_strip")

    def __init__(self, n: int, name_pos: Sequence[int], names: Sequence[bytes],
                 val_pos: Sequence[int], keys: Sequence[str],
                 prefixes: Sequence[bytes] | None = None, signed: bool = False,
                 lines: int | None = None) -> None:
        if len(name_pos) != len(names) or len(val_pos) != len(keys) or \
                (prefixes is not None and len(prefixes) != len(keys)):
            raise ValueError("layout positions and names differ in length")
        self.n = n
        self.names = tuple(names)
        self.keys = tuple(keys)
        self.name_pos = tuple(name_pos)
        self.val_pos = tuple(val_pos)
        self.prefixes = tuple(prefixes) if prefixes is not None else (b"",) * len(keys)
        self.signed = bool(signed)
        self.lines = lines
        self._names_at = _getter(self.name_pos)
        self._vals_at = _getter(self.val_pos)
        self._strip = any(self.prefixes)

    def same_as(self, other: TokenLayout | None) -> bool:
        """Whether ``other`` describes the same file layout."""
        return other is not None and (self.n, self.names, self.keys, self.name_pos,
                                      self.val_pos, self.prefixes, self.signed, self.lines) == \
            (other.n, other.names, other.keys, other.name_pos, other.val_pos, other.prefixes,
             other.signed, other.lines)

    @classmethod
    def of(cls, data: bytes, name_pos: Sequence[int], names: Sequence[bytes],
           val_pos: Sequence[int], keys: Sequence[str], **kw) -> TokenLayout:
        """A layout of the read ``data`` (its token and line counts)."""
        return cls(len(data.split()), name_pos, names, val_pos, keys,
                   lines=data.count(b"\n"), **kw)

    def values(self, data: bytes) -> dict[str, float] | None:
        """The kept values of the read ``data``, or None when it does not have this layout
        or a value is not a number the parsers accept (the caller parses)."""
        tok = data.split()
        if len(tok) != self.n or self._names_at(tok) != self.names or \
                (self.lines is not None and data.count(b"\n") != self.lines):
            return None
        vals = self._vals_at(tok)
        if not vals:
            return {}  # (a CPU filter that matches no column of this file)
        if self._strip:
            if not all(map(bytes.startswith, vals, self.prefixes)):
                return None
            vals = tuple(map(bytes.removeprefix, vals, self.prefixes))
        if self.signed:
            digits = tuple(map(bytes.removeprefix, vals, repeat(b"-")))
            if not all(map(bytes.isdigit, digits)) or max(map(len, digits)) > MAX_DIGITS:
                return None
            # through int: "-0" is 0.0, as parse_int reads it (float(b"-0") is -0.0)
            return dict(zip(self.keys, map(float, map(int, vals))))
        # bytes.isdigit is ASCII digits only ("٣" in UTF-8 is not); float() alone took
        # "nan", "-5", "+7", "1e9", "1_0". A split token is never empty, so one isdigit of
        # them joined checks them all; a stripped prefix may leave an empty one.
        if not (all(map(bytes.isdigit, vals)) if self._strip else b"".join(vals).isdigit()) \
                or max(map(len, vals)) > MAX_DIGITS:
            return None
        return dict(zip(self.keys, map(float, vals)))  # (as many keys as values: __init__)


class LayoutBuilder:
    """Accumulates a :class:`TokenLayout` line by line (``line.split()`` tokens at a running
    offset: ``data.split()`` is the concatenation of every line's split)."""

    def __init__(self) -> None:
        self.off = 0
        self.name_pos: list[int] = []
        self.names: list[bytes] = []
        self.val_pos: list[int] = []
        self.keys: list[str] = []
        self.prefixes: list[bytes] = []

    def name(self, rel: int, tok: bytes) -> None:
        self.name_pos.append(self.off + rel)
        self.names.append(tok)

    def value(self, rel: int, key: str, prefix: bytes = b"") -> None:
        self.val_pos.append(self.off + rel)
        self.keys.append(key)
        self.prefixes.append(prefix)

    def advance(self, ntok: int) -> None:
        self.off += ntok

    def build(self, data: bytes, signed: bool = False) -> TokenLayout:
        """The layout of the read ``data`` the lines came from."""
        return TokenLayout(self.off, self.name_pos, self.names, self.val_pos, self.keys,
                           self.prefixes, signed, data.count(b"\n"))
