"""``hftagent watch``: keep a probe (or your own process) timed, sample the host, and name the
cause of every slow sample.

Thin: the options are parsed and checked once into a request (agent/watch/options.py), one
call runs it (agent/watch/runner.py), the summary is rendered (agent/watch/report.py) and the
run recorded in history (agent/history/record.py ``record_watch``)."""

from __future__ import annotations

import json
import sys
import threading
from typing import Annotated

import typer

from agent.commands.common import (
    AttachRuntimeOpt,
    AttachSymbolOpt,
    DbOpt,
    NoHistoryOpt,
    ProcfsOpt,
    RootOpt,
    SysfsOpt,
    check_history_db,
    fail,
    make_host,
    register_command,
)
from agent.watch.options import MAX_RATE_HZ, MAX_SAMPLE_HZ, MIN_SAMPLE_HZ

_opt = typer.Option

HELP = """Attribute every slow probe sample to a named cause, continuously.

Keeps a probe timed open loop on the target CPUs (--probe tf or numpy, at --rate auto by
default), or reads the latencies your own process reports through agent.client (--pid,
--ring), or times every inference call of an unmodified process with uprobes (--attach PID,
or a service across its restarts: --attach-name, --attach-unit, --attach-cgroup);
samples the host from a housekeeping CPU and gives every slow sample its ranked causes.
Watch itself never runs on the source's CPUs: it leaves an inherited affinity or the
isolated cpuset where it may, and refuses (exit 1) where it may run nowhere else.

Every option that is given is used or refused before anything starts (one line, exit 1).
Exit status: 0 at --duration or on SIGTERM/SIGINT (the summary printed), 3 when the probe
or the watched process died or its ring became unreadable (a service followed by
--attach-name/-unit/-cgroup may exit and restart: watch goes on), 4 when --attach or a
service timed no call (said on stderr), 1 on bad input or a spike log that could not be
written. A run with samples is recorded in history (--db, --no-history):
its summary, spikes by cause and the host fingerprint."""
ProbeOpt = Annotated[str | None, _opt(
    "--probe", metavar="tf|numpy|external", help="Latency source: tf (built-in TF probe, the "
    "default), numpy (numpy LSTM-shaped probe, no TF), or external (--pid/--ring: your "
    "process with agent.client). --attach PID times an unmodified process instead.")]
ModelOpt = Annotated[str | None, _opt("--model", metavar="NAME|PATH", help="Built-in model "
                                      "name or a model path (--probe tf only; default lstm).")]
VariantOpt = Annotated[str | None, _opt("--variant", metavar="NAME", help="TF variant for the "
                                        "probe (--probe tf only; default xla).")]
RateOpt = Annotated[str, _opt(
    "--rate", metavar="HZ|auto", help="Probe starts per second (open loop), or auto (the "
    "default): the most (≤ 500) that keep the probe CPU 25 % busy at the warm-up's P50 "
    "(calls between sleeps run slower: expect up to ~40 %), so response times measure the "
    f"host rather than the probe's own queue; at most {MAX_RATE_HZ:g}.")]
CpusOpt = Annotated[str | None, _opt(
    "--cpus", metavar="LIST", help="Probe CPUs (default: the last of the target CPUs — "
    "isolated, else nohz_full, else all online but the housekeeping core; with --pid or "
    "--attach, the process's own CPUs).")]
HousekeepingOpt = Annotated[str | None, _opt(
    "--housekeeping", metavar="LIST", help="CPUs for the sampler and watch itself (default: "
    "the housekeeping CPUs of the target rule, else all but the probe's).")]
PidOpt = Annotated[int | None, _opt(
    "--pid", metavar="PID", help="External process to attribute (using agent.client: its "
    "ring is found in /proc/PID/maps, and must be owned by its user).")]
RingOpt = Annotated[str | None, _opt("--ring", metavar="PATH", help="External latency ring "
                                     "path (a regular file; a symlink is refused).")]
AttachOpt = Annotated[int | None, _opt(
    "--attach", metavar="PID", help="Time every inference call of this running, unmodified "
    "process with uprobes on its runtime's once-per-call function (LiteRT, the TFLite/TF C "
    "APIs, TF2 from Python), read from watch's own tracefs instance; not with --probe, --pid "
    "or --ring. Needs root; docs/attach.md.")]
