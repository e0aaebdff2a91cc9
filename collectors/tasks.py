"""Tasks (threads) with their identity, kernel flags and CPU affinity.

Files: /proc/PID/task/TID/stat (comm, state, flags = field 9, starttime = field 22) and
/proc/PID/task/TID/status (``Tgid``, ``Cpus_allowed_list``). A *task* is one scheduling entity
— a thread — because CPU affinity is per thread: moving a process means moving each of its
threads.

Identity: ``(tid, starttime)``. starttime is the task's start in clock ticks since boot, so a
TID the kernel has reused for a new task has another starttime; a key that names both never
mistakes the new task for the old one (``task:TID:STARTTIME``).

Flags (include/linux/sched.h): ``PF_KTHREAD`` 0x00200000 marks a kernel thread,
``PF_NO_SETAFFINITY`` 0x04000000 a task whose affinity userspace may not change (per-CPU
kthreads bound with kthread_bind, workqueue workers, IRQ threads): sched_setaffinity answers
EINVAL for them.

A task that cannot be read (it exited between the directory listing and the read) is left out:
it is not there any more. Equivalent: ``ps -eLo tid,comm,psr,flags; taskset -pc TID``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host
from collectors.parsers import parse_cpulist, parse_kv

PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000


@dataclass(frozen=True)
class StatIdentity:
    """The fields of /proc/.../stat that identify a task and say what kind it is."""

    tid: int
    comm: str
    state: str
    flags: int
    starttime: int


def parse_stat_identity(text: str) -> StatIdentity:
    """tid, comm, state, flags (field 9) and starttime (field 22) of a stat line. comm may hold
    spaces and parentheses: split on the last ')'. Raises ValueError."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        raise ValueError("bad stat line: no (comm)")
    rest = text[rpar + 2:].split()
    if len(rest) < 20:
        raise ValueError(f"bad stat line: {len(rest) + 2} fields")
    # rest[0] is field 3 (state); field N is rest[N - 3]
    return StatIdentity(int(text[:lpar]), text[lpar + 1:rpar], rest[0], int(rest[6]),
                        int(rest[19]))


@dataclass(frozen=True)
class Task:
    """One thread. ``affinity`` None: its status could not be parsed."""

    tid: int
    pid: int            # thread group (process) id
    comm: str
    state: str
    flags: int
    starttime: int
    affinity: list[int] | None
    status_path: Path   # under the Host's procfs (where a tree copy keeps the affinity)

    @property
    def kthread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    @property
    def no_setaffinity(self) -> bool:
        return bool(self.flags & PF_NO_SETAFFINITY)

    @property
    def key(self) -> str:
        return task_key(self.tid, self.starttime)

    @property
    def name(self) -> str:
        """How a list names it: ``comm[tid]`` (``ksoftirqd/1[24]``)."""
        return f"{self.comm}[{self.tid}]"


def task_key(tid: int, starttime: int) -> str:
    return f"task:{tid}:{starttime}"


def parse_task_key(key: str) -> tuple[int, int] | None:
    """(tid, starttime) of a ``task:TID:STARTTIME`` key, or None when it is not one."""
    parts = key.split(":")
    if len(parts) != 3 or parts[0] != "task" or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return int(parts[1]), int(parts[2])


def read_task(host: Host, d: Path, pid: int | None = None) -> Task | None:
    """The task whose /proc directory is ``d`` (``/proc/PID/task/TID`` or ``/proc/TID``);
    None when it is gone or unreadable."""
    st = host.read(d / "stat")
    if not st.ok:
        return None
    try:
        ident = parse_stat_identity(st.value)
    except ValueError:
        return None
    status = host.read(d / "status")
    if not status.ok:
        return None
    kv = parse_kv(status.value, ":")
    try:
        affinity = parse_cpulist(kv["Cpus_allowed_list"])
    except (KeyError, ValueError):
        affinity = None
    tgid = kv.get("Tgid", "")
    owner = int(tgid) if tgid.isdigit() else (pid if pid is not None else ident.tid)
    return Task(ident.tid, owner, ident.comm, ident.state, ident.flags, ident.starttime,
                affinity, d / "status")


def task_dirs(host: Host, pids: Iterable[int] | None = None) -> Iterator[tuple[int, Path]]:
    """(pid, task directory) of every thread of every process (or of ``pids``). A process
    without a task/ directory (a capture that kept only the main thread) is its own task."""
    for pid in (host.pids() if pids is None else sorted(pids)):
        base = host.proc(pid)
        tids = [n for n in host.listdir(base / "task") if n.isdigit()]
        if not tids:
            if host.exists(base / "stat"):
                yield pid, base
            continue
        for t in tids:
            yield pid, base / "task" / t


def tasks(host: Host, pids: Iterable[int] | None = None) -> list[Task]:
    """Every readable task (thread) under procfs, or those of ``pids``, by tid."""
    out = [t for pid, d in task_dirs(host, pids) if (t := read_task(host, d, pid)) is not None]
    return sorted(out, key=lambda t: t.tid)


def find_task(host: Host, tid: int, starttime: int | None = None) -> Task | None:
    """The task ``tid`` (and, when given, with that starttime: otherwise the TID was reused);
    None when it is gone. /proc/TID answers for any thread on a live kernel. A tree copy keeps
    threads under /proc/PID/task/TID, where :func:`tasks` found them: that directory is read
    first there (a process's /proc/PID/status is its own copy in a tree)."""
    t = None
    if not host.live:
        for pid in host.pids():
            d = host.proc(pid, "task", tid)
            if host.exists(d):
                t = read_task(host, d, pid)
                break
    if t is None:
        t = read_task(host, host.proc(tid))
    if t is None or t.tid != tid or (starttime is not None and t.starttime != starttime):
        return None
    return t
