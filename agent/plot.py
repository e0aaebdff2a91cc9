"""matplotlib for the commands that draw (probe --idle-gaps, cpus --plot, history plot): the
headless backend, one message when it is not installed, one when the file cannot be written
(agent/outfile.py: every plot goes through the one output opener).
matplotlib is an optional extra (``pip install 'hftagent[plot]'``), imported only here."""

from __future__ import annotations

import os

from agent.errors import AgentError

MISSING = "needs matplotlib (pip install 'hftagent[plot]')"


def pyplot(what: str = "--plot"):
    """matplotlib.pyplot on the Agg backend; AgentError naming ``what`` without it."""
    try:
        import matplotlib
    except ImportError:
        raise AgentError(f"{what} {MISSING}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def fmt_us(us: float) -> str:
    """A latency tick or label: short, with its unit (``500 µs``, ``20 ms``, ``1.5 s``), so
    that neighbouring labels never run into each other as ``10,00020,000`` did."""
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def log_axis(axis, values_us) -> None:
    """Ticks for a log latency axis in µs: few enough never to overlap, spaced evenly on the
    log scale. Under a decade, at most 5 round values (1, 1.5, 2, 3, 4, 5, 6, 7, 8 x 10^k)
    picked evenly; up to three decades 1, 2 and 5 per decade; beyond, one per decade. Labels
    by :func:`fmt_us`; no minor labels."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter
    vals = [v for v in values_us if v and v > 0 and v == v]
    decades = math.log10(max(vals) / min(vals)) if vals else 3.0
    if decades < 1:
        lo, hi = min(vals), max(vals)
        k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        cands = [m * 10.0 ** k for k in range(k0, k1 + 1)
                 for m in (1, 1.5, 2, 3, 4, 5, 6, 7, 8) if lo <= m * 10.0 ** k <= hi]
        step = max(1, math.ceil(len(cands) / 5))
        axis.set_major_locator(FixedLocator(cands[::step] or [lo, hi]))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3
                                          else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt_us(v)))
    axis.set_minor_formatter(NullFormatter())


def available(what: str = "--plot") -> None:
    """Raise AgentError now (before a scan or a run) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AgentError(f"{what} {MISSING}") from None


def save(fig, path: str, what: str = "--plot", *, dpi: float | None = 110) -> None:
    """Write the figure to ``path`` through agent/outfile.py (no symlink followed, only a new
    file or a regular file of ours replaced, written whole or not at all) and close it. The
    format is the file's suffix (.png unless .svg/.pdf...). OutputError (one line) when the
    file cannot be written."""
    import matplotlib.pyplot as plt

    from agent.outfile import open_output
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    try:
        with open_output(path, what, binary=True) as out:
            fig.savefig(out.file, dpi="figure" if dpi is None else dpi, format=fmt)
    except ValueError as exc:  # a format matplotlib does not write
        raise AgentError(f"cannot write {what} {path}: {exc}") from None
    finally:
        plt.close(fig)
