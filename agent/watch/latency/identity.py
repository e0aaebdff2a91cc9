"""A service followed by identity (``watch --attach-name NAME``, ``--attach-unit UNIT``,
``--attach-cgroup PATH``): every process that is the service (:mod:`.procs` decides which),
timed as ``--attach`` times one (:mod:`.attached`), across its restarts.

One probe set: uprobes are per inode, so the processes that map the same runtime library
file share one set of events (``hftagent_<watch's pid>``), filtered to the union of their
threads, and their calls are told apart by thread (:class:`ServiceReader`: a row's ``pid``
is its process). The set is armed on the first process whose runtime is mapped (the trial
between candidate runtimes, as ``--attach``'s), and stays armed while the service lives or
restarts onto the same file: a restart is a new thread filter, nothing defined again. A
process that maps another copy of the runtime while the set's file is still used by a live
process is said and not timed; once no live process uses the set, the set is removed and
armed again on the new file.

Polling, from the loop's reads (:meth:`ServiceRun.poll`, every :data:`POLL_S`): the identity's
pids (/proc: comm and cmdline of new pids only), and each new process's maps until its
runtime library is mapped; then it is timed. So a restarted service is timed within
~2 × POLL_S of its first mapping of the runtime (a process that ran :data:`SETTLED_AFTER_S` before
the run: both looks in start-up). An exit is said on stderr; the run keeps its
history and metrics and goes on.

The calls a process started during the run made before it was timed: counted by the
process's own count where it keeps one watch can read — an :mod:`agent.client` latency ring
(found as ``--pid`` finds it, :func:`~agent.watch.latency.ring.find_ring`: owned by the
process's user, created by it), whose last sequence number, read when the process exits or
the run ends, is the calls it recorded — as that count less the calls timed; else "not
countable" (the runtime keeps no count of its own).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.client import FIELDS
from agent.errors import AgentError
from agent.watch.latency import procs
from agent.watch.latency.attached import (
    EXIT_NOTHING_TIMED,
    Attached,
    AttachedReader,
    AttachedRun,
)
from agent.watch.latency.base import Given, Phase, ProcessLife, Running, Source, process_cpus
from collectors.host import Host
from collectors.parsers import format_cpulist

F = {name: i for i, name in enumerate(FIELDS)}
POLL_S = 0.15            # the identity and the waiting processes' maps: ~6.7 Hz
RECHECK_S, RECHECK_EVERY_S = 5.0, 0.5   # a timed process with no call: its maps again
LOAD_WAIT_S = 2.0        # a process mapping part of the armed set's files: waited for
# a process that had run this long when the run began is armed in start-up (ServiceRun.
# _settle_running): its imports are done (a TF import maps its libraries over 2-4 s; one
# still loading after it is armed again by _recheck within RECHECK_S, before its first call)
SETTLED_AFTER_S = 5.0
SLOW_AFTER_S, SLOW_POLL_S = 10.0, 1.0   # a process waiting longer: its maps read at 1 Hz
RING_TRIES = 8           # a process's agent.client ring is looked for this often
RING_READS = 64          # reads of it to its newest record (each bounded: agent.client)
COPY = "waiting: it maps another copy of the runtime than the one armed"
MAX_LINES = 10           # the summary's lines of processes (the latest; the others summed)
MAX_KEPT = 1000          # processes that exited kept one by one (older ones: summed only)
NO_THREAD = [0]          # a filter no user thread passes (pid 0 is the idle task)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ServiceReader(AttachedReader):
    """An :class:`AttachedReader` over several processes of one probe set: its threads are
    the union of theirs (``pids``), each row's pid its thread's process, calls counted per
    process (``per_pid``)."""

    def __init__(self, host: Host, pids: list[int], events: Any, uprobes: Any,
                 entry_only: bool, label: str) -> None:
        self.pids: list[int] = list(pids)
        self.tid_pid: dict[int, int] = {}
        self.per_pid: dict[int, int] = {}
        self.first_ns: dict[int, int] = {}    # pid -> the start of its first timed call
        self.leaving: set[int] = set()        # exited: its calls still in the buffers
        super().__init__(host, pids[0], events, uprobes, entry_only)
        self.path = f"uprobes {uprobes.group} on {label}"

    def threads(self) -> set[int]:
        """The live processes' threads, and those of the processes leaving (their calls made
        before the exit are still to be read: a thread not in the set is another process's)."""
        out: dict[int, int] = {}
        for pid in self.pids:
            for t in self.host.listdir(self.host.proc(pid, "task")):
                if t.isdigit():
                    out[int(t)] = pid
        self.tid_pid.update(out)
        return set(out) | {t for t, p in self.tid_pid.items() if p in self.leaving}

    def _row(self, t0: int, t1: int, tid: int, c0: int, c1: int) -> list[int]:
        r = super()._row(t0, t1, tid, c0, c1)
        pid = self.tid_pid.get(tid, self.pid)
        r[F["pid"]] = pid
        self.per_pid[pid] = self.per_pid.get(pid, 0) + 1
        self.first_ns.setdefault(pid, t0)
        return r

    def _rows_made(self, rows: np.ndarray) -> None:
        """:meth:`_row`'s work on the C pairing's rows: each row's process, the calls per
        process and the start of each one's first call. One process and none leaving (a
        service of one process: every thread of the filter is its): no per-thread lookup
        (np.unique and a pass per process were ~0.2 ms of CPU a read, issue #38)."""
        if len(self.pids) == 1 and not self.leaving:
            pid = self.pids[0]
            rows[:, F["pid"]] = pid
            self.per_pid[pid] = self.per_pid.get(pid, 0) + len(rows)
            self.first_ns.setdefault(pid, int(rows[0, F["start_ns"]]))
            return
        tids, inv = np.unique(rows[:, F["tid"]], return_inverse=True)
        pids = np.array([self.tid_pid.get(t, self.pid) for t in tids.tolist()],
                        dtype=np.int64)[inv]
        rows[:, F["pid"]] = pids
        for pid in set(pids.tolist()):
            mine = pids == pid
            self.per_pid[pid] = self.per_pid.get(pid, 0) + int(mine.sum())
            self.first_ns.setdefault(pid, int(rows[mine, F["start_ns"]][0]))

    def follow(self, pid: int) -> None:
        """Time process ``pid`` too (it maps the set's library)."""
        if pid not in self.pids:
            self.pids.append(pid)
        self.refilter()

    def leave(self, pid: int) -> None:
        """Process ``pid`` exited: its threads are kept until the next read has taken the
        calls it made before (:meth:`forget`)."""
        self.leaving.add(pid)

    def forget(self, pid: int) -> None:
        """Process ``pid`` exited and its calls were read: its open calls are closed and
        counted (``open_at_exit``), its threads leave the filter."""
        self.leaving.discard(pid)
        self.pids = [p for p in self.pids if p != pid]
        gone = [t for t, p in self.tid_pid.items() if p == pid]
        for tid in gone:
            del self.tid_pid[tid]
        self._close_threads(gone)
        if self.native is not None:
            self.open_at_exit += self.native.drop(gone)
        self.refilter()

    def refilter(self) -> None:
        """The filter of every instance: the processes' threads now (none: a filter no
        thread passes, never an empty one, which would record every process's hits)."""
        self._tids, self._tids_at = self.threads(), time.monotonic()
        for inst in self.uprobes.instances:
            try:
                self.uprobes.set_filter(inst, sorted(self._tids) or NO_THREAD)
            except OSError:
                pass


