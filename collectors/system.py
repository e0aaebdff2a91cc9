"""Whole-system facts: NUMA nodes, virtualization, processes (other tuners), a target PID.

Sources:
- /sys/devices/system/node/nodeN/cpulist (else cpumap)      [numactl --hardware]
- /sys/devices/system/cpu/{online,present,possible}, cpuN/online  [lscpu]
- virtualization: collectors/virt.py (CPUID flags, DMI, /sys/hypervisor, /proc/sysinfo,
  device tree, lparcfg, PCI vendor IDs)                     [systemd-detect-virt]
- /proc/stat steal ticks over a short window               [vmstat 1, column st]
- /proc/<pid>/{comm,status,environ}                          [ps, cat]
- /etc/tuned/active_profile                                  [tuned-adm active]
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from collectors import virt
from collectors.host import ABSENT, PERMISSION, Host, Reading
from collectors.parsers import (
    format_cpulist,
    parse_cpulist,
    parse_cpumask,
    parse_environ,
    parse_kv,
    parse_proc_stat,
)

# --------------------------------------------------------------------------------------------
# NUMA
# --------------------------------------------------------------------------------------------


def node_cpus(host: Host, node_dir) -> Reading[list[int]]:
    """The CPUs of one nodeN directory: its ``cpulist``, else (a capture that kept only the
    mask, a common dump format) its ``cpumap``, the same set as a hex mask of comma-separated
    32-bit words (drivers/base/node.c node_read_cpumap). The reading of cpulist when neither
    can be read."""
    r = host.read(node_dir / "cpulist").map(parse_cpulist)
    if r.ok or r.reason != ABSENT:
        return r
    m = host.read(node_dir / "cpumap").map(parse_cpumask)
    return m if m.reason != ABSENT else r


def numa_node_cpulists(host: Host) -> dict[int, Reading[list[int]]]:
    """{node id: its CPUs' reading} for every nodeN directory (:func:`node_cpus`). Node ids
    are whatever the kernel was given (ACPI SRAT proximity domains, the device tree): they
    need not start at 0 nor be contiguous. {} on a kernel without NUMA sysfs."""
    out = {}
    for name, d in host.glob_dirs(host.sys("devices/system/node"), "node"):
        if name[4:].isdigit():
            out[int(name[4:])] = node_cpus(host, d)
    return out


def numa_nodes(host: Host) -> dict[int, list[int]]:
    """{node id: CPU ids}. A kernel without NUMA sysfs gives {} (callers treat as one node).
    A node whose cpulist cannot be read has [] here: checks that must tell "no CPUs" from
    "unreadable" use :func:`numa_node_cpulists`."""
    return {n: r.value or [] for n, r in numa_node_cpulists(host).items()}


def node_of_cpus(nodes: dict[int, list[int]], cpus: list[int]) -> set[int]:
    return {n for n, cl in nodes.items() if set(cl) & set(cpus)}


# --------------------------------------------------------------------------------------------
# Online CPUs, also where /sys/devices/system/cpu/online is missing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnlineCpus:
    """The online CPUs and how they were found. ``derived`` is None when the kernel's own
    list (cpu/online, ``path``) was read; else ``reason`` says why it was not and
    ``derived`` where the CPUs came from instead."""

    cpus: list[int]
    path: str
    derived: str | None = None
    reason: str | None = None


def online_cpus(host: Host) -> Reading[OnlineCpus]:
    """/sys/devices/system/cpu/online [lscpu]; where it is missing or unreadable (seen in
    captures), derived from ``present`` (else ``possible``) and the cpuN directories, less
    the CPUs cpu/offline lists and those whose own cpuN/online says 0 (x86's CPU 0 has no
    such file: it cannot go offline). None when none of these can be read."""
    base = host.sys("devices/system/cpu")
    r = host.read(base / "online").map(parse_cpulist)
    if r.ok and r.value:
        return Reading(OnlineCpus(r.value, r.path), r.path)
    dirs = sorted(int(n[3:]) for n, _ in host.glob_dirs(base, "cpu") if n[3:].isdigit())
    reason = "empty" if r.ok else (r.reason or "unreadable")
    sources: list[str] = []
    cpus: list[int] | None = None
    for name in ("present", "possible"):
        lst = host.read(base / name).map(parse_cpulist)
        if lst.ok and lst.value:
            cpus = [c for c in lst.value if c in dirs] if dirs else lst.value
            sources.append(f"CPUs from {lst.path}" + (" and the cpuN directories" if dirs
                                                       else ""))
            break
    if cpus is None and dirs:
        cpus = dirs
        sources.append(f"CPUs from the cpuN directories of {host.display(base)}")
    if not cpus:
        return Reading(None, r.path, r.reason or "empty")
    # the kernel's list of offline CPUs (possible but not online, drivers/base/cpu.c
    # print_cpus_offline) is taken out as well as each cpuN/online = 0: a capture may hold
    # one without the other, and an offline CPU keeps its cpuN directory
    listed = host.read(base / "offline").map(
        lambda s: parse_cpulist(s) if s.strip() else [])
    off = set(listed.value or [])
    per_cpu = []
    for c in cpus:
        o = host.read_int(base / f"cpu{c}" / "online")
        if o.value == 0:
            per_cpu.append(c)
    off |= set(per_cpu)
    cpus = [c for c in cpus if c not in off]
    if listed.value:
        sources.append(f"less {listed.path} ({format_cpulist(listed.value)})")
    if per_cpu:
        sources.append(f"less cpuN/online = 0 ({format_cpulist(per_cpu)})")
    if not off:
        sources.append("each online unless its cpuN/online says 0")
    if not cpus:
        return Reading(None, r.path, "every CPU offline")
    return Reading(OnlineCpus(cpus, r.path, "; ".join(sources), reason), r.path)


def nr_cpu_ids(host: Host, online: list[int] | None = None) -> int | None:
    """The kernel's nr_cpu_ids (the highest possible CPU + 1, what "N" and "all" mean in a
    boot argument's CPU list), from cpu/possible; else one past the last online CPU."""
    r = host.read(host.sys("devices/system/cpu/possible")).map(parse_cpulist)
    if r.ok and r.value:
        return max(r.value) + 1
    return max(online) + 1 if online else None


# --------------------------------------------------------------------------------------------
# Virtualization
# --------------------------------------------------------------------------------------------

# collectors/virt.py reads every source that can show a hypervisor (this module's callers
# keep importing it from here)
Virt = virt.Virt
virtualization = virt.virtualization


@dataclass(frozen=True)
class StatSnapshot:
    """One read of /proc/stat (parsed), the file it was read from and when
    (``time.monotonic()``): the opening of a steal window."""

    reading: Reading
    source: str
    t: float


def stat_snapshot(host: Host) -> StatSnapshot:
    """Open a steal window now; :func:`steal_window` closes it."""
    path = host.proc("stat")
    return StatSnapshot(host.read(path).map(parse_proc_stat), str(path), time.monotonic())


@dataclass(frozen=True)
class StealWindow:
    """One CPU's steal over a window of two /proc/stat reads (or since boot), in USER_HZ
    ticks: ``steal_ticks`` of the steal column, ``ticks`` of all its columns (guest time
    left out: it is in user already).

    The kernel keeps steal per CPU in ns (``cpustat[CPUTIME_STEAL]``, from the paravirt
    steal clock) and /proc/stat prints it truncated to whole ticks (fs/proc/stat.c
    ``nsec_to_clock_t``, Linux 4.11+); no mainline kernel (6.18 included) gives user space
    the ns figure. A delta of k ticks is therefore more than k − 1 and less than k + 1
    ticks of steal — one tick may be a few µs that crossed a boundary — and the kernel
    folds steal in at its next tick, which the same ±1 covers: :attr:`min_share` and
    :attr:`max_share` bound the share it can be. One tick in a 0.2 s window (20 ticks) reads
    as 5 % and may be 0: a verdict on the lower bound never turns on one tick."""

    steal_ticks: int
    ticks: int

    @property
    def share(self) -> float:
        """The share as read (0..1)."""
        return self.steal_ticks / self.ticks if self.ticks > 0 else 0.0

    @property
    def min_share(self) -> float:
        """The least share the ticks can be: (k − 1) / window ticks, at least 0."""
        return max(0, self.steal_ticks - 1) / self.ticks if self.ticks > 0 else 0.0

    @property
    def max_share(self) -> float:
        """The most share the ticks can be: (k + 1) / window ticks, at most 1."""
        return min(1.0, (self.steal_ticks + 1) / self.ticks) if self.ticks > 0 else 1.0


def steal_window(host: Host, cpus: list[int], window_s: float = 0.2,
                 start: StatSnapshot | None = None) -> Reading[dict[int, StealWindow]]:
    """Each CPU's steal (:class:`StealWindow`) over ``window_s`` seconds, from two
    /proc/stat reads (``vmstat 1``'s ``st`` column, per CPU). ``start``: a window opened
    earlier by :func:`stat_snapshot`; only what is left of ``window_s`` is slept, so that
    work done since overlaps the window (audit runs its checks in it). On a fixture tree
    (not live) a single read is all there is: the steal since boot instead."""
    path = host.proc("stat")
    if start is None or start.source != str(path):  # a window opened on another host's file
        start = stat_snapshot(host)
    first = start.reading
    if not first.ok:
        return Reading(None, first.path, first.reason)
    if host.live and window_s > 0:
        left = window_s - (time.monotonic() - start.t)
        if left > 0:
            time.sleep(left)
        second = host.read(path).map(parse_proc_stat)
        if not second.ok:
            return Reading(None, second.path, second.reason)
        a, b = first.value.cpus, second.value.cpus
    else:
        a = {c: dict.fromkeys(v, 0) for c, v in first.value.cpus.items()}
        b = first.value.cpus
    out = {}
    for c in cpus:
        if c not in a or c not in b:
            continue
        out[c] = steal_between(a[c], b[c])
    return Reading(out, first.path)


def steal_between(a: dict[str, int], b: dict[str, int]) -> StealWindow:
    """The steal of one CPU between two of its parsed /proc/stat lines (``a`` first)."""
    total = sum(b[k] - a.get(k, 0) for k in b if k not in ("guest", "guest_nice"))
    return StealWindow(max(0, b.get("steal", 0) - a.get("steal", 0)), max(0, total))


def steal_share(host: Host, cpus: list[int], window_s: float = 0.2,
                start: StatSnapshot | None = None) -> Reading[dict[int, float]]:
    """Share (0..1) of each CPU's time stolen by the hypervisor over ``window_s`` seconds
    as read (:func:`steal_window`; its bounds there)."""
    r = steal_window(host, cpus, window_s, start)
    if not r.ok:
        return Reading(None, r.path, r.reason)
    return Reading({c: w.share for c, w in r.value.items()}, r.path)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def process_names(host: Host) -> dict[int, str]:
    """{pid: comm} of every process under procfs (cheap: one small read each)."""
    out = {}
    for pid in host.pids():
        r = host.read(host.proc(pid, "comm"))
        if r.ok:
            out[pid] = r.value.strip()
    return out


@dataclass(frozen=True)
class ProcessTable:
    """{pid: comm} and whether it is the whole table. ``partial`` says why not: PID 1 (init,
    in every PID namespace) is missing, as under ``hidepid=`` for another user or in a
    capture that took only some processes."""

    names: dict[int, str]
    partial: str | None = None


def process_table(host: Host) -> Reading[ProcessTable]:
    """The processes under procfs by name, for checks that look for a daemon (irqbalance,
    tuned...) [ps -e]. None, with the reason, when no /proc/<pid>/comm can be read at all
    (a tree captured without processes): "not running" could not be told from "not shown".
    """
    shown = host.display(host.procfs) + "/*/comm"
    pids = host.pids()
    if not pids:
        return Reading(None, shown, "no /proc/<pid> directories")
    names = process_names(host)
    if not names:
        return Reading(None, shown, f"none of {len(pids)} /proc/<pid>/comm readable")
    partial = None if 1 in names else "PID 1 is not in it (hidepid=, or a partial capture)"
    return Reading(ProcessTable(names, partial), shown)


def find_processes(host: Host, names: set[str]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for pid, comm in process_names(host).items():
        if comm in names:
            found.setdefault(comm, []).append(pid)
    return found


def tuned_profile(host: Host) -> Reading[str]:
    return host.read(host.etc("tuned", "active_profile"))


@dataclass
class ProcessInfo:
    pid: int
    comm: str | None
    cpus_allowed: list[int] | None
    mems_allowed: list[int] | None
    threads: int | None
    environ: dict[str, str] | None
    environ_reason: str | None


def process_info(host: Host, pid: int) -> ProcessInfo | None:
    """Affinity, memory binding, thread count and environment of a process; None if gone."""
    st = host.read(host.proc(pid, "status"))
    if not st.ok:
        return None
    kv = parse_kv(st.value, ":")
    envr = host.read_bytes(host.proc(pid, "environ"))  # bounded: a tree's file may be 2 GiB
    if envr.value is not None:
        env, env_reason = parse_environ(envr.value), None
    elif envr.reason == PERMISSION:
        env, env_reason = None, "permission (retry as root or as the process owner)"
    else:
        env, env_reason = None, f"unreadable: {envr.reason}"

    def cl(key: str) -> list[int] | None:
        try:
            return parse_cpulist(kv[key]) if key in kv else None
        except ValueError:
            return None

    threads = kv.get("Threads")
    return ProcessInfo(pid, kv.get("Name"), cl("Cpus_allowed_list"), cl("Mems_allowed_list"),
                       int(threads) if threads and threads.isdigit() else None, env, env_reason)
