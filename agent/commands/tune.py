"""`hftagent tune plan|apply|rollback|status`: change runtime host settings, prove it, undo it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from agent.commands.common import (
    BuiltinOpt,
    CpusOpt,
    DbOpt,
    JsonOpt,
    ModelOpt,
    NoHistoryOpt,
    ProcfsOpt,
    ProfileOpt,
    RootOpt,
    SysfsOpt,
    fail,
    make_host,
    register_command,
)

HELP = ("Plan, apply, verify and roll back runtime host settings from a profile.\n\n"
        "apply journals every original value (durably, before each write) in /run/hftagent; "
        "rollback restores those originals in reverse order, even after a crash half-way. Boot "
        "arguments are never applied: they are printed as grubby/GRUB commands "
        "(pending-reboot).")

StateOpt = Annotated[str | None, typer.Option("--state-dir", metavar="DIR",
                                              help="Journal directory (default "
                                              "ROOT/run/hftagent: tmpfs on a live box). It "
                                              "and every directory above it must be owned by "
                                              "root or you and not writable by others (a "
                                              "sticky one like /tmp may be); only symlinks "
                                              "owned by root or you are followed to it.")]
OnlyOpt = Annotated[list[str] | None, typer.Option("--only", metavar="NAME",
                                                   help="Only these tunables or "
                                                   "families (repeatable): cpu, irq.affinity, "
                                                   "isolate...")]
SkipOpt = Annotated[list[str] | None, typer.Option("--skip", metavar="NAME",
                                                   help="Skip these tunables or "
                                                   "families (repeatable), e.g. --skip gpu.")]
IsolateOpt = Annotated[bool, typer.Option("--isolate", help="Runtime isolation of --cpus on top "
                                          "of the profile, whatever it says (hft-cpu and hft-gpu "
                                          "ask for it already): move tasks, kernel threads and "
                                          "unbound workqueues off them and build a cpuset "
                                          "(journalled; rollback restores each task's "
                                          "affinity). User tasks pinned inside --cpus stay. "
                                          "--only isolate: isolation alone.")]
IncludePinnedOpt = Annotated[bool, typer.Option("--include-pinned", help="Runtime isolation "
                                                "moves user tasks pinned inside --cpus too "
                                                "(by default they are kept where they are and "
                                                "listed: that is usually the inference service "
                                                "itself).")]


def _state_dir(host, state_dir: str | None) -> Path:
    """--state-dir, or ROOT/run/hftagent. An empty --state-dir is refused, not "default"."""
    if state_dir is None:
        return host.run_dir("hftagent")
    if not state_dir.strip() or "\x00" in state_dir:
        raise fail(f"--state-dir {state_dir!r}: not a directory path")
    return Path(state_dir)


def _selection(only: list[str] | None, isolate: bool) -> list[str] | None:
    """``--isolate`` adds isolation to what is selected: to the profile's whole plan (no
    ``--only``), or to the families ``--only`` names."""
    return [*only, "isolate"] if isolate and only else only


def _setup(root, procfs, sysfs, profile, cpus, only, skip, state_dir, isolate=False,
           include_pinned=False):
    from tuning.apply import build_context, check_selection, selected, wants_gpu
    from tuning.profiles import load_profile
    from tuning.tunables.isolate import asks_isolation, with_isolation

    host = make_host(root, procfs, sysfs)
    sd = _state_dir(host, state_dir)
    prof = load_profile(profile)
    if include_pinned:
        check_selection(only, skip)
        if not (isolate or asks_isolation(prof)) or not selected("isolate.tasks", only, skip):
            why = ("runtime isolation is not selected (--only/--skip)" if isolate or
                   asks_isolation(prof) else f"profile {prof.name} does not ask for "
                   "runtime_isolation and --isolate is not given")
            raise fail(f"--include-pinned only changes what runtime isolation moves, and {why}")
    if isolate or include_pinned:
        prof = with_isolation(prof, include_pinned=include_pinned)
    ctx = build_context(host, prof, cpus, want_gpu=wants_gpu(prof, only, skip))
    return host, prof, ctx, sd


# ----------------------------------------------------------------------------------------------
# rendering
# ----------------------------------------------------------------------------------------------


def _groups(rows, key):
    """Group rows (tunable id, target, index, *rest) into compact target sets per key: CPUs and
    IRQs as ranges (``cpu 0-3``, ``irq 24-26``), file targets by their whole path (never
    shortened: --json has the same)."""
    from collectors.parsers import format_cpulist
    from tuning.tunables import by_id

    tunables = by_id()
    grouped: dict[tuple, list] = {}
    for r in rows:
        grouped.setdefault((r["tunable"],) + key(r), []).append(r)
    out = []
    for k, rs in grouped.items():
        t = tunables.get(k[0])
        idx = [t.index_of(r["target"]) if t else None for r in rs]
        if t and all(i is not None for i in idx) and t.scope:
            where = f"{t.scope} {format_cpulist(idx)}"
        else:
            where = _listed(list(dict.fromkeys(r["target"] for r in rs)))
        out.append((k, where))
    return out


LISTED_TARGETS = 6  # a row names at most this many targets; --json has every one


def _listed(targets: list[str]) -> str:
    """A row's targets: all of them when few, else the first few and how many more (tune
    plan --isolate printed 76 moved tasks as one line)."""
    if len(targets) <= LISTED_TARGETS:
        return ", ".join(targets)
    return (f"{len(targets)} targets: {', '.join(targets[:LISTED_TARGETS - 1])} and "
            f"{len(targets) - LISTED_TARGETS + 1} more (--json lists each)")


def _value(v: str | None) -> str:
    """A value as read or written: never an empty string or None in the output."""
    if v is None:
        return "unreadable"
    return v if v.strip() else "(empty)"


def _console():
    from agent.textout import console
    return console()


def _heading(con, title: str, *fields: tuple[str, str]) -> None:
    """The command's first line: its title, then ``label value`` pairs; the values (a profile
    name, a journal path) printed as text, never as markup."""
    from agent.textout import line
    parts: list = [(title, "bold")]
    for label, value in fields:
        parts += [f"  {label} ", (value, "cyan")]
    line(con, *parts)


def _plan_columns():
    from agent.textout import Column
    return [Column("tunable"), Column("targets"), Column("current"), Column("desired"),
            Column("note")]


def _render_plan(plan, prof, ctx, title: str) -> None:
    from agent.textout import Row, line, show
    from collectors.parsers import format_cpulist
    from tuning.apply import UNAVAILABLE
    from tuning.tunables import PENDING_REBOOT, WRITE

    con = _console()
    _heading(con, title, ("profile", prof.name),
             ("target CPUs", format_cpulist(ctx.cpus) or "none"),
             ("online", format_cpulist(ctx.online)))
    rows = [c.to_dict() for c in plan.changes if c.kind == WRITE]
    if rows:
        show(con, None, _plan_columns(), [
            Row({"tunable": tid, "targets": where, "current": _value(cur), "desired": des,
                 "note": det}, tag="change", tag_style="yellow")
            for (tid, cur, des, det), where in _groups(
                rows, lambda r: (r["current"], r["desired"], r["detail"]))],
            head=("tunable", "targets"))
    else:
        line(con, ("nothing to change at runtime", "green"))
    _render_notes(con, plan)
    boot = [c for c in plan.changes if c.kind == PENDING_REBOOT]
    if boot:
        _render_recipe(con, boot[0].detail)
    for c in plan.changes:
        if c.kind not in (WRITE, PENDING_REBOOT):
            line(con, f"manual: {c.tunable}: {c.detail}", style="yellow")
    na = [it for it in plan.items if it.state == UNAVAILABLE]
    if na:
        line(con, "not tunable here:", style="dim")
        reasons: dict[str, list[str]] = {}
        for it in na:
            reasons.setdefault(it.reason, []).append(it.tunable.id)
        for why, ids in reasons.items():  # a reason several tunables share is said once
            line(con, f"  {', '.join(ids)}: {why}", style="dim")


def _render_notes(con, plan) -> None:
    """What a tunable's plan does in words (isolate.tasks: how many tasks move, which pinned
    ones stay)."""
    from agent.textout import line

    for it in plan.items:
        if it.note:
            line(con, f"{it.tunable.id}: {it.note}")


def _render_recipe(con, recipe: str) -> None:
    """The boot-argument recipe, one whole command per line (tuning/tunables/boot.py joins
    them with newlines): never wrapped, at any width or on a pipe, so each line pastes as the
    command it is. The reboot is said in words, once, never printed as a command."""
    from agent.textout import line

    line(con, ("pending-reboot", "magenta"), " (never applied; run these yourself):")
    for cmd in recipe.splitlines():
        if cmd.strip():
            line(con, "    " + cmd)
    line(con, "then reboot")


RESULT_STYLE = {"applied": "green", "restored": "green", "holds": "green",
                "unchangeable": "yellow", "drift": "yellow", "was-original": "dim",
                "already": "dim"}


def _render_rows(con, title: str, fields: list[tuple[str, str]], rows: list[dict],
                 result_key: str, extra: str) -> None:
    """apply/rollback/status outcomes: per tunable and result, its targets, the value and the
    note (a table on a wide terminal, a list otherwise)."""
    from agent.textout import Column, Row, show

    _heading(con, title, *fields)
    if not rows:
        return
    cols = [Column("tunable"), Column("targets"), Column("result"), Column(extra),
            Column("note")]
    out = []
    for (tid, res, val, msg), where in _groups(
            rows, lambda r: (r[result_key], str(r.get("_val")), r.get("message", ""))):
        style = RESULT_STYLE.get(res, "red")
        out.append(Row({"tunable": tid, "targets": where, extra: val, "note": msg},
                       tag=res, tag_style=style))
    show(con, None, cols, out, head=("tunable", "targets"), tag_column="result")


def _render_findings(con, findings) -> None:
    """tune apply's verification: audit's table on a wide terminal, its list otherwise."""
    from agent.render import findings_list, findings_table, use_table
    from agent.textout import line
    if use_table(con):
        con.print(findings_table(findings, title="verify"))
    else:
        line(con, ("verify", "bold"))
        findings_list(con, findings)


def _plan_json(plan, prof, ctx) -> dict:
    from collectors.parsers import format_cpulist
    return {"profile": prof.name, "cpus": format_cpulist(ctx.cpus),
            "online": format_cpulist(ctx.online),
            "items": [it.to_dict() for it in plan.items]}


# ----------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------


def plan_cmd(profile: ProfileOpt = "hft-cpu", cpus: CpusOpt = None, only: OnlyOpt = None,
             skip: SkipOpt = None, isolate: IsolateOpt = False,
             include_pinned: IncludePinnedOpt = False, json_out: JsonOpt = False,
             root: RootOpt = "/", procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    """The diff current → desired per tunable and target, and how many tasks isolation moves
    (naming pinned ones). Nothing is written.
    Exit 0: nothing to change; 2: changes (or reboot-only arguments) pending."""
    from tuning.apply import make_plan

    only = _selection(only, isolate)
    _host, prof, ctx, _sd = _setup(root, procfs, sysfs, profile, cpus, only, skip, None, isolate,
                                   include_pinned)
    plan = make_plan(ctx, only, skip)
    if json_out:
        print(json.dumps(_plan_json(plan, prof, ctx), indent=2))
    else:
        _render_plan(plan, prof, ctx, "hftagent tune plan (nothing written)")
    raise typer.Exit(2 if plan.changes else 0)


def apply_cmd(profile: ProfileOpt = "hft-cpu", cpus: CpusOpt = None, only: OnlyOpt = None,
              skip: SkipOpt = None, isolate: IsolateOpt = False,
              include_pinned: IncludePinnedOpt = False,
              dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what apply would "
                                                    "write; write nothing.")] = False,
              state_dir: StateOpt = None, json_out: JsonOpt = False, root: RootOpt = "/",
              procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    """Journal originals, write, read back and verify. Exit 0: applied and verified;
    2: something does not hold or needs a reboot; 1: an error (nothing or part written —
    `tune rollback` undoes the part)."""
    from tuning.apply import FAILED, apply_plan, make_plan, require_privilege
    from tuning.findings import exit_code

    only = _selection(only, isolate)
    host, prof, ctx, sd = _setup(root, procfs, sysfs, profile, cpus, only, skip, state_dir,
                                 isolate, include_pinned)
    if not dry_run:
        require_privilege(host)
    plan = make_plan(ctx, only, skip)
    report = apply_plan(ctx, plan, sd, profile=prof.name, dry_run=dry_run)
    if json_out:
        print(json.dumps({**_plan_json(plan, prof, ctx), "dry_run": dry_run,
                          "journal": report.journal,
                          "outcomes": [o.to_dict() for o in report.outcomes],
                          "findings": [f.to_dict() for f in report.findings]}, indent=2))
    elif dry_run:
        _render_plan(plan, prof, ctx, "hftagent tune apply --dry-run (nothing written)")
    else:
        rows = [{**o.to_dict(), "_val": _value(o.change.desired)} for o in report.outcomes
                if o.change.kind == "write"]
        con = _console()
        _render_rows(con, "hftagent tune apply", [("profile", prof.name),
                                                  ("journal", str(report.journal))],
                     rows, "result", "value")
        boot = [o for o in report.outcomes if o.result == "pending-reboot"]
        _render_notes(con, plan)
        if boot:
            _render_recipe(con, boot[0].message)
        if report.findings:
            _render_findings(con, report.findings)
    if dry_run:
        raise typer.Exit(2 if plan.changes else 0)
    failed = [o for o in report.outcomes if o.result == FAILED]
    if failed:
        # One line on stderr whatever the output mode: under --json the outcomes carry the
        # detail, but a script that only checks the exit status must still see why.
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        print(f"hftagent: error: tune apply: {first.change.target}: "
              f"{' '.join(first.message.split()) or 'failed'}{more}; `hftagent tune rollback` "
              "undoes what was written", file=sys.stderr)
        raise typer.Exit(1)
    raise typer.Exit(exit_code(report.findings) if report.ok else 2)


def rollback_cmd(force: Annotated[bool, typer.Option("--force", help="Restore originals even "
                                                     "where the value drifted since we wrote "
                                                     "it.")] = False,
                 discard_stale: Annotated[bool, typer.Option("--discard-stale", help="Delete a "
                                                             "journal from an earlier boot "
                                                             "(never replayed).")] = False,
                 state_dir: StateOpt = None, json_out: JsonOpt = False, root: RootOpt = "/",
                 procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    """Restore journalled originals in reverse order. Idempotent. Exit 0: everything restored
    (or nothing to do); 2: entries left (drift, unreadable, or a journal that ends in a torn
    record: kept as it was); 1: an error."""
    from tuning.apply import FAILED, require_privilege, rollback
    from tuning.profiles import load_profile
    from tuning.tunables import TuneContext

    host = make_host(root, procfs, sysfs)
    sd = _state_dir(host, state_dir)
    require_privilege(host)
    from tuning.apply import build_context
    # Rollback needs no profile or target CPUs: only the host, its writer and services.
    ctx: TuneContext = build_context(host, load_profile("hft-cpu"), None,
                                     want_gpu=_journal_has_gpu(host, sd))
    rep = rollback(ctx, sd, force=force, discard_stale=discard_stale)
    if json_out:
        print(json.dumps({"journal": rep.journal, "remaining": rep.remaining, "note": rep.note,
                          "torn": rep.torn, "items": [i.to_dict() for i in rep.items]},
                         indent=2))
    else:
        from agent.textout import line

        rows = [{**i.to_dict(), "_val": _value(i.current)} for i in rep.items]
        con = _console()
        _render_rows(con, "hftagent tune rollback", [("journal", str(rep.journal))], rows,
                     "result", "now")
        if rep.note:
            line(con, rep.note, style="yellow" if rep.torn else "")
        left = f"{rep.remaining} journal entr{'y' if rep.remaining == 1 else 'ies'} left"
        line(con, left + (f" (one of them the torn record); journal kept: {rep.journal}"
                          if rep.torn else ""))
    if any(i.result == FAILED for i in rep.items):
        raise typer.Exit(1)
    raise typer.Exit(0 if rep.ok else 2)


def _journal_has_gpu(host, sd: Path) -> bool:
    """Initialise NVML for rollback only when the journal holds GPU entries."""
    from tuning.apply import state_beneath
    from tuning.journal import JournalError, load
    try:
        j = load(sd, beneath=state_beneath(host, sd))
    except JournalError:
        return False  # rollback() loads it again and reports the error
    return bool(j and any(e.target.startswith("nvml:") for e in j.entries))


def status_cmd(state_dir: StateOpt = None, json_out: JsonOpt = False, root: RootOpt = "/",
               procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    """What tune apply changed (from the journal) and whether each value still holds.
    Exit 0: all hold (or nothing applied); 2: drift, restored by someone else, unreadable, a
    journal from an earlier boot, or one that ends in a torn record."""
    from tuning.apply import build_context, status
    from tuning.profiles import load_profile

    host = make_host(root, procfs, sysfs)
    sd = _state_dir(host, state_dir)
    ctx = build_context(host, load_profile("hft-cpu"), None,
                        want_gpu=_journal_has_gpu(host, sd))
    rep = status(ctx, sd)
    if json_out:
        print(json.dumps({"journal": rep.journal, "exists": rep.exists, "stale": rep.stale,
                          "boot_id": rep.boot_id, "profile": rep.profile, "cpus": rep.cpus,
                          "all_hold": rep.all_hold, "torn": rep.torn,
                          "items": [i.to_dict() for i in rep.items]}, indent=2))
    else:
        from agent.textout import line

        con = _console()
        if not rep.exists:
            line(con, f"nothing applied (no journal at {rep.journal})")
        elif rep.stale:
            line(con, f"journal {rep.journal} is from an earlier boot ({rep.boot_id}): not "
                 "replayed; `hftagent tune rollback --discard-stale` removes it",
                 style="yellow")
        else:
            rows = [{**i.to_dict(), "_val": f"{_value(i.written)} (was {_value(i.original)})"}
                    for i in rep.items]
            _render_rows(con, "hftagent tune status", [
                ("profile", rep.profile or "unknown"), ("target CPUs", rep.cpus or "none"),
                ("journal", str(rep.journal))], rows, "result", "applied (original)")
            if rep.torn:
                line(con, rep.torn, style="yellow")
    raise typer.Exit(2 if rep.stale or not rep.all_hold else 0)


def register(app: typer.Typer) -> None:
    from agent.commands.common import paragraphs
    sub = typer.Typer(name="tune", help=paragraphs(HELP), no_args_is_help=True)
    register_command(sub, "plan", plan_cmd)
    register_command(sub, "apply", apply_cmd)
    register_command(sub, "rollback", rollback_cmd)
    register_command(sub, "status", status_cmd)
    register_command(sub, "threads", threads_cmd, allow_interspersed_args=False)
    register_command(sub, "try", try_cmd, TRY_HELP)
    app.add_typer(sub, name="tune")


def threads_cmd(
    cmd: Annotated[list[str] | None, typer.Argument(help="Your inference command (after --), "
                                                    "for the printed `hftagent run` line.")]
    = None,
    from_file: Annotated[str | None, typer.Option("--from", metavar="FILE", help="A saved "
                                                  "`hftagent probe "
                                                  "--sweep threads --json` result instead of "
                                                  "running the sweep now (then the sweep's "
                                                  "own options are refused).")] = None,
    model: ModelOpt = None,
    builtin: BuiltinOpt = None,
    variant: Annotated[str | None, typer.Option("--variant", metavar="NAME", help="Variant to "
                                                "sweep (default xla).")] = None,
    cpus: CpusOpt = None,
    duration: Annotated[float | None, typer.Option("--duration", metavar="SECONDS",
                                                   help="Seconds per configuration (default "
                                                   "3).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Pick intra/inter/affinity from the probe's thread sweep and print the `hftagent run`
    command that reproduces the winner (lowest P99 among runs with enough samples that `run`
    can reproduce; a faster caller-thread or TF-default run is mentioned separately)."""
    result = _thread_sweep(from_file, model=model, builtin=builtin, variant=variant,
                           cpus=cpus, duration=duration)
    rec, faster = _recommend_threads(result)
    c = rec["config"]
    from tuning.launcher import command_line
    command = command_line(cmd or ["<your inference command>"], cpus=c["cpus"],
                           intra=c["intra"], inter=c["inter"])
    if json_out:
        print(json.dumps({"recommendation": rec, "command": command, "faster_unreproducible":
                          faster, "runs": [{"config": r.config.get("id"), "status": r.status,
                                            "p99_ns": r.p99_ns()} for r in result.runs]},
                         indent=2))
        raise typer.Exit(0)
    _render_threads(result, rec, command, faster)


