"""The package as installed: `--version`, `hftagent deploy --out DIR` (the deployment files
shipped as package data), and a reader that closes stdout early. The non-editable wheel
itself is built, installed and smoke-tested from / by .ci/smoke-wheel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


def hft(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          cwd=str(REPO), **kw)


def test_version():
    r = hft("--version")
    assert r.returncode == 0 and r.stdout.startswith("hftagent ") and not r.stderr


def test_deploy_writes_every_shipped_file(tmp_path):
    out = tmp_path / "d"
    r = hft("deploy", "--out", str(out))
    assert r.returncode == 0, r.stderr
    want = sorted(str(p.relative_to(REPO / "deploy")) for p in (REPO / "deploy").rglob("*")
                  if p.is_file())
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == want and len(want) >= 9
    for rel in want:
        if rel.startswith("systemd/"):  # set for this box and install: tests/test_deploy.py
            continue
        assert (out / rel).read_bytes() == (REPO / "deploy" / rel).read_bytes()


def test_deploy_refuses_existing_files_and_writes_nothing(tmp_path):
    out = tmp_path / "d"
    (out / "systemd").mkdir(parents=True)
    (out / "systemd" / "hftagent-watch.service").write_text("mine\n")
    r = hft("deploy", "--out", str(out))
    assert r.returncode == 1 and "already exists" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert (out / "systemd" / "hftagent-watch.service").read_text() == "mine\n"
    assert [p.name for p in out.rglob("*") if p.is_file()] == ["hftagent-watch.service"]


def test_deploy_never_writes_through_a_link(tmp_path):
    # (links on the way to DIR: tests/test_deploy.py, by agent/outfile.py's rule)
    victim = tmp_path / "victim"
    victim.mkdir()
    sub = tmp_path / "out"
    sub.mkdir()
    (sub / "systemd").symlink_to(victim)   # a planted link one level down
    r = hft("deploy", "--out", str(sub))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert list(victim.iterdir()) == []


def test_deploy_bad_parent_is_one_line(tmp_path):
    r = hft("deploy", "--out", str(tmp_path / "missing" / "d"))
    assert r.returncode == 1 and "missing does not exist (create it first)" in r.stderr
    assert not (tmp_path / "missing").exists()


def test_a_reader_that_stops_early_is_not_an_error():
    # `hftagent deploy --help | head -1`: the pipe closes under the writer
    p = subprocess.Popen([*CLI, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=str(REPO), env=dict(os.environ, COLUMNS="80"))
    p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "Broken pipe" not in err and "Traceback" not in err


def test_plain_flags_leaves_a_typer_without_its_hook_alone(monkeypatch):
    # another typer release (the GPU machine's image) has no TyperOption.display_type_rich:
    # every command went into "internal error: AttributeError" when it was patched blindly
    from typer.core import TyperOption

    from agent.commands import common
    monkeypatch.setattr(TyperOption, "display_type_rich", None, raising=False)
    monkeypatch.setattr(common, "_FLAGS_PLAIN", False)
    common.plain_flags()
    assert TyperOption.display_type_rich is None


def test_the_watch_unit_records_history_where_its_sandbox_can_write():
    # watch records every run (issue #28); the unit's ProtectHome=yes hides ~/.local/state,
    # so its database must be in the unit's StateDirectory (/var/lib/hftagent)
    unit = (REPO / "deploy" / "systemd" / "hftagent-watch.service").read_text()
    assert "StateDirectory=hftagent" in unit
    assert "Environment=HFTAGENT_DB=/var/lib/hftagent/history.sqlite" in unit
