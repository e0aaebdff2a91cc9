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
(or ``--ring PATH``) reads. Costs well under 1 µs per record (see docs/benchmarks.md,
bench/collector_cost.py --client). Timestamps are ``CLOCK_MONOTONIC``
(``time.monotonic_ns``), the clock the watch sampler stamps its rounds with.

Ring layout (little-endian int64 words):

* header, 8 words: magic, version, capacity (records), record words, creator pid, 3 spare
* record i of ``capacity``, ``RECORD_WORDS`` words: seq, start_ns, end_ns, pid, tid, nivcsw,
  nvcsw, minflt, majflt, cpu_ns, rq_delay_ns, cpu_start, cpu_end, seq. ``seq`` is the record's
  1-based sequence number, written first and last in one ``pack_into``, into slot
  ``(seq - 1) % capacity``; a reader accepts a slot only when both copies agree (a torn read
  shows as a mismatch and is retried on the next read). Evidence fields are -1 when not
  measured.

Where the ring is, and how watch finds it: ``/dev/shm/hftagent-<pid>-<16 random hex>.ring``
(:func:`default_ring_path`; ``$HFTAGENT_RING`` names another path). The random part
(``secrets.token_hex``) means no other user can block the name beforehand (a directory or a
file planted at every name a pid-only scheme would use). The process reports its ring by
mapping it: ``hftagent watch --pid PID`` reads ``/proc/PID/maps`` (through the Host model),
takes the shared writable file mappings, and keeps the one that is a latency ring created by
PID whose device and inode are those of the mapping. No environment variable is set for it:
``/proc/PID/environ`` shows only the environment the process was started with (the kernel
reads the block between ``env_start`` and ``env_end`` set at exec; a later ``putenv`` is not
there), and a variable would be inherited by the process's children, who would then share
one name. A process in another mount namespace (a container) is watched with ``--ring``.

The ring file is mode 0600, owned by the process that created it: ``hftagent watch`` reads it
as the same user or as root, and root reads a process's ring only when the file's owner is
that process's effective uid (a ring planted by another user, whatever creator pid its
header claims, is refused with one line). It is created under a random temporary name in the
ring's directory (``O_CREAT|O_EXCL|O_NOFOLLOW``: a name planted there beforehand, a symlink
included, is never opened), checked (a regular file of ours, mode 0600), filled with its
header and renamed over the final name (``rename`` replaces a symlink there, it never writes
through it). The temporary file is removed on every error; one left by a process killed in
between, and the ring of a process that has exited, are swept by the next ``hftagent watch``
(:func:`sweep_stale_rings`).

The client never raises into the application: when the ring cannot be created (no room in
/dev/shm, ``$HFTAGENT_RING`` unusable), :func:`timed`, :func:`end` and :func:`ring` go on as
no-ops and one line saying why goes to stderr, once per process.

Writers: any number of threads of one process (slots are claimed with ``next()`` on an
``itertools.count``, atomic under the GIL). One ring per process.

Nothing happens at import: the ring is created on first use; the environment variable
``HFTAGENT_RING`` (a path) is read then.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import secrets
import stat
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np

MAGIC = 0x31474E4952544648  # b"HFTRING1" little-endian
VERSION = 1
HEADER_WORDS = 8
HEADER_BYTES = HEADER_WORDS * 8
FIELDS: tuple[str, ...] = ("seq", "start_ns", "end_ns", "pid", "tid", "nivcsw", "nvcsw",
                           "minflt", "majflt", "cpu_ns", "rq_delay_ns", "cpu_start", "cpu_end",
                           "seq2")
RECORD_WORDS = len(FIELDS)
RECORD_BYTES = RECORD_WORDS * 8
DEFAULT_CAPACITY = 1 << 15  # 32768 records: > 60 s at 500 Hz, 3.7 MiB
MIN_CAPACITY = 16
MAX_CAPACITY = 1 << 24  # 16 M records, 1.9 GiB: anything larger is not a ring we wrote
_REC = struct.Struct(f"<{RECORD_WORDS}q")
_HDR = struct.Struct(f"<{HEADER_WORDS}q")

