"""Scheduler signals for the probe's threads and the tasks sharing its CPUs.

Sources (per watched thread, read with pread on kept-open descriptors):
- /proc/<pid>/task/<tid>/schedstat  ns on CPU, ns waiting on a run queue, timeslices
                                    [perf sched latency; cat /proc/PID/task/TID/schedstat]
                                    every round
- /proc/<pid>/task/<tid>/stat       last CPU (field 39) ⇒ migrations; minor/major faults
- /proc/<pid>/task/<tid>/status     voluntary / nonvoluntary context switches
                                    [pidstat -w -t -p PID 1]
                                    (stat and status every ``status_every``-th round: 20 Hz)
And, every ``scan_period_s`` or when a spike asks for it, a scan of every task's stat and
schedstat: which tasks ran on the probe CPUs (by CPU time consumed between two scans), and how
many were runnable there — "who preempted the probe" [top -H; perf sched timehist].

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
from dataclasses import dataclass

from collectors.base import Availability
from collectors.host import Host, HotFile
from collectors.layout import TokenLayout
from collectors.parsers import ParseError


def _stat_uint(tok: bytes, what: str) -> int:
    if not tok.isdigit() or len(tok) > 20:
        raise ParseError(f"bad {what} {tok[:24]!r} in stat")
    return int(tok)


def parse_stat_fields(data: bytes) -> tuple[str, str, int, int, int, int]:
    """/proc/<pid>/task/<tid>/stat bytes → (comm, state, minflt, majflt, utime+stime ticks,
    processor). comm may contain spaces and ')' — split at the last ')'. Pure; raises
    :class:`~collectors.parsers.ParseError` on a truncated or garbled file."""
    lp, r = data.find(b"("), data.rfind(b")")
    if lp < 0 or r < lp:
        raise ParseError("bad stat: no (comm)")
    comm = data[lp + 1:r].decode(errors="replace")
    rest = data[r + 2:].split()
    if len(rest) < 37 or len(rest[0]) != 1 or not rest[0].isalpha():
        raise ParseError("truncated stat")
    return (comm, rest[0].decode(), _stat_uint(rest[7], "minflt"),
            _stat_uint(rest[9], "majflt"),
            _stat_uint(rest[11], "utime") + _stat_uint(rest[12], "stime"),
            _stat_uint(rest[36], "processor"))


def thread_layouts(keys: tuple[str, ...], ss: bytes, st: bytes,
                   status: bytes | None) -> tuple[TokenLayout, TokenLayout, TokenLayout | None]:
    """Token layouts of one thread's schedstat, stat and status reads giving exactly the
    values :meth:`SchedCollector.sample` takes from them (the native reader applies them;
    ``keys`` as :class:`_Thread`'s). stat's pid and comm tokens are names: a renamed thread
    no longer matches. Raises ValueError on reads sample() would not parse either. Pure."""
    n = len(ss.split())
    if n < 3:
        raise ValueError("bad schedstat")
    lss = TokenLayout(n, (), (), (0, 1, 2), keys[0:3])
    r = st.rfind(b")")
    head = st[:r + 1].split()
    nh, rest = len(head), st[r + 2:].split()
    if r < 0 or len(rest) < 37:
        raise ValueError("bad stat")
    lst = TokenLayout(nh + len(rest), range(nh), head, (nh + 7, nh + 9, nh + 36), keys[3:6])
    lsw = None
    if status is not None:
        tok = status.split()
        i, j = tok.index(b"voluntary_ctxt_switches:"), tok.index(b"nonvoluntary_ctxt_switches:")
        lsw = TokenLayout(len(tok), (i, j), (tok[i], tok[j]), (i + 1, j + 1), keys[6:8])
    return lss, lst, lsw


def parse_status_switches(data: bytes) -> tuple[int, int]:
    """/proc/<pid>/status bytes → (voluntary, nonvoluntary) context switches. Pure; raises
    :class:`~collectors.parsers.ParseError` when a line is missing or not a count."""

    def value(key: bytes) -> int:
        i = data.find(key)
        if i < 0:
            raise ParseError("no ctxt_switches lines in status")
        i += len(key)
        j = data.find(b"\n", i)
        v = data[i:] if j < 0 else data[i:j]  # the last line may lack its newline
        v = v.strip(b" \t")
        if not v.isdigit() or len(v) > 20:
            raise ParseError(f"bad {key.strip()!r} value {v[:24]!r} in status")
        return int(v)

    return value(b"\nvoluntary_ctxt_switches:"), value(b"\nnonvoluntary_ctxt_switches:")


@dataclass
class _Thread:
    tid: int
    schedstat: HotFile
    stat: HotFile
    status: HotFile | None
    keys: tuple[str, ...] = ()  # run_ns rq_delay_ns slices minflt majflt cpu nvcsw nivcsw
    layouts: tuple | None = None  # native replay: the three files' token layouts

    def __post_init__(self) -> None:
        p = f"sched.{self.tid}."
        self.keys = tuple(p + k for k in ("run_ns", "rq_delay_ns", "slices", "minflt",
                                          "majflt", "cpu", "nvcsw", "nivcsw"))


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
    # The native sampler feeds its per-thread files (host.open_hot); the task scan reads live.
    replayable = True
    period_s = 0.0

    def __init__(self, host: Host, pids: list[int], cpus: list[int], *,
                 scan_period_s: float = 2.0, min_scan_gap_s: float = 0.25,
                 max_threads: int = 8, status_every: int = 5,
                 period_s: float = 0.0) -> None:
        self.host = host
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
        self._prev_runs: dict[int, int] = {}  # tid → schedstat run ns (watched CPUs)
        self._prev_ticks: dict[int, int] = {}  # tid → utime+stime ticks (every task)
        self._others_total: dict[int, int] = {}  # CPU → ns others ran there (counter)
        self._last_scan_ns = 0
        self._scan_requested = False
        self.defer_scan = False  # set by the native sampler: see live_extra()
        self.exclude_pids: set[int] = set()  # not "others" in scans (the native reader)
        self.scans: deque[Scan] = deque(maxlen=64)
        self.dropped: dict[int, str] = {}
        # schedstat (the run-queue delay, 1 µs to read) is read every round; stat (faults,
        # last CPU) and status (context switches; the kernel formats ~50 lines) every
        # ``status_every`` rounds: cold, right after the sampler wakes, they cost ~14 and
        # ~16 µs per read on the dev VM, most of the collector's budget at 100 Hz.
        self.status_every = max(1, status_every) if not period_s else 1
        self._round = 0
        self._planned = False  # replay_plan counted this row's round
        self._plans: tuple | None = None  # native replay: (with stat and status, without)

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
        # stat and status on one round in status_every: the native reader reads them that
        # often (sample() then asks the file whether this round has them: due())
        st.every = self.status_every
        if status is not None:
            status.every = self.status_every
        self._threads[tid] = _Thread(tid, ss, st, status)
        self._plans = None

    def sample(self) -> dict[str, float | None]:
        if not self._threads and not self._wanted:
            self._wanted.update(p for p in self.pids)  # main threads until records name more
        for tid in list(self._wanted):
            self._wanted.discard(tid)
            self._attach(tid)
        out: dict[str, float | None] = {}
        if self._planned:  # this row's plan was not used: it counted already
            self._planned = False
        else:
            self._round += 1
        want_status = self._round % self.status_every == 1 or self.status_every == 1
        native = self.defer_scan  # the native reader feeds us: keep its layouts current
        for tid, th in list(self._threads.items()):
            try:
                ss_data = th.schedstat.read()
                ss = ss_data.split()
                k = th.keys
                out[k[0]] = float(ss[0])
                out[k[1]] = float(ss[1])
                out[k[2]] = float(ss[2])
                if want_status if not native or self.status_every == 1 else th.stat.due():
                    st = th.stat.read()
                    # fields after "(comm) ": state=0 minflt=7 majflt=9 processor=36
                    f = st[st.rfind(b")") + 2:].split()
                    out[k[3]] = float(f[7])
                    out[k[4]] = float(f[9])
                    out[k[5]] = float(f[36])
                    sw = None
                    if th.status is not None:
                        sw = th.status.read()
                        v, n = parse_status_switches(sw)
                        out[k[6]] = float(v)
                        out[k[7]] = float(n)
                    if native:
                        self._check_layouts(th, ss_data, st, sw)
            except (OSError, ValueError, IndexError) as exc:
                # ESRCH / ENOENT: the thread exited. Drop it (and what was read of it this
                # round); it is not a 0.
                for key in th.keys:
                    out.pop(key, None)
                self.dropped[tid] = getattr(exc, "strerror", None) or str(exc)
                self._close_thread(th)
                del self._threads[tid]
                self._plans = None
                continue
        if not self._threads and self.pids and all(
                not self.host.exists(self.host.proc(p)) for p in self.pids):
            raise ProcessLookupError(f"watched process(es) {self.pids} exited")
        if not self.defer_scan:
            out.update(self.live_extra())
        return out

    def live_extra(self) -> dict[str, float | None]:
        """The task scan when it is due (every ``scan_period_s``, or asked for by a spike and
        ``min_scan_gap_s`` after the last): read live, now. The native sampler sets
        ``defer_scan`` and calls this after replaying a batch, merging the scan into the
        newest row, so a scan is never stamped with an older recorded round's time."""
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

        Cost (the scan also runs on spikes, up to 4 times a second): plain string paths and
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
        own = set(self.pids) | {os.getpid()} | self.exclude_pids
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

    def _check_layouts(self, th: _Thread, ss: bytes, st: bytes, sw: bytes | None) -> None:
        """(native replay) Rebuild the thread's layouts when these reads no longer fit them
        (first read, a renamed thread, a status line that changed length)."""
        lay = th.layouts
        if lay is not None and lay[0].values(ss.split()) is not None and \
                lay[1].values(st.split()) is not None and \
                (sw is None or lay[2] is None or lay[2].values(sw.split()) is not None):
            return
        try:
            th.layouts = thread_layouts(th.keys, ss, st, sw)
        except ValueError:
            th.layouts = None  # no shortcut for this thread: sample() reads it
        self._plans = None

    def replay_plan(self) -> tuple | None:
        """The native sampler's shortcut (agent/watch/feed.py): this row is each thread's
        schedstat values and, on the rounds :meth:`sample` reads them, its stat and status
        values, in sample()'s key order (whether this round has stat and status: due()).
        None while threads are to be attached
        or before every thread has layouts (sample() runs)."""
        self._planned = False
        if not self.defer_scan or self._wanted or not self._threads:
            return None
        plans = self._plans
        if plans is None:
            ths = list(self._threads.values())
            if any(th.layouts is None for th in ths):
                return None
            full, short = [], []
            for th in ths:
                lss, lst, lsw = th.layouts
                short.append((th.schedstat, lss))
                full += [(th.schedstat, lss), (th.stat, lst)]
                if th.status is not None and lsw is not None:
                    full.append((th.status, lsw))
                elif th.status is not None:
                    return None  # status was never read with stat: sample() first
            plans = self._plans = (tuple(full), tuple(short))
        self._round += 1
        self._planned = True
        if self.status_every == 1:
            return plans[0]
        # the native reader reads stat and status on one round in status_every: this one?
        return plans[0] if next(iter(self._threads.values())).stat.due() else plans[1]

    def _close_thread(self, th: _Thread) -> None:
        for hf in (th.schedstat, th.stat, th.status):
            if hf is not None:
                hf.close()

    def close(self) -> None:
        for th in self._threads.values():
            self._close_thread(th)
        self._threads.clear()
        self._plans = None
