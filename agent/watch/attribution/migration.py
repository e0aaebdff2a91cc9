"""Migration: the sample moved between CPUs during the call, ran outside the probe's CPUs,
or (external sources) its thread was seen on several CPUs in the window; perf's
cpu-migrations where ``--perf`` runs; or the call ran far over its usual CPU time on one
CPU while the probe's recent samples ran on another (the move's after-effect: a core whose
caches and TLB hold none of the probe's working set)."""

from __future__ import annotations

import numpy as np

from agent.watch.attribution.spike import RECENT_CPU_END_COL, CauseScore, Context, slow_own_call

MOVED_IN_CALL = 0.85  # started and ended on different CPUs (in-process)
OUTSIDE_PROBE_CPUS = 0.8  # ran (partly) outside the CPUs the probe is placed on
THREAD_CPUS_IN_WINDOW = 0.6  # the sched rows saw the thread on more than one CPU
PERF_MIGRATIONS, PERF_Z_MIN = 0.5, 3  # perf cpu-migrations in the window, z ≥ PERF_Z_MIN
AFTER_MOVE = 0.6  # no move in the call, but far over its usual CPU time after recent moves
AFTER_MOVE_CPU_RATIO = 2.0  # ... this many times the recent samples' median CPU time


def migration(ctx: Context) -> CauseScore | None:
    sp, views, probe_cpus = ctx.spike, ctx.views, ctx.probe_cpus
    s, ev, details = 0.0, {}, []
    seen_cpus = {c for c in (sp.cpu_start, sp.cpu_end) if c >= 0}
    outside = sorted(seen_cpus - set(probe_cpus)) if probe_cpus else []
    if sp.cpu_start >= 0 and sp.cpu_end >= 0 and sp.cpu_start != sp.cpu_end:
        s = MOVED_IN_CALL
        ev["cpu_start"], ev["cpu_end"] = sp.cpu_start, sp.cpu_end
        details.append(f"moved from CPU {sp.cpu_start} to CPU {sp.cpu_end} during the call")
    if outside:
        # The sample ran (partly) outside the CPUs the probe is placed on: its affinity
        # was changed or it was migrated. Whatever it met there (a busy housekeeping CPU,
        # a cold cache) is a consequence of the move.
        s = max(s, OUTSIDE_PROBE_CPUS)
        ev["outside_probe_cpus"] = outside
        details.append(f"ran on CPU {','.join(map(str, outside))}, outside its CPUs "
                       f"{','.join(map(str, probe_cpus))}")
    v = views.get("sched")
    if v is not None and sp.cpu_start < 0:
        i = v.ring.cols.get(f"sched.{sp.tid}.cpu")
        if i is not None and len(v.win):
            vals = v.ring.data[v.win, i]
            prev = v.ring.data[v.base[-1:], i] if len(v.base) else np.empty(0)
            seen = set(np.concatenate([prev, vals])[~np.isnan(np.concatenate([prev, vals]))]
                       .astype(int).tolist())
            if len(seen) > 1:
                s = max(s, THREAD_CPUS_IN_WINDOW)
                ev["thread_cpus_in_window"] = sorted(seen)
                details.append(f"thread ran on CPUs {sorted(seen)} in the window")
    if s == 0:
        s, after = _after_move(ctx)
        if after:
            ev["after_move"] = after
            details.append(
                f"ran {sp.cpu_ns / 1e6:.1f} ms on the CPU (usual "
                f"{after['cpu_median_us'] / 1e3:.1f} ms) on CPU {sp.cpu_start}, after "
                f"{after['recent_elsewhere']} of the probe's last {after['recent_samples']} "
                "samples ran on other CPUs: it came to a core with cold caches")
    p = views.get("perf")
    if p is not None:
        w = p.counter(f"perf.{sp.pid}.cpu_migrations_total")
        if w is not None and w.window > 0 and w.z >= PERF_Z_MIN:
            ev[w.name] = w.to_dict()
            s = max(s, PERF_MIGRATIONS)
            details.append(f"perf: {w.window:.0f} cpu-migrations in the window")
    return CauseScore("migration", s, detail="; ".join(details), evidence=ev) if s else None


def _after_move(ctx: Context) -> tuple[float, dict | None]:
    """(AFTER_MOVE, evidence) when the call stayed on one CPU, ran AFTER_MOVE_CPU_RATIO×
    the recent samples' median CPU time or more, and some of the probe's recent samples
    ended on another CPU; (0, None) otherwise (a probe that stays on its CPU, a baseline
    without the CPU columns). Seen on a 16-vCPU KVM guest (kernel 6.18) under the kit's affinity flips: calls
    that ran 1.5-1.8 ms of CPU (usual 0.6-0.9) with nothing else on the CPU, on the CPU the
    probe had just come back to."""
    sp, recent = ctx.spike, ctx.recent
    if sp.cpu_start < 0 or sp.cpu_end != sp.cpu_start:
        return 0.0, None
    cpu_med = slow_own_call(ctx, AFTER_MOVE_CPU_RATIO)
    if cpu_med is None or recent.shape[1] <= RECENT_CPU_END_COL:
        return 0.0, None
    ends = recent[:, RECENT_CPU_END_COL]
    ends = ends[~np.isnan(ends) & (ends >= 0)]
    elsewhere = int((ends != sp.cpu_start).sum())
    if elsewhere <= 0:
        return 0.0, None
    return AFTER_MOVE, {"cpu_us": round(sp.cpu_ns / 1e3, 1),
                        "cpu_median_us": round(cpu_med / 1e3, 1),
                        "recent_elsewhere": elsewhere, "recent_samples": int(len(ends))}
