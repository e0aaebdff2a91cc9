"""The followed thread's own on-CPU counters, kept beside the CPU's story (:mod:`.cpu_story`):
its user page faults inside the window and its runtime as the scheduler counted it.

:class:`OnCpu` is fed by :class:`~.cpu_story.CpuStory` as it walks the CPU's events:

- **page faults** (``exceptions:page_fault_user``, x86, filtered to the followed threads):
  each fault's entry inside ``[t0, t1]`` counts; its time runs to the next event on the CPU
  (the window's end at most), capped at :data:`~.accounting.FAULT_CAP_NS` (the event has no
  exit); a switch of the thread out, not runnable, right after says it slept in the fault,
  also after the block I/O the fault issued in the thread's context (a major fault of a
  file page: ``block_rq_issue``, then the switch out in D);
- **runtime** (``sched:sched_stat_runtime``, emitted for CFS tasks at each tick and switch out
  on 6.18): each update covers the *stretch* since the thread's switch-in or its previous
  update on this CPU; a stretch that overlaps the window is compared with the runtime it
  reports (its wall time, and its wall time less the interrupts charged in it inside the
  window), with its part outside the window counted apart (``runtime_outside_ns``: the time
  hidden there is not the call's), unless a task was enqueued onto this CPU from another in
  it (that enqueue updated the thread's runtime on a CPU whose events we do not walk):
  skipped and counted. A thread that sleeps between calls runs each call in one stretch,
  from its switch-in before ``t0`` to the update of its switch out after ``t1``, with no
  update inside (a tick comes every 1-4 ms): comparing only the stretches wholly inside
  the window measured none of its calls. :meth:`CpuStory.run <.cpu_story.CpuStory.run>`
  walks on past ``t1`` to that update (:meth:`OnCpu.close_stretch`). A stretch that began before the thread's updates
  were recorded (``from_ns``) is not compared.

The results go into the :class:`~.accounting.Timeline` (``faults``, ``fault_ns``,
``faults_slept``, ``runtime_*``), where ``None`` says the event was not recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

from .accounting import FAULT_CAP_NS, RUNTIME_EVENT, Timeline
from .contexts import OP_IRQ_IN, OP_IRQ_OUT, OP_SOFT_IN, OP_SOFT_OUT, OP_VEC_IN, OP_VEC_OUT, op
from .event import Event

_WAKE_NAMES = frozenset({"sched_waking", "sched_wakeup"})
_IRQ_IN = frozenset({OP_IRQ_IN, OP_SOFT_IN, OP_VEC_IN})  # the interrupt contexts' entries
_IRQ_OUT = frozenset({OP_IRQ_OUT, OP_SOFT_OUT, OP_VEC_OUT})

# How long after a fault's entry a switch out not runnable is still the fault's sleep, where
# only its path's events came between (fault_ends): a fault's own work before it sleeps (its
# readahead's page-cache insertions, the read issued) takes µs to ~2 ms (a 2 MiB readahead
# on a 2-vCPU guest: 1.5 ms from the fault to its block_rq_issue).
FAULT_SLEEP_NS = 3_000_000


class OnCpu:
    """The followed thread ``tid``'s page faults and runtime stretches in ``tl`` (module
    docstring)."""

    def __init__(self, tl: Timeline, tid: int | None) -> None:
        self.tl = tl
        self.tid = tid
        self.fault_at: int | None = None  # the open page fault's entry
        # a fault's sleep is still watched for (the events since it are its path's: see
        # fault_ends), from sleep_from (the entry of the last fault)
        self.reading = False
        self.sleep_from = 0
        # the runtime stretch: where it began (a switch-in or an update; None while the
        # thread is not current), the interrupts charged in it, whether a remote enqueue came
        self.rt_at: int | None = None
        self.rt_irq = 0
        self.rt_remote = False
        self.from_ns: int | None = None  # from when the thread's updates are recorded

    def fault(self, ts: int, pid: int) -> None:
        """A user page fault's entry (of ``pid``), where faults are recorded."""
        tl = self.tl
        if tl.faults is not None and pid == self.tid and tl.t0_ns <= ts <= tl.t1_ns:
            tl.faults += 1
            self.fault_at = ts

    def fault_ends(self, ts: int, switch: Event | None, reads: bool = False,
                   passing: bool = False) -> None:
        """The open fault's time ends at ``ts`` (the next event on the CPU); ``switch``: that
        event when it is a sched_switch; ``reads``: it is block I/O the thread issued (the
        fault reading its page: the switch out that follows is still the fault's sleep);
        ``passing``: an event the fault's path emits or that interrupts it (an interrupt's
        entry, exit or anything inside one, a wake-up, an IPI sent, a TLB flush, a runtime
        update): the watch for the fault's sleep goes on through it, for up to
        :data:`FAULT_SLEEP_NS` after the fault's entry. A major fault on 6.18 issues its read
        (block_rq_issue), wakes kworker/N:1H to dispatch the rest of it (sched_waking in the
        thread's context), is interrupted (a tick, the disk's completion) and only then
        switches out in D: a watch ended at the first of those counted none of them slept."""
        tl, at = self.tl, self.fault_at
        if at is None and not self.reading:
            return
        if at is not None:
            self.fault_at = None
            tl.fault_ns += max(0, min(ts, tl.t1_ns, at + FAULT_CAP_NS) - at)
            self.sleep_from = at
        soon = ts - self.sleep_from <= FAULT_SLEEP_NS
        if switch is not None:
            if soon and switch.fields.get("prev_pid") == self.tid and \
                    not str(switch.fields.get("prev_state", "R")).startswith("R"):
                tl.faults_slept += 1
            self.reading = False
            return
        self.reading = soon and (reads or passing)

    def stretch(self, at: int | None) -> None:
        """A runtime stretch begins at ``at`` (None: the thread left the CPU)."""
        self.rt_at, self.rt_irq, self.rt_remote = at, 0, False

    def interrupted(self, ns: int) -> None:
        """``ns`` of an interrupt charged while the thread was current."""
        if self.rt_at is not None:
            self.rt_irq += ns

    def enqueued_from_elsewhere(self) -> None:
        """Another CPU enqueued a task onto this one: the stretch's runtime may have been
        updated there."""
        self.rt_remote = True

    def runtime(self, ev: Event) -> None:
        """A runtime update: the stretch since the last one (or the switch-in) is compared
        with the runtime it reports, where it lies wholly in the window."""
        tl, f = self.tl, ev.fields
        if tl.runtime_ns is None or f.get("pid") != self.tid or ev.pid != f.get("pid"):
            return
        at, ts, t0, t1 = self.rt_at, ev.ts_ns, tl.t0_ns, tl.t1_ns
        if at is not None and at < t1 and ts > t0 and \
                (self.from_ns is None or self.from_ns <= at):
            if self.rt_remote:
                tl.runtime_skipped += 1
            else:
                run = int(f.get("runtime") or 0)
                out = max(0, t0 - at) + max(0, ts - t1)
                tl.runtime_ns += run
                tl.runtime_wall_ns += ts - at
                tl.runtime_own_ns += ts - at - self.rt_irq
                tl.runtime_outside_ns += out
                tl.runtime_hidden_ns += max(0, ts - at - self.rt_irq - run - out)
                tl.runtime_hidden_wall_ns += max(0, ts - at - run - out)
                tl.runtime_stretches += 1
        self.stretch(ts)



    def close_stretch(self, after: Event | None, rest: Iterator[Event], cpu: int) -> None:
        """Where a stretch that overlaps the window is still open at its end, walk on from
        ``after`` (the first of ``cpu``'s events after the window) through ``rest`` to the
        thread's next runtime update, which closes the stretch the call ran in
        (:meth:`runtime`), charging to it the interrupts on the way and noting a remote
        enqueue onto this CPU; a switch before any update (no update: not a CFS task), or
        the events' end, leaves the stretch uncompared."""
        if after is None or self.tl.runtime_ns is None or self.rt_at is None or \
                self.rt_at >= self.tl.t1_ns:
            return
        tid = self.tid
        irq_at: list[int] = []  # the open interrupt contexts' entries (nested)
        for ev in chain((after,), rest):
            if ev.cpu != cpu:
                if ev.name in _WAKE_NAMES and ev.fields.get("target_cpu") == cpu and \
                        ev.fields.get("pid") != tid:
                    self.enqueued_from_elsewhere()
                continue
            if ev.name == RUNTIME_EVENT:
                if ev.fields.get("pid") == tid:
                    if irq_at:  # (a tick's update comes inside its interrupt)
                        self.interrupted(ev.ts_ns - irq_at[0])
                    self.runtime(ev)
                    return
                continue
            if ev.name == "sched_switch":
                return
            code = op(ev.name)[0]
            if code in _IRQ_IN:
                irq_at.append(ev.ts_ns)
            elif code in _IRQ_OUT and irq_at:
                at = irq_at.pop()
                if not irq_at:
                    self.interrupted(ev.ts_ns - at)
