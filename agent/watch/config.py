"""What one ``hftagent watch`` run is asked to do (:class:`WatchConfig`), and where its parts
run (:func:`cpu_plan`: the probe CPUs and the housekeeping CPUs the sampler and the loop use).

:func:`cpu_plan` is kept a small function of its own so that the target-CPU resolver of
:mod:`tuning.targets` (one default and one housekeeping rule for every command) can replace
it without touching the session.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from agent.errors import AgentError


@dataclass
class WatchConfig:
    probe: str = "tf"  # tf | numpy | external | attach (--attach PID: uprobes, agent/trace)
    model: str = "lstm"
    variant: str = "xla"
    rate_hz: float = 500.0  # 0: auto (the probe worker picks it after its warm-up)
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

    # TRANSITIONAL, to be removed when agent/watch/session.py passes cfg.threshold_ns and
    # cfg.flight_ns: it still reads these two names and hands them to SpikeDetector and
    # FlightRecorder, which take ns. They hold ns, not µs: nothing else may read them.
    threshold_us = property(lambda self: self.threshold_ns)
    flight_us = property(lambda self: self.flight_ns)


def cpu_plan(online: list[int], probe_cpus: list[int] | None,
             housekeeping: list[int] | None) -> tuple[list[int], list[int]]:
    """(probe CPUs, housekeeping CPUs). Default: the probe on the last online CPU, everything
    else housekeeping; on a 1-CPU box both share CPU 0 (said in the warnings)."""
    if not online:
        online = sorted(os.sched_getaffinity(0))
    probe = sorted(probe_cpus) if probe_cpus else [online[-1]]
    bad = [c for c in probe if c not in online]
    if bad:
        raise AgentError(f"probe CPU(s) {bad} (--cpus) not online (online: {online})")
    if housekeeping:
        hk = sorted(housekeeping)
        bad = [c for c in hk if c not in online]
        if bad:
            raise AgentError(f"housekeeping CPU(s) {bad} (--housekeeping) not online (online: "
                             f"{online})")
        if set(hk) & set(probe):
            raise AgentError(f"--housekeeping CPUs {hk} overlap the probe CPUs {probe}: the "
                             "sampler must never run on the probe's CPUs")
    else:
        hk = [c for c in online if c not in probe] or list(probe)
    return probe, hk
