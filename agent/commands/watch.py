"""``hftagent watch``: keep a probe (or your own process) timed, sample the host, and name the
cause of every slow sample."""

from __future__ import annotations

import json
import signal
import sys
from typing import Annotated

import typer

from agent.commands.common import ProcfsOpt, RootOpt, SysfsOpt, cli_errors, fail, make_host

MIN_SAMPLE_HZ, MAX_SAMPLE_HZ = 1.0, 1000.0  # a round costs ~100 µs: 1 kHz is 10 % of a CPU
MAX_RATE_HZ = 100_000.0  # a probe call takes ≥ 10 µs: more starts than this only queue


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)


@cli_errors
def watch(
    probe: Annotated[str, typer.Option(help="Latency source: tf (built-in TF probe), numpy "
                                       "(numpy LSTM-shaped probe, no TF), or external "
                                       "(--pid/--ring: your process with agent.client).")] = "tf",
    model: Annotated[str | None, typer.Option(help="Built-in model name or a model path "
                                              "(--probe tf only; default lstm).")] = None,
    variant: Annotated[str | None, typer.Option(help="TF variant for the probe (--probe tf "
                                                "only; default xla).")] = None,
    rate: Annotated[str, typer.Option(help="Probe starts per second (open loop), or auto: "
                                      "the most (≤ 500) that keep the probe CPU 25 % busy "
                                      "at the warm-up's P50 (calls between sleeps run slower: "
                                      "expect up to ~40 %), so response times measure the "
                                      "host rather than the probe's own queue; at most "
                                      f"{MAX_RATE_HZ:g}).")] = "500",
    cpus: Annotated[str | None, typer.Option(help="Probe CPUs (default: the last of the "
                                             "target CPUs — isolated, else nohz_full, else "
                                             "all online but the housekeeping core; with "
                                             "--pid, the process's own CPUs).")] = None,
    housekeeping: Annotated[str | None, typer.Option(help="CPUs for the sampler and watch "
                                                     "itself (default: the housekeeping "
                                                     "CPUs, else all but the probe's).")
                        ] = None,
    pid: Annotated[int | None, typer.Option(help="External process to attribute (using "
                                            "agent.client: its ring is found in "
                                            "/proc/PID/maps, and must be owned by its "
                                            "user).")] = None,
    ring: Annotated[str | None, typer.Option(help="External latency ring path (a regular "
                                             "file; a symlink is refused).")] = None,
    sample_hz: Annotated[float, typer.Option(help="Collector rounds per second "
                                             f"({MIN_SAMPLE_HZ:g}..{MAX_SAMPLE_HZ:g}).")
                         ] = 100.0,
    sampler: Annotated[str, typer.Option(help="Who reads the hot /proc files: native (a small "
                                         "C reader built on first use with the system's cc; "
                                         "about half the CPU cost), python, or auto (native "
                                         "when it can be built, else python).")] = "auto",
    trace: Annotated[str, typer.Option(help="Kernel events (tracefs) for an exact timeline "
                                       "and breakdown of each attributed spike: auto (where "
                                       "tracefs is mounted and usable, else said as "
                                       "'unsupported: ...' and watch runs without), on (an "
                                       "error where unusable), off, or mount (mount tracefs "
                                       "at /sys/kernel/tracing first when it is not "
                                       "mounted). Needs root.")] = "auto",
    irq_cost: Annotated[str, typer.Option(help="One interrupt's cost to the probe, its "
                                          "sub-µs handler included (entry/exit; in a VM the "
                                          "exit to the hypervisor): with kernel events, each "
                                          "interrupt "
                                          "that hit the probe is charged this in a spike's "
                                          "breakdown. auto (measured on the probe CPUs for "
                                          "~25 ms before watch's own probe starts; not for "
                                          "an external one), off, or a cost in µs.")
                        ] = "auto",
    nice: Annotated[str, typer.Option(help="watch's own priority on the housekeeping CPUs: "
                                      "this nice value for its threads and its sampler's "
                                      "helper, never for the probe (-20 to 19; 0 leaves "
                                      "it). Where the housekeeping CPUs run other busy "
                                      "work, -10 keeps spike records timely; negative "
                                      "values need root (CAP_SYS_NICE).")] = "0",
    threshold_us: Annotated[float | None, typer.Option(help="A sample over this many µs is a "
                                                       "spike (up to 1e9); with --listen "
                                                       "also an exceedance counter.")
                            ] = None,
    k: Annotated[float, typer.Option("--k", help="A sample over k × rolling P50 is a spike.")
                 ] = 3.0,
    flight_us: Annotated[float | None, typer.Option(help="Dump every signal's surrounding "
                                                    "window for spikes over this.")] = None,
    flight_dir: Annotated[str | None, typer.Option(help="Where --flight-us records go "
                                                   "(default ./hftagent-flight; created if "
                                                   "missing, its parent must exist).")] = None,
    spike_log: Annotated[str | None, typer.Option(help="JSONL spike log (appended; its "
                                                  "directory must exist; a regular file, a "
                                                  "FIFO with a reader or a terminal).")] = None,
    duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    perf: Annotated[bool, typer.Option(help="Also stream `perf stat -I` software events.")
                    ] = False,
    listen: Annotated[str | None, typer.Option(help="Serve Prometheus /metrics here "
                                               "(e.g. 127.0.0.1:9877; loopback unless you say "
                                               "otherwise).")] = None,
    web_config_file: Annotated[str | None, typer.Option(
        "--web.config.file", help="TLS and basic auth for --listen: a web config in the "
        "Prometheus exporter-toolkit format (tls_server_config, basic_auth_users with bcrypt "
        "hashes), as node_exporter's --web.config.file; docs/fleet.md.")] = None,
    live: Annotated[bool | None, typer.Option("--live/--no-live", help="Live view (default: "
                                              "when stdout is a terminal).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Summary as JSON on stdout.")] = False,
    p99_budget_us: Annotated[int | None, typer.Option(help="P99 budget exported with --listen "
                                                      "(hftagent_probe_p99_budget_seconds; "
                                                      "the HftP99OverBudget alert).")] = None,
    profile: Annotated[str | None, typer.Option(help="Audit profile for the audit state "
                                                "exported with --listen (run once at start; "
                                                "default hft-cpu).")] = None,
    root: RootOpt = "/",
    procfs: ProcfsOpt = None,
    sysfs: SysfsOpt = None,
) -> None:
    """Attribute every slow probe sample to a named cause, continuously."""
    # Every option that is given is used or refused before anything starts: an empty value,
    # one that applies only with another that is missing (--model without --probe tf,
    # --profile or --p99-budget-us without --listen, --flight-dir without --flight-us), a
    # --ring that is not a latency ring, a --spike-log that cannot be opened: one line, exit 1.
    from agent.defaults import MAX_THRESHOLD_US
    from agent.watch.config import WatchConfig, cpu_plan
    from agent.watch.metrics_feed import MetricsFeed, watch_metrics
    from agent.watch.session import WatchSession
    from collectors.cpu import online_cpus

    host = make_host(root, procfs, sysfs)
    if probe not in ("tf", "numpy", "external"):
        raise fail(f"--probe must be tf, numpy or external, not {probe!r}")
    for name, v in (("--ring", ring), ("--spike-log", spike_log), ("--flight-dir", flight_dir),
                    ("--listen", listen), ("--profile", profile), ("--model", model),
                    ("--variant", variant)):
        if v is not None and not v.strip():
            raise fail(f"{name} is empty")
    if pid is not None or ring is not None:
        probe = "external"
    if probe == "external" and pid is None and ring is None:
        raise fail("--probe external needs --pid or --ring")
    if sampler not in ("auto", "native", "python"):
        raise fail(f"--sampler must be auto, native or python, not {sampler!r}")
    if trace not in ("auto", "on", "off", "mount"):
        raise fail(f"--trace must be auto, on, off or mount, not {trace!r}")
    from agent.watch.attribution.events import parse_irq_cost
    parse_irq_cost(irq_cost)  # (AgentError: one line, exit 1)
    from agent.watch.priority import parse_nice
    nice_n = parse_nice(nice)
    _check_tf_options(probe, model, variant)
    if listen is None:
        for name, v in (("--profile", profile), ("--p99-budget-us", p99_budget_us),
                        ("--web.config.file", web_config_file)):
            if v is not None:
                raise fail(f"{name} is for the metrics of --listen: give --listen too")
    if flight_dir is not None and flight_us is None:
        raise fail("--flight-dir is where --flight-us records go: give --flight-us too")
    import math

    def positive(name: str, v: float | None, above: float = 0.0) -> None:
        # "not v > x" (not "v <= x") so that NaN is refused too; isfinite refuses inf
        if v is not None and not (v > above and math.isfinite(v)):
            raise fail(f"{name} must be a finite number > {above:g}, not {v}")
    if rate == "auto":
        rate_hz = 0.0  # the probe worker picks it after its warm-up
    else:
        try:
            if not rate.isascii():  # float() takes "٣" (any Unicode digit) as 3
                raise ValueError(rate)
            rate_hz = float(rate)
        except ValueError:
            raise fail(f"--rate must be a number or auto, not {rate!r}") from None
        positive("--rate", rate_hz)
        if rate_hz > MAX_RATE_HZ:
            raise fail(f"--rate must be at most {MAX_RATE_HZ:g} starts a second, not {rate}")
    for name, v in (("--sample-hz", sample_hz), ("--duration", duration),
                    ("--threshold-us", threshold_us), ("--flight-us", flight_us)):
        positive(name, v)
    if threshold_us is not None and threshold_us > MAX_THRESHOLD_US:
        # (hftagent probe's bound; the exporter counts samples over it as integer ns)
        raise fail(f"--threshold-us must be at most {MAX_THRESHOLD_US:g} µs, not "
                   f"{threshold_us:g}")
    if not MIN_SAMPLE_HZ <= sample_hz <= MAX_SAMPLE_HZ:
        # the rings hold capacity_s × sample_hz rows per collector: 1e9 Hz is a MemoryError
        raise fail(f"--sample-hz must be in {MIN_SAMPLE_HZ:g}..{MAX_SAMPLE_HZ:g} rounds a "
                   f"second, not {sample_hz:g}")
    positive("--k", k, 1.0)
    if p99_budget_us is not None and p99_budget_us <= 0:
        raise fail("--p99-budget-us must be > 0")
    if pid is not None:
        if pid <= 0 or not host.proc(pid).exists():
            raise fail(f"--pid {pid}: no such process")
    online = online_cpus(host).value or []
    want = _cpu_option("--cpus", cpus, online)
    hk = _cpu_option("--housekeeping", housekeeping, online)
    if ring is not None:
        _check_ring(ring)
    if probe == "external" and want is None and pid is not None:
        import os
        try:
            want = sorted(os.sched_getaffinity(pid))
            if hk is None and len(want) == len(online):
                want = [online[-1]]  # unpinned process: watch the last CPU, keep one free
        except OSError:
            want = None
    want, hk = default_cpus(host, probe, want, hk)
    probe_cpus, hk_cpus = cpu_plan(online, want, hk)
    model = model or "lstm"
    variant = variant or "xla"
    cfg = WatchConfig(probe=probe, model=model, variant=variant, rate_hz=rate_hz,
                      probe_cpus=probe_cpus, housekeeping_cpus=hk_cpus, pid=pid, ring_path=ring,
                      sample_hz=sample_hz,
                      threshold_ns=None if threshold_us is None else round(threshold_us * 1e3),
                      k_p50=k, flight_ns=None if flight_us is None else round(flight_us * 1e3), flight_dir=flight_dir or "hftagent-flight",
                      spike_log=spike_log, duration_s=duration, perf=perf, sampler=sampler,
                      trace=trace, irq_cost=irq_cost, nice=nice_n)
    metrics = exporter = wm = prof = None
    webcfg = None
    if listen is not None:
        from agent.export.server import parse_listen
        from tuning.profiles import load_profile
        parse_listen(listen)  # (AgentError: one line, before anything starts)
        if web_config_file is not None:  # a bad file: one line, before anything starts
            from agent.export.webconfig import load_web_config
            webcfg = load_web_config(web_config_file)
        prof = load_profile(profile or "hft-cpu")
        # the exceedance counters: the fleet's defaults plus this run's --threshold-us
        wm = watch_metrics(threshold_ns=cfg.threshold_ns,
                           source="probe" if probe != "external" else "client",
                           variant=variant if probe == "tf" else "", p99_budget_us=p99_budget_us)
        metrics = MetricsFeed(wm)
    view = None
    if live if live is not None else (sys.stdout.isatty() and not json_out):
        from agent.watch.view import LiveView
        view = LiveView()
        if not view.console.is_terminal:
            # rich would print one stale frame at the end, glued to the summary (and before
            # the JSON with --json): no live view without a terminal.
            print("hftagent: --live needs a terminal on stdout; no live view, the summary "
                  "only", file=sys.stderr)
            view = None
    session = WatchSession(cfg, host, metrics=metrics, view=view,  # exemplars: every record
                           on_record=None if metrics is None else metrics.on_record)
    session.open_outputs()  # --spike-log, --flight-dir: refused here, before anything runs
    if wm is not None:
        from agent.export.server import Exporter
        _set_audit(wm, host, prof, probe_cpus)
        try:
            exporter = Exporter(wm, listen, web_config=webcfg).start()
        except BaseException:
            session.close_outputs()
            raise
        print(f"metrics: {exporter.url}", file=sys.stderr)
        if (warning := exporter.exposure_warning()) is not None:  # beyond loopback
            print(f"hftagent: warning: {warning}", file=sys.stderr)

    def _on_signal(signum, _frame) -> None:
        session.request_stop(signal.Signals(signum).name)

    # SIGTERM (systemctl stop, kill) and SIGINT (Ctrl-C) are a requested stop: the loop ends
    # at its next turn, pending spikes are attributed, the spike log is flushed and closed,
    # the exporter stopped, the summary printed, exit 0 (deploy/systemd/hftagent-watch.service).
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = session.run()
    finally:
        if view is not None:
            view.close()
        if exporter is not None:
            exporter.stop()
        for s, h in old.items():
            signal.signal(s, h)
    summary = session.summary()
    summary["events"] = session.trace.info()
    _collector_signals(session, summary)
    if json_out:
        print(json.dumps(summary, indent=1))
    else:
        _print_summary(summary, spike_log)
    if summary["stopped_by"]:
        print(f"hftagent: stopped by {summary['stopped_by']}"
              + (f"; spike log flushed to {spike_log}" if spike_log else ""), file=sys.stderr)
    if summary["source_error"]:
        print(f"hftagent: error: {summary['source_error']}; spike log kept"
              + (f" at {spike_log}" if spike_log else ""), file=sys.stderr)
    elif summary["output_error"]:
        print(f"hftagent: error: {summary['output_error']}", file=sys.stderr)
    if rc:
        raise typer.Exit(rc)


