"""Where a watch run's timed calls come from: one module per latency source, one small
interface (:mod:`agent.watch.latency.base`), chosen once.

::

    base.py       Given (the source options as given), Source (a source as chosen: frozen, its
                  CPUs by the one target rule, its traits, open()), Running (one run's side:
                  start, a stream of timed calls, liveness, its own summary lines, stop)
    probe.py      the built-in probe (--probe tf|numpy): agent/watch/probe_worker.py's process
                  on the probe CPUs, its ring; the probe's load figure and advice
    ring.py       an external client (--pid, --ring, --probe external): the ring agent.client
                  writes, found in /proc/PID/maps or named, owned by the process's user
    attached.py   an unmodified process (--attach PID): uprobes on its runtime's once-per-call
                  function (agent/trace), calls paired per thread from the kernel events
                  (native_pair.py + hftpair.c: the same pairing in C, for the always-on case)
    identity.py   a service by identity (--attach-name, --attach-unit, --attach-cgroup): its
                  processes timed through attached.py's classes, one probe set per library
                  file, across restarts; procs.py decides which processes are the service

:func:`choose` asks each source module, in its ``RANK`` order, whether the options name it
(``named``), builds the one named (the default — ``DEFAULT`` — when none is) and refuses the
options of the others; that :class:`Source` goes into the frozen
:class:`~agent.watch.config.WatchConfig` and nothing else ever asks what kind it is: the
session, the wiring, the summary, the exporter and history ask it for what they need (its
traits, ``open()``, its summary lines, its labels). Adding a source is adding a module here
that defines ``SOURCE`` (a :class:`Source` subclass); :func:`sources` finds it.
"""

from __future__ import annotations

import importlib
import pkgutil

from agent.errors import AgentError
from agent.watch.latency.base import Given, Running, Source
from collectors.host import Host

__all__ = ["Given", "Running", "Source", "choose", "default", "sources"]


def sources() -> list[type[Source]]:
    """Every source module's ``SOURCE``, in ``RANK`` order (imported here, on first use:
    nothing happens at import)."""
    found = []
    for m in pkgutil.iter_modules(__path__):
        if m.name.startswith("_") or m.name == "base":
            continue
        cls = getattr(importlib.import_module(f"{__name__}.{m.name}"), "SOURCE", None)
        if cls is not None:
            found.append(cls)
    return sorted(found, key=lambda c: c.RANK)


def default() -> Source:
    """The source a run without source options times (``DEFAULT``), with its defaults."""
    return next(c for c in sources() if c.DEFAULT)()


def choose(host: Host, given: Given) -> Source:
    """The one source the options name, its options checked (the PID once); the others'
    options refused. AgentError with one line."""
    every = sources()
    default = next(c for c in every if c.DEFAULT)
    names = [n for c in [default] + [c for c in every if c is not default] for n in c.NAMES]
    if given.probe is not None and given.probe not in names:
        said = ", ".join(names[:-1]) + " or " + names[-1]
        raise AgentError(f"--probe must be {said}, not {given.probe!r}")
    cls = next((c for c in every if c.named(given)), default)
    source = cls.build(host, given)
    for other in every:
        if other is not cls:
            other.refuse(given, source.said)
    return source
