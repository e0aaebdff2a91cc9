"""`hftagent cpus`: rank the CPUs by measured noise and recommend the inference CPUs.

Thin: the options become a :class:`CpusRequest` (checked once, before the scan; the CPUs by
tuning/targets.py's rules), :func:`execute` has agent/noise/survey.py scan, judge and rank
(and writes the outputs), :func:`show` renders."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Annotated

import typer

from agent.commands.common import (
    DbOpt,
    JsonOpt,
    NoHistoryOpt,
    Stopped,
    fail,
    make_host,
    register_command,
    stop_on_signals,
)

HELP = """Scan each candidate CPU for noise and recommend the inference CPUs.

A small C loop pinned to each candidate reads the clock for --duration seconds and records
every gap over --threshold-us (or 8x the smallest gap seen): the time that CPU lost to IRQs,
softirqs, the tick, kworkers, other tasks or the hypervisor. A few CPUs are scanned at a time
(at most a quarter of the online CPUs), never the housekeeping core.

A CPU is quiet or noisy against the quietest candidate (noisy: over 3x its loss and over
200 µs/s, or over 50 ms/s whatever the others do). A single candidate has nothing to be
compared with: it is judged against those absolute limits alone and, between them, called
unranked, not quiet; the report says which basis each verdict has.

The ranking takes the quietest CPUs, one per physical core, on the GPU's / NIC's NUMA node
when known, and avoids CPUs other processes are pinned to. It prints the --cpus to use and the
exact tune and run commands. With kernel events (--trace; root) each CPU's lost time is
attributed exactly: µs per second per IRQ, softirq, tick, work item and task, and the gaps no
event explains as hw_or_hypervisor; without them, from /proc counter deltas. Read-only:
nothing on the host is changed (--trace uses a private tracefs instance, removed after each
batch), except that, as root, what a killed hftagent left in tracefs (its instances and
uprobe events) is removed at the start (--json: each removal a line of trace.notes).

SIGTERM or SIGINT (Ctrl-C) during the scan stops it: the recorders are killed and the
instance removed, the CPUs scanned so far are printed (marked partial; with --json nothing),
nothing is recorded,
exit status 128 + the signal's number (143, 130); a recorder whose hftagent was killed
(kill -9 included) exits at once. Exit status otherwise: 0 a recommendation, 2 none."""

DurationOpt = Annotated[float, typer.Option("--duration", metavar="SECONDS",
                                            help="Seconds of scan per CPU (0 < S <= 60).")]
CandidatesOpt = Annotated[str | None, typer.Option(
    "--candidates", metavar="LIST", help="CPUs to scan. Default: all online CPUs but the "
    "housekeeping core.")]
ThresholdOpt = Annotated[float, typer.Option("--threshold-us", metavar="US",
                                             help="Smallest gap counted as noise (µs).")]
CountOpt = Annotated[int | None, typer.Option(
    "--count", metavar="N", help="How many CPUs to recommend. Default: every quiet one the "
    "rules allow.")]
SiblingsOpt = Annotated[bool, typer.Option("--allow-siblings",
                                           help="Allow both SMT siblings of a core.")]
PlotOpt = Annotated[str | None, typer.Option("--plot", metavar="FILE",
                                             help="Write a PNG of the per-CPU noise here.")]
TraceOpt = Annotated[str, typer.Option(
    "--trace", metavar="MODE", help="Kernel events (tracefs) to attribute each "
    "CPU's gaps exactly: auto (where tracefs is mounted and usable, else /proc deltas and the "
    "reason), on (an error where unusable), off, or mount (mount tracefs at "
    "/sys/kernel/tracing first when it is not mounted). Needs root.")]
TextfileOpt = Annotated[str | None, typer.Option(
    "--textfile", metavar="DIR", help="Also write the per-CPU noise as "
    "DIR/hftagent_cpu_noise.prom for node_exporter's textfile collector.")]


@dataclass
class CpusRequest:
    """A scan, checked: the candidate CPUs (tuning/targets.py's online set, never the
    housekeeping core), the figures' limits, the outputs and the history database."""

    host: object
    online: list[int]
    housekeeping: list[int]
    candidates: list[int]
    duration_s: float
    threshold_us: float
    count: int | None
    allow_siblings: bool
    trace: str
    plot: str | None
    textfile: str | None
    db: str | None
    record: bool
    json: bool


