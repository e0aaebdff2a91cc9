"""An unmodified process (``watch --attach PID``): its inference calls,
timed by uprobes on its runtime's once-per-call function (agent/trace/attach.py chooses it,
agent/trace/uprobe.py defines the events) and read from watch's own tracefs instance of them
alone (agent/trace/calls.py), not from the rings of the sched/irq events the spikes are
explained with.

Pairing, per thread: the outermost entry to its return is one call (an entry of another
probed function inside it, e.g. LiteRT's Invoke around LiteRtRunCompiledModel, is nested), so
threads calling at the same time stay apart. Each probed function is taken as not re-entered
on one thread (true of every function of the catalogue): an entry of a function whose last
entry on that thread has not returned means that return was never recorded (the kernel could
not place the return probe, or dropped its event), so the open call is dropped and counted in
``lost_returns`` and the new one starts — a lost return never stalls the pairing. A return
without its entry (the call began before the attach) is skipped and counted. A call still open
when its thread or the process ends is closed, counted in ``open_at_exit`` and not made a
sample (its end is unknown). Hits the kernel lost (a calls ring overwritten) make the pairing
start again from a clean state (``resynced``) rather than pair across the gap.

Each call becomes one row of :data:`agent.client.FIELDS`: ``start_ns``/``end_ns`` from the
entry and return events (CLOCK_MONOTONIC: the instance's ``mono`` clock), ``pid`` the
process, ``tid`` the calling thread, ``cpu_start``/``cpu_end`` the CPUs of the two events;
the in-process evidence a client records (context switches, faults, CPU time, run-queue
delay) is -1 (unknown): the kernel events give it per spike instead.

The runtime, when the process maps several (``auto``): every candidate is armed at once and
the trial (agent/trace/trial.py) keeps the one whose calls arrive, the outermost per call;
the others' events are disabled (their definitions go with the rest at the end: removing one
mid-run empties every ring buffer) and their hits still in the rings skipped. The calls made
during the trial are samples already: the pairing takes the outermost entry, whichever
candidate's. The choice is said on stderr with each candidate's count. Nothing timed
:data:`QUIET_S` after the attach: one line on stderr (what is armed, what else is mapped,
what to try); a run that timed no call exits :data:`EXIT_NOTHING_TIMED`.

Entry-only timing (``--attach-symbol`` without ``--unsafe-return``): a sample is the time from
one entry to the next on the same thread, i.e. the call period, not the call's latency; the
run header says so.

Its CPUs: the CPUs the process's threads may run on (:func:`~agent.watch.latency.base.process_cpus`,
the one rule for a process's CPUs): the event instance traces those; a --cpus that differs is
said and not used. The PID is checked once, when the options are built (:meth:`Attached.build`).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.client import FIELDS
from agent.errors import AgentError
from agent.watch.latency.base import (
    Given,
    Phase,
    ProcessLife,
    Running,
    Source,
    process_cpus,
)
from collectors.host import Host
from collectors.parsers import format_cpulist

F = {name: i for i, name in enumerate(FIELDS)}
_BLANK = [-1] * len(FIELDS)  # a row's unknowns (the in-process evidence)
_EMPTY = np.empty((0, len(FIELDS)), dtype=np.int64)
_SEQ, _SEQ2, _START, _END, _PID, _TID, _CPU0, _CPU1 = (
    F[k] for k in ("seq", "seq2", "start_ns", "end_ns", "pid", "tid", "cpu_start", "cpu_end"))
TID_REFRESH_S = 1.0


class AttachedReader:
    """``read()`` → rows of :data:`FIELDS` for the calls completed since the last read."""

    gpu: Any = None   # --gpu-probes: agent.trace.gpu_probes.GpuHits (takes its hits)
    pmu: Any = None   # --pmu: agent.watch.attribution.pmu.PerCall (each call's counters)
    native: Any = None  # native_pair.NativePairing: the C pairing, once in use
    _native_tried = False

    def __init__(self, host: Host, pid: int, events, uprobes, entry_only: bool) -> None:
        self.host = host
        self.pid = pid
        self.events = events          # agent.trace.tracefs.EventSource (uprobes added)
        self.uprobes = uprobes        # agent.trace.uprobe.Uprobes
        self.entry_only = entry_only
        self.path = f"uprobes {uprobes.group} on pid {pid}"
        self.creator_pid = pid
        self.calls = 0
        self.unpaired_returns = 0
        self.open_at_exit = 0
        self.resynced = 0
        self.lost = 0                 # for the session's counters (a ring reader's name)
        self.invalid = 0
        self._seq = 0
        self.lost_returns = 0
        # tid -> {event name of the entry: (ts, cpu)} of its calls open now
        self._open: dict[int, dict[str, tuple[int, int]]] = {}
        # tid -> (ts, cpu) of its outermost open entry (entry-only: of its last entry)
        self._start: dict[int, tuple[int, int]] = {}
        self._lost_seen = events.calls_lost()
        self._tids = self.threads()
        self._tids_at = time.monotonic()
        # the choice among candidate runtimes (agent/trace/trial.py), while it is open;
        # on_choice(trial) is told once it is made, and returns the event names it dropped
        self.trial: Any = None
        self.on_choice: Callable[[Any], set[str]] | None = None
        self._dropped: set[str] = set()
        self._looked = False

    # -- the C pairing (native_pair.py): the always-on case ------------------------------------
    def _native_pairing(self, names: dict[int, str] | None) -> Any:
        """The C pairing, when it applies to this read (no GPU probe, no trial, entry to
        return, every hit a tuple, a library built): made once, the Python state handed
        over; else None."""
        if names is None or self.gpu is not None or self.trial is not None or \
                self.entry_only:
            return None
        if self.native is None:
            if self._native_tried or os.environ.get("HFTAGENT_PY_PAIRING"):
                return None
            self._native_tried = True
            from agent.watch.latency import native_pair
            lib = native_pair.library()
            if lib is None:
                return None
            nat = native_pair.NativePairing(lib, self.pid, (_SEQ, _SEQ2, _START, _END, _PID,
                                                            _TID, _CPU0, _CPU1), len(FIELDS))
            if not self._hand_over(nat, names):
                return None
            self.native = nat
        if not self.native.set_codes(names, self.events.is_return_name, self._dropped):
            return None  # (a name it cannot pair; the Python state is empty: none handed)
        return self.native

    def _hand_over(self, nat: Any, names: dict[int, str]) -> bool:
        """The Python pairing's open calls into ``nat`` (after a trial); False, nothing
        changed, when a name cannot be coded."""
        from agent.watch.latency.native_pair import code_of
        if not nat.set_codes(names, self.events.is_return_name, self._dropped):
            return False
        opened = {}
        for tid, o in self._open.items():
            mask = 0
            for name in o:
                c = code_of(name, False)
                if c is None:
                    return False
                mask |= 1 << c
            opened[tid] = mask
        for tid, mask in opened.items():
            if mask and tid in self._start:
                t0, c0 = self._start[tid]
                nat.set_open(tid, mask, t0, c0)
        self._open.clear()
        self._start.clear()
        return True

    def _read_native(self, nat: Any) -> np.ndarray:
        """One read through the C pairing (one C call; the threads not known looked at
        first where there are some)."""
        pages = self.events.uprobe_pages()
        if not pages:
            return _EMPTY
        nat.set_threads(self._tids)

        def known(unknown: list[int]) -> None:
            for t in unknown:  # (the threads are listed again once per read, at the first)
                self._new_thread(t)
            nat.set_threads(self._tids)

        rows = nat.read(pages, self.events.page_layout, self._seq, known)
        if len(rows):
            self._seq += len(rows)
            self.calls += len(rows)
            self._rows_made(rows)
        return rows

    def _rows_made(self, rows: np.ndarray) -> None:
        """Rows the C pairing made (a subclass sets what :meth:`_row` would)."""

    def threads(self) -> set[int]:
        return {int(t) for t in self.host.listdir(self.host.proc(self.pid, "task"))
                if t.isdigit()}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._tids_at < TID_REFRESH_S:
            return
        self._tids_at = now
        tids = self.threads()
        if not tids:
            return
        if tids != self._tids:
            self._close_threads(set(self._open) - tids)  # a thread ended inside a call
            if self.native is not None:
                self.open_at_exit += self.native.keep(tids)
            self._tids = tids
            for inst in self.uprobes.instances:
                try:
                    self.uprobes.set_filter(inst, sorted(tids))
                except OSError:
                    pass
            if self.gpu is not None:
                self.gpu.set_threads(sorted(tids))
            if self.pmu is not None:
                self.pmu.set_threads(sorted(tids))

    def _close_threads(self, tids) -> None:
        """Threads that ended (or left): their open calls closed and counted."""
        for gone in tids:
            if self._open.pop(gone, None):
                self.open_at_exit += 1
            self._start.pop(gone, None)

    def read(self, max_records: int | None = None) -> np.ndarray:
        self._refresh()
        lost = self.events.calls_lost()
        if lost != self._lost_seen:  # events lost: pair again from a clean state
            self._lost_seen = lost
            had = any(self._open.values())
            if self.native is not None and self.native.clear():
                had = True
            if had:
                self.resynced += 1
            self._open.clear()
            self._start.clear()
        self._looked = False  # (_new_thread: the threads looked at again once per read)
        nat = None
        if self.native is not None or not self._native_tried:
            names = getattr(self.events, "hit_names", None)  # (a source of raw pages)
            nat = self._native_pairing(names() if names is not None else None)
        if nat is not None:
            rows_ = self._read_native(nat)
            if self.pmu is not None and len(rows_):
                self.pmu.feed(rows_.tolist())
            return rows_
        rows: list[list[int]] = []
        hits = self.events.uprobe_events()
        if self.gpu is None and self.trial is None and not self.entry_only and \
                self.events.hits_are_tuples:
            self._pair(hits, rows)
        else:
            self._pair_each(hits, rows)
        if self.trial is not None and self.trial.decided(time.monotonic_ns()):
            self._decide()
        if self.pmu is not None:
            self.pmu.feed(rows)
        if not rows:
            return np.empty((0, len(FIELDS)), dtype=np.int64)
        return np.array(rows, dtype=np.int64)

    def _pair_each(self, hits: list, rows: list[list[int]]) -> None:
        """Pair ``hits`` (in time order) into ``rows``, whatever they are: a GPU probe's hit
        taken aside, a trial fed, entry-only timing; the rest as :meth:`_pair` does."""
        tids, kept = self._tids, []
        for ev in hits:
            tid = ev.pid
            if tid not in tids:
                if not self._new_thread(tid):
                    continue
                tids = self._tids
            if self.gpu is not None and self.gpu.take(ev):
                continue  # a GPU probe's hit: kept for the spikes' GPU split
            if ev.name in self._dropped:
                continue
            if self.trial is not None:
                self.trial.feed(tid, ev.name, ev.ts_ns)
            if self.entry_only:
                prev = self._start.get(tid)
                self._start[tid] = (ev.ts_ns, ev.cpu)
                if prev is not None:
                    rows.append(self._row(prev[0], ev.ts_ns, tid, prev[1], ev.cpu))
                continue
            kept.append((ev.ts_ns, ev.cpu, tid, ev.name))
        self._pair(kept, rows)

    def _pair(self, hits: list, rows: list[list[int]]) -> None:
        """Pair ``hits``, ``(ts_ns, cpu, tid, name)`` tuples in time order, entry to return
        (module docstring) into ``rows``: the always-on case (no GPU probe, no trial) takes
        the source's hits here directly, each unpacked once and looked at in as few steps
        as the pairing needs (watch's own CPU, issue #38)."""
        tids, dropped, row = self._tids, self._dropped, self._row
        open_, start = self._open, self._start
        entry_of: dict[str, str | None] = {}  # event name -> its entry's (a return), else None
        for ts, cpu, tid, name in hits:
            if tid not in tids:
                if not self._new_thread(tid):
                    continue  # another process mapping the same library (no filter applies)
                tids = self._tids
            if name in dropped:
                continue  # a trial's loser, hit before its removal
            try:
                key = entry_of[name]
            except KeyError:
                key = entry_of[name] = self._entry_of(name) \
                    if self.events.is_return_name(name) else None
            opened = open_.get(tid)
            if opened is None:
                opened = open_[tid] = {}
            if key is not None:
                if opened.pop(key, None) is None:
                    self.unpaired_returns += 1
                    continue
                if not opened:  # the outermost call returned
                    t0, c0 = start.pop(tid)
                    rows.append(row(t0, ts, tid, c0, cpu))
            else:
                if name in opened:  # its last entry never returned: a lost return
                    self.lost_returns += 1
                    opened.clear()
                if not opened:
                    start[tid] = (ts, cpu)
                opened[name] = (ts, cpu)

    def _new_thread(self, tid: int) -> bool:
        """Whether ``tid``, not among the threads known, is one of the process's: they are
        looked at again once per read (a thread started since the last look)."""
        if not self._looked:
            self._looked = True
            self._tids_at = 0.0
            self._refresh()
        return tid in self._tids

    def _decide(self) -> None:
        """The trial's choice is made: its losers' events are dropped (``on_choice``) and
        forgotten in the calls open now (an open call whose outermost entry was a loser's
        starts at its earliest kept entry)."""
        trial, self.trial = self.trial, None
        self._dropped = self.on_choice(trial) if self.on_choice is not None else set()
        for tid, opened in self._open.items():
            if not self._dropped & set(opened):
                continue
            for name in self._dropped & set(opened):
                del opened[name]
            if opened:
                self._start[tid] = min(opened.values())
            else:
                self._start.pop(tid, None)

    @staticmethod
    def _entry_of(ret_name: str) -> str:
        """The entry event of a return event: ``ret<i>`` → ``call<i>`` (agent/trace/uprobe.py
        names them so)."""
        return "call" + ret_name[3:] if ret_name.startswith("ret") else ret_name

    def _row(self, t0: int, t1: int, tid: int, c0: int, c1: int) -> list[int]:
        self._seq += 1
        self.calls += 1
        r = _BLANK[:]
        r[_SEQ] = r[_SEQ2] = self._seq
        r[_START], r[_END] = t0, t1
        r[_PID], r[_TID] = self.pid, tid
        r[_CPU0], r[_CPU1] = c0, c1
        return r

    def finish(self) -> None:
        """The process ended (or watch stops): calls still open are closed and counted."""
        self.open_at_exit += sum(1 for o in self._open.values() if o)
        if self.native is not None:
            self.open_at_exit += self.native.clear()
        self._open.clear()
        self._start.clear()

    def stats(self) -> dict:
        nat = self.native
        return {"calls": self.calls,
                "unpaired_returns": self.unpaired_returns + (nat.unpaired_returns if nat
                                                             else 0),
                "lost_returns": self.lost_returns + (nat.lost_returns if nat else 0),
                "open_at_exit": self.open_at_exit, "resynced": self.resynced,
                "timing": "entry to next entry (call period)" if self.entry_only else
                "entry to return"}

    def close(self) -> None:
        self.finish()
        if self.pmu is not None:  # --pmu: its perf groups, rings and perf's own uprobes
            self.pmu.close()


@dataclass(frozen=True)
class Attached(Source):
    """``--attach PID``: the process (its name when checked), the runtime whose
    once-per-call function is timed (agent.trace.attach.NAMES) or LIB:SYMBOL for any other
    function, return probes on such a function only with ``unsafe_return`` (a C++ exception
    unwinding through a uretprobe'd frame aborts the process)."""

    process: int = 0
    comm: str = ""
    runtime: str = "auto"
    symbol: str | None = None
    unsafe_return: bool = False
    unsafe_library: bool = False
    gpu_probes: str = "default"   # agent.trace.gpu_probes.LEVELS

    RANK = 10
    exporter_label = "attach"
    kind = property(lambda self: "attach")
    said = property(lambda self: "--attach")
    pid = property(lambda self: self.process)

    @classmethod
    def named(cls, given: Given) -> bool:
        return given.attach is not None

    @classmethod
    def build(cls, host: Host, given: Given) -> Attached:
        """--attach and its options: the one source named, a running process (checked here,
        once), a known runtime name, the LIB:SYMBOL shape; --unsafe-return only for
        --attach-symbol (the catalogue's functions get return probes anyway: they return
        status codes, never throw)."""
        from agent.trace.attach import NAMES, AttachError, comm_of
        for name, v in (("--probe", given.probe), ("--pid", given.pid), ("--ring", given.ring)):
            if v is not None:
                raise AgentError(f"--attach and {name} name two latency sources: give one "
                                 "(--attach times the running process itself)")
        pid, runtime, symbol = given.attach or 0, given.attach_runtime, given.attach_symbol
        if pid <= 0:
            raise AgentError(f"--attach {pid}: a PID is a positive number")
        try:
            comm = comm_of(host, pid)
        except AttachError as exc:
            raise AgentError(f"--attach: {exc}") from None
        if runtime is not None and runtime not in NAMES:
            raise AgentError(f"--attach-runtime must be one of {', '.join(NAMES)}, not "
                             f"{runtime!r}")
        if runtime is not None and symbol is not None:
            raise AgentError("--attach-runtime and --attach-symbol name two functions: give "
                             "one (--attach-symbol times LIB:SYMBOL whatever the runtime)")
        if symbol is not None:
            lib, sep, sym = symbol.partition(":")
            if not sep or not lib.strip() or not sym.strip():
                raise AgentError(f"--attach-symbol must be LIB:SYMBOL, not {symbol!r}")
        elif given.unsafe_return:
            raise AgentError("--unsafe-return is for --attach-symbol (a runtime's own "
                             "function is timed to its return already): give --attach-symbol "
                             "too")
        return cls(process=pid, comm=comm, runtime=runtime or "auto", symbol=symbol,
                   unsafe_return=given.unsafe_return,
                   unsafe_library=given.attach_unsafe_library,
                   gpu_probes=_gpu_level(given.gpu_probes))

    @classmethod
    def refuse(cls, given: Given, chosen: str) -> None:
        if given.gpu_probes is not None:
            _gpu_level(given.gpu_probes)   # (a bad value is said first)
            raise AgentError(f"--gpu-probes is for --attach PID, not {chosen}")
        if chosen.startswith("--attach-"):  # a service by identity (identity.py) takes them
            return
        for name, v in (("--attach-runtime", given.attach_runtime),
                        ("--attach-symbol", given.attach_symbol),
                        ("--unsafe-return", given.unsafe_return or None),
                        ("--attach-unsafe-library", given.attach_unsafe_library or None)):
            if v is not None:
                raise AgentError(f"{name} is for --attach: give --attach PID (or "
                                 "--attach-name/--attach-unit/--attach-cgroup) too")

    def cpus(self, host: Host, rule: Any, given: list[int] | None,
             keep_one_free: bool) -> list[int]:
        return process_cpus(host, self.process, rule.online) or given or [rule.cpus[-1]]

    def cpu_notes(self, given: list[int] | None, cpus: list[int]) -> list[str]:
        notes = []
        if given and sorted(given) != cpus:
            notes.append(f"--attach: pid {self.process} ({self.comm}) may run on CPUs "
                         f"{format_cpulist(cpus)}: those are traced")
        if len(cpus) > 4:
            notes.append(f"--attach: pid {self.process} is not pinned ({len(cpus)} CPUs): "
                         "kernel events are recorded on all of them (pin the service for a "
                         "smaller cost and a cleaner attribution)")
        return notes

    def open(self, host: Host, cpus: list[int], warnings: list[str]) -> AttachedRun:
        return AttachedRun(self, host, cpus, warnings)


def _gpu_level(level: str | None) -> str:
    """--gpu-probes checked (agent/trace/gpu_probes.py LEVELS; None: the default)."""
    from agent.trace import gpu_probes
    try:
        return gpu_probes.check_level(gpu_probes.DEFAULT_LEVEL if level is None else level)
    except gpu_probes.GpuProbeError as exc:
        raise AgentError(str(exc)) from None


# libraries worth naming when nothing was timed: other inference runtimes and accelerators
_ML = re.compile(r"tensorflow|tflite|litert|onnx|torch|cuda|cudnn|xla|jax|openvino|tensorrt|"
                 r"nvinfer|dnnl|mkl|paddle|mxnet|ncnn|mnn|rknn|triton", re.IGNORECASE)
QUIET_S = 5.0            # nothing timed this long after the attach: said on stderr, once
EXIT_NOTHING_TIMED = 4   # watch's exit status for a run that timed no call (watch --help)


def _index(event: str) -> int:
    """The target of an event: ``call<i>``/``ret<i>`` → i (agent/trace/uprobe.py)."""
    return int(event.removeprefix("call").removeprefix("ret"))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class AttachedRun(Running):
    """The uprobes of one run and their :class:`AttachedReader`. Several candidate runtimes
    (``auto`` on a process that maps more than one) are armed together and tried
    (agent/trace/trial.py): the one whose calls arrive is kept, the others' events removed,
    and the choice said on stderr with each candidate's count. ``say``: where such lines go
    while the run goes on (stderr)."""

    source: Attached

    def __init__(self, source: Attached, host: Host, cpus: list[int],
                 warnings: list[str], say: Callable[[str], None] = _stderr) -> None:
        super().__init__(source, host, cpus, warnings)
        self._uprobes: Any = None  # agent.trace.uprobe.Uprobes
        self._plan: Any = None     # agent.trace.attach.Plan
        self.say = say
        self._armed_at = 0.0
        self._quiet_said = False
        self._life: ProcessLife | None = None  # whether the process runs (check())
        self.gpu: Any = None       # agent.trace.gpu_probes.GpuHits (the session splits spikes)
        self._gpu_uprobes: Any = None

    def start(self, events: Any, phase: Phase | None = None) -> None:
        """Uprobes on the runtime's once-per-call function (every candidate's, when the
        process maps several), enabled in the calls instance of ``events``' source
        (agent/trace/calls.py; the session's SpikeEvents: it must be active), read by an
        :class:`AttachedReader`.
        AgentError with one line when the process cannot be attached."""
        from agent.trace import attach, uprobe
        if not events.active:
            raise AgentError(f"--attach needs the kernel's trace events: {events.reason}")
        src, tracing = self.source, events.source
        try:
            plan = attach.plan(self.host, src.process, src.runtime, src.symbol,
                               src.unsafe_return, phase, unsafe_library=src.unsafe_library)
        except attach.AttachError as exc:
            raise AgentError(str(exc)) from None
        self.warnings += [f"attach: {n}" for n in uprobe.remove_stale(self.host,
                                                                      tracing.tracefs)]
        u = uprobe.Uprobes(tracing.tracefs, plan.targets)
        try:
            u.define()
            reader = AttachedReader(self.host, src.process, tracing, u,
                                    entry_only=not any(t.returns for t in plan.targets))
            tracing.add_uprobes(u, sorted(reader.threads()))
        except (uprobe.UprobeError, OSError, ValueError) as exc:
            u.remove()
            raise AgentError(f"--attach {src.process}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        self._uprobes, self.reader, self._plan = u, reader, plan
        if not reader.entry_only and not os.environ.get("HFTAGENT_PY_PAIRING"):
            from agent.watch.latency import native_pair
            native_pair.library()  # built now (~0.2 s, once per cache), not in the loop
        if len(plan.runtimes) > 1 and not reader.entry_only:
            self._arm_trial(reader, u)
        self._said(plan, reader.entry_only, attach)
        self._arm_gpu(tracing, reader)
        self._armed_at = time.monotonic()

    def _arm_gpu(self, tracing: Any, reader: AttachedReader) -> None:
        """--gpu-probes: a few libcuda probes (agent/trace/gpu_probes.py), their hits kept
        by the reader for each spike's GPU split (agent/watch/attribution/gpu_split.py,
        called by the session)."""
        from agent.trace import gpu_probes
        src = self.source
        got = gpu_probes.arm(self.host, src.process, src.gpu_probes, src.unsafe_library,
                             tracing, sorted(reader.threads()))
        self.warnings += [f"attach: {n}" for n in got.notes]
        if got.hits is not None and got.plan is not None:
            reader.gpu, self._gpu_uprobes, self.gpu = got.hits, got.uprobes, got.hits
            self.info["gpu_probes"] = got.plan.to_dict()

    def _arm_trial(self, reader: AttachedReader, u: Any) -> None:
        from agent.trace.trial import Trial
        runtime_of = {n: u.targets[_index(n)].runtime for n in u.names}
        reader.trial = Trial(runtime_of, self._plan.runtimes, lambda n: n in u.returns)
        reader.on_choice = self._chosen

    def _chosen(self, trial: Any) -> set[str]:
        """The trial chose: drop the other candidates' events, say which and why."""
        win = trial.winner()
        losers = {i for i, t in enumerate(self._uprobes.targets) if t.runtime != win}
        try:
            dropped = set(self._uprobes.drop(losers))
        except OSError as exc:  # (kept armed: their hits are skipped, their cost stays)
            self.warnings.append(f"attach: the other candidates' probes could not be "
                                 f"disabled: {exc.strerror or exc}")
            dropped = {n for n in self._uprobes.names
                       if self._uprobes.targets[_index(n)].runtime != win}
        kept = [t for t in self._uprobes.targets if t.runtime == win]
        line = (f"attach: timing {win}: {kept[0].shown}, chosen by trial ("
                f"{trial.tally[win].outermost} outermost calls); calls per candidate: "
                f"{trial.counts()}; the others' probes disabled")
        self.say(f"hftagent: {line}")
        self.info["probe"] = (f"attached to pid {self.pid} ({self._plan.comm}): {win} "
                              f"{kept[0].shown}")
        self.info["attach"]["chosen"] = {"runtime": win, "by": "trial",
                                         "counts": trial.to_dict()}
        return dropped

    def _said(self, plan: Any, entry_only: bool, attach: Any) -> None:
        t = plan.targets[0]
        tried = plan.runtimes if len(plan.runtimes) > 1 else []
        what = (f"candidates {', '.join(tried)} (chosen by trial)" if tried else
                f"{t.runtime} {t.shown}")
        self.info = {"pid": self.pid, "probe": f"attached to pid {self.pid} ({plan.comm}): "
                     f"{what}", "attach": plan.to_dict()}
        self.warnings += [f"attach: {n}" for n in attach.host_notes(self.host)]
        libs = ", ".join(dict.fromkeys(os.path.basename(x.library) for x in plan.targets))
        self.warnings.append(
            f"attached: {len(plan.targets)} uprobe(s) in {libs}; every process that maps "
            f"it pays ~{attach.COST_US} µs a call while watch runs"
            + ("; entry-only timing: samples are call periods, not latencies"
               if entry_only else ""))

    def check(self) -> str | None:
        """Why the process is gone, or None; meanwhile, once, the line that nothing has been
        timed :data:`QUIET_S` after the attach (on stderr while the run goes on)."""
        if not self._quiet_said and self.reader is not None and not self.reader.calls and \
                time.monotonic() - self._armed_at >= QUIET_S:
            self._say_quiet()
        if self._alive():
            return None
        return f"attached process {self.source.process} exited"

    def _alive(self) -> bool:
        """Whether the process runs (:class:`~agent.watch.latency.base.ProcessLife`: its
        pidfd, opened at the first check)."""
        if self._life is None:
            self._life = ProcessLife(self.host, self.source.process)
        return self._life.alive()

    def _say_quiet(self) -> None:
        """What is armed, what else the process maps, and what to try instead."""
        from agent.trace.attach import RUNTIMES
        self._quiet_said = True
        p, src = self._plan, self.source
        armed = "; ".join(f"{r} {next(t.shown for t in p.targets if t.runtime == r)}"
                          for r in p.runtimes)
        ours = {os.path.basename(t.library) for t in p.targets}
        libs = [n for n in p.mapped if ".so" in n and ".cpython-" not in n and n not in ours]
        other = [n for n in libs if _ML.search(n)] or libs
        more = f" and {len(other) - 8} more" if len(other) > 8 else ""
        untried = [r.name for r in RUNTIMES if r.name not in p.runtimes
                   and any(r.library.search(n) for n in p.mapped)]
        hint = (f"--attach-runtime {' or '.join(untried)}" if untried else
                "--attach-symbol LIB:SYMBOL (the function it calls once per inference)")
        line = (f"--attach {src.process} ({p.comm}): nothing timed in "
                f"{time.monotonic() - self._armed_at:.0f} s; armed: {armed}; it also maps "
                f"{', '.join(other[:8]) or 'no other library'}{more}; if it is serving, try "
                f"{hint}")
        self.say(f"hftagent: warning: {line}")
        self.warnings.append(line)

    def exit_code(self) -> int:
        """:data:`EXIT_NOTHING_TIMED` when the run timed no call (said on stderr too)."""
        if self.reader is None or self.reader.calls:
            return 0
        if not self._quiet_said:
            self._say_quiet()
        return EXIT_NOTHING_TIMED

    def summary(self, lat: Any) -> dict[str, Any]:
        out = super().summary(lat)
        if self.gpu is not None and self.reader is not None:  # --gpu-probes: hits paid, parts
            out["gpu"] = self.gpu.stats(self.reader.calls)
        return out

    def close(self) -> None:
        super().close()
        if self._life is not None:
            self._life.close()
        if self._gpu_uprobes is not None:
            left = self._gpu_uprobes.remove()
            if left:
                self.warnings.append("GPU uprobe events not removed: " + "; ".join(left))
            self._gpu_uprobes = None
        if self._uprobes is not None:
            left = self._uprobes.remove()
            if left:
                self.warnings.append("uprobe events not removed: " + "; ".join(left))
            self._uprobes = None


SOURCE = Attached
