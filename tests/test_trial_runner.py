"""agent/trial/runner.py and levers.py: every lever is undone after each block and on every way
out (a failed block, an exception, SIGTERM/SIGINT, a stop half-way through the isolation's
apply), with fake levers; and the real isolation and halt-polling levers on a tree copy
(nothing here writes the real /proc or /sys)."""

from __future__ import annotations

import contextlib
import os
import signal

import numpy as np
import pytest

from agent.commands.common import Stopped, stop_on_signals
from agent.trial.arms import Arm, TrialError, TrialPlan, schedule
from agent.trial.levers import BlockError, halt_polling, isolation
from agent.trial.runner import Hooks, run_trial
from collectors.host import Host
from tests.isotree import IsoSim, iso_tree
from tests.treecopy import diff, snapshot

ISO = Arm("isolate", "isolation alone", isolate=True)
HP = Arm("halt-poll", "isolation + halt-polling", isolate=True, halt_poll_ns=200_000)
NONE = Arm("none", "none")


class Fake:
    """Levers that log what they hold; ``block`` does what the test asks of each call."""

    def __init__(self, on_block=None) -> None:
        self.log: list[str] = []
        self.on_block = on_block or (lambda arm: None)

    @contextlib.contextmanager
    def _held(self, name: str):
        self.log.append(f"+{name}")
        try:
            yield
        finally:
            self.log.append(f"-{name}")

    def hooks(self) -> Hooks:
        def block(arm: Arm):
            self.log.append(f"block {arm.name}")
            self.on_block(arm)
            return np.arange(10, dtype=np.int64), ["hftagent run: keep-awake spinner on CPU 1 "
                                                    "stopped: thread 1 waited"]
        return Hooks(isolate=lambda: self._held("iso"),
                     halt_poll=lambda ns: self._held(f"hp{ns}"), block=block)

    def held(self) -> int:
        return sum(1 if e.startswith("+") else -1 if e.startswith("-") else 0
                   for e in self.log)


def plan(arms: list[Arm], rounds: int = 2) -> TrialPlan:
    p = TrialPlan([1], arms, {}, rounds, 1.0, 100.0, 5, "numpy")
    p.order = schedule([a.name for a in arms], rounds, 5)
    return p


def test_each_block_holds_its_arms_levers_and_undoes_them_in_reverse_order():
    f = Fake()
    seen: list[str] = []
    run = run_trial(plan([NONE, ISO, HP]), f.hooks(), seen.append)
    assert run.blocks_done == 6 and len(seen) == 6 and seen[0].startswith("round 1/2, block 1/6")
    i = f.log.index("block halt-poll")
    assert f.log[i - 2:i + 3] == ["+iso", "+hp200000", "block halt-poll", "-hp200000", "-iso"]
    assert f.held() == 0
    assert {k: len(v) for k, v in run.samples.items()} == {"none": 2, "isolate": 2,
                                                          "halt-poll": 2}
    assert len(run.stopped["halt-poll"]) == 2  # the spinner's stop line, per block


def test_a_failed_block_is_reported_for_its_arm_and_the_run_goes_on():
    def on_block(arm: Arm) -> None:
        if arm.name == "halt-poll":
            raise BlockError("the halt-poll block's probe failed: boom")
    f = Fake(on_block)
    run = run_trial(plan([ISO, HP]), f.hooks())
    assert run.errors == {"halt-poll": ["the halt-poll block's probe failed: boom"] * 2}
    assert "halt-poll" not in run.samples and len(run.samples["isolate"]) == 2
    assert f.held() == 0


