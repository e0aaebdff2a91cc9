"""`hftagent history`: list, show, export and plot recorded runs."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from agent.commands.common import (
    DbOpt,
    JsonOpt,
    cli_errors,
    fail,
    paragraphs,
    plain_flags,
    register_command,
)

HELP = """Runs recorded by probe, watch, audit, cpus and gate (SQLite; --db, else $HFTAGENT_DB,
else $XDG_STATE_HOME/hftagent/history.sqlite). Without a subcommand: list the newest runs.

Options given before a subcommand apply to it: `history --db X show 3` reads X. One the
subcommand does not take (`history --limit 5 show 3`) is an error, never ignored.

Only hftagent's own databases are opened (PRAGMA application_id "HFTA", an `hftagent` table;
older ones are recognised and stamped): another SQLite file is refused and left untouched.
A row with a value of the wrong type (a BLOB, a NULL, text that is not UTF-8) is skipped with
one warning that counts them. --out is never followed through a symlink, replaces only a
regular file of ours, and is written whole (a temporary file renamed into place)."""

ModelOpt = Annotated[str | None, typer.Option("--model", metavar="TEXT", help="Only runs whose "
                                              "model path, key (builtin:NAME) or hash contains "
                                              "this.")]
LimitOpt = Annotated[int, typer.Option("--limit", metavar="N", help="Newest N runs.")]
KindOpt = Annotated[str | None, typer.Option("--kind", metavar="KIND", help="probe | watch | "
                                             "audit | gate | cpus | trial (tune try)")]



def _check_limit(limit: int) -> None:
    if not 1 <= limit <= 1_000_000:
        raise fail("--limit must be between 1 and 1000000")


def _given(ctx: typer.Context) -> dict[str, Any]:
    """{parameter name: value} of the options given on the command line (not defaults)."""
    out = {}
    for p in ctx.command.params:
        src = ctx.get_parameter_source(p.name) if p.name in ctx.params else None
        # ParameterSource's class is not public in typer's vendored click: compare by name
        if src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT"):
            out[p.name] = ctx.params[p.name]
    return out


def _flag(ctx: typer.Context, name: str) -> str:
    return next((p.opts[0] for p in ctx.command.params if p.name == name), name)


def _with_group(ctx: typer.Context, **values: Any) -> dict[str, Any]:
    """``values`` (this subcommand's options) with the options given to ``history`` before
    the subcommand merged in. An option the subcommand does not take, or one given on both
    sides with different values, is an error: an option that is given is never ignored."""
    parent = ctx.parent
    if parent is None:
        return values
    group, mine, sub = _given(parent), _given(ctx), ctx.info_name
    out = dict(values)
    for name, value in group.items():
        flag = _flag(parent, name)
        if name not in values:
            raise fail(f"history {flag} does not apply to 'history {sub}'"
                       + (" (it filters the run listing)" if name in ("model", "limit", "kind")
                          else ""))
        if name in mine and mine[name] != value:
            raise fail(f"{flag} given twice with different values: {value!r} before "
                       f"'{sub}', {mine[name]!r} after")
        out[name] = value
    return out


def history_list(ctx: typer.Context, model: ModelOpt = None, limit: LimitOpt = 20,
                 kind: KindOpt = None, db: DbOpt = None, json_out: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is not None:
        return  # the subcommand takes the options given here (_with_group)
    from agent.history import History, check_kind, db_exists, resolve_db
    _check_limit(limit)
    check_kind(kind)
    if not db_exists(db):  # listing never creates a database
        if json_out:
            print("[]")
        else:
            print(f"no runs recorded yet (no history database at {resolve_db(db)})")
        return
    with History(db) as h:
        runs = h.runs(model=model, kind=kind, limit=limit)
        path = h.path
        _note_skipped(h)
    if json_out:
        from agent.history.documents import row
        print(json.dumps([row(r) for r in runs], indent=2))
        return
    from agent.history.render import render_list
    render_list(runs, path)


def _note_skipped(h) -> None:
    """One warning line on stderr when rows were skipped for values of the wrong type."""
    note = h.skipped_note()
    if note:
        print(note, file=sys.stderr)


def show(ctx: typer.Context,
         run_id: Annotated[str, typer.Argument(help="Run id or 'latest'.")],
         samples: Annotated[bool, typer.Option("--samples/--no-samples",
                                               help="Include raw latencies in --json.")] = True,
         db: DbOpt = None, json_out: JsonOpt = False) -> None:
    from agent.history import History, parse_run_id
    from agent.history.documents import export_doc
    o = _with_group(ctx, db=db, json_out=json_out)
    db, json_out = o["db"], o["json_out"]
    rid = None if run_id == "latest" else parse_run_id(run_id)
    with History(db, create=False) as h:
        r = h.get(h.latest_id() if rid is None else rid)
        doc = export_doc(h, r, samples and json_out)
        _note_skipped(h)
    if json_out:
        print(json.dumps(doc))
        return
    from agent.history.render import render_run
    render_run(r, doc["gate_results"])


def _check_out(out: str) -> None:
    """``--out``, checked before any work (agent/outfile.py's rules, via
    agent.commands.common.check_output_file)."""
    from agent.commands.common import check_output_file
    check_output_file(out, "--out")


def export(ctx: typer.Context,
           fmt: Annotated[str, typer.Option("--format", metavar="csv|json",
                                            help="The format.")] = "csv",
           out: Annotated[str | None, typer.Option("--out", help="File (default stdout).")
                          ] = None,
           samples: Annotated[bool, typer.Option("--samples/--no-samples",
                                                 help="JSON: include raw latencies.")] = False,
           model: ModelOpt = None, limit: LimitOpt = 1000, kind: KindOpt = None,
           db: DbOpt = None) -> None:
    from agent.history import History, check_kind
    from agent.history.documents import export_doc, write_export
    o = _with_group(ctx, model=model, limit=limit, kind=kind, db=db)
    model, limit, kind, db = o["model"], o["limit"], o["kind"], o["db"]
    if fmt not in ("csv", "json"):
        raise fail(f"--format must be csv or json, not {fmt!r}")
    _check_limit(limit)
    check_kind(kind)
    if out is not None:
        _check_out(out)
    with History(db, create=False) as h:
        runs = h.runs(model=model, kind=kind, limit=limit)
        docs = [export_doc(h, r, samples) for r in runs] if fmt == "json" else None
        _note_skipped(h)
    if out is None:
        try:
            write_export(sys.stdout, fmt, runs, docs)
            sys.stdout.flush()
        except BrokenPipeError:
            raise  # a reader that stopped early: agent/cli.py ends quietly
        except OSError as exc:
            raise fail(f"cannot write to stdout: {exc.strerror or exc}") from None
        return
    from agent.outfile import open_output
    # a temporary file renamed over --out once complete: never half-written, never written
    # through a link planted at the path (agent/outfile.py)
    with open_output(out, "--out") as f:
        write_export(f, fmt, runs, docs)


def plot(ctx: typer.Context,
         out: Annotated[str, typer.Option("--out", help="FILE.png or FILE.svg")],
         model: ModelOpt = None,
         variant: Annotated[str | None, typer.Option("--variant", help="Only this variant.")
                            ] = None,
         scenario: Annotated[str | None, typer.Option("--scenario", help="Only this scenario "
                                                      "(default: the latest run's).")] = None,
         limit: LimitOpt = 50, db: DbOpt = None) -> None:
    """Percentiles across runs and the latest run's latency distribution."""
    o = _with_group(ctx, model=model, limit=limit, db=db)
    model, limit, db = o["model"], o["limit"], o["db"]
    if not out.lower().endswith((".png", ".svg")):
        raise fail(f"--out must end in .png or .svg, not {out!r}")
    _check_out(out)
    _check_limit(limit)
    from agent.plot import pyplot
    plt = pyplot("history plot")

    from agent.history import History
    with History(db, create=False) as h:
        runs = h.series(model=model, variant=variant, scenario=scenario, limit=limit)
        if not runs:
            given = [f"{flag} {v!r}" for flag, v in (("--model", model), ("--variant", variant),
                                                      ("--scenario", scenario)) if v is not None]
            raise fail("no runs with latency samples" + (f" match {', '.join(given)}" if given
                                                          else f" in {h.path}"))
        lat = h.samples(runs[-1].id)
        _note_skipped(h)
    from agent.history.plot import draw
    draw(plt, runs, runs[-1], lat, out)
    print(f"wrote {out} ({len(runs)} runs)", file=sys.stderr)


def register(app: typer.Typer) -> None:
    plain_flags()
    sub = typer.Typer(help=paragraphs(HELP), invoke_without_command=True, no_args_is_help=False)
    sub.callback()(cli_errors(history_list))
    register_command(sub, "show", show, "One run in its kind's shape (probe and gate: latency "
                     "figures; audit: its findings; cpus: the ranking; watch: spikes by "
                     "cause), the host fingerprint, gate results; --json gives an "
                     "hftagent.run document (a valid gate --baseline FILE).")
    register_command(sub, "export", export, "Runs as CSV or JSON.")
    register_command(sub, "plot", plot, "Percentiles across runs and the latest run's "
                     "distribution (needs matplotlib: the 'plot' extra).")
    app.add_typer(sub, name="history")