# What a record may hold (RingReader drops and counts any other): the kernel's PID_MAX_LIMIT
# (include/linux/threads.h, 4 M on 64-bit) bounds pids and tids; a latency is at most an
# hour (a reader that saw one longer is reading garbage: an int64 never holds a NaN, a
# crafted or corrupt slot shows as a negative or absurd value); CPU numbers below 65536
# (NR_CPUS is at most 8192 on x86_64's MAXSMP); evidence counters -1 (not measured) or
# non-negative and below 2**50.
PID_MAX_LIMIT = 1 << 22
MAX_LATENCY_NS = 3600 * 10**9
MAX_CPU = 1 << 16
MAX_EVIDENCE = 1 << 50
MAX_SEQ = 1 << 62  # a sequence number this large was never written by a client
CLOCK_SLACK_NS = 10**9  # a record ending later than the reader's clock + this is garbage
# What one RingReader.read() pass reads at most (slots and the lap search together): twice a
# default ring (3.7 MiB), so a reader that fell a whole default ring behind catches up in one
# pass; a ring of 2**24 records (1.9 GiB, real or a sparse forgery) is read across passes,
# never whole into memory. 8 MiB of pread from tmpfs and its checks take a few ms.
READ_LIMIT_BYTES = 8 << 20


def ring_dir() -> Path:
    """Where rings live: /dev/shm (tmpfs: no disk writes), /tmp where there is none."""
    base = Path("/dev/shm")
    if not base.is_dir():  # pragma: no cover - non-Linux fallback
        base = Path("/tmp")
    return base


def ring_name(prefix: str = "hftagent", pid: int | None = None) -> str:
    """``<prefix>-<pid>-<16 random hex>.ring`` (pid: ours by default). The pid lets
    :func:`sweep_stale_rings` tell a dead creator's ring; the 64 random bits make the name
    unpredictable, so it cannot be taken beforehand."""
    return f"{prefix}-{os.getpid() if pid is None else pid}-{secrets.token_hex(8)}.ring"


def default_ring_path() -> Path:
    """$HFTAGENT_RING when set, else a new :func:`ring_name` in :func:`ring_dir`."""
    env = os.environ.get("HFTAGENT_RING")
    if env:
        return Path(env)
    return ring_dir() / ring_name()


def ring_size_ok(size: int) -> bool:
    """Whether a file of ``size`` bytes can be a ring (a header and 16..2**24 records)."""
    n, rem = divmod(size - HEADER_BYTES, RECORD_BYTES)
    return rem == 0 and MIN_CAPACITY <= n <= MAX_CAPACITY


class RingError(Exception):
    """The ring file is missing, truncated, not a latency ring, or cannot be created."""


class RingMissing(RingError):
    """The ring file does not exist (yet): the only ring error worth waiting out."""


# ----------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------


def _tmp_name(final: str) -> str:
    """``.<final>.<pid>.<random>.tmp``: the pid lets :func:`sweep_stale_rings` tell a dead
    creator's leftover from a live one's; the 64 random bits make the name unpredictable."""
    return f".{final}.{os.getpid()}.{secrets.token_hex(8)}.tmp"


_TMP_RE = re.compile(r"^\.(hftagent-[^/]*\.ring)\.(\d+)\.[0-9a-f]{16}\.tmp$")


def _create(path: Path, size: int, init) -> mmap.mmap:
    """Create the ring file ``path`` of ``size`` bytes as the module docstring says: a new
    file under a random name in ``path``'s directory (``O_EXCL|O_NOFOLLOW``, mode 0600),
    checked after the open (a regular file owned by our euid, one link, mode 0600), its
    space allocated (a sparse file on a full tmpfs would SIGBUS the writer at a record),
    ``init(mapping)`` writing the header, then renamed over ``path``. Every step goes
    through a descriptor of the directory, so a directory swapped in between changes
    nothing. Returns the writable mapping; raises :class:`RingError` (the temporary file
    removed) on any failure."""
    name = path.name
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise RingError(f"cannot create latency ring {path}: directory {path.parent}: "
                        f"{exc.strerror}") from None
    try:
        tmp = _tmp_name(name)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except OSError as exc:
            raise RingError(f"cannot create latency ring {path}: {exc.strerror}") from None
        done = False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                raise RingError(f"cannot create latency ring {path}: the new file is not a "
                                "regular file of ours")
            os.fchmod(fd, 0o600)  # whatever a default ACL of the directory made of it
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
                raise RingError(f"cannot create latency ring {path}: mode is not 0600")
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
            try:
                init(mm)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                mm.close()
                raise
            done = True
            return mm
        except OSError as exc:
            hint = ""
            if exc.errno in (errno.EPERM, errno.EACCES):
                hint = " (another user's file in the way?)"
            elif exc.errno == errno.ENOSPC:
                hint = f" ({size} bytes needed)"
            raise RingError(f"cannot create latency ring {path}: {exc.strerror}{hint}") \
                from None
        finally:
            os.close(fd)
            if not done:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
    finally:
        os.close(dfd)


