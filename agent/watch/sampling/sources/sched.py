"""SchedCollector: scheduler signals of the probe's threads and a scan of the tasks sharing
its CPUs (collectors/sched.py: files, parse, layout per thread; TaskRun and Scan).

Per watched thread, its schedstat every row, its stat and status on one row in
``status_every`` (20 Hz at the default 100 Hz; the native reader reads them on those rounds
only). And, every ``scan_period_s`` or when a spike asks for it, a scan of every task's stat
and schedstat: which tasks ran on the probe CPUs (by CPU time consumed between two scans), and
how many were runnable there — "who preempted the probe" [top -H; perf sched timehist]. The
scan reads live: the native sampler runs it after replaying a batch (:meth:`live_extra`).

Signals (``sched.<tid>.*``): ``run_ns``, ``rq_delay_ns``, ``slices``, ``minflt``, ``majflt``,
``nvcsw``, ``nivcsw`` (counters); ``cpu`` (gauge: the CPU the thread last ran on). On scan
rounds: ``sched.cpu<N>.runnable`` (gauge: tasks other than the probe in state R whose last
CPU is N) and ``sched.cpu<N>.others_run_ns`` (counter: CPU ns the other tasks consumed on N,
summed over the scans since watch started). A thread that exits is dropped, not reported as 0.
"""

from __future__ import annotations

import os
import time
from collections import deque
from functools import partial

from agent.watch.sampling.sources.base import HotSource, Track
from collectors import sched as schedmod
from collectors.base import Availability
from collectors.host import Host
from collectors.sched import Scan, TaskRun

# A spike's record waits for a task scan after its end (who ran, others' CPU share). Scans on
# spikes come at most this often: 0.25 s held records back up to ~0.6 s in a storm
# (bench/attribution.py); one scan costs ~1 ms of CPU with ~130 tasks, so a storm pays ≤ ~1 %
# of one CPU for them.
MIN_SCAN_GAP_S = 0.1


class _Thread:
    """A watched thread: its three tracks (status may be missing) and its signal names."""

    __slots__ = ("tid", "schedstat", "stat", "status", "keys")

    def __init__(self, tid: int, schedstat: Track, stat: Track, status: Track | None) -> None:
        self.tid = tid
        self.schedstat = schedstat
        self.stat = stat
        self.status = status
        self.keys = schedmod.signal_keys(tid)


