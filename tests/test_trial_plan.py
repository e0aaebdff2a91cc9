"""agent/trial/arms.py: the arms, --levers, which guest supports halt-polling, the interleaved
schedule and its estimate; agent/trial/levers.py: the probe child's command line."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from agent.trial import arms
from agent.trial.arms import TrialError, make_plan, parse_levers, schedule
from agent.trial.levers import block_argv
from collectors.host import Host
from tests.isotree import iso_tree


def test_every_arm_once_per_round_shuffled_per_round_and_seeded():
    names = ["none", "isolate", "pm-qos", "keep-awake", "keep-awake-busy"]
    plan = schedule(names, 6, seed=3)
    assert len(plan) == 6 and all(sorted(r) == sorted(names) for r in plan)
    assert len({tuple(r) for r in plan}) > 1  # not one order repeated
    assert schedule(names, 6, seed=3) == plan  # the printed seed reruns it
    assert schedule(names, 6, seed=4) != plan


def test_levers_option():
    assert parse_levers(None) == ["pm-qos", "keep-awake", "keep-awake-busy", "halt-poll"]
    assert parse_levers("keep-awake-busy, pm-qos,pm-qos") == ["keep-awake-busy", "pm-qos"]
    for bad in ("turbo", "", ",", "isolate", "none"):
        with pytest.raises(TrialError, match="--levers"):
            parse_levers(bad)


def test_the_reference_arms_always_run_and_halt_polling_only_where_the_guest_has_it(tmp_path):
    root = iso_tree(tmp_path / "t")  # vm-dev: haltpoll driver, guest_halt_poll_ns 0
    host = Host(root)
    p = make_plan(host, [1], ["pm-qos", "halt-poll"], rounds=2, block_s=1, rate=100, seed=1,
                  workload="numpy")
    assert [a.name for a in p.arms] == ["none", "isolate", "pm-qos", "halt-poll"]
    assert p.unsupported == {}
    (root / "sys/devices/system/cpu/cpuidle/current_driver").write_text("acpi_idle\n")
    p = make_plan(host, [1], ["halt-poll"], rounds=1, block_s=1, rate=100, seed=1,
                  workload="numpy")
    assert [a.name for a in p.arms] == ["none", "isolate"]
    assert p.unsupported["halt-poll"].startswith("cpuidle driver acpi_idle, not haltpoll")
    for f in (root / "sys/module/haltpoll/parameters").iterdir():
        f.unlink()
    (root / "sys/module/haltpoll/parameters").rmdir()
    p = make_plan(host, [1], ["halt-poll"], rounds=1, block_s=1, rate=100, seed=1,
                  workload="numpy")
    assert "the guest has no haltpoll cpuidle driver" in p.unsupported["halt-poll"]


@pytest.mark.parametrize("kw,msg", [({"rounds": 0}, "--rounds 0"),
                                    ({"block_s": 0}, "--block-s 0"),
                                    ({"rate": -1}, "--rate -1"),
                                    ({"rate": 1, "block_s": 1}, "less than two calls")])
def test_settings_that_cannot_run_are_refused(tmp_path, kw, msg):
    host = Host(iso_tree(tmp_path / "t"))
    args = {"rounds": 1, "block_s": 1.0, "rate": 100.0} | kw
    with pytest.raises(TrialError, match=msg):
        make_plan(host, [1], [], seed=1, workload="numpy", **args)


def test_estimate_and_samples_of_the_defaults_fit_three_minutes(tmp_path):
    """The defaults (6 arms where the guest has halt-polling) finish in ≤ 3 minutes by the
    estimate, and give each arm enough calls to claim P99.9 (agent/stats.py)."""
    from agent import stats
    p = make_plan(Host(iso_tree(tmp_path / "t")), [1], parse_levers(None), rounds=3,
                  block_s=8.0, rate=280.0, seed=1, workload="numpy")
    assert len(p.arms) == 6 and p.blocks() == 18
    assert p.estimate_s() <= 180
    assert p.samples_per_arm() >= stats.required_samples(99.9)
    assert p.to_dict()["order"] == p.order and len(p.order) == 3


def test_the_probe_child_goes_through_hftagent_run_with_the_arm_flags(tmp_path):
    busy = next(a for a in arms.ARMS if a.name == "keep-awake-busy")
    argv = block_argv(busy, [1], 2.0, 250.0, "numpy", Path("/tmp/x/samples.npy"))
    i = argv.index("run")
    assert argv[i:i + 5] == ["run", "--cpus", "1", "--intra", "1"]
    j = argv.index("--")
    assert argv[i + 5:j] == ["--keep-awake", "--keep-awake-loop", "busy"]
    assert argv[j + 2:j + 4] == ["-m", "agent.trial.worker"]
    assert "--rate 250 --seconds 2" in shlex.join(argv)
    plain = next(a for a in arms.ARMS if a.name == "halt-poll")
    assert plain.lever and not plain.run_flags  # held by the trial, not by `run`
