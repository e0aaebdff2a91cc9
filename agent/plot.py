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
