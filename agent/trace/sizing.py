"""The probe CPUs' rings: sized for ``buffer_s`` seconds of events, re-sized from the rate
measured, grown after losses; the rate and the losses themselves.

:class:`RingSizing`, mixed into :class:`agent.trace.tracefs.EventSource`: the first size comes
from an assumed rate (:func:`size_ring_kb`, at open), :meth:`~RingSizing.refit` re-sizes once
from the rate measured after warm-up, :meth:`~RingSizing.grow` enlarges the rings after
events were lost. Every size is bounded (:data:`MIN_CPU_KB`, :data:`MAX_CPU_KB` per probe
CPU, :data:`MAX_TOTAL_KB` over them): memory stays bounded whatever the rate. The kernel
resizes ``per_cpu/cpuN/buffer_size_kb`` in place, content kept (kernel
Documentation/trace/ftrace.rst, "buffer_size_kb"), and rounds up to whole pages: the size it
made of it is read back. The rate is what ``per_cpu/cpuN/stats`` counts as written (entries
+ overrun + read) since open.
"""

from __future__ import annotations

import time

from .instance import CpuStats, _read, _write, parse_stats

# Ring sizing. The assumed rate is what a probe CPU showed on a 2-vCPU guest with a
# CPU hog and a 500 Hz probe (sched + tlb + irq events, ~6k/s) with headroom for a storm
# burst; bytes/event is the measured mean (30-40 B: tlb_flush 24 B, sched_switch 68 B).
ASSUMED_RATE_EPS = 20_000
ASSUMED_EVENT_BYTES = 40
MIN_CPU_KB = 512
MAX_CPU_KB = 32 * 1024
MAX_TOTAL_KB = 256 * 1024
OTHER_CPU_KB = 4  # the kernel rounds up to its minimum (2 pages)
KEEP_MAX_BYTES = 16 << 20
# After lost events: ×4, so that a flood at ~50× the warm-up rate (a 16-vCPU 6.18 guest: 2,000 →
# ~50,000 events/s, 700,000/s inside its bursts) is covered after two resizes, not five.
GROW_FACTOR = 4