def parse(*, duration, candidates, threshold_us, count, allow_siblings, plot, trace, db,
          no_history, textfile, json_out) -> CpusRequest:
    """Every option checked once, before the scan (one line, exit 1)."""
    from agent.commands.common import check_history_db, check_output_dir, check_output_file
    from agent.noise import scan as sc
    from collectors.parsers import format_cpulist, parse_cpu_option
    from tuning.targets import TargetError, housekeeping_core, online_cpus

    if not 0 < duration <= sc.MAX_DURATION_S:
        raise fail(f"--duration must be > 0 and <= {sc.MAX_DURATION_S:g} s")
    if not 0 < threshold_us <= 1e6:
        raise fail("--threshold-us must be > 0 and <= 1000000")
    if count is not None and count < 1:
        raise fail("--count must be >= 1")
    if trace not in ("auto", "on", "off", "mount"):
        raise fail(f"--trace must be auto, on, off or mount, not {trace!r}")
    if db is not None and no_history:
        raise fail("--db and --no-history contradict each other: give one")
    if plot is not None:
        check_output_file(plot, "--plot")
        from agent.plot import available
        available("--plot")  # before the scan, used after it
    if textfile is not None:
        check_output_dir(textfile, "--textfile")
    record = check_history_db(db, no_history)  # --db checked before the scan (#28.4)
    host = make_host()
    try:
        online, _ = online_cpus(host)
    except TargetError as exc:
        raise fail(str(exc)) from None
    if len(online) < 2:
        raise fail(f"only CPU {format_cpulist(online)} is online: nothing to choose from "
                   "(one CPU must stay for housekeeping)")
    house = housekeeping_core(host, online)
    if candidates is not None:
        try:
            cand = parse_cpu_option(candidates, online)
        except ValueError as exc:
            raise fail(str(exc).replace("--cpus", "--candidates")) from None
        if set(cand) & set(house):
            raise fail(f"--candidates {candidates!r} covers the housekeeping core "
                       f"(CPU {format_cpulist(house)}): scan other CPUs")
    else:
        cand = [c for c in online if c not in house]
    if not cand:
        raise fail("no candidate CPUs left besides the housekeeping core")
    if count is not None and count > len(cand):
        raise fail(f"--count {count} is more than the {len(cand)} candidate CPU(s)")
    return CpusRequest(host, online, house, cand, duration, threshold_us, count,
                       allow_siblings, trace, plot, textfile, db, record, json_out)


@dataclass
class CpusOutcome:
    results: list
    choice: object
    doc: dict
    stopped: Stopped | None = None
    not_scanned: list[int] = field(default_factory=list)


def scan(req: CpusRequest) -> tuple[list, Stopped | None, dict]:
    """The candidates, a batch at a time (agent/noise/survey.py); a stop keeps the batches
    that finished (the one in flight is lost: its recorders are killed). With the kernel
    events' state (agent.noise.events.Tracer.info)."""
    from agent.noise.events import Tracer
    from agent.noise.survey import scan_candidates
    from collectors.parsers import format_cpulist

    def say(line: str) -> None:
        if not req.json:
            print(line, file=sys.stderr, flush=True)

    results: list = []
    tracer = Tracer(req.trace, req.host)
    try:
        with stop_on_signals():
            scan_candidates(
                req.host, req.candidates, len(req.online), req.duration_s, req.threshold_us,
                into=results, tracer=tracer, irq_sender=req.housekeeping[0],
                built=lambda: say(f"hftagent cpus: {len(req.candidates)} candidate CPU(s), "
                                  f"{req.duration_s:g} s each"),
                progress=lambda group: say(f"scanning CPU {format_cpulist(group)} for "
                                           f"{req.duration_s:g} s ..."))
    except Stopped as stop:
        return sorted(results, key=lambda r: r.cpu), stop, tracer.info()
    return sorted(results, key=lambda r: r.cpu), None, tracer.info()


def execute(req: CpusRequest) -> CpusOutcome:
    """Scan, judge and rank (agent/noise/survey.py); write the plot and the textfile and
    record the run when the scan finished."""
    from agent.noise import survey

    results, stopped, trace = scan(req)
    choice = survey.recommend(req.host, results, req.candidates, count=req.count,
                              allow_siblings=req.allow_siblings)
    doc = survey.document(results, choice, trace, duration_s=req.duration_s,
                          threshold_us=req.threshold_us, online=req.online,
                          housekeeping=req.housekeeping, candidates=req.candidates,
                          complete=stopped is None)
    scanned = {r.cpu for r in results}
    out = CpusOutcome(results, choice, doc, stopped,
                      [c for c in req.candidates if c not in scanned])
    if stopped is not None:
        return out
    if req.plot:
        _plot(results, choice.recommended, req.plot)
    if req.textfile:
        import time

        from agent.export.textfile import render_families, write_prom
        from agent.noise.export import TEXTFILE_NAME, families
        write_prom(render_families(families(doc, time.time())), req.textfile, TEXTFILE_NAME)
    if req.record:
        # the noise fingerprint of this box, comparable over time and across boxes
        # (hftagent history list --kind cpus; history show N)
        from agent.history import record_run
        record_run("cpus", doc, None, command="cpus", db=req.db, warn=True)
    return out


