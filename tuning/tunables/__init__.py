"""Tunables, in the order apply runs them (rollback runs the journal in reverse).

Ordering constraints, written next to the list as pyperf does:
- governor before EPP and min_freq: on intel_pstate a governor change resets EPP and limits;
- turbo before min_freq: turning turbo off lowers scaling_max_freq, the floor we copy;
- irqbalance before any IRQ move: it would move them back;
- default_smp_affinity before existing IRQs: an IRQ requested in between lands off target;
- isolate: tasks, then workqueues, then cgroups, then cpuset settings: a v2 partition takes
  its CPUs from other cgroups' tasks itself, so tasks are journalled with their own masks
  first and rollback dissolves the partition before restoring them; a cgroup's files exist
  only once the cgroup does (apply journals a tunable's targets before its first write).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from tuning.tunables.base import (
    MANUAL,
    PENDING_REBOOT,
    WRITE,
    Change,
    FileWriter,
    GpuControl,
    ServiceManager,
    Tunable,
    TuneContext,
    TuneError,
)
from tuning.tunables.boot import BootIsolation
from tuning.tunables.cpu import CpuIdle, Epb, Epp, Governor, MinFreq, PstateMinPerf, Turbo
from tuning.tunables.gpu import GpuComputeMode, GpuPersistence
from tuning.tunables.irq import DefaultIrqAffinity, IrqAffinity, Irqbalance
from tuning.tunables.isolate import IsolateCgroup, IsolateCpuset, IsolateTasks, IsolateWorkqueue
from tuning.tunables.memory import (
    Ksm,
    NmiWatchdog,
    NumaBalancing,
    PerfEventParanoid,
    SchedRtRuntime,
    StatInterval,
    Swappiness,
    ThpDefrag,
    ThpEnabled,
    TimerMigration,
)
from tuning.tunables.pmqos import PmQosResumeLatency

ORDER: tuple[type[Tunable], ...] = (
    Governor, Turbo, PstateMinPerf, MinFreq, Epp, Epb, CpuIdle, PmQosResumeLatency,
    ThpEnabled, ThpDefrag, Ksm, Swappiness, NumaBalancing, TimerMigration, StatInterval,
    NmiWatchdog, SchedRtRuntime, PerfEventParanoid,
    Irqbalance, DefaultIrqAffinity, IrqAffinity,
    IsolateTasks, IsolateWorkqueue, IsolateCgroup, IsolateCpuset,
    GpuPersistence, GpuComputeMode,
    BootIsolation,
)


def all_tunables() -> list[Tunable]:
    """Fresh instances in apply order (built on demand: nothing happens at import)."""
    return [cls() for cls in ORDER]


def by_id() -> dict[str, Tunable]:
    return {t.id: t for t in all_tunables()}


def fixing(finding_id: str) -> list[str]:
    """The ids of the tunables that fix audit finding ``finding_id`` (``tune apply --only``
    takes them), in apply order; [] when no tunable does (swap, SMT, boot arguments)."""
    return [t.id for t in all_tunables()
            if any(fnmatchcase(finding_id, p) for p in t.audit_ids or (t.id,))]


__all__ = [
    "MANUAL", "PENDING_REBOOT", "WRITE", "Change", "FileWriter", "GpuControl", "ORDER",
    "ServiceManager", "Tunable", "TuneContext", "TuneError", "all_tunables", "by_id",
    "fixing",
]
