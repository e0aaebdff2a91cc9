"""tuning/trial_state.py and the audit's wake-up recommendation from it (tuning/checks/
wakeup.py): the lever the last tune try on this box picked (same CPUs, kernel and boot
arguments), else `hftagent tune try`; on tree copies, nothing written outside them."""

from __future__ import annotations

import json
import os
import shlex

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors.host import Host
from tests.isotree import iso_tree
from tuning.audit import run_audit
from tuning.findings import Status
from tuning.profiles import load_profile
from tuning.trial_state import FILENAME, last_trial, lever_fix, state_file, write_state

runner = CliRunner()


def _isolated(tmp_path):
    root = iso_tree(tmp_path / "t")
    (root / "sys/devices/system/cpu/isolated").write_text("1\n")
    return root


def _cpuidle(root):
    rep = run_audit(Host(root), load_profile("hft-cpu"), "1", families=["virt", "wakeup"])
    return {f.id: f for f in rep.findings}["wakeup.cpuidle"]


@pytest.mark.parametrize("winner,fix", [
    ("pm-qos", "hftagent run --cpus 1 --pm-qos 0 -- CMD"),
    ("keep-awake-busy", "hftagent run --cpus 1 --keep-awake --keep-awake-loop busy -- CMD"),
    ("halt-poll", "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns")])
def test_the_audit_recommends_the_lever_the_last_trial_picked(tmp_path, winner, fix):
    root = _isolated(tmp_path)
    assert _cpuidle(root).fix == "hftagent tune try --cpus 1"
    assert "no hftagent tune try on this box yet" in _cpuidle(root).current
    path = write_state(Host(root), {"cpus": [1], "winner": winner, "clear": True,
                                    "created_utc": "2026-12-04T20:00:00+00:00"})
    assert path == root / "run/hftagent" / FILENAME
    assert os.stat(path).st_mode & 0o777 == 0o600
    c = _cpuidle(root)
    assert c.status == Status.WARN and c.fix == fix
    assert f"tune try of 2026-12-04T20:00:00+00:00 picked {winner}" in c.current


def test_the_recommended_run_line_is_accepted_by_run(tmp_path):
    root = _isolated(tmp_path)
    write_state(Host(root), {"cpus": [1], "winner": "keep-awake-busy", "clear": False})
    c = _cpuidle(root)
    assert "not a clear win" in c.current
    argv = shlex.split(c.fix)
    i = argv.index("--")
    res = runner.invoke(get_app(), argv[1:i] + ["--dry-run", "--root", str(root), "--",
                                                "true"])
    assert res.exit_code == 0, res.output
    assert "keep-awake spinner on CPU 1 (SCHED_IDLE, busy loop)" in res.stdout


@pytest.mark.parametrize("winner", ["isolate", "none"])
def test_no_lever_beat_isolation_means_no_lever_fix(tmp_path, winner):
    root = _isolated(tmp_path)
    write_state(Host(root), {"cpus": [1], "winner": winner, "clear": True})
    c = _cpuidle(root)
    assert c.fix == "" and "no wake-up lever beat isolation alone here" in c.current


def test_a_trial_without_a_winner_asks_for_a_longer_one(tmp_path):
    root = _isolated(tmp_path)
    write_state(Host(root), {"cpus": [1], "winner": None, "clear": False})
    c = _cpuidle(root)
    assert c.fix == "hftagent tune try --cpus 1" and "found no winner" in c.current


@pytest.mark.parametrize("change,why", [
    ("cpus", "the last tune try measured CPU 0"),
    ("kernel", "another kernel"),
    ("cmdline", "another boot command line")])
def test_a_trial_of_other_cpus_another_kernel_or_boot_does_not_count(tmp_path, change, why):
    root = _isolated(tmp_path)
    host = Host(root)
    write_state(host, {"cpus": [0] if change == "cpus" else [1], "winner": "pm-qos"})
    if change == "kernel":
        (root / "proc/sys/kernel/osrelease").write_text("9.9.9-other\n")
    elif change == "cmdline":
        p = root / "proc/cmdline"
        p.write_text(p.read_text().strip() + " isolcpus=1\n")
    t, reason = last_trial(host, [1])
    assert t is None and why in reason
    assert _cpuidle(root).fix == "hftagent tune try --cpus 1"


def test_a_state_file_that_is_not_ours_is_not_read(tmp_path):
    root = _isolated(tmp_path)
    host = Host(root)
    path = state_file(host)
    path.parent.mkdir(parents=True, mode=0o700)
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps({"format": "hftagent.tune-try", "cpus": [1],
                                 "winner": "pm-qos"}))
    path.symlink_to(other)
    t, why = last_trial(host, [1])
    assert t is None and "cannot read it" in why
    path.unlink()
    path.write_text("{not json")
    assert "not JSON" in last_trial(host, [1])[1]
    path.write_text(json.dumps({"format": "something else"}))
    assert "not a tune try result" in last_trial(host, [1])[1]
    path.write_text(json.dumps({"format": "hftagent.tune-try", "cpus": [1], "winner": 3,
                                "kernel": None, "cmdline": None}))
    os.chmod(path, 0o666)
    assert "writable by another user" in last_trial(host, [1])[1]
    os.chmod(path, 0o600)
    assert "no hftagent tune try" not in last_trial(host, [1])[1]
    assert _cpuidle(root).fix == "hftagent tune try --cpus 1"  # never a traceback


def test_lever_fix_names_the_isolation_step_unless_the_cpus_are_isolated():
    assert lever_fix("pm-qos", [2, 3]) == ("hftagent tune apply --isolate --only isolate "
                                            "--cpus 2-3; then hftagent run --cpus 2-3 --pm-qos "
                                            "0 -- CMD")
    assert lever_fix("pm-qos", [2], isolated=True) == "hftagent run --cpus 2 --pm-qos 0 -- CMD"
    assert lever_fix("isolate", [2]) == "hftagent tune apply --isolate --only isolate --cpus 2"
    assert lever_fix("isolate", [2], isolated=True) == ""
    assert lever_fix("none", [2]) == ""
