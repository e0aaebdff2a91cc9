"""The levers of ``tune try``, each a context that undoes itself on every way out (a normal
end, an exception, :class:`agent.commands.common.Stopped` from SIGTERM/SIGINT).

- :func:`isolation`: tune's own ``apply --isolate --only isolate`` and ``rollback``, in
  process (tuning/apply.py), journalled in a state directory of its own (``trial`` under
  tune's): a rollback of it never touches what ``tune apply`` journalled. Equivalent:
  ``hftagent tune apply --isolate --only isolate --cpus C --state-dir D`` then
  ``hftagent tune rollback --state-dir D``.
- :func:`halt_polling`: /sys/module/haltpoll/parameters/guest_halt_poll_ns written for the
  block (through tune's writer: no symlink out of sysfs) and written back to the value read
  before. Equivalent: ``echo 200000 > .../guest_halt_poll_ns``.
- PM QoS and keep-awake are not held here: ``hftagent run --pm-qos 0 --keep-awake ...`` holds
  them for the probe child (:mod:`.worker`) alone, and the kernel drops them when it exits
  (tuning/launcher.py); :func:`run_block` kills the child on every way out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from collectors.host import Host
from collectors.parsers import format_cpulist

from .arms import Arm, TrialError


class BlockError(TrialError):
    """One block's probe failed (that arm is reported with the error; the others go on)."""


TRIAL_DIR = "trial"
HALT_POLL_KEY = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"  # collectors.wakeup's  # under tune's state directory: the isolation journal of tune try


def trial_state_dir(tune_state_dir: Path) -> Path:
    return tune_state_dir / TRIAL_DIR


LOCKNAME = "tune-try.lock"  # in ROOT/run/hftagent: one tune try at a time on a box