@dataclass(frozen=True)
class Service(Source):
    """``--attach-name/--attach-unit/--attach-cgroup``: the service (:class:`procs.Identity`)
    and what to time in each of its processes (as ``--attach``'s options); ``found``: its
    pids when the options were checked (their CPUs are traced)."""

    ident: procs.Identity = procs.Identity("name", "")
    runtime: str = "auto"
    symbol: str | None = None
    unsafe_return: bool = False
    unsafe_library: bool = False
    found: tuple[int, ...] = field(default=())

    RANK = 9    # before --attach: given together, this source refuses --attach
    exporter_label = "attach"
    kind = property(lambda self: "attach")
    said = property(lambda self: self.ident.said)
    exporter_service = property(lambda self: self.ident.label)

    @classmethod
    def named(cls, given: Given) -> bool:
        return any(v is not None for v in (given.attach_name, given.attach_unit,
                                           given.attach_cgroup))

    @classmethod
    def build(cls, host: Host, given: Given) -> Service:
        """The identity checked (:func:`procs.identity`), --attach's function options
        checked as --attach checks them, the pids that match now."""
        try:
            ident = procs.identity(host, given.attach_name, given.attach_unit,
                                   given.attach_cgroup)
        except procs.IdentityError as exc:
            raise AgentError(str(exc)) from None
        for name, v in (("--attach", given.attach), ("--probe", given.probe),
                        ("--pid", given.pid), ("--ring", given.ring)):
            if v is not None:
                raise AgentError(f"{ident.said} and {name} name two latency sources: give "
                                 "one")
        runtime, symbol = _function(given)
        found = tuple(sorted(procs.Matcher(host, ident).poll()))
        return cls(ident=ident, runtime=runtime, symbol=symbol,
                   unsafe_return=given.unsafe_return,
                   unsafe_library=given.attach_unsafe_library, found=found)

    def cpus(self, host: Host, rule: Any, given: list[int] | None,
             keep_one_free: bool) -> list[int]:
        mine = sorted({c for p in self.found for c in process_cpus(host, p, rule.online)})
        return mine or given or [rule.cpus[-1]]

    def cpu_notes(self, given: list[int] | None, cpus: list[int]) -> list[str]:
        at = f"CPUs {format_cpulist(cpus)} are traced"
        if not self.found:
            return [f"{self.said}: no process of it runs yet: {at} (calls on other CPUs are "
                    "not seen; pin the service)"]
        if given and sorted(given) != cpus:
            return [f"{self.said}: its processes may run on CPUs {format_cpulist(cpus)}: "
                    "those are traced"]
        return []

    def open(self, host: Host, cpus: list[int], warnings: list[str]) -> ServiceRun:
        return ServiceRun(self, host, cpus, warnings)