def _thread_sweep(from_file: str | None, *, model, builtin, variant, cpus, duration):
    """The sweep: read from ``--from`` (then the sweep's own options are refused) or run now
    (agent/probe, batch 1, with progress on stderr)."""
    if from_file is not None:
        given = [opt for opt, v in (("--model", model), ("--builtin", builtin),
                                    ("--variant", variant), ("--cpus", cpus),
                                    ("--duration", duration)) if v is not None]
        if given:
            raise fail(f"--from reads a saved sweep: {', '.join(given)} would not be used "
                       "(run the sweep without --from to use them)")
        return _saved_sweep(from_file)
    from agent.probe import options
    from agent.probe.progress import progress_hook
    from agent.probe.runner import run_probe

    settings, configs = options.build(
        model=model, builtin=builtin if builtin is not None else "lstm",
        signature="serving_default", shape=None,
        input_data="random", variant=variant, samples=None, duration=duration, warmup=200,
        rate=None, threshold_us=5000.0, calib=None, intra=None, inter=None, cpus=cpus,
        sweep="threads", batch="1")
    with progress_hook(prefix="hftagent tune threads: ") as hook:
        result, _arrays = run_probe(settings, configs, on_event=hook)
    return result


def _recommend_threads(result) -> tuple[dict, dict | None]:
    """(the recommendation: the lowest P99 of the eligible batch-1 runs `hftagent run` can
    reproduce; the fastest run when it is not that one and cannot be reproduced, else None).
    None eligible and reproducible: one line, exit 1."""
    from agent.probe.runner import eligible

    cands = sorted((r for r in result.runs if r.batch == 1 and eligible(r)[0]),
                   key=lambda r: r.p99_ns())
    repro = [r for r in cands if _unreproducible(r.config) is None]
    if not repro:
        raise fail("no configuration of the sweep can be recommended (none that `hftagent run` "
                   "can reproduce ran with enough samples for P99)")
    best = repro[0]
    rec = {"variant": best.variant, "batch": best.batch, "config": best.config,
           "p99_ns": best.p99_ns(), "reason": f"lowest P99 of {len(repro)} passing run(s) "
           "that `hftagent run` can reproduce"}
    faster = None
    if cands[0] is not best:  # the fastest run cannot be expressed as a `run` line
        f = cands[0]
        faster = {"variant": f.variant, "config": f.config, "p99_ns": f.p99_ns(),
                  "note": _unreproducible(f.config)}
    return rec, faster


