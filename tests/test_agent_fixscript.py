"""Fixes a person can paste (issue #25, Build 1 and 2): the one GRUB recipe run for real on
copies of GRUB files, every printed fix line parsed by bash, never a reboot, and
`audit --fix-script`."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tuning.tunables.base as tunables_base
from agent.cli import get_app
from agent.fixscript import NOT_UNDONE
from tests.conftest import FIXTURES
from tests.treecopy import KernelSim, diff, snapshot
from tuning.tunables import fixing
from tuning.tunables.boot import boot_args, grub_commands, grub_script

runner = CliRunner()
KEYS = ("isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity", "skew_tick")
# every host tree under tests/fixtures (events/ and gpu-h200-facts/ are not hosts)
HOST_TREES = sorted(p.name for p in FIXTURES.iterdir() if (p / "proc").is_dir())
PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "tuning/profiles")
                  .glob("*.toml"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CMD_LINE = re.compile(r"^ {8}\S")  # how agent/render.py prints a command: 8 spaces, then it
DEBIAN_GRUB = """\
# If you change this file, run 'update-grub' afterwards to update /boot/grub/grub.cfg.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="isolcpus=3 quiet nohz_full=4-7 splash rcu_nocb_poll skew_tick=0"
GRUB_CMDLINE_LINUX="console=ttyS0,115200 irqaffinity=0-1 rcu_nocbs=1"
#GRUB_CMDLINE_LINUX_DEFAULT="nohz_full=9"
"""


def _bin(tmp_path: Path) -> dict[str, str]:
    """A PATH with recording stand-ins for update-grub and grubby (nothing real is touched)."""
    b = tmp_path / "bin"
    b.mkdir()
    for name in ("update-grub", "grubby"):
        f = b / name
        f.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name}" "$@" >> {tmp_path}/calls\n')
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{b}:{os.environ['PATH']}"}


def _calls(tmp_path: Path) -> list[str]:
    p = tmp_path / "calls"
    return p.read_text().splitlines() if p.exists() else []


def _line_of(text: str, var: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(f"{var}="))


def _args_of(line: str) -> list[str]:
    return shlex.split(line.partition("=")[2])[0].split()


# -- the recipe ------------------------------------------------------------------------------


def test_recipe_never_reboots_and_is_one_command_a_line():
    cmds = grub_commands(boot_args([2, 3], [0, 1, 2, 3]))
    assert len(cmds) == 2
    for c in cmds:
        assert "\n" not in c and "reboot" not in c
        assert subprocess.run(["bash", "-n", "-c", c]).returncode == 0


def test_debian_recipe_run_twice_on_a_grub_copy(tmp_path):
    """Every key it sets is removed first, from both lines, and set once; a second run
    changes nothing; other arguments (rcu_nocb_poll, quiet) and the commented line stay."""
    env = _bin(tmp_path)
    grub = tmp_path / "grub"
    grub.write_text(DEBIAN_GRUB)
    args = boot_args([2, 3], [0, 1, 2, 3])
    debian = grub_commands(args, grub_file=str(grub))[1]
    subprocess.run(["sh", "-c", debian], env=env, check=True)
    once = grub.read_text()
    default = _args_of(_line_of(once, "GRUB_CMDLINE_LINUX_DEFAULT"))
    for k in KEYS:
        assert [a for a in default if a.partition("=")[0] == k] == [f"{k}={args[k]}"], default
    assert default[:3] == ["quiet", "splash", "rcu_nocb_poll"]
    assert _args_of(_line_of(once, "GRUB_CMDLINE_LINUX")) == ["console=ttyS0,115200"]
    assert '#GRUB_CMDLINE_LINUX_DEFAULT="nohz_full=9"' in once
    subprocess.run(["sh", "-c", debian], env=env, check=True)
    assert grub.read_text() == once  # idempotent
    assert _calls(tmp_path) == ["update-grub", "update-grub"]


def test_debian_recipe_on_an_empty_default_line(tmp_path):
    env = _bin(tmp_path)
    grub = tmp_path / "grub"
    grub.write_text('GRUB_CMDLINE_LINUX_DEFAULT=""\nGRUB_CMDLINE_LINUX=""\n')
    debian = grub_commands({"nohz_full": "2-3", "skew_tick": "1"}, grub_file=str(grub))[1]
    subprocess.run(["sh", "-c", debian], env=env, check=True)
    assert grub.read_text() == ('GRUB_CMDLINE_LINUX_DEFAULT="nohz_full=2-3 skew_tick=1"\n'
                                'GRUB_CMDLINE_LINUX=""\n')


@pytest.mark.parametrize("line", ["GRUB_CMDLINE_LINUX_DEFAULT='quiet nohz_full=1'",
                                  'GRUB_CMDLINE_LINUX_DEFAULT="quiet \\\n nohz_full=1"',
                                  'GRUB_TIMEOUT=5'])
def test_debian_recipe_leaves_another_form_alone(tmp_path, line):
    """Single quotes, a continued line, no such line: one message, exit 1, the file as it
    was and no update-grub (an edit that half works would boot with the old arguments)."""
    env = _bin(tmp_path)
    grub = tmp_path / "grub"
    grub.write_text(line + "\n")
    debian = grub_commands({"nohz_full": "2-3"}, grub_file=str(grub))[1]
    res = subprocess.run(["sh", "-c", debian], env=env, capture_output=True, text=True)
    assert res.returncode == 1
    assert "set the boot arguments by hand" in res.stderr
    assert grub.read_text() == line + "\n" and _calls(tmp_path) == []


def test_grubby_recipe_removes_every_key_it_sets(tmp_path):
    env = _bin(tmp_path)
    args = boot_args([4, 5, 6, 7], list(range(16)))
    subprocess.run(["sh", "-c", grub_commands(args)[0]], env=env, check=True)
    calls = _calls(tmp_path)
    assert calls[:2] == ["grubby", "--update-kernel=ALL"]
    removed = next(c for c in calls if c.startswith("--remove-args=")).partition("=")[2]
    added = next(c for c in calls if c.startswith("--args=")).partition("=")[2]
    assert sorted(removed.split()) == sorted(KEYS)
    assert sorted(a.partition("=")[0] for a in added.split()) == sorted(KEYS)
    assert "isolcpus=managed_irq,domain,4-7" in added.split()


@pytest.mark.parametrize("with_grubby", [True, False])
def test_script_form_of_the_recipe(tmp_path, with_grubby):
    """grub_script under set -e: grubby where installed, else the GRUB file and update-grub;
    a GRUB file in another form stops the script."""
    env = _bin(tmp_path)
    if not with_grubby:
        (tmp_path / "bin/grubby").unlink()
        env["PATH"] = f"{tmp_path / 'bin'}:/usr/bin:/bin"
        if any(Path(d, "grubby").exists() for d in ("/usr/bin", "/bin")):
            pytest.skip("this machine has a real grubby")
    grub = tmp_path / "grub"
    grub.write_text(DEBIAN_GRUB)
    script = "set -e\n" + "\n".join(grub_script({"nohz_full": "2-3"}, str(grub))) + \
        "\necho done\n"
    res = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "done\n", res.stderr
    if with_grubby:
        assert _calls(tmp_path)[0] == "grubby" and grub.read_text() == DEBIAN_GRUB
    else:
        assert _calls(tmp_path) == ["update-grub"]
        assert _args_of(_line_of(grub.read_text(), "GRUB_CMDLINE_LINUX_DEFAULT")).count(
            "nohz_full=2-3") == 1
        grub.write_text("GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n")
        res = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
        assert res.returncode == 1 and "done" not in res.stdout


@pytest.mark.parametrize("args", [{"nohz_full": "1;reboot"}, {"nohz_full": "1 2"},
                                  {"a b": "1"}, {"nohz_full": "$(id)"}, {}])
def test_recipe_refuses_what_is_not_a_boot_argument(args):
    with pytest.raises(ValueError):
        grub_commands(args)


# -- what audit prints -----------------------------------------------------------------------


def _audit(*args: str, env: dict | None = None):
    return runner.invoke(get_app(), ["audit", "--steal-window", "0", *args], env=env or {})


@cache
def _json(tree: str, profile: str = "hft-cpu", cpus: str | None = None) -> dict:
    res = _audit("--root", str(FIXTURES / tree), "--profile", profile, "--json",
                 *(["--cpus", cpus] if cpus else []))
    assert res.exit_code in (0, 1, 2), res.output
    return json.loads(res.stdout)


def _human(tree: str, profile: str, env: dict, cpus: str | None = None) -> str:
    res = _audit("--root", str(FIXTURES / tree), "--profile", profile,
                 *(["--cpus", cpus] if cpus else []), env=env)
    assert res.exit_code in (0, 1, 2), res.output
    return ANSI.sub("", res.stdout)


def _expected_commands(doc: dict) -> list[str]:
    """The command lines the human output must show for this JSON: each finding's commands,
    then the one recipe for every boot argument still to set."""
    from agent.render import command_line, is_boot_arg, to_fix
    from tuning.findings import Finding, Status, fix_steps
    fs = [Finding(**{**f, "status": Status(f["status"])}) for f in doc["findings"]]
    out = [command_line(s) for f in to_fix(fs) if not is_boot_arg(f)
           for s in fix_steps(f.fix) if s.command]
    args = dict(f.data["kernel_arg"].split("=", 1) for f in fs if is_boot_arg(f))
    return out + (grub_commands(args) if args else [])


@cache
def _bash_ok(line: str) -> bool:
    return subprocess.run(["bash", "-n", "-c", line], capture_output=True).returncode == 0


MODES = {"piped-80": {"COLUMNS": "80"},
         "terminal-80": {"COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"},
         "terminal-200": {"COLUMNS": "200", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}}


def _check_fixes(out: str, doc: dict) -> None:
    cmds = [ln[8:] for ln in out.splitlines() if CMD_LINE.match(ln)]
    assert cmds == _expected_commands(doc)  # each whole, on its own line, none left out
    for c in cmds:
        assert _bash_ok(c), c
        assert "reboot" not in c, c
    boot = any("kernel_arg" in f.get("data", {}) and f["status"] != "ok" and f["fix"]
               for f in doc["findings"])
    assert out.count("then reboot") == (1 if boot else 0)
    # nothing of a fix is lost between the JSON and the words printed
    words = set(re.findall(r"[^\s()#;]+", out))
    for f in doc["findings"]:
        if f["fix"] and "kernel_arg" not in f.get("data", {}):
            missing = set(re.findall(r"[^\s()#;]+", f["fix"])) - words - {"or:"}
            assert not missing, (f["id"], missing)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("tree", HOST_TREES)
def test_printed_fixes_paste_piped(tree, profile):
    """Issue #25's test: for every fixture tree and profile, the fixes printed at 80 columns
    on a pipe parse with bash -n one line at a time, and none contains reboot."""
    _check_fixes(_human(tree, profile, MODES["piped-80"]), _json(tree, profile))


@pytest.mark.parametrize("mode", ["terminal-80", "terminal-200"])
@pytest.mark.parametrize("tree", HOST_TREES)
def test_printed_fixes_paste_on_a_terminal(tree, mode):
    _check_fixes(_human(tree, "hft-cpu", MODES[mode]), _json(tree))


def test_all_boot_arguments_at_once_sets_each_key_once(tmp_path):
    """synthetic-tuned boots with nohz_full=4-7 etc.; targets 2-7 need every key but
    skew_tick changed. The printed recipe was `--remove-args=isolcpus` only and left two
    nohz_full= on the GRUB line. Run the printed Debian line, twice, on a GRUB file holding
    the tree's arguments."""
    out = _human("synthetic-tuned", "hft-cpu", MODES["piped-80"], cpus="2-7")
    cmds = [ln[8:] for ln in out.splitlines() if CMD_LINE.match(ln)]
    grubby = next(c for c in cmds if c.startswith("grubby "))
    removed = shlex.split(grubby)[2].partition("=")[2].split()
    assert sorted(removed) == sorted(set(KEYS) - {"skew_tick"})
    debian = next(c for c in cmds if "update-grub" in c)
    booted = (FIXTURES / "synthetic-tuned/proc/cmdline").read_text().split()
    grub = tmp_path / "grub"
    grub.write_text(f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(booted[3:])}"\n'
                    'GRUB_CMDLINE_LINUX=""\n')
    env = _bin(tmp_path)
    for _ in range(2):
        subprocess.run(["sh", "-c", debian.replace("/etc/default/grub", str(grub))], env=env,
                       check=True)
    line = _args_of(_line_of(grub.read_text(), "GRUB_CMDLINE_LINUX_DEFAULT"))
    for k in KEYS:
        assert len([a for a in line if a.startswith(k + "=")]) == 1, line
    assert "nohz_full=2-7" in line and "irqaffinity=0-1,8-15" in line


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("tree", HOST_TREES)
def test_tune_plan_recipe_pastes(tree, profile):
    """tune plan --root prints the same recipe: each command whole on its own line (at 80
    columns, piped), bash -n clean, and no reboot command."""
    base = ["tune", "plan", "--root", str(FIXTURES / tree), "--profile", profile]
    res = runner.invoke(get_app(), [*base, "--json"])
    assert res.exit_code in (0, 2), res.output
    recipe = [ln for it in json.loads(res.stdout)["items"] for c in it["changes"]
              if c["kind"] == "pending-reboot" for ln in c["detail"].splitlines()]
    res = runner.invoke(get_app(), base, env={"COLUMNS": "80"})
    assert res.exit_code in (0, 2), res.output
    lines = [ln.strip() for ln in ANSI.sub("", res.stdout).splitlines()]
    for cmd in recipe:
        assert cmd in lines, cmd
        assert _bash_ok(cmd) and "reboot" not in cmd, cmd
    for ln in lines:
        assert not re.search(r"(^|[;&|]\s*)reboot\b", ln), ln


