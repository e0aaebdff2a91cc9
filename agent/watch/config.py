"""What one ``hftagent watch`` run is asked to do (:class:`WatchConfig`: built and checked once
from the options by agent/watch/options.py), and where its parts run (:func:`plan_cpus`: the
probe CPUs and the housekeeping CPUs the sampler and the loop use, decided by the one
target-CPU rule of :mod:`tuning.targets`).

Units: every duration inside is ns (``threshold_ns``, ``flight_ns``) or s where the loop
sleeps (``duration_s``, ``loop_s``), converted once from the options' µs when they are parsed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from agent.errors import AgentError
from collectors.host import Host


@dataclass
class WatchConfig:
    probe: str = "tf"  # tf | numpy | external | attach (--attach PID: uprobes, agent/trace)
    model: str = "lstm"
    variant: str = "xla"
    rate_hz: float = 500.0  # 0: auto (the probe worker picks it after its warm-up)
    rate_auto: bool = False  # --rate auto (rate_hz then holds the worker's choice once it runs)
    probe_cpus: list[int] = field(default_factory=list)
    housekeeping_cpus: list[int] = field(default_factory=list)
    pid: int | None = None
    ring_path: str | None = None
    # --attach PID (probe "attach"): the runtime whose once-per-call function is timed
    # (agent.trace.attach.NAMES), or LIB:SYMBOL for any other function; return probes on
    # such a function only with unsafe_return (a C++ exception unwinding through a
    # uretprobe'd frame aborts the process)
    attach_runtime: str = "auto"
    attach_symbol: str | None = None
    unsafe_return: bool = False
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
    warmup: int = 200
    loop_s: float = 0.05
    max_attributions_per_s: float = 200.0  # the token bucket (agent/watch/schedule.py)
    sampler: str = "auto"  # auto | native | python (agent/watch/sampling/)
    ring_dir: str | None = None  # where the probe's ring goes (default agent.client.ring_dir)
    # kernel events (agent/trace): auto (where tracefs is usable), on (else an
    # error), off, mount (mount tracefs when it is not mounted); the kernel ring's seconds
    trace: str = "auto"
    trace_buffer_s: float = 10.0
    # one interrupt's cost to the probe, hidden parts included (agent/trace/irqcost.py):
    # auto (measured before watch's own probe starts), off, or a cost in µs
    irq_cost: str = "auto"
    # watch's own threads and sampler helper (agent/watch/priority.py): 0 leaves them as is
    nice: int = 0



def plan_cpus(host: Host, probe: str, cpus: str | None = None,
              housekeeping: str | None = None, pid: int | None = None
              ) -> tuple[list[int], list[int]]:
    """(probe CPUs, housekeeping CPUs) of a watch run, by the one target rule
    (:func:`tuning.targets.resolve`; ``cpus`` and ``housekeeping``: the options' CPU lists,
    checked there as audit, tune and run check ``--cpus``).

    Probe CPUs: ``--cpus``; else, for a process (``--pid``, ``--attach``), the CPUs it may run
    on (an external process that may run anywhere: the last target CPU, keeping one free);
    else for a ring alone (``--ring``) every target CPU, and for the built-in probe the last
    target CPU. Housekeeping: ``--housekeeping``, else the rule's housekeeping CPUs — never
    another target CPU —, else every other online CPU; a box with one CPU shares it (the
    session warns). AgentError with one line when a list is bad or the two overlap."""
    from tuning.targets import TargetError, resolve
    try:
        rule = resolve(host)
        given = resolve(host, cpus).cpus if cpus is not None else None
    except TargetError as exc:
        raise AgentError(str(exc)) from None
    online = rule.online
    probe_cpus = given
    if given is None and probe in ("external", "attach"):
        probe_cpus = _process_cpus(pid, online)
        if probe == "external" and housekeeping is None and probe_cpus == online:
            probe_cpus = [rule.cpus[-1]]  # a process that may run anywhere: keep one free
    if not probe_cpus:
        probe_cpus = list(rule.cpus) if probe == "external" else [rule.cpus[-1]]
    if housekeeping is None:
        hk = [c for c in rule.housekeeping if c not in probe_cpus] or \
            [c for c in online if c not in probe_cpus] or list(probe_cpus)
        return probe_cpus, hk
    try:
        hk = resolve(host, housekeeping).cpus
    except TargetError as exc:
        raise AgentError(str(exc).replace("--cpus", "--housekeeping", 1)) from None
    if set(hk) & set(probe_cpus):
        raise AgentError(f"--housekeeping CPUs {hk} overlap the probe CPUs {probe_cpus}: the "
                         "sampler must never run on the probe's CPUs")
    return probe_cpus, hk


def _process_cpus(pid: int | None, online: list[int]) -> list[int] | None:
    """The online CPUs process ``pid`` may run on (its affinity); None when unknown."""
    if pid is None:
        return None
    try:
        return [c for c in sorted(os.sched_getaffinity(pid)) if c in online] or None
    except OSError:
        return None
