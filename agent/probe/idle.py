"""``hftagent probe --idle-gaps``: response time against the idle gap before each call.

The "cold after quiet" curve: an inference call that follows a quiet spell pays for whatever
the host did while it was idle — a CPU in a deep C-state (exit latency, a cold cache after
the core's caches were flushed), a halted vCPU the hypervisor must wake, a frequency that
dropped, TF's thread pool gone to sleep. Back-to-back calls (gap 0) pay none of it. The
harness (:func:`agent.probe.harness.gap_loop`) interleaves the gaps round by round so that
every gap sees the same host noise; this module parses the option, summarises the samples
per gap against gap 0, renders the table and writes the plot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from agent.errors import AgentError
from agent.probe import stats

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_GAP = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s)?", re.ASCII)
MAX_GAP_NS = 60 * 1_000_000_000
MAX_GAPS = 16


def parse_gaps(spec: str) -> list[int]:
    """"0,1ms,10ms,100ms,1s" → sorted gap lengths in ns. A bare number is in ms. Raises
    AgentError with a message for the user."""
    if not spec or not spec.strip():
        raise AgentError("--idle-gaps is empty (e.g. --idle-gaps 0,1ms,10ms,100ms,1s)")
    out: set[int] = set()
    for part in spec.split(","):
        p = part.strip()
        m = _GAP.fullmatch(p)
        if not m:
            raise AgentError(f"bad --idle-gaps entry {part!r}: expected a length such as 0, "
                             "500us, 10ms or 1s")
        ns = round(float(m.group(1)) * _UNITS_NS[m.group(2) or "ms"])
        if ns > MAX_GAP_NS:
            raise AgentError(f"--idle-gaps entry {part!r} is over 60 s")
        out.add(int(ns))
    if len(out) > MAX_GAPS:
        raise AgentError(f"--idle-gaps has {len(out)} gaps: at most {MAX_GAPS}")
    return sorted(out)


def fmt_gap(ns: int) -> str:
    if ns == 0:
        return "0 (back-to-back)"
    for unit, f in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= f:
            return f"{ns / f:g} {unit}"
    return f"{ns} ns"


def rounds_for(gaps_ns: list[int], per_call_ns: int, duration_s: float | None,
               samples: int | None) -> int:
    """Rounds (one call per gap each) that fit the time budget, at most ``samples``."""
    round_ns = sum(gaps_ns) + len(gaps_ns) * max(per_call_ns, 1)
    want = samples or 200
    if duration_s:
        want = min(want, max(1, int(duration_s * 1e9 // round_ns)))
    return max(1, want)


def summarize(arrays: Mapping[int, np.ndarray]) -> list[dict]:
    """One row per gap: the latency summary, the mean gap actually slept, and P50/P99 as a
    ratio to the back-to-back calls (gap 0, or the smallest gap when 0 was not asked)."""
    rows = []
    for g in sorted(arrays):
        a = arrays[g]
        lat = a[2] - a[1]
        rows.append({"gap_ns": int(g), "slept_mean_ns": float(a[0].mean()) if a.shape[1] else None,
                     "latency": stats.summarize(lat)})
    base = rows[0]["latency"] if rows else None
    for row in rows:
        for q in ("p50", "p99"):
            v, b = row["latency"].get(q + "_ns"), base.get(q + "_ns") if base else None
            row[f"{q}_ratio"] = (v / b) if v is not None and b else None
    return rows


def headline(rows: list[dict]) -> str:
    """"a call after 1 s idle is 1.38× slower at P50 than back-to-back calls"."""
    if len(rows) < 2 or rows[-1]["p50_ratio"] is None:
        return ""
    last, first = rows[-1], rows[0]
    return (f"a call after {fmt_gap(last['gap_ns'])} idle is {last['p50_ratio']:.2f}× "
            f"{'slower' if last['p50_ratio'] >= 1 else 'faster'} at P50 than after "
            f"{fmt_gap(first['gap_ns'])}")


def plot(rows: list[dict], path: str, title: str) -> None:
    """P50 and P99 against the gap (log x; gap 0 drawn at the left edge). A percentile a gap
    has too few calls to claim (P99 from 60 rounds: fewer than 662) is drawn hollow on a
    dotted line and says so in the legend, as the table marks it with ``*``. Needs
    matplotlib (``pip install 'hftagent[plot]'``); raises AgentError without it."""
    from agent.plot import fmt_us, pyplot, save
    plt = pyplot("--plot")  # matplotlib (and its Agg backend) before its submodules
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    from agent.stats import REQUIRED_SAMPLES
    xs = [r["gap_ns"] / 1e6 for r in rows]
    positive = [x for x in xs if x > 0]
    zero_at = (min(positive) / 10) if positive else 1e-3
    xs = [x if x > 0 else zero_at for x in xs]
    fig, ax = plt.subplots(figsize=(7, 4.6))
    handles = []
    for q, pct, marker, colour in (("p50", 50.0, "o", "tab:blue"),
                                   ("p99", 99.0, "s", "tab:orange")):
        pts = [(x, r["latency"].get(q + "_ns"), r["latency"].get("sufficient", {}).get(q, True))
               for x, r in zip(xs, rows, strict=True)]
        pts = [(x, y / 1e3, ok) for x, y, ok in pts if y is not None]
        if not pts:
            continue
        all_ok = all(ok for *_, ok in pts)
        ax.plot([x for x, *_ in pts], [y for _, y, _ in pts], color=colour,
                linestyle="-" if all_ok else ":")
        for x, y, ok in pts:
            ax.plot([x], [y], marker, color=colour,
                    markerfacecolor=colour if ok else "white")
        label = q.upper() if all_ok else (f"{q.upper()}* (hollow: fewer than "
                                          f"{REQUIRED_SAMPLES[pct]:,} calls at that gap)")
        handles.append(Line2D([], [], color=colour, marker=marker,
                              linestyle="-" if all_ok else ":",
                              markerfacecolor=colour if all_ok else "white", label=label))
    ax.set_xscale("log")
    if all(b / a >= 3 for a, b in zip(xs, xs[1:])):  # far enough apart: label each gap
        from matplotlib.ticker import NullLocator
        ax.set_xticks(xs, ["0" if r["gap_ns"] == 0 else fmt_gap(r["gap_ns"]) for r in rows])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("idle gap before the call (back-to-back, 0, at the left edge)")
    ax.set_ylabel("latency")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_us(v)))
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=2, frameon=False)
    fig.tight_layout()
    save(fig, path)
