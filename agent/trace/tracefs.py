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
  ``--attach``), enabled in :mod:`.calls`' :class:`~agent.trace.calls.CallsInstance`, the
  third instance, where they are the only events (read every step without walking the
  kernel events);
- :mod:`.sizing` — :class:`~agent.trace.sizing.RingSizing`: the rings' size (at open,
  :meth:`~agent.trace.sizing.RingSizing.refit`, :meth:`~agent.trace.sizing.RingSizing.grow`),
  the rate and the losses;
- :mod:`.recording` — :class:`~agent.trace.recording.Recording`: the events enabled, their
  formats, and the reader (raw pages or the text fallback);

and this module: opening (what is set, in which order), a window's read, and closing.

Set-up (kernel Documentation/trace/ftrace.rst, "Instances"): ``mkdir
instances/hftagent-<pid>``; in it ``tracing_on`` 0 while it is set up; ``trace_clock``
``mono`` (CLOCK_MONOTONIC: the probe's ``time.monotonic_ns`` and ``perf_counter_ns`` read the
same clock on Linux, so a sample's intended start and end select events directly);
``options/overwrite`` 1 (the kernel ring is the flight recorder: the oldest events make
room, the writer never stops); ``tracing_cpumask`` = the probe CPUs;
``per_cpu/cpuN/buffer_size_kb`` sized for ``buffer_s`` seconds on the probe CPUs and the
minimum on the others (the mask does not stop the kernel allocating every CPU's buffer);
the events of :data:`.recording.WANTED` that the instance's ``events/`` directory has, each through its
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

from .calls import CallsInstance
from .guardian import guard
from .instance import (
    _HELD,
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
    remove_instance,
    remove_stale,
)
from .recording import Recording
from .sizing import ASSUMED_RATE_EPS, KEEP_MAX_BYTES, RingSizing
from .symbols import SymbolResolver
from .uprobe import UprobeEvents
from .uprobe import remove_stale as remove_stale_uprobes
from .wake import WakeInstance
from .window import Window, WindowReader, _close_rings, _CpuRing


def _tracefs_root(host: Host, mount: bool, notes: list[str]) -> Path:
    """The tracefs mount; with ``mount``, tracefs mounted at /sys/kernel/tracing first when
    it is not (a live root only; a note says so)."""
    root = find_tracefs(host)
    if root is not None:
        return root
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
    notes.append(f"mounted tracefs at {shown}")
    return root


class EventSource(WindowReader, WakeInstance, UprobeEvents, CallsInstance, RingSizing,
                  Recording):
    """A private tracefs instance on the probe CPUs (module docstring). Build it with
    :meth:`open`; read with :meth:`window`; :meth:`close` (or ``with``) removes it."""

    def __init__(self) -> None:  # use open()
        super().__init__()
        self.host: Host | None = None
        self.tracefs: Path = Path()
        self.name = ""
        self.path: Path = Path()
        self.cpus: list[int] = []
        self.notes: list[str] = []  # stale instances removed, mount done...
        self.started_ns = 0
        self._creator = 0
        self._closed = True

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
        self.tracefs = _tracefs_root(host, mount, self.notes)
        inst_dir = self.tracefs / "instances"
        # what killed runs left: their uprobe groups first (their instance is a witness)
        self.notes += remove_stale_uprobes(host, self.tracefs)
        remove_stale(host, inst_dir, self.notes)
        self._create(host, inst_dir)
        online = online_cpus(host)
        bad = [c for c in cpus if c not in online]
        if bad:
            raise _Refused(f"unsupported: probe CPU(s) {bad} not online")
        self.cpus = cpus
        self._configure(reader)
        self.buffer_s = buffer_s
        self._size_rings(online, rate_hint or ASSUMED_RATE_EPS)
        self.keep_ns = int((buffer_s if keep_s is None else keep_s) * 1e9)
        self.keep_bytes = min(KEEP_MAX_BYTES, self.buffer_kb * 1024)
        self._enable_events()
        for c in cpus:
            self._rings[c] = _CpuRing(c)
        self._load_formats()
        self._start(host, inst_dir, online)

    def _create(self, host: Host, inst_dir: Path) -> None:
        """``mkdir instances/hftagent-<pid>`` (after our guardian is started: a SIGKILL
        removes it too), held from then on: removed at exit and on SIGTERM."""
        self.name = _instance_name()
        self.path = inst_dir / self.name
        shown = host.display(self.path)
        if str(self.path) in _HELD:
            raise _Refused(f"unsupported: tracefs instance {shown} is already in use by "
                           "this process")
        no_guardian = guard(self.tracefs)   # before the instance: a SIGKILL removes it too
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

    def _configure(self, reader: str) -> None:
        """Stopped while it is set up: the mono clock, overwrite, the probe CPUs' mask, the
        page size and the reader."""
        p = self.path
        _write(p / "tracing_on", "0")
        clocks = _read(p / "trace_clock")
        if "mono" not in clocks.replace("[", " ").replace("]", " ").split():
            raise _Refused(f"unsupported: trace clock 'mono' not offered ({clocks.strip()})")
        _write(p / "trace_clock", "mono")
        _write(p / "options" / "overwrite", "1")
        _write(p / "tracing_cpumask", cpumask_hex(self.cpus))
        # page (sub-buffer) size: buffer_subbuf_size_kb where the kernel has it (6.8+)
        try:
            self.page_size = int(_read(p / "buffer_subbuf_size_kb").split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            self.page_size = 4096
        self.reader = self._choose_reader(reader)

    def _start(self, host: Host, inst_dir: Path, online: set[int]) -> None:
        """The pipes opened (raw reader), the wake instance made, tracing on; the rings
        cover from now; the rate counted from now; kallsyms loaded in a thread."""
        if self.reader == "raw":
            for c in self.cpus:
                self._rings[c].fd = os.open(self.path / "per_cpu" / f"cpu{c}" / "trace_pipe_raw",
                                            os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._open_wake(inst_dir, online)
        _write(self.path / "tracing_on", "1")
        if self._wake_rings:
            _write(self.wake_path / "tracing_on", "1")
        self.started_ns = time.monotonic_ns()
        for ring in (*self._rings.values(), *self._wake_rings.values()):
            ring.cover_from_ns = self.started_ns
        self._start_counting()
        kallsyms = host.proc("kallsyms")
        self._symbols = SymbolResolver(lambda: _read_bytes(kallsyms))
        self._symbols.load_async()

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
    def describe(self) -> dict:
        """What the source is, for the run header / --json."""
        return {"instance": self.host.display(self.path) if self.host else str(self.path),
                "cpus": self.cpus, "reader": self.reader, "buffer_kb_per_cpu": self.buffer_kb,
                "sizing": self.sizing, "events": self.events, "missing": self.missing,
                "notes": self.notes, "wake": self.describe_wake(),
                **({"calls": c} if (c := self.describe_calls()) else {})}

    def startup_done(self, timeout_s: float) -> bool:
        """Wait for start-up work still running in the background (the kernel symbol
        table's load) at most ``timeout_s``; True when none is left."""
        return self._symbols is None or self._symbols.wait(timeout_s)

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and remove the instance (idempotent; never raises). A forked child never
        removes its parent's instance."""
        if self._closed or os.getpid() != self._creator:
            return
        self._teardown()

    def _teardown(self) -> None:
        self._close_calls()
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
