"""The wake instance (``hftagent-<pid>-wake``, every online CPU): who woke, stopped or
ended a probe thread from another CPU, and the timers its sleeps asked for.

What ends a probe thread's not-runnable stretch happens on the *waker's* CPU, which the
main instance's ``tracing_cpumask`` (the probe CPUs) does not trace. This second instance
traces every online CPU with small rings and filtered events (:data:`WAKE_EVENTS`,
:data:`TIMER_EVENT`); its pages are read by the same :class:`agent.trace.window.WindowReader`
and merged into each window (:class:`WakeInstance`, mixed into
:class:`agent.trace.tracefs.EventSource`). Not fatal: where it cannot be made,
``wake_reason`` says why and the timelines name no waker on another CPU ("unknown").
"""

from __future__ import annotations

import os
from bisect import bisect_left
from pathlib import Path

from .event import Event, FormatError, parse_format
from .instance import WAKE_SUFFIX, _read, _Refused, _write, cpumask_hex, remove_instance
from .text import parse_text
from .window import Window, _close_rings, _CpuRing, event_ts, page_ts

# What ends a probe thread's not-runnable stretch happens on the *waker's* CPU —
# sched_waking fires in the waker's context, on its CPU (kernel/sched/core.c
# try_to_wake_up), signal_generate in the sender's — which the main instance's
# tracing_cpumask (the probe CPUs) does not trace. The wake instance's events carry a filter (the kernel evaluates it before the record is committed:
# Documentation/trace/events.rst, "Event filtering"), so the ring holds only:
# - wake-ups of a task whose CPU (``target_cpu``: task_cpu() when it fires) is a probe CPU,
#   from any CPU (those fired on the probe CPUs repeat the main instance's, whose window is
#   read from ``lo``: the reader keeps this ring's copies only from before it, the lookback
#   below); sched_wakeup only where sched_waking is missing (before 4.3);
# - stop and continue signals, and SIGKILL: who stopped a thread (T) and who ended it;
# - every task's exit, unfiltered (one record per thread that exits: its comm and tid), so
#   a waker or a sender that exits before its window is read keeps its name (issue #35
#   item 4: a `kill -STOP` is gone within a millisecond).
WAKE_EVENTS: tuple[tuple[str, str], ...] = (
    ("sched", "sched_waking"), ("sched", "sched_wakeup"), ("signal", "signal_generate"),
    ("sched", "sched_process_exit"))
EXIT_EVENT = "sched_process_exit"
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


class WakeInstance:
    """The wake instance of :class:`agent.trace.tracefs.EventSource` (module docstring): made
    by :meth:`_open_wake` after the main instance, read by :meth:`_add_wake` into each
    window, removed by :meth:`_close_wake`. Uses, from the source it is mixed into: ``name``,
    ``cpus``, ``buffer_s``, ``reader``, ``host``, ``notes``, ``_creator``, and the reader's
    ``_formats``, ``_names``, ``_symbols``, ``_switch_ids``, :meth:`_page_events`."""

    def __init__(self) -> None:
        super().__init__()
        # every online CPU; None reason while it runs
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
            f = SIGNAL_FILTER if ev == "signal_generate" else "" if ev == EXIT_EVENT else \
                targets
            try:
                if f:
                    _write(d / "filter", f)
            except OSError:
                raise _Refused(f"unsupported: the kernel refused the filter {f!r} of "
                               f"{system}:{ev}") from None
            if f:
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
            remove_instance(self.wake_path, "wake instance", self.notes)
            self._wake_made = False

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
            win.events = sorted(win.events + got, key=event_ts)

    def _wake_raw(self, lo: int, hi: int, need_from: int
                  ) -> tuple[list[Event], bool, str | None, int, int]:
        out: list[Event] = []
        complete, reason = True, None
        walked = decoded = 0
        ids = frozenset(self._switch_ids)
        store = self._symbols is None or self._symbols.ready
        for ring in self._wake_rings.values():
            pages = ring.pages
            i = max(0, bisect_left(pages, lo, key=page_ts) - 1)
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

    def _exit_comms(self, pids: set[int], since_ns: int) -> dict[int, str]:
        """The comm of each of ``pids`` whose ``sched_process_exit`` the wake rings hold from
        ``since_ns`` on (a task that exited after its window: /proc no longer has it). Read
        only for tasks /proc lacks; raw reader only (the text reader's window has the exits
        up to its end)."""
        if self.wake_reason is not None or self.reader != "raw" or not pids:
            return {}
        out: dict[int, str] = {}
        ids = frozenset(self._switch_ids)
        store = self._symbols is None or self._symbols.ready
        for ring in self._wake_rings.values():
            pages = ring.pages
            for i in range(max(0, bisect_left(pages, since_ns, key=page_ts) - 1), len(pages)):
                got, _b, _k, _m = self._page_events(ring, pages[i], ids, since_ns, 1 << 62,
                                                    False, store)
                for e in got:
                    pid = e.fields.get("pid")
                    if e.name == EXIT_EVENT and pid in pids:
                        out.setdefault(pid, e.fields.get("comm", "?"))
        return out

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
