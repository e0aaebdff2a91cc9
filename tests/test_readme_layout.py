"""The README's layout names today's rooms (issue #37 item 5): it named watch/events/,
stress.py and the exporter where they were long after they moved, and left out trace/, export/
and gate/. A room is a package directory under agent/, collectors/ or tuning/ (agent/watch/,
agent/watch/latency/, tuning/checks/, ...) or a folder of agent/ itself (agent/deploy/); the
layout names one by its full path at the start of a line of its block."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPS = ("agent", "collectors", "tuning")


def rooms(repo: Path) -> set[str]:
    """Every room of the tree at ``repo``, as "agent/watch/latency/"."""
    out: set[str] = set()
    for top in TOPS:
        for d, dirs, files in os.walk(repo / top):  # (links not followed: agent/deploy)
            dirs[:] = [x for x in dirs if x != "__pycache__" and not x.startswith(".")]
            if "__init__.py" in files:
                out.add(Path(d).relative_to(repo).as_posix() + "/")
    for d in (repo / "agent").iterdir():
        if d.is_dir() and d.name != "__pycache__" and not d.name.startswith("."):
            out.add(f"agent/{d.name}/")
    return out


def named(readme: str) -> list[str]:
    """The paths the README's layout block names: the first word of each line of the first
    code block after "## Layout" that starts at its first column."""
    m = re.search(r"^## Layout\n.*?^```\n(.*?)^```", readme, re.M | re.S)
    assert m, "README.md has no layout block under '## Layout'"
    return [ln.split()[0] for ln in m.group(1).splitlines() if ln and not ln[0].isspace()]


def check(repo: Path, readme: str) -> tuple[list[str], list[str]]:
    """(rooms the layout does not name, named paths that are not there)."""
    said = named(readme)
    missing = sorted(rooms(repo) - set(said))
    gone = [p for p in said if not p.endswith("/") or not (repo / p).is_dir()]
    return missing, gone


def test_the_layout_names_every_room_and_only_rooms_that_are_there():
    missing, gone = check(REPO, (REPO / "README.md").read_text())
    assert not missing, f"rooms the README layout does not name: {missing}"
    assert not gone, f"the README layout names what is not there: {gone}"


def test_the_check_bites(tmp_path):
    for d in ("agent/watch/latency", "agent/deploy", "collectors", "tuning/checks"):
        (tmp_path / d).mkdir(parents=True)
    for d in ("agent", "agent/watch", "agent/watch/latency", "collectors", "tuning",
              "tuning/checks"):
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "agent/watch/__pycache__").mkdir()
    readme = ("# x\n\n## Layout\n\n```\nagent/        a\n              agent/deploy/ (said "
              "inside a line is not naming)\nagent/watch/  b\nagent/watch/latency/  c\n"
              "agent/deploy/  d\ncollectors/  e\ntuning/  f\ntuning/checks/  g\n```\n")
    assert check(tmp_path, readme) == ([], [])
    (tmp_path / "agent/gate").mkdir()
    (tmp_path / "agent/gate/__init__.py").write_text("")
    (tmp_path / "agent/watch/latency/__init__.py").unlink()
    (tmp_path / "agent/watch/latency").rmdir()
    assert check(tmp_path, readme) == (["agent/gate/"], ["agent/watch/latency/"])
