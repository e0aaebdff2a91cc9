"""Probe statistics against numpy on synthetic latency arrays (no TF)."""

import math

import numpy as np
import pytest

from agent.probe import stats


@pytest.mark.parametrize("n", [1, 2, 7, 100, 662, 1000, 6636, 10000, 12345])
def test_nearest_rank_matches_numpy_inverted_cdf(n):
    rng = np.random.default_rng(n)
    v = rng.lognormal(12, 1, n).astype(np.int64)
    got = stats.percentiles(v)
    srt = np.sort(v)
    for q in stats.PERCENTILES:
        exact = srt[-(-int(q * 10) * n // 1000) - 1]  # integer ceil(q/100 * n), 1-based rank
        assert got[q] == exact, q
        if (int(q * 10) * n) % 1000:  # numpy's float rank is only exact off integer products
            assert got[q] == int(np.percentile(v, q, method="inverted_cdf")), q


def test_nearest_rank_exact_rank_no_float_roundoff():
    # 0.999 * 10000 = 9990.000000000002 in floats; nearest rank must be 9990 (index 9989).
    assert stats.nearest_rank_index(99.9, 10000) == 9989
    assert stats.nearest_rank_index(99.0, 100) == 98
    assert stats.nearest_rank_index(50.0, 1) == 0
    v = np.arange(1, 10001, dtype=np.int64)
    assert stats.percentiles(v)[99.9] == 9990


def test_summarize_fields_and_sufficiency():
    v = np.arange(1, 701, dtype=np.int64) * 1000
    s = stats.summarize(v)
    assert s["count"] == 700
    assert s["min_ns"] == 1000 and s["max_ns"] == 700_000
    assert s["mean_ns"] == pytest.approx(v.mean())
    assert s["stdev_ns"] == pytest.approx(v.std(ddof=1))
    assert s["p50_ns"] == 350_000
    assert s["sufficient"] == {"p50": True, "p90": True, "p99": True, "p999": False}
    assert s["required"]["p99"] == 662 and s["required"]["p999"] == 6636
    assert stats.summarize(v[:661])["sufficient"]["p99"] is False


def test_summarize_empty_is_none_not_zero():
    s = stats.summarize(np.zeros(0, dtype=np.int64))
    assert s["count"] == 0 and s["p99_ns"] is None and s["mean_ns"] is None


def test_wilson_interval_known_values():
    lo, hi = stats.wilson_interval(0, 100)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.0370, abs=1e-4)
    lo, hi = stats.wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    assert stats.wilson_interval(0, 0) == (0.0, 1.0)


def test_jitter_counts_strictly_over_threshold():
    v = np.array([1, 5, 5, 6, 10], dtype=np.int64)
    j = stats.jitter(v, 5)
    assert j["count"] == 2 and j["rate"] == pytest.approx(0.4)
    assert j["wilson95_low"] < 0.4 < j["wilson95_high"]


def test_tail_attribution_shares():
    lat = np.array([10, 10, 10, 10, 100, 100], dtype=np.int64)
    iv = np.array([0, 0, 0, 1, 1, 0], dtype=np.int64)
    mn = np.array([0, 0, 0, 0, 0, 3], dtype=np.int64)
    mj = np.zeros(6, dtype=np.int64)
    a = stats.tail_attribution(lat, iv, mn, mj, 100)
    assert a["slow_count"] == 2
    assert a["slow_share_ivcsw"] == 0.5 and a["slow_share_fault"] == 0.5
    assert a["slow_share_either"] == 1.0
    assert a["all_share_ivcsw"] == pytest.approx(2 / 6)


def test_agreement_classifier_and_regression():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((100, 3))
    a = stats.agreement(ref, ref + 1e-6)
    assert a["classifier_like"] and a["argmax_share"] == 1.0 and a["passes"]
    flipped = ref.copy()
    flipped[:10] = -flipped[:10]  # argmax changes on (almost) every flipped row
    b = stats.agreement(ref, flipped)
    assert b["argmax_share"] < 0.95 and not b["passes"]
    reg = stats.agreement(ref[:, :1], ref[:, :1] * 1.2)
    assert not reg["classifier_like"] and reg["max_rel_err"] == pytest.approx(0.2, rel=1e-6)
    assert not reg["passes"]
    nan = stats.agreement(ref, np.full_like(ref, np.nan))
    assert not nan["passes"] and not nan["finite"]


def test_required_samples_rule():
    assert stats.required_samples(99.0) == 662
    assert stats.required_samples(99.9) == 6636
    assert stats.required_samples(95.0) == math.ceil(6.62 / 0.05)


def _run(variant, p99, *, stable=True, unserved=0, mode="closed", resp_p99=None):
    from agent.probe.result import RunResult
    from agent.probe.stats import summarize
    lat = np.full(700, p99, dtype=np.int64)
    r = RunResult(variant=variant, batch=1, config={"id": "c0"}, mode=mode,
                  latency=summarize(lat), warmup={"stable": stable, "reason": "unstable: x"},
                  unserved=unserved, rate_hz=1000.0 if mode == "open" else None)
    if resp_p99 is not None:
        r.response = summarize(np.full(700, resp_p99, dtype=np.int64))
    return r


def test_recommendation_skips_unstable_and_saturated_runs_and_uses_response_in_open_loop():
    from agent.probe.runner import eligible, recommend
    fast_unstable = _run("xla", 100, stable=False)
    saturated = _run("tflite", 90, unserved=5, mode="open", resp_p99=90)
    steady = _run("graph", 1000)
    assert eligible(fast_unstable)[1].startswith("not recommended: unstable")
    assert "saturated" in eligible(saturated)[1]
    assert recommend([fast_unstable, saturated, steady])["variant"] == "graph"
    # open loop: the headline (and the recommendation) is response time, not service time
    queued = _run("xla", 100, mode="open", resp_p99=5000)
    prompt = _run("tflite", 300, mode="open", resp_p99=400)
    assert queued.headline["p99_ns"] == 5000 and queued.p99_ns() == 5000
    rec = recommend([queued, prompt])
    assert rec["variant"] == "tflite" and rec["p99_ns"] == 400


def test_sweep_recommends_what_hftagent_run_can_reproduce():
    """A caller-thread (inter -1) or TF-default winner cannot be set through `hftagent run`:
    the best reproducible configuration is recommended, the winner named in a note."""
    import shlex

    from agent.probe.result import ProbeResult
    from agent.probe.runner import finish
    caller = _run("xla", 100)
    caller.config = {"id": "intra1-caller-cpu1", "intra": 1, "inter": -1, "cpus": [1]}
    default = _run("xla", 150)
    default.config = {"id": "default", "intra": None, "inter": None, "cpus": None}
    pinned = _run("xla", 200)
    pinned.config = {"id": "intra1-inter1-cpu1", "intra": 1, "inter": 1, "cpus": [1]}
    res = ProbeResult(host={}, model={}, settings={}, runs=[caller, default, pinned],
                      created_utc="2026-11-29T00:00:00Z")
    finish(res)
    sr = res.sweep_recommendation
    assert res.recommendation["config"]["id"] == "intra1-caller-cpu1"  # the fastest, honestly
    assert sr["config"]["id"] == "intra1-inter1-cpu1"
    line = sr["command"].split("  #")[0]
    assert shlex.split(line)[:8] == ["hftagent", "run", "--cpus", "1", "--intra", "1",
                                     "--inter", "1"]
    assert "cannot reproduce" in sr["note"]
