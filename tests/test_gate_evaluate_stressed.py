"""gate --scenarios ...,stressed: the probe under a standard load on the housekeeping CPUs,
gated against the same box's quiet run, and never a pass when the load did not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from agent.gate import evaluate as g


def gi(label: str, scale: float, n: int = 7000) -> g.GateInput:
    rng = np.random.default_rng(3)
    return g.GateInput(label, latency_ns=(rng.gamma(4, 25_000, n) * scale).astype(np.int64))


LOAD_OK = {"tool": "builtin", "cpus": [0], "rates": {"cpu_cache": 900.0, "net": 9e4,
                                                     "disk": 40.0, "alloc": 800.0},
           "short": {}}


def test_parse_scenarios_knows_stressed():
    assert g.parse_scenarios("warm,stressed") == ["warm", "stressed"]


def test_within_budget_passes_and_over_fails():
    quiet = gi("quiet", 1.0)
    ok = {c.name: c for c in g.stressed_checks(gi("s", 1.2), LOAD_OK, quiet, "#1")}
    assert ok["housekeeping-load"].status == g.PASS
    assert ok["stressed-vs-quiet"].status == g.PASS
    assert 1.1 < ok["stressed-vs-quiet"].data["ratio"] < 1.3
    bad = {c.name: c for c in g.stressed_checks(gi("s", 2.0), LOAD_OK, quiet, "#1")}
    assert bad["stressed-vs-quiet"].status == g.FAIL


def test_a_load_that_did_not_run_is_no_pass():
    short = dict(LOAD_OK, short={"net": "achieved 3.0 packets/s (< 1000)"})
    c = {c.name: c for c in g.stressed_checks(gi("s", 1.0), short, gi("q", 1.0), "#1")}
    assert c["housekeeping-load"].status == g.FAIL and "net" in c["housekeeping-load"].detail
    c = {c.name: c for c in g.stressed_checks(gi("s", 1.0), None, gi("q", 1.0), "#1")}
    assert c["housekeeping-load"].status == g.FAIL


def test_p999_needs_its_samples_and_a_quiet_run():
    c = {c.name: c for c in g.stressed_checks(gi("s", 1.0, 1000), LOAD_OK, gi("q", 1.0), "#1")}
    assert c["stressed-vs-quiet"].status == g.INSUFFICIENT
    c = {c.name: c for c in g.stressed_checks(gi("s", 1.0), LOAD_OK, None, None)}
    assert c["stressed-vs-quiet"].status == g.SKIP


@pytest.mark.slow
@pytest.mark.tf
def test_warm_and_stressed_run_record_and_gate(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the stressed scenario needs a housekeeping CPU besides the target")
    db = tmp_path / "h.sqlite"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", HFTAGENT_STRESS_DIR=str(tmp_path))
    p = subprocess.run(
        [sys.executable, "-c", "from agent.cli import main; main()", "gate", "--db", str(db),
         "--scenarios", "warm,stressed", "--variant", "tflite", "--samples", "7000",
         "--max-jitter-rate", "off", "--json"],
        capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    verdicts = {v["scenario"]: v for v in json.loads(p.stdout)["verdicts"]}
    checks = {c["name"]: c for c in verdicts["stressed"]["checks"]}
    assert checks["housekeeping-load"]["status"] == "pass", checks["housekeeping-load"]
    assert set(checks["housekeeping-load"]["data"]["rates"]) == {"cpu_cache", "net", "disk",
                                                                 "alloc"}
    assert checks["stressed-vs-quiet"]["status"] in ("pass", "fail")
    assert checks["stressed-vs-quiet"]["data"]["quiet_p999_ns"] > 0
    assert list(tmp_path.glob(".hftagent-stress-*")) == []
