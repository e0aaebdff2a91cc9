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
4. Scheduling: ``--sched fifo:PRIO`` (or ``rr:PRIO``) sets SCHED_FIFO (SCHED_RR) at PRIO
   (1..99) before exec. Equivalent: ``chrt -f PRIO CMD`` (``chrt -r``). Use with
   kernel.sched_rt_runtime_us in mind (RT throttling).
5. Isolated cpuset: when `tune apply --isolate` has made ``hftagent-isolated`` and the CPUs
   are in it, CMD joins it first (its cgroup.procs; in a cgroup v2 partition a task outside
   it cannot run on those CPUs at all). CPUs outside it: a note, and CMD stays where it is.
6. Wake-up levers, alive exactly as long as CMD:
   - ``--keep-awake``: one spinner per CPU (tuning/keepawake.c, built on first use like the
     native sampler: collectors/native.py), SCHED_IDLE, pinned, ``pause`` in its loop. Each
     holds a pidfd of this process — which becomes CMD — and exits when it is gone; a failure
     before exec kills them at once. Not CMD's children: a ``wait`` in CMD never waits on them.
     They stay in CMD's session and cgroups (SCHED_IDLE is idle only within one task group),
     and each stops itself with one line on CMD's stderr when CMD's threads (or its
     descendants') are seen waiting for its CPU while it spins there (keepawake.c's guard).
   - ``--pm-qos US``: /dev/cpu_dma_latency opened, US written (a binary s32), the descriptor
     left open and inheritable: the kernel holds the request while any process has it open,
     so it ends when CMD (and any child it passed the descriptor to) exits. It applies to
     every CPU. Equivalent: what TuneD's ``force_latency`` does for its own lifetime.

Default CPUs: the one rule of tuning/targets.py (isolated, else nohz_full, else — with
``--gpu N``, or CUDA_VISIBLE_DEVICES=N under CUDA_DEVICE_ORDER=PCI_BUS_ID — that GPU's local
CPUs, else all online CPUs but the housekeeping core).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collectors.host import Host
from collectors.parsers import format_cpulist

NVIDIA_VENDOR = "0x10de"
KEEPAWAKE_SOURCE = Path(__file__).with_name("keepawake.c")
PM_QOS_MAX_US = 2**31 - 1  # the request is an s32


CALLER_THREAD_HINT = (
    "caller-thread inter-op execution cannot be set through the environment (TensorFlow reads "
    "TF_NUM_INTEROP_THREADS <= 0 as its default): set it inside the program with "
    "tf.config.threading.set_inter_op_parallelism_threads before TensorFlow initialises")


# The keep-awake spinner's loops (tuning/keepawake.c): "pause" spins with the pause hint (an
# SMT sibling keeps the core's pipelines); "busy" spins with no pause, for KVM guests whose
# pause-loop exiting hands a pausing vCPU back to the host.
KEEP_AWAKE_LOOPS = ("pause", "busy")


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
    keep_awake: bool = False
    keep_awake_loop: str = "pause"        # the spinner's loop: KEEP_AWAKE_LOOPS
    spinner: Path | None = None           # the built keep-awake helper
    procfs: Path | None = None            # the spinners' guard reads the command's tasks here
    pm_qos_us: int | None = None
    pm_qos_device: Path | None = None
    cpuset: str | None = None             # the isolated cpuset CMD joins (user-facing path)
    cpuset_procs: Path | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        keys = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
        return {"argv": self.argv, "cpus": format_cpulist(self.cpus),
                "cpus_source": self.cpus_source, "mem_node": self.mem_node,
                "sched": None if self.sched is None else
                {"policy": "fifo" if self.sched[0] == os.SCHED_FIFO else "rr",
                 "priority": self.sched[1]},
                "keep_awake": format_cpulist(self.cpus) if self.keep_awake else None,
                "keep_awake_loop": self.keep_awake_loop if self.keep_awake else None,
                "pm_qos_us": self.pm_qos_us, "cpuset": self.cpuset, "notes": self.notes,
                "env": {k: self.env[k] for k in keys}}

    def command_line(self, cmd: Sequence[str]) -> str:
        """The `hftagent run` line that reproduces this launch of ``cmd``."""
        return command_line(cmd, cpus=self.cpus,
                            intra=int(self.env["TF_NUM_INTRAOP_THREADS"]),
                            inter=int(self.env["TF_NUM_INTEROP_THREADS"]),
                            mem_node=self.mem_node,
                            sched=None if self.sched is None else
                            f"{'fifo' if self.sched[0] == os.SCHED_FIFO else 'rr'}:{self.sched[1]}",
                            keep_awake=self.keep_awake, pm_qos=self.pm_qos_us,
                            keep_awake_loop=self.keep_awake_loop)