def show(req: CpusRequest, out: CpusOutcome) -> None:
    """The ranking (JSON or the report). A stopped scan prints its partial report for a
    person; under --json nothing (a document is whole or not at all), only the line on
    stderr."""
    if req.json:
        if out.stopped is None:
            print(json.dumps(out.doc, indent=2))
    else:
        render(out, req.housekeeping)
    if out.stopped is not None:
        print(f"hftagent: cpus stopped by {out.stopped.name} during the scan: recorders "
              "killed, nothing recorded", file=sys.stderr)
        raise typer.Exit(out.stopped.exit_code)
    if not out.choice.recommended:
        raise typer.Exit(2)


def cpus(duration: DurationOpt = 1.0, candidates: CandidatesOpt = None,
         threshold_us: ThresholdOpt = 1.0, count: CountOpt = None,
         allow_siblings: SiblingsOpt = False, plot: PlotOpt = None, trace: TraceOpt = "auto",
         db: DbOpt = None, no_history: NoHistoryOpt = False, textfile: TextfileOpt = None,
         json_out: JsonOpt = False) -> None:
    req = parse(**locals())
    show(req, execute(req))


VERDICT_STYLE = {"quiet": "green", "noisy": "bold red", "unranked": "yellow", "error": "red"}


def render(out: CpusOutcome, house: list[int], con=None) -> None:
    """The ranking (a table on a wide terminal, a list otherwise), each CPU's causes, what
    was left out and why, the verdicts' basis (said once), the recommendation."""
    from agent import textout

    con = con or textout.console()
    if out.stopped is not None:
        textout.line(con, ("partial result", "bold yellow"),
                     f": stopped by {out.stopped.name}; CPUs scanned before the stop only")
    _table(con, out, house)
    _causes(con, out)
    _recommendation(con, out)


def _table(con, out: CpusOutcome, house: list[int]) -> None:
    """One row per CPU in the ranking's order: its verdict, loss, gaps, top cause."""
    from agent import textout
    from agent.probe.report import fmt_ns
    from collectors.parsers import format_cpulist

    choice = out.choice
    cols = [textout.Column("cpu", label="CPU"), textout.Column("verdict"),
            textout.Column("noise µs/s", right=True, label="lost µs/s"),
            textout.Column("gaps/s", right=True), textout.Column("P99 gap", right=True),
            textout.Column("P99.9 gap", right=True), textout.Column("max gap", right=True),
            textout.Column("top cause"), textout.Column("left out")]
    rows = []
    order = {c: i for i, c in enumerate(choice.ranked)}
    for r in sorted(out.results, key=lambda r: order.get(r.cpu, 1 << 30)):
        verdict = "error" if r.error else r.verdict
        style = VERDICT_STYLE.get(verdict, "")
        cells: dict = {"cpu": str(r.cpu), "verdict": textout.Text(verdict, style=style)}
        if r.error:
            cells["left out"] = r.error
        else:
            p = r.gap_percentiles()
            cells.update({"noise µs/s": f"{r.noise_us_per_s:,.1f}",
                          "gaps/s": f"{r.gaps_per_s:,.0f}", "P99 gap": fmt_ns(p["p99"]),
                          "P99.9 gap": fmt_ns(p["p999"]), "max gap": fmt_ns(r.max_gap_ns),
                          "top cause": _top(r.top_cause()),
                          "left out": choice.left_out.get(r.cpu, "")})
        rows.append(textout.Row(cells, tag=verdict, tag_style=style))
    textout.show(con, f"CPU noise (housekeeping core: CPU {format_cpulist(house)})", cols, rows,
                 head=("cpu",), tag_column="verdict")


