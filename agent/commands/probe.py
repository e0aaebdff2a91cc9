"""`hftagent probe`: warmed, fixed-shape TF inference probe with honest tail statistics (and a
TF-free numpy stand-in model, ``--model numpy``, for hosts without TensorFlow)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from agent.commands.common import DbOpt, JsonOpt, NoHistoryOpt, cli_errors, fail
from agent.defaults import JITTER_THRESHOLD_US

HELP = """Probe a TensorFlow model's inference latency: P50/P99/P99.9, cold start, tail jitter.

Without --model the built-in LSTM order-flow model ([1,64,32] → LSTM(128) → Dense(3)) is built
on first use and cached. Each thread configuration runs in its own worker process. Default
variants: graph, xla, tflite (--variant all adds eager, tflite-int8, tf-trt).

--model numpy (or --builtin numpy) is no TensorFlow model: an LSTM-shaped numpy recurrence
([1,64,32] → 128, single-threaded BLAS) whose one variant is numpy, for host acceptance where
TensorFlow is absent (nothing imports TF). Same statistics, pinning, open/closed loop and
history record; its figures describe the host, not TensorFlow.

Every option is checked before the first worker starts (ranges, files, CPUs, the history
database). Exit status: 0 at least one variant ran; 1 bad input or nothing ran."""


def probe(
    model: Annotated[str | None, typer.Option("--model", help="SavedModel dir, .keras or "
                                              ".tflite file, or numpy: the TF-free numpy "
                                              "stand-in (default: built-in LSTM).")] = None,
    builtin: Annotated[str | None, typer.Option("--builtin", help="Built-in model: lstm "
                                                "(default) | mlp | conv1d | numpy (no TF); "
                                                "not with --model.")
                       ] = None,
    signature: Annotated[str | None, typer.Option("--signature", help="SavedModel signature "
                                                  "(default serving_default; a SavedModel "
                                                  "--model only).")] = None,
    shape: Annotated[str | None, typer.Option("--shape", help="Fixed input shape, e.g. "
                                              "1,64,32 (required for dynamic dims).")] = None,
    input_data: Annotated[str, typer.Option("--input-data", help="random | zeros | FILE.npy")
                          ] = "random",
    variant: Annotated[str | None, typer.Option("--variant", help="Comma list of eager, graph, "
                                                "xla, tflite, tflite-int8, tf-trt, or all; "
                                                "numpy for --model numpy (its only one).")
                       ] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Timed samples per run, "
                                                "1..5000000 (default 6636: enough for "
                                                "P99.9).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Time budget per run in "
                                                   "seconds, up to 86400 (default 6).")
                        ] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Minimum warm-up calls "
                                        "(1..1000000).")] = 200,
    rate: Annotated[float | None, typer.Option("--rate", help="Open loop at this many calls/s, "
                                               "up to 1000000 (response time from the "
                                               "intended start).")] = None,
    threshold_us: Annotated[float, typer.Option("--threshold-us", help="Tail-jitter threshold "
                                                "in µs (up to 1e9).")] = JITTER_THRESHOLD_US,
    calib: Annotated[str | None, typer.Option("--calib", help="Representative samples "
                                              "[N,...] .npy for tflite-int8.")] = None,
    intra: Annotated[int | None, typer.Option("--intra", help="TF intra-op threads (and "
                                              "LiteRT threads), 1..4096; omit for TF's "
                                              "default.")] = None,
    inter: Annotated[int | None, typer.Option("--inter", help="TF inter-op threads, 1..4096, "
                                              "or -1: run ops in the caller thread; omit for "
                                              "TF's default.")] = None,
    cpus: Annotated[str | None, typer.Option("--cpus", help="Pin the worker to these CPUs "
                                             "(e.g. 1 or 0-3). Default: the target CPUs "
                                             "(isolated, else nohz_full, else all online "
                                             "but the housekeeping core).")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="threads: measure a grid of "
                                              "intra/inter/affinity (not with --intra/"
                                              "--inter).")] = None,
    batch: Annotated[str, typer.Option("--batch", help="Batch sizes, e.g. 1,8,32.")] = "1",
    idle_gaps: Annotated[str | None, typer.Option("--idle-gaps", help="Response time against "
                                                  "the idle gap before each call, e.g. "
                                                  "0,1ms,10ms,100ms,1s (interleaved rounds; "
                                                  "--samples rounds, default 200, within "
                                                  "--duration, default 60 s).")] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="With --idle-gaps: write the "
                                             "curve as a PNG here.")] = None,
    json_out: JsonOpt = False,
    csv_path: Annotated[str | None, typer.Option("--csv", help="Write one row per sample to "
                                                 "this file.")] = None,
    db: DbOpt = None,
    no_history: NoHistoryOpt = False,
) -> None:
    import os

    from agent.commands.common import check_history_db, check_output_file
    from agent.probe import options
    from agent.probe.progress import progress_hook
    from agent.probe.runner import run_probe

    if db is not None and no_history:
        raise fail("--db and --no-history contradict each other: give one")

    settings, configs = options.build(
        model=model, builtin=builtin, signature=signature, shape=shape, input_data=input_data,
        variant=variant, samples=samples, duration=duration, warmup=warmup, rate=rate,
        threshold_us=threshold_us, calib=calib, intra=intra, inter=inter, cpus=cpus,
        sweep=sweep, batch=batch, idle_gaps=idle_gaps)
    if plot is not None:
        if idle_gaps is None:
            raise fail("--plot draws the --idle-gaps curve: give --idle-gaps")
        check_output_file(plot, "--plot")
        from agent.plot import available
        available("--plot")  # before the run, used after it
    # Checked now: a --db that cannot be used must not cost a finished probe (the recording
    # after the run only warns). The default database only warns, as before.
    no_history = not check_history_db(db, no_history)
    csv_file = None
    if csv_path is not None:
        # opened before the run (a bad path must not cost a finished probe): a temporary file
        # beside it, renamed over it once written whole (agent/outfile.py)
        from agent.outfile import open_output
        csv_file = open_output(csv_path, "--csv")
    try:
        with progress_hook(enabled=sys.stderr.isatty()) as hook:
            result, arrays = run_probe(settings, configs, on_event=hook)
        if csv_file is not None:
            from agent.probe.report import write_csv
            with csv_file:
                write_csv(csv_file, result, arrays)
    finally:
        if csv_file is not None:
            csv_file.discard()  # not written (the probe failed, Ctrl-C): nothing left behind
    if plot is not None:
        from agent.probe.idle import plot as draw
        for r in result.runs:
            if r.ok and r.idle_gaps:
                name = plot if len(result.runs) == 1 else \
                    f"{os.path.splitext(plot)[0]}-{r.variant}{os.path.splitext(plot)[1] or '.png'}"
                draw(r.idle_gaps, name, f"{result.model.get('name')} {r.variant}: latency "
                     "after an idle gap")
    if json_out:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from agent.probe.report import render
        render(result)
    if not no_history and result.any_ran:
        from agent.gate.history import record_probe

        record_probe(result, arrays, command="probe", db=db, warn=True)
    if not result.any_ran:
        for r in result.runs:
            print(f"hftagent: {r.variant}: {r.status}: {r.reason}", file=sys.stderr)
        raise fail("no variant ran")


def register(app: typer.Typer) -> None:
    app.command("probe", help=HELP)(cli_errors(probe))
