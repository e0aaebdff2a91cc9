"""The store (agent/history/store.py): round trip, corruption, concurrent writers, databases
that are not ours, rows of the wrong type."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from agent.history import History, HistoryError, record_run
from agent.history import store as st
from agent.history.schema import SCHEMA_VERSION

FP = {"version": 1, "hostname": "h", "kernel": "6.1", "cpu_model": "X", "online_cpus": "0-1",
      "governors": "0-1=performance", "turbo": False, "isolated_cpus": "1",
      "nohz_full_cpus": "1", "smt_active": 0, "virtualization": "none", "gpu_models": None,
      "gpu_driver": None, "audit": None}


def lat(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(150_000, 400_000, n).astype(np.int64)


def test_record_and_read_back(tmp_path):
    db = tmp_path / "h.sqlite"
    x = lat(6636)
    rid = record_run("probe", {"latency": {"p99_ns": 123, "count": 6636}}, x, command="probe",
                     builtin="lstm", variant="tflite", tf_version="2.21.0", fingerprint=FP,
                     cold_start_ns=999, db=db)
    with History(db) as h:
        r = h.get(rid)
        assert (r.kind, r.scenario, r.model_key, r.variant) == ("probe", "warm", "builtin:lstm",
                                                               "tflite")
        assert r.p99_ns == 123 and r.sample_count == 6636 and r.cold_start_ns == 999
        assert r.fingerprint["governors"] == "0-1=performance" and r.host_digest
        np.testing.assert_array_equal(h.samples(rid), x)
        codec, blob = h.con.execute("SELECT codec, data FROM samples").fetchone()
        assert codec == "zlib-i64le" and len(blob) < x.nbytes / 2
        assert h.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert h.schema_version() == SCHEMA_VERSION


def test_p99_computed_from_samples_when_summary_lacks_it(tmp_path):
    x = lat(1000)
    rid = record_run("watch", {}, x, command="watch", fingerprint=FP, db=tmp_path / "h.sqlite")
    with History(tmp_path / "h.sqlite") as h:
        r = h.get(rid)
    k = int(np.ceil(0.99 * 1000)) - 1
    assert r.p99_ns == int(np.sort(x)[k])
    assert r.scenario is None and r.model_key is None


def test_unknown_kind_and_unknown_id(tmp_path):
    with History(tmp_path / "h.sqlite") as h:
        with pytest.raises(HistoryError, match="unknown run kind"):
            h.add_run(kind="nope", command="x", summary={})
        with pytest.raises(HistoryError, match="unknown run id 42"):
            h.get(42)


def test_get_beyond_sqlite_range_is_an_unknown_id(tmp_path):
    db = tmp_path / "h.sqlite"
    record_run("probe", {}, lat(10), command="probe", fingerprint=FP, db=db)
    with History(db) as h:
        for rid in (2**63, 10**40, -1):
            with pytest.raises(HistoryError, match="unknown run id"):  # was OverflowError
                h.get(rid)


def test_not_a_database_is_a_clear_error_and_left_untouched(tmp_path):
    db = tmp_path / "h.sqlite"
    junk = b"this is not sqlite at all\n" * 100
    db.write_bytes(junk)
    with pytest.raises(HistoryError, match="unreadable.*left untouched"):
        History(db)
    assert db.read_bytes() == junk


def test_damaged_page_is_a_clear_error_and_file_kept(tmp_path):
    db = tmp_path / "h.sqlite"
    for i in range(30):
        record_run("probe", {"pad": "x" * 2000}, lat(2000, i), command="probe",
                   fingerprint=FP, db=db)
    with History(db) as h:  # checkpoint the WAL into the main file, then damage it
        h.con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    data[4096:4096 * 8] = b"\xff" * (4096 * 7)
    db.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match="unreadable"):
        with History(db) as h:
            h.runs(limit=None)
            for r in h.runs(limit=None):
                h.samples(r.id)
    assert db.read_bytes() == bytes(data)


def test_damaged_sample_blob_loses_only_that_run(tmp_path):
    db = tmp_path / "h.sqlite"
    ids = [record_run("probe", {}, lat(700, i), command="probe", fingerprint=FP, db=db)
           for i in range(3)]
    with History(db) as h:
        h.con.execute("UPDATE samples SET data = ? WHERE run_id = ?", (b"garbage", ids[1]))
        with pytest.raises(HistoryError, match=f"run {ids[1]}: stored samples are damaged"):
            h.samples(ids[1])
        np.testing.assert_array_equal(h.samples(ids[0]), lat(700, 0))
        np.testing.assert_array_equal(h.samples(ids[2]), lat(700, 2))
        assert len(h.runs(limit=None)) == 3


def _writer(db: str, wid: int, n: int) -> None:
    for i in range(n):
        record_run("probe", {"writer": wid, "i": i}, lat(500, wid * 1000 + i), command="probe",
                   builtin="lstm", variant="tflite", fingerprint=FP, db=db)


def test_concurrent_writers(tmp_path):
    db = str(tmp_path / "h.sqlite")  # no file yet: the writers also race to create the schema
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(db, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with History(db) as h:
        runs = h.runs(limit=None)
        assert len(runs) == 60 and len({r.id for r in runs}) == 60
        seen = {(r.summary["writer"], r.summary["i"]) for r in runs}
        assert seen == {(w, i) for w in range(4) for i in range(15)}
        for r in runs[:8]:
            w, i = r.summary["writer"], r.summary["i"]
            np.testing.assert_array_equal(h.samples(r.id), lat(500, w * 1000 + i))


def test_a_database_locked_while_another_process_creates_it_is_waited_for(tmp_path,
                                                                          monkeypatch):
    """Switching a new database to WAL answers "database is locked" at once while another
    process holds it (no busy wait): opening retries within the busy timeout, and says so
    in one line when it runs out."""
    calls = {"n": 0}
    real = st.Store._wal

    def flaky(self):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise sqlite3.OperationalError("database is locked")
        return real(self)
    monkeypatch.setattr(st.Store, "_wal", flaky)
    with History(tmp_path / "h.sqlite") as h:
        assert h.runs(limit=None) == []
    assert calls["n"] >= 3

    def locked(self):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(st.Store, "_wal", locked)
    monkeypatch.setattr(st, "BUSY_TIMEOUT_S", 0.05)
    with pytest.raises(HistoryError, match="database is locked"):
        History(tmp_path / "other.sqlite")


def _file_state(p: Path) -> tuple:
    """The bytes of ``p`` and which of its sidecar files exist."""
    return (p.read_bytes(), sorted(q.name for q in p.parent.iterdir()))


def _foreign_dbs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    p = out["app_id"] = tmp_path / "other-app.sqlite"
    con = sqlite3.connect(p)
    con.execute("PRAGMA application_id = 1196444237")  # another application's id ('GPKG')
    con.execute("CREATE TABLE features (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO features (name) VALUES ('x')")
    con.commit()
    con.close()
    p = out["no_marker"] = tmp_path / "notes.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE notes (t TEXT)")
    con.commit()
    con.close()
    p = out["runs_v1_lookalike"] = tmp_path / "lookalike.sqlite"  # user_version 1, not our runs
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE runs (x)")
    con.execute("CREATE TABLE samples (y)")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    out["empty_file"] = tmp_path / "empty.sqlite"
    out["empty_file"].write_bytes(b"")
    return out


@pytest.mark.parametrize("which", ["app_id", "no_marker", "runs_v1_lookalike", "empty_file"])
def test_a_database_that_is_not_ours_is_refused_and_never_modified(which, tmp_path, capsys):
    """A read command once added our tables to another application's database and switched
    it to WAL (user_version 0 -> 2). Every way in refuses it and leaves it as it was."""
    db = _foreign_dbs(tmp_path)[which]
    before = _file_state(db)
    for create in (True, False):
        with pytest.raises(HistoryError, match="not an hftagent history database.*left "
                                               "untouched"):
            History(db, create=create)
    with pytest.raises(HistoryError, match="not an hftagent history database"):
        st.check_writable(db)
    assert record_run("audit", {}, None, command="audit", db=db, fingerprint=FP,
                      warn=True) is None
    assert "not an hftagent history database" in capsys.readouterr().err
    from typer.testing import CliRunner

    from agent.cli import get_app
    for argv in (["history", "--db", str(db)], ["history", "--db", str(db), "show", "1"],
                 ["history", "--db", str(db), "export"]):
        r = CliRunner().invoke(get_app(), argv)
        assert r.exit_code == 1 and "not an hftagent history database" in r.output, r.output
    assert _file_state(db) == before
    if which != "empty_file":
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        con.close()


def _bad_rows_db(tmp_path: Path) -> Path:
    """Runs 1-7 of one model; 2-5 and 7 damaged: a BLOB where text is stored, text that is
    not UTF-8, a BLOB in an integer column, a NULL where none is stored (the table rebuilt
    without its NOT NULL, as a hand-made database has it), a JSON summary that is a list; and
    run 6's gate verdict and samples of the wrong type."""
    db = tmp_path / "bad.sqlite"
    for i in range(7):
        rid = record_run("probe", {"latency": {"p50_ns": 1000, "p99_ns": 2000 + i,
                                               "p999_ns": 3000}}, lat(50, i),
                         command="probe", builtin="lstm", variant="tflite", fingerprint=FP,
                         db=db)
        with History(db) as h:
            h.add_gate_result(rid, None, "warm", "pass", {"ok": True})
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET created_utc = x'00ff' WHERE id = 2")
    con.execute("UPDATE runs SET summary = CAST(x'ff7b7d' AS TEXT) WHERE id = 3")
    con.execute("UPDATE runs SET p99_ns = x'01' WHERE id = 4")
    con.execute("UPDATE gate_results SET verdict = x'ff' WHERE run_id = 6")
    con.execute("UPDATE samples SET data = 'text, not a blob' WHERE run_id = 6")
    con.execute("UPDATE runs SET summary = '[1, 2]', fingerprint = '\"x\"' WHERE id = 7")
    info = list(con.execute("PRAGMA table_info(runs)"))
    cols = ", ".join(r[1] for r in info)
    decl = ", ".join("id INTEGER PRIMARY KEY AUTOINCREMENT" if r[1] == "id" else
                     f"{r[1]} {r[2]}" for r in info)  # no NOT NULL
    con.executescript(f"""
        PRAGMA foreign_keys = OFF;
        CREATE TABLE runs_loose ({decl});
        INSERT INTO runs_loose ({cols}) SELECT {cols} FROM runs;
        DROP TABLE runs;
        ALTER TABLE runs_loose RENAME TO runs;
        UPDATE runs SET kind = NULL WHERE id = 5;
    """)
    con.commit()
    con.close()
    return db


