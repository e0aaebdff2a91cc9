"""History store: location, round trip, v1 → v2 migration, concurrent writers, corruption."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.gate import history as hs
from agent.gate.history import History, HistoryError, record_probe, record_run

FP = {"version": 1, "hostname": "h", "kernel": "6.1", "cpu_model": "X", "online_cpus": "0-1",
      "governors": "0-1=performance", "turbo": False, "isolated_cpus": "1",
      "nohz_full_cpus": "1", "smt_active": 0, "virtualization": "none", "gpu_models": None,
      "gpu_driver": None, "audit": None}


def lat(n: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(150_000, 400_000, n).astype(np.int64)


# -- location -----------------------------------------------------------------------------------
def test_db_path_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("HFTAGENT_DB", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert hs.resolve_db() == tmp_path / "state/hftagent/history.sqlite"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hs.resolve_db() == tmp_path / "home/.local/state/hftagent/history.sqlite"
    monkeypatch.setenv("HFTAGENT_DB", str(tmp_path / "env.sqlite"))
    assert hs.resolve_db() == tmp_path / "env.sqlite"           # read at call time
    assert hs.resolve_db(tmp_path / "arg.sqlite") == tmp_path / "arg.sqlite"


def test_import_reads_no_environment_and_no_tensorflow():
    code = ("import os, sys; os.environ.pop('HFTAGENT_DB', None); "
            "import agent.gate.history, agent.gate.evaluate, agent.gate.fingerprint, agent.commands.gate, "
            "agent.commands.history; "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules; "
            "os.environ['HFTAGENT_DB'] = '/x/y.sqlite'; "
            "assert str(agent.gate.history.resolve_db()) == '/x/y.sqlite'")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- round trip ---------------------------------------------------------------------------------
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
        assert h.schema_version() == hs.SCHEMA_VERSION


def test_p99_computed_from_samples_when_summary_lacks_it(tmp_path):
    x = lat(1000)
    rid = record_run("watch", {}, x, command="watch", fingerprint=FP, db=tmp_path / "h.sqlite")
    with History(tmp_path / "h.sqlite") as h:
        r = h.get(rid)
    k = int(np.ceil(0.99 * 1000)) - 1
    assert r.p99_ns == int(np.sort(x)[k])
    assert r.scenario is None and r.model_key is None


def test_model_hash_changes_with_content(tmp_path):
    d = tmp_path / "sm"
    (d / "variables").mkdir(parents=True)
    (d / "saved_model.pb").write_bytes(b"a")
    (d / "variables/v").write_bytes(b"b")
    h1 = hs.model_hash(str(d))
    (d / "variables/v").write_bytes(b"c")
    assert hs.model_hash(str(d)) != h1 and len(h1) == 64
    assert hs.model_hash(str(tmp_path / "missing")) is None


def test_unknown_kind_and_unknown_id(tmp_path):
    with History(tmp_path / "h.sqlite") as h:
        with pytest.raises(HistoryError, match="unknown run kind"):
            h.add_run(kind="nope", command="x", summary={})
        with pytest.raises(HistoryError, match="unknown run id 42"):
            h.get(42)


def test_last_pass(tmp_path):
    db = tmp_path / "h.sqlite"
    ids = [record_run("probe", {}, lat(700, i), command="probe", builtin="lstm",
                      variant="tflite", fingerprint=FP, db=db) for i in range(4)]
    other = record_run("probe", {}, lat(700), command="probe", builtin="lstm", variant="xla",
                       fingerprint=FP, db=db)
    with History(db) as h:
        # Nothing gated yet: the previous run of the same model/variant/scenario.
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[3]).id == ids[2]
        h.add_gate_result(ids[1], ids[0], "warm", "pass", {})
        h.add_gate_result(ids[2], ids[1], "warm", "fail", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[3]).id == ids[1]
        assert h.last_pass(model_key_="builtin:lstm", variant="xla", scenario="warm",
                           before=other) is None
        assert h.get(ids[2]).gate_status == "fail"
    # No run passed yet: the newest ungated one, never a failed one.
    db2 = tmp_path / "h2.sqlite"
    ids = [record_run("probe", {}, lat(700, i), command="probe", builtin="lstm",
                      variant="tflite", fingerprint=FP, db=db2) for i in range(3)]
    with History(db2) as h:
        h.add_gate_result(ids[1], ids[0], "warm", "fail", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[2]).id == ids[0]
        h.add_gate_result(ids[0], None, "warm", "fail", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[2]) is None


# -- migration from v1 ----------------------------------------------------------------------------
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


# -- corruption -------------------------------------------------------------------------------------
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


# -- concurrent writers -------------------------------------------------------------------------------
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


def test_audit_summary_rides_along_in_later_fingerprints(tmp_path):
    db = tmp_path / "h.sqlite"
    report = {"findings": [{"id": "a", "status": "ok"}, {"id": "b", "status": "fail"},
                           {"id": "c", "status": "fail"}]}
    aid = record_run("audit", report, None, command="audit", fingerprint=dict(FP), db=db)
    pid = record_run("probe", {}, lat(700), command="probe", fingerprint=dict(FP), db=db)
    other = record_run("probe", {}, lat(700), command="probe", db=db,
                       fingerprint=dict(FP, kernel="6.9"))
    with History(db) as h:
        assert h.get(aid).fingerprint["audit"] == {"ok": 1, "fail": 2}
        assert h.get(pid).fingerprint["audit"] == {"run_id": aid, "ok": 1, "fail": 2}
        assert h.get(other).fingerprint["audit"] is None   # another host configuration


def _probe_result(n_runs: int = 2):
    from agent.probe import stats
    from agent.probe.harness import COLUMNS, Samples
    from agent.probe.result import ProbeResult, RunResult
    runs, arrays = [], []
    for i in range(n_runs):
        x = lat(800, i)
        data = np.zeros((len(COLUMNS), x.size), dtype=np.int64)
        data[COLUMNS.index("end_ns")] = x
        runs.append(RunResult(variant=["xla", "tflite"][i], batch=1, config={"id": "c"},
                              cold_start_ns=5_000 + i, latency=stats.summarize(x)))
        arrays.append(Samples(data, open_loop=False))
    runs.append(RunResult(variant="tf-trt", batch=1, config={"id": "c"}, status="unavailable"))
    arrays.append(None)
    res = ProbeResult(host={"tensorflow": "2.21.0"}, model={"name": "builtin:lstm"},
                      settings={"model": {"path": None, "builtin": "lstm"}}, runs=runs,
                      created_utc="2025-01-01T00:00:00Z")
    return res, arrays


def test_record_probe_hook(tmp_path):
    db = tmp_path / "h.sqlite"
    res, arrays = _probe_result()
    ids = record_probe(res, arrays, db=db, fingerprint=FP)
    assert len(ids) == 2                                   # the unavailable run has no samples
    with History(db) as h:
        a, b = h.get(ids[0]), h.get(ids[1])
        assert (a.variant, b.variant) == ("xla", "tflite")
        assert a.tf_version == "2.21.0" and a.cold_start_ns == 5_000 and a.scenario == "warm"
        assert a.summary["run"]["variant"] == "xla"
        np.testing.assert_array_equal(h.samples(ids[1]), lat(800, 1))
    # run_config's {column: array} form is accepted as well
    ids2 = record_probe(res, [s.as_dict() if s else None for s in arrays], db=db, fingerprint=FP)
    with History(db) as h:
        np.testing.assert_array_equal(h.samples(ids2[0]), lat(800, 0))


def test_hooks_warn_instead_of_failing(tmp_path, capsys):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"junk" * 100)
    res, arrays = _probe_result(1)
    assert record_probe(res, arrays, db=bad, fingerprint=FP, warn=True) == []
    assert record_run("audit", {}, None, command="audit", db=bad, fingerprint=FP,
                      warn=True) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("hftagent: warning: run not recorded") for e in err)
    with pytest.raises(HistoryError):
        record_probe(res, arrays, db=bad, fingerprint=FP)
    assert bad.read_bytes() == b"junk" * 100


# -- ids, kinds and paths a user gives (issue #13) ------------------------------------------------
def test_parse_run_id_takes_ascii_digits_in_sqlite_range():
    assert hs.parse_run_id("42") == 42
    assert hs.parse_run_id(str(2**63 - 1)) == 2**63 - 1
    # int() takes all but the last two of these; sqlite3 overflows on the last two
    for bad in ["", " 1", "1 ", "+1", "1_0", "٣", "-1", "1.0", "0x1", "0", str(2**63),
                "1234567890123456789012345678901234567890"]:
        with pytest.raises(HistoryError, match="--run"):
            hs.parse_run_id(bad, "--run")


def test_get_beyond_sqlite_range_is_an_unknown_id(tmp_path):
    db = tmp_path / "h.sqlite"
    record_run("probe", {}, lat(10), command="probe", fingerprint=FP, db=db)
    with History(db) as h:
        for rid in (2**63, 10**40, -1):
            with pytest.raises(HistoryError, match="unknown run id"):  # was OverflowError
                h.get(rid)


def test_unknown_kind_filter_is_refused(tmp_path):
    with History(tmp_path / "h.sqlite") as h:
        assert h.runs(kind="audit") == []
        with pytest.raises(HistoryError, match="--kind must be one of probe, watch"):
            h.runs(kind="bogus")


def test_paths_that_cannot_be_a_database_fail_at_once(tmp_path):
    import os
    import signal

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    os.symlink(loop, loop)

    def hang(*_):
        raise AssertionError("blocked: a FIFO was opened")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(10)
    try:
        for path, msg in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"),
                          (tmp_path, "is a directory"), (loop, "symbolic link")):
            for create in (True, False):
                with pytest.raises(HistoryError, match=msg):
                    History(path, create=create)
            with pytest.raises(HistoryError, match=msg):
                hs.db_exists(path)
            with pytest.raises(HistoryError, match=msg):
                hs.check_writable(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not hs.db_exists(tmp_path / "missing.sqlite")
    with pytest.raises(HistoryError, match="--db is empty"):
        hs.resolve_db("")


def test_check_writable(tmp_path):
    missing = tmp_path / "a" / "b" / "h.sqlite"
    with pytest.raises(HistoryError, match="directory .*/a/b does not exist"):
        hs.check_writable(missing)  # a missing directory is an error, never created (#28.4)
    with pytest.raises(HistoryError, match="does not exist"):
        record_run("probe", {}, lat(10), command="probe", fingerprint=FP, db=missing)
    assert not (tmp_path / "a").exists()
    new = tmp_path / "h.sqlite"
    assert hs.check_writable(new) == new and not new.exists()  # nothing is created
    notdb = tmp_path / "notdb.sqlite"
    notdb.write_text("hello")
    with pytest.raises(HistoryError, match="not an SQLite database"):
        hs.check_writable(notdb)
    assert notdb.read_text() == "hello"
    with pytest.raises(HistoryError, match="Not a directory|not a writable directory|is not a directory"):
        hs.check_writable(notdb / "under-a-file.sqlite")
    record_run("probe", {}, lat(10), command="probe", fingerprint=FP, db=new)
    assert hs.check_writable(new) == new


def test_a_database_locked_while_another_process_creates_it_is_waited_for(tmp_path,
                                                                          monkeypatch):
    """Switching a new database to WAL answers "database is locked" at once while another
    process holds it (no busy wait): opening retries within the busy timeout, and says so
    in one line when it runs out."""
    import agent.gate.history as hist
    calls = {"n": 0}
    real = hist.History._wal

    def flaky(self):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise sqlite3.OperationalError("database is locked")
        return real(self)
    monkeypatch.setattr(hist.History, "_wal", flaky)
    with History(tmp_path / "h.sqlite") as h:
        assert h.runs(limit=None) == []
    assert calls["n"] >= 3

    def locked(self):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(hist.History, "_wal", locked)
    monkeypatch.setattr(hist, "BUSY_TIMEOUT_S", 0.05)
    with pytest.raises(hist.HistoryError, match="database is locked"):
        History(tmp_path / "other.sqlite")


# -- ours or not (issue #30 items 5, 8) ----------------------------------------------------------
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
        hs.check_writable(db)
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


# -- rows of the wrong type (issue #30 item 8) -------------------------------------------------
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
