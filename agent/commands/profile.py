"""`hftagent profile --nsight -- CMD`: run CMD under Nsight Compute and report its kernels."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from agent.commands.common import JsonOpt, cli_errors, fail

HELP = """Profile CMD's GPU kernels with Nsight Compute (ncu) and report kernel count, kernel time
per inference vs wall time (launch-bound or compute-bound) and the top kernels.

Give the number of inferences CMD runs (--inferences) and the uninstrumented wall time of one
inference (--wall-us, e.g. the probe's P50): ncu serialises kernels, so wall time under ncu is
meaningless. ncu runs with --clock-control none (GPU clocks are never touched).

Example: hftagent profile --nsight --inferences 200 --wall-us 296 -- python3 infer.py"""


def profile(
    ctx: typer.Context,
    nsight: Annotated[bool, typer.Option("--nsight", help="Profile with Nsight Compute (ncu).")] = False,
    inferences: Annotated[int | None, typer.Option("--inferences", min=1,
                          help="Inferences CMD runs (kernels are divided by this).")] = None,
    wall_us: Annotated[float | None, typer.Option("--wall-us", min=0.0,
                       help="Uninstrumented wall time of one inference, µs.")] = None,
    launch_skip: Annotated[int, typer.Option("--launch-skip", min=0,
                           help="Kernels to skip first (warm-up).")] = 0,
    launch_count: Annotated[int | None, typer.Option("--launch-count", min=1,
                            help="Kernels to profile at most.")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Top kernels to list.")] = 10,
    ncu: Annotated[str, typer.Option("--ncu", help="ncu executable.")] = "ncu",
    keep_csv: Annotated[str | None, typer.Option("--keep-csv", help="Keep ncu's CSV here.")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds before giving up.")] = 600,
    json_out: JsonOpt = False,
) -> None:
    from collectors.nsight import NsightError
    from collectors.nsight import profile as run_profile

    cmd = list(ctx.args)
    if not nsight:
        raise fail("only --nsight profiling exists: hftagent profile --nsight -- CMD ...")
    if not cmd:
        raise fail("no command: hftagent profile --nsight -- CMD ...")
    try:
        rep = run_profile(cmd, inferences=inferences,
                          wall_ns_per_inference=None if wall_us is None else wall_us * 1e3,
                          ncu=ncu, launch_skip=launch_skip, launch_count=launch_count, top=top,
                          timeout_s=timeout_s, keep_csv=keep_csv)
    except NsightError as exc:
        raise fail(str(exc)) from None
    print(json.dumps(rep.to_dict(), indent=2) if json_out else rep.render())
    if rep.returncode:
        print(f"hftagent: note: the profiled command exited {rep.returncode}",
              file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("profile", help=HELP, context_settings={
        "allow_extra_args": True, "ignore_unknown_options": True})(cli_errors(profile))
