"""The format on disk (agent/history/schema.py): migrations from v1, atomic, a newer schema
refused, the marker on new databases and old ones stamped."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from agent.history import History, HistoryError
from agent.history import schema as hs
from tests.test_history_store import FP, lat


def make_v1(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A database as the first release wrote it: schema v1, raw int64 sample blobs."""
    con = sqlite3.connect(path)
    con.executescript(hs.SCHEMA_V1)
    a, b = lat(800, 1), lat(900, 2)
    for i, (x, kind) in enumerate(((a, "probe"), (b, "probe"), (None, "audit")), 1):
        con.execute("INSERT INTO runs (id, created_utc, kind, command, model_key, variant, "
                    "fingerprint, summary, sample_count, p99_ns) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (i, f"2025-01-0{i}T00:00:00Z", kind, kind, "builtin:lstm", "xla",
                     json.dumps(FP), "{}", None if x is None else x.size, 1))
        if x is not None:
            con.execute("INSERT INTO samples (run_id, data) VALUES (?, ?)",
                        (i, x.astype("<i8").tobytes()))
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    return a, b


def test_migrates_v1_to_v2_keeping_every_run(tmp_path):
    db = tmp_path / "old.sqlite"
    a, b = make_v1(db)
    with History(db) as h:
        assert h.schema_version() == hs.SCHEMA_VERSION
        runs = h.runs(limit=None)
        assert [r.id for r in runs] == [3, 2, 1]
        assert [r.scenario for r in runs] == [None, "warm", "warm"]
        assert runs[1].host_digest is not None
        np.testing.assert_array_equal(h.samples(1), a)
        np.testing.assert_array_equal(h.samples(2), b)
        rid = h.add_run(kind="probe", command="probe", summary={}, samples_ns=a,
                        scenario="warm", model_key_="builtin:lstm", variant="xla")
        h.add_gate_result(rid, 2, "warm", "pass", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="xla", scenario="warm",
                           before=rid + 1).id == rid


def test_migration_is_atomic(tmp_path, monkeypatch):
    db = tmp_path / "old.sqlite"
    make_v1(db)

    def boom(con):
        con.execute("ALTER TABLE runs ADD COLUMN scenario TEXT")
        raise RuntimeError("crash mid-migration")
    monkeypatch.setitem(hs.MIGRATIONS, 1, boom)
    with pytest.raises(RuntimeError):
        History(db)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 1
    cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    assert "scenario" not in cols and con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    con.close()
    monkeypatch.undo()
    with History(db) as h:
        assert h.schema_version() == hs.SCHEMA_VERSION and len(h.runs(limit=None)) == 3


def test_newer_schema_is_refused(tmp_path):
    db = tmp_path / "new.sqlite"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA application_id = {hs.APPLICATION_ID}")  # ours, from a later release
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(HistoryError, match="newer than this hftagent"):
        History(db)


def test_ours_carry_the_marker_and_old_ones_are_stamped(tmp_path):
    new = tmp_path / "new.sqlite"
    History(new).close()
    head = new.read_bytes()[:100]
    assert int.from_bytes(head[68:72], "big") == hs.APPLICATION_ID  # as file(1) reads it
    con = sqlite3.connect(new)
    assert con.execute("SELECT value FROM hftagent WHERE key = 'format'").fetchone() == \
        ("hftagent.gate.history",)
    con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.sqlite"]  # no temporary left
    # v1 and v2 databases of earlier releases: known by version and tables, then stamped
    old = tmp_path / "old.sqlite"
    a, _b = make_v1(old)
    with History(old) as h:
        np.testing.assert_array_equal(h.samples(1), a)
    con = sqlite3.connect(old)
    assert con.execute("PRAGMA application_id").fetchone()[0] == hs.APPLICATION_ID
    assert con.execute("SELECT count(*) FROM hftagent").fetchone()[0] == 1
    con.close()
