"""Run one checked ``hftagent watch`` request (:func:`run_watch`): the composition of the
session with what surrounds it — the exporter (``--listen``) and the metrics it reads, the
live view, the stop signals — and the summary at the end.

SIGTERM (systemctl stop, kill) and SIGINT (Ctrl-C) are a requested stop: the loop ends at
its next turn, pending spikes are attributed, the spike log is flushed and closed, the
exporter stopped, and the summary comes back with exit code 0
(deploy/systemd/hftagent-watch.service).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from agent.watch import session as session_mod  # (its WatchSession looked up at each run)
from agent.watch.metrics_feed import MetricsFeed, watch_metrics
from agent.watch.options import WatchRequest
from collectors.host import Host


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_watch(req: WatchRequest, host: Host, *, say: Callable[[str], None] = _stderr,
              on_phase: Callable[[str], None] | None = None) -> tuple[int, dict]:
    """(exit code, summary) of the run ``req`` asks for. ``say``: the lines for the person
    while it runs (the metrics URL, an exposure warning, no live view without a terminal);
    ``on_phase``: told each start-up phase. A spike log or flight directory that cannot be
    opened, or an exporter that cannot bind, is an error before anything runs."""
    cfg = req.cfg
    wm = watch_metrics(threshold_ns=cfg.threshold_ns, source=cfg.source.exporter_label,
                       variant=cfg.source.exporter_variant,
                       service=cfg.source.exporter_service,
                       p99_budget_us=req.p99_budget_us) if req.listen is not None else None
    metrics = MetricsFeed(wm) if wm is not None else None
    view = _live_view(req, say)
    session = session_mod.WatchSession(cfg, host, metrics=metrics, view=view, on_phase=on_phase,
                           on_record=None if metrics is None else metrics.on_record)
    session.open_outputs()  # --spike-log, --flight-dir: refused here, before anything runs
    exporter = None
    try:
        if wm is not None:
            exporter = _start_exporter(req, wm, host, say)
        with _stop_signals(session):
            rc = session.run()
    finally:
        if view is not None:
            view.close()
        if exporter is not None:
            exporter.stop()
        session.close_outputs()
    summary = session.summary()
    summary["events"] = session.trace.info()
    _own_cpu(session, summary)
    _collector_signals(session, summary)
    return rc, summary


def _own_cpu(session, summary: dict) -> None:
    """What watch's own work costs, % of one CPU: the event reads' CPU (``events``) and
    ``own_cpu_share_of_one_cpu``, the sampler's plus theirs (issue #26's budget: ≤ 1.5 %);
    the whole, by part, is ``own_cpu`` (agent/watch/budget.py), and a warning says how many
    spikes the CPU budget left without exact attribution."""
    dur = summary.get("duration_s") or 0.0
    ev = summary["events"]
    reads = session.trace.read_cpu_ns / 1e9 / dur if dur and ev.get("active") else 0.0
    if ev.get("active"):
        ev["read_cpu_share_of_one_cpu"] = round(reads, 5) if dur else None
    smp = summary.get("sampler") or {}
    if smp.get("cpu_share_of_one_cpu") is not None:
        summary["own_cpu_share_of_one_cpu"] = round(smp["cpu_share_of_one_cpu"] + reads, 4)
    budget = (summary.get("own_cpu") or {}).get("budget") or {}
    skipped, shed = budget.get("skipped_exact_attributions"), budget.get("shed_polled_rules")
    if skipped or shed:
        summary["warnings"].append(
            f"watch's CPU budget ({budget['pct_of_one_cpu']:g} % of one CPU, --cpu-budget) "
            f"was spent for {(skipped or 0) + (shed or 0)} spike(s): recorded with the polled "
            "rules' cause, without their kernel-event window"
            + (f" ({shed} with the cause of a spike ms away on the same CPU: its always-on "
               "parts spent the budget)" if shed else "")
            + " (own_cpu.by_part says where watch's CPU went)")


def _live_view(req: WatchRequest, say: Callable[[str], None]):
    """The live view, when asked for (default: when stdout is a terminal, not with --json);
    never without a terminal: rich would print one stale frame at the end, glued to the
    summary (and before the JSON with --json)."""
    if not (req.live if req.live is not None else (sys.stdout.isatty() and not req.json_out)):
        return None
    from agent.watch.view import LiveView
    view = LiveView()
    if not view.console.is_terminal:
        say("hftagent: --live needs a terminal on stdout; no live view, the summary only")
        return None
    return view


def _start_exporter(req: WatchRequest, wm, host: Host, say: Callable[[str], None]):
    """The audit once (its state on /metrics), then the /metrics server: its URL said, and a
    warning when it listens beyond loopback."""
    from agent.export.server import Exporter
    _set_audit(wm, host, req.profile, req.cfg.probe_cpus, say)
    exporter = Exporter(wm, req.listen, web_config=req.web_config).start()
    say(f"metrics: {exporter.url}")
    if (warning := exporter.exposure_warning()) is not None:  # beyond loopback
        say(f"hftagent: warning: {warning}")
    return exporter


class _stop_signals:
    """SIGTERM and SIGINT ask ``session`` to stop (:meth:`WatchSession.request_stop`) while
    the block runs; the previous handlers come back after it."""

    def __init__(self, session: session_mod.WatchSession) -> None:
        self.session = session
        self.old: dict = {}

    def __enter__(self) -> None:
        def on_signal(signum, _frame) -> None:
            self.session.request_stop(signal.Signals(signum).name)
        self.old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}

    def __exit__(self, *exc: object) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def _collector_signals(session: session_mod.WatchSession, summary: dict) -> None:
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


def _set_audit(wm, host: Host, profile, probe_cpus: list[int],
               say: Callable[[str], None]) -> None:
    """Run the audit once (≈ 0.2 s) with the loaded ``profile`` so /metrics carries
    hftagent_audit_check; a failing audit is a warning, never a reason not to watch (a
    profile that cannot be loaded was refused before)."""
    try:
        from tuning.audit import run_audit
        report = run_audit(host, profile, cpus=",".join(map(str, probe_cpus)))
        wm.set_audit(report.findings)
    except Exception as exc:  # noqa: BLE001 - metrics are best effort
        say(f"warning: audit for /metrics failed: {type(exc).__name__}: {exc}")
