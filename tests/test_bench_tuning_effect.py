"""bench/tuning_effect.py's pure logic: scenario selection, block sizing for a sample count,
the budget fit, the late share, the mixed wake-up schedule and its classes, the median's
distribution-free interval and the wake-up figures, on synthetic data (no probe child, no
hftagent run, nothing written outside tmp)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agent.probe.harness import time_loop
from bench.tuning_effect import (
    COMBOS,
    FAST,
    FIRST,
    ISOLATE_S,
    LEVERS,
    SLOW,
    block_seconds,
    classify,
    fit_budget,
    late_share,
    median_ci,
    mixed_intervals,
    mixed_loop,
    scenario_table,
    select_scenarios,
    spinner_stopped,
    wake_plan,
    wake_summary,
    without_lever,
)

BENCH = Path(__file__).resolve().parents[1] / "bench" / "tuning_effect.py"
TARGET = "quiet,noisy,bursty,noisy+all,bursty+all"


def test_select_scenarios_keeps_table_order_and_always_quiet():
    table = scenario_table(list(LEVERS))
    got = select_scenarios(table, "bursty+all,noisy,noisy+all,bursty")
    assert [s[0] for s in got] == TARGET.split(",")
    assert dict((s[0], s[2]) for s in got)["noisy+all"] == frozenset(LEVERS)
    assert [s[0] for s in select_scenarios(table, None)] == [s[0] for s in table]
    assert select_scenarios(table, "all") == table


def test_every_lever_and_recommended_combination_runs_under_each_kind():
    """Issue #25: each lever alone and each combination the audit or a profile recommends,
    quiet, noisy and bursty; isolation + keep-awake among them (the audit's fix on an
    isolated CPU)."""
    table = {name: (noise, lv) for name, noise, lv in scenario_table(list(LEVERS))}
    noise = {"quiet": None, "noisy": "noisy", "bursty": "bursty"}
    for kind, nz in noise.items():
        assert table[kind] == (nz, frozenset())
        for x in LEVERS:
            assert table[f"{kind}+{x}"] == (nz, frozenset({x}))
        for c in COMBOS:
            assert table[f"{kind}+{'+'.join(c)}"] == (nz, frozenset(c))
        assert table[f"{kind}+all"] == (nz, frozenset(LEVERS))
    assert ("isolate", "keep-awake") in COMBOS
    assert table["noisy+isolate+keep-awake"] == ("noisy", frozenset({"isolate", "keep-awake"}))
    assert len(table) == 3 * (1 + len(LEVERS) + len(COMBOS) + 1) + 2
    # a combination needs all its levers; one equal to the full set is "all"
    names = [s[0] for s in scenario_table(["isolate", "keep-awake"])]
    assert "noisy+isolate+keep-awake" not in names and "noisy+all" in names
    assert not any("pm-qos" in n for n in names)


def test_without_lever_drops_what_becomes_a_repeat():
    table = without_lever(scenario_table(list(LEVERS)), "fifo")
    names = [s[0] for s in table]
    assert "noisy+fifo" not in names and "quiet+fifo" not in names and "noisy" in names
    assert dict((s[0], s[2]) for s in table)["noisy+all"] == frozenset(LEVERS) - {"fifo"}
    assert "noisy+isolate+keep-awake+pm-qos" not in names  # the same set as noisy+all now
    assert len({(nz, lv) for _, nz, lv in table}) == len(table)


def test_spinner_stopped_finds_the_guard_line_only():
    err = ("hftagent run: keep-awake spinner pid 7 on CPU 1 (SCHED_IDLE, pause loop; exits "
           "with the command, or stops with a line here if the command waits for the CPU "
           "behind it)\nhftagent run: keep-awake spinner on CPU 1 stopped: thread 9 (python) "
           "of the command was waiting for CPU 1 in 90 of 100 samples while ...\n")
    got = spinner_stopped(err)
    assert len(got) == 1 and got[0].startswith("hftagent run: keep-awake spinner on CPU 1 "
                                               "stopped: thread 9")
    assert spinner_stopped("") == []


def test_select_scenarios_names_the_unknown_ones():
    table = scenario_table(["fifo"])
    with pytest.raises(ValueError, match="noisy[+]isolate.*known: quiet"):
        select_scenarios(table, "quiet,noisy+isolate")


def scheduled(seconds: float, rate: float) -> int:
    """Calls one open-loop block serves (agent/probe/harness._open, deadline-bounded)."""
    period = int(round(1e9 / rate))
    n = int(seconds * rate) + 1
    return min(n, max(1, -(-(int(seconds * 1e9) - period) // period)))


@pytest.mark.parametrize("rate", [77.3, 125.6, 250.0, 380.8, 500.0])
@pytest.mark.parametrize("rounds", [1, 2, 3, 5])
@pytest.mark.parametrize("need", [400, 6636])
def test_block_seconds_gives_at_least_the_samples_asked(rate, rounds, need):
    s = block_seconds(need, rounds, rate)
    got = rounds * scheduled(s, rate)
    assert need <= got <= need + 3 * rounds


def test_block_seconds_against_the_real_open_loop():
    """A block of block_seconds() serves ≥ the samples asked when the loop begins with it
    (its first call one period in). Where this process starts the loop late (a busy box),
    the loop still serves every call scheduled before the deadline: the count is checked
    against the loop's own first intended start, not against wall time."""
    s = block_seconds(100, 1, 2000.0)
    period = int(1e9 / 2000.0)
    assert -(-(int(s * 1e9) - period) // period) >= 100  # begun at once: ≥ 100 scheduled
    deadline = time.perf_counter_ns() + int(s * 1e9)
    got = time_loop(lambda: None, int(s * 2000) + 1, 2000.0, deadline_ns=deadline)
    begin = int(got.column("intended_ns")[0])
    scheduled = max(1, -(-(deadline - begin) // period))
    assert got.count + got.unserved == scheduled


def test_fit_budget():
    assert fit_budget(20.0, 10, 0, 2.0, None) == (20.0, 220.0)
    assert fit_budget(20.0, 10, 0, 2.0, 300.0) == (20.0, 220.0)
    fit, est = fit_budget(20.0, 10, 2, 2.0, 150.0)
    assert fit == pytest.approx((150.0 - 20.0 - 2 * ISOLATE_S) / 10) and est == pytest.approx(150)
    with pytest.raises(ValueError, match="per block"):
        fit_budget(20.0, 10, 0, 2.0, 25.0)


def test_late_share_counts_starts_over_half_a_period_late():
    lag = np.array([0, 1_000_000, 4_000_000, 4_000_001, 9_000_000])
    assert late_share(lag, 125.0) == pytest.approx(2 / 5)  # period 8 ms: late is > 4 ms
    assert late_share(np.array([], dtype=np.int64), 125.0) == 0.0


def test_mixed_intervals_are_seeded_and_fill_the_segment():
    a = mixed_intervals(20.0, 2_000_000, 50_000_000, 0.5, 7)
    assert np.array_equal(a, mixed_intervals(20.0, 2_000_000, 50_000_000, 0.5, 7))
    assert set(np.unique(a)) == {2_000_000, 50_000_000}
    assert 20e9 - 50e6 < a.sum() <= 20e9
    assert 0.4 < np.mean(a == 50_000_000) < 0.6
    assert mixed_intervals(0.001, 2_000_000, 50_000_000, 0.5, 1).size == 2  # at least 2


def test_classify_by_the_preceding_interval():
    iv = np.array([50, 2, 50, 50, 2], dtype=np.int64)
    assert classify(iv, 50).tolist() == [FIRST, FAST, SLOW, SLOW, FAST]


def test_median_ci_order_statistics():
    r = median_ci([5, 1, 4, 2, 6, 3])
    assert r["ci"] == [1.0, 6.0] and r["median"] == 3.5
    assert r["confidence"] == pytest.approx(1 - 2 / 64)
    r20 = median_ci(list(range(1, 21)))  # P(B <= 5) = 0.0207 for n = 20: k = 6
    assert r20["ci"] == [6.0, 15.0]
    assert r20["confidence"] == pytest.approx(1 - 2 * sum(math.comb(20, j)
                                                          for j in range(6)) / 2 ** 20)
    assert r20["confidence"] >= 0.95
    assert median_ci([2.0])["confidence"] == 0.0 and median_ci([]) is None


def synthetic_arm(seed: int, ratio: float, pairs: int = 6) -> list[dict]:
    """Fast/slow pairs with a drift shared by a pair (±30 %) and a mixed segment with a slow
    trend through it: the slow class ``ratio`` × the fast one at every moment."""
    rng = np.random.default_rng(seed)
    segs = []
    for p in range(pairs):
        d = float(np.exp(rng.normal(0, 0.3)))
        segs.append({"kind": "rate", "rate": 500.0, "pair": p,
                     "response_ns": (rng.lognormal(np.log(5e5), 0.1, 500) * d).astype(np.int64)})
        segs.append({"kind": "rate", "rate": 20.0, "pair": p, "response_ns":
                     (rng.lognormal(np.log(5e5 * ratio), 0.1, 50) * d).astype(np.int64)})
    n = 800
    iv = np.where(rng.random(n) < 0.5, 50, 2)
    cls = classify(iv, 50)
    trend = np.linspace(0.7, 1.4, n)
    resp = rng.lognormal(np.log(5e5), 0.1, n) * trend * np.where(cls == SLOW, ratio, 1.0)
    segs.append({"kind": "mixed", "response_ns": resp.astype(np.int64), "cls": cls})
    return segs


def test_wake_summary_recovers_the_ratio_through_drift():
    w = wake_summary(synthetic_arm(3, 1.2), 20.0, 500.0, seed=1, n_boot=500)
    assert w["pairs"] == 6 and w["samples"] == {"500": 3000, "20": 300}
    assert w["pooled_ci"][0] <= 1.2 <= w["pooled_ci"][1]
    assert w["per_pair"]["median"] == pytest.approx(1.2, rel=0.05)
    lo, hi = w["per_pair"]["ci"]  # 6 pairs: min and max of the ratios, 97 %
    assert lo <= w["per_pair"]["median"] <= hi and 1.1 < lo and hi < 1.3
    assert w["per_pair"]["confidence"] == pytest.approx(1 - 2 / 64)
    m = w["mixed"]
    assert m["ratio"] == pytest.approx(1.2, rel=0.05)
    assert m["ci"][0] <= 1.2 <= m["ci"][1] and m["windows"] == 20
    assert m["counts"]["slow"] + m["counts"]["fast"] == 799  # call 0 unclassified
    assert m["p50_ns"]["fast_after_fast"] > 0


def test_wake_summary_skips_unpaired_segments_and_intervals_of_one():
    segs = synthetic_arm(4, 1.0, pairs=1)[:2] + [
        {"kind": "rate", "rate": 500.0, "pair": 9, "response_ns": np.array([1, 2, 3])}]
    w = wake_summary(segs, 20.0, 500.0, seed=1, n_boot=100)
    assert w["pairs"] == 1 and w["pooled_ci"] is None and "mixed" not in w
    assert w["per_pair"]["confidence"] == 0.0


def test_wake_plan_keeps_each_pair_adjacent():
    plan = wake_plan(3, 1.0, 2.5, 10.0, 500.0, 20.0, 0.5, random.Random(5), 1)
    assert sum(s["seconds"] for s in plan) == pytest.approx(20.5)
    assert [s["kind"] for s in plan].count("mixed") == 1
    rate = [s for s in plan if s["kind"] == "rate"]
    for i in range(0, len(rate), 2):
        assert rate[i]["pair"] == rate[i + 1]["pair"]
        assert {rate[i]["rate"], rate[i + 1]["rate"]} == {500.0, 20.0}
    i = next(k for k, s in enumerate(plan) if s["kind"] == "mixed")
    assert i % 2 == 0  # between pairs, never inside one
    assert plan == wake_plan(3, 1.0, 2.5, 10.0, 500.0, 20.0, 0.5, random.Random(5), 1)
    assert all(s["kind"] == "rate" for s in wake_plan(2, 1, 1, 0, 500, 20, 0.5,
                                                      random.Random(1), 0))


def test_mixed_loop_times_every_call_from_its_intended_start():
    iv = np.array([1_000_000, 3_000_000] * 10, dtype=np.int64)
    resp, lag = mixed_loop(lambda: None, iv)
    assert resp.size == lag.size == 20
    assert (resp >= lag).all() and (lag >= 0).all()


@pytest.mark.parametrize("argv, msg", [
    (["--scenarios", "quiet,bogus"], "unknown scenario(s) bogus"),
    (["--busy", "1.5"], "--busy takes a share"),
    (["--rate", "fast"], "--rate takes calls/s or auto"),
    (["--wake-only", "--no-wake"], "exclude each other"),
    (["--min-samples", "0"], "--min-samples must be >= 1"),
    (["--wake-pairs", "0", "--wake-mixed-s", "0"], "needs --wake-pairs > 0"),
    (["--levers", "fifo,turbo"], "unknown lever(s) turbo"),
])
def test_bad_input_is_one_line_and_exit_2(argv, msg):
    r = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr


def test_block_figures_are_the_block_s_own_nearest_rank_quantiles_and_counter_deltas():
    from bench.tuning_effect import block_figures
    c0 = {"steal_ticks": 5, "irq_ticks": 0, "softirq_ticks": 2, "interrupts": 100}
    c1 = {"steal_ticks": 7, "irq_ticks": 0, "softirq_ticks": 2, "interrupts": 160}
    f = block_figures(np.arange(1000, 0, -1), c0, c1)
    assert f == {"n": 1000, "p50_ns": 500, "p99_ns": 990, "max_ns": 1000, "steal_ticks": 2,
                 "irq_ticks": 0, "softirq_ticks": 0, "interrupts": 60}
