"""What one ``hftagent watch`` run is asked to do (:class:`WatchConfig`: built and checked once
from the options by agent/watch/options.py, then frozen), and where its parts run
(:func:`plan`: the latency source's CPUs and the housekeeping CPUs the sampler and the loop
use, decided by the one target-CPU rule of :mod:`tuning.targets`).

Units: every duration inside is ns (``threshold_ns``, ``flight_ns``) or s where the loop
sleeps (``duration_s``, ``loop_s``), converted once from the options' µs when they are parsed.
What a run learns while it runs (the worker's pid, the rate ``--rate auto`` chose) is the
running source's (:mod:`agent.watch.latency`), never written back here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from agent.errors import AgentError
from agent.watch.latency import Source, default
from collectors.host import Host


@dataclass(frozen=True)
class WatchConfig:
    # the latency source, chosen once (agent.watch.latency.choose); its CPUs below
    source: Source = field(default_factory=default)
    probe_cpus: list[int] = field(default_factory=list)
    housekeeping_cpus: list[int] = field(default_factory=list)
    notes: tuple[str, ...] = ()  # what planning the CPUs had to say (the summary's warnings)
    sample_hz: float = 100.0
    # durations in ns, converted once from the options' µs (agent/watch/options.py)
    threshold_ns: int | None = None  # a sample over this is a spike (agent/watch/detect.py)
    k_p50: float = 3.0  # ... and so is one over k × the rolling P50
    min_samples: int = 200  # normal samples needed before k × P50 applies
    flight_ns: int | None = None  # a spike this long gets a flight record (flight.py)
    flight_dir: str = "hftagent-flight"
    flight_window_s: float = 1.0
    spike_log: str | None = None
    duration_s: float | None = None
    perf: bool = False
    baseline_s: float = 10.0
    loop_s: float = 0.05
    max_attributions_per_s: float = 200.0  # the token bucket (agent/watch/schedule.py)
    sampler: str = "auto"  # auto | native | python (agent/watch/sampling/)
    # kernel events (agent/trace): auto (where tracefs is usable), on (else an
    # error), off, mount (mount tracefs when it is not mounted); the kernel ring's seconds
    trace: str = "auto"
    trace_buffer_s: float = 10.0
    # one interrupt's cost to the probe, hidden parts included (agent/trace/irqcost.py):
    # auto (measured before watch's own probe starts), off, or a cost in µs
    irq_cost: str = "auto"
    # watch's own threads and sampler helper (agent/watch/priority.py): 0 leaves them as is
    nice: int = 0
    # watch's own CPU budget, a share of one CPU (--cpu-budget: 1 % → 0.01), which decides
    # each spike's exact attribution (agent/watch/budget.py); None: no budget (library use)
    cpu_budget: float | None = None
    # --attach: each call's cycles, instructions and on-CPU ns (agent/trace/pmu.py): auto
    # (where a hardware cycles counter opens), on (else exit 2), off
    pmu: str = "auto"


class CpuPlan(NamedTuple):
    probe: list[int]         # the latency source's CPUs
    housekeeping: list[int]  # the sampler's and watch's own
    notes: list[str]         # the source's warnings on the CPUs it was given


def plan(host: Host, source: Source, cpus: str | None = None,
         housekeeping: str | None = None) -> CpuPlan:
    """The CPUs of a watch run, by the one target rule (:func:`tuning.targets.resolve`;
    ``cpus`` and ``housekeeping``: the options' CPU lists, checked there as audit, tune and
    run check ``--cpus``).

    The source's CPUs: :meth:`Source.cpus` of ``--cpus`` and the rule (the built-in probe: the
    last target CPU; a process: the CPUs it may run on; a ring alone: every target CPU).
    Housekeeping: ``--housekeeping``, else the rule's housekeeping CPUs — never another
    target CPU —, else every other online CPU; a box with one CPU shares it (the session
    warns). AgentError with one line when a list is bad or the two overlap."""
    from tuning.targets import TargetError, resolve
    try:
        rule = resolve(host)
        given = resolve(host, cpus).cpus if cpus is not None else None
    except TargetError as exc:
        raise AgentError(str(exc)) from None
    probe_cpus = source.cpus(host, rule, given, keep_one_free=housekeeping is None)
    notes = source.cpu_notes(given, probe_cpus)
    if housekeeping is None:
        hk = [c for c in rule.housekeeping if c not in probe_cpus] or \
            [c for c in rule.online if c not in probe_cpus] or list(probe_cpus)
        return CpuPlan(probe_cpus, hk, notes)
    try:
        hk = resolve(host, housekeeping).cpus
    except TargetError as exc:
        raise AgentError(str(exc).replace("--cpus", "--housekeeping", 1)) from None
    if set(hk) & set(probe_cpus):
        raise AgentError(f"--housekeeping CPUs {hk} overlap the probe CPUs {probe_cpus}: the "
                         "sampler must never run on the probe's CPUs")
    return CpuPlan(probe_cpus, hk, notes)


def plan_cpus(host: Host, source: Source, cpus: str | None = None,
              housekeeping: str | None = None) -> tuple[list[int], list[int]]:
    """(source CPUs, housekeeping CPUs) of :func:`plan`."""
    p = plan(host, source, cpus, housekeeping)
    return p.probe, p.housekeeping
