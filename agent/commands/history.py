"""`hftagent history`: list, show, export and plot recorded runs."""

from __future__ import annotations

import csv
import json
import sys
from typing import Annotated, Any

import typer

from agent.commands.common import DbOpt, JsonOpt, cli_errors, fail

HELP = """Runs recorded by probe, watch, audit and gate (SQLite; --db, else $HFTAGENT_DB,
else $XDG_STATE_HOME/hftagent/history.sqlite). Without a subcommand: list the newest runs.

Options given before a subcommand apply to it: `history --db X show 3` reads X. One the
subcommand does not take (`history --limit 5 show 3`) is an error, never ignored.

Only hftagent's own databases are opened (PRAGMA application_id "HFTA", an `hftagent` table;
older ones are recognised and stamped): another SQLite file is refused and left untouched.
A row with a value of the wrong type (a BLOB, a NULL, text that is not UTF-8) is skipped with
one warning that counts them. --out is never followed through a symlink, replaces only a
regular file of ours, and is written whole (a temporary file renamed into place)."""

ModelOpt = Annotated[str | None, typer.Option("--model", help="Only runs whose model path, "
                                              "key (builtin:NAME) or hash contains this.")]
LimitOpt = Annotated[int, typer.Option("--limit", help="Newest N runs.")]
KindOpt = Annotated[str | None, typer.Option("--kind", help="probe | watch | audit | gate")]

CSV_COLUMNS = ("id", "created_utc", "kind", "command", "scenario", "model_key", "model_hash",
               "variant", "tf_version", "host_digest", "sample_count", "p50_ns", "p99_ns",
               "p999_ns", "cold_start_ns", "gate_status")


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


def _us(ns: Any) -> str:
    if ns is None:
        return "—"
    return f"{ns / 1e3:,.0f}" if ns >= 100_000 else f"{ns / 1e3:.1f}"


