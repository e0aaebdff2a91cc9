"""Target CPUs: the one rule that audit, tune, run, watch, probe and cpus share.

The *target* CPUs are the ones the inference work runs on; the *housekeeping* CPUs are the
rest, where the kernel, IRQs, the agent's own sampler and every other task belong.

Default target (the first that gives a non-empty set of online CPUs):

1. ``--cpus LIST`` when given (checked: every CPU online; never silently "default");
2. the isolated CPUs (/sys/devices/system/cpu/isolated: ``isolcpus=`` or a cpuset partition);
3. the nohz_full CPUs (/sys/devices/system/cpu/nohz_full);
4. when a GPU is named (``run --gpu N``): that GPU's local CPUs (its PCI ``local_cpulist``,
   else its NUMA node's CPUs), less the housekeeping core;
5. all online CPUs but the housekeeping core: the lowest online CPU and its SMT siblings
   (CPU 0 takes most unbound kernel work, timers and the IRQs that cannot move).

Housekeeping: every online CPU that is not a target. A target set that covers every online
CPU leaves none: ``housekeeping`` is then empty, and commands that need a housekeeping CPU
(IRQ moves, isolation, the watch sampler) call :meth:`TargetPlan.require_housekeeping`, which
refuses it in one line. On a one-CPU box the default target is that CPU and there is no
housekeeping CPU (said in ``source``).

A GPU picks the default only when it is named: on a box with two GPUs "the GPU's node" is
ambiguous, and a default that moved with an unnamed GPU would make ``audit`` and ``tune``
disagree on boxes whose GPU sits on node 1. The audit judges every GPU's node against the
targets (``pcie``/``gpu``), and ``hftagent cpus`` weighs it with the measured noise.

Equivalent commands: ``cat /sys/devices/system/cpu/{online,isolated,nohz_full}``,
``cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors import cpu as cpuc
from collectors.host import Host
from collectors.parsers import format_cpulist, parse_cpu_option

DEFAULT_RULE = ("isolated CPUs, else nohz_full CPUs, else all online CPUs but the "
                "housekeeping core (the lowest online CPU and its SMT siblings)")


class TargetError(ValueError):
    """The target CPUs cannot be resolved (bad or offline --cpus, unreadable online list);
    the message is for the user."""


@dataclass(frozen=True)
class TargetPlan:
    """Resolved target and housekeeping CPUs, and where the target came from."""

    cpus: list[int]
    housekeeping: list[int]
    online: list[int]
    source: str                # "--cpus", "isolated CPUs", "nohz_full CPUs", "default: ..."
    explicit: bool = False     # given with --cpus
    notes: list[str] = field(default_factory=list)  # e.g. how the online CPUs were found

    @property
    def cpus_s(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def housekeeping_s(self) -> str:
        return format_cpulist(self.housekeeping)

    def require_housekeeping(self, what: str = "this") -> list[int]:
        """The housekeeping CPUs, or TargetError when the targets leave none."""
        if not self.housekeeping:
            if len(self.online) <= 1:
                raise TargetError(f"{what} needs a housekeeping CPU, and only CPU "
                                  f"{self.cpus_s} is online")
            hint = format_cpulist(self.online[1:])
            raise TargetError(f"--cpus {self.cpus_s} covers every online CPU: {what} needs "
                              f"at least one housekeeping CPU (e.g. --cpus {hint})")
        return self.housekeeping

    def to_dict(self) -> dict:
        return {"cpus": self.cpus, "housekeeping": self.housekeeping, "online": self.online,
                "source": self.source, "explicit": self.explicit, "notes": list(self.notes)}


def online_cpus(host: Host) -> tuple[list[int], list[str]]:
    """(online CPUs, notes). cpu/online, or where a capture lacks it, the CPUs derived from
    present/possible and the cpuN directories (collectors.system.online_cpus; the note says
    how). Raises TargetError when they cannot be known at all."""
    from collectors import system
    r = system.online_cpus(host)
    if not r.ok or not r.value.cpus:
        raise TargetError(f"cannot read the online CPUs ({r.path}: {r.reason or 'empty'})")
    notes = [f"online CPUs derived: {r.value.derived}"] if r.value.derived else []
    return list(r.value.cpus), notes


def housekeeping_core(host: Host, online: list[int]) -> list[int]:
    """The lowest online CPU and its online SMT siblings."""
    first = online[0]
    sib = cpuc.smt(host, [first]).siblings.get(first, [first])
    return sorted({first} | {c for c in sib if c in online})


def gpu_local_cpus(host: Host, index: int, online: list[int]) -> tuple[list[int], str]:
    """(online CPUs local to NVIDIA GPU ``index`` in nvidia-smi's order, a description)."""
    from collectors.pcie import nvidia_gpus
    from collectors.system import numa_nodes
    gpus = nvidia_gpus(host)
    if not 0 <= index < len(gpus):
        raise TargetError(f"--gpu {index}: {len(gpus)} NVIDIA GPU(s) in "
                          f"{host.display(host.sys('bus/pci/devices'))}")
    dev = gpus[index]
    local = dev.local_cpus
    where = f"local CPUs of GPU {index} ({dev.address})"
    if not local and dev.numa_node is not None:
        local = numa_nodes(host).get(dev.numa_node)
        where = f"NUMA node {dev.numa_node} of GPU {index} ({dev.address})"
    cpus = [c for c in (local or []) if c in online]
    if not cpus:
        raise TargetError(f"--gpu {index} ({dev.address}): its local CPUs are unknown or "
                          "offline: pass --cpus")
    return cpus, where


def resolve(host: Host, spec: str | None = None, *, gpu: int | None = None) -> TargetPlan:
    """The target CPUs for ``--cpus spec`` (None: the default rule; ``gpu``: the named GPU's
    local CPUs come before the last step). Raises TargetError."""
    online, notes = online_cpus(host)
    if spec is not None:
        from collectors.system import nr_cpu_ids
        try:
            cpus = parse_cpu_option(spec, online, nr_cpu_ids(host, online))
        except ValueError as exc:
            raise TargetError(str(exc)) from None
        return _plan(cpus, online, "--cpus", True, notes)
    iso = [c for c in cpuc.isolated_cpus(host) if c in online]
    if iso:
        return _plan(iso, online, "isolated CPUs", False, notes)
    nohz = [c for c in cpuc.nohz_full_cpus(host) if c in online]
    if nohz:
        return _plan(nohz, online, "nohz_full CPUs", False, notes)
    if len(online) == 1:
        return _plan(online, online, "default: the only online CPU", False, notes)
    house = housekeeping_core(host, online)
    if gpu is not None:
        local, where = gpu_local_cpus(host, gpu, online)
        cpus = [c for c in local if c not in house] or local
        return _plan(cpus, online, where + (f" less the housekeeping core (CPU "
                                            f"{format_cpulist(house)})" if len(cpus) <
                                            len(local) else ""), False, notes)
    rest = [c for c in online if c not in house]
    if not rest:  # one core with SMT siblings only
        rest = [c for c in online if c != online[0]]
    return _plan(rest, online, f"default: all online CPUs but the housekeeping core "
                 f"(CPU {format_cpulist(sorted(set(online) - set(rest)))})", False, notes)


def _plan(cpus: list[int], online: list[int], source: str, explicit: bool,
          notes: list[str]) -> TargetPlan:
    cpus = sorted(cpus)
    house = [c for c in online if c not in set(cpus)]
    return TargetPlan(cpus, house, list(online), source, explicit, list(notes))
