"""NUMA remote memory: numa_miss / other_node / numa_foreign rising in the window (the numa
collector's per-node counters, /proc/vmstat's host-wide ones)."""

from __future__ import annotations

import math

from agent.watch.attribution.spike import CauseScore, Context

EXCESS_MIN, Z_MIN = 10, 4  # remote allocations over the baseline's, and z
SLOPE, MAX = 0.2, 0.6  # strength: SLOPE × log10(excess), at most MAX


def numa_remote(ctx: Context) -> CauseScore | None:
    ev, s = {}, 0.0
    for rname, names in (("numa", None), ("memory", ["mem.all.numa_miss",
                                                     "mem.all.numa_foreign"])):
        v = ctx.views.get(rname)
        if v is None:
            continue
        for name in names or v.names(suffixes=(".numa_miss", ".other_node", ".numa_foreign")):
            w = v.counter(name)
            if w is not None and w.excess >= EXCESS_MIN and w.z >= Z_MIN:
                ev[name] = w.to_dict()
                s = max(s, min(MAX, SLOPE * math.log10(w.excess)))
    return CauseScore("numa_remote", s, detail="remote NUMA allocations in the window",
                      evidence=ev) if s else None