class SchedCollector(HotSource):
    """Per-thread scheduler counters of the watched processes, plus a task scan of the probe
    CPUs (see module docstring)."""

    name = "sched"
    period_s = 0.0

    def __init__(self, host: Host, pids: list[int], cpus: list[int], *,
                 scan_period_s: float = 2.0, min_scan_gap_s: float = MIN_SCAN_GAP_S,
                 max_threads: int = 8, status_every: int = 5,
                 period_s: float = 0.0) -> None:
        super().__init__(host)
        # period_s 0: every sampler round (the default; an external source's records carry
        # no run-queue delay of their own, so schedstat at the full rate is its only one).
        # A source that measures its own per-call run-queue delay (the built-in probes) can
        # use 0.05: the whole collector at 20 Hz, stat and status on every one of its rounds.
        self.period_s = period_s
        self.pids = list(pids)
        self.cpus = frozenset(cpus)
        self.scan_period_s = scan_period_s
        self.min_scan_gap_s = min_scan_gap_s
        self.max_threads = max_threads
        self._threads: dict[int, _Thread] = {}
        self._wanted: set[int] = set()
        # tid → its process, as the records named it (a service followed by name has no
        # pids of its own here: its processes come and go)
        self._tid_pid: dict[int, int] = {}
        self._prev_runs: dict[int, int] = {}  # tid → schedstat run ns (watched CPUs)
        self._prev_ticks: dict[int, int] = {}  # tid → utime+stime ticks (every task)
        self._others_total: dict[int, int] = {}  # CPU → ns others ran there (counter)
        self._last_scan_ns = 0
        self._scan_requested = False
        self.exclude_pids: set[int] = set()  # not "others" in scans (the native reader)
        self.scans: deque[Scan] = deque(maxlen=64)
        self.dropped: dict[int, str] = {}
        self._dropped_pid: dict[int, int] = {}  # a dropped thread's process, where known
        # an exited thread's signal names, until the sampler retires them in this
        # collector's ring (their columns go to later threads: SignalRing.retire)
        self.gone: list[str] = []
        # stat (faults, last CPU) and status (context switches; the kernel formats ~50 lines)
        # on one row in status_every (see _attach)
        self.status_every = max(1, status_every) if not period_s else 1

    # -- configuration ---------------------------------------------------------------------
    def slow_to(self, period_s: float) -> None:
        """Sample the whole collector every ``period_s`` from now on, stat and status on
        each of its rows (as one built with that period). Before the sampler is built: it
        takes each collector's period then (agent/watch/wiring.py reduce_for_events)."""
        self.period_s = period_s
        self.status_every = 1
        for t in self.tracks.values():
            if t.every != 1:
                t.every = 1
                self.gen += 1

    def watch_tids(self, tids, pids: dict[int, int] | None = None) -> None:
        """Threads to follow at full rate (the ones that report latencies), at most
        ``max_threads`` new ones a round; ``pids``: a thread's process where the records
        name it (a service followed by name, ``--attach-name``, gives this collector no pids:
        without them its threads had no schedstat rows, and its spikes past the CPU budget
        no polled run-queue wait)."""
        for t in tids:
            t = int(t)
            if t in self.dropped and pids and t in pids and \
                    self._dropped_pid.get(t, pids[t]) != pids[t]:
                # the tid of a thread gone, given again by the kernel to one of another
                # process (a restarted service's, after pid_max wraps): a new thread
                del self.dropped[t]
                del self._dropped_pid[t]
            if t not in self._threads and t not in self.dropped and \
                    len(self._wanted) < self.max_threads:
                self._wanted.add(t)
                if pids and t in pids:
                    self._tid_pid[t] = int(pids[t])

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
    def _open_tracks(self) -> None:
        """(The tracks are the watched threads': :meth:`prepare` attaches them.)"""

    def _pid_of(self, tid: int) -> int | None:
        for pid in self.pids:
            if self.host.exists(self.host.proc(pid, "task", tid)):
                return pid
        pid = self._tid_pid.get(tid)
        if pid is not None and self.host.exists(self.host.proc(pid, "task", tid)):
            return pid
        return None

    def _attach(self, tid: int) -> None:
        pid = self._pid_of(tid)
        if pid is None:
            self.dropped[tid] = "absent"
            self._tid_pid.pop(tid, None)
            return
        paths = schedmod.files(self.host, pid, tid)
        p = f"sched.{tid}."
        # stat and status on one row in status_every (the native reader reads them on those
        # rounds only): cold, right after the sampler wakes, they cost ~14 and ~16 µs a read
        # on a VM, most of the collector's budget at 100 Hz; schedstat (the run-queue delay,
        # 1 µs to read) every row
        every = self.status_every
        added: list[str] = []
        try:
            for name in ("schedstat", "stat", "status"):
                try:
                    self._add(p + name, paths[name], partial(schedmod.parse_file, name, tid=tid),
                              partial(schedmod.layout, name, tid=tid),
                              1 if name == "schedstat" else every,
                              python_layout=name != "status")
                except OSError:
                    if name != "status":
                        raise
                    continue
                added.append(p + name)
        except OSError as exc:
            for key in added:
                self._drop(key)
            self.dropped[tid] = exc.strerror or "error"
            self._tid_pid.pop(tid, None)
            return
        t = self.tracks
        self._threads[tid] = _Thread(tid, t[p + "schedstat"], t[p + "stat"],
                                     t.get(p + "status"))

    def prepare(self) -> None:
        if not self._threads and not self._wanted:
            self._wanted.update(p for p in self.pids)  # main threads until records name more
        for tid in list(self._wanted):
            self._wanted.discard(tid)
            self._attach(tid)

    def sample(self) -> dict[str, float | None]:
        """A row read now (the Python sampler), with the task scan when it is due."""
        out = super().sample()
        out.update(self.live_extra())
        return out

    def row(self, reads: dict) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        values = self.values
        for tid, th in list(self._threads.items()):
            ss = reads.get(th.schedstat.key)
            if ss is None:
                continue  # not in this round (a replayed round before the files were read)
            try:
                if isinstance(ss, OSError):
                    raise ss
                out.update(values(th.schedstat, ss))
                for t in (th.stat, th.status):
                    data = reads.get(t.key) if t is not None else None
                    if data is None:
                        continue  # not due this row
                    if isinstance(data, OSError):
                        raise data
                    out.update(values(t, data))
            except (OSError, ValueError) as exc:
                # ESRCH / ENOENT: the thread exited; a ParseError: its files are not what
                # they should be. Drop it (and what was read of it this round); not a 0.
                for key in th.keys:
                    out.pop(key, None)
                self.dropped[tid] = getattr(exc, "strerror", None) or str(exc)
                if tid in self._tid_pid:
                    self._dropped_pid[tid] = self._tid_pid[tid]
                self.gone.extend(th.keys)
                self._close_thread(th)
        if not self._threads and self.pids and all(
                not self.host.exists(self.host.proc(p)) for p in self.pids):
            raise ProcessLookupError(f"watched process(es) {self.pids} exited")
        return out

    def live_extra(self) -> dict[str, float | None]:
        """The task scan when it is due (every ``scan_period_s``, or asked for by a spike and
        ``min_scan_gap_s`` after the last): read live, now. :meth:`sample` ends with it; the
        native sampler calls it after replaying a batch and merges it into the newest row,
        so a scan is never stamped with an older recorded round's time."""
        now = time.monotonic_ns()
        gap = now - self._last_scan_ns
        if (gap >= self.scan_period_s * 1e9
                or (self._scan_requested and gap >= self.min_scan_gap_s * 1e9)):
            self._scan_requested = False
            return self.scan()
        return {}

    def scan(self) -> dict[str, float | None]:
        """Read every task's stat (and the schedstat of those on the watched CPUs); record
        which ran on the watched CPUs since the previous scan.

        Cost (the scan also runs on spikes, up to 1 / MIN_SCAN_GAP_S times a second): plain string paths and
        os.open/os.read; a single-threaded process (every kernel thread) is read once, from
        /proc/PID/stat, without listing its task/ directory; schedstat (ns) only for tasks
        whose last CPU is a watched one. A task that was on another CPU at the previous scan has no ns
        baseline: its run time since is taken from stat's utime+stime (USER_HZ ticks, 10 ms
        resolution) — coarse, but never invented."""
        runs: list[TaskRun] = []
        cpus = self.cpus
        runnable = dict.fromkeys(cpus, 0)
        others = dict.fromkeys(cpus, 0)
        cur_ns: dict[int, int] = {}
        cur_ticks: dict[int, int] = {}
        own = set(self.pids) | set(self._tid_pid.values()) | {os.getpid()} | self.exclude_pids
        prev_ns, prev_ticks = self._prev_runs, self._prev_ticks
        first = not self._last_scan_ns
        proc = os.fspath(self.host.procfs)
        o_open, o_read, o_close, rdonly = os.open, os.read, os.close, os.O_RDONLY | os.O_CLOEXEC
        def read(path: str) -> bytes:
            fd = o_open(path, rdonly)
            try:
                return o_read(fd, 4096)
            finally:
                o_close(fd)

        for pname in os.listdir(proc):
            if not (pname.isdigit() and pname.isascii()):  # ("٣".isdigit() and int() is 3)
                continue
            pid = int(pname)
            pdir = f"{proc}/{pname}"
            try:
                data = read(pdir + "/stat")
                r = data.rfind(b")")
                f = data[r + 2:].split()
                if f[17] == b"1":
                    # Single-threaded (every kernel thread, most daemons): the process's stat
                    # is its one task's; no task/ listing, no second open.
                    tasks = [(pid, pdir, data, r, f)]
                else:
                    tasks = []
                    tdir = pdir + "/task/"
                    for tname in os.listdir(tdir):
                        if not (tname.isdigit() and tname.isascii()):
                            continue
                        try:
                            d = read(tdir + tname + "/stat")
                        except OSError:
                            continue  # exited during the scan
                        rr = d.rfind(b")")
                        tasks.append((int(tname), tdir + tname, d, rr, d[rr + 2:].split()))
            except (OSError, ValueError, IndexError):
                continue  # exited during the scan
            for tid, base, data, r, f in tasks:
                try:
                    cpu = int(f[36])
                    ticks = int(f[11]) + int(f[12])
                except (ValueError, IndexError):
                    continue
                cur_ticks[tid] = ticks
                if cpu not in cpus:
                    continue
                run_ns = None
                try:
                    run_ns = int(read(base + "/schedstat").split()[0])
                    cur_ns[tid] = run_ns
                except (OSError, ValueError, IndexError):
                    pass  # no schedstat (CONFIG_SCHED_INFO off): ticks below
                if pid in own:
                    continue
                state = f[0].decode()
                if state == "R":
                    runnable[cpu] += 1
                if first:
                    continue
                p_ns = prev_ns.get(tid)
                if run_ns is not None and p_ns is not None:
                    delta = run_ns - p_ns
                elif tid in prev_ticks:
                    delta = (ticks - prev_ticks[tid]) * 10_000_000
                else:
                    # Absent from the previous scan: it started since, so all its run time
                    # falls in this interval (a freshly started hog is the typical culprit).
                    delta = run_ns if run_ns is not None else ticks * 10_000_000
                if delta > 0:
                    comm = data[data.find(b"(") + 1:r].decode(errors="replace")
                    runs.append(TaskRun(tid, pid, comm, cpu, delta, state))
                    others[cpu] += delta
        now = time.monotonic_ns()
        if not first:
            runs.sort(key=lambda r: -r.run_ns)
            self.scans.append(Scan(now, self._last_scan_ns, runs))
        self._prev_runs = cur_ns
        self._prev_ticks = cur_ticks
        self._last_scan_ns = now
        out: dict[str, float | None] = {}
        tot = self._others_total
        for c in cpus:
            tot[c] = tot.get(c, 0) + others[c]
            out[f"sched.cpu{c}.runnable"] = float(runnable[c])
            out[f"sched.cpu{c}.others_run_ns"] = float(tot[c])
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

    def others_share(self, t0_ns: int, t1_ns: int, cpus=None, max_span_s: float = 1.0,
                     long_span_s: float = 3.0, long_min_share: float = 0.4) -> float | None:
        """Share of ``cpus``' time (default: the watched CPUs) that tasks other than the
        watched ones consumed in the scan interval(s) overlapping [t0_ns, t1_ns]; None when
        no scan covers the window, or the scans covering it span more than ``max_span_s``
        (an average over seconds says little about a few milliseconds; a spike asks for a
        scan, so a burst's later spikes get ≥ 0.25 s ones) — unless they span at most
        ``long_span_s`` and the share is at least ``long_min_share``: contention that took
        40 % of the CPU over seconds was there at the burst's first spike too, whose scan
        covers the time since the periodic one (2-3 s). An always-busy hog sharing a probe
        CPU gives ~0.5. A task's run time counts on the CPU it was last seen on."""
        want = self.cpus if cpus is None else frozenset(cpus) & self.cpus or self.cpus
        span = used = 0
        for s in list(self.scans):
            if s.t_ns < t0_ns or s.prev_t_ns > t1_ns:
                continue
            span += s.t_ns - s.prev_t_ns
            used += sum(r.run_ns for r in s.runs if r.cpu in want)
        if span <= 0 or span > max(max_span_s, long_span_s) * 1e9:
            return None
        share = min(1.0, used / (span * len(want)))
        if span > max_span_s * 1e9 and share < long_min_share:
            return None
        return share

    def latest_scan_ns(self) -> int:
        return self._last_scan_ns

    def _close_thread(self, th: _Thread) -> None:
        self._threads.pop(th.tid, None)
        self._tid_pid.pop(th.tid, None)
        for t in (th.schedstat, th.stat, th.status):
            if t is not None:
                self._drop(t.key)

    def close(self) -> None:
        self._threads.clear()
        super().close()
