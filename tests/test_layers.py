"""The house's shape (issue #29): agent/ is one folder per capability and imports between
its rooms run one way. Every import is counted, function-level ones too (a lazy import still
ties two rooms), so a loop cannot hide behind one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

AGENT = Path(__file__).resolve().parents[1] / "agent"
ROOMS = {"commands", "probe", "watch", "noise", "trace", "export", "gate", "history",
         "deploy", "trial"}


def room_of(module: str) -> str | None:
    """agent.watch.session -> watch; agent.causes -> causes (a leaf module); others None."""
    parts = module.split(".")
    if parts[0] != "agent" or len(parts) < 2:
        return None
    return parts[1]


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = ".".join(path.relative_to(AGENT.parent).with_suffix("").parts)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: -node.level] if path.name != "__init__.py" else \
                    pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for p in AGENT.rglob("*.py"):
        src = room_of(".".join(p.relative_to(AGENT.parent).with_suffix("").parts))
        if src in (None, "__init__"):
            continue
        for m in imports(p):
            dst = room_of(m)
            if dst and dst != src and dst != "__init__" and (
                    dst in ROOMS or (AGENT / f"{dst}.py").exists()):
                g.setdefault(src, set()).add(dst)
    return g


def test_no_loop_between_rooms():
    g = graph()
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        seen[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if seen.get(m) == 1:
                raise AssertionError("import loop: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in seen:
                visit(m)
        stack.pop()
        seen[n] = 2

    for n in sorted(g):
        if n not in seen:
            visit(n)


def test_lower_rooms_never_import_upper_ones():
    g = graph()
    upper = {"cli", "commands"}
    for low in ("trace", "export", "gate", "history", "probe", "noise", "watch", "trial"):
        assert not (g.get(low, set()) & upper), (low, g.get(low))
    assert not (g.get("trace", set()) & {"watch", "noise", "export", "gate", "probe"}), g["trace"]
    assert not (g.get("export", set()) & {"watch", "noise", "gate", "probe", "trace"}), \
        g["export"]
    # history keeps runs: the rooms that make them record into it, never the other way
    assert not (g.get("history", set()) & {"watch", "noise", "trace", "export"}), g["history"]
    assert "history" not in g.get("gate", set()), g["gate"]
    # leaves import no room
    for leaf in ("causes", "stats", "client", "errors", "defaults", "outfile"):
        assert not (g.get(leaf, set()) & ROOMS), (leaf, g.get(leaf))


def test_every_room_says_what_it_owns():
    for room in sorted(ROOMS - {"deploy"}):
        doc = ast.get_docstring(ast.parse((AGENT / room / "__init__.py").read_text()))
        assert doc and len(doc) > 80, room


# a comparison of a latency source's kind — probe == KIND, kind in (..., KIND), KIND != source,
# cfg.probe not in (...), KIND a quoted kind name — (the issue #37 check's pattern, widened)
_KINDS = r"""["'](attach|ring|external|client|pid)["']"""
SOURCE_KIND = re.compile(
    r"(probe|source_kind|source|kind)\)? *(==|!=|not in|in) *\(?[^)\n]*" + _KINDS
    + r"|" + _KINDS + r" *(==|!=) *[\w.]*(probe|source|kind)")


def test_the_latency_sources_are_one_room():
    """agent/watch/latency/ (issue #37): one module per latency source behind one interface.
    No module outside it compares a source's kind or imports one source's module (they ask
    the chosen source); inside, it imports no other watch module but the probe's worker
    process (the session, the summary and the rest sit above it)."""
    room = AGENT / "watch" / "latency"
    own = ("agent.watch.latency", "agent.watch.probe_worker")
    for p in sorted(AGENT.rglob("*.py")):
        mods = imports(p)
        if room in p.parents:
            above = sorted(m for m in mods if m.startswith("agent.watch.")
                           and not m.startswith(own))
            assert not above, (p, above)
            continue
        hits = [ln.strip() for ln in p.read_text().splitlines() if SOURCE_KIND.search(ln)]
        assert not hits, (p, hits)
        named = sorted(m for m in mods if m.startswith("agent.watch.latency.")
                       and m.split(".")[3] not in ("base", "Given", "Source", "Running",
                                                   "choose", "default", "sources"))
        assert not named, (p, named)


def test_the_source_kind_pattern_bites():
    # (written so that this file holds no such comparison itself)
    for line in ('if cfg.probe == "{}":', 'x = kind in ("tf", "{}")', 'if "{}" != source:',
                 'queueing=cfg.probe not in ("tf", "{}")', 'if (source) == "{}":'):
        for k in ("attach", "ring", "external", "client", "pid"):
            assert SOURCE_KIND.search(line.format(k)), line.format(k)
    assert not SOURCE_KIND.search('source = "attach: uprobes"')
