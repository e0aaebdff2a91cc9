"""watch --attach's always-on pairing in C (hftpair.c, loaded with ctypes): the calls rings'
pages → the process's calls as rows of :data:`agent.client.FIELDS`, in one C call a read.

Why: a quiet attached service costs watch a read every loop step (~7 a second), and the
Python walk of the pages and pairing of the hits was a third of watch's own CPU (issue #38:
~600 µs a read of ~140 hits, cold, under Linux 6.18 in a KVM guest; ~300 µs here, most of it
the page reads and the call into C, paid cold after each sleep: one C call a read). The Python pairing
(:meth:`agent.watch.latency.attached.AttachedReader._pair`) stays the reference and the path
whenever this one does not apply (a GPU probe's hits, a runtime trial, entry-only timing, a
common header of another shape, no C compiler): tests/test_native_pair.py checks both give
the same rows, counters and open calls.

The library is built like the native helpers (collectors/native.py: the checked per-user
cache, compiled from the hashed bytes) when the attach starts, and loaded through the cache
directory's descriptor. ``HFTAGENT_PY_PAIRING=1`` keeps the Python pairing (a benchmark's
side-by-side run).
"""

from __future__ import annotations

import ctypes
import re
from array import array
from collections.abc import Callable
from pathlib import Path

import numpy as np

from collectors.native import NativeUnavailable, build

C_SOURCE = Path(__file__).with_name("hftpair.c")
HIT = np.dtype([("ts", "<i8"), ("cpu", "<i4"), ("tid", "<i4"), ("code", "<i4"),
                ("order", "<i4")])
MAX_THREADS = 4096       # threads the state holds (more: their hits are counted, not paired)
MAX_CODE = 31            # call<k> for k < 31 (a bit each in a u32; bit 0 unused)
_HEAD = 8                # int64 words of hftpair.c's state_t before its slots
_SLOT = 3                # int64 words a slot_t takes
_UNPAIRED, _LOST, _OVERFLOW, _CAP = 1, 2, 3, 4
_P = ctypes.c_void_p
_I64, _I32 = ctypes.c_int64, ctypes.c_int32
_NAME = re.compile(r"(call|ret)(\d+)$")

_lib: ctypes.CDLL | None = None
_why: str | None = None


def library() -> ctypes.CDLL | None:
    """The loaded library (built on first use), or None: :func:`unavailable` says why."""
    global _lib, _why
    if _lib is not None or _why is not None:
        return _lib
    try:
        helper = build(C_SOURCE, "hftpair", "attach pairing", shared=True)
        try:
            lib = ctypes.CDLL(helper.exe)
        finally:
            helper.close()  # (the mapping stays; the directory's descriptor is not needed)
    except (NativeUnavailable, OSError) as exc:
        _why = str(exc)
        return None
    lib.hft_pair.argtypes = [_P, _P, _I64, _P, _I32, _I64, _I64, _P, _I32, _P, _I64]
    lib.hft_pair.restype = _I64
    lib.hft_read.argtypes = [_P, _P, _I64, _P, _I32, _I32, _I32, _I32, _P, _P, _I64, _P, _P,
                             _I32, _P, _I32, _I64, _I64, _P, _I32, _P, _I64]
    lib.hft_read.restype = _I64
    lib.hft_clear.argtypes = [_P]
    lib.hft_clear.restype = _I64
    lib.hft_keep.argtypes = [_P, _P, _I32]
    lib.hft_keep.restype = _I64
    lib.hft_drop.argtypes = [_P, _P, _I32]
    lib.hft_drop.restype = _I64
    lib.hft_set.argtypes = [_P, _I32, ctypes.c_uint32, _I64, _I32]
    lib.hft_set.restype = _I32
    lib.hft_open.argtypes = [_P]
    lib.hft_open.restype = _I64
    _lib = lib
    return lib


def unavailable() -> str | None:
    """Why the library could not be had (None: it loaded, or was not asked for yet)."""
    return _why


def code_of(name: str, is_return: bool) -> int | None:
    """hftpair.c's code of a uprobe event (``call<k>``: k+1, ``ret<k>``: -(k+1)); None for a
    name it cannot pair (then the Python pairing is used)."""
    m = _NAME.match(name)
    if m is None or int(m.group(2)) + 1 > MAX_CODE or (m.group(1) == "ret") != is_return:
        return None
    k = int(m.group(2)) + 1
    return -k if is_return else k


