"""The guardian: our kernel state goes with the process that made it, SIGKILL included.

A process that creates kernel state (a tracefs instance ``instances/hftagent-<pid>``, a
uprobe group ``hftagent_<pid>``) starts one guardian first (:func:`guard`, once per process
and tracefs mount; ~20 ms, off every hot path). It is this file run by the same interpreter
with ``-I -S`` (no site, no environment, no current directory on the path: a few standard
library modules, ~10 MB resident, no import of the agent), started without a shell, in its own session
(a terminal's Ctrl-C goes to watch, which cleans up itself), cwd ``/``, stdin/stdout/stderr
``/dev/null``, and holding no descriptor of its parent's but the read end of the parent's
lifeline pipe (collectors/native.py, :func:`collectors.native.lifeline`; the same pattern
as the C helpers).

It blocks in ``read`` on that pipe (no CPU, no wake-ups while idle). The read returns 0
only when no process holds the write end any more: its parent is gone, however it ended.
Then, within a second (:data:`RETRY_S`), it

1. stops its parent's instances (``tracing_on`` 0);
2. disables its parent's uprobe group in every instance where it is enabled (the kernel
   refuses to remove an enabled event: EBUSY) and removes each of its events from
   ``uprobe_events`` — opened ``O_WRONLY|O_APPEND`` only: a plain open for writing
   truncates the global file, which removes every uprobe event on the box, other tools' too;
3. removes its parent's instances (``rmdir``);

and exits. It never outlives its job: it exits at once when the pipe reads EOF, and on a
bad argument. SIGINT, SIGTERM and SIGHUP are ignored: a service stop signals the whole
cgroup, and the guardian must stay until watch itself is gone.

What it may touch is passed explicitly and checked before it waits: the tracefs mount (an
absolute, normalised path to a directory, not a link, with ``instances/``; its device is
checked again through an ``O_NOFOLLOW`` descriptor before anything is written), the group,
which must be ``hftagent_<parent pid>``, and the instances, which must be
``hftagent-<parent pid>``, ``hftagent-<parent pid>-wake`` or ``hftagent-<parent pid>-calls``.
Nothing else is written.

A guardian killed together with its parent (``kill -9`` of the whole process group, the OOM
killer) leaves the state behind; the next start of watch, cpus (or anything that opens an
:class:`agent.trace.EventSource` or defines :class:`agent.trace.uprobe.Uprobes`) removes it
(:func:`agent.trace.instance.remove_stale`, :func:`agent.trace.uprobe.remove_stale`;
:func:`clean_stale` runs both). That rule is where a guardian is also a witness: a live
process with a group ``hftagent_<pid>`` is its creator when it has a guardian of its own
(:func:`guardian_of`) or its instance was created after it started.

Usage (what :func:`guard` runs; exit 0 all removed, 1 something left, 2 bad arguments)::

    python -I -S agent/trace/guardian.py PARENT_PID LIFELINE_FD TRACEFS \\
        [--group hftagent_PID] [--instance hftagent-PID[-wake|-calls]]...
"""

from __future__ import annotations

import errno
import os
import re
import select
import signal
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the parent's side; the guardian itself imports none of these
    import subprocess
    from collections.abc import Callable
    from pathlib import Path

    from collectors.host import Host

GROUP_PREFIX = "hftagent_"       # agent.trace.uprobe.PREFIX
INSTANCE_PREFIX = "hftagent-"    # agent.trace.instance.PREFIX
WAKE_SUFFIX = "-wake"            # agent.trace.instance.WAKE_SUFFIX
CALLS_SUFFIX = "-calls"          # agent.trace.instance.CALLS_SUFFIX
RETRY_S = 0.8                    # an instance busy for a moment (a reader's open file)
SCRIPT = os.path.realpath(__file__)
_SCRIPT_TAIL = b"/agent/trace/guardian.py"   # any install's guardian
USAGE = ("usage: guardian.py PARENT_PID LIFELINE_FD TRACEFS [--group hftagent_PID] "
         "[--instance hftagent-PID[-wake|-calls]]...")

# (our pid, tracefs) -> the guardian started for it
_STARTED: dict[tuple[int, str], subprocess.Popen] = {}