def size_ring_kb(buffer_s: float, ncpus: int, rate_eps: float = ASSUMED_RATE_EPS,
                 event_bytes: float = ASSUMED_EVENT_BYTES) -> tuple[int, str]:
    """(per-CPU KiB, one line saying why) for ``buffer_s`` seconds at ``rate_eps`` events a
    second of ``event_bytes`` each, within [MIN_CPU_KB, MAX_CPU_KB] and MAX_TOTAL_KB over
    the probe CPUs."""
    want = int(buffer_s * rate_eps * event_bytes / 1024) + 1
    kb = max(MIN_CPU_KB, min(MAX_CPU_KB, want, MAX_TOTAL_KB // max(1, ncpus)))
    cover = kb * 1024 / max(1.0, rate_eps * event_bytes)
    why = (f"{kb} KiB per probe CPU: {buffer_s:g} s at {rate_eps:,.0f} events/s × "
           f"{event_bytes:.0f} B" + ("" if kb == want else
                                      f" (bounded; covers {cover:.1f} s at that rate)"))
    return kb, why


class RingSizing:
    """The ring sizes, the rate and the losses of :class:`agent.trace.tracefs.EventSource`
    (module docstring). Uses, from the source it is mixed into: ``path``, ``cpus``,
    ``_closed``, and the reader's ``_rings`` and ``keep_bytes``."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer_s = 0.0
        self.buffer_kb = 0
        self.sizing = ""
        self._t_open = 0.0
        self._stats0: dict[int, CpuStats] = {}

    def _size_rings(self, online: set[int], rate: float) -> None:
        """The first size, at open: ``buffer_s`` at ``rate`` on the probe CPUs, the minimum
        on the others (the mask does not stop the kernel allocating every CPU's buffer)."""
        kb, why = size_ring_kb(self.buffer_s, len(self.cpus), rate)
        pc = self.path / "per_cpu"
        for c in sorted(online):
            _write(pc / f"cpu{c}" / "buffer_size_kb", str(kb if c in self.cpus else OTHER_CPU_KB))
        got = _read(pc / f"cpu{self.cpus[0]}" / "buffer_size_kb").split()[0]
        self.buffer_kb = int(got) if got.isdigit() else kb
        self.sizing = why

    def _start_counting(self) -> None:
        """The rate's start: now, and each probe CPU's counters as they stand."""
        self._t_open = time.monotonic()
        self._stats0 = {c: self.cpu_stats(c) for c in self.cpus}

    def cpu_stats(self, cpu: int) -> CpuStats:
        try:
            return parse_stats(_read(self.path / "per_cpu" / f"cpu{cpu}" / "stats"), cpu)
        except OSError:
            return CpuStats(cpu)

    def rate(self) -> dict[int, float]:
        """Events a second per probe CPU since :meth:`open` (written: entries + overrun +
        read, as the kernel counts them)."""
        dt = max(1e-3, time.monotonic() - self._t_open)
        out = {}
        for c in self.cpus:
            a, b = self._stats0.get(c, CpuStats(c)), self.cpu_stats(c)
            written = (b.entries + b.overrun + b.read) - (a.entries + a.overrun + a.read)
            out[c] = max(0, written) / dt
        return out

    def lost(self) -> int:
        """Events lost so far on the probe CPUs as the reads reported them."""
        return sum(r.lost for r in self._rings.values())

    def refit(self) -> str | None:
        """Re-size the rings for ``buffer_s`` at the rate measured since open (content is
        kept: the kernel resizes in place). Returns the new sizing line, None if unchanged
        (within a factor of 2) or closed. A resize stops the instance's recording for a
        moment (Linux 6.18: 2-4 calls of a 300/s attached service lost at each one): the
        timed calls' uprobe events are not in these rings but in the calls instance's
        (agent/trace/calls.py), which is never resized but to grow after lost hits."""
        if self._closed:
            return None
        rates = self.rate()
        if not rates:
            return None
        rate = max(rates.values())
        bpe = [s.bytes / s.entries for s in map(self.cpu_stats, self.cpus) if s.entries]
        ebytes = max(bpe) if bpe else ASSUMED_EVENT_BYTES
        kb, why = size_ring_kb(self.buffer_s, len(self.cpus), max(rate, 1.0), ebytes)
        if self.buffer_kb // 2 <= kb <= self.buffer_kb * 2:
            return None
        refused = self._resize(kb)
        if refused:
            return refused
        self.sizing = why + " (measured)"
        return self.sizing

    def grow(self) -> str | None:
        """Grow the probe CPUs' rings GROW_FACTOR-fold after events were lost (a storm beyond
        the rate the ring was sized for: :meth:`refit` measures the rate once, after warm-up),
        within MAX_CPU_KB and MAX_TOTAL_KB: memory stays bounded whatever the rate, and what
        was lost stays counted. Content is kept (the kernel resizes in place). Returns the new
        sizing line; None at the bound or closed."""
        if self._closed:
            return None
        kb = min(MAX_CPU_KB, MAX_TOTAL_KB // max(1, len(self.cpus)),
                 self.buffer_kb * GROW_FACTOR)
        if kb <= self.buffer_kb:
            return None
        refused = self._resize(kb)
        if refused:
            return refused
        self.sizing = (f"{self.buffer_kb} KiB per probe CPU (grown ×{GROW_FACTOR} after "
                       f"{self.lost():,} events were lost)")
        return self.sizing

    def _resize(self, kb: int) -> str | None:
        """Give the probe CPUs' rings ``kb`` KiB each (the kernel resizes in place, content
        kept) and take the size it made of it (it rounds up to whole pages) as
        ``buffer_kb``, with the kept pages' bound; the "resize refused" line if it refused."""
        pc = self.path / "per_cpu"
        try:
            for c in self.cpus:
                _write(pc / f"cpu{c}" / "buffer_size_kb", str(kb))
            got = _read(pc / f"cpu{self.cpus[0]}" / "buffer_size_kb").split()
        except OSError as exc:
            return f"resize refused: {exc.strerror or exc}"
        self.buffer_kb = int(got[0]) if got and got[0].isdigit() else kb
        self.keep_bytes = min(KEEP_MAX_BYTES, self.buffer_kb * 1024)
        return None
