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
"""

from __future__ import annotations

import os

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