def parse_sched(spec: str) -> tuple[int, int]:
    """"fifo:PRIO" (or "rr:PRIO") to (policy, priority); priority 1..99."""
    policy_s, sep, prio_s = spec.partition(":")
    policies = {"fifo": os.SCHED_FIFO, "rr": os.SCHED_RR}
    if not sep or policy_s not in policies or not (prio_s.isascii() and prio_s.isdigit()):
        raise LaunchError(f"bad --sched {spec!r}: expected fifo:PRIO or rr:PRIO (PRIO 1..99)")
    prio = int(prio_s)
    lo, hi = os.sched_get_priority_min(policies[policy_s]), os.sched_get_priority_max(
        policies[policy_s])
    if not lo <= prio <= hi:
        raise LaunchError(f"bad --sched {spec!r}: priority must be {lo}..{hi}")
    return policies[policy_s], prio


def gpu_from_env(env: Mapping[str, str]) -> int | None:
    """The GPU a CUDA process is bound to by its environment, in nvidia-smi's order: a single
    index in CUDA_VISIBLE_DEVICES counts only under CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's
    default order, FASTEST_FIRST, need not match the PCI order nvidia-smi and NVML use)."""
    vis = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" and vis.isascii() and vis.isdigit():
        return int(vis)
    return None


def build_launch(host: Host, cmd: list[str], *, cpus: str | None = None,
                 mem_node: int | None = None, intra: int | None = None,
                 inter: int | None = None, sched: str | None = None,
                 keep_awake: bool = False, pm_qos: int | None = None, gpu: int | None = None,
                 keep_awake_loop: str = "pause", env: Mapping[str, str] | None = None,
                 which: Callable[[str], str | None] = shutil.which,
                 build_spinner: Callable[[], Path] | None = None) -> Launch:
    """Validate everything and compute argv/env. Pure apart from reading the host (and, with
    ``keep_awake``, building the spinner once: a compiler error is a LaunchError here, before
    anything is pinned or started)."""
    from collectors import cpu as cpuc
    from collectors.system import numa_nodes
    from tuning.targets import TargetError, resolve

    if not cmd:
        raise LaunchError("no command given: hftagent run [OPTIONS] -- CMD [ARGS...]")
    base_env = os.environ if env is None else env
    if gpu is None and cpus is None:
        gpu = gpu_from_env(base_env)
    try:
        plan = resolve(host, cpus, gpu=gpu)
    except TargetError as exc:
        raise LaunchError(str(exc)) from None
    cpu_list, source = plan.cpus, plan.source
    _check_threads(intra, inter)
    n_intra = intra if intra is not None else len(cpu_list)
    n_inter = inter if inter is not None else 1
    out_env = dict(base_env)
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
    launch = Launch(argv, out_env, cpu_list, source, mem_node,
                    parse_sched(sched) if sched is not None else None)
    _cpuset(host, launch)
    if pm_qos is not None:
        if not 0 <= pm_qos <= PM_QOS_MAX_US:
            raise LaunchError(f"bad --pm-qos {pm_qos}: expected 0..{PM_QOS_MAX_US} µs")
        launch.pm_qos_us = pm_qos
        launch.pm_qos_device = host.root / "dev" / "cpu_dma_latency"
    if keep_awake_loop not in KEEP_AWAKE_LOOPS:
        raise LaunchError(f"bad --keep-awake-loop {keep_awake_loop!r}: expected "
                          f"{' or '.join(KEEP_AWAKE_LOOPS)}")
    if keep_awake_loop != "pause" and not keep_awake:
        raise LaunchError("--keep-awake-loop needs --keep-awake")
    if keep_awake:
        launch.keep_awake = True
        launch.keep_awake_loop = keep_awake_loop
        launch.spinner = (build_spinner or _build_spinner)()
        launch.procfs = host.proc()
        if not launch.cpuset and not set(cpu_list) <= set(cpuc.isolated_cpus(host)):
            # Since Linux 5.4 (sched_idle_cpu) a CPU that runs only SCHED_IDLE tasks counts as
            # idle for wake-up placement and load balancing: the spinner draws other runnable
            # tasks onto the CPU it keeps awake, and the command waits behind them whatever
            # keeps the CPU awake (the audit recommends keep-awake on isolated CPUs only).
            # (bench/tuning_effect.py's P50 x275 without isolation, 6 busy neighbours, was
            # measured with the spinner in a session of its own, whose autogroup made it
            # anything but idle: keepawake.c; noisy+keep-awake re-measures it.)
            launch.notes.append(
                f"--keep-awake on CPU {format_cpulist(cpu_list)}, which other tasks may use: "
                "the kernel counts a CPU running only the SCHED_IDLE spinner as idle and moves "
                "runnable tasks onto it; isolate the CPUs first (hftagent tune apply --isolate "
                f"--only isolate --cpus {format_cpulist(cpu_list)})")
    return launch


