"""Output for a person, shared by the commands that print tables (probe, cpus, tune, history,
gate): a table on a terminal at least :data:`agent.render.WIDE` columns wide, a list below
that and on a pipe, and never a cut value in either (issue #28 item 1).

The list is ``lscpu``'s and ``tuned-adm verify``'s manner: one line per item that starts with
its status tag, then its details indented below as ``label: value`` pairs, as many to a line
as the width allows; a pair is never split, and a value longer than the line is printed whole
(the terminal wraps it, nobody cuts it). The table folds long cells, it never cuts them.

Strings that come from the user or the host (a model path, a profile name, a database field)
are printed as :class:`rich.text.Text`, never parsed as markup: a profile named ``[/bold] x``
is printed as it is (``rich.errors.MarkupError`` otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agent.render import use_table

Cell = str | Text
DETAIL_INDENT = " " * 6
PAIR_SEP = "   "


def console(stderr: bool = False) -> Console:
    """The console every command prints through: no highlighting of numbers and paths (a
    path half-coloured reads as two values)."""
    return Console(stderr=stderr, highlight=False)


def line(con: Console, *parts: Cell | tuple[str, str], style: str = "") -> None:
    """One output line from plain strings, ``(text, style)`` pairs and Text: never parsed as
    markup, never wrapped or cut by rich (a terminal too narrow wraps it itself)."""
    out = Text(style=style)
    for p in parts:
        if isinstance(p, tuple):
            out.append(p[0], style=p[1])
        else:
            out.append(p)
    con.print(out, soft_wrap=True)


@dataclass
class Row:
    """One item: ``cells`` by column name, ``tag`` its status word (shown as ``[tag]`` in the
    list, a column of its own in the table when the table has ``tag_column``)."""

    cells: dict[str, Cell]
    tag: str = ""
    tag_style: str = ""
    notes: list[str] = field(default_factory=list)  # printed below the item (list) / table


@dataclass
class Column:
    name: str
    right: bool = False  # numbers: right-aligned in the table
    label: str | None = None  # the list's ``label:`` (default: the column's name)


def _cell_text(v: Cell) -> Text:
    return v if isinstance(v, Text) else Text(str(v))


def _head(c: Column, v: Cell) -> Text:
    """A head cell on the item's line: with its label when the column has one (``batch 1``)."""
    t = Text(f"{c.label} " if c.label else "")
    t.append_text(_cell_text(v))
    return t


def pack(pairs: Iterable[tuple[str, Cell]], width: int, indent: str = DETAIL_INDENT
         ) -> list[Text]:
    """``label: value`` pairs packed into lines of at most ``width`` columns; a pair is never
    split between lines, and one longer than a line gets a line of its own, whole."""
    lines: list[Text] = []
    cur: Text | None = None
    for label, value in pairs:
        v = _cell_text(value)
        if not v.plain:
            continue
        pair = Text(f"{label}: " if label else "")
        pair.append_text(v)
        if cur is not None and cur.cell_len + len(PAIR_SEP) + pair.cell_len <= width:
            cur.append(PAIR_SEP)
            cur.append_text(pair)
            continue
        if cur is not None:
            lines.append(cur)
        cur = Text(indent)
        cur.append_text(pair)
    if cur is not None:
        lines.append(cur)
    return lines


def show(con: Console, title: Cell | None, columns: Sequence[Column], rows: Sequence[Row], *,
         head: Sequence[str] = (), tag_column: str | None = None, wide: bool | None = None
         ) -> None:
    """The rows as a table (wide terminal) or a list (narrow, piped).

    ``head``: the columns that name an item (its first line in the list, after the tag);
    ``tag_column``: the table column that shows the tag (None: the tag is not a column, e.g.
    when a cell already carries it). ``wide`` forces one shape (tests, and callers that
    decided already)."""
    if wide is None:
        wide = use_table(con)
    if wide:
        t = Table(title=title, title_justify="left", pad_edge=False, highlight=False)
        for c in columns:
            t.add_column(c.name, justify="right" if c.right else "left", overflow="fold")
        for r in rows:
            cells = []
            for c in columns:
                if c.name == tag_column:
                    cells.append(Text(r.tag, style=r.tag_style))
                else:
                    cells.append(_cell_text(r.cells.get(c.name, "")))
            t.add_row(*cells)
        con.print(t)
        for r in rows:
            for n in r.notes:
                line(con, "  ", n, style="dim")
        return
    if title is not None:
        line(con, title if isinstance(title, Text) else (title, "bold"))
    width = max(con.width, 40)
    for r in rows:
        first = Text("  ")
        if r.tag:
            first.append(f"[{r.tag}]", style=r.tag_style)
            first.append(" ")
        first.append_text(Text("  ").join(_head(c, r.cells.get(c.name, ""))
                                         for c in columns if c.name in head
                                         and _cell_text(r.cells.get(c.name, "")).plain))
        con.print(first, soft_wrap=True)
        pairs = [(c.label if c.label is not None else c.name, r.cells.get(c.name, ""))
                 for c in columns if c.name not in head and c.name != tag_column]
        for ln in pack(pairs, width):
            con.print(ln, soft_wrap=True)
        for n in r.notes:
            line(con, DETAIL_INDENT, n, style="dim")


def said_once(reasons: Iterable[str]) -> list[tuple[str, int]]:
    """Distinct reasons in first-seen order with how often each was given: a reason shared
    by several items is said once (``why (×3)``)."""
    out: dict[str, int] = {}
    for r in reasons:
        out[r] = out.get(r, 0) + 1
    return list(out.items())
