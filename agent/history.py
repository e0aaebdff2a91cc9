"""Run history: every probe, watch, audit and gate run in an embedded SQLite database.

Location (read at call time, never at import): ``--db`` > ``$HFTAGENT_DB`` >
``$XDG_STATE_HOME/hftagent/history.sqlite`` > ``~/.local/state/hftagent/history.sqlite``.

Schema (``PRAGMA user_version`` holds its version; :data:`MIGRATIONS` upgrades older files in
place, inside one transaction, so a crash mid-migration leaves the old version intact)::

    runs(id, created_utc, kind, command, scenario, model_path, model_key, model_hash,
         variant, tf_version, host_digest, fingerprint JSON, summary JSON,
         sample_count, p50_ns, p99_ns, p999_ns, cold_start_ns)
    samples(run_id → runs.id, codec, count, data BLOB, sha256)   raw per-sample latency ns
    gate_results(id, run_id, baseline_id, scenario, status, created_utc, verdict JSON)  (v2)

v1 (the first release) had no ``scenario``/``host_digest`` columns, stored samples as raw
int64 bytes without a codec and had no gate results. v2 compresses samples
(``zlib-i64le``: zlib over little-endian int64, ~3-4× smaller on probe latencies) and keeps
v1 blobs readable as ``raw-i64le``.

Concurrency: WAL journal, a 30 s busy timeout and ``BEGIN IMMEDIATE`` for every write, so
several processes (probe runs in parallel CI jobs, watch) can record at once. A file that is
not SQLite, or is damaged, raises :class:`HistoryError` with one line and is never modified or
replaced; a damaged sample blob fails only that run's samples (checked with its SHA-256).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import sqlite3
import stat
import sys
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where samples are handled: audit runs carry none
    import numpy as np

from agent.errors import AgentError

SCHEMA_VERSION = 2
KINDS = ("probe", "watch", "audit", "gate", "cpus")  # cpus: a noise scan (hftagent cpus)
BUSY_TIMEOUT_S = 30.0
MAX_RUN_ID = 2**63 - 1  # SQLite's INTEGER PRIMARY KEY is a signed 64-bit integer


class HistoryError(AgentError):
    """The history database cannot be used (corrupt, newer schema, unknown run id...)."""


# -- location ------------------------------------------------------------------------------
def default_db_path() -> Path:
    """$XDG_STATE_HOME/hftagent/history.sqlite, else ~/.local/state/hftagent/history.sqlite."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hftagent" / "history.sqlite"


def resolve_db(db: str | os.PathLike | None = None) -> Path:
    """``db`` if given, else $HFTAGENT_DB, else :func:`default_db_path` (env read now).

    An empty ``db`` is an error, not "the default": an option that is given is never
    ignored."""
    if db is not None:
        if not str(db).strip():
            raise HistoryError("--db is empty: give a database file (or leave --db out for "
                               "the default)")
        return Path(db)
    env = os.environ.get("HFTAGENT_DB")
    return Path(env) if env else default_db_path()


def db_exists(db: str | os.PathLike | None = None) -> bool:
    """Whether the history database exists (False only when nothing is at its path). Anything
    there that cannot be a database (a directory, a FIFO, a device, a symlink loop) raises
    HistoryError, so that a listing never reports "no runs yet" for a path that is wrong."""
    path = resolve_db(db)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise HistoryError(f"cannot use history database path {path}: "
                           f"{exc.strerror or exc}") from None
    _check_regular(path, st)
    return True


