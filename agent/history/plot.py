"""History as pictures (``history plot``): P50/P99/P99.9 across runs and one run's latency
distribution, side by side. matplotlib is imported here only, when a plot is asked for
(agent/plot.py: the 'plot' extra, or one line naming it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes

    from .store import Run

PERCENTILE_SERIES = (("p50_ns", "P50", 50.0, "tab:green"), ("p99_ns", "P99", 99.0, "tab:orange"),
                     ("p999_ns", "P99.9", 99.9, "tab:red"))


def percentiles_across_runs(ax: Axes, runs: list[Run]) -> None:
    """P50/P99/P99.9 per run on a log axis. A percentile the run had too few samples to
    claim (agent.stats.REQUIRED_SAMPLES: 662 for P99, 6,636 for P99.9) is a hollow marker,
    as the tables mark it with ``*``; a failed gate is a red band. Every mark has a legend
    entry."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    from agent.plot import log_axis
    from agent.stats import REQUIRED_SAMPLES
    ids = [r.id for r in runs]
    handles = []
    hollow = False
    values = []
    for attr, label, q, colour in PERCENTILE_SERIES:
        ys = [getattr(r, attr) / 1e3 if getattr(r, attr) is not None else float("nan")
              for r in runs]
        values += [y for y in ys if y == y]
        enough = [(r.sample_count or 0) >= REQUIRED_SAMPLES[q] for r in runs]
        ax.plot(ids, ys, color=colour, linewidth=1.2)
        ax.plot([i for i, ok in zip(ids, enough, strict=True) if ok],
                [y for y, ok in zip(ys, enough, strict=True) if ok], "o", color=colour)
        short = [(i, y) for i, y, ok in zip(ids, ys, enough, strict=True) if not ok]
        if short:
            hollow = True
            ax.plot([i for i, _ in short], [y for _, y in short], "o", color=colour,
                    markerfacecolor="white")
        handles.append(Line2D([], [], color=colour, marker="o", label=label))
    if hollow:
        handles.append(Line2D([], [], color="gray", marker="o", linestyle="",
                              markerfacecolor="white",
                              label="hollow: too few samples for that percentile"))
    failed = [r.id for r in runs if r.gate_status == "fail"]
    for rid in failed:
        ax.axvspan(rid - 0.3, rid + 0.3, color="red", alpha=0.15, linewidth=0)
    if failed:
        handles.append(Patch(color="red", alpha=0.15, label="gate failed"))
    ax.set_xlabel("run id")
    ax.set_ylabel("latency")
    ax.set_yscale("log")
    log_axis(ax.yaxis, values)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=3, frameon=False)  # below the axes: never over a mark


def distribution(ax: Axes, lat: np.ndarray, run: Run) -> None:
    """The latest run's latency histogram (log-log) with its percentiles as vertical lines:
    dashed where the run's samples support the percentile, dotted and marked ``*`` where
    they do not."""
    import numpy as np

    from agent.plot import fmt_us, log_axis
    from agent.stats import REQUIRED_SAMPLES
    us = lat / 1e3
    lo, hi = max(float(us.min()), 1e-3), float(us.max())
    bins = np.geomspace(lo, hi * 1.0001, 80) if hi > lo else 10
    ax.hist(us, bins=bins, color="tab:blue", label="samples")
    ax.set_xscale("log")
    ax.set_yscale("log")
    n = int(lat.size)
    for attr, label, q, colour in PERCENTILE_SERIES:
        v = getattr(run, attr)
        if v is None:
            continue
        ok = n >= REQUIRED_SAMPLES[q]
        ax.axvline(v / 1e3, color=colour, linestyle="--" if ok else ":",
                   label=f"{label} {fmt_us(v / 1e3)}" + ("" if ok else
                                                         f"* ({n:,} < {REQUIRED_SAMPLES[q]:,}"
                                                         " samples)"))
    log_axis(ax.xaxis, [lo, hi])
    ax.set_xlabel("latency")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)  # below the axes: never over a bar or a line


def title(run: Run) -> str:
    """What the runs are: model and variant where a probe ran one, else the command (a watch
    or cpus run has neither: its title was "None None [None]"), and the scenario."""
    what = " ".join(p for p in (run.model_key, run.variant) if p) or run.command
    return what + (f" [{run.scenario}]" if run.scenario else "")


def draw(plt: Any, runs: list[Run], latest: Run, lat: np.ndarray | None, out: str) -> None:
    """The figure ``history plot`` writes: ``runs`` (oldest first) across the left panel,
    ``latest``'s samples ``lat`` (or None) on the right, saved to ``out`` by agent/plot.py's
    rules (a new file, or a regular one of ours)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.5))
    percentiles_across_runs(ax1, runs)
    ax1.set_title(title(latest))
    if lat is not None and lat.size:
        distribution(ax2, lat, latest)
    ax2.set_title(f"run {latest.id}: {latest.sample_count or 0:,} samples")
    fig.tight_layout()
    from agent.plot import save
    save(fig, out, "--out", dpi=None)
