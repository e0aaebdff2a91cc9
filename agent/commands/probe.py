"""`hftagent probe`: warmed, fixed-shape TF inference probe with honest tail statistics (and a
TF-free numpy stand-in model, ``--model numpy``, for hosts without TensorFlow).

Thin: the options become a :class:`ProbeRequest` (every value checked once, before the first
worker starts: agent/probe/options.py, the CPUs by tuning/targets.py), :func:`execute` runs it,
:func:`show` renders it."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Annotated

import typer

from agent.commands.common import (
    BuiltinOpt,
    CpusOpt,
    DbOpt,
    InterOpt,
    IntraOpt,
    JsonOpt,
    ModelOpt,
    NoHistoryOpt,
    Stopped,
    fail,
    register_command,
    stop_on_signals,
)
from agent.defaults import JITTER_THRESHOLD_US

HELP = """Probe a TensorFlow model's inference latency: P50/P99/P99.9, cold start, tail jitter.

Without --model the built-in LSTM order-flow model ([1,64,32] → LSTM(128) → Dense(3)) is built
on first use and cached. Each thread configuration runs in its own worker process. Default
variants: graph, xla, tflite (--variant all adds eager, tflite-int8, tf-trt).

--model numpy (or --builtin numpy) is no TensorFlow model: an LSTM-shaped numpy recurrence
([1,64,32] → 128, single-threaded BLAS) whose one variant is numpy, for host acceptance where
TensorFlow is absent (nothing imports TF). Same statistics, pinning, open/closed loop and
history record; its figures describe the host, not TensorFlow.

A run ends at --samples or at its time budget (--duration, 6 s unless given), whichever comes
first; the report says which. With --rate the loop is open: a run whose offered load is more
than the model serves is marked saturated and never recommended. Progress goes to stderr from
the first second (one line per phase when stderr is not a terminal). Ctrl-C (or SIGTERM)
stops the worker at once and prints the runs that finished, marked partial (with --json
nothing: a document is whole or not at all), exit 130 or 143.