def _cpuset(host: Host, launch: Launch) -> None:
    """Join the isolated cpuset `tune apply --isolate` made, when the CPUs are in it."""
    from tuning.tunables.isolate import isolated_cpuset

    iso = isolated_cpuset(host)
    if iso is None:
        return
    if set(launch.cpus) <= set(iso.cpus):
        launch.cpuset, launch.cpuset_procs = iso.path, iso.procs
    else:
        launch.notes.append(f"not joining the isolated cpuset {iso.path} (CPUs "
                            f"{format_cpulist(iso.cpus)}): --cpus {format_cpulist(launch.cpus)} "
                            "is not inside it")


def _build_spinner() -> Path:
    from collectors.native import NativeUnavailable, build

    try:
        return build(KEEPAWAKE_SOURCE, "hftkeepawake", "keep-awake spinner")
    except NativeUnavailable as exc:
        raise LaunchError(f"--keep-awake: {exc}") from None


@dataclass
class Spinner:
    """One running keep-awake spinner (not our child: see keepawake.c)."""

    cpu: int
    pid: int
    pidfd: int  # ours, O_CLOEXEC: to kill it without a PID race; closed by exec


def start_spinners(exe: Path, cpus: Sequence[int], loop: str = "pause",
                   procfs: Path | None = None) -> list[Spinner]:
    """One spinner per CPU, each watching this process through an inherited pidfd. With
    ``procfs`` (the live procfs mount) each also guards this process — which becomes the
    command — and its descendants: when they wait for its CPU while it spins there, it stops
    with one line on their stderr (keepawake.c). Raises LaunchError (and leaves none running)
    when one cannot start."""
    from collectors.native import command
    try:
        me = os.pidfd_open(os.getpid())
    except (AttributeError, OSError) as exc:
        raise LaunchError(f"--keep-awake needs pidfd_open (Linux 5.3+): "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    guard = ("-p", str(procfs), "-w", str(os.getpid())) if procfs is not None else ()
    out: list[Spinner] = []
    try:
        for c in cpus:
            # through its checked cache directory (collectors/native.py); no lifeline: the
            # spinner watches the pidfd, which outlives our exec
            argv, fds = command(exe, *guard, str(c), str(me), loop, lifeline=False)
            try:
                r = subprocess.run(argv, pass_fds=(me, *fds),
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=10)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise LaunchError(f"--keep-awake: cannot start the spinner for CPU {c}: "
                                  f"{exc}") from None
            if r.returncode != 0 or not r.stdout.strip().isdigit():
                why = r.stderr.strip() or f"exit status {r.returncode}"
                raise LaunchError(f"--keep-awake: the spinner for CPU {c} did not start: {why}")
            pid = int(r.stdout.strip())
            # The spinner is alive and waits for *us* to exit: its PID cannot be reused yet.
            out.append(Spinner(c, pid, os.pidfd_open(pid)))
    except BaseException:
        stop_spinners(out)
        raise
    finally:
        os.close(me)
    return out


def stop_spinners(spinners: Sequence[Spinner]) -> None:
    """Kill spinners (the launch failed before exec). Never raises."""
    for s in spinners:
        try:
            signal.pidfd_send_signal(s.pidfd, signal.SIGKILL)
        except OSError:
            pass  # already gone
        try:
            os.close(s.pidfd)
        except OSError:
            pass


def hold_pm_qos(device: Path, us: int) -> int:
    """Open /dev/cpu_dma_latency, request ``us`` µs, and return the descriptor, inheritable so
    the request lives as long as whoever holds it. Raises LaunchError."""
    try:
        fd = os.open(device, os.O_WRONLY | os.O_NOFOLLOW)
    except PermissionError:
        raise LaunchError(f"--pm-qos: cannot open {device}: permission denied (it is root's: "
                          "run as root)") from None
    except FileNotFoundError:
        raise LaunchError(f"--pm-qos: no {device} (a kernel without CPU latency PM QoS)") \
            from None
    except OSError as exc:
        raise LaunchError(f"--pm-qos: cannot open {device}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            raise LaunchError(f"--pm-qos: {device} is not a character device: refused")
        if os.write(fd, struct.pack("=i", us)) != 4:
            raise LaunchError(f"--pm-qos: short write to {device}")
        os.set_inheritable(fd, True)
    except OSError as exc:
        os.close(fd)
        raise LaunchError(f"--pm-qos: cannot write {device}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def exec_launch(launch: Launch, report: Callable[[str], None] | None = None) -> None:
    """Join the isolated cpuset, pin, start the wake-up levers, set the scheduler, and become
    the command. Returns only by raising OSError or LaunchError; spinners started before that
    are killed first. ``report`` gets one line per lever (default: stderr)."""
    say = report or (lambda line: print(f"hftagent run: {line}", file=sys.stderr, flush=True))
    for note in launch.notes:
        say(note)
    if launch.cpuset_procs is not None:
        _join(launch)
        say(f"joined the isolated cpuset {launch.cpuset}")
    os.sched_setaffinity(0, launch.cpus)
    spinners: list[Spinner] = []
    try:
        if launch.keep_awake and launch.spinner is not None:
            spinners = start_spinners(launch.spinner, launch.cpus, launch.keep_awake_loop,
                                      launch.procfs)
            for s in spinners:
                say(f"keep-awake spinner pid {s.pid} on CPU {s.cpu} (SCHED_IDLE, "
                    f"{launch.keep_awake_loop} loop; exits with the command, or stops with "
                    "a line here if the command waits for the CPU behind it)")
        if launch.pm_qos_us is not None and launch.pm_qos_device is not None:
            fd = hold_pm_qos(launch.pm_qos_device, launch.pm_qos_us)
            say(f"PM QoS {launch.pm_qos_us} µs held on {launch.pm_qos_device} (fd {fd}, every "
                "CPU, until the command exits)")
        if launch.sched is not None:
            policy, prio = launch.sched
            os.sched_setscheduler(0, policy, os.sched_param(prio))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe(launch.argv[0], launch.argv, launch.env)
    except BaseException:
        stop_spinners(spinners)
        raise


def _join(launch: Launch) -> None:
    from tuning.tunables.isolate import move_to_cpuset

    try:
        move_to_cpuset(launch.cpuset_procs)
    except OSError as exc:
        raise LaunchError(f"cannot join the isolated cpuset {launch.cpuset}: "
                          f"{exc.strerror or exc}") from None


MAX_THREADS = 4096  # the probe's limit too (agent/probe/config.py)


def _check_threads(intra: int | None, inter: int | None) -> None:
    if intra is not None and not 1 <= intra <= MAX_THREADS:
        raise LaunchError(f"--intra must be between 1 and {MAX_THREADS}")
    if inter is not None and not 1 <= inter <= MAX_THREADS:
        raise LaunchError(f"--inter must be between 1 and {MAX_THREADS}; {CALLER_THREAD_HINT}")


def command_line(cmd: Sequence[str], *, cpus: Iterable[int] | None = None,
                 intra: int | None = None, inter: int | None = None,
                 mem_node: int | None = None, sched: str | None = None,
                 keep_awake: bool = False, pm_qos: int | None = None,
                 keep_awake_loop: str = "pause") -> str:
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
    if keep_awake:
        parts += ["--keep-awake"]
        if keep_awake_loop != "pause":
            parts += ["--keep-awake-loop", keep_awake_loop]
    if pm_qos is not None:
        parts += ["--pm-qos", str(pm_qos)]
    return shlex.join([*parts, "--", *cmd])
