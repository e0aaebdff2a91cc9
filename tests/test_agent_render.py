"""Audit's human output narrow and piped (issue #28 item 1, audit): a list, never a cut value,
a repeated reason said once, a header without ``None``; and a missing /proc/cmdline
(issue #25) is unsupported."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from tests.conftest import FIXTURES

runner = CliRunner()
HOST_TREES = sorted(p.name for p in FIXTURES.iterdir() if (p / "proc").is_dir())
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PIPED = {"COLUMNS": "80"}
TERMINAL_80 = {"COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
TERMINAL_200 = {"COLUMNS": "200", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}


def _audit(root, *args: str, env: dict | None = None):
    res = runner.invoke(get_app(), ["audit", "--root", str(root), "--steal-window", "0", *args],
                        env=env or {})
    assert res.exit_code in (0, 1, 2), res.output
    return res


def _findings(root) -> list[dict]:
    return json.loads(_audit(root, "--json").stdout)["findings"]


@pytest.mark.parametrize("env", [PIPED, TERMINAL_80], ids=["piped", "terminal-80"])
@pytest.mark.parametrize("tree", HOST_TREES)
def test_narrow_audit_is_a_list_with_every_value_whole(tree, env):
    out = ANSI.sub("", _audit(FIXTURES / tree, env=env).stdout)
    lines = out.splitlines()
    assert "…" not in out
    assert not any(ln.startswith(("┏", "│", "┃")) for ln in lines)  # no table
    said: set[str] = set()
    for f in _findings(FIXTURES / tree):
        tag = f"  [{f['status']}] {f['title']}"
        assert sum(1 for ln in lines if ln.startswith(tag)) == 1, tag  # one line per finding
        if f["status"] == "unsupported":
            reason = f["current"].removeprefix("unsupported: ")
            # a reason shared by several checks is said once
            assert sum(ln.count(reason) for ln in lines) == 1, reason
            said.add(reason)
            continue
        for value in (f["current"], f["expected"]):
            if value:
                assert any(value in ln for ln in lines), (f["id"], value)


def test_a_repeated_reason_is_said_once():
    """vm-dev: three cpufreq checks share "cpuN/cpufreq absent ..." (it was printed 3 times)."""
    out = _audit(FIXTURES / "vm-dev", env=PIPED).stdout
    assert out.count("cpuN/cpufreq absent from this tree") == 1
    assert "[unsupported] Turbo / boost: same reason as CPU frequency governor" in out


@pytest.mark.parametrize("tree", HOST_TREES)
def test_wide_terminal_keeps_the_table_and_cuts_nothing(tree):
    out = _audit(FIXTURES / tree, env=TERMINAL_200).stdout
    assert "┏" in out and "…" not in out


def test_json_is_unchanged_by_the_width():
    a = _audit(FIXTURES / "vm-dev", "--json", env=PIPED).stdout
    b = _audit(FIXTURES / "vm-dev", "--json", env=TERMINAL_200).stdout
    assert a == b and json.loads(a)["findings"]


def test_header_never_says_none(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(FIXTURES / "synthetic-2socket", root, symlinks=True)
    (root / "proc/sys/kernel/osrelease").unlink()
    out = _audit(root, env=PIPED).stdout
    header = out.splitlines()[1]
    assert "None" not in out
    assert header.startswith("kernel unknown (/proc/sys/kernel/osrelease absent from this "
                             "tree)"), header


def test_missing_cmdline_is_unsupported(tmp_path):
    """No /proc/cmdline at all: the source is absent (unsupported, with the reason), as the
    README's rule says; it was an error."""
    root = tmp_path / "t"
    shutil.copytree(FIXTURES / "synthetic-2socket", root, symlinks=True)
    (root / "proc/cmdline").unlink()
    f = next(f for f in _findings(root) if f["id"] == "isolation.cmdline")
    assert f["status"] == "unsupported"
    assert f["current"] == "unsupported: absent from this tree"


def test_unreadable_cmdline_is_still_an_error(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(FIXTURES / "synthetic-2socket", root, symlinks=True)
    (root / "proc/cmdline").unlink()
    (root / "proc/cmdline").mkdir()  # EISDIR: there, but cannot be read
    f = next(f for f in _findings(root) if f["id"] == "isolation.cmdline")
    assert f["status"] == "error" and f["current"].startswith("unreadable: ")
