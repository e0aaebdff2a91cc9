"""The hftagent command line. Thin: parse options, call one function, render.

Each command lives in its own module under agent/commands/ and exposes ``register(app)``.
Commands are loaded lazily (issue #28 item 7): ``hftagent audit`` imports and builds only
agent/commands/audit.py, and ``hftagent --help`` imports no command module, no typer and no
rich: it is rendered from :data:`SUMMARIES` by :func:`root_help`, the same text the typer
group prints for ``hftagent`` with no arguments. Nothing heavy (TensorFlow, NVML,
py-cpuinfo) is imported here or by the command modules at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, MutableMapping

# Command modules, in the order they appear in --help. Each has register(app); the command's
# name is the module's last component.
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
    "agent.commands.docs",
)

# One line per command for `hftagent --help`, kept here so that the list needs no command
# module imported. Each is the first sentence of that command's own help
# (tests/test_cli_startup.py holds them to it): edit both together.
SUMMARIES = {
    "audit": "Report every host setting that hurts tail latency, with evidence and the "
             "exact fix.",
    "capture": "Capture this host's /proc and /sys files (the ones audit reads) into DIR.",
    "probe": "Probe a TensorFlow model's inference latency: P50/P99/P99.9, cold start, "
             "tail jitter.",
    "profile": "Profile CMD's GPU kernels with Nsight Compute (ncu) and report kernel count, "
               "kernel time per inference vs wall time (launch-bound or compute-bound) and "
               "the top kernels.",
    "tune": "Plan, apply, verify and roll back runtime host settings from a profile.",
    "run": "Run CMD pinned to CPUs, with NUMA memory binding, TF thread counts, "
           "SCHED_FIFO/RR and wake-up levers.",
    "history": "Runs recorded by probe, watch, audit, cpus and gate (SQLite; --db, else "
               "$HFTAGENT_DB, else $XDG_STATE_HOME/hftagent/history.sqlite).",
    "gate": "Gate a run against its baseline: P99 change with a bootstrap 95 % interval, "
            "tail-jitter rate with an exact binomial test, absolute budgets.",
    "watch": "Attribute every slow probe sample to a named cause, continuously.",
    "cpus": "Scan each candidate CPU for noise and recommend the inference CPUs.",
    "attach": "Show what can be attached in a running process, read-only.",
    "deploy": "Write the deployment files (systemd units, Prometheus config and alert rules, "
              "Alertmanager example, Grafana dashboard, web config example) into DIR.",
    "docs": "Show a shipped document (usage, attach, events, fleet, tuning, ...), or list "
            "them.",
}

ABOUT = ("Host tuning and tail-latency attribution for low-latency TensorFlow inference.",
         "Start with `hftagent audit` (read-only), then `hftagent probe`.")
ROOT_OPTIONS = (("--version", "Print the version and exit."),
                ("--help", "Show this message and exit."))


def _names() -> list[str]:
    return [m.rsplit(".", 1)[1] for m in COMMANDS]


def root_help(width: int | None = None) -> str:
    """The text of `hftagent --help`: plain, wrapped to the terminal (40 to 100 columns; 80
    on a pipe), words never cut. Needs neither typer nor rich nor any command module."""
    import shutil
    import textwrap

    if width is None:
        width = shutil.get_terminal_size((80, 24)).columns
    width = max(40, min(width, 100))

    def wrap(text: str, w: int) -> list[str]:
        return textwrap.wrap(text, max(w, 20), break_long_words=False,
                             break_on_hyphens=False) or [""]

    def rows(items) -> list[str]:
        key = max(len(k) for k, _ in items)
        out = []
        for k, text in items:
            first, *rest = wrap(text, width - key - 4)
            out.append(f"  {k:<{key}}  {first}")
            out.extend(" " * (key + 4) + line for line in rest)
        return out

    lines = ["Usage: hftagent [OPTIONS] COMMAND [ARGS]...", ""]
    for para in ABOUT:
        lines += wrap(para, width)
    lines += ["", "Commands:", *rows([(n, SUMMARIES[n]) for n in _names()]),
              "", "Options:", *rows(ROOT_OPTIONS),
              "", *wrap("`hftagent COMMAND --help` shows a command's options.", width)]
    return "\n".join(lines)


class _LazyCommands(MutableMapping):
    """The root group's commands: every name known up front, each command module imported
    and built by typer only when that command is looked up."""

    def __init__(self, load: Callable[[str], object]) -> None:
        self._load = load
        self._built: dict[str, object] = {}

    def __getitem__(self, name: str):
        if name not in self._built:
            if name not in SUMMARIES:
                raise KeyError(name)
            self._built[name] = self._load(name)
        return self._built[name]

    def __setitem__(self, name: str, cmd) -> None:
        self._built[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from _names()
        yield from (n for n in self._built if n not in SUMMARIES)

    def __len__(self) -> int:
        return len(list(iter(self)))


def _load_command(name: str):
    """The click command of ``agent.commands.<name>``, built by typer from that module alone."""
    import importlib

    import typer
    import typer.main

    from agent.commands.common import plain_flags
    plain_flags()  # flags show no <bool> in every command's --help, not only those that ask
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(f"agent.commands.{name}").register(sub)
    return typer.main.get_group(sub).commands[name]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        import typer
        try:
            v = version("hftagent")
        except PackageNotFoundError:
            v = "unknown (not installed as a package)"
        print(f"hftagent {v}")
        raise typer.Exit(0)


_app = None
_command = None


def get_app():
    """The typer app (for tests: ``CliRunner().invoke(get_app(), [...])``). Its group loads
    each command on first use."""
    global _app
    if _app is None:
        _app = _build_app()
    return _app


def _build_app():
    import typer
    from typer.core import TyperGroup

    class LazyGroup(TyperGroup):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.commands = _LazyCommands(_load_command)

        def format_help(self, ctx, formatter) -> None:
            formatter.write(root_help() + "\n")

        def parse_args(self, ctx, args):
            if not args and not ctx.resilient_parsing:  # the help on stderr, exit 0 (as main)
                print(root_help(), file=sys.stderr)
                ctx.exit(0)
            return super().parse_args(ctx, args)

    app = typer.Typer(name="hftagent", help=ABOUT[0], cls=LazyGroup,
                      add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _root(
        show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                          help=dict(ROOT_OPTIONS)["--version"]),
    ) -> None:
        """Host tuning and tail-latency attribution for low-latency TensorFlow inference."""

    return app


def get_command():
    """The click command typer builds from the app, built once: typer re-reads every
    command's signature and type hints on each call of the app, which in-process callers
    (the bad-input corpus runs hundreds) would pay every time."""
    global _command
    if _command is None:
        import typer.main
        _command = typer.main.get_command(get_app())
    return _command


# OpenBLAS (numpy's wheel) starts one worker thread per CPU when numpy loads, each spinning
# ~0.1 s before it sleeps (nproc - 1 threads: 15 and ~1.5 s of CPU with 16 CPUs), on every CPU the
# process may use, the isolated ones included — the noise this tool hunts, for arrays of a
# few thousand values that one thread handles. numpy is loaded with the BLAS variables at 1
# (agent.defaults.BLAS_THREAD_VARS; a value the caller set is kept) and the environment is put
# back at once: what hftagent starts (`run`'s command, the probe's workers) inherits the
# caller's.


class _OneBlasThread:
    """A meta-path finder for ``numpy`` alone: its module runs with the BLAS variables at 1,
    whenever it is first imported (most commands never import it)."""

    def find_spec(self, name, path=None, target=None):
        if name != "numpy":
            return None
        from importlib.machinery import PathFinder
        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, run = spec.loader, spec.loader.exec_module

        from agent.defaults import BLAS_THREAD_VARS  # (here: `hftagent --help` imports none)

        def exec_module(module):
            saved = {v: os.environ.get(v) for v in BLAS_THREAD_VARS}
            for v in BLAS_THREAD_VARS:
                os.environ.setdefault(v, "1")
            try:
                run(module)
            finally:
                for v, old in saved.items():
                    if old is None:
                        os.environ.pop(v, None)
                    else:
                        os.environ[v] = old

        loader.exec_module = exec_module
        return spec


def one_blas_thread() -> None:
    """Load numpy, when something first imports it, with one BLAS thread (above)."""
    if "numpy" not in sys.modules and not any(isinstance(f, _OneBlasThread)
                                              for f in sys.meta_path):
        sys.meta_path.insert(0, _OneBlasThread())


def _started_early(args: list[str]) -> dict:
    """Work a command starts before typer is imported and has parsed its options (typer and
    pydantic take about 0.1 s of a 0.3 s audit), handed to it as the context's ``obj``:
    `hftagent audit` opens its steal window on the live host here, so that all of that runs
    inside the window (collectors.system.steal_share ignores it for another host's
    /proc/stat, and a read that fails here is only a window not opened early)."""
    if args[:1] != ["audit"]:
        return {}
    from collectors.host import Host
    from collectors.system import stat_snapshot
    snap = stat_snapshot(Host())
    return {"steal_start": snap} if snap.reading.ok else {}


def _usage_error_line(exc) -> str:
    # One line whatever the message holds (a value with a newline, a "did you mean" hint).
    return " ".join(exc.format_message().split())


def main() -> None:
    """Console entry point: bad usage is one line on stderr and exit 1, never a traceback."""
    args = sys.argv[1:]
    if args in ([], ["--help"]):
        # The commonest first call, answered without typer (#28.7). No arguments: the help
        # goes to stderr, as the group's no_args_is_help does.
        rc = _print_root_help(sys.stderr if not args else sys.stdout)
    else:
        rc = _run()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_stdout()
        rc = 0
    sys.exit(rc if isinstance(rc, int) else 0)


def _print_root_help(stream) -> int:
    try:
        print(root_help(), file=stream)
    except BrokenPipeError:  # `hftagent --help | head -1`
        _quiet_stdout()
    return 0


def _run():
    one_blas_thread()
    early = _started_early(sys.argv[1:])  # before typer is imported
    import typer

    stdout_was = _fd_identity(1)
    try:
        rc = get_command()(standalone_mode=False, obj=early)
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
    return rc


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
