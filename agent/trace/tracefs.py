"""The event source: a private tracefs instance on the probe CPUs, read only around spikes.

Life cycle (kernel Documentation/trace/ftrace.rst, "Instances"):

- ``mkdir <tracefs>/instances/hftagent-<pid>`` creates a trace array of our own, with its
  own ring buffer, events, ``tracing_on``, ``trace_clock`` and ``tracing_cpumask``; ``rmdir``
  removes it (EBUSY while one of its files is open, so ours are closed first). Nothing
  outside that directory is ever written: not the top-level ``tracing_on``,
  ``current_tracer`` or events, not another instance — except removing an instance named
  ``hftagent-<pid>`` whose creator is dead (a SIGKILLed watch), at the next start.
  Removed by :meth:`EventSource.close`, at exit (atexit, KeyboardInterrupt included), and on
  SIGTERM where nobody else handles it: the first open installs a handler (main thread,
  default disposition only) that removes every instance held, then dies of SIGTERM as it
  would have. Commands that handle SIGTERM themselves (watch, cpus) unwind to ``close``.
- In it: ``tracing_on`` 0 while it is set up; ``trace_clock`` ``mono`` (CLOCK_MONOTONIC:
  the probe's ``time.monotonic_ns`` and ``perf_counter_ns`` read the same clock on Linux, so
  a sample's intended start and end select events directly); ``options/overwrite`` 1 (the
  kernel ring is the flight recorder: the oldest events make room, the writer never stops);
  ``tracing_cpumask`` = the probe CPUs; ``per_cpu/cpuN/buffer_size_kb`` sized for
  ``buffer_s`` seconds on the probe CPUs and the minimum on the others (the mask does not
  stop the kernel allocating every CPU's buffer); the events of :data:`WANTED` that the
  instance's ``events/`` directory has, each through its own ``enable`` file; then
  ``tracing_on`` 1.
- Reading: ``per_cpu/cpuN/trace_pipe_raw`` (binary ring-buffer pages, consuming), drained
  non-blocking only when a window is asked for; the pages drained are kept, raw, for
  ``keep_s`` seconds (``buffer_s`` by default; bounded in bytes) so that windows
  overlapping an earlier read still find their events, and only the pages that overlap a
  window are read: the first found by bisecting the kept pages' timestamps; each page's
  record headers are walked once into a PageIndex (pages.py) that the next windows over it
  bisect, and its records are decoded once each (identical records once per format:
  EventFormat.make_event's memo), the last :data:`INDEXED_PAGES` per CPU staying indexed;
  the last ``sched_switch`` before the window comes from the first page's index, else from
  the pages before it back to that switch, each page's last switch remembered once walked.
  So a read costs the window's pages and records, not the event rate or the time since the
  last read (``Window.walked`` / ``Window.decoded`` count it; tests/test_events_window_work.py):
  a spike window of a few ms costs ~0.1 ms of CPU with ~50 events, ~0.5-1 ms with ~800
  under a softirq flood (bench/events_read_cost.py --windows). The instance's
  ``trace`` file is not used where the binary layout is readable: it formats the whole
  buffer on every read — 0.28 s of kernel time for an 8 MiB buffer (186k events) on the
  2-vCPU guest against 2 ms to drain the same buffer raw (docs/events.md,
  bench/events_read_cost.py). It is the fallback reader (``reader="text"``) where
  ``events/header_page`` / ``header_event`` describe a layout the binary parser does not know.

Bounded memory whatever the event rate: the kernel ring has a fixed size; a storm
overwrites its oldest pages and the next read reports them as lost (``RB_MISSED_EVENTS``),
which moves the CPU's "continuous since" mark forward: a window that starts before the
mark is returned incomplete, with the reason, never guessed at. Kept pages are capped per
CPU; eviction moves the mark too.

Every failure — tracefs not mounted (mounted only with ``mount=True``), no permission, the
instance name taken, an unknown layout, a write the kernel refuses — is one
:class:`Unsupported` with one line of reason; no exception escapes :meth:`EventSource.open`.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os
import re
import signal
import threading
import time
import weakref
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

from collectors.host import Host

from .event import Event, EventFormat, FormatError, parse_format
from .pages import (
    Page,
    PageLayout,
    check_header_event,
    decode_record,
    iter_page,
    page_index,
    page_info,
    page_last_of,
    page_last_ts,
    page_may_hold,
    parse_header_page,
)
from .symbols import SymbolResolver
from .text import TextStats, parse_text

PREFIX = "hftagent-"
# (system, event) in the order of the issue; each enabled only where the instance has it.
WANTED: tuple[tuple[str, str], ...] = (
    ("sched", "sched_switch"), ("sched", "sched_waking"), ("sched", "sched_wakeup"),
    ("sched", "sched_migrate_task"),
    ("irq", "irq_handler_entry"), ("irq", "irq_handler_exit"),
    ("irq", "softirq_entry"), ("irq", "softirq_exit"),
    ("workqueue", "workqueue_execute_start"), ("workqueue", "workqueue_execute_end"),
    ("tlb", "tlb_flush"), ("ipi", "ipi_send_cpu"), ("ipi", "ipi_send_cpumask"),
    # the probe CPUs' own block requests: issued by the probe (its common_pid), completed in
    # an interrupt there (an I/O wait's end). Issue #26 item 1; cheap: only I/O on the probe
    # CPUs fires them
    ("block", "block_rq_issue"), ("block", "block_rq_complete"),
)
# The wake instance (``hftagent-<pid>-wake``, every online CPU): what ends a probe thread's
# not-runnable stretch happens on the *waker's* CPU — sched_waking fires in the waker's
# context, on its CPU (kernel/sched/core.c try_to_wake_up), signal_generate in the
# sender's — which the main instance's tracing_cpumask (the probe CPUs) does not trace. Its
# events carry a filter (the kernel evaluates it before the record is committed:
# Documentation/trace/events.rst, "Event filtering"), so the ring holds only:
# - wake-ups of a task whose CPU (``target_cpu``: task_cpu() when it fires) is a probe CPU,
#   from any CPU (those fired on the probe CPUs repeat the main instance's, whose window is
#   read from ``lo``: the reader keeps this ring's copies only from before it, the lookback
#   below); sched_wakeup only where sched_waking is missing (before 4.3);
# - stop and continue signals, and SIGKILL: who stopped a thread (T) and who ended it.
WAKE_SUFFIX = "-wake"
WAKE_EVENTS: tuple[tuple[str, str], ...] = (
    ("sched", "sched_waking"), ("sched", "sched_wakeup"), ("signal", "signal_generate"))
# SIGKILL 9, SIGCONT 18, SIGSTOP 19, SIGTSTP 20, SIGTTIN 21, SIGTTOU 22 (x86/arm64 numbers;
# asm-generic/signal.h)
SIGNAL_FILTER = "sig == 9 || (sig >= 18 && sig <= 22)"
# - the timers of sleeping threads armed on the probe CPUs (timer:hrtimer_start whose
#   callback is hrtimer_wakeup: nanosleep, futex and poll timeouts; not the tick): the
#   expiry a sleeper asked for, so a timer's wake-up tells a sleep the call asked for from
#   one that came late. Filtered on the callback's address (from kallsyms: enabled at the
#   first window once the symbol table is loaded) and the probe CPUs.
TIMER_EVENT = ("timer", "hrtimer_start")
TIMER_CALLBACK = "hrtimer_wakeup"
# Sizing: WAKE_ASSUMED_EPS such events a second per probe CPU, over all other CPUs together
# (a wake-up of a task on a probe CPU is followed by a switch there: the probe CPU's own
# switch rate bounds them), WAKE_EVENT_BYTES each (sched_waking 36 B + header), spread over
# the online CPUs, within [WAKE_MIN_KB, WAKE_MAX_KB] per CPU and WAKE_MAX_TOTAL_KB in all.
WAKE_ASSUMED_EPS = 2_000
WAKE_EVENT_BYTES = 48
WAKE_MIN_KB = 64
WAKE_MAX_KB = 1024
WAKE_MAX_TOTAL_KB = 32 * 1024
# A window's wake ring read starts this long before the window: the signal that stopped a
# thread that is still stopped at the window's start (the stop began between two calls).
WAKE_LOOKBACK_NS = 50_000_000

# irq_vectors: every *_entry/*_exit pair (local_timer, call_function(_single), reschedule,
# irq_work, thermal_apic, ...); the vector_* allocation events are not time spent on a CPU.
VECTOR_SYSTEM = "irq_vectors"

# Ring sizing. The assumed rate is what a probe CPU showed on a 2-vCPU guest with a
# CPU hog and a 500 Hz probe (sched + tlb + irq events, ~6k/s) with headroom for a storm
# burst; bytes/event is the measured mean (30-40 B: tlb_flush 24 B, sched_switch 68 B).
ASSUMED_RATE_EPS = 20_000
ASSUMED_EVENT_BYTES = 40
MIN_CPU_KB = 512
MAX_CPU_KB = 32 * 1024
MAX_TOTAL_KB = 256 * 1024
OTHER_CPU_KB = 4  # the kernel rounds up to its minimum (2 pages)
KEEP_MAX_BYTES = 16 << 20
# After lost events: ×4, so that a flood at ~50× the warm-up rate (a 16-vCPU 6.18 guest: 2,000 →
# ~50,000 events/s, 700,000/s inside its bursts) is covered after two resizes, not five.
GROW_FACTOR = 4
# Pages per probe CPU that keep their PageIndex (header walk + the events decoded from
# them, ~50-100 KiB each): the pages of the last few windows, so that overlapping windows
# (a burst of spikes) decode each record once.
INDEXED_PAGES = 32


@dataclass(frozen=True)
class Unsupported:
    """Why there is no event source; ``reason`` starts with ``unsupported:``."""

    reason: str

    def __bool__(self) -> bool:
        return False


class _Refused(Exception):
    """Set-up failed; the message is the Unsupported reason."""


@dataclass
class Window:
    """The events of the probe CPUs between ``t_from_ns - margin`` and ``t_to_ns``, sorted
    by time (plus, per CPU, the last ``sched_switch`` before that where the kept pages have
    one: who was running when the window opened; and, when the read asked for it, the first
    event after ``t_to_ns``: who was running when it closed).

    ``complete`` is False when events of ``[t_from_ns, t_to_ns]`` may be missing (``reason``
    says which CPU, since when and why: lost in a storm, evicted, before the instance
    started, or after the read); ``lost`` counts the events the kernel reported lost before
    pages this read touched. ``read_ns``: how long the call took (drain + decode + comms),
    wall clock; ``cpu_ns``: the CPU time the calling thread spent in it (what the read
    costs: on a loaded host ``read_ns`` also counts the time the thread waited to run).
    ``walked`` / ``decoded``: the pages whose record headers this read walked and the
    records it decoded (raw reader; pages and records an earlier window read are not
    counted again while their page stays indexed). The events are shared with other
    windows: read-only."""

    t_from_ns: int
    t_to_ns: int
    events: list[Event]
    complete: bool = True
    reason: str | None = None
    lost: int = 0
    read_ns: int = 0
    # pid -> comm for the tasks the events do not name themselves (an event carries only
    # common_pid): read from /proc/<pid>/comm when the window was read
    comms: dict[int, str] = field(default_factory=dict)
    cpu_ns: int = 0
    walked: int = 0  # the read's work (see above)
    decoded: int = 0
    # the wake instance's part (wake-ups and signals on the other CPUs, from
    # WAKE_LOOKBACK_NS before the window): False with the reason when it may lack some (not
    # running on this kernel, its ring overwritten); the events are in ``events``
    wake_complete: bool = True
    wake_reason: str | None = None


def _page_ts(page: Page) -> int:
    return page.ts_ns


_event_ts = attrgetter("ts_ns")  # (the sort key of a window's events: C, not a Python call)


def named_pids(events: list[Event]) -> set[int]:
    """The pids the events name with a comm (switch, wake-up, migration)."""
    out: set[int] = set()
    for ev in events:
        f = ev.fields
        if ev.name == "sched_switch":
            out.update((f.get("prev_pid", -1), f.get("next_pid", -1)))
        elif "comm" in f and "pid" in f:
            out.add(f["pid"])
    return out


@dataclass
class CpuStats:
    """``per_cpu/cpuN/stats`` of the instance (kernel trace.c tracing_stats_read)."""

    cpu: int
    entries: int = 0
    overrun: int = 0
    commit_overrun: int = 0
    bytes: int = 0
    dropped: int = 0
    read: int = 0
    oldest_ns: int | None = None
    now_ns: int | None = None


@dataclass
class _CpuRing:
    cpu: int
    fd: int = -1
    pages: deque = field(default_factory=deque)  # Page, oldest first
    kept_bytes: int = 0
    cover_from_ns: int = 0  # events are continuous from here on (see module docstring)
    cover_reason: str = "before the instance started"
    lost: int = 0  # events the kernel reported lost, in total
    evicted_pages: int = 0
    indexed: deque = field(default_factory=deque)  # Page with an index, oldest first
    keep_bytes: int = 0  # the kept pages' bound (0: the source's keep_bytes)


def parse_stats(text: str, cpu: int) -> CpuStats:
    st = CpuStats(cpu)
    for line in text.splitlines():
        key, _, val = line.partition(":")
        val = val.strip()
        try:
            if key == "entries":
                st.entries = int(val)
            elif key == "overrun":
                st.overrun = int(val)
            elif key == "commit overrun":
                st.commit_overrun = int(val)
            elif key == "bytes":
                st.bytes = int(val)
            elif key == "dropped events":
                st.dropped = int(val)
            elif key == "read events":
                st.read = int(val)
            elif key in ("oldest event ts", "now ts"):
                sec, _, frac = val.partition(".")
                ns = int(sec) * 1_000_000_000 + int((frac + "000000")[:6]) * 1000
                if key == "now ts":
                    st.now_ns = ns
                elif ns:
                    st.oldest_ns = ns
        except ValueError:
            continue
    return st


def cpumask_hex(cpus: set[int] | list[int]) -> str:
    """``tracing_cpumask`` format: hex, comma every 32 bits (``ffffffff,00000002``), the
    kernel's cpumask form (collectors.parsers.format_cpumask)."""
    from collectors.parsers import format_cpumask
    return format_cpumask(cpus)


