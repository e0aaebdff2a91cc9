"""What ran on the probe CPU during one sample, to the µs, from its kernel events.

:func:`timeline` walks the CPU's events in time order with a small state machine — the
current task, a stack of interrupt contexts (hard IRQ handlers, softirqs, the APIC vectors
of ``irq_vectors``), the work item a kworker runs — and charges every interval between two
events to the innermost context active in it:

- a task: ``comm[pid]`` (the probe's own threads apart, as ``probe``); idle (pid 0) is
  ``idle before the probe woke`` until the probe first runs in the window (a late timer or
  a deep C-state: the wake-up itself came late), ``idle (probe blocked)`` after, ``idle
  (probe not on this CPU)`` when the probe never ran in the window (blocked throughout, or
  on another CPU);
- ``IRQ <n> <name>`` (irq_handler_entry/exit), ``softirq <VEC>`` (softirq_entry/exit),
  ``local timer tick`` (local_timer_entry/exit), ``IPI <vector>`` (call_function,
  call_function_single, reschedule, irq_work; ``(TLB shootdown)`` when a ``tlb_flush`` of
  reason "remote shootdown" ran inside it), ``vector <name>`` for the other APIC vectors;
- ``<kworker comm> (<function>)`` while a workqueue item runs (workqueue_execute_start/end).

Which task ran is read from every event's ``common_pid`` (the task current on that CPU when
it fired), so a lost ``sched_switch`` cannot make the walk charge the wrong task for long.
An exit whose entry lies before the window (or was lost) charges the interval before it to
that context. ``sched_waking``/``sched_wakeup`` of a probe thread followed by its switch-in
give the probe's wake-up latency; events on other CPUs are ignored (the IPI senders are not
seen: the main instance traces the probe CPUs only), except, when following the thread, its
own wake-ups and stop signals there (the wake instance's).

With ``follow=True`` and one probe thread (watch's spikes) the walk also follows that
thread's own state (docs/events.md "Off-CPU time"): on the CPU, runnable (preempted or
woken: what ran is the delay), not runnable from a switch-out in S, D, T/t, P or I to the
``sched_waking`` that ended it (from any CPU: the source's wake instance) — a
:class:`Part`, named by its state and its waker (a task, another thread of the same
process, a timer, an interrupt) or, for T, the stop signal's sender —, woken with the CPU
idle (wake-up latency proper), unknown (no event says) or exited. While it was not
runnable, what ran on the CPU did not delay it: those intervals are the part's. A part
with neither a waking nor a switch-in nor a run of the thread at its end is unknown, never
guessed; a part that began before the window's start and ended by a timer is a pacing
sleep that overshot the start (a late wake-up), not a wait of the call's own.

:func:`breakdown` turns a timeline into the excess over P50, item by item, with an explicit
``unexplained`` residual (and, with :func:`backlog`, the thread's earlier calls queued
behind a stall at the call's start); :func:`hw_noise` reports, as rtla's hwnoise does, the time the
probe was on the CPU with no event while its CPU time says it did not run
(``hw_or_hypervisor``), with the quiet gaps it must lie in, correlated with steal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from agent.causes import EVENT_KINDS, EVENT_RESIDUALS

from .event import Event

(PROBE, TASK, IDLE, IRQ, SOFTIRQ, TIMER, IPI, VECTOR, WORK, UNKNOWN, BLOCKED, IO_WAIT,
 STOPPED) = EVENT_KINDS
NOT_RUNNABLE = (BLOCKED, IO_WAIT, STOPPED)  # the kinds of a not-runnable part (Part)

_IPI_VECTORS = {"call_function", "call_function_single", "reschedule", "irq_work"}
RAISE_WITHIN_NS = 2_000  # a softirq this soon after an IPI returned ran on its irq_exit
RAISES_SHARE = 0.5
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
# a block request the thread issued this soon before it slept in D makes the wait an I/O
# wait; a block completion this soon before an interrupt's wake-up makes it its end
IO_NEAR_NS = 100_000
# a sleep's timer due this soon after the call's start still aimed at it: a pacing sleep
# computed as "start - now" lands a few µs past the start (seen: 5 µs in the service's
# idle_wakeup switch), not a sleep the call asked for past it
PACING_SLACK_NS = 50_000


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
        return d


@lru_cache(maxsize=256)
def _vector_entity(base: str) -> Entity:
    if base == "local_timer":
        return Entity(TIMER, "local_timer")
    if base in _IPI_VECTORS:
        return Entity(IPI, base)
    return Entity(VECTOR, base)


class _Walk:
    """The state machine of :func:`timeline` (one CPU, events in time order)."""

    def __init__(self, cpu: int, probe: set[int], t0: int, t1: int,
                 comms: dict[int, str], probe_pid: int | None = None,
                 tgid_of: Callable[[int], int | None] | None = None,
                 follow: bool = False) -> None:
        self.tl = Timeline(cpu, t0, t1)
        self.probe = probe
        self.comms = comms
        # the thread whose state is followed (the sample's: one probe tid), its process
        self.tid = next(iter(probe)) if follow and len(probe) == 1 else None
        self.probe_pid = probe_pid
        self.tgid_of = tgid_of
        # its state: _RUN while it is not followed (several tids), else _UNK until an event
        # says (a switch of it, a waking, an event in its context)
        self.pstate = _UNK if self.tid is not None else _RUN
        self.part: Part | None = None  # open while _OFF (or _GONE)
        self.unk_ns = 0  # not the thread's own time, while its state was unknown
        self.unk_idx = 0  # the first interval of the unknown stretch
        self.wake_idle_ns = 0  # idle while it was runnable (woken, not yet running)
        self.first_ns = t0  # the window's first event on this CPU (timeline() sets it)
        self.woken_ns: int | None = None  # its waking, while _WOKEN
        self.stop_sig: tuple[int, int, int | None, str] | None = None  # (ts, sig, tid, who)
        self.io_issued: int | None = None  # its last block request on this CPU
        self.io_done: int | None = None  # the last block completion on this CPU
        # its last hrtimer_start of a sleep (ts, softexpires): the expiry it asked for
        self.timer_set: tuple[int, int | None] | None = None
        self.stack: list[tuple[Entity, int, bool]] = []  # (context, interval index, tlb)
        self.work: dict[int, str] = {}  # kworker pid -> function it runs
        self.task: int | None = None  # pid current after the last event
        self.probe_ran = False
        self.last = t0
        self.waking: int | None = None  # the probe's pending wake-up (not yet switched in)
        self.waking_name = ""
        self.switch_ins: list[tuple[int | None, int]] = []  # (wake-up, switch-in)
        self._tasks: dict[int, Entity] = {}  # pid -> its entity (task_entity's cache)
        self.last_exit: tuple[Entity, int] | None = None  # an IPI that just returned
        self.raised: dict[Entity, dict[str, int]] = {}  # IPI -> softirq vector -> times

    def task_entity(self, pid: int) -> Entity:
        if pid == 0:
            return Entity(IDLE, IDLE_BLOCKED if self.probe_ran else IDLE_BEFORE_WAKE, 0)
        ent = self._tasks.get(pid)
        if ent is None:
            ent = self._tasks[pid] = self._task_entity(pid)
        return ent

    # -- the followed thread's state (issue #26: off-CPU time, exactly) ---------------------
    def overlay(self, who: Entity, ns: int) -> Entity:
        """What an interval charged to ``who`` (what the CPU ran) was for the followed
        thread, outside _RUN: while it was not runnable, its part (what ran then did not
        delay it); idle while it was runnable, its wake-up latency (woken, the CPU not yet
        running it: the idle exit, the IPI's delivery); while its state was unknown, as it
        is (and counted as unknown)."""
        st = self.pstate
        if st == _OFF or st == _GONE:
            part = self.part
            if who.kind != PROBE and part is not None:
                part.in_ns += ns
                part.took.append((len(self.tl.intervals), who))
                return part.entity
        elif st == _UNK:
            if who.kind != PROBE:
                self.unk_ns += ns
        elif who.kind == IDLE:  # _WOKEN, _READY
            self.wake_idle_ns += ns
            return _WAKE_ENTITY
        return who

    def to_run(self, at: int, how: str) -> None:
        """The followed thread is on the CPU from ``at`` (its switch-in, else the first
        event in its context: a 6.18 Firecracker guest's kernel records no switch from idle)."""
        if self.pstate == _OFF and self.part is not None:
            self.close_part(at, how)
        elif self.pstate == _GONE:
            self.part = None  # an event of the exited tid: a reused one, or events lost
        if how == "event" and self.pstate != _UNK:
            # its switch-in, inferred: the wake-up before it, if any, is this run's
            self.switch_ins.append((self.waking, at))
            self.waking = None
        self.pstate = _RUN
        self.woken_ns = None

    def open_part(self, at: int, state: str | None) -> None:
        letter = state[:1] if state else None
        part = Part(letter, at, first_idx=len(self.tl.intervals))
        part.entity = Entity(BLOCKED, f"#{len(self.tl.parts)}", detail=f"open part "
                             f"{len(self.tl.parts)}")
        if letter in ("T", "t") and self.stop_sig is not None:
            self._sign(part)
        if letter == "D" and self.io_issued is not None and at - self.io_issued <= IO_NEAR_NS:
            part.io = True
        self.io_issued = None
        if letter in ("X", "Z"):
            part.kind, part.ended_by = UNKNOWN, "exit"
            part.entity = Entity(UNKNOWN, EXITED)
        self.part = part
        self.tl.parts.append(part)
        self.pstate = _GONE if letter in ("X", "Z") else _OFF

    def _sign(self, part: Part) -> None:
        _ts, sig, tid, who = self.stop_sig
        part.signal, part.sender_tid, part.sender = sig, tid, who
        self.stop_sig = None

    def close_part(self, at: int, how: str, waker: dict | None = None) -> None:
        """End the open part at ``at`` (``how``: see :class:`Part`), decide its kind and
        give its intervals their final entity."""
        part = self.part
        self.part = None
        if part is None or part.kind == UNKNOWN:
            return
        part.end_ns, part.ended_by = at, how
        w = waker or {}
        part.waker_tid = w.get("tid")
        part.waker = w.get("what", "unknown (no wake-up event)" if how != "window" else
                           "unknown (still off the CPU at the window's end)")
        part.waker_ctx = w.get("ctx", "")
        part.waker_cpu = w.get("cpu")
        part.same_process = bool(w.get("same_process"))
        st = part.state
        ctx = part.waker_ctx
        timer, self.timer_set = self.timer_set, None
        if timer is not None and ctx == "timer" and timer[1] is not None and \
                timer[0] <= part.start_ns + IO_NEAR_NS and 0 <= timer[1] - timer[0] < 3600e9:
            part.timer_due_ns = timer[1]  # (a CLOCK_MONOTONIC timer: the trace clock's)
        if st is None and self.stop_sig is not None and self.stop_sig[0] <= at:
            # its switch-out is not in the window, but a stop signal to it is, and it was
            # not runnable until this waking: stopped (the state letter stays unknown)
            self._sign(part)
        if st in ("T", "t") or st is None and part.signal is not None:
            part.kind = STOPPED
            by = f" by {SIGNAL_NAMES.get(part.signal, part.signal)} from {part.sender}" \
                if part.signal is not None else ""
            label = f"stopped ({st or 'state unknown'}){by}, continued by {part.waker}"
            culprit = _comm_of(part.sender) if part.sender else _comm_of(part.waker)
        elif st == "D" and (part.io or ctx == "io" or ctx in ("irq", "softirq", "interrupt")):
            part.kind = IO_WAIT
            label = f"I/O wait (D), ended by {part.waker}"
            culprit = _comm_of(part.waker)
        elif st in ("S", None) and ctx in ("timer", "none") and (
                part.timer_due_ns is not None and part.start_ns < self.tl.t0_ns and
                part.timer_due_ns <= self.tl.t0_ns + PACING_SLACK_NS or
                part.timer_due_ns is None and part.start_ns < self.tl.t0_ns):
            # asleep at the call's start on a timer due by then that fired after it (or,
            # without the timer's own event, asleep since before the start on a timer):
            # the pacing sleep overshot — timer slack, an idle CPU's or a halted vCPU's late
            # wake-up —, not a wait of the call's own
            part.kind = IDLE
            self._relabel(part.first_idx, part.entity, _WAKE_ENTITY)
            part.entity = _WAKE_ENTITY
            return
        else:
            if part.timer_due_ns is not None and part.timer_due_ns < at:
                self._late_timer(part, part.timer_due_ns, at)
            part.kind = BLOCKED
            label = f"blocked ({st or 'state unknown'}), woken by {part.waker}"
            culprit = _comm_of(part.waker)
        new = Entity(part.kind, culprit, part.waker_tid, detail=label)
        self._relabel(part.first_idx, part.entity, new)
        part.entity = new

    def _late_timer(self, part: Part, due: int, at: int) -> None:
        """The sleep asked for ended at ``due`` but its timer woke the thread at ``at``:
        the part's time from ``due`` on is a late wake-up (a Part of its own, kind IDLE),
        the interval that straddles ``due`` split in two."""
        tl = self.tl
        ivs = tl.intervals
        old = part.entity
        late = Part(part.state, due, at, "waking", IDLE, None, part.waker, part.waker_ctx,
                    part.waker_cpu, entity=_WAKE_ENTITY)
        i = part.first_idx
        while i < len(ivs):
            iv = ivs[i]
            if iv.entity == old and iv.start_ns < due < iv.end_ns:
                ivs.insert(i + 1, Interval(due, iv.end_ns, old))
                iv.end_ns = due
                self.stack = [(e, x + 1 if x > i else x, t) for e, x, t in self.stack]
            elif iv.entity == old and iv.start_ns >= due:
                iv.entity = _WAKE_ENTITY
                late.in_ns += iv.ns
            i += 1
        if not late.in_ns:
            return
        part.in_ns -= late.in_ns
        tl.totals[old] -= late.in_ns
        if not tl.totals[old]:
            del tl.totals[old]
        tl.totals[_WAKE_ENTITY] = tl.totals.get(_WAKE_ENTITY, 0) + late.in_ns
        tl.parts.append(late)

    def unknown_part(self, part: Part) -> None:
        """A part still open at the window's end: the call ended at ``t1`` although no event
        says its thread ran again (a wake-up and a switch both unrecorded, or the thread ran
        on another CPU): unknown, never guessed. Its intervals go back to what the CPU ran
        (as before a state was known) and its time counts as unknown."""
        self.part = None
        self.pstate = _UNK
        part.kind, part.ended_by = UNKNOWN, "window"
        part.waker = "unknown (no wake-up, switch-in or run of it seen)"
        tl = self.tl
        old = part.entity
        for i, who in part.took:
            iv = tl.intervals[i]
            tl.totals[old] -= iv.ns
            tl.totals[who] = tl.totals.get(who, 0) + iv.ns
            iv.entity = who
        if tl.totals.get(old) == 0:
            del tl.totals[old]
        self.unk_ns += part.in_ns
        part.entity = None
        part.took = []

    def waker(self, ev: Event) -> dict:
        """Who made the followed thread runnable with ``ev`` (a waking): a task (its
        ``common_pid`` in task context), else the interrupt it ran in — on this CPU the
        innermost context the walk holds (a local timer tick or a TIMER/HRTIMER softirq:
        "timer"; an IRQ; a softirq; a block completion just before: "io"), on another CPU
        only "an interrupt on CPU n" (its interrupts are not traced) — or nobody (the idle
        task: "none")."""
        f = ev.fields
        ctx = f.get("irq_ctx")
        if ctx or (ctx is None and ev.pid == 0):
            if ev.cpu != self.tl.cpu:
                return {"what": f"an interrupt on CPU {ev.cpu}", "ctx": "interrupt",
                        "cpu": ev.cpu}
            io = self.io_done is not None and ev.ts_ns - self.io_done <= IO_NEAR_NS
            top = self.stack[-1][0] if self.stack else None
            if top is None:
                what, kind = ("the idle task", "none") if not ctx else \
                    ("an interrupt (its entry not recorded)", "interrupt")
            elif top.kind == TIMER or top.kind == SOFTIRQ and top.name in ("TIMER", "HRTIMER"):
                what, kind = "timer", "timer"
            else:
                what, kind = top.label, "softirq" if top.kind == SOFTIRQ else "irq"
            if io and kind != "timer":
                what, kind = f"block I/O completion ({what})", "io"
            return {"what": what, "ctx": kind, "cpu": ev.cpu}
        tid = ev.pid
        comm = self.comms.get(tid, "?")
        out = {"tid": tid, "what": f"{comm}[{tid}]", "ctx": "task", "cpu": ev.cpu}
        if self.tgid_of is not None and self.probe_pid is not None:
            try:
                tg = self.tgid_of(tid)
            except Exception:  # noqa: BLE001 - a name only: the tid stays
                tg = None
            if tg == self.probe_pid:
                out["same_process"] = True
                out["what"] = f"thread {tid} of the same process ({comm})"
        return out

    def woke(self, ev: Event) -> None:
        """A waking (sched_waking, else sched_wakeup) of the followed thread, on any CPU."""
        st = self.pstate
        if st == _OFF:
            self.close_part(ev.ts_ns, "waking", self.waker(ev))
        elif st == _UNK:
            # a waking says it was asleep (try_to_wake_up fires it only for a task whose
            # state matched): a part from the window's start, its state unknown
            ivs = self.tl.intervals
            if self.unk_idx == 0:
                # asleep since before the window's first event, when it began unknown
                start = min(self.first_ns, self.tl.t0_ns - 1, ev.ts_ns)
            else:
                start = ivs[self.unk_idx].start_ns if self.unk_idx < len(ivs) else ev.ts_ns
            part = Part(None, start, first_idx=self.unk_idx)
            part.entity = Entity(BLOCKED, "#unknown", detail="open part (state unknown)")
            self.tl.parts.append(part)
            self.part = part
            for iv in ivs[self.unk_idx:]:
                if iv.entity.kind != PROBE:
                    part.in_ns += iv.ns
                    self.tl.totals[iv.entity] -= iv.ns
                    if not self.tl.totals[iv.entity]:
                        del self.tl.totals[iv.entity]
                    self.tl.totals[part.entity] = self.tl.totals.get(part.entity, 0) + iv.ns
                    iv.entity = part.entity
            self.unk_ns = 0
            self.close_part(ev.ts_ns, "waking", self.waker(ev))
        else:
            return  # runnable already (the pair's sched_wakeup, or a switch not recorded)
        self.pstate = _WOKEN
        self.woken_ns = ev.ts_ns

    def signalled(self, ev: Event) -> None:
        """signal_generate (any CPU): a stop signal for the followed thread or its process
        is kept for the T switch-out that follows it (or the part it came in)."""
        f = ev.fields
        sig = f.get("sig")
        if self.tid is None or f.get("pid") not in (self.tid, self.probe_pid) or \
                sig not in STOP_SIGNALS or f.get("result") not in (0, None):
            return
        ctx = f.get("irq_ctx")
        who = f"{self.comms.get(ev.pid, '?')}[{ev.pid}]" if not ctx else \
            f"the kernel (in an interrupt on CPU {ev.cpu})"
        self.stop_sig = (ev.ts_ns, sig, ev.pid if not ctx else None, who)
        part = self.part
        if part is not None and part.state in ("T", "t") and part.signal is None:
            self._sign(part)  # (the sender's event came after the stop: another CPU)

    def remote(self, ev: Event) -> None:
        """A wake-up, signal or sleep timer of the followed thread on another CPU."""
        if ev.name == "signal_generate":
            self.signalled(ev)
            return
        if ev.name == "hrtimer_start":
            self.timer_set = (ev.ts_ns, ev.fields.get("softexpires"))
            return
        if ev.fields.get("pid") != self.tid:
            return
        if self.pstate != _RUN and ev.ts_ns > self.last:
            # the stretch up to it on this CPU, as it was (the next local event would charge
            # it after the state changed)
            self.charge(ev.ts_ns, self.current(self.task), self.task)
        self.woke(ev)
        if self.waking is None or ev.name == "sched_waking" and \
                self.waking_name == "sched_wakeup":
            self.waking, self.waking_name = ev.ts_ns, ev.name

    def _task_entity(self, pid: int) -> Entity:
        """(cached per pid until its comm or work item changes)"""
        comm = self.comms.get(pid, "?")
        if pid in self.probe:
            return Entity(PROBE, comm, pid)
        fn = self.work.get(pid)
        if fn is not None:
            return Entity(WORK, f"{comm} ({fn})", pid)
        return Entity(TASK, comm, pid)

    def charge(self, until: int, who: Entity, current_pid: int | None) -> None:
        """Charge the time from the last event to ``until`` to ``who``. :meth:`step` does
        the same inline (once per event: a call each cost the flood's walk 22 %)."""
        tl = self.tl
        a, b = max(self.last, tl.t0_ns), min(until, tl.t1_ns)
        if b > a:
            if self.pstate != _RUN:
                who = self.overlay(who, b - a)
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

    def current(self, pid: int | None) -> Entity:
        if self.stack:
            return self.stack[-1][0]
        if pid is None:
            return Entity(UNKNOWN, "no events (task unknown)")
        return self.task_entity(pid)

    def _find(self, op: int, ev: Event, vent: Entity | None) -> int:
        """The stack index of the context exit ``ev`` (of kind ``op``) closes, innermost
        first; -1 when its entry is not on the stack (before the window, or lost)."""
        stack = self.stack
        if op == _IRQ_OUT:
            irq = ev.fields.get("irq")
            for i in range(len(stack) - 1, -1, -1):
                e = stack[i][0]
                if e.kind == IRQ and e.num == irq:
                    return i
        elif op == _SOFT_OUT:
            action = str(ev.fields.get("action"))
            for i in range(len(stack) - 1, -1, -1):
                e = stack[i][0]
                if e.kind == SOFTIRQ and e.name == action:
                    return i
        else:  # an APIC vector's exit
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == vent:
                    return i
        return -1

    def _pop_at(self, i: int) -> tuple[Entity, int, bool] | None:
        if i < 0:
            return None
        top = self.stack[i]
        if i != len(self.stack) - 1:
            self.tl.anomalies += 1  # an inner exit was lost
        del self.stack[i:]
        return top

    def _unmatched(self, op: int, ev: Event, vent: Entity | None, at: int) -> Entity | None:
        """The context an exit closes when its entry is not on the stack (``at`` < 0): the
        interval up to the exit was spent in it."""
        if op == _WQ_OUT:
            if ev.pid not in self.work and not self.stack:
                return Entity(WORK, f"{self.comms.get(ev.pid, '?')} "
                                    f"({ev.fields.get('function')})", ev.pid)
            return None
        if at >= 0:
            return None
        if op == _IRQ_OUT:
            return Entity(IRQ, "?", num=ev.fields.get("irq"))
        if op == _SOFT_OUT:
            return _softirq_entity(str(ev.fields.get("action")))
        return vent

    def _exit_context(self, op: int, ev: Event, vent: Entity | None
                      ) -> tuple[int, Entity | None]:
        """For an exit: (the stack index of the context it closes, -1 when its entry is not
        on the stack; that context when it is not, else None). (-1, None) for the rest."""
        if op not in _EXITS:
            return -1, None
        at = -1 if op == _WQ_OUT else self._find(op, ev, vent)
        return at, self._unmatched(op, ev, vent, at)

    def pid_of(self, ev: Event) -> int:
        """Who was current when ``ev`` fired: its ``common_pid``, except for the switch's
        own TLB flush (switch_mm, before ``current`` changes), which carries the task just
        switched out, right after the sched_switch that left it. Trusting that pid charged
        the switched-in task's run to the one it replaced (on a 6.18 KVM guest's kernel (16 vCPUs) every
        switch between processes flushes so: under an RT hog a third of the windows showed
        the hog through the probe's own run)."""
        if ev.name == "tlb_flush" and self.task is not None and _on_switch(ev.fields):
            return self.task
        return ev.pid

    def step(self, ev: Event) -> None:
        tl, name, ts = self.tl, ev.name, ev.ts_ns
        stack = self.stack
        op, vent = _op(name)
        pid = self.pid_of(ev) if op == _TLB else ev.pid
        if self.task is not None and pid != self.task and not stack and ts >= tl.t0_ns:
            # a switch we did not see: trust common_pid (counted in the sample itself: the
            # margin before it may hold the wake instance's sparse lookback events, between
            # which switches went unread)
            tl.anomalies += 1
        if pid == self.tid and self.pstate != _RUN:
            self.to_run(self.last, "event")  # it ran: the interval before is its own
        # 1. the interval up to this event: the innermost context, or the one an exit
        # whose entry the stack lacks closes
        at, who = self._exit_context(op, ev, vent)
        if who is None:
            who = stack[-1][0] if stack else self.task_entity(pid)
        # (charge, inlined: once per event)
        last, t0, t1 = self.last, tl.t0_ns, tl.t1_ns
        a = last if last > t0 else t0
        b = ts if ts < t1 else t1
        if b > a:
            if self.pstate != _RUN:
                who = self.overlay(who, b - a)
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
        if ts > last:
            self.last = ts
        # 2. the event's own effect
        last_exit, self.last_exit = self.last_exit, None
        if op == _SWITCH:
            self._switch(ev)
            return
        self.task = pid
        f = ev.fields
        if op == _VEC_IN:
            self._count(vent.name, ts)
            self._entered(vent, ev)
            stack.append((vent, len(tl.intervals), False))
        elif op == _VEC_OUT:
            top = self._pop_at(at)
            if top is not None and top[2]:  # a TLB shootdown ran in this IPI: say so
                new = Entity(top[0].kind, f"{top[0].name} (TLB shootdown)")
                self._relabel(top[1], top[0], new)
                pi = tl.probe_interrupts
                if not stack and pid in self.probe and pi.get(top[0]):
                    # its hidden cost goes with it (one culprit label, not two)
                    pi[top[0]] -= 1
                    pi[new] = pi.get(new, 0) + 1
                    if not pi[top[0]]:
                        del pi[top[0]]
            elif vent.kind == IPI and not stack:
                self.last_exit = (vent, ts)
        elif op == _SOFT_IN:
            action = str(f.get("action"))
            if last_exit is not None and ts - last_exit[1] <= RAISE_WITHIN_NS and \
                    ts >= tl.t0_ns:  # (as the IPIs it is compared with: the sample's own)
                per = self.raised.setdefault(last_exit[0], {})
                per[action] = per.get(action, 0) + 1
            stack.append((_softirq_entity(action), len(tl.intervals), False))
        elif op == _SOFT_OUT or op == _IRQ_OUT:
            self._pop_at(at)
        elif op == _IRQ_IN:
            ent = Entity(IRQ, str(f.get("name", "?")), num=f.get("irq"))
            self._entered(ent, ev)
            stack.append((ent, len(tl.intervals), False))
        elif op == _WAKE:
            if f.get("pid") == self.tid:
                self.woke(ev)
            if f.get("pid") in self.probe:
                # sched_waking comes first where both are enabled: keep the earlier of a pair
                if self.waking is None or name == "sched_waking" and \
                        self.waking_name == "sched_wakeup":
                    self.waking, self.waking_name = ts, name
        elif op == _MIGRATE:
            if f.get("pid") in self.probe:
                tl.migrations.append((ts, f.get("orig_cpu", -1), f.get("dest_cpu", -1)))
                if f.get("pid") == self.tid and f.get("orig_cpu") == tl.cpu and \
                        f.get("dest_cpu") != tl.cpu and self.pstate in (_READY, _WOKEN):
                    self.pstate = _UNK  # runnable on another CPU: not seen from here
                    self.unk_idx = len(tl.intervals)
        elif op == _SIGNAL:
            self.signalled(ev)
        elif op == _TIMER_SET:
            if pid == self.tid:
                self.timer_set = (ts, f.get("softexpires"))
        elif op == _IO_ISSUE:
            if pid == self.tid:
                self.io_issued = ts
        elif op == _IO_DONE:
            self.io_done = ts
        elif op == _WQ_IN:
            self.work[pid] = str(f.get("function"))
            self._tasks.pop(pid, None)
        elif op == _WQ_OUT:
            self.work.pop(pid, None)
            self._tasks.pop(pid, None)
        elif op == _TLB:
            self._count("tlb_flush", ts)
            if f.get("reason") == 1 or "remote shootdown" in str(f.get("reason_str", "")):
                self._count("tlb_shootdown", ts)
                if stack and stack[-1][0].kind == IPI:
                    ent, idx, _ = stack[-1]
                    stack[-1] = (ent, idx, True)
        elif op == _IPI_SENT:
            self._count("ipi_sent", ts)

    def _switch(self, ev: Event) -> None:
        tl, f = self.tl, ev.fields
        if self.stack:
            tl.anomalies += 1  # switches happen in task context: an exit was lost
            self.stack.clear()
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
        if prev == self.tid and prev != nxt:
            if runnable:
                self.pstate = _READY  # preempted: what runs now delays it
            else:
                self.open_part(ev.ts_ns, str(f.get("prev_state", "")) or None)
        if nxt in self.probe:
            self.switch_ins.append((self.waking, ev.ts_ns))
            self.waking = None
        if nxt == self.tid:
            self.to_run(ev.ts_ns, "switch")
        self.task = nxt

    def _entered(self, ent: Entity, ev: Event) -> None:
        """A hard interrupt entered: count it when it interrupted the probe itself."""
        tl = self.tl
        if not self.stack and ev.pid in self.probe and tl.t0_ns <= ev.ts_ns <= tl.t1_ns:
            tl.probe_interrupts[ent] = tl.probe_interrupts.get(ent, 0) + 1

    def finish(self) -> None:
        """Name the IPIs that raise a softirq (below), then pick the switch-in that starts
        this sample: the last at or before t0 when the probe was on the CPU at t0, else the
        first after it."""
        self._name_raisers()
        tl = self.tl
        if self.part is not None and self.pstate == _OFF:
            self.unknown_part(self.part)
        # it exited: closed, its time after the exit unknown
        self.unk_ns += sum(p.in_ns for p in tl.parts if p.ended_by == "exit")
        if self.tid is not None:
            parts = sum(p.in_ns for p in tl.parts if p.kind not in (IDLE, UNKNOWN))
            wake = self.wake_idle_ns + sum(p.in_ns for p in tl.parts if p.kind == IDLE)
            tl.state_ns = {"on_cpu": tl.probe_current_ns, "not_runnable": parts,
                           "wakeup": wake, "unknown": self.unk_ns,
                           "runnable": max(0, tl.wall_ns - tl.probe_current_ns - parts - wake
                                           - self.unk_ns)}
        if not self.probe_ran and not any(p.ended_by == "waking" for p in tl.parts):
            # the probe never ran here in the whole window: the idle was not a wake-up that
            # came late (it blocked throughout, or ran on another CPU); unless a waking of
            # the followed thread says it was woken here (its run came after the window)
            self._relabel(0, Entity(IDLE, IDLE_BEFORE_WAKE, 0), Entity(IDLE, IDLE_ABSENT, 0))
        before = [s for s in self.switch_ins if s[1] <= tl.t0_ns]
        after = [s for s in self.switch_ins if s[1] > tl.t0_ns]
        pick = before[-1] if tl.start_delay_ns == 0 and before else (after[0] if after else None)
        if pick is not None:
            tl.switch_in_ns = pick[1]
            if pick[0] is not None:
                tl.wake_ns = pick[0]
                tl.wake_latency_ns = pick[1] - pick[0]

    def _name_raisers(self) -> None:
        """An IPI after most of whose returns (≥ RAISES_SHARE) one softirq vector starts at
        once, before any other event, was sent to raise it: RPS/RFS steering packets to
        this CPU (``rps_trigger_softirq``), a remote ``raise_softirq``. Its time is that
        softirq's: the entity becomes ``softirq <VEC> raise (IPI <vector>)``, kind softirq."""
        tl = self.tl
        for ent, per in self.raised.items():
            vec, n = max(per.items(), key=lambda kv: kv[1])
            seen = self.tl.counts.get(ent.name, 0)
            if not seen or n < RAISES_SHARE * seen:
                continue
            new = Entity(SOFTIRQ, f"{vec} raise (IPI {ent.name})")
            self._relabel(0, ent, new)
            if ent in tl.probe_interrupts:
                tl.probe_interrupts[new] = tl.probe_interrupts.pop(ent)

    def _count(self, key: str, ts: int) -> None:
        """Count an event of the sample itself (``[t0, t1]``: not the margin read before it,
        which sets state only)."""
        tl = self.tl
        if tl.t0_ns <= ts <= tl.t1_ns:
            tl.counts[key] = tl.counts.get(key, 0) + 1

    def _relabel(self, from_idx: int, old: Entity, new: Entity) -> None:
        tl = self.tl
        for iv in tl.intervals[from_idx:]:
            if iv.entity == old:
                iv.entity = new
                tl.totals[old] -= iv.ns
                tl.totals[new] = tl.totals.get(new, 0) + iv.ns
        if tl.totals.get(old) == 0:
            del tl.totals[old]


@lru_cache(maxsize=1024)
def _is_vector(name: str) -> bool:
    """irq_vectors' <vector>_entry/_exit (not irq:*, softirq_* or the others')."""
    if not name.endswith(("_entry", "_exit")):
        return False
    return not name.startswith(("irq_handler", "softirq", "tasklet", "workqueue", "sched",
                                "hrtimer", "timer_", "vector_"))


# What each event name does in the walk, decided once per name (:func:`_op`).
(_OTHER, _SWITCH, _WAKE, _MIGRATE, _IRQ_IN, _IRQ_OUT, _SOFT_IN, _SOFT_OUT, _WQ_IN, _WQ_OUT,
 _TLB, _IPI_SENT, _VEC_IN, _VEC_OUT, _SIGNAL, _IO_ISSUE, _IO_DONE, _TIMER_SET) = range(18)
_EXITS = frozenset({_IRQ_OUT, _SOFT_OUT, _WQ_OUT, _VEC_OUT})
_OPS = {"sched_switch": _SWITCH, "sched_waking": _WAKE, "sched_wakeup": _WAKE,
        "sched_migrate_task": _MIGRATE, "irq_handler_entry": _IRQ_IN,
        "irq_handler_exit": _IRQ_OUT, "softirq_entry": _SOFT_IN, "softirq_exit": _SOFT_OUT,
        "workqueue_execute_start": _WQ_IN, "workqueue_execute_end": _WQ_OUT,
        "tlb_flush": _TLB, "signal_generate": _SIGNAL, "block_rq_issue": _IO_ISSUE,
        "block_rq_complete": _IO_DONE, "hrtimer_start": _TIMER_SET}
# The events of other CPUs the walk takes (the source's wake instance): who woke or stopped
# the followed thread; they never charge time on this CPU.
_REMOTE = frozenset({"sched_waking", "sched_wakeup", "signal_generate"})
# The followed thread's states (_Walk.pstate)
_RUN, _READY, _WOKEN, _OFF, _UNK, _GONE = range(6)
_WAKE_ENTITY = Entity(IDLE, IDLE_BEFORE_WAKE, 0)


def _comm_of(label: str | None) -> str:
    """A waker's or sender's short name for a metrics label: the comm of "comm[tid]" (or of
    "thread N of the same process (comm)"), else the label itself ("timer", ...)."""
    if not label:
        return "unknown"
    if label.endswith(")") and label.startswith("thread "):
        return label.rsplit("(", 1)[-1][:-1]
    if label.endswith("]") and "[" in label:
        return label.rsplit("[", 1)[0]
    return label


@lru_cache(maxsize=1024)
def _op(name: str) -> tuple[int, Entity | None]:
    """(what ``name`` does, the APIC vector's entity for a vector's entry or exit)."""
    op = _OPS.get(name)
    if op is not None:
        return op, None
    if name.startswith("ipi_send"):
        return _IPI_SENT, None
    if _is_vector(name):
        base = name.rsplit("_", 1)[0]
        return (_VEC_IN if name.endswith("_entry") else _VEC_OUT), _vector_entity(base)
    return _OTHER, None


def _on_switch(f: dict) -> bool:
    """A tlb_flush of reason TLB_FLUSH_ON_TASK_SWITCH (0, "flush on task switch")."""
    return f.get("reason") == 0 or "task switch" in str(f.get("reason_str", ""))


@lru_cache(maxsize=256)
def _softirq_entity(action: str) -> Entity:
    return Entity(SOFTIRQ, action)


def timeline(events: Iterable[Event], cpu: int, probe_tids: Iterable[int], t0_ns: int,
             t1_ns: int, *, comms: dict[int, str] | None = None, complete: bool = True,
             reason: str | None = None, follow: bool = False, probe_pid: int | None = None,
             tgid_of: Callable[[int], int | None] | None = None,
             wake_reason: str | None = None) -> Timeline:
    """Account ``[t0_ns, t1_ns]`` on ``cpu`` (see the module docstring). ``events``: the
    window's events (other CPUs' are skipped, except the wake-ups and signals of the probe
    thread: who woke or stopped it), including some before ``t0_ns`` so that the state at
    ``t0_ns`` is known (EventSource.window's margin and the last sched_switch before it).
    ``probe_tids``: the probe's thread ids; with one and ``follow``, its state is followed
    (parts, state_ns: a slow call's off-CPU time; ``hftagent cpus`` follows none: its
    spinners never block, and what ran on the CPU is what it reports).
    ``comms``: pid → comm for tasks no event names (``Window.comms``). ``probe_pid``: its
    process (a signal to the process stops the thread; a waker in it is "the same
    process"), ``tgid_of``: a task's process id (None when gone). ``wake_reason``: why the
    other CPUs' wake-ups may be missing (Window.wake_reason)."""
    probe = {int(t) for t in probe_tids}
    one = next(iter(probe)) if follow and len(probe) == 1 else None
    evs = sorted((e for e in events if e.cpu == cpu or one is not None and (
        e.name in _REMOTE and e.fields.get("pid") in (one, probe_pid) or
        e.name == "hrtimer_start" and e.pid == one)), key=lambda e: e.ts_ns)
    names: dict[int, str] = {}
    for e in evs:  # comms the events name, so tasks are named from their first interval on
        f = e.fields
        if e.name == "sched_switch":
            names.setdefault(f.get("prev_pid"), f.get("prev_comm", "?"))
            names.setdefault(f.get("next_pid"), f.get("next_comm", "?"))
        elif "comm" in f and "pid" in f:
            names.setdefault(f["pid"], f["comm"])
    if comms:
        for k, v in comms.items():
            names.setdefault(k, v)
    w = _Walk(cpu, probe, t0_ns, t1_ns, names, probe_pid, tgid_of, follow)
    local = [e.ts_ns for e in evs if e.cpu == cpu]
    w.last = w.first_ns = min(t0_ns, local[0]) if local else t0_ns
    w.tl.seen_until_ns = local[-1] if local else None
    after = None
    for ev in evs:
        if ev.cpu != cpu:
            if ev.ts_ns <= t1_ns:
                w.remote(ev)
            continue
        if ev.ts_ns > t1_ns:
            after = ev
            break
        w.step(ev)
    # the rest of the window: whoever the first event after it says was current (its
    # common_pid; a switch's prev), as every interval before an event is charged; without
    # one, whoever is current after the last event. The kernel does not always record the
    # switch in (a 6.18 Firecracker guest's kernel records no sched_switch from idle at all),
    # so the task after the last event can be stale where the next one is not.
    if after is not None:
        op, vent = _op(after.name)
        pid = w.pid_of(after)
        if pid == w.tid and w.pstate != _RUN:
            w.to_run(w.last, "event")
        w.charge(t1_ns, w._exit_context(op, after, vent)[1] or w.current(pid), pid)
    else:
        if w.pstate == _WOKEN and not w.stack and w.task == 0:
            # woken, then no event at all up to the window's end: it ran or it waited, no
            # event says (6.18 records no switch from idle) — unknown, not the idle CPU's
            w.pstate = _UNK
            w.charge(t1_ns, Entity(UNKNOWN, NO_RUN_SEEN), w.task)
        else:
            w.charge(t1_ns, w.current(w.task), w.task)
    w.finish()
    tl = w.tl
    tl.complete = complete
    tl.reason = reason
    tl.wake_reason = wake_reason
    return tl


# --- the excess over P50 --------------------------------------------------------------------

HW, UNEXPLAINED = EVENT_RESIDUALS  # "hw_or_hypervisor", "unexplained"


HIDDEN_IRQ = "interrupt entry/exit (hidden)"
SLOWED = "probe slowed after interrupts (est.)"


BACKLOG = "backlog: its thread's earlier calls, queued behind the stall"


def backlog(tl: Timeline, own_ns: int) -> tuple[Entity, int] | None:
    """The time a call waited for its own thread's earlier calls after a stall that began
    before it: the followed thread was not runnable at the call's intended start (a part
    that began before ``t0`` and ended inside the window: blocked, I/O, stopped, or a
    pacing sleep that overshot), so the call could not start before that part ended, and
    then the thread ran the calls that had queued behind the stall first (an open-loop
    client's schedule: they were due earlier). That is the thread's on-CPU time after the
    part's end less the call's own work (``own_ns``: its CPU time where measured, else the
    P50), never below 0. As an entity of the part's kind and culprit (its cause), labelled
    :data:`BACKLOG`; None without such a part."""
    part = next((p for p in reversed(tl.parts) if p.start_ns < tl.t0_ns and p.in_ns > 0
                 and p.end_ns is not None and p.entity is not None
                 and p.kind in (BLOCKED, IO_WAIT, STOPPED, IDLE)), None)
    if part is None:
        return None
    ran = sum(iv.ns for iv in tl.intervals
              if iv.entity.kind == PROBE and iv.start_ns >= part.end_ns)
    ns = ran - max(0, int(own_ns))
    if ns <= 0:
        return None
    e = part.entity
    return Entity(e.kind, e.name, e.pid, detail=BACKLOG), ns


def breakdown(tl: Timeline, excess_ns: int, *, hw: HwNoise | None = None,
              irq_cost_ns: int | None = None, slowdown_ns: int | None = None,
              queued: tuple[Entity, int] | None = None,
              min_ns: int = 1_000) -> list[tuple[str, int]]:
    """The excess of a sample over P50 by what took the CPU from the probe, largest first,
    then ``hw_or_hypervisor`` (when ``hw`` found hidden time), the interrupts' hidden entry
    and exit (:func:`interrupt_overhead`, with ``irq_cost_ns``), the probe's own slowdown
    after them (``slowdown_ns`` per interrupt: the in-situ estimate of
    agent/watch/attribution/events.py :class:`SlowdownEstimate`, from earlier spikes) and
    ``unexplained``: ``excess - sum(items)``, never below 0. Items are real durations from
    the timeline (not scaled): they can sum to more than the excess when a typical sample
    also has some of them (a tick); the residual is then 0. The two per-interrupt items are
    capped at what the items before them leave. Items under ``min_ns`` are left out (they
    stay in ``tl.totals``). ``queued``: :func:`backlog`'s item (the thread's earlier calls
    after a stall), capped like the per-interrupt ones. An incomplete timeline names only
    what its events show: what it cannot see is in the residual."""
    items = [(e.label, ns) for e, ns in tl.ranked() if e.kind != PROBE and ns >= min_ns]
    if hw is not None and hw.hidden_ns:
        items.append((HW, hw.hidden_ns))
    explained = sum(ns for _, ns in items)
    if queued is not None:
        ns = min(queued[1], int(excess_ns) - explained)
        if ns >= min_ns:
            items.append((queued[0].label, ns))
            explained += ns
    for label, per in ((HIDDEN_IRQ, irq_cost_ns), (SLOWED, slowdown_ns)):
        ns = sum(interrupt_overhead(tl, per, int(excess_ns) - explained).values())
        if ns >= min_ns:
            items.append((label, ns))
            explained += ns
    items.append((UNEXPLAINED, max(0, int(excess_ns) - explained)))
    return items


def interrupt_overhead(tl: Timeline, cost_ns: int | None, residual_ns: int
                       ) -> dict[Entity, int]:
    """What the interrupts that entered while the probe ran cost it beyond their handlers,
    per interrupt entity: ``tl.probe_interrupts`` × ``cost_ns``, the CPU's measured cost of
    one interrupt to a running task (agent/trace/irqcost.py: in a VM mostly the exit to the
    hypervisor and the entry back, which no guest event can time; on bare metal a few
    hundred ns of entry and exit code). That time shows as the probe's own run time in the
    timeline. Never more than ``residual_ns`` (what the timeline's items leave unexplained):
    scaled down to it when the count says more. Empty without a cost."""
    if not cost_ns or cost_ns <= 0 or residual_ns <= 0 or not tl.probe_interrupts:
        return {}
    raw = {e: n * int(cost_ns) for e, n in tl.probe_interrupts.items()}
    total = sum(raw.values())
    if total <= residual_ns:
        return raw
    return {e: ns * residual_ns // total for e, ns in raw.items()}


def format_breakdown(items: list[tuple[str, int]]) -> str:
    """``1.2 ms kworker/1:0 (vmstat_update), 0.4 ms softirq NET_RX, 0.2 ms unexplained``."""
    def fmt(ns: int) -> str:
        return f"{ns / 1e6:.1f} ms" if ns >= 100_000 else f"{ns / 1e3:.0f} µs"
    return ", ".join(f"{fmt(ns)} {label}" for label, ns in items)


# --- hardware / hypervisor noise --------------------------------------------------------------

@dataclass
class HwNoise:
    """Time the probe was on the CPU, with no event, that its CPU time does not contain.

    ``hidden_ns``: the probe's on-CPU wall time in the timeline minus ``probe_cpu_ns`` (0
    under the threshold; None without a CPU time to compare). ``gaps_ns``: the quiet
    stretches (probe running, no event at all) of at least ``min_gap_ns``, longest first —
    the hidden time lies inside them, as rtla hwnoise's gaps do; ``steal_ns``: the
    hypervisor's steal reported for the CPU around the sample, when given; ``correlated``:
    steal accounts for at least half the hidden time; ``note``: one line saying so."""

    hidden_ns: int | None
    gaps_ns: list[int]
    steal_ns: int | None = None
    correlated: bool | None = None
    note: str = ""

    @property
    def longest_gap_ns(self) -> int:
        return self.gaps_ns[0] if self.gaps_ns else 0

    def to_dict(self) -> dict:
        d: dict = {"hidden_us": None if self.hidden_ns is None else round(self.hidden_ns / 1e3, 1),
                   "gaps_us": [round(g / 1e3, 1) for g in self.gaps_ns[:16]], "note": self.note}
        if self.steal_ns is not None:
            d["steal_us"] = round(self.steal_ns / 1e3, 1)
            d["correlated_with_steal"] = self.correlated
        return d


def hw_noise(tl: Timeline, probe_cpu_ns: int | None = None, *, steal_ns: int | None = None,
             cpu_includes_irq: bool = False, min_gap_ns: int = 10_000,
             threshold_ns: int = 20_000, threshold_frac: float = 0.02) -> HwNoise:
    """Hardware or hypervisor time inside a sample (see :class:`HwNoise`).

    ``probe_cpu_ns``: the probe thread's CPU time over the sample (CLOCK_THREAD_CPUTIME or
    schedstat; with CONFIG_PARAVIRT_TIME_ACCOUNTING the kernel leaves steal out of it). By
    default it is compared with the time the probe itself ran; with ``cpu_includes_irq``
    (a kernel without CONFIG_IRQ_TIME_ACCOUNTING charges interrupts to the task they
    interrupt) with the time the probe was current, interrupts inside it included. The
    default is the conservative one: it never reports interrupt time as hidden. Hidden time
    under ``max(threshold_ns, threshold_frac × on-CPU time)`` is clock-read noise: 0."""
    gaps = sorted((iv.ns for iv in tl.quiet_probe_gaps() if iv.ns >= min_gap_ns), reverse=True)
    if probe_cpu_ns is None or probe_cpu_ns < 0:
        return HwNoise(None, gaps, steal_ns, None,
                       "no CPU time for the probe: hidden time not measurable")
    on_cpu = tl.probe_current_ns if cpu_includes_irq else tl.probe_run_ns
    hidden = on_cpu - int(probe_cpu_ns)
    if hidden < max(threshold_ns, int(threshold_frac * on_cpu)):
        return HwNoise(0, gaps, steal_ns, None, "none: CPU time matches time on the CPU")
    if not gaps:
        # on the CPU with events all along, and still missing time: the CPU time was read
        # differently from the window (a multi-threaded probe, a clock read outside it)
        return HwNoise(0, gaps, steal_ns, None,
                       f"{hidden / 1e3:.0f} µs of CPU time missing, but no quiet stretch "
                       "to hold it: not hardware")
    hidden = min(hidden, sum(gaps))
    if steal_ns is None:
        note = "no steal figure to compare"
        corr = None
    else:
        corr = steal_ns * 2 >= hidden
        note = (f"steal {steal_ns / 1e3:.0f} µs around it: the hypervisor ran something else"
                if corr else
                f"steal {steal_ns / 1e3:.0f} µs only: firmware (SMI) or a host that does "
                "not report steal")
    return HwNoise(hidden, gaps, steal_ns, corr, note)
