"""The probe worker's callers mode (ProbeSettings.callers, gate's concurrentN): settings,
harness.concurrent_loop, and worker.run_task in-process on fake and numpy callables (no TF,
no wall-time assertions)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from agent.errors import AgentError
from agent.probe import harness
from agent.probe.config import MAX_CALLERS, ProbeSettings, ThreadConfig
from agent.probe.harness import CallerFailed, concurrent_loop
from agent.probe.models import ModelSpec, load_model
from agent.probe.result import RunResult
from agent.probe.variants import BuiltVariant


# -- settings ----------------------------------------------------------------------------------
def test_callers_default_and_round_trip():
    assert ProbeSettings().callers == 1
    s = ProbeSettings(callers=16)
    d = s.to_dict()
    assert d["callers"] == 16
    assert ProbeSettings.from_dict(d).callers == 16
    old = dict(d)
    del old["callers"]  # a settings dict written before the field existed
    assert ProbeSettings.from_dict(old).callers == 1


@pytest.mark.parametrize("bad", [0, -1, MAX_CALLERS + 1, True, 2.0, "4", None])
def test_callers_out_of_range_refused(bad):
    with pytest.raises(AgentError, match="callers must be an integer"):
        ProbeSettings(callers=bad)


def test_callers_refused_with_a_schedule():
    with pytest.raises(AgentError, match="--rate"):
        ProbeSettings(callers=2, rate_hz=100.0)
    s = ProbeSettings(callers=2)
    s.idle_gaps_ns = [0, 1_000_000]  # set after construction, as options.build does
    with pytest.raises(AgentError, match="--idle-gaps"):
        s.validate()
    from agent.probe.runner import run_probe
    with pytest.raises(AgentError, match="--idle-gaps"):
        run_probe(s)  # refused before a worker starts
    assert ProbeSettings(callers=MAX_CALLERS).callers == MAX_CALLERS


def test_run_result_carries_callers():
    r = RunResult(variant="numpy", batch=1, config={}, callers=4)
    assert r.to_dict()["callers"] == 4
    assert RunResult.from_dict(r.to_dict()).callers == 4
    old = r.to_dict()
    del old["callers"]
    assert RunResult.from_dict(old).callers == 1


# -- harness.concurrent_loop -------------------------------------------------------------------
def test_concurrent_loop_runs_callers_at_once_and_concatenates():
    callers, per = 4, 25
    # Each thread's first call waits for all the others' first calls: a loop that did not run
    # the callers concurrently would break this barrier (timeout) and fail the run.
    meet = threading.Barrier(callers, timeout=30)
    local = threading.local()
    seen: set[int] = set()
    lock = threading.Lock()

    def fn() -> None:
        if not getattr(local, "met", False):
            local.met = True
            meet.wait()
        with lock:
            seen.add(threading.get_ident())
    s = concurrent_loop(fn, callers, per)
    assert not s.open_loop and s.count == callers * per
    assert len(seen) == callers
    assert (s.column("intended_ns") == s.column("start_ns")).all()
    assert (s.latency_ns >= 0).all()
    # caller by caller: within each caller's block the starts increase
    starts = s.column("start_ns").reshape(callers, per)
    assert (np.diff(starts, axis=1) > 0).all()
    for c in ("nivcsw", "nvcsw", "minflt", "majflt"):
        assert (s.column(c) >= 0).all()


def test_concurrent_loop_deadline_takes_one_call_each():
    calls = []
    s = concurrent_loop(lambda: calls.append(1), 3, 100, deadline_ns=0)
    assert s.count == 3 and len(calls) == 3


def test_concurrent_loop_caller_error_is_raised_with_its_message():
    def fn() -> None:
        if threading.current_thread().name == "probe-caller-2":
            raise RuntimeError("interpreter busy")
    with pytest.raises(CallerFailed, match=r"caller 2: RuntimeError: interpreter busy"):
        concurrent_loop(fn, 4, 10)


def test_concurrent_loop_refuses_bad_arguments():
    with pytest.raises(ValueError):
        concurrent_loop(lambda: None, 0, 10)
    with pytest.raises(ValueError, match="buffer too small"):
        concurrent_loop(lambda: None, 2, 10, buf=harness.allocate(19))


# -- worker.run_task ---------------------------------------------------------------------------
SHAPE = (1, 64, 32)


def _settings(**kw) -> ProbeSettings:
    base = dict(model=ModelSpec(builtin="numpy"), variants=["numpy"], samples=101,
                duration_s=None, warmup=10, warmup_budget_s=5.0, agree_n=4)
    return ProbeSettings(**{**base, **kw})


def _fake_build(monkeypatch, call, notes=("fake",)):
    import agent.probe.variants as variants

    def build_callable(model, variant, shape, threads=None, calib=None):
        return BuiltVariant(variant, tuple(shape), 0.0, lambda x: call,
                            lambda xs: np.zeros((xs.shape[0], 1)), list(notes))
    monkeypatch.setattr(variants, "build_callable", build_callable)


def test_run_task_numpy_callers_one_run():
    from agent.probe.worker import run_task
    model = load_model(ModelSpec(builtin="numpy"))
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    r, s = run_task(model, "numpy", SHAPE, _settings(callers=4), ThreadConfig(), x, None, None)
    assert r.ok, r.reason
    assert r.callers == 4 and r.mode == "closed" and r.to_dict()["callers"] == 4
    assert s is not None and s.count == 4 * 26  # ceil(101 / 4) each
    assert r.latency["count"] == s.count and r.jitter["samples"] == s.count
    assert r.cold_start_ns > 0 and r.warmup["calls"] >= 10
    assert r.throughput_per_s and r.throughput_per_s > 0
    assert not r.timed_budget_hit
    assert not any("LiteRT" in n for n in r.notes)


def test_run_task_single_caller_unchanged(monkeypatch):
    from agent.probe.worker import run_task
    _fake_build(monkeypatch, lambda: None)
    r, s = run_task(None, "numpy", SHAPE, _settings(), ThreadConfig(), np.zeros(SHAPE), None,
                    None)
    assert r.ok and r.callers == 1 and s.count == 101


def test_run_task_tflite_callers_share_the_interpreter_through_a_lock(monkeypatch):
    from agent.probe.worker import run_task
    inside = [0]
    worst = [0]
    guard = threading.Lock()

    def call() -> None:
        with guard:
            inside[0] += 1
            worst[0] = max(worst[0], inside[0])
        time.sleep(0)  # releases the GIL: without the lock another caller gets in here
        with guard:
            inside[0] -= 1
    _fake_build(monkeypatch, call)
    r, s = run_task(None, "tflite", SHAPE, _settings(callers=8, samples=400), ThreadConfig(),
                    np.zeros(SHAPE), None, None)
    assert r.ok and s.count == 400
    assert worst[0] == 1  # never two callers inside the interpreter
    assert "LiteRT interpreter shared by the callers through a lock" in r.notes


def test_run_task_caller_error_fails_the_run(monkeypatch):
    from agent.probe.worker import run_task
    state = {"timed": False}

    def call() -> None:
        if state["timed"] and threading.current_thread().name == "probe-caller-1":
            raise ValueError("bad state")
    _fake_build(monkeypatch, call)

    def emit(**ev) -> None:
        if ev.get("phase") == "timed":
            state["timed"] = True
    r, s = run_task(None, "graph", SHAPE, _settings(callers=3), ThreadConfig(),
                    np.zeros(SHAPE), None, None, emit=emit)
    assert s is None and r.status == "failed"
    assert r.reason == "3 callers: caller 1: ValueError: bad state"