def _pid_dead(pid: int) -> bool:
    """True only when no process ``pid`` exists (a live one of another user is alive)."""
    if not 0 < pid < PID_MAX_LIMIT:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


# ring_name()'s, and the pid-only names of versions before the random part
_WATCH_RE = re.compile(r"^hftagent-watch-(\d+)(?:-[0-9a-f]{16})?\.ring$")
_CLIENT_RE = re.compile(r"^hftagent-(\d+)(?:-[0-9a-f]{16})?\.ring$")  # one per client process


def sweep_stale_rings(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove what a killed ``hftagent watch`` (or a client killed while creating its ring)
    left in ``directory`` (default :func:`ring_dir`): ``hftagent-watch-<pid>-<random>.ring``
    rings whose watch (the pid in the name) and probe worker (the creator pid in the header)
    are both gone, and ring temporary files (``.hftagent-*.ring.<pid>.<random>.tmp``) whose
    creator is gone, and a client's ``hftagent-<pid>-<random>.ring`` whose process (the pid
    in the name and the header's creator) is gone: a client never unlinks its ring (watch may
    read it after the client exits), so without this every process that used the client left
    ~3.7 MB of tmpfs behind. The pid-only names of older versions are swept the same way.
    Only regular files owned by our euid with one link are removed (never a symlink, never
    another user's file, never a live process's). Returns the names removed; errors are
    skipped (a sweep never stops watch from starting)."""
    d = Path(directory) if directory is not None else ring_dir()
    removed: list[str] = []
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        euid = os.geteuid()
        for name in os.listdir(dfd):
            m_tmp = _TMP_RE.match(name)
            m_watch = None if m_tmp else (_WATCH_RE.match(name) or _CLIENT_RE.match(name))
            if not (m_tmp or m_watch):
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != euid or st.st_nlink != 1:
                continue
            if m_tmp:
                if not _pid_dead(int(m_tmp.group(2))):
                    continue
            else:
                if not _pid_dead(int(m_watch.group(1))):
                    continue
                creator = _header_pid(dfd, name, st)
                if creator is not None and not _pid_dead(creator):
                    continue
            try:
                os.unlink(name, dir_fd=dfd)
                removed.append(name)
            except OSError:
                pass
    finally:
        os.close(dfd)
    return removed


def _header_pid(dfd: int, name: str, st: os.stat_result) -> int | None:
    """The creator pid in the header of ring ``name`` (the file ``st`` describes), or None
    when it cannot be read as one."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except OSError:
        return None
    try:
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            return None
        hdr = os.pread(fd, HEADER_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(hdr) < HEADER_BYTES:
        return None
    magic, version, _cap, _words, pid, *_ = _HDR.unpack(hdr)
    return int(pid) if (magic, version) == (MAGIC, VERSION) else None


class LatencyRing:
    """Writer side: create the ring file (see the module docstring for how) and append
    records."""

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 capacity: int = DEFAULT_CAPACITY) -> None:
        if not MIN_CAPACITY <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be in {MIN_CAPACITY}..{MAX_CAPACITY}")
        self.path = Path(path) if path is not None else default_ring_path()
        self.capacity = int(capacity)
        size = HEADER_BYTES + self.capacity * RECORD_BYTES
        self._mm = _create(self.path, size, self._init_header)
        self._counter = itertools.count(1)
        self._pid = os.getpid()
        # Kernel thread id cached in thread-local storage: get_native_id() is a gettid
        # syscall (~0.3 µs on a VM). Not keyed by threading.get_ident(): a new thread can
        # reuse a dead one's ident. A forked child drops the cache (new thread ids).
        self._loc = threading.local()
        os.register_at_fork(after_in_child=self._reset_thread_cache)
        self._pack = _REC.pack_into
        self._base = HEADER_BYTES

    def _init_header(self, mm: mmap.mmap) -> None:
        _HDR.pack_into(mm, 0, MAGIC, VERSION, self.capacity, RECORD_WORDS, os.getpid(),
                       0, 0, 0)

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

    def __init__(self, ring: LatencyRing | NullRing) -> None:
        self._ring = ring

    def __enter__(self) -> _Timed:
        self._t0 = _monotonic_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ring.end(self._t0)


