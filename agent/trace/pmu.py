"""Per-call CPU counters of the calls ``watch --attach`` times (issue #35 item 2e): cycles,
instructions and the thread's on-CPU ns between a call's entry and its return, exact per call.

Mechanism (perf_event_open(2), Documentation/trace/uprobetracer.rst): for each thread of the
attached process one perf **group**, opened with ``pid=tid, cpu=-1`` (it counts only while
that thread runs, on whatever CPU):

- the counters: the leader (``cycles``, PERF_TYPE_HARDWARE; the first software counter where
  the members are software ones), the other counters (``instructions``) and
  ``task_clock`` (PERF_COUNT_SW_TASK_CLOCK: the thread's on-CPU ns, so that
  cycles / on-CPU ns is the effective frequency);
- a uprobe on each function watch times, at the same file offset as watch's own uprobe
  events, entry and return, as *sampling* members (:data:`UPROBE_PMU`: perf's ``uprobe``
  event source, ``config`` bit 0 the return probe, ``config1`` the path — watch's pinned
  ``/proc/self/fd/N`` of the library — and ``config2`` the offset), ``sample_period=1``,
  ``sample_type`` IDENTIFIER|TID|TIME|CPU|READ and ``read_format``
  GROUP|ID|TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING, their output redirected into the leader's
  mmap'd ring (PERF_EVENT_IOC_SET_OUTPUT: allowed between events of one task and one cpu).

Each uprobe hit then writes one PERF_RECORD_SAMPLE holding the whole group's values at that
instant (a sample with PERF_FORMAT_GROUP reads the leader and every sibling, whichever member
fired): a call's counts are its return sample minus its entry sample, on its own thread.

Why perf's own uprobes and not watch's uprobe events (PERF_TYPE_TRACEPOINT with the id from
``events/<group>/<event>/id``, the first idea): a uprobe event is either ftrace's or perf's —
kernel/trace/trace_uprobe.c ``probe_event_enable`` returns -EINTR to perf while the event is
enabled in a trace instance (TP_FLAG_TRACE) and the other way round; measured on Linux 6.18:
EINTR for every thread. A uprobe of the ``uprobe`` PMU is a private probe of its descriptor
on the same instruction (one breakpoint, a second consumer): nothing is written to
``uprobe_events``, and it goes with its descriptor on every exit, SIGKILL included. The
uprobes are members, not leaders (the brief's first idea): one group reads *one* set of
counters at both the entry and the return, where a group per uprobe event would need a
hardware counter pair per event (two per target; a trial arms several targets) and the
entry's and the return's counters would be different counters. Per thread rather than per
CPU (decided by experiment on Linux 6.18: a uprobe opened with ``pid=tid, cpu=-1`` samples
that thread's hits only, sits in a group beside the counters and shares its ring); a
per-CPU counter counts whatever runs on the CPU, so a call that was preempted would be
charged the other task's instructions; per thread the counters stop when the thread is
switched out, which is what "the call's work" is.

The clock: ``use_clockid`` with CLOCK_MONOTONIC, which the kernel reads with
``ktime_get_mono_fast_ns`` — the very function of the trace instance's ``mono`` clock
(agent/trace/instance.py sets it; the calls' ``start_ns``/``end_ns`` come from it). Each
thread's samples are paired as watch's reader pairs the trace events (:meth:`Group.pair`:
the outermost entry to its return), and a call watch timed is joined to the paired call
whose entry and end are both nearest, within :data:`JOIN_NS` (:func:`join`): the trace
event and the perf sample of one hit are written by two consumers of one breakpoint, one
after the other, µs apart. A call is joined only where its group ran the whole call
(time_running grew as much as time_enabled: no multiplexing with another user of the PMU);
otherwise it is counted in ``multiplexed`` and left without counts.

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
thread's group that fails half-way); watch's reader closes them with itself.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import resource
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
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe/type")   # perf's uprobe event source
UPROBE_RETURN = 1   # its "retprobe" format bit (config:0)
ATTR_SIZE = 136          # PERF_ATTR_SIZE_VER8 (Linux 6.3+); older kernels take the zeros
HEAD_OFF, TAIL_OFF, DATA_OFF, SIZE_OFF = 1024, 1032, 1040, 1048
PAGE = mmap.PAGESIZE
RING_PAGES = 16          # data pages per thread (64 KiB: ~300 calls of 2 samples)
MAX_THREADS = 64         # groups opened at most (threads beyond it: their calls uncounted)
FD_SHARE = 0.5           # ... and no more descriptors than this share of RLIMIT_NOFILE
KEEP_CALLS = 4096        # calls kept per thread, waiting for watch's rows of them
PENDING_READS = 3        # a row whose samples are not there yet is tried this many reads
JOIN_NS = 50_000         # a row and its perf call: their entries and ends this close at most


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


def attr(c: Counter, *, sampling: bool = False, disabled: bool = False, config1: int = 0,
         config2: int = 0) -> bytes:
    """A ``struct perf_event_attr`` (:data:`ATTR_SIZE` bytes): a counting member, or a
    sampling one (every hit a sample of the group's values) for a uprobe (``config1``: the
    address of its path, ``config2``: its offset)."""
    flags = BIT_USE_CLOCKID | (BIT_DISABLED if disabled else 0)
    period = 1 if sampling else 0
    stype = SAMPLE_IDENTIFIER | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_READ \
        if sampling else 0
    rfmt = FORMAT_GROUP | FORMAT_ID | FORMAT_ENABLED | FORMAT_RUNNING
    head = struct.pack("<IIQQQQQ", c.type, ATTR_SIZE, c.config, period, stype, rfmt, flags)
    # wakeup_events, bp_type, config1, config2, branch_sample_type, sample_regs_user,
    # sample_stack_user, clockid
    tail = struct.pack("<IIQQQQIi", 0, 0, config1, config2, 0, 0, 0, CLOCK_MONOTONIC)
    out = head + tail
    return out + bytes(ATTR_SIZE - len(out))


class Sample(NamedTuple):
    """One uprobe hit's sample: when, which event, the group's members' names and values in
    the group's order (:attr:`values` by name: built only for the calls joined), and the
    group's enabled/running ns (equal growth: the counters ran the whole time)."""

    ts_ns: int
    event: str
    cpu: int
    keys: tuple[str, ...]
    vals: tuple[int, ...]
    enabled_ns: int
    running_ns: int

    @property
    def values(self) -> dict[str, int]:
        return dict(zip(self.keys, self.vals))


