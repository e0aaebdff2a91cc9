"""End to end on real TensorFlow: two probe runs pass the gate, a CPU-hogged run fails it,
history lists them and plots them. The probe's fastest variant (tflite) with 2,000 samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.gate.history import History, record_probe
from collectors.host import Host
from collectors.parsers import parse_proc_stat

pytestmark = [pytest.mark.slow, pytest.mark.tf]

ALLOWED = "50%"
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


def hftagent(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
try:  # real-time when allowed: it preempts the probe at once, every time
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except (PermissionError, OSError):
    pass
busy, idle = int(sys.argv[2]), int(sys.argv[3])
clock = time.perf_counter_ns
while True:
    end = clock() + busy
    while clock() < end:
        pass
    time.sleep(idle / 1e9)
"""


def steal_ticks(cpu: int) -> int:
    """The ``steal`` time of ``cpuN`` in /proc/stat (USER_HZ ticks; 0 where not reported),
    through the Host and collectors.parsers."""
    host = Host()
    times = parse_proc_stat(host.read(host.proc("stat")).value or "").cpus.get(cpu, {})
    return times.get("steal", 0)


def disturbed(slow_share_ivcsw: float | None, steal: int, p50_ratio: float) -> bool:
    """Evidence that a failed clean run was really slower, not a false alarm of the gate: its
    slow samples were mostly preempted, the hypervisor stole ≥ 2 ticks of the probe CPU while
    it ran, or its median moved by ≥ 15 % (the whole run, not only its tail)."""
    return ((slow_share_ivcsw or 0.0) >= 0.5 or steal >= 2
            or not (1 / 1.15 < p50_ratio < 1.15))


def start_hog(cpu: int, control_p99_ns: int) -> subprocess.Popen:
    """A periodic CPU hog on ``cpu`` sized from a same-run control: busy 2.5 × the clean
    run's P99 (at least 2 ms) every 5 × that, SCHED_FIFO when permitted.

    Why periodic: on 6.18 (EEVDF) a constant busy loop on the probe's CPU barely moved the
    tflite P99 (237 µs vs 187 µs P50, measured) - the probe still got its calls through -
    while a hog that wakes up preempts calls in flight. As SCHED_FIFO each burst that lands
    in a call delays it by the whole burst. A burst must land in ≥ 1 % of the calls to move
    P99, so bursts stay short and frequent: with a busy loop pinned on the probe's own CPU
    the clean run's P99 is already an EEVDF slice (~4.5 ms) and no hog that lands often
    enough proves a 1.5x regression (the closing note of 2026-12-02 has the figures).
    """
    busy = max(2_000_000, int(2.5 * control_p99_ns))
    return subprocess.Popen([sys.executable, "-c", HOG, str(cpu), str(busy), str(4 * busy)])


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
    # Two probe runs recorded through the hook the probe command calls, then gated.
    result, arrays = run_probe(settings, [cfg])
    assert result.runs[0].ok, result.runs[0].reason
    assert record_probe(result, arrays, command="probe", db=db) == [1]
    # The jitter budget (0.05 % over 5 ms) is covered by unit tests; a shared 2-core CI VM
    # cannot promise it, so the end-to-end gates P99 only, and with 50 % allowed instead of
    # 10 %: consecutive clean runs here drifted by up to +20 % in P99 with no preemption
    # evidence (214 → 256 µs, interval [+14 %, +24 %]) - run-to-run variance that a
    # within-run bootstrap cannot see. The 10 % figures are proven on synthetic samples
    # (test_gate_stats.py).
    # This VM is shared: another process pinned to our CPU, or the hypervisor, can genuinely
    # degrade a "clean" run, and then the gate is right to fail it. Such a failure is accepted
    # (and the run re-measured) only when evidence shows it: the probe's slow samples were
    # preempted (involuntary context switches), the hypervisor stole time from the probe's CPU
    # during the run, or the whole run moved (its median too, not only the tail: the host got
    # slower, as in one CI run here, P99 232 → 408 µs with no context switch). An unexplained
    # failure is a false alarm.
    base_p50 = result.runs[0].latency["p50_ns"]
    for _attempt in range(3):
        steal0 = steal_ticks(cpu)
        result, arrays = run_probe(settings, [cfg])
        stolen = steal_ticks(cpu) - steal0
        assert result.runs[0].ok, result.runs[0].reason
        (rid,) = record_probe(result, arrays, command="probe", db=db)
        ok = hftagent("gate", "--run", "latest", "--json", "--seed", "1", "--max-jitter-rate",
                      "off", "--max-p99-regression", ALLOWED, env=env)
        if ok.returncode == 0:
            break
        att = result.runs[0].attribution
        moved = result.runs[0].latency["p50_ns"] / base_p50
        assert ok.returncode == 1 and disturbed(att["slow_share_ivcsw"], stolen, moved), (
            f"steal ticks {stolen}, P50 ratio {moved:.2f}\n" + ok.stdout + ok.stderr)
    else:
        pytest.fail("three clean runs in a row were disturbed (preempted, stolen or slowed)")
    doc = json.loads(ok.stdout)
    (v,) = doc["verdicts"]
    assert v["current"] == f"run {rid}" and v["baseline"] == "run 1" and v["status"] == "pass"
    reg = next(c for c in v["checks"] if c["name"] == "p99-regression")
    assert reg["status"] == "pass" and reg["data"]["low"] <= 1.5

    hog = start_hog(cpu, result.runs[0].latency["p99_ns"])  # the clean run just gated
    try:
        bad = hftagent("gate", "--variant", "tflite", "--samples", "2000", "--cpus", str(cpu),
                       "--json", "--seed", "1", "--max-jitter-rate", "off",
                       "--max-p99-regression", ALLOWED, env=env)
    finally:
        hog.kill()
        hog.wait()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (v,) = json.loads(bad.stdout)["verdicts"]
    assert v["baseline"] == f"run {rid}"   # last-pass: the clean run that passed its gate
    reg = next(c for c in v["checks"] if c["name"] == "p99-regression")
    assert reg["status"] == "fail" and reg["data"]["low"] > 1.5
    hogged = rid + 1

    with History(db) as h:
        runs = h.runs(limit=None)
        assert [(r.id, r.gate_status) for r in runs][:2] == [(hogged, "fail"), (rid, "pass")]
        assert h.samples(hogged).size == 2000

    ls = hftagent("history", "--json", env=env)
    assert ls.returncode == 0 and [r["id"] for r in json.loads(ls.stdout)][:2] == [hogged, rid]
    out = tmp_path / "runs.png"
    pl = hftagent("history", "plot", "--out", str(out), env=env)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert pl.returncode == 1 and "needs matplotlib" in pl.stderr
    else:
        assert pl.returncode == 0, pl.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
