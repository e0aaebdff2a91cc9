"""`hftagent history`: list, show, export and plot recorded runs."""

from __future__ import annotations

import csv
import json
import sys
from typing import Annotated, Any

import typer
from rich.text import Text

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
                                             "audit | gate | cpus")]

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
    from agent import textout
    con = textout.console()
    cols = [textout.Column("id", right=True, label="run"), textout.Column("UTC"),
            textout.Column("kind"), textout.Column("model"), textout.Column("variant"),
            textout.Column("n", right=True), textout.Column("P50µs", right=True),
            textout.Column("P99µs", right=True), textout.Column("P99.9µs", right=True),
            textout.Column("gate")]
    rows = []
    for r in runs:
        k = r.kind + (f"/{r.scenario}" if r.scenario else "")
        cells = {"id": str(r.id), "UTC": r.created_utc[:16].replace("T", " "), "kind": k,
                 "model": Text((r.model_key or "").removeprefix("builtin:")),
                 "variant": Text(r.variant or ""), "n": str(r.sample_count or ""),
                 "P50µs": _us_marked(r.p50_ns, r.sample_count, 50.0),
                 "P99µs": _us_marked(r.p99_ns, r.sample_count, 99.0),
                 "P99.9µs": _us_marked(r.p999_ns, r.sample_count, 99.9),
                 "gate": r.gate_status or ""}
        rows.append(textout.Row(cells, tag=r.kind))
    title = Text(f"{len(runs)} run(s) in ")
    title.append(str(path))
    textout.show(con, title, cols, rows, head=("id", "UTC"), tag_column="kind")


def _us_marked(ns: Any, count: int | None, q: float) -> str:
    """A percentile in µs, ``*`` when the run's samples are too few to claim it (as the
    probe's tables mark it: agent.stats.REQUIRED_SAMPLES)."""
    from agent.stats import REQUIRED_SAMPLES
    if ns is None:
        return ""
    return _us(ns) + ("*" if (count or 0) < REQUIRED_SAMPLES[q] else "")


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
    render_run(r, doc["gate_results"])


def _plain(v: Any) -> str:
    """A stored value as a person reads it: never ``None``, a dict repr or a list repr."""
    if v is None or v == "":
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_plain(x)}" for k, x in v.items()) or "—"
    if isinstance(v, list | tuple):
        return ", ".join(_plain(x) for x in v) or "—"
    return str(v)


FINGERPRINT_KEYS = ("hostname", "kernel", "cpu_model", "online_cpus", "governors", "turbo",
                    "isolated_cpus", "nohz_full_cpus", "virtualization", "gpu_models",
                    "gpu_driver", "audit")


def render_run(r, gate_results: list[dict], con=None) -> None:
    """One run in its kind's own shape: a probe or gate run its latency figures; an audit its
    findings; a cpus scan its ranking; a watch its causes. Then the host it ran on and its
    gate results. Every string from the database is printed as text, never as markup."""
    from agent import textout
    con = con or textout.console()
    w = max(con.width, 40)
    head = [("kind", f"{r.kind} ({r.command})"), ("UTC", r.created_utc)]
    if r.scenario:
        head.append(("scenario", r.scenario))
    textout.line(con, (f"run {r.id}", "bold"))
    for ln in textout.pack(head, w, indent="  "):
        con.print(ln, soft_wrap=True)
    summary = r.summary if isinstance(r.summary, dict) else {}
    shape = {"audit": _show_audit, "cpus": _show_cpus, "watch": _show_watch}.get(r.kind,
                                                                                 _show_latency)
    shape(con, r, summary)
    fp = r.fingerprint if isinstance(r.fingerprint, dict) else {}
    textout.line(con, ("host", "bold"))
    pairs = [(k, _plain(fp.get(k))) for k in FINGERPRINT_KEYS if fp.get(k) not in (None, "")]
    for ln in textout.pack(pairs, w, indent="  ") or [Text("  (no fingerprint recorded)")]:
        con.print(ln, soft_wrap=True, style="dim")
    for g in gate_results:
        textout.line(con, f"gate #{g['id']} [{_plain(g.get('scenario'))}] vs "
                     f"{_plain(g.get('baseline_id'))}: ", (_plain(g.get("status")), "bold"))


