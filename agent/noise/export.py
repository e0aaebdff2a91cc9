"""Per-CPU noise as Prometheus series, for node_exporter's textfile collector
(``hftagent cpus --textfile DIR`` writes DIR/hftagent_cpu_noise.prom atomically).

Labels are bounded: ``cpu`` (one series per scanned CPU), and on
``hftagent_cpu_noise_cause_ratio`` (scans attributed from kernel events) ``cause``, one of
the fixed entity kinds or ``hw_or_hypervisor`` (agent.noise.events.KINDS), so a fleet can
compare boxes by their noise fingerprint (deploy/grafana: "CPU noise per box") without a
cardinality blow-up. Base units: seconds lost per second, gaps per second, gap seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

TEXTFILE_NAME = "hftagent_cpu_noise.prom"


def families(doc: dict, at_unix_s: float) -> Iterator[GaugeMetricFamily]:
    """Families from ``hftagent cpus --json``'s document."""
    spec = (
        ("hftagent_cpu_noise_ratio", "Share of a pinned busy loop's time lost to other work "
         "(seconds per second) during the last noise scan", "noise_us_per_s", 1e-6),
        ("hftagent_cpu_noise_gaps_per_second", "Clock gaps over the threshold per second "
         "during the last noise scan", "gaps_per_s", 1.0),
        ("hftagent_cpu_noise_p999_gap_seconds", "P99.9 of the gap lengths in the last noise "
         "scan", "p999_gap_ns", 1e-9),
        ("hftagent_cpu_noise_max_gap_seconds", "Longest gap in the last noise scan",
         "max_gap_ns", 1e-9),
    )
    rec = set(doc.get("recommended") or [])
    rows = [r for r in doc.get("cpus", []) if r.get("error") is None]
    for name, help_, key, scale in spec:
        g = GaugeMetricFamily(name, help_, labels=["cpu"])
        for r in rows:
            if r.get(key) is not None:
                g.add_metric([str(r["cpu"])], float(r[key]) * scale)
        yield g
    caused = [r for r in rows if r.get("events_by_kind_us_per_s") is not None]
    if caused:
        # cause: the entity kind (irq, softirq, timer, ipi, vector, workqueue, task, idle)
        # or hw_or_hypervisor, a fixed set (agent.noise.events.KINDS): never a comm or IRQ
        # name, so the series stay bounded
        from agent.noise.events import KINDS
        g = GaugeMetricFamily("hftagent_cpu_noise_cause_ratio", "Share of a pinned busy "
                              "loop's time taken by each kind of kernel-event cause "
                              "(seconds per second) during the last noise scan "
                              "(hftagent cpus --trace)", labels=["cpu", "cause"])
        for r in caused:
            for kind, us in r["events_by_kind_us_per_s"].items():
                if kind in KINDS:
                    g.add_metric([str(r["cpu"]), kind], float(us) * 1e-6)
        yield g
    g = GaugeMetricFamily("hftagent_cpu_noise_recommended", "1 when the last noise scan "
                          "recommends this CPU for inference, else 0", labels=["cpu"])
    for r in rows:
        g.add_metric([str(r["cpu"])], 1.0 if r["cpu"] in rec else 0.0)
    yield g
    yield GaugeMetricFamily("hftagent_cpu_noise_scan_timestamp_seconds",
                            "Unix time of the last noise scan", value=at_unix_s)
