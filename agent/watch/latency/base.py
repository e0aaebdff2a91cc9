"""The one small interface of a latency source (:mod:`agent.watch.latency`).

:class:`Source`: a source as the options chose it, frozen (a subclass is a frozen dataclass
of its settings): how the options name it (``NAMES``, ``named``, ``said``), its own options
checked once (``build``) and refused when another source is chosen (``refuse``); the CPUs it
runs on, by the one target rule (``cpus``, :func:`process_cpus` for a process's); what the
rest of watch asks of it instead of its kind (``queueing``, ``idle_until_start``,
``sched_period_s``, ``exporter_label``, ``exporter_variant``, ``history``); and ``open()``,
one run's :class:`Running` side.

:class:`Running`: ``start(events, phase)``, the stream of timed calls (``reader.read()``:
rows of :data:`agent.client.FIELDS`), ``check()`` (why it is gone, or None), ``summary()`` and
``end_warnings()`` (its own summary lines), ``stop()`` and ``close()``. What a run learns
(the worker's pid, the rate ``--rate auto`` chose) is kept here, never written back into the
config.
"""

from __future__ import annotations

import os
import select
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from collectors.host import Host

Phase = Callable[[str], None]


@dataclass(frozen=True)
class Given:
    """The latency-source options of ``hftagent watch`` as given (None: not given);
    ``rate_hz`` parsed (0.0: ``--rate auto``)."""

    probe: str | None = None
    model: str | None = None
    variant: str | None = None
    rate_hz: float = 0.0
    pid: int | None = None
    ring: str | None = None
    attach: int | None = None
    attach_runtime: str | None = None
    attach_symbol: str | None = None
    unsafe_return: bool = False
    attach_unsafe_library: bool = False
    attach_name: str | None = None
    attach_unit: str | None = None
    attach_cgroup: str | None = None
    gpu_probes: str | None = None


class Source(ABC):
    """A latency source as chosen (module docstring). Subclasses are frozen dataclasses."""

    RANK: ClassVar[int] = 50            # :func:`~agent.watch.latency.choose` asks in this order
    DEFAULT: ClassVar[bool] = False     # chosen when no source is named
    NAMES: ClassVar[tuple[str, ...]] = ()  # the --probe values that name it
    # a call can queue behind the previous slow one (an open-loop schedule: detect.py's
    # "queued behind"); the CPUs are idle until start() (the interrupt cost is measured then);
    # the watched threads' schedstat period (its calls carry their own run-queue delay: 20 Hz;
    # they carry none: every sampler round)
    queueing: ClassVar[bool] = False
    idle_until_start: ClassVar[bool] = False
    sched_period_s: ClassVar[float] = 0.05
    exporter_label: ClassVar[str] = "probe"  # hftagent_probe_info{source=...}: bounded

    @property
    @abstractmethod
    def kind(self) -> str:
        """The summary's ``source_kind`` and history's ``probe`` (a label, never compared)."""

    @property
    @abstractmethod
    def said(self) -> str:
        """How the options said it ("--probe numpy", "--attach"): for other sources' refusals."""

    @property
    def pid(self) -> int | None:
        """The process it watches when the options name one."""
        return None

    @property
    def exporter_variant(self) -> str:
        return ""

    @property
    def exporter_service(self) -> str:
        """The service it times, by the name the options gave (``--attach-name``,
        ``--attach-unit``, ``--attach-cgroup``; never a pid): the exporter's ``service``
        label, "" for none."""
        return ""

    def history(self) -> dict[str, Any]:
        """``record_watch``'s ``probe``, ``model`` and ``variant`` of a run of this source."""
        return {"probe": self.kind, "model": None, "variant": None}

    @classmethod
    @abstractmethod
    def named(cls, given: Given) -> bool:
        """Whether the options name this source."""

    @classmethod
    @abstractmethod
    def build(cls, host: Host, given: Given) -> Source:
        """This source of the options, each of its options checked (AgentError, one line)."""

    @classmethod
    def refuse(cls, given: Given, chosen: str) -> None:
        """AgentError when an option only this source takes is given while ``chosen`` (how
        the options said the chosen source) runs instead. (The built-in probe's --model,
        --attach's --attach-symbol: each source refuses its own.)"""
        return None

    @abstractmethod
    def cpus(self, host: Host, rule: Any, given: list[int] | None,
             keep_one_free: bool) -> list[int]:
        """The CPUs it runs on: ``given`` (--cpus) or by the rule (``rule``: the
        :class:`tuning.targets.TargetPlan`); ``keep_one_free``: no --housekeeping was given."""

    def cpu_notes(self, given: list[int] | None, cpus: list[int]) -> list[str]:
        """Warnings on the CPUs it was given (the summary's)."""
        return []

    @abstractmethod
    def open(self, host: Host, cpus: list[int], warnings: list[str]) -> Running:
        """One run's side (nothing starts before :meth:`Running.start`)."""


