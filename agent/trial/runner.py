"""The interleaved run of ``tune try``: every block with its arm's levers entered before it and
undone after it, in the plan's shuffled order.

Undo on every way out: each block's levers are entered in an ExitStack (isolation first, then
halt-polling; the probe child inside them), so a normal end, a failed block, an exception or
:class:`agent.commands.common.Stopped` (SIGTERM/SIGINT, which the command turns into an
unwinding) leaves them in reverse order: the child killed, halt-polling written back, the
isolation rolled back. A block whose probe fails is reported for its arm and the run goes on;
a lever that cannot be set or undone stops the run (after undoing what is held).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from .arms import Arm, TrialPlan
from .levers import BlockError

STOPPED_SPINNER = "keep-awake spinner on CPU"  # keepawake.c's line: "... stopped: ..."


@dataclass
class Hooks:
    """How a block's levers are held and its probe run (tests pass fakes)."""

    isolate: Callable[[], AbstractContextManager[Any]]
    halt_poll: Callable[[int], AbstractContextManager[Any]]
    block: Callable[[Arm], tuple[Any, list[str]]]


@dataclass
class TrialRun:
    """What the blocks measured: per arm the sample arrays (one per block), the block errors
    and the keep-awake spinners' stop lines."""

    samples: dict[str, list[Any]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    stopped: dict[str, list[str]] = field(default_factory=dict)
    blocks_done: int = 0


def run_block(arm: Arm, hooks: Hooks, out: TrialRun) -> None:
    """One block of ``arm``: its levers held around the probe, undone in reverse order."""
    with contextlib.ExitStack() as stack:
        if arm.isolate:
            stack.enter_context(hooks.isolate())
        if arm.halt_poll_ns is not None:
            stack.enter_context(hooks.halt_poll(arm.halt_poll_ns))
        try:
            lat, lines = hooks.block(arm)
        except BlockError as exc:
            out.errors.setdefault(arm.name, []).append(str(exc))
            return
    out.samples.setdefault(arm.name, []).append(lat)
    stop = [ln for ln in lines if STOPPED_SPINNER in ln and " stopped: " in ln]
    if stop:
        out.stopped.setdefault(arm.name, []).extend(stop)


def run_trial(plan: TrialPlan, hooks: Hooks,
              progress: Callable[[str], None] | None = None) -> TrialRun:
    """Every block of ``plan`` in its order; ``progress`` is told each block as it starts."""
    arms = {a.name: a for a in plan.arms}
    out = TrialRun()
    total = plan.blocks()
    for rnd, order in enumerate(plan.order, 1):
        for name in order:
            if progress is not None:
                progress(f"round {rnd}/{plan.rounds}, block {out.blocks_done + 1}/{total}: "
                         f"{arms[name].label}")
            run_block(arms[name], hooks, out)
            out.blocks_done += 1
    return out
