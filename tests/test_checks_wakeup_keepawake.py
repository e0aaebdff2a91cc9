"""run --keep-awake on CPUs other tasks may use: the note's fix isolates them and does
nothing else (issue #28). `tune apply --isolate --cpus X` applies the whole profile plus
isolation; `--isolate --only isolate` is the isolation alone, as the audit's wake-up finding
says (tuning/checks/wakeup.py)."""

from __future__ import annotations

import json
import re
import shlex

from typer.testing import CliRunner

from agent.cli import get_app
from collectors.host import Host
from tests.treecopy import make_synthetic
from tuning.launcher import build_launch


def _note(tmp_path) -> tuple[str, Host]:
    root = make_synthetic(tmp_path / "syn")
    host = Host(root)
    d = build_launch(host, ["true"], cpus="3", keep_awake=True, which=lambda _: "/bin/true",
                     build_spinner=lambda: tmp_path / "spin")
    notes = [n for n in d.notes if "isolate the CPUs first" in n]
    assert len(notes) == 1, d.notes
    return notes[0], host


def test_the_note_suggests_isolation_only(tmp_path):
    note, _ = _note(tmp_path)
    m = re.search(r"\((hftagent tune apply [^)]*)\)", note)
    assert m and m.group(1) == "hftagent tune apply --isolate --only isolate --cpus 3"


def test_the_suggested_command_is_accepted_and_plans_isolation_only(tmp_path):
    note, host = _note(tmp_path)
    argv = shlex.split(re.search(r"\(hftagent (tune apply [^)]*)\)", note).group(1))
    argv[1] = "plan"  # the same options, planned on the tree instead of written

    def planned(args: list[str]) -> set[str]:
        res = CliRunner().invoke(get_app(), [*args, "--root", str(host.root), "--json"])
        assert res.exit_code in (0, 2), res.output
        return {i["id"].split(".")[0] for i in json.loads(res.stdout)["items"]
                if i["state"] not in ("skipped", "not-asked")}
    assert planned(argv) == {"isolate"}
    # what the note said before: the whole profile (this tree's governor, IRQs...) as well
    assert planned(["tune", "plan", "--isolate", "--cpus", "3"]) > {"isolate", "cpu"}
