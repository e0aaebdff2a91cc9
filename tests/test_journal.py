"""The journal: atomic format, corrupt and stale journals, and the kill-at-every-write crash test.

Crash test: apply runs in a forked child that dies with ``os._exit`` (no cleanup, no finally
blocks, like SIGKILL) at the k-th step — after a journal temp file is written but before its
rename, after the journal is saved, after each target write — for every k. A rollback in the
parent must then restore the tree byte for byte. The same for a rollback killed half-way.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from collectors.host import Host
from tests.treecopy import KernelSim, diff, make_synthetic, snapshot
from tuning.apply import apply_plan, build_context, make_plan, rollback, status
from tuning.journal import FORMAT, Journal, JournalError, StaleJournal, load, locked
from tuning.profiles import load_profile

# In the crash tests one write changes the value and *then* fails (EIO after sysfs took the
# bytes), in apply and in rollback alike: that target must be journalled and restored too.
FLAKY = {"intel_pstate/min_perf_pct": errno.EIO}


def _ctx(root: Path, profile: str = "bench", flaky: bool = False):
    ctx = build_context(Host(root), load_profile(profile), "1")
    ctx.writer = KernelSim(fail_after=FLAKY if flaky else None)
    return ctx


class Crash(Exception):
    pass


def _count_steps(root: Path, fn) -> int:
    steps = []
    fn(_ctx(root, flaky=True), steps.append)
    return len(steps)


def _in_child_dying_at(k: int, root: Path, fn) -> int:
    """Run fn(ctx, checkpoint) in a forked child that os._exit()s at its k-th checkpoint."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            n = 0

            def cp(step: str) -> None:
                nonlocal n
                n += 1
                if n == k:
                    os._exit(137)

            fn(_ctx(root, flaky=True), cp)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - never return into pytest from the child
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)


def _apply(ctx, cp):
    apply_plan(ctx, make_plan(ctx), ctx.host.run_dir("hftagent"), checkpoint=cp)


def _rollback(ctx, cp):
    rollback(ctx, ctx.host.run_dir("hftagent"), checkpoint=cp)


def test_kill_at_every_apply_step_then_rollback_restores_everything(tmp_path):
    proto = make_synthetic(tmp_path / "proto", ncpus=2)
    pristine = snapshot(proto)
    total = _count_steps(make_synthetic(tmp_path / "count", ncpus=2), _apply)
    assert total >= 3 * 20  # temp-written, journaled, written per target
    for k in range(1, total + 1):
        root = make_synthetic(tmp_path / f"k{k}", ncpus=2)
        assert _in_child_dying_at(k, root, _apply) == 137
        ctx = _ctx(root, flaky=True)
        rb = rollback(ctx, ctx.host.run_dir("hftagent"))
        assert rb.remaining == 0, (k, [i.to_dict() for i in rb.items])
        assert diff(pristine, snapshot(root)) == [], f"killed at step {k}"
        # the dead child's temp file (killed between write and rename) is cleaned up too
        leftovers = [p.name for p in ctx.host.run_dir("hftagent").iterdir()
                     if p.name not in ("lock",)]
        assert leftovers == [], k


def test_kill_at_every_rollback_step_then_rollback_again(tmp_path):
    proto = make_synthetic(tmp_path / "proto", ncpus=2)
    pristine = snapshot(proto)

    def applied(name: str) -> Path:
        root = make_synthetic(tmp_path / name, ncpus=2)
        ctx = _ctx(root, flaky=True)
        apply_plan(ctx, make_plan(ctx), ctx.host.run_dir("hftagent"))
        return root

    total = _count_steps(applied("count"), _rollback)
    assert total > 20
    for k in range(1, total + 1):
        root = applied(f"k{k}")
        assert _in_child_dying_at(k, root, _rollback) == 137
        ctx = _ctx(root, flaky=True)
        assert rollback(ctx, ctx.host.run_dir("hftagent")).remaining == 0
        assert diff(pristine, snapshot(root)) == [], f"rollback killed at step {k}"


def test_journal_file_format_and_atomic_save(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx, only=["memory"]), sd, profile="hft-cpu")
    data = json.loads((sd / "journal.json").read_text())
    assert data["format"] == FORMAT and data["boot_id"] == "synthetic-boot-1"
    assert data["profile"] == "hft-cpu" and data["cpus"] == "1"
    sw = [e for e in data["entries"] if e["target"] == "/proc/sys/vm/swappiness"][0]
    assert (sw["original"], sw["written"], sw["tunable"]) == ("60", "1", "memory.swappiness")
    assert [e["seq"] for e in data["entries"]] == sorted(e["seq"] for e in data["entries"])
    assert not [p for p in sd.iterdir() if p.name.endswith(".tmp")]
    assert oct(os.stat(sd / "journal.json").st_mode & 0o777) == "0o600"


