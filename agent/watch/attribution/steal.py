"""Hypervisor steal: the vCPU the call ran on was not running (/proc/stat's steal column of
that CPU, in USER_HZ ticks).

The kernel keeps steal per CPU in ns (``kcpustat_cpu(cpu).cpustat[CPUTIME_STEAL]``, from the
paravirt steal clock) and /proc/stat prints it truncated to whole USER_HZ ticks (10 ms at
100 Hz; fs/proc/stat.c ``nsec_to_clock_t``, Linux 4.11+); no mainline kernel (6.18
included) exposes the ns figure to user space. So a window's delta of k ticks means more
than (k − 1) and less than (k + 1) ticks were stolen: one tick may be 0.01 ms of steal that
crossed a boundary (:func:`collectors.system.steal_bounds`). Steal is named only from k ≥
2 ticks (a lower bound above 0), and only on the CPU the call ran on
(:attr:`~.spike.Context.call_cpus`): one tick in a 2 ms call's window, or a tick on another
CPU of the process, never names it. Where the call's timeline is complete, the time hidden
from the thread while it was on the CPU decides instead (events.py, verdict.py).
"""

from __future__ import annotations

from agent.watch.attribution.irq import CLK_TCK
from agent.watch.attribution.spike import CauseScore, Context

Z_MIN = 2  # a window's steal counts when z ≥ Z_MIN over its baseline, or steal is new
MIN_TICKS = 2  # ticks in the window: the lowest count whose stolen time is above 0
BASE, PER_TICK, MAX = 0.4, 0.2, 0.8  # strength: BASE + PER_TICK × (ticks − 1), at most MAX


def steal(ctx: Context) -> CauseScore | None:
    v = ctx.views.get("cpu")
    if v is None:
        return None
    best = None
    for c in sorted(ctx.call_cpus):
        w = v.counter(f"cpu.{c}.steal_ticks")
        if w is not None and w.window >= MIN_TICKS and (w.z >= Z_MIN or w.base_rate == 0):
            if best is None or w.window > best.window:
                best = w
    if best is None:
        return None
    ticks = int(best.window)
    tick_ms = 1000 / CLK_TCK
    s = min(MAX, BASE + PER_TICK * (ticks - 1))
    cpu = best.name.split(".")[1]
    return CauseScore(
        "steal", s, detail=f"{ticks} steal ticks on CPU {cpu} in the window: at least "
        f"{(ticks - 1) * tick_ms:.0f} ms stolen", evidence={
            best.name: best.to_dict(),
            "stolen_ms": [(ticks - 1) * tick_ms, (ticks + 1) * tick_ms]})