def _show_latency(con, r, summary: dict) -> None:
    """probe and gate runs: the model, the variant and the latency figures."""
    from agent import textout
    pairs = [("model", Text(r.model_key or "—")), ("hash", (r.model_hash or "—")[:16]),
             ("variant", Text(r.variant or "—")), ("TF", r.tf_version or "—"),
             ("samples", f"{r.sample_count or 0:,}"), ("P50", _us_unit(r.p50_ns)),
             ("P99", _us_unit(r.p99_ns)), ("P99.9", _us_unit(r.p999_ns)),
             ("cold start", _us_unit(r.cold_start_ns))]
    lat = summary.get("latency") if isinstance(summary.get("latency"), dict) else {}
    suff = lat.get("sufficient") if isinstance(lat.get("sufficient"), dict) else {}
    for q in ("p99", "p999"):
        if suff.get(q) is False:
            pairs = [(k, v + "*" if k == {"p99": "P99", "p999": "P99.9"}[q] else v)
                     for k, v in pairs]
    for ln in textout.pack(pairs, max(con.width, 40), indent="  "):
        con.print(ln, soft_wrap=True)
    if any(suff.get(q) is False for q in ("p99", "p999")):
        textout.line(con, "  * = fewer samples than needed to claim this percentile",
                     style="dim")


def _us_unit(ns: Any) -> str:
    return "—" if ns is None else f"{_us(ns)} µs"


def _show_audit(con, r, summary: dict) -> None:
    """An audit run: its status counts and every finding that is not ok."""
    from agent import textout
    from agent.render import STYLE
    from tuning.findings import Status
    findings = [f for f in summary.get("findings") or [] if isinstance(f, dict)]
    counts = summary.get("summary") if isinstance(summary.get("summary"), dict) else {}
    textout.line(con, "  ", ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                 or f"{len(findings)} findings", (f"  profile {_plain(summary.get('profile'))}"
                                                  f", target CPUs "
                                                  f"{_plain(summary.get('target_cpus'))}",
                                                  "dim"))
    todo = [f for f in findings if f.get("status") not in ("ok", "unsupported")]
    if not todo:
        textout.line(con, "  nothing to fix", style="green")
    said: dict[str, str] = {}
    for f in todo:
        st = str(f.get("status"))
        try:
            style = STYLE[Status(st)]
        except ValueError:
            style = ""
        textout.line(con, "  ", (f"[{st}]", style), " ", _plain(f.get("title")),
                     (f"  ({_plain(f.get('id'))})", "dim"))
        if f.get("current"):
            textout.line(con, f"      current:  {_plain(f.get('current'))}")
        if f.get("expected"):
            textout.line(con, f"      expected: {_plain(f.get('expected'))}")
        fix = f.get("fix")
        if fix:
            if fix in said:
                textout.line(con, f"      fix: as for {said[fix]}")
            else:
                said[fix] = _plain(f.get("id"))
                for i, cmd in enumerate(str(fix).splitlines()):
                    textout.line(con, ("      fix: " if i == 0 else "           ") + cmd)
    unsupported = sum(1 for f in findings if f.get("status") == "unsupported")
    if unsupported:
        textout.line(con, f"  {unsupported} unsupported here (hftagent history show "
                     f"{r.id} --json lists them)", style="dim")


def _show_cpus(con, r, summary: dict) -> None:
    """A cpus scan: the ranking with each CPU's verdict and lost time, the recommendation."""
    from agent import textout
    from collectors.parsers import format_cpulist
    cpus = {c.get("cpu"): c for c in summary.get("cpus") or [] if isinstance(c, dict)}
    ranked = [c for c in summary.get("ranked") or [] if c in cpus]
    ranked += [c for c in cpus if c not in ranked]
    left = summary.get("left_out") if isinstance(summary.get("left_out"), dict) else {}
    for c in ranked:
        d = cpus[c]
        verdict = "error" if d.get("error") else _plain(d.get("verdict"))
        pairs = [("lost µs/s", _plain(d.get("noise_us_per_s"))),
                 ("gaps/s", _plain(d.get("gaps_per_s")))]
        why = d.get("error") or left.get(str(c)) or left.get(c)
        if why:
            pairs.append(("left out", _plain(why)))
        textout.line(con, "  ", (f"[{verdict}]", "green" if verdict == "quiet" else "yellow"),
                     f" CPU {c}")
        for ln in textout.pack(pairs, max(con.width, 40)):
            con.print(ln, soft_wrap=True)
    rec = [c for c in summary.get("recommended") or [] if isinstance(c, int)]
    textout.line(con, "  recommended: ", (f"--cpus {format_cpulist(rec)}", "bold") if rec
                 else ("none", "red"))


