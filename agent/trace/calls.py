"""The calls instance (``hftagent-<pid>-calls``, the probe CPUs): watch --attach's uprobe
events, alone in rings of their own.

The timed calls are read every loop step (10-20 times a second); the kernel events only when
a spike's window is read. In one instance, each step walked every record header of the
kernel events (~4.7 k/s on an attached LiteRT service's CPU, ~0.4 µs each in Python) to find
the few uprobe hits among them: most of what reading the calls cost. Here the uprobe events
are the only events enabled, so a step reads and walks only their records, and the
kernel-event instance is drained only as often as it needs to be (:data:`KERNEL_DRAIN_S`,
and for each window). The rings are small (:data:`CALLS_KB` per probe CPU: ~1 s of hits at
20,000 calls a second, each call an entry and a return record of 24-32 B), never shrunk
(a resize stops the instance's recording for a moment: Linux 6.18 lost 2-4 calls of a 300/s
service at each one), and grown ×4 after lost hits, up to :data:`CALLS_MAX_KB` (a loss is
worse than a resize). Overwrite mode like the other instances: a step that comes late finds
the newest hits, and the loss reported (``RB_MISSED_EVENTS``) makes the pairing start again.

Made by the first :meth:`~agent.trace.uprobe.UprobeEvents.add_uprobes` (a run that attaches
nothing has no such instance), removed with the event source, by its guardian after a
SIGKILL, and by the next start after a guardian killed with its run
(:func:`agent.trace.instance.remove_stale`), like the other two.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .event import FormatError
from .instance import CALLS_SUFFIX, _read, _write, cpumask_hex, online_cpus, remove_instance
from .pages import page_info
from .sizing import OTHER_CPU_KB
from .window import _close_rings, _CpuRing, _read_page

CALLS_KB = 1024
CALLS_MAX_KB = 16 * 1024
CALLS_GROW = 4
# The kernel-event rings are drained (moved into the kept pages, not decoded) at least this
# often while the calls are read, as the calls' reads drained them before: well within the
# seconds a ring covers (sizing.py: buffer_s at the measured rate), so a quiet stretch
# without spikes never reads as lost events (and a ring grown for nothing).
KERNEL_DRAIN_S = 1.0


class CallsInstance:
    """The calls instance of :class:`agent.trace.tracefs.EventSource` (module docstring):
    made by :meth:`_open_calls`, drained by :meth:`_calls_pages`, removed by
    :meth:`_close_calls`. Uses, from the source it is mixed into: ``name``, ``path``,
    ``cpus``, ``host``, ``notes``, ``reader``, ``page_size``, ``_creator``, ``_layout``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls_path: Path = Path()
        self.calls_kb = 0
        self.calls_grown: list[str] = []
        self._calls_rings: dict[int, _CpuRing] = {}
        self._calls_made = False
        self._calls_lost = 0  # the rings' lost hits, summed as they are counted

    def _open_calls(self) -> Path:
        """The calls instance, made now if it is not yet: stopped while it is set up, the
        mono clock, overwrite, the probe CPUs' mask, :data:`CALLS_KB` on each of them (the
        minimum elsewhere), their ``trace_pipe_raw`` open, then on. OSError when the kernel
        refuses (what was made is removed)."""
        if self._calls_made:
            return self.calls_path
        path = self.path.with_name(self.name + CALLS_SUFFIX)
        os.mkdir(path)
        self.calls_path, self._calls_made = path, True
        try:
            _write(path / "tracing_on", "0")
            _write(path / "trace_clock", "mono")
            _write(path / "options" / "overwrite", "1")
            _write(path / "tracing_cpumask", cpumask_hex(self.cpus))
            pc = path / "per_cpu"
            for c in sorted(online_cpus(self.host) | set(self.cpus)):
                _write(pc / f"cpu{c}" / "buffer_size_kb",
                       str(CALLS_KB if c in self.cpus else OTHER_CPU_KB))
            got = _read(pc / f"cpu{self.cpus[0]}" / "buffer_size_kb").split()
            self.calls_kb = int(got[0]) if got and got[0].isdigit() else CALLS_KB
            for c in self.cpus:
                ring = _CpuRing(c)
                ring.fd = os.open(pc / f"cpu{c}" / "trace_pipe_raw",
                                  os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                ring.cover_from_ns = time.monotonic_ns()
                self._calls_rings[c] = ring
            _write(path / "tracing_on", "1")
        except BaseException:
            self._close_calls()
            raise
        return path

    def _calls_pages(self) -> list[tuple[int, bytes]]:
        """``(cpu, page)`` of every page the calls rings hold now (drained: read once, not
        kept), in time order per CPU; a page that reports lost hits counts them in the
        ring's ``lost`` and grows the rings (:meth:`_grow_calls`)."""
        out: list[tuple[int, bytes]] = []
        lost_now = False
        for ring in self._calls_rings.values():
            cap = self.calls_kb * 1024 // self.page_size + 64
            for _ in range(cap):
                buf = _read_page(ring.fd, self.page_size)
                if buf is None:
                    break
                try:
                    ts, _size, lost = page_info(buf, self._layout)
                except FormatError:
                    continue
                if lost:
                    ring.lost += max(lost, 1)
                    self._calls_lost += max(lost, 1)
                    ring.cover_from_ns = ts
                    lost_now = True
                out.append((ring.cpu, buf))
        if lost_now:
            self._grow_calls()
        return out

    def calls_lost(self) -> int:
        """Uprobe hits the kernel reported lost so far (the calls rings overwritten before a
        read, or a count it could not give: 1 each)."""
        return self._calls_lost  # (read every loop step: a sum, cold, cost ~17 µs)

    def _grow_calls(self) -> None:
        """×:data:`CALLS_GROW` after lost hits, up to :data:`CALLS_MAX_KB` (the line in
        ``calls_grown``); a refusal is a line there too."""
        kb = min(CALLS_MAX_KB, self.calls_kb * CALLS_GROW)
        if kb <= self.calls_kb or not self._calls_made:
            return
        pc = self.calls_path / "per_cpu"
        try:
            for c in self.cpus:
                _write(pc / f"cpu{c}" / "buffer_size_kb", str(kb))
        except OSError as exc:
            self.calls_grown.append(f"calls rings not grown: {exc.strerror or exc}")
            self.calls_kb = CALLS_MAX_KB  # (not asked again)
            return
        self.calls_kb = kb
        self.calls_grown.append(f"calls rings grown to {kb} KiB per probe CPU after "
                                f"{self.calls_lost():,} hits were lost")

    def _close_calls(self) -> None:
        """Close the calls rings and remove the instance (idempotent)."""
        _close_rings(self._calls_rings.values())
        self._calls_rings = {}
        if self._calls_made and self._creator == os.getpid():
            remove_instance(self.calls_path, "calls instance", self.notes)
            self._calls_made = False

    def describe_calls(self) -> dict | None:
        """The calls instance (None when watch attached nothing)."""
        if not self._calls_made:
            return None
        shown = self.host.display(self.calls_path) if self.host else str(self.calls_path)
        return {"instance": shown, "buffer_kb_per_cpu": self.calls_kb,
                "lost": self.calls_lost(), "grown": self.calls_grown}