AttachUnsafeLibraryOpt = Annotated[bool, _opt(
    "--attach-unsafe-library", help="With --attach: read and probe a library that a user "
    "other than root and the process's owner may write (owned by another user, group- or "
    "world-writable), or one on a FUSE filesystem. Risk: that user (or the FUSE server) can "
    "change the code the uprobe lands in, in every process that maps the file, while root's "
    "probe is there; a FUSE server may also never answer a read.",
    rich_help_panel="--attach overrides")]  # (its own panel: the name fits its column)
AttachNameOpt = Annotated[str | None, _opt(
    "--attach-name", metavar="NAME", help="Time a service by name across its restarts: every "
    "process whose name (comm) is NAME or whose command line the regular expression NAME "
    "matches (watch and its parents never), timed as --attach times one (one probe set per "
    "library file, shared by its processes); an exit is said on stderr and the next process "
    "is timed within a second of mapping its runtime. Takes --attach-runtime, "
    "--attach-symbol, --unsafe-return, --attach-unsafe-library. docs/attach.md.")]
AttachUnitOpt = Annotated[str | None, _opt(
    "--attach-unit", metavar="UNIT", help="As --attach-name, for a systemd unit's main "
    "process (systemctl show -p MainPID; without systemd, the processes of the unit's "
    "cgroup); .service is added to a name without a suffix.")]
AttachCgroupOpt = Annotated[str | None, _opt(
    "--attach-cgroup", metavar="PATH", help="As --attach-name, for every process of a cgroup "
    "directory (and its descendants) under /sys/fs/cgroup, absolute or relative to it.")]
GpuProbesOpt = Annotated[str | None, _opt(
    "--gpu-probes", metavar="LEVEL", help="With --attach, on a process "
    "that maps libcuda: which driver calls get a uprobe, for each slow call's GPU split "
    "(enqueue, copies, GPU wait, completion lag). default: kernel launches and the sync "
    "calls (~7 µs a JAX call); copies: also the copies with their bytes and "
    "cuLaunchHostFunc (~23 µs); full: also cuEventRecord, cuStreamWaitEvent, cuEventQuery; "
    "off: none. attach "
    "--check shows their expected cost per call. docs/attach.md.")]
UnsafeReturnOpt = Annotated[bool, _opt(
    "--unsafe-return", help="With --attach-symbol: time the function to its return too. "
    "Unsafe: a C++ exception that unwinds through a function with a return probe aborts the "
    "process (std::terminate); only for a function you know cannot throw. Without it an "
    "arbitrary function gets entry-only timing (call periods).")]
SampleHzOpt = Annotated[float, _opt("--sample-hz", metavar="HZ", help="Collector rounds per "
                                    f"second ({MIN_SAMPLE_HZ:g}..{MAX_SAMPLE_HZ:g}).")]
SamplerOpt = Annotated[str, _opt(
    "--sampler", metavar="auto|native|python", help="Who reads the hot /proc files: native (a "
    "small C reader built on first use with the system's cc; about half the CPU cost), "
    "python, or auto (native when it can be built, else python).")]
TraceOpt = Annotated[str, _opt(
    "--trace", metavar="auto|on|off|mount", help="Kernel events (tracefs) for an exact "
    "timeline and breakdown of each attributed spike: auto (where tracefs is mounted and "
    "usable, else said as 'unsupported: ...' and watch runs without), on (an error where "
    "unusable), off, or mount (mount tracefs at /sys/kernel/tracing first when it is not "
    "mounted). Needs root.")]
PmuOpt = Annotated[str, _opt(
    "--pmu", metavar="auto|on|off", help="With --attach: each call's cycles, instructions "
    "and on-CPU time (a perf group per thread, sampled at the call's entry and return "
    "uprobes), so a slow call that kept its CPU is named slow_code: it did more work, ran "
    "at a lower IPC or at a lower clock. auto (where a hardware cycles counter opens for "
    "the process, else 'pmu: unsupported: ...' once), on (exit 2 where none opens), off. "
    "docs/attach.md.")]
