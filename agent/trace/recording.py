"""What the instance records and how it is read back: the events enabled, their formats, the
reader.

:class:`Recording`, mixed into :class:`agent.trace.tracefs.EventSource`: the events of
:data:`WANTED` and the ``irq_vectors`` entry/exit pairs that the instance's ``events/``
directory offers, each enabled through its own ``enable`` file (a kernel without
``sched:sched_switch`` is refused: no timeline without it); their ``format`` files parsed
into the decoders (:mod:`.event`); and the reader: ``raw`` (binary ``trace_pipe_raw``
pages, :mod:`.pages`) where ``events/header_page`` and ``header_event`` describe a layout the
parser knows, else ``text`` (:mod:`.text`) with the reason in the notes. ``reader="raw"``
refuses instead of falling back.

The followed threads' own events (:data:`FOLLOWED`, issue #35 item 2: their user page
faults, :data:`FAULT_EVENT`, and their runtime updates, :data:`RUNTIME_EVENT`) are not in
:data:`WANTED`: a process can fault hundreds of thousands of times a second, so they are
enabled only once the threads to follow are known (:meth:`Recording.follow_threads`: watch
asks as soon as its latency source names them, from their first timed call on; a thread
first seen in a spike is asked then), filtered to them in the kernel (``common_pid == tid || ...``,
evaluated before the record is committed), and :meth:`Recording.faults_from` /
:meth:`Recording.runtime_from` say from when each thread's are recorded (a window that
begins earlier does not have them all).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from .event import FormatError, parse_format
from .instance import _read, _Refused, _write
from .pages import PageLayout, check_header_event, parse_header_page

# (system, event) in the order of the issue; each enabled only where the instance has it.
WANTED: tuple[tuple[str, str], ...] = (
    ("sched", "sched_switch"), ("sched", "sched_waking"), ("sched", "sched_wakeup"),
    ("sched", "sched_migrate_task"),
    ("irq", "irq_handler_entry"), ("irq", "irq_handler_exit"),
    ("irq", "softirq_entry"), ("irq", "softirq_exit"),
    ("workqueue", "workqueue_execute_start"), ("workqueue", "workqueue_execute_end"),
    ("tlb", "tlb_flush"), ("ipi", "ipi_send_cpu"), ("ipi", "ipi_send_cpumask"),
    # the probe CPUs' own block requests: issued by the probe (its common_pid), completed in
    # an interrupt there (an I/O wait's end). Issue #26 item 1; cheap: only I/O on the probe
    # CPUs fires them
    ("block", "block_rq_issue"), ("block", "block_rq_complete"),
)

# A user page fault (x86's exceptions:page_fault_user; 6.18 has it on x86 only: arm64 and
# others have no fault tracepoint) fires at the fault's entry in the faulting task's context
# (arch/x86/mm/fault.c); it has no exit event. Filtered to at most MAX_FAULT_TIDS threads.
FAULT_EVENT = ("exceptions", "page_fault_user")
# The scheduler's runtime update of the current task (kernel/sched/fair.c update_curr: at
# each tick, at its switch out, when a task is enqueued on its CPU): the ns of task clock
# since its last update (rq_clock_task: steal left out with PARAVIRT_TIME_ACCOUNTING, IRQ
# time with IRQ_TIME_ACCOUNTING). Fair-class tasks only (6.18: CFS/EEVDF).
RUNTIME_EVENT = ("sched", "sched_stat_runtime")
FOLLOWED = (FAULT_EVENT, RUNTIME_EVENT)
MAX_FAULT_TIDS = 64

# irq_vectors: every *_entry/*_exit pair (local_timer, call_function(_single), reschedule,
# irq_work, thermal_apic, ...); the vector_* allocation events are not time spent on a CPU.
VECTOR_SYSTEM = "irq_vectors"


class Recording:
    """The events and the reader of :class:`agent.trace.tracefs.EventSource` (module
    docstring). Uses, from the source it is mixed into: ``tracefs``, ``path``, ``notes``,
    and the reader's ``page_size``, ``_layout``, ``_formats``, ``_names``, ``_switch_ids``."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []  # "system:name" enabled
        self.missing: list[str] = []  # wanted but not offered by this kernel
        self.reader = "raw"
        # tid -> CLOCK_MONOTONIC ns from which its FOLLOWED events are recorded
        self.fault_tids: dict[int, int] = {}
        # "system:name" of each FOLLOWED event asked -> None (on) or why not
        self.follow_reasons: dict[str, str | None] = {}

    def _choose_reader(self, reader: str) -> str:
        if reader == "text":
            return "text"
        events_dir = self.tracefs / "events"
        try:
            self._layout = parse_header_page(_read(events_dir / "header_page"))
            check_header_event(_read(events_dir / "header_event"))
        except (OSError, FormatError) as exc:
            if reader == "raw":
                raise _Refused(f"unsupported: binary ring-buffer layout not readable: "
                               f"{exc}") from None
            self.notes.append(f"text reader: {exc}")
            return "text"
        if self._layout.page_size != self.page_size:
            self._layout = PageLayout(self._layout.ts_offset, self._layout.commit_offset,
                                      self._layout.commit_size, self._layout.data_offset,
                                      self.page_size)
        return "raw"

    def _enable_events(self) -> None:
        ev_dir = self.path / "events"
        wanted = list(WANTED)
        vec_dir = ev_dir / VECTOR_SYSTEM
        for name in sorted(os.listdir(vec_dir)) if vec_dir.is_dir() else ():
            if name.endswith(("_entry", "_exit")) and not name.startswith("vector_"):
                wanted.append((VECTOR_SYSTEM, name))
        for system, name in wanted:
            enable = ev_dir / system / name / "enable"
            if not enable.exists():
                self.missing.append(f"{system}:{name}")
                continue
            _write(enable, "1")
            self.events.append(f"{system}:{name}")
        if not any(e.endswith(":sched_switch") for e in self.events):
            raise _Refused("unsupported: this kernel has no sched:sched_switch event")

    def _load_formats(self) -> None:
        ev_dir = self.path / "events"
        for full in self.events:
            system, name = full.split(":", 1)
            try:
                fmt = parse_format(_read(ev_dir / system / name / "format"), system)
            except (OSError, FormatError) as exc:
                raise _Refused(f"unsupported: cannot read the format of {full}: {exc}") from None
            self._formats[fmt.id] = fmt
            self._names.add(fmt.name)
            if fmt.name == "sched_switch":
                self._switch_ids = {fmt.id}

    def follow_threads(self, tids: Iterable[int]) -> str | None:
        """Record the :data:`FOLLOWED` events of ``tids`` too (the threads already followed
        stay followed; see the module docstring): None when at least one of them is on,
        else why not ("unsupported: ..."; each event's own reason in ``follow_reasons``).
        The filters are rewritten only when a thread is new; a thread that is gone stays in
        them (its pid matches nothing until reused). Beyond MAX_FAULT_TIDS threads in all,
        the first of ``tids`` that fit are followed."""
        new = list(dict.fromkeys(int(t) for t in tids if int(t) not in self.fault_tids))
        new = new[:MAX_FAULT_TIDS - len(self.fault_tids)]
        if not new or self.follow_reasons and all(self.follow_reasons.values()):
            return self._follow_reason()
        expr = " || ".join(f"common_pid == {t}" for t in sorted({*self.fault_tids, *new}))
        for system, name in FOLLOWED:
            full = f"{system}:{name}"
            if self.follow_reasons.get(full, "") is not None and full in self.follow_reasons:
                continue  # refused before: never asked again
            self.follow_reasons[full] = self._follow_one(system, name, expr)
        now = time.monotonic_ns()  # (the filters hold from here on)
        for t in new:
            self.fault_tids[t] = now
        return self._follow_reason()

    def unfollow(self, tids: Iterable[int]) -> None:
        """Stop following ``tids`` (threads that exited): their room in the filter's bound
        goes to the next new thread; the filters are rewritten with the next one (until then
        a gone thread's pid matches nothing)."""
        for t in tids:
            self.fault_tids.pop(int(t), None)

    def _follow_one(self, system: str, name: str, expr: str) -> str | None:
        """Filter one followed event to ``expr`` (enabling it the first time): None, or why
        it cannot be."""
        d = self.path / "events" / system / name
        full = f"{system}:{name}"
        if not (d / "enable").exists():
            return f"unsupported: no {full} event" + (
                " (x86 kernels only)" if (system, name) == FAULT_EVENT else "")
        try:
            fmt = parse_format(_read(d / "format"), system) if full not in self.events else None
            _write(d / "filter", expr)
            if fmt is not None:
                _write(d / "enable", "1")
                self._formats[fmt.id] = fmt
                self._names.add(fmt.name)
                self.events.append(full)
        except (OSError, FormatError) as exc:
            return f"unsupported: {full}: {getattr(exc, 'strerror', None) or exc}"
        return None

    def _follow_reason(self) -> str | None:
        if not self.follow_reasons:
            return "no thread followed yet"
        bad = [r for r in self.follow_reasons.values() if r is not None]
        return None if len(bad) < len(self.follow_reasons) else "; ".join(bad)

    def _followed_from(self, event: tuple[str, str], tid: int) -> int | None:
        if self.follow_reasons.get(":".join(event), "no") is not None:
            return None
        return self.fault_tids.get(tid)

    def faults_from(self, tid: int) -> int | None:
        """From when thread ``tid``'s page faults are recorded (CLOCK_MONOTONIC ns), None
        when they are not."""
        return self._followed_from(FAULT_EVENT, tid)

    def runtime_from(self, tid: int) -> int | None:
        """From when thread ``tid``'s ``sched_stat_runtime`` updates are recorded
        (CLOCK_MONOTONIC ns), None when they are not."""
        return self._followed_from(RUNTIME_EVENT, tid)
