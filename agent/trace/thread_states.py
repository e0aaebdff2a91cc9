"""The followed thread's states: the second machine of the timeline walk.

With ``follow=True`` and one probe thread (watch's spikes), :class:`ThreadStates` follows
that thread's own state over the window (docs/events.md "Off-CPU time"): on the CPU
(``RUN``), runnable (preempted, ``READY``, or woken, ``WOKEN``: what ran is the delay), not
runnable (``OFF``) from a switch-out in S, D, T/t, P or I to the ``sched_waking`` that
ended it (from any CPU: the source's wake instance) — a :class:`~.accounting.Part`, named
by its state and its waker (a task, another thread of the same process, a timer, an
interrupt) or, for T, the stop signal's sender —, woken with the CPU idle (wake-up latency
proper), unknown (``UNK``: no event says) or exited (``GONE``). A part with neither a
waking nor a switch-in nor a run of the thread at its end is unknown, never guessed; a part
that began before the window's start and ended by a timer is a pacing sleep that overshot
the start (a late wake-up), not a wait of the call's own.

How it meets the CPU's story (:mod:`.cpu_story`), which drives it: the CPU's story charges
every interval to what the CPU ran and, while the thread is not ``RUN``, asks
:meth:`ThreadStates.overlay` what that interval was for the thread (while it was not
runnable, its part's: what ran then did not delay it; idle while it was runnable, its
wake-up latency). It hands over the thread's switches (:meth:`~ThreadStates.switched_out`,
:meth:`~ThreadStates.to_run`), wakings, signals, migrations, sleep timers and block I/O.
This machine reads the CPU's interrupt :class:`~.contexts.Contexts` to name an interrupt
that woke the thread, writes the parts and ``state_ns`` into the shared
:class:`~.accounting.Timeline`, and renames the intervals it took once a part's kind is
known (:func:`~.accounting.relabel`).
"""

from __future__ import annotations

from collections.abc import Callable

from .accounting import (
    BLOCKED,
    EXITED,
    IDLE,
    IDLE_BEFORE_WAKE,
    IO_WAIT,
    PROBE,
    SIGNAL_NAMES,
    SOFTIRQ,
    STOP_SIGNALS,
    STOPPED,
    TIMER,
    UNKNOWN,
    Entity,
    Interval,
    Part,
    Timeline,
    relabel,
)
from .contexts import Contexts
from .event import Event

# a block request the thread issued this soon before it slept in D makes the wait an I/O
# wait; a block completion this soon before an interrupt's wake-up makes it its end
IO_NEAR_NS = 100_000
# a sleep's timer due this soon after the call's start still aimed at it: a pacing sleep
# computed as "start - now" lands a few µs past the start (seen: 5 µs in the service's
# idle_wakeup switch), not a sleep the call asked for past it
PACING_SLACK_NS = 50_000

# The followed thread's states (ThreadStates.pstate)
RUN, READY, WOKEN, OFF, UNK, GONE = range(6)
WAKE_ENTITY = Entity(IDLE, IDLE_BEFORE_WAKE, 0)


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


