"""`hftagent attach --check PID`: what `watch --attach PID` would time in that process."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from agent.commands.common import (
    AttachRuntimeOpt,
    AttachSymbolOpt,
    JsonOpt,
    cli_errors,
    fail,
)

HELP = """Show what can be attached in a running process, read-only.

For process PID: the inference runtime found in its mapped libraries (LiteRT from Python,
the LiteRT, TFLite and TF C APIs, TF2 from Python, a C++ TF server's session run), the
library, the function that runs once per inference call, its file offset, the instruction at
its entry, what a uprobe there costs per call, and why not where it cannot be attached.
`hftagent watch --attach PID` then times every call and explains each slow one. Nothing is
written and no probe is placed: read-only about the process and its libraries. Only our own dead state is removed: as root, what a
killed hftagent left in tracefs (its uprobe events and instances, never another tool's), a
line each on stderr (--json: removed_stale), as every start of watch and cpus does.

A process that maps libcuda also gets the GPU probes watch --attach would place there
(--gpu-probes LEVEL, default `default`): each driver function, its library, its expected
hits per call (counts of one JAX inference) and the expected cost per call at ~1.75 µs a
hit; nothing is printed for them when the process maps no libcuda. A process with libcuda
but no runtime of the catalogue (JAX) still gets them, before the one line that says why
nothing can be attached without --attach-symbol (exit 1).

A process that maps several runtimes (every TF2 Python process maps the TF C API it never
calls) lists them all as candidates: the choice is made by trial at attach time, where watch
arms them together and keeps the one whose calls arrive (the outermost per call).

Each library is opened once and read through that descriptor; one that is not a regular file
is refused, and so is one that a user other than root and the process's owner may write, or
one on a FUSE filesystem (unless --attach-unsafe-library)."""

UnsafeLibraryOpt = Annotated[bool, typer.Option(
    "--attach-unsafe-library", help="Read and probe a library that a user other than root "
    "and the process's owner may write (owned by another user, group- or world-writable), "
    "or one on a FUSE filesystem. Risk: that user (or the FUSE server) can change the code "
    "the uprobe lands in, in every process that maps the file, while root's probe is "
    "there; a FUSE server may also never answer a read.")]


GpuProbesCheckOpt = Annotated[str, typer.Option(
    "--gpu-probes", metavar="LEVEL", help="The GPU probes' level to show (off, default, "
    "copies, full) for a process that maps libcuda (watch --attach's --gpu-probes): each driver function, "
    "its expected hits per call and their cost.")]


def attach(
    pid: Annotated[int, typer.Argument(help="The process to look at.")],
    check: Annotated[bool, typer.Option("--check", help="Report only (the one mode: "
                                        "watch --attach does the attaching).")] = True,
    runtime: AttachRuntimeOpt = None,
    symbol: AttachSymbolOpt = None,
    as_json: JsonOpt = False,
    unsafe_library: UnsafeLibraryOpt = False,
    gpu_probes: GpuProbesCheckOpt = "default",
) -> None:
    from agent.trace import gpu_probes as gp
    from agent.trace.attach import AttachError, check_text, host_notes, plan
    from collectors.host import Host

    if pid <= 0:
        raise fail(f"PID must be a positive process id, not {pid}")
    try:
        gp.check_level(gpu_probes)
    except gp.GpuProbeError as exc:
        raise fail(str(exc)) from None
    host = Host()
    try:
        p = plan(host, pid, runtime or "auto", symbol,
                 progress=lambda msg: print(msg + " ...", file=sys.stderr, flush=True),
                 unsafe_library=unsafe_library)
    except AttachError as exc:
        _gpu_alone(host, pid, gpu_probes, unsafe_library, as_json)
        raise fail(str(exc)) from None
    p.close()   # read-only: nothing is defined on the pinned libraries
    gpu = _gpu_plan(host, pid, gpu_probes, unsafe_library)
    # a killed hftagent's leftovers, never the target's state (after the PID and the runtime
    # are known: bad input stays one line)
    from agent.trace.guardian import clean_stale
    stale = clean_stale(host)
    for note in stale:
        print(f"attach: {note}", file=sys.stderr, flush=True)
    from agent.watch.attribution.pmu import check_line
    pmu_line = check_line(pid)   # watch --attach --pmu: its counters open here, or why not
    if as_json:
        print(json.dumps({**p.to_dict(), "kernel": host_notes(host), "removed_stale": stale,
                          "gpu_probes": gpu.to_dict() if gpu else None, "pmu": pmu_line},
                         indent=2))
    else:
        print("\n".join(check_text(p, host) + gp.check_lines(gpu) + [f"pmu: {pmu_line}"]))


def _gpu_plan(host, pid: int, level: str, unsafe_library: bool):
    """The GPU probes watch --attach would place (None: no libcuda, or level off); their
    pinned libcuda closed again (read-only)."""
    from agent.trace import gpu_probes as gp
    from agent.trace.attach import AttachError
    try:
        gpu = gp.plan(host, pid, level, unsafe_library)
    except AttachError as exc:
        raise fail(str(exc)) from None
    if gpu is not None:
        gpu.close()
    return gpu


def _gpu_alone(host, pid: int, level: str, unsafe_library: bool, as_json: bool) -> None:
    """No function to time was found (a JAX process maps no runtime of the catalogue): the
    GPU probes watch --attach --attach-symbol would add are still shown on stdout, before
    the one line on stderr that says why nothing can be attached."""
    from agent.trace import gpu_probes as gp
    from agent.trace.attach import AttachError
    try:
        gpu = gp.plan(host, pid, level, unsafe_library)
    except AttachError:
        return
    if gpu is None:
        return
    gpu.close()
    if as_json:
        print(json.dumps({"pid": pid, "targets": [], "gpu_probes": gpu.to_dict()}, indent=2))
    else:
        print("\n".join([f"pid {pid}: no function to time (stderr says why; --attach-symbol "
                         "LIB:SYMBOL names one); with it, watch --attach would add:",
                         *gp.check_lines(gpu)]))


def register(app: typer.Typer) -> None:
    app.command("attach", help=HELP)(cli_errors(attach))
