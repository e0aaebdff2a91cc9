"""`hftagent capture`: copy the /proc and /sys files the agent reads into a directory tree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent.commands.common import ProcfsOpt, RootOpt, SysfsOpt, cli_errors, fail, make_host

HELP = """Capture this host's /proc and /sys files (the ones audit reads) into DIR.

Audit it later anywhere with `hftagent audit --root DIR`: for bug reports, comparing boxes,
and golden tests. Process entries keep only comm and status (no environments, no command
lines). Read-only on the host."""


def capture(
    out: Annotated[Path, typer.Option("--out", help="Directory to create (must not exist).")],
    root: RootOpt = "/",
    procfs: ProcfsOpt = None,
    sysfs: SysfsOpt = None,
) -> None:
    from collectors.capture import capture as do_capture

    if out.exists():
        raise fail(f"--out {str(out)!r} already exists; give a new directory")
    host = make_host(root, procfs, sysfs)
    try:
        out.mkdir(parents=True)
        skipped = do_capture(host, out)
    except OSError as exc:
        raise fail(f"cannot write {str(out)!r}: {exc.strerror or exc}") from None
    files = sum(1 for p in out.rglob("*") if p.is_file())
    print(f"captured {files} files into {out} ({len(skipped)} unreadable, listed in "
          f"{out / 'CAPTURE-SKIPPED'})")


def register(app: typer.Typer) -> None:
    app.command("capture", help=HELP)(cli_errors(capture))
