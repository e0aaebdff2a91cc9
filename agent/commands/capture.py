"""`hftagent capture`: copy the /proc and /sys files the agent reads into a directory tree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent.commands.common import ProcfsOpt, RootOpt, SysfsOpt, cli_errors, fail, make_host

HELP = """Capture this host's /proc and /sys files (the ones audit reads) into DIR.

Audit it later anywhere with `hftagent audit --root DIR`: for bug reports, comparing boxes,
and golden tests. The capture keeps sysfs's layout, links included (cpuN/cpufreq, PCI devices
behind bridges), and never follows a link out of the tree. Process entries keep only comm and
status (no environments, no command lines). Read-only on the host."""


def capture(
    out: Annotated[Path, typer.Option("--out", help="Directory to create (must not exist).")],
    root: RootOpt = "/",
    procfs: ProcfsOpt = None,
    sysfs: SysfsOpt = None,
) -> None:
    from collectors.capture import capture_result

    if out.exists() or out.is_symlink():
        raise fail(f"--out {str(out)!r} already exists; give a new directory")
    host = make_host(root, procfs, sysfs)
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise fail(f"--out {str(out)!r}: cannot create it: {exc.strerror or exc}") from None
    try:
        res = capture_result(host, out)
    except OSError as exc:
        raise fail(f"--out {str(out)!r}: cannot write in it: {exc.strerror or exc}") from None
    print(f"captured {res.files} files into {out} ({len(res.skipped)} skipped, listed in "
          f"{out / 'CAPTURE-SKIPPED'})")


def register(app: typer.Typer) -> None:
    app.command("capture", help=HELP)(cli_errors(capture))
