"""The latency client: report your own inference latencies to ``hftagent watch``.

Embed it in the serving process so watch attributes *your* slow requests, not only its probe::

    from agent.client import timed
    with timed():
        y = model(x)

or, cheapest (no object per call)::

    from agent.client import start, end
    t = start()
    y = model(x)
    end(t)

Each call writes one fixed-size record (start_ns, end_ns, pid, tid, optional in-process
evidence) into a shared-memory ring, a file under /dev/shm that ``hftagent watch --pid PID``
(or ``--ring PATH``) maps read-only. Costs well under 1 µs per record (see
docs/benchmarks.md, bench/collector_cost.py --client). Timestamps are ``CLOCK_MONOTONIC``
(``time.monotonic_ns``), the clock the watch sampler stamps its rounds with.

Ring layout (little-endian int64 words):

* header, 8 words: magic, version, capacity (records), record words, creator pid, 3 spare
* record i of ``capacity``, ``RECORD_WORDS`` words: seq, start_ns, end_ns, pid, tid, nivcsw,
  nvcsw, minflt, majflt, cpu_ns, rq_delay_ns, cpu_start, cpu_end, seq. ``seq`` is the record's
  1-based sequence number, written first and last in one ``pack_into``; a reader accepts a slot
  only when both copies agree (a torn read shows as a mismatch and is retried on the next
  read). Evidence fields are -1 when not measured.

Writers: any number of threads of one process (slots are claimed with ``next()`` on an
``itertools.count``, atomic under the GIL). One ring per process.

Nothing happens at import: the ring is created on first use; the environment variable
``HFTAGENT_RING`` (a path) is read then.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np

MAGIC = 0x31474E4952544648  # b"HFTRING1" little-endian
VERSION = 1
HEADER_WORDS = 8
FIELDS: tuple[str, ...] = ("seq", "start_ns", "end_ns", "pid", "tid", "nivcsw", "nvcsw",
                           "minflt", "majflt", "cpu_ns", "rq_delay_ns", "cpu_start", "cpu_end",
                           "seq2")
RECORD_WORDS = len(FIELDS)
RECORD_BYTES = RECORD_WORDS * 8
DEFAULT_CAPACITY = 1 << 15  # 32768 records: > 60 s at 500 Hz, 3.7 MiB
_REC = struct.Struct(f"<{RECORD_WORDS}q")
_HDR = struct.Struct(f"<{HEADER_WORDS}q")


def default_ring_path(pid: int | None = None) -> Path:
    """/dev/shm/hftagent-<pid>.ring (tmpfs: no disk writes), or $HFTAGENT_RING for this
    process when set."""
    if pid is None:
        env = os.environ.get("HFTAGENT_RING")
        if env:
            return Path(env)
        pid = os.getpid()
    base = Path("/dev/shm")
    if not base.is_dir():  # pragma: no cover - non-Linux fallback
        base = Path("/tmp")
    return base / f"hftagent-{pid}.ring"


class RingError(Exception):
    """The ring file is missing, truncated or not a latency ring."""


class LatencyRing:
    """Writer side: create (or truncate) the ring file and append records."""

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 16:
            raise ValueError("capacity must be >= 16")
        self.path = Path(path) if path is not None else default_ring_path()
        self.capacity = int(capacity)
        size = (HEADER_WORDS + self.capacity * RECORD_WORDS) * 8
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _HDR.pack_into(self._mm, 0, MAGIC, VERSION, self.capacity, RECORD_WORDS, os.getpid(),
                       0, 0, 0)
        os.replace(tmp, self.path)  # a reader never sees a half-initialised header
        self._counter = itertools.count(1)
        self._pid = os.getpid()
        # Kernel thread id cached in thread-local storage: get_native_id() is a gettid
        # syscall (~0.3 µs on a VM). Not keyed by threading.get_ident(): a new thread can
        # reuse a dead one's ident. A forked child drops the cache (new thread ids).
        self._loc = threading.local()
        os.register_at_fork(after_in_child=self._reset_thread_cache)
        self._pack = _REC.pack_into
        self._base = HEADER_WORDS * 8

    def record(self, start_ns: int, end_ns: int, tid: int | None = None, nivcsw: int = -1,
               nvcsw: int = -1, minflt: int = -1, majflt: int = -1, cpu_ns: int = -1,
               rq_delay_ns: int = -1, cpu_start: int = -1, cpu_end: int = -1) -> None:
        seq = next(self._counter)
        off = self._base + ((seq - 1) % self.capacity) * RECORD_BYTES
        self._pack(self._mm, off, seq, start_ns, end_ns, self._pid,
                   threading.get_native_id() if tid is None else tid, nivcsw, nvcsw, minflt,
                   majflt, cpu_ns, rq_delay_ns, cpu_start, cpu_end, seq)

    def end(self, start_ns: int) -> None:
        """Record a request that started at ``start_ns`` (from :func:`start`) and ends now."""
        end_ns = _monotonic_ns()
        seq = next(self._counter)
        loc = self._loc
        try:
            tid = loc.tid
        except AttributeError:
            tid = loc.tid = threading.get_native_id()
        self._pack(self._mm, self._base + ((seq - 1) % self.capacity) * RECORD_BYTES, seq,
                   start_ns, end_ns, self._pid, tid, -1, -1, -1, -1, -1, -1, -1, -1, seq)

    def _reset_thread_cache(self) -> None:
        # A forked child writing into its parent's ring would reuse the parent's sequence
        # numbers and overwrite its records: the child's records carry its own pid, but
        # forking is not supported — a child should open its own ring (LatencyRing()).
        self._loc = threading.local()
        self._pid = os.getpid()

    def close(self, unlink: bool = False) -> None:
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        if unlink:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class _Timed:
    """One per ``with timed():`` block: blocks that interleave on one thread (asyncio
    handlers awaiting inside the block, generators) each keep their own start time."""

    __slots__ = ("_ring", "_t0")

    def __init__(self, ring: LatencyRing) -> None:
        self._ring = ring

    def __enter__(self) -> _Timed:
        self._t0 = _monotonic_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ring.end(self._t0)


_monotonic_ns = time.monotonic_ns


_default: LatencyRing | None = None
_lock = threading.Lock()


def ring() -> LatencyRing:
    """This process's ring, created on first use."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                _default = LatencyRing()
    return _default