def _causes(con, out: CpusOutcome) -> None:
    """The verdicts' basis (once each), where the attribution came from, one interrupt's
    cost, and each CPU's causes."""
    from agent import textout

    for basis, _n in textout.said_once(r.basis for r in out.results if r.basis):
        textout.line(con, f"verdicts judged {basis}", style="dim")
    trace = out.doc.get("trace") or {}
    if not trace.get("active") and trace.get("reason"):
        textout.line(con, f"kernel events: {trace['reason']}; attributed from /proc counters")
    costs = [r.irq_cost["cost_us"] for r in out.results
             if r.irq_cost and r.irq_cost.get("cost_us") is not None]
    if costs:
        textout.line(con, f"one interrupt costs a running task {min(costs):.1f}-"
                     f"{max(costs):.1f} µs here (median {sorted(costs)[len(costs) // 2]:.1f}; "
                     "hftagent watch --irq-cost US under an external client)")
    for r in out.results:
        if r.error:
            continue
        if r.events is not None:
            textout.line(con, f"  CPU {r.cpu} (kernel events): {_events_line(r.events)}")
        else:
            causes = (", ".join(f"{k} {v:g}" for k, v in r.causes.items())
                      or "nothing counted")
            textout.line(con, f"  CPU {r.cpu} (/proc counts per s): {causes}")


def _recommendation(con, out: CpusOutcome) -> None:
    """The --cpus to use and the commands; after a stop, what was not scanned instead."""
    from agent import textout
    from collectors.parsers import format_cpulist

    if out.stopped is not None:
        if out.not_scanned:
            textout.line(con, ("partial result", "bold yellow"), ": not scanned: CPU "
                         f"{format_cpulist(out.not_scanned)}; no recommendation from a "
                         "partial scan")
        return
    rec = out.doc["commands"]
    if rec:
        textout.line(con, "recommended: ", (f"--cpus {format_cpulist(out.choice.recommended)}",
                                            "bold"))
        for c in rec:
            textout.line(con, f"  {c}")
    else:
        textout.line(con, ("no CPU can be recommended", "red"),
                     ": every candidate is noisy or failed")


def _rate(us_per_s: float) -> str:
    return f"{us_per_s / 1e3:.1f} ms/s" if us_per_s >= 1000 else f"{us_per_s:.1f} µs/s"


def _top(top: tuple[str, float, str] | None) -> str:
    if top is None:
        return ""
    what, v, unit = top
    return f"{what} {_rate(v)}" if unit == "µs/s" else f"{what} {v:g}/s"


def _events_line(ev: dict, top: int = 5) -> str:
    """``python3 181.2 ms/s ×200, local timer tick 12.5 µs/s ×250, hw_or_hypervisor
    3.1 µs/s (2 gaps), 99.5 % of gap time inside events``."""
    parts = [f"{e['entity']} {_rate(e['us_per_s'])} ×{e['count']}" for e in ev["events"][:top]]
    if ev.get("hw_or_hypervisor_gaps"):
        parts.append(f"hw_or_hypervisor {_rate(ev['hw_or_hypervisor_us_per_s'])} "
                     f"({ev['hw_or_hypervisor_gaps']} gaps)")
    if ev.get("gap_time_explained_pct") is not None:
        parts.append(f"{ev['gap_time_explained_pct']:g} % of gap time inside events")
    if not ev.get("events_complete", True):
        parts.append(f"incomplete: {ev.get('events_reason')}")
    return ", ".join(parts) or "no events"


PLOT_COLOURS = {"recommended": "tab:green", "quiet": "tab:gray", "unranked": "tab:olive",
                "noisy": "tab:red"}


def _plot(results, recommended, path: str) -> None:
    """Lost time per CPU, one bar colour per verdict with a legend entry for each colour used
    (green: recommended, grey: quiet, olive: unranked, red: noisy)."""
    from matplotlib.patches import Patch

    from agent.plot import pyplot, save
    plt = pyplot("--plot")
    ok = [r for r in results if r.error is None]

    def kind(r) -> str:
        return "recommended" if r.cpu in recommended else (
            r.verdict if r.verdict in PLOT_COLOURS else "quiet")
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(ok) + 2), 3.5))
    ax.bar([str(r.cpu) for r in ok], [r.noise_us_per_s for r in ok],
           color=[PLOT_COLOURS[kind(r)] for r in ok])
    used = [k for k in PLOT_COLOURS if any(kind(r) == k for r in ok)]
    ax.legend(handles=[Patch(color=PLOT_COLOURS[k], label=k) for k in used], fontsize=8,
              loc="best")
    ax.set_xlabel("CPU")
    ax.set_ylabel("noise (µs lost per s)")
    ax.set_title("hftagent cpus")
    fig.tight_layout()
    save(fig, path)


def register(app: typer.Typer) -> None:
    register_command(app, "cpus", cpus, HELP)