# -- the parent's side -----------------------------------------------------------------------
def guard(tracefs: Path) -> str | None:
    """Start this process's guardian for ``tracefs`` unless one runs already; call it before
    the first instance or uprobe group is created. None when one runs, else one line saying
    why not (the state then waits for the next start's :func:`clean_stale`)."""
    import subprocess

    pid = os.getpid()
    key = (pid, str(tracefs))
    running = _STARTED.get(key)
    if running is not None and running.poll() is None:
        return None
    from collectors.native import lifeline  # the one lifeline pipe per process
    r = lifeline()
    if not _STARTED:
        import atexit
        atexit.register(_let_go)
    argv = [sys.executable, "-I", "-S", str(SCRIPT), str(pid), str(r), str(tracefs),
            "--group", f"{GROUP_PREFIX}{pid}", "--instance", f"{INSTANCE_PREFIX}{pid}",
            "--instance", f"{INSTANCE_PREFIX}{pid}{WAKE_SUFFIX}",
            "--instance", f"{INSTANCE_PREFIX}{pid}{CALLS_SUFFIX}"]
    try:
        _STARTED[key] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, close_fds=True, pass_fds=(r,), cwd="/",
            start_new_session=True)
    except OSError as exc:
        return f"no guardian for the kernel state: {exc.strerror or exc}"
    return None


def _let_go() -> None:
    """At our exit: a guardian outlives us by design (it acts once we are gone, and init
    reaps it), so its Popen is marked done rather than left to warn that it still runs."""
    for p in _STARTED.values():
        if p.poll() is None:
            p.returncode = 0


def guardian_of(host: Host, pid: int) -> bool:
    """Whether ``pid`` has a guardian of its own: a child running ``.../agent/trace/
    guardian.py`` (this install's or another's) for it, owned by root or by us (an
    unprivileged process cannot pose as one). /proc has no children list without
    CONFIG_PROC_CHILDREN, so every process's ``stat`` is read: only called for a live
    process with a group and no instance of its own (rare)."""
    for c in host.pids():
        st = host.read(host.proc(c, "stat")).value
        try:
            if st is None or int(st[st.rindex(")") + 2:].split()[1]) != pid:
                continue
        except (ValueError, IndexError):
            continue
        argv = (host.read_bytes(host.proc(c, "cmdline")).value or b"").split(b"\0")
        at = next((i for i, a in enumerate(argv) if a.endswith(_SCRIPT_TAIL)), None)
        try:
            owner = os.stat(host.proc(c)).st_uid
        except OSError:
            continue
        if at is not None and argv[at + 1:at + 2] == [str(pid).encode()] and \
                owner in (0, os.geteuid()):
            return True
    return False


def clean_stale(host: Host) -> list[str]:
    """Remove what killed hftagents left (their uprobe groups, then their instances) where
    tracefs is mounted and ours to write; a note per removal or refusal. Nothing where
    tracefs is absent or not ours (not root): a start never fails for it."""
    from .instance import _Refused, find_tracefs, remove_stale
    from .uprobe import remove_stale as remove_stale_uprobes
    try:
        root = find_tracefs(host)
    except _Refused:
        return []
    if root is None or not os.access(root / "instances", os.W_OK):
        return []
    notes = remove_stale_uprobes(host, root)
    remove_stale(host, root / "instances", notes)
    return notes


# -- the guardian's side ---------------------------------------------------------------------
class Job:
    """What one guardian may remove (checked by :func:`parse`)."""

    def __init__(self, ppid: int, fd: int, tracefs: str, dev: int) -> None:
        self.ppid = ppid
        self.fd = fd
        self.tracefs = tracefs
        self.dev = dev
        self.groups: list[str] = []
        self.instances: list[str] = []


