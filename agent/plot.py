"""matplotlib for the commands that draw (probe --idle-gaps, cpus --plot, history plot): the
headless backend, one message when it is not installed, one when the file cannot be written.
matplotlib is an optional extra (``pip install 'hftagent[plot]'``), imported only here."""

from __future__ import annotations

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


def save(fig, path: str) -> None:
    """Write the figure and close it; AgentError (one line) when the file cannot be written."""
    import matplotlib.pyplot as plt
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise AgentError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
