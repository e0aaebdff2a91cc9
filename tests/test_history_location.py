"""Where the history database is and which paths may be one (agent/history/location.py,
and the store's check_writable that commands call before a run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import agent.history as hs
from agent.history import History, HistoryError, record_run
from tests.test_history_store import FP, lat


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
            "import agent.history, agent.history.render, agent.history.documents, "
            "agent.history.plot, agent.gate.evaluate, agent.gate.fingerprint, "
            "agent.commands.gate, agent.commands.history; "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules; "
            "os.environ['HFTAGENT_DB'] = '/x/y.sqlite'; "
            "assert str(agent.history.resolve_db()) == '/x/y.sqlite'")
    subprocess.run([sys.executable, "-c", code], check=True)


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
