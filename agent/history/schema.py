"""The history database's format: its tables, the migrations from every earlier version, the
sample blobs and how a new file is made.

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
``PRAGMA application_id`` = :data:`APPLICATION_ID`. The marker's value names the module the
history first lived in (agent/gate/history.py); it is the format's name, not a path, and
stays so that every database written before opens after.

A new database is built complete under a temporary name in its directory and linked into
place (``link``: never over an existing file), so that the path never holds a database
without its marker, even while several processes create it at once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sqlite3
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where samples are handled: audit runs carry none
    import numpy as np

from agent.outfile import Target

SCHEMA_VERSION = 3
# PRAGMA application_id of our databases ("HFTA"), in the SQLite header as file(1) reads it:
# a database another application made carries its own id, or 0 and none of our tables.
APPLICATION_ID = 0x48465441
MARKER_TABLE = "hftagent"
MARKER_FORMAT = "hftagent.gate.history"  # the format's name since v3: never changes
KINDS = ("probe", "watch", "audit", "gate", "cpus", "trial")  # cpus: a noise scan; trial: tune try
MAX_RUN_ID = 2**63 - 1  # SQLite's INTEGER PRIMARY KEY is a signed 64-bit integer

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
    con.execute(f"INSERT INTO {MARKER_TABLE} (key, value) VALUES ('format', ?)",
                (MARKER_FORMAT,))
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")


# MIGRATIONS[v] upgrades a database at version v to v + 1.
MIGRATIONS = {1: _migrate_1_to_2, 2: _migrate_2_to_3}


def now_utc() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- sample blobs ----------------------------------------------------------------------------
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


def create_schema(con: sqlite3.Connection) -> None:
    """The whole current schema on a new, empty database (inside the caller's transaction):
    v1, then every migration, so that a new file and a migrated one are alike."""
    for stmt in SCHEMA_V1.split(";"):
        if stmt.strip():
            con.execute(stmt)
    for ver in range(1, SCHEMA_VERSION):
        MIGRATIONS[ver](con)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def create_file(t: Target) -> None:
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
                create_schema(con)
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
