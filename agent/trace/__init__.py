"""trace: the kernel's own account of a CPU, shared by watch, cpus and attach.

What ran on the probe CPUs during a slow sample, and uprobes on an unmodified process:

- :mod:`.elf`, :mod:`.attach`, :mod:`.uprobe` — a runtime's once-per-call function in a
  running process (catalogue, file offset, entry instruction) and our own uprobe events on it
  (``watch --attach``, ``attach --check``).
- :mod:`.pmu` — each attached call's cycles, instructions and on-CPU ns: a perf group per
  thread sampled by perf's own uprobes at the call's entry and return (``watch --attach
  --pmu``).
- :mod:`.irqcost` (+ ``hftirqcost.c``) — what one interrupt costs a running task, measured.
- :mod:`.tracefs` — :class:`EventSource`, a private tracefs instance
  ``instances/hftagent-<pid>`` on the probe CPUs whose kernel ring is the flight recorder;
  only the windows around spikes are read (binary ``trace_pipe_raw`` pages). It is opened,
  read and closed there, and put together from :mod:`.instance` (an instance's life:
  create, settings, remove, stale ones of a killed run), :mod:`.window` (the per-CPU pages
  kept and read back as a :class:`Window`), :mod:`.wake` (the second instance that sees
  wake-ups and signals from the other CPUs), :mod:`.uprobe`'s ``UprobeEvents`` (watch
  --attach's uprobe hits, in :mod:`.calls`' third instance where they are the only events),
  :mod:`.sizing` (the rings' size, the rate, the losses) and :mod:`.recording` (the events
  enabled, their formats, the reader).
- :mod:`.event` — :class:`Event` and its decoder, built from the kernel's event ``format``
  files (the derived fields both readers share); :mod:`.symbols` — kernel addresses to
  names (kallsyms, loaded in a thread).
- :mod:`.pages` — the binary ring-buffer pages (``trace_pipe_raw``): header walk, per-page
  index; :mod:`.text` — the ``trace`` text, the fallback reader.
- :mod:`.timeline` — per-sample :class:`Timeline` (µs per task, IRQ, softirq, tick, IPI,
  work item; the probe's wake-up latency), :func:`breakdown` of the excess over P50 with an
  explicit ``unexplained`` residual, and :func:`hw_noise` (``hw_or_hypervisor``). Its walk
  is two machines writing into :mod:`.accounting`'s result types: :mod:`.cpu_story` (what
  ran on the CPU; its interrupt :mod:`.contexts`) drives :mod:`.thread_states` (the
  followed thread's states) and feeds :mod:`.oncpu` (its page faults and runtime).

May import: collectors (the Host, the parsers), agent.causes, agent.errors. Never imports
watch, noise, export or the CLI: they import it. The event verdicts (which cause a timeline
decides) live in agent/watch/attribution/events.py.

Wiring (for ``hftagent watch``)::

    from agent.trace import EventSource, Unsupported, timeline, breakdown, hw_noise

    src = EventSource.open(host, probe_cpus, buffer_s=10, mount=args.trace == "mount")
    if not src:                       # Unsupported: falsy, one line in src.reason
        say(src.reason)               # "unsupported: tracefs not mounted at /sys/kernel/tracing ..."
    else:
        say(src.sizing)               # "7813 KiB per probe CPU: 10 s at 20,000 events/s × 40 B"
    ...
    # after warm-up, once: size the ring for the rate actually seen
    src.refit()
    ...
    # per spike, from the attribution thread, once the sample has ended:
    win = src.window(spike.start_ns, spike.end_ns)   # CLOCK_MONOTONIC ns (the probe's clock)
    tl = timeline(win.events, cpu=spike.cpu_end, probe_tids={spike.tid},
                  t0_ns=spike.start_ns, t1_ns=spike.end_ns, comms=win.comms,
                  complete=win.complete, reason=win.reason,
                  follow=True, probe_pid=spike.pid)   # its thread's off-CPU states too
    hw = hw_noise(tl, probe_cpu_ns=spike.cpu_ns, steal_ns=polled_steal_ns)
    items = breakdown(tl, spike.excess_ns, hw=hw)   # [(label, ns), ..., ("unexplained", ns)]
    record["timeline"] = tl.to_dict(); record["hw_noise"] = hw.to_dict()
    ...
    src.close()                       # also at exit (atexit) and, after kill -9, at next open

``window`` costs a drain of what the kernel ring gathered since the last call (≈1 µs per
4 KiB page) plus decoding the pages that overlap the window; it is meant for the
attribution thread, never the sampling loop. Threads: one reader at a time (watch's
attribution thread); the source is not locked.
"""

from __future__ import annotations

from .event import Event, FormatError
from .timeline import (
    HW,
    UNEXPLAINED,
    Entity,
    HwNoise,
    Timeline,
    breakdown,
    format_breakdown,
    hw_noise,
    timeline,
)
from .tracefs import EventSource, Unsupported, Window

__all__ = [
    "HW", "UNEXPLAINED", "Entity", "Event", "EventSource", "FormatError", "HwNoise",
    "Timeline", "Unsupported", "Window", "breakdown", "format_breakdown", "hw_noise",
    "timeline",
]
