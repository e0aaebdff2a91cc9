"""Where the history database is and which paths may be one (agent/history/location.py,
and the store's check_writable that commands call before a run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


# ---- the one rule for the database's directory (issue #34 item 2) ---------------------------


def _where(how: str, give: Path) -> tuple[list[str], dict[str, str], Path]:
    """(options, environment, database path) for a database below ``give`` named by ``how``:
    --db, $HFTAGENT_DB or the default in $XDG_STATE_HOME."""
    if how == "--db":
        return ["--db", str(give / "h.sqlite")], {}, give / "h.sqlite"
    if how == "HFTAGENT_DB":
        return [], {"HFTAGENT_DB": str(give / "h.sqlite")}, give / "h.sqlite"
    return [], {"XDG_STATE_HOME": str(give / "st")}, give / "st" / "hftagent" / "history.sqlite"


def _cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("HFTAGENT_DB", "XDG_STATE_HOME")}
    return subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", *argv],
                          capture_output=True, text=True, timeout=120,
                          env={**base, "HOME": "/nonexistent", **env})


@pytest.mark.parametrize("how", ["--db", "HFTAGENT_DB", "XDG_STATE_HOME"])
def test_a_database_below_another_users_directory_is_refused_real_cli(how, tmp_path, user):
    """A run that would create the database (audit records one) and a listing of one that
    is there, with it below another user's directory, through their link, or in a group- or
    world-writable directory that is not sticky: one line naming that component (exit 1; a
    warning that the run is not recorded where the database was not named by --db), nothing
    created or changed (the default directory was made before its parents were
    checked). Root's sticky directory and root's own link: recorded and listed."""
    from tests.test_agent_outfile import ALLOWED, REFUSED, _layout, _tree, make_db
    _name, uid, gid = user
    src = make_db(tmp_path / "src.sqlite")
    for kind in REFUSED + ALLOWED:
        give, land, named = _layout(tmp_path / kind, kind, uid, gid)
        opts, env, db = _where(how, give)
        for argv, there in ((["audit", "--steal-window", "0", *opts], False),
                            (["history", *opts], True)):
            if there and named is not None:  # a database of ours waiting there
                real = land / db.relative_to(give)
                real.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, real)
            before = _tree(tmp_path / kind)
            r = _cli(argv, env)
            lines = r.stderr.strip().splitlines()
            shown = f"{kind} {argv[0]}: rc={r.returncode} stderr={r.stderr!r}"
            if named is None:
                assert r.returncode in ((0,) if there else (0, 2)), shown
                assert (land / db.relative_to(give)).is_file(), shown
                continue
            assert len(lines) == 1 and f"{named[0]} {named[1]}" in lines[0], shown
            if there or how == "--db":
                assert r.returncode == 1 and lines[0].startswith("hftagent: error: "), shown
            else:  # a database nobody asked for by name: the run goes on, unrecorded
                assert lines[0].startswith("hftagent: warning: run will not be recorded"), shown
            assert _tree(tmp_path / kind) == before, f"{shown}: something was created"
