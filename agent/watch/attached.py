"""The latency source of ``watch --attach PID``: an unmodified process's inference calls,
timed by uprobes on its runtime's once-per-call function (agent/trace/attach.py chooses it,
agent/trace/uprobe.py defines the events) and read from watch's own tracefs instance, the same
rings that hold the sched/irq events the spikes are explained with.

Pairing, per thread: the outermost entry to its return is one call (an entry of another
probed function inside it, e.g. LiteRT's Invoke around LiteRtRunCompiledModel, is nested), so
threads calling at the same time stay apart. Each probed function is taken as not re-entered
on one thread (true of every function of the catalogue): an entry of a function whose last
entry on that thread has not returned means that return was never recorded (the kernel could
not place the return probe, or dropped its event), so the open call is dropped and counted in
``lost_returns`` and the new one starts — a lost return never stalls the pairing. A return
without its entry (the call began before the attach) is skipped and counted. A call still open
when its thread or the process ends is closed, counted in ``open_at_exit`` and not made a
sample (its end is unknown). Events the kernel lost (a ring overwritten) make the pairing start
again from a clean state (``resynced``) rather than pair across the gap.

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
        self.lost_returns = 0
        # tid -> {event name of the entry: (ts, cpu)} of its calls open now
        self._open: dict[int, dict[str, tuple[int, int]]] = {}
        # tid -> (ts, cpu) of its outermost open entry (entry-only: of its last entry)
        self._start: dict[int, tuple[int, int]] = {}
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
            for gone in set(self._open) - tids:  # a thread ended inside a call
                if self._open.pop(gone, None):
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
            if any(self._open.values()):
                self.resynced += 1
            self._open.clear()
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
            if self.entry_only:
                prev = self._start.get(tid)
                self._start[tid] = (ev.ts_ns, ev.cpu)
                if prev is not None:
                    rows.append(self._row(prev[0], ev.ts_ns, tid, prev[1], ev.cpu))
                continue
            opened = self._open.setdefault(tid, {})
            if is_ret(ev):
                key = self._entry_of(ev.name)
                if opened.pop(key, None) is None:
                    self.unpaired_returns += 1
                    continue
                if not opened:  # the outermost call returned
                    t0, c0 = self._start.pop(tid)
                    rows.append(self._row(t0, ev.ts_ns, tid, c0, ev.cpu))
            else:
                if ev.name in opened:  # its last entry never returned: a lost return
                    self.lost_returns += 1
                    opened.clear()
                if not opened:
                    self._start[tid] = (ev.ts_ns, ev.cpu)
                opened[ev.name] = (ev.ts_ns, ev.cpu)
        if not rows:
            return np.empty((0, len(FIELDS)), dtype=np.int64)
        return np.array(rows, dtype=np.int64)

    @staticmethod
    def _entry_of(ret_name: str) -> str:
        """The entry event of a return event: ``ret<i>`` → ``call<i>`` (agent/trace/uprobe.py
        names them so)."""
        return "call" + ret_name[3:] if ret_name.startswith("ret") else ret_name

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
        self.open_at_exit += sum(1 for o in self._open.values() if o)
        self._open.clear()
        self._start.clear()

    def stats(self) -> dict:
        return {"calls": self.calls, "unpaired_returns": self.unpaired_returns,
                "lost_returns": self.lost_returns,
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
