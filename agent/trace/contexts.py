"""The interrupt contexts of the walked CPU, and what each event name does in the walk.

Part of the CPU's story (:mod:`.cpu_story`): :class:`Contexts` is the stack of interrupt
contexts active on the CPU — hard IRQ handlers (irq_handler_entry/exit), softirqs
(softirq_entry/exit), the APIC vectors of ``irq_vectors`` (``local timer tick``, the IPIs,
the other vectors) — whose innermost entry every interval between two events is charged
to. It matches an exit with its entry (innermost first; an exit whose entry lies before the
window, or was lost, names the context the interval before it was spent in), counts the
hard interrupts that entered while the probe itself ran (``Timeline.probe_interrupts``),
marks an IPI in which a ``tlb_flush`` of reason "remote shootdown" ran (``(TLB
shootdown)``) and, at the end, names the IPIs after whose returns one softirq starts at
once as that softirq's raise (:meth:`Contexts.name_raisers`).

The followed thread's machine (:mod:`.thread_states`) reads :meth:`Contexts.top` to name an
interrupt that woke the thread, and calls :meth:`Contexts.shift` when it splits an interval
(the frames hold interval indices).

:func:`op` decides, once per event name, what the event does in the walk (the ``OP_*``
codes both modules dispatch on).
"""

from __future__ import annotations

from functools import lru_cache

from .accounting import IPI, IRQ, SOFTIRQ, TIMER, VECTOR, Entity, Timeline, relabel
from .event import Event

_IPI_VECTORS = {"call_function", "call_function_single", "reschedule", "irq_work"}
RAISE_WITHIN_NS = 2_000  # a softirq this soon after an IPI returned ran on its irq_exit
RAISES_SHARE = 0.5

# What each event name does in the walk, decided once per name (:func:`op`).
(OP_OTHER, OP_SWITCH, OP_WAKE, OP_MIGRATE, OP_IRQ_IN, OP_IRQ_OUT, OP_SOFT_IN, OP_SOFT_OUT,
 OP_WQ_IN, OP_WQ_OUT, OP_TLB, OP_IPI_SENT, OP_VEC_IN, OP_VEC_OUT, OP_SIGNAL, OP_IO_ISSUE,
 OP_IO_DONE, OP_TIMER_SET) = range(18)
EXITS = frozenset({OP_IRQ_OUT, OP_SOFT_OUT, OP_WQ_OUT, OP_VEC_OUT})
# the ops :meth:`Contexts.event` handles (an interrupt context's entry or exit, a TLB flush,
# an IPI sent)
CONTEXT_OPS = frozenset({OP_IRQ_IN, OP_IRQ_OUT, OP_SOFT_IN, OP_SOFT_OUT, OP_VEC_IN,
                         OP_VEC_OUT, OP_TLB, OP_IPI_SENT})
_OPS = {"sched_switch": OP_SWITCH, "sched_waking": OP_WAKE, "sched_wakeup": OP_WAKE,
        "sched_migrate_task": OP_MIGRATE, "irq_handler_entry": OP_IRQ_IN,
        "irq_handler_exit": OP_IRQ_OUT, "softirq_entry": OP_SOFT_IN,
        "softirq_exit": OP_SOFT_OUT, "workqueue_execute_start": OP_WQ_IN,
        "workqueue_execute_end": OP_WQ_OUT, "tlb_flush": OP_TLB, "signal_generate": OP_SIGNAL,
        "block_rq_issue": OP_IO_ISSUE, "block_rq_complete": OP_IO_DONE,
        "hrtimer_start": OP_TIMER_SET}

# a frame of the stack: (the context, the index of its first interval, a TLB shootdown ran
# in it)
Frame = tuple[Entity, int, bool]