def test_an_exception_in_a_block_undoes_what_is_held_and_stops_the_run():
    def on_block(arm: Arm) -> None:
        raise RuntimeError("unexpected")
    f = Fake(on_block)
    with pytest.raises(RuntimeError):
        run_trial(plan([HP]), f.hooks())
    assert f.log == ["+iso", "+hp200000", "block halt-poll", "-hp200000", "-iso"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_in_a_block_undo_every_lever(sig):
    """The command runs the trial under stop_on_signals: the signal unwinds the block through
    its levers' undo; a second signal during the undo cannot cut it short."""
    def on_block(arm: Arm) -> None:
        os.kill(os.getpid(), sig)

    f = Fake(on_block)
    hooks = f.hooks()
    orig = hooks.isolate

    @contextlib.contextmanager
    def isolate_again():
        with orig():
            try:
                yield
            finally:
                os.kill(os.getpid(), sig)  # a second Ctrl-C while rolling back: ignored
                f.log.append("rollback finished")
    hooks.isolate = isolate_again
    with pytest.raises(Stopped) as ei, stop_on_signals():
        run_trial(plan([HP]), hooks)
    assert ei.value.signum == sig
    assert f.log == ["+iso", "+hp200000", "block halt-poll", "-hp200000", "rollback finished",
                     "-iso"]


def _tree(tmp_path, monkeypatch):
    root = iso_tree(tmp_path / "t")
    sim = IsoSim()
    monkeypatch.setattr("tuning.tunables.base.default_writer", lambda: sim)
    return root, Host(root), sim


def test_isolation_is_tunes_apply_and_rollback_and_leaves_nothing(tmp_path, monkeypatch):
    root, host, sim = _tree(tmp_path, monkeypatch)
    before = snapshot(root)
    sd = tmp_path / "state" / "trial"
    with isolation(host, [1], sd):
        assert (sd / "journal.json").exists()
        assert diff(before, snapshot(root))  # something moved
    assert not (sd / "journal.json").exists()
    assert diff(before, snapshot(root)) == []
    with pytest.raises(ValueError), isolation(host, [1], sd):
        raise ValueError("an error inside the block")
    assert not (sd / "journal.json").exists() and diff(before, snapshot(root)) == []


def test_a_stop_half_way_through_the_apply_is_rolled_back(tmp_path, monkeypatch):
    root, host, sim = _tree(tmp_path, monkeypatch)
    before = snapshot(root)
    fired = []

    def stop_once(path) -> None:
        if not fired:
            fired.append(str(path))
            raise Stopped(signal.SIGTERM)
    sim.after_write = stop_once
    sd = tmp_path / "state" / "trial"
    with pytest.raises(Stopped), isolation(host, [1], sd):
        pytest.fail("the block must not start")
    assert fired and diff(before, snapshot(root)) == []
    assert not (sd / "journal.json").exists()


def test_halt_polling_is_written_back_to_the_value_it_had(tmp_path, monkeypatch):
    root, host, sim = _tree(tmp_path, monkeypatch)
    p = root / "sys/module/haltpoll/parameters/guest_halt_poll_ns"
    p.write_text("7\n")
    td = tmp_path / "state" / "trial"
    with halt_polling(host, 200_000, td):
        assert p.read_text() == "200000\n"
        assert (td / "guest_halt_poll_ns.original").read_text() == "7\n"  # saved first
    assert p.read_text() == "7\n" and not (td / "guest_halt_poll_ns.original").exists()
    with pytest.raises(KeyboardInterrupt), halt_polling(host, 200_000, td):
        raise KeyboardInterrupt
    assert p.read_text() == "7\n"
    p.unlink()
    with pytest.raises(TrialError, match="not readable"), halt_polling(host, 1, td):
        pass


def test_halt_polling_a_killed_run_left_is_restored_by_the_next(tmp_path, monkeypatch):
    """SIGKILL in a halt-poll block: nothing runs the write-back, but the original was saved
    before the write; the next tune try's first step writes it back."""
    from agent.trial.levers import restore_halt_polling
    root, host, sim = _tree(tmp_path, monkeypatch)
    p = root / "sys/module/haltpoll/parameters/guest_halt_poll_ns"
    p.write_text("7\n")
    td = tmp_path / "state" / "trial"
    cm = halt_polling(host, 200_000, td)
    cm.__enter__()  # ... and never left: the process was killed
    assert p.read_text() == "200000\n"
    assert restore_halt_polling(host, td) == 7
    assert p.read_text() == "7\n" and restore_halt_polling(host, td) is None
    cm.gen.close()  # (the killed run's frame, finalised here rather than at collection)


def test_a_task_that_joined_the_isolated_cpuset_is_named_and_the_next_try_rolls_back(
        tmp_path, monkeypatch):
    """A task that joins the cpuset during the block (`hftagent run` joins it while it
    exists) keeps rollback from removing it: one error naming the task; once it has left,
    the journal's rollback (the next tune try's first step) finishes the job."""
    from agent.trial.levers import roll_back
    root, host, sim = _tree(tmp_path, monkeypatch)
    before = snapshot(root)
    sd = tmp_path / "state" / "trial"
    procs = root / "sys/fs/cgroup/cpuset/hftagent-isolated/cgroup.procs"
    monkeypatch.setattr("agent.trial.levers.JOINED_WAIT_S", 0.0)
    with pytest.raises(TrialError) as ei, isolation(host, [1], sd):
        saved = procs.read_text()
        procs.write_text(saved + "907\n")
    msg = str(ei.value)
    assert msg.startswith("isolation not fully rolled back: ")
    assert "task 907 (pinned) joined the isolated cpuset" in msg
    assert (sd / "journal.json").exists()
    procs.write_text(saved)
    roll_back(host, sd)
    assert not (sd / "journal.json").exists() and diff(before, snapshot(root)) == []


def test_the_rollback_waits_for_a_task_that_joined_to_leave(tmp_path, monkeypatch):
    from agent.trial.levers import roll_back
    root, host, sim = _tree(tmp_path, monkeypatch)
    before = snapshot(root)
    sd = tmp_path / "state" / "trial"
    procs = root / "sys/fs/cgroup/cpuset/hftagent-isolated/cgroup.procs"
    monkeypatch.setattr("agent.trial.levers.JOINED_WAIT_S", 0.0)
    with pytest.raises(TrialError), isolation(host, [1], sd):
        saved = procs.read_text()
        procs.write_text(saved + "907\n")
    naps: list[float] = []

    def nap(s: float) -> None:  # the task leaves during the second wait
        naps.append(s)
        if len(naps) == 2:
            procs.write_text(saved)
    roll_back(host, sd, wait_s=10, sleep=nap)
    assert naps == [0.5, 0.5]
    assert not (sd / "journal.json").exists() and diff(before, snapshot(root)) == []


def test_the_rollback_retries_a_cgroup_that_a_dying_task_still_holds(tmp_path, monkeypatch):
    """A task that exited but is not yet reaped is in no cgroup.procs, yet keeps the cpuset
    populated (rmdir: EBUSY): the rollback is tried again for DYING_WAIT_S although no task
    is listed (a CI run with a busy loop on each CPU left the cgroup and its two files)."""
    from types import SimpleNamespace

    import tuning.apply
    from agent.trial import levers
    root, host, sim = _tree(tmp_path, monkeypatch)
    before = snapshot(root)
    sd = tmp_path / "state" / "trial"
    procs = root / "sys/fs/cgroup/cpuset/hftagent-isolated/cgroup.procs"
    monkeypatch.setattr("agent.trial.levers.JOINED_WAIT_S", 0.0)
    monkeypatch.setattr("agent.trial.levers.DYING_WAIT_S", 0.0)
    with pytest.raises(TrialError), isolation(host, [1], sd):
        saved = procs.read_text()
        procs.write_text(saved + "907\n")
    procs.write_text(saved)     # listed nowhere now, but "still dying" for two more tries
    real, tries = tuning.apply.rollback, []

    def dying(ctx, state_dir):
        tries.append(1)
        if len(tries) <= 2:
            return SimpleNamespace(ok=False, remaining=3, journal=state_dir / "journal.json")
        return real(ctx, state_dir)
    monkeypatch.setattr(tuning.apply, "rollback", dying)
    naps: list[float] = []
    monkeypatch.setattr("agent.trial.levers.DYING_WAIT_S", 3.0)
    levers.roll_back(host, sd, wait_s=15, sleep=naps.append)
    assert naps == [0.5, 0.5] and len(tries) == 3
    assert not (sd / "journal.json").exists() and diff(before, snapshot(root)) == []
    # past DYING_WAIT_S with no task listed: the one error, the journal kept
    with pytest.raises(TrialError), isolation(host, [1], sd):
        procs.write_text(saved + "907\n")
    procs.write_text(saved)
    tries.clear()
    def held(ctx, state_dir):
        tries.append(1)
        return SimpleNamespace(ok=False, remaining=3, journal=state_dir / "journal.json")
    monkeypatch.setattr(tuning.apply, "rollback", held)
    naps.clear()
    with pytest.raises(TrialError, match="3 entries left"):
        levers.roll_back(host, sd, wait_s=15, sleep=naps.append)
    assert naps == [0.5] * 6 and (sd / "journal.json").exists()


def test_a_stop_during_the_rollback_still_rolls_everything_back(tmp_path, monkeypatch):
    """SIGTERM arriving while a block's isolation is being rolled back: the rollback is run
    again to the end (the stop ignores further signals), then the stop goes on."""
    root, host, sim = _tree(tmp_path, monkeypatch)
    before = snapshot(root)
    sd = tmp_path / "state" / "trial"
    fired = []

    def stop_in_rollback(path) -> None:
        if rolling and not fired:
            fired.append(str(path))
            raise Stopped(signal.SIGTERM)
    rolling = False
    sim.after_write = stop_in_rollback
    with pytest.raises(Stopped), isolation(host, [1], sd):
        rolling = True
    assert fired and diff(before, snapshot(root)) == []
    assert not (sd / "journal.json").exists()


def test_one_tune_try_at_a_time(tmp_path):
    """A second tune try would roll the first one's isolation back as a stopped run's: it is
    refused while the first holds the lock, and runs once it is released."""
    from agent.trial.levers import LOCKNAME, one_at_a_time
    host = Host()
    sd = tmp_path / "state"
    with one_at_a_time(host, sd):
        with pytest.raises(TrialError, match="another hftagent tune try is running"), \
                one_at_a_time(host, sd):
            pass
    with one_at_a_time(host, sd):
        pass
    tree = Host(iso_tree(tmp_path / "t"))  # by default in ROOT/run/hftagent
    with one_at_a_time(tree):
        assert (tmp_path / "t/run/hftagent" / LOCKNAME).is_file()
    assert (sd / LOCKNAME).is_file() and not (sd / LOCKNAME).is_symlink()
    (sd / LOCKNAME).unlink()
    (sd / LOCKNAME).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TrialError, match=LOCKNAME), one_at_a_time(host, sd):
        pass
    assert not (tmp_path / "elsewhere").exists()
