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
  update on this CPU; a stretch wholly in the window is compared with the runtime it reports
  (its wall time, and its wall time less the interrupts charged in it), unless a task was
  enqueued onto this CPU from another in it (that enqueue updated the thread's runtime on a
  CPU whose events we do not walk): skipped and counted.

The results go into the :class:`~.accounting.Timeline` (``faults``, ``fault_ns``,
``faults_slept``, ``runtime_*``), where ``None`` says the event was not recorded.
"""

from __future__ import annotations

from .accounting import FAULT_CAP_NS, Timeline
from .event import Event


class OnCpu:
    """The followed thread ``tid``'s page faults and runtime stretches in ``tl`` (module
    docstring)."""

    def __init__(self, tl: Timeline, tid: int | None) -> None:
        self.tl = tl
        self.tid = tid
        self.fault_at: int | None = None  # the open page fault's entry
        self.reading = False  # the last fault issued block I/O: its switch out is a sleep
        # the runtime stretch: where it began (a switch-in or an update; None while the
        # thread is not current), the interrupts charged in it, whether a remote enqueue came
        self.rt_at: int | None = None
        self.rt_irq = 0
        self.rt_remote = False

    def fault(self, ts: int, pid: int) -> None:
        """A user page fault's entry (of ``pid``), where faults are recorded."""
        tl = self.tl
        if tl.faults is not None and pid == self.tid and tl.t0_ns <= ts <= tl.t1_ns:
            tl.faults += 1
            self.fault_at = ts

    def fault_ends(self, ts: int, switch: Event | None, reads: bool = False) -> None:
        """The open fault's time ends at ``ts`` (the next event on the CPU); ``switch``: that
        event when it is a sched_switch; ``reads``: it is block I/O the thread issued (the
        fault reading its page: the switch out that follows is still the fault's sleep)."""
        tl, at = self.tl, self.fault_at
        if at is None and not self.reading:
            return
        if at is not None:
            self.fault_at = None
            tl.fault_ns += max(0, min(ts, tl.t1_ns, at + FAULT_CAP_NS) - at)
        if switch is not None and switch.fields.get("prev_pid") == self.tid and \
                not str(switch.fields.get("prev_state", "R")).startswith("R"):
            tl.faults_slept += 1
        self.reading = reads and (at is not None or self.reading)

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
        at, ts = self.rt_at, ev.ts_ns
        if at is not None and tl.t0_ns <= at and ts <= tl.t1_ns:
            if self.rt_remote:
                tl.runtime_skipped += 1
            else:
                tl.runtime_ns += int(f.get("runtime") or 0)
                tl.runtime_wall_ns += ts - at
                tl.runtime_own_ns += ts - at - self.rt_irq
                tl.runtime_stretches += 1
        self.stretch(ts)
