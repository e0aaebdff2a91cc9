"""The CPU's story: the first machine of the timeline walk — what ran on the call's CPU.

:class:`CpuStory` walks the CPU's events in time order — the current task, the interrupt
contexts (:class:`~.contexts.Contexts`: hard IRQ handlers, softirqs, APIC vectors), the work
item a kworker runs — and charges every interval between two events to the innermost
context active in it (a task, ``idle``, an IRQ, a softirq, the local timer tick, an IPI, a
vector, a work item; see :mod:`.timeline`). Which task ran is read from every event's
``common_pid`` (the task current on that CPU when it fired), so a lost ``sched_switch``
cannot make the walk charge the wrong task for long. An exit whose entry lies before the
window (or was lost) charges the interval before it to that context. The probe's own time
on the CPU (``probe_run_ns``, ``probe_current_ns``), its wake-up latency (its
``sched_waking``/``sched_wakeup`` followed by its switch-in), its preemptions, blocks and
migrations, and whether it ran here at all (the idle's label) are this machine's.

How it meets the followed thread's machine (:mod:`.thread_states`): it owns a
:class:`~.thread_states.ThreadStates` and drives it — while the thread is not on the CPU,
each interval goes through :meth:`~.thread_states.ThreadStates.overlay` before it is
charged (what the CPU ran becomes the thread's part, or its wake-up latency); the thread's
switches, wakings (those of other CPUs too: :meth:`CpuStory.remote`), signals, migrations,
sleep timers and block I/O are handed to it; an event in the thread's context says it ran.
At the end the thread's machine closes what is open before this one names the idle and
picks the sample's switch-in (:meth:`CpuStory.finish`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .accounting import (
    FAULT_EVENT,
    IDLE,
    IDLE_ABSENT,
    IDLE_BEFORE_WAKE,
    IDLE_BLOCKED,
    NO_RUN_SEEN,
    PROBE,
    RUNTIME_EVENT,
    TASK,
    UNKNOWN,
    WORK,
    Entity,
    Interval,
    Timeline,
    relabel,
)
from .contexts import (
    CONTEXT_OPS,
    EXITS,
    OP_IO_DONE,
    OP_IO_ISSUE,
    OP_MIGRATE,
    OP_OTHER,
    OP_SIGNAL,
    OP_SWITCH,
    OP_TIMER_SET,
    OP_TLB,
    OP_WAKE,
    OP_WQ_IN,
    OP_WQ_OUT,
    Contexts,
    op,
)
from .event import Event
from .oncpu import OnCpu
from .thread_states import RUN, WOKEN, ThreadStates

# The events that leave a page fault's sleep watched for (OnCpu.fault_ends): an interrupt's
# entry or exit, a TLB flush, an IPI sent, a wake-up or a task moved (the fault's read waking
# kworker/N:1H), block I/O issued or completed
FAULT_PATH_OPS = CONTEXT_OPS | {OP_WAKE, OP_MIGRATE, OP_IO_ISSUE, OP_IO_DONE}


def _on_fault_path(code: int, ev: Event) -> bool:
    return code in FAULT_PATH_OPS or code == OP_OTHER and ev.name == RUNTIME_EVENT


def _on_switch(f: dict) -> bool:
    """A tlb_flush of reason TLB_FLUSH_ON_TASK_SWITCH (0, "flush on task switch")."""
    return f.get("reason") == 0 or "task switch" in str(f.get("reason_str", ""))


class CpuStory:
    """The walk of one CPU's events over ``[t0, t1]`` into a :class:`Timeline` (see the
    module docstring). ``probe``: the probe's thread ids; with ``follow`` and one of them,
    its states are followed (:class:`ThreadStates`); ``comms``: pid → comm (updated by the
    switches it sees)."""

    def __init__(self, cpu: int, probe: set[int], t0: int, t1: int,
                 comms: dict[int, str], probe_pid: int | None = None,
                 tgid_of: Callable[[int], int | None] | None = None,
                 follow: bool = False) -> None:
        self.tl = Timeline(cpu, t0, t1)
        self.probe = probe
        self.comms = comms
        self.ctx = Contexts(self.tl, probe)
        tid = next(iter(probe)) if follow and len(probe) == 1 else None
        self.thread = ThreadStates(self.tl, self.ctx, tid, comms, probe_pid, tgid_of)
        self.work: dict[int, str] = {}  # kworker pid -> function it runs
        self.task: int | None = None  # pid current after the last event
        self.probe_ran = False
        self.last = t0
        self.waking: int | None = None  # the probe's pending wake-up (not yet switched in)
        self.waking_name = ""
        self.switch_ins: list[tuple[int | None, int]] = []  # (wake-up, switch-in)
        self._tasks: dict[int, Entity] = {}  # pid -> its entity (task_entity's cache)
        self.oncpu = OnCpu(self.tl, self.thread.tid)  # its page faults and runtime

    def run(self, evs: Sequence[Event]) -> Timeline:
        """Walk ``evs`` (time order: this CPU's, and the followed thread's wake-ups,
        signals and sleep timers of the others) and finish the timeline."""
        tl, cpu = self.tl, self.tl.cpu
        local = [e.ts_ns for e in evs if e.cpu == cpu]
        self.last = self.thread.first_ns = min(tl.t0_ns, local[0]) if local else tl.t0_ns
        tl.seen_until_ns = local[-1] if local else None
        after, rest = None, iter(evs)
        for ev in rest:
            if ev.cpu != cpu:
                if ev.ts_ns <= tl.t1_ns:
                    self.remote(ev)
                continue
            if ev.ts_ns > tl.t1_ns:
                after = ev
                break
            self.step(ev)
        self.end(after)
        self.oncpu.close_stretch(after, rest, cpu)  # (the call's stretch: its update is later)
        self.finish()
        return tl

    # -- tasks -------------------------------------------------------------------------------
    def task_entity(self, pid: int) -> Entity:
        if pid == 0:
            return Entity(IDLE, IDLE_BLOCKED if self.probe_ran else IDLE_BEFORE_WAKE, 0)
        ent = self._tasks.get(pid)
        if ent is None:
            ent = self._tasks[pid] = self._task_entity(pid)
        return ent

    def _task_entity(self, pid: int) -> Entity:
        """(cached per pid until its comm or work item changes)"""
        comm = self.comms.get(pid, "?")
        if pid in self.probe:
            return Entity(PROBE, comm, pid)
        fn = self.work.get(pid)
        if fn is not None:
            return Entity(WORK, f"{comm} ({fn})", pid)
        return Entity(TASK, comm, pid)

    def current(self, pid: int | None) -> Entity:
        top = self.ctx.top()
        if top is not None:
            return top
        if pid is None:
            return Entity(UNKNOWN, "no events (task unknown)")
        return self.task_entity(pid)

    def pid_of(self, ev: Event) -> int:
        """Who was current when ``ev`` fired: its ``common_pid``, except for the switch's
        own TLB flush (switch_mm, before ``current`` changes: it carries the task just
        switched out; trusted, it charged the switched-in task's run to the one it replaced:
        on 6.18 KVM guests every switch between processes flushes so)."""
        if ev.name == "tlb_flush" and self.task is not None and _on_switch(ev.fields):
            return self.task
        return ev.pid

    # -- charging ----------------------------------------------------------------------------
    def charge(self, until: int, who: Entity, current_pid: int | None) -> None:
        """Charge the time from the last event to ``until`` to ``who``. :meth:`step` does
        the same inline (once per event: a call each cost the flood's walk 22 %)."""
        tl = self.tl
        a, b = max(self.last, tl.t0_ns), min(until, tl.t1_ns)
        if b > a:
            if self.thread.pstate != RUN:
                who = self.thread.overlay(who, b - a)
            tl.intervals.append(Interval(a, b, who))
            tl.totals[who] = tl.totals.get(who, 0) + (b - a)
            if who.kind == PROBE:
                tl.probe_run_ns += b - a
                if tl.start_delay_ns is None:
                    tl.start_delay_ns = a - tl.t0_ns
                self.probe_ran = True
            if current_pid is not None and current_pid in self.probe:
                tl.probe_current_ns += b - a
        self.last = max(self.last, until)

    def _closes(self, code: int, ev: Event, vent: Entity | None) -> tuple[int, Entity | None]:
        """For an exit: (the stack index of the context it closes, -1 when its entry is not
        on the stack; that context when it is not, else None). A work item's end closes
        the kworker's item when the walk did not see it start (in task context)."""
        if code != OP_WQ_OUT:
            return self.ctx.closes(code, ev, vent)
        if ev.pid not in self.work and not self.ctx.frames:
            return -1, Entity(WORK, f"{self.comms.get(ev.pid, '?')} "
                                    f"({ev.fields.get('function')})", ev.pid)
        return -1, None

    def step(self, ev: Event) -> None:
        """One event of this CPU: charge the interval up to it, then apply its effect."""
        tl, ts, th = self.tl, ev.ts_ns, self.thread
        stack = self.ctx.frames
        code, vent = op(ev.name)
        pid = self.pid_of(ev) if code == OP_TLB else ev.pid
        if self.task is not None and pid != self.task and not stack and ts >= tl.t0_ns:
            # a switch we did not see: trust common_pid (counted in the sample itself: the
            # margin before it may hold the wake instance's sparse lookback events, between
            # which switches went unread)
            tl.anomalies += 1
        if pid == th.tid and th.pstate != RUN:
            self._ran(self.last)  # it ran: the interval before is its own
        oncpu = self.oncpu
        if oncpu.fault_at is not None or oncpu.reading:
            oncpu.fault_ends(ts, ev if code == OP_SWITCH else None, code == OP_IO_ISSUE and
                             pid == th.tid, bool(stack) or _on_fault_path(code, ev))
        if code == OP_OTHER and ev.name == FAULT_EVENT:
            oncpu.fault(ts, pid)
        elif code == OP_OTHER and ev.name == RUNTIME_EVENT:
            oncpu.runtime(ev)
        # 1. the interval up to this event: the innermost context, or the one an exit
        # whose entry the stack lacks closes
        at, who = self._closes(code, ev, vent) if code in EXITS else (-1, None)
        if who is None:
            who = stack[-1][0] if stack else self.task_entity(pid)
        # (charge, inlined: once per event)
        last, t0, t1 = self.last, tl.t0_ns, tl.t1_ns
        a = last if last > t0 else t0
        b = ts if ts < t1 else t1
        if b > a:
            if th.pstate != RUN:
                who = th.overlay(who, b - a)
            tl.intervals.append(Interval(a, b, who))
            totals = tl.totals
            totals[who] = totals.get(who, 0) + (b - a)
            if who.kind == PROBE:
                tl.probe_run_ns += b - a
                if tl.start_delay_ns is None:
                    tl.start_delay_ns = a - t0
                self.probe_ran = True
            if pid in self.probe:
                tl.probe_current_ns += b - a
                if who.kind != PROBE:
                    oncpu.interrupted(b - a)
        if ts > last:
            self.last = ts
        # 2. the event's own effect
        ctx = self.ctx
        last_exit, ctx.last_exit = ctx.last_exit, None
        if code == OP_SWITCH:
            self._switch(ev)
            return
        self.task = pid
        if code in CONTEXT_OPS:
            ctx.event(code, ev, pid, at, vent, last_exit)
        elif code != OP_OTHER:
            self._event(code, ev, pid)

    def _event(self, code: int, ev: Event, pid: int) -> None:
        """The effect of the events that are neither a switch nor an interrupt context's."""
        f, ts, th = ev.fields, ev.ts_ns, self.thread
        if code == OP_WAKE:
            if f.get("pid") == th.tid:
                th.woke(ev)
            if f.get("pid") in self.probe:
                self._probe_waking(ev)
        elif code == OP_MIGRATE:
            if f.get("pid") in self.probe:
                self.tl.migrations.append((ts, f.get("orig_cpu", -1), f.get("dest_cpu", -1)))
                th.migrated(f)
        elif code == OP_SIGNAL:
            th.signalled(ev)
        elif code == OP_TIMER_SET:
            if pid == th.tid:
                th.armed(ts, f.get("softexpires"))
        elif code == OP_IO_ISSUE:
            if pid == th.tid:
                th.issued(ts)
        elif code == OP_IO_DONE:
            th.completed(ts)
        elif code == OP_WQ_IN:
            self.work[pid] = str(f.get("function"))
            self._tasks.pop(pid, None)
        elif code == OP_WQ_OUT:
            self.work.pop(pid, None)
            self._tasks.pop(pid, None)

    def _switch(self, ev: Event) -> None:
        tl, f, th = self.tl, ev.fields, self.thread
        self.ctx.clear()
        prev, nxt = f.get("prev_pid"), f.get("next_pid")
        if f.get("next_comm") and self.comms.get(nxt) != f["next_comm"]:
            self.comms[nxt] = f["next_comm"]
            self._tasks.pop(nxt, None)
        runnable = str(f.get("prev_state", "")).startswith("R")
        if prev in self.probe and ev.ts_ns >= tl.t0_ns:
            if runnable:
                tl.preemptions += 1
            else:
                tl.blocks += 1
        elif prev in self.probe:
            tl.switched_out_before += 1
        if prev == th.tid and prev != nxt:
            th.switched_out(ev.ts_ns, str(f.get("prev_state", "")) or None, runnable)
            self.oncpu.stretch(None)
        if nxt in self.probe:
            self.switch_ins.append((self.waking, ev.ts_ns))
            self.waking = None
        if nxt == th.tid:
            th.to_run(ev.ts_ns, "switch")
            self.oncpu.stretch(ev.ts_ns)  # (its task clock starts again at its switch-in)
        self.task = nxt

    # -- the probe's wake-ups -------------------------------------------------------------------
    def _probe_waking(self, ev: Event) -> None:
        # sched_waking comes first where both are enabled: keep the earlier of a pair
        if self.waking is None or ev.name == "sched_waking" and \
                self.waking_name == "sched_wakeup":
            self.waking, self.waking_name = ev.ts_ns, ev.name

    def _ran(self, at: int) -> None:
        """An event in the followed thread's context: it is on the CPU from ``at``."""
        if self.thread.to_run(at, "event"):
            # its switch-in, inferred: the wake-up before it, if any, is this run's
            self.switch_ins.append((self.waking, at))
            self.waking = None

    def remote(self, ev: Event) -> None:
        """A wake-up, signal or sleep timer of the followed thread on another CPU."""
        th = self.thread
        if ev.fields.get("target_cpu") == self.tl.cpu and ev.fields.get("pid") != th.tid:
            self.oncpu.enqueued_from_elsewhere()  # see OnCpu.runtime
            return
        if ev.name == "signal_generate":
            th.signalled(ev)
            return
        if ev.name == "hrtimer_start":
            th.armed(ev.ts_ns, ev.fields.get("softexpires"))
            return
        if ev.fields.get("pid") != th.tid:
            return
        if th.pstate != RUN and ev.ts_ns > self.last:
            # the stretch up to it on this CPU, as it was (the next local event would charge
            # it after the state changed)
            self.charge(ev.ts_ns, self.current(self.task), self.task)
        th.woke(ev)
        self._probe_waking(ev)

    # -- the window's end ------------------------------------------------------------------------
    def end(self, after: Event | None) -> None:
        """Charge the rest of the window: to whoever the first event after it (``after``)
        says was current (its common_pid; a switch's prev), as every interval before an
        event is charged; without one, to whoever is current after the last event. The
        kernel does not always record the switch in (6.18 in a Firecracker guest records no
        sched_switch from idle at all): the task after the last event can be stale."""
        t1, th = self.tl.t1_ns, self.thread
        self.oncpu.fault_ends(after.ts_ns if after is not None else t1, after if after is
                              not None and after.name == "sched_switch" else None)
        if after is not None:
            code, vent = op(after.name)
            pid = self.pid_of(after)
            if pid == th.tid and th.pstate != RUN:
                self._ran(self.last)
            closed = self._closes(code, after, vent)[1] if code in EXITS else None
            self.charge(t1, closed or self.current(pid), pid)
        elif th.pstate == WOKEN and not self.ctx.frames and self.task == 0:
            # woken, then no event at all up to the window's end: unknown, not the idle's
            th.run_unseen()
            self.charge(t1, Entity(UNKNOWN, NO_RUN_SEEN), self.task)
        else:
            self.charge(t1, self.current(self.task), self.task)

    def finish(self) -> None:
        """Name the IPIs that raise a softirq, close the thread's states, name the idle,
        then pick the switch-in that starts this sample."""
        self.ctx.name_raisers()
        self.thread.finish()
        tl = self.tl
        if not self.probe_ran and not any(p.ended_by == "waking" for p in tl.parts):
            # the probe never ran here in the whole window: the idle was not a wake-up that
            # came late (it blocked throughout, or ran on another CPU); unless a waking of
            # the followed thread says it was woken here (its run came after the window)
            relabel(tl, 0, Entity(IDLE, IDLE_BEFORE_WAKE, 0), Entity(IDLE, IDLE_ABSENT, 0))
        _pick_switch_in(tl, self.switch_ins)


def _pick_switch_in(tl: Timeline, switch_ins: list[tuple[int | None, int]]) -> None:
    """The probe's switch-in that starts the sample (the last at or before t0 when the
    probe was on the CPU at t0, else the first after it) and the wake-up before it."""
    before = [s for s in switch_ins if s[1] <= tl.t0_ns]
    after = [s for s in switch_ins if s[1] > tl.t0_ns]
    pick = before[-1] if tl.start_delay_ns == 0 and before else (after[0] if after else None)
    if pick is not None:
        tl.switch_in_ns = pick[1]
        if pick[0] is not None:
            tl.wake_ns = pick[0]
            tl.wake_latency_ns = pick[1] - pick[0]