def size_ring_kb(buffer_s: float, ncpus: int, rate_eps: float = ASSUMED_RATE_EPS,
                 event_bytes: float = ASSUMED_EVENT_BYTES) -> tuple[int, str]:
    """(per-CPU KiB, one line saying why) for ``buffer_s`` seconds at ``rate_eps`` events a
    second of ``event_bytes`` each, within [MIN_CPU_KB, MAX_CPU_KB] and MAX_TOTAL_KB over
    the probe CPUs."""
    want = int(buffer_s * rate_eps * event_bytes / 1024) + 1
    kb = max(MIN_CPU_KB, min(MAX_CPU_KB, want, MAX_TOTAL_KB // max(1, ncpus)))
    cover = kb * 1024 / max(1.0, rate_eps * event_bytes)
    why = (f"{kb} KiB per probe CPU: {buffer_s:g} s at {rate_eps:,.0f} events/s × "
           f"{event_bytes:.0f} B" + ("" if kb == want else
                                      f" (bounded; covers {cover:.1f} s at that rate)"))
    return kb, why


# -- the process-wide set of instances this process holds, for atexit and "taken" -----------
_HELD: dict[str, weakref.ref] = {}


_AT_EXIT = []  # registered on the first open, not at import


def _close_all_at_exit() -> None:
    for ref in list(_HELD.values()):
        src = ref()
        if src is not None:
            src.close()


def _close_all_then_die(signum: int, _frame) -> None:
    """SIGTERM with no handler of the command's: remove the instances, then die of the
    signal with its default action (the exit status says SIGTERM, as it would have)."""
    signal.signal(signum, signal.SIG_DFL)
    try:
        _close_all_at_exit()
    finally:
        os.kill(os.getpid(), signum)


def _at_exit_and_term() -> None:
    """Once per process, on the first open: atexit, and SIGTERM where its disposition is
    still the default and this is the main thread (only it may set handlers)."""
    if _AT_EXIT:
        return
    _AT_EXIT.append(True)
    atexit.register(_close_all_at_exit)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _close_all_then_die)


def _proc_is_dead_or_reused(host: Host, pid: int, created_wall: float) -> bool:
    """Whether the creator of an ``hftagent-<pid>`` instance is gone: no such process, a
    zombie, or a process started after the instance was made (the pid was reused)."""
    st = host.read(host.proc(pid, "stat"))
    if not st.ok:
        return True
    text = st.value
    try:
        after = text[text.rindex(")") + 2:].split()
        state, start_ticks = after[0], int(after[19])
    except (ValueError, IndexError):
        return False  # unreadable: leave it alone
    if state in ("Z", "X"):
        return True
    btime = None
    stat = host.read(host.proc("stat"))
    for line in (stat.value or "").splitlines():
        if line.startswith("btime "):
            btime = int(line.split()[1])
    if btime is None:
        return False
    started = btime + start_ticks / os.sysconf("SC_CLK_TCK")
    # btime has 1 s resolution: a process that started more than 2 s after the instance
    # was created cannot be its creator
    return started > created_wall + 2.0


def _instance_name() -> str:
    return f"{PREFIX}{os.getpid()}"


def find_tracefs(host: Host) -> Path | None:
    """The tracefs mount: /sys/kernel/tracing, else the debugfs view (older set-ups)."""
    for p in (host.sys("kernel", "tracing"), host.sys("kernel", "debug", "tracing")):
        try:
            if (p / "instances").is_dir():
                return p
        except PermissionError:
            # tracefs is mode 0700 (root only): one clear line, not a traceback
            raise _Refused(f"unsupported: no permission to use tracefs at "
                           f"{host.display(p)} (needs root)") from None
    return None


def _mount_tracefs(target: Path) -> None:
    """mount -t tracefs nodev TARGET (mount(2) through libc: no shell, no mount binary)."""
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(b"nodev", os.fsencode(str(target)), b"tracefs", ctypes.c_ulong(0), None)
    if rc != 0:
        e = ctypes.get_errno()
        raise _Refused(f"unsupported: cannot mount tracefs at {target}: {os.strerror(e)}")


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_bytes(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def _close_rings(rings) -> None:
    """Close each ring's trace_pipe_raw and drop its kept pages (idempotent)."""
    for ring in rings:
        if ring.fd >= 0:
            try:
                os.close(ring.fd)
            except OSError:
                pass
            ring.fd = -1
        ring.pages.clear()
        ring.indexed.clear()
        ring.kept_bytes = 0


class EventSource:
    """A private tracefs instance on the probe CPUs (module docstring). Build it with
    :meth:`open`; read with :meth:`window`; :meth:`close` (or ``with``) removes it."""

    def __init__(self) -> None:  # use open()
        self.host: Host | None = None
        self.tracefs: Path = Path()
        self.name = ""
        self.path: Path = Path()
        self.cpus: list[int] = []
        self.events: list[str] = []  # "system:name" enabled
        self.missing: list[str] = []  # wanted but not offered by this kernel
        self.reader = "raw"
        self.buffer_s = 0.0
        self.buffer_kb = 0
        self.sizing = ""
        self.notes: list[str] = []  # stale instances removed, mount done...
        self.started_ns = 0
        self.page_size = 4096
        self.keep_ns = 0
        self.keep_bytes = 0
        self._layout = PageLayout()
        self._formats: dict[int, EventFormat] = {}
        self._names: set[str] = set()
        self._switch_ids: set[int] = set()
        self._comm_cache: dict[int, str] = {}
        self._rings: dict[int, _CpuRing] = {}
        self._symbols: SymbolResolver | None = None
        self._creator = 0
        self._closed = True
        self._t_open = 0.0
        self._stats0: dict[int, CpuStats] = {}
        self._uprobe_ids: dict[int, bool] = {}    # event id -> a return probe (watch --attach)
        # the wake instance (WAKE_EVENTS): every online CPU; None reason while it runs
        self.wake_path: Path = Path()
        self.wake_events: list[str] = []
        self.wake_filters: dict[str, str] = {}
        self.wake_missing: list[str] = []
        self.wake_kb = 0
        self.wake_reason: str | None = "not opened"
        # hrtimer_start in the wake instance: "pending" (until kallsyms is loaded), "on", or
        # why not
        self.timer_starts = "pending"
        self._wake_rings: dict[int, _CpuRing] = {}
        self._wake_made = False
        self._uprobe_names: dict[str, bool] = {}
        self._uprobe_done: dict[int, int] = {}    # cpu -> pages scanned for uprobe hits

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def open(cls, host: Host, cpus, buffer_s: float = 10.0, *, mount: bool = False,
             rate_hint: float | None = None, keep_s: float | None = None,
             reader: str = "auto") -> EventSource | Unsupported:
        """Create and start the instance; an :class:`Unsupported` (falsy) with one line of
        reason when that cannot be done. ``cpus``: the probe CPUs. ``buffer_s``: seconds of
        events the kernel ring should hold at ``rate_hint`` events/s per CPU (default
        :data:`ASSUMED_RATE_EPS`; :meth:`refit` re-sizes from the measured rate).
        ``mount``: mount tracefs at /sys/kernel/tracing when it is not mounted (watch's
        ``--trace mount``). ``keep_s``: how long drained pages stay answerable (default
        ``buffer_s``, as the kernel ring would have kept them; bytes capped at the ring's
        size and KEEP_MAX_BYTES per CPU). ``reader``: ``raw``, ``text`` or ``auto`` (raw where the page
        layout is known)."""
        src = cls()
        try:
            src._open(host, sorted({int(c) for c in cpus}), buffer_s, mount, rate_hint,
                      keep_s, reader)
        except _Refused as exc:
            src._teardown()
            return Unsupported(str(exc))
        except ValueError as exc:  # a tracefs or sysfs file that does not read as documented
            src._teardown()
            return Unsupported(f"unsupported: tracefs instance set-up failed: {exc}")
        except OSError as exc:
            src._teardown()
            return Unsupported(f"unsupported: tracefs instance set-up failed: "
                               f"{exc.strerror or exc}"
                               + (f" ({exc.filename})" if exc.filename else ""))
        except BaseException:  # a stop (SIGTERM/SIGINT raised in a handler) mid-set-up
            src._teardown()
            raise
        return src

    def _open(self, host: Host, cpus: list[int], buffer_s: float, mount: bool,
              rate_hint: float | None, keep_s: float | None, reader: str) -> None:
        if not cpus:
            raise _Refused("unsupported: no probe CPUs to trace")
        if reader not in ("auto", "raw", "text"):
            raise _Refused(f"unsupported: unknown event reader {reader!r}")
        self.host = host
        root = find_tracefs(host)
        if root is None:
            target = host.sys("kernel", "tracing")
            shown = host.display(target)
            if not mount:
                raise _Refused(f"unsupported: tracefs not mounted at {shown} "
                               "(watch --trace mount mounts it)")
            if not host.live:
                raise _Refused(f"unsupported: tracefs not mounted at {shown} "
                               "(not mounting under a non-live root)")
            if not target.is_dir():
                raise _Refused(f"unsupported: no {shown} to mount tracefs on")
            _mount_tracefs(target)
            root = find_tracefs(host)
            if root is None:
                raise _Refused(f"unsupported: tracefs mounted at {shown} has no instances/")
            self.notes.append(f"mounted tracefs at {shown}")
        self.tracefs = root
        inst_dir = root / "instances"
        self._remove_stale(host, inst_dir)
        self.name = _instance_name()
        self.path = inst_dir / self.name
        shown = host.display(self.path)
        if str(self.path) in _HELD:
            raise _Refused(f"unsupported: tracefs instance {shown} is already in use by "
                           "this process")
        try:
            os.mkdir(self.path)
        except FileExistsError:
            raise _Refused(f"unsupported: tracefs instance {shown} already exists "
                           "(name taken)") from None
        except PermissionError:
            raise _Refused(f"unsupported: cannot create tracefs instance {shown}: "
                           "permission denied (needs root)") from None
        self._creator = os.getpid()
        self._closed = False
        _HELD[str(self.path)] = weakref.ref(self)
        _at_exit_and_term()
        p = self.path
        online = self._online_cpus(host)
        bad = [c for c in cpus if c not in online]
        if bad:
            raise _Refused(f"unsupported: probe CPU(s) {bad} not online")
        self.cpus = cpus
        _write(p / "tracing_on", "0")
        clocks = _read(p / "trace_clock")
        if "mono" not in clocks.replace("[", " ").replace("]", " ").split():
            raise _Refused(f"unsupported: trace clock 'mono' not offered ({clocks.strip()})")
        _write(p / "trace_clock", "mono")
        _write(p / "options" / "overwrite", "1")
        _write(p / "tracing_cpumask", cpumask_hex(cpus))
        # page (sub-buffer) size: buffer_subbuf_size_kb where the kernel has it (6.8+)
        try:
            self.page_size = int(_read(p / "buffer_subbuf_size_kb").split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            self.page_size = 4096
        self.reader = self._choose_reader(reader)
        self.buffer_s = buffer_s
        self._size_rings(online, rate_hint or ASSUMED_RATE_EPS)
        self.keep_ns = int((buffer_s if keep_s is None else keep_s) * 1e9)
        self.keep_bytes = min(KEEP_MAX_BYTES, self.buffer_kb * 1024)
        self._enable_events()
        for c in cpus:
            self._rings[c] = _CpuRing(c)
        self._load_formats()
        if self.reader == "raw":
            for c in cpus:
                self._rings[c].fd = os.open(p / "per_cpu" / f"cpu{c}" / "trace_pipe_raw",
                                            os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._open_wake(inst_dir, online)
        _write(p / "tracing_on", "1")
        if self._wake_rings:
            _write(self.wake_path / "tracing_on", "1")
        self.started_ns = time.monotonic_ns()
        for ring in (*self._rings.values(), *self._wake_rings.values()):
            ring.cover_from_ns = self.started_ns
        self._t_open = time.monotonic()
        self._stats0 = {c: self.cpu_stats(c) for c in cpus}
        kallsyms = host.proc("kallsyms")
        self._symbols = SymbolResolver(lambda: _read_bytes(kallsyms))
        self._symbols.load_async()

    @staticmethod
    def _online_cpus(host: Host) -> set[int]:
        text = host.read(host.sys("devices", "system", "cpu", "online")).value or ""
        out: set[int] = set()
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            a, _, b = part.partition("-")
            out.update(range(int(a), int(b or a) + 1))
        return out

    def _remove_stale(self, host: Host, inst_dir: Path) -> None:
        for entry in host.listdir(inst_dir):
            m = re.fullmatch(re.escape(PREFIX) + r"(\d+)(?:" + re.escape(WAKE_SUFFIX) + ")?",
                             entry)
            if not m:
                continue
            path = inst_dir / entry
            if str(path).removesuffix(WAKE_SUFFIX) in _HELD:
                continue  # ours, open
            pid = int(m.group(1))
            try:
                created = path.lstat().st_mtime
            except OSError:
                continue
            if pid != os.getpid() and not _proc_is_dead_or_reused(host, pid, created):
                continue
            try:
                os.rmdir(path)
                self.notes.append(f"removed stale tracefs instance {entry} (pid {pid} gone)")
            except OSError as exc:
                self.notes.append(f"stale tracefs instance {entry} left: "
                                  f"{exc.strerror or exc}")

    def _choose_reader(self, reader: str) -> str:
        if reader == "text":
            return "text"
        events_dir = self.tracefs / "events"
        try:
            self._layout = parse_header_page(_read(events_dir / "header_page"))
            check_header_event(_read(events_dir / "header_event"))
        except (OSError, FormatError) as exc:
            if reader == "raw":
                raise _Refused(f"unsupported: binary ring-buffer layout not readable: "
                               f"{exc}") from None
            self.notes.append(f"text reader: {exc}")
            return "text"
        if self._layout.page_size != self.page_size:
            self._layout = PageLayout(self._layout.ts_offset, self._layout.commit_offset,
                                      self._layout.commit_size, self._layout.data_offset,
                                      self.page_size)
        return "raw"

    def _size_rings(self, online: set[int], rate: float) -> None:
        kb, why = size_ring_kb(self.buffer_s, len(self.cpus), rate)
        pc = self.path / "per_cpu"
        for c in sorted(online):
            _write(pc / f"cpu{c}" / "buffer_size_kb", str(kb if c in self.cpus else OTHER_CPU_KB))
        got = _read(pc / f"cpu{self.cpus[0]}" / "buffer_size_kb").split()[0]
        self.buffer_kb = int(got) if got.isdigit() else kb
        self.sizing = why

    def _enable_events(self) -> None:
        ev_dir = self.path / "events"
        wanted = list(WANTED)
        vec_dir = ev_dir / VECTOR_SYSTEM
        for name in sorted(os.listdir(vec_dir)) if vec_dir.is_dir() else ():
            if name.endswith(("_entry", "_exit")) and not name.startswith("vector_"):
                wanted.append((VECTOR_SYSTEM, name))
        for system, name in wanted:
            enable = ev_dir / system / name / "enable"
            if not enable.exists():
                self.missing.append(f"{system}:{name}")
                continue
            _write(enable, "1")
            self.events.append(f"{system}:{name}")
        if not any(e.endswith(":sched_switch") for e in self.events):
            raise _Refused("unsupported: this kernel has no sched:sched_switch event")

    def _load_formats(self) -> None:
        ev_dir = self.path / "events"
        for full in self.events:
            system, name = full.split(":", 1)
            try:
                fmt = parse_format(_read(ev_dir / system / name / "format"), system)
            except (OSError, FormatError) as exc:
                raise _Refused(f"unsupported: cannot read the format of {full}: {exc}") from None
            self._formats[fmt.id] = fmt
            self._names.add(fmt.name)
            if fmt.name == "sched_switch":
                self._switch_ids = {fmt.id}

    def _open_wake(self, inst_dir: Path, online: set[int]) -> None:
        """The wake instance (see :data:`WAKE_EVENTS`): on every online CPU, its events
        filtered, its rings small. Not fatal: where it cannot be made, ``wake_reason`` says
        why and the timelines name no waker on another CPU ("unknown")."""
        name = self.name + WAKE_SUFFIX
        path = inst_dir / name
        try:
            os.mkdir(path)
        except FileExistsError:
            self.wake_reason = f"unsupported: tracefs instance {name} already exists (name taken)"
            return
        except OSError as exc:
            self.wake_reason = f"unsupported: cannot create tracefs instance {name}: " \
                               f"{exc.strerror or exc}"
            return
        self.wake_path, self._wake_made = path, True
        try:
            self._set_up_wake(path, online)
        except (OSError, ValueError, FormatError, _Refused) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.wake_reason = why if why.startswith("unsupported:") else \
                f"unsupported: wake instance set-up failed: {why}"
            self._close_wake()
            return
        self.wake_reason = None

    def _set_up_wake(self, p: Path, online: set[int]) -> None:
        _write(p / "tracing_on", "0")
        _write(p / "trace_clock", "mono")
        _write(p / "options" / "overwrite", "1")
        _write(p / "tracing_cpumask", cpumask_hex(sorted(online)))
        want = self.buffer_s * WAKE_ASSUMED_EPS * len(self.cpus) * WAKE_EVENT_BYTES / 1024
        kb = int(max(WAKE_MIN_KB, min(WAKE_MAX_KB, want / max(1, len(online)),
                                      WAKE_MAX_TOTAL_KB // max(1, len(online)))))
        for c in sorted(online):
            _write(p / "per_cpu" / f"cpu{c}" / "buffer_size_kb", str(kb))
        got = _read(p / "per_cpu" / f"cpu{min(online)}" / "buffer_size_kb").split()
        self.wake_kb = int(got[0]) if got and got[0].isdigit() else kb
        targets = " || ".join(f"target_cpu == {c}" for c in self.cpus)
        ev_dir = p / "events"
        for system, ev in WAKE_EVENTS:
            d = ev_dir / system / ev
            if ev == "sched_wakeup" and "sched:sched_waking" in self.wake_events:
                continue  # the fallback only
            if not (d / "enable").exists():
                self.wake_missing.append(f"{system}:{ev}")
                continue
            f = SIGNAL_FILTER if ev == "signal_generate" else targets
            try:
                _write(d / "filter", f)
            except OSError:
                raise _Refused(f"unsupported: the kernel refused the filter {f!r} of "
                               f"{system}:{ev}") from None
            self.wake_filters[f"{system}:{ev}"] = f
            _write(d / "enable", "1")
            self.wake_events.append(f"{system}:{ev}")
            if not any(fmt.name == ev for fmt in self._formats.values()):
                fmt = parse_format(_read(d / "format"), system)
                self._formats[fmt.id] = fmt
                self._names.add(fmt.name)
        if not self.wake_events:
            raise _Refused("unsupported: no sched_waking, sched_wakeup or signal_generate "
                           "event")
        if not (ev_dir / TIMER_EVENT[0] / TIMER_EVENT[1] / "enable").exists():
            self.timer_starts = "unsupported: no timer:hrtimer_start event"
            self.wake_missing.append(":".join(TIMER_EVENT))
        for c in sorted(online):
            ring = _CpuRing(c, keep_bytes=self.wake_kb * 1024)
            if self.reader == "raw":
                ring.fd = os.open(p / "per_cpu" / f"cpu{c}" / "trace_pipe_raw",
                                  os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._wake_rings[c] = ring

    def _close_wake(self) -> None:
        """Close the wake instance's files and remove it (idempotent)."""
        _close_rings(self._wake_rings.values())
        self._wake_rings = {}
        if self._wake_made and self._creator == os.getpid():
            self._remove_instance(self.wake_path, "wake instance")
            self._wake_made = False

    def _remove_instance(self, path: Path, what: str) -> None:
        """Stop and remove one of our instances; a refusal is a note, never an exception."""
        try:
            _write(path / "tracing_on", "0")
        except OSError:
            pass
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.notes.append(f"{what} not removed: {exc.strerror or exc}")

    # -- reading ---------------------------------------------------------------------------
    def window(self, t_from_ns: int, t_to_ns: int, *, margin_ns: int = 2_000_000,
               after_ns: int = 0) -> Window:
        """The events of the probe CPUs in ``[t_from_ns - margin_ns, t_to_ns]`` (CLOCK_MONOTONIC
        ns), see :class:`Window`; with ``after_ns``, also each CPU's first event in
        ``(t_to_ns, t_to_ns + after_ns]`` (who was current at ``t_to_ns``: the timeline
        needs that one event, not the rest, and under a flood the rest cost as much to
        decode as the window). Drains what the kernel holds first (raw reader), so call it
        once the window has ended."""
        t_start = time.perf_counter_ns()
        c_start = time.thread_time_ns()
        lo, hi = t_from_ns - margin_ns, t_to_ns
        if self._closed:
            return Window(t_from_ns, t_to_ns, [], False, "event source closed")
        if self.reader == "text":
            win = self._window_text(t_from_ns, lo, hi, after_ns)
        else:
            self.drain()
            win = self._window_raw(t_from_ns, lo, hi, after_ns)
        self._timer_starts()
        self._add_wake(win, lo, hi)
        self._fill_comms(win)
        now = time.monotonic_ns()
        if t_to_ns + after_ns > now and win.complete:
            win.complete, win.reason = False, "the window ends after the read"
        win.read_ns = time.perf_counter_ns() - t_start
        win.cpu_ns = time.thread_time_ns() - c_start
        return win

    def _timer_starts(self) -> None:
        """Enable TIMER_EVENT in the wake instance once kallsyms gives TIMER_CALLBACK's
        address (the filter compares the callback pointer), filtered to the probe CPUs."""
        if self.timer_starts != "pending" or self.wake_reason is not None or \
                self._symbols is None or not self._symbols.ready:
            return
        addr = self._symbols.address(TIMER_CALLBACK)
        if not addr:
            self.timer_starts = f"unsupported: no address for {TIMER_CALLBACK} in kallsyms"
            return
        d = self.wake_path / "events" / TIMER_EVENT[0] / TIMER_EVENT[1]
        cpus = " || ".join(f"common_cpu == {c}" for c in self.cpus)
        f = f"function == 0x{addr:x} && ({cpus})"
        try:
            fmt = parse_format(_read(d / "format"), TIMER_EVENT[0])
            _write(d / "filter", f)
            _write(d / "enable", "1")
        except (OSError, FormatError) as exc:
            self.timer_starts = f"unsupported: {':'.join(TIMER_EVENT)}: " \
                                f"{getattr(exc, 'strerror', None) or exc}"
            return
        self._formats[fmt.id] = fmt
        self._names.add(fmt.name)
        self.wake_filters[":".join(TIMER_EVENT)] = f
        self.wake_events.append(":".join(TIMER_EVENT))
        self.timer_starts = "on"

    def _add_wake(self, win: Window, lo: int, hi: int) -> None:
        """The wake instance's events in ``[lo - WAKE_LOOKBACK_NS, hi]`` merged into the
        window (sorted by time), and whether they are complete from ``lo`` on."""
        if self.wake_reason is not None:
            win.wake_complete = False
            win.wake_reason = f"no wake-ups from other CPUs: {self.wake_reason}"
            return
        if win.reason == "event source closed":
            return
        got, complete, reason, walked, decoded = (
            self._wake_text(lo - WAKE_LOOKBACK_NS, hi) if self.reader == "text" else
            self._wake_raw(lo - WAKE_LOOKBACK_NS, hi, lo))
        # the probe CPUs' own wake-ups from lo on are the main instance's (the same events)
        probe = set(self.cpus)
        got = [e for e in got if e.cpu not in probe or e.ts_ns < lo or
               e.name not in ("sched_waking", "sched_wakeup")]
        win.walked += walked
        win.decoded += decoded
        win.wake_complete, win.wake_reason = complete, reason
        if got:
            win.events = sorted(win.events + got, key=_event_ts)

    def _page_events(self, ring: _CpuRing, pg: Page, ids: frozenset[int], lo: int, hi: int,
                     before: bool, store: bool) -> tuple[list[Event], object, int, bool]:
        """One kept page's events in [lo, hi] through its PageIndex (walked once, then kept
        hot): (events, the switch before them when ``before``, records decoded, whether the
        page was walked now). Both instances' windows read pages through it."""
        idx, made = page_index(pg, ids, self._layout)
        if made:
            self._hot(ring, pg)
        got, b, k = idx.select(pg.data, ring.cpu, self._formats, lo, hi, self._symbols,
                               before=before, store=store)
        return got, b, k, made

    def _wake_raw(self, lo: int, hi: int, need_from: int
                  ) -> tuple[list[Event], bool, str | None, int, int]:
        out: list[Event] = []
        complete, reason = True, None
        walked = decoded = 0
        ids = frozenset(self._switch_ids)
        store = self._symbols is None or self._symbols.ready
        for ring in self._wake_rings.values():
            pages = ring.pages
            i = max(0, bisect_left(pages, lo, key=_page_ts) - 1)
            while i < len(pages):
                pg = pages[i]
                if pg.ts_ns > hi:
                    break
                got, _b, k, made = self._page_events(ring, pg, ids, lo, hi, False, store)
                walked += made
                decoded += k
                out.extend(got)
                i += 1
            if ring.cover_from_ns > need_from and complete:
                complete = False
                reason = (f"wake-ups of cpu {ring.cpu}: {ring.cover_reason}; continuous only "
                          f"from {(ring.cover_from_ns - need_from) / 1e3:.0f} µs after the "
                          "window's start")
        return out, complete, reason, walked, decoded

    def _wake_text(self, lo: int, hi: int) -> tuple[list[Event], bool, str | None, int, int]:
        out: list[Event] = []
        for c in self._wake_rings:
            path = self.wake_path / "per_cpu" / f"cpu{c}" / "trace"
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    out.extend(parse_text(fh, self._names, t_from=lo, t_to=hi))
            except OSError as exc:
                return [], False, f"cannot read {path}: {exc}", 0, 0
        return out, True, None, 0, 0

    def _fill_comms(self, win: Window, limit: int = 256) -> None:
        named = named_pids(win.events)
        for pid in sorted({e.pid for e in win.events} - named - {0})[:limit]:
            comm = self._comm_cache.get(pid)
            if comm is None:
                comm = self.host.read(self.host.proc(pid, "comm")).value if self.host else None
                if comm is None:
                    continue  # gone: the timeline shows "?[pid]"
                if len(self._comm_cache) > 4096:
                    self._comm_cache.clear()
                self._comm_cache[pid] = comm
            win.comms[pid] = comm

    def drain(self) -> int:
        """Move every page the kernel holds for the probe CPUs into the kept pages (raw
        reader); returns the number of pages read. Bounded: at most the ring's pages plus
        a margin per CPU per call, whatever the rate."""
        if self._closed or self.reader != "raw":
            return 0
        total = 0
        newest = 0
        for ring in (*self._rings.values(), *self._wake_rings.values()):
            n = 0
            cap = (ring.keep_bytes or self.buffer_kb * 1024) // self.page_size + 64
            while n < cap:
                try:
                    buf = os.read(ring.fd, self.page_size)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EINTR:
                        continue
                    break
                if not buf:
                    break
                n += 1
                try:
                    ts, _size, lost = page_info(buf, self._layout)
                except FormatError:
                    continue
                if lost:
                    ring.lost += max(lost, 0)
                    ring.cover_from_ns = ts
                    ring.cover_reason = ("events lost (ring overwritten)" if lost > 0 else
                                         "events lost (count unknown)")
                ring.pages.append(Page(ring.cpu, ts, buf, lost))
                ring.kept_bytes += len(buf)
                newest = max(newest, ts)
            total += n
        self._evict(newest or time.monotonic_ns())
        return total

    def _evict(self, newest_ns: int) -> None:
        for ring in (*self._rings.values(), *self._wake_rings.values()):
            pages = ring.pages
            limit = ring.keep_bytes or self.keep_bytes
            while pages and (ring.kept_bytes > limit or
                             (len(pages) > 1 and pages[1].ts_ns < newest_ns - self.keep_ns)):
                old = pages.popleft()
                ring.kept_bytes -= len(old.data)
                ring.evicted_pages += 1
                mark = pages[0].ts_ns if pages else page_last_ts(old.data, self._layout) + 1
                if mark > ring.cover_from_ns:
                    ring.cover_from_ns = mark
                    ring.cover_reason = "older events no longer kept"

    def _window_raw(self, t_from: int, lo: int, hi: int, after_ns: int = 0) -> Window:
        per_cpu: list[list[Event]] = []
        complete, reason, lost = True, None, 0
        ids = frozenset(self._switch_ids)
        # events decoded now are kept on their page's index for the next window, except
        # while symbol names may still be hex (kallsyms not loaded yet)
        store = self._symbols is None or self._symbols.ready
        walked = decoded = 0
        for ring in self._rings.values():
            pages = ring.pages
            n = len(pages)
            # the first page that can hold an event at or after lo: the one before the
            # first page starting at or after lo (kept pages are in time order)
            i = max(0, bisect_left(pages, lo, key=_page_ts) - 1)
            evs: list[Event] = []
            first = None
            before = None
            while i < n:
                pg = pages[i]
                if pg.ts_ns > hi:
                    break
                got, b, k, made = self._page_events(ring, pg, ids, lo, hi, first is None,
                                                    store)
                walked += made
                if first is None:
                    first = i
                    lost += max(pg.lost, 0)
                    before = b
                decoded += k
                evs.extend(got)
                i += 1
            if after_ns > 0:
                nxt = self._first_after(ring, max(i - 1, 0), hi, hi + after_ns, ids)
                if nxt is not None:
                    evs.append(nxt)
            # who ran before lo: in the first page's walk, else back from the page before
            if before is not None:
                prelude = before
            else:
                prelude, w = self._last_switch_before(ring.cpu, pages, first, lo,
                                                      skip_first=first is not None)
                walked += w
            if prelude is not None:
                evs.insert(0, prelude)
            per_cpu.append(evs)
            if ring.cover_from_ns > t_from and complete:
                complete = False
                reason = (f"cpu {ring.cpu}: {ring.cover_reason}; events continuous only "
                          f"from {(ring.cover_from_ns - t_from) / 1e3:.0f} µs after the "
                          "window's start")
                if ring.lost and "lost" not in ring.cover_reason:
                    reason += f" ({ring.lost} events lost to ring overwrites so far)"
        events = [e for evs in per_cpu for e in evs]
        events.sort(key=_event_ts)
        return Window(t_from, hi, events, complete, reason, lost, walked=walked,
                      decoded=decoded)

    def _first_after(self, ring: _CpuRing, i: int, t: int, t_max: int,
                     ids: frozenset[int]) -> Event | None:
        """The ring's first event with ``t < ts <= t_max``, from its kept page ``i`` on (the
        window's last page: the one that may hold records past ``t``)."""
        pages = ring.pages
        while i < len(pages):
            pg = pages[i]
            if pg.ts_ns > t_max:
                return None
            idx, made = page_index(pg, ids, self._layout)
            if made:
                self._hot(ring, pg)
            ev = idx.first_after(pg.data, ring.cpu, self._formats, t, t_max, self._symbols)
            if ev is not None:
                return ev
            i += 1
        return None

    def _hot(self, ring: _CpuRing, pg: Page) -> None:
        """``pg`` now has an index: the newest of the ring's indexed pages; the oldest
        beyond :data:`INDEXED_PAGES` drop theirs (memory stays bounded at any rate)."""
        hot = ring.indexed
        hot.append(pg)
        while len(hot) > INDEXED_PAGES:
            hot.popleft().index = None

    def _last_switch_before(self, cpu: int, pages, first: int | None, lo: int,
                            max_pages: int = 64, *, skip_first: bool = False
                            ) -> tuple[Event | None, int]:
        """(the last sched_switch on ``cpu`` before ``lo`` in the kept pages, the pages
        whose headers were walked for it): searching back at most ``max_pages`` pages from
        the window's first page ``first``, that page included (``skip_first``: its walk
        found none already), and no further back than that switch: the task current when
        the window opened. A page with no switch record at all is passed over without
        walking it (page_may_hold: a byte search); one whose records all precede ``lo``
        answers from one header walk remembered on it (page_last_of; its index where it has
        one), as the walk below would. So under a flood that leaves the CPU's task running
        (no switch for many pages) the search costs a byte search per page."""
        end = len(pages) if first is None else first + 1
        ids = frozenset(self._switch_ids)
        walked = 0
        for i in range(end - 1, max(-1, end - 1 - max_pages), -1):
            if skip_first and i == first:
                continue
            pg = pages[i]
            if ids not in pg.memo and (pg.index is None or pg.index.ids != ids):
                if not page_may_hold(pg.data, ids, self._layout):
                    continue  # no switch in it: neither the memo nor the walk finds one
                walked += 1
            rec, latest = page_last_of(pg, ids, self._layout)
            if latest < lo:
                if rec is None:
                    continue
                ev = decode_record(pg.data, cpu, self._formats, rec, self._symbols)
                if ev is not None and ev.name == "sched_switch":
                    return ev, walked
            best = None
            walked += 1
            for ev in iter_page(pg.data, cpu, self._formats, layout=self._layout,
                                t_to=lo - 1, symbols=self._symbols, only=self._switch_ids):
                if ev.name == "sched_switch":
                    best = ev
            if best is not None:
                return best, walked
        return None, walked

    def _window_text(self, t_from: int, lo: int, hi: int, after_ns: int = 0) -> Window:
        events: list[Event] = []
        complete, reason, lost = True, None, 0
        for c in self.cpus:
            st = TextStats()
            pdir = self.path / "per_cpu" / f"cpu{c}"
            try:
                with open(pdir / "trace", encoding="utf-8", errors="replace") as fh:
                    got = parse_text(fh, self._names, t_from=lo, t_to=hi + after_ns, stats=st)
                    got = sorted(got, key=_event_ts)
                    k = bisect_right(got, hi, key=_event_ts)
                    events.extend(got[:k + 1] if after_ns > 0 else got[:k])
            except OSError as exc:
                return Window(t_from, hi, [], False, f"cannot read {pdir}/trace: {exc}")
            lost += sum(st.lost.values())
            cs = self.cpu_stats(c)
            oldest = cs.oldest_ns if cs.oldest_ns is not None else self.started_ns
            start = oldest if cs.overrun else self.started_ns
            if start > t_from and complete:
                complete = False
                reason = (f"cpu {c}: ring overwritten; oldest event "
                          f"{(start - t_from) / 1e3:.0f} µs after the window's start")
        events.sort(key=lambda e: e.ts_ns)
        return Window(t_from, hi, events, complete, reason, lost)

    # -- state -------------------------------------------------------------------------------
    def cpu_stats(self, cpu: int) -> CpuStats:
        try:
            return parse_stats(_read(self.path / "per_cpu" / f"cpu{cpu}" / "stats"), cpu)
        except OSError:
            return CpuStats(cpu)

    def rate(self) -> dict[int, float]:
        """Events a second per probe CPU since :meth:`open` (written: entries + overrun +
        read, as the kernel counts them)."""
        dt = max(1e-3, time.monotonic() - self._t_open)
        out = {}
        for c in self.cpus:
            a, b = self._stats0.get(c, CpuStats(c)), self.cpu_stats(c)
            written = (b.entries + b.overrun + b.read) - (a.entries + a.overrun + a.read)
            out[c] = max(0, written) / dt
        return out

    def lost(self) -> int:
        """Events lost so far on the probe CPUs as the reads reported them."""
        return sum(r.lost for r in self._rings.values())

    def refit(self) -> str | None:
        """Re-size the rings for ``buffer_s`` at the rate measured since open (content is
        kept: the kernel resizes in place). Returns the new sizing line, None if unchanged
        (within a factor of 2) or closed."""
        if self._closed:
            return None
        rates = self.rate()
        if not rates:
            return None
        rate = max(rates.values())
        bpe = [s.bytes / s.entries for s in map(self.cpu_stats, self.cpus) if s.entries]
        ebytes = max(bpe) if bpe else ASSUMED_EVENT_BYTES
        kb, why = size_ring_kb(self.buffer_s, len(self.cpus), max(rate, 1.0), ebytes)
        if self.buffer_kb // 2 <= kb <= self.buffer_kb * 2:
            return None
        refused = self._resize(kb)
        if refused:
            return refused
        self.sizing = why + " (measured)"
        return self.sizing

    def grow(self) -> str | None:
        """Grow the probe CPUs' rings GROW_FACTOR-fold after events were lost (a storm beyond
        the rate the ring was sized for: :meth:`refit` measures the rate once, after warm-up),
        within MAX_CPU_KB and MAX_TOTAL_KB: memory stays bounded whatever the rate, and what
        was lost stays counted. Content is kept (the kernel resizes in place). Returns the new
        sizing line; None at the bound or closed."""
        if self._closed:
            return None
        kb = min(MAX_CPU_KB, MAX_TOTAL_KB // max(1, len(self.cpus)),
                 self.buffer_kb * GROW_FACTOR)
        if kb <= self.buffer_kb:
            return None
        refused = self._resize(kb)
        if refused:
            return refused
        self.sizing = (f"{self.buffer_kb} KiB per probe CPU (grown ×{GROW_FACTOR} after "
                       f"{self.lost():,} events were lost)")
        return self.sizing

    def _resize(self, kb: int) -> str | None:
        """Give the probe CPUs' rings ``kb`` KiB each (the kernel resizes in place, content
        kept) and take the size it made of it (it rounds up to whole pages) as
        ``buffer_kb``, with the kept pages' bound; the "resize refused" line if it refused."""
        pc = self.path / "per_cpu"
        try:
            for c in self.cpus:
                _write(pc / f"cpu{c}" / "buffer_size_kb", str(kb))
            got = _read(pc / f"cpu{self.cpus[0]}" / "buffer_size_kb").split()
        except OSError as exc:
            return f"resize refused: {exc.strerror or exc}"
        self.buffer_kb = int(got[0]) if got and got[0].isdigit() else kb
        self.keep_bytes = min(KEEP_MAX_BYTES, self.buffer_kb * 1024)
        return None

    def describe(self) -> dict:
        """What the source is, for the run header / --json."""
        return {"instance": self.host.display(self.path) if self.host else str(self.path),
                "cpus": self.cpus, "reader": self.reader, "buffer_kb_per_cpu": self.buffer_kb,
                "sizing": self.sizing, "events": self.events, "missing": self.missing,
                "notes": self.notes, "wake": self.describe_wake()}

    def describe_wake(self) -> dict:
        """The wake instance: its events and their filters, what this kernel lacks, its
        ring size; or why it does not run."""
        if self.wake_reason is not None:
            return {"reason": self.wake_reason, "missing": self.wake_missing}
        shown = self.host.display(self.wake_path) if self.host else str(self.wake_path)
        return {"instance": shown, "cpus": sorted(self._wake_rings),
                "events": self.wake_events, "filters": self.wake_filters,
                "timer_starts": self.timer_starts,
                "missing": self.wake_missing, "buffer_kb_per_cpu": self.wake_kb,
                "lost": sum(r.lost for r in self._wake_rings.values())}

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and remove the instance (idempotent; never raises). A forked child never
        removes its parent's instance."""
        if self._closed or os.getpid() != self._creator:
            return
        self._teardown()

    def _teardown(self) -> None:
        self._close_wake()
        _close_rings(self._rings.values())
        if self._creator == os.getpid() and self.path != Path() and self.name:
            self._remove_instance(self.path, "instance")
        ref = _HELD.get(str(self.path))
        if ref is not None and ref() is self:
            _HELD.pop(str(self.path), None)
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> EventSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never from a finalizer
            pass

    # -- uprobe events (watch --attach; agent/trace/uprobe.py defines them) ------------------
    def add_uprobes(self, uprobes, tids: list[int]) -> None:
        """Enable ``uprobes`` (an :class:`agent.trace.uprobe.Uprobes`, defined) in this
        instance, filtered to ``tids``, and learn their formats; :meth:`uprobe_events` then
        returns their hits. Raises OSError or FormatError when the kernel refuses."""
        uprobes.enable(self.path, tids)
        ev_dir = self.path / "events" / uprobes.group
        for name in uprobes.names:
            fmt = parse_format(_read(ev_dir / name / "format"), uprobes.group)
            self._formats[fmt.id] = fmt
            self._uprobe_ids[fmt.id] = name in uprobes.returns
            self._uprobe_names[fmt.name] = name in uprobes.returns
            self._names.add(fmt.name)
        self.events += [f"{uprobes.group}:{n}" for n in uprobes.names]

    def uprobe_events(self) -> list[Event]:
        """The uprobe hits recorded since the last call, in time order (drains the kernel
        rings first; the pages stay kept for the spike windows as before). Each page is
        scanned once for the uprobe ids only."""
        if self._closed or not self._uprobe_ids or self.reader != "raw":
            return []
        self.drain()
        only = set(self._uprobe_ids)
        out: list[Event] = []
        for ring in self._rings.values():
            done = self._uprobe_done.get(ring.cpu, 0)
            first = max(0, done - ring.evicted_pages)
            pages = ring.pages
            for i in range(first, len(pages)):
                out.extend(iter_page(pages[i].data, ring.cpu, self._formats,
                                     layout=self._layout, only=only))
            self._uprobe_done[ring.cpu] = ring.evicted_pages + len(pages)
        out.sort(key=attrgetter("ts_ns"))
        return out

    def is_return(self, ev: Event) -> bool:
        """Whether ``ev`` is a return probe's hit (else an entry)."""
        return bool(self._uprobe_names.get(ev.name))

    def drop_uprobes(self, uprobes) -> list[str]:
        """Disable and remove ``uprobes`` (:meth:`Uprobes.remove`) and forget their formats;
        returns what could not be removed."""
        left = uprobes.remove()
        for i in [i for i, f in self._formats.items() if f.system == uprobes.group]:
            del self._formats[i]
            self._uprobe_ids.pop(i, None)
        for n in uprobes.names:
            self._uprobe_names.pop(n, None)
        self.events = [e for e in self.events if not e.startswith(uprobes.group + ":")]
        return left
