"""history: every probe, watch, audit, cpus and gate run, kept in one embedded SQLite database,
and the queries and pictures of them that the commands show.

Six commands use it: ``probe``, ``watch``, ``audit`` and ``cpus`` record their runs; ``gate``
records its probe runs and verdicts and asks for baselines; ``history`` lists, shows, exports
and plots them. They go through the names below, never a submodule's:

- :mod:`.location` — where the database is (``--db`` > ``$HFTAGENT_DB`` > the state
  directory, read at call time) and whether a path may be one (agent/outfile.py's rules:
  never a symlink, a regular file of ours, a directory nobody else can change).
- :mod:`.schema` — the format on disk: the tables, ``PRAGMA user_version`` and the
  migrations from every earlier version (a database written by any earlier release opens),
  the sample blobs (``zlib-i64le``), a new file built whole and linked into place.
- :mod:`.store` — :class:`Store`: an open database that is ours (another application's is
  refused before anything is written), its rows as :class:`Run` (a row of the wrong type
  skipped and counted), every write one short ``BEGIN IMMEDIATE`` transaction (WAL: several
  processes record at once).
- :mod:`.queries` — :class:`History`, the store with the queries each command asks
  (``runs``, ``latest_id``, ``last_pass``, ``baseline_family``, ``latest_audit``), and the
  checks on what a user types for them (:func:`parse_run_id`, :func:`check_kind`).
- :mod:`.record` — the hooks other commands call (:func:`record_run`, :func:`record_probe`,
  :func:`record_watch`), and a model's identity across runs (:func:`model_identity`).
- :mod:`.documents` — a run as the ``hftagent.run`` v1 document (also a valid
  ``gate --baseline FILE``) and the CSV/JSON export.
- :mod:`.render` — a run for a person (each kind in its own shape) and the run listing;
  :mod:`.plot` — percentiles across runs and a run's distribution (matplotlib, lazily).

May import: agent.errors, agent.outfile, agent.stats, agent.textout, agent.render,
agent.plot, agent.gate.fingerprint (the host every run carries), agent.probe.models (a
built-in's cached file, lazily), collectors, tuning. Never imports the CLI, watch, noise,
trace or export: they, or their commands, import it. Nothing happens at import: no
environment read, no file opened, no numpy.

Wiring (for a command)::

    from agent.history import History, HistoryError, record_run

    rid = record_run("audit", report.to_dict(), None, command="audit", db=db, warn=True)
    with History(db, create=False) as h:          # HistoryError: one line, exit 1
        r = h.get(h.latest_id())
        base = h.last_pass(model_key_=r.model_key, variant=r.variant,
                           scenario=r.scenario, before=r.id)
        note = h.skipped_note()                   # rows skipped for values of the wrong type
"""

from __future__ import annotations

from .location import HistoryError, db_exists, default_db_path, resolve_db
from .queries import History, check_kind, parse_run_id
from .record import (
    model_hash,
    model_identity,
    model_key,
    record_probe,
    record_run,
    record_watch,
    watch_record,
)
from .schema import KINDS, SCHEMA_VERSION
from .store import Run, Store, check_writable

__all__ = [
    "KINDS", "SCHEMA_VERSION", "History", "HistoryError", "Run", "Store", "check_kind",
    "check_writable", "db_exists", "default_db_path", "model_hash", "model_identity",
    "model_key", "parse_run_id", "record_probe", "record_run", "record_watch", "resolve_db",
    "watch_record",
]
