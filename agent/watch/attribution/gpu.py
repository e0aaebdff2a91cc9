"""GPU causes on the probe's GPU(s): a clock-event (throttle) reason active in the window,
and foreign compute processes, named by the GPU collector where it can
(:meth:`collectors.gpu.GpuCollector.causes`: "GPU shared with PID 4242 (python3)").

Only the probe's GPU(s) count (the collector's ``gpu.N.probe_gpu``, 0 on a GPU the probe has
no context on): a foreign process or a throttle on another GPU is not ours. The GPU
collector's own cause rules (:class:`collectors.gpu.GpuCause`,
:func:`collectors.gpu.causes_for_windows`) are to move here next (docs/design.md).
"""

from __future__ import annotations

from agent.watch.attribution.spike import CauseScore, Context

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