IrqCostOpt = Annotated[str, _opt(
    "--irq-cost", metavar="auto|off|US", help="One interrupt's cost to the probe, its sub-µs "
    "handler included (entry/exit; in a VM the exit to the hypervisor): with kernel events, "
    "each interrupt that hit the probe is charged this in a spike's breakdown. auto "
    "(measured on the probe CPUs for ~25 ms before watch's own probe starts; not for an "
    "external one), off, or a cost in µs.")]
NiceOpt = Annotated[str, _opt(
    "--nice", metavar="N", help="watch's own priority on the housekeeping CPUs: this nice "
    "value for its threads and its sampler's helper, never for the probe (-20 to 19; 0 "
    "leaves it). Where the housekeeping CPUs run other busy work, -10 keeps spike records "
    "timely; negative values need root (CAP_SYS_NICE).")]
ThresholdOpt = Annotated[float | None, _opt(
    "--threshold-us", metavar="US", help="A sample over this many µs is a spike (0.001 to "
    "1e9); with --listen also an exceedance counter.")]
KOpt = Annotated[float, _opt("--k", metavar="K", help="A sample over k × rolling P50 is a "
                             "spike (k > 1).")]
FlightOpt = Annotated[float | None, _opt("--flight-us", metavar="US", help="Dump every "
                                         "signal's surrounding window for spikes over this "
                                         "many µs.")]
FlightDirOpt = Annotated[str | None, _opt(
    "--flight-dir", metavar="DIR", help="Where --flight-us records go (default "
    "./hftagent-flight; created if missing, its parent must exist).")]
SpikeLogOpt = Annotated[str | None, _opt(
    "--spike-log", metavar="FILE", help="JSONL spike log (appended; its directory must exist; "
    "a regular file, a FIFO with a reader or a terminal).")]
DurationOpt = Annotated[float | None, _opt("--duration", metavar="S", help="Stop after this "
                                           "many seconds.")]
PerfOpt = Annotated[bool, _opt("--perf", help="Also stream `perf stat -I` software events.")]
ListenOpt = Annotated[str | None, _opt(
    "--listen", metavar="ADDR:PORT", help="Serve Prometheus /metrics here (e.g. "
    "127.0.0.1:9877; loopback unless you say otherwise).")]
WebConfigOpt = Annotated[str | None, _opt(
    "--web.config.file", metavar="FILE", help="TLS and basic auth for --listen: a web config "
    "in the Prometheus exporter-toolkit format (tls_server_config, basic_auth_users with "
    "bcrypt hashes), as node_exporter's --web.config.file; docs/fleet.md.")]
LiveOpt = Annotated[bool | None, _opt("--live/--no-live", help="Live view (default: when "
                                      "stdout is a terminal).")]
JsonOutOpt = Annotated[bool, _opt("--json", help="Summary as JSON on stdout.")]
BudgetOpt = Annotated[int | None, _opt(
    "--p99-budget-us", metavar="US", help="P99 budget exported with --listen "
    "(hftagent_probe_p99_budget_seconds; the HftP99OverBudget alert).")]
CpuBudgetOpt = Annotated[float | None, _opt(
    "--cpu-budget", metavar="PCT", help="watch's own CPU budget in % of one CPU (default 1; "
    "0 < PCT <= 100): the sampler and the source's reads always run and every spike is "
    "recorded with a cause; a token bucket gives each spike exact attribution (its "
    "kernel-event window) while the budget allows, and past it the spike gets the polled "
    "rules' cause and a note; while the always-on parts alone spend it, a spike whose polled "
    "rules would see the same sampler rows as the last attributed spike's on the same CPU "
    "takes that cause instead, and the sampler's rounds come twice as far apart until "
    "they are under 80 % of it (records wait for its own rounds: ~0.4 s at most). The "
    "summary and /metrics report watch's CPU by part.")]
ProfileOpt = Annotated[str | None, _opt(
    "--profile", metavar="NAME|FILE", help="Audit profile for the audit state exported with "
    "--listen (run once at start; default hft-cpu).")]


def register(app: typer.Typer) -> None:
    register_command(app, "watch", watch, HELP)


