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
    hftagent(key, value)   the marker: ('format', 'hftagent.gate.history')  (v3)

v1 (the first release) had no ``scenario``/``host_digest`` columns, stored samples as raw
int64 bytes without a codec and had no gate results. v2 compresses samples
(``zlib-i64le``: zlib over little-endian int64, ~3-4× smaller on probe latencies) and keeps
v1 blobs readable as ``raw-i64le``. v3 marks the file as ours: the ``hftagent`` table and
``PRAGMA application_id`` = :data:`APPLICATION_ID`.

Ours or not (issue #30 item 5): a database is opened only when it is ours — our
application_id, or our marker table, or (v1/v2, before the marker) our user_version with our
tables, which is then stamped. Any other SQLite file (another application's id, or none of
our tables: an empty file included) is refused with one line before anything is written to it
(no table added, no switch to WAL). A new database is built complete under a temporary name in
its directory and linked into place (``link``: never over an existing file), so that the path
never holds a database without its marker, even while several processes create it at once.
The path is checked by the output opener's rules first (agent/outfile.py): never a symlink,
a regular file we own, in a directory nobody else can change; its directory is never
created, except the default one in the state directory (0700).

Concurrency: WAL journal, a 30 s busy timeout and ``BEGIN IMMEDIATE`` for every write, so
several processes (probe runs in parallel CI jobs, watch) can record at once. A file that is
not SQLite, or is damaged, raises :class:`HistoryError` with one line and is never modified or
replaced; a damaged sample blob fails only that run's samples (checked with its SHA-256). A
row with a value of the wrong type (a BLOB, a NULL, text that is not UTF-8 where hftagent
stores none) is skipped and counted (:attr:`History.skipped`), never an error.
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
from agent.outfile import OutputError, Target, locate

SCHEMA_VERSION = 3
# PRAGMA application_id of our databases ("HFTA"), in the SQLite header as file(1) reads it:
# a database another application made carries its own id, or 0 and none of our tables.
APPLICATION_ID = 0x48465441
MARKER_TABLE = "hftagent"
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


WHAT = "history database"


def _is_default(db: str | os.PathLike | None) -> bool:
    """Whether the database is the state directory's (neither --db nor $HFTAGENT_DB): the
    only one whose missing directories are created (mode 0700, tuning/safepath.py)."""
    return db is None and not os.environ.get("HFTAGENT_DB")


def _locate(path: Path) -> Target:
    """The database's :class:`agent.outfile.Target`, by the output opener's rules (no symlink
    of another user followed, the file itself never a symlink, its directory never created),
    and refused unless it is nothing yet or a regular file we own in a directory nobody else
    can change under us (SQLite opens it by path, after this check). HistoryError."""
    try:
        t = locate(path, WHAT)
    except OutputError as exc:
        raise HistoryError(str(exc)) from None
    try:
        t.check_replaceable()
        t.check_private_dir()
    except OutputError as exc:
        t.close()
        raise HistoryError(str(exc)) from None
    return t


def db_exists(db: str | os.PathLike | None = None) -> bool:
    """Whether the history database exists (False only when nothing is at its path). Anything
    there that cannot be our database (a directory, a FIFO, a device, a symlink, another
    user's file) raises HistoryError, so that a listing never reports "no runs yet" for a
    path that is wrong."""
    path = resolve_db(db)
    try:
        t = locate(path, WHAT)
    except OutputError as exc:
        if exc.missing:
            return False
        raise HistoryError(str(exc)) from None
    with t:
        if t.st is None:
            return False
    with _locate(path) as t:
        return t.st is not None


SQLITE_MAGIC = b"SQLite format 3\0"


def _header(path: Path) -> bytes | None:
    """The first 16 bytes of ``path`` (None if it cannot be opened). O_NOFOLLOW, O_NONBLOCK
    and fstat: a symlink or a FIFO swapped in after the check is neither followed, nor
    blocks the open, nor is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HistoryError(f"{WHAT} path {path} is not a regular file")
        return os.read(fd, 16)
    finally:
        os.close(fd)


def _try_write(t: Target, exists: bool) -> None:
    """Whether a run can be recorded at ``t``, tried rather than guessed from mode bits (root
    passes every access() check, yet not a read-only mount or an immutable directory): a file
    created and removed in its directory (SQLite puts its -wal and -shm files there), and the
    database itself opened for writing (not written)."""
    import secrets
    probe = f".hftagent-{secrets.token_hex(8)}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=t.dfd))
        os.unlink(probe, dir_fd=t.dfd)
    except OSError as exc:
        raise HistoryError(f"cannot {'write' if exists else 'create'} {WHAT} {t.shown}: "
                           f"{t.directory} is not a writable directory ({exc.strerror})"
                           ) from None
    if exists:
        try:
            os.close(os.open(t.name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=t.dfd))
        except OSError as exc:
            raise HistoryError(f"{WHAT} {t.shown} is not writable ({exc.strerror})") from None


def check_writable(db: str | os.PathLike | None = None) -> Path:
    """Refuse now a database that a run could not be recorded in, before the run (the
    recording itself only warns, after the result is out): anything the opener refuses
    (agent/outfile.py), not SQLite, another application's database, not writable, or no
    writable directory to create it in (a missing directory is an error, never created,
    except the default one in the state directory). Nothing is left behind (a write is tried
    with a file removed at once); an old hftagent database is stamped as ours. Returns the
    path."""
    path = resolve_db(db)
    if _is_default(db) and not os.path.lexists(path.parent):
        parent = path.parent
        while not os.path.lexists(parent) and parent != parent.parent:
            parent = parent.parent  # History() creates the missing directories (0700)
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise HistoryError(f"cannot create {WHAT} {path}: {parent} is not a writable "
                               "directory")
        return path
    with _locate(path) as t:
        exists = t.st is not None
        _try_write(t, exists)
    if exists:
        head = _header(path)
        if head and head != SQLITE_MAGIC:
            raise HistoryError(f"{WHAT} {path} is not an SQLite database; it was left "
                               "untouched: move it aside or use --db for a new one")
        History(path, create=False).close()  # not SQLite, not ours, newer: refused here
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
    from agent.gate.fingerprint import digest
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


def _migrate_2_to_3(con: sqlite3.Connection) -> None:
    """The marker: our table and our application_id, so that a database is known as ours
    (or not) before anything is written to it."""
    con.execute(f"CREATE TABLE {MARKER_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute(f"INSERT INTO {MARKER_TABLE} (key, value) VALUES ('format', 'hftagent.gate.history')")
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")


# MIGRATIONS[v] upgrades a database at version v to v + 1.
MIGRATIONS = {1: _migrate_1_to_2, 2: _migrate_2_to_3}


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


def _opt(v: Any, typ: type) -> bool:
    """``v`` is None or of type ``typ``."""
    return v is None or isinstance(v, typ)


def _run_row_ok(t: tuple) -> bool:
    """Whether a ``runs`` row (:data:`_RUN_COLS`) holds the types hftagent stores: text where
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


def _while_locked(fn, timeout_s: float | None = None):
    """``fn()``, again while SQLite says the database is locked, for up to ``timeout_s``
    (BUSY_TIMEOUT_S). The busy timeout does not cover every lock: switching a new database
    to WAL needs it exclusively, and SQLite answers "database is locked" at once, without
    waiting, where waiting could deadlock (several processes creating the same history at
    once: tests/test_gate_history.py test_concurrent_writers failed so in one CI run). The schema
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


def _make_default_dir(path: Path) -> None:
    """The state directory of the default database, created (0700) when missing, resolved as
    tuning/safepath.py's open_dir does: only symlinks of root or ours followed, and refused
    unless it is ours (or root's) and nobody else may write in it."""
    from tuning.safepath import UnsafePath, open_dir
    try:
        fd = open_dir(path.parent, create=True)
    except UnsafePath as exc:
        raise HistoryError(f"{WHAT} {path}: {exc}") from None
    except OSError as exc:
        raise HistoryError(f"cannot create {WHAT} {path}: {exc.strerror or exc}") from None
    if fd is not None:
        os.close(fd)


def _create_schema(con: sqlite3.Connection) -> None:
    """The whole current schema on a new, empty database (inside the caller's transaction):
    v1, then every migration, so that a new file and a migrated one are alike."""
    for stmt in SCHEMA_V1.split(";"):
        if stmt.strip():
            con.execute(stmt)
    for ver in range(1, SCHEMA_VERSION):
        MIGRATIONS[ver](con)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _create(t: Target) -> None:
    """Make a new database at ``t`` (module docstring): built complete under an unpredictable
    name in its directory (``O_CREAT|O_EXCL|O_NOFOLLOW``), then linked to its name, which
    fails if anything is there by then (another process creating the same database: theirs is
    used, ours removed)."""
    import errno
    import secrets
    tmp = f".hftagent-{secrets.token_hex(8)}.sqlite-new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=t.dfd)
    os.close(fd)
    try:
        con = sqlite3.connect(t.directory / tmp, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                _create_schema(con)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        finally:
            con.close()
        try:
            os.link(tmp, t.name, src_dir_fd=t.dfd, dst_dir_fd=t.dfd, follow_symlinks=False)
        except FileExistsError:
            pass  # created by another process meanwhile: that one is opened (and checked)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            # a filesystem without hard links (vfat, some FUSE): a rename, when still free
            if not os.path.lexists(t.real):
                os.rename(tmp, t.name, src_dir_fd=t.dfd, dst_dir_fd=t.dfd)
    finally:
        for name in (tmp, f"{tmp}-journal"):
            try:
                os.unlink(name, dir_fd=t.dfd)
            except OSError:
                pass


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


class History:
    """An open history database. Use as a context manager; every write is its own short
    ``BEGIN IMMEDIATE`` transaction. ``create``: make the database when nothing is at its
    path (else HistoryError "no history database"). Only our databases are opened (module
    docstring). :attr:`skipped`: rows skipped so far for values of the wrong type."""

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True) -> None:
        self.path = resolve_db(path)
        self._bad_runs: set[int] = set()
        self._bad_gates: set[int] = set()
        if create and _is_default(path):
            _make_default_dir(self.path)
        elif not create and not os.path.lexists(self.path):
            raise HistoryError(f"no {WHAT} at {self.path}")
        try:
            with _locate(self.path) as t:
                if t.st is None:
                    if not create:
                        raise HistoryError(f"no {WHAT} at {self.path}")
                    _create(t)
                    t.restat()
                    t.check_replaceable()
                if t.st is None:
                    raise HistoryError(f"{WHAT} {self.path} was removed while it was opened")
                real, ident = t.real, (t.st.st_dev, t.st.st_ino)
        except OutputError as exc:
            raise HistoryError(str(exc)) from None
        except OSError as exc:
            raise HistoryError(f"cannot create {WHAT} {self.path}: {exc.strerror or exc}"
                               ) from None
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot create {WHAT} {self.path}: {exc}") from None
        self._real = real
        try:
            self._check_sqlite()
        except sqlite3.DatabaseError as exc:
            raise self._corrupt(exc) from None
        try:
            self.con = sqlite3.connect(real, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"cannot open {WHAT} {self.path}: {exc}") from None
        try:
            st = os.stat(real, follow_symlinks=False)
            if (st.st_dev, st.st_ino) != ident:  # swapped between the check and the open
                raise HistoryError(f"{WHAT} {self.path} changed while it was opened: refused")
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
        head = _header(self._real)
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
                from agent.gate.evaluate import P99, quantile_nr
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
    def _row(self, t: tuple) -> Run | None:
        """The Run of a ``runs`` row (:data:`_RUN_COLS`), or None (counted in
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
        return self._rows(sql, args, limit)

    def get(self, run_id: int) -> Run:
        rows = (self._q(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (int(run_id),))
                if 0 <= int(run_id) <= MAX_RUN_ID else [])  # sqlite3: OverflowError beyond
        if not rows:
            raise HistoryError(f"unknown run id {run_id} in {self.path}")
        r = self._row(rows[0])
        if r is None:
            raise HistoryError(f"run {run_id} in {self.path} has values of the wrong type (a "
                               "BLOB, a NULL, or text that is not UTF-8): skipped")
        return r

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
        if not (isinstance(codec, str) and isinstance(data, bytes)
                and (count is None or isinstance(count, int))
                and (sha is None or isinstance(sha, str))):
            raise HistoryError(f"run {run_id}: stored samples are damaged (values of the "
                               "wrong type)")
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
        runs = self._rows(
            f"SELECT {_RUN_COLS} FROM runs WHERE id < ? AND kind IN ('probe', 'gate') "
            "AND model_key IS ? AND variant IS ? AND scenario IS ? ORDER BY id DESC",
            (before, model_key_, variant, scenario))
        for r in runs:
            if r.gate_status == "pass":
                return r
        return next((r for r in runs if r.gate_status is None), None)

    def baseline_family(self, *, model_key_: str | None, variant: str | None,
                        scenario: str | None, before: int, limit: int) -> list[Run]:
        """Up to ``limit`` earlier runs of the same model key, variant and scenario that did
        not fail a gate (passed, or never gated), newest first: the runs whose spread tells
        how much P99 moves from one run to the next on this host."""
        runs = self._rows(
            f"SELECT {_RUN_COLS} FROM runs WHERE id < ? AND kind IN ('probe', 'gate') "
            "AND model_key IS ? AND variant IS ? AND scenario IS ? ORDER BY id DESC",
            (before, model_key_, variant, scenario))
        return [r for r in runs if r.gate_status in (None, "pass") and r.p99_ns][:limit]

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
    from agent.gate import fingerprint as fpm
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
    from agent.gate import fingerprint as fpm
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


# What a watch summary (agent/watch/summary.py build) carries only for the live run: the
# collectors' and sampler's health, the kernel events' counters, the flight record paths.
WATCH_LIVE_ONLY = ("collectors", "sampler", "events", "flight_records")


def watch_record(summary: dict) -> dict:
    """The history summary of a ``hftagent watch`` run (kind "watch"): its summary less
    :data:`WATCH_LIVE_ONLY`, with ``causes`` as {cause: spikes} (``history show`` renders
    them; the examples move to ``cause_examples``), ``samples``, ``spikes``, ``p50_us`` and
    ``p99_us`` as watch printed them, and ``latency`` ({p50,p99,p999}_ns, count) for the
    indexed columns."""
    out = {k: v for k, v in summary.items() if k not in WATCH_LIVE_ONLY}
    causes = summary.get("causes") or {}
    out["causes"] = {c: d["count"] if isinstance(d, dict) else d for c, d in causes.items()}
    out["cause_examples"] = {c: d.get("top", []) for c, d in causes.items()
                             if isinstance(d, dict) and d.get("top")}

    def ns(us: Any) -> int | None:
        return None if not isinstance(us, int | float) else int(round(us * 1000))
    out["latency"] = {"p50_ns": ns(summary.get("p50_us")), "p99_ns": ns(summary.get("p99_us")),
                      "p999_ns": ns(summary.get("p999_us")), "count": summary.get("samples")}
    return out


def record_watch(summary: dict, *, probe: str | None = None, model: str | None = None,
                 variant: str | None = None, command: str = "watch",
                 db: str | os.PathLike | None = None, fingerprint: dict | None = None,
                 warn: bool = False) -> int | None:
    """Store one watch run (kind "watch", :func:`watch_record` of its summary, the host
    fingerprint taken now unless given) and return its id. ``probe``, ``model``, ``variant``:
    the run's WatchConfig values; the built-in probes (tf: the model and variant; numpy: the
    numpy stand-in) give the run its model key, an external or attached process none. No
    per-sample latencies: watch keeps a histogram, not the samples. ``warn=True``: a history
    failure is one warning line on stderr and None, as for a probe."""
    builtin = path = None
    if probe == "tf":
        path, builtin = (model, None) if model and os.path.exists(model) else \
            (None, model or "lstm")
    elif probe == "numpy":
        builtin, variant = "numpy", "numpy"
    else:
        variant = None
    return record_run("watch", watch_record(summary), None, command=command, model_path=path,
                      builtin=builtin, variant=variant, fingerprint=fingerprint, db=db,
                      warn=warn)
