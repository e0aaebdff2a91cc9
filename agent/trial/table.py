"""``tune try``'s figures: each arm's n and P50/P99/P99.9 with distribution-free 95 % intervals
(:func:`agent.stats.quantile_interval`: two order statistics, ranks from the binomial), the
winner rule, and the table.

**The winner** is the arm with the lowest P99.9 *upper* bound (a lucky point estimate from a
wide interval does not win), the fewer levers on a tie. A lever arm (one on top of isolation)
is the winner only when it is better than isolation alone by its own interval: its upper bound
below isolation's, and its P99.9 not above isolation's; otherwise the best of none and
isolation alone is, and the verdict says which lever was set aside and why. The win is *clear*
only when no other arm's interval reaches below the winner's upper bound; overlapping arms are
named. An arm whose P99.9 has no upper bound (too few samples beyond it) cannot win. A P99.9
from fewer samples than agent/stats.py requires to claim it is marked ``*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agent import stats

from .arms import Arm

QS = (50.0, 99.0, 99.9)
CONFIDENCE = 0.95


@dataclass
class Figure:
    """One percentile of one arm: the nearest-rank value and its interval (ns; None on a side
    the sample count cannot bound)."""

    value_ns: int
    lo_ns: int | None
    hi_ns: int | None

    def to_dict(self) -> dict:
        return {"value_ns": self.value_ns, "lo_ns": self.lo_ns, "hi_ns": self.hi_ns}


@dataclass
class ArmFigures:
    name: str
    label: str
    lever: bool
    n: int
    q: dict[str, Figure] = field(default_factory=dict)  # pkey -> Figure

    @property
    def p999(self) -> Figure | None:
        return self.q.get("p999")

    @property
    def sufficient(self) -> bool:
        return self.n >= stats.required_samples(99.9)

    def to_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "lever": self.lever, "n": self.n,
                "p999_sufficient": self.sufficient,
                **{k: f.to_dict() for k, f in self.q.items()}}


def figures(arm: Arm, blocks: list) -> ArmFigures:
    """An arm's figures from its blocks' samples pooled (ns)."""
    a = np.sort(np.concatenate(blocks)) if blocks else np.zeros(0, dtype=np.int64)
    out = ArmFigures(arm.name, arm.label, arm.lever, int(a.size))
    if a.size:
        for q in QS:
            lo, hi = stats.quantile_interval(a, q, CONFIDENCE)
            out.q[stats.pkey(q)] = Figure(int(stats.quantile_sorted(a, q)), lo, hi)
    return out


@dataclass
class Verdict:
    winner: str | None
    clear: bool
    overlaps: list[str]
    note: str

    def to_dict(self) -> dict:
        return {"winner": self.winner, "clear": self.clear, "overlaps": self.overlaps,
                "note": self.note}


def _upper(f: ArmFigures) -> float:
    p = f.p999
    return float("inf") if p is None or p.hi_ns is None else float(p.hi_ns)


def _lower(f: ArmFigures) -> float:
    p = f.p999
    return float("-inf") if p is None or p.lo_ns is None else float(p.lo_ns)


def not_better(lever: ArmFigures, iso: ArmFigures | None) -> str | None:
    """Why a lever arm is not better than isolation alone by its own interval, or None."""
    if iso is None or iso.p999 is None or lever.p999 is None:
        return "isolation alone has no figures to compare it with"
    if _upper(lever) >= _upper(iso):
        return "its P99.9 upper bound is not below isolation alone's"
    if lever.p999.value_ns > iso.p999.value_ns:
        return "its P99.9 is above isolation alone's"
    return None


def pick(arms: list[ArmFigures]) -> Verdict:
    """The winner rule (module docstring)."""
    order = {f.name: i for i, f in enumerate(arms)}
    cands = sorted((f for f in arms if f.n and _upper(f) < float("inf")),
                   key=lambda f: (_upper(f), order[f.name]))
    if not cands:
        need = stats.required_samples(99.9)
        return Verdict(None, False, [], "no arm has a P99.9 upper bound: too few samples "
                       f"(about {need:,} per arm bound it well: more --rounds or --block-s)")
    best, note = cands[0], ""
    iso = next((f for f in arms if f.name == "isolate"), None)
    if best.lever:
        why = not_better(best, iso)
        if why is not None:
            note = f"{best.label} had the lowest upper bound, but {why}: not the winner"
            plain = [f for f in cands if not f.lever]
            if not plain:
                return Verdict(None, False, [], note)
            best = plain[0]
    over = [f.name for f in arms if f is not best and f.n and _lower(f) <= _upper(best)]
    if over:
        note = "; ".join(x for x in (note, "intervals overlap with " + ", ".join(over)
                                     + ": the win is not clear") if x)
    return Verdict(best.name, not over, over, note)


def _us(ns: float | None) -> str:
    if ns is None:
        return "∞"
    v = ns / 1e3
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def cell(f: Figure | None, mark: str = "") -> str:
    if f is None:
        return "-"
    lo = "0" if f.lo_ns is None else _us(f.lo_ns)
    return f"{_us(f.value_ns)}{mark} [{lo}, {_us(f.hi_ns)}]"


def render(con, arms: list[ArmFigures], verdict: Verdict) -> None:
    """The lever table (µs, 95 % intervals) and the winner line."""
    from agent.textout import Column, Row, line, show

    rows = []
    for f in arms:
        mark = "" if f.sufficient else "*"
        win = f.name == verdict.winner
        rows.append(Row({"arm": f.label, "n": f"{f.n:,}", "P50 µs": cell(f.q.get("p50")),
                         "P99 µs": cell(f.q.get("p99")),
                         "P99.9 µs": cell(f.p999, mark)},
                        tag="winner" if win else "", tag_style="green" if win else ""))
    show(con, "wake-up levers (value [95 % interval], µs)",
         [Column("arm"), Column("n", right=True), Column("P50 µs", right=True),
          Column("P99 µs", right=True), Column("P99.9 µs", right=True), Column("")], rows,
         head=("arm",), tag_column="")
    short = [f.label for f in arms if f.n and not f.sufficient]
    if short:
        which = "every arm" if len(short) == len(arms) else ", ".join(short)
        line(con, f"* P99.9 from fewer than {stats.required_samples(99.9):,} samples: an "
             f"order statistic, not a claim ({which})")
    if verdict.winner is None:
        line(con, "winner: none. " + verdict.note, style="yellow")
        return
    label = next(f.label for f in arms if f.name == verdict.winner)
    line(con, ("winner: ", "bold"), (label, "bold green"),
         " (lowest P99.9 upper bound" + (", clear)" if verdict.clear else ")"))
    if verdict.note:
        line(con, verdict.note, style="yellow")


def notes(con, doc: dict, recorded: list[str]) -> None:
    """What follows the table: the fix for the winner, unsupported arms, failed blocks,
    spinners that stopped themselves, the seed and where the result went."""
    from agent.textout import line

    if doc.get("fix") and doc.get("winner") not in (None, "none"):
        line(con, "to use it: ", (doc["fix"], "bold"))
    for name, why in doc.get("unsupported", {}).items():
        line(con, f"{name}: unsupported: {why}")
    for name, errs in doc.get("errors", {}).items():
        line(con, f"{name}: {len(errs)} block(s) failed: {errs[0]}", style="yellow")
    for name, stops in doc.get("keepawake_stopped", {}).items():
        line(con, f"{name}: the keep-awake spinner stopped itself in {len(stops)} block(s) "
             f"(the probe waited for its CPU behind it): {stops[0]}", style="yellow")
    line(con, f"order seed {doc.get('seed')} (--seed reruns the same order); recorded: "
         + (", ".join(recorded) or "nowhere"))
