"""bench/events_p99_ab.py: blocking, the sign-test interval, the A/B and A/A statistics and
the instance's enable files, on synthetic data and a fake instance tree (no tracefs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.trace.instance import CpuStats
from bench.abstats import VERDICT_DIFFERS, VERDICT_INCONCLUSIVE
from bench.events_p99_ab import (
    InstanceEvents,
    analyse,
    assign,
    block_order,
    median_ratio,
    off_leaks,
    pair_ratios,
    samples_per_block,
    sign_ci,
    sign_test_p,
    stalls,
    usable_pairs,
    written,
)

STATS = """entries: {e}
overrun: {o}
commit overrun: 0
bytes: 1234
oldest event ts:  100.000001
now ts:  101.500000
dropped events: 0
read events: {r}
"""


def blocks(seed: int, pairs: int = 120, n: int = 900, shift: float = 1.0,
           drift_sd: float = 0.2) -> tuple[dict, dict]:
    """Per-pair latency blocks (ns): a drift shared by the pair, ``shift`` on the on side."""
    rng = np.random.default_rng(seed)
    on, off = {}, {}
    for i, d in enumerate(np.exp(rng.normal(0, drift_sd, pairs))):
        on[i] = rng.lognormal(np.log(4e5), 0.3, n) * d * shift
        off[i] = rng.lognormal(np.log(4e5), 0.3, n) * d
    return on, off


def test_block_order_is_seeded_and_mixed():
    a = block_order(120, np.random.default_rng(17))
    assert a == block_order(120, np.random.default_rng(17))
    assert set(a) == {("on", "off"), ("off", "on")}
    assert all(sorted(p) == ["off", "on"] for p in a)
    assert 40 < sum(p[0] == "on" for p in a) < 80


def test_samples_per_block_meets_the_p99_rule_at_the_defaults():
    assert samples_per_block(1000, 1.0, 0.1) == 900 >= 662
    assert samples_per_block(500, 1.0, 0.1) == 450 < 662  # events_ab's rate is not enough
    assert samples_per_block(1000, 0.1, 0.2) == 0


def test_assign_keeps_samples_by_start_in_half_open_windows():
    start = np.array([50, 10, 30, 20, 40, 60])  # out of order, as rings of chunks can be
    lat = start * 10
    got = assign(start, lat, [(10, 30), (30, 60), (70, 80)])
    assert got[0].tolist() == [100, 200]
    assert got[1].tolist() == [300, 400, 500]
    assert got[2].size == 0


def test_written_counts_consumed_and_overwritten_events():
    from agent.trace.instance import parse_stats
    a = parse_stats(STATS.format(e=10, o=0, r=0), 1)
    b = parse_stats(STATS.format(e=3, o=5, r=40), 1)  # watch drained 40, 5 overwritten
    assert written(b) - written(a) == 38
    assert written(CpuStats(1)) == 0


def test_sign_ci_is_the_order_statistic_interval():
    r = sign_ci(np.arange(1, 121, dtype=float))  # n = 120: k = 49 at 95 %
    assert r["median"] == 60.5
    assert r["ci"] == [49.0, 72.0]
    assert 0.95 <= r["level"] < 0.97
    small = sign_ci([3.0, 1.0, 2.0, 5.0, 4.0])  # n = 5: no rank reaches 95 %
    assert small["ci"] is None and small["median"] == 3.0
    six = sign_ci([6, 5, 4, 3, 2, 1])  # n = 6: the extremes, 1 - 2/64
    assert six["ci"] == [1.0, 6.0] and math.isclose(six["level"], 0.9688, abs_tol=1e-4)
    with pytest.raises(ValueError):
        sign_ci([])


def test_sign_ci_covers_the_median_at_about_the_level():
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(400):
        ci = sign_ci(rng.normal(1.0, 0.1, 120))["ci"]
        hits += ci[0] <= 1.0 <= ci[1]
    assert 0.93 <= hits / 400 <= 0.99


def test_pair_ratios_and_median_ratio():
    a = [np.full(700, 2.0), np.full(700, 3.0)]
    b = [np.full(700, 1.0), np.full(700, 1.0)]
    assert pair_ratios(a, b, 0.99).tolist() == [2.0, 3.0]
    r = median_ratio(a, b, 0.99)
    assert r["median"] == 2.5 and r["ci"] is None and r["verdict"].startswith("no interval")


def test_usable_pairs_drops_thin_blocks():
    on = {0: np.ones(700), 1: np.ones(100), 2: np.ones(662)}
    off = {0: np.ones(700), 1: np.ones(700), 2: np.ones(662)}
    assert usable_pairs(on, off, 662) == [0, 2]


def test_analyse_no_effect_is_within_and_aa_straddles_1():
    on, off = blocks(1)
    r = analyse(on, off, (0.5, 0.99), 300, np.random.default_rng(1), 0.05, 662)
    assert len(r["kept"]) == 120 and r["dropped"] == []
    for k in ("p50", "p99"):
        mp, po = r["ab"][k]["median_pair"], r["ab"][k]["pooled"]
        assert mp["ci"][0] < 1 < mp["ci"][1]
        assert po["ci"][0] < 1 < po["ci"][1]
    assert r["ab"]["p50"]["median_pair"]["verdict"] == "within 5 %"
    for m in ("on", "off"):
        assert r["aa"][m]["pairs"] == 60
        assert r["aa"][m]["p99"]["median_pair"]["ci"][0] < 1 < \
            r["aa"][m]["p99"]["median_pair"]["ci"][1]


def test_analyse_sees_a_10_percent_shift_the_drift_hides_in_single_blocks():
    on, off = blocks(2, shift=1.10, drift_sd=0.3)
    r = analyse(on, off, (0.5, 0.99), 300, np.random.default_rng(2), 0.02, 662)
    mp = r["ab"]["p99"]["median_pair"]
    assert 1.05 < mp["median"] < 1.15 and mp["ci"][0] > 1.02
    assert mp["verdict"] == VERDICT_DIFFERS and mp["excludes_1"]
    assert r["ab"]["p99"]["pooled"]["verdict"] in (VERDICT_DIFFERS, VERDICT_INCONCLUSIVE)
    for m in ("on", "off"):  # same treatment on both sides: no shift (pairs' drift: wide)
        ci = r["aa"][m]["p99"]["median_pair"]["ci"]
        assert ci[0] < 1 < ci[1]


def test_analyse_needs_four_pairs():
    on, off = blocks(4, pairs=3)
    with pytest.raises(ValueError, match="usable pairs"):
        analyse(on, off, (0.99,), 100, np.random.default_rng(0), 0.02, 662)


def test_off_leaks():
    bl = [{"mode": "on", "events": 3000}, {"mode": "off", "events": 0},
          {"mode": "off", "events": 2}, {"mode": "off", "events": None}]
    assert off_leaks(bl) == [bl[2]]


def fake_instance(tmp_path):
    inst = tmp_path / "instances" / "hftagent-4242"
    ev = inst / "events"
    for sysname, name, val in (("sched", "sched_switch", "1"), ("sched", "sched_waking", "1"),
                               ("irq", "irq_handler_entry", "1"), ("irq", "softirq_raise", "0"),
                               ("kmem", "kmalloc", "0")):
        d = ev / sysname / name
        d.mkdir(parents=True)
        (d / "enable").write_text(val + "\n")
    (ev / "enable").write_text("X\n")
    cpu = inst / "per_cpu" / "cpu1"
    cpu.mkdir(parents=True)
    (cpu / "stats").write_text(STATS.format(e=7, o=1, r=2))
    return inst


def test_instance_events_toggles_only_watch_set(tmp_path):
    inst = fake_instance(tmp_path)
    ev = InstanceEvents(inst)
    assert ev.names == ["irq:irq_handler_entry", "sched:sched_switch", "sched:sched_waking"]
    ev.set(False)
    assert all(p.read_text() == "0" for p in ev.files)
    assert (inst / "events" / "kmem" / "kmalloc" / "enable").read_text().strip() == "0"
    ev.set(True)
    assert all(p.read_text() == "1" for p in ev.files)
    # the events watch left off stay off (a 1 in events/enable would have enabled them)
    assert (inst / "events" / "irq" / "softirq_raise" / "enable").read_text().strip() == "0"
    assert (inst / "events" / "enable").read_text().strip() == "X"  # the fake: untouched
    assert ev.state() == "X"
    assert written(ev.stats(1)) == 10


def test_instance_events_refuses_an_instance_with_nothing_enabled(tmp_path):
    inst = fake_instance(tmp_path)
    for p in (inst / "events").glob("*/*/enable"):
        p.write_text("0\n")
    with pytest.raises(RuntimeError, match="no event enabled"):
        InstanceEvents(inst)


def test_sign_test_p():
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(5, 10) == 1.0
    assert math.isclose(sign_test_p(0, 6), 2 / 64)
    assert math.isclose(sign_test_p(6, 6), 2 / 64)
    assert math.isclose(sign_test_p(2, 10), 2 * 56 / 1024)  # P(X <= 2) = (1 + 10 + 45) / 1024


def test_stalls_counts_per_mode_and_keeps_quiet_pairs():
    rng = np.random.default_rng(5)
    on = {i: rng.lognormal(np.log(4e5), 0.1, 900) for i in range(10)}
    off = {i: rng.lognormal(np.log(4e5), 0.1, 900) for i in range(10)}
    for i in (1, 2):  # a 10 ms stall queueing 20 samples
        on[i][:20] = 1e7
    for i in (2, 7, 8):
        off[i][:20] = 1e7
    st = stalls(on, off, list(range(10)))
    assert (st["stalled_on"], st["stalled_off"], st["both"]) == (2, 3, 1)
    assert (st["on_only"], st["off_only"]) == (1, 2)
    assert st["sign_test_p"] == 1.0
    assert st["quiet_pairs"] == [0, 3, 4, 5, 6, 9]
    assert 400 < st["threshold_us"] / 2 < 600


def test_analyse_reports_the_quiet_pairs():
    on, off = blocks(6, pairs=40)
    for i in range(0, 40, 5):
        on[i][:15] = 2e7
    r = analyse(on, off, (0.5, 0.99), 200, np.random.default_rng(6), 0.05, 662)
    st = r["stalls"]
    assert st["stalled_on"] >= 8 and st["on_only"] >= 8 and st["sign_test_p"] < 0.01
    assert st["quiet"]["p99"]["n"] == len(st["quiet_pairs"])
    assert st["quiet"]["p99"]["ci"][0] < 1 < st["quiet"]["p99"]["ci"][1]
