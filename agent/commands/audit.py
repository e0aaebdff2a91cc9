"""`hftagent audit`: read-only report of host settings that hurt tail latency."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from agent.commands.common import (
    DbOpt,
    JsonOpt,
    NoHistoryOpt,
    ProcfsOpt,
    ProfileOpt,
    RootOpt,
    SysfsOpt,
    cli_errors,
    fail,
    make_host,
    quiet_stdout,
)

HELP = (
    "Report every host setting that hurts tail latency, with evidence and the exact fix.\n\n"
    "Read-only: nothing on the host is written. On a terminal of 120 columns or more the "
    "findings are a table; narrower or piped, a list (one line per finding, details "
    "indented). Fix commands are printed whole, one a line, never with a reboot in them: the "
    "boot arguments come last, as one GRUB recipe, then \"then reboot\". --fix-script FILE "
    "writes them as a shell script to review and run: its runtime settings go through one "
    "journalled `hftagent tune apply --only ...` call, so `hftagent tune rollback` undoes "
    "them.\n\n"
    "Exit status: 0 nothing fails; 2 a check failed or needs a reboot (--fail-on warn: "
    "warnings too); 1 the audit could not run, or some check could not read what it needs "
    "(status \"error\") and nothing failed. A reader that closes the pipe early (| head) does "
    "not change it.")


CpusOpt = Annotated[str | None, typer.Option(
    "--cpus", help="Target CPUs where inference runs (e.g. 2-5,8). Default: isolated CPUs, "
    "else all.")]
PidOpt = Annotated[int | None, typer.Option(
    "--pid", help="Also check this inference process: affinity, memory nodes, TF thread "
    "settings.")]
FailOnOpt = Annotated[str, typer.Option(
    "--fail-on", help="fail | warn: lowest status that makes the exit status 2.")]
TextfileOpt = Annotated[str | None, typer.Option(
    "--textfile", help="Also write the result as DIR/hftagent_audit.prom for node_exporter's "
    "textfile collector (atomic).")]
StealOpt = Annotated[float, typer.Option(
    "--steal-window", help="Seconds over which CPU steal is measured. The window opens as the "
    "audit starts and the checks run inside it: it adds only what is left of it once they "
    "are done. /proc/stat counts steal in whole 10 ms ticks, so the check fails only on "
    "what the ticks prove (k ticks: more than k - 1); one tick never fails it. A longer "
    "window proves a smaller steal (0.2 s: from 2 ticks, 5 %; 2 s: 1.5 % from 4 ticks).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v",
                                          help="Show evidence of passing checks too.")]
NoiseOpt = Annotated[float | None, typer.Option(
    "--noise", metavar="S", help="Also scan each target CPU for S seconds with a pinned "
    "clock-gap loop (hftagent cpus) and report a noisy one. Live host only.")]
FixScriptOpt = Annotated[str | None, typer.Option(
    "--fix-script", metavar="FILE",
    help="Also write the fixes as an executable shell script (#!/bin/sh, set -e): every "
         "runtime setting through one journalled `hftagent tune apply --only ...` call, so "
         "`hftagent tune rollback` undoes it; what tune cannot journal marked \"not undone by "
         "tune rollback\"; the boot arguments last, never a reboot. FILE must not exist: it is "
         "created, mode 0700, never overwritten.")]


def audit(ctx: typer.Context, cpus: CpusOpt = None, pid: PidOpt = None,
          profile: ProfileOpt = "hft-cpu", fail_on: FailOnOpt = "fail",
          json_out: JsonOpt = False, textfile: TextfileOpt = None,
          steal_window: StealOpt = 0.2, verbose: VerboseOpt = False, noise: NoiseOpt = None,
          fix_script: FixScriptOpt = None, db: DbOpt = None, no_history: NoHistoryOpt = False,
          root: RootOpt = "/", procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    _check_options(fail_on, steal_window, noise, fix_script)
    host = make_host(root, procfs, sysfs)
    if noise is not None and not host.live:
        raise fail("--noise measures this host: not with --root/--procfs/--sysfs")
    steal_start = _steal_start(ctx, host, steal_window)
    from tuning.findings import Status, exit_code
    from tuning.profiles import load_profile

    prof = load_profile(profile)
    record = host.live and not no_history
    if record:  # --db checked before the checks run (#28.4)
        from agent.commands.common import check_history_db
        record = check_history_db(db, False)
    report = _run(host, prof, cpus, pid, steal_window, steal_start, noise)
    if textfile:
        _write_textfile(report, textfile)
    if fix_script is not None:
        _write_fix_script(fix_script, report, profile)
    code = exit_code(report.findings, Status.WARN if fail_on == "warn" else Status.FAIL)
    _show(host, report, json_out, verbose)
    if record:  # a captured tree (--root) is not a run of this host
        from agent.history import record_run

        record_run("audit", report.to_dict(), None, command="audit", db=db, warn=True)
    raise typer.Exit(code)


def _check_options(fail_on: str, steal_window: float, noise: float | None,
                   fix_script: str | None) -> None:
    if fail_on not in ("fail", "warn"):
        raise fail(f"--fail-on must be 'fail' or 'warn', not {fail_on!r}")
    if not 0 <= steal_window <= 10:
        raise fail("--steal-window must be between 0 and 10 seconds")
    if noise is not None and not 0 < noise <= 60:
        raise fail("--noise must be > 0 and <= 60 seconds")
    if fix_script is not None:
        from agent.fixscript import check_path
        check_path(fix_script)  # before any work: a typo costs nothing (OutputError: one line)


def _steal_start(ctx: typer.Context, host, steal_window: float):
    """The steal window's first snapshot. It is open already (agent/cli.py opens it before
    typer is even imported), else it opens now: the parsing, tuning's imports and the checks
    run inside it, and only what is left of it is slept (issue #28 item 7)."""
    if not host.live or steal_window <= 0:
        return None
    from collectors.system import stat_snapshot
    return (ctx.obj or {}).get("steal_start") or stat_snapshot(host)


def _run(host, prof, cpus: str | None, pid: int | None, steal_window: float, steal_start,
         noise: float | None):
    """The checks (and the --noise scan): the audit's report."""
    from tuning.audit import AuditInputError, run_audit
    try:
        report = run_audit(host, prof, cpus=cpus, pid=pid, steal_window_s=steal_window,
                           steal_start=steal_start)
    except AuditInputError as exc:
        raise fail(str(exc)) from None
    if noise is not None:
        from agent.noise.scan import audit_finding
        from tuning.targets import resolve
        plan = resolve(host, cpus)
        house = plan.housekeeping or [plan.online[0]]
        report.findings.append(audit_finding(host, report.target_cpus, house,
                                             len(plan.online), noise))
    return report


def _write_textfile(report, textfile: str) -> None:
    from agent.export.textfile import write_textfile
    try:
        write_textfile(report.findings, textfile)
    except OSError as exc:
        raise fail(f"cannot write textfile in {textfile!r}: {exc.strerror or exc}") from None


def _console():
    """rich's Console, except that a closed stdout raises BrokenPipeError: rich's own answer
    (``Console.on_broken_pipe``) exits 1, which would hide the audit's status."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipeConsole()


def _show(host, report, json_out: bool, verbose: bool) -> None:
    """Print the report. A reader that closed the pipe (`hftagent audit | head -1`) ends the
    output, never the audit: its exit status stands (issue #39)."""
    try:
        if json_out:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            from agent.render import render_findings

            console = _console()
            for line in _header(host, report):
                console.print(line, soft_wrap=True, highlight=False, markup=False)
            console.print()
            render_findings(console, report.findings, verbose)
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()


def _kernel(host, report) -> str:
    """The kernel release, or "unknown (why)" when it could not be read."""
    if report.host.get("kernel"):
        return report.host["kernel"]
    from tuning.checks.base import why
    r = host.read(host.proc("sys/kernel/osrelease"))
    return f"unknown ({r.path} {why(host, r.reason, r.path)})"


def _header(host, report) -> list[str]:
    """The lines above the findings: what was audited, then the host, then the CPU model."""
    from collectors.parsers import format_cpulist
    h = report.host
    derived = " (derived: see cpu.online)" if h.get("online_cpus_derived") else ""
    lines = [f"hftagent audit  profile {report.profile}  target CPUs "
             f"{format_cpulist(report.target_cpus)}",
             f"kernel {_kernel(host, report)}  virt {h['virtualization']}  "
             f"online {h['online_cpus']}{derived}  NUMA nodes {h['numa_nodes']}"]
    if h.get("cpu_model"):
        lines.append(f"cpu: {h['cpu_model']}")
    return lines


def _write_fix_script(path: str, report, profile: str) -> None:
    from agent.fixscript import script_text, write_script
    from collectors.parsers import format_cpulist
    from tuning.profiles import BUILTIN
    cpus = format_cpulist(report.target_cpus)
    header = [f"hftagent audit --fix-script: profile {report.profile}, target CPUs {cpus}, "
              f"kernel {report.host.get('kernel') or 'unknown'}"]
    # the script may run from another directory: a profile file by its absolute path
    prof = profile if profile in BUILTIN else os.path.abspath(profile)
    write_script(path, script_text(report.findings, header, profile=prof, cpus=cpus))


def register(app: typer.Typer) -> None:
    app.command("audit", help=HELP)(cli_errors(audit))
