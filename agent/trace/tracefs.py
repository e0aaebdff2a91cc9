"""The event source: a private tracefs instance on the probe CPUs, read only around spikes.

:class:`EventSource` is put together from one class per concern:

- :mod:`.instance` — the instance's life (create, settings, remove; atexit and SIGTERM);
- :mod:`.guardian` — a small process started before the instance that removes it (and our
  uprobe group) within a second when this process dies, SIGKILL included; what a killed
  run left anyway (a guardian killed with it) is removed at the next open, the uprobe
  groups of dead hftagents too (:func:`agent.trace.uprobe.remove_stale`);
- :mod:`.window` — :class:`~agent.trace.window.WindowReader`: the per-CPU pages drained
  from ``trace_pipe_raw``, kept, and read back as a :class:`Window` around a spike;
- :mod:`.wake` — :class:`~agent.trace.wake.WakeInstance`: the second instance that sees
  wake-ups and signals from the other CPUs;
- :mod:`.uprobe` — :class:`~agent.trace.uprobe.UprobeEvents`: our uprobe events (watch
  ``--attach``) in the same instance;

and this module: opening (what is set, in which order), the ring sizing (:func:`size_ring_kb`,
:meth:`EventSource.refit`, :meth:`EventSource.grow`), the rate and losses, and closing.

Set-up (kernel Documentation/trace/ftrace.rst, "Instances"): ``mkdir
instances/hftagent-<pid>``; in it ``tracing_on`` 0 while it is set up; ``trace_clock``
``mono`` (CLOCK_MONOTONIC: the probe's ``time.monotonic_ns`` and ``perf_counter_ns`` read the
same clock on Linux, so a sample's intended start and end select events directly);
``options/overwrite`` 1 (the kernel ring is the flight recorder: the oldest events make
room, the writer never stops); ``tracing_cpumask`` = the probe CPUs;
``per_cpu/cpuN/buffer_size_kb`` sized for ``buffer_s`` seconds on the probe CPUs and the
minimum on the others (the mask does not stop the kernel allocating every CPU's buffer);
the events of :data:`WANTED` that the instance's ``events/`` directory has, each through its
own ``enable`` file; then ``tracing_on`` 1. Removed by :meth:`EventSource.close`, at exit
and on SIGTERM (:mod:`.instance`); commands that handle SIGTERM themselves (watch, cpus)
unwind to ``close``.

Every failure — tracefs not mounted (mounted only with ``mount=True``), no permission, the
instance name taken, an unknown layout, a write the kernel refuses — is one
:class:`Unsupported` with one line of reason; no exception escapes :meth:`EventSource.open`.
"""

from __future__ import annotations

import os
import time
import weakref
from pathlib import Path

from collectors.host import Host

from .event import FormatError, parse_format
from .guardian import guard
from .instance import (
    _HELD,
    CpuStats,
    Unsupported,
    _at_exit_and_term,
    _instance_name,
    _mount_tracefs,
    _read,
    _read_bytes,
    _Refused,
    _write,
    cpumask_hex,
    find_tracefs,
    online_cpus,
    parse_stats,
    remove_instance,
    remove_stale,
)
from .pages import PageLayout, check_header_event, parse_header_page
from .symbols import SymbolResolver
from .uprobe import UprobeEvents
from .uprobe import remove_stale as remove_stale_uprobes
from .wake import WakeInstance
from .window import Window, WindowReader, _close_rings, _CpuRing

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


class EventSource(WindowReader, WakeInstance, UprobeEvents):
    """A private tracefs instance on the probe CPUs (module docstring). Build it with
    :meth:`open`; read with :meth:`window`; :meth:`close` (or ``with``) removes it."""

    def __init__(self) -> None:  # use open()
        super().__init__()
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
        self._creator = 0
        self._closed = True
        self._t_open = 0.0
        self._stats0: dict[int, CpuStats] = {}

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
        # what killed runs left: their uprobe groups first (their instance is a witness)
        self.notes += remove_stale_uprobes(host, root)
        remove_stale(host, inst_dir, self.notes)
        self.name = _instance_name()
        self.path = inst_dir / self.name
        shown = host.display(self.path)
        if str(self.path) in _HELD:
            raise _Refused(f"unsupported: tracefs instance {shown} is already in use by "
                           "this process")
        no_guardian = guard(root)   # before the instance: a SIGKILL removes it too
        if no_guardian:
            self.notes.append(no_guardian)
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
        online = online_cpus(host)
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
            remove_instance(self.path, "instance", self.notes)
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
