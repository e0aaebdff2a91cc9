"""What ran on the probe CPU during one sample, to the µs, from its kernel events.

This module is the public face of the walk: :func:`timeline`, :func:`breakdown`,
:func:`backlog`, :func:`hw_noise` and the result types they return (:class:`Timeline`,
:class:`Entity`, :class:`Part` and the kinds, defined in :mod:`.accounting`). The walk
itself is two machines over one :class:`Timeline`: the CPU's story
(:class:`~.cpu_story.CpuStory`, with its interrupt :class:`~.contexts.Contexts`: what ran
on the call's CPU) drives the followed thread's states
(:class:`~.thread_states.ThreadStates`: where the call's thread was); each module's
docstring says how they meet.

:func:`timeline` walks the CPU's events in time order — the current task, a stack of
interrupt contexts (hard IRQ handlers, softirqs, the APIC vectors of ``irq_vectors``), the
work item a kworker runs — and charges every interval between two events to the innermost
context active in it:

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
from dataclasses import dataclass

from agent.causes import EVENT_RESIDUALS

from .accounting import (
    BLOCKED,
    EXITED,
    IDLE,
    IDLE_ABSENT,
    IDLE_BEFORE_WAKE,
    IDLE_BLOCKED,
    IO_WAIT,
    IPI,
    IRQ,
    NO_RUN_SEEN,
    NOT_RUNNABLE,
    PROBE,
    SOFTIRQ,
    STOPPED,
    TASK,
    TIMER,
    UNKNOWN,
    VECTOR,
    WORK,
    Entity,
    Interval,
    Part,
    Timeline,
)
from .cpu_story import CpuStory
from .event import Event

# The public names: the entry points below and the result types they return (defined in
# .accounting, which the walk's two machines share).
__all__ = [
    "BACKLOG", "BLOCKED", "EXITED", "HIDDEN_IRQ", "HW", "IDLE", "IDLE_ABSENT",
    "IDLE_BEFORE_WAKE", "IDLE_BLOCKED", "IO_WAIT", "IPI", "IRQ", "NO_RUN_SEEN",
    "NOT_RUNNABLE", "PROBE", "SLOWED", "SOFTIRQ", "STOPPED", "TASK", "TIMER", "UNEXPLAINED",
    "UNKNOWN", "VECTOR", "WORK", "Entity", "HwNoise", "Interval", "Part", "Timeline",
    "backlog", "breakdown", "format_breakdown", "hw_noise", "interrupt_overhead",
    "timeline",
]

# The events of other CPUs the walk takes (the source's wake instance): who woke or stopped
# the followed thread; they never charge time on this CPU.
_REMOTE = frozenset({"sched_waking", "sched_wakeup", "signal_generate"})
_WAKES = frozenset({"sched_waking", "sched_wakeup"})


def timeline(events: Iterable[Event], cpu: int, probe_tids: Iterable[int], t0_ns: int,
             t1_ns: int, *, comms: dict[int, str] | None = None, complete: bool = True,
             reason: str | None = None, follow: bool = False, probe_pid: int | None = None,
             tgid_of: Callable[[int], int | None] | None = None,
             wake_reason: str | None = None, faults_from_ns: int | None = None,
             runtime_from_ns: int | None = None) -> Timeline:
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
    other CPUs' wake-ups may be missing (Window.wake_reason). ``faults_from_ns``: from when
    the followed thread's page faults are recorded (EventSource.faults_from): at or before
    ``t0_ns``, the timeline counts them (``Timeline.faults``), else they are unknown (None);
    ``runtime_from_ns`` the same for its runtime updates (``Timeline.runtime_ns``: the other
    CPUs' wake-ups onto ``cpu`` are taken too, to leave out the stretches they may cut)."""
    probe = {int(t) for t in probe_tids}
    one = next(iter(probe)) if follow and len(probe) == 1 else None
    runtime = one is not None and runtime_from_ns is not None and runtime_from_ns <= t0_ns
    evs = sorted((e for e in events if e.cpu == cpu or one is not None and (
        e.name in _REMOTE and e.fields.get("pid") in (one, probe_pid) or
        e.name == "hrtimer_start" and e.pid == one) or runtime and e.name in _WAKES and
        e.fields.get("target_cpu") == cpu), key=lambda e: e.ts_ns)
    walk = CpuStory(cpu, probe, t0_ns, t1_ns, _names(evs, comms), probe_pid, tgid_of, follow)
    if one is not None and faults_from_ns is not None and faults_from_ns <= t0_ns:
        walk.tl.faults = 0
    if runtime:
        walk.tl.runtime_ns = 0
        walk.oncpu.from_ns = runtime_from_ns
    tl = walk.run(evs)
    tl.complete = complete
    tl.reason = reason
    tl.wake_reason = wake_reason
    return tl


def _names(evs: list[Event], comms: dict[int, str] | None) -> dict[int, str]:
    """pid → comm: the comms the events name (so tasks are named from their first interval
    on), then ``comms`` for the tasks no event names."""
    names: dict[int, str] = {}
    for e in evs:
        f = e.fields
        if e.name == "sched_switch":
            names.setdefault(f.get("prev_pid"), f.get("prev_comm", "?"))
            names.setdefault(f.get("next_pid"), f.get("next_comm", "?"))
        elif "comm" in f and "pid" in f:
            names.setdefault(f["pid"], f["comm"])
    if comms:
        for k, v in comms.items():
            names.setdefault(k, v)
    return names


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
