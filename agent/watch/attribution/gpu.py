"""GPU causes on the probe's GPU(s): a clock-event (throttle) reason active in the window,
and foreign compute processes, named from the GPU collector's history
(:attr:`collectors.gpu.GpuCollector.history`: "GPU shared with PID 4242 (python3)").

Only the probe's GPU(s) count (the collector's ``gpu.N.probe_gpu``, 0 on a GPU the probe has
no context on): a foreign process or a throttle on another GPU is not ours. The rules over
the collector's samples (:func:`gpu_causes`, :func:`causes_for_windows`, :class:`GpuCause`)
live here, not in the collector (collectors are parsers and adapters only).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.watch.attribution.spike import CauseScore, Context
from collectors.gpu import GpuProcess, GpuSample
from collectors.nvml import decode_clock_event_reasons, harmful_clock_event_reasons

# NVML clock-event reason bits (nvmlClocksEventReason*): idle (0x1) and application-clock
# setting (0x2) are not throttles.
GPU_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
               0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
               0x100: "display_clocks"}
THROTTLE = 0.7  # a throttle reason active on the probe's GPU in the window
FOREIGN = 0.6  # another process's compute context on the probe's GPU


def _foreign(ctx: Context, gpu: str) -> list[tuple[str, dict]]:
    """Names of the foreign processes on ``gpu`` around the spike, from the collector."""
    if ctx.gpu_detail is None:
        return []
    sp = ctx.spike
    try:
        causes = ctx.gpu_detail(sp.start_ns - ctx.slack_ns, sp.end_ns + ctx.slack_ns)
    except Exception:  # noqa: BLE001 - naming is a bonus; the count already attributes
        return []
    return [(c.cause, c.evidence) for c in causes if c.cause.startswith("GPU shared with")
            and str(c.gpu) == gpu]


def gpu(ctx: Context) -> list[CauseScore]:
    v = ctx.views.get("gpu")
    if v is None:
        return []
    out: list[CauseScore] = []
    for name in v.names("gpu."):
        if not name.endswith((".clock_event_reasons", ".foreign_processes")):
            continue
        scope = v.gauge(f"gpu.{name.split('.')[1]}.probe_gpu", low=False)
        if scope is not None and scope.window < 1:
            continue
        if name.endswith(".clock_event_reasons"):
            w = v.gauge(name, low=False)
            if w is None or w.window != w.window:
                continue
            bits = int(w.window)
            named = [n for b, n in GPU_REASONS.items() if bits & b]
            if named:
                out.append(CauseScore("gpu_throttle", THROTTLE,
                                      detail=f"GPU {name.split('.')[1]}: {', '.join(named)}",
                                      evidence={name: bits}))
        elif name.endswith(".foreign_processes"):
            w = v.gauge(name, low=False)
            if w is not None and w.window >= 1:
                g = name.split(".")[1]
                detail = f"{w.window:.0f} foreign compute process(es) on GPU {g}"
                ev: dict = {name: w.window}
                who = _foreign(ctx, g)
                if who:  # "GPU shared with PID 4242 (python3)"
                    detail = "; ".join(label for label, _ in who)
                    ev["processes"] = [e for _, e in who]
                out.append(CauseScore("gpu_foreign_process", FOREIGN, detail=detail,
                                      evidence=ev))
    return out


# -- the GPU collector's cause rules (over its history of samples) ----------------------------
def collector_causes(collector, t0_ns: int, t1_ns: int, baseline_s: float = 10.0) -> list:
    """GPU causes for one slow window [t0, t1] (monotonic ns) from ``collector``'s history
    (a :class:`~collectors.gpu.GpuCollector`); see :func:`causes_for_windows`."""
    return causes_for_windows(list(collector.history), [(t0_ns, t1_ns)], baseline_s)[0]


def detail_for(collector) -> Callable[[int, int], list]:
    """The attributor's ``gpu_detail(t0, t1)`` over ``collector``."""
    return lambda t0, t1: collector_causes(collector, t0, t1)


def causes_for_windows(history: Sequence[GpuSample], windows: Sequence[tuple[int, int]],
                       baseline_s: float = 10.0) -> list[list[GpuCause]]:
    """GPU causes for each slow window [t0, t1] (monotonic ns) against the samples of the
    ``baseline_s`` before it. ``history`` is time-ordered (the collector's). Each window is
    widened to the samples just around it: a 100 Hz sampler may have no sample strictly inside
    a 1 ms spike. Binary search per window, so thousands of spikes cost milliseconds."""
    times = [s.t_ns for s in history]
    out = []
    for t0, t1 in windows:
        lo = bisect.bisect_left(times, t0)
        hi = bisect.bisect_right(times, t1)
        a, b = max(0, lo - 1), min(len(history), hi + 1)
        base_lo = bisect.bisect_left(times, t0 - int(baseline_s * 1e9))
        out.append(gpu_causes(history[a:b], history[base_lo:a]))
    return out