def default_cpus(host, probe: str, want: list[int] | None, hk: list[int] | None
                 ) -> tuple[list[int] | None, list[int] | None]:
    """The CPUs not given, by the one target rule (tuning/targets.py): the built-in probe
    takes the last target CPU (an external one all of them), the sampler the housekeeping
    CPUs — never another target CPU. Unchanged where the rule cannot be read."""
    if want is not None and hk is not None:
        return want, hk
    from tuning.targets import TargetError, resolve
    try:
        plan = resolve(host)
    except TargetError:
        return want, hk
    if want is None:
        want = [plan.cpus[-1]] if probe != "external" else plan.cpus
    if hk is None and plan.housekeeping and not set(plan.housekeeping) & set(want):
        hk = plan.housekeeping
    return want, hk


def _cpu_option(name: str, spec: str | None, online: list[int]) -> list[int] | None:
    """A CPU-list option: None when not given; given, parsed and checked as audit/tune/run
    check ``--cpus`` (:func:`collectors.parsers.parse_cpu_option`: never empty — an option
    that is given is never silently the default —, every CPU online; where the online CPUs
    could not be read, the CPUs watch may run on)."""
    import os

    from collectors.parsers import parse_cpu_option
    if spec is None:
        return None
    try:
        return parse_cpu_option(spec, online or sorted(os.sched_getaffinity(0)))
    except ValueError as exc:
        raise fail(str(exc).replace("--cpus", name, 1)) from None


