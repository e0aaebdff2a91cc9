"""Tree copies for the isolation and wake-up tests, and a kernel simulation for their files.

:func:`iso_tree` copies the vm-dev capture (tests/fixtures/vm-dev) and adds what it lacks,
labelled SYNTHETIC in ``SYNTHETIC-ISOLATION``: a few tasks with stat/status files (kernel
threads bound to CPU 1, workqueue workers, an IRQ thread, user processes with threads, a
zombie, a task already in the isolated cpuset), the unbound workqueue masks, a cgroup v1 or
v2 cpuset hierarchy and a mount table, per-CPU PM QoS files and the haltpoll parameters.

:class:`IsoSim` is the kernel's side of a write on such a tree (KernelSim for the rest):
cpumask files keep the kernel's width, cpuset lists are normalised, a cgroup's mkdir makes
its files (and rmdir refuses a cgroup with tasks, EBUSY), cgroup.subtree_control takes
+name/-name, a task's status file is taken whole (a tree keeps a task's affinity there),
pm_qos_resume_latency_us takes "n/a" as the kernel does.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from collectors.parsers import format_cpulist, parse_cpulist, parse_cpumask
from collectors.tasks import PF_KTHREAD, PF_NO_SETAFFINITY
from tests.treecopy import KernelSim, _mask_at_width, copy_fixture

KT, NOAFF = PF_KTHREAD, PF_KTHREAD | PF_NO_SETAFFINITY

# (pid, comm, flags, affinity, threads, state, cpuset): SYNTHETIC tasks
TASKS = (
    (900, "supervisor", 0x400100, "0-1", (900, 901), "S", "/"),
    (902, "kswapd0", KT, "0-1", (902,), "S", "/"),
    (903, "ksoftirqd/1", NOAFF, "1", (903,), "S", "/"),
    (904, "kworker/1:0", NOAFF, "1", (904,), "I", "/"),
    (905, "kworker/u4:0", NOAFF, "0-1", (905,), "I", "/"),
    (906, "irq/25-ACPI:Ged", KT, "1", (906,), "S", "/"),
    (907, "pinned", 0x400100, "1", (907,), "S", "/"),
    (908, "zombie", 0x400100, "0-1", (908,), "Z", "/"),
    (909, "inference", 0x400100, "1", (909,), "S", "/hftagent-isolated"),
    (910, "housekeeper", 0x400100, "0", (910,), "S", "/"),
)
MOVABLE = ("supervisor[900]", "supervisor[901]", "kswapd0[902]", "pinned[907]")
PER_CPU = ("ksoftirqd/1[903]", "kworker/1:0[904]")


def _w(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n")


def stat_line(tid: int, comm: str, state: str, flags: int, starttime: int) -> str:
    rest = ["0"] * 50
    rest[0], rest[1], rest[6], rest[19] = state, "1", str(flags), str(starttime)
    return f"{tid} ({comm}) " + " ".join(rest)


def status_text(pid: int, tid: int, comm: str, state: str, affinity: str) -> str:
    mask = format(sum(1 << c for c in parse_cpulist(affinity)), "x")
    return (f"Name:\t{comm}\nUmask:\t0022\nState:\t{state}\nTgid:\t{pid}\nPid:\t{tid}\n"
            f"PPid:\t1\nThreads:\t1\nCpus_allowed:\t{mask}\nCpus_allowed_list:\t{affinity}\n"
            "Mems_allowed_list:\t0\n")


def add_tasks(root: Path, tasks=TASKS) -> None:
    for pid, comm, flags, aff, threads, state, cgroup in tasks:
        base = root / "proc" / str(pid)
        for i, tid in enumerate(threads):
            d = base / "task" / str(tid)
            _w(d / "stat", stat_line(tid, comm, state, flags, 1000 + tid))
            _w(d / "status", status_text(pid, tid, comm, state, aff))
            _w(d / "cpuset", cgroup)
            if i == 0:
                _w(base / "stat", stat_line(tid, comm, state, flags, 1000 + tid))
                _w(base / "status", status_text(pid, tid, comm, state, aff))
                _w(base / "comm", comm)
                _w(base / "cpuset", cgroup)


def iso_tree(dst: Path, cgroup: str = "v1", osrelease: str | None = None,
             workqueue: bool = True, tasks=TASKS) -> Path:
    """vm-dev + SYNTHETIC tasks, workqueues, cpusets (``cgroup``: "v1", "v2" or "none")."""
    root = copy_fixture("vm-dev", dst)
    _w(root / "SYNTHETIC-ISOLATION", "tasks, workqueues, cgroups, PM QoS and haltpoll files "
       "added by tests/isotree.py (not a capture)")
    add_tasks(root, tasks)
    if osrelease:
        _w(root / "proc/sys/kernel/osrelease", osrelease)
    if workqueue:
        wq = root / "sys/devices/virtual/workqueue"
        for rel in ("cpumask", "writeback/cpumask", "blkcg_punt_bio/cpumask",
                    "scsi_tmf_0/cpumask"):
            _w(wq / rel, "3")
        _w(wq / "cpumask_isolated", "0")
    mounts = ["sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0",
              "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0"]
    cg = root / "sys/fs/cgroup"
    if cgroup == "v1":
        mounts += ["cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0",
                   "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0"]
        for f, v in (("cpuset.cpus", "0-1"), ("cpuset.mems", "0"),
                     ("cpuset.sched_load_balance", "1"), ("cpuset.effective_cpus", "0-1"),
                     ("cgroup.procs", "1"), ("tasks", "1")):
            _w(cg / "cpuset" / f, v)
        _w(cg / "unified/cgroup.controllers", "")
        _w(cg / "unified/cgroup.procs", "1")
    elif cgroup == "v2":
        mounts = ["sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0",
                  "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0"]
        for f, v in (("cgroup.controllers", "cpuset cpu io memory pids"),
                     ("cgroup.subtree_control", "cpu memory pids"), ("cgroup.procs", "1"),
                     ("cpuset.cpus.effective", "0-1"), ("cpuset.mems.effective", "0")):
            _w(cg / f, v)
    _w(root / "proc/self/mounts", "\n".join(mounts))
    for c in (0, 1):
        _w(root / f"sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us", "0")
    for name, v in (("guest_halt_poll_ns", "0"), ("guest_halt_poll_grow", "2")):
        _w(root / "sys/module/haltpoll/parameters" / name, v)
    return root


class IsoSim(KernelSim):
    """KernelSim plus the files runtime isolation and PM QoS write (module docstring)."""

    def write(self, path: Path, text: str) -> None:
        for suffix, err in self.fail.items():
            if str(path).endswith(suffix):
                raise OSError(err, os.strerror(err), str(path))
        name = path.name
        value = text.strip()
        if name == "cpumask":
            try:
                cpus = parse_cpumask(value)
            except ValueError:
                raise OSError(errno.EINVAL, "bad mask", str(path)) from None
            new = _mask_at_width(cpus, path.read_text()) + "\n"
        elif name in ("cpuset.cpus", "cpuset.mems"):
            try:
                new = format_cpulist(parse_cpulist(value)) + "\n"
            except ValueError:
                raise OSError(errno.EINVAL, "bad list", str(path)) from None
            if not value and (path.parent / "cgroup.procs").read_text().strip():
                raise OSError(errno.ENOSPC, "cpuset has tasks", str(path))
        elif name == "cpuset.sched_load_balance":
            if value not in ("0", "1"):
                raise OSError(errno.EINVAL, "bad flag", str(path))
            new = value + "\n"
        elif name == "cpuset.cpus.partition":
            if value not in ("member", "root", "isolated"):
                raise OSError(errno.EINVAL, "bad partition", str(path))
            new = value + "\n"
        elif name == "cgroup.subtree_control":
            have = path.read_text().split()
            for w in value.split():
                if w[:1] == "+" and w[1:] not in have:
                    have.append(w[1:])
                elif w[:1] == "-" and w[1:] in have:
                    have.remove(w[1:])
                elif w[:1] not in "+-":
                    raise OSError(errno.EINVAL, "bad control word", str(path))
            order = (path.parent / "cgroup.controllers").read_text().split()
            new = " ".join(c for c in order if c in have) + "\n"
        elif name == "status" or name == "pm_qos_resume_latency_us":
            if name == "pm_qos_resume_latency_us" and not (value == "n/a" or value.isdigit()):
                raise OSError(errno.EINVAL, "bad latency", str(path))
            new = (text if name == "status" else value) + "\n"
        else:
            super().write(path, text)
            return
        path.write_text(new)
        self.writes.append((str(path), value))
        if self.after_write:
            self.after_write(path)

    def mkdir(self, path: Path) -> None:
        """A cgroup's mkdir: the kernel makes its interface files."""
        os.mkdir(path, 0o755)
        parent = path.parent
        if (parent / "cgroup.controllers").exists():  # v2
            files = {"cgroup.procs": "", "cpuset.cpus": "", "cpuset.cpus.partition": "member",
                     "cpuset.cpus.effective": "0-1"}
        else:
            files = {"cgroup.procs": "", "tasks": "", "cpuset.cpus": "", "cpuset.mems": "",
                     "cpuset.sched_load_balance": "1", "cpuset.effective_cpus": ""}
        for f, v in files.items():
            (path / f).write_text(v + "\n")
        self.writes.append((str(path), "mkdir"))
        if self.after_write:
            self.after_write(path)

    def rmdir(self, path: Path) -> None:
        if (path / "cgroup.procs").read_text().strip():
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        shutil.rmtree(path)
        self.writes.append((str(path), "rmdir"))
        if self.after_write:
            self.after_write(path)