def timed() -> _Timed:
    """Context manager timing its block into this process's ring (≈ 1 µs per record)."""
    return _Timed(_default if _default is not None else ring())


def start() -> int:
    """Start time of a request (``CLOCK_MONOTONIC`` ns); pass it to :func:`end`."""
    return time.monotonic_ns()


def end(start_ns: int) -> None:
    (_default if _default is not None else ring()).end(start_ns)


# ----------------------------------------------------------------------------------------------
# Reader (used by hftagent watch)
# ----------------------------------------------------------------------------------------------


class RingReader:
    """Reader side: map a ring read-only and return the records written since the last read.

    ``read()`` returns an int64 array [n, RECORD_WORDS] ordered by sequence number. Records
    overwritten before they were read (the writer lapped the reader) are counted in ``lost``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise RingError(f"cannot open latency ring {self.path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_WORDS * 8:
                raise RingError(f"{self.path}: too small for a latency ring")
            self._mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, version, cap, words, pid, *_ = _HDR.unpack_from(self._mm, 0)
        if magic != MAGIC or version != VERSION or words != RECORD_WORDS:
            raise RingError(f"{self.path}: not a version-{VERSION} hftagent latency ring")
        if size < (HEADER_WORDS + cap * words) * 8:
            raise RingError(f"{self.path}: truncated ring")
        self.capacity = int(cap)
        self.creator_pid = int(pid)
        self._arr = np.frombuffer(self._mm, dtype="<i8", count=cap * words,
                                  offset=HEADER_WORDS * 8).reshape(cap, words)
        self.pos = 0  # highest sequence number consumed
        self.lost = 0

    def read(self, max_records: int | None = None) -> np.ndarray:
        """Records written since the last read, in sequence order.

        Only the slots from the last position on are copied (a few hundred bytes per record,
        not the whole ring), block by block, up to the first slot that is not the next
        sequence number: not written yet (stop), torn (stop; re-read next time) or already
        overwritten by a writer that lapped us (skip to the oldest record still there and
        count the rest as lost)."""
        cap = self.capacity
        limit = cap if max_records is None else max(1, min(cap, max_records))
        out: list[np.ndarray] = []
        got = 0
        block = 256
        while got < limit:
            start = self.pos % cap
            n = min(block, cap - start, limit - got)
            blk = self._arr[start:start + n].copy()
            expected = np.arange(self.pos + 1, self.pos + 1 + n, dtype=np.int64)
            good = (blk[:, 0] == expected) & (blk[:, -1] == expected)
            k = n if good.all() else int(np.argmin(good))
            if k:
                out.append(blk[:k])
                self.pos += k
                got += k
            if k == n:
                block = min(block * 2, 4096)
                continue
            s, s2 = int(blk[k, 0]), int(blk[k, -1])
            if s == s2 and s > self.pos + 1:
                # Lapped: the oldest record still in the ring is head - cap + 1. Resume a
                # little after it, so the writer does not lap us again while we copy.
                head = int(self._arr[:, 0].max())
                new_pos = max(self.pos, head - cap + min(block, cap // 4))
                self.lost += new_pos - self.pos
                self.pos = new_pos
                continue
            break
        if not out:
            return np.empty((0, RECORD_WORDS), dtype=np.int64)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def close(self) -> None:
        self._arr = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
