"""CPU frequency drop and thermal throttling on the probe CPUs (cpufreq's scaling_cur_freq,
the thermal_throttle counters)."""

from __future__ import annotations

from agent.watch.attribution.spike import CauseScore, Context

DROP_MIN = 0.1  # the window's lowest frequency this share under its baseline median
DROP_BASE, DROP_MAX = 0.4, 0.85  # strength: DROP_BASE + the drop's share, at most DROP_MAX
THROTTLE = 0.7  # a core or package thermal throttle event in the window


def frequency(ctx: Context) -> CauseScore | None:
    v = ctx.views.get("cpu")
    if v is None:
        return None
    s, ev, detail = 0.0, {}, ""
    for c in ctx.cpus:
        f = v.gauge(f"cpu.{c}.freq_hz", low=True)
        if f is not None and f.base_rate == f.base_rate and f.base_rate > 0:
            drop = 1 - f.window / f.base_rate
            if drop >= DROP_MIN:
                ev[f.name] = {"window_min_hz": f.window, "baseline_hz": f.base_rate}
                if DROP_BASE + drop > s:
                    s = min(DROP_MAX, DROP_BASE + drop)
                    detail = (f"CPU {c} at {f.window / 1e6:.0f} MHz vs "
                              f"{f.base_rate / 1e6:.0f} MHz baseline")
        for kind in ("core", "package"):
            t = v.counter(f"cpu.{c}.{kind}_throttle_total")
            if t is not None and t.window > 0:
                ev[t.name] = t.to_dict()
                if s < THROTTLE:
                    s, detail = THROTTLE, f"{kind} thermal throttle on CPU {c}"
    return CauseScore("freq_drop", s, detail=detail, evidence=ev) if s > 0 else None
