"""Options and error handling shared by every command (defined once)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from agent.errors import AgentError
from collectors.host import Host, HostError

F = TypeVar("F", bound=Callable)

RootOpt = Annotated[str, typer.Option("--root", help="Read the host under this directory "
                                      "(a captured tree) instead of /.")]
ProcfsOpt = Annotated[str | None, typer.Option("--procfs", help="procfs mount point "
                                               "(default ROOT/proc).")]
SysfsOpt = Annotated[str | None, typer.Option("--sysfs", help="sysfs mount point "
                                              "(default ROOT/sys).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
ProfileOpt = Annotated[str, typer.Option("--profile", help="hft-cpu | hft-gpu | bench | path to "
                                         "a profile .toml")]
DbOpt = Annotated[str | None, typer.Option("--db", help="History database (default "
                                           "$HFTAGENT_DB, else the user's state dir: "
                                           "~/.local/state/hftagent/history.sqlite). Its "
                                           "directory must exist; checked before any work; "
                                           "never a symlink or another application's "
                                           "database.")]
NoHistoryOpt = Annotated[bool, typer.Option("--no-history", help="Do not record this run in "
                                            "the history database.")]


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one line on stderr and return the Exit to raise."""
    print(f"hftagent: error: {message}", file=sys.stderr)
    return typer.Exit(code)


def _domain_errors() -> tuple[type[Exception], ...]:
    """The error classes whose message is for the user. Imported only when an error is being
    handled: importing tuning.journal and the tunables up front costs every command ~30 ms."""
    from tuning.journal import JournalError
    from tuning.launcher import LaunchError
    from tuning.profiles import ProfileError
    from tuning.tunables.base import TuneError
    return (AgentError, HostError, ProfileError, TuneError, JournalError, LaunchError)


def cli_errors(fn: F) -> F:
    """Turn domain errors into one stderr line and exit 1 (the CLI layer's only job here)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise  # the command's own exit status (audit's 2): not an error to classify
        except PermissionError as exc:
            raise fail(f"permission denied: {exc.filename or exc} (retry as root)") from None
        except Exception as exc:
            if isinstance(exc, _domain_errors()):
                raise fail(str(exc)) from None
            raise
    return wrapper  # type: ignore[return-value]


def check_output_file(path: str, opt: str = "--out") -> None:
    """An output file option, checked before any work so that a typo does not cost a scan or
    a probe run: agent/outfile.py's rules (no symlink followed, an existing file only when it
    is a regular file we own, the directory must exist). Raises its one-line OutputError."""
    from agent.outfile import check_output
    check_output(path, opt)


def check_history_db(db: str | None, no_history: bool) -> bool:
    """The history database, checked before the command's work (issue #28 item 4): whether
    the run is to be recorded. ``--db`` that cannot be used (not ours, not writable, its
    directory missing: never created) is an error, one line, exit 1; the default database
    ($HFTAGENT_DB, else the state directory) only warns, once, and the run is not recorded."""
    if no_history:
        if db is not None:
            raise fail("--db and --no-history contradict each other: give one")
        return False
    from agent.gate.history import HistoryError, check_writable
    try:
        check_writable(db)
    except HistoryError as exc:
        if db is not None:
            raise fail(str(exc)) from None
        print(f"hftagent: warning: run will not be recorded in history: {exc}",
              file=sys.stderr)
        return False
    return True


def check_output_dir(path: str, opt: str) -> None:
    """An output directory option (node_exporter's textfile directory): exists, is a
    directory, and we may write there."""
    import os
    if not path.strip():
        raise fail(f"{opt} is empty: give a directory")
    if not os.path.isdir(path):
        raise fail(f"{opt}: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise fail(f"{opt}: cannot write in {path}: permission denied")


def make_host(root: str = "/", procfs: str | None = None, sysfs: str | None = None) -> Host:
    """The Host of --root/--procfs/--sysfs; an empty value is refused (it would silently mean
    the current directory)."""
    for opt, v in (("--root", root), ("--procfs", procfs), ("--sysfs", sysfs)):
        if v is not None and not v.strip():
            raise fail(f"{opt} is empty: give a directory")
    return Host(root, procfs, sysfs)


# --attach's options, shared by `watch --attach PID` and `attach --check PID`
# (agent.trace.attach: the runtimes' catalogue, NAMES; the LIB:SYMBOL form).
AttachRuntimeOpt = Annotated[str | None, typer.Option(
    "--attach-runtime", metavar="auto|litert|litert-c|tflite-c|tf-c|tf-python",
    help="The runtime whose once-per-call function is timed: auto (the first the process "
    "maps), litert (LiteRT from Python), litert-c, tflite-c, tf-c (TF_SessionRun) or "
    "tf-python (TFE_Py_ExecuteCancelable).")]
AttachSymbolOpt = Annotated[str | None, typer.Option(
    "--attach-symbol", metavar="LIB:SYMBOL", help="Time another function: SYMBOL in the "
    "mapped library whose name is or starts with LIB (entry-only timing unless "
    "--unsafe-return).")]