@contextlib.contextmanager
def one_at_a_time(host: Host, lock_dir: Path | None = None) -> Iterator[None]:
    """An exclusive lock held for the whole trial, in ROOT/run/hftagent whatever
    ``--state-dir`` says (the isolated cpuset is one per box): a second ``tune try`` would
    measure under the first one's levers, or take its isolation journal for a stopped run's
    and roll it back under it. The directory is opened as tune's journal opens it (no symlink
    out of a ``--root`` tree, owned by root or us, not writable by others); the lock file is
    never a symlink. ``lock_dir``: another directory (tests)."""
    tune_state_dir = lock_dir if lock_dir is not None else host.run_dir("hftagent")
    import fcntl
    import stat

    from tuning.apply import state_beneath
    from tuning.safepath import UnsafePath, open_dir

    try:
        dfd = open_dir(tune_state_dir, create=True,
                       beneath=state_beneath(host, tune_state_dir))
    except (OSError, UnsafePath) as exc:
        raise TrialError(f"cannot use state directory {tune_state_dir}: {exc}") from None
    assert dfd is not None
    try:
        fd = os.open(LOCKNAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dfd)
    except OSError as exc:
        os.close(dfd)
        raise TrialError(f"{tune_state_dir}/{LOCKNAME}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TrialError(f"{tune_state_dir}/{LOCKNAME} is not a regular file: refused")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TrialError(f"another hftagent tune try is running on this box (it holds "
                             f"{tune_state_dir}/{LOCKNAME})") from None
        yield
    finally:
        os.close(fd)
        os.close(dfd)


def _iso_context(host: Host, cpus: list[int] | None):
    from tuning.apply import build_context
    from tuning.profiles import load_profile
    from tuning.tunables.isolate import with_isolation

    prof = with_isolation(load_profile("hft-cpu"))
    spec = format_cpulist(cpus) if cpus is not None else None
    return prof, build_context(host, prof, spec, want_gpu=False)


JOINED_WAIT_S = 15.0  # how long a rollback waits for tasks that joined the cpuset to leave
# how long it retries with no task listed: a task that has exited but is not yet reaped is no
# longer in cgroup.procs, yet keeps the cgroup populated (rmdir: EBUSY) until its parent
# waits for it (a probe worker of the block; seen in a CI run with a busy loop on each CPU)
DYING_WAIT_S = 3.0


def roll_back(host: Host, state_dir: Path, *, wait_s: float | None = None,
              sleep: Callable[[float], None] = time.sleep) -> None:
    """``tune rollback --state-dir`` of the trial's journal. A task that joined the isolated
    cpuset during the block keeps it from being removed: the rollback is tried again every
    0.5 s while such a task is there, for up to ``wait_s`` (a short-lived worker leaves), and
    for :data:`DYING_WAIT_S` in any case (an exited task not yet reaped is listed nowhere but
    still holds the cgroup). Then
    TrialError when entries are left (drift, a value that could not be written back, a task
    still in the cpuset): the user must see it."""
    from tuning.apply import rollback

    _prof, ctx = _iso_context(host, None)
    rep = rollback(ctx, state_dir)
    waited, limit = 0.0, JOINED_WAIT_S if wait_s is None else wait_s
    while not rep.ok and waited < limit and (waited < DYING_WAIT_S or _joined(host)):
        sleep(0.5)
        waited += 0.5
        rep = rollback(ctx, state_dir)
    if not rep.ok:
        raise TrialError(f"isolation not fully rolled back: {rep.remaining} entr"
                         f"{'y' if rep.remaining == 1 else 'ies'} left in {rep.journal}"
                         f"{_joined(host)}; hftagent tune rollback --state-dir {state_dir} "
                         "once they have left (the next tune try does it first)")


def _joined(host: Host) -> str:
    """Who keeps the isolated cpuset from being removed: tasks that joined it during the
    block (`hftagent run` and the probe workers join it while it exists)."""
    from tuning.tunables.isolate import isolated_cpuset

    iso = isolated_cpuset(host)
    r = host.read(iso.procs) if iso is not None else None
    pids = (r.value or "").split() if r is not None else []
    if not pids:
        return ""
    names = []
    for pid in pids[:3]:
        c = host.read(host.proc(pid, "comm"))
        names.append(f"{pid} ({(c.value or '?').strip()})")
    more = f" and {len(pids) - 3} more" if len(pids) > 3 else ""
    return (f": task {', '.join(names)}{more} joined the isolated cpuset {iso.path} during the "
            "block, so it cannot be removed")


@contextlib.contextmanager
def isolation(host: Host, cpus: list[int], state_dir: Path) -> Iterator[None]:
    """The CPUs isolated for the block, rolled back after it whatever happens (the rollback
    also runs when the apply itself fails or is interrupted half-way: the journal holds each
    original before its write)."""
    from tuning.apply import FAILED, apply_plan, make_plan

    try:
        prof, ctx = _iso_context(host, cpus)
        plan = make_plan(ctx, ["isolate"], None)
        rep = apply_plan(ctx, plan, state_dir, profile=prof.name)
        failed = [o for o in rep.outcomes if o.result == FAILED]
        if failed:
            raise TrialError(f"isolation failed: {failed[0].change.target}: "
                             f"{' '.join(failed[0].message.split())}")
        yield
    finally:
        _finish(lambda: roll_back(host, state_dir))


HALT_POLL_SAVED = "guest_halt_poll_ns.original"  # in the trial's state directory


@contextlib.contextmanager
def halt_polling(host: Host, value_ns: int, trial_dir: Path) -> Iterator[None]:
    """guest_halt_poll_ns at ``value_ns`` for the block, then the value it had. The original
    is saved in ``trial_dir`` (durably, before the write) and the file removed once it is
    written back, so a run killed outright (SIGKILL) leaves it for the next ``tune try`` to
    restore first (:func:`restore_halt_polling`)."""
    from collectors import wakeup as wk
    from tuning.tunables import base

    before = wk.halt_poll_ns(host)
    if not before.ok:
        raise TrialError(f"guest_halt_poll_ns is not readable ({before.reason})")
    path = base.contained(host, HALT_POLL_KEY)
    w = base.default_writer()  # tune's writer: `echo VALUE > FILE`
    _save(host, trial_dir, before.value)
    try:
        w.write(path, str(value_ns))
        yield
    finally:
        _finish(lambda: (w.write(path, str(before.value)), _drop(host, trial_dir)))


def _in_dir(host: Host, trial_dir: Path) -> int:
    from tuning.apply import state_beneath
    from tuning.safepath import open_dir
    dfd = open_dir(trial_dir, create=True, beneath=state_beneath(host, trial_dir))
    assert dfd is not None
    return dfd


def _save(host: Host, trial_dir: Path, value: int) -> None:
    """The original value, written whole (O_EXCL|O_NOFOLLOW, fsync'd) before the lever's."""
    dfd = _in_dir(host, trial_dir)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(HALT_POLL_SAVED, dir_fd=dfd)  # restore_halt_polling ran before: stale
        fd = os.open(HALT_POLL_SAVED, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            os.write(fd, f"{value}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _drop(host: Host, trial_dir: Path) -> None:
    dfd = _in_dir(host, trial_dir)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(HALT_POLL_SAVED, dir_fd=dfd)
    finally:
        os.close(dfd)


def restore_halt_polling(host: Host, trial_dir: Path) -> int | None:
    """A guest_halt_poll_ns that a killed ``tune try`` left set: written back from the saved
    original, the file removed. Returns the value restored, or None when nothing was left."""
    from tuning.tunables import base

    dfd = _in_dir(host, trial_dir)
    try:
        try:
            fd = os.open(HALT_POLL_SAVED, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=dfd)
        except FileNotFoundError:
            return None
        try:
            text = os.read(fd, 64).decode(errors="replace").strip()
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    if not text.isdigit():
        raise TrialError(f"{trial_dir}/{HALT_POLL_SAVED} does not hold a value: {text!r}")
    base.default_writer().write(base.contained(host, HALT_POLL_KEY), text)
    _drop(host, trial_dir)
    return int(text)


def _finish(undo: Callable[[], None]) -> None:
    """Run ``undo``; when SIGTERM/SIGINT (a KeyboardInterrupt: agent.commands.common.Stopped)
    cuts it short, run it again — the stop ignores any further signal, tune's rollback and a
    write of the old value are idempotent — and then let the stop go on."""
    try:
        undo()
    except KeyboardInterrupt:
        undo()
        raise


def hftagent_argv(*args: str) -> list[str]:
    """argv of this hftagent (the interpreter running it: a venv's hftagent may not be on
    root's PATH)."""
    return [sys.executable, "-c", "from agent.cli import main; main()", *args]


def block_argv(arm: Arm, cpus: list[int], seconds: float, rate: float, workload: str,
               out: Path) -> list[str]:
    """The probe child of one block: ``hftagent run --cpus C [lever flags] -- python -m
    agent.trial.worker ...`` (the real path a user's service takes)."""
    return hftagent_argv("run", "--cpus", format_cpulist(cpus), "--intra", "1",
                         *arm.run_flags, "--", sys.executable, "-m", "agent.trial.worker",
                         "--rate", f"{rate:g}", "--seconds", f"{seconds:g}",
                         "--workload", workload, "--out", str(out))


def run_block(arm: Arm, cpus: list[int], seconds: float, rate: float, workload: str,
              timeout_s: float | None = None):
    """One block's latencies (int64 ns, response time from each intended start) and the
    lines the child wrote on stderr (a keep-awake spinner that stopped itself says so there).
    The child is killed on every way out. TrialError when it fails."""
    import numpy as np

    tmp = Path(tempfile.mkdtemp(prefix="hftagent-try-"))  # 0700, a random name
    out = tmp / "samples.npy"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[2])] + [p for p in
                                                       [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.Popen(block_argv(arm, cpus, seconds, rate, workload, out),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = proc.communicate(timeout=timeout_s or (2 * seconds + 60))
        if proc.returncode != 0:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            raise BlockError(f"the {arm.name} block's probe failed: "
                             f"{lines[-1] if lines else f'exit status {proc.returncode}'}")
        with open(out, "rb") as f:
            return np.load(f, allow_pickle=False), err.splitlines()
    except subprocess.TimeoutExpired:
        raise BlockError(f"the {arm.name} block's probe did not finish in time") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            out.unlink()
        with contextlib.suppress(OSError):
            tmp.rmdir()
