"""Human rendering of findings (rich). JSON comes from the same objects (to_dict).

Two shapes, neither of which ever cuts a value:

- a terminal at least :data:`WIDE` columns wide gets the findings table (cells fold, they
  are never cut with "…");
- narrower, or piped, gets a list in ``lscpu``'s ``key: value`` manner: one line per finding
  with a status tag, details indented below it; a reason shared by several unsupported
  checks is said once.

Then the fixes, most severe first. Every command is printed whole on its own line with nothing
before it but spaces (never wrapped by us: rich's ``soft_wrap``), so a line copied from the
output is the command; a trailing remark is a shell comment. Advice that is not a command is
printed as words. No command ever reboots: the boot arguments come last, as one GRUB recipe
for all of them (tuning/tunables/boot.py), followed once by "then reboot" in words.
"""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tuning.findings import Finding, FixStep, Status, fix_steps, summarize

STYLE = {
    Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red",
    Status.UNSUPPORTED: "dim", Status.PENDING_REBOOT: "magenta", Status.ERROR: "red",
}
# Below this many columns (and on a pipe) the findings table becomes a list: five columns
# at 80 wrap every title and cut values.
WIDE = 120
TODO_ORDER = {Status.FAIL: 0, Status.PENDING_REBOOT: 1, Status.ERROR: 2, Status.WARN: 3}
CMD_INDENT = " " * 8
THEN_REBOOT = "then reboot: boot arguments take effect at the next boot."


def findings_table(findings: list[Finding], title: str | None = None) -> Table:
    t = Table(title=title, show_lines=False, expand=False, pad_edge=False)
    t.add_column("family", style="cyan", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("check", overflow="fold")
    t.add_column("current", overflow="fold")
    t.add_column("expected", overflow="fold")
    last = None
    for f in findings:
        fam = f.family if f.family != last else ""
        if f.family != last and last is not None:
            t.add_section()
        last = f.family
        t.add_row(fam, Text(f.status.value, style=STYLE[f.status]), f.title, f.current,
                  f.expected)
    return t


def use_table(console: Console) -> bool:
    """The table only on a terminal wide enough for it; a list otherwise (and when piped)."""
    return console.is_terminal and console.width >= WIDE


def _line(console: Console, *parts: str | tuple[str, str], style: str = "") -> None:
    """One output line, never wrapped or cut by rich (the terminal wraps it if it must)."""
    console.print(Text.assemble(*parts, style=style), soft_wrap=True)


def _prose(console: Console, label: str, text: str, style: str = "dim") -> None:
    """``    label: text``: wrapped with a hanging indent on a terminal (words never split: a
    path stays whole), one line on a pipe."""
    head = f"    {label + ':':<10}"
    if console.is_terminal and console.width > len(head) + 20:
        for ln in textwrap.wrap(text, width=console.width - 1, initial_indent=head,
                                subsequent_indent=" " * len(head), break_long_words=False,
                                break_on_hyphens=False) or [head]:
            _line(console, ln, style=style)
    else:
        _line(console, head + text, style=style)


def findings_list(console: Console, findings: list[Finding]) -> None:
    """The narrow shape: per family a heading, per finding ``[status] title: value`` (ok,
    unsupported) or the tag line with ``current:``/``expected:`` below it."""
    last = None
    said: dict[str, str] = {}  # unsupported reason -> the title that said it first
    for f in findings:
        if f.family != last:
            _line(console, (f.family, "bold cyan"))
            last = f.family
        tag = (f"  [{f.status.value}] ", STYLE[f.status])
        if f.status is Status.UNSUPPORTED:
            reason = f.current.removeprefix("unsupported: ")
            if reason in said:
                _line(console, tag, f"{f.title}: same reason as {said[reason]}")
            else:
                said[reason] = f.title
                _line(console, tag, f"{f.title}: {reason}")
        elif f.status is Status.OK:
            extra = f"  (expected {f.expected})" if f.expected and f.expected != f.current \
                else ""
            _line(console, tag, f"{f.title}: {f.current}", (extra, "dim"))
        else:
            _line(console, tag, f.title)
            if f.current:
                _line(console, f"      current:  {f.current}")
            if f.expected:
                _line(console, f"      expected: {f.expected}")


def to_fix(findings: list[Finding]) -> list[Finding]:
    """The findings to act on, most severe first (audit's order within a status)."""
    todo = [f for f in findings if f.status in TODO_ORDER]
    return sorted(todo, key=lambda f: TODO_ORDER[f.status])


def is_boot_arg(f: Finding) -> bool:
    """A kernel argument still to set: fixed by the one GRUB recipe for all of them."""
    return f.status in TODO_ORDER and "kernel_arg" in f.data and bool(f.fix)


def boot_args(findings: list[Finding]) -> dict[str, str]:
    """Every kernel argument the findings still want, as ``{key: value}``."""
    from tuning.checks.isolation import boot_arg_dict
    return boot_arg_dict([f.data["kernel_arg"] for f in findings if is_boot_arg(f)])


def command_line(step: FixStep) -> str:
    """A step's command as printed: the command, its note as a shell comment."""
    return step.command + (f"  # {step.note}" if step.note else "")


def _fix_lines(console: Console, f: Finding) -> None:
    steps = fix_steps(f.fix)
    if any(s.command for s in steps):
        _line(console, "    fix:")
    for s in steps:
        if s.command:
            _line(console, CMD_INDENT + command_line(s))
        else:
            _prose(console, "advice", s.advice, style="")


def render_fixes(console: Console, findings: list[Finding]) -> None:
    """The "To fix" section: each finding with why, evidence and its commands; the boot
    arguments last, all at once, then "then reboot" once."""
    todo = to_fix(findings)
    if not todo:
        return
    console.print()
    _line(console, ("To fix", "bold"), " (most severe first):")
    whys: dict[str, str] = {}
    for f in todo:
        _line(console, (f"[{f.status.value}] ", STYLE[f.status]), (f.id, "bold"), f"  {f.title}")
        if f.why:
            if f.why in whys:
                _prose(console, "why", f"as for {whys[f.why]}")
            else:
                whys[f.why] = f.id
                _prose(console, "why", f.why)
        if f.evidence:
            _prose(console, "evidence", f.evidence)
        if is_boot_arg(f):
            _prose(console, "boot arg", f"{f.data['kernel_arg']}  (set below, with the others)",
                   style="")
        elif f.fix:
            _fix_lines(console, f)
    args = boot_args(findings)
    if args:
        from tuning.tunables.boot import grub_commands
        console.print()
        _line(console, ("To set all boot arguments at once", "bold"),
              f" ({' '.join(args)}), run the first line on RHEL/Fedora (grubby) or the second "
              "on Debian/Ubuntu (/etc/default/grub):")
        for cmd in grub_commands(args):
            _line(console, CMD_INDENT + cmd)
        _line(console, THEN_REBOOT)


def render_findings(console: Console, findings: list[Finding], verbose: bool = False) -> None:
    if use_table(console):
        console.print(findings_table(findings))
    else:
        findings_list(console, findings)
    render_fixes(console, findings)
    if verbose:
        for f in findings:
            if f.status in (Status.OK, Status.UNSUPPORTED):
                _line(console, f"  {f.id}: {f.evidence}", style="dim")
    s = summarize(findings)
    console.print()
    _line(console, "summary: " + ", ".join(f"{v} {k}" for k, v in s.items() if v))