class Running(ABC):
    """One run of a source (module docstring). ``warnings``: the session's list."""

    unstarted = "the process"  # the summary's "source" of a run stopped before it started

    def __init__(self, source: Source, host: Host, cpus: list[int],
                 warnings: list[str]) -> None:
        self.source = source
        self.host = host
        self.cpus = list(cpus)
        self.warnings = warnings
        self.reader: Any = None  # read() → rows of agent.client.FIELDS; lost, invalid, path
        self.info: dict = {}     # what it is, once started ("probe": a description)
        self.pid: int | None = source.pid
        self.proc: Any = None    # a process watch started, when it started one

    @abstractmethod
    def start(self, events: Any, phase: Phase) -> None:
        """Start timing calls (``events``: the session's SpikeEvents; ``phase``: told each
        start-up phase). AgentError with one line when it cannot."""

    @abstractmethod
    def check(self) -> str | None:
        """Why the source is gone, or None while it lives."""

    def summary(self, lat: Any) -> dict[str, Any]:
        """Its own summary lines: what it is, its pid, its rate, its calls' CPU share
        (``lat``: the session's LatencyRing)."""
        return {"source": self.info.get("probe") or self.unstarted,
                "source_kind": self.source.kind, "pid": self.pid, "rate_hz": None,
                "rate_auto": False, "probe_calls_busy": None}

    def end_warnings(self, lat: Any, hist: Any, cpu_busy: float | None) -> list[str]:
        """Its warnings at the end of the run (the built-in probe's load)."""
        return []

    def arming(self) -> bool:
        """Whether the run waits for a process to time (one to start, or one seen whose
        runtime is not armed yet): its polls want the loop's regular steps, not the slower
        ones past watch's CPU budget (agent/watch/session.py). False by default."""
        return False

    def exit_code(self) -> int:
        """The run's exit status when nothing else failed: non-zero for a run that did not
        do its job (an attached process of which no call was timed); 0 by default."""
        return 0

    def stop(self) -> None:
        """Stop what it started (a worker, a ring it owns): nothing by default."""
        return None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def process_cpus(host: Host, pid: int, online: list[int] | None = None) -> list[int]:
    """The CPUs process ``pid``'s threads may run on (the union of their affinities; of
    ``online`` when given): the one rule for a watched process's CPUs."""
    cpus: set[int] = set()
    for t in host.listdir(host.proc(pid, "task")):
        if t.isdigit():
            try:
                cpus |= os.sched_getaffinity(int(t))
            except OSError:
                continue
    return sorted(c for c in cpus if online is None or c in online)


def process_alive(host: Host, pid: int) -> bool:
    """Whether process ``pid`` runs (kill(0); a zombie, which still answers it, is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    st = host.read(host.proc(pid, "stat")).value
    return not (st and st[st.rfind(")") + 2:st.rfind(")") + 3] in ("Z", "X"))


class ProcessLife:
    """Whether one process still runs, cheaply: its pidfd (Linux 5.3+, opened at the first
    check while it runs) polls readable once it has exited — one syscall where kill(0) and a
    read of /proc/PID/stat were four (~0.1 ms of CPU a check, issue #38) — and it names this
    process, never a later one given the pid. Without one (an older kernel, a --root tree's
    pid, which is not this system's): :func:`process_alive`. :meth:`close` closes it."""

    def __init__(self, host: Host, pid: int) -> None:
        self.host, self.pid = host, pid
        self._fd: int | None = None  # None: not opened yet; -1: none (process_alive)

    def alive(self) -> bool:
        if self._fd is None:
            self._fd = -1
            if process_alive(self.host, self.pid) and self.host.live:
                try:
                    self._fd = os.pidfd_open(self.pid)
                except (OSError, AttributeError):
                    pass
        if self._fd < 0:
            return process_alive(self.host, self.pid)
        return not select.select([self._fd], [], [], 0)[0]

    def close(self) -> None:
        """Close the pidfd (later checks: :func:`process_alive`)."""
        if self._fd is not None and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