# -- audit --fix-script ----------------------------------------------------------------------


def _script(path: Path) -> tuple[list[str], list[str]]:
    """(every line, the commands: lines that are not comments, set -e or the boot part)."""
    lines = path.read_text().splitlines()
    end = lines.index("if command -v grubby >/dev/null 2>&1; then") \
        if "if command -v grubby >/dev/null 2>&1; then" in lines else len(lines)
    cmds = [ln for ln in lines[:end] if ln.strip() and not ln.lstrip().startswith("#")
            and ln != "set -e" and ln != "#!/bin/sh"]
    return lines, cmds


def _tune_call(cmds: list[str]) -> list[str]:
    """The one `tune apply` call's argv; every other command must say it is not undone."""
    calls = [shlex.split(c) for c in cmds if " tune apply " in c]
    assert len(calls) == 1, cmds
    for c in cmds:
        assert " tune apply " in c or "# " in c and NOT_UNDONE in c.partition("# ")[2], c
    return calls[0]


def test_fix_script_is_an_executable_commented_script(tmp_path):
    path = tmp_path / "fix.sh"
    res = _audit("--root", str(FIXTURES / "synthetic-2socket"), "--fix-script", str(path))
    assert res.exit_code == 2, res.output
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700
    lines, commands = _script(path)
    assert lines[0] == "#!/bin/sh" and "set -e" in lines
    for sh in ("sh", "bash"):
        assert subprocess.run([sh, "-n", str(path)]).returncode == 0
    doc = _json("synthetic-2socket")
    todo = [f for f in doc["findings"] if f["status"] in ("fail", "warn", "pending-reboot",
                                                          "error")]
    for f in todo:  # one comment line naming each finding
        assert sum(1 for ln in lines if ln.startswith(f"# {f['id']} (")) == 1, f["id"]
    assert lines[-1] == "# then reboot"
    assert not any(re.search(r"\breboot\b", c) for c in commands)
    # every runtime setting through ONE journalled call, with the exact --only list: the
    # tunables of the findings to fix (tuning.tunables.fixing), in apply order
    argv = _tune_call(commands)
    assert os.path.isabs(argv[0]) and os.access(argv[0], os.X_OK), argv[0]
    assert argv[1:7] == ["tune", "apply", "--profile", "hft-cpu", "--cpus", "2-7"]
    only = [v for o, v in zip(argv, argv[1:]) if o == "--only"]
    want = [t for f in todo for t in fixing(f["id"])]
    assert only == want and len(set(only)) == len(only)
    assert {"cpu.governor", "irq.affinity", "irq.default_affinity", "memory.swappiness",
            "memory.numa_balancing", "kernel.perf_event_paranoid"} <= set(only)
    # no raw write of a setting tune journals is left to run
    assert not [c for c in commands if c.startswith(("sysctl", "echo", "for ", "cpupower"))]
    # what tune cannot journal stays, marked, with the value to put back
    assert "swapoff -a  # not undone by tune rollback; to restore: swapon -a (the swap in " \
        "/etc/fstab); it was: /dev/nvme0n1p3 (8191 MiB, 1 MiB used)" in commands
    assert any(c.startswith("systemctl disable --now irqbalance.service tuned.service  # ") and
               "to restore: systemctl enable --now irqbalance.service tuned.service" in c
               for c in commands)
    assert any(ln.startswith("# -- boot arguments (not undone by tune rollback") for ln in lines)
    assert "# isolation.nohz_full (pending-reboot): nohz_full (no timer tick): nohz_full=2-7 " \
        "(now: not set)" in lines
    # advice is a comment, never run; the call's job is said next to each finding
    assert any(ln.startswith("#   advice: include SMT siblings") for ln in lines)
    assert "#   tune apply --only cpu.governor (below), journalled; the same as: cpupower -c " \
        "4-7 frequency-set -g performance" in lines
    assert not any(ln.startswith("#   or, instead:") and "tune apply" in ln for ln in lines)