@lru_cache(maxsize=1024)
def op(name: str) -> tuple[int, Entity | None]:
    """(what ``name`` does, the APIC vector's entity for a vector's entry or exit)."""
    code = _OPS.get(name)
    if code is not None:
        return code, None
    if name.startswith("ipi_send"):
        return OP_IPI_SENT, None
    if _is_vector(name):
        base = name.rsplit("_", 1)[0]
        return (OP_VEC_IN if name.endswith("_entry") else OP_VEC_OUT), _vector_entity(base)
    return OP_OTHER, None


@lru_cache(maxsize=1024)
def _is_vector(name: str) -> bool:
    """irq_vectors' <vector>_entry/_exit (not irq:*, softirq_* or the others')."""
    if not name.endswith(("_entry", "_exit")):
        return False
    return not name.startswith(("irq_handler", "softirq", "tasklet", "workqueue", "sched",
                                "hrtimer", "timer_", "vector_"))


@lru_cache(maxsize=256)
def _vector_entity(base: str) -> Entity:
    if base == "local_timer":
        return Entity(TIMER, "local_timer")
    if base in _IPI_VECTORS:
        return Entity(IPI, base)
    return Entity(VECTOR, base)


@lru_cache(maxsize=256)
def softirq_entity(action: str) -> Entity:
    return Entity(SOFTIRQ, action)


