"""`hftagent run -- CMD ARGS`: exec an inference command pinned, bound, with TF threads set."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Annotated

import typer

from agent.commands.common import (
    JsonOpt,
    ProcfsOpt,
    RootOpt,
    SysfsOpt,
    fail,
    make_host,
    register_command,
)

HELP = """Run CMD pinned to CPUs, with NUMA memory binding, TF thread counts, SCHED_FIFO/RR and
wake-up levers.

No shell: CMD and its arguments are exec'd as given (put them after --); the process keeps the
launcher's PID. Default CPUs: the isolated CPUs, else nohz_full, else the --gpu's local CPUs,
else all online CPUs but the housekeeping core. Threads: TF_NUM_INTRAOP_THREADS = number of
CPUs, TF_NUM_INTEROP_THREADS = 1 unless given. When `tune apply --isolate` made an isolated
cpuset and the CPUs are in it, CMD joins it. --keep-awake and --pm-qos last exactly as long as
CMD: spinners exit with it, the PM QoS request ends when it exits. Which wake-up lever helps
(PM QoS, keep-awake with a pause or a busy loop, halt-polling) differs by box: `hftagent tune
try` measures them on yours and picks one."""


CmdArg = Annotated[list[str] | None, typer.Argument(help="Command and arguments (after --).")]
# run's own --cpus: its default has the --gpu's local CPUs in it (tuning/launcher.py)
RunCpusOpt = Annotated[str | None, typer.Option(
    "--cpus", metavar="LIST", help="CPU list, e.g. 2-5. Default: isolated, else nohz_full, "
    "else the --gpu's local CPUs, else all online CPUs but the housekeeping core.")]
GpuOpt = Annotated[int | None, typer.Option(
    "--gpu", metavar="INDEX", help="The GPU the command uses (nvidia-smi index): its local "
    "CPUs are the default --cpus. Also taken from CUDA_VISIBLE_DEVICES=N when "
    "CUDA_DEVICE_ORDER=PCI_BUS_ID.")]
MemNodeOpt = Annotated[int | None, typer.Option(
    "--mem-node", metavar="NODE", help="Bind memory to this NUMA node (needs numactl).")]
RunIntraOpt = Annotated[int | None, typer.Option(
    "--intra", metavar="N", help="TF intra-op threads (default: number of CPUs).")]
RunInterOpt = Annotated[int | None, typer.Option(
    "--inter", metavar="N", help="TF inter-op threads, at least 1 (default 1). Caller-thread "
    "execution can only be set inside the program (tf.config.threading).")]
SchedOpt = Annotated[str | None, typer.Option(
    "--sched", metavar="POLICY:PRIO", help="fifo:PRIO for SCHED_FIFO or rr:PRIO for SCHED_RR "
    "(PRIO 1..99; needs root or CAP_SYS_NICE).")]
KeepAwakeOpt = Annotated[bool, typer.Option(
    "--keep-awake", help="One SCHED_IDLE spinner per CPU (C, `pause` in the loop) so the CPUs "
    "never idle: no idle-state exit, no halt in a VM. They run only while CMD runs, and stop "
    "(one line on stderr) if CMD waits for the CPU behind them. For isolated CPUs; whether it "
    "helps on this box: `hftagent tune try`.")]
KeepAwakeLoopOpt = Annotated[str, typer.Option(
    "--keep-awake-loop", metavar="LOOP", help="The spinner's loop: pause (default; the "
    "pause hint leaves an SMT sibling the core) or busy (no pause: in a KVM guest, pause-loop "
    "exiting can hand a pausing vCPU back to the host, which then wakes it late). Measure both "
    "with `hftagent tune try`.")]
PmQosOpt = Annotated[int | None, typer.Option(
    "--pm-qos", metavar="US", help="Hold /dev/cpu_dma_latency at US µs while CMD runs (every "
    "CPU; 0 = polling only; needs root). The open descriptor is inherited by CMD: the request "
    "ends when CMD exits. Whether it helps on this box: `hftagent tune try`.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print what would be exec'd; do not "
                                         "run it.")]


def run_cmd(cmd: CmdArg = None, cpus: RunCpusOpt = None, gpu: GpuOpt = None,
            mem_node: MemNodeOpt = None, intra: RunIntraOpt = None, inter: RunInterOpt = None,
            sched: SchedOpt = None, keep_awake: KeepAwakeOpt = False,
            keep_awake_loop: KeepAwakeLoopOpt = "pause", pm_qos: PmQosOpt = None,
            dry_run: DryRunOpt = False, json_out: JsonOpt = False, root: RootOpt = "/",
            procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    from tuning.launcher import build_launch, exec_launch

    host = make_host(root, procfs, sysfs)
    if not dry_run and not host.live:
        # the CPUs, NUMA nodes and GPU of a captured tree say nothing about this machine
        raise fail("--root/--procfs/--sysfs describe a captured tree, not this host: use them "
                   "with --dry-run (a real run always uses the live host)")
    launch = build_launch(host, list(cmd or []), cpus=cpus, mem_node=mem_node, intra=intra,
                          inter=inter, sched=sched, keep_awake=keep_awake, pm_qos=pm_qos,
                          keep_awake_loop=keep_awake_loop,
                          gpu=gpu)
    if dry_run:
        show_dry_run(launch, list(cmd or []), json_out)
        raise typer.Exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        exec_launch(launch)
    except PermissionError as exc:
        raise fail(f"cannot start {launch.argv[0]!r}: {exc.strerror} (SCHED_FIFO/RR needs root "
                   "or CAP_SYS_NICE)") from None
    except OSError as exc:
        raise fail(f"cannot start {launch.argv[0]!r}: {exc.strerror or exc}") from None


def show_dry_run(launch, cmd: list[str], json_out: bool) -> None:
    """What ``run`` would exec: the CPUs and where they came from, the environment, the
    policy, the levers, and the line itself (``exec:``, whole, never wrapped)."""
    if json_out:
        print(json.dumps({**launch.to_dict(), "command": launch.command_line(cmd)}, indent=2))
        return
    d = launch.to_dict()
    print(f"cpus {d['cpus']} ({d['cpus_source']}); "
          + " ".join(f"{k}={v}" for k, v in d["env"].items())
          + (f"; sched {d['sched']['policy']}:{d['sched']['priority']}" if d["sched"] else ""))
    levers = []
    if launch.cpuset:
        levers.append(f"joins the isolated cpuset {launch.cpuset}")
    if launch.keep_awake:
        levers.append(f"keep-awake spinner on CPU {d['cpus']} (SCHED_IDLE, "
                      f"{launch.keep_awake_loop} loop)")
    if launch.pm_qos_us is not None:
        levers.append(f"PM QoS {launch.pm_qos_us} µs held on {launch.pm_qos_device}")
    if levers:
        print("levers: " + "; ".join(levers) + " (for as long as the command runs)")
    for note in launch.notes:
        print("note: " + note)
    print("exec: " + shlex.join(launch.argv))
    print("same as: " + launch.command_line(cmd))


def register(app: typer.Typer) -> None:
    register_command(app, "run", run_cmd, HELP, allow_interspersed_args=False)
