"""What a :func:`~.timeline.timeline` is made of: the result types of the walk.

:class:`Entity` (something that used the CPU, or a part of the followed thread's off-CPU
time), :class:`Interval` (a stretch between two events charged to one entity),
:class:`Part` (a stretch of the followed thread off the CPU and not runnable) and
:class:`Timeline` (the accounting of one sample's window on one CPU), with the kinds
(agent/causes.py ``EVENT_KINDS``) and the fixed labels they use. Both machines of the walk
write into one :class:`Timeline`: :mod:`.cpu_story` its intervals and counts,
:mod:`.thread_states` its parts and ``state_ns``; :func:`relabel` is how either renames
intervals already charged. Importers name these through :mod:`.timeline`, the public face.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from agent.causes import EVENT_KINDS

(PROBE, TASK, IDLE, IRQ, SOFTIRQ, TIMER, IPI, VECTOR, WORK, UNKNOWN, BLOCKED, IO_WAIT,
 STOPPED) = EVENT_KINDS
NOT_RUNNABLE = (BLOCKED, IO_WAIT, STOPPED)  # the kinds of a not-runnable part (Part)

IDLE_BEFORE_WAKE = "idle before the probe woke"
IDLE_BLOCKED = "idle (probe blocked)"
IDLE_ABSENT = "idle (probe not on this CPU)"
EXITED = "probe thread exited"
NO_RUN_SEEN = "no event after its wake-up (its run not recorded)"
# signal_generate's stop signals (asm-generic/signal.h: SIGSTOP 19, SIGTSTP 20, SIGTTIN 21,
# SIGTTOU 22) and the others a part names; TRACE_SIGNAL_DELIVERED 0, IGNORED 1 (a SIGCONT
# with no handler still continues the task), ALREADY_PENDING 2
SIGNAL_NAMES = {9: "SIGKILL", 18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN",
                22: "SIGTTOU"}
STOP_SIGNALS = frozenset({19, 20, 21, 22})
# exceptions:page_fault_user, and one fault's time at most: from its entry to the next event
# on the CPU, but never more than this (a minor fault of a 4 KiB page, with fault-around,
# takes ~1-5 µs; beyond this the thread ran its own code after the fault returned, with no
# event to say when; a 2 MiB huge page's zeroing, ~100-200 µs, is counted up to this only)
FAULT_EVENT = "page_fault_user"
FAULT_CAP_NS = 50_000
RUNTIME_EVENT = "sched_stat_runtime"


class Entity(NamedTuple):
    """Something that used the CPU: ``kind`` (one of the constants above), ``name`` (comm,
    IRQ name, softirq vector, vector or work function), ``pid`` (tasks and work items) and
    ``num`` (the IRQ number). A NamedTuple: the walk hashes and compares one per event, and a
    tuple does that in C (a frozen dataclass took a third of the walk's time)."""

    kind: str
    name: str
    pid: int | None = None
    num: int | None = None
    # the whole label of a not-runnable part ("blocked (S), woken by ..."): ``name`` is then
    # its culprit (the waker's or the sender's comm, "timer", "unknown")
    detail: str | None = None

    @property
    def label(self) -> str:
        if self.detail is not None:
            return self.detail
        k = self.kind
        if k in (PROBE, TASK):
            return f"{'probe ' if k == PROBE else ''}{self.name}[{self.pid}]"
        if k == IRQ:
            return f"IRQ {self.num} {self.name}"
        if k == SOFTIRQ:
            return f"softirq {self.name}"
        if k == TIMER:
            return "local timer tick"
        if k == IPI:
            return f"IPI {self.name}"
        if k == VECTOR:
            return f"vector {self.name}"
        if k == WORK:
            return self.name
        return self.name  # idle, unknown

    @property
    def culprit(self) -> str:
        """A short, bounded name for metrics labels (comm, IRQ name, vector, function)."""
        if self.kind == WORK:
            return self.name.rsplit("(", 1)[-1].rstrip(")")
        return self.name


@dataclass(slots=True)
class Interval:
    start_ns: int
    end_ns: int
    entity: Entity

    @property
    def ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Part:
    """A stretch of the sample's thread off the CPU and not runnable, from its switch-out
    (``start_ns``, which may precede the window: the switch before it) to the event that made
    it runnable again (``end_ns``): its ``sched_waking`` (``ended_by`` "waking"), else its
    switch-in ("switch": the wake-up was not recorded, so the part's end is an upper bound
    and its waker unknown), else the first event the thread ran in ("event"), else the end
    of the window ("window"), or its exit ("exit").

    ``state``: ``prev_state`` of the switch-out ("S", "D", "T", "t", "P", "I", "X"...;
    None when the switch-out is not in the window but a waking says the thread was asleep).
    The waker: ``waker_tid`` (the waking's ``common_pid`` when it ran in task context;
    None when an interrupt, a timer or the idle task woke it), ``waker`` (a label: the comm
    and tid, "timer", "IRQ 24 virtio0", "an interrupt on CPU 0", "unknown"),
    ``waker_ctx`` ("task", "timer", "irq", "softirq", "io", "interrupt", "none", ""),
    ``waker_cpu``, ``same_process`` (the waker is another thread of the probe's process).
    For T: ``signal`` (its number) and ``sender_tid`` / ``sender`` (signal_generate's task).
    ``io``: the thread issued a block request just before it slept. ``kind``: BLOCKED,
    IO_WAIT, STOPPED, IDLE (a late wake-up: its timer fired after the expiry it asked for,
    ``timer_due_ns``, or — without the timer's event — it slept since before the window's
    start on a timer that fired after it) or UNKNOWN (exited). ``in_ns``: its time inside
    the window."""

    state: str | None
    start_ns: int
    end_ns: int | None = None
    ended_by: str = ""
    kind: str = BLOCKED
    waker_tid: int | None = None
    waker: str = "unknown"
    waker_ctx: str = ""
    waker_cpu: int | None = None
    same_process: bool = False
    signal: int | None = None
    sender_tid: int | None = None
    sender: str | None = None
    io: bool = False
    # the expiry its timer was armed with (hrtimer_start's softexpires) when a timer ended
    # it: what the sleep asked for; a waking after it is late (a wake-up part of its own)
    timer_due_ns: int | None = None
    in_ns: int = 0
    entity: Entity | None = None
    first_idx: int = 0  # the first interval charged to it
    # (interval index, what the CPU ran then) of each interval it took over: given back
    # when the part turns out unknown (never ended in the window)
    took: list[tuple[int, Entity]] = field(default_factory=list, repr=False)

    def to_dict(self, t0_ns: int) -> dict:
        us = lambda ns: round(ns / 1e3, 1)  # noqa: E731
        d: dict = {"kind": "wakeup" if self.kind == IDLE else self.kind,
                   "state": self.state, "from_us": us(self.start_ns - t0_ns),
                   "us": us(self.in_ns), "ended_by": self.ended_by, "waker": self.waker,
                   "waker_ctx": self.waker_ctx}
        if self.end_ns is not None:
            d["to_us"] = us(self.end_ns - t0_ns)
        if self.waker_tid is not None:
            d["waker_tid"] = self.waker_tid
        if self.waker_cpu is not None:
            d["waker_cpu"] = self.waker_cpu
        if self.same_process:
            d["same_process"] = True
        if self.signal is not None:
            d["signal"] = SIGNAL_NAMES.get(self.signal, str(self.signal))
            d["sender_tid"] = self.sender_tid
            d["sender"] = self.sender
        if self.io:
            d["io"] = True
        if self.timer_due_ns is not None:
            d["timer_due_us"] = us(self.timer_due_ns - t0_ns)
        return d


@dataclass
class Timeline:
    """The accounting of ``[t0_ns, t1_ns]`` on ``cpu`` (see the module docstring).

    ``intervals``: consecutive, non-overlapping, clipped to the window, one per stretch
    between two events. ``totals``: ns per entity. ``probe_run_ns``: the probe itself on the
    CPU; ``probe_current_ns``: the probe the current task, interrupts inside it included.
    ``wake_ns``/``wake_latency_ns``: the probe's last wake-up before its first switch-in at or
    after the window start, and switch-in minus wake-up; ``start_delay_ns``: from ``t0_ns``
    to the probe's first instant on the CPU (0 when it was already on it). ``complete`` /
    ``reason`` come from the event source's window."""

    cpu: int
    t0_ns: int
    t1_ns: int
    intervals: list[Interval] = field(default_factory=list)
    totals: dict[Entity, int] = field(default_factory=dict)
    probe_run_ns: int = 0
    probe_current_ns: int = 0
    wake_ns: int | None = None
    switch_in_ns: int | None = None
    wake_latency_ns: int | None = None
    start_delay_ns: int | None = None
    preemptions: int = 0  # the probe switched out while runnable (prev_state R)
    blocks: int = 0  # the probe switched out to sleep
    # the probe switched out in the margin read before t0 (its call's counters, read from
    # before the spin up to the start, count those too)
    switched_out_before: int = 0
    migrations: list[tuple[int, int, int]] = field(default_factory=list)  # (ts, from, to)
    counts: dict[str, int] = field(default_factory=dict)
    # hard interrupts (IRQ handlers, APIC vectors) that entered while the probe itself ran,
    # per entity, inside the window: each one also cost the probe the entry and exit the
    # events cannot time (interrupt_overhead)
    probe_interrupts: dict[Entity, int] = field(default_factory=dict)
    anomalies: int = 0  # state the events contradicted (a lost event, nesting off)
    # the CPU's last event the window holds (after t1 when the read reached past the
    # sample: the stretch before t1 then lacks nothing); None without events
    seen_until_ns: int | None = None
    complete: bool = True
    reason: str | None = None
    # The sample's thread (one probe tid) state by state, over the window: on the CPU
    # (probe_current_ns), runnable (waiting for the CPU: what ran instead is in totals),
    # wake-up (idle between its waking and its run; asleep past its start on a timer),
    # not runnable (the parts), unknown (no switch of it seen yet). Empty when the walk did
    # not follow one thread (several probe tids).
    state_ns: dict[str, int] = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)
    # why the wake-ups of other CPUs may be missing (the source's wake instance), if so
    wake_reason: str | None = None
    # The followed thread's user page faults inside [t0, t1] (exceptions:page_fault_user,
    # filtered to it): None where they were not recorded over the whole window. fault_ns:
    # each fault's entry to the next event on its CPU (the handler has returned or the
    # thread left the CPU by then; it has no exit event), capped at FAULT_CAP_NS per fault;
    # faults_slept: those after which the thread switched out not runnable (it slept in
    # the fault: a read from the disk, a page lock; its off-CPU time is in its parts).
    faults: int | None = None
    fault_ns: int = 0
    faults_slept: int = 0
    # The followed thread's runtime as the scheduler counted it (sched_stat_runtime, filtered
    # to it) against its time on the CPU, over the stretches between two of its updates on
    # this CPU that overlap [t0, t1] while it was current throughout (from a switch-in, or
    # an update, to the next update, which may come after t1: a call of a thread that sleeps
    # between calls is one stretch, from its switch-in before t0 to the update of its switch
    # out after t1): runtime_ns its runtime there, runtime_wall_ns the stretches' wall time,
    # runtime_own_ns the same less the interrupts recorded in them inside [t0, t1],
    # runtime_outside_ns the stretches' time outside [t0, t1] (what hid there cannot be the
    # call's: the hidden time inside is at least own - runtime - outside, per stretch),
    # runtime_hidden_ns that lower bound summed over the stretches (0 for a stretch whose
    # runtime covers it), runtime_hidden_wall_ns the same from the wall time (where the
    # kernel charges interrupts to the task's runtime). None where its
    # updates were not recorded over the whole stretch. runtime_skipped: the stretches left
    # out because a wake-up onto this CPU from another one came in them (the enqueue there
    # updates the thread's runtime on that CPU, which is not traced).
    runtime_ns: int | None = None
    runtime_wall_ns: int = 0
    runtime_own_ns: int = 0
    runtime_outside_ns: int = 0
    runtime_hidden_ns: int = 0
    runtime_hidden_wall_ns: int = 0
    runtime_stretches: int = 0
    runtime_skipped: int = 0

    @property
    def wall_ns(self) -> int:
        return self.t1_ns - self.t0_ns

    def ranked(self) -> list[tuple[Entity, int]]:
        return sorted(self.totals.items(), key=lambda kv: (-kv[1], kv[0].label))

    def others_ns(self) -> int:
        """Time on the CPU that was not the probe's own."""
        return sum(ns for e, ns in self.totals.items() if e.kind != PROBE)

    def spans(self, keep: int | None = None) -> list[Interval]:
        """The intervals with neighbours of the same entity merged (for display); ``keep``:
        the first ``keep`` of them only (:meth:`span_count` counts them all)."""
        out: list[Interval] = []
        prev: Interval | None = None
        for iv in self.intervals:
            if prev is not None and prev.entity == iv.entity and prev.end_ns == iv.start_ns:
                out[-1].end_ns = iv.end_ns
            elif keep is not None and len(out) >= keep:
                break
            else:
                out.append(Interval(iv.start_ns, iv.end_ns, iv.entity))
            prev = iv
        return out

    def span_count(self) -> int:
        """How many :meth:`spans` there are (without making them)."""
        n = 0
        prev: Interval | None = None
        for iv in self.intervals:
            if prev is None or prev.entity != iv.entity or prev.end_ns != iv.start_ns:
                n += 1
            prev = iv
        return n

    def quiet_probe_gaps(self) -> list[Interval]:
        """Stretches the probe ran with no event at all (where only hardware or the
        hypervisor could have taken time from it)."""
        return [iv for iv in self.intervals if iv.entity.kind == PROBE]

    def to_dict(self, max_spans: int = 64) -> dict:
        """JSON for a spike record: µs per entity, wake-up, counts, the first spans."""
        us = lambda ns: round(ns / 1e3, 1)  # noqa: E731
        spans = self.spans(keep=max_spans)
        d = {
            "cpu": self.cpu, "wall_us": us(self.wall_ns), "complete": self.complete,
            "entities": [{"label": e.label, "kind": e.kind, "us": us(ns)}
                         for e, ns in self.ranked()],
            "probe_run_us": us(self.probe_run_ns),
            "preemptions": self.preemptions, "blocks": self.blocks,
            "spans": [[us(s.start_ns - self.t0_ns), us(s.ns), s.entity.label]
                      for s in spans[:max_spans]],
        }
        if len(spans) == max_spans and (n_spans := self.span_count()) > max_spans:
            d["spans_left_out"] = n_spans - max_spans
        if self.wake_latency_ns is not None:
            d["wake_latency_us"] = us(self.wake_latency_ns)
        if self.start_delay_ns is not None:
            d["start_delay_us"] = us(self.start_delay_ns)
        if self.migrations:
            d["migrations"] = [[us(t - self.t0_ns), a, b] for t, a, b in self.migrations]
        if self.counts:
            d["counts"] = dict(self.counts)
        if self.probe_interrupts:
            d["probe_interrupts"] = sum(self.probe_interrupts.values())
        if self.seen_until_ns is not None:
            d["events_until_us"] = us(self.seen_until_ns - self.t0_ns)
        if self.anomalies:
            d["anomalies"] = self.anomalies
        if self.reason:
            d["reason"] = self.reason
        if self.state_ns:
            d["state_us"] = {k: us(v) for k, v in self.state_ns.items()}
        shown = [p for i, p in enumerate(self.parts)
                 if p.in_ns > 0 or i == len(self.parts) - 1 or (p.end_ns or 0) > self.t0_ns]
        if shown:
            d["parts"] = [p.to_dict(self.t0_ns) for p in shown[-16:]]
        if self.wake_reason:
            d["wake_reason"] = self.wake_reason
        if self.faults is not None:
            d["page_faults"] = {"count": self.faults, "us": us(self.fault_ns),
                                "slept": self.faults_slept}
        if self.runtime_ns is not None:
            d["runtime"] = {"runtime_us": us(self.runtime_ns), "wall_us": us(self.runtime_wall_ns),
                            "own_us": us(self.runtime_own_ns),
                            "outside_us": us(self.runtime_outside_ns),
                            "stretches": self.runtime_stretches,
                            "skipped": self.runtime_skipped}
        return d


def relabel(tl: Timeline, from_idx: int, old: Entity, new: Entity) -> None:
    """Give the intervals from ``from_idx`` on that were charged to ``old`` to ``new``,
    their time with them (what the walk learns later: a part's kind, a raising IPI)."""
    for iv in tl.intervals[from_idx:]:
        if iv.entity == old:
            iv.entity = new
            tl.totals[old] -= iv.ns
            tl.totals[new] = tl.totals.get(new, 0) + iv.ns
    if tl.totals.get(old) == 0:
        del tl.totals[old]
