"""Every command's --help at 80 columns shows whole words: a path, metric or symbol name too
long for its column folds onto the next line, never cut with "…" (issue #39)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agent.cli import COMMANDS, get_app

runner = CliRunner()
SUBCOMMANDS = [["tune", "plan"], ["tune", "apply"], ["tune", "rollback"], ["history", "export"]]


@pytest.mark.parametrize("argv", [[m.rsplit(".", 1)[1]] for m in COMMANDS] + SUBCOMMANDS,
                         ids=" ".join)
def test_help_at_80_columns_cuts_no_word(argv):
    res = runner.invoke(get_app(), [*argv, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    assert "…" not in res.stdout, [ln for ln in res.stdout.splitlines() if "…" in ln]
    assert max(len(ln) for ln in res.stdout.splitlines()) <= 80
