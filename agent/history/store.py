"""The store: an open history database, its rows as :class:`Run`, every write.

Ours or not (issue #30 item 5): a database is opened only when it is ours — our
application_id, or our marker table, or (v1/v2, before the marker) our user_version with our
tables, which is then stamped. Any other SQLite file (another application's id, or none of
our tables: an empty file included) is refused with one line before anything is written to it
(no table added, no switch to WAL).

Concurrency: WAL journal, a 30 s busy timeout and ``BEGIN IMMEDIATE`` for every write, so
several processes (probe runs in parallel CI jobs, watch) can record at once. A file that is
not SQLite, or is damaged, raises :class:`HistoryError` with one line and is never modified or
replaced; a damaged sample blob fails only that run's samples (checked with its SHA-256). A
row with a value of the wrong type (a BLOB, a NULL, text that is not UTF-8 where hftagent
stores none) is skipped and counted (:attr:`Store.skipped`), never an error.

The queries the commands ask are :mod:`.queries`' (``History``, a Store).
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

if TYPE_CHECKING:  # numpy is imported where samples are handled: audit runs carry none
    import numpy as np

from agent.outfile import OutputError, Target

from .location import (
    SQLITE_MAGIC,
    WHAT,
    HistoryError,
    default_dir,
    header,
    is_default,
    locate_db,
    resolve_db,
    try_write,
)
from .schema import (
    APPLICATION_ID,
    KINDS,
    MARKER_TABLE,
    MAX_RUN_ID,
    MIGRATIONS,
    SCHEMA_VERSION,
    create_file,
    decode_samples,
    encode_samples,
    now_utc,
)

BUSY_TIMEOUT_S = 30.0
T = TypeVar("T")
_Seen = tuple[tuple[int, int], tuple[int, int]]  # (st_dev, st_ino): the directory, the file


def _seen(t: Target) -> _Seen:
    """The (st_dev, st_ino) of a located database's directory and file (HistoryError when
    nothing is there)."""
    if t.st is None:
        raise HistoryError(f"{WHAT} {t.shown} was removed while it was opened")
    d = os.fstat(t.dfd)
    return (d.st_dev, d.st_ino), (t.st.st_dev, t.st.st_ino)

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


RUN_COLS = ("id, created_utc, kind, command, scenario, model_path, model_key, model_hash, "
             "variant, tf_version, host_digest, fingerprint, summary, sample_count, p50_ns, "
             "p99_ns, p999_ns, cold_start_ns")


def _opt(v: Any, typ: type) -> bool:
    """``v`` is None or of type ``typ``."""
    return v is None or isinstance(v, typ)


def _run_row_ok(t: tuple) -> bool:
    """Whether a ``runs`` row (:data:`RUN_COLS`) holds the types hftagent stores: text where
    text is stored (created_utc, kind, command and summary never NULL), integers where
    integers are. A BLOB, a NULL where none is stored, or text that is not UTF-8 (read as
    :data:`_UNDECODABLE`) makes the row one to skip."""
    return (isinstance(t[0], int) and all(isinstance(t[i], str) for i in (1, 2, 3, 12))
            and all(_opt(t[i], str) for i in range(4, 12))
            and all(_opt(t[i], int) for i in range(13, 18)))


def _json_or(text: str | None, default: Any) -> Any:
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def _while_locked(fn: Callable[[], T], timeout_s: float | None = None) -> T:
    """``fn()``, again while SQLite says the database is locked, for up to ``timeout_s``
    (BUSY_TIMEOUT_S). The busy timeout does not cover every lock: switching a new database
    to WAL needs it exclusively, and SQLite answers "database is locked" at once, without
    waiting, where waiting could deadlock (several processes creating the same history at
    once: tests/test_history_store.py test_concurrent_writers failed so in one CI run). The
    schema step is idempotent (it re-reads the version inside its transaction)."""
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


class _Undecodable:
    """What a TEXT value that is not UTF-8 reads as (sqlite3's text_factory): a value no row
    check accepts, so that the row is skipped instead of the whole query failing."""

    def __repr__(self) -> str:
        return "<text that is not UTF-8>"


_UNDECODABLE = _Undecodable()


def _text(b: bytes) -> str | _Undecodable:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return _UNDECODABLE


class Store:
    """An open history database. Use as a context manager; every write is its own short
    ``BEGIN IMMEDIATE`` transaction. ``create``: make the database when nothing is at its
    path (else HistoryError "no history database"). Only our databases are opened (module
    docstring). :attr:`skipped`: rows skipped so far for values of the wrong type."""

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True) -> None:
        self.path = resolve_db(path)
        self._bad_runs: set[int] = set()
        self._bad_gates: set[int] = set()
        if create and is_default(path):
            default_dir(self.path, create=True)
        elif not create and not os.path.lexists(self.path):
            raise HistoryError(f"no {WHAT} at {self.path}")
        self._real, seen = self._locate(create)
        try:
            self._check_sqlite()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        try:
            self.con = sqlite3.connect(self._real, timeout=BUSY_TIMEOUT_S,
                                       isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"cannot open {WHAT} {self.path}: {exc}") from None
        try:
            self._check_opened(seen)
            self.con.text_factory = _text
            _while_locked(self._ensure_schema)
            self.con.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            self.con.close()
            raise self._corrupt(exc) from None
        except OSError as exc:
            self.con.close()
            raise HistoryError(f"cannot open {WHAT} {self.path}: {exc.strerror or exc}"
                               ) from None
        except HistoryError:
            self.con.close()
            raise

    def _locate(self, create: bool) -> tuple[Path, _Seen]:
        """The database's real path and what the walk found there (its directory's and its
        own (st_dev, st_ino)); made first when missing and ``create``."""
        try:
            with locate_db(self.path) as t:
                if t.st is None:
                    if not create:
                        raise HistoryError(f"no {WHAT} at {self.path}")
                    create_file(t)
                    t.restat()
                    t.check_replaceable()
                return t.real, _seen(t)
        except OutputError as exc:
            raise HistoryError(str(exc)) from None
        except OSError as exc:
            raise HistoryError(f"cannot create {WHAT} {self.path}: {exc.strerror or exc}"
                               ) from None
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot create {WHAT} {self.path}: {exc}") from None

    def _check_opened(self, seen: _Seen) -> None:
        """Refuse the file SQLite opened unless it is the one the walk checked.

        SQLite opens by path: even ``/proc/self/fd/N/history.sqlite`` (our walked directory's
        descriptor) is no help, as SQLite resolves every link on a path itself (3.35+,
        unixFullPathname) and then opens the directory's path text. The window is closed
        instead: every directory on the path passed the rule (root's or ours, writable by
        nobody else unless root's and sticky), so nobody else can rename, replace or re-link
        a name on it between the walk and the open; SQLite holds the file open once connect
        returns, and makes its -wal, -shm and -journal files beside it, in that directory.
        Then the path is walked again: it must lead to the same directory and file, and SQLite
        must name that same path as the one it opened."""
        rows = self.con.execute("PRAGMA database_list").fetchall()
        opened = next((r[2] for r in rows if r[1] == "main"), None)
        try:
            with locate_db(self.path) as t:
                now = _seen(t)
        except HistoryError as exc:
            raise HistoryError(f"{WHAT} {self.path} changed while it was opened: {exc}"
                               ) from None
        if now != seen or opened != str(self._real):
            raise HistoryError(f"{WHAT} {self.path} changed while it was opened: refused")

    @property
    def skipped(self) -> int:
        """Rows (runs and gate results) skipped so far: a value of the wrong type."""
        return len(self._bad_runs) + len(self._bad_gates)

    def skipped_note(self) -> str | None:
        """One warning line about the skipped rows, or None when there are none."""
        if not self.skipped:
            return None
        parts = [f"{n} {what}" for n, what in ((len(self._bad_runs), "run(s)"),
                                                (len(self._bad_gates), "gate result(s)")) if n]
        return (f"hftagent: warning: {' and '.join(parts)} in {self.path} skipped: values of "
                "the wrong type (a BLOB, a NULL, or text that is not UTF-8)")

    def _corrupt(self, exc: Exception) -> HistoryError:
        return HistoryError(f"{WHAT} {self.path} is unreadable ({exc}); it was left "
                            "untouched: move it aside or use --db for a new one")

    def _check_sqlite(self) -> None:
        # Read the header ourselves: sqlite only notices a foreign file on first access, and
        # journal_mode=WAL must never be attempted on something that is not ours.
        head = header(self._real)
        if head and head != SQLITE_MAGIC:
            raise sqlite3.DatabaseError("file is not a database")

    def _foreign(self, why: str) -> HistoryError:
        return HistoryError(f"{self.path} is not an hftagent {WHAT} ({why}); it was left "
                            "untouched: give --db a file of its own")

    def _identify(self) -> int:
        """The schema version of our database; HistoryError for one that is not ours or is
        newer than this hftagent. Reads only: nothing is written before this says ours."""
        con = self.con
        app = con.execute("PRAGMA application_id").fetchone()[0]
        ver = con.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = "
                                            "'table'")}
        if app not in (0, APPLICATION_ID):
            raise self._foreign(f"another application's SQLite database: application_id "
                                f"{app:#010x}")
        if app == 0 and MARKER_TABLE not in tables:
            # v1/v2, before the marker: our version and our tables, which the stamp adds to
            need = {"runs", "samples"} | ({"gate_results"} if ver == 2 else set())
            if ver not in (1, 2) or not need <= tables:
                raise self._foreign(f"no '{MARKER_TABLE}' table" if tables else
                                    "an empty SQLite database")
            cols = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
            if not {"created_utc", "kind", "command", "summary", "p99_ns"} <= cols:
                raise self._foreign("its 'runs' table is not ours")
        if ver > SCHEMA_VERSION:
            raise HistoryError(f"{WHAT} {self.path} has schema v{ver}, newer than "
                               f"this hftagent (v{SCHEMA_VERSION}): upgrade hftagent")
        if ver < 1:
            raise self._corrupt(ValueError("no schema version"))
        return ver

    def _ensure_schema(self) -> None:
        con = self.con
        ver = self._identify()
        self._wal()
        if ver == SCHEMA_VERSION:
            return
        con.execute("BEGIN IMMEDIATE")
        try:
            ver = con.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
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
    def __enter__(self) -> Self:
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
        from agent.gate.fingerprint import digest
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
                from agent.stats import quantile  # nearest rank, as the gate's P99
                p50, p99, p999 = (quantile(arr, q) for q in (50.0, 99.0, 99.9))
        try:
            body = json.dumps(summary, default=_json_default)
            fp = json.dumps(fingerprint, default=_json_default) if fingerprint else None
        except (TypeError, ValueError) as exc:
            raise HistoryError(f"run summary is not JSON-serialisable: {exc}") from None
        row = (created_utc or now_utc(), kind, command, scenario, model_path, model_key_,
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
                    (run_id, baseline_id, scenario, status, now_utc(),
                     json.dumps(verdict, default=_json_default)))
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        return int(cur.lastrowid)

    # -- reads
    def _row(self, t: tuple) -> Run | None:
        """The Run of a ``runs`` row (:data:`RUN_COLS`), or None (counted in
        :attr:`skipped`) when a value has a type hftagent never stores there."""
        if not _run_row_ok(t):
            self._bad_runs.add(t[0] if isinstance(t[0], int) else -1 - len(self._bad_runs))
            return None
        fp = _json_or(t[11], None)
        summary = _json_or(t[12], {})
        r = Run(*t[:11], fp if isinstance(fp, dict) else None,
                summary if isinstance(summary, dict) else {}, *t[13:18])
        g = self._q("SELECT status FROM gate_results WHERE run_id = ? ORDER BY id DESC LIMIT 1",
                    (r.id,))
        r.gate_status = g[0][0] if g and isinstance(g[0][0], str) else None
        return r

    def _rows(self, sql: str, args: Iterable = (), limit: int | None = None) -> list[Run]:
        """The good runs of a query, at most ``limit``, skipping (and counting) bad rows."""
        out: list[Run] = []
        try:
            cur = self.con.execute(sql, tuple(args))
            for t in cur:
                r = self._row(t)
                if r is not None:
                    out.append(r)
                    if limit is not None and len(out) >= limit:
                        break
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        return out

    def get(self, run_id: int) -> Run:
        rows = (self._q(f"SELECT {RUN_COLS} FROM runs WHERE id = ?", (int(run_id),))
                if 0 <= int(run_id) <= MAX_RUN_ID else [])  # sqlite3: OverflowError beyond
        if not rows:
            raise HistoryError(f"unknown run id {run_id} in {self.path}")
        r = self._row(rows[0])
        if r is None:
            raise HistoryError(f"run {run_id} in {self.path} has values of the wrong type (a "
                               "BLOB, a NULL, or text that is not UTF-8): skipped")
        return r

    def samples(self, run_id: int) -> np.ndarray | None:
        """The run's raw latencies (None if it stored none). A damaged blob raises
        HistoryError for this run only."""
        rows = self._q("SELECT codec, count, data, sha256 FROM samples WHERE run_id = ?",
                       (int(run_id),))
        if not rows:
            return None
        codec, count, data, sha = rows[0]
        if not (isinstance(codec, str) and isinstance(data, bytes)
                and (count is None or isinstance(count, int))
                and (sha is None or isinstance(sha, str))):
            raise HistoryError(f"run {run_id}: stored samples are damaged (values of the "
                               "wrong type)")
        try:
            return decode_samples(codec, data, count, sha)
        except (ValueError, zlib.error) as exc:
            raise HistoryError(f"run {run_id}: stored samples are damaged ({exc})") from None

    def gate_results(self, run_id: int) -> list[dict]:
        rows = self._q("SELECT id, baseline_id, scenario, status, created_utc, verdict FROM "
                       "gate_results WHERE run_id = ? ORDER BY id", (int(run_id),))
        out = []
        for r in rows:
            if not (isinstance(r[0], int) and _opt(r[1], int) and _opt(r[2], str)
                    and isinstance(r[3], str) and isinstance(r[4], str) and _opt(r[5], str)):
                self._bad_gates.add(r[0] if isinstance(r[0], int) else -1 - len(self._bad_gates))
                continue
            out.append({"id": r[0], "baseline_id": r[1], "scenario": r[2], "status": r[3],
                        "created_utc": r[4], "verdict": _json_or(r[5], None)})
        return out

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


def check_writable(db: str | os.PathLike | None = None) -> Path:
    """Refuse now a database that a run could not be recorded in, before the run (the
    recording itself only warns, after the result is out): anything the opener refuses
    (agent/outfile.py), not SQLite, another application's database, not writable, or no
    writable directory to create it in (a missing directory is an error, never created,
    except the default one in the state directory). Nothing is left behind (a write is tried
    with a file removed at once); an old hftagent database is stamped as ours. Returns the
    path."""
    path = resolve_db(db)
    if is_default(db) and not default_dir(path, create=False):
        parent = path.parent
        while not os.path.lexists(parent) and parent != parent.parent:
            parent = parent.parent  # History() creates the missing directories (0700)
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise HistoryError(f"cannot create {WHAT} {path}: {parent} is not a writable "
                               "directory")
        return path
    with locate_db(path) as t:
        exists = t.st is not None
        try_write(t, exists)
    if exists:
        head = header(path)
        if head and head != SQLITE_MAGIC:
            raise HistoryError(f"{WHAT} {path} is not an SQLite database; it was left "
                               "untouched: move it aside or use --db for a new one")
        Store(path, create=False).close()  # not SQLite, not ours, newer: refused here
    return path