def _function(given: Given) -> tuple[str, str | None]:
    """--attach-runtime / --attach-symbol / --unsafe-return, checked as --attach checks
    them: (runtime, symbol)."""
    from agent.trace.attach import NAMES
    runtime, symbol = given.attach_runtime, given.attach_symbol
    if runtime is not None and runtime not in NAMES:
        raise AgentError(f"--attach-runtime must be one of {', '.join(NAMES)}, not "
                         f"{runtime!r}")
    if runtime is not None and symbol is not None:
        raise AgentError("--attach-runtime and --attach-symbol name two functions: give one")
    if symbol is not None:
        lib, sep, sym = symbol.partition(":")
        if not sep or not lib.strip() or not sym.strip():
            raise AgentError(f"--attach-symbol must be LIB:SYMBOL, not {symbol!r}")
    elif given.unsafe_return:
        raise AgentError("--unsafe-return is for --attach-symbol: give --attach-symbol too")
    return runtime or "auto", symbol


@dataclass
class Proc:
    """One process of the service, as the run saw it (times: time.monotonic())."""

    pid: int
    comm: str
    seen_at: float
    started: int | None = None     # its start time (/proc/PID/stat, clock ticks after boot)
    mapped_at: float | None = None # the first poll that found its runtime mapped
    armed_at: float | None = None
    exited_at: float | None = None
    state: str = "waiting for its runtime"
    maps_at: float = 0.0
    files: frozenset | None = None # its runtime files at the last look
    started_in_run: bool = False   # not there at the run's first poll: its start was missed
    ring: Any = None               # its agent.client RingReader, where it keeps one
    ring_tries: int = 0
    own_calls: int | None = None   # its own count (the ring's last sequence number)
    life: ProcessLife | None = None  # whether it runs (its pidfd while it does)
    missed: int | None = None      # its calls recorded before its first timed one
    why: str = "the process keeps no count watch can read: no agent.client ring"

    def to_dict(self, calls: int, first_ns: int | None = None) -> dict[str, Any]:
        """Its incarnation: state, calls timed, when it was seen to map its runtime, armed
        (both s after it was first seen; ``rearm_s``: armed after that mapping was seen) and
        exited, its first timed call's start (``first_call_ns``, CLOCK_MONOTONIC), its own
        count and the calls missed before its timing."""
        def rel(t: float | None, since: float | None = None) -> float | None:
            base = self.seen_at if since is None else since
            return None if t is None else round(t - base, 3)
        missed: int | str | None = None
        if self.started_in_run and self.armed_at is not None:
            missed = self.missed if self.missed is not None else \
                f"not countable ({self.why})"
        rearm = None if self.mapped_at is None else rel(self.armed_at, self.mapped_at)
        return {"pid": self.pid, "comm": self.comm, "state": self.state, "calls": calls,
                "mapped_after_s": rel(self.mapped_at), "armed_after_s": rel(self.armed_at),
                "rearm_s": rearm, "exited_after_s": rel(self.exited_at),
                "first_call_ns": first_ns, "own_calls": self.own_calls, "missed": missed}

    def find_ring(self, host: Host) -> None:
        """Its agent.client ring, looked for at most :data:`RING_TRIES` times (once a poll
        round after it is timed): a process keeps one or does not."""
        from agent.client import RingError
        from agent.watch.latency.ring import find_ring
        if self.ring is not None or self.ring_tries >= RING_TRIES:
            return
        self.ring_tries += 1
        try:
            self.ring = find_ring(host, self.pid)
        except RingError:
            return

    def count_own(self, first_ns: int | None) -> None:
        """The calls it recorded before its first timed call (``first_ns``: that call's
        start), by its own ring: read to its newest record (our descriptor keeps an
        unlinked ring readable after the process exits), then closed. A record's sequence
        number counts the calls recorded up to it, so the last record that ended before
        ``first_ns`` says how many were missed; none left of that time (the ring lapped
        them) is not countable."""
        from agent.client import RingError
        if self.ring is None:
            return
        got: list[np.ndarray] = []
        try:
            for _ in range(RING_READS):
                r = self.ring.read()
                if not len(r):
                    break
                got.append(r[:, [F["seq"], F["end_ns"]]])
            self.own_calls = int(self.ring.pos)
        except RingError as exc:
            self.why = f"its ring: {exc}"
        finally:
            self.ring.close()
            self.ring = None
        if self.own_calls is None:
            return
        rows = np.concatenate(got) if got else np.empty((0, 2), dtype=np.int64)
        before = rows[rows[:, 1] < first_ns] if first_ns is not None else rows
        if first_ns is None:
            self.missed = self.own_calls
        elif len(before):
            self.missed = int(before[:, 0].max())
        elif not len(rows) or int(rows[:, 0].min()) == 1:
            self.missed = 0
        else:
            self.why = "its ring no longer holds the calls before the first one timed"