@pytest.mark.parametrize("tree", HOST_TREES)
def test_fix_script_then_rollback_restores_every_value(tree, tree_copy, tmp_path, monkeypatch):
    """Issue #39's test: run the script (sh, set -e) with hftagent, swapoff, systemctl and
    grubby recorded, then the one hftagent call it made against a copy of the tree (the
    kernel simulated): the findings it stands for are fixed, the tree changed; after `tune
    rollback` a snapshot of every file equals the one before."""
    from agent import fixscript
    monkeypatch.setattr(tunables_base, "default_writer", KernelSim)
    root = tree_copy(tree)
    env = _bin(tmp_path)
    stub = tmp_path / "bin/hftagent-here"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {tmp_path}/hftagent-argv\n')
    stub.chmod(0o755)
    for name in ("swapoff", "systemctl"):  # what tune cannot journal: recorded, not run
        (tmp_path / "bin" / name).write_text(f"#!/bin/sh\necho {name} >> {tmp_path}/calls\n")
        (tmp_path / "bin" / name).chmod(0o755)
    monkeypatch.setattr(fixscript, "hftagent_argv", lambda: [str(stub)])
    path = tmp_path / "fix.sh"
    assert _audit("--root", str(root), "--fix-script", str(path)).exit_code in (0, 2)
    _, commands = _script(path)
    if tree == "synthetic-tuned":  # tuned already: nothing for tune to do
        assert not [c for c in commands if " tune apply " in c]
        return
    argv = _tune_call(commands)
    assert argv[0] == str(stub)
    res = subprocess.run(["sh", str(path)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    ran = (tmp_path / "hftagent-argv").read_text().split("\0")[:-1]
    assert ran == argv[1:]
    before = snapshot(root)
    applied = runner.invoke(get_app(), [*ran, "--root", str(root), "--json"])
    assert applied.exit_code == 0, applied.output
    items = {i["id"]: i["state"] for i in json.loads(applied.stdout)["items"]}
    changed = diff(before, snapshot(root))
    assert changed, "the call changed nothing"
    after = json.loads(_audit("--root", str(root), "--json").stdout)
    status = {f["id"]: f["status"] for f in after["findings"]}
    fixed = [fid for fid in _runtime_findings(path)
             if fixing(fid) and all(items.get(t) == "planned" for t in fixing(fid))]
    assert fixed and all(status[fid] == "ok" for fid in fixed), \
        {fid: status[fid] for fid in fixed}
    rb = runner.invoke(get_app(), ["tune", "rollback", "--root", str(root)])
    assert rb.exit_code == 0, rb.output
    assert diff(before, snapshot(root)) == []


def _runtime_findings(path: Path) -> list[str]:
    """The findings of the script's first part (the one journalled call's)."""
    lines = path.read_text().splitlines()
    start = lines.index("# -- runtime settings: one journalled call --")
    out = []
    for ln in lines[start + 1:]:
        if not ln.startswith("#"):
            break
        if not ln.startswith("#   "):
            out.append(ln[2:].split(" (", 1)[0])
    return out


def test_the_script_calls_hftagent_by_its_absolute_path(tmp_path, monkeypatch):
    """Root's PATH rarely holds a virtual environment's bin/: the script names the program
    that wrote it (absolute, quoted), and runs where no hftagent is on PATH."""
    import sys

    from agent import fixscript
    here = Path(sys.executable).parent / "hftagent"
    odd = tmp_path / "my tools"
    odd.mkdir()
    prog = odd / "hftagent"
    prog.write_text(f'#!/bin/sh\necho "$0" > {tmp_path}/ran\n')
    prog.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(prog), "audit"])
    assert fixscript.hftagent_argv() == [str(prog)]
    monkeypatch.chdir(odd)
    monkeypatch.setattr(sys, "argv", ["./hftagent", "audit"])  # relative: made absolute
    assert fixscript.hftagent_argv() == [str(prog)]
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/agent/cli.py"])  # python -m agent.cli
    if here.is_file():
        assert fixscript.hftagent_argv() == [str(here)]
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python3"))  # none beside it
    assert fixscript.hftagent_argv() == [str(tmp_path / "python3"), "-m", "agent.cli"]
    monkeypatch.setattr(sys, "argv", [str(prog), "audit"])
    path = tmp_path / "fix.sh"
    assert _audit("--root", str(FIXTURES / "vm-dev"), "--fix-script", str(path)).exit_code == 2
    _, commands = _script(path)
    call = next(c for c in commands if " tune apply " in c)
    assert call.startswith(f"'{prog}' tune apply ")
    res = subprocess.run(["sh", "-c", call], env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert res.returncode == 0 and (tmp_path / "ran").read_text() == f"{prog}\n"


def test_a_profile_file_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    src = Path(__file__).resolve().parents[1] / "tuning/profiles/hft-cpu.toml"
    (tmp_path / "mine.toml").write_text(src.read_text())
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "fix.sh"
    res = _audit("--root", str(FIXTURES / "vm-dev"), "--profile", "mine.toml", "--fix-script",
                 str(path))
    assert res.exit_code == 2, res.output
    argv = _tune_call(_script(path)[1])
    assert argv[argv.index("--profile") + 1] == str(tmp_path / "mine.toml")


def test_fix_script_boot_part_runs(tmp_path):
    """The boot part of a written script, run with /etc/default/grub pointed at a copy."""
    path = tmp_path / "fix.sh"
    assert _audit("--root", str(FIXTURES / "vm-dev"), "--fix-script", str(path)).exit_code == 2
    lines = path.read_text().splitlines()
    start = lines.index("if command -v grubby >/dev/null 2>&1; then")
    grub = tmp_path / "grub"
    grub.write_text(DEBIAN_GRUB)
    boot = "set -e\n" + "\n".join(lines[start:]).replace("/etc/default/grub", str(grub))
    env = _bin(tmp_path)
    (tmp_path / "bin/grubby").unlink()
    env["PATH"] = f"{tmp_path / 'bin'}:/usr/bin:/bin"
    if any(Path(d, "grubby").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has a real grubby")
    subprocess.run(["sh", "-c", boot], env=env, check=True)
    line = _args_of(_line_of(grub.read_text(), "GRUB_CMDLINE_LINUX_DEFAULT"))
    assert sorted(a.partition("=")[0] for a in line if "=" in a) == sorted(KEYS)


def test_fix_script_with_nothing_to_fix(tmp_path):
    path = tmp_path / "fix.sh"
    res = _audit("--root", str(FIXTURES / "synthetic-tuned"), "--profile", "bench",
                 "--fix-script", str(path))
    assert res.exit_code in (0, 2), res.output
    assert subprocess.run(["sh", "-n", str(path)]).returncode == 0


def _bad(tmp_path: Path, target: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    res = _audit("--root", str(FIXTURES / "vm-dev"), "--fix-script", target)
    assert res.exit_code == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hftagent: error: --fix-script"), res.output
    assert "Traceback" not in res.output and res.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_fix_script_refuses_an_existing_file(tmp_path):
    f = tmp_path / "fix.sh"
    f.write_text("keep me\n")
    _bad(tmp_path, str(f))
    assert f.read_text() == "keep me\n"


def test_fix_script_refuses_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    _bad(tmp_path, str(tmp_path / "d"))


@pytest.mark.parametrize("dangling", [True, False])
def test_fix_script_refuses_a_symlink(tmp_path, dangling):
    target = tmp_path / "target"
    if not dangling:
        target.write_text("keep me\n")
    (tmp_path / "link").symlink_to(target)
    _bad(tmp_path, str(tmp_path / "link"))
    assert not target.exists() if dangling else target.read_text() == "keep me\n"


def test_fix_script_refuses_a_missing_directory(tmp_path):
    _bad(tmp_path, str(tmp_path / "no/such/dir/fix.sh"))
    _bad(tmp_path, "")


def test_fix_script_refuses_an_unwritable_directory(tmp_path):
    """A directory the user may not write in: one line, exit 1, nothing created. Root writes
    anywhere, so as root the command runs as nobody (setpriv) on a 0555 directory."""
    import shutil
    import sys
    import tempfile
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir(mode=0o500)
        try:
            _bad(tmp_path, str(d / "fix.sh"))
            assert list(d.iterdir()) == []
        finally:
            d.chmod(0o700)
        return
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv to drop to another user")
    d = Path(tempfile.mkdtemp(prefix="hftagent-ro-"))
    try:
        d.chmod(0o555)
        res = subprocess.run(
            [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
             "-m", "agent.cli", "audit", "--root", str(FIXTURES / "vm-dev"), "--steal-window",
             "0", "--fix-script", str(d / "fix.sh")],
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
        assert res.returncode == 1, res.stderr
        assert res.stderr.splitlines() == [f"hftagent: error: --fix-script {d}/fix.sh: "
                                           f"cannot write in {d}: permission denied"]
        assert res.stdout == "" and list(d.iterdir()) == []
    finally:
        d.chmod(0o700)
        d.rmdir()


def test_exclusive_create_leaves_nothing_on_failure(tmp_path, monkeypatch):
    """A write that fails (ENOSPC at the fsync) removes the half-written script; an existing
    file is refused and left as it was (agent/outfile.py, exclusive)."""
    import errno as errno_

    from agent import fixscript
    from agent.outfile import OutputError

    path = tmp_path / "fix.sh"

    def full(fd):
        raise OSError(errno_.ENOSPC, os.strerror(errno_.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match="No space left"):
        fixscript.write_script(str(path), "#!/bin/sh\n")
    assert not path.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    path.write_text("x")
    with pytest.raises(OutputError, match="already exists"):
        fixscript.write_script(str(path), "#!/bin/sh\n")
    assert path.read_text() == "x"
    fixscript.write_script(str(tmp_path / "new.sh"), "#!/bin/sh\n")
    assert stat.S_IMODE((tmp_path / "new.sh").stat().st_mode) == 0o700


def test_script_text_sorts_each_kind_of_fix():
    """Straight from findings: a tune apply fix joins the one call (its --only, --isolate), a
    GPU finding maps to its tunable, a setting tune does not own stays marked with what it
    was, a template and a read-only hftagent command are comments with the absolute path."""
    from agent.fixscript import script_text
    from tuning.findings import Finding, Status

    def f(fid: str, fix: str, current: str = "x") -> Finding:
        return Finding(fid, fid.split(".")[0], fid, Status.WARN, current=current, fix=fix)

    text = script_text([
        f("wakeup.cpuidle", "hftagent tune apply --isolate --only isolate --cpus 2"),
        f("wakeup.pm_qos_resume_latency", "hftagent tune apply --profile hft-cpu --cpus 2 "
          "--only wakeup.pm_qos_resume_latency"),
        f("gpu.0.persistence", "nvidia-smi -i 0 -pm 1 (or enable nvidia-persistenced.service)"),
        f("cpu.smt", "echo off > /sys/devices/system/cpu/smt/control  (or kernel arg nosmt)",
          current="on"),
        f("process.tf_threads", "hftagent run --cpus 2 --intra 1 --inter 1 -- CMD"),
        f("noise.cpus", "hftagent cpus  (quiet candidates here: 3)"),
    ], ["test"], profile="/etc/my profile.toml", cpus="2", hftagent=["/opt/x y/hftagent"])
    lines = text.splitlines()
    call = shlex.split(next(ln for ln in lines if " tune apply " in ln and ln[0] != "#"))
    assert call == ["/opt/x y/hftagent", "tune", "apply", "--profile", "/etc/my profile.toml",
                    "--cpus", "2", "--isolate", "--only", "isolate", "--only",
                    "wakeup.pm_qos_resume_latency", "--only", "gpu.persistence"]
    assert "echo off > /sys/devices/system/cpu/smt/control  # or kernel arg nosmt; not undone " \
        "by tune rollback; to restore: echo on > /sys/devices/system/cpu/smt/control; it " \
        "was: on" in lines
    assert "#   start the service with: '/opt/x y/hftagent' run --cpus 2 --intra 1 --inter 1 " \
        "-- CMD" in lines
    assert "#   then: '/opt/x y/hftagent' cpus  # quiet candidates here: 3" in lines
    assert subprocess.run(["sh", "-n", "-c", text]).returncode == 0
