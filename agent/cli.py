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

# typer >= 0.22 vendors click as typer._click (pinned in pyproject); its exception classes are
# the ones raised in non-standalone mode.
from typer._click import exceptions as click_exc

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
)

app = typer.Typer(
    name="hftagent",
    help="Host tuning and tail-latency attribution for low-latency TensorFlow inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Host tuning and tail-latency attribution for low-latency TensorFlow inference.

    Start with `hftagent audit` (read-only), then `hftagent probe`.
    """


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
    except typer.Exit as exc:
        rc = exc.exit_code
    except typer.Abort:
        print("hftagent: aborted", file=sys.stderr)
        rc = 130
    except click_exc.NoArgsIsHelpError as exc:
        exc.show()
        rc = 0
    except click_exc.ClickException as exc:
        print(f"hftagent: error: {exc.format_message()}", file=sys.stderr)
        rc = 1
    except KeyboardInterrupt:
        rc = 130
    except Exception as exc:  # noqa: BLE001 - a bug must still not spill a traceback on users
        if os.environ.get("HFTAGENT_DEBUG"):
            raise
        print(f"hftagent: internal error: {type(exc).__name__}: {exc} "
              "(HFTAGENT_DEBUG=1 shows the traceback)", file=sys.stderr)
        rc = 1
    sys.exit(rc if isinstance(rc, int) else 0)