def test_rows_of_the_wrong_type_are_skipped_and_counted(tmp_path):
    db = _bad_rows_db(tmp_path)
    with History(db) as h:
        runs = h.runs(limit=None)
        assert [r.id for r in runs] == [7, 6, 1]
        assert runs[0].summary == {} and runs[0].fingerprint is None  # JSON of the wrong shape
        assert h.runs(limit=2)[-1].id == 6  # the limit counts good rows
        assert h.gate_results(6) == [] and h.gate_results(1)[0]["status"] == "pass"
        assert h.skipped == 5
        assert "4 run(s) and 1 gate result(s)" in h.skipped_note()
        with pytest.raises(HistoryError, match="run 3 .* wrong type"):
            h.get(3)
        with pytest.raises(HistoryError, match="run 6: stored samples are damaged"):
            h.samples(6)
        assert h.latest_id() == 7
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=7).id == 6
    assert record_run("probe", {}, lat(10), command="probe", fingerprint=FP, db=db) == 8


def test_history_commands_on_rows_of_the_wrong_type(tmp_path):
    """42 "internal error"s over 18 such databases: every command now skips the bad rows
    with one warning, or refuses the one run asked for with one line."""
    from typer.testing import CliRunner

    from agent.cli import get_app
    db = str(_bad_rows_db(tmp_path))
    runner = CliRunner()
    for argv, code in ((["history", "--db", db], 0), (["history", "--db", db, "--json"], 0),
                       (["history", "--db", db, "show", "1"], 0),
                       (["history", "--db", db, "show", "latest", "--json"], 0),
                       (["history", "--db", db, "export"], 0),
                       (["history", "--db", db, "export", "--format", "json", "--samples"], 1),
                       (["history", "--db", db, "export", "--format", "json"], 0),
                       (["history", "--db", db, "plot", "--out", str(tmp_path / "p.png")], 0),
                       (["history", "--db", db, "show", "2"], 1),
                       (["gate", "--db", db, "--run", "7"], None)):
        r = runner.invoke(get_app(), argv)
        assert "internal error" not in r.output and r.exception is None or \
            isinstance(r.exception, SystemExit), (argv, r.output)
        if code is not None:
            assert r.exit_code == code, (argv, r.output)
        assert "Traceback" not in r.output
    r = runner.invoke(get_app(), ["history", "--db", db])
    assert "skipped: values of the wrong type" in r.output


