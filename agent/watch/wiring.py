"""Which host collectors a watch run samples, and at what rates (:func:`build_collectors`);
the attributor over their rings (:func:`attributor_for`).

The probe CPUs' cpu, sched, irq, softirq, memory, numa and pcie collectors; perf with
``--perf``; the GPU collector where :mod:`collectors.gpu` can start (NVML); plus any the
caller adds. A collector whose ``available()`` says no (or raises) is left out and listed in
``unavailable`` with its reason (the summary's "unsupported collectors").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.watch.config import WatchConfig
from collectors.host import Host

# ~20 Hz (every 5th round at 100 Hz): on an H200 under load one GpuCollector.sample() took
# 309 µs median / 1.16 ms P99, 4.95 % of one CPU at 100 Hz (docs/gpu-validation.md); GPU
# clocks and throttle reasons change on a ms-to-s scale, and a throttle that lasts 50 ms
# still shows in the window + slack of the spikes it causes.
GPU_PERIOD_S = 0.05
# The built-in probes time each call with its own run-queue delay, switches and faults
# (in-process evidence), so their threads' schedstat at 100 Hz would only repeat it: 20 Hz
# there (each cold /proc read after a wake-up costs 30-50 µs on a VM). An external process's
# records carry none: every round.
SCHED_PERIOD_BUILTIN_S = 0.05


@dataclass
class Collectors:
    """The collectors that can run, the sched and irq ones among them (the attributor asks
    them who ran and what an IRQ is), and why the others cannot."""

    active: list
    sched: object
    irq: object
    unavailable: dict[str, str] = field(default_factory=dict)


def build_collectors(cfg: WatchConfig, host: Host, gpu_host: Host,
                     extra: list | None = None) -> Collectors:
    """``host``: what the collectors read through; ``gpu_host``: the GPU collector's. (The
    native reader registers the hot sources' files itself: agent/watch/sampling/native/.)"""
    from agent.watch.sampling.sources.cpu import CpuCollector
    from agent.watch.sampling.sources.irq import IrqCollector
    from agent.watch.sampling.sources.memory import MemoryCollector
    from agent.watch.sampling.sources.numa import NumaCollector
    from agent.watch.sampling.sources.sched import SchedCollector
    from agent.watch.sampling.sources.softirq import SoftirqCollector
    from collectors.pcie import PcieCollector
    cpus = cfg.probe_cpus
    sched = SchedCollector(host, [cfg.pid], cpus,
                           period_s=0.0 if cfg.probe == "external" else SCHED_PERIOD_BUILTIN_S)
    irq = IrqCollector(host, cpus)
    cands = [CpuCollector(host, cpus), sched, irq, SoftirqCollector(host, cpus),
             MemoryCollector(host), NumaCollector(host, cpus), PcieCollector(host)]
    if cfg.perf:
        from collectors.perf import PerfCollector
        cands.append(PerfCollector(cfg.pid))
    cands.extend(gpu_collectors(gpu_host, [cfg.pid]))
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
