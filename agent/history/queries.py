"""The queries the commands ask of the history, one method each, named for what the command
wants (``History``: a :class:`~.store.Store` that answers them), and the checks on what a
user types for them (a run id, a ``--kind``).

Which command asks which: ``history`` lists, exports and plots :meth:`History.runs`;
``history show latest`` and ``gate --run latest`` take :meth:`History.latest_id`; the gate's
last-pass baseline is :meth:`History.last_pass` and its run-to-run spread
:meth:`History.baseline_family`; a recorded run carries :meth:`History.latest_audit`'s counts.
"""

from __future__ import annotations

import re

from .location import HistoryError
from .schema import KINDS, MAX_RUN_ID
from .store import RUN_COLS, Run, Store


def parse_run_id(text: str, what: str = "run id") -> int:
    """A run id as the user typed it: ASCII digits only (no sign, blanks, underscores or
    other scripts' digits, all of which int() would take), 1 .. 2**63-1 (SQLite's range)."""
    if not re.fullmatch(r"[0-9]+", text or ""):
        raise HistoryError(f"{what} must be a run id (a positive integer) or 'latest', not "
                           f"{text!r}")
    rid = int(text)
    if not 1 <= rid <= MAX_RUN_ID:
        raise HistoryError(f"{what} {text}: no such run id (run ids are 1 .. {MAX_RUN_ID})")
    return rid


def check_kind(kind: str | None) -> None:
    """``--kind``: one of :data:`KINDS` (a typo must not list nothing with exit status 0)."""
    if kind is not None and kind not in KINDS:
        raise HistoryError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")


class History(Store):
    """An open history database with the commands' queries (:class:`~.store.Store`: opening,
    rows, writes). Use as a context manager."""

    def runs(self, *, model: str | None = None, kind: str | None = None,
             scenario: str | None = None, variant: str | None = None,
             limit: int | None = 20, before: int | None = None) -> list[Run]:
        """``history`` (list, export, plot): newest first. ``model`` matches the model key,
        path or hash (substring); ``limit`` counts good rows (a skipped one is not one)."""
        check_kind(kind)
        where, args = [], []
        if model:
            where.append("(model_key LIKE ? OR model_path LIKE ? OR model_hash LIKE ?)")
            args += [f"%{model}%"] * 3
        for col, val in (("kind", kind), ("scenario", scenario), ("variant", variant)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if before is not None:
            where.append("id < ?")
            args.append(before)
        sql = f"SELECT {RUN_COLS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        return self._rows(sql, args, limit)

    def latest_id(self, kind: str | None = None) -> int:
        """``history show latest``, ``gate --run latest``: the newest run's id."""
        rows = self.runs(kind=kind, limit=1)
        if not rows:
            raise HistoryError(f"no {kind + ' ' if kind else ''}runs in {self.path}")
        return rows[0].id

    def _family(self, model_key_: str | None, variant: str | None, scenario: str | None,
                before: int) -> list[Run]:
        """The earlier probe and gate runs of one model key, variant and scenario, newest
        first."""
        return self._rows(
            f"SELECT {RUN_COLS} FROM runs WHERE id < ? AND kind IN ('probe', 'gate') "
            "AND model_key IS ? AND variant IS ? AND scenario IS ? ORDER BY id DESC",
            (before, model_key_, variant, scenario))

    def last_pass(self, *, model_key_: str | None, variant: str | None,
                  scenario: str | None, before: int) -> Run | None:
        """``gate`` (last-pass): the newest earlier run of the same model key, variant and
        scenario whose latest gate verdict passed; if none passed, the newest earlier run
        never gated (bootstrap: the first gate compares with the previous probe run). A
        failed run is never a baseline."""
        runs = self._family(model_key_, variant, scenario, before)
        for r in runs:
            if r.gate_status == "pass":
                return r
        return next((r for r in runs if r.gate_status is None), None)

    def baseline_family(self, *, model_key_: str | None, variant: str | None,
                        scenario: str | None, before: int, limit: int) -> list[Run]:
        """``gate``: up to ``limit`` earlier runs of the same model key, variant and scenario
        that did not fail a gate (passed, or never gated), newest first: the runs whose
        spread tells how much P99 moves from one run to the next on this host."""
        runs = self._family(model_key_, variant, scenario, before)
        return [r for r in runs if r.gate_status in (None, "pass") and r.p99_ns][:limit]

    def latest_audit(self) -> Run | None:
        """``record_run``: the newest audit run, whose status counts ride along in the
        fingerprint of a later run on the same host configuration."""
        a = self.runs(kind="audit", limit=1)
        return a[0] if a else None

    def series(self, *, model: str | None = None, variant: str | None = None,
               scenario: str | None = None, limit: int = 50) -> list[Run]:
        """``history plot``: the runs with a P99 among those ``model``, ``variant`` and
        ``scenario`` select, of the newest one's model key, variant and scenario, at most
        ``limit`` of them, oldest first ([] when none has a P99)."""
        runs = [r for r in self.runs(model=model, variant=variant, scenario=scenario,
                                     limit=None) if r.p99_ns is not None]
        if not runs:
            return []
        key = (runs[0].model_key, runs[0].variant, runs[0].scenario)
        return [r for r in runs if (r.model_key, r.variant, r.scenario) == key][:limit][::-1]
