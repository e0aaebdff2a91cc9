"""Progress display for long probe runs (stderr, TTY only). Fed by worker events in the
parent process: nothing here touches the worker's hot loop."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


@contextlib.contextmanager
def progress_hook(enabled: bool) -> Iterator:
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)
    task = prog.add_task("starting TensorFlow worker…", total=None)
    state = {"t0": 0.0, "total": None}
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.2):
            if state["total"]:
                prog.update(task, completed=min(time.monotonic() - state["t0"], state["total"]))

    def hook(ci: int, n: int, ev: dict) -> None:
        where = f"[{ci + 1}/{n}] " if n > 1 else ""
        if ev.get("event") == "reference":
            prog.update(task, description=f"{where}fp32 reference", total=None)
            state["total"] = None
        elif ev.get("event") == "task":
            desc = f"{where}{ev['variant']} b{ev['batch']}: {ev['phase']}"
            if ev["phase"] == "timed":
                state["t0"], state["total"] = time.monotonic(), float(ev["expected_s"])
                prog.update(task, description=desc, total=state["total"], completed=0)
            else:
                state["total"] = None
                prog.update(task, description=desc, total=None)

    th = threading.Thread(target=tick, daemon=True)
    with prog:
        th.start()
        try:
            yield hook
        finally:
            stop.set()
