"""End to end on real TensorFlow: two probe runs pass the gate, a CPU-hogged run fails it,
history lists them and plots them. The probe's fastest variant (tflite) with 2,000 samples."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from agent.history import History, record_probe
from collectors.host import Host
from collectors.parsers import parse_proc_stat

pytestmark = [pytest.mark.slow, pytest.mark.tf]

ALLOWED = "50%"
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


def hftagent(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


# SCHED_FIFO priorities where permitted: the probe's processes at RT_PROBE, the hog's bursts
# one above, so each burst preempts a call in flight and nothing SCHED_OTHER preempts either.
RT_PROBE, RT_HOG = 1, 2

HOG = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
if int(sys.argv[4]):  # real-time: it preempts the (RT_PROBE) probe at once, every time
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(sys.argv[4])))
busy, idle = int(sys.argv[2]), int(sys.argv[3])
clock = time.perf_counter_ns
print("ready", flush=True)
while True:
    end = clock() + busy
    while clock() < end:
        pass
    time.sleep(idle / 1e9)
"""


@contextlib.contextmanager
def probe_realtime():
    """The processes this thread starts meanwhile (the probe worker, the gate command and its
    worker) inherit SCHED_FIFO ``RT_PROBE`` where permitted (sched(7): the policy survives
    fork and execve); yields whether they do. This is what makes the baseline a control on a
    busy host: no SCHED_OTHER task (another test, a busy loop pinned to the probe's CPU) can
    preempt a call, so the clean runs and the hogged run see the same host and the P99 ratio
    the gate measures is the hog's. (Under EEVDF a busy loop on the probe's CPU made the
    clean P99 a whole time slice, ~4.5 ms, and the hogged run's ratio interval fell to a
    lower bound of 1.007.) Fair tasks still get 50 ms of each second on the CPU (RT
    throttling, sched_rt_runtime_us; the fair deadline server since 6.12): a delayed call or
    two in a run, far from the 1 % of its calls that P99 is."""
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PROBE))
    except OSError:  # not root, no CAP_SYS_NICE, or a cgroup without RT runtime
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, *before)


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


def start_hog(cpu: int, control: dict, rt: bool) -> subprocess.Popen:
    """A periodic CPU hog on ``cpu`` sized from a same-run control (``control``: the clean
    run's latency summary): busy 2.5 × its P99 (at least 2 ms), then idle 4 × that or 25 ×
    its P50, whichever is shorter; SCHED_FIFO ``RT_HOG`` (above the probe) when ``rt``, else
    SCHED_OTHER.

    Why periodic: on 6.18 (EEVDF) a constant busy loop on the probe's CPU barely moved the
    tflite P99 (237 µs vs 187 µs P50, measured) - the probe still got its calls through -
    while a hog that wakes up preempts calls in flight. As SCHED_FIFO above the probe each
    burst that lands in a call delays it by the whole burst, so the hogged P99 is ≥ 2.5 × the
    control's once bursts land in ≥ 1 % of the calls. About 25 calls run between two bursts,
    so ~1 call in 26 is hit however slow the calls or heavy the control's tail (an idle of 4
    bursts after a 4.5 ms P99 leaves 45 ms, ~110 calls of 0.4 ms: too few hit for P99).
    Measured, quiet and with a busy loop pinned on each CPU (6 runs): one 2 ms burst every
    ~10 ms hit ~4.5 % of the calls; hogged P99 2.5-2.8 ms against 0.45-0.9 ms controls
    (interval lower bound 5.3 in one).
    """
    busy = max(2_000_000, int(2.5 * control["p99_ns"]))
    idle = min(4 * busy, 25 * int(control["p50_ns"]))
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(cpu), str(busy), str(idle),
                            str(RT_HOG if rt else 0)], stdout=subprocess.PIPE, text=True)
    if hog.stdout.readline().strip() != "ready":  # e.g. SCHED_FIFO refused after all
        hog.kill()
        hog.wait()
        pytest.fail(f"the hog did not start (status {hog.returncode})")
    return hog


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
    # Two probe runs recorded through the hook the probe command calls, then gated. Every
    # probe, the hogged one too, runs SCHED_FIFO where permitted (probe_realtime).
    with probe_realtime() as rt:
        result, arrays = run_probe(settings, [cfg])
    assert result.runs[0].ok, result.runs[0].reason
    assert record_probe(result, arrays, command="probe", db=db) == [1]
    # The jitter budget (0.05 % over 5 ms) is covered by unit tests; a shared 2-core CI VM
    # cannot promise it, so the end-to-end gates P99 only, and with 50 % allowed instead of
    # 10 %: consecutive clean runs here drifted by up to +20 % in P99 with no preemption
    # evidence (214 → 256 µs, interval [+14 %, +24 %]) - run-to-run variance that a
    # within-run bootstrap cannot see. The 10 % figures are proven on synthetic samples
    # (test_gate_evaluate.py).
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
        with probe_realtime():
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

    hog = start_hog(cpu, result.runs[0].latency, rt)  # the clean run just gated
    try:
        with probe_realtime():
            bad = hftagent("gate", "--variant", "tflite", "--samples", "2000", "--cpus",
                           str(cpu), "--json", "--seed", "1", "--max-jitter-rate", "off",
                           "--max-p99-regression", ALLOWED, env=env)
    finally:
        hog.kill()
        hog.wait()
        hog.stdout.close()
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (v,) = json.loads(bad.stdout)["verdicts"]
    assert v["baseline"] == f"run {rid}"   # last-pass: the clean run that passed its gate
    # Two earlier runs: history too short to know the run-to-run spread, so the gate ran a
    # control interleaved with the hogged run (issue #39). The bursts hit the control as
    # well; the control against the clean baseline is the box's own move, and fails.
    assert v["decided_by"] == "control", v
    checks = {c["name"]: c for c in v["checks"]}
    assert checks["host-drift"]["status"] == "fail" and checks["host-drift"]["data"]["low"] > 1.5
    assert checks["p99-regression"]["data"]["baseline_alone"]["low"] > 1.5
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
