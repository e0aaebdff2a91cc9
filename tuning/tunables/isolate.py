"""Runtime CPU isolation: tasks, kernel threads, unbound workqueues and a cpuset, off (or
around) the target CPUs — what ``isolcpus=`` does at boot, done and undone at runtime.

Four tunables, one profile key (``runtime_isolation = "on"``), one family (``isolate``;
``tune apply --isolate`` asks for it whatever the profile says, on top of the rest of the
profile; ``--only isolate`` narrows a run to it):

- :class:`IsolateTasks` moves every movable task (each thread: affinity is per thread) and
  kernel thread off the target CPUs, like ``taskset -pc HOUSEKEEPING TID`` for each;
- :class:`IsolateWorkqueue` takes the target CPUs out of the unbound workqueue cpumask and of
  each WQ_SYSFS workqueue's own mask;
- :class:`IsolateCgroup` and :class:`IsolateCpuset` build a cpuset for the target CPUs (the
  cgroups, then their settings): a cgroup v2 partition where the kernel offers one, else a
  cgroup v1 cpuset with load balancing off (below).

What cannot move is listed by name, never hidden: per-CPU kernel threads (PF_NO_SETAFFINITY:
cpuhp/N, migration/N, ksoftirqd/N, kworker/N:M — only ``isolcpus``/``nohz_full`` at boot keep
them quiet), workqueue workers (they follow the workqueue cpumask), IRQ threads (they follow
their IRQ's affinity, irq.affinity). A task the kernel refuses to move (EINVAL: its own cpuset
allows only target CPUs; EPERM) is reported "unchangeable", not a failure. Tasks already in the
isolated cpuset were put there by ``hftagent run --cpus`` and stay. So do user tasks whose
affinity is already inside the target CPUs: someone pinned them there on purpose (``taskset -c``,
``hftagent run --cpus``, a service's CPUAffinity=) — on a trading box that is the inference
service itself. They are listed ("kept: pinned inside the target CPUs") and move only with
``--include-pinned``. User tasks pinned by their own choice to CPUs that include some targets
are moved to the rest of their CPUs and named in the plan. Kernel threads are not "the user's
own work" and move whatever their mask.

Rollback restores each task's original affinity where the task still exists: a task is named
``task:TID:STARTTIME`` (collectors/tasks.py), so a TID the kernel has reused for a new task is
not mistaken for the old one (:meth:`IsolateTasks.gone`). Tasks started *during* the isolation
inherit their parent's housekeeping affinity and keep it after rollback: only tasks that
existed at apply time are in the journal.

cpuset method (:func:`cpuset_layout` says which, and why):

- cgroup v2 (``cgroup.controllers`` of the mount lists cpuset): ``hftagent-isolated`` gets
  ``cpuset.cpus`` = the targets and ``cpuset.cpus.partition`` = ``isolated`` (Linux ≥ 6.2: no
  scheduler domain, no load balancing on those CPUs) or ``root`` (5.13 ≤ Linux < 6.2: a
  domain of their own). The kernel then takes the CPUs from every other cgroup's effective
  set. cpuset is enabled in the root's ``cgroup.subtree_control`` first when it is not.
- cgroup v1 (a ``cgroup`` mount with the cpuset option, as on hosts whose cgroup2 mount has
  no controllers): ``hftagent-isolated`` (the targets, ``sched_load_balance`` 0),
  ``hftagent-housekeeping`` (the rest, load balancing on), then the root cpuset's
  ``sched_load_balance`` 0 — the kernel builds scheduler domains only for cpusets that
  balance, so the targets get none (the runtime form of ``isolcpus=domain``).

Only these mounts may be written (tuning/allowlist.py): cgroup2 at /sys/fs/cgroup or
/sys/fs/cgroup/unified, the v1 cpuset at /sys/fs/cgroup/cpuset. Anything else, or no cpuset
controller: ``unsupported: <reason>`` for the cpuset part, and the other parts still apply.

Ordering (also in tuning/tunables/__init__.py): tasks, then workqueues, then the cgroups, then
their settings. A v2 partition takes its CPUs from the tasks of every other cgroup itself:
moving the tasks first journals each task's own mask, and rollback (in reverse) dissolves the
partition before it gives the tasks their masks back, when the kernel accepts them again. The
cgroups come before their settings because apply reads and journals all of a tunable's
targets before its first write, and a cgroup's files exist only once the cgroup does.

Equivalents: ``tuna --cpus=LIST --isolate``; ``cset shield --cpu LIST`` (v1);
``echo MASK > /sys/devices/virtual/workqueue/cpumask``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collectors.host import Host
from collectors.parsers import format_cpulist, format_cpumask, parse_cpulist, parse_cpumask
from collectors.tasks import Task, find_task, parse_task_key, tasks
from tuning.findings import Finding, Status
from tuning.profiles import Profile, Setting
from tuning.safepath import open_dir
from tuning.tunables.base import (
    KEEP,
    MANUAL,
    Change,
    FileTunable,
    Tunable,
    TuneContext,
    TuneError,
    contained,
    resolve,
)

KEY = "runtime_isolation"
ISO = "hftagent-isolated"
HOUSE = "hftagent-housekeeping"
V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
V1_ROOTS = ("/sys/fs/cgroup/cpuset",)
WQ = "/sys/devices/virtual/workqueue"
# Unbound workqueues made with WQ_SYSFS in mainline (mm/backing-dev.c, block/blk-cgroup.c,
# drivers/nvme/host/core.c, drivers/md/raid5.c, drivers/infiniband/core/device.c): the
# allowlist names targets literally, so only these per-workqueue masks are written. Every
# other one is cut to the global mask anyway (effective = own mask & global mask).
WQ_SYSFS = ("writeback", "blkcg_punt_bio", "nvme-wq", "nvme-reset-wq", "nvme-delete-wq",
            "raid5wq", "ib-comp-unb-wq")

# Tests restrict the task set to processes they started themselves (never the machine's other
# tasks): a predicate on each task, None = every task. Module-level like base.default_writer,
# so the tunable that apply and rollback instantiate sees it.
task_filter: Callable[[Task], bool] | None = None


def housekeeping(ctx: TuneContext) -> list[int]:
    """The online CPUs that are not targets. TuneError (one line) when there are none."""
    rest = sorted(set(ctx.online) - set(ctx.cpus))
    if not rest:
        hint = format_cpulist(ctx.online[1:])
        raise TuneError(f"--cpus {format_cpulist(ctx.cpus)} covers every online CPU "
                        f"({format_cpulist(ctx.online)}): runtime isolation needs at least one "
                        "housekeeping CPU" + (f" (e.g. --cpus {hint})" if hint else ""))
    return rest


def _no_targets(ctx: TuneContext) -> str | None:
    if not ctx.cpus:
        return "no target CPUs: pass --cpus (or isolate CPUs with isolcpus=)"
    return None


@dataclass(frozen=True)
class IsolatingProfile(Profile):
    """A profile as ``tune --isolate``/``--include-pinned`` asks it: runtime isolation on, and
    whether user tasks pinned inside the target CPUs move too (the profile's own files never
    say that: it is the operator's call for one run)."""

    include_pinned: bool = False


def with_isolation(profile: Profile, *, include_pinned: bool = False) -> Profile:
    """``profile`` asking for runtime isolation (``tune --isolate``), whatever it says; with
    ``include_pinned`` (``--include-pinned``) tasks pinned inside the target CPUs move too."""
    s = profile.get(KEY)
    why = s.why if s and s.why else ("tasks, kernel threads and unbound work on the "
                                     "inference CPUs preempt the inference thread")
    settings = {**profile.settings, KEY: Setting(KEY, "on", s.severity if s else Status.WARN,
                                                   why)}
    return IsolatingProfile(profile.name, profile.description, settings, profile.source,
                            include_pinned)


def asks_isolation(profile: Profile) -> bool:
    """Whether ``profile`` asks for runtime isolation (its own ``runtime_isolation = "on"``,
    or :func:`with_isolation`)."""
    return profile.expected(KEY) not in (None, "any")


def moves_pinned(ctx: TuneContext) -> bool:
    """Whether this run moves user tasks pinned inside the target CPUs (``--include-pinned``)."""
    return isinstance(ctx.profile, IsolatingProfile) and ctx.profile.include_pinned


def _live_procfs(host: Host) -> bool:
    """Whether the Host's tasks are this kernel's (so an affinity change is a syscall)."""
    return host.procfs.resolve() == Path("/proc")


def _live_sysfs(host: Host) -> bool:
    return host.sysfs.resolve() == Path("/sys")


# ----------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------


@dataclass
class TaskSurvey:
    """The tasks allowed on the target CPUs, by what isolation can do about them."""

    moves: list[tuple[Task, list[int]]] = field(default_factory=list)  # (task, new affinity)
    per_cpu: list[Task] = field(default_factory=list)    # bound to target CPUs, cannot move
    workers: list[Task] = field(default_factory=list)    # workqueue workers (follow the mask)
    irq_threads: list[Task] = field(default_factory=list)  # follow their IRQ's affinity
    fixed: list[Task] = field(default_factory=list)      # other PF_NO_SETAFFINITY tasks
    in_cpuset: list[Task] = field(default_factory=list)  # in the isolated cpuset: stay
    # user tasks whose affinity is already inside the target CPUs: pinned there on purpose,
    # kept (unless include_pinned: then they are in ``moves`` as well, and listed here)
    pinned: list[Task] = field(default_factory=list)
    include_pinned: bool = False
    online: frozenset[int] = frozenset()
    exiting: int = 0                                      # zombies: nothing to move
    total: int = 0                                        # tasks looked at
    # every pinned IRQ thread, target CPUs or not: journalled at its own value, because a
    # cgroup v2 partition change resets the affinity of the kernel threads in the root cgroup
    # (cpuset_update_tasks_cpumask; seen on 6.18: irq/48-nvidia pinned to CPU 4 came back
    # from the partition's removal allowed on 0-15) and nothing else would restore it
    irq_keep: list[Task] = field(default_factory=list)

    @property
    def stay(self) -> list[Task]:
        return self.per_cpu + self.workers + self.irq_threads + self.fixed

    @property
    def kept(self) -> list[Task]:
        """Pinned inside the target CPUs and left there."""
        return [] if self.include_pinned else self.pinned

    @property
    def narrowed(self) -> list[tuple[Task, list[int]]]:
        """User tasks that move although pinned by their own choice (a mask that is not every
        online CPU): to the rest of their CPUs, or (``include_pinned``) to housekeeping."""
        return [(t, new) for t, new in self.moves
                if not t.kthread and t.affinity and set(t.affinity) != self.online]

    def summary(self) -> dict:
        return {"movable_on_targets": len(self.moves),
                "pinned_kept": [t.name for t in self.kept],
                "pinned_moved": [t.name for t, _ in self.narrowed],
                "per_cpu_kthreads": [t.name for t in self.per_cpu],
                "workqueue_workers": [t.name for t in self.workers],
                "irq_threads": [t.name for t in self.irq_threads],
                "cannot_move": [t.name for t in self.fixed],
                "in_isolated_cpuset": [t.name for t in self.in_cpuset],
                "tasks_seen": self.total}


def _in_isolated_cpuset(host: Host, t: Task) -> bool:
    r = host.read(t.status_path.with_name("cpuset"))
    return r.ok and r.value.strip() == f"/{ISO}"


def survey_tasks(host: Host, cpus: list[int], house: list[int],
                 only: Callable[[Task], bool] | None = None, *,
                 include_pinned: bool = False) -> TaskSurvey:
    """Classify every task allowed on ``cpus`` (or those ``only`` accepts). A user task whose
    affinity is inside ``cpus`` is kept (``pinned``) unless ``include_pinned``."""
    targets = set(cpus)
    s = TaskSurvey(include_pinned=include_pinned, online=frozenset(targets | set(house)))
    for t in tasks(host):
        if only is not None and not only(t):
            continue
        s.total += 1
        if (t.kthread and t.comm.startswith("irq/") and t.affinity
                and t.state not in ("Z", "X")):
            s.irq_keep.append(t)
        if t.affinity is None or not targets & set(t.affinity):
            continue
        if t.state in ("Z", "X"):
            s.exiting += 1
            continue
        if t.kthread and t.comm.startswith("irq/"):
            # threaded IRQ handlers: the kernel sets their affinity from their IRQ's
            # (irq_thread_check_affinity) and would undo a move; irq.affinity moves the IRQ
            s.irq_threads.append(t)
            continue
        if t.no_setaffinity:
            if set(t.affinity) <= targets:
                s.per_cpu.append(t)
            elif t.comm.startswith("kworker/"):
                s.workers.append(t)
            else:
                s.fixed.append(t)
            continue
        if _in_isolated_cpuset(host, t):
            s.in_cpuset.append(t)
            continue
        if not t.kthread and set(t.affinity) <= targets:
            s.pinned.append(t)  # put there on purpose: the inference service, typically
            if not include_pinned:
                continue
        s.moves.append((t, sorted(set(t.affinity) - targets) or house))
    return s


def _names(ts: list[Task], limit: int = 24) -> str:
    """Task names for a one-line list; past ``limit``, grouped by name template with digits
    as N, up to the first "-" ("ksoftirqd/N x126", "kworker/R x17")."""
    if len(ts) <= limit:
        return ", ".join(t.name for t in ts)
    groups: dict[str, int] = {}
    for t in ts:
        k = re.sub(r"\d+", "N", t.comm).split("-")[0]
        groups[k] = groups.get(k, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(groups.items(), key=lambda kv: -kv[1]))


def _pinned(ts: list[Task], new: list[list[int]] | None = None, limit: int = 12) -> str:
    """Pinned tasks by name with their CPUs ("inference[4242] (CPU 1)"; with ``new``:
    "(CPU 0-1 → 0)"), the first ``limit`` of them."""
    out = []
    for i, t in enumerate(ts[:limit]):
        cpus = format_cpulist(t.affinity or [])
        out.append(f"{t.name} (CPU {cpus}" + (f" → {format_cpulist(new[i])})" if new else ")"))
    return ", ".join(out) + (f" and {len(ts) - limit} more" if len(ts) > limit else "")


def _mask_like(cpus: list[int], like: str) -> str:
    """A CPU mask with the word count and first-word width of ``like`` (how the kernel prints
    Cpus_allowed: "3" on 2 CPUs, "ffff" on 16)."""
    words = format_cpumask(cpus).split(",")
    old = like.strip().split(",")
    while len(words) < len(old):
        words.insert(0, "00000000")
    first = words[0][-len(old[0]):] if len(words) == len(old) else words[0]
    return ",".join([first] + words[1:])


class IsolateTasks(Tunable):
    """Every movable task and kernel thread off the target CPUs.

    Target: ``task:TID:STARTTIME`` (one per thread), value = the CPU list it may run on. New
    affinity = current minus the target CPUs, or the housekeeping CPUs when nothing would be
    left. Live host: ``sched_setaffinity(TID)``, after checking the TID still has that
    starttime. A tree copy (``--root``) keeps a task's affinity in its status file's
    ``Cpus_allowed_list``/``Cpus_allowed`` lines, which are rewritten there instead (so a
    round trip on a capture can be compared byte for byte).
    Equivalent: ``taskset -pc 0 TID``; ``ps -eLo tid,psr,comm`` to look.
    """

    id, family, title, key = "isolate.tasks", "isolate", "Task and kernel-thread affinity", KEY
    patterns = ("task:[0-9]*:[0-9]*",)
    MANUAL_TARGET = "tasks:staying"

    def __init__(self) -> None:
        self.survey: TaskSurvey | None = None  # of the last desired(): plan and verify use it

    def available(self, ctx: TuneContext) -> str | None:
        return _no_targets(ctx)

    def valid(self, value: str) -> bool:
        try:
            return bool(parse_cpulist(value))
        except ValueError:
            return False

    def owns(self, target: str) -> bool:
        return parse_task_key(target) is not None

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        house = housekeeping(ctx)
        self.survey = survey_tasks(ctx.host, ctx.cpus, house, task_filter,
                                   include_pinned=moves_pinned(ctx))
        keep = {t.key: format_cpulist(t.affinity) for t in self.survey.irq_keep
                if t.affinity and set(t.affinity) != set(ctx.online)}
        return keep | {t.key: format_cpulist(new) for t, new in self.survey.moves}

    def plan(self, desired: dict[str, str], current: dict[str, str | None]) -> list[Change]:
        out = super().plan(desired, current)
        s = self.survey
        if s and s.moves:  # a first apply (a second one finds nothing to move: journalled)
            planned = {c.target for c in out}
            for t in s.irq_keep:
                if t.key in desired and t.key not in planned and current.get(t.key) is not None:
                    out.append(Change(self.id, t.key, current[t.key], desired[t.key], KEEP,
                                      detail=f"{t.name} kept at its own affinity and journalled"
                                      ": a cpuset partition change resets IRQ threads' "
                                      "affinities"))
        if s and s.stay:
            parts = []
            if s.per_cpu:
                parts.append(f"{len(s.per_cpu)} per-CPU kernel thread(s) cannot move "
                             f"(PF_NO_SETAFFINITY; only isolcpus/nohz_full at boot quiet them): "
                             f"{_names(s.per_cpu)}")
            if s.workers:
                parts.append(f"{len(s.workers)} workqueue worker(s) follow the workqueue "
                             f"cpumask (isolate.workqueue): {_names(s.workers, 8)}")
            if s.irq_threads:
                parts.append(f"{len(s.irq_threads)} IRQ thread(s) follow their IRQ's affinity "
                             f"(irq.affinity): {_names(s.irq_threads, 8)}")
            if s.fixed:
                parts.append(f"{len(s.fixed)} task(s) with PF_NO_SETAFFINITY cannot move: "
                             f"{_names(s.fixed)}")
            out.append(Change(self.id, self.MANUAL_TARGET, None, "stay", MANUAL,
                              detail="; ".join(parts)))
        return out

    def plan_note(self, ctx: TuneContext) -> str:
        """The plan in words: how many tasks move, which pinned ones stay where they are, and
        which move although pinned by their own choice (the survey of the last desired())."""
        s = self.survey
        if s is None:
            return ""
        cpus = format_cpulist(ctx.cpus)
        parts = [f"{len(s.moves)} task(s) will move off CPU {cpus}"]
        if s.kept:
            parts.append(f"kept: pinned inside the target CPUs: {_pinned(s.kept)} "
                         "(--include-pinned moves them too)")
        if s.narrowed:
            how = ("pinned by their own choice, moved anyway (--include-pinned)"
                   if s.include_pinned else
                   "pinned by their own choice to CPUs that include the targets, moved to the "
                   "rest of them")
            parts.append(f"{how}: " + _pinned([t for t, _ in s.narrowed],
                                              [n for _, n in s.narrowed]))
        return "; ".join(parts)

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        k = parse_task_key(target)
        if k is None:
            return None
        t = find_task(ctx.host, k[0], k[1])
        if t is None or t.affinity is None:
            return None
        return format_cpulist(t.affinity)

    def gone(self, ctx: TuneContext, target: str) -> bool:
        """Whether the task no longer exists (exited, or its TID now names another task):
        nothing to restore, and not an error. A task that is there but unreadable is not
        gone."""
        k = parse_task_key(target)
        if k is None:
            return False
        t = find_task(ctx.host, k[0])
        return t is None or t.starttime != k[1]

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        k = parse_task_key(target)
        if k is None:
            raise OSError(errno.EINVAL, f"not a task key: {target!r}")
        try:
            cpus = parse_cpulist(value)
        except ValueError:
            raise OSError(errno.EINVAL, f"bad CPU list {value!r}") from None
        t = find_task(ctx.host, k[0], k[1])
        if t is None:
            raise ProcessLookupError(errno.ESRCH, f"task {k[0]} exited", target)
        if _live_procfs(ctx.host):
            # The starttime was checked just above: a TID reused in between would need the
            # task to exit and pid_max to wrap within microseconds.
            os.sched_setaffinity(k[0], cpus)
            return
        text = ctx.host.read(t.status_path).value
        if text is None:
            raise OSError(errno.EIO, "status unreadable", str(t.status_path))
        lines = []
        for ln in text.split("\n"):
            name, _, rest = ln.partition(":")
            if name == "Cpus_allowed_list":
                ln = f"{name}:\t{format_cpulist(cpus)}"
            elif name == "Cpus_allowed":
                ln = f"{name}:\t{_mask_like(cpus, rest)}"
            lines.append(ln)
        ctx.writer.write(contained(ctx.host, ctx.host.display(t.status_path)), "\n".join(lines))

    def unchangeable(self, exc: OSError) -> bool:
        # EINVAL: PF_NO_SETAFFINITY, or a cpuset of its own that allows only target CPUs;
        # EPERM: another user's task without CAP_SYS_NICE.
        return exc.errno in (errno.EINVAL, errno.EPERM)

    def verify(self, ctx: TuneContext, desired: dict[str, str]) -> Finding:
        """Every planned move holds (tasks gone since are counted, not failed), and the count
        of movable tasks still allowed on the target CPUs, before and after."""
        setting = ctx.profile.get(self.key)
        before = self.survey
        gone, bad = [], {}
        for tgt, want in desired.items():
            cur = self.read_target(ctx, tgt)
            if cur == want:
                continue
            if self.gone(ctx, tgt):
                gone.append(tgt)
            else:
                bad[tgt] = cur
        house = sorted(set(ctx.online) - set(ctx.cpus)) or ctx.online
        after = survey_tasks(ctx.host, ctx.cpus, house, task_filter,
                             include_pinned=moves_pinned(ctx))
        planned = {t.key for t, _ in before.moves} if before else set(desired)
        refused = [t for t, _ in after.moves if t.key in planned and t.key not in desired]
        left = [t for t, _ in after.moves if t.key not in planned]  # new since the plan
        cpus = format_cpulist(ctx.cpus)
        n_before = len(before.moves) if before else len(desired)
        current = (f"{len(after.moves) - len(refused)} movable task(s) allowed on CPU {cpus} "
                   f"(before: {n_before})")
        if refused:
            current += f"; {len(refused)} refused to move (unchangeable): {_names(refused, 8)}"
        if after.kept:
            current += f"; kept: pinned inside the target CPUs: {_pinned(after.kept, limit=8)}"
        if after.stay:
            current += (f"; staying: {len(after.per_cpu)} per-CPU kernel thread(s), "
                        f"{len(after.workers)} workqueue worker(s), "
                        f"{len(after.irq_threads)} IRQ thread(s), {len(after.fixed)} other")
        if gone:
            current += f"; {len(gone)} exited since planning"
        if bad:
            current += f"; {len(bad)} did not hold"
        if left:
            current += f"; new since planning: {_names(left, 8)}"
        ok = not bad and not left
        return Finding(
            id=self.id, family=self.family, title=self.title,
            status=Status.OK if ok else (setting.severity if setting else Status.WARN),
            current=current, expected=f"no movable task allowed on CPU {cpus}",
            evidence="/proc/*/task/*/status (Cpus_allowed_list), /proc/*/task/*/stat (flags)",
            fix="" if ok else (f"hftagent tune apply --isolate --only isolate --cpus {cpus}"
                               + (" --include-pinned" if moves_pinned(ctx) else "")),
            why=setting.why if setting else "",
            data={"before": before.summary() if before else {}, "after": after.summary(),
                  "moved": len(desired) - len(gone) - len(bad), "exited": sorted(gone),
                  "mismatched": sorted(bad), "new_on_targets": [t.name for t in left],
                  "refused": [t.name for t in refused]})


# ----------------------------------------------------------------------------------------------
# Unbound workqueues
# ----------------------------------------------------------------------------------------------


class IsolateWorkqueue(FileTunable):
    """The target CPUs out of the unbound workqueue cpumask and each sysfs workqueue's mask.

    Files: /sys/devices/virtual/workqueue/cpumask (every unbound workqueue, Linux ≥ 4.2) and
    /sys/devices/virtual/workqueue/<name>/cpumask (workqueues created with WQ_SYSFS:
    writeback, blkcg_punt_bio...; effective = own mask ∩ global mask). Hex masks. New mask =
    current minus the target CPUs, or the housekeeping CPUs when nothing would be left. The
    global mask goes first (the per-workqueue masks are cut to it). A mask the kernel refuses
    (EINVAL: e.g. an ordered workqueue) is reported unchangeable.
    Equivalent: ``echo 1 > /sys/devices/virtual/workqueue/cpumask``.
    """

    id, family, title, key = "isolate.workqueue", "isolate", "Unbound workqueue CPU masks", KEY
    patterns = (f"{WQ}/cpumask",) + tuple(f"{WQ}/{n}/cpumask" for n in WQ_SYSFS)

    def _dir(self, ctx: TuneContext) -> Path:
        return ctx.host.sys("devices/virtual/workqueue")

    def available(self, ctx: TuneContext) -> str | None:
        if not ctx.host.exists(self._dir(ctx) / "cpumask"):
            return ("unsupported: no /sys/devices/virtual/workqueue/cpumask (a kernel without "
                    "the unbound workqueue cpumask, < 4.2)")
        return _no_targets(ctx)

    def valid(self, value: str) -> bool:
        try:
            return bool(parse_cpumask(value))
        except ValueError:
            return False

    def normalise(self, text: str) -> str:
        return format_cpumask(parse_cpumask(text))

    def others(self, ctx: TuneContext) -> list[str]:
        """Workqueues with a mask of their own that the allowlist does not name."""
        d = self._dir(ctx)
        return [n for n, sub in ctx.host.glob_dirs(d, "")
                if n not in WQ_SYSFS and ctx.host.exists(sub / "cpumask")]

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        house = housekeeping(ctx)
        targets = set(ctx.cpus)
        d = self._dir(ctx)
        files = [d / "cpumask"] + [d / n / "cpumask" for n in WQ_SYSFS
                                   if ctx.host.exists(d / n / "cpumask")]
        out = {}
        for f in files:
            r = ctx.host.read(f)
            try:
                cur = parse_cpumask(r.value) if r.ok else None
            except ValueError:
                cur = None
            new = (sorted(set(cur) - targets) or house) if cur else house
            out[ctx.host.display(f)] = format_cpumask(new)
        return out

    def detail(self, ctx: TuneContext, target: str) -> str:
        if target != f"{WQ}/cpumask":
            return ""
        rest = self.others(ctx)
        return (f"also cuts {len(rest)} other sysfs workqueue(s) to it: {', '.join(rest[:6])}"
                + (" ..." if len(rest) > 6 else "")) if rest else ""

    def unchangeable(self, exc: OSError) -> bool:
        return exc.errno == errno.EINVAL


# ----------------------------------------------------------------------------------------------
# cpuset
# ----------------------------------------------------------------------------------------------

V2, V1 = "cgroup2-partition", "cgroup1-cpuset"


@dataclass(frozen=True)
class CpusetLayout:
    """Where and how the isolated cpuset is made. ``mount`` is the path a user would type."""

    method: str            # V2 | V1
    mount: str
    why: str
    partition: str = ""    # v2: "isolated" | "root"


def _kernel_version(host: Host) -> tuple[int, int] | None:
    r = host.read(host.proc("sys/kernel/osrelease"))
    m = re.match(r"(\d+)\.(\d+)", r.value or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _mounts(host: Host) -> list[tuple[str, str, str]] | None:
    """(mount point, fstype, options) of every mount, or None when no mounts file reads."""
    for rel in ("self/mounts", "mounts"):
        r = host.read(host.proc(rel))
        if r.ok:
            out = []
            for ln in r.value.splitlines():
                f = ln.split()
                if len(f) >= 4:
                    out.append((f[1].replace("\\040", " "), f[2], f[3]))
            return out
    return None


def cpuset_layout(host: Host) -> CpusetLayout | str:
    """The cpuset method this host offers, or the reason there is none ("unsupported: ...").

    Found from the mount table (cgroup2 mounts whose cgroup.controllers lists cpuset; cgroup
    v1 mounts with the cpuset option), else from the usual mount points."""
    mounts = _mounts(host)
    if mounts is None:  # a capture without a mount table: look where the mounts usually are
        v2 = [r for r in V2_ROOTS if host.exists(resolve(host, r) / "cgroup.controllers")]
        v1 = [r for r in V1_ROOTS if host.exists(resolve(host, r) / "cpuset.cpus")]
        elsewhere: list[str] = []
    else:
        v2 = [m for m, fs, _o in mounts if fs == "cgroup2"]
        v1 = [m for m, fs, o in mounts if fs == "cgroup" and "cpuset" in o.split(",")]
        elsewhere = [m for m in v1 if m not in V1_ROOTS] + [m for m in v2 if m not in V2_ROOTS]
        v2 = [m for m in v2 if m in V2_ROOTS]
        v1 = [m for m in v1 if m in V1_ROOTS]
    v2_cpuset = []
    for m in v2:
        r = host.read(resolve(host, m) / "cgroup.controllers")
        if r.ok and "cpuset" in r.value.split():
            v2_cpuset.append(m)
    if v2_cpuset:
        m = v2_cpuset[0]
        ver = _kernel_version(host)
        if ver is not None and ver < (5, 13):
            return (f"unsupported: cgroup2 at {m} has cpuset but Linux {ver[0]}.{ver[1]} has no "
                    "cpuset partitions (5.13+)")
        part = "isolated" if ver is None or ver >= (6, 2) else "root"
        kv = f"Linux {ver[0]}.{ver[1]}" if ver else "kernel version unknown"
        return CpusetLayout(V2, m, f"cgroup v2 partition ({m} offers cpuset; "
                            f"cpuset.cpus.partition={part}: {kv})", part)
    if v1:
        m = v1[0]
        if not host.exists(resolve(host, m) / "cpuset.sched_load_balance"):
            return (f"unsupported: cpuset at {m} has no cpuset.sched_load_balance (mounted "
                    "with noprefix?)")
        why2 = (f"cgroup2 at {v2[0]} offers no cpuset (the controller is bound to the v1 "
                "hierarchy)" if v2 else "no cgroup2 mount")
        return CpusetLayout(V1, m, f"cgroup v1 cpuset at {m} with sched_load_balance off "
                            f"({why2})")
    if elsewhere:
        return (f"unsupported: cpuset mounted at {', '.join(elsewhere)}, not where tuning may "
                f"write ({', '.join(V1_ROOTS + V2_ROOTS)})")
    return "unsupported: no cpuset controller (neither a cgroup2 cpuset nor a v1 cpuset mount)"


@dataclass(frozen=True)
class IsolatedCpuset:
    """The isolated cpuset `tune apply --isolate` made, as `hftagent run` joins it."""

    method: str
    path: str          # user-facing directory
    procs: Path        # the real path of its cgroup.procs
    cpus: list[int]


def isolated_cpuset(host: Host) -> IsolatedCpuset | None:
    """The ``hftagent-isolated`` cpuset when it exists with CPUs, else None."""
    for method, roots in ((V2, V2_ROOTS), (V1, V1_ROOTS)):
        for r in roots:
            try:  # the real path (no symlink out of sysfs): `run` writes it
                procs = contained(host, f"{r}/{ISO}/cgroup.procs")
            except OSError:
                continue
            cp = host.read(procs.with_name("cpuset.cpus"))
            try:
                cpus = parse_cpulist(cp.value) if cp.ok else []
            except ValueError:
                cpus = []
            if cpus:
                return IsolatedCpuset(method, f"{r}/{ISO}", procs, cpus)
    return None


def join_isolated(host: Host, cpus, pid: int = 0) -> IsolatedCpuset | None:
    """Move ``pid`` (0: this process) into the isolated cpuset when ``cpus`` are all inside
    it, as `hftagent run` does; returns the cpuset joined, or None (no isolated cpuset, or
    the CPUs are not all in it). With a cgroup v2 partition the isolated CPUs leave every
    other cgroup's effective cpus, so a process pins itself there only from inside (Linux
    5.19+, cpuset.cpus.partition). Raises OSError when the write is refused."""
    iso = isolated_cpuset(host)
    if iso is None or not set(cpus) <= set(iso.cpus):
        return None
    move_to_cpuset(iso.procs, pid)
    return iso


def move_to_cpuset(procs: Path, pid: int = 0) -> None:
    """Write ``pid`` (0: this process) into a cpuset's ``cgroup.procs`` (its real path, opened
    without following a link out of sysfs). Raises OSError."""
    from tuning.safepath import open_real

    fd = open_real(procs, os.O_WRONLY)
    try:
        os.write(fd, f"{pid or os.getpid()}\n".encode())
    finally:
        os.close(fd)


def pin_self(cpus, host: Host | None = None) -> str | None:
    """Pin this process to ``cpus``, joining the isolated cpuset first when they are all in
    it (the probe's and watch's workers: after a cgroup v2 isolation their parent's cgroup no
    longer has those CPUs). Returns the cpuset joined, or None. A refused join is left to the
    pinning to report (on cgroup v1 the pinning alone may still succeed)."""
    try:
        iso = join_isolated(host or Host(), cpus)
    except OSError:
        iso = None
    os.sched_setaffinity(0, cpus)
    return iso.path if iso is not None else None


def _tree_without_cgroupfs(ctx: TuneContext) -> str | None:
    if not _live_sysfs(ctx.host) and not hasattr(ctx.writer, "mkdir"):
        return ("unsupported: creating a cgroup needs the live kernel (a tree copy has no "
                "cgroupfs to make the cgroup's files)")
    return None


def _layout_or_reason(ctx: TuneContext) -> CpusetLayout | str:
    lay = cpuset_layout(ctx.host)
    if isinstance(lay, str):
        return lay
    return _tree_without_cgroupfs(ctx) or _no_targets(ctx) or lay


DIR_PREFIX = "cgroup:"


class IsolateCgroup(Tunable):
    """The cgroups of the isolated cpuset: ``hftagent-isolated`` (and, on v1,
    ``hftagent-housekeeping``), and on v2 the cpuset controller in the root's
    ``cgroup.subtree_control``.

    Targets: ``cgroup:/sys/fs/cgroup/.../hftagent-isolated`` (a directory: ``present`` =
    mkdir, ``absent`` = rmdir, so rollback removes what apply made; the kernel makes and
    removes the cgroup's files) and ``/sys/fs/cgroup/cgroup.subtree_control`` (value: the
    enabled controllers, sorted; written as the ``+name``/``-name`` difference). Its own
    tunable, before :class:`IsolateCpuset`: apply reads and journals a tunable's targets
    before its first write, and a cgroup's files exist only once the cgroup does. A tree copy
    has no cgroupfs to make a cgroup's files: there the writer must simulate mkdir/rmdir
    (tests do). Equivalent: ``mkdir /sys/fs/cgroup/hftagent-isolated``,
    ``echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control``.
    """

    id, family, title, key = "isolate.cgroup", "isolate", "Isolated cpuset: cgroups", KEY
    patterns = tuple(
        [p for r in V2_ROOTS for p in (f"{r}/cgroup.subtree_control", f"{DIR_PREFIX}{r}/{ISO}")]
        + [f"{DIR_PREFIX}{r}/{n}" for r in V1_ROOTS for n in (ISO, HOUSE)])

    def __init__(self) -> None:
        self.layout: CpusetLayout | None = None

    def available(self, ctx: TuneContext) -> str | None:
        lay = _layout_or_reason(ctx)
        if isinstance(lay, str):
            return lay
        self.layout = lay
        return None

    def valid(self, value: str) -> bool:
        return value in ("present", "absent") or all(re.fullmatch(r"[a-z_]+", w)
                                                     for w in value.split())

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        housekeeping(ctx)
        lay = self.layout or _layout_or_reason(ctx)
        if isinstance(lay, str):
            raise TuneError(lay)
        m = lay.mount
        if lay.method == V2:
            out = {}
            ctl = self.read_target(ctx, f"{m}/cgroup.subtree_control")
            if ctl is not None and "cpuset" not in ctl.split():
                out[f"{m}/cgroup.subtree_control"] = " ".join(sorted(ctl.split() + ["cpuset"]))
            return out | {f"{DIR_PREFIX}{m}/{ISO}": "present"}
        return {f"{DIR_PREFIX}{m}/{ISO}": "present", f"{DIR_PREFIX}{m}/{HOUSE}": "present"}

    def _dir(self, ctx: TuneContext, target: str) -> tuple[Path, str]:
        """(real path of the cgroup's parent, the cgroup's name). The parent is found through
        its cgroup.procs, checked like any file target (no symlink out of its mount)."""
        shown = target[len(DIR_PREFIX):]
        parent, _, name = shown.rpartition("/")
        if name not in (ISO, HOUSE):
            raise OSError(errno.EINVAL, f"not one of our cgroups: {target!r}")
        return contained(ctx.host, f"{parent}/cgroup.procs").parent, name

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        if target.startswith(DIR_PREFIX):
            try:
                parent, name = self._dir(ctx, target)
            except OSError:
                return None
            return "present" if (parent / name).is_dir() else "absent"
        r = ctx.host.read(resolve(ctx.host, target))
        return None if r.value is None else " ".join(sorted(r.value.split()))

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        if target.startswith(DIR_PREFIX):
            parent, name = self._dir(ctx, target)
            if value not in ("present", "absent"):
                raise OSError(errno.EINVAL, f"bad cgroup directory state {value!r}")
            fn = getattr(ctx.writer, "mkdir" if value == "present" else "rmdir", None)
            if fn is not None:  # a kernel simulation in front of a tree copy
                fn(parent / name)
                return
            dfd = open_dir(parent, create=False)
            if dfd is None:
                raise FileNotFoundError(errno.ENOENT, "no such cgroup parent", str(parent))
            try:
                if value == "present":
                    os.mkdir(name, 0o755, dir_fd=dfd)
                else:
                    os.rmdir(name, dir_fd=dfd)
            finally:
                os.close(dfd)
            return
        have = set((self.read_target(ctx, target) or "").split())
        want = set(value.split())
        delta = [f"+{c}" for c in sorted(want - have)] + [f"-{c}" for c in sorted(have - want)]
        if delta:
            ctx.writer.write(contained(ctx.host, target), " ".join(delta))

    def detail(self, ctx: TuneContext, target: str) -> str:
        lay = self.layout
        return lay.why if lay is not None and target.endswith(f"/{ISO}") else ""

    def verify(self, ctx: TuneContext, desired: dict[str, str]) -> Finding:
        f = super().verify(ctx, desired)
        if self.layout is not None:
            f.data |= {"method": self.layout.method, "why": self.layout.why}
            if f.status == Status.OK:
                f.current = self.layout.why
        return f


class IsolateCpuset(FileTunable):
    """The isolated cpuset's settings (the module docstring has both recipes and the order).

    v2 files: ``hftagent-isolated/cpuset.cpus`` (the targets) and
    ``hftagent-isolated/cpuset.cpus.partition`` (``isolated`` or ``root``: read back as the
    kernel prints it, with "invalid (reason)" when it refused to make the partition). v1
    files: ``hftagent-isolated/cpuset.{mems,cpus,sched_load_balance}`` (all memory nodes, the
    targets, 0), ``hftagent-housekeeping/cpuset.{mems,cpus}`` (all nodes, the other CPUs), and
    the root cpuset's ``cpuset.sched_load_balance`` (0) last. In a cgroup that
    :class:`IsolateCgroup` makes, the originals are the kernel's empty values.
    Equivalent (v1): ``echo 0 > /sys/fs/cgroup/cpuset/cpuset.sched_load_balance``.
    """

    id, family, title, key = "isolate.cpuset", "isolate", "Isolated cpuset: settings", KEY
    patterns = tuple(
        [p for r in V2_ROOTS for p in (f"{r}/{ISO}/cpuset.cpus",
                                       f"{r}/{ISO}/cpuset.cpus.partition")]
        + [p for r in V1_ROOTS for p in (f"{r}/{ISO}/cpuset.mems", f"{r}/{ISO}/cpuset.cpus",
                                         f"{r}/{ISO}/cpuset.sched_load_balance",
                                         f"{r}/{HOUSE}/cpuset.mems", f"{r}/{HOUSE}/cpuset.cpus",
                                         f"{r}/cpuset.sched_load_balance")])
    PARTITIONS = ("member", "root", "isolated")

    def __init__(self) -> None:
        self.layout: CpusetLayout | None = None

    def available(self, ctx: TuneContext) -> str | None:
        lay = _layout_or_reason(ctx)
        if isinstance(lay, str):
            return lay
        self.layout = lay
        return None

    @staticmethod
    def _kind(target: str) -> str:
        name = target.rsplit("/", 1)[-1]
        return {"cpuset.cpus": "list", "cpuset.mems": "list",
                "cpuset.sched_load_balance": "int"}.get(name, "partition")

    def valid(self, value: str) -> bool:
        if value in ("0", "1") or value.split(" ")[0] in self.PARTITIONS:
            return True
        try:
            parse_cpulist(value)  # "" included: a new cgroup's empty cpus/mems
            return True
        except ValueError:
            return False

    # What a file of a new cgroup holds once mkdir has made it (cgroup v1 and v2 alike).
    FRESH = {"list": "", "int": "1", "partition": "member"}

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        """The file's value. A file of one of *our* cgroups while that cgroup does not exist
        reads as the value mkdir gives it: that is what apply journals as its original, and a
        rollback killed after the rmdir but before the journal dropped these entries then
        finds them in place instead of unreadable forever."""
        kind = self._kind(target)
        parent = target.rsplit("/", 2)
        if parent[1] in (ISO, HOUSE):
            probe = f"{parent[0]}/{parent[1]}/cgroup.procs"
            try:
                contained(ctx.host, probe)
            except FileNotFoundError:
                return self.FRESH[kind]
            except OSError:
                return None
        try:
            path = contained(ctx.host, target)
        except OSError:
            return None
        r = ctx.host.read(path)
        if r.value is None:
            return None
        try:
            if kind == "list":
                return format_cpulist(parse_cpulist(r.value))
            if kind == "int":
                return str(int(r.value.strip()))
        except ValueError:
            return None
        return " ".join(r.value.split())

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        house = housekeeping(ctx)
        lay = self.layout or _layout_or_reason(ctx)
        if isinstance(lay, str):
            raise TuneError(lay)
        m, cpus = lay.mount, format_cpulist(ctx.cpus)
        if lay.method == V2:
            return {f"{m}/{ISO}/cpuset.cpus": cpus,
                    f"{m}/{ISO}/cpuset.cpus.partition": lay.partition}
        mems_r = ctx.host.read(resolve(ctx.host, f"{m}/cpuset.mems"))
        try:
            mems = format_cpulist(parse_cpulist(mems_r.value or "")) or "0"
        except ValueError:
            mems = "0"
        return {f"{m}/{ISO}/cpuset.mems": mems, f"{m}/{ISO}/cpuset.cpus": cpus,
                f"{m}/{ISO}/cpuset.sched_load_balance": "0",
                f"{m}/{HOUSE}/cpuset.mems": mems, f"{m}/{HOUSE}/cpuset.cpus":
                format_cpulist(house), f"{m}/cpuset.sched_load_balance": "0"}

    def detail(self, ctx: TuneContext, target: str) -> str:
        parent = target.rsplit("/", 2)
        if parent[1] not in (ISO, HOUSE):
            return ""
        try:
            contained(ctx.host, f"{parent[0]}/{parent[1]}/cgroup.procs")
        except FileNotFoundError:
            return "in the cgroup isolate.cgroup makes (current: its value at mkdir)"
        except OSError:
            pass
        return ""

    def verify(self, ctx: TuneContext, desired: dict[str, str]) -> Finding:
        f = super().verify(ctx, desired)
        if self.layout is not None:
            f.data |= {"method": self.layout.method, "why": self.layout.why}
        return f
