"""`hftagent profile --nsight -- CMD`: run CMD under Nsight Compute and report its kernels."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Annotated

import typer

from agent.commands.common import JsonOpt, fail, register_command

HELP = """Profile CMD's GPU kernels with Nsight Compute (ncu) and report kernel count, kernel time
per inference vs wall time (launch-bound or compute-bound) and the top kernels.

Give the number of inferences CMD runs (--inferences) and the uninstrumented wall time of one
inference (--wall-us, e.g. the probe's P50): ncu serialises kernels, so wall time under ncu is
meaningless. ncu runs with --clock-control none (GPU clocks are never touched).

Every option is checked before ncu starts: --ncu must be an executable, --keep-csv a new file
or a regular file of ours in an existing directory (never a symlink: ncu writes its log in a
private directory, copied there at the end), --timeout at most a day.

Example:

  hftagent profile --nsight --inferences 200 --wall-us 296 -- python3 infer.py"""

MAX_TIMEOUT_S = 86_400.0   # a day
MAX_WALL_US = 1e9          # 1000 s per inference
MAX_TOP = 10_000


def profile(
    ctx: typer.Context,
    nsight: Annotated[bool, typer.Option("--nsight",
                                         help="Profile with Nsight Compute (ncu).")] = False,
    inferences: Annotated[int | None, typer.Option("--inferences", min=1,
                          help="Inferences CMD runs (kernels are divided by this).")] = None,
    wall_us: Annotated[float | None, typer.Option("--wall-us",
                       help="Uninstrumented wall time of one inference, µs (> 0).")] = None,
    launch_skip: Annotated[int, typer.Option("--launch-skip", min=0,
                           help="Kernels to skip first (warm-up).")] = 0,
    launch_count: Annotated[int | None, typer.Option("--launch-count", min=1,
                            help="Kernels to profile at most.")] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=MAX_TOP,
                                     help="Top kernels to list.")] = 10,
    ncu: Annotated[str, typer.Option("--ncu", help="ncu executable.")] = "ncu",
    keep_csv: Annotated[str | None, typer.Option("--keep-csv", help="Keep ncu's CSV here.")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds before giving up "
                                             "(at most 86400).")] = 600,
    json_out: JsonOpt = False,
) -> None:
    from collectors.nsight import NsightError
    from collectors.nsight import profile as run_profile

    cmd = list(ctx.args)
    _check(nsight, cmd, timeout_s, wall_us, keep_csv, ncu)
    # ncu runs CMD for as long as it takes: say so now, not only at the end
    print(f"hftagent profile: running {cmd[0]} under {ncu} (kernels serialised; this takes "
          "longer than the command alone)", file=sys.stderr, flush=True)
    kw = dict(inferences=inferences,
              wall_ns_per_inference=None if wall_us is None else wall_us * 1e3, ncu=ncu,
              launch_skip=launch_skip, launch_count=launch_count, top=top, timeout_s=timeout_s)
    try:
        rep = (run_profile(cmd, **kw) if keep_csv is None
               else _profile_keeping_csv(cmd, keep_csv, **kw))
    except NsightError as exc:
        raise fail(str(exc)) from None
    print(json.dumps(rep.to_dict(), indent=2) if json_out else rep.render())
    if rep.returncode:
        print(f"hftagent: note: the profiled command exited {rep.returncode}",
              file=sys.stderr)


def _check(nsight: bool, cmd: list[str], timeout_s: float, wall_us: float | None,
           keep_csv: str | None, ncu: str) -> None:
    """Every option checked before ncu starts (one line, exit 1)."""
    if not nsight:
        raise fail("only --nsight profiling exists: hftagent profile --nsight -- CMD ...")
    if not cmd:
        raise fail("no command: hftagent profile --nsight -- CMD ...")
    # "not 0 < x <= max" also refuses NaN; the maximum refuses inf
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise fail(f"--timeout must be a number of seconds > 0 and at most {MAX_TIMEOUT_S:.0f}, "
                   f"not {timeout_s:g}")
    if wall_us is not None and not 0 < wall_us <= MAX_WALL_US:
        raise fail(f"--wall-us must be a number of µs > 0 and at most {MAX_WALL_US:.0f}, not "
                   f"{wall_us:g}")
    if keep_csv is not None:  # ncu writes its log there (a FIFO would block ncu)
        from agent.commands.common import check_output_file
        check_output_file(keep_csv, "--keep-csv")
    if not ncu.strip() or shutil.which(ncu) is None:
        raise fail(f"--ncu {ncu!r}: not found or not executable: install Nsight Compute (ncu) "
                   "or pass --ncu PATH")


def _profile_keeping_csv(cmd: list[str], keep_csv: str, **kw):
    """collectors.nsight.profile with ncu's log kept at ``keep_csv``. ncu writes it in a
    private temporary directory (ncu opens its log by path and would follow a link planted
    at ``keep_csv``); it is then copied there through agent/outfile.py, also when ncu found no
    kernels (the log says why)."""
    import os
    import tempfile

    from agent.outfile import open_output
    from collectors.nsight import profile as run_profile
    with tempfile.TemporaryDirectory(prefix="hftagent-ncu-keep-") as tmp:
        log = os.path.join(tmp, "ncu.csv")
        try:
            return run_profile(cmd, keep_csv=log, **kw)
        finally:
            if os.path.exists(log):
                with open(log, "rb") as src, open_output(keep_csv, "--keep-csv",
                                                         binary=True) as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)


def register(app: typer.Typer) -> None:
    register_command(app, "profile", profile, HELP, allow_extra_args=True,
                     ignore_unknown_options=True)
