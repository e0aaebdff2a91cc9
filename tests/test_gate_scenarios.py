"""`hftagent gate --scenarios cold,warm,concurrent16` on real TensorFlow (tflite, small)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.history import History

pytestmark = [pytest.mark.slow, pytest.mark.tf]


def test_three_scenarios_run_record_and_gate(tmp_path):
    db = tmp_path / "h.sqlite"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run(
        [sys.executable, "-c", "from agent.cli import main; main()", "gate", "--db", str(db),
         "--scenarios", "cold,warm,concurrent16", "--cold-processes", "2", "--samples", "1000",
         "--max-jitter-rate", "off", "--max-cold-start-us", "10000000", "--json"],
        capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    verdicts = json.loads(p.stdout)["verdicts"]
    assert [v["scenario"] for v in verdicts] == ["cold", "warm", "concurrent16"]
    cold = {c["name"]: c for c in verdicts[0]["checks"]}
    assert cold["cold-start-budget"]["status"] == "pass"
    assert cold["cold-start-budget"]["data"]["n"] == 2
    with History(db) as h:
        runs = {r.scenario: r for r in h.runs(limit=None)}
        assert set(runs) == {"cold", "warm", "concurrent16"}
        assert h.samples(runs["cold"].id).size == 2          # one first call per process
        assert h.samples(runs["warm"].id).size == 1000
        conc = runs["concurrent16"]
        assert h.samples(conc.id).size == 16 * 63 and conc.summary["callers"] == 16
        # one probe worker in its callers mode (ProbeSettings.callers): one run of 16 callers
        assert conc.summary["per_caller"] == 63 and conc.summary["settings"]["callers"] == 16
        assert "LiteRT interpreter shared by the callers through a lock" in conc.summary["notes"]
        assert conc.summary["run"]["variant"] == "tflite" and conc.summary["run"]["warmup"]
        # 16 callers sharing one interpreter queue behind each other. The median can stay low
        # (an unfair lock lets the releasing thread re-take it: a convoy), but by Little's law
        # the mean latency is about the number of callers in flight times the service time.
        assert h.samples(conc.id).mean() > 2 * h.samples(runs["warm"].id).mean()