def _render_threads(result, rec: dict, command: str, faster: dict | None) -> None:
    """The sweep's runs by P99 (the best tagged, why each other is not recommended), the
    command that reproduces the best, and the faster run that cannot be reproduced."""
    from rich.text import Text

    from agent.probe.runner import eligible
    from agent.textout import Column, Row, line, show

    con = _console()
    rows = []
    for r in sorted(result.runs, key=lambda r: (r.p99_ns() is None, r.p99_ns() or 0)):
        p99 = r.p99_ns()
        best = (r.config.get("id") == rec["config"].get("id") and r.variant == rec["variant"])
        why = "" if best or eligible(r)[0] else eligible(r)[1]
        rows.append(Row({"configuration": str(r.config.get("id")), "variant": r.variant,
                         "P99 µs": "-" if p99 is None else f"{p99 / 1000:.1f}",
                         "why not": Text(why)},
                        tag="best" if best else ("ok" if r.ok and not why else
                                                 "not recommended" if r.ok else r.status),
                        tag_style="green" if best else "yellow"))
    show(con, "thread sweep (batch 1)", [Column("configuration"), Column("variant"),
                                          Column("P99 µs", right=True), Column("status"),
                                          Column("why not")], rows,
         head=("configuration", "variant"), tag_column="status")
    line(con, "reproduce with: ", (command, "bold"))
    if faster:
        line(con, f"faster: {faster['config'].get('id')} (P99 {faster['p99_ns'] / 1000:.1f} "
             f"µs) — {faster['note']}")


