"""The latency source of ``watch --attach PID``: an unmodified process's inference calls,
timed by uprobes on its runtime's once-per-call function (agent/trace/attach.py chooses it,
agent/trace/uprobe.py defines the events) and read from watch's own tracefs instance, the same
rings that hold the sched/irq events the spikes are explained with.

Pairing, per thread: the outermost entry to its return is one call (a nested or recursive
entry only deepens the count), so threads calling at the same time stay apart. A return
without its entry (the call began before the attach) is skipped and counted. A call still
open when its thread or the process ends is closed, counted in ``open_at_exit`` and not made
a sample (its end is unknown). Events the kernel lost (a ring overwritten) make the pairing
start again from a clean state (``resynced``) rather than pair across the gap.

Each call becomes one row of :data:`agent.client.FIELDS`: ``start_ns``/``end_ns`` from the
entry and return events (CLOCK_MONOTONIC: the instance's ``mono`` clock), ``pid`` the
process, ``tid`` the calling thread, ``cpu_start``/``cpu_end`` the CPUs of the two events;
the in-process evidence a client records (context switches, faults, CPU time, run-queue
delay) is -1 (unknown): the kernel events give it per spike instead.

Entry-only timing (``--attach-symbol`` without ``--unsafe-return``): a sample is the time from
one entry to the next on the same thread, i.e. the call period, not the call's latency; the
run header says so.
"""

from __future__ import annotations

import os
import time

import numpy as np

from agent.client import FIELDS
from collectors.host import Host

F = {name: i for i, name in enumerate(FIELDS)}
TID_REFRESH_S = 1.0


class AttachedReader:
    """``read()`` → rows of :data:`FIELDS` for the calls completed since the last read."""

    def __init__(self, host: Host, pid: int, events, uprobes, entry_only: bool) -> None:
        self.host = host
        self.pid = pid
        self.events = events          # agent.trace.tracefs.EventSource (uprobes added)
        self.uprobes = uprobes        # agent.trace.uprobe.Uprobes
        self.entry_only = entry_only
        self.path = f"uprobes {uprobes.group} on pid {pid}"
        self.creator_pid = pid
        self.calls = 0
        self.unpaired_returns = 0
        self.open_at_exit = 0
        self.resynced = 0
        self.lost = 0                 # for the session's counters (a ring reader's name)
        self.invalid = 0
        self._seq = 0
        self._depth: dict[int, int] = {}
        self._start: dict[int, tuple[int, int]] = {}   # tid -> (ts, cpu) of the outer entry
        self._lost_seen = events.lost()
        self._tids = self.threads()
        self._tids_at = time.monotonic()

    def threads(self) -> set[int]:
        return {int(t) for t in self.host.listdir(self.host.proc(self.pid, "task"))
                if t.isdigit()}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._tids_at < TID_REFRESH_S:
            return
        self._tids_at = now
        tids = self.threads()
        if not tids:
            return
        if tids != self._tids:
            for gone in set(self._depth) - tids:  # a thread ended inside a call
                if self._depth.pop(gone, 0) > 0:
                    self.open_at_exit += 1
                self._start.pop(gone, None)
            self._tids = tids
            for inst in self.uprobes.instances:
                try:
                    self.uprobes.set_filter(inst, sorted(tids))
                except OSError:
                    pass

    def read(self, max_records: int | None = None) -> np.ndarray:
        self._refresh()
        lost = self.events.lost()
        if lost != self._lost_seen:  # events lost: pair again from a clean state
            self._lost_seen = lost
            if self._depth:
                self.resynced += 1
            self._depth.clear()
            self._start.clear()
        rows: list[list[int]] = []
        is_ret = self.events.is_return
        refreshed = False
        for ev in self.events.uprobe_events():
            tid = ev.pid
            if tid not in self._tids:
                if not refreshed:  # a thread started since the last look?
                    refreshed = True
                    self._tids_at = 0.0
                    self._refresh()
                if tid not in self._tids:
                    continue  # another process mapping the same library (no filter applies)
            if is_ret(ev):
                d = self._depth.get(tid, 0)
                if d <= 0:
                    self.unpaired_returns += 1
                    continue
                if d > 1:
                    self._depth[tid] = d - 1
                    continue
                self._depth[tid] = 0
                t0, c0 = self._start.pop(tid)
                rows.append(self._row(t0, ev.ts_ns, tid, c0, ev.cpu))
            elif self.entry_only:
                prev = self._start.get(tid)
                self._start[tid] = (ev.ts_ns, ev.cpu)
                if prev is not None:
                    rows.append(self._row(prev[0], ev.ts_ns, tid, prev[1], ev.cpu))
            else:
                d = self._depth.get(tid, 0)
                if d == 0:
                    self._start[tid] = (ev.ts_ns, ev.cpu)
                self._depth[tid] = d + 1
        if not rows:
            return np.empty((0, len(FIELDS)), dtype=np.int64)
        return np.array(rows, dtype=np.int64)

    def _row(self, t0: int, t1: int, tid: int, c0: int, c1: int) -> list[int]:
        self._seq += 1
        self.calls += 1
        r = [-1] * len(FIELDS)
        r[F["seq"]] = r[F["seq2"]] = self._seq
        r[F["start_ns"]], r[F["end_ns"]] = t0, t1
        r[F["pid"]], r[F["tid"]] = self.pid, tid
        r[F["cpu_start"]], r[F["cpu_end"]] = c0, c1
        return r

    def finish(self) -> None:
        """The process ended (or watch stops): calls still open are closed and counted."""
        self.open_at_exit += sum(1 for d in self._depth.values() if d > 0)
        self._depth.clear()
        self._start.clear()

    def stats(self) -> dict:
        return {"calls": self.calls, "unpaired_returns": self.unpaired_returns,
                "open_at_exit": self.open_at_exit, "resynced": self.resynced,
                "timing": "entry to next entry (call period)" if self.entry_only else
                "entry to return"}

    def close(self) -> None:
        self.finish()


def process_cpus(host: Host, pid: int) -> list[int]:
    """The CPUs the process's threads may run on (the union of their affinities)."""
    cpus: set[int] = set()
    for t in host.listdir(host.proc(pid, "task")):
        if t.isdigit():
            try:
                cpus |= os.sched_getaffinity(int(t))
            except OSError:
                continue
    return sorted(cpus)
