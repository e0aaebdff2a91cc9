"""Hardware IRQs and softirqs on the probe CPU(s).

Each class's best named row (``irq.<cpu>.<row>``, ``softirq.<cpu>.<ROW>``: its count's
excess over its baseline) is weighed by the *time* the class took on that CPU in the window
(/proc/stat's irq and softirq columns, :func:`irq_time`): a softirq flood that eats 10 % of
the CPU outranks a burst of a few disk interrupts that cost almost nothing, whatever their
counts. The IRQ is named by its actions in /proc/interrupts
(:func:`collectors.irq.action_names`: every device of a shared line).
"""

from __future__ import annotations

import math
import os

from agent.watch.attribution.spike import CauseScore, Context, Spike, wait_explains
from agent.watch.attribution.window import SignalWindow, rnd
from collectors.irq import action_names

# Interrupt and softirq rows that follow scheduling activity itself (a busy CPU takes timer
# ticks, preemption sends rescheduling IPIs): weak evidence of their own, so that a CPU hog
# is not blamed on the timer tick it causes.
HOUSEKEEPING_ROWS = frozenset({"LOC", "RES", "CAL", "TLB", "IWI", "TIMER", "SCHED", "RCU",
                               "HRTIMER", "NMI", "PMI", "HYP", "PIN", "NPI", "PIW", "SPU"})
HOUSEKEEPING_WEIGHT = 0.3

# A row counts when its window is z ≥ ROW_Z_MIN over its baseline and ROW_EXCESS_MIN events
# over what the baseline rate predicts; its strength grows with the log of the excess (in
# units of ROW_EXCESS_UNIT events): ROW_SLOPE × log2(1 + excess / unit), at most ROW_MAX.
ROW_Z_MIN, ROW_EXCESS_MIN = 3, 5
ROW_EXCESS_UNIT, ROW_SLOPE, ROW_MAX = 5, 0.2, 0.85
# The class's time on the CPU rose ("hot") by at least HOT_SHARE_MIN of the window and a
# whole tick: TIME_BASE + TIME_SLOPE × that share (plus TIME_BONUS with a named row), at most
# TIMED_MAX with a named row, TIME_ONLY_MAX without one.
HOT_SHARE_MIN, HOT_TICKS_MIN = 0.02, 1
TIME_BASE, TIME_SLOPE, TIME_BONUS = 0.35, 2.5, 0.1
TIMED_MAX, TIME_ONLY_MAX = 0.95, 0.8
# A named row whose class's time is accounted and did not rise, while the other class's did.
COLD_FACTOR = 0.5
# A switch explains the sample better than the interrupts around it; slow while never
# leaving the CPU: interrupted.
SWITCHED_FACTOR = 0.5
STAYED_FACTOR, STAYED_MAX = 1.2, 0.95
EVIDENCE_ROWS = 5  # named rows kept in the evidence, largest excess first

# USER_HZ: the unit of /proc/stat's time columns.
try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    CLK_TCK = 100


def _other(fam: str) -> str:
    return "softirq" if fam == "irq" else "irq"


def irq_time(views, cpus) -> dict[str, dict[int, dict]]:
    """Per-CPU hardirq and softirq *time* in the window from /proc/stat's irq/softirq
    columns (USER_HZ ticks): {"irq"|"softirq": {cpu: {"share", "excess_share", "ticks"}}}. A
    class whose column stayed 0 over the whole baseline and window is not accounted by this
    kernel (hardirq time needs CONFIG_IRQ_TIME_ACCOUNTING; the timer tick alone would show):
    it is left out — unknown, not 0."""
    v = views.get("cpu")
    out: dict[str, dict[int, dict]] = {"irq": {}, "softirq": {}}
    if v is None or v.win_dt <= 0:
        return out
    for fam in ("irq", "softirq"):
        for c in cpus:
            name = f"cpu.{c}.{fam}_ticks"
            w = v.counter(name)
            if w is None or w.window != w.window:
                continue
            if not v.base_sum(name) + w.window > 0:
                continue  # never moved: not accounted here
            tick_s = 1.0 / CLK_TCK
            out[fam][c] = {"share": w.window * tick_s / v.win_dt,
                           "excess_share": max(0.0, w.excess) * tick_s / v.win_dt,
                           "ticks": w.window, "baseline_ticks_per_s": w.base_rate}
    return out


