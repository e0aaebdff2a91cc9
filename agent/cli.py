"""The hftagent command line. Thin: parse options, call one function, render.

Each command lives in its own module under agent/commands/ and exposes ``register(app)``.
Nothing heavy (TensorFlow, NVML, py-cpuinfo) is imported here or by those modules at import
time: ``hftagent audit`` must start and finish within a second.
"""

from __future__ import annotations

import importlib
import sys

import click
import typer

# Command modules, in the order they appear in --help. Each has register(app).
COMMANDS = (
    "agent.commands.audit",
)

app = typer.Typer(
    name="hftagent",
    help="Host tuning and tail-latency attribution for low-latency TensorFlow inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _wire() -> None:
    for mod in COMMANDS:
        importlib.import_module(mod).register(app)


_wired = False


def get_app() -> typer.Typer:
    """The fully wired app (for tests: ``CliRunner().invoke(get_app(), [...])``)."""
    global _wired
    if not _wired:
        _wire()
        _wired = True
    return app


def main() -> None:
    """Console entry point: bad usage is one line on stderr and exit 1, never a traceback."""
    try:
        rc = get_app()(standalone_mode=False)
    except click.exceptions.Exit as exc:
        rc = exc.exit_code
    except click.exceptions.Abort:
        print("hftagent: aborted", file=sys.stderr)
        rc = 130
    except click.ClickException as exc:
        print(f"hftagent: error: {exc.format_message()}", file=sys.stderr)
        rc = 1
    except KeyboardInterrupt:
        rc = 130
    sys.exit(rc if isinstance(rc, int) else 0)