def _show_watch(con, r, summary: dict) -> None:
    """A watch run: its samples and spikes, the latency figures, the spikes by cause."""
    from agent import textout
    pairs = [(k, _plain(summary.get(k))) for k in ("samples", "spikes")
             if summary.get(k) is not None]
    for key, label in (("p50_ns", "P50"), ("p99_ns", "P99"), ("p999_ns", "P99.9")):
        v = summary.get(key, getattr(r, key, None))
        if isinstance(v, int | float):
            pairs.append((label, _us_unit(v)))
    if r.model_key:
        pairs.insert(0, ("probe", Text(r.model_key)))
    for ln in textout.pack(pairs, max(con.width, 40), indent="  "):
        con.print(ln, soft_wrap=True)
    causes = summary.get("causes") if isinstance(summary.get("causes"), dict) else {}
    if not causes:
        textout.line(con, "  no spike attributed" if summary.get("spikes") else
                     "  no causes recorded", style="dim")
        return
    textout.line(con, "  spikes by cause:")
    total = sum(v for v in causes.values() if isinstance(v, int | float)) or 0
    for name, n in sorted(causes.items(), key=lambda kv: -(kv[1] if isinstance(kv[1], int |
                                                                                    float)
                                                           else 0)):
        share = f" ({n / total:.0%})" if total and isinstance(n, int | float) else ""
        textout.line(con, f"    {_plain(name)}: {_plain(n)}{share}")


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
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.5))
    _percentiles_across_runs(ax1, same)
    ax1.set_title(f"{latest.model_key} {latest.variant} [{latest.scenario}]")
    if lat is not None and lat.size:
        _distribution(ax2, lat, latest)
    ax2.set_title(f"run {latest.id}: {latest.sample_count or 0:,} samples")
    fig.tight_layout()
    from agent.plot import save
    save(fig, out, "--out", dpi=None)  # agent/outfile.py: a new file, or a regular one of ours
    print(f"wrote {out} ({len(same)} runs)", file=sys.stderr)


PERCENTILE_SERIES = (("p50_ns", "P50", 50.0, "tab:green"), ("p99_ns", "P99", 99.0, "tab:orange"),
                     ("p999_ns", "P99.9", 99.9, "tab:red"))


def _percentiles_across_runs(ax, runs: list) -> None:
    """P50/P99/P99.9 per run on a log axis. A percentile the run had too few samples to
    claim (agent.stats.REQUIRED_SAMPLES: 662 for P99, 6,636 for P99.9) is a hollow marker,
    as the tables mark it with ``*``; a failed gate is a red band. Every mark has a legend
    entry."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    from agent.plot import log_axis
    from agent.stats import REQUIRED_SAMPLES
    ids = [r.id for r in runs]
    handles = []
    hollow = False
    values = []
    for attr, label, q, colour in PERCENTILE_SERIES:
        ys = [getattr(r, attr) / 1e3 if getattr(r, attr) is not None else float("nan")
              for r in runs]
        values += [y for y in ys if y == y]
        enough = [(r.sample_count or 0) >= REQUIRED_SAMPLES[q] for r in runs]
        ax.plot(ids, ys, color=colour, linewidth=1.2)
        ax.plot([i for i, ok in zip(ids, enough, strict=True) if ok],
                [y for y, ok in zip(ys, enough, strict=True) if ok], "o", color=colour)
        short = [(i, y) for i, y, ok in zip(ids, ys, enough, strict=True) if not ok]
        if short:
            hollow = True
            ax.plot([i for i, _ in short], [y for _, y in short], "o", color=colour,
                    markerfacecolor="white")
        handles.append(Line2D([], [], color=colour, marker="o", label=label))
    if hollow:
        handles.append(Line2D([], [], color="gray", marker="o", linestyle="",
                              markerfacecolor="white",
                              label="hollow: too few samples for that percentile"))
    failed = [r.id for r in runs if r.gate_status == "fail"]
    for rid in failed:
        ax.axvspan(rid - 0.3, rid + 0.3, color="red", alpha=0.15, linewidth=0)
    if failed:
        handles.append(Patch(color="red", alpha=0.15, label="gate failed"))
    ax.set_xlabel("run id")
    ax.set_ylabel("latency")
    ax.set_yscale("log")
    log_axis(ax.yaxis, values)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=3, frameon=False)  # below the axes: never over a mark


def _distribution(ax, lat, run) -> None:
    """The latest run's latency histogram (log-log) with its percentiles as vertical lines:
    dashed where the run's samples support the percentile, dotted and marked ``*`` where
    they do not."""
    import numpy as np

    from agent.plot import fmt_us, log_axis
    from agent.stats import REQUIRED_SAMPLES
    us = lat / 1e3
    lo, hi = max(float(us.min()), 1e-3), float(us.max())
    bins = np.geomspace(lo, hi * 1.0001, 80) if hi > lo else 10
    ax.hist(us, bins=bins, color="tab:blue", label="samples")
    ax.set_xscale("log")
    ax.set_yscale("log")
    n = int(lat.size)
    for attr, label, q, colour in PERCENTILE_SERIES:
        v = getattr(run, attr)
        if v is None:
            continue
        ok = n >= REQUIRED_SAMPLES[q]
        ax.axvline(v / 1e3, color=colour, linestyle="--" if ok else ":",
                   label=f"{label} {fmt_us(v / 1e3)}" + ("" if ok else
                                                         f"* ({n:,} < {REQUIRED_SAMPLES[q]:,}"
                                                         " samples)"))
    log_axis(ax.xaxis, [lo, hi])
    ax.set_xlabel("latency")
    ax.set_ylabel("samples")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)  # below the axes: never over a bar or a line


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
