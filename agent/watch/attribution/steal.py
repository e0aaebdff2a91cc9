"""Hypervisor steal: the vCPU the probe runs on was not running (/proc/stat's steal column
on the probe CPUs, in USER_HZ ticks)."""

from __future__ import annotations

from agent.watch.attribution.spike import CauseScore, Context

Z_MIN = 2  # a window's steal counts when z ≥ Z_MIN over its baseline, or steal is new
BASE, PER_TICK, MAX = 0.4, 0.2, 0.8  # strength: BASE + PER_TICK × ticks, at most MAX


def steal(ctx: Context) -> CauseScore | None:
    v = ctx.views.get("cpu")
    if v is None:
        return None
    best = None
    for c in ctx.cpus:
        w = v.counter(f"cpu.{c}.steal_ticks")
        if w is not None and w.window >= 1 and (w.z >= Z_MIN or w.base_rate == 0):
            if best is None or w.window > best.window:
                best = w
    if best is None:
        return None
    s = min(MAX, BASE + PER_TICK * best.window)
    cpu = best.name.split(".")[1]
    return CauseScore("steal", s, detail=f"{best.window:.0f} steal tick(s) on CPU {cpu} "
                      "in the window", evidence={best.name: best.to_dict()})
