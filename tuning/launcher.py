"""`hftagent run`: start an inference process pinned, bound and with TF threads set.

What it does, in order, then ``execvpe`` (the launcher process *becomes* CMD: same PID, no
shell, no wrapper left behind):

1. CPU affinity: ``sched_setaffinity(0, CPUS)`` (inherited across exec). Equivalent:
   ``taskset -c CPUS CMD``.
2. NUMA memory: with ``--mem-node N``, CMD is run as ``numactl --physcpubind=CPUS
   --membind=N -- CMD`` (numactl must be installed; a clear error otherwise).
3. Threads: TF_NUM_INTRAOP_THREADS (default: the number of CPUs), TF_NUM_INTEROP_THREADS
   (default 1) and OMP_NUM_THREADS (= intra) in the environment — read by TensorFlow when it
   initialises, which is why they must be set before the process starts. Both must be ≥ 1:
   TF reads a value ≤ 0 as "use the default" (TF_NUM_INTEROP_THREADS=-1 gave the same two
   tf_Compute threads as unset, measured), so inter-op work in the caller thread can only be
   asked for inside the program (:data:`CALLER_THREAD_HINT`).
4. Scheduling: ``--sched fifo:PRIO`` sets SCHED_FIFO at PRIO (1..99) before exec. Equivalent:
   ``chrt -f PRIO CMD``. Use with kernel.sched_rt_runtime_us in mind (RT throttling).

Default CPUs: the isolated CPUs (/sys/devices/system/cpu/isolated), else the CPUs of the NUMA
node of the first NVIDIA GPU (its PCI device's numa_node), else all online CPUs but CPU 0.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from collectors.host import Host
from collectors.parsers import format_cpulist, parse_cpu_option

NVIDIA_VENDOR = "0x10de"


CALLER_THREAD_HINT = (
    "caller-thread inter-op execution cannot be set through the environment (TensorFlow reads "
    "TF_NUM_INTEROP_THREADS <= 0 as its default): set it inside the program with "
    "tf.config.threading.set_inter_op_parallelism_threads before TensorFlow initialises")


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

    def command_line(self, cmd: Sequence[str]) -> str:
        """The `hftagent run` line that reproduces this launch of ``cmd``."""
        return command_line(cmd, cpus=self.cpus,
                            intra=int(self.env["TF_NUM_INTRAOP_THREADS"]),
                            inter=int(self.env["TF_NUM_INTEROP_THREADS"]),
                            mem_node=self.mem_node,
                            sched=None if self.sched is None else
                            f"{'fifo' if self.sched[0] == os.SCHED_FIFO else 'rr'}:{self.sched[1]}")


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
    _check_threads(intra, inter)
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


def _check_threads(intra: int | None, inter: int | None) -> None:
    if intra is not None and intra < 1:
        raise LaunchError("--intra must be at least 1")
    if inter is not None and inter < 1:
        raise LaunchError(f"--inter must be at least 1; {CALLER_THREAD_HINT}")


def command_line(cmd: Sequence[str], *, cpus: Iterable[int] | None = None,
                 intra: int | None = None, inter: int | None = None,
                 mem_node: int | None = None, sched: str | None = None) -> str:
    """The one builder of an `hftagent run` command line (`run --dry-run`, `tune threads`, the
    probe's sweep): options in a fixed order, every word quoted with ``shlex.join``. An
    option left None is omitted (`run` then uses its default). Raises LaunchError for
    thread counts `run` refuses (inter < 1: caller-thread execution is not reproducible
    through `run`, see :data:`CALLER_THREAD_HINT`)."""
    _check_threads(intra, inter)
    parts = ["hftagent", "run"]
    cpu_list = sorted(cpus) if cpus is not None else []
    if cpu_list:
        parts += ["--cpus", format_cpulist(cpu_list)]
    if intra is not None:
        parts += ["--intra", str(intra)]
    if inter is not None:
        parts += ["--inter", str(inter)]
    if mem_node is not None:
        parts += ["--mem-node", str(mem_node)]
    if sched is not None:
        parts += ["--sched", sched]
    return shlex.join([*parts, "--", *cmd])