class Contexts:
    """The interrupt contexts active on the CPU, innermost last (see the module docstring).

    ``frames``: the stack (the CPU's story reads its top once per event, as a list);
    ``last_exit``: an IPI that returned to task context at the previous event (a softirq
    that starts right after it was raised by it); ``raised``: per IPI, how often each
    softirq vector started right after its return."""

    def __init__(self, tl: Timeline, probe: set[int]) -> None:
        self.tl = tl
        self.probe = probe
        self.frames: list[Frame] = []
        self.last_exit: tuple[Entity, int] | None = None
        self.raised: dict[Entity, dict[str, int]] = {}

    def top(self) -> Entity | None:
        """The innermost context, None in task context."""
        return self.frames[-1][0] if self.frames else None

    def clear(self) -> None:
        """A task switch: switches happen in task context, so a frame left is an exit lost."""
        if self.frames:
            self.tl.anomalies += 1
            self.frames.clear()

    def shift(self, i: int) -> None:
        """An interval was inserted after index ``i``: the frames' indices after it move."""
        self.frames[:] = [(e, x + 1 if x > i else x, t) for e, x, t in self.frames]

    def closes(self, code: int, ev: Event, vent: Entity | None) -> tuple[int, Entity | None]:
        """For the exit of a hard IRQ, a softirq or a vector: (the stack index of the context
        it closes, -1 when its entry is not on the stack; that context when it is not, else
        None)."""
        at = self._find(code, ev, vent)
        if at >= 0:
            return at, None
        if code == OP_IRQ_OUT:
            return at, Entity(IRQ, "?", num=ev.fields.get("irq"))
        if code == OP_SOFT_OUT:
            return at, softirq_entity(str(ev.fields.get("action")))
        return at, vent

    def _find(self, code: int, ev: Event, vent: Entity | None) -> int:
        """The stack index of the context exit ``ev`` (of kind ``code``) closes, innermost
        first; -1 when its entry is not on the stack (before the window, or lost)."""
        stack = self.frames
        if code == OP_IRQ_OUT:
            irq = ev.fields.get("irq")
            for i in range(len(stack) - 1, -1, -1):
                e = stack[i][0]
                if e.kind == IRQ and e.num == irq:
                    return i
        elif code == OP_SOFT_OUT:
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

    def _pop_at(self, i: int) -> Frame | None:
        if i < 0:
            return None
        top = self.frames[i]
        if i != len(self.frames) - 1:
            self.tl.anomalies += 1  # an inner exit was lost
        del self.frames[i:]
        return top

    def event(self, code: int, ev: Event, pid: int, at: int, vent: Entity | None,
              last_exit: tuple[Entity, int] | None) -> None:
        """The effect of an op of :data:`CONTEXT_OPS` (``at``: :meth:`closes`'s index for an
        exit; ``last_exit``: the IPI that returned at the event before)."""
        tl, ts = self.tl, ev.ts_ns
        if code == OP_VEC_IN:
            self._count(vent.name, ts)
            self._enter(vent, ev)
        elif code == OP_VEC_OUT:
            self._vector_out(pid, at, vent, ts)
        elif code == OP_SOFT_IN:
            action = str(ev.fields.get("action"))
            if last_exit is not None and ts - last_exit[1] <= RAISE_WITHIN_NS and \
                    ts >= tl.t0_ns:  # (as the IPIs it is compared with: the sample's own)
                per = self.raised.setdefault(last_exit[0], {})
                per[action] = per.get(action, 0) + 1
            self.frames.append((softirq_entity(action), len(tl.intervals), False))
        elif code == OP_IRQ_IN:
            f = ev.fields
            self._enter(Entity(IRQ, str(f.get("name", "?")), num=f.get("irq")), ev)
        elif code == OP_TLB:
            self._tlb(ev.fields, ts)
        elif code == OP_IPI_SENT:
            self._count("ipi_sent", ts)
        else:  # OP_SOFT_OUT, OP_IRQ_OUT
            self._pop_at(at)

    def _enter(self, ent: Entity, ev: Event) -> None:
        """A hard interrupt entered: counted when it interrupted the probe itself."""
        tl = self.tl
        if not self.frames and ev.pid in self.probe and tl.t0_ns <= ev.ts_ns <= tl.t1_ns:
            tl.probe_interrupts[ent] = tl.probe_interrupts.get(ent, 0) + 1
        self.frames.append((ent, len(tl.intervals), False))

    def _vector_out(self, pid: int, at: int, vent: Entity | None, ts: int) -> None:
        tl = self.tl
        top = self._pop_at(at)
        if top is not None and top[2]:  # a TLB shootdown ran in this IPI: say so
            new = Entity(top[0].kind, f"{top[0].name} (TLB shootdown)")
            relabel(tl, top[1], top[0], new)
            pi = tl.probe_interrupts
            if not self.frames and pid in self.probe and pi.get(top[0]):
                # its hidden cost goes with it (one culprit label, not two)
                pi[top[0]] -= 1
                pi[new] = pi.get(new, 0) + 1
                if not pi[top[0]]:
                    del pi[top[0]]
        elif vent.kind == IPI and not self.frames:
            self.last_exit = (vent, ts)

    def _tlb(self, f: dict, ts: int) -> None:
        self._count("tlb_flush", ts)
        if f.get("reason") == 1 or "remote shootdown" in str(f.get("reason_str", "")):
            self._count("tlb_shootdown", ts)
            stack = self.frames
            if stack and stack[-1][0].kind == IPI:
                ent, idx, _ = stack[-1]
                stack[-1] = (ent, idx, True)

    def _count(self, key: str, ts: int) -> None:
        """Count an event of the sample itself (``[t0, t1]``: not the margin read before it,
        which sets state only)."""
        tl = self.tl
        if tl.t0_ns <= ts <= tl.t1_ns:
            tl.counts[key] = tl.counts.get(key, 0) + 1

    def name_raisers(self) -> None:
        """An IPI after most of whose returns (≥ RAISES_SHARE) one softirq vector starts at
        once, before any other event, was sent to raise it: RPS/RFS steering packets to
        this CPU (``rps_trigger_softirq``), a remote ``raise_softirq``. Its time is that
        softirq's: the entity becomes ``softirq <VEC> raise (IPI <vector>)``, kind softirq."""
        tl = self.tl
        for ent, per in self.raised.items():
            vec, n = max(per.items(), key=lambda kv: kv[1])
            seen = tl.counts.get(ent.name, 0)
            if not seen or n < RAISES_SHARE * seen:
                continue
            new = Entity(SOFTIRQ, f"{vec} raise (IPI {ent.name})")
            relabel(tl, 0, ent, new)
            if ent in tl.probe_interrupts:
                tl.probe_interrupts[new] = tl.probe_interrupts.pop(ent)