class ServiceRun(Running):
    """The run of a :class:`Service` (module docstring): the probe set armed now (an
    :class:`AttachedRun` whose reader is a :class:`ServiceReader`), the processes seen."""

    source: Service
    unstarted = "the service"

    def __init__(self, source: Service, host: Host, cpus: list[int], warnings: list[str],
                 say: Callable[[str], None] = _stderr,
                 matcher: procs.Matcher | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(source, host, cpus, warnings)
        self.say, self.clock = say, clock
        self.matcher = matcher
        self.procs: dict[int, Proc] = {}
        self.armed: AttachedRun | None = None
        self.key: frozenset | None = None   # the armed set's files (dev, inode, path)
        self.events: Any = None
        self.phase: Phase | None = None
        self.calls_before: dict[int, int] = {}  # pid -> calls timed by sets removed
        self.first_ns: dict[int, int] = {}      # pid -> its first timed call's start (ditto)
        self._polled = -POLL_S
        self._polls = 0
        self._leaving: list[Proc] = []          # exited: said once their calls are read
        # the exited processes beyond MAX_KEPT, summed (a crash-looping service, always on)
        self.folded = {"processes": 0, "calls": 0, "missed": 0, "not_countable": 0}
        self.earlier: list[dict[str, Any]] = []  # exited processes whose pid was reused
        self._stash: list[np.ndarray] = []      # calls read from a set before its removal

    def start(self, events: Any, phase: Phase | None = None) -> None:
        """Arm on the processes that run now (none is fine: the run waits for one)."""
        if not events.active:
            raise AgentError(f"{self.source.said} needs the kernel's trace events: "
                             f"{events.reason}")
        self.events, self.phase = events, phase
        self.matcher = self.matcher or procs.Matcher(self.host, self.source.ident)
        self.reader = _Feed(self)
        self.info = {"probe": self._described(), "attach": {}}
        self.poll()
        self._settle_running()
        self.phase = None   # start-up is over: a later arming says its own line
        if not self.procs:
            self.say(f"hftagent: {self.source.said}: no process of it runs yet; waiting")

    def _settle_running(self) -> None:
        """The processes that had run :data:`SETTLED_AFTER_S` or more when the run began have
        loaded their runtime: the second look at their files, which settles them
        (:meth:`_arm`), is taken now, in start-up, not one poll later in the loop — their
        arming (the plan, the probes: ~30-50 ms of CPU) is start-up's, as ``--attach PID``'s
        is, not the running cost's (issue #38: ~0.1 % of one CPU over a minute's run). A
        younger one may still be loading (an import maps libLiteRt.so before its Python
        wrapper's library): it waits for the next poll."""
        up = self.host.read(self.host.proc("uptime")).value
        for p in list(self.procs.values()):
            ran = procs.running_for_s(p.started, up)
            if p.armed_at is None and p.exited_at is None and p.files is not None and \
                    ran is not None and ran >= SETTLED_AFTER_S:
                self._arm(p)

    def poll(self) -> None:
        """The identity's pids now: new ones noted, gone ones said, waiting ones armed
        once their runtime is mapped."""
        now = self.clock()
        if now - self._polled < POLL_S:
            return
        self._polled = now
        pids = self.matcher.poll() if self.matcher is not None else set()
        for pid in sorted(pids):
            if pid not in self.procs or self._reused(self.procs[pid]):
                self.procs[pid] = Proc(pid, _comm(self.host, pid), now,
                                       started_in_run=self._polls > 0,
                                       started=procs.started(self.host, pid))
        self._polls += 1
        for p in list(self.procs.values()):
            if p.state == "timed" and p.started_in_run:
                p.find_ring(self.host)
            if p.state == "timed" and p.pid in pids:
                self._recheck(p, now)
            if p.exited_at is None and (p.pid not in pids or not self._alive(p)):
                self._exited(p, now)
            elif p.exited_at is None and p.armed_at is None and \
                    not p.state.startswith("not timed"):
                self._arm(p)

    def arming(self) -> bool:
        """No process of the service is timed, or one seen within :data:`SLOW_AFTER_S`
        waits to be armed (a restart), or one timed since it started in the run is still
        looked for its own ring (its count of the calls missed: :meth:`Proc.find_ring`, one
        look a poll): these need the polls' pace (POLL_S), which the steps past the CPU
        budget (≤ 0.45 s apart) would stretch — bench/restarts.py re-armed max 0.55 s after
        the mapping with them, 0.37 s without, and a process killed 0.3 s after its timing
        could go before its ring was looked for. (One that waits longer is polled at 1 Hz
        anyway.)"""
        now = self.clock()
        live = [p for p in self.procs.values() if p.exited_at is None]
        return not any(p.state == "timed" for p in live) or any(
            p.armed_at is None and not p.state.startswith("not timed") and
            now - p.seen_at < SLOW_AFTER_S or
            p.state == "timed" and p.started_in_run and p.ring is None and
            p.ring_tries < RING_TRIES for p in live)

    def _alive(self, p: Proc) -> bool:
        if p.life is None:
            p.life = ProcessLife(self.host, p.pid)
        return p.life.alive()

    def _reused(self, p: Proc) -> bool:
        """Whether ``p``, which exited, has its pid taken by a new process of the service
        (another start time: not its zombie). Its incarnation is kept as it ended
        (``earlier``), its per-pid figures cleared for the new one."""
        if p.exited_at is None or p in self._leaving or \
                procs.started(self.host, p.pid) in (None, p.started):
            return False
        self.earlier.append(p.to_dict(self.calls_of(p.pid), self._first_ns(p.pid)))
        self._forget_pid(p.pid)
        return True

    def _forget_pid(self, pid: int) -> None:
        self.calls_before.pop(pid, None)
        self.first_ns.pop(pid, None)
        if self.armed is not None:
            self.armed.reader.per_pid.pop(pid, None)
            self.armed.reader.first_ns.pop(pid, None)

    def _exited(self, p: Proc, now: float) -> None:
        """Process ``p`` is gone: said once the calls it made before are read
        (:meth:`settle`, after the next read of the set)."""
        p.exited_at, was = now, p.state
        p.state = "exited"
        if p.life is not None:
            p.life.close()
        if self.armed is not None and was == "timed":
            self.armed.reader.leave(p.pid)
        self._leaving.append(p)

    def settle(self) -> None:
        """The processes that exited before the last read: their threads leave the filter,
        their own count is read, their exit is said."""
        leaving, self._leaving = self._leaving, []
        for p in leaving:
            if self.armed is not None and p.pid in self.armed.reader.leaving:
                self.armed.reader.forget(p.pid)
            p.count_own(self._first_ns(p.pid))
            self.say(f"hftagent: {self.source.said}: pid {p.pid} ({p.comm}) exited after "
                     f"{self.calls_of(p.pid)} call(s) timed; watching for the next")
        if leaving:
            self._fold()
            self.info["probe"] = self._described()

    def _fold(self) -> None:
        """Past :data:`MAX_KEPT` processes, the oldest that exited are summed into
        ``folded`` and forgotten (their calls, missed count and per-pid figures), so an
        always-on run's memory does not grow with its service's restarts."""
        over = len(self.procs) + len(self.earlier) - MAX_KEPT
        gone, self.earlier = self.earlier[:max(0, over)], self.earlier[max(0, over):]
        old = [p for p in self.procs.values() if p.exited_at is not None and
               p not in self._leaving][:max(0, over - len(gone))]
        for d in gone + [p.to_dict(self.calls_of(p.pid)) for p in old]:
            self.folded["processes"] += 1
            self.folded["calls"] += d["calls"]
            if isinstance(d["missed"], int):
                self.folded["missed"] += d["missed"]
            elif isinstance(d["missed"], str):
                self.folded["not_countable"] += 1
        for p in old:
            del self.procs[p.pid]
            self._forget_pid(p.pid)

    def _arm(self, p: Proc) -> None:
        """Time ``p`` once its runtime is mapped: on the armed set when it maps the same
        file(s), else on a new set (the old one removed when no live process uses it)."""
        now = self.clock()
        if now - p.seen_at > SLOW_AFTER_S and now - p.maps_at < SLOW_POLL_S:
            return   # (a process that never maps the runtime: its maps read at 1 Hz)
        p.maps_at = now
        key = _runtime_files(self.host, p.pid, self.source)
        if key is None:
            return   # not mapped yet (or gone: the next poll says so)
        if p.mapped_at is None:
            p.mapped_at = now
        if key != p.files:   # settled: the same runtime files on two polls (an import
            p.files = key    # maps libLiteRt.so before the Python wrapper's library)
            return
        p.comm = _comm(self.host, p.pid)   # (first seen between its fork and its exec)
        fit = self._fits(p, key, now)
        if fit == "wait":
            return
        if fit == "refuse":   # (tried again each poll: timed once the armed set is free)
            if p.state != COPY:
                p.state = COPY
                self.say(f"hftagent: warning: {self.source.said}: pid {p.pid} ({p.comm}) "
                         "maps another copy of the runtime than the armed one: not timed "
                         "while a process uses that one")
            return
        if fit == "new":
            self._drop_set()
        try:
            if self.armed is None:
                self._new_set(p, key)
            else:
                self.armed.reader.follow(p.pid)
        except AgentError as exc:
            p.state = f"not timed: {exc}"
            self.say(f"hftagent: warning: {self.source.said}: pid {p.pid} ({p.comm}): {exc}")
            return
        p.armed_at, p.state = self.clock(), "timed"
        self.say(f"hftagent: {self.source.said}: timing pid {p.pid} ({p.comm})")
        self.info["probe"] = self._described()

    def _recheck(self, p: Proc, now: float) -> None:
        """A timed process none of whose calls has come, in its first :data:`RECHECK_S`:
        when it maps runtime files the set lacks (the library it calls, loaded after the
        set was armed) and no other process uses the set, the set is armed again."""
        assert p.armed_at is not None
        if self.calls_of(p.pid) or now - p.armed_at > RECHECK_S or \
                now - p.maps_at < RECHECK_EVERY_S or self.key is None:
            return
        p.maps_at = now
        files = _runtime_files(self.host, p.pid, self.source)
        if not files or files <= self.key or \
                any(q.state == "timed" and q.pid != p.pid for q in self.procs.values()):
            return
        new = ", ".join(sorted(os.path.basename(f[2]) for f in files - self.key))
        self.say(f"hftagent: {self.source.said}: pid {p.pid} ({p.comm}) mapped {new} since "
                 "it was armed, before any call: armed again")
        self._drop_set()
        p.armed_at, p.state, p.files = None, "waiting for its runtime", files
        self._arm(p)

    def _fits(self, p: Proc, files: frozenset, now: float) -> str:
        """How process ``p``, mapping runtime ``files``, is timed: "follow" (it maps every
        file the armed set still probes), "wait" (a subset: still loading them, for
        :data:`LOAD_WAIT_S`), "refuse" (another copy while a live process uses the armed
        one) or "new" (a set of its own)."""
        if self.armed is None or self.key is None:
            return "new"
        if self._armed_files() <= files:
            return "follow"
        if files < self.key and now - p.seen_at < LOAD_WAIT_S:
            return "wait"
        if any(q.state == "timed" for q in self.procs.values()):
            return "refuse"
        return "new"

    def _armed_files(self) -> frozenset:
        """The files of the armed set's enabled targets (a trial's losers disabled)."""
        assert self.armed is not None and self.key is not None
        u = self.armed.reader.uprobes
        gone = getattr(u, "dropped", set())
        kept = {u.targets[int(n.removeprefix("call").removeprefix("ret"))].library
                for n in u.names if n not in gone}
        return frozenset(f for f in self.key if f[2] in kept) or self.key

    def _new_set(self, p: Proc, key: frozenset) -> None:
        """Arm a probe set on process ``p`` (:meth:`AttachedRun.start`: the plan, the
        events, a trial between candidate runtimes) and read it with a
        :class:`ServiceReader`, before a single event is read. AgentError with one line."""
        src = self.source
        one = Attached(process=p.pid, comm=p.comm, runtime=src.runtime, symbol=src.symbol,
                       unsafe_return=src.unsafe_return, unsafe_library=src.unsafe_library)
        # its own warnings, merged into the run's once each (a set armed on each restart
        # onto another file says the same host notes again)
        run = AttachedRun(one, self.host, self.cpus, [], say=self.say)
        try:
            run.start(self.events, self.phase)
        finally:
            self._merge(run)
        old: AttachedReader = run.reader
        new = ServiceReader(self.host, [p.pid], old.events, old.uprobes, old.entry_only,
                            src.said)
        new.trial, new.on_choice = old.trial, old.on_choice
        run.reader = new
        self.armed, self.key = run, key
        self.info["attach"] = run.info.get("attach", {})

    def _drop_set(self) -> None:
        """Remove the armed set (no live process uses its library any more)."""
        run, self.armed, self.key = self.armed, None, None
        if run is None:
            return
        rows = run.reader.read()   # the calls of the processes that exited, still unread
        if len(rows):
            self._stash.append(rows)
        for pid, n in run.reader.per_pid.items():
            self.calls_before[pid] = self.calls_before.get(pid, 0) + n
        for pid, t in run.reader.first_ns.items():
            self.first_ns.setdefault(pid, t)
        left = self.events.source.drop_uprobes(run.reader.uprobes)
        if left:
            self.warnings.append("uprobe events not removed: " + "; ".join(left))
        run.close()
        self._merge(run)

    def _merge(self, run: AttachedRun) -> None:
        self.warnings += [w for w in dict.fromkeys(run.warnings) if w not in self.warnings]

    def _first_ns(self, pid: int) -> int | None:
        """The start of process ``pid``'s first timed call (CLOCK_MONOTONIC ns), or None."""
        firsts = [self.first_ns.get(pid)] + ([self.armed.reader.first_ns.get(pid)]
                                             if self.armed is not None else [])
        return min((t for t in firsts if t is not None), default=None)

    def calls_of(self, pid: int) -> int:
        now = self.armed.reader.per_pid.get(pid, 0) if self.armed is not None else 0
        return self.calls_before.get(pid, 0) + now

    @property
    def calls(self) -> int:
        return sum(self.calls_of(p) for p in self.procs) + self.folded["calls"] + \
            sum(d["calls"] for d in self.earlier)

    def _described(self) -> str:
        timed = [f"{p.pid} ({p.comm})" for p in self.procs.values() if p.state == "timed"]
        gone = sum(1 for p in self.procs.values() if p.exited_at is not None)
        now = f"timing pid {', '.join(timed)}" if timed else "waiting for a process"
        return f"service {self.source.said}: {now}" + (f"; {gone} exited" if gone else "")

    def processes(self) -> list[dict[str, Any]]:
        """Each process seen: its state, calls timed, when it was armed and exited (s
        after it was first seen)."""
        return list(self.earlier) + [p.to_dict(self.calls_of(p.pid), self._first_ns(p.pid))
                                     for p in self.procs.values()]

    def summary(self, lat: Any) -> dict[str, Any]:
        """Its lines, and ``processes``: each incarnation of the service
        (:meth:`Proc.to_dict`; ``processes_earlier``: those past :data:`MAX_KEPT`, summed)."""
        out = super().summary(lat)
        out["source"] = self._described()
        out["processes"] = self.processes()
        if self.folded["processes"]:
            out["processes_earlier"] = dict(self.folded)
        return out

    def end_warnings(self, lat: Any, hist: Any, cpu_busy: float | None) -> list[str]:
        """A line per process seen, and what cannot be counted."""
        lines, every, f = [], self.processes(), self.folded
        if len(every) > MAX_LINES or f["processes"]:
            older, every = every[:-MAX_LINES], every[-MAX_LINES:]
            counted = [d["missed"] for d in older if isinstance(d["missed"], int)]
            unknown = sum(1 for d in older if isinstance(d["missed"], str)) + \
                f["not_countable"]
            lines.append(f"{self.source.said}: {len(older) + f['processes']} earlier "
                         f"process(es): {sum(d['calls'] for d in older) + f['calls']} call(s) "
                         f"timed; missed before their timing: {sum(counted) + f['missed']} "
                         "counted"
                         + (f", {unknown} process(es) not countable" if unknown else ""))
        for d in every:
            armed = "" if d["armed_after_s"] is None else \
                f", timed {d['armed_after_s']:.2f} s after it was seen"
            gone = "" if d["exited_after_s"] is None else \
                f", exited after {d['exited_after_s']:.1f} s"
            lines.append(f"{self.source.said}: pid {d['pid']} ({d['comm']}): {d['calls']} "
                         f"call(s) timed{armed}{gone}; {d['state']}")
        missed = [d for d in every if d["missed"] is not None]
        if missed:
            lines.append(f"{self.source.said}: calls missed between a start and its timing: "
                         + "; ".join(f"pid {d['pid']}: {d['missed']}"
                                     + (f" (of its own count {d['own_calls']})"
                                        if isinstance(d["missed"], int) else "")
                                     for d in missed))
        return lines

    def check(self) -> str | None:
        """None: the service may restart (its exits are said, never the run's end)."""
        return None

    def exit_code(self) -> int:
        """:data:`EXIT_NOTHING_TIMED` when no call of the service was timed (said)."""
        if self.calls:
            return 0
        self.say(f"hftagent: warning: {self.source.said}: no call timed "
                 f"({len(self.procs)} process(es) seen)")
        return EXIT_NOTHING_TIMED

    def take(self) -> np.ndarray:
        """The calls read now: those of a set removed since the last read, then the armed
        set's; then the processes that exited before this read are settled."""
        if self.armed is not None:
            self._stash.append(self.armed.reader.read())
        got, self._stash = self._stash, []
        self.settle()
        if not got:
            return np.empty((0, len(FIELDS)), dtype=np.int64)
        return got[0] if len(got) == 1 else np.concatenate(got)

    def close(self) -> None:
        super().close()
        self.settle()
        for p in self.procs.values():
            p.count_own(self._first_ns(p.pid))
            if p.life is not None:
                p.life.close()
        if self.matcher is not None:
            self.matcher.close()
        if self.armed is not None:
            self.armed.close()   # (its uprobes removed; the run's warnings say what is left)
            self._merge(self.armed)


class _Feed:
    """The session's reader: polls the service, then reads the armed set (rows of
    :data:`FIELDS`), else nothing."""

    lost = 0
    invalid = 0

    def __init__(self, run: ServiceRun) -> None:
        self.run = run

    @property
    def path(self) -> str:
        armed = self.run.armed
        return armed.reader.path if armed is not None else f"uprobes of {self.run.source.said}"

    @property
    def calls(self) -> int:
        return self.run.calls

    def read(self, max_records: int | None = None) -> np.ndarray:
        self.run.poll()
        return self.run.take()

    def stats(self) -> dict:
        armed = self.run.armed
        return armed.reader.stats() if armed is not None else {"calls": 0}

    def close(self) -> None:
        return None


def _comm(host: Host, pid: int) -> str:
    return (host.read(host.proc(pid, "comm")).value or "?").strip()


def _runtime_files(host: Host, pid: int, src: Service) -> frozenset | None:
    """The (dev, inode, path) of the libraries of ``src``'s function that process ``pid``
    maps (the runtime's, or --attach-symbol's LIB), or None when it maps none (yet)."""
    from agent.trace.attach import RUNTIMES, AttachError, exec_mappings
    try:
        maps = exec_mappings(host, pid)
    except AttachError:
        return None
    if src.symbol is not None:
        lib = src.symbol.partition(":")[0]
        files = {(m.dev, m.inode, m.path) for m in maps
                 if m.name == lib or m.name.startswith(lib) or m.path == lib}
    else:
        libs = [r.library for r in RUNTIMES if src.runtime in ("auto", r.name)]
        files = {(m.dev, m.inode, m.path) for m in maps
                 if any(r.search(m.name) for r in libs)}
    return frozenset(files) or None


SOURCE = Service
