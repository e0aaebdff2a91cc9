"""CPU contention: another task had the probe's CPU.

Evidence, strongest first: the sample's own run-queue wait (schedstat, measured in-process)
and its involuntary switches; for external sources, which measure neither, the thread's
run-queue wait and switches in the window's sched rows; failing those, a late wake-up while
other tasks took a good share of the CPU (:func:`late_wake_up`). The task that ran is named
from the sched collector's task scans.
"""

from __future__ import annotations

from agent.watch.attribution.spike import CauseScore, Context, wait_explains

RQ_MIN_NS = 50_000  # a measured run-queue wait this long counts
RQ_BASE, RQ_MAX = 0.3, 0.95  # its strength: RQ_BASE + wait / excess, at most RQ_MAX
SWITCH_EXPLAINS = 0.7  # an involuntary switch whose wait explains the excess (or unmeasured)
SWITCH_BRIEF = 0.4  # one that got the CPU back within a small part of the excess
# External sources: the thread's run-queue wait summed over the window's rows, when it is at
# least WINDOW_RQ_SHARE of the excess and WINDOW_RQ_MIN_NS: WINDOW_RQ_BASE + WINDOW_RQ_SLOPE ×
# wait / excess, at most WINDOW_RQ_MAX.
WINDOW_RQ_SHARE, WINDOW_RQ_MIN_NS = 0.3, 100_000
WINDOW_RQ_BASE, WINDOW_RQ_SLOPE, WINDOW_RQ_MAX = 0.3, 0.6, 0.85
WINDOW_SWITCHES = 0.55  # involuntary switches of the thread in the window's rows
# ...whose run-queue wait, summed over those rows (every call's in them: a bound on the
# spike's own), is under WINDOW_RQ_SHARE of the excess: they got the CPU back within a small
# part of it, and name no cause (under rules.MIN_STRENGTH). A service stopped by SIGSTOP for
# 3 ms every 25 ms has ~19 of them a 0.4 s row (the sender's wake-ups on its CPU) and 0.2 ms
# of wait: not contention (its exact stories say stopped).
WINDOW_SWITCHES_BRIEF = 0.25
# A late wake-up: at least LATE_MIN_NS and LATE_SHARE of the excess off the CPU and off the
# run queue, while others took at least LATE_OTHERS_MIN of the CPU: LATE_BASE + LATE_SLOPE ×
# their share, at most LATE_MAX (below a measured wait or switch).
LATE_MIN_NS, LATE_SHARE, LATE_OTHERS_MIN = 200_000, 0.5, 0.2
LATE_BASE, LATE_SLOPE, LATE_MAX = 0.3, 0.5, 0.7
WHO_RAN_SHOWN = 3  # tasks named in the evidence


