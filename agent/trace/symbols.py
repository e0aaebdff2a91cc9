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
