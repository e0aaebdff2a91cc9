"""Human rendering of findings (rich). JSON comes from the same objects (to_dict)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tuning.findings import Finding, Status, summarize

STYLE = {
    Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red",
    Status.UNSUPPORTED: "dim", Status.PENDING_REBOOT: "magenta", Status.ERROR: "red",
}


def findings_table(findings: list[Finding], title: str | None = None) -> Table:
    t = Table(title=title, show_lines=False, expand=False, pad_edge=False)
    t.add_column("family", style="cyan", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("check")
    t.add_column("current")
    t.add_column("expected")
    last = None
    for f in findings:
        fam = f.family if f.family != last else ""
        if f.family != last and last is not None:
            t.add_section()
        last = f.family
        t.add_row(fam, Text(f.status.value, style=STYLE[f.status]), f.title, f.current,
                  f.expected)
    return t


def render_findings(console: Console, findings: list[Finding], verbose: bool = False) -> None:
    console.print(findings_table(findings))
    todo = [f for f in findings if f.status in (Status.FAIL, Status.WARN, Status.PENDING_REBOOT,
                                                Status.ERROR)]
    if todo:
        console.print()
        console.print("[bold]To fix[/bold] (most severe first):")
        order = {Status.FAIL: 0, Status.PENDING_REBOOT: 1, Status.ERROR: 2, Status.WARN: 3}
        for f in sorted(todo, key=lambda f: order[f.status]):
            console.print(Text.assemble((f"[{f.status.value}] ", STYLE[f.status]),
                                        (f.id, "bold"), f"  {f.title}"))
            if f.fix:
                console.print(Text("    fix:      " + f.fix))
            if f.why:
                console.print(Text("    why:      " + f.why, style="dim"))
            console.print(Text("    evidence: " + f.evidence, style="dim"))
    boot = [f.data["kernel_arg"] for f in findings
            if f.status == Status.PENDING_REBOOT and "kernel_arg" in f.data]
    if len(boot) > 1:
        from tuning.checks.isolation import grubby

        console.print(Text("all boot arguments at once: " + grubby(" ".join(boot)), style="bold"))
    if verbose:
        for f in findings:
            if f.status in (Status.OK, Status.UNSUPPORTED):
                console.print(Text(f"  {f.id}: {f.evidence}", style="dim"))
    s = summarize(findings)
    console.print()
    console.print("summary: " + ", ".join(f"{v} {k}" for k, v in s.items() if v))
