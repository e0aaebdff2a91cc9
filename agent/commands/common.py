"""Options and error handling shared by every command (defined once), and the help text's
shape: paragraphs the renderer wraps, flags shown as flags."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TypeVar

import typer

from agent.errors import AgentError
from collectors.host import Host, HostError

F = TypeVar("F", bound=Callable)

RootOpt = Annotated[str, typer.Option("--root", metavar="DIR", help="Read the host under this "
                                      "directory (a captured tree) instead of /.")]
ProcfsOpt = Annotated[str | None, typer.Option("--procfs", metavar="DIR", help="procfs mount "
                                               "point (default ROOT/proc).")]
SysfsOpt = Annotated[str | None, typer.Option("--sysfs", metavar="DIR", help="sysfs mount "
                                              "point (default ROOT/sys).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
ProfileOpt = Annotated[str, typer.Option("--profile", metavar="NAME|FILE",
                                         help="hft-cpu | hft-gpu | bench | path to a profile "
                                         ".toml")]
DbOpt = Annotated[str | None, typer.Option("--db", metavar="FILE", help="History database "
                                           "(default $HFTAGENT_DB, else the user's state dir: "
                                           "~/.local/state/hftagent/history.sqlite). Its "
                                           "directory must exist; checked before any work; "
                                           "never a symlink or another application's "
                                           "database.")]
NoHistoryOpt = Annotated[bool, typer.Option("--no-history", help="Do not record this run in "
                                            "the history database.")]
# The target CPUs: one rule for every command (tuning/targets.py), parsed there.
CpusOpt = Annotated[str | None, typer.Option("--cpus", metavar="LIST", help="Target "
                                             "(inference) CPUs, e.g. 2-5 or 1,3. Default: "
                                             "the isolated CPUs, else nohz_full, else every "
                                             "online CPU but the housekeeping core.")]
# TensorFlow's thread pools (probe, gate, run): TF reads them once, at initialisation.
IntraOpt = Annotated[int | None, typer.Option("--intra", metavar="N", help="TF intra-op "
                                              "threads (and LiteRT threads), 1..4096; omit "
                                              "for TF's default.")]
InterOpt = Annotated[int | None, typer.Option("--inter", metavar="N", help="TF inter-op "
                                              "threads, 1..4096, or -1: run ops in the caller "
                                              "thread; omit for TF's default.")]
ModelOpt = Annotated[str | None, typer.Option("--model", metavar="PATH", help="SavedModel "
                                              "directory, .keras or .tflite file, or numpy: "
                                              "the TF-free numpy stand-in (default: the "
                                              "built-in LSTM).")]
BuiltinOpt = Annotated[str | None, typer.Option("--builtin", metavar="NAME", help="Built-in "
                                                "model: lstm (default) | mlp | conv1d | numpy "
                                                "(no TF); not with --model.")]


def paragraphs(text: str) -> str:
    """A help text written as paragraphs: the lines of each paragraph joined into one, so that
    the help renderer wraps it once at the terminal's width (typer's rich mode keeps single
    line breaks: a source line wrapped at 100 columns came out as a ragged half line at 80).
    Paragraphs are separated by a blank line; one whose lines are indented is kept as it is
    (an example command)."""
    import inspect
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.splitlines()
        if lines and all(ln.startswith("  ") for ln in lines):
            out.append(para)  # typer's rich help keeps its line breaks
        else:
            out.append(" ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


_FLAGS_PLAIN = False


def plain_flags() -> None:
    """Show flags as flags in --help. typer 0.29's rich help prints every option's type, so a
    flag that takes no value (--json, --help) read ``<bool>``: a flag (or a counter) shows no
    type here, as click's plain help does (typer.core.TyperOption.get_help_record). Done once,
    when the commands are registered (not at import)."""
    global _FLAGS_PLAIN
    if _FLAGS_PLAIN:
        return
    from typer.core import TyperOption
    shown = getattr(TyperOption, "display_type_rich", None)
    _FLAGS_PLAIN = True
    if shown is None:  # another typer release renders help otherwise: leave it as it is
        return

    def display_type_rich(self, ctx):  # noqa: ANN001, ANN202 - typer's own signature
        if self.is_flag or self.count:
            return None
        return shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
    # rich is imported only when help is shown: a command that runs never pays for it
    from typer.core import TyperCommand, TyperGroup
    for cls in (TyperCommand, TyperGroup):
        cls.format_help = _folding(cls.format_help)  # type: ignore[method-assign]


def _folding(format_help: Callable) -> Callable:
    def with_folding(self, ctx, formatter):  # noqa: ANN001, ANN202 - click's own signature
        _fold_long_words()
        return format_help(self, ctx, formatter)
    return with_folding


def _fold_long_words() -> None:
    """An option's help cell folds a word longer than its column (a path, a metric or a
    symbol name) onto the next line: rich's table cells cut it with "…" by default, which
    at 80 columns hid the end of names the user must type (issue #39). Once, when help is
    first shown."""
    from typer import rich_utils

    helper = getattr(rich_utils, "_get_parameter_help", None)
    if helper is None or getattr(helper, "folds", False):  # another typer, or done
        return

    def folded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - typer's own signature
        cell = helper(*args, **kwargs)  # a rich Columns of Text parts (typer 0.29)
        for part in getattr(cell, "renderables", [cell]):
            if hasattr(part, "overflow"):
                part.overflow = "fold"
        return cell

    folded.folds = True  # type: ignore[attr-defined]
    rich_utils._get_parameter_help = folded


def register_command(app: typer.Typer, name: str, fn: Callable, help: str | None = None,
                     **settings) -> None:
    """``app.command(name)`` for one command function: its help as paragraphs (``help`` or
    the function's docstring), its domain errors as one line (:func:`cli_errors`), flags shown
    as flags (:func:`plain_flags`). ``settings``: click context settings."""
    plain_flags()
    text = help if help is not None else fn.__doc__
    app.command(name, help=paragraphs(text) if text else None,
                context_settings=settings or None)(cli_errors(fn))


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
        except BrokenPipeError:
            # The reader stopped early (`hftagent history export | head -1`): quiet, exit 0,
            # as `head` users expect. Here, because click answers an EPIPE that reaches it
            # with exit status 1; stdout is pointed at /dev/null so that no later flush
            # complains either.
            quiet_stdout()
            raise typer.Exit(0) from None
        except PermissionError as exc:
            raise fail(f"permission denied: {exc.filename or exc} (retry as root)") from None
        except Exception as exc:
            if isinstance(exc, _domain_errors()):
                raise fail(str(exc)) from None
            raise
    return wrapper  # type: ignore[return-value]


def quiet_stdout() -> None:
    """Point stdout at /dev/null (its reader is gone): nothing more is written, no flush
    fails."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


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
    from agent.history import HistoryError, check_writable
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
    directory, we may write there, and it passes agent/outfile.py's rule."""
    import os
    if not path.strip():
        raise fail(f"{opt} is empty: give a directory")
    if not os.path.isdir(path):
        raise fail(f"{opt}: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise fail(f"{opt}: cannot write in {path}: permission denied")
    from agent.outfile import open_dir  # every directory from / down root's or ours
    os.close(open_dir(path, opt))


def make_host(root: str = "/", procfs: str | None = None, sysfs: str | None = None) -> Host:
    """The Host of --root/--procfs/--sysfs; an empty value is refused (it would silently mean
    the current directory)."""
    for opt, v in (("--root", root), ("--procfs", procfs), ("--sysfs", sysfs)):
        if v is not None and not v.strip():
            raise fail(f"{opt} is empty: give a directory")
    return Host(root, procfs, sysfs)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT during a command's measurement. A KeyboardInterrupt (not an
    Exception), so that no ``except Exception`` on the way swallows it: it unwinds the work
    through its ``finally`` blocks (children killed, kernel state removed) to the command,
    which prints what was measured so far and exits 128 + the signal's number (one that
    escapes the command is still the CLI's Ctrl-C: exit 130, no traceback)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM/SIGINT raise :class:`Stopped` in the main thread while the block runs; after
    the first, both are ignored until the block is left, so a second Ctrl-C cannot cut the
    clean-up short. The previous handlers come back on the way out. Outside the main thread
    (library use) nothing is installed."""

    def stop(signum: int, _frame) -> None:  # noqa: ANN001 - signal handler
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    try:
        old = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# --attach's options, shared by `watch --attach PID` and `attach --check PID`
# (agent.trace.attach: the runtimes' catalogue, NAMES; the LIB:SYMBOL form).
AttachRuntimeOpt = Annotated[str | None, typer.Option(
    "--attach-runtime", metavar="RUNTIME",
    help="The runtime whose once-per-call function is timed: auto (every one the process "
    "maps, tried at attach time: the one whose calls arrive is kept), litert (LiteRT from "
    "Python), litert-c, tflite-c, tf-c (TF_SessionRun), tf-python (TFE_Py_ExecuteCancelable) "
    "or tf-session (tensorflow::DirectSession::Run).")]
AttachSymbolOpt = Annotated[str | None, typer.Option(
    "--attach-symbol", metavar="LIB:SYMBOL", help="Time another function: SYMBOL in the "
    "mapped library whose name is or starts with LIB (entry-only timing unless "
    "--unsafe-return).")]