def parse(argv: list[str]) -> Job:
    """The arguments, checked; ValueError with the reason."""
    if len(argv) < 3 or len(argv) % 2 == 0:
        raise ValueError("wrong number of arguments")
    ppid_s, fd_s, tracefs = argv[:3]
    if not (ppid_s.isdigit() and fd_s.isdigit()) or int(ppid_s) < 2:
        raise ValueError("PARENT_PID and LIFELINE_FD must be numbers")
    ppid, fd = int(ppid_s), int(fd_s)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        raise ValueError("LIFELINE_FD is not a pipe")
    if not os.path.isabs(tracefs) or os.path.normpath(tracefs) != tracefs:
        raise ValueError("TRACEFS must be an absolute, normalised path")
    st = os.lstat(tracefs)
    if not stat.S_ISDIR(st.st_mode) or not stat.S_ISDIR(
            os.lstat(os.path.join(tracefs, "instances")).st_mode):
        raise ValueError(f"{tracefs} is not a tracefs mount (no instances/)")
    job = Job(ppid, fd, tracefs, st.st_dev)
    allowed = {"--group": (job.groups, {f"{GROUP_PREFIX}{ppid}"}),
               "--instance": (job.instances, {f"{INSTANCE_PREFIX}{ppid}",
                                              f"{INSTANCE_PREFIX}{ppid}{WAKE_SUFFIX}",
                                              f"{INSTANCE_PREFIX}{ppid}{CALLS_SUFFIX}"})}
    for opt, name in zip(argv[3::2], argv[4::2], strict=True):
        if opt not in allowed or name not in allowed[opt][1]:
            raise ValueError(f"{opt} {name!r}: not one of the parent's ({ppid})")
        allowed[opt][0].append(name)
    return job


def _write(tfd: int, rel: str, value: str, flags: int = 0) -> None:
    fd = os.open(rel, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags, dir_fd=tfd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _events_of(tfd: int, group: str) -> list[str]:
    """The names of ``group``'s events in ``uprobe_events``."""
    try:
        fd = os.open("uprobe_events", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tfd)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as fh:
        text = fh.read().decode("utf-8", "replace")
    pat = re.compile(r"^[pr]:" + re.escape(group) + r"/(\S+)\s")
    return [m.group(1) for m in map(pat.match, (line + " " for line in text.splitlines()))
            if m]


def _disable(tfd: int, group: str) -> None:
    """``group`` disabled at the top level and in every instance (0 to the group's
    ``enable``: all of its events)."""
    try:
        ifd = os.open("instances", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=tfd)
    except OSError:
        names = []
    else:
        try:
            names = [f"instances/{n}" for n in os.listdir(ifd)]
        finally:
            os.close(ifd)
    for inst in [".", *names]:
        try:
            _write(tfd, f"{inst}/events/{group}/enable", "0")
        except OSError:
            pass  # not there: nothing of ours enabled in it


def clean_once(job: Job) -> list[str]:
    """One pass over the job (module docstring); what was left, one item each."""
    try:
        tfd = os.open(job.tracefs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []   # unmounted since: nothing of ours can be there
    left: list[str] = []
    try:
        if os.fstat(tfd).st_dev != job.dev:
            return []   # not the tracefs we were given: write nothing
        for inst in job.instances:
            try:
                _write(tfd, f"instances/{inst}/tracing_on", "0")
            except OSError:
                pass
        for group in job.groups:
            names = _events_of(tfd, group)
            if names:
                _disable(tfd, group)
            for name in names:
                try:
                    _write(tfd, "uprobe_events", f"-:{group}/{name}\n", os.O_APPEND)
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        left.append(f"{group}/{name}: {exc.strerror}")
        for inst in job.instances:
            try:
                os.rmdir(f"instances/{inst}", dir_fd=tfd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                left.append(f"{inst}: {exc.strerror}")
    finally:
        os.close(tfd)
    return left


def clean(job: Job, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """:func:`clean_once` until nothing is left or :data:`RETRY_S` has passed."""
    deadline = clock() + RETRY_S
    while True:
        left = clean_once(job)
        if not left or clock() > deadline:
            return left
        time.sleep(0.05)


def _at_eof(fd: int) -> bool:
    """Whether the lifeline reads EOF now (no process holds its write end)."""
    return bool(select.select([fd], [], [], 0)[0]) and not os.read(fd, 64)


def _wait_for_eof(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 64):
                return
        except InterruptedError:  # pragma: no cover - PEP 475 retries it
            continue


def main(argv: list[str]) -> int:
    try:
        job = parse(argv)
    except (ValueError, OSError) as exc:
        print(f"hftagent guardian: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    if os.getppid() != job.ppid and not _at_eof(job.fd):
        # reparented with the lifeline still held: whoever started us is not the process
        # named (a parent that died before this check, a zombie yet or not, closed it)
        print(f"hftagent guardian: {job.ppid} is not our parent", file=sys.stderr)
        return 2
    _wait_for_eof(job.fd)
    os.close(job.fd)
    left = clean(job)
    if left:
        print(f"hftagent guardian: left: {', '.join(left)}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