def watch(probe: ProbeOpt = None, model: ModelOpt = None, variant: VariantOpt = None,
          rate: RateOpt = "auto", cpus: CpusOpt = None, housekeeping: HousekeepingOpt = None,
          pid: PidOpt = None, ring: RingOpt = None, attach: AttachOpt = None,
          attach_runtime: AttachRuntimeOpt = None, attach_symbol: AttachSymbolOpt = None,
          unsafe_return: UnsafeReturnOpt = False,
          attach_unsafe_library: AttachUnsafeLibraryOpt = False,
          attach_name: AttachNameOpt = None, attach_unit: AttachUnitOpt = None,
          attach_cgroup: AttachCgroupOpt = None, gpu_probes: GpuProbesOpt = None,
          sample_hz: SampleHzOpt = 100.0,
          sampler: SamplerOpt = "auto", trace: TraceOpt = "auto", pmu: PmuOpt = "auto",
          irq_cost: IrqCostOpt = "auto", nice: NiceOpt = "0",
          threshold_us: ThresholdOpt = None, k: KOpt = 3.0, flight_us: FlightOpt = None,
          flight_dir: FlightDirOpt = None, spike_log: SpikeLogOpt = None,
          duration: DurationOpt = None, perf: PerfOpt = False, listen: ListenOpt = None,
          web_config_file: WebConfigOpt = None, live: LiveOpt = None,
          json_out: JsonOutOpt = False, p99_budget_us: BudgetOpt = None,
          profile: ProfileOpt = None, cpu_budget: CpuBudgetOpt = None, db: DbOpt = None,
          no_history: NoHistoryOpt = False,
          root: RootOpt = "/", procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    """``hftagent watch`` (HELP): options → one checked request → one run → render."""
    from agent.watch import options, report
    from agent.watch.runner import run_watch

    host = make_host(root, procfs, sysfs)
    req = options.build(
        host, probe=probe, model=model, variant=variant, rate=rate, cpus=cpus,
        housekeeping=housekeeping, pid=pid, ring=ring, attach=attach,
        attach_runtime=attach_runtime, attach_symbol=attach_symbol,
        unsafe_return=unsafe_return, attach_unsafe_library=attach_unsafe_library,
        attach_name=attach_name, attach_unit=attach_unit, attach_cgroup=attach_cgroup,
        gpu_probes=gpu_probes, sample_hz=sample_hz, sampler=sampler, trace=trace, pmu=pmu,
        irq_cost=irq_cost, nice=nice, threshold_us=threshold_us, k=k, flight_us=flight_us,
        flight_dir=flight_dir, spike_log=spike_log, duration=duration, perf=perf,
        listen=listen, web_config_file=web_config_file, live=live, json_out=json_out,
        p99_budget_us=p99_budget_us, profile=profile, cpu_budget=cpu_budget)
    record = check_history_db(db, no_history)  # (a --db that cannot be used: before the run)
    phases = _Phases(sys.stderr.isatty())
    from agent.watch.attribution.pmu import Refused
    try:
        rc, summary = run_watch(req, host, on_phase=phases)
    except Refused as exc:  # --pmu on where no counter opens: exit 2, as audit's "not tuned"
        raise fail(str(exc), 2) from None
    finally:
        phases.cancel()
    text = json.dumps(summary, indent=1) if json_out else "\n".join(report.render(summary,
                                                                                   spike_log))
    print(text)
    for line in report.closing(summary, spike_log):
        print(line, file=sys.stderr)
    if record and summary["samples"]:
        from agent.history import record_watch
        record_watch(summary, **req.cfg.source.history(), db=db, warn=True)
    if rc:
        raise typer.Exit(rc)


class _Phases:
    """Start-up phases (model load, warm-up, symbols read, first samples), one line each on
    stderr: TensorFlow's import and XLA's compile take seconds that would otherwise be
    silent. On a terminal a phase is said as it begins; on a pipe only once it has lasted
    1 s, so a start-up that fails at once stays the one line a script reads. "" (the
    session's end of start-up) drops a line still pending."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self._timer: threading.Timer | None = None

    def __call__(self, what: str) -> None:
        self.cancel()
        if not what:  # start-up is over
            return
        if self.tty:
            self._say(what)
        else:
            self._timer = threading.Timer(1.0, self._say, (what,))
            self._timer.daemon = True
            self._timer.start()

    @staticmethod
    def _say(what: str) -> None:
        print(f"hftagent watch: {what} ...", file=sys.stderr, flush=True)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
