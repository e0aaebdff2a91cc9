"""End to end on real TensorFlow: two probe runs pass the gate, a CPU-hogged run fails it,
history lists them and plots them. The probe's fastest variant (tflite) with 2,000 samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.history import History, record_probe

pytestmark = [pytest.mark.slow, pytest.mark.tf]

CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


def hftagent(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


HOG = """
import os, time
os.sched_setaffinity(0, {%d})
clock = time.perf_counter_ns
while True:
    end = clock() + 2_000_000
    while clock() < end:
        pass
    time.sleep(0.008)
"""


def start_hog(cpu: int) -> subprocess.Popen:
    """A periodic CPU hog on ``cpu``: 2 ms busy every ~10 ms, unprivileged.

    Why periodic: on this VM's 6.18 (EEVDF) kernel a constant busy loop on the probe's CPU
    barely moved the tflite P99 (237 µs vs 187 µs P50, measured here) - the probe still got
    its calls through - while a hog that wakes up preempts calls in flight (P99 ≈ 6 ms here).
    """
    return subprocess.Popen([sys.executable, "-c", HOG % cpu])


def test_gate_passes_two_runs_and_fails_a_hogged_one(tmp_path):
    from agent.probe.config import ProbeSettings, ThreadConfig
    from agent.probe.models import ModelSpec
    from agent.probe.runner import run_probe

    db = tmp_path / "history.sqlite"
    env = dict(os.environ, HFTAGENT_DB=str(db), TF_CPP_MIN_LOG_LEVEL="2")
    cpu = max(os.sched_getaffinity(0))
    settings = ProbeSettings(model=ModelSpec(), variants=["tflite"], samples=2000,
                             duration_s=10.0, warmup=200, agree_n=8)
    cfg = ThreadConfig(cpus=[cpu])
    # Two probe runs recorded through the hook the probe command calls.
    ids = []
    for _ in range(2):
        result, arrays = run_probe(settings, [cfg])
        assert result.runs[0].ok, result.runs[0].reason
        ids += record_probe(result, arrays, command="probe", db=db)
    assert ids == [1, 2]

    # The jitter budget (0.05 % over 5 ms) is covered by unit tests; a shared 2-core CI VM
    # cannot promise it, so the end-to-end gates P99 only.
    ok = hftagent("gate", "--run", "latest", "--json", "--seed", "1", "--max-jitter-rate", "off",
                  env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json.loads(ok.stdout)
    (v,) = doc["verdicts"]
    assert v["baseline"] == "run 1" and v["status"] == "pass"
    reg = next(c for c in v["checks"] if c["name"] == "p99-regression")
    assert reg["status"] == "pass" and reg["data"]["low"] <= 1.10

    hog = start_hog(cpu)
    try:
        bad = hftagent("gate", "--variant", "tflite", "--samples", "2000", "--cpus", str(cpu),
                       "--json", "--seed", "1", "--max-jitter-rate", "off", env=env)
    finally:
        hog.kill()
        hog.wait()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (v,) = json.loads(bad.stdout)["verdicts"]
    assert v["baseline"] == "run 2"   # last-pass: run 2 passed its gate
    reg = next(c for c in v["checks"] if c["name"] == "p99-regression")
    assert reg["status"] == "fail" and reg["data"]["low"] > 1.10

    with History(db) as h:
        runs = h.runs(limit=None)
        assert [(r.id, r.gate_status) for r in runs] == [(3, "fail"), (2, "pass"), (1, None)]
        assert h.samples(3).size == 2000

    ls = hftagent("history", "--json", env=env)
    assert ls.returncode == 0 and [r["id"] for r in json.loads(ls.stdout)] == [3, 2, 1]
    out = tmp_path / "runs.png"
    pl = hftagent("history", "plot", "--out", str(out), env=env)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert pl.returncode == 1 and "needs matplotlib" in pl.stderr
    else:
        assert pl.returncode == 0, pl.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