@dataclass(frozen=True)
class GpuCause:
    """A named cause for a slow window: ``cause`` is the label attribution reports."""

    cause: str
    score: float  # 0..1, how strongly the evidence points here
    evidence: str
    gpu: int | None = None


def _gpus_in(samples: Sequence[GpuSample]) -> list[int]:
    out = set()
    for s in samples:
        for k in s.values:
            if k.startswith("gpu."):
                out.add(int(k.split(".")[1]))
    return sorted(out)


def not_probe_gpu(samples: Sequence[GpuSample], gpu: int) -> bool:
    """True when ``samples`` say GPU ``gpu`` is not the probe's: every ``gpu.N.probe_gpu``
    that was read is 0. Unread or absent everywhere (unknown) is False: nothing rules it out."""
    known = [v for s in samples if (v := s.values.get(f"gpu.{gpu}.probe_gpu")) is not None]
    return bool(known) and max(known) < 1


def _delta(samples: Sequence[GpuSample], key: str) -> float | None:
    vals = [s.values.get(key) for s in samples if s.values.get(key) is not None]
    if len(vals) < 2:
        return None
    return vals[-1] - vals[0]


def gpu_causes(window: Sequence[GpuSample], baseline: Sequence[GpuSample] = ()) -> list[GpuCause]:
    """Map GPU evidence in a slow window to named causes (pure: samples in, causes out).

    * "GPU throttle (HW slowdown, ...)" -- a harmful clock-event bit in the window (idle and
      sync boost are not), or a power/thermal violation counter that grew across it.
    * "GPU shared with PID 4242 (python3)" -- a foreign compute process on the GPU in the
      window; scored higher when it was not there in the baseline (it just arrived).
    * "PCIe replay / errors" -- the replay counter or volatile uncorrected ECC grew.
    Only the probe's GPUs count: a GPU whose ``probe_gpu`` reads 0 in every sample of the
    window that has it (see GpuCollector) is skipped, so a foreign process on GPU 1 is never
    blamed for a slow inference on GPU 0. Samples without the column (unknown) are not
    skipped. Causes are sorted by score, highest first.
    """
    causes: list[GpuCause] = []
    base_foreign: set[tuple[int, int]] = {(g, p.pid) for s in baseline for g, ps in s.foreign.items()
                                          for p in ps}
    for g in _gpus_in(window):
        if not_probe_gpu(window, g):
            continue
        p = f"gpu.{g}."
        # throttle
        mask = 0
        for s in window:
            v = s.values.get(p + "clock_event_reasons")
            if v is not None:
                mask |= int(v)
        named = harmful_clock_event_reasons(mask)
        grew = [pol for pol in ("power", "thermal")
                if (_delta(window, f"{p}violation_{pol}_ns_total") or 0) > 0]
        if named or grew:
            label = ", ".join(named) if named else " / ".join(f"{x} violation" for x in grew)
            ev = f"gpu {g}: clocks_event_reasons 0x{mask:x} ({', '.join(decode_clock_event_reasons(mask))})"
            if grew:
                ev += "; violation counters grew: " + ", ".join(grew)
            causes.append(GpuCause(f"GPU throttle ({label})", 0.9 if named else 0.6, ev, g))
        # foreign processes
        seen: dict[int, GpuProcess] = {}
        for s in window:
            for proc in s.foreign.get(g, []):
                seen[proc.pid] = proc
        for pid, proc in sorted(seen.items()):
            new = (g, pid) not in base_foreign
            mem = ("" if proc.used_memory_bytes is None
                   else f", {proc.used_memory_bytes / 2**20:.0f} MiB")
            causes.append(GpuCause(
                f"GPU shared with PID {pid} ({proc.name or 'unknown'})", 0.85 if new else 0.5,
                f"gpu {g}: compute process {pid} ({proc.name or '?'}{mem}) "
                f"{'appeared in' if new else 'present before and during'} the window "
                "(nvmlDeviceGetComputeRunningProcesses)", g))
        # PCIe replay / ECC
        replay = _delta(window, p + "pcie_replay_total")
        ecc = _delta(window, p + "ecc_uncorrected_volatile_total")
        if (replay or 0) > 0 or (ecc or 0) > 0:
            parts = []
            if replay:
                parts.append(f"PCIe replays +{replay:.0f}")
            if ecc:
                parts.append(f"uncorrected ECC +{ecc:.0f}")
            causes.append(GpuCause("PCIe replay / errors", 0.7, f"gpu {g}: " + ", ".join(parts), g))
    causes.sort(key=lambda c: -c.score)
    return causes