def interrupts(ctx: Context) -> CauseScore | None:
    sp, views, cpus = ctx.spike, ctx.views, ctx.call_cpus
    best: dict[str, tuple[float, SignalWindow | None, str]] = {
        "irq": (0.0, None, ""), "softirq": (0.0, None, "")}
    ev: dict = {}
    for ring_name, fam in (("irq", "irq"), ("softirq", "softirq")):
        v = views.get(ring_name)
        if v is None:
            continue
        for c in cpus:
            for w in v.hot(f"{fam}.{c}.", ROW_Z_MIN, ROW_EXCESS_MIN):
                name = w.name
                row = name.rsplit(".", 1)[1]
                st = min(ROW_MAX, ROW_SLOPE * math.log2(1 + w.excess / ROW_EXCESS_UNIT))
                if row in HOUSEKEEPING_ROWS:
                    st *= HOUSEKEEPING_WEIGHT
                ev[name] = w.to_dict()
                if st > best[fam][0]:
                    best[fam] = (st, w, row)
    times = irq_time(views, cpus)
    hot = {fam: {c: x for c, x in times[fam].items()
                 if x["excess_share"] >= HOT_SHARE_MIN and x["ticks"] >= HOT_TICKS_MIN}
           for fam in times}
    cand: dict[str, tuple[float, str]] = {}
    for fam in ("irq", "softirq"):
        st, w, row = best[fam]
        for c, x in times[fam].items():
            ev[f"cpu.{c}.{fam}_time"] = {"share": rnd(x["share"]),
                                         "excess_share": rnd(x["excess_share"]),
                                         "ticks": rnd(x["ticks"])}
        if w is not None:
            cpu = int(w.name.split(".")[1])
            detail = (f"{irq_label(ctx, w, row)} on CPU {cpu}: +{w.excess:.0f} over "
                      f"baseline in the window (z={w.z:.1f})")
            x = hot[fam].get(cpu)
            if x is not None:
                # Measured time on that CPU: the class did cost the probe CPU time.
                st = min(TIMED_MAX, max(st, TIME_BASE + TIME_SLOPE * x["excess_share"])
                         + TIME_BONUS)
                detail += f"; {fam} time {100 * x['share']:.0f} % of CPU {cpu}"
            elif cpu in times[fam] and hot[_other(fam)]:
                # Its time is accounted and did not rise, while the other class's did.
                st *= COLD_FACTOR
            cand[fam] = (st, detail)
        elif hot[fam]:
            # Time without a named row over its threshold: still that class, by time.
            c, x = max(hot[fam].items(), key=lambda kv: kv[1]["excess_share"])
            cand[fam] = (min(TIME_ONLY_MAX, TIME_BASE + TIME_SLOPE * x["excess_share"]),
                         f"{fam} time {100 * x['share']:.0f} % of CPU {c} in the window")
    if not cand:
        return None
    fam, (s, detail) = max(cand.items(), key=lambda kv: kv[1][0])
    if s <= 0:
        return None
    s = _switch_weight(sp, s)
    named = sorted(((k, x) for k, x in ev.items() if "excess" in x),
                   key=lambda kv: -(kv[1]["excess"] or 0))[:EVIDENCE_ROWS]
    ev = {**dict(named), **{k: x for k, x in ev.items() if k.endswith("_time")}}
    other = cand.get(_other(fam))
    if other is not None:
        ev["runner_up"] = {"cause": _other(fam), "strength": rnd(other[0]),
                           "detail": other[1]}
    return CauseScore(fam, s, detail=detail, evidence=ev)


def _switch_weight(sp: Spike, s: float) -> float:
    if wait_explains(sp):
        return s * SWITCHED_FACTOR  # a switch explains the sample better than the interrupts
    if sp.nivcsw == 0:
        return min(STAYED_MAX, s * STAYED_FACTOR)  # slow while never leaving the CPU
    return s


def irq_label(ctx: Context, w: SignalWindow, row: str) -> str:
    """"softirq NET_RX", "IRQ 38 (ehci_hcd:usb1,mmc0)" (every action of the line), or the
    row itself (LOC, an IRQ without a description or without an action)."""
    if w.name.startswith("softirq."):
        return f"softirq {row}"
    if ctx.irq_desc is not None and row.isdigit():
        d = (ctx.irq_desc() or {}).get(row)
        if d:
            names = action_names(d)
            return f"IRQ {row} ({names})" if names else f"IRQ {row}"
    return row