MAX_SWEEP_BYTES = 64 << 20  # a saved sweep with full per-sample detail is a few MB


def _saved_sweep(from_file: str):
    """A saved `probe --sweep threads --json` result: a regular file (a FIFO would block,
    /dev/zero would read forever), bounded, JSON of the probe's result shape."""
    from agent.probe.result import ProbeResult
    from tuning.safepath import UnsafePath, read_regular

    shown = repr(from_file if len(from_file) <= 200 else from_file[:200] + "…")
    if not from_file.strip() or "\x00" in from_file:
        raise fail(f"--from {shown}: not a file path")
    try:
        doc = json.loads(read_regular(from_file, MAX_SWEEP_BYTES))
        return ProbeResult.from_dict(doc)
    except FileNotFoundError:
        raise fail(f"--from {shown}: no such file") from None
    except UnsafePath as exc:
        raise fail(f"--from {shown}: {exc}") from None
    except OSError as exc:
        raise fail(f"--from {shown}: cannot read it ({exc.strerror or exc})") from None
    except RecursionError:
        raise fail(f"--from {shown}: not a saved probe result (nested too deeply)") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise fail(f"--from {shown}: not a saved probe result ({exc})") from None


def _unreproducible(config: dict) -> str | None:
    """Why `hftagent run` cannot reproduce a sweep configuration, or None when it can."""
    from tuning.launcher import CALLER_THREAD_HINT

    inter = config.get("inter")
    if inter is not None and inter < 1:
        return CALLER_THREAD_HINT
    if config.get("intra") is None or inter is None or not config.get("cpus"):
        return ("TensorFlow's default thread pools and affinity: `hftagent run` always sets "
                "the thread counts and CPUs, so run the program without it to get these")
    return None


