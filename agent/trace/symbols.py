"""Kernel text addresses to symbol names, from ``/proc/kallsyms``, loaded once in a thread.

The binary pages carry work-item functions, IPI callbacks and hrtimer callbacks as kernel
addresses; :class:`SymbolResolver` names them (``vmstat_update``...) as the ``trace`` text
prints them, so both readers give the same fields. The table is read in the background
when the event source opens (a few hundred ms), off the spike path; the reader of the file
is passed in (the Host decides where ``kallsyms`` lives).
"""

from __future__ import annotations

import re
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable


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

    def wait(self, timeout_s: float) -> bool:
        """Wait for the table (at most ``timeout_s``); True once it is loaded. Not started:
        True at once (nothing is running)."""
        return not self._started or self._done.wait(timeout_s)

    def load_async(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._load, name="hftagent-kallsyms", daemon=True).start()

    def _load(self) -> None:
        try:
            self._addrs, self._offs, self._blob = parse_kallsyms(self._read() or b"")
        except (OSError, ValueError, OverflowError):
            self._addrs = array("Q")
        finally:
            self._done.set()

    def address(self, name: str) -> int | None:
        """The address of the text symbol ``name`` once the table is loaded (never waits:
        None before, or where it is absent or hidden by kptr_restrict; of several symbols of
        one name, the first listed)."""
        if not self.ready or not self._addrs:
            return None
        at = self._blob.find(b"\0" + name.encode() + b"\0") + 1
        if at <= 0:
            return None
        try:
            return self._addrs[self._offs.index(at)]
        except ValueError:
            return None

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
        if i > 0:
            i = bisect_left(addrs, addrs[i], 0, i)  # the first listed of its aliases
        if i >= 0 and addr - addrs[i] < (1 << 20):
            o = self._offs[i]
            name = self._blob[o:self._blob.index(b"\0", o)].decode("utf-8", "replace")
        else:
            name = hex(addr)
        if len(self._cache) < 4096:
            self._cache[addr] = name
        return name


_KALLSYMS_RE = re.compile(rb"^([0-9a-fA-F]+) [tTwW] ([^\t\n]+)", re.M)
_TEXT = b"tTwW"
_HEX = bytes(int(chr(c), 16) if chr(c) in "0123456789abcdefABCDEF" else 255 for c in range(256))


def parse_kallsyms(data: bytes) -> tuple[array, array, bytes]:
    """The text symbols (types t T w W) of a kallsyms table, zero addresses dropped: their
    addresses in ascending order, each one's name's offset in the blob, and the blob, where
    each name has a NUL before and after it. Symbols at one address (aliases) keep the
    table's order (the lookup names the first listed, as the kernel's own does: kallsyms.c
    get_symbol_pos).

    In array operations over the file where every line has the address width of the first
    (~30 ms for 122k lines, where the line-by-line parse took ~170 ms of CPU at every watch
    start, issue #38): a name runs to its line's end or to the tab before its module, and
    the blob is the table itself with a NUL written on each side of every name kept. A table
    of another shape goes through :func:`_parse_lines`."""
    import numpy as np
    w = data.find(b" ")
    if not 0 < w <= 16:
        return _parse_lines(data)
    buf = np.frombuffer(data, dtype=np.uint8)
    starts = np.flatnonzero(buf == 10) + 1
    starts = np.concatenate(([0], starts[starts < len(buf)]))
    if starts[-1] + w + 3 > len(buf):  # a last line too short to hold a symbol
        return _parse_lines(data)
    if not ((buf[starts + w] == 32) & (buf[starts + w + 2] == 32)).all():
        return _parse_lines(data)  # a line whose address is not of the first line's width
    text = np.zeros(256, dtype=bool)
    text[list(_TEXT)] = True
    s = starts[text[buf[starts + w + 1]]]
    digits = np.frombuffer(_HEX, dtype=np.uint8)[buf[s[:, None] + np.arange(w)]]
    if (digits > 15).any():
        return _parse_lines(data)
    addr = np.zeros(len(s), dtype=np.uint64)
    for k in range(w):
        addr = addr * np.uint64(16) + digits[:, k]
    first = s + w + 3  # each name's first byte
    ends = np.append(np.flatnonzero((buf == 9) | (buf == 10)), len(buf))
    last = ends[np.searchsorted(ends, first)]  # the tab or newline after each name
    keep = (addr != 0) & (last > first)  # (an empty name: the regex matches no such line)
    addr, first, last = addr[keep], first[keep], last[keep]
    order = np.argsort(addr, kind="stable")
    blob = bytearray(len(data) + 1)
    blob[:len(data)] = data
    nul = np.frombuffer(blob, dtype=np.uint8)
    nul[first - 1] = 0
    nul[last] = 0
    return array("Q", addr[order].astype("<u8").tobytes()), \
        array("I", first[order].astype(np.uint32).tobytes()), bytes(blob)


def _parse_lines(data: bytes) -> tuple[array, array, bytes]:
    """:func:`parse_kallsyms`' answer line by line (any address width), the blob the names
    alone in address order."""
    pairs = [(a, n) for a, n in ((int(a, 16), n) for a, n in _KALLSYMS_RE.findall(data)) if a]
    pairs.sort(key=lambda p: p[0])  # (stable: aliases in the table's order)
    offs = array("I")
    pos = 1
    for _, n in pairs:
        offs.append(pos)
        pos += len(n) + 1
    return array("Q", (a for a, _ in pairs)), offs, b"\0" + b"".join(n + b"\0" for _, n in pairs)
