"""Start-up (issue #28 item 7): `hftagent --help` imports no command module, typer or rich;
each command loads alone; audit's steal window overlaps the parsing and the checks instead of
being waited for. No timed assertions: what is imported, and what is slept, is checked."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import typer.main
from typer.testing import CliRunner

from agent import cli
from tests.conftest import FIXTURES

runner = CliRunner()

PROBE = """import sys
sys.argv = ['hftagent', *sys.argv[1:]]
from agent.cli import main
try:
    main()
except SystemExit as exc:
    rc = exc.code
print('MODULES', sorted(m for m in sys.modules
                        if m.startswith(('agent', 'typer', 'rich', 'pydantic'))), file=sys.stderr)
print('RC', rc, file=sys.stderr)
"""


def _modules(*args: str, env: dict | None = None) -> tuple[list[str], str, str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                       timeout=120, env=env)
    mods = re.search(r"^MODULES (\[.*\])$", r.stderr, re.M)
    assert mods, r.stderr[-1000:]
    return eval(mods.group(1)), r.stdout, r.stderr  # noqa: S307 - our own repr of a list


@pytest.mark.parametrize("args", [["--help"], []])
def test_root_help_imports_no_command_typer_or_rich(args):
    mods, out, err = _modules(*args)
    assert mods == ["agent", "agent.cli"], mods
    text = out if args else err  # no arguments: the help goes to stderr, exit 0
    assert text.startswith("Usage: hftagent [OPTIONS] COMMAND") and "RC 0" in err
    for name in cli.SUMMARIES:
        assert re.search(rf"^  {name} ", text, re.M), name


def test_a_command_loads_only_its_own_module():
    mods, _, err = _modules("capture", "--help")
    assert "RC 0" in err
    commands = [m for m in mods if m.startswith("agent.commands.") and m != "agent.commands.common"]
    assert commands == ["agent.commands.capture"], commands


def test_root_help_is_one_text_through_typer_and_the_fast_path():
    """`hftagent --help` (main's fast path) and the typer group (CliRunner, `hftagent` with
    no arguments) print the same text."""
    got = runner.invoke(cli.get_app(), ["--help"], env={"COLUMNS": "80"})
    assert got.exit_code == 0
    assert got.stdout.rstrip("\n") == cli.root_help(80)
    bare = runner.invoke(cli.get_app(), [], env={"COLUMNS": "80"})
    assert bare.exit_code == 0 and bare.stderr.rstrip("\n") == cli.root_help(80)


@pytest.mark.parametrize("width", [60, 80, 200])
def test_root_help_fits_and_cuts_no_word(width):
    text = cli.root_help(width)
    assert max(map(len, text.splitlines())) <= min(width, 100)
    flat = " ".join(text.split())
    for summary in cli.SUMMARIES.values():
        assert " ".join(summary.split()) in flat


def _first_sentence(help_text: str) -> str:
    para = " ".join(help_text.split("\n\n")[0].split())
    m = re.match(r"(.+?\.)(\s|$)", para)
    return m.group(1) if m else para


def test_summaries_are_each_commands_first_sentence():
    """SUMMARIES (what --help lists without importing the commands) follow the commands'
    own help: edit both together."""
    group = typer.main.get_command(cli.get_app())
    assert list(cli.SUMMARIES) == [m.rsplit(".", 1)[1] for m in cli.COMMANDS]
    assert list(group.commands) == list(cli.SUMMARIES)
    for name, summary in cli.SUMMARIES.items():
        assert summary == _first_sentence(group.commands[name].help or ""), name


def test_root_options_listed_are_the_groups_own():
    group = typer.main.get_command(cli.get_app())
    listed = {opt for opt, _ in cli.ROOT_OPTIONS}
    assert listed == {o for p in group.get_params(typer.Context(group)) for o in p.opts}


def test_unknown_command_is_one_line_with_a_suggestion():
    r = subprocess.run([sys.executable, "-m", "agent.cli", "audt"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == "hftagent: error: No such command 'audt'. Did you mean 'audit'?"


# ---- the steal window -------------------------------------------------------------------


def _sleeps(monkeypatch) -> list[float]:
    import collectors.system as system
    slept: list[float] = []
    monkeypatch.setattr(system.time, "sleep", slept.append)
    return slept


def test_a_window_opened_earlier_sleeps_only_what_is_left(monkeypatch):
    from collectors.host import Host
    from collectors.system import StatSnapshot, stat_snapshot, steal_share

    host = Host()
    if not host.live:
        pytest.skip("needs the live /proc/stat")
    slept = _sleeps(monkeypatch)
    old = stat_snapshot(host)
    long_ago = StatSnapshot(old.reading, old.source, time.monotonic() - 5.0)
    st = steal_share(host, [0], 0.2, long_ago)
    assert st.ok and slept == []  # the work done since covered the window
    st = steal_share(host, [0], 0.2, stat_snapshot(host))
    assert st.ok and len(slept) == 1 and 0 < slept[0] <= 0.2
    st = steal_share(host, [0], 0.2)  # no window opened: it opens now, the whole of it
    assert st.ok and len(slept) == 2 and 0 < slept[1] <= 0.2


def test_a_window_opened_on_another_file_is_not_used(monkeypatch, tmp_path):
    from collectors.host import Host
    from collectors.system import StatSnapshot, stat_snapshot, steal_share

    host = Host()
    if not host.live:
        pytest.skip("needs the live /proc/stat")
    slept = _sleeps(monkeypatch)
    other = stat_snapshot(Host(FIXTURES / "synthetic-tuned"))
    assert other.reading.ok and other.source != str(host.proc("stat"))
    st = steal_share(host, [0], 0.2, StatSnapshot(other.reading, other.source, 0.0))
    assert st.ok and len(slept) == 1  # its own window, not the fixture's numbers


def test_virt_runs_last_but_is_reported_first(monkeypatch):
    """The steal window stays open while the other families run: virt runs last, and the
    report keeps FAMILIES' order."""
    import tuning.audit as audit
    from collectors.host import Host
    from tuning.findings import Finding, Status
    from tuning.profiles import load_profile

    ran: list[str] = []

    def family(name):
        def check(ctx):
            ran.append(name)
            return [Finding(f"{name}.x", name, name, Status.OK)]
        return check
    names = [n for n, _ in audit.FAMILIES]
    monkeypatch.setattr(audit, "FAMILIES", [(n, family(n)) for n in names])
    report = audit.run_audit(Host(FIXTURES / "synthetic-tuned"), load_profile("hft-cpu"))
    assert names[0] == "virt" and ran == [*names[1:], "virt"]
    assert [f.family for f in report.findings] == names


def test_audit_opens_its_window_before_typer_is_imported(tmp_path):
    """The live audit's steal window opens in agent/cli.py before typer (and pydantic, which
    typer's option parsing imports) is imported; the check closes that same window."""
    code = """import sys, time
import collectors.system as system
opened, closed = [], []
real_open, real_window = system.stat_snapshot, system.steal_window
def stat_snapshot(host):
    snap = real_open(host)
    opened.append((snap, 'typer' in sys.modules or 'pydantic' in sys.modules))
    return snap
def steal_window(host, cpus, window_s=0.2, start=None):
    closed.append(start)
    return real_window(host, cpus, window_s, start)
system.stat_snapshot, system.steal_window = stat_snapshot, steal_window
sys.argv = ['hftagent', 'audit', '--json', '--no-history']
from agent.cli import main
try:
    main()
except SystemExit:
    pass
print('OPENED', len(opened), 'AFTER-TYPER', opened[0][1], 'SAME', closed[0] is opened[0][0],
      file=sys.stderr)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "OPENED 1 AFTER-TYPER False SAME True" in r.stderr, r.stderr[-1000:]