def test_journal_lives_under_the_root_tree(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    assert ctx.host.run_dir("hftagent") == root / "run/hftagent"


def _applied(tmp_path) -> tuple[Path, Path, dict]:
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx), sd)
    return root, sd, snapshot(root, exclude=())


CORRUPT = {
    "truncated": lambda t: t[: len(t) // 2],
    "garbage": lambda t: "\x00\x13garbage{{{",
    "empty": lambda t: "",
    "not-utf8": None,
    "wrong-format": lambda t: t.replace("hftagent-journal/1", "something/9"),
    "entries-not-list": lambda t: json.dumps({**json.loads(t), "entries": {}}),
    "entry-missing-original": lambda t: json.dumps(
        {**json.loads(t), "entries": [{k: v for k, v in json.loads(t)["entries"][0].items()
                                       if k != "original"}]}),
    "target-off-allowlist": lambda t: t.replace("/proc/sys/vm/swappiness", "/etc/shadow"),
    "unknown-tunable": lambda t: t.replace('"memory.swappiness"', '"memory.bogus"'),
    "no-mounts": lambda t: json.dumps({k: v for k, v in json.loads(t).items()
                                       if k != "sysfs"}),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_journal_clear_error_nothing_changed(tmp_path, case):
    root, sd, _ = _applied(tmp_path)
    j = sd / "journal.json"
    if CORRUPT[case] is None:
        j.write_bytes(b"\xff\xfe\x00bad")
    else:
        j.write_text(CORRUPT[case](j.read_text()))
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(JournalError, match="journal .*(corrupt|not a|malformed|not a target|"
                                           "entry list|unknown tunable|does not say which)"):
        rollback(ctx, sd)
    with pytest.raises(JournalError):
        apply_plan(ctx, make_plan(ctx), sd)
    with pytest.raises(JournalError):
        status(ctx, sd)
    assert snapshot(root, exclude=()) == before


def _with_entries(j: Path, *entries: dict) -> None:
    data = json.loads(j.read_text())
    base = {"time": "", "detail": ""}
    data["entries"] = [{**base, **e, "seq": i} for i, e in enumerate(entries, 1)]
    j.write_text(json.dumps(data))


@pytest.mark.parametrize("bad,match", [
    ({"tunable": "memory.swappiness", "target": "service:irqbalance", "original": "active",
      "written": "inactive"}, "not a target of memory.swappiness"),
    ({"tunable": "kernel.timer_migration", "target": "/proc/sys/kernel/timer_migration",
      "original": "7", "written": "0"}, "not a valid kernel.timer_migration value"),
    ({"tunable": "cpu.governor", "target": "/sys/devices/system/cpu/cpu0/cpufreq/"
      "scaling_governor", "original": "../../x", "written": "performance"}, "not a valid"),
])
def test_journal_is_validated_as_a_whole_before_the_first_write(tmp_path, bad, match):
    """Rollback runs in reverse: a bad first entry used to be found only after the valid later
    ones had been written back."""
    root, sd, _ = _applied(tmp_path)
    ok = {"tunable": "memory.swappiness", "target": "/proc/sys/vm/swappiness", "original": "77",
          "written": "1"}
    _with_entries(sd / "journal.json", bad, ok)
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(JournalError, match=match):
        rollback(ctx, sd, force=True)
    with pytest.raises(JournalError, match=match):
        status(ctx, sd)
    assert snapshot(root, exclude=()) == before


def test_every_tunable_owns_only_allowlisted_targets():
    from tuning.allowlist import WRITABLE
    from tuning.tunables import all_tunables
    from tuning.tunables.memory import Sysctl

    owned = [p for t in all_tunables() for p in t.patterns]
    owned += ["/proc/sys/" + t.name.replace(".", "/") for t in all_tunables()
              if isinstance(t, Sysctl)]
    assert sorted(owned) == sorted(WRITABLE)  # each allowlisted target has exactly one owner


def test_journal_from_an_earlier_boot_is_reported_not_replayed(tmp_path):
    root, sd, _ = _applied(tmp_path)
    (root / "proc/sys/kernel/random/boot_id").write_text("synthetic-boot-2\n")  # "rebooted"
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(StaleJournal, match="earlier boot.*synthetic-boot-1.*synthetic-boot-2"):
        rollback(ctx, sd)
    with pytest.raises(StaleJournal):
        apply_plan(ctx, make_plan(ctx), sd)
    st = status(ctx, sd)
    assert st.stale and st.items == []
    assert snapshot(root, exclude=()) == before
    rb = rollback(ctx, sd, discard_stale=True)
    assert "discarded" in rb.note and not (sd / "journal.json").exists()
    # only the journal went: the (post-"reboot") kernel values were not touched
    assert diff(before, snapshot(root, exclude=())) == ["run/hftagent/journal.json"]


def test_journal_of_another_tree_is_refused(tmp_path):
    """A journal written against tree A (say with --state-dir) is never checked against, or
    replayed onto, tree B — B standing in for the live kernel."""
    root, sd, _ = _applied(tmp_path)
    data = json.loads((sd / "journal.json").read_text())
    assert (data["procfs"], data["sysfs"]) == (str(root.resolve() / "proc"),
                                               str(root.resolve() / "sys"))
    other = make_synthetic(tmp_path / "other")
    before = snapshot(other, exclude=())
    ctx = _ctx(other, "hft-cpu")
    for call in (lambda: rollback(ctx, sd, force=True), lambda: status(ctx, sd),
                 lambda: apply_plan(ctx, make_plan(ctx), sd)):
        with pytest.raises(JournalError, match="written against procfs .*not this host"):
            call()
    assert snapshot(other, exclude=()) == before
    assert rollback(_ctx(root, "hft-cpu"), sd).remaining == 0  # its own tree: fine


def test_record_keeps_first_original(tmp_path):
    j = Journal(tmp_path / "journal.json", "b", procfs="/t/proc", sysfs="/t/sys")
    j.record("memory.swappiness", "/proc/sys/vm/swappiness", "60", "1")
    j.record("memory.swappiness", "/proc/sys/vm/swappiness", "1", "5")
    assert [(e.original, e.written) for e in j.entries] == [("60", "5")]
    j.save()
    assert load(tmp_path).entries[0].original == "60"
    j.drop("/proc/sys/vm/swappiness")
    j.save()
    assert not (tmp_path / "journal.json").exists() and load(tmp_path) is None


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    dead, alive = tmp_path / f".journal.json.{_dead_pid()}.tmp", tmp_path / ".journal.json.1.tmp"
    for p in (dead, alive):
        p.write_text("{half")
    other = tmp_path / "notes.tmp"
    other.write_text("x")
    with locked(tmp_path):
        pass
    assert not dead.exists() and alive.exists() and other.exists()


def test_save_never_writes_through_a_planted_temp_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / f".journal.json.{os.getpid()}.tmp").symlink_to(victim)
    j = Journal(sd / "journal.json", "b", procfs="/t/proc", sysfs="/t/sys")
    j.record("memory.swappiness", "/proc/sys/vm/swappiness", "60", "1")
    j.save()
    assert victim.read_text() == "precious\n"
    assert load(sd).entries[0].original == "60"
    assert oct(os.stat(sd / "journal.json").st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
def test_journal_save_error_is_a_journal_error_and_nothing_is_written(tmp_path, monkeypatch,
                                                                       err):
    import tuning.journal as jmod

    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = _ctx(root, "hft-cpu")

    def fsync(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(jmod.os, "fsync", fsync)
    with pytest.raises(JournalError, match=f"cannot save journal .*{os.strerror(err)}"):
        apply_plan(ctx, make_plan(ctx, only=["memory"]), ctx.host.run_dir("hftagent"))
    assert diff(before, snapshot(root)) == []  # the write the entry covered never happened
    assert not [p for p in ctx.host.run_dir("hftagent").iterdir() if p.name != "lock"]


def test_lock_file_error_is_a_journal_error(tmp_path, monkeypatch):
    import tuning.journal as jmod

    real_open = os.open

    def ro_open(path, flags, *a):
        if str(path).endswith("/lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(jmod.os, "open", ro_open)
    with pytest.raises(JournalError, match="cannot use state directory .*Read-only file system"):
        with locked(tmp_path / "sd"):
            pass


def test_lock_refuses_a_second_writer(tmp_path):
    with locked(tmp_path), pytest.raises(JournalError, match="holds"):
        pid = os.fork()
        if pid == 0:
            try:
                with locked(tmp_path):
                    os._exit(0)
            except JournalError:
                os._exit(7)
            os._exit(1)
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 7
        raise JournalError("another hftagent tune apply/rollback holds it")
