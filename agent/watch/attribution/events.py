"""The event source inside ``hftagent watch`` (``--trace auto|on|off|mount``).

:class:`SpikeEvents` owns the :class:`~.tracefs.EventSource` of one watch run: it opens it
on the probe CPUs (and their SMT siblings where the cores have them: what ran beside the
call, :mod:`.smt`) when the session starts (``auto``: where tracefs is usable, else one
``unsupported: <reason>`` warning and the run goes on as without events; ``on``: an error
instead; ``mount``: tracefs mounted first when it is not; ``off``: never), re-sizes the ring
once after warm-up (:meth:`maybe_refit`), reads one window per attributed spike
(:meth:`for_spike`) and closes the source on every exit path (:meth:`close`; the source's own
``atexit`` hook and its stale-instance removal at the next start cover the rest).

Per spike: the events of the probe CPU from the sample's intended start − 2 ms to its end +
1 ms, the :func:`~.timeline.timeline` of the probe's thread over ``[start, end]``,
:func:`~.timeline.hw_noise` against the sample's CPU time, and :func:`~.timeline.breakdown`
of the excess over the rolling P50. Only spikes the attribution rate limiter lets through
(agent/watch/schedule.py) reach it, so the cost is bounded by ``--max-attributions``; a
window that cannot be read gives a record with ``complete: false`` and the reason, never an
error of the run.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

from agent.client import FIELDS
from agent.errors import AgentError
from agent.trace.recording import MAX_FAULT_TIDS
from agent.trace.timeline import (
    BACKLOG,
    BLOCKED,
    HIDDEN_IRQ,
    HW,
    IDLE,
    IDLE_BEFORE_WAKE,
    IO_WAIT,
    NOT_RUNNABLE,
    PROBE,
    SLOWED,
    STOPPED,
    TASK,
    UNEXPLAINED,
    WORK,
    backlog,
    breakdown,
    format_breakdown,
    hw_noise,
    interrupt_overhead,
    timeline,
)
from agent.trace.tracefs import EventSource
from agent.watch.attribution import smt, verdict

MODES = ("auto", "on", "off", "mount")
# The window read around a spike: events from MARGIN_BEFORE_NS before its intended start
# (the probe wakes ~0.2 ms before it and spins: its wake-up and whatever held the CPU then)
# to its end, and the first event in the MARGIN_AFTER_NS after it (who was current at the
# end: one event, whatever the span, so it may look far). Under a softirq flood on a 16-vCPU guest
# every ms of window is ~1,500 events to decode and walk: 2 ms before and all of 1 ms
# after made a 3.5 ms spike's window 6.5 ms long. 5 ms after: a thread woken on an idle
# CPU of a kernel that records no switch from idle (6.18) and running on past its call's
# end without a tick showed no event in the 1 ms after (its run then unknown).
MARGIN_BEFORE_NS = 1_000_000
MARGIN_AFTER_NS = 5_000_000
REFIT_AFTER_S = 2.0  # the rate measured over at least this long before refit()
GROW_EVERY_NS = 1_000_000_000  # after lost events the rings grow (×4), at most once a second
SLOWDOWN_MIN_INTERRUPTS = 20  # a spike interrupted this often measures the probe's slowdown
SLOWDOWN_MIN_SPIKES = 5       # earlier such spikes before the estimate is used
# a named task's thread group is read from /proc once and kept this long (an exact attribution
# read it for every spike: two /proc reads, ~8 % of its cost in a storm of one hog); all are
# forgotten together after it, so a reused tid is named from /proc again
TGID_KEEP_S = 5.0
ASKED_KEPT = 4096  # follow_calls' threads remembered (a bound: forgotten ones are asked again)
F_PID, F_TID = FIELDS.index("pid"), FIELDS.index("tid")
SLOWDOWN_KEPT = 16            # the latest ones per probe CPU (the slowdown drifts: see below)


class SlowdownEstimate:
    """What each interrupt costs the probe's own code beyond its measured entry and exit,
    measured in situ from earlier spikes on the same CPU.

    An interrupt evicts part of the probe's cache and TLB working set (a NET_RX softirq
    touches socket buffers, skbs and its own code), so the probe runs longer after it: that
    time shows as the probe's own run time in the timeline and as the residual of the
    breakdown. agent/trace/irqcost.py measures the entry and exit with an empty handler and
    a spinner's tiny working set, so it cannot see this part; the probe's own spikes can.
    Each complete timeline with at least :data:`SLOWDOWN_MIN_INTERRUPTS` interrupts of the
    probe gives one observation: the probe's run time over the sample's P50 (less the hidden
    time hw_noise found and the measured entry/exit), per interrupt. The estimate for the
    next spike is the median of the last :data:`SLOWDOWN_KEPT` observations once there are
    :data:`SLOWDOWN_MIN_SPIKES`, and only while their lower quartile is above 0 (three in
    four show a slowdown: it is real, not noise around none); a spike never uses its own
    observation. How tight they are is not asked: the slowdown follows how densely the
    interrupts come, 0.4-3.4 µs per interrupt within one run on a 16-vCPU KVM guest, so the
    recent ones are kept, and each spike's charge is capped at its own residual
    (:func:`~.timeline.breakdown`). Measured under the kit's softirq flood
    (docs/benchmarks.md): a median of ~1.3 µs per interrupt beyond the measured entry and
    exit (1.3 µs on a 16-vCPU KVM guest, 5.5-6.8 µs on a 2-vCPU Firecracker guest)."""

    def __init__(self) -> None:
        self._obs: dict[int, deque[float]] = {}

    def observe(self, cpu: int, tl, p50_ns: int, cost_ns: int | None,
                hidden_ns: int | None = None) -> None:
        n = sum(tl.probe_interrupts.values())
        if n < SLOWDOWN_MIN_INTERRUPTS or not tl.complete or tl.probe_run_ns <= 0 or p50_ns <= 0:
            return
        surplus = tl.probe_run_ns - p50_ns - (hidden_ns or 0)
        self._obs.setdefault(cpu, deque(maxlen=SLOWDOWN_KEPT)).append(
            surplus / n - (cost_ns or 0))

    def per_interrupt(self, cpu: int) -> tuple[int | None, int]:
        """(ns per interrupt or None, the observations it rests on)."""
        xs = sorted(self._obs.get(cpu, ()))
        n = len(xs)
        if n < SLOWDOWN_MIN_SPIKES:
            return None, n
        med = statistics.median(xs)
        if med <= 0 or xs[n // 4] <= 0:
            return None, n
        return int(med), n


HIDDEN_NOISE_NS = 20_000  # hidden time under this (or 2 % of the time compared) is clock noise
IRQ_IN_CPU_MIN_NS = 100_000  # interrupt time in a sample that lets it say how CPU time is kept
IRQ_IN_CPU_VOTES = 5         # samples that said so before it is used


class IrqInCpuTime:
    """Whether this kernel charges interrupt time to the task it interrupts, from the spikes
    themselves. Without CONFIG_IRQ_TIME_ACCOUNTING (both 6.18 guest kernels here: the dev
    6.18 guests checked in their configs) a task's CPU time includes the
    IRQs and softirqs that ran on top of it; with it, it does not. With
    CONFIG_PARAVIRT_TIME_ACCOUNTING (both) it leaves steal out either way. So which of the
    timeline's ``probe_current_ns`` (the probe's intervals with what ran on top of them) and
    ``probe_run_ns`` (the probe's own) its CPU time follows tells the two apart: each spike
    with ≥ IRQ_IN_CPU_MIN_NS of interrupts on the probe votes for the nearer, and after
    IRQ_IN_CPU_VOTES the majority decides how :func:`~.timeline.hw_noise` compares
    (``cpu_includes_irq``: then the hidden time is what the hypervisor stole under the
    interrupts too). Under a softirq flood on a 16-vCPU guest 48 of 60 spikes voted "included"; the
    others are the ones steal pulled down."""

    def __init__(self) -> None:
        self.included = 0
        self.excluded = 0

    def vote(self, tl, cpu_ns: int) -> None:
        irq = tl.probe_current_ns - tl.probe_run_ns
        if cpu_ns < 0 or irq < IRQ_IN_CPU_MIN_NS or not tl.complete:
            return
        if abs(cpu_ns - tl.probe_current_ns) < abs(cpu_ns - tl.probe_run_ns):
            self.included += 1
        else:
            self.excluded += 1

    @property
    def includes(self) -> bool | None:
        """None until IRQ_IN_CPU_VOTES spikes voted."""
        if self.included + self.excluded < IRQ_IN_CPU_VOTES:
            return None
        return self.included > self.excluded


def _check_probe_seen(tl, sp, cpu: int) -> None:
    """A timeline that contradicts the probe's own counters lacks events, and is not exact:
    marked incomplete (with why), so that it decides nothing and feeds no estimate. The
    probe was switched out during the call (its context switches, counted from before its
    spin up to the start: a switch in the margin before the window counts) on this CPU, but
    the window shows no switch of it and nothing else on the CPU: 3 of ~5,400 timed spikes on
    a 16-vCPU guest, one of which showed the probe running through a 4 ms run-queue wait
    (as hidden time).

    A timeline in which the probe never ran although it had CPU time there is left as it
    is: since the switch's own TLB flush no longer hands the CPU back to the task switched
    out (timeline.py), what remains is a stretch after the window's last event that went
    to the task before it (a switch the kernel did not record), and what the events
    decide there (that task ran first) is still right; marking such windows incomplete
    turned right verdicts into unexplained ones."""
    if not tl.complete or sp.cpu_start != cpu or sp.cpu_end != cpu:
        return
    switched = max(sp.nivcsw, 0) + max(sp.nvcsw, 0)
    if switched > 0 and tl.probe_run_ns > 0 and tl.preemptions == 0 and tl.blocks == 0 \
            and tl.switched_out_before == 0 and not any(p.in_ns for p in tl.parts) \
            and not any(e.kind in (TASK, IDLE, WORK, *NOT_RUNNABLE) for e in tl.totals):
        tl.complete = False
        tl.reason = (f"the probe was switched out {switched} time(s) in this sample, but the "
                     f"window shows no switch of it and nothing else on CPU {cpu} (switches "
                     "the kernel did not record)")


# The call's own run-queue wait (schedstat, read around the call) that a window must show:
# beyond WAIT_SEEN_SLACK_NS and twice the runnable time the window followed, it lacks a
# preemption (the wait may begin in the spin before the window's start: the slack).
WAIT_SEEN_SLACK_NS = 200_000


def _check_wait_seen(tl, sp) -> None:
    """A timeline that shows the thread running through a run-queue wait its own schedstat
    measured in the call lacks a preemption (a 2-vCPU guest: the probe running 1.5 ms with
    0.4 ms of CPU time and 1.1 ms on its run queue): marked incomplete, with why, so that it
    neither decides nor contradicts the contention the call's own figure shows."""
    runnable = tl.state_ns.get("runnable")
    if not tl.complete or runnable is None or sp.rq_delay_ns < 0:
        return
    if sp.rq_delay_ns > 2 * runnable + WAIT_SEEN_SLACK_NS:
        tl.complete = False
        tl.reason = (f"the call waited {sp.rq_delay_ns / 1e3:,.0f} µs on its run queue (its "
                     f"own schedstat), the window shows {runnable / 1e3:,.0f} µs runnable "
                     "(a preemption the kernel did not record)")


class SpikeEvents:
    """``opener``: :meth:`EventSource.open` (tests pass a fake returning canned windows)."""

    def __init__(self, mode: str, host, cpus: list[int], buffer_s: float = 10.0, *,
                 opener: Callable | None = None, irq_cost: str = "off",
                 housekeeping: list[int] | None = None,
                 irq_coster: Callable | None = None) -> None:
        if mode not in MODES:
            raise AgentError(f"--trace must be auto, on, off or mount, not {mode!r}")
        self.irq_cost_mode = parse_irq_cost(irq_cost)
        self.housekeeping = [c for c in housekeeping or [] if c not in cpus]
        self.irq_coster = irq_coster  # agent.trace.irqcost.measure (tests pass a fake)
        self.irq_cost_ns: dict[int, int] = {}  # probe CPU -> one interrupt's cost
        self.irq_cost_info: list[dict] = []
        self.slowdown = SlowdownEstimate()
        self.irq_in_cpu = IrqInCpuTime()
        self._irq_asked = False  # measure_irq_cost was asked to measure (watch's own probe)
        self.mode = mode
        self.host = host
        self.cpus = list(cpus)
        self.buffer_s = buffer_s
        self.opener = opener or EventSource.open
        self.source = None
        self.reason: str | None = None  # why there are no events (one line)
        self.sizing: str | None = None
        self.refit_note: str | None = None
        self.windows = 0  # windows read
        self.incomplete = 0
        self.read_ns = 0       # wall time of the window reads
        self.read_cpu_ns = 0   # the reading thread's CPU time in them (the cost)
        self._opened_ns = 0
        self._refitted = False
        self._lost_seen = 0
        self._grown_ns: int | None = None
        self.grow_notes: list[str] = []  # each time the rings grew after lost events
        self._ran = False
        self._final: dict = {}  # the source's description, rate and losses at close
        self._asked: set[int] = set()  # the timed threads asked to be followed (follow_calls)
        self.siblings: dict[int, list[int]] = {}  # probe CPU -> its SMT siblings (traced too)
        self._pids: set[int] = set()   # their processes, whose threads were listed
        self._tgids: dict[int, int | None] = {}  # tid -> thread group, read within TGID_KEEP_S
        self._tgids_t = float("-inf")
        self.mono = time.monotonic  # (tests inject a clock)

    def open(self, now_ns: int) -> str | None:
        """Open the source; returns the warning line for ``auto``/``mount`` when it cannot
        (None when it runs or with ``off``). ``on``: :class:`AgentError` instead."""
        if self.mode == "off":
            self.reason = "off (--trace off)"
            return None
        # the SMT siblings of the probe CPUs are traced too: their sched_switch says what
        # shared the call's core (smt.py); none without SMT
        self.siblings = smt.siblings(self.host, self.cpus)
        extra = sorted({s for v in self.siblings.values() for s in v} - set(self.cpus))
        src = self.opener(self.host, self.cpus + extra, self.buffer_s,
                          mount=self.mode == "mount")
        if not src:
            self.reason = src.reason
            if self.mode == "on":
                raise AgentError(f"--trace on: {src.reason}")
            return f"kernel events: {src.reason}"
        self.source = src
        self._ran = True
        self.sizing = getattr(src, "sizing", None)
        self._opened_ns = now_ns
        return None

    def measure_irq_cost(self, measure: bool = True) -> None:
        """The interrupt cost per probe CPU for :func:`~.timeline.interrupt_overhead`: the
        ``--irq-cost`` value, or (``auto``, with ``measure``) measured now with
        agent/trace/irqcost.py. The session calls it before it opens the source (the
        instance's own events on the CPU would stretch the gaps) and before its own probe
        starts; under an external client with ``measure=False`` (the helper would spin on
        its CPU for ~25 ms), so only a given cost applies there. Used only where the source
        opens."""
        if self.mode == "off" or self.irq_cost_mode == "off":
            return
        if isinstance(self.irq_cost_mode, int):  # given: applies to an external probe too
            self.irq_cost_ns = {c: self.irq_cost_mode for c in self.cpus}
            self.irq_cost_info = [{"cpu": c, "cost_us": self.irq_cost_mode / 1e3,
                                   "note": "given (--irq-cost)"} for c in self.cpus]
            return
        self._irq_asked = measure
        if not measure or not self._may_open():
            return
        coster = self.irq_coster
        if coster is None:
            from agent.trace.irqcost import measure as coster
        for cpu in self.cpus:
            if not self.housekeeping:
                self.irq_cost_info.append({"cpu": cpu, "cost_us": None,
                                           "note": "no housekeeping CPU to send IPIs from: "
                                                   "not measured"})
                continue
            r = coster(cpu, self.housekeeping[0])
            self.irq_cost_info.append(r.to_dict())
            if r.cost_ns is not None:
                self.irq_cost_ns[cpu] = r.cost_ns

    def _may_open(self) -> bool:
        """Whether the source can open here (so a measurement is not spent where it cannot):
        ``mount`` mode, a fake opener (tests), or tracefs mounted and usable."""
        if self.mode == "mount" or self.opener != EventSource.open:  # (a bound classmethod)
            return True
        from agent.trace.tracefs import find_tracefs
        try:
            return self.host is not None and find_tracefs(self.host) is not None
        except Exception:  # noqa: BLE001 - refused (no permission): open says why
            return False

    @property
    def active(self) -> bool:
        return self.source is not None

    def startup_done(self, timeout_s: float) -> bool:
        """Wait for the event source's background start-up (its symbol table) at most
        ``timeout_s``; True when none is left."""
        done = getattr(self.source, "startup_done", None)
        return done is None or done(timeout_s)

    def maybe_refit(self, now_ns: int, warmed: bool) -> None:
        """Once, after warm-up (``warmed``) and ≥ REFIT_AFTER_S of measured rate."""
        if self._refitted or self.source is None or not warmed or \
                now_ns - self._opened_ns < REFIT_AFTER_S * 1e9:
            return
        self._refitted = True
        try:
            self.refit_note = self.source.refit()
        except Exception as exc:  # noqa: BLE001 - a resize is best effort
            self.refit_note = f"refit failed: {type(exc).__name__}: {exc}"

    def maybe_grow(self, now_ns: int) -> None:
        """Grow the rings when events were lost since the last look (the refit rate was a
        quiet one and a storm came), at most once per GROW_EVERY_NS, up to the source's
        bound (:meth:`EventSource.grow`)."""
        if self.source is None or (self._grown_ns is not None and
                                   now_ns - self._grown_ns < GROW_EVERY_NS):
            return
        try:
            lost = self.source.lost()
            if lost <= self._lost_seen:
                return
            self._lost_seen = lost
            self._grown_ns = now_ns
            note = self.source.grow()
        except Exception as exc:  # noqa: BLE001 - a resize is best effort
            note = f"grow failed: {type(exc).__name__}: {exc}"
        if note and len(self.grow_notes) < 8:
            self.grow_notes.append(note)

    def for_spike(self, sp) -> tuple[dict, list[tuple[str, str, int]]]:
        """The spike record's ``events`` part and the breakdown as (cause, culprit, ns)
        triples for the metrics (empty when the window could not be read)."""
        cpu = sp.cpu_end if sp.cpu_end >= 0 and sp.cpu_end in self.cpus else self.cpus[0]
        faults_from, runtime_from = self._follow(sp)
        try:
            win = self.source.window(sp.start_ns, sp.end_ns, margin_ns=MARGIN_BEFORE_NS,
                                     after_ns=MARGIN_AFTER_NS)
            tl = timeline(win.events, cpu, {sp.tid}, sp.start_ns, sp.end_ns,
                          comms=win.comms, complete=win.complete, reason=win.reason,
                          follow=True, probe_pid=sp.pid if sp.pid > 0 else None,
                          tgid_of=self._tgid_or_none,
                          wake_reason=getattr(win, "wake_reason", None),
                          faults_from_ns=faults_from, runtime_from_ns=runtime_from)
            _check_probe_seen(tl, sp, cpu)
            _check_wait_seen(tl, sp)
            # a stall at the call's start: the thread's earlier calls ran first (queued);
            # unless the call's own run-queue wait says it was waiting then, not running (a
            # window that lacks a preemption: a 2-vCPU guest, an RT hog's 2.9 ms read as the probe's)
            queued = backlog(tl, sp.cpu_ns if sp.cpu_ns >= 0 else sp.p50_ns)
            if queued is not None and sp.rq_delay_ns >= 0 and \
                    sp.rq_delay_ns >= queued[1] // 2:
                queued = None
            if queued is None:
                self.irq_in_cpu.vote(tl, sp.cpu_ns)
            # the thread's CPU time in the window is its earlier calls' too: hidden time is
            # what the CPU time of both leaves (else their work would read as the host's)
            cpu_ns = sp.cpu_ns + (queued[1] if queued else 0) if sp.cpu_ns >= 0 else None
            hw = hw_noise(tl, probe_cpu_ns=cpu_ns,
                          cpu_includes_irq=self.irq_in_cpu.includes is True)
            cost = self.irq_cost_ns.get(cpu)
            slow, slow_n = self.slowdown.per_interrupt(cpu)
            items = breakdown(tl, sp.excess_ns, hw=hw, irq_cost_ns=cost, slowdown_ns=slow,
                              queued=queued)
            if queued is None:  # (a queued call's run holds its thread's earlier calls)
                self.slowdown.observe(cpu, tl, sp.p50_ns, cost, hw.hidden_ns)
        except Exception as exc:  # noqa: BLE001 - a bad window never ends the run
            self.windows += 1
            self.incomplete += 1
            return {"complete": False,
                    "reason": f"event window not read: {type(exc).__name__}: {exc}"}, []
        self.windows += 1
        self.maybe_grow(time.monotonic_ns())  # (the read drained the kernel's pages)
        self.read_ns += win.read_ns
        self.read_cpu_ns += win.cpu_ns
        if not tl.complete:
            self.incomplete += 1
        out = {"timeline": tl.to_dict(),
               "breakdown": [{"what": label, "us": round(ns / 1e3, 1)} for label, ns in items],
               "summary": format_breakdown(items), "hw_noise": hw.to_dict(),
               "complete": tl.complete, "reason": tl.reason,
               "read_us": round(win.read_ns / 1e3, 1),
               "read_cpu_us": round(win.cpu_ns / 1e3, 1)}
        if tl.runtime_ns is not None:
            out["timeline"]["runtime"].update(self._hidden(tl))
        sib = self.siblings.get(cpu)
        if sib:  # (the first: a core of more than two threads is rare)
            out["timeline"]["smt_sibling"] = smt.sibling_runs(
                win.events, sib[0], sp.start_ns, sp.end_ns, sp.pid,
                comms=getattr(win, "comms", None), tgid_of=self._tgid_or_none)
        if cost is not None:
            out["irq_cost_us"] = round(cost / 1e3, 2)
        if slow is not None:
            out["slowdown_us_per_irq"] = round(slow / 1e3, 2)
            out["slowdown_from_spikes"] = slow_n
        if win.lost:
            out["lost_events"] = win.lost
        if queued is not None:
            q = next((ns for label, ns in items if label == BACKLOG), 0)
            if q:  # the record says so: this call queued behind its thread's stall
                out["queued_behind_stall_us"] = round(q / 1e3, 1)
        return out, _triples(tl, items, cost, queued)

    def follow_process(self, pid: int | None) -> None:
        """Follow the page faults and runtime updates of process ``pid``'s threads from now
        (the session calls it once its latency source has started: the process it times is
        known before its first call)."""
        if pid is not None and pid > 0 and self._follows():
            self._pids.add(pid)
            self._ask(self._threads_of(pid))

    def follow_calls(self, tids: list[int], recs) -> None:
        """Follow the threads of a batch of latency records (``tids``: their distinct tids;
        ``recs``: rows of agent.client.FIELDS) from their first timed call on, not from their
        first spike (issue #35): a new thread (one started later, a restarted process's) is
        asked with the other threads of its process (/proc/PID/task) once its process is
        new. The cost of a batch whose threads are all known is one set comparison."""
        if not self._follows() or self._asked.issuperset(tids):
            return
        new = [int(t) for t in tids if int(t) not in self._asked and int(t) > 0]
        if len(self._asked) + len(new) > ASKED_KEPT:  # (threads come and go: a bound)
            self._asked.clear()
        self._asked.update(new)
        ask: list[int] = []
        for t in new:
            ask.append(t)
            pid = int(recs[recs[:, F_TID] == t][0, F_PID])
            if pid > 0 and pid not in self._pids:
                self._pids.add(pid)
                ask += self._threads_of(pid)
        self._ask(ask)

    def _follows(self) -> bool:
        return self.source is not None and hasattr(self.source, "follow_threads")

    def _threads_of(self, pid: int) -> list[int]:
        if self.host is None:
            return [pid]
        try:
            return [int(t) for t in self.host.listdir(self.host.proc(pid, "task"))
                    if t.isdigit()]
        except OSError:  # (gone already)
            return []

    def _ask(self, tids: list[int]) -> None:
        """Ask the source to follow ``tids`` (the first ones first where the filter's bound
        leaves room for some only); when the bound is reached, the followed threads that
        exited give up their room first (/proc/TID gone)."""
        src = self.source
        tids = [t for t in dict.fromkeys(tids) if src.faults_from(t) is None and
                src.runtime_from(t) is None]
        if not tids:
            return
        followed = getattr(src, "fault_tids", None)
        if self.host is not None and followed is not None and \
                len(followed) + len(tids) > MAX_FAULT_TIDS and hasattr(src, "unfollow"):
            src.unfollow([t for t in list(followed)
                          if not self.host.exists(self.host.proc(t))])
        src.follow_threads(tids)

    def _follow(self, sp) -> tuple[int | None, int | None]:
        """From when the page faults and the runtime updates of the spike's thread are
        recorded (None: not, or a source without them). Threads are followed from their
        first timed call (:meth:`follow_calls`); one first seen in a spike (a source whose
        records the session did not pass) asks here, with all its process's threads: a
        call before that has them unknown, never zero."""
        src = self.source
        if not hasattr(src, "follow_threads") or sp.tid <= 0:
            return None, None
        if src.faults_from(sp.tid) is None and src.runtime_from(sp.tid) is None:
            tids = [sp.tid]  # first: the one that must fit the filter's bound
            if sp.pid > 0:
                self._pids.add(sp.pid)
                tids += self._threads_of(sp.pid) if self.host is not None else []
            self._ask(tids)
        return src.faults_from(sp.tid), src.runtime_from(sp.tid)

    def _hidden(self, tl) -> dict:
        """The followed thread's time on the CPU inside the call that its runtime updates
        do not count (``hidden_us``; 0 under max(HIDDEN_NOISE_NS, 2 %): the trace clock and
        the task clock are read µs apart at each update), over the stretches the timeline
        compared: each one's time on the CPU less its runtime less its time outside the call
        (``runtime_hidden_ns``: a lower bound; what hid outside is not the call's).
        Interrupts are in the runtime where this kernel charges them to the task
        (:class:`IrqInCpuTime`, also voted on here: the runtime is the task's CPU time);
        until that is known the comparison leaves them out (the conservative one). The vote
        takes only stretches wholly inside the call (no time outside), whose interrupts are
        all recorded."""
        wall, own, run = tl.runtime_wall_ns, tl.runtime_own_ns, tl.runtime_ns
        out = tl.runtime_outside_ns
        if not out and wall - own >= IRQ_IN_CPU_MIN_NS and tl.complete:
            if abs(run - wall) < abs(run - own):
                self.irq_in_cpu.included += 1
            else:
                self.irq_in_cpu.excluded += 1
        wall_based = self.irq_in_cpu.includes is True
        on = wall if wall_based else own
        h = tl.runtime_hidden_wall_ns if wall_based else tl.runtime_hidden_ns
        if h < max(HIDDEN_NOISE_NS, int(0.02 * (on - out))):
            h = 0
        return {"compared_us": round(on / 1e3, 1), "hidden_us": round(h / 1e3, 1)}

    def tgid(self, tid: int) -> int:
        """The thread group of task ``tid`` through the session's Host
        (collectors.tasks.find_task); the tid itself where it is gone."""
        t = self._tgid_or_none(tid)
        return t if t is not None else tid

    def _tgid_or_none(self, tid: int) -> int | None:
        """(the timeline's ``tgid_of``: None where the task is gone or unreadable)"""
        if self.host is None or tid <= 0:
            return None
        now = self.mono()
        if now - self._tgids_t > TGID_KEEP_S:  # forget them all: a tid may be reused
            self._tgids.clear()
            self._tgids_t = now
        if tid not in self._tgids:
            self._tgids[tid] = self._read_tgid(tid)
        return self._tgids[tid]

    def _read_tgid(self, tid: int) -> int | None:
        from collectors.tasks import find_task
        try:
            t = find_task(self.host, tid)
        except OSError:
            return None
        return t.pid if t is not None else None

    def info(self) -> dict:
        """For the summary: the mode, whether events ran (``active``) or why not, the
        source's description, event rate and losses (as at close once closed)."""
        d: dict = {"mode": self.mode, "active": self._ran, "windows": self.windows,
                   "incomplete": self.incomplete}
        if self.reason:
            d["reason"] = self.reason
        d.update(self._source_info() if self.source is not None else self._final)
        if self.refit_note:
            d["refit"] = self.refit_note
        if self.grow_notes:
            d["grown"] = list(self.grow_notes)
        if self._ran:
            inc = self.irq_in_cpu.includes
            d["cpu_time_includes_irq"] = inc  # None: not enough spikes to tell
        if self.irq_cost_mode != "off" and self._ran:
            d["irq_cost"] = self.irq_cost_info or [
                {"note": "not measured: the probe is external (give --irq-cost US)"
                 if not self._irq_asked else "not measured"}]
        if self.windows:
            d["mean_read_us"] = round(self.read_ns / 1e3 / self.windows, 1)
            d["mean_read_cpu_us"] = round(self.read_cpu_ns / 1e3 / self.windows, 1)
        return d

    def _source_info(self) -> dict:
        try:
            return {"source": self.source.describe(),
                    "rate_per_cpu": {str(c): round(r) for c, r in self.source.rate().items()},
                    "lost": self.source.lost()}
        except Exception as exc:  # noqa: BLE001 - reporting only
            return {"source_error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        if self.source is not None:
            self._final = self._source_info()
        src, self.source = self.source, None
        if src is not None:
            try:
                src.close()
            except Exception:  # noqa: BLE001 - closing must finish; atexit retries
                pass


# What an event kind of the breakdown is, as a cause of agent/causes.py. Kinds that
# say nothing about who delayed the probe (idle after the probe blocked: its own wait; idle
# with the probe never on the CPU; unknown) and the residuals decide nothing:
# hw_or_hypervisor is the absence of events while the probe's own counters say it did not
# run, which a switch the window lacks shows as well as the hypervisor does (docs/events.md).
EVENT_CAUSE = {"task": "cpu_contention", "workqueue": "cpu_contention", "irq": "irq",
               "vector": "irq", "timer": "irq", "ipi": "irq", "softirq": "softirq",
               # the call's thread not runnable (timeline Part): its own wait
               BLOCKED: "blocked", IO_WAIT: "io_wait", STOPPED: "stopped"}
# The causes of a thread that was not runnable. Where they decide, they replace any polled
# verdict (no host cause — contention, an IRQ, steal, a frequency drop — explains time in
# which the thread could not have run), except page faults against a wait in D (a major
# fault's read: the polled rule saw the fault itself, the more precise name).
NOT_RUNNABLE_CAUSES = frozenset({"blocked", "io_wait", "stopped"})
# The polled causes of the host that cannot explain a sample whose thread was not runnable
# for most of its excess: the events make those unexplained where no single cause leads.
HOST_POLLED = frozenset({"cpu_contention", "irq", "softirq", "steal", "freq_drop"})
# Idle before the probe woke (the CPU had nothing to run and the probe's wake-up came late)
# is a cause of its own; idle after the probe blocked is the probe's own wait: none.
WAKEUP_CAUSE = "wakeup_latency"


# An IPI in which a remote TLB shootdown ran (tlb_flush reason "remote shootdown"), while
# the probe was the CPU's task, flushed the probe's own address space: another CPU changed
# its page tables (reclaim unmapping its pages, compaction or NUMA migration moving them, a
# munmap or mprotect of its own threads). That is the memory family's cause, not an
# interrupt's: agent/causes.py page_faults ("page faults, reclaim and compaction").
SHOOTDOWN = "(TLB shootdown)"
SHOOTDOWN_CAUSE = "page_faults"


def _cause_of(kind: str, culprit: str) -> str | None:
    if kind == IDLE and culprit == IDLE_BEFORE_WAKE:
        return WAKEUP_CAUSE
    if culprit.endswith(SHOOTDOWN):
        return SHOOTDOWN_CAUSE
    return EVENT_CAUSE.get(kind)
# The polled causes that events see directly and may correct: another task, an IRQ or a
# softirq on the probe CPU (or nothing found), and steal where none was hidden inside the
# sample (_no_hidden_time). The others (page faults, migration, frequency, NUMA, GPU,
# PCIe) happen inside the probe's own time or off the CPU: the polled verdict stands.
EVENTS_MAY_CORRECT = frozenset({"cpu_contention", "irq", "softirq", "unexplained"})
VERDICT_MIN_SHARE = 0.5   # the events' cause covers at least half the excess
VERDICT_MIN_LEAD = 2.0    # and at least twice the next cause's time


def event_verdict(triples: list[tuple[str, str, int]], excess_ns: int
                  ) -> tuple[str, str, int] | None:
    """The cause the kernel events decide, as (cause, top culprit, ns), or None when they do
    not: the event kinds of a spike's breakdown summed per cause; the largest must cover
    VERDICT_MIN_SHARE of the excess over P50 and VERDICT_MIN_LEAD × the next one."""
    if excess_ns <= 0:
        return None
    per: dict[str, int] = {}
    top: dict[str, tuple[str, int]] = {}
    for kind, culprit, ns in triples:
        cause = _cause_of(kind, culprit)
        if cause is None or ns <= 0:
            continue
        per[cause] = per.get(cause, 0) + ns
        if ns > top.get(cause, ("", -1))[1]:
            top[cause] = (culprit, ns)
    if not per:
        return None
    ranked = sorted(per.items(), key=lambda kv: kv[1], reverse=True)
    cause, ns = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    if ns < VERDICT_MIN_SHARE * excess_ns or ns < VERDICT_MIN_LEAD * runner_up:
        return None
    return cause, top[cause][0], ns


def apply_verdict(body: dict, triples: list[tuple[str, str, int]], excess_ns: int,
                  tgid_of: Callable[[int], int] | None = None) -> None:
    """Correct the polled verdict in a spike record's ``body`` with the kernel events of a
    complete timeline (a partial one may miss what ran: ``decided_by: polled``).

    1. Where the events decide a cause (:func:`event_verdict`) that the polled rules can
       get wrong (:data:`EVENTS_MAY_CORRECT`; any polled cause for a thread that was not
       runnable: :data:`NOT_RUNNABLE_CAUSES`), or where the timeline contradicts the polled
       cause (:func:`~.verdict.contradiction`: contention without a run-queue wait in it,
       steal counted on another CPU...), the record's ``cause`` becomes the events', the
       polled one is kept as ``polled_cause`` (``decided_by: events``). The events' cause
       entry carries the evidence of bench/attribution.py's contract (:func:`part_evidence`:
       the state, the waker's process and thread, the signal's sender).
    2. Where no cause leads but the thread was not runnable for at least VERDICT_MIN_SHARE
       of the excess, a polled host cause (:data:`HOST_POLLED`) becomes unexplained: it
       cannot explain time the thread could not run in.
    3. Where no cause leads and the timeline contradicts the polled cause, it is overruled
       (:func:`~.verdict.overrule`: an on-CPU cause, the next polled cause the timeline
       allows, else unexplained with its µs); where the polled rules named nothing, an
       on-CPU cause may (:func:`~.verdict.on_cpu`: the call's page faults).
    4. The cause that stands, where the timeline sees it, takes its detail and culprit from
       the timeline (:func:`name_tasks`, :func:`~.verdict.from_timeline`)."""
    polled = body.get("cause")
    ev = body.get("events") or {}
    body["decided_by"] = "polled"
    if not ev.get("complete"):
        return
    per, top = per_cause(triples)
    entry = next((c for c in body.get("causes") or [] if c.get("cause") == polled), None)
    why = verdict.contradiction(entry, ev, per, excess_ns) if entry is not None else None
    v = event_verdict(triples, excess_ns)
    if v is not None:
        _events_decide(body, v, ev, excess_ns, tgid_of, contradicted=why)
    elif not _not_runnable_unexplained(body, triples, excess_ns):
        if why is not None:
            verdict.overrule(body, ev, per, excess_ns,
                             sum(ns for kind, _c, ns in triples if kind == UNEXPLAINED))
        elif polled in (None, "unexplained"):
            verdict.on_cpu(body, ev, per, excess_ns)
    lead = next((c for c in body.get("causes") or [] if c.get("cause") == body["cause"]),
                None)
    if lead is None or verdict.contradiction(lead, ev, per, excess_ns) is not None:
        return  # (a guard: every path above leaves a cause the timeline allows)
    if body["cause"] == "cpu_contention":
        name_tasks(body, ev, tgid_of)
    else:
        verdict.from_timeline(lead, ev, per, top)


def per_cause(triples: list[tuple[str, str, int]]
              ) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
    """The timeline's ns per cause over the excess (hidden time as ``steal``: what the
    hypervisor or firmware took while the thread was on the CPU) and each cause's largest
    culprit with its ns."""
    per: dict[str, int] = {}
    top: dict[str, tuple[str, int]] = {}
    for kind, culprit, ns in triples:
        cause = "steal" if kind == HW else _cause_of(kind, culprit)
        if cause is None or ns <= 0:
            continue
        per[cause] = per.get(cause, 0) + ns
        if ns > top.get(cause, ("", -1))[1]:
            top[cause] = (culprit, ns)
    return per, top


def _events_decide(body: dict, v: tuple[str, str, int], ev: dict, excess_ns: int,
                   tgid_of: Callable[[int], int] | None, contradicted: str | None) -> None:
    """Rule 1 of :func:`apply_verdict`: the events' cause ``v`` replaces the polled one
    where they may correct it, or where the timeline contradicts it."""
    polled = body.get("cause")
    cause, culprit, ns = v
    if cause == "io_wait" and _faults_read(ev):
        _major_faults(body, ev, ns, excess_ns, tgid_of)
        return
    if cause in NOT_RUNNABLE_CAUSES:
        if polled == "page_faults" and _state_of(ev, cause) == "D":
            return
    elif not (polled in EVENTS_MAY_CORRECT or polled == "steal" and _no_hidden_time(ev)
              or contradicted is not None):
        return
    body["decided_by"] = "events"
    if cause == polled:
        return
    tl = ev.get("timeline") or {}
    evidence = {"events_us": round(ns / 1e3, 1), "excess_us": round(excess_ns / 1e3, 1),
                "culprit": culprit, **part_evidence(tl, cause, tgid_of)}
    body["polled_cause"] = polled
    if contradicted is not None:
        body["contradicted"] = {"cause": polled, "why": contradicted}
    body["cause"] = cause
    body.setdefault("causes", []).insert(0, {
        "cause": cause, "score": round(min(1.0, ns / excess_ns), 3), "strength": 1.0,
        # stable (the summary counts details), in the polled rules' words
        "detail": _verdict_detail(cause, culprit, tl.get("cpu", "?"), evidence),
        "evidence": evidence})


def _faults_read(ev: dict) -> bool:
    """The call's thread slept in one of its own page faults (the timeline's
    ``page_faults.slept``: a fault, the block I/O it issued, its switch out in D): a major
    fault reading its page, whose I/O wait is the fault's."""
    return bool(((ev.get("timeline") or {}).get("page_faults") or {}).get("slept"))


def _major_faults(body: dict, ev: dict, ns: int, excess_ns: int,
                  tgid_of: Callable[[int], int] | None) -> None:
    """An I/O wait the thread entered inside its own page faults is the faults' (a mapped
    file's pages read back: the weights of a model that were reclaimed): ``page_faults``,
    with their count, how many it slept in and the µs it waited for the reads."""
    tl = ev.get("timeline") or {}
    pf = tl.get("page_faults") or {}
    n, slept = pf.get("count") or 0, pf.get("slept") or 0
    waker = part_evidence(tl, "io_wait", tgid_of).get("waker") or "unknown"
    polled = body.get("cause")
    body["decided_by"] = "events"
    if polled != "page_faults":
        body["polled_cause"] = polled
    body["cause"] = "page_faults"
    body.setdefault("causes", []).insert(0, {
        "cause": "page_faults", "score": round(min(1.0, ns / max(1, excess_ns)), 3),
        "strength": 1.0,
        "detail": f"{n:,} page faults inside the call, {slept:,} of them major: the thread "
                  f"waited {ns / 1e3:,.0f} µs for I/O (D) reading their pages, ended by "
                  f"{waker} (kernel events)",
        "evidence": {"page_faults": n, "faults_slept": slept, "page_fault_us": pf.get("us"),
                     "io_wait_us": round(ns / 1e3, 1), "excess_us": round(excess_ns / 1e3, 1),
                     "state": "D"}})


# The timeline part kinds (Part.to_dict) of each not-runnable cause, and of wakeup_latency
_PART_KINDS = {"blocked": (BLOCKED,), "io_wait": (IO_WAIT,), "stopped": (STOPPED,),
               WAKEUP_CAUSE: ("wakeup",)}


def _state_of(ev: dict, cause: str) -> str | None:
    part = _largest_part((ev.get("timeline") or {}).get("parts") or [], cause)
    return part.get("state") if part else None


def _largest_part(parts: list[dict], cause: str) -> dict | None:
    kinds = _PART_KINDS.get(cause, ())
    mine = [p for p in parts if p.get("kind") in kinds]
    return max(mine, key=lambda p: p.get("us") or 0, default=None)


def part_evidence(tl: dict, cause: str, tgid_of: Callable[[int], int] | None = None
                  ) -> dict:
    """The evidence of a cause decided from the thread's parts (bench/attribution.py's
    contract): for blocked, io_wait and stopped, their largest part's ``state``, the
    waker's process (``waker_pid``, thread-group id through ``tgid_of``; None when no task
    woke it: a timer, an interrupt), ``waker_tid``, ``waker`` (a label: "timer" for a
    timer), ``same_process`` where the waker is another thread of the probe's process; for
    stopped also ``signal`` and its sender's process and thread (``sender_pid``,
    ``sender_tid``, ``sender``). For wakeup_latency: the waker of the wake-up that came late
    (a timer: ``waker_pid`` None) and ``wake_us``, its waking → running. No wait channel:
    /proc/TID/wchan at attribution time is where the thread waits *now* (it has run again
    since), not where it waited then; the state and the waker are the events' own."""
    parts = tl.get("parts") or []
    tg = tgid_of or (lambda tid: tid)
    part = _largest_part(parts, cause)
    if part is None and cause == WAKEUP_CAUSE:
        # waking → running only: the waker of the latest part the waking ended
        part = next((p for p in reversed(parts) if p.get("ended_by") == "waking"), None)
    if part is None:
        return {}
    out: dict = {"state": part.get("state"), "waker": part.get("waker"),
                 "part_us": part.get("us"), "ended_by": part.get("ended_by")}
    if part.get("waker_ctx"):  # who woke it is known (a task, or none: a timer, an IRQ)
        out["waker_tid"] = part.get("waker_tid")
        out["waker_pid"] = tg(part["waker_tid"]) if part.get("waker_tid") else None
    if part.get("waker_cpu") is not None:
        out["waker_cpu"] = part["waker_cpu"]
    if part.get("same_process"):
        out["same_process"] = True
    if cause == "stopped" and part.get("signal"):
        out["signal"] = part["signal"]
        out["sender_tid"] = part.get("sender_tid")
        out["sender"] = part.get("sender")
        out["sender_pid"] = tg(part["sender_tid"]) if part.get("sender_tid") else None
    if cause == WAKEUP_CAUSE:
        out["wake_us"] = (tl.get("state_us") or {}).get("wakeup")
    return out


def _not_runnable_unexplained(body: dict, triples: list[tuple[str, str, int]],
                              excess_ns: int) -> bool:
    """No cause leads, but the thread was not runnable for most of the excess: a polled
    host cause cannot be right (a 73 µs wait never explains a 150 ms stall). True when it
    made the record unexplained."""
    off = sum(ns for kind, _c, ns in triples if kind in NOT_RUNNABLE and ns > 0)
    polled = body.get("cause")
    if polled not in HOST_POLLED or off < VERDICT_MIN_SHARE * excess_ns:
        return False
    body["decided_by"] = "events"
    body["polled_cause"] = polled
    body["cause"] = "unexplained"
    body.setdefault("causes", []).insert(0, {
        "cause": "unexplained", "score": 1.0, "strength": 0.0,
        "detail": "the thread was not runnable for most of the excess, with no single cause "
                  "of it (kernel events): the polled host cause cannot explain it",
        "evidence": {"not_runnable_us": round(off / 1e3, 1),
                     "excess_us": round(excess_ns / 1e3, 1)}})
    return True


def _no_hidden_time(ev: dict) -> bool:
    """The probe's CPU time matched its time on the CPU (hw_noise measured 0 hidden): the
    host stole nothing while the probe was current. A polled steal verdict rests on a steal
    tick somewhere in the sampler's rows around the spike (10 ms each at 100 Hz); with none
    inside the sample, what the events saw run instead of the probe decides. On the
    2-vCPU guest a spike in which the kit's hog ran for all 1.8 ms of its excess said
    steal from one tick."""
    hidden = (ev.get("hw_noise") or {}).get("hidden_us")
    return hidden is not None and hidden == 0


def _verdict_detail(cause: str, culprit: str, cpu, ev: dict | None = None) -> str:
    ev = ev or {}
    if cause in NOT_RUNNABLE_CAUSES:
        st = ev.get("state") or "?"
        waker = ev.get("waker") or "unknown"
        if cause == "stopped":
            sig = f" by {ev['signal']} from {ev.get('sender') or '?'}" \
                if ev.get("signal") else ""
            return f"stopped ({st}){sig}, continued by {waker} (kernel events)"
        if cause == "io_wait":
            return f"waited for I/O ({st}), ended by {waker} (kernel events)"
        return f"blocked ({st}), woken by {waker} (kernel events)"
    if cause == WAKEUP_CAUSE:
        return f"CPU {cpu} idle while the probe's wake-up came late (kernel events)"
    if cause == SHOOTDOWN_CAUSE:
        return (f"TLB shootdowns of the probe's pages on CPU {cpu} ({culprit}): its page "
                "tables were changed from another CPU (reclaim, migration, unmapping; kernel "
                "events)")
    return f"{culprit} ran on CPU {cpu} (kernel events)"


TASKS_NAMED = 3  # as attribution.cpu.WHO_RAN_SHOWN


def name_tasks(body: dict, ev: dict, tgid_of: Callable[[int], int] | None = None) -> None:
    """The contention cause of a record with a complete timeline, named from it: the tasks
    the events saw on the call's CPU as its ``ran_on_cpu`` evidence (largest first, ``"from":
    "kernel events"``) and its detail, "waited N µs for CPU c (kernel events); comm (pid N)
    ran on CPU c", every number the timeline's (the wait: its ``state_us.runnable`` where it
    followed the thread, else what other tasks ran). A task scan's naming (its tasks ran on
    the probe CPUs in the scan's rows, not necessarily in the call: a kdamond named while
    the timeline showed tokio-rt-worker) is kept as ``polled_ran_on_cpu``, the polled detail
    as ``polled_detail``. ``pid`` is the thread group of the event's task where /proc still
    has it (``tgid_of``: :meth:`SpikeEvents.tgid` in watch), else its tid."""
    cause = next((c for c in body.get("causes") or [] if c.get("cause") == "cpu_contention"),
                 None)
    tl = ev.get("timeline") or {}
    if cause is None or not tl:
        return
    runs = _timeline_tasks(tl)
    tg = tgid_of or (lambda tid: tid)
    cpu = tl.get("cpu")
    named = [{"comm": comm, "pid": tg(tid), "tid": tid, "cpu": cpu, "run_us": round(us),
              "from": "kernel events"} for comm, tid, us in runs[:TASKS_NAMED]]
    evidence = cause.setdefault("evidence", {})
    old = evidence.pop("ran_on_cpu", None)
    if old and any(r.get("from") != "kernel events" for r in old):
        evidence["polled_ran_on_cpu"] = old
    if named:
        evidence["ran_on_cpu"] = named
    detail = cause.get("detail") or ""
    if detail and "(kernel events)" not in detail:
        cause["polled_detail"] = detail
    st = tl.get("state_us") or {}
    if "runnable" in st:
        wait = f"waited {st['runnable']:,.0f} µs for CPU {cpu}"
    else:
        others = sum(e.get("us") or 0 for e in tl.get("entities") or []
                     if e.get("kind") in ("task", "workqueue"))
        wait = f"other tasks ran {others:,.0f} µs on CPU {cpu}"
    who = f"; {named[0]['comm']} (pid {named[0]['pid']}) ran on CPU {cpu}" if named else ""
    cause["detail"] = f"{wait} (kernel events){who}"


def _timeline_tasks(tl: dict) -> list[tuple[str, int, float]]:
    """(comm, tid, µs) of the tasks a timeline dict shows, largest first."""
    runs = []
    for e in tl.get("entities") or []:
        if e.get("kind") != "task" or not e.get("label", "").endswith("]"):
            continue
        comm, _, tid = e["label"][:-1].rpartition("[")
        if not tid.isdigit() or not int(tid):
            continue
        runs.append((comm, int(tid), e.get("us") or 0))
    runs.sort(key=lambda r: -r[2])
    return runs


def _triples(tl, items: list[tuple[str, int]], irq_cost_ns: int | None = None,
             queued: tuple | None = None) -> list[tuple[str, str, int]]:
    """The breakdown's items as (cause, culprit, ns): the entity kind and its short name
    (:attr:`~.timeline.Entity.culprit`); ``hw_or_hypervisor`` and ``unexplained`` are their
    own cause and culprit; the interrupts' hidden entry/exit and the probe's slowdown after
    them go to the interrupts, each its share of the count (as
    :func:`~.timeline.interrupt_overhead` splits them)."""
    by_label = {e.label: e for e, _ in tl.ranked() if e.kind != PROBE}
    if queued is not None:
        by_label[queued[0].label] = queued[0]
    out = []
    for label, ns in items:
        if label in (HW, UNEXPLAINED):
            out.append((label, label, ns))
        elif label in (HIDDEN_IRQ, SLOWED):  # each interrupt its share, as counted
            share = interrupt_overhead(tl, irq_cost_ns or 1, ns)
            out.extend((e.kind, e.culprit, n) for e, n in share.items() if n > 0)
        elif (e := by_label.get(label)) is not None:
            out.append((e.kind, e.culprit, ns))
    return out


def parse_irq_cost(spec) -> str | int:
    """``--irq-cost``: "auto" (measured), "off", or a cost in µs (to ns)."""
    text = str(spec).strip()
    if text in ("auto", "off"):
        return text
    try:
        us = float(text)
    except ValueError:
        us = -1.0
    if not 0 < us <= 1000 or round(us * 1000) < 1:
        raise AgentError(f"--irq-cost must be auto, off or a cost in µs (0.001-1000), not "
                         f"{spec!r}")
    return int(round(us * 1000))
