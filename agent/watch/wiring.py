"""Which host collectors a watch run samples, and at what rates (:func:`build_collectors`);
the attributor over their rings (:func:`attributor_for`).

The probe CPUs' cpu, sched, irq, softirq, memory, numa and pcie collectors; perf with
``--perf``; the GPU collector where :mod:`collectors.gpu` can start (NVML); plus any the
caller adds. A collector whose ``available()`` says no (or raises) is left out and listed in
``unavailable`` with its reason (the summary's "unsupported collectors").

With kernel events on the probe CPUs (``--trace``, :attr:`SpikeEvents.active`: the source
opens in ``WatchSession.start()`` before the sampler is built), what the events see directly
is polled less (:func:`reduce_for_events`): /proc/interrupts, /proc/softirqs, /proc/stat,
the memory counters, the watched threads' schedstat and the task scans a spike asks for. Not to zero: the polled
rules still decide where a window is incomplete or the events decide nothing, and they need
their baselines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.watch.config import WatchConfig
from collectors.host import Host

# ~20 Hz (every 5th round at 100 Hz): with a busy Hopper GPU one GpuCollector.sample() took
# 309 µs median / 1.16 ms P99, 4.95 % of one CPU at 100 Hz (docs/gpu-validation.md); GPU
# clocks and throttle reasons change on a ms-to-s scale, and a throttle that lasts 50 ms
# still shows in the window + slack of the spikes it causes.
GPU_PERIOD_S = 0.05
# The built-in probes time each call with its own run-queue delay, switches and faults
# (in-process evidence), so their threads' schedstat at 100 Hz would only repeat it: 20 Hz
# there (each cold /proc read after a wake-up costs 30-50 µs on a VM). An external process's
# records carry none: every round. (Each source says which: its ``sched_period_s``,
# agent/watch/latency/; with kernel events it is EVENTS_SCHED_PERIOD_S.)
SCHED_PERIOD_BUILTIN_S = 0.05

# Polled less where the kernel events cover it (reduce_for_events). /proc/interrupts (the
# costliest hot file: ~60 µs a read plus parsing on a 2-CPU VM): 20 → 5 Hz. Its rows then
# often come after a spike is attributed (Sampler.covered_ns waits for ≤ 50 ms collectors
# only, so records are not held back): the events name the IRQ; /proc/stat's irq time and
# the later spikes of a burst keep the polled rule. /proc/softirqs: every round → 20 Hz,
# still waited for (a softirq flood that loses events — ring overwritten, window
# incomplete — keeps its polled verdict). The task scan a spike asks for: ≥ 0.1 s → ≥ 2 s
# apart, and records no longer wait for one (the events name the task that ran); the
# periodic scan every 10 s, not 2 (EVENTS_SCAN_PERIOD_S). An external process's threads'
# schedstat (its run-queue delay, every round without events): 20 Hz, as for the built-in
# probes, since the events' switches and wake-ups of those threads time each wait exactly.
# Every other hot source (/proc/stat, /proc/softirqs, the watched threads' schedstat) at 5 Hz,
# so the native helper makes 5 rounds a second, not 20 (issue #38: its procfs reads were
# ~0.45 % of one CPU at 20 rounds/s, ~0.2 % at 10, beside an attached LiteRT service on a
# 2-vCPU Linux 6.18 guest): with the events on, the polled rows are the fallback (a window
# incomplete, a spike the CPU budget skips) and the spike's own window still has them: a
# spike waits for the round after it (Sampler.covered_ns), and where that round is not
# there when the spike is seen, the helper is asked for it (NativeSampler.ask_round), so
# the record is not later than at 10 rounds a second. (Past watch's CPU budget, 2.5 rounds a
# second and none asked: NativeSampler.slow, agent/watch/session.py.)
EVENTS_IRQ_PERIOD_S = 0.2
EVENTS_SOFTIRQ_PERIOD_S = 0.2
EVENTS_POLL_PERIOD_S = 0.2
# The memory counters (/proc/vmstat: ~170 counters the kernel sums over every CPU per read,
# and PSI) at 2 Hz where the events run: the call's own page faults are in its timeline
# (exceptions:page_fault_user, followed from its first call), so the counters are context
# for the polled memory rule, whose window of rows covers a 0.4 s round anyway.
EVENTS_MEMORY_PERIOD_S = 0.4  # (a multiple of the 0.2 s rounds)
EVENTS_SCHED_PERIOD_S = 0.2
# (2 s, not 0.5: a scan costs ~3.3 ms of CPU with ~190 tasks on 16 CPUs, and a storm whose
# spikes the budget skips asked for one every 0.5 s: ~0.7 % of one CPU, issue #38)
EVENTS_MIN_SCAN_GAP_S = 2.0
# The periodic task scan (every 2 s without events: others_share's and who_ran's intervals
# between a spike's scans) every 10 s where the events run: they name the task that ran on
# the probe CPUs to the µs, so a scan's rows serve only a spike the CPU budget skips, which
# asks for its own scan (≥ EVENTS_MIN_SCAN_GAP_S apart: a storm's later spikes get 2 s
# intervals) where the budget's floor pays for exact attribution less often than that
# (session.py _scan_for_spike). A scan reads every task's stat: ~1.5 ms of CPU with ~150
# tasks, ~3.3 ms with ~190 and 16 CPUs (Linux 6.18), 0.07-0.16 % of one CPU at one every 2 s
# (issue #38).
EVENTS_SCAN_PERIOD_S = 10.0
IRQ_DESC_S = 5.0  # the IRQ device names re-read this often whatever the irq rate
# "0": poll as without events even when they run (the before/after A/B of the reduction:
# bench/events_reduce_ab.py); anything else or unset: reduce.
REDUCE_ENV = "HFTAGENT_EVENTS_REDUCE"


@dataclass
class Collectors:
    """The collectors that can run, the sched and irq ones among them (the attributor asks
    them who ran and what an IRQ is), and why the others cannot."""

    active: list
    sched: object
    irq: object
    unavailable: dict[str, str] = field(default_factory=dict)
    # what the kernel events made slower: {source: {"what", "from_hz", "to_hz"}}
    reduced_by_events: dict[str, dict] = field(default_factory=dict)


def build_collectors(cfg: WatchConfig, host: Host, gpu_host: Host,
                     extra: list | None = None, *, pid: int | None = None,
                     events: bool = False) -> Collectors:
    """``host``: what the collectors read through; ``gpu_host``: the GPU collector's. (The
    native reader registers the hot sources' files itself: agent/watch/sampling/native/.)
    ``pid``: the process the source times in (the running source's); ``events``: kernel
    events run on the probe CPUs (:func:`reduce_for_events`). The watched threads'
    schedstat is read at the source's ``sched_period_s``."""
    from agent.watch.sampling.sources.cpu import CpuCollector
    from agent.watch.sampling.sources.irq import IrqCollector
    from agent.watch.sampling.sources.memory import MemoryCollector
    from agent.watch.sampling.sources.numa import NumaCollector
    from agent.watch.sampling.sources.sched import SchedCollector
    from agent.watch.sampling.sources.softirq import SoftirqCollector
    from collectors.pcie import PcieCollector
    cpus = cfg.probe_cpus
    # (no pid: a ring alone, a service's changing processes: the task scans still run)
    pids = [pid] if pid is not None else []
    sched = SchedCollector(host, pids, cpus, period_s=cfg.source.sched_period_s)
    irq = IrqCollector(host, cpus)
    cands = [CpuCollector(host, cpus), sched, irq, SoftirqCollector(host, cpus),
             MemoryCollector(host), NumaCollector(host, cpus), PcieCollector(host)]
    if cfg.perf:
        from collectors.perf import PerfCollector
        cands.append(PerfCollector(pid))
    cands.extend(gpu_collectors(gpu_host, pids))
    cands.extend(extra or [])
    out = Collectors([], sched, irq)
    for c in cands:
        try:
            a = c.available()
        except Exception as exc:  # noqa: BLE001 - an adapter bug is "unavailable"
            a = None
            out.unavailable[c.name] = f"error: {type(exc).__name__}: {exc}"
        if a is not None and a.ok:
            out.active.append(c)
        elif a is not None:
            out.unavailable[c.name] = a.reason or "unavailable"
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
    if events:
        out.reduced_by_events = reduce_for_events(out, cfg.sample_hz)
    return out


def _hz(period_s: float, sample_hz: float) -> float:
    return round(min(sample_hz, 1.0 / period_s) if period_s > 0 else sample_hz, 2)


def reduce_for_events(c: Collectors, sample_hz: float, env=None) -> dict[str, dict]:
    """Poll what the kernel events cover on the probe CPUs more slowly (module constants);
    before the sampler is built, which takes each collector's ``period_s`` then. Returns
    what changed, for the summary's ``sampler.reduced_by_events``; nothing where
    :data:`REDUCE_ENV` is "0" (``env``: os.environ by default)."""
    import os
    if (os.environ if env is None else env).get(REDUCE_ENV, "1").strip() == "0":
        return {}
    out: dict[str, dict] = {}
    active = {id(x) for x in c.active}

    def slower(name: str, col, what: str, period_s: float) -> None:
        if col is None or id(col) not in active or col.period_s >= period_s:
            return
        out[name] = {"what": what, "from_hz": _hz(col.period_s, sample_hz),
                     "to_hz": _hz(period_s, sample_hz)}
        col.period_s = period_s

    irq = c.irq
    slower("irq", irq, "/proc/interrupts rows of the probe CPUs", EVENTS_IRQ_PERIOD_S)
    for x in c.active:
        name = getattr(x, "name", "")
        if name == "cpu":
            slower(name, x, "/proc/stat rows of the probe CPUs", EVENTS_POLL_PERIOD_S)
        elif name == "memory":
            slower(name, x, "the memory counters", EVENTS_MEMORY_PERIOD_S)
        elif name == "numa":  # (never waited for: a round of its own would be 10 a second)
            slower(name, x, "numastat of the probe CPUs' nodes", EVENTS_POLL_PERIOD_S)
    if "irq" in out:
        irq.desc_every = max(1, round(IRQ_DESC_S / EVENTS_IRQ_PERIOD_S))
    soft = next((x for x in c.active if getattr(x, "name", "") == "softirq"), None)
    slower("softirq", soft, "/proc/softirqs rows of the probe CPUs", EVENTS_SOFTIRQ_PERIOD_S)
    sched = c.sched
    if sched is not None and id(sched) in active and \
            sched.period_s < EVENTS_SCHED_PERIOD_S:
        out["sched"] = {"what": "the watched threads' schedstat, stat and status",
                        "from_hz": _hz(sched.period_s, sample_hz),
                        "to_hz": _hz(EVENTS_SCHED_PERIOD_S, sample_hz)}
        sched.slow_to(EVENTS_SCHED_PERIOD_S)
    if sched is not None and id(sched) in active and \
            sched.min_scan_gap_s < EVENTS_MIN_SCAN_GAP_S:
        out["sched_scan"] = {"what": "task scans on spikes (who ran); records do not wait "
                             "for one", "from_hz": round(1.0 / sched.min_scan_gap_s, 2),
                             "to_hz": round(1.0 / EVENTS_MIN_SCAN_GAP_S, 2)}
        sched.min_scan_gap_s = EVENTS_MIN_SCAN_GAP_S
    if sched is not None and id(sched) in active and \
            sched.scan_period_s < EVENTS_SCAN_PERIOD_S:
        out["task_scan"] = {"what": "the periodic task scan (who ran; the budget's skipped "
                            "spikes ask for their own)",
                            "from_hz": round(1.0 / sched.scan_period_s, 2),
                            "to_hz": round(1.0 / EVENTS_SCAN_PERIOD_S, 2)}
        sched.scan_period_s = EVENTS_SCAN_PERIOD_S
    return out


def gpu_collectors(host: Host, own_pids: list[int]) -> list:
    """collectors.gpu's GpuCollector; one that cannot be built is left out (no GPU signals,
    as on a box without NVML)."""
    try:
        import importlib
        mod = importlib.import_module("collectors.gpu")
    except ImportError:
        return []
    cls = getattr(mod, "GpuCollector", None)
    if cls is None:
        return []
    try:
        c = cls(own_pids=own_pids, host=host)
    except Exception:  # noqa: BLE001 - a GPU adapter that cannot start is "unsupported"
        return []
    c.period_s = GPU_PERIOD_S
    return [c]


def attributor_for(cfg: WatchConfig, sampler, sched, irq):
    """The :class:`~agent.watch.attribution.Attributor` over ``sampler``'s rings: who ran and
    the others' share from ``sched``'s task scans, IRQ names from ``irq``, the foreign GPU
    processes from the GPU collector where one is sampled."""
    from agent.watch.attribution import Attributor
    from agent.watch.attribution.gpu import detail_for
    rings = {e.ring.name: e.ring for e in sampler.entries}
    gpu = next((e.collector for e in sampler.entries if hasattr(e.collector, "history") and
                getattr(e.collector, "name", "") == "gpu"), None)
    return Attributor(rings, cfg.probe_cpus, who_ran=sched.who_ran,
                      others_share=sched.others_share, irq_desc=lambda: irq.descriptions,
                      gpu_detail=detail_for(gpu) if gpu is not None else None,
                      baseline_s=cfg.baseline_s)