class ThreadStates:
    """The followed thread's state machine (see the module docstring). ``tid``: the thread
    (None when the walk follows none: its state is then ``RUN`` throughout); ``comms``: the
    walk's pid → comm (shared with the CPU's story); ``probe_pid``: its process;
    ``tgid_of``: a task's process id (None when gone)."""

    def __init__(self, tl: Timeline, ctx: Contexts, tid: int | None, comms: dict[int, str],
                 probe_pid: int | None = None,
                 tgid_of: Callable[[int], int | None] | None = None) -> None:
        self.tl = tl
        self.ctx = ctx
        self.tid = tid
        self.comms = comms
        self.probe_pid = probe_pid
        self.tgid_of = tgid_of
        # RUN while it is not followed, else UNK until an event says (a switch of it, a
        # waking, an event in its context)
        self.pstate = UNK if tid is not None else RUN
        self.part: Part | None = None  # open while OFF (or GONE)
        self.unk_ns = 0  # not the thread's own time, while its state was unknown
        self.unk_idx = 0  # the first interval of the unknown stretch
        self.wake_idle_ns = 0  # idle while it was runnable (woken, not yet running)
        self.first_ns = tl.t0_ns  # the window's first event on this CPU (the walk sets it)
        self.woken_ns: int | None = None  # its waking, while WOKEN
        self.stop_sig: tuple[int, int, int | None, str] | None = None  # (ts, sig, tid, who)
        self.io_issued: int | None = None  # its last block request on this CPU
        self.io_done: int | None = None  # the last block completion on this CPU
        # its last hrtimer_start of a sleep (ts, softexpires): the expiry it asked for
        self.timer_set: tuple[int, int | None] | None = None

    # -- what the CPU's story hands over --------------------------------------------------
    def overlay(self, who: Entity, ns: int) -> Entity:
        """What an interval charged to ``who`` (what the CPU ran) was for the followed
        thread, outside RUN: while it was not runnable, its part (what ran then did not
        delay it); idle while it was runnable, its wake-up latency (woken, the CPU not yet
        running it: the idle exit, the IPI's delivery); while its state was unknown, as it
        is (and counted as unknown)."""
        st = self.pstate
        if st == OFF or st == GONE:
            part = self.part
            if who.kind != PROBE and part is not None:
                part.in_ns += ns
                part.took.append((len(self.tl.intervals), who))
                return part.entity
        elif st == UNK:
            if who.kind != PROBE:
                self.unk_ns += ns
        elif who.kind == IDLE:  # WOKEN, READY
            self.wake_idle_ns += ns
            return WAKE_ENTITY
        return who

    def to_run(self, at: int, how: str) -> bool:
        """The followed thread is on the CPU from ``at`` (its switch-in, else the first
        event in its context: a 6.18 Firecracker guest's kernel records no switch from idle).
        True when that is its switch-in, inferred (the wake-up before it is this run's)."""
        inferred = how == "event" and self.pstate != UNK
        if self.pstate == OFF and self.part is not None:
            self.close_part(at, how)
        elif self.pstate == GONE:
            self.part = None  # an event of the exited tid: a reused one, or events lost
        self.pstate = RUN
        self.woken_ns = None
        return inferred

    def switched_out(self, at: int, state: str | None, runnable: bool) -> None:
        """Its sched_switch away (``state``: prev_state)."""
        if runnable:
            self.pstate = READY  # preempted: what runs now delays it
        else:
            self.open_part(at, state)

    def migrated(self, f: dict) -> None:
        """sched_migrate_task of a probe thread: the followed one, runnable, moved off this
        CPU is runnable where this walk does not see it."""
        cpu = self.tl.cpu
        if f.get("pid") == self.tid and f.get("orig_cpu") == cpu and \
                f.get("dest_cpu") != cpu and self.pstate in (READY, WOKEN):
            self.pstate = UNK
            self.unk_idx = len(self.tl.intervals)

    def run_unseen(self) -> None:
        """Woken, then no event at all up to the window's end: it ran or it waited, no event
        says (6.18 records no switch from idle) — unknown, not the idle CPU's."""
        self.pstate = UNK

    def armed(self, ts: int, expires: int | None) -> None:
        """Its hrtimer_start (a sleep's timer, due at ``expires``)."""
        self.timer_set = (ts, expires)

    def issued(self, ts: int) -> None:
        """Its block_rq_issue."""
        self.io_issued = ts

    def completed(self, ts: int) -> None:
        """A block_rq_complete on this CPU (anyone's)."""
        self.io_done = ts

    # -- its parts -------------------------------------------------------------------------
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
        self.pstate = GONE if letter in ("X", "Z") else OFF

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
        timer, self.timer_set = self.timer_set, None
        if timer is not None and part.waker_ctx == "timer" and timer[1] is not None and \
                timer[0] <= part.start_ns + IO_NEAR_NS and 0 <= timer[1] - timer[0] < 3600e9:
            part.timer_due_ns = timer[1]  # (a CLOCK_MONOTONIC timer: the trace clock's)
        if part.state is None and self.stop_sig is not None and self.stop_sig[0] <= at:
            # its switch-out is not in the window, but a stop signal to it is, and it was
            # not runnable until this waking: stopped (the state letter stays unknown)
            self._sign(part)
        named = _settle(part, self.tl.t0_ns)
        if part.kind == BLOCKED and part.timer_due_ns is not None and part.timer_due_ns < at:
            _late_wakeup(self.tl, self.ctx, part, part.timer_due_ns, at)
        new = WAKE_ENTITY if named is None else \
            Entity(part.kind, named[1], part.waker_tid, detail=named[0])
        relabel(self.tl, part.first_idx, part.entity, new)
        part.entity = new

    def unknown_part(self, part: Part) -> None:
        """A part still open at the window's end: the call ended at ``t1`` although no event
        says its thread ran again (a wake-up and a switch both unrecorded, or the thread ran
        on another CPU): unknown, never guessed. Its intervals go back to what the CPU ran
        (as before a state was known) and its time counts as unknown."""
        self.part = None
        self.pstate = UNK
        part.kind, part.ended_by = UNKNOWN, "window"
        part.waker = "unknown (no wake-up, switch-in or run of it seen)"
        _give_back(self.tl, part)
        self.unk_ns += part.in_ns
        part.entity = None
        part.took = []

    # -- who woke or stopped it ------------------------------------------------------------
    def waker(self, ev: Event) -> dict:
        """Who made the followed thread runnable with ``ev`` (a waking): a task (its
        ``common_pid`` in task context), else the interrupt it ran in (:meth:`_interrupt`)
        — or nobody (the idle task: "none")."""
        ctx = ev.fields.get("irq_ctx")
        if ctx or (ctx is None and ev.pid == 0):
            return self._interrupt(ev, ctx)
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

    def _interrupt(self, ev: Event, ctx: object) -> dict:
        """A waking outside task context: on this CPU the innermost context the CPU's story
        holds (a local timer tick or a TIMER/HRTIMER softirq: "timer"; an IRQ; a softirq; a
        block completion just before: "io"), on another CPU only "an interrupt on CPU n"
        (its interrupts are not traced); none at all: the idle task."""
        if ev.cpu != self.tl.cpu:
            return {"what": f"an interrupt on CPU {ev.cpu}", "ctx": "interrupt", "cpu": ev.cpu}
        io = self.io_done is not None and ev.ts_ns - self.io_done <= IO_NEAR_NS
        top = self.ctx.top()
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

    def woke(self, ev: Event) -> None:
        """A waking (sched_waking, else sched_wakeup) of the followed thread, on any CPU."""
        st = self.pstate
        if st == OFF:
            self.close_part(ev.ts_ns, "waking", self.waker(ev))
        elif st == UNK:
            self._asleep_since_unknown(ev)
            self.close_part(ev.ts_ns, "waking", self.waker(ev))
        else:
            return  # runnable already (the pair's sched_wakeup, or a switch not recorded)
        self.pstate = WOKEN
        self.woken_ns = ev.ts_ns

    def _asleep_since_unknown(self, ev: Event) -> None:
        """A waking says it was asleep (try_to_wake_up fires it only for a task whose state
        matched): a part from the start of the unknown stretch, its state unknown, taking
        that stretch's intervals (the thread's own runs apart)."""
        tl = self.tl
        ivs = tl.intervals
        if self.unk_idx == 0:
            # asleep since before the window's first event, when it began unknown
            start = min(self.first_ns, tl.t0_ns - 1, ev.ts_ns)
        else:
            start = ivs[self.unk_idx].start_ns if self.unk_idx < len(ivs) else ev.ts_ns
        part = Part(None, start, first_idx=self.unk_idx)
        part.entity = Entity(BLOCKED, "#unknown", detail="open part (state unknown)")
        tl.parts.append(part)
        self.part = part
        _take(tl, part, self.unk_idx)
        self.unk_ns = 0

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

    # -- the window's end --------------------------------------------------------------------
    def finish(self) -> None:
        """Close what is open at the window's end and count the thread's time by state
        (``Timeline.state_ns``; the CPU's story has charged every interval by then)."""
        tl = self.tl
        if self.part is not None and self.pstate == OFF:
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