_HEADER = struct.Struct("<IHH")   # perf_event_header: type, misc, size
_SAMPLE_HEAD = "<QIIQIIQQQ"   # id, pid, tid, time, cpu, res, nr, time_enabled, time_running
_STRUCTS: dict[int, struct.Struct] = {}


def _layout(nr: int) -> struct.Struct:
    """The sample body of a group of ``nr`` members (a Struct per size, made once)."""
    st = _STRUCTS.get(nr)
    if st is None:
        st = _STRUCTS[nr] = struct.Struct(_SAMPLE_HEAD + "QQ" * nr)
    return st


def parse_sample(buf: bytes, at: int, size: int, names: dict[int, str],
                 order: dict[tuple, tuple[str, ...]] | None = None
                 ) -> tuple[int, Sample] | None:
    """(tid, :class:`Sample`) of the PERF_RECORD_SAMPLE body of ``size`` bytes at ``at`` in
    ``buf`` (after its 8-byte header), in the layout :func:`attr` asks for; None for an id not
    ours. ``order``: a cache of the members' names by their ids' order (the same each
    sample of a group: leader first, then the siblings as added)."""
    nr = (size - 56) // 16
    if nr <= 0:
        return None
    v = _layout(nr).unpack_from(buf, at)
    event = names.get(v[0])
    if event is None:
        return None
    ids = v[10::2]
    keys = order.get(ids) if order is not None else None
    if keys is None:
        keys = tuple(names.get(i, str(i)) for i in ids)
        if order is not None:
            order[ids] = keys
    return v[2], Sample(v[3], event, v[4], keys, v[9::2], v[7], v[8])


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

    def records(self) -> tuple[bytes, list[tuple[int, int, int]], int]:
        """The bytes between our tail and the kernel's head (copied out at once, reassembled
        where they wrap the end of the data area), each record in them as (type, offset of
        its body, body size), and the events the kernel says it lost there
        (PERF_RECORD_LOST, LOST_SAMPLES)."""
        m = self.map
        head = struct.unpack_from("<Q", m, HEAD_OFF)[0]
        with self._fence:   # smp_rmb() (module docstring)
            tail = struct.unpack_from("<Q", m, TAIL_OFF)[0]
        if head <= tail:
            return b"", [], 0
        size, off = self.size, self.off
        pos, n = tail % size, min(head - tail, size)
        first = min(n, size - pos)
        buf = m[off + pos: off + pos + first]
        if first < n:
            buf += m[off: off + n - first]
        struct.pack_into("<Q", m, TAIL_OFF, tail + n)   # after the copy: smp_mb(), store
        out: list[tuple[int, int, int]] = []
        lost, at, hdr = 0, 0, _HEADER.unpack_from
        while at + 8 <= n:
            rtype, _misc, rsize = hdr(buf, at)
            if rsize < 8 or at + rsize > n:   # never written so by the kernel: stop
                break
            if rtype == RECORD_LOST:
                lost += struct.unpack_from("<QQ", buf, at + 8)[1]
            elif rtype == RECORD_LOST_SAMPLES:
                lost += struct.unpack_from("<Q", buf, at + 8)[0]
            if rtype in (RECORD_SAMPLE, RECORD_LOST, RECORD_LOST_SAMPLES):
                out.append((rtype, at + 8, rsize - 8))
            at += rsize
        return buf, out, lost

    def close(self) -> None:
        try:
            self.map.close()
        except (BufferError, ValueError):
            pass