_monotonic_ns = time.monotonic_ns


class NullRing:
    """What :func:`ring` hands out when this process's ring cannot be created: the same
    calls, recording nothing (``reason`` says why; ``path`` is None)."""

    path = None
    capacity = 0

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def record(self, *args: object, **kw: object) -> None:
        pass

    def end(self, start_ns: int) -> None:
        pass

    def close(self, unlink: bool = False) -> None:
        pass


_default: LatencyRing | NullRing | None = None
_lock = threading.Lock()


def ring() -> LatencyRing | NullRing:
    """This process's ring, created on first use. Never raises: a ring that cannot be
    created (any error, :class:`RingError` or other) makes a :class:`NullRing`, said once on
    stderr, and the application goes on unmeasured."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                try:
                    _default = LatencyRing()
                except Exception as exc:  # noqa: BLE001 - never into the application
                    msg = str(exc) if isinstance(exc, RingError) else \
                        f"cannot create latency ring: {type(exc).__name__}: {exc}"
                    _default = NullRing(msg)
                    try:
                        sys.stderr.write(f"hftagent client: {msg}; latencies are not "
                                         "recorded in this process\n")
                        sys.stderr.flush()
                    except Exception:  # noqa: BLE001 - a closed stderr: stay quiet
                        pass
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
    """Reader side: read a ring and return the records written since the last read.

    ``read()`` returns an int64 array [n, RECORD_WORDS] ordered by sequence number. Records
    overwritten before they were read (the writer lapped the reader) are counted in ``lost``;
    records that fail validation (see :meth:`read`) are dropped and counted in ``invalid``.

    The ring is untrusted input (watch runs as root; the ring may be another user's): it is
    opened ``O_RDONLY|O_NONBLOCK|O_NOFOLLOW`` (a symlink, a FIFO, a directory or a device is
    refused at once with a :class:`RingError`, never waited on), checked through the open
    descriptor (``fstat``: owner, device and inode), its header is checked (magic, version,
    record width, capacity in ``MIN_CAPACITY..MAX_CAPACITY`` and equal to what the file's
    size holds, a plausible creator pid), and it is read with ``pread``, not mapped: a ring
    truncated under the reader is a :class:`RingError` at the next read, never a SIGBUS.
    ``expect_uid`` / ``expect_pid`` / ``expect_file``: refuse a ring not owned by that user /
    not created by that process / not that ``(st_dev, st_ino)`` (watch's own probe ring;
    ``--pid``'s ring, the file the process maps). ``read_limit_bytes`` bounds one
    :meth:`read` pass (``bytes_read`` counts every byte read from the ring).
    """

    def __init__(self, path: str | os.PathLike[str], *, expect_uid: int | None = None,
                 expect_pid: int | None = None, expect_file: tuple[int, int] | None = None,
                 read_limit_bytes: int = READ_LIMIT_BYTES) -> None:
        self.path = Path(path)
        self.read_limit_bytes = max(int(read_limit_bytes), RECORD_BYTES)
        self.bytes_read = 0
        self._left = self.read_limit_bytes  # of the current pass
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RingMissing(f"cannot open latency ring {self.path}: no such file") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RingError(f"latency ring {self.path} is a symbolic link: give the "
                                "ring's own path") from None
            raise RingError(f"cannot open latency ring {self.path}: {exc.strerror}") from None
        try:
            self._check(fd, expect_uid, expect_pid, expect_file)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.pos = 0  # highest sequence number consumed
        self.lost = 0
        self.invalid = 0

    def _check(self, fd: int, expect_uid: int | None, expect_pid: int | None,
               expect_file: tuple[int, int] | None) -> None:
        p = self.path
        try:
            st = os.fstat(fd)
            hdr = os.pread(fd, HEADER_BYTES, 0) if stat.S_ISREG(st.st_mode) else b""
        except OSError as exc:
            raise RingError(f"cannot read latency ring {p}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
            raise RingError(f"{p} is {kind}, not a latency ring (a regular file)")
        if expect_file is not None and (st.st_dev, st.st_ino) != tuple(expect_file):
            raise RingError(f"latency ring {p} is not the file the process maps (replaced "
                            "since)")
        if expect_uid is not None and st.st_uid != expect_uid:
            raise RingError(f"latency ring {p} is owned by uid {st.st_uid}, not {expect_uid}")
        if len(hdr) < HEADER_BYTES:
            raise RingError(f"{p}: too small for a latency ring")
        magic, version, cap, words, pid, *_ = _HDR.unpack(hdr)
        if magic != MAGIC or version != VERSION or words != RECORD_WORDS:
            raise RingError(f"{p}: not a version-{VERSION} hftagent latency ring")
        if not MIN_CAPACITY <= cap <= MAX_CAPACITY:
            raise RingError(f"{p}: bad ring header: capacity {cap} (a ring holds "
                            f"{MIN_CAPACITY}..{MAX_CAPACITY} records)")
        # the header's capacity must be what the file holds: it never sends a read past the
        # file's end, and a lie about it is a bad ring (reads stay bounded per pass anyway)
        size = HEADER_BYTES + cap * RECORD_BYTES
        if st.st_size != size:
            raise RingError(f"{p}: {'truncated' if st.st_size < size else 'bad'} ring: "
                            f"{st.st_size} bytes, a ring of {cap} records has {size}")
        if not 0 < pid < PID_MAX_LIMIT:
            raise RingError(f"{p}: bad ring header: creator pid {pid}")
        if expect_pid is not None and pid != expect_pid:
            raise RingError(f"latency ring {p} was created by pid {pid}, not {expect_pid} "
                            "(a stale or planted ring)")
        self.capacity = int(cap)
        self.creator_pid = int(pid)
        self.owner_uid = int(st.st_uid)

    def _slots(self, start: int, n: int) -> np.ndarray:
        """Slots ``start .. start + n - 1`` (one ``pread``); a short read is a truncated ring.
        Counted against the pass's limit (callers never ask for more than is left)."""
        out = np.empty((n, RECORD_WORDS), dtype="<i8")
        try:
            got = os.preadv(self._fd, [out], HEADER_BYTES + start * RECORD_BYTES)
        except OSError as exc:
            raise RingError(f"cannot read latency ring {self.path}: {exc.strerror}") from None
        self.bytes_read += got
        self._left -= out.nbytes
        if got != out.nbytes:
            raise RingError(f"latency ring {self.path} was truncated while being read "
                            f"(now {HEADER_BYTES + start * RECORD_BYTES + got} bytes or less)")
        return out

    def _head(self, seq: int) -> int:
        """The newest sequence number written, from a well-formed slot holding ``seq`` (a lap
        ahead of the reader): the writer fills slots in order, so the slots after ``seq``'s
        hold ``seq + 1, seq + 2 ...`` up to the head and an older lap after it. Bisected on
        that, one slot per step: at most log2(capacity) + 1 slots (25 for a ring of 2**24),
        never the whole ring (a forged ring only makes the answer wrong, which the read's
        sequence checks then catch)."""
        cap = self.capacity
        first = (seq - 1) % cap
        lo, hi = 0, cap  # slot first + lo holds seq + lo; first + hi does not (or unknown)
        while hi - lo > 1 and self._left >= RECORD_BYTES:
            mid = (lo + hi) // 2
            r = self._slots((first + mid) % cap, 1)[0]
            if r[0] == r[-1] == seq + mid:
                lo = mid
            else:
                hi = mid
        return seq + lo

    def read(self, max_records: int | None = None) -> np.ndarray:
        """Records written since the last read, in sequence order.

        Only the slots from the last position on are read (a few hundred bytes per record,
        not the whole ring), block by block, up to the first slot that is not the next
        sequence number: not written yet (stop), torn (stop; re-read next time) or already
        overwritten by a writer that lapped us (skip to the oldest record still there and
        count the rest as lost). Every call ends after at most ``capacity`` (or
        ``max_records``) slots, two lapped skips and ``read_limit_bytes`` read, whatever the
        ring holds; what is left is read by the next call.

        Validation: a slot whose two sequence copies agree but name a record that cannot be
        in that slot (``(seq - 1) % capacity`` is another slot, or ``seq`` is absurd) is
        corrupt: consumed, dropped, counted in ``invalid`` (a lapped skip needs a well-formed
        slot, so a skip always moves forward by at least a lap). A record is dropped and
        counted too unless: ``0 <= start_ns <= end_ns``, ``end_ns`` not past the reader's
        clock by more than a second, latency at most an hour, pid and tid in
        ``1..PID_MAX_LIMIT - 1``, evidence -1 or non-negative, CPUs -1 or below 65536."""
        cap = self.capacity
        limit = cap if max_records is None else max(1, min(cap, max_records))
        self._left = self.read_limit_bytes
        now = time.monotonic_ns()
        out: list[np.ndarray] = []
        budget = limit
        jumps = 0
        block = 64  # records a read finds at 500 Hz every 50 ms: 25; doubled as they come
        while budget > 0:
            start = self.pos % cap
            n = min(block, cap - start, budget, self._left // RECORD_BYTES)
            if n <= 0:
                break  # this pass's bytes are spent: the rest is the next read's
            blk = self._slots(start, n)
            s, s2 = blk[:, 0], blk[:, -1]
            if s[0] <= self.pos:
                break  # nothing new (the common case: not written yet)
            expected = np.arange(self.pos + 1, self.pos + 1 + n, dtype=np.int64)
            good = (s == expected) & (s2 == expected)
            k = n if good.all() else int(np.argmin(good))
            mixed = False
            if k < n and s[k] == s2[k] and s[k] > expected[k]:
                # a lap or a corrupt slot at k: corrupt slots (two agreeing copies naming a
                # record of another slot, or an absurd seq) are consumed with the good ones
                congruent = (s - 1) % cap == np.arange(start, start + n)
                corrupt = (s == s2) & (s > expected) & (~congruent | (s >= MAX_SEQ))
                take = good | corrupt
                k = n if take.all() else int(np.argmin(take))
                mixed = True
            if k:
                recs = blk[:k][good[:k]] if mixed else blk[:k]
                self.invalid += k - len(recs)
                if len(recs):
                    ok = _valid(recs, now)
                    if not ok.all():
                        self.invalid += int((~ok).sum())
                        recs = recs[ok]
                    if len(recs):
                        out.append(recs)
                self.pos += k
                budget -= k
            if k == n:
                block = min(block * 2, 4096)
                continue
            if s[k] == s2[k] and s[k] > expected[k] and jumps < 2:
                # Lapped (slot k holds a well-formed record a lap or more ahead: corrupt
                # ones were taken above): the oldest record still in the ring is
                # head - cap + 1. Resume a little after it, so the writer does not lap us
                # again while we read; head >= s[k] >= pos + 1 + cap, so pos moves on.
                jumps += 1
                new_pos = max(self.pos + 1, self._head(int(s[k])) - cap + min(block, cap // 4))
                self.lost += new_pos - self.pos
                self.pos = new_pos
                continue
            break
        if not out:
            return np.empty((0, RECORD_WORDS), dtype=np.int64)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)


_I64 = np.iinfo(np.int64)
# Per-column bounds of a record (inclusive; the time columns' upper bound is set per read).
_LO = np.array([_I64.min, 0, 0, 1, 1] + [-1] * 6 + [-1, -1] + [_I64.min], dtype=np.int64)
_HI = np.array([_I64.max, 0, 0, PID_MAX_LIMIT - 1, PID_MAX_LIMIT - 1]
               + [MAX_EVIDENCE - 1] * 6 + [MAX_CPU - 1] * 2 + [_I64.max], dtype=np.int64)


def _valid(r: np.ndarray, now_ns: int) -> np.ndarray:
    """Which records of ``r`` hold plausible values (:meth:`RingReader.read`): every column
    within its bounds (times ``0 ..`` the reader's clock + CLOCK_SLACK_NS), then
    ``0 <= end_ns - start_ns <= MAX_LATENCY_NS`` (no overflow: both times are in bounds)."""
    hi = _HI.copy()
    hi[1] = hi[2] = now_ns + CLOCK_SLACK_NS
    ok = ((r >= _LO) & (r <= hi)).all(axis=1)
    lat = r[:, 2] - r[:, 1]
    return ok & (lat >= 0) & (lat <= MAX_LATENCY_NS)
