"""Per-CPU noise figures and the ranking of candidate CPUs (pure: no host access).

A CPU's *noise* is the time a pinned busy loop lost to something else, in µs per second of
scan (``noise_us_per_s``), with the count of gaps per second and the gap sizes' P99 / P99.9 /
max. The quietest CPUs rank first; then the choice honours, in order:

1. never a CPU marked noisy (see :func:`noisy`);
2. one CPU per physical core: never both SMT siblings of a core unless asked
   (``allow_siblings``): a sibling's work slows its twin's pipeline;
3. the NUMA node of the GPU and NIC, when known: a CPU on the devices' node avoids a
   cross-socket hop on every H2D/D2H copy and every packet;
4. CPUs other processes are already pinned to come last (their work would land there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.probe import stats

# A CPU is noisy when its lost time is over NOISY_FACTOR x the quietest candidate's and over
# NOISY_FLOOR_US_PER_S (below that floor every CPU is quiet enough: the tick alone costs a few
# µs per second on a tickless-idle kernel and ~0.5 % on a VM whose timer exits to the host).
NOISY_FACTOR = 3.0
NOISY_FLOOR_US_PER_S = 200.0
# ... and whatever the others do, a CPU that lost over 5 % of its time is noisy (one candidate
# alone, or all of them loaded alike, must not pass for quiet). Quiet VM CPUs measured here
# lose 0.6-2.6 % (timer exits to the host); a CPU shared with a bursty task 37 %.
NOISY_CEILING_US_PER_S = 50_000.0
# "Quiet" is a comparison: with one candidate there is nothing to compare with, so a lone CPU
# is judged against absolute limits only: quiet at or under the floor, noisy over the
# ceiling, and between them "unranked" (not called quiet; still the only choice there is).
UNRANKED = "unranked"


@dataclass
class CpuNoise:
    """Figures of one CPU's scan."""

    cpu: int
    duration_s: float
    gaps: int
    sum_gap_ns: int
    max_gap_ns: int
    gap_ns: np.ndarray = field(repr=False)   # the kept gaps' lengths
    threshold_ns: int = 0
    min_gap_ns: int = 0
    dropped: int = 0                         # gaps counted but not kept (bounded memory)
    causes: dict[str, float] = field(default_factory=dict)  # per-second counts by source
    verdict: str = ""                        # quiet | noisy | unranked (set by :func:`judge`)
    basis: str = ""                          # what the verdict was judged against, in words
    error: str | None = None                 # scan failed here: why
    gap_start_ns: np.ndarray | None = field(default=None, repr=False)  # CLOCK_MONOTONIC
    t0_ns: int = 0                           # the recorder's loop, CLOCK_MONOTONIC
    t1_ns: int = 0
    causes_source: str = "proc"              # "events" when kernel events attributed it
    events: dict | None = None               # agent.noise.events.CpuEvents.result()
    irq_cost: dict | None = None             # agent.trace.irqcost.IrqCost.to_dict()

    def top_cause(self) -> tuple[str, float, str] | None:
        """(what, rate, unit) of the largest cause: µs/s from events, else count/s."""
        if self.events is not None:
            best = [(e["entity"], e["us_per_s"]) for e in self.events.get("events", [])[:1]]
            hw = self.events.get("hw_or_hypervisor_us_per_s") or 0.0
            if hw and (not best or hw > best[0][1]):
                best = [("hw_or_hypervisor", hw)]
            return (best[0][0], best[0][1], "µs/s") if best else None
        if self.causes:
            k, v = next(iter(self.causes.items()))
            return k, v, "/s"
        return None

    @property
    def gaps_per_s(self) -> float:
        return self.gaps / self.duration_s if self.duration_s else 0.0

    @property
    def noise_us_per_s(self) -> float:
        return self.sum_gap_ns / 1e3 / self.duration_s if self.duration_s else 0.0

    def gap_percentiles(self) -> dict[str, int | None]:
        if not self.gap_ns.size:
            return {"p99": None, "p999": None}
        p = stats.percentiles(self.gap_ns, (99.0, 99.9))
        return {"p99": p[99.0], "p999": p[99.9]}

    def to_dict(self) -> dict:
        p = self.gap_percentiles()
        return {"cpu": self.cpu, "duration_s": self.duration_s, "gaps": self.gaps,
                "gaps_per_s": round(self.gaps_per_s, 1),
                "noise_us_per_s": round(self.noise_us_per_s, 1),
                "p99_gap_ns": p["p99"], "p999_gap_ns": p["p999"], "max_gap_ns": self.max_gap_ns,
                "threshold_ns": self.threshold_ns, "min_gap_ns": self.min_gap_ns,
                "dropped": self.dropped, "causes": self.causes,
                "causes_source": self.causes_source, **(self.events or {}),
                "irq_cost": self.irq_cost, "verdict": self.verdict,
                "verdict_basis": self.basis, "error": self.error}