def contention(ctx: Context) -> CauseScore | None:
    sp, views, cpus = ctx.spike, ctx.views, ctx.call_cpus
    s = 0.0
    ev: dict = {}
    details = []
    if sp.rq_delay_ns >= 0:
        ev["rq_delay_us"] = round(sp.rq_delay_ns / 1e3, 1)
        if sp.rq_delay_ns >= RQ_MIN_NS:
            s = max(s, min(RQ_MAX, RQ_BASE + sp.rq_delay_ns / sp.excess_ns))
            details.append(f"waited {sp.rq_delay_ns / 1e3:.0f} µs on the run queue")
    if sp.nivcsw > 0:
        ev["nivcsw"] = sp.nivcsw
        # A switch is strong evidence when its wait (measured in-process) is a good part
        # of the excess, or when the wait was not measured; a switch that got the CPU
        # back within a small part of the excess explains little of the sample.
        s = max(s, SWITCH_EXPLAINS if wait_explains(sp) is not False else SWITCH_BRIEF)
        details.append(f"{sp.nivcsw} involuntary context switch(es)")
    v = views.get("sched")
    if v is not None:
        # (the window: the sampler rows over the call, 50 ms to 0.4 s of every call's waits)
        where = f"in the window's {1e3 * v.win_dt:.0f} ms of rows" if v.win_dt > 0 else \
            "in the window"
        rq = v.counter(f"sched.{sp.tid}.rq_delay_ns")
        waited = rq.window if rq is not None and rq.window == rq.window else None
        if waited is not None:
            ev["thread_rq_delay_window_us"] = round(waited / 1e3, 1)
            # Scored only without the sample's own run-queue delay (external sources):
            # the window's rows (50 ms for the built-in probes) sum many calls' ordinary
            # wake-up waits, which the sample's own figure leaves out.
            if sp.rq_delay_ns < 0 and waited >= WINDOW_RQ_SHARE * sp.excess_ns and \
                    waited >= WINDOW_RQ_MIN_NS:
                s = max(s, min(WINDOW_RQ_MAX,
                               WINDOW_RQ_BASE + WINDOW_RQ_SLOPE * waited / sp.excess_ns))
                details.append(f"thread waited {waited / 1e3:.0f} µs on the run queue {where}")
        nv = v.counter(f"sched.{sp.tid}.nivcsw")
        if nv is not None and nv.window > 0 and sp.nivcsw < 0:
            ev["thread_nivcsw_window"] = nv.window
            brief = waited is not None and waited < WINDOW_RQ_SHARE * sp.excess_ns
            s = max(s, WINDOW_SWITCHES_BRIEF if brief else WINDOW_SWITCHES)
            details.append(f"{nv.window:.0f} involuntary switch(es) {where}" +
                           (f" (their wait: {waited / 1e3:.0f} µs)" if brief else ""))
    if s <= 0:
        s = late_wake_up(ctx, ev, details)
    if s <= 0:
        return None
    if ctx.who_ran is not None:
        runs = ctx.who_ran(sp.start_ns - 1, sp.end_ns + 1, cpus)
        if runs:
            ev["ran_on_cpu"] = [{"comm": r.comm, "pid": r.pid, "tid": r.tid, "cpu": r.cpu,
                                 "run_us": round(r.run_ns / 1e3)} for r in runs[:WHO_RAN_SHOWN]]
            top = runs[0]
            details.append(f"{top.comm} (pid {top.pid}) ran on CPU {top.cpu}")
    return CauseScore("cpu_contention", s, detail="; ".join(details), evidence=ev)


def late_wake_up(ctx: Context, ev: dict, details: list) -> float:
    """A built-in probe's sample that lost most of its excess neither on the CPU nor on the
    run queue as schedstat counts it, without blocking, switching or queueing behind the
    previous call — it woke late — while other tasks took a good share of its CPU:
    contention whose wait schedstat missed. Seen under an always-busy nice-0 hog with the
    EEVDF scheduler (Linux 6.6+): wake-ups ~4 ms late (one slice), rq_delay 0 (16-57 % of
    its hog spikes were left unexplained before). An IRQ or steal found in the window
    outranks it."""
    sp = ctx.spike
    off = sp.off_cpu_ns
    if ctx.others_share is None or off < LATE_MIN_NS or off < LATE_SHARE * sp.excess_ns or \
            sp.queued_behind >= 0 or sp.nvcsw != 0 or sp.nivcsw != 0 or sp.majflt > 0:
        return 0.0
    share = ctx.others_share(sp.start_ns - 1, sp.end_ns + 1, ctx.call_cpus)
    if share is None or share < LATE_OTHERS_MIN:
        return 0.0
    ev["off_cpu_us"] = round(off / 1e3, 1)
    ev["others_cpu_share"] = round(share, 3)
    details.append(f"lost {off / 1e3:.1f} ms neither running nor counted on the run queue "
                   f"(a late wake-up) while other tasks took {100 * share:.0f} % of the CPU")
    return min(LATE_MAX, LATE_BASE + LATE_SLOPE * share)
