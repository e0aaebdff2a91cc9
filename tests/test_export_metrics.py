"""WatchMetrics: histogram, exceedances, window quantiles, bounded labels, thread safety."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from agent.export.metrics import (
    CAUSES,
    GAUGES,
    MAX_AUDIT_CHECKS,
    MAX_COLLECTORS,
    WatchMetrics,
)
from agent.probe.stats import nearest_rank_index
from tuning.findings import Finding, Status

MS = 1_000_000


def bucket_count(s, le_s: float) -> int:
    return s.bucket_cumulative[s.bucket_bounds_s.index(le_s)]


def test_buckets_span_10us_to_100ms_and_include_thresholds():
    m = WatchMetrics(thresholds_ns=(750_000, 4_321_000))
    s = m.snapshot()
    assert s.bucket_bounds_s[0] == pytest.approx(10e-6)
    assert s.bucket_bounds_s[-1] == pytest.approx(0.1)
    assert 4321e-6 in s.bucket_bounds_s and 750e-6 in s.bucket_bounds_s
    assert list(s.bucket_bounds_s) == sorted(s.bucket_bounds_s)
    assert len(s.bucket_cumulative) == len(s.bucket_bounds_s) + 1


def test_exceedance_is_strictly_over_the_threshold():
    m = WatchMetrics(thresholds_ns=(500_000, 1_000_000, 5_000_000))
    for ns in (5 * MS, 5 * MS + 1, 1 * MS, 400_000, 200 * MS):
        m.observe(ns)
    s = m.snapshot()
    assert s.count == 5
    assert s.exceedances == {500: 4, 1000: 3, 5000: 2}
    # consistent with the histogram, so rules may use either
    for t, n in s.exceedances.items():
        assert n == s.count - bucket_count(s, t / 1e6)
    assert s.bucket_cumulative[-1] == 5
    assert s.bucket_cumulative[-2] == 4  # 200 ms is above the top finite bucket
    assert s.sum_s == pytest.approx((5 * MS * 2 + 1 + MS + 400_000 + 200 * MS) / 1e9)


def test_quantiles_are_nearest_rank_and_only_claimed_with_enough_samples():
    rng = np.random.default_rng(7)
    lat = rng.integers(100_000, 3 * MS, size=7000)
    m = WatchMetrics()
    for v in lat[:600]:
        m.observe(int(v))
    s = m.snapshot()
    assert s.window_samples == 600
    assert set(s.quantiles) == {0.5}  # 600 < 662: no P99 claim
    m2 = WatchMetrics()
    for v in lat:
        m2.observe(int(v))
    s2 = m2.snapshot()
    assert set(s2.quantiles) == {0.5, 0.99, 0.999}
    srt = np.sort(lat)
    for q, got in s2.quantiles.items():
        # the probe's own nearest-rank definition (exact: P99.9 of 7,000 is rank 6,993, where
        # numpy's float arithmetic picks 6,994)
        want = srt[nearest_rank_index(round(q * 100, 3), lat.size)] / 1e9
        assert got == want, q
    assert s2.quantiles[0.999] == srt[6992] / 1e9


def test_window_forgets_old_samples_by_time_and_capacity():
    m = WatchMetrics(window_s=0.2, quantile_refresh_s=0.0)
    for _ in range(100):
        m.observe(9 * MS)
    time.sleep(0.3)
    for _ in range(50):
        m.observe(1 * MS)
    s = m.snapshot()
    assert s.window_samples == 50
    assert s.quantiles[0.5] == pytest.approx(1e-3)
    assert s.count == 150  # counters never forget

    m = WatchMetrics(window_capacity=1024, quantile_refresh_s=0.0)
    for i in range(3000):
        m.observe(i * 1000)
    s = m.snapshot()
    assert s.window_samples == 1024
    newest = np.arange(3000 - 1024, 3000) * 1000
    assert s.quantiles[0.5] == pytest.approx(
        np.percentile(newest, 50, method="inverted_cdf") / 1e9)


def test_quantiles_are_cached_between_refreshes():
    m = WatchMetrics(quantile_refresh_s=60.0)
    for _ in range(100):
        m.observe(1 * MS)
    assert m.snapshot().quantiles[0.5] == pytest.approx(1e-3)
    for _ in range(1000):
        m.observe(3 * MS)
    s = m.snapshot()
    assert s.count == 1100  # counters are live ...
    assert s.quantiles[0.5] == pytest.approx(1e-3)  # ... the window quantiles are cached


def test_observe_many_matches_observe():
    rng = np.random.default_rng(1)
    lat = rng.integers(1_000, 150 * MS, size=5000)
    a, b = WatchMetrics(), WatchMetrics()
    for v in lat:
        a.observe(int(v))
    b.observe_many(lat[:1234])
    b.observe_many(lat[1234:])
    b.observe_many(np.array([], dtype=np.int64))
    sa, sb = a.snapshot(), b.snapshot()
    assert sa.bucket_cumulative == sb.bucket_cumulative
    assert sa.exceedances == sb.exceedances
    assert sa.sum_s == sb.sum_s
    assert sa.quantiles == sb.quantiles


def test_observe_many_larger_than_the_window_wraps():
    m = WatchMetrics(window_capacity=1024)
    m.observe(1)
    m.observe_many(np.arange(5000, dtype=np.int64) * 1000)
    s = m.snapshot()
    assert s.count == 5001 and s.window_samples == 1024
    assert s.quantiles[0.5] == pytest.approx(
        np.percentile(np.arange(5000 - 1024, 5000) * 1000, 50, method="inverted_cdf") / 1e9)


def test_concurrent_writers_and_readers_lose_nothing():
    m = WatchMetrics(quantile_refresh_s=0.0)
    stop = threading.Event()
    bad: list[str] = []

    def reader():
        while not stop.is_set():
            s = m.snapshot()
            if s.bucket_cumulative[-1] != s.count:
                bad.append(f"{s.bucket_cumulative[-1]} != {s.count}")

    def writer(k):
        for i in range(20_000):
            m.observe(((i * 7919 + k) % 9000) * 1000)
            if i % 1000 == 0:
                m.spike(CAUSES[i % len(CAUSES)])

    r = threading.Thread(target=reader)
    r.start()
    ws = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    stop.set()
    r.join()
    s = m.snapshot()
    assert not bad
    assert s.count == 80_000
    assert sum(s.spikes.values()) == 80


def test_spikes_unknown_cause_counts_as_other():
    m = WatchMetrics()
    m.spike("irq")
    m.spike("irq")
    m.spike("cosmic_rays")
    m.spike("")
    s = m.snapshot()
    assert set(s.spikes) == set(CAUSES)
    assert s.spikes["irq"] == 2 and s.spikes["other"] == 2


def test_collectors_bounded():
    m = WatchMetrics()
    m.set_collector("cpu", True, 0.001)
    m.set_collector("cpu", False, 0.002)
    s = m.snapshot()
    assert s.collectors["cpu"].success is False and s.collectors["cpu"].duration_s == 0.002
    for i in range(MAX_COLLECTORS + 5):
        m.set_collector(f"c{i}", True, 0.0)
    s = m.snapshot()
    assert len(s.collectors) == MAX_COLLECTORS
    assert s.dropped["collector"] == 6
    with pytest.raises(ValueError):
        m.set_collector('cpu"} 1\nevil', True, 0.0)


def test_set_collector_result_from_run_collector():
    from collectors.base import Availability, run_collector

    class Broken:
        name = "irq"

        def available(self):
            return Availability.yes()

        def sample(self):
            raise OSError("gone")

        def close(self):
            pass

    m = WatchMetrics()
    m.set_collector_result(run_collector(Broken()))
    c = m.snapshot().collectors["irq"]
    assert c.success is False and 0 <= c.duration_s < 1


def test_audit_replaced_and_bounded():
    m = WatchMetrics()
    assert m.snapshot().audit is None
    m.set_audit([Finding("cpu.governor", "cpu", "Governor", Status.FAIL),
                 Finding("irq.balance", "irq", "irqbalance", Status.OK)])
    s = m.snapshot()
    assert s.audit == {"cpu.governor": "fail", "irq.balance": "ok"}
    assert s.audit_unix_s == pytest.approx(time.time(), abs=5)
    m.set_audit([Finding("cpu.governor", "cpu", "Governor", Status.PENDING_REBOOT)])
    assert m.snapshot().audit == {"cpu.governor": "pending-reboot"}
    m.set_audit([Finding(f"x.c{i}", "x", "t", Status.OK) for i in range(MAX_AUDIT_CHECKS + 3)])
    s = m.snapshot()
    assert len(s.audit) == MAX_AUDIT_CHECKS and s.dropped["audit"] == 3
    with pytest.raises(ValueError):
        m.set_audit([Finding("Bad Id!", "x", "t", Status.OK)])


def test_set_gauge_allowlist_and_none_removes():
    m = WatchMetrics()
    m.set_gauge("cpu_frequency_hertz", 2.4e9, cpu=3)
    m.set_gauge("gpu_clock_hertz", 1.98e9, gpu=0, clock="sm")
    m.set_gauge("pcie_link_degraded", 1, device="0000:17:00.0")
    s = m.snapshot()
    assert s.gauges["cpu_frequency_hertz"] == {("3",): 2.4e9}
    assert s.gauges["gpu_clock_hertz"] == {("0", "sm"): 1.98e9}
    m.set_gauge("cpu_frequency_hertz", None, cpu=3)  # unreadable now: absent, never 0
    m.set_gauge("pcie_link_degraded", float("nan"), device="0000:17:00.0")
    s = m.snapshot()
    assert s.gauges["cpu_frequency_hertz"] == {} and s.gauges["pcie_link_degraded"] == {}
    with pytest.raises(ValueError, match="unknown gauge"):
        m.set_gauge("load_average", 1.0)
    with pytest.raises(ValueError, match="labels must be"):
        m.set_gauge("cpu_frequency_hertz", 1.0, cpu=1, pid=7)
    for bad in ({"cpu": "-1"}, {"cpu": "all"}, {"cpu": "01"}):
        with pytest.raises(ValueError, match="bad cpu"):
            m.set_gauge("cpu_frequency_hertz", 1.0, **bad)
    with pytest.raises(ValueError, match="bad clock"):
        m.set_gauge("gpu_clock_hertz", 1.0, gpu=0, clock="shader")
    with pytest.raises(ValueError, match="bad device"):
        m.set_gauge("pcie_link_degraded", 1.0, device="17:00.0")
    assert set(GAUGES) >= {"cpu_frequency_hertz", "gpu_clock_hertz", "gpu_clock_event_reason",
                           "pcie_link_degraded"}


def test_gauge_series_bound(monkeypatch):
    import agent.export.metrics as mod
    monkeypatch.setattr(mod, "MAX_SERIES_PER_GAUGE", 4)
    m = WatchMetrics()
    for cpu in range(6):
        m.set_gauge("cpu_frequency_hertz", 1e9, cpu=cpu)
    m.set_gauge("cpu_frequency_hertz", 2e9, cpu=0)  # updating an existing series still works
    s = m.snapshot()
    assert len(s.gauges["cpu_frequency_hertz"]) == 4
    assert s.gauges["cpu_frequency_hertz"][("0",)] == 2e9
    assert s.dropped["cpu_frequency_hertz"] == 2


def test_gpu_clock_event_reasons_decoded():
    m = WatchMetrics()
    m.set_gpu_clock_event_reasons(1, 0x1 | 0x40)  # idle + hw thermal slowdown
    g = m.snapshot().gauges["gpu_clock_event_reason"]
    assert g[("1", "gpu_idle")] == 1.0 and g[("1", "hw_thermal_slowdown")] == 1.0
    assert g[("1", "hw_slowdown")] == 0.0 and g[("1", "hw_power_brake_slowdown")] == 0.0
    assert sum(g.values()) == 2.0
    m.set_gpu_clock_event_reasons(1, None)
    assert m.snapshot().gauges["gpu_clock_event_reason"] == {}


def test_probe_up_and_last_sample_time():
    m = WatchMetrics()
    s = m.snapshot()
    assert s.probe_up is False and s.last_sample_unix_s is None
    m.probe_up(True)
    m.observe(MS)
    s = m.snapshot()
    assert s.probe_up is True
    assert s.last_sample_unix_s == pytest.approx(time.time(), abs=1.0)


def test_constructor_validates():
    with pytest.raises(ValueError):
        WatchMetrics(thresholds_ns=())
    with pytest.raises(ValueError):
        WatchMetrics(thresholds_ns=(0,))
    with pytest.raises(ValueError):
        WatchMetrics(variant='x"y')
    assert WatchMetrics(thresholds_ns=(5_000_000, 500_000, 500_000)).thresholds_us == (500, 5000)


def test_thresholds_outside_1ns_to_1e9_us_are_refused():
    for bad in (float("nan"), float("inf"), -1, 0.1, 1e12 + 1, 2.5):  # (whole ns only)
        with pytest.raises(ValueError, match="thresholds_ns"):
            WatchMetrics(thresholds_ns=(bad,))


def test_the_watch_threshold_is_an_exceedance_counter_in_the_exporter_output():
    """`hftagent watch --threshold-us` reaches WatchMetrics: the exporter counts the samples
    over the threshold watch logs spikes for, next to the fleet's 500/1,000/5,000 µs (the
    counters once stayed at those three whatever the threshold). A fractional threshold is
    kept to the ns and labelled as given."""
    from prometheus_client.parser import text_string_to_metric_families

    from agent.export.server import make_registry, render
    from agent.watch.metrics_feed import MetricsFeed, watch_metrics
    lat = np.array([2_400_000, 2_500_000, 2_500_400, 2_500_600, 6_000_000], dtype=np.int64)
    for thr, label, over in ((2500.0, "2500", 3), (2500.5, "2500.5", 2), (None, None, None),
                             (5000.0, "5000", 1)):
        wm = watch_metrics(threshold_ns=thr and round(thr * 1000), source="probe", variant="xla", p99_budget_us=None)
        MetricsFeed(wm).observe_many(lat)
        body = render(make_registry(wm))[0].decode()
        exc = {s.labels["threshold_us"]: s.value for f in text_string_to_metric_families(body)
               for s in f.samples if s.name == "hftagent_probe_exceedances_total"}
        assert set(exc) == {"500", "1000", "5000"} | ({label} if label else set()), exc
        assert exc["500"] == 5 and exc["1000"] == 5 and exc["5000"] == 1
        if label:
            assert exc[label] == over, (thr, exc)
            # the threshold is a histogram bound too: count − bucket{le=threshold} = over
            le = {s.labels["le"]: s.value for f in text_string_to_metric_families(body)
                  for s in f.samples if s.name == "hftagent_probe_latency_seconds_bucket"}
            assert 5 - le[repr(thr / 1e6)] == over


def test_exemplar_lands_on_the_bucket_of_its_latency_latest_wins():
    """A logged spike marks the bucket its latency falls in (le inclusive, as observe()):
    the latest one per bucket, the others untouched; +Inf takes what is over the top bound;
    bad ids and latencies are refused."""
    m = WatchMetrics(thresholds_ns=(500_000,))
    bounds = m.snapshot().bucket_bounds_s
    assert all(e is None for e in m.snapshot().bucket_exemplars)
    m.exemplar("7", 8 * MS, 1_700_000_000.5)          # 8 ms: le=0.01
    m.exemplar("8", 1 * MS)                           # exactly 1 ms: le=0.001
    m.exemplar("9", 9 * MS, 1_700_000_001.0)          # same bucket as 7: replaces it
    m.exemplar("10", 500 * MS)                        # over 100 ms: +Inf
    ex = m.snapshot().bucket_exemplars
    assert len(ex) == len(bounds) + 1
    by_le = {("+Inf" if i == len(bounds) else bounds[i]): e for i, e in enumerate(ex) if e}
    assert by_le == {0.01: ("9", 0.009, 1_700_000_001.0), 0.001: ("8", 0.001, None),
                     "+Inf": ("10", 0.5, None)}
    for bad in ("", "x" * 65, "a\nb"):
        with pytest.raises(ValueError):
            m.exemplar(bad, MS)
    with pytest.raises(ValueError):
        m.exemplar("1", -1)
    assert m.snapshot().bucket_exemplars == ex  # nothing changed by the refused ones


def test_own_cost_is_bounded_validated_and_never_goes_back():
    """set_own_cost (agent/watch/budget.py's figures): part names are label-safe and bounded,
    totals only grow (counters), the charged CPU is the cost per call × the samples."""
    m = WatchMetrics()
    m.observe_many(np.full(1000, 100_000, dtype=np.int64))
    m.set_own_cost({"sampler": 3_000_000, "events": 2_000_000}, budget_share=0.01,
                   exact=4, skipped=2, shed=5, cost_us_per_call=1.8)
    m.set_own_cost({"sampler": 1_000_000, "events": 5_000_000}, budget_share=0.01,
                   exact=3, skipped=6, shed=1, cost_us_per_call=1.8)  # an older reading: kept
    s = m.snapshot()
    assert dict(s.own_cpu_s) == {"events": 0.005, "sampler": 0.003}
    assert dict(s.budget_spikes) == {"exact": 4, "skipped": 6, "shed": 5}
    assert s.cpu_budget_ratio == 0.01
    assert s.attach_cost_per_call_s == pytest.approx(1.8e-6)
    assert s.attach_charged_cpu_s == pytest.approx(1.8e-3)  # 1000 calls
    for bad in ({"Bad-Name": 1}, {"x": -1}):
        with pytest.raises(ValueError):
            m.set_own_cost(bad, budget_share=None)
    for share in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError):
            m.set_own_cost({}, budget_share=share)
    with pytest.raises(ValueError):
        m.set_own_cost({}, budget_share=None, cost_us_per_call=float("nan"))
    with pytest.raises(ValueError):
        m.set_own_cost({}, budget_share=None, shed=-1)
    m.set_own_cost({f"p{i}": 1 for i in range(20)}, budget_share=None)
    assert len(m.snapshot().own_cpu_s) == 16 and m.snapshot().dropped["own_cpu_part"] == 6
    fresh = WatchMetrics().snapshot()  # nothing set: no series, no budget, nothing charged
    assert fresh.own_cpu_s == () and fresh.cpu_budget_ratio is None
    assert fresh.attach_charged_cpu_s is None


def test_own_cost_series_count_matches_docs_fleet():
    """docs/fleet.md's series table: watch's own cost is 11 series (7 parts, the budget, 3
    decisions), 13 with --attach (the cost per call and the charged CPU)."""
    from agent.export.server import make_registry, render
    from agent.watch.budget import PARTS

    def series(m: WatchMetrics) -> int:
        body = render(make_registry(m))[0].decode()
        return len([ln for ln in body.splitlines() if ln and not ln.startswith("#")])
    base = series(WatchMetrics())
    m = WatchMetrics()
    m.set_own_cost(dict.fromkeys(PARTS, 1), budget_share=0.01, exact=1, skipped=0)
    assert series(m) == base + 11
    m.set_own_cost(dict.fromkeys(PARTS, 1), budget_share=0.01, cost_us_per_call=1.8)
    assert series(m) == base + 13