class NativePairing:
    """One attached process's pairing state in C, and the reads through it."""

    def __init__(self, lib: ctypes.CDLL, pid: int, fields: tuple[int, ...], nfields: int
                 ) -> None:
        self.lib = lib
        self.pid = pid
        self.nfields = nfields
        self.state = np.zeros(_HEAD + MAX_THREADS * _SLOT, dtype=np.int64)
        self.state[_CAP] = MAX_THREADS
        self._st = self.state.ctypes.data
        self._fields = np.array(fields, dtype=np.int32)
        self._fields_p = self._fields.ctypes.data
        self._codes = np.zeros(1 << 16, dtype=np.int8)
        self._codes_p = self._codes.ctypes.data
        self._codes_key: tuple | None = None
        self._hits = np.empty(1024, dtype=HIT)
        self._hits_p = self._hits.ctypes.data
        self._unknown = np.empty(64, dtype=np.int32)
        self._unknown_p = self._unknown.ctypes.data
        self._rows = np.empty((1024, nfields), dtype=np.int64)
        self._nhits = np.zeros(1, dtype=np.int64)
        self._nhits_p = self._nhits.ctypes.data
        self._tids = np.zeros(1, dtype=np.int32)
        self._tids_p, self._ntids = self._tids.ctypes.data, 0
        self._tids_of: frozenset[int] | set[int] | None = None

    # -- what the read needs ------------------------------------------------------------------
    def set_codes(self, names: dict[int, str], is_return, dropped: set[str]) -> bool:
        """The event ids' codes (``names``: id -> event name; a ``dropped`` name's hits are
        skipped); False when a name cannot be paired here."""
        key = (id(names), len(names), frozenset(dropped))
        if key == self._codes_key:
            return True
        codes = np.zeros(1 << 16, dtype=np.int8)
        for ev, name in names.items():
            c = code_of(name, is_return(name))
            if c is None or not 0 <= ev < 1 << 16:
                return False
            codes[ev] = 0 if name in dropped else c
        self._codes, self._codes_key, self._codes_p = codes, key, codes.ctypes.data
        return True

    def set_threads(self, tids: set[int]) -> None:
        if tids is not self._tids_of:
            self._tids = np.array(sorted(tids) or [0], dtype=np.int32)
            self._tids_p, self._ntids = self._tids.ctypes.data, len(tids)
            self._tids_of = tids

    # -- a read ------------------------------------------------------------------------------
    def read(self, pages: list[tuple[int, bytes]], layout, seq0: int,
             known: Callable[[list[int]], None]) -> np.ndarray:
        """The calls ``pages`` (``(cpu, page)``, each CPU's in order, at least one) complete,
        as rows numbered from ``seq0 + 1``: one C call when every hit's thread is known;
        else ``known(tids)`` is told them first (it calls :meth:`set_threads` where they
        are the process's) and the hits are paired then."""
        buf, size, cpus = self._joined(pages)
        cap = len(buf) // 12 + 1  # (the smallest record: a 4 B header and 8 B of data)
        if len(self._hits) < cap:
            self._hits = np.empty(max(cap, 2 * len(self._hits)), dtype=HIT)
            self._hits_p = self._hits.ctypes.data
        if len(self._rows) < cap:  # (each row: a return record in these pages)
            self._rows = np.empty((max(cap, 2 * len(self._rows)), self.nfields), np.int64)
        rows = self._rows
        k = self.lib.hft_read(self._st, buf, size, cpus.buffer_info()[0], len(pages),
                              layout.ts_offset, layout.commit_offset, layout.data_offset,
                              self._codes_p, self._hits_p, len(self._hits), self._nhits_p,
                              self._tids_p, self._ntids, self._unknown_p, len(self._unknown),
                              self.pid, seq0, self._fields_p, self.nfields, rows.ctypes.data,
                              cap)
        if k < 0:  # threads not known: looked at, then paired
            known(self._unknown[:-1 - k].tolist())
            n = int(self._nhits[0])
            k = self.lib.hft_pair(self._st, self._hits_p, n, self._tids_p, self._ntids,
                                  self.pid, seq0, self._fields_p, self.nfields,
                                  rows.ctypes.data, cap)
        return rows[:k].copy()

    @staticmethod
    def _joined(pages: list[tuple[int, bytes]]) -> tuple[bytes, int, array]:
        """The pages one after the other, each as long as the longest (trace_pipe_raw reads
        whole sub-buffers: a shorter read is padded), and their CPUs."""
        cpus = array("i", [c for c, _ in pages])
        size = len(pages[0][1])
        if any(len(p) != size for _, p in pages):
            size = max(len(p) for _, p in pages)
            return b"".join([p.ljust(size, b"\0") for _, p in pages]), size, cpus
        return b"".join([p for _, p in pages]), size, cpus

    # -- the state ---------------------------------------------------------------------------
    def clear(self) -> int:
        """Forget every thread; the threads that had a call open."""
        return self.lib.hft_clear(self._st)

    def keep(self, tids: set[int]) -> int:
        """Forget the threads not in ``tids``; those of them that had a call open."""
        arr = np.array(sorted(tids), dtype=np.int32)
        return self.lib.hft_keep(self._st, arr.ctypes.data, len(arr))

    def drop(self, tids) -> int:
        """Forget the threads in ``tids``; those of them that had a call open."""
        arr = np.array(sorted(tids), dtype=np.int32)
        return self.lib.hft_drop(self._st, arr.ctypes.data, len(arr))

    def set_open(self, tid: int, mask: int, t0: int, c0: int) -> bool:
        return bool(self.lib.hft_set(self._st, tid, mask, t0, c0))

    def open_calls(self) -> int:
        return self.lib.hft_open(self._st)

    @property
    def unpaired_returns(self) -> int:
        return int(self.state[_UNPAIRED])

    @property
    def lost_returns(self) -> int:
        return int(self.state[_LOST])

    @property
    def overflow(self) -> int:
        return int(self.state[_OVERFLOW])
