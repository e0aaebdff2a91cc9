"""Per-call CPU counters of the calls ``watch --attach`` times (issue #35 item 2e): cycles,
instructions and the thread's on-CPU ns between a call's entry and its return, exact per call.

Mechanism (perf_event_open(2), Documentation/trace/uprobetracer.rst): for each thread of the
attached process one perf **group**, opened with ``pid=tid, cpu=-1`` (it counts only while
that thread runs, on whatever CPU):

- the counters: the leader (``cycles``, PERF_TYPE_HARDWARE; the first software counter where
  the members are software ones), the other counters (``instructions``) and
  ``task_clock`` (PERF_COUNT_SW_TASK_CLOCK: the thread's on-CPU ns, so that
  cycles / on-CPU ns is the effective frequency);
- watch's own uprobe events (PERF_TYPE_TRACEPOINT, ``config`` = the id from tracefs
  ``events/<group>/<event>/id``; entry and return) as *sampling* members,
  ``sample_period=1``, ``sample_type`` IDENTIFIER|TID|TIME|CPU|READ and ``read_format``
  GROUP|ID|TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING, their output redirected into the leader's
  mmap'd ring (PERF_EVENT_IOC_SET_OUTPUT: allowed between events of one task and one cpu).

Each uprobe hit then writes one PERF_RECORD_SAMPLE holding the whole group's values at that
instant (a sample with PERF_FORMAT_GROUP reads the leader and every sibling, whichever member
fired): a call's counts are its return sample minus its entry sample, on its own thread. The
uprobe events are members, not leaders (the brief's first idea): one group reads *one* set of
counters at both the entry and the return, where a group per uprobe event would need a
hardware counter pair per event (two per target; a trial arms several targets) and the
entry's and the return's counters would be different counters. Per thread rather than per
CPU (decided by experiment: a uprobe tracepoint opened with ``pid=tid, cpu=-1`` samples
that thread's hits only, on Linux 6.18, and may sit in a group beside counters and share
its ring); a per-CPU counter counts whatever runs on the CPU, so
a call that was preempted would be charged the other task's instructions; per thread the
counters stop when the thread is switched out, which is what "the call's work" is.

The clock: ``use_clockid`` with CLOCK_MONOTONIC, which the kernel reads with
``ktime_get_mono_fast_ns`` — the very function of the trace instance's ``mono`` clock
(agent/trace/instance.py sets it; the calls' ``start_ns``/``end_ns`` come from it). For one
hit the kernel's uprobe dispatcher writes the trace event first, then the perf sample, so a
call's entry sample is the first entry sample of its thread at or after ``start_ns``, its
return sample the first return sample at or after ``end_ns`` (a nested probed function's
hits fall strictly inside) — :func:`join`. A call is joined only where its group ran the
whole call (time_running grew as much as time_enabled: no multiplexing with another user of
the PMU); otherwise it is counted in ``multiplexed`` and left without counts.

The ring (``perf_event_mmap_page``): ``data_head`` at offset 1024 is read once per drain, the
records behind it are parsed (PERF_RECORD_SAMPLE; PERF_RECORD_LOST and LOST_SAMPLES counted:
the thread's open pairing cannot span the gap, so its samples before it are dropped), a
record that wraps the end of the data area is reassembled, and ``data_tail`` (offset 1032) is
written only after every record up to it was copied out. Ordering: the kernel writes the
records, ``smp_wmb()``, then ``data_head``; on x86-64 loads are not reordered with other loads
(TSO) so a record behind a head read first is complete; elsewhere the ``threading.Lock``
acquire/release after the head read (glibc's LDAXR/STLXR) stands for the reader's
``smp_rmb()``, and writing the tail after the copies, for its ``smp_mb()``.

Where no hardware cycles counter opens for the target (no PMU exposed: no ``cpu``/``armv8_*``
source in /sys/bus/event_source/devices — a Firecracker guest, most clouds' small VMs),
:func:`probe` says why in one line; nothing is ever reported as 0. The same mechanism with
software members (:data:`SOFTWARE`: task-clock, page faults, context switches) is what the
tests run on such a box, so the ring and the join are tested for real.

Every descriptor (counters, uprobe members, rings) is closed on every exit path:
:meth:`Counters.close` (idempotent; also the refusal paths of :meth:`Counters.open` and a
thread's group that fails half-way). The groups must be closed before watch removes its
uprobe events: an event perf still holds cannot be removed (EBUSY).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

# perf_event_open(2) numbers (include/uapi/linux/perf_event.h)
SYSCALL = {"x86_64": 298, "aarch64": 241}
TYPE_HARDWARE, TYPE_SOFTWARE, TYPE_TRACEPOINT = 0, 1, 2
HW_CPU_CYCLES, HW_INSTRUCTIONS, HW_REF_CPU_CYCLES = 0, 1, 9
SW_TASK_CLOCK, SW_PAGE_FAULTS, SW_CONTEXT_SWITCHES = 1, 2, 3
SAMPLE_TID, SAMPLE_TIME, SAMPLE_READ, SAMPLE_CPU, SAMPLE_IDENTIFIER = 1 << 1, 1 << 2, 1 << 4, \
    1 << 7, 1 << 16
FORMAT_ENABLED, FORMAT_RUNNING, FORMAT_ID, FORMAT_GROUP = 1, 2, 4, 8
BIT_DISABLED, BIT_USE_CLOCKID = 1 << 0, 1 << 25
FLAG_FD_CLOEXEC = 8
IOC_ENABLE, IOC_DISABLE, IOC_SET_OUTPUT, IOC_ID = 0x2400, 0x2401, 0x2405, 0x80082407
IOC_FLAG_GROUP = 1
RECORD_LOST, RECORD_SAMPLE, RECORD_LOST_SAMPLES = 2, 9, 13
CLOCK_MONOTONIC = 1
ATTR_SIZE = 136          # PERF_ATTR_SIZE_VER8 (Linux 6.3+); older kernels take the zeros
HEAD_OFF, TAIL_OFF, DATA_OFF, SIZE_OFF = 1024, 1032, 1040, 1048
PAGE = mmap.PAGESIZE
RING_PAGES = 16          # data pages per thread (64 KiB: ~300 calls of 2 samples)
MAX_THREADS = 256        # groups opened at most (threads beyond it: their calls uncounted)
KEEP_SAMPLES = 8192      # samples kept per thread waiting for their calls
PENDING_READS = 3        # a call whose samples are not there yet is tried this many reads


class Counter(NamedTuple):
    """One counter of the group: its name in the per-call result, perf type and config."""

    name: str
    type: int
    config: int


CYCLES = Counter("cycles", TYPE_HARDWARE, HW_CPU_CYCLES)
INSTRUCTIONS = Counter("instructions", TYPE_HARDWARE, HW_INSTRUCTIONS)
TASK_CLOCK = Counter("task_clock_ns", TYPE_SOFTWARE, SW_TASK_CLOCK)
# what watch counts where a PMU is exposed; the on-CPU ns last (every set has it)
HARDWARE: tuple[Counter, ...] = (CYCLES, INSTRUCTIONS, TASK_CLOCK)
# the same mechanism with software counters only (no PMU): the tests on a PMU-less box
SOFTWARE: tuple[Counter, ...] = (TASK_CLOCK, Counter("page_faults", TYPE_SOFTWARE,
                                                     SW_PAGE_FAULTS),
                                 Counter("context_switches", TYPE_SOFTWARE,
                                         SW_CONTEXT_SWITCHES))


class PmuError(Exception):
    """The counters cannot be opened: one line (``unsupported: ...`` where the box has none)."""


def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    lib.ioctl.restype = ctypes.c_int
    return lib


_LIBC: ctypes.CDLL | None = None


def _perf_open(attr: bytes, pid: int, cpu: int, group_fd: int) -> int:
    """perf_event_open(attr, pid, cpu, group_fd, FD_CLOEXEC) → fd; OSError with errno."""
    global _LIBC
    nr = SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open: no syscall number known for "
                                    f"{platform.machine()}")
    if _LIBC is None:
        _LIBC = _libc()
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _LIBC.syscall(ctypes.c_long(nr), buf, ctypes.c_int(pid), ctypes.c_int(cpu),
                       ctypes.c_int(group_fd), ctypes.c_ulong(FLAG_FD_CLOEXEC))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


def _ioctl(fd: int, req: int, arg: int | ctypes.c_uint64 = 0) -> None:
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    a = ctypes.byref(arg) if isinstance(arg, ctypes.c_uint64) else ctypes.c_ulong(arg)
    if _LIBC.ioctl(ctypes.c_int(fd), ctypes.c_ulong(req), a) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def attr(c: Counter, *, sampling: bool = False, disabled: bool = False) -> bytes:
    """A ``struct perf_event_attr`` (:data:`ATTR_SIZE` bytes): a counting member, or a
    sampling one (every hit a sample of the group's values) for a uprobe event."""
    flags = BIT_USE_CLOCKID | (BIT_DISABLED if disabled else 0)
    period = 1 if sampling else 0
    stype = SAMPLE_IDENTIFIER | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_READ \
        if sampling else 0
    rfmt = FORMAT_GROUP | FORMAT_ID | FORMAT_ENABLED | FORMAT_RUNNING
    head = struct.pack("<IIQQQQQ", c.type, ATTR_SIZE, c.config, period, stype, rfmt, flags)
    # wakeup_events, bp_type, config1, config2, branch_sample_type, sample_regs_user,
    # sample_stack_user, clockid
    tail = struct.pack("<IIQQQQIi", 0, 0, 0, 0, 0, 0, 0, CLOCK_MONOTONIC)
    out = head + tail
    return out + bytes(ATTR_SIZE - len(out))


class Sample(NamedTuple):
    """One uprobe hit's sample: when, which event, the group's values (by counter name), and
    the group's enabled/running ns (equal growth: the counters ran the whole time)."""

    ts_ns: int
    event: str
    cpu: int
    values: dict[str, int]
    enabled_ns: int
    running_ns: int


def parse_sample(rec: bytes, names: dict[int, str]) -> tuple[int, Sample] | None:
    """(tid, :class:`Sample`) of one PERF_RECORD_SAMPLE body (after its 8-byte header), in
    the layout :func:`attr` asks for; None for an id not ours."""
    ident, _pid, tid, ts, cpu, _res, nr, en, run = struct.unpack_from("<QIIQIIQQQ", rec, 0)
    event = names.get(ident)
    if event is None:
        return None
    vals = struct.unpack_from(f"<{2 * nr}Q", rec, 56)
    values = {names.get(vals[i + 1], str(vals[i + 1])): vals[i] for i in range(0, 2 * nr, 2)}
    return tid, Sample(ts, event, cpu, values, en, run)


class Ring:
    """One thread's mmap'd perf ring: :meth:`records` → the record bodies written since the
    last call, with the lost count."""

    def __init__(self, fd: int, pages: int = RING_PAGES) -> None:
        self.map = mmap.mmap(fd, (1 + pages) * PAGE, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self.off, self.size = struct.unpack_from("<QQ", self.map, DATA_OFF)
        if not self.size:   # (before Linux 4.1 the data area is the pages after the first)
            self.off, self.size = PAGE, pages * PAGE
        self._fence = threading.Lock()

    def records(self) -> tuple[list[tuple[int, bytes]], int]:
        """[(type, body)] of the records between our tail and the kernel's head, and the
        events the kernel says it lost there (PERF_RECORD_LOST, LOST_SAMPLES)."""
        m = self.map
        head = struct.unpack_from("<Q", m, HEAD_OFF)[0]
        with self._fence:   # smp_rmb() (module docstring)
            tail = struct.unpack_from("<Q", m, TAIL_OFF)[0]
        out: list[tuple[int, bytes]] = []
        lost = 0
        size, off = self.size, self.off
        while tail < head:
            pos = tail % size
            hdr = self._copy(off, pos, 8, size)
            rtype, _misc, rsize = struct.unpack("<IHH", hdr)
            if rsize < 8:   # never written so by the kernel: stop rather than spin
                break
            body = self._copy(off, (pos + 8) % size, rsize - 8, size)
            if rtype == RECORD_SAMPLE:
                out.append((rtype, body))
            elif rtype == RECORD_LOST:
                lost += struct.unpack_from("<QQ", body, 0)[1]
                out.append((rtype, body))
            elif rtype == RECORD_LOST_SAMPLES:
                lost += struct.unpack_from("<Q", body, 0)[0]
                out.append((rtype, body))
            tail += rsize
        struct.pack_into("<Q", m, TAIL_OFF, tail)   # after the copies: smp_mb() then store
        return out, lost

    def _copy(self, off: int, pos: int, n: int, size: int) -> bytes:
        """``n`` bytes at ring position ``pos``, reassembled where they wrap the end."""
        first = min(n, size - pos)
        b = self.map[off + pos: off + pos + first]
        return b + self.map[off: off + n - first] if first < n else b

    def close(self) -> None:
        try:
            self.map.close()
        except (BufferError, ValueError):
            pass


@dataclass
class Group:
    """One thread's perf group: its descriptors (leader first), its ring, and the ids of
    its members (id → counter or event name)."""

    tid: int
    fds: list[int] = field(default_factory=list)
    ring: Ring | None = None
    names: dict[int, str] = field(default_factory=dict)
    samples: deque = field(default_factory=lambda: deque(maxlen=KEEP_SAMPLES))

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for fd in reversed(self.fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


class Call(NamedTuple):
    """One call's counts (return sample − entry sample): counter name → count over the call."""

    tid: int
    start_ns: int
    end_ns: int
    counts: dict[str, int]


def event_ids(tracefs: Path, group: str, names: Iterable[str]) -> dict[str, int]:
    """The tracepoint id of each uprobe event (``events/<group>/<name>/id`` under the
    tracefs root: the id is global, not per instance)."""
    return {n: int((tracefs / "events" / group / n / "id").read_text()) for n in names}


def event_sources(root: Path = Path("/sys/bus/event_source/devices")) -> list[str]:
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def probe(tid: int, counters: tuple[Counter, ...] = HARDWARE,
          sources: Path = Path("/sys/bus/event_source/devices")) -> str | None:
    """None where every counter of ``counters`` opens for thread ``tid``; else the line why
    not (``unsupported: ...`` where the kernel has no such counter). The descriptors opened
    to find out are closed."""
    fds: list[int] = []
    try:
        for c in counters:
            try:
                fds.append(_perf_open(attr(c, disabled=True), tid, -1, fds[0] if fds else -1))
            except OSError as exc:
                return why_not(c, exc, event_sources(sources))
        return None
    finally:
        for fd in fds:
            os.close(fd)


def why_not(c: Counter, exc: OSError, sources: list[str]) -> str:
    """One line for a counter that did not open (perf_event_open(2)'s errors)."""
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    if exc.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV) and c.type == TYPE_HARDWARE:
        pmus = [s for s in sources if s == "cpu" or s.startswith(("cpu_", "armv8", "arm_"))]
        return (f"unsupported: no hardware {c.name} counter (perf_event_open: {name}; event "
                f"sources: {', '.join(sources) or 'none'}"
                + ("" if pmus else ": no CPU PMU exposed") + ")")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"unsupported: {c.name}: perf_event_open refused ({name}: needs root or "
                "CAP_PERFMON, see /proc/sys/kernel/perf_event_paranoid)")
    return f"unsupported: {c.name}: perf_event_open: {name} ({exc.strerror or exc})"


class Counters:
    """The groups of one attached process: :meth:`open`, :meth:`set_threads` as threads come
    and go, :meth:`read` (drain every ring into per-thread samples), :func:`join` of the
    calls, :meth:`close`."""

    def __init__(self, tracefs: Path, group: str, entries: list[str], returns: list[str],
                 counters: tuple[Counter, ...] = HARDWARE, pages: int = RING_PAGES) -> None:
        self.ids = event_ids(tracefs, group, entries + returns)
        self.entries, self.returns = set(entries), set(returns)
        self.counters = counters
        self.pages = pages
        self.groups: dict[int, Group] = {}
        self.lost = 0
        self.failed: dict[int, str] = {}   # tid → why its group did not open
        self.closed = False

    def open_thread(self, tid: int) -> Group:
        """The group of thread ``tid`` (OSError where the kernel refuses; nothing left open)."""
        g = Group(tid)
        try:
            for i, c in enumerate(self.counters):
                fd = _perf_open(attr(c, disabled=i == 0), tid, -1, g.fds[0] if g.fds else -1)
                g.fds.append(fd)
                g.names[self._id(fd)] = c.name
            g.ring = Ring(g.fds[0], self.pages)
            for name, eid in self.ids.items():
                fd = _perf_open(attr(Counter(name, TYPE_TRACEPOINT, eid), sampling=True),
                                tid, -1, g.fds[0])
                g.fds.append(fd)
                g.names[self._id(fd)] = name
                _ioctl(fd, IOC_SET_OUTPUT, g.fds[0])
            _ioctl(g.fds[0], IOC_ENABLE, IOC_FLAG_GROUP)
        except (OSError, ValueError):
            g.close()
            raise
        return g

    @staticmethod
    def _id(fd: int) -> int:
        v = ctypes.c_uint64(0)
        _ioctl(fd, IOC_ID, v)
        return int(v.value)

    def set_threads(self, tids: Iterable[int]) -> None:
        """Groups for the threads in ``tids`` (new ones opened, gone ones read a last time
        and closed). A thread that exited before its group opened (ESRCH) is skipped."""
        want = set(tids)
        for tid in [t for t in self.groups if t not in want]:
            self.groups.pop(tid).close()
        for tid in sorted(want - set(self.groups)):
            if len(self.groups) >= MAX_THREADS or tid in self.failed:
                continue
            try:
                self.groups[tid] = self.open_thread(tid)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    self.failed[tid] = exc.strerror or str(exc)

    def read(self) -> int:
        """Drain every ring into its thread's samples; the number of samples read."""
        n = 0
        for g in self.groups.values():
            if g.ring is None:
                continue
            recs, lost = g.ring.records()
            for rtype, body in recs:
                if rtype != RECORD_SAMPLE:
                    g.samples.clear()   # a gap: no call is paired across it
                    continue
                got = parse_sample(body, g.names)
                if got is not None and got[0] == g.tid:
                    g.samples.append(got[1])
                    n += 1
            self.lost += lost
        return n

    def fds(self) -> int:
        """Descriptors held: each group's, and each ring's (Python's mmap keeps a dup of the
        leader's descriptor until it is closed)."""
        return sum(len(g.fds) + (g.ring is not None) for g in self.groups.values())

    def close(self) -> None:
        for g in self.groups.values():
            g.close()
        self.groups.clear()
        self.closed = True

    def __enter__(self) -> Counters:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def join(samples: deque, start_ns: int, end_ns: int, entries: set[str],
         ends: set[str]) -> tuple[Sample, Sample] | None | str:
    """The (entry, end) samples of the call ``[start_ns, end_ns]`` of one thread: the first
    entry sample at or after ``start_ns`` and the first ``ends`` sample (its return; entry-only
    timing: the next entry) at or after ``end_ns`` and before the thread's next entry after it;
    None when they are not (yet) there; "multiplexed" when the group did not run the whole
    call. Samples before the call's end sample are dropped (calls of a thread come in order)."""
    first = last = None
    for s in samples:
        if first is None:
            if s.ts_ns >= start_ns and s.event in entries:
                if s.ts_ns > end_ns:
                    return None
                first = s
        elif s.ts_ns >= end_ns and s.event in ends:
            last = s
            break
    if first is None or last is None:
        return None
    while samples and samples[0] is not last:
        samples.popleft()
    if last.running_ns - first.running_ns != last.enabled_ns - first.enabled_ns:
        return "multiplexed"
    return first, last


def counts(first: Sample, last: Sample, names: set[str]) -> dict[str, int]:
    """Counter name → its growth from ``first`` to ``last``, for the counters ``names`` (the
    uprobe members' hit counts left out)."""
    return {k: last.values[k] - first.values.get(k, 0) for k in names if k in last.values}


def prune(samples: deque, before_ns: int) -> None:
    """Drop the samples older than ``before_ns`` (a call given up: its thread's later calls
    are joined from there)."""
    while samples and samples[0].ts_ns < before_ns:
        samples.popleft()
