"""Progress of a probe run on stderr, fed by the worker's events in the parent process
(nothing here touches the worker's hot loop).

From the first second (issue #28 item 2): on a terminal, one live line (rich, cleared at the
end) naming the phase — model load, the fp32 reference, then per variant: build
(convert/compile), first call, warm-up, timing with its expected length, agreement; on a pipe
or a file, one plain line per phase, so a log shows where the time went and a run of minutes
is never silent.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

PHASES = {
    "load": "starting the worker, loading the model",
    "start": "starting",
    "build": "building (convert / compile)",
    "cold": "first call",
    "warmup": "warming up",
    "agreement": "checking agreement with the reference",
}


def describe(ci: int, n: int, ev: dict) -> str | None:
    """The phase an event starts, in words (None: an event that starts none)."""
    where = f"[{ci + 1}/{n}] " if n > 1 else ""
    kind, phase = ev.get("event"), ev.get("phase")
    if kind == "worker":
        return where + PHASES.get(phase, str(phase))
    if kind == "reference":
        return f"{where}building the fp32 reference"
    if kind != "task":
        return None
    run = f"{where}{ev.get('variant')} batch {ev.get('batch')}: "
    if phase == "timed":
        n_s, exp = ev.get("n"), ev.get("expected_s")
        size = f"up to {n_s:,} samples" if isinstance(n_s, int) else "samples"
        return run + f"timing {size}" + (f", ~{exp:.1f} s" if isinstance(exp, int | float)
                                        else "")
    if phase == "done":
        return run + f"done ({ev.get('status', 'ok')})"
    return run + PHASES.get(phase, str(phase))


@contextlib.contextmanager
def progress_hook(enabled: bool = True, stream: TextIO | None = None,
                  prefix: str = "hftagent probe: ") -> Iterator[Callable | None]:
    """The hook for :func:`agent.probe.runner.run_probe`: a live line when ``stream`` (stderr)
    is a terminal, else one line per phase. ``enabled=False``: no hook."""
    if not enabled:
        yield None
        return
    out = stream if stream is not None else sys.stderr
    if not out.isatty():
        def lines(ci: int, n: int, ev: dict) -> None:
            text = describe(ci, n, ev)
            if text is not None:
                print(prefix + text, file=out, flush=True)
        yield lines
        return
    yield from _live(out)


def _live(out: TextIO) -> Iterator[Callable]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=Console(file=out), transient=True)
    task = prog.add_task(PHASES["load"], total=None)
    state: dict = {"t0": 0.0, "total": None}
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.2):
            if state["total"]:
                prog.update(task, completed=min(time.monotonic() - state["t0"], state["total"]))

    def hook(ci: int, n: int, ev: dict) -> None:
        text = describe(ci, n, ev)
        if text is None:
            return
        if ev.get("event") == "task" and ev.get("phase") == "timed" and ev.get("expected_s"):
            state["t0"], state["total"] = time.monotonic(), float(ev["expected_s"])
            prog.update(task, description=text, total=state["total"], completed=0)
        else:
            state["total"] = None
            prog.update(task, description=text, total=None)

    th = threading.Thread(target=tick, daemon=True)
    with prog:
        th.start()
        try:
            yield hook
        finally:
            stop.set()
