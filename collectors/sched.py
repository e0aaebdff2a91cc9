"""Scheduler signals for the probe's threads and the tasks sharing its CPUs.

Sources (per watched thread, read with pread on kept-open descriptors):
- /proc/<pid>/task/<tid>/schedstat  ns on CPU, ns waiting on a run queue, timeslices
                                    [perf sched latency; cat /proc/PID/task/TID/schedstat]
- /proc/<pid>/task/<tid>/stat       last CPU (field 39) ⇒ migrations; minor/major faults
- /proc/<pid>/task/<tid>/status     voluntary / nonvoluntary context switches
                                    [pidstat -w -t -p PID 1]
And, every ``scan_period_s`` or when a spike asks for it, a scan of every task's stat and
schedstat: which tasks ran on the probe CPUs (by CPU time consumed between two scans), and how
many were runnable there — "who preempted the probe" [top -H; perf sched timehist].

Signals (``sched.<tid>.*``): ``run_ns``, ``rq_delay_ns``, ``slices``, ``minflt``, ``majflt``,
``nvcsw``, ``nivcsw`` (counters); ``cpu`` (gauge: the CPU the thread last ran on). On scan
rounds: ``sched.cpu<N>.runnable`` (gauge: tasks other than the probe in state R whose last
CPU is N) and ``sched.cpu<N>.others_run_ns`` (counter-like: CPU ns the other tasks consumed
on N since the previous scan). A thread that exits is dropped, not reported as 0.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass

from collectors.base import Availability
from collectors.host import Host, HotFile


def parse_stat_fields(data: bytes) -> tuple[str, str, int, int, int, int]:
    """/proc/<pid>/task/<tid>/stat bytes → (comm, state, minflt, majflt, utime+stime ticks,
    processor). comm may contain spaces and ')' — split at the last ')'. Pure."""
    r = data.rfind(b")")
    if r < 0:
        raise ValueError("bad stat")
    comm = data[data.find(b"(") + 1:r].decode(errors="replace")
    rest = data[r + 2:].split()
    return (comm, rest[0].decode(), int(rest[7]), int(rest[9]), int(rest[11]) + int(rest[12]),
            int(rest[36]))


def parse_status_switches(data: bytes) -> tuple[int, int]:
    """/proc/<pid>/status bytes → (voluntary, nonvoluntary) context switches. Pure."""
    i = data.find(b"\nvoluntary_ctxt_switches:")
    j = data.find(b"\nnonvoluntary_ctxt_switches:")
    if i < 0 or j < 0:
        raise ValueError("no ctxt_switches lines in status")
    v = int(data[i + 25:data.find(b"\n", i + 25)])
    n = int(data[j + 28:data.find(b"\n", j + 28)])
    return v, n


@dataclass
class _Thread:
    tid: int
    schedstat: HotFile
    stat: HotFile
    status: HotFile | None


@dataclass(frozen=True)
class TaskRun:
    """A task that consumed CPU on a watched CPU between two scans."""

    tid: int
    pid: int
    comm: str
    cpu: int
    run_ns: int
    state: str


@dataclass
class Scan:
    t_ns: int  # CLOCK_MONOTONIC at the end of the scan
    prev_t_ns: int
    runs: list[TaskRun]


class SchedCollector:
    """Per-thread scheduler counters of the watched processes, plus a task scan of the probe
    CPUs (see module docstring)."""

    name = "sched"
    period_s = 0.0

    def __init__(self, host: Host, pids: list[int], cpus: list[int], *,
                 scan_period_s: float = 2.0, min_scan_gap_s: float = 0.25,
                 max_threads: int = 8, status_every: int = 5) -> None:
        self.host = host
        self.pids = list(pids)
        self.cpus = frozenset(cpus)
        self.scan_period_s = scan_period_s
        self.min_scan_gap_s = min_scan_gap_s
        self.max_threads = max_threads
        self._threads: dict[int, _Thread] = {}
        self._wanted: set[int] = set()
        self._prev_runs: dict[int, int] = {}
        self._last_scan_ns = 0
        self._scan_requested = False
        self.scans: deque[Scan] = deque(maxlen=64)
        self.dropped: dict[int, str] = {}
        # /proc/<tid>/status is the costliest of the three files (the kernel formats ~50
        # lines): read it every ``status_every`` rounds; schedstat carries the run-queue delay
        # at full rate.
        self.status_every = max(1, status_every)
        self._round = 0

    # -- configuration ---------------------------------------------------------------------
    def watch_tids(self, tids) -> None:
        """Threads to follow at full rate (the ones that report latencies)."""
        for t in tids:
            t = int(t)
            if t not in self._threads and t not in self.dropped and \
                    len(self._wanted) < self.max_threads:
                self._wanted.add(t)

    def request_scan(self) -> None:
        """Ask for a task scan at the next round (a spike wants to know who ran)."""
        self._scan_requested = True

    def available(self) -> Availability:
        for pid in self.pids:
            if not self.host.exists(self.host.proc(pid, "schedstat")):
                if self.host.exists(self.host.proc(pid)):
                    return Availability.no("unsupported: no schedstat (CONFIG_SCHED_INFO off)")
                return Availability.no(f"absent: process {pid} not found")
        return Availability.yes()

    def is_counter(self, name: str) -> bool:
        return not (name.endswith(".cpu") or name.endswith(".runnable"))

    # -- sampling ----------------------------------------------------------------------------
    def _pid_of(self, tid: int) -> int | None:
        for pid in self.pids:
            if self.host.exists(self.host.proc(pid, "task", tid)):
                return pid
        return None

    def _attach(self, tid: int) -> None:
        pid = self._pid_of(tid)
        if pid is None:
            self.dropped[tid] = "absent"
            return
        d = self.host.proc(pid, "task", tid)
        try:
            ss = self.host.open_hot(d / "schedstat")
            st = self.host.open_hot(d / "stat")
        except OSError as exc:
            self.dropped[tid] = exc.strerror or "error"
            return
        try:
            status = self.host.open_hot(d / "status")
        except OSError:
            status = None
        self._threads[tid] = _Thread(tid, ss, st, status)

    def sample(self) -> dict[str, float | None]:
        if not self._threads and not self._wanted:
            self._wanted.update(p for p in self.pids)  # main threads until records name more
        for tid in list(self._wanted):
            self._wanted.discard(tid)
            self._attach(tid)
        out: dict[str, float | None] = {}
        self._round += 1
        want_status = self._round % self.status_every == 1 or self.status_every == 1
        for tid, th in list(self._threads.items()):
            try:
                ss = th.schedstat.read().split()
                comm, _state, minflt, majflt, _ticks, cpu = parse_stat_fields(th.stat.read())
                sw = parse_status_switches(th.status.read()) if th.status and want_status \
                    else None
            except (OSError, ValueError, IndexError) as exc:
                # ESRCH / ENOENT: the thread exited. Drop it; it is not a 0.
                self.dropped[tid] = getattr(exc, "strerror", None) or str(exc)
                self._close_thread(th)
                del self._threads[tid]
                continue
            p = f"sched.{tid}."
            out[p + "run_ns"] = float(ss[0])
            out[p + "rq_delay_ns"] = float(ss[1])
            out[p + "slices"] = float(ss[2])
            out[p + "minflt"] = float(minflt)
            out[p + "majflt"] = float(majflt)
            out[p + "cpu"] = float(cpu)
            if sw is not None:
                out[p + "nvcsw"] = float(sw[0])
                out[p + "nivcsw"] = float(sw[1])
        if not self._threads and self.pids and all(
                not self.host.exists(self.host.proc(p)) for p in self.pids):
            raise ProcessLookupError(f"watched process(es) {self.pids} exited")
        now = time.monotonic_ns()
        gap = now - self._last_scan_ns
        if (gap >= self.scan_period_s * 1e9
                or (self._scan_requested and gap >= self.min_scan_gap_s * 1e9)):
            self._scan_requested = False
            out.update(self.scan())
        return out

    def scan(self) -> dict[str, float | None]:
        """Read every task's stat + schedstat; record which ran on the watched CPUs."""
        runs: list[TaskRun] = []
        runnable = dict.fromkeys(self.cpus, 0)
        others = dict.fromkeys(self.cpus, 0)
        cur: dict[int, int] = {}
        own = set(self.pids) | {os.getpid()}
        proc = self.host.procfs
        for pname in os.listdir(proc):
            if not pname.isdigit():
                continue
            pid = int(pname)
            try:
                tids = os.listdir(proc / pname / "task")
            except OSError:
                continue
            for tname in tids:
                base = proc / pname / "task" / tname
                try:
                    with open(base / "stat", "rb") as fh:
                        comm, state, _mn, _mj, ticks, cpu = parse_stat_fields(fh.read())
                    try:
                        with open(base / "schedstat", "rb") as fh:
                            run_ns = int(fh.read().split()[0])
                    except (OSError, ValueError, IndexError):
                        run_ns = ticks * 10_000_000  # no schedstat: 100 Hz ticks
                except (OSError, ValueError, IndexError):
                    continue  # exited during the scan
                tid = int(tname)
                cur[tid] = run_ns
                if cpu not in self.cpus or pid in own:
                    continue
                if state == "R":
                    runnable[cpu] += 1
                prev = self._prev_runs.get(tid)
                # A task absent from the previous scan started since: all its run time falls
                # in this interval (a freshly started hog is the typical culprit).
                delta = (run_ns - (prev or 0)) if self._last_scan_ns else 0
                if delta > 0:
                    runs.append(TaskRun(tid, pid, comm, cpu, delta, state))
                    others[cpu] += delta
        now = time.monotonic_ns()
        if self._last_scan_ns:
            runs.sort(key=lambda r: -r.run_ns)
            self.scans.append(Scan(now, self._last_scan_ns, runs))
        self._prev_runs = cur
        self._last_scan_ns = now
        out: dict[str, float | None] = {}
        for c in self.cpus:
            out[f"sched.cpu{c}.runnable"] = float(runnable[c])
            out[f"sched.cpu{c}.others_run_ns"] = float(others[c])
        return out

    def who_ran(self, t0_ns: int, t1_ns: int, cpus=None) -> list[TaskRun]:
        """Tasks other than the watched ones that consumed CPU on ``cpus`` (default: the
        watched CPUs) in the scan interval(s) overlapping [t0_ns, t1_ns], biggest first.
        Resolution is the scan interval (≥ ``min_scan_gap_s``)."""
        want = self.cpus if cpus is None else frozenset(cpus)
        agg: dict[int, TaskRun] = {}
        for s in list(self.scans):
            if s.t_ns < t0_ns or s.prev_t_ns > t1_ns:
                continue
            for r in s.runs:
                if r.cpu not in want:
                    continue
                old = agg.get(r.tid)
                agg[r.tid] = r if old is None else TaskRun(r.tid, r.pid, r.comm, r.cpu,
                                                          old.run_ns + r.run_ns, r.state)
        return sorted(agg.values(), key=lambda r: -r.run_ns)

    def latest_scan_ns(self) -> int:
        return self._last_scan_ns

    def _close_thread(self, th: _Thread) -> None:
        for hf in (th.schedstat, th.stat, th.status):
            if hf is not None:
                hf.close()

    def close(self) -> None:
        for th in self._threads.values():
            self._close_thread(th)
        self._threads.clear()