def _check_tf_options(probe: str, model: str | None, variant: str | None) -> None:
    """--model and --variant name something the TF probe can build (checked here, not after
    the worker's TF import), and are given only with --probe tf."""
    if probe != "tf":
        for name, v in (("--model", model), ("--variant", variant)):
            if v is not None:
                raise fail(f"{name} is for --probe tf, not --probe {probe}")
        return
    import os

    from agent.probe.models import BUILTINS
    from agent.probe.variants import VARIANTS
    if variant is not None and variant not in VARIANTS:
        raise fail(f"--variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
    if model is not None and model not in BUILTINS and not os.path.exists(model):
        raise fail(f"--model {model!r}: neither a built-in model ({', '.join(BUILTINS)}) nor "
                   "an existing path")


def _check_ring(ring: str) -> None:
    """A --ring that is there must be a latency ring now (a directory, a FIFO, a device, a
    symlink, a bad header: refused before anything starts); one that is not there yet must
    be able to appear (its directory exists): watch waits a little for it."""
    import os
    from pathlib import Path

    from agent.client import RingError, RingReader
    parent = Path(ring).parent
    if not parent.is_dir():
        raise fail(f"--ring {ring}: directory {parent} does not exist")
    if not os.path.lexists(ring):
        return
    try:
        RingReader(ring).close()
    except RingError as exc:
        raise fail(f"--ring: {exc}") from None


def _collector_signals(session, summary: dict) -> None:
    """Add to each working collector's summary entry the signals it found unsupported
    (``unsupported_signals``: perf's hardware events in a VM without a PMU, cpufreq ...),
    and to perf's its counts over the run (``totals``)."""
    smp = session.sampler
    if smp is None:
        return
    for name, entry in summary["collectors"].items():
        c = smp.collector(name)
        if c is None:
            continue
        unsupported = getattr(c, "unsupported", None)
        if unsupported:
            entry["unsupported_signals"] = dict(sorted(unsupported.items()))
        if name == "perf" and hasattr(c, "totals"):
            entry["totals"] = c.totals()


def _set_audit(wm, host, profile, probe_cpus: list[int]) -> None:
    """Run the audit once (≈ 0.2 s) with the loaded ``profile`` so /metrics carries
    hftagent_audit_check; a failing audit is a warning, never a reason not to watch (a
    profile that cannot be loaded was refused before)."""
    try:
        from tuning.audit import run_audit
        report = run_audit(host, profile, cpus=",".join(map(str, probe_cpus)))
        wm.set_audit(report.findings)
    except Exception as exc:  # noqa: BLE001 - metrics are best effort
        print(f"warning: audit for /metrics failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _print_summary(s: dict, spike_log: str | None) -> None:
    at = "" if str(s["source"]).startswith("external") else f" at {s['rate_hz']:g}/s"
    print(f"watched {s['source']} (pid {s['pid']}) on CPU "
          f"{','.join(map(str, s['probe_cpus']))}{at} for {s['duration_s']} s: "
          f"{s['samples']} samples, P50 {s['p50_us']} µs, P99 {s['p99_us']} µs, "
          f"P99.9 {s['p999_us']} µs, max {s['max_us']} µs")
    print(f"spikes: {s['spikes']} ({s['attributed']} attributed"
          + (f", {s['queued']} of them queued behind a slow sample and given its cause"
             if s.get("queued") else "")
          + (f", {s['inherited']} inheriting the cause of a spike ms away (over the "
             "attribution rate limit or step budget)" if s.get("inherited") else "")
          + (f"; {s['not_attributed']} not attributed: rate limit, backlog or end of run, "
             "each logged with its reason" if s['not_attributed'] else "") + ")")
    for c, d in s["causes"].items():
        top = f"  e.g. {'; '.join(d['top'])}" if d["top"] else ""
        print(f"  {c:<20} {d['count']:>6}  {100 * d['share']:5.1f} %{top}")
    delay = s["attribution_delay_ms"]
    if delay["p50"] is not None:
        print(f"spike → attributed record: P50 {delay['p50']:.0f} ms, max {delay['max']:.0f} ms")
    bad = {n: c for n, c in s["collectors"].items() if c["state"] != "ok"}
    if bad:
        print("unsupported collectors: " + "; ".join(f"{n} ({c['reason']})"
                                                     for n, c in bad.items()))
    perf = s["collectors"].get("perf", {})
    if perf.get("state") == "ok":
        counts = ", ".join(f"{v:.0f} {_event(k)}" for k, v in perf.get("totals", {}).items())
        hw = ", ".join(_event(k) for k in perf.get("unsupported_signals", {}))
        print(f"perf (pid {s['pid']}): {counts or 'nothing counted'}"
              + (f"; not supported here: {hw}" if hw else ""))
    smp = s["sampler"]
    if smp:
        split = ""
        if smp.get("helper_cpu_share") is not None:
            split = (f" (reader {100 * smp['helper_cpu_share']:.2f} %, replay "
                     f"{100 * (smp['drain_cpu_share'] or 0):.2f} %)")
        print(f"sampler ({smp['mode']}) on CPU {smp['pinned_to']}: {smp['rounds']} rounds, "
              f"{smp['cpu_us_per_round']} µs CPU/round, "
              f"{100 * (smp['cpu_share_of_one_cpu'] or 0):.2f} % of one CPU{split}"
              + (f"; {smp['note']}" if smp.get("note") else ""))
        red = smp.get("reduced_by_events") or {}
        if red:  # the polls kernel events cover, slowed while they run
            print("polled less while kernel events run: " + ", ".join(
                f"{k} {v['from_hz']:g} → {v['to_hz']:g} Hz" for k, v in red.items()))
    ev = s.get("events") or {}
    if ev.get("active"):
        rate = ", ".join(f"CPU {c} {r}/s" for c, r in ev.get("rate_per_cpu", {}).items())
        print(f"kernel events: {ev['windows']} spike windows read"
              + (f" ({ev['incomplete']} incomplete)" if ev.get("incomplete") else "")
              + (f", {ev['mean_read_us']} µs each" if ev.get("mean_read_us") else "")
              + (f"; {rate}" if rate else "") + (f"; {ev['lost']} lost" if ev.get("lost")
                                                  else ""))
    for w in s["warnings"]:
        print(f"warning: {w}")
    if s["flight_records"]:
        print(f"flight records: {len(s['flight_records'])} in "
              f"{s['flight_records'][0].rsplit('/', 1)[0]}")
    if spike_log:
        print(f"spike log: {spike_log}")


def _event(signal_name: str) -> str:
    """``perf.123.context_switches_total`` → ``context-switches`` (perf's event name)."""
    return signal_name.split(".")[-1].removesuffix("_total").replace("_", "-")