# -- what a part's intervals become (the Timeline's side of the machine) ----------------------

def _settle(part: Part, t0: int) -> tuple[str, str] | None:
    """Decide a closed part's kind: (its label, its culprit), None for a pacing sleep that
    overshot the call's start ``t0`` (kind IDLE, charged as the wake-up)."""
    st, ctx = part.state, part.waker_ctx
    if st in ("T", "t") or st is None and part.signal is not None:
        part.kind = STOPPED
        by = f" by {SIGNAL_NAMES.get(part.signal, part.signal)} from {part.sender}" \
            if part.signal is not None else ""
        culprit = _comm_of(part.sender) if part.sender else _comm_of(part.waker)
        return f"stopped ({st or 'state unknown'}){by}, continued by {part.waker}", culprit
    if st == "D" and (part.io or ctx == "io" or ctx in ("irq", "softirq", "interrupt")):
        part.kind = IO_WAIT
        return f"I/O wait (D), ended by {part.waker}", _comm_of(part.waker)
    if st in ("S", None) and ctx in ("timer", "none") and (
            part.timer_due_ns is not None and part.start_ns < t0 and
            part.timer_due_ns <= t0 + PACING_SLACK_NS or
            part.timer_due_ns is None and part.start_ns < t0):
        # asleep at the call's start on a timer due by then that fired after it (or,
        # without the timer's own event, asleep since before the start on a timer): the
        # pacing sleep overshot — timer slack, an idle CPU's or a halted vCPU's late
        # wake-up —, not a wait of the call's own
        part.kind = IDLE
        return None
    part.kind = BLOCKED
    return f"blocked ({st or 'state unknown'}), woken by {part.waker}", _comm_of(part.waker)


