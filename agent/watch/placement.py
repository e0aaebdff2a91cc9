"""Where watch itself runs (:func:`place`): on the housekeeping CPUs, never on the latency
source's (issue #39 item 3).

Watch pins itself (its loop, the Python sampler's thread, which inherit it) to the
housekeeping CPUs before anything starts; the native sampler's helper is pinned there too
(agent/watch/sampling). What it inherited may not allow that: ``hftagent run --cpus 15 --
hftagent watch`` under isolation starts watch inside the isolated cpuset, pinned to CPU 15 —
the probe's —, where its sampler put the probe's P99.9 at 44-55 ms without a word. So:

* an inherited affinity alone (``taskset``): the pin moves watch out;
* a cpuset that has no housekeeping CPU (the isolated cpuset ``tune apply --isolate`` made):
  watch leaves it for its parent cgroup where it may (root), then pins;
* where neither works and watch may run on no CPU but the source's, it refuses with one line
  (AgentError) before the source starts; where it keeps other CPUs, it pins to those and says
  so.

A box where the plan itself shares the CPUs (one CPU; a watched process that may run on all of
them) keeps today's warning. :class:`OwnCpus` holds the calls that read and move this process
(tests inject fakes: they never move a process but their own).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import AgentError
from collectors.host import Host
from collectors.parsers import format_cpulist


def _get() -> set[int]:
    return os.sched_getaffinity(0)


def _set(cpus: list[int]) -> None:
    os.sched_setaffinity(0, cpus)


def _join(procs: Path) -> None:
    from tuning.tunables.isolate import move_to_cpuset
    move_to_cpuset(procs)


@dataclass
class OwnCpus:
    """This process's affinity (``get``), its pinning (``set``; OSError when refused) and
    its move into another cgroup (``join``: a ``cgroup.procs`` path; OSError when refused)."""

    get: Callable[[], set[int]] = field(default=_get)
    set: Callable[[list[int]], None] = field(default=_set)
    join: Callable[[Path], None] = field(default=_join)


def place(host: Host, probe: list[int], housekeeping: list[int],
          own: OwnCpus | None = None) -> list[str]:
    """Pin watch to ``housekeeping``, away from the source's CPUs ``probe`` (module
    docstring); the warnings to say. AgentError (one line) when it may run nowhere else."""
    own = own or OwnCpus()
    hk_s = format_cpulist(housekeeping)
    if set(housekeeping) <= set(probe):  # the plan shares: one CPU, or a process on all
        try:
            own.set(housekeeping)
        except OSError as exc:
            return [f"cannot pin watch to CPUs {hk_s}: {exc.strerror}",
                    "one CPU only: the sampler shares the probe's CPU"]
        return ["one CPU only: the sampler shares the probe's CPU"]
    try:
        own.set(housekeeping)
        return []
    except OSError as exc:
        why = exc.strerror or str(exc)
    left = _leave_cpuset(host, probe, housekeeping, own)
    if left is not None:
        return [left]
    rest = sorted(own.get() - set(probe))
    if not rest:
        cpus = format_cpulist(sorted(own.get()))
        raise AgentError(
            f"watch may run only on CPU {cpus}, the latency source's (its inherited affinity "
            f"or cpuset), and cannot move to the housekeeping CPUs {hk_s} ({why}): its sampler "
            "would disturb the calls it times; start it outside the source's CPUs (not under "
            "`hftagent run --cpus`), or as root, which may leave the cpuset")
    try:
        own.set(rest)
    except OSError:
        pass
    return [f"cannot pin watch to CPUs {hk_s}: {why}; it runs on CPU "
            f"{format_cpulist(rest)} (its inherited affinity or cpuset), not the source's"]


def _leave_cpuset(host: Host, probe: list[int], housekeeping: list[int],
                  own: OwnCpus) -> str | None:
    """Leave the isolated cpuset for its parent cgroup and pin, when watch runs inside it
    (all its CPUs are the cpuset's) and no housekeeping CPU is in it; what was done, or None
    when it was not or could not be."""
    from tuning.tunables.base import contained
    from tuning.tunables.isolate import isolated_cpuset
    iso = isolated_cpuset(host)
    if iso is None or not own.get() <= set(iso.cpus) or set(housekeeping) & set(iso.cpus):
        return None
    parent = iso.path.rsplit("/", 1)[0]
    try:
        own.join(contained(host, f"{parent}/cgroup.procs"))
        own.set(housekeeping)
    except OSError:
        return None
    return (f"watch left the cpuset {iso.path} (CPUs {format_cpulist(iso.cpus)}) it inherited "
            f"for {parent}: it runs on CPUs {format_cpulist(housekeeping)}, the source on "
            f"{format_cpulist(probe)}")
