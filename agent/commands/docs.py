"""`hftagent docs [NAME]`: the documents the help points to, shipped in the package."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from agent.commands.common import fail, register_command

HELP = """Show a shipped document (usage, attach, events, fleet, tuning, ...), or list them.

Every document the help and the README point to (docs/NAME.md in the source tree) is
installed with the package, so a wheel install has them too. Without NAME: each document,
its first line and where it is installed. With NAME: the document on stdout (pipe it to a
pager, or open the path shown)."""


def docs_dir() -> Path:
    """The installed documents: agent/docs (a link to the checkout's docs/, shipped as
    package data)."""
    return Path(__file__).resolve().parent.parent / "docs"


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.lstrip("# ").strip()
    return ""


def docs(name: Annotated[str | None, typer.Argument(
        help="A document's name (e.g. attach, or attach.md); none: list them.")] = None,
         path: Annotated[bool, typer.Option("--path", help="Print the document's installed "
                                            "path instead of its text.")] = False) -> None:
    base = docs_dir()
    found = sorted(base.glob("*.md")) if base.is_dir() else []
    if not found:
        raise fail(f"no documents installed at {base}")
    if name is None:
        width = max(len(p.stem) for p in found)
        for p in found:
            print(f"{p.stem:<{width}}  {_title(p)}")
        print(f"\n(in {base}; `hftagent docs NAME` prints one)")
        return
    stem = name.removesuffix(".md")
    match = [p for p in found if p.stem == stem]
    if not match:
        raise fail(f"no document {name!r}: one of {', '.join(p.stem for p in found)}")
    if path:
        print(match[0])
        return
    try:
        sys.stdout.write(match[0].read_text(encoding="utf-8"))
        sys.stdout.flush()
    except BrokenPipeError:  # a pager or head closed the pipe: the reader has what it wants
        pass


def register(app: typer.Typer) -> None:
    register_command(app, "docs", docs, HELP)