def _late_wakeup(tl: Timeline, ctx: Contexts, part: Part, due: int, at: int) -> None:
    """The sleep asked for ended at ``due`` but its timer woke the thread at ``at``: the
    part's time from ``due`` on is a late wake-up (a Part of its own, kind IDLE), the
    interval that straddles ``due`` split in two (the CPU's contexts told: their frames
    hold interval indices)."""
    ivs = tl.intervals
    old = part.entity
    late = Part(part.state, due, at, "waking", IDLE, None, part.waker, part.waker_ctx,
                part.waker_cpu, entity=WAKE_ENTITY)
    i = part.first_idx
    while i < len(ivs):
        iv = ivs[i]
        if iv.entity == old and iv.start_ns < due < iv.end_ns:
            ivs.insert(i + 1, Interval(due, iv.end_ns, old))
            iv.end_ns = due
            ctx.shift(i)
        elif iv.entity == old and iv.start_ns >= due:
            iv.entity = WAKE_ENTITY
            late.in_ns += iv.ns
        i += 1
    if not late.in_ns:
        return
    part.in_ns -= late.in_ns
    tl.totals[old] -= late.in_ns
    if not tl.totals[old]:
        del tl.totals[old]
    tl.totals[WAKE_ENTITY] = tl.totals.get(WAKE_ENTITY, 0) + late.in_ns
    tl.parts.append(late)


def _give_back(tl: Timeline, part: Part) -> None:
    """A part that turned out unknown: the intervals it took go back to what the CPU ran."""
    old = part.entity
    for i, who in part.took:
        iv = tl.intervals[i]
        tl.totals[old] -= iv.ns
        tl.totals[who] = tl.totals.get(who, 0) + iv.ns
        iv.entity = who
    if tl.totals.get(old) == 0:
        del tl.totals[old]


def _take(tl: Timeline, part: Part, from_idx: int) -> None:
    """A part found afterwards (a waking after an unknown stretch) takes the intervals
    from ``from_idx`` on, the thread's own runs apart."""
    for iv in tl.intervals[from_idx:]:
        if iv.entity.kind != PROBE:
            part.in_ns += iv.ns
            tl.totals[iv.entity] -= iv.ns
            if not tl.totals[iv.entity]:
                del tl.totals[iv.entity]
            tl.totals[part.entity] = tl.totals.get(part.entity, 0) + iv.ns
            iv.entity = part.entity
