"""Unit sizes (issue #37 "Done when"): no class in agent/trace/ over 300 lines, no function
there over 80, no function of a command module (agent/commands/: the command functions and
what they call) over 60, no audit check function (tuning/checks/) over 80 — a unit too long
to hold in one's head fails here, not in review.

A unit's size is its lines from its ``class``/``def`` line to its last (decorators apart,
its docstring and comments in), read with ``ast``; methods and nested functions are
functions of their own (``Class.method``, ``outer.inner``). Each rule is one row of
:data:`RULES`; :data:`ALLOWED` names the units over a limit that other work owns right now,
with why. An entry that is no longer over its limit fails too, so the list only shrinks."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Rule:
    """``kind`` units ("class" or "function") in ``folder`` (from the repository root, its
    subfolders too) whose qualified name matches ``name`` (a regex, searched; "" any) are
    at most ``limit`` lines."""

    folder: str
    kind: str
    limit: int
    name: str = ""

    def __str__(self) -> str:
        which = f" matching {self.name!r}" if self.name else ""
        return f"{self.kind}s{which} in {self.folder}/ ≤ {self.limit} lines"


# One row per rule: a new rule is a new row.
RULES = (
    Rule("agent/trace", "class", 300),
    Rule("agent/trace", "function", 80),
    Rule("agent/commands", "function", 60),  # parse -> execute -> show
    Rule("tuning/checks", "function", 80),   # one function per finding
)

# (file, qualified name) -> why it is over its limit for now. ONLY for files other engineers
# still own right now; remove the entry when the unit is split (a stale entry fails).
ALLOWED: dict[tuple[str, str], str] = {}


def units(source: str, filename: str = "<source>") -> list[tuple[str, str, int]]:
    """(qualified name, "class" or "function", lines) of every class and function."""
    out: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{prefix}{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                out.append((qual, kind, child.end_lineno - child.lineno + 1))
                visit(child, qual + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename), "")
    return out


def measured(rule: Rule, root: Path = ROOT) -> dict[tuple[str, str], int]:
    """(file relative to ``root``, qualified name) -> lines, for every unit ``rule`` covers."""
    pick = re.compile(rule.name) if rule.name else None
    out: dict[tuple[str, str], int] = {}
    for path in sorted((root / rule.folder).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for qual, kind, lines in units(path.read_text(), rel):
            if kind == rule.kind and (pick is None or pick.search(qual)):
                out[(rel, qual)] = lines
    return out


def over(rule: Rule, root: Path = ROOT) -> dict[tuple[str, str], int]:
    return {k: n for k, n in measured(rule, root).items() if n > rule.limit}


@pytest.mark.parametrize("rule", RULES, ids=str)
def test_no_unit_over_its_limit(rule: Rule) -> None:
    long = {k: n for k, n in over(rule).items() if k not in ALLOWED}
    assert not long, f"{rule}: " + ", ".join(
        f"{f}:{q} {n} lines" for (f, q), n in sorted(long.items()))


def test_every_allowed_unit_is_still_over_a_limit() -> None:
    """An allowed unit that was split (or is gone) leaves the list: it only shrinks."""
    still = set().union(*(over(rule) for rule in RULES))
    stale = sorted(set(ALLOWED) - still)
    assert not stale, f"no longer over a limit, remove from ALLOWED: {stale}"


def test_the_rules_measure_what_they_say(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    body = "\n".join(f"        x = {i}" for i in range(79))
    (pkg / "m.py").write_text(
        "@decorator\n"
        "class Big:\n"
        "    def long(self):\n" + body + "\n        return x\n"  # 81 lines
        "    def short(self):\n        def inner():\n            pass\n        return inner\n"
        + "\n".join(f"    y{i} = {i}" for i in range(300)) + "\n"
        "async def top():\n" + "\n".join(f"    await f({i})" for i in range(80)) + "\n")
    sizes = {q: (k, n) for q, k, n in units((pkg / "m.py").read_text())}
    assert sizes["Big.long"] == ("function", 81)
    assert sizes["Big.short.inner"] == ("function", 2)
    assert sizes["top"] == ("function", 81)  # an async def is a function too
    assert sizes["Big"] == ("class", 81 + 4 + 300 + 1)  # from `class`, not the decorator
    functions = over(Rule("pkg", "function", 80), tmp_path)
    assert set(functions) == {("pkg/sub/m.py", "Big.long"), ("pkg/sub/m.py", "top")}
    assert set(over(Rule("pkg", "class", 300), tmp_path)) == {("pkg/sub/m.py", "Big")}
    assert not over(Rule("pkg", "class", 400), tmp_path)
    # a name pattern narrows a rule (as a rule for command functions only would)
    assert set(over(Rule("pkg", "function", 80, name=r"^top$"), tmp_path)) == \
        {("pkg/sub/m.py", "top")}