def judge(results: Sequence[CpuNoise]) -> None:
    """Set each scanned CPU's verdict and its basis.

    Two or more CPUs scanned: relative — noisy over NOISY_FACTOR x the quietest and over the
    floor (NOISY_FLOOR_US_PER_S), or over the ceiling whatever the others do; quiet
    otherwise. One CPU: nothing to compare it with, so absolute limits only — quiet at or
    under the floor, noisy over the ceiling, and ``unranked`` between (never called quiet)."""
    ok = [r for r in results if r.error is None]
    if not ok:
        return
    if len(ok) == 1:
        (r,) = ok
        if r.noise_us_per_s <= NOISY_FLOOR_US_PER_S:
            r.verdict = "quiet"
            r.basis = (f"alone, against the absolute floor: ≤ {NOISY_FLOOR_US_PER_S:g} µs/s "
                       "lost")
        elif r.noise_us_per_s > NOISY_CEILING_US_PER_S:
            r.verdict = "noisy"
            r.basis = (f"alone, against the absolute ceiling: over "
                       f"{NOISY_CEILING_US_PER_S / 1e3:g} ms/s lost")
        else:
            r.verdict = UNRANKED
            r.basis = (f"alone: over the {NOISY_FLOOR_US_PER_S:g} µs/s a quiet CPU loses and "
                       f"under the {NOISY_CEILING_US_PER_S / 1e3:g} ms/s ceiling; scan at least "
                       "two candidates to call one quiet")
        return
    best = min(r.noise_us_per_s for r in ok)
    limit = min(max(NOISY_FACTOR * best, NOISY_FLOOR_US_PER_S), NOISY_CEILING_US_PER_S)
    basis = (f"against the quietest of {len(ok)} CPUs: noisy over {limit:,.0f} µs/s lost "
             f"({NOISY_FACTOR:g}x the quietest, at least {NOISY_FLOOR_US_PER_S:g}, at most "
             f"{NOISY_CEILING_US_PER_S / 1e3:g} ms/s)")
    for r in ok:
        r.verdict = "noisy" if r.noise_us_per_s > limit else "quiet"
        r.basis = basis


@dataclass
class Choice:
    """The ranking and the recommended CPUs, with the reason each candidate was left out."""

    ranked: list[int]
    recommended: list[int]
    left_out: dict[int, str]
    device_nodes: list[int]


def rank(results: Sequence[CpuNoise], *, siblings: Mapping[int, Sequence[int]],
         cpu_node: Mapping[int, int], device_nodes: Sequence[int] = (),
         pinned: Mapping[int, Sequence[str]] | None = None, count: int | None = None,
         allow_siblings: bool = False) -> Choice:
    """Order the scanned CPUs and pick ``count`` of them (None: every quiet CPU that fits the
    rules). ``siblings``: CPU → its SMT siblings (itself included or not); ``cpu_node``: CPU →
    NUMA node; ``device_nodes``: the GPU's/NIC's nodes; ``pinned``: CPU → names of processes
    pinned to it alone."""
    pinned = pinned or {}
    dev = set(device_nodes)
    ok = [r for r in results if r.error is None]

    def key(r: CpuNoise) -> tuple:
        off_node = bool(dev) and cpu_node.get(r.cpu) not in dev
        p999 = r.gap_percentiles()["p999"] or 0
        return (r.verdict == "noisy", off_node, bool(pinned.get(r.cpu)),
                round(r.noise_us_per_s, 1), p999, r.cpu)

    order = sorted(ok, key=key)
    left_out: dict[int, str] = {r.cpu: f"scan failed: {r.error}" for r in results if r.error}
    chosen: list[int] = []
    for r in order:
        why = None
        if r.verdict == "noisy":
            why = f"noisy: {r.noise_us_per_s:.0f} µs/s lost"
        elif not allow_siblings and any(s in chosen for s in siblings.get(r.cpu, ()) if s != r.cpu):
            twin = next(s for s in siblings.get(r.cpu, ()) if s != r.cpu and s in chosen)
            why = f"SMT sibling of CPU {twin} (chosen)"
        elif count is None and dev and cpu_node.get(r.cpu) not in dev and any(
                cpu_node.get(c) in dev for c in chosen):
            why = f"NUMA node {cpu_node.get(r.cpu)}, not the devices' node(s) {sorted(dev)}"
        elif count is not None and len(chosen) >= count:
            why = "enough CPUs chosen"
        if why:
            left_out[r.cpu] = why
        else:
            chosen.append(r.cpu)
    return Choice([r.cpu for r in order], sorted(chosen), left_out, sorted(dev))
