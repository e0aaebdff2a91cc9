"""`hftagent capture`: copy the /proc and /sys files the agent reads into a directory tree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent.commands.common import (
    ProcfsOpt,
    RootOpt,
    SysfsOpt,
    fail,
    make_host,
    register_command,
)

HELP = """Capture this host's /proc and /sys files (the ones audit reads) into DIR.

Audit it later anywhere with `hftagent audit --root DIR`: for bug reports, comparing boxes,
and golden tests. The capture keeps sysfs's layout, links included (cpuN/cpufreq, PCI devices
behind bridges), and never follows a link out of the tree. Process entries keep only comm and
status (no environments, no command lines). Read-only on the host."""


def capture(
    out: Annotated[Path, typer.Option("--out", metavar="DIR",
                                      help="Directory to create (must not exist; its parent must, "
                                      "owned by root or you and not writable by others).")],
    root: RootOpt = "/",
    procfs: ProcfsOpt = None,
    sysfs: SysfsOpt = None,
) -> None:
    import os

    from agent.outfile import OutputError, create_dir, show
    from collectors.capture import capture_result

    if not str(out).strip():
        raise fail("--out is empty: give a new directory")
    host = make_host(root, procfs, sysfs)
    # Created exclusively below its checked parent (which must exist: never mkdir -p), and
    # written only through its descriptor, with O_NOFOLLOW below it (agent/outfile.py,
    # collectors/capture.py): nothing another user owns or plants on the way is used.
    dfd = create_dir(out, "--out")
    try:
        res = capture_result(host, out, dir_fd=dfd)
        if host.live:
            _cpu_identity(dfd)
    except OSError as exc:
        raise fail(f"--out {show(out)}: cannot write in it: {exc.strerror or exc}") from None
    except OutputError as exc:
        raise fail(str(exc)) from None
    finally:
        os.close(dfd)
    print(f"captured {res.files} files into {out} ({len(res.skipped)} skipped, listed in "
          f"{out / 'CAPTURE-SKIPPED'})")


def _cpu_identity(dfd: int) -> None:
    """DIR/CPU-IDENTITY.json: the CPU as py-cpuinfo names it (brand, family/model/stepping,
    cache sizes, advertised clock, flags), which /proc/cpuinfo alone does not give on every
    architecture; for telling captured boxes apart. Live host only (CPUID, not the tree);
    best effort: a box where py-cpuinfo fails still gets its capture."""
    import json
    try:
        import cpuinfo
        info = cpuinfo.get_cpu_info()
    except Exception as exc:  # noqa: BLE001 - third-party probing of odd CPUs
        info = {"error": f"py-cpuinfo: {type(exc).__name__}: {exc}"}
    keep = ("brand_raw", "vendor_id_raw", "arch", "bits", "count", "family", "model",
            "stepping", "hz_advertised_friendly", "l1_data_cache_size", "l2_cache_size",
            "l3_cache_size", "flags", "cpuinfo_version_string", "error")
    doc = {k: info[k] for k in keep if k in info}
    from collectors.capture import write_new
    write_new(dfd, "CPU-IDENTITY.json", (json.dumps(doc, indent=2) + "\n").encode())


def register(app: typer.Typer) -> None:
    register_command(app, "capture", capture, HELP)