@pytest.mark.adversarial
@pytest.mark.parametrize("what", ["directory", "directory-same-file", "file"])
def test_a_database_swapped_between_the_walk_and_sqlites_open_is_refused(what, tmp_path,
                                                                         monkeypatch):
    """SQLite opens the database by its path after the walk checked it (issue #34 item 2).
    Under the rule only root or we can change a name on that path; here we do, between the
    walk and the open (the directory, or the file in it, replaced by another; or another
    directory with a hard link of the same file, where SQLite would have replayed a -wal
    file planted beside it into our database): the store walks again after the open and
    refuses, and the one swapped in is not touched."""
    import os
    import shutil

    d = tmp_path / "d"
    d.mkdir()
    db = d / "h.sqlite"
    record_run("probe", {}, lat(10), command="probe", fingerprint=FP, db=db)
    spare = tmp_path / "spare"
    spare.mkdir()
    if what == "directory-same-file":
        os.link(db, spare / "h.sqlite")
    else:
        shutil.copy(db, spare / "h.sqlite")
    before = (spare / "h.sqlite").read_bytes()
    connect, swapped = st.sqlite3.connect, []

    def swap(path, *args, **kwargs):
        if Path(path) == db and not swapped:
            swapped.append(path)
            if what.startswith("directory"):
                d.rename(tmp_path / "moved")
                spare.rename(d)
            else:
                os.rename(spare / "h.sqlite", db)
        return connect(path, *args, **kwargs)

    monkeypatch.setattr(st.sqlite3, "connect", swap)
    with pytest.raises(HistoryError, match="changed while it was opened: refused"):
        History(db, create=False)
    assert db.read_bytes() == before and sorted(os.listdir(d)) == ["h.sqlite"]
