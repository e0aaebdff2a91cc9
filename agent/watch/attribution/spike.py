"""What the engine scores and returns: one slow sample (:class:`Spike`), one cause's score
(:class:`CauseScore`), the ranked result (:class:`Attribution`), and what a cause family's
rule sees for one spike (:class:`Context`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from agent.watch.attribution.window import RingView

# A run-queue wait measured in-process explains a sample when it is at least this long and
# this share of its excess over P50 (wait_explains).
WAIT_MIN_NS = 50_000
WAIT_SHARE = 0.3


@dataclass
class Spike:
    """One slow sample. Evidence fields are -1 when not measured (external clients)."""

    seq: int
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    p50_ns: int
    nivcsw: int = -1
    nvcsw: int = -1
    minflt: int = -1
    majflt: int = -1
    cpu_ns: int = -1
    rq_delay_ns: int = -1
    cpu_start: int = -1
    cpu_end: int = -1
    # seq of the slow sample of the same thread still running at this one's intended start
    # (open loop: this one waited for it), -1 when none
    queued_behind: int = -1

    @property
    def latency_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def excess_ns(self) -> int:
        return max(1, self.latency_ns - self.p50_ns)

    @property
    def off_cpu_ns(self) -> int:
        """Wall time neither on the CPU (the thread's CPU time as the kernel counts it) nor
        waiting on its run queue as schedstat counts it; -1 when not measured (external
        sources)."""
        if self.cpu_ns < 0 or self.rq_delay_ns < 0:
            return -1
        return max(0, self.latency_ns - self.cpu_ns - self.rq_delay_ns)

    def in_process(self) -> dict:
        keys = ("nivcsw", "nvcsw", "minflt", "majflt", "cpu_ns", "rq_delay_ns", "cpu_start",
                "cpu_end")
        out = {k: getattr(self, k) for k in keys if getattr(self, k) >= 0}
        if self.off_cpu_ns >= 0:
            # Sleeping (nvcsw), waiting behind the previous call, a late wake-up, interrupt
            # time, or a stopped vCPU (the hypervisor's steal): the lead for a spike that the
            # switches and run-queue figures do not explain.
            out["off_cpu_us"] = round(self.off_cpu_ns / 1e3, 1)
        return out


def wait_explains(sp: Spike) -> bool | None:
    """Whether the sample's run-queue wait explains a good part (≥ WAIT_SHARE) of its excess
    over P50; None when the wait was not measured (then: whether it was switched out)."""
    if sp.rq_delay_ns < 0:
        return True if sp.nivcsw > 0 else None
    return sp.rq_delay_ns >= WAIT_MIN_NS and sp.rq_delay_ns >= WAIT_SHARE * sp.excess_ns


@dataclass
class CauseScore:
    cause: str
    strength: float
    score: float = 0.0
    detail: str = ""
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"cause": self.cause, "score": round(self.score, 3),
                "strength": round(self.strength, 3), "detail": self.detail,
                "evidence": self.evidence}


@dataclass
class Attribution:
    cause: str
    causes: list[CauseScore]
    unexplained: float
    in_process: dict

    def to_dict(self) -> dict:
        return {"cause": self.cause, "unexplained": round(self.unexplained, 3),
                "causes": [c.to_dict() for c in self.causes], "in_process": self.in_process}


@dataclass
class Context:
    """What one cause family's rule sees for one spike (built by the
    :class:`~agent.watch.attribution.engine.Attributor`)."""

    spike: Spike
    views: dict[str, RingView]  # collector name → its rows around the spike vs baseline
    cpus: set[int]  # the probe CPUs and any the sample started or ended on
    probe_cpus: list[int]
    recent: np.ndarray | None  # in-process evidence of recent normal samples
    recent_stat: Callable[[int], tuple[float, float]]  # (median, MAD) of one recent column
    who_ran: Callable | None = None  # SchedCollector.who_ran(t0, t1, cpus)
    others_share: Callable | None = None  # SchedCollector.others_share(t0, t1, cpus)
    irq_desc: Callable | None = None  # IRQ row → /proc/interrupts text after the counts
    gpu_detail: Callable | None = None  # GpuCollector.causes(t0, t1)
    slack_ns: int = 0  # the window is [start − slack, end + slack]

    @property
    def call_cpus(self) -> set[int]:
        """The CPUs the call itself ran on: where it started and ended when the source says
        (the built-in probes, an attached process's uprobes), else the probe CPUs. Another
        CPU's counters never name a call that did not run there: a thread of a service on
        CPU 14 is not slowed by a steal tick or a LOC burst on CPU 1, where its process's
        other threads run (issue #35)."""
        own = {c for c in (self.spike.cpu_start, self.spike.cpu_end) if c >= 0}
        return own or set(self.probe_cpus)


# The in-process baseline's columns, in order (agent/watch/session.py builds it from these
# fields of the latest RECENT_EVIDENCE samples): minor and major faults, involuntary and
# voluntary switches, the call's CPU time, the CPU it ended on.
RECENT_FIELDS = ("minflt", "majflt", "nivcsw", "nvcsw", "cpu_ns", "cpu_end")
RECENT_CPU_COL = RECENT_FIELDS.index("cpu_ns")
RECENT_CPU_END_COL = RECENT_FIELDS.index("cpu_end")


def slow_own_call(ctx: Context, ratio: float) -> float | None:
    """The recent samples' median CPU time where the spike's call ran ``ratio`` × it or more,
    else None (and None without a CPU column: an external source's baseline). The first test
    of the after-effect rules (memory.py after page-ins, migration.py after a move)."""
    sp, recent = ctx.spike, ctx.recent
    if sp.cpu_ns <= 0 or recent is None or recent.ndim != 2 or \
            recent.shape[1] <= RECENT_CPU_COL or not len(recent):
        return None
    med, _ = ctx.recent_stat(RECENT_CPU_COL)
    return med if med > 0 and sp.cpu_ns >= ratio * med else None