@dataclass
class Group:
    """One thread's perf group: its descriptors (leader first), its ring, the ids of its
    members (id → counter or probe name) and its calls paired from the samples
    (:meth:`pair`): (entry sample, end sample), oldest first."""

    tid: int
    fds: list[int] = field(default_factory=list)
    ring: Ring | None = None
    names: dict[int, str] = field(default_factory=dict)
    probe_fds: dict[str, int] = field(default_factory=dict)   # probe name → its descriptor
    order: dict[tuple, tuple[str, ...]] = field(default_factory=dict)   # (parse_sample's)
    calls: deque = field(default_factory=lambda: deque(maxlen=KEEP_CALLS))
    _open: dict[str, Sample] = field(default_factory=dict)
    _start: Sample | None = None

    def pair(self, s: Sample, is_return: bool, entry_only: bool) -> None:
        """The pairing watch's reader does with the trace events (agent/watch/latency/
        attached.py), on this thread's samples: the outermost entry to its return is a call
        (a nested probed function inside it apart); an entry whose last entry did not return
        starts again; entry-only timing, one entry to the next."""
        if entry_only:
            if self._start is not None:
                self.calls.append((self._start, s))
            self._start = s
            return
        if is_return:
            if self._open.pop("call" + s.event[3:], None) is not None and not self._open:
                self.calls.append((self._start, s))
            return
        if s.event in self._open:   # its return was never sampled
            self._open.clear()
        if not self._open:
            self._start = s
        self._open[s.event] = s

    def gap(self) -> None:
        """Samples were lost: no call is paired across them."""
        self._open.clear()
        self._start = None

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


class Probe(NamedTuple):
    """A uprobe of the group: its name (watch's event name, ``call<i>``/``ret<i>``), the
    library's path as the kernel should open it, the file offset, entry or return."""

    name: str
    path: str
    offset: int
    returns: bool