def _check_regular(path: Path, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise HistoryError(f"history database path {path} is a directory")
    if not stat.S_ISREG(st.st_mode):
        # a FIFO would block the open forever; a device (/dev/zero) is never a database
        raise HistoryError(f"history database path {path} is not a regular file")


SQLITE_MAGIC = b"SQLite format 3\0"


def _header(path: Path) -> bytes | None:
    """The first 16 bytes of ``path`` (None if it cannot be opened). O_NONBLOCK and fstat: a
    FIFO swapped in after a stat() must neither block the open nor be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HistoryError(f"history database path {path} is not a regular file")
        return os.read(fd, 16)
    finally:
        os.close(fd)


def check_writable(db: str | os.PathLike | None = None) -> Path:
    """Refuse now a database that a run could not be recorded in, before the run (the
    recording itself only warns, after the result is out): not a regular file, not SQLite,
    not writable, or no writable directory to create it in. Returns the path."""
    path = resolve_db(db)
    if db_exists(path):
        head = _header(path)
        if head and head != SQLITE_MAGIC:
            raise HistoryError(f"history database {path} is not an SQLite database; it was "
                               "left untouched: move it aside or use --db for a new one")
        if not os.access(path, os.R_OK | os.W_OK):
            raise HistoryError(f"history database {path} is not writable")
        return path
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # History() creates the missing directories
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise HistoryError(f"cannot create history database {path}: {parent} is not a "
                           "writable directory")
    return path


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


# -- schema --------------------------------------------------------------------------------
SCHEMA_V1 = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_utc TEXT NOT NULL,
    kind TEXT NOT NULL,
    command TEXT NOT NULL,
    model_path TEXT,
    model_key TEXT,
    model_hash TEXT,
    variant TEXT,
    tf_version TEXT,
    fingerprint TEXT,
    summary TEXT NOT NULL,
    sample_count INTEGER,
    p50_ns INTEGER,
    p99_ns INTEGER,
    p999_ns INTEGER,
    cold_start_ns INTEGER
);
CREATE TABLE samples (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    data BLOB NOT NULL
);
CREATE INDEX runs_model ON runs(model_key, variant, id);
"""


def _migrate_1_to_2(con: sqlite3.Connection) -> None:
    from agent.fingerprint import digest
    con.execute("ALTER TABLE runs ADD COLUMN scenario TEXT")
    con.execute("ALTER TABLE runs ADD COLUMN host_digest TEXT")
    con.execute("UPDATE runs SET scenario = 'warm' WHERE kind = 'probe'")
    for rid, fp in con.execute("SELECT id, fingerprint FROM runs").fetchall():
        try:
            d = digest(json.loads(fp)) if fp else None
        except ValueError:
            d = None
        con.execute("UPDATE runs SET host_digest = ? WHERE id = ?", (d, rid))
    con.execute("ALTER TABLE samples ADD COLUMN codec TEXT NOT NULL DEFAULT 'raw-i64le'")
    con.execute("ALTER TABLE samples ADD COLUMN count INTEGER")
    con.execute("ALTER TABLE samples ADD COLUMN sha256 TEXT")
    con.execute("UPDATE samples SET count = length(data) / 8")
    con.execute("""CREATE TABLE gate_results (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        baseline_id INTEGER,
        scenario TEXT,
        status TEXT NOT NULL,
        created_utc TEXT NOT NULL,
        verdict TEXT NOT NULL)""")
    con.execute("CREATE INDEX gate_run ON gate_results(run_id)")
    con.execute("CREATE INDEX runs_scenario ON runs(model_key, variant, scenario, id)")


# MIGRATIONS[v] upgrades a database at version v to v + 1.
MIGRATIONS = {1: _migrate_1_to_2}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- sample codec --------------------------------------------------------------------------
def encode_samples(latency_ns: np.ndarray) -> tuple[str, int, bytes, str]:
    import numpy as np
    a = np.ascontiguousarray(np.asarray(latency_ns, dtype="<i8"))
    raw = a.tobytes()
    return "zlib-i64le", int(a.size), zlib.compress(raw, 6), hashlib.sha256(raw).hexdigest()


def decode_samples(codec: str, data: bytes, count: int | None, sha: str | None) -> np.ndarray:
    import numpy as np
    if codec == "zlib-i64le":
        raw = zlib.decompress(data)
    elif codec == "raw-i64le":
        raw = bytes(data)
    else:
        raise ValueError(f"unknown sample codec {codec!r}")
    if len(raw) % 8 or (count is not None and len(raw) // 8 != count):
        raise ValueError("sample blob has the wrong length")
    if sha is not None and hashlib.sha256(raw).hexdigest() != sha:
        raise ValueError("sample blob checksum mismatch")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


# -- model identity ------------------------------------------------------------------------
def model_key(model_path: str | None, builtin: str | None = None) -> str:
    """What 'the same model' means across runs: its path (resolved), or builtin:NAME."""
    if model_path:
        return os.path.realpath(model_path)
    return f"builtin:{builtin or 'lstm'}"


def model_hash(model_path: str | None) -> str | None:
    """SHA-256 over a model file, or over a SavedModel directory's files (relative names and
    contents, in sorted order). None when the path cannot be read."""
    if not model_path:
        return None
    p = Path(model_path)
    if not p.exists():
        return None
    h = hashlib.sha256()
    try:
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            h.update(str(f.relative_to(p) if f != p else f.name).encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


# -- rows ----------------------------------------------------------------------------------
@dataclass
class Run:
    id: int
    created_utc: str
    kind: str
    command: str
    scenario: str | None
    model_path: str | None
    model_key: str | None
    model_hash: str | None
    variant: str | None
    tf_version: str | None
    host_digest: str | None
    fingerprint: dict | None
    summary: dict
    sample_count: int | None
    p50_ns: int | None
    p99_ns: int | None
    p999_ns: int | None
    cold_start_ns: int | None
    gate_status: str | None = None

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


_RUN_COLS = ("id, created_utc, kind, command, scenario, model_path, model_key, model_hash, "
             "variant, tf_version, host_digest, fingerprint, summary, sample_count, p50_ns, "
             "p99_ns, p999_ns, cold_start_ns")


def _json_or(text: str | None, default: Any) -> Any:
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def _while_locked(fn, timeout_s: float | None = None):
    """``fn()``, again while SQLite says the database is locked, for up to ``timeout_s``
    (BUSY_TIMEOUT_S). The busy timeout does not cover every lock: switching a new database
    to WAL needs it exclusively, and SQLite answers "database is locked" at once, without
    waiting, where waiting could deadlock (several processes creating the same history at
    once: tests/test_history.py test_concurrent_writers failed so in one CI run). The schema
    step is idempotent (it re-reads the version inside its transaction)."""
    deadline = time.monotonic() + (BUSY_TIMEOUT_S if timeout_s is None else timeout_s)
    delay = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(0.1, delay * 2)


class History:
    """An open history database. Use as a context manager; every write is its own short
    ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True) -> None:
        self.path = resolve_db(path)
        if not db_exists(self.path) and not create:
            raise HistoryError(f"no history database at {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S,
                                       isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"cannot open history database {self.path}: {exc}") from None
        try:
            self._check_sqlite()
            self.con.execute("PRAGMA foreign_keys = ON")
            _while_locked(self._ensure_schema)
        except sqlite3.DatabaseError as exc:
            self.con.close()
            raise self._corrupt(exc) from None
        except HistoryError:
            self.con.close()
            raise

    def _corrupt(self, exc: Exception) -> HistoryError:
        return HistoryError(f"history database {self.path} is unreadable ({exc}); it was left "
                            "untouched: move it aside or use --db for a new one")

    def _check_sqlite(self) -> None:
        # Read the header ourselves: sqlite only notices a foreign file on first access, and
        # journal_mode=WAL must never be attempted on something that is not ours.
        head = _header(self.path)  # None: sqlite3 creates it (or says why it cannot)
        if head and head != SQLITE_MAGIC:
            raise sqlite3.DatabaseError("file is not a database")

    def _ensure_schema(self) -> None:
        con = self.con
        ver = con.execute("PRAGMA user_version").fetchone()[0]
        if ver == SCHEMA_VERSION:
            self._wal()
            return
        if ver > SCHEMA_VERSION:
            raise HistoryError(f"history database {self.path} has schema v{ver}, newer than "
                               f"this hftagent (v{SCHEMA_VERSION}): upgrade hftagent")
        self._wal()
        con.execute("BEGIN IMMEDIATE")
        try:
            ver = con.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
            if ver == 0:
                has_tables = con.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
                if has_tables:
                    raise HistoryError(f"{self.path} has a 'runs' table but no schema version: "
                                       "not an hftagent history database")
                for stmt in SCHEMA_V1.split(";"):
                    if stmt.strip():
                        con.execute(stmt)
                ver = 1
            while ver < SCHEMA_VERSION:
                MIGRATIONS[ver](con)
                ver += 1
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _wal(self) -> None:
        mode = self.con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # e.g. a network filesystem: still works, less concurrent
            pass

    # -- context manager
    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def _q(self, sql: str, args: Iterable = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, tuple(args)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None

    # -- writes
    def add_run(self, *, kind: str, command: str, summary: dict,
                samples_ns: np.ndarray | None = None, scenario: str | None = None,
                model_path: str | None = None, model_key_: str | None = None,
                model_hash_: str | None = None, variant: str | None = None,
                tf_version: str | None = None, fingerprint: dict | None = None,
                cold_start_ns: int | None = None, created_utc: str | None = None) -> int:
        from agent.fingerprint import digest
        if kind not in KINDS:
            raise HistoryError(f"unknown run kind {kind!r} (known: {', '.join(KINDS)})")
        lat = summary.get("latency") if isinstance(summary.get("latency"), dict) else {}
        p50, p99, p999 = lat.get("p50_ns"), lat.get("p99_ns"), lat.get("p999_ns")
        count = lat.get("count")
        blob = None
        if samples_ns is not None:
            import numpy as np
            arr = np.asarray(samples_ns, dtype=np.int64).ravel()
            blob = encode_samples(arr)
            count = int(arr.size)
            if arr.size and p99 is None:
                from agent.gate import P99, quantile_nr
                p50, p99 = quantile_nr(arr, 50.0), quantile_nr(arr, P99)
                p999 = quantile_nr(arr, 99.9)
        try:
            body = json.dumps(summary, default=_json_default)
            fp = json.dumps(fingerprint, default=_json_default) if fingerprint else None
        except (TypeError, ValueError) as exc:
            raise HistoryError(f"run summary is not JSON-serialisable: {exc}") from None
        row = (created_utc or _now(), kind, command, scenario, model_path, model_key_,
               model_hash_, variant, tf_version, digest(fingerprint), fp, body, count, p50, p99,
               p999, cold_start_ns)
        con = self.con
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                cur = con.execute(
                    "INSERT INTO runs (created_utc, kind, command, scenario, model_path, "
                    "model_key, model_hash, variant, tf_version, host_digest, fingerprint, "
                    "summary, sample_count, p50_ns, p99_ns, p999_ns, cold_start_ns) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
                rid = int(cur.lastrowid)
                if blob is not None:
                    con.execute("INSERT INTO samples (run_id, codec, count, data, sha256) "
                                "VALUES (?,?,?,?,?)", (rid, blob[0], blob[1], blob[2], blob[3]))
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        return rid

    def add_gate_result(self, run_id: int, baseline_id: int | None, scenario: str | None,
                        status: str, verdict: dict) -> int:
        try:
            self.con.execute("BEGIN IMMEDIATE")
            try:
                cur = self.con.execute(
                    "INSERT INTO gate_results (run_id, baseline_id, scenario, status, "
                    "created_utc, verdict) VALUES (?,?,?,?,?,?)",
                    (run_id, baseline_id, scenario, status, _now(),
                     json.dumps(verdict, default=_json_default)))
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        return int(cur.lastrowid)

    # -- reads
    def _row(self, t: tuple) -> Run:
        r = Run(*t[:11], _json_or(t[11], None), _json_or(t[12], {}), *t[13:18])
        g = self._q("SELECT status FROM gate_results WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                    (r.id,))
        r.gate_status = g[0][0] if g else None
        return r

    def runs(self, *, model: str | None = None, kind: str | None = None,
             scenario: str | None = None, variant: str | None = None,
             limit: int | None = 20, before: int | None = None) -> list[Run]:
        """Newest first. ``model`` matches the model key, path or hash (substring)."""
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
        sql = f"SELECT {_RUN_COLS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [self._row(t) for t in self._q(sql, args)]

    def get(self, run_id: int) -> Run:
        rows = (self._q(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (int(run_id),))
                if 0 <= int(run_id) <= MAX_RUN_ID else [])  # sqlite3: OverflowError beyond
        if not rows:
            raise HistoryError(f"unknown run id {run_id} in {self.path}")
        return self._row(rows[0])

    def latest_id(self, kind: str | None = None) -> int:
        rows = self.runs(kind=kind, limit=1)
        if not rows:
            raise HistoryError(f"no {kind + ' ' if kind else ''}runs in {self.path}")
        return rows[0].id

    def samples(self, run_id: int) -> np.ndarray | None:
        """The run's raw latencies (None if it stored none). A damaged blob raises
        HistoryError for this run only."""
        rows = self._q("SELECT codec, count, data, sha256 FROM samples WHERE run_id = ?",
                       (int(run_id),))
        if not rows:
            return None
        codec, count, data, sha = rows[0]
        try:
            return decode_samples(codec, data, count, sha)
        except (ValueError, zlib.error) as exc:
            raise HistoryError(f"run {run_id}: stored samples are damaged ({exc})") from None

    def last_pass(self, *, model_key_: str | None, variant: str | None,
                  scenario: str | None, before: int) -> Run | None:
        """The newest earlier run of the same model key, variant and scenario whose latest
        gate verdict passed; if none passed, the newest earlier run never gated (bootstrap:
        the first gate compares with the previous probe run). A failed run is never a
        baseline."""
        cands = self._q(
            f"SELECT {_RUN_COLS} FROM runs WHERE id < ? AND kind IN ('probe', 'gate') "
            "AND model_key IS ? AND variant IS ? AND scenario IS ? ORDER BY id DESC",
            (before, model_key_, variant, scenario))
        runs = [self._row(t) for t in cands]
        for r in runs:
            if r.gate_status == "pass":
                return r
        return next((r for r in runs if r.gate_status is None), None)

    def baseline_family(self, *, model_key_: str | None, variant: str | None,
                        scenario: str | None, before: int, limit: int) -> list[Run]:
        """Up to ``limit`` earlier runs of the same model key, variant and scenario that did
        not fail a gate (passed, or never gated), newest first: the runs whose spread tells
        how much P99 moves from one run to the next on this host."""
        cands = self._q(
            f"SELECT {_RUN_COLS} FROM runs WHERE id < ? AND kind IN ('probe', 'gate') "
            "AND model_key IS ? AND variant IS ? AND scenario IS ? ORDER BY id DESC",
            (before, model_key_, variant, scenario))
        runs = [self._row(t) for t in cands]
        return [r for r in runs if r.gate_status in (None, "pass") and r.p99_ns][:limit]

    def gate_results(self, run_id: int) -> list[dict]:
        rows = self._q("SELECT id, baseline_id, scenario, status, created_utc, verdict FROM "
                       "gate_results WHERE run_id = ? ORDER BY id", (int(run_id),))
        return [{"id": r[0], "baseline_id": r[1], "scenario": r[2], "status": r[3],
                 "created_utc": r[4], "verdict": _json_or(r[5], None)} for r in rows]

    def schema_version(self) -> int:
        return int(self._q("PRAGMA user_version")[0][0])


def _json_default(o: Any) -> Any:
    np = sys.modules.get("numpy")  # a numpy value can only exist once numpy is imported
    if np is None:
        raise TypeError(f"{type(o).__name__} is not JSON-serialisable")
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


# -- the hook other commands call ------------------------------------------------------------
def record_run(kind: str, summary: dict, samples_ns: np.ndarray | None, *, command: str,
               model_path: str | None = None, builtin: str | None = None,
               variant: str | None = None, tf_version: str | None = None,
               scenario: str | None = None, cold_start_ns: int | None = None,
               fingerprint: dict | None = None, db: str | os.PathLike | None = None,
               warn: bool = False) -> int | None:
    """Store one run and return its id.

    ``summary``: any JSON-able dict (a probe RunResult dict puts its ``latency`` summary in the
    indexed columns). ``samples_ns``: raw per-sample latencies (int ns) or None. The host
    fingerprint is taken now unless given; the latest audit run's status counts ride along.
    Raises HistoryError (an AgentError) when the database cannot be used; with ``warn=True``
    prints one warning line on stderr instead and returns None (a command whose own result
    is already out must not fail because its history could not be written).
    """
    if warn:
        try:
            return record_run(kind, summary, samples_ns, command=command,
                              model_path=model_path, builtin=builtin, variant=variant,
                              tf_version=tf_version, scenario=scenario,
                              cold_start_ns=cold_start_ns, fingerprint=fingerprint, db=db)
        except HistoryError as exc:
            _warn(exc)
            return None
    from agent import fingerprint as fpm
    if fingerprint is None:
        fingerprint = fpm.collect()
    with History(db) as h:
        if fingerprint.get("audit") is None and kind != "audit":
            a = h.runs(kind="audit", limit=1)
            if a and a[0].host_digest == fpm.digest(fingerprint):
                fingerprint = dict(fingerprint, audit={"run_id": a[0].id,
                                                       **audit_counts(a[0].summary)})
        if kind == "audit":
            fingerprint = dict(fingerprint, audit=audit_counts(summary))
        key = model_key(model_path, builtin) if (model_path or builtin or variant) else None
        return h.add_run(kind=kind, command=command, summary=summary, samples_ns=samples_ns,
                         scenario=scenario if scenario is not None else
                         ("warm" if kind == "probe" else None),
                         model_path=model_path, model_key_=key,
                         model_hash_=model_hash(model_path) if model_path else
                         _builtin_hash(builtin) if key else None,
                         variant=variant, tf_version=tf_version, fingerprint=fingerprint,
                         cold_start_ns=cold_start_ns)


def _warn(exc: Exception) -> None:
    import sys
    print(f"hftagent: warning: run not recorded in history: {exc}", file=sys.stderr)


def audit_counts(summary: dict) -> dict:
    """{status: count} over an audit report's findings (AuditReport.to_dict())."""
    out: dict[str, int] = {}
    for f in summary.get("findings", []) or []:
        s = f.get("status") if isinstance(f, dict) else None
        if s:
            out[s] = out.get(s, 0) + 1
    return out


def _builtin_hash(name: str | None) -> str | None:
    """Hash of a cached built-in's .keras file (None if it was never built). Globs the cache
    instead of calling builtin_dir(), which imports keras (and TensorFlow: 1.5 s)."""
    from agent.probe.models import CACHE_FORMAT, SEED, cache_dir
    pattern = f"{name or 'lstm'}-f{CACHE_FORMAT}-seed{SEED}-keras*/model.keras"
    found = sorted(cache_dir().joinpath("models").glob(pattern),
                   key=lambda p: p.stat().st_mtime)
    return model_hash(str(found[-1])) if found else None


def latencies_of(arrays: Any, open_loop: bool = False) -> np.ndarray | None:
    """The headline latencies of a probe run's arrays (a harness Samples or the {column:
    array} dict of run_config): response time from the intended start in open loop, service
    time in closed loop — the figures the probe itself reports."""
    if arrays is None:
        return None
    import numpy as np
    start = "intended_ns" if open_loop else "start_ns"
    if isinstance(arrays, dict):
        return np.asarray(arrays["end_ns"]) - np.asarray(arrays[start])
    return np.asarray(arrays.response_ns if open_loop else arrays.latency_ns)


def record_probe(result: Any, arrays: list, *, command: str = "probe",
                 scenario: str = "warm", db: str | os.PathLike | None = None,
                 fingerprint: dict | None = None, warn: bool = False) -> list[int]:
    """Store every run of a ProbeResult that got samples (one history run each); returns the
    ids in order. ``arrays`` is parallel to ``result.runs`` (run_probe or run_config output).
    ``warn=True``: a history failure is one warning line on stderr, never an exception."""
    if warn:
        try:
            return record_probe(result, arrays, command=command, scenario=scenario, db=db,
                                fingerprint=fingerprint)
        except HistoryError as exc:
            _warn(exc)
            return []
    from agent import fingerprint as fpm
    d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    fingerprint = fingerprint or fpm.collect()
    model = d.get("model") or {}
    settings = d.get("settings") or {}
    spec = settings.get("model") or {}
    ids = []
    for r, a in zip(d.get("runs", []), arrays, strict=True):
        open_loop = r.get("mode") == "open"
        lat = latencies_of(a, open_loop)
        if lat is None:
            continue
        summary = {"run": r, "model": model, "settings": settings, "host": d.get("host"),
                   "created_utc": d.get("created_utc"), "schema": d.get("schema"),
                   "schema_version": d.get("schema_version")}
        summary["latency"] = r.get("response") if open_loop and r.get("response") else \
            r.get("latency")
        ids.append(record_run(
            "probe", summary, lat, command=command, model_path=spec.get("path"),
            builtin=spec.get("builtin"), variant=r.get("variant"),
            tf_version=(d.get("host") or {}).get("tensorflow"), scenario=scenario,
            cold_start_ns=r.get("cold_start_ns"), fingerprint=fingerprint, db=db))
    return ids
