"""The hftagent command line. Thin: parse options, call one function, render.

Each command lives in its own module under agent/commands/ and exposes ``register(app)``.
Nothing heavy (TensorFlow, NVML, py-cpuinfo) is imported here or by those modules at import
time: ``hftagent audit`` must start and finish within a second.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer
import typer.main

# Command modules, in the order they appear in --help. Each has register(app).
COMMANDS = (
    "agent.commands.audit",
    "agent.commands.capture",
    "agent.commands.probe",
    "agent.commands.profile",
    "agent.commands.tune",
    "agent.commands.run",
    "agent.commands.history",
    "agent.commands.gate",
    "agent.commands.watch",
    "agent.commands.cpus",
    "agent.commands.attach",
    "agent.commands.deploy",
)

app = typer.Typer(
    name="hftagent",
    help="Host tuning and tail-latency attribution for low-latency TensorFlow inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("hftagent")
        except PackageNotFoundError:
            v = "unknown (not installed as a package)"
        print(f"hftagent {v}")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                      help="Print the version and exit."),
) -> None:
    """Host tuning and tail-latency attribution for low-latency TensorFlow inference.

    Start with `hftagent audit` (read-only), then `hftagent probe`.
    """


def _wire() -> None:
    for mod in COMMANDS:
        importlib.import_module(mod).register(app)


_wired = False
_command = None


def get_app() -> typer.Typer:
    """The fully wired app (for tests: ``CliRunner().invoke(get_app(), [...])``)."""
    global _wired
    if not _wired:
        _wire()
        _wired = True
    return app


def get_command():
    """The click command typer builds from the app, built once: typer re-reads every
    command's signature and type hints on each call of the app (~15 ms), which in-process
    callers (the bad-input corpus runs hundreds) would pay every time."""
    global _command
    if _command is None:
        _command = typer.main.get_command(get_app())
    return _command


def _usage_error_line(exc: typer.TyperException) -> str:
    # One line whatever the message holds (a value with a newline, a "did you mean" hint).
    return " ".join(exc.format_message().split())


def main() -> None:
    """Console entry point: bad usage is one line on stderr and exit 1, never a traceback."""
    stdout_was = _fd_identity(1)
    try:
        rc = get_command()(standalone_mode=False)
    except SystemExit as exc:
        # rich's Console answers a closed stdout by pointing it at /dev/null and exiting 1
        # (Console.on_broken_pipe); a reader that stopped early is no failure of ours
        rc = 0 if _stdout_broken(stdout_was) else exc.code
    except typer.Exit as exc:
        rc = exc.exit_code
    except typer.Abort:
        print("hftagent: aborted", file=sys.stderr)
        rc = 130
    except typer.TyperException as exc:
        # The parser's errors (bad option value, unknown option, missing argument) derive
        # from the public typer.TyperException in typer >= 0.29; a group called without a
        # subcommand raises NoArgsIsHelpError, whose message is the group's help. Its class
        # is not public: recognised by name, as typer's own rich_utils does.
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message(), file=sys.stderr)
            rc = 0
        else:
            print(f"hftagent: error: {_usage_error_line(exc)}", file=sys.stderr)
            rc = 1
    except KeyboardInterrupt:
        rc = 130
    except BrokenPipeError:
        # The reader stopped early (`hftagent audit | head -1`): quiet, as `head` users
        # expect, and stdout pointed at /dev/null so that the interpreter's final flush does
        # not complain either.
        _quiet_stdout()
        rc = 0
    except Exception as exc:  # noqa: BLE001 - a bug must still not spill a traceback on users
        if os.environ.get("HFTAGENT_DEBUG"):
            raise
        print(f"hftagent: internal error: {type(exc).__name__}: {exc} "
              "(HFTAGENT_DEBUG=1 shows the traceback)", file=sys.stderr)
        rc = 1
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        rc = 0
    sys.exit(rc if isinstance(rc, int) else 0)


def _fd_identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _stdout_broken(before: tuple[int, int] | None) -> bool:
    """Whether stdout was replaced by /dev/null during the command (rich does that on EPIPE)."""
    now = _fd_identity(1)
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return now != before and now == (null.st_dev, null.st_ino)


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # python -m agent.cli
    main()
