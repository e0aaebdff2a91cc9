"""Page faults, reclaim and compaction: the sample's own faults (getrusage, in-process) and
whether it slept on them; a call far over its usual CPU time right after the probe's pages
came back (the page-ins' after-effect, see AFTER); for external sources the thread's faults
in the sched rows; the host's reclaim, compaction and THP fallbacks (/proc/vmstat) and
memory PSI. (A TLB shootdown of the probe's pages, which the kernel events see, is this
family's cause too: agent/watch/attribution/events.py.)"""

from __future__ import annotations

import math

from agent.watch.attribution.spike import CauseScore, Context, slow_own_call

MAJOR = 0.9  # a major fault in the call
BLOCKED = 0.9  # slept in the call while faulting: waited for its pages
# Faults over the probe's usual count: at least this many, and 5 robust sigmas (1.4826 × MAD).
BLOCKED_EXCESS_MIN, MINOR_EXCESS_MIN, SIGMAS = 4.0, 8.0, 5
# Minor faults alone: MINOR_BASE + MINOR_SLOPE × log2(excess / MINOR_EXCESS_MIN + 1), at most
# MINOR_MAX.
MINOR_BASE, MINOR_SLOPE, MINOR_MAX = 0.3, 0.15, 0.85
# External sources: the thread's faults in the window (count over baseline, strength), z ≥ 3.
THREAD_FAULTS = (("majflt", 1, 0.8), ("minflt", 16, 0.5))
HOST_Z_MIN = 3
HOST_BONUS, HOST_MAX = 0.05, 0.95  # host-wide reclaim next to the sample's own faults
HOST_ONLY = 0.3  # host-wide reclaim/compaction, not seen in-process
PSI_BASE, PSI_MAX = 0.3, 0.8  # PSI_BASE + the stall's share of the excess, at most PSI_MAX
# After-effect: the probe's pages came back (page-ins among its recent samples) and this
# call, with no fault of its own, ran AFTER_CPU_RATIO × its usual CPU time or more. Reclaimed
# memory comes back cold in the caches and TLB, and a reclaimed huge page comes back as
# small pages, so the call is slower with nothing else to see: on a 16-vCPU guest (6.18), 20
# consecutive calls of 4.0 ms CPU each (median 1.0 ms) right after the kit's first page-out
# wave, no event on the probe CPU but a tick (docs/benchmarks.md).
AFTER, AFTER_CPU_RATIO = 0.6, 2.0
HOST_COUNTERS = ("pgmajfault", "pgscan_direct", "allocstall_normal", "allocstall_movable",
                 "compact_stall", "thp_fault_fallback")


def page_faults(ctx: Context) -> CauseScore | None:
    sp, views = ctx.spike, ctx.views
    s, ev, details = 0.0, {}, []
    if sp.majflt > 0:
        s = MAJOR
        ev["majflt"] = sp.majflt
        details.append(f"{sp.majflt} major fault(s) in the call")
    if sp.minflt >= 0:
        med, mad = ctx.recent_stat(0)
        excess = sp.minflt - med
        # Slept in the call (voluntary switches over the probe's own usual count) while
        # faulting: the thread waited for its pages (swap-in, file read-in). Swap-in
        # readahead makes most of those faults minor (swap-cache hits), so minor faults
        # count here too.
        nv_med, _ = ctx.recent_stat(3)
        if sp.nvcsw > nv_med and sp.nvcsw > 0 and (
                sp.majflt > 0 or excess >= max(BLOCKED_EXCESS_MIN, SIGMAS * 1.4826 * mad)):
            s = max(s, BLOCKED)
            ev["blocked_in_call"] = sp.nvcsw
            details.append(f"slept {sp.nvcsw} time(s) in the call while faulting "
                           f"({sp.majflt} major, {sp.minflt} minor): waited for its pages")
        if excess >= max(MINOR_EXCESS_MIN, SIGMAS * 1.4826 * mad):
            st = min(MINOR_MAX, MINOR_BASE + MINOR_SLOPE * math.log2(excess / MINOR_EXCESS_MIN
                                                                    + 1))
            if st > s:
                s = st
            ev["minflt"] = sp.minflt
            ev["minflt_baseline_median"] = med
            details.append(f"{sp.minflt} minor faults in the call (baseline {med:.0f})")
    if s == 0:
        s, after = _after_faults(ctx)
        if after:
            ev["after_faults"] = after
            details.append(
                f"ran {sp.cpu_ns / 1e6:.1f} ms on the CPU (usual {after['cpu_median_us'] / 1e3:.1f}"
                f" ms) with no major fault of its own, after {after['recent_paged_samples']} of "
                f"the probe's last {after['recent_samples']} samples paged in: its memory came "
                "back slower (cold caches and TLB, huge pages split by reclaim)")
    v = views.get("sched")
    if v is not None and sp.minflt < 0:
        for k, thr, st in THREAD_FAULTS:
            w = v.counter(f"sched.{sp.tid}.{k}")
            if w is not None and w.excess >= thr and w.z >= HOST_Z_MIN:
                ev[w.name] = w.to_dict()
                s = max(s, st)
                details.append(f"thread {k}: +{w.excess:.0f} in the window")
    m = views.get("memory")
    if m is not None:
        for k in HOST_COUNTERS:
            w = m.counter(f"mem.all.{k}")
            if w is not None and w.excess >= 1 and w.z >= HOST_Z_MIN:
                ev[w.name] = w.to_dict()
                if s > 0:
                    s = min(HOST_MAX, s + HOST_BONUS)
                elif k != "pgmajfault":
                    s = max(s, HOST_ONLY)  # host-wide reclaim/compaction, not seen in-process
                details.append(f"{k} +{w.excess:.0f}")
        w = m.counter("psi.memory.some_us")
        if w is not None and w.window > 0 and w.z >= HOST_Z_MIN:
            ev[w.name] = w.to_dict()
            s = max(s, min(PSI_MAX, PSI_BASE + w.window * 1e3 / sp.excess_ns))
            details.append(f"memory PSI stall {w.window:.0f} µs")
    return CauseScore("page_faults", s, detail="; ".join(details), evidence=ev) if s else None


def _after_faults(ctx: Context) -> tuple[float, dict | None]:
    """(AFTER, evidence) when the call ran far over its usual CPU time with no major fault
    of its own while some of the probe's recent samples paged in (a major fault, or minor
    faults MINOR_EXCESS_MIN over the usual: swap-cache hits after readahead are minor);
    (0, None) otherwise."""
    sp, recent = ctx.spike, ctx.recent
    cpu_med = slow_own_call(ctx, AFTER_CPU_RATIO) if sp.majflt == 0 else None
    if cpu_med is None:
        return 0.0, None
    minflt_med, _ = ctx.recent_stat(0)
    paged = (recent[:, 1] > 0) | (recent[:, 0] >= minflt_med + MINOR_EXCESS_MIN)
    n_paged = int(paged.sum())
    if n_paged <= 0:
        return 0.0, None
    return AFTER, {"cpu_us": round(sp.cpu_ns / 1e3, 1), "cpu_median_us": round(cpu_med / 1e3, 1),
                   "recent_paged_samples": n_paged, "recent_majflt": int(recent[:, 1].sum()),
                   "recent_samples": int(len(recent))}