Every option is checked before the first worker starts (ranges, files, CPUs, the history
database). Exit status: 0 at least one variant ran; 1 bad input or nothing ran."""

SignatureOpt = Annotated[str | None, typer.Option(
    "--signature", metavar="NAME", help="SavedModel signature (default serving_default; a "
    "SavedModel --model only).")]
ShapeOpt = Annotated[str | None, typer.Option(
    "--shape", metavar="DIMS", help="Fixed input shape, e.g. 1,64,32 (required for dynamic "
    "dims).")]
InputOpt = Annotated[str, typer.Option("--input-data", metavar="SOURCE",
                                       help="The probe's input: random | zeros | FILE.npy.")]
VariantOpt = Annotated[str | None, typer.Option(
    "--variant", metavar="LIST", help="Comma list of eager, graph, xla, tflite, tflite-int8, "
    "tf-trt, or all; numpy for --model numpy (its only one).")]
SamplesOpt = Annotated[int | None, typer.Option(
    "--samples", metavar="N", help="Timed samples per run, 1..5000000 (default 6636: enough "
    "for P99.9). The run ends at N or at the time budget, whichever comes first.")]
DurationOpt = Annotated[float | None, typer.Option(
    "--duration", metavar="SECONDS", help="Time budget per run, up to 86400 (default 6; 60 "
    "with --idle-gaps). Alone, the run lasts this long.")]
WarmupOpt = Annotated[int, typer.Option("--warmup", metavar="N",
                                        help="Minimum warm-up calls (1..1000000).")]
RateOpt = Annotated[float | None, typer.Option(
    "--rate", metavar="CALLS/S", help="Open loop at this many calls/s, up to 1000000 "
    "(response time from the intended start; saturation detected).")]
ThresholdOpt = Annotated[float, typer.Option("--threshold-us", metavar="US",
                                             help="Tail-jitter threshold in µs (up to 1e9).")]
CalibOpt = Annotated[str | None, typer.Option(
    "--calib", metavar="FILE.npy", help="Representative samples [N,...] for tflite-int8.")]
SweepOpt = Annotated[str | None, typer.Option(
    "--sweep", metavar="threads", help="threads: measure a grid of intra/inter/affinity (not "
    "with --intra/--inter).")]
BatchOpt = Annotated[str, typer.Option("--batch", metavar="LIST",
                                       help="Batch sizes, e.g. 1,8,32.")]
IdleGapsOpt = Annotated[str | None, typer.Option(
    "--idle-gaps", metavar="LIST", help="Response time against the idle gap before each call, "
    "e.g. 0,1ms,10ms,100ms,1s (interleaved rounds; --samples rounds, default 200, within "
    "--duration, default 60 s).")]
PlotOpt = Annotated[str | None, typer.Option("--plot", metavar="FILE",
                                             help="With --idle-gaps: write the curve as a PNG "
                                             "here.")]
CsvOpt = Annotated[str | None, typer.Option("--csv", metavar="FILE",
                                            help="Write one row per sample to this file.")]


@dataclass
class ProbeRequest:
    """Everything ``probe`` does, checked: the settings and thread configurations
    (agent/probe/options.py), the output files and whether to record the run."""

    settings: object
    configs: list
    plot: str | None
    csv: object | None  # agent.outfile's open output, renamed into place once written
    db: str | None
    record: bool
    json: bool


def parse(*, model, builtin, signature, shape, input_data, variant, samples, duration, warmup,
          rate, threshold_us, calib, intra, inter, cpus, sweep, batch, idle_gaps, plot,
          json_out, csv_path, db, no_history) -> ProbeRequest:
    """The options, each checked once (one line and exit 1 for a bad one)."""
    from agent.commands.common import check_history_db, check_output_file
    from agent.probe import options

    if db is not None and no_history:
        raise fail("--db and --no-history contradict each other: give one")
    settings, configs = options.build(
        model=model, builtin=builtin, signature=signature, shape=shape, input_data=input_data,
        variant=variant, samples=samples, duration=duration, warmup=warmup, rate=rate,
        threshold_us=threshold_us, calib=calib, intra=intra, inter=inter, cpus=cpus,
        sweep=sweep, batch=batch, idle_gaps=idle_gaps, keep_budget=True)
    if plot is not None:
        if idle_gaps is None:
            raise fail("--plot draws the --idle-gaps curve: give --idle-gaps")
        check_output_file(plot, "--plot")
        from agent.plot import available
        available("--plot")  # before the run, used after it
    # a --db that cannot be used must not cost a finished probe (#28 item 4)
    record = check_history_db(db, no_history)
    csv_file = None
    if csv_path is not None:
        # opened before the run (a bad path must not cost a finished probe): a temporary file
        # beside it, renamed over it once written whole (agent/outfile.py)
        from agent.outfile import open_output
        csv_file = open_output(csv_path, "--csv")
    return ProbeRequest(settings, configs, plot, csv_file, db, record, json_out)


@dataclass
class ProbeOutcome:
    result: object
    arrays: list
    stopped: Stopped | None = None  # a stop part-way: the result holds what finished


def execute(req: ProbeRequest) -> ProbeOutcome:
    """Run the probe with progress on stderr; a stop (Ctrl-C, SIGTERM) kills the worker at
    once and keeps what finished. Writes --csv and --plot, records a complete run."""
    from agent.probe.progress import progress_hook
    from agent.probe.runner import ProbeInterrupted, run_probe

    out = None
    try:
        with stop_on_signals(), progress_hook() as hook:
            try:
                result, arrays = run_probe(req.settings, req.configs, on_event=hook)
                out = ProbeOutcome(result, arrays)
            except ProbeInterrupted as stop:
                cause = stop.cause if isinstance(stop.cause, Stopped) else Stopped(2)
                out = ProbeOutcome(stop.result, stop.arrays, cause)
        if req.csv is not None and out.stopped is None:
            from agent.probe.report import write_csv
            with req.csv:
                write_csv(req.csv, out.result, out.arrays)
    finally:
        if req.csv is not None:
            req.csv.discard()  # not written (failed, stopped): nothing left behind
    if req.plot is not None and out.stopped is None:
        _plot(out.result, req.plot)
    if req.record and out.stopped is None and out.result.any_ran:
        from agent.history import record_probe
        record_probe(out.result, out.arrays, command="probe", db=req.db, warn=True)
    return out


def _plot(result, path: str) -> None:
    from agent.probe.idle import plot as draw
    ok = [r for r in result.runs if r.ok and r.idle_gaps]
    for r in ok:
        base, ext = os.path.splitext(path)
        name = path if len(result.runs) == 1 else f"{base}-{r.variant}{ext or '.png'}"
        draw(r.idle_gaps, name, f"{result.model.get('name')} {r.variant}: latency after an "
             "idle gap")


def show(req: ProbeRequest, out: ProbeOutcome) -> None:
    """Print the result (JSON or the report) and end with the command's exit status."""
    partial = None
    if out.stopped is not None:
        partial = (f"stopped by {out.stopped.name}; the worker was killed, nothing written or "
                   "recorded")
    if req.json:
        if out.stopped is None:  # a document is whole or not at all: the line on stderr
            print(json.dumps(out.result.to_dict(), indent=2))
    else:
        from agent.probe.report import render
        render(out.result, partial=partial)
    if out.stopped is not None:
        print(f"hftagent: probe {partial}", file=sys.stderr)
        raise typer.Exit(out.stopped.exit_code)
    if not out.result.any_ran:
        for r in out.result.runs:
            print(f"hftagent: {r.variant}: {r.status}: {r.reason}", file=sys.stderr)
        raise fail("no variant ran")


def probe(model: ModelOpt = None, builtin: BuiltinOpt = None, signature: SignatureOpt = None,
          shape: ShapeOpt = None, input_data: InputOpt = "random", variant: VariantOpt = None,
          samples: SamplesOpt = None, duration: DurationOpt = None, warmup: WarmupOpt = 200,
          rate: RateOpt = None, threshold_us: ThresholdOpt = JITTER_THRESHOLD_US,
          calib: CalibOpt = None, intra: IntraOpt = None, inter: InterOpt = None,
          cpus: CpusOpt = None, sweep: SweepOpt = None, batch: BatchOpt = "1",
          idle_gaps: IdleGapsOpt = None, plot: PlotOpt = None, json_out: JsonOpt = False,
          csv_path: CsvOpt = None, db: DbOpt = None, no_history: NoHistoryOpt = False) -> None:
    req = parse(**locals())
    show(req, execute(req))


def register(app: typer.Typer) -> None:
    register_command(app, "probe", probe, HELP)
