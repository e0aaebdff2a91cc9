"""`hftagent run`: start an inference process pinned, bound and with TF threads set.

What it does, in order, then ``execvpe`` (the launcher process *becomes* CMD: same PID, no
shell, no wrapper left behind):

1. CPU affinity: ``sched_setaffinity(0, CPUS)`` (inherited across exec). Equivalent:
   ``taskset -c CPUS CMD``.
2. NUMA memory: with ``--mem-node N``, CMD is run as ``numactl --physcpubind=CPUS
   --membind=N -- CMD`` (numactl must be installed; a clear error otherwise).
3. Threads: TF_NUM_INTRAOP_THREADS (default: the number of CPUs), TF_NUM_INTEROP_THREADS
   (default 1) and OMP_NUM_THREADS (= intra) in the environment — read by TensorFlow when it
   initialises, which is why they must be set before the process starts.
4. Scheduling: ``--sched fifo:PRIO`` sets SCHED_FIFO at PRIO (1..99) before exec. Equivalent:
   ``chrt -f PRIO CMD``. Use with kernel.sched_rt_runtime_us in mind (RT throttling).

Default CPUs: the isolated CPUs (/sys/devices/system/cpu/isolated), else the CPUs of the NUMA
node of the first NVIDIA GPU (its PCI device's numa_node), else all online CPUs but CPU 0.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from collectors.host import Host
from collectors.parsers import format_cpulist, parse_cpu_option

NVIDIA_VENDOR = "0x10de"


class LaunchError(Exception):
    """Bad input for `hftagent run`; the message is for the user."""


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cpus: list[int]
    cpus_source: str
    mem_node: int | None = None
    sched: tuple[int, int] | None = None  # (policy, priority)

    def to_dict(self) -> dict:
        keys = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
        return {"argv": self.argv, "cpus": format_cpulist(self.cpus),
                "cpus_source": self.cpus_source, "mem_node": self.mem_node,
                "sched": None if self.sched is None else
                {"policy": "fifo" if self.sched[0] == os.SCHED_FIFO else "rr",
                 "priority": self.sched[1]},
                "env": {k: self.env[k] for k in keys}}


def parse_sched(spec: str) -> tuple[int, int]:
    """"fifo:PRIO" (or "rr:PRIO") to (policy, priority); priority 1..99."""
    policy_s, sep, prio_s = spec.partition(":")
    policies = {"fifo": os.SCHED_FIFO, "rr": os.SCHED_RR}
    if not sep or policy_s not in policies or not prio_s.isdigit():
        raise LaunchError(f"bad --sched {spec!r}: expected fifo:PRIO (PRIO 1..99)")
    prio = int(prio_s)
    lo, hi = os.sched_get_priority_min(policies[policy_s]), os.sched_get_priority_max(
        policies[policy_s])
    if not lo <= prio <= hi:
        raise LaunchError(f"bad --sched {spec!r}: priority must be {lo}..{hi}")
    return policies[policy_s], prio


def default_cpus(host: Host, online: list[int]) -> tuple[list[int], str]:
    """(CPUs, where they came from): isolated, else the GPU's NUMA node, else all but CPU 0."""
    from collectors import cpu as cpuc
    from collectors.pcie import pci_devices
    from collectors.system import numa_nodes

    iso = [c for c in cpuc.isolated_cpus(host) if c in online]
    if iso:
        return iso, "isolated CPUs"
    nodes = numa_nodes(host)
    for dev in pci_devices(host):
        if dev.vendor == NVIDIA_VENDOR and dev.klass.lower().startswith(("vga", "3d", "display")) \
                and dev.numa_node is not None and nodes.get(dev.numa_node):
            cpus = [c for c in nodes[dev.numa_node] if c in online]
            if cpus:
                return cpus, f"NUMA node {dev.numa_node} of GPU {dev.address}"
    rest = [c for c in online if c != 0]
    return (rest, "all online CPUs but CPU 0") if rest else (online, "all online CPUs")


def build_launch(host: Host, cmd: list[str], *, cpus: str | None = None,
                 mem_node: int | None = None, intra: int | None = None,
                 inter: int | None = None, sched: str | None = None,
                 env: Mapping[str, str] | None = None,
                 which: Callable[[str], str | None] = shutil.which) -> Launch:
    """Validate everything and compute argv/env. Pure apart from reading the host."""
    from collectors import cpu as cpuc
    from collectors.system import numa_nodes

    if not cmd:
        raise LaunchError("no command given: hftagent run [OPTIONS] -- CMD [ARGS...]")
    online_r = cpuc.online_cpus(host)
    if not online_r.ok:
        raise LaunchError(f"cannot read online CPUs ({online_r.path}: {online_r.reason})")
    online = online_r.value
    if cpus is None:
        cpu_list, source = default_cpus(host, online)
    else:
        try:
            cpu_list = parse_cpu_option(cpus, online)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        source = "--cpus"
    if intra is not None and intra < 1:
        raise LaunchError("--intra must be at least 1")
    # -1: TF runs inter-op work in the caller thread (what `probe --sweep threads` calls
    # "caller"); 0 would mean TF's own default, which is what omitting --inter is for.
    if inter is not None and inter < 1 and inter != -1:
        raise LaunchError("--inter must be at least 1, or -1 (run in the caller thread)")
    n_intra = intra if intra is not None else len(cpu_list)
    n_inter = inter if inter is not None else 1
    out_env = dict(os.environ if env is None else env)
    out_env.update(TF_NUM_INTRAOP_THREADS=str(n_intra), TF_NUM_INTEROP_THREADS=str(n_inter),
                   OMP_NUM_THREADS=str(n_intra))
    argv = list(cmd)
    if mem_node is not None:
        nodes = numa_nodes(host)
        if nodes and mem_node not in nodes:
            raise LaunchError(f"--mem-node {mem_node}: no such NUMA node (nodes: "
                              f"{', '.join(map(str, sorted(nodes)))})")
        numactl = which("numactl")
        if not numactl:
            raise LaunchError("--mem-node needs numactl, which is not installed "
                              "(apt-get install numactl, or dnf install numactl)")
        argv = [numactl, f"--physcpubind={format_cpulist(cpu_list)}",
                f"--membind={mem_node}", "--", *cmd]
    elif which(cmd[0]) is None and "/" not in cmd[0]:
        raise LaunchError(f"command not found: {cmd[0]!r}")
    return Launch(argv, out_env, cpu_list, source, mem_node,
                  parse_sched(sched) if sched else None)


def exec_launch(launch: Launch) -> None:
    """Pin, set the scheduler, and become the command. Returns only by raising OSError."""
    os.sched_setaffinity(0, launch.cpus)
    if launch.sched is not None:
        policy, prio = launch.sched
        os.sched_setscheduler(0, policy, os.sched_param(prio))
    os.execvpe(launch.argv[0], launch.argv, launch.env)


def command_line(launch: Launch, cmd: list[str]) -> str:
    """The `hftagent run` command that reproduces ``launch`` (for `tune threads` and logs)."""
    import shlex

    parts = ["hftagent", "run", "--cpus", format_cpulist(launch.cpus),
             "--intra", launch.env["TF_NUM_INTRAOP_THREADS"],
             "--inter", launch.env["TF_NUM_INTEROP_THREADS"]]
    if launch.mem_node is not None:
        parts += ["--mem-node", str(launch.mem_node)]
    if launch.sched is not None:
        parts += ["--sched", f"{'fifo' if launch.sched[0] == os.SCHED_FIFO else 'rr'}:"
                  f"{launch.sched[1]}"]
    return shlex.join([*parts, "--", *cmd])