def history_list(ctx: typer.Context, model: ModelOpt = None, limit: LimitOpt = 20,
                 kind: KindOpt = None, db: DbOpt = None, json_out: JsonOpt = False) -> None:
    if ctx.invoked_subcommand is not None:
        return  # the subcommand takes the options given here (_with_group)
    from agent.gate.history import History, check_kind, db_exists, resolve_db
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
        print(json.dumps([_row(r) for r in runs], indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"{len(runs)} run(s) in {path}", title_justify="left")
    for c in ("id", "UTC", "kind", "model", "variant", "n", "P50µs", "P99µs", "P99.9µs",
              "gate"):
        t.add_column(c, overflow="fold")
    for r in runs:
        kind = r.kind + (f"/{r.scenario}" if r.scenario else "")
        t.add_row(str(r.id), r.created_utc[5:16].replace("T", " "), kind,
                  (r.model_key or "").removeprefix("builtin:"), r.variant or "",
                  str(r.sample_count or ""), _us(r.p50_ns), _us(r.p99_ns), _us(r.p999_ns),
                  r.gate_status or "")
    Console().print(t)


def _note_skipped(h) -> None:
    """One warning line on stderr when rows were skipped for values of the wrong type."""
    note = h.skipped_note()
    if note:
        print(note, file=sys.stderr)


def _row(r) -> dict:
    d = r.to_dict()
    return {k: d[k] for k in CSV_COLUMNS}


def export_doc(h, r, with_samples: bool) -> dict:
    """The ``hftagent.run`` v1 document (also a valid ``gate --baseline FILE``)."""
    d: dict = {"schema": "hftagent.run", "schema_version": 1, "run": r.to_dict(),
               "gate_results": h.gate_results(r.id)}
    if with_samples:
        lat = h.samples(r.id)
        d["latency_ns"] = None if lat is None else lat.tolist()
    return d


def show(ctx: typer.Context,
         run_id: Annotated[str, typer.Argument(help="Run id or 'latest'.")],
         samples: Annotated[bool, typer.Option("--samples/--no-samples",
                                               help="Include raw latencies in --json.")] = True,
         db: DbOpt = None, json_out: JsonOpt = False) -> None:
    from agent.gate.history import History, parse_run_id
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
    from rich.console import Console
    con = Console()
    con.print(f"[bold]run {r.id}[/bold]  {r.created_utc}  {r.kind} ({r.command})  "
              f"scenario {r.scenario or '—'}")
    con.print(f"model {r.model_key or '—'}  hash {(r.model_hash or '—')[:16]}  variant "
              f"{r.variant or '—'}  TF {r.tf_version or '—'}")
    con.print(f"samples {r.sample_count or 0}  P50 {_us(r.p50_ns)} µs  P99 {_us(r.p99_ns)} µs"
              f"  P99.9 {_us(r.p999_ns)} µs  cold start {_us(r.cold_start_ns)} µs")
    fp = r.fingerprint or {}
    con.print("host: " + ", ".join(f"{k}={fp.get(k)}" for k in
                                   ("hostname", "kernel", "cpu_model", "governors", "turbo",
                                    "isolated_cpus", "virtualization", "gpu_models",
                                    "gpu_driver", "audit")), style="dim")
    for g in doc["gate_results"]:
        con.print(f"gate #{g['id']} [{g['scenario']}] vs {g['baseline_id'] or '—'}: "
                  f"{g['status']}")


def _check_out(out: str) -> None:
    """``--out``, checked before any work (agent/outfile.py's rules, via
    agent.commands.common.check_output_file)."""
    from agent.commands.common import check_output_file
    check_output_file(out, "--out")


def export(ctx: typer.Context, fmt: Annotated[str, typer.Option("--format", help="csv | json")] = "csv",
           out: Annotated[str | None, typer.Option("--out", help="File (default stdout).")
                          ] = None,
           samples: Annotated[bool, typer.Option("--samples/--no-samples",
                                                 help="JSON: include raw latencies.")] = False,
           model: ModelOpt = None, limit: LimitOpt = 1000, kind: KindOpt = None,
           db: DbOpt = None) -> None:
    from agent.gate.history import History, check_kind
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
            _write_export(sys.stdout, fmt, runs, docs)
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
        _write_export(f, fmt, runs, docs)


def _write_export(f, fmt: str, runs: list, docs: list | None) -> None:
    if fmt == "csv":
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in runs:
            row = _row(r)
            w.writerow(["" if row[c] is None else row[c] for c in CSV_COLUMNS])
    else:
        json.dump({"schema": "hftagent.runs", "schema_version": 1, "runs": docs}, f)
        f.write("\n")


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
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    from agent.gate.history import History
    with History(db, create=False) as h:
        runs = [r for r in h.runs(model=model, variant=variant, scenario=scenario, limit=None)
                if r.p99_ns is not None]
        if not runs:
            given = [f"{flag} {v!r}" for flag, v in (("--model", model), ("--variant", variant),
                                                      ("--scenario", scenario)) if v is not None]
            raise fail("no runs with latency samples" + (f" match {', '.join(given)}" if given
                                                          else f" in {h.path}"))
        latest = runs[0]
        same = [r for r in runs if (r.model_key, r.variant, r.scenario) ==
                (latest.model_key, latest.variant, latest.scenario)][:limit][::-1]
        lat = h.samples(latest.id)
        _note_skipped(h)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ids = [r.id for r in same]
    for attr, label in (("p50_ns", "P50"), ("p99_ns", "P99"), ("p999_ns", "P99.9")):
        ys = [getattr(r, attr) / 1e3 if getattr(r, attr) is not None else float("nan")
              for r in same]
        ax1.plot(ids, ys, marker="o", label=label)
    for r in same:
        if r.gate_status == "fail":
            ax1.axvline(r.id, color="red", alpha=0.2)
    ax1.set_xlabel("run id")
    ax1.set_ylabel("latency (µs)")
    ax1.set_yscale("log")
    ax1.set_title(f"{latest.model_key} {latest.variant} [{latest.scenario}]")
    ax1.legend()
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.grid(True, which="both", alpha=0.3)
    if lat is not None and lat.size:
        import numpy as np
        us = lat / 1e3
        lo, hi = max(float(us.min()), 1e-3), float(us.max())
        bins = np.geomspace(lo, hi * 1.0001, 80) if hi > lo else 10
        ax2.hist(us, bins=bins)
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        for attr, label, c in (("p50_ns", "P50", "green"), ("p99_ns", "P99", "orange"),
                               ("p999_ns", "P99.9", "red")):
            v = getattr(latest, attr)
            if v is not None:
                ax2.axvline(v / 1e3, color=c, linestyle="--", label=f"{label} {v / 1e3:,.0f} µs")
        ax2.legend()
    for axis in (ax1.yaxis, ax2.xaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        axis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel("latency (µs)")
    ax2.set_ylabel("samples")
    ax2.set_title(f"run {latest.id}: {latest.sample_count or 0} samples")
    fig.tight_layout()
    from agent.plot import save
    save(fig, out, "--out", dpi=None)  # agent/outfile.py: a new file, or a regular one of ours
    print(f"wrote {out} ({len(same)} runs)", file=sys.stderr)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help=HELP, invoke_without_command=True, no_args_is_help=False)
    sub.callback()(cli_errors(history_list))
    sub.command("show", help="One run: summary, host fingerprint, gate results; --json "
                "gives an hftagent.run document (a valid gate --baseline FILE).")(cli_errors(show))
    sub.command("export", help="Runs as CSV or JSON.")(cli_errors(export))
    sub.command("plot", help="Percentiles across runs and the latest run's distribution "
                "(needs matplotlib: the 'plot' extra).")(cli_errors(plot))
    app.add_typer(sub, name="history")