TRY_HELP = ("Measure which wake-up lever helps on this box: the probe (watch's numpy "
            "LSTM-shaped one, open loop at --rate, so the CPU idles between calls) runs on the "
            "target CPUs in interleaved blocks under each arm — none, isolation alone, "
            "isolation + PM QoS 0, + keep-awake (pause loop), + keep-awake (busy loop), + guest "
            "halt-polling where the guest has it — the order shuffled per round (the seed is "
            "printed). Prints each arm's n and P50/P99/P99.9 with distribution-free 95 % "
            "intervals and the winner: the lowest P99.9 upper bound; a lever not better than "
            "isolation alone by its own interval never wins. Every lever is undone after each "
            "block and on every exit (Ctrl-C, SIGTERM, an error). The result goes to history "
            "and to ROOT/run/hftagent/tune-try.json, from which the audit recommends a "
            "wake-up lever. Needs root. Exit 0 with a winner, 2 without one, 1 on an error.")


LeversOpt = Annotated[str | None, typer.Option(
    "--levers", metavar="LIST", help="Lever arms to run (comma-separated: pm-qos, keep-awake, "
    "keep-awake-busy, halt-poll; default all). none and isolation alone always run.")]
RoundsOpt = Annotated[int, typer.Option("--rounds", metavar="N", help="Rounds; each runs every "
                                        "arm once.")]
