"""The result of ``tune try`` kept: one history run (kind ``trial``, its scenario the winner,
the winner's samples) and the state file the audit reads (tuning/trial_state.py)."""

from __future__ import annotations

import datetime as _dt
import sys
from pathlib import Path

from collectors.host import Host

from .arms import TrialPlan
from .runner import TrialRun
from .table import ArmFigures, Verdict


def result_doc(plan: TrialPlan, run: TrialRun, arms: list[ArmFigures], verdict: Verdict
               ) -> dict:
    """The result as JSON: the plan (seed, order), every arm's figures, the verdict."""
    from tuning.trial_state import lever_fix
    return {"created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            **plan.to_dict(), "winner": verdict.winner, "clear": verdict.clear,
            "overlaps": verdict.overlaps, "note": verdict.note,
            "fix": lever_fix(verdict.winner, plan.cpus) if verdict.winner else None,
            "figures": [f.to_dict() for f in arms], "errors": run.errors,
            "keepawake_stopped": run.stopped, "blocks_done": run.blocks_done}


def keep(host: Host, doc: dict, run: TrialRun, *, state_dir: Path | None, db: str | None,
         history: bool) -> list[str]:
    """Record ``doc``; each failure is one warning line on stderr (the table is out already).
    Returns the places written."""
    import numpy as np

    from tuning.safepath import UnsafePath
    from tuning.trial_state import write_state
    where: list[str] = []
    try:
        where.append(str(write_state(host, doc, state_dir)))
    except (OSError, UnsafePath) as exc:
        print(f"hftagent: warning: tune try result not saved for the audit: {exc}",
              file=sys.stderr)
    if history:
        from agent.history import record_run
        win = doc.get("winner")
        samples = (np.concatenate(run.samples[win]) if win and run.samples.get(win)
                   else None)
        rid = record_run("trial", doc, samples, command="tune try", scenario=win or "none",
                         db=db, warn=True)
        if rid is not None:
            where.append(f"history run {rid}")
    return where
