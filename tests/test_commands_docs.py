"""`hftagent docs`: the documents the help points to are shipped and shown (issue #39: a wheel
did not ship docs/*.md, which the help named)."""

from __future__ import annotations

import re
import subprocess
import sys

from typer.testing import CliRunner

from agent.cli import get_app
from agent.commands.docs import docs_dir
from tests.conftest import FIXTURES

REPO = FIXTURES.parent.parent

runner = CliRunner()


def test_every_doc_is_listed_and_shown():
    res = runner.invoke(get_app(), ["docs"])
    assert res.exit_code == 0, res.output
    names = sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    listed = [ln.split()[0] for ln in res.stdout.splitlines() if ln and not ln.startswith("(")]
    assert listed == names
    res = runner.invoke(get_app(), ["docs", "attach"])
    assert res.exit_code == 0 and res.stdout == (REPO / "docs/attach.md").read_text()
    res = runner.invoke(get_app(), ["docs", "fleet.md", "--path"])
    assert res.exit_code == 0 and res.stdout.strip() == str(docs_dir() / "fleet.md")


def test_an_unknown_doc_is_one_line_and_exit_1():
    res = runner.invoke(get_app(), ["docs", "../README"])
    assert res.exit_code == 1
    assert re.fullmatch(r"hftagent: error: no document '\.\./README': one of [a-z, -]+\n",
                        res.stderr)


def test_every_doc_the_help_names_is_shipped():
    """A `docs/NAME.md` named in any command's source (its help) is one `hftagent docs` has."""
    shipped = {p.name for p in docs_dir().glob("*.md")}
    named = set()
    for f in (REPO / "agent").rglob("*.py"):
        named |= set(re.findall(r"docs/([a-z-]+\.md)", f.read_text()))
    assert named and named <= shipped, named - shipped


def test_a_closed_pipe_is_not_an_error():
    p = subprocess.run(f"{sys.executable} -m agent.cli docs usage | head -1", shell=True,
                       capture_output=True, text=True, cwd=REPO)
    assert p.stdout.startswith("# Using hftagent")
    assert "Traceback" not in p.stderr and "Exception" not in p.stderr, p.stderr