BlockOpt = Annotated[float, typer.Option("--block-s", metavar="SECONDS", help="Seconds per "
                                         "block.")]
RateOpt = Annotated[float, typer.Option("--rate", metavar="HZ", help="Probe calls per second "
                                        "(open loop).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", metavar="N", help="Seed of the block "
                                             "order (default: random, printed).")]
WorkloadOpt = Annotated[str, typer.Option("--workload", metavar="KIND", help="numpy (default) "
                                          "or tflite (the bundled LSTM .tflite on LiteRT).")]
TryDryOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan (arms, rounds, block "
                                         "length, estimated time); change nothing.")]


def try_cmd(cpus: CpusOpt = None, levers: LeversOpt = None, rounds: RoundsOpt = 3,
            block_s: BlockOpt = 8.0, rate: RateOpt = 280.0, seed: SeedOpt = None,
            workload: WorkloadOpt = "numpy", dry_run: TryDryOpt = False,
            json_out: JsonOpt = False, state_dir: StateOpt = None, db: DbOpt = None,
            no_history: NoHistoryOpt = False, root: RootOpt = "/", procfs: ProcfsOpt = None,
            sysfs: SysfsOpt = None) -> None:
    import secrets

    from agent.commands.common import Stopped, check_history_db, stop_on_signals
    from agent.trial import record, session
    from agent.trial.levers import one_at_a_time, trial_state_dir

    host = make_host(root, procfs, sysfs)
    sd = _state_dir(host, state_dir)
    plan = session.prepare(host, cpus=cpus, levers=levers, rounds=rounds, block_s=block_s,
                           rate=rate, seed=seed if seed is not None else secrets.randbelow(
                               1 << 31), workload=workload)
    if dry_run:
        print(json.dumps(plan.to_dict(), indent=2) if json_out else
              "\n".join(session.describe(plan)))
        raise typer.Exit(0)

    def say(msg: str) -> None:
        print(f"hftagent tune try: {msg}", file=sys.stderr, flush=True)
    session.check_host(host, None, say)  # root on the live host, before any file is made
    history = check_history_db(db, no_history)
    try:
        with one_at_a_time(host), stop_on_signals():
            session.check_host(host, trial_state_dir(sd), say)
            say(session.describe(plan)[0])
            res = session.execute(host, plan, trial_state_dir(sd), say)
    except Stopped as exc:
        raise fail(f"tune try stopped by {exc.name}: every lever undone, nothing recorded",
                   exc.exit_code) from None
    doc = record.result_doc(plan, res.run, res.arms, res.verdict)
    where = record.keep(host, doc, res.run, state_dir=sd if state_dir else None, db=db,
                        history=history)
    if json_out:
        print(json.dumps({**doc, "recorded": where}, indent=2))
    else:
        from agent.trial.table import notes, render
        con = _console()
        render(con, res.arms, res.verdict)
        notes(con, doc, where)
    raise typer.Exit(0 if res.verdict.winner else 2)