def uprobe_type(path: Path = UPROBE_PMU) -> int:
    """perf's uprobe event source's type (Linux 4.17+); OSError without one."""
    return int(path.read_text())


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

    def __init__(self, probes: list[Probe], counters: tuple[Counter, ...] = HARDWARE,
                 pages: int = RING_PAGES, pmu_type: Path = UPROBE_PMU) -> None:
        try:
            self.type = uprobe_type(pmu_type)
        except (OSError, ValueError):
            raise PmuError(f"unsupported: no uprobe event source ({pmu_type}: perf's "
                           "uprobes, Linux 4.17+)") from None
        self.probes = list(probes)
        self.entries = [p.name for p in probes if not p.returns]
        self.returns = [p.name for p in probes if p.returns]
        self._returns = set(self.returns)
        self.entry_only = not self.returns
        self.counters = counters
        self.pages = pages
        self.groups: dict[int, Group] = {}
        self.lost = 0
        self.failed: dict[int, str] = {}   # tid → why its group did not open
        self.opened = 0                    # groups opened over the run (threads counted)
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
            for p in self.probes:
                path = ctypes.create_string_buffer(os.fsencode(p.path))
                a = attr(Counter(p.name, self.type, UPROBE_RETURN if p.returns else 0),
                         sampling=True, config1=ctypes.addressof(path), config2=p.offset)
                fd = _perf_open(a, tid, -1, g.fds[0])   # (path: alive through the call)
                g.fds.append(fd)
                g.names[self._id(fd)] = p.name
                g.probe_fds[p.name] = fd
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
        per = len(self.counters) + len(self.probes) + 1   # a group's descriptors, its ring's
        room = int(resource.getrlimit(resource.RLIMIT_NOFILE)[0] * FD_SHARE)
        for tid in sorted(want - set(self.groups)):
            if tid in self.failed:
                continue
            if len(self.groups) >= MAX_THREADS or self.fds() + per > room:
                self.failed[tid] = (f"over {MAX_THREADS} threads or {FD_SHARE:.0%} of the "
                                    "descriptor limit (RLIMIT_NOFILE)")
                continue
            try:
                self.groups[tid] = self.open_thread(tid)
                self.opened += 1
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    self.failed[tid] = exc.strerror or str(exc)

    def read(self) -> int:
        """Drain every ring into its thread's calls; the number of samples read."""
        n = 0
        for g in self.groups.values():
            if g.ring is None:
                continue
            buf, recs, lost = g.ring.records()
            for rtype, at, size in recs:
                if rtype != RECORD_SAMPLE:
                    g.gap()
                    continue
                got = parse_sample(buf, at, size, g.names, g.order)
                if got is not None and got[0] == g.tid:
                    g.pair(got[1], got[1].event in self._returns, self.entry_only)
                    n += 1
            self.lost += lost
        return n

    def drop(self, names: Iterable[str]) -> None:
        """Close the uprobes ``names`` in every group (a trial's losers: watch drops their
        trace events, and a uprobe costs its function a trap while any consumer holds it):
        a sibling closed leaves its group."""
        gone = set(names)
        self.probes = [p for p in self.probes if p.name not in gone]
        for g in self.groups.values():
            for n in gone & set(g.probe_fds):
                fd = g.probe_fds.pop(n)
                g.fds.remove(fd)
                os.close(fd)

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


def join(calls: deque, start_ns: int, end_ns: int) -> tuple[Sample, Sample] | None | str:
    """The (entry, end) samples of the call that watch's trace events timed ``[start_ns,
    end_ns]`` on one thread: the paired call (:meth:`Group.pair`) nearest to it, both ends
    within :data:`JOIN_NS` (the two probes' handlers run one after the other on the same hit,
    in either order: the kernel keeps a uprobe's consumers in a list); None when it is not
    (yet) there; "multiplexed" when the group did not run the whole call. Calls before it
    are dropped (a thread's calls come in order)."""
    best, dist = None, JOIN_NS + 1
    for i, (a, b) in enumerate(calls):
        d = max(abs(a.ts_ns - start_ns), abs(b.ts_ns - end_ns))
        if d < dist:
            best, dist = i, d
        elif a.ts_ns > end_ns + JOIN_NS:
            break
    if best is None:
        return None
    for _ in range(best):
        calls.popleft()
    first, last = calls.popleft()
    if last.running_ns - first.running_ns != last.enabled_ns - first.enabled_ns:
        return "multiplexed"
    return first, last


def counts(first: Sample, last: Sample, names: set[str]) -> dict[str, int]:
    """Counter name → its growth from ``first`` to ``last``, for the counters ``names`` (the
    uprobe members' hit counts left out)."""
    a, b = first.values, last.values
    return {k: b[k] - a.get(k, 0) for k in names if k in b}


def prune(calls: deque, before_ns: int) -> None:
    """Drop the calls that ended before ``before_ns`` (a row given up: its thread's later
    calls are joined from there)."""
    while calls and calls[0][1].ts_ns < before_ns:
        calls.popleft()
