"""The probe's TF-free built-in ``numpy`` model (agent/probe/numpy_model.py): options, the
variant, the worker run end to end with TensorFlow, Keras and LiteRT hidden (a sitecustomize
that sets ``sys.modules[name] = None``, so any import of them raises ImportError in every
process started under it), and the history record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from agent.errors import AgentError
from agent.probe import options
from agent.probe.models import LoadedModel, ModelSpec, load_model
from agent.probe.numpy_model import NumpyLSTM
from agent.probe.variants import VariantUnavailable, build_callable

REPO = Path(__file__).resolve().parent.parent
HFTAGENT = str(Path(sys.executable).parent / "hftagent")
HIDDEN = ("tensorflow", "keras", "ai_edge_litert", "tf_keras")
DEFAULTS = dict(model=None, builtin=None, signature=None, shape=None, input_data="random",
                variant=None, samples=None, duration=None, warmup=200, rate=None,
                threshold_us=5000.0, calib=None, intra=None, inter=None, cpus=None,
                sweep=None, batch="1")


def build(**kw):
    return options.build(**{**DEFAULTS, **kw})


@pytest.fixture
def no_tf_env(tmp_path):
    """An environment in which importing TensorFlow, Keras or LiteRT fails (the probe's
    worker processes inherit it)."""
    d = tmp_path / "no-tf"
    d.mkdir()
    (d / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in HIDDEN))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(d), str(REPO),
                                                     env.get("PYTHONPATH")) if p)
    env["HFTAGENT_DB"] = str(tmp_path / "history.sqlite")
    return env


def _py(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


# -- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"model": "numpy"}, {"builtin": "numpy"},
                                {"model": "numpy", "builtin": "lstm"},
                                {"model": "numpy", "variant": "all"},
                                {"model": "numpy", "variant": "numpy"}])
def test_numpy_model_spec_and_variants(kw):
    s, configs = build(**kw)
    assert s.model.path is None and s.model.builtin == "numpy" and s.model.is_numpy
    assert s.model.kind() == "numpy"
    assert s.variants == ["numpy"]
    assert configs[0].intra is None and configs[0].inter is None


def test_tf_models_keep_their_variants():
    assert build()[0].variants == ["graph", "xla", "tflite"]
    assert "numpy" not in build(variant="all")[0].variants
    assert not build()[0].model.is_numpy


@pytest.mark.parametrize("kw,needle", [
    ({"model": "numpy", "variant": "tflite"}, "tflite is a TensorFlow variant"),
    ({"model": "numpy", "variant": "numpy,xla"}, "xla is a TensorFlow variant"),
    ({"builtin": "numpy", "variant": "graph"}, "graph is a TensorFlow variant"),
    ({"variant": "numpy"}, "numpy is the variant of the built-in numpy model only"),
    ({"builtin": "mlp", "variant": "numpy"}, "numpy is the variant"),
    ({"model": "numpy", "builtin": "mlp"}, "exclude each other"),
    ({"model": "numpy", "intra": 1}, "--intra"),
    ({"model": "numpy", "inter": 1}, "--inter"),
    ({"model": "numpy", "sweep": "threads"}, "--sweep"),
    ({"model": "numpy", "signature": "serving_default"}, "--signature"),
])
def test_numpy_model_refusals(kw, needle):
    with pytest.raises(AgentError) as e:
        build(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_gate_default_variant_follows_the_model():
    from agent.commands.gate import _probe_settings
    from agent.gate.evaluate import Limits
    lim = Limits(max_p99_regression=0.1, max_p99_ns=None, max_cold_start_ns=None,
                 max_jitter_rate=None, jitter_threshold_ns=5_000_000)
    common = dict(samples=None, duration=None, warmup=200, cpus=None, intra=None, inter=None)
    s, _c = _probe_settings(lim, model="numpy", builtin="lstm", variant=None, **common)
    assert s.variants == ["numpy"] and s.model.is_numpy
    s, _c = _probe_settings(lim, model=None, builtin="lstm", variant=None, **common)
    assert s.variants == ["tflite"] and not s.model.is_numpy
    with pytest.raises(AgentError, match="TensorFlow variant"):
        _probe_settings(lim, model="numpy", builtin="lstm", variant="xla", **common)


# -- the model and its variant ---------------------------------------------------------------
def test_watch_numpy_probe_is_the_same_computation():
    from agent.watch.probe_worker import build_numpy_probe
    fn, desc = build_numpy_probe()
    m = NumpyLSTM()
    want = m.bind(m.sample)().copy()
    assert np.array_equal(fn(), want) and "numpy-lstm [1,64,32]" in desc
    assert np.all(np.isfinite(want)) and np.any(want != 0)


def test_batch_path_equals_samples_one_at_a_time():
    m = NumpyLSTM()
    xs = np.random.default_rng(3).standard_normal((4, 64, 32)).astype(np.float32)
    one = m.predict(xs)
    assert one.shape == (4, 128)
    np.testing.assert_allclose(m.bind(xs)(), one, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="numpy model takes"):
        m.bind(np.zeros((1, 65, 32), dtype=np.float32))


def test_numpy_variant_builds_and_tf_variants_are_unavailable(monkeypatch):
    for name in HIDDEN:  # any TF import below would raise ImportError
        monkeypatch.setitem(sys.modules, name, None)
    model = load_model(ModelSpec(builtin="numpy"))
    assert model.kind == "numpy" and model.input_shape == (None, 64, 32)
    built = build_callable(model, "numpy", (1, 64, 32))
    assert "not a TensorFlow one" in built.notes[0]
    x = np.random.default_rng(5).standard_normal((1, 64, 32)).astype(np.float32)
    np.testing.assert_array_equal(built.bind(x)(), NumpyLSTM().bind(x)())
    for v in ("eager", "graph", "xla", "tflite", "tflite-int8", "tf-trt"):
        with pytest.raises(VariantUnavailable, match="TensorFlow variant"):
            build_callable(model, v, (1, 64, 32))
    tf_model = LoadedModel(name="m", kind="keras", path="m.keras", signature=None,
                           input_name="x", input_shape=(None, 64, 32), input_dtype="float32",
                           output_name=None, keras_model=object())
    with pytest.raises(VariantUnavailable, match="built-in numpy model only"):
        build_callable(tf_model, "numpy", (1, 64, 32))


def test_shared_callable_keeps_per_thread_state():
    """gate's concurrentN shares one bound callable between caller threads: each thread
    computes into its own buffers, so every result is the single-threaded one."""
    model = load_model(ModelSpec(builtin="numpy"))
    x = np.random.default_rng(9).standard_normal((1, 64, 32)).astype(np.float32)
    want = NumpyLSTM().bind(x)().copy()
    fn = build_callable(model, "numpy", (1, 64, 32)).bind(x)
    bad: list[int] = []
    barrier = threading.Barrier(4)

    def caller() -> None:
        barrier.wait()
        for _ in range(20):
            if not np.array_equal(fn(), want):
                bad.append(1)
    ts = [threading.Thread(target=caller) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


def test_worker_env_single_blas_thread_for_numpy_only(monkeypatch):
    from agent.probe.runner import BLAS_THREAD_VARS, worker_env
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    s, _c = build(model="numpy")
    env = worker_env(s)
    assert all(env[v] == "1" for v in BLAS_THREAD_VARS)
    assert worker_env(build()[0])["OPENBLAS_NUM_THREADS"] == "8"


def test_gate_concurrent_is_the_probe_workers_callers_mode(monkeypatch):
    """gate's concurrentN runs through the probe's runner (one worker process, its
    environment: one BLAS thread for the numpy model) with ProbeSettings.callers = N; the
    caller's settings are left as they were."""
    import agent.gate.evaluate as gate
    import agent.probe.runner as runner
    seen = []

    def fake_run_probe(settings, configs=None, **_kw):
        seen.append((settings, configs))
        raise RuntimeError("stop here")
    monkeypatch.setattr(runner, "run_probe", fake_run_probe)
    s, c = build(model="numpy", samples=1000)
    with pytest.raises(RuntimeError, match="stop here"):
        gate._run_concurrent(16, s, c[0])
    ((ran, configs),) = seen
    assert ran.callers == 16 and ran.samples == 1000 and configs == [c[0]]
    assert s.callers == 1
    assert not hasattr(gate, "_concurrent_worker")


# -- without TensorFlow, end to end ----------------------------------------------------------
def test_apply_threads_imports_tf_only_for_thread_counts(no_tf_env):
    code = ("from agent.probe.config import ThreadConfig\n"
            "from agent.probe.worker import apply_threads\n"
            "apply_threads(ThreadConfig())\n"
            "print('plain ok')\n"
            "apply_threads(ThreadConfig(intra=1))\n")
    p = _py(code, no_tf_env)
    assert "plain ok" in p.stdout
    assert p.returncode != 0 and "import of tensorflow halted" in p.stderr  # really hidden


def test_probe_runs_closed_and_open_loop_without_tf(no_tf_env):
    cpu = max(os.sched_getaffinity(0))
    code = (
        "import json\n"
        "from agent.probe import options\n"
        "from agent.probe.runner import run_probe\n"
        f"kw = {DEFAULTS!r}\n"
        f"kw.update(model='numpy', samples=300, warmup=20, cpus='{cpu}')\n"
        "out = []\n"
        "for rate in (None, 2000.0):\n"
        "    s, c = options.build(**{**kw, 'rate': rate})\n"
        "    res, arrays = run_probe(s, c)\n"
        "    r = res.runs[0]\n"
        "    out.append({'status': r.status, 'reason': r.reason, 'mode': r.mode,\n"
        "                'n': r.latency['count'] if r.latency else 0,\n"
        "                'resp': (r.response or {}).get('count'),\n"
        "                'cpus': r.config['cpus'], 'kind': res.model['kind'],\n"
        "                'notes': r.notes, 'arrays': arrays[0] is not None})\n"
        "print(json.dumps(out))\n")
    p = _py(code, no_tf_env)
    assert p.returncode == 0, p.stderr[-2000:]
    closed, opened = json.loads(p.stdout.strip().splitlines()[-1])
    for r in (closed, opened):
        assert r["status"] == "ok", r["reason"]
        assert r["kind"] == "numpy" and r["cpus"] == [cpu] and r["arrays"]
        assert any("not a TensorFlow one" in n and "BLAS threads 1" in n for n in r["notes"])
    assert closed["mode"] == "closed" and closed["n"] == 300
    assert opened["mode"] == "open" and opened["resp"] and opened["resp"] > 0


def test_gate_concurrent4_without_tf(no_tf_env):
    """``gate --model numpy --scenarios concurrent4``'s scenario: four caller threads in one
    probe worker, their samples one run (ceil(300 / 4) = 75 each), no TensorFlow anywhere."""
    code = (
        "import json\n"
        "from agent.gate import evaluate as gate\n"
        "from agent.probe import options\n"
        f"kw = {DEFAULTS!r}\n"
        "kw.update(model='numpy', samples=300, warmup=20)\n"
        "s, c = options.build(**kw)\n"
        "sr = gate.run_scenario('concurrent4', s, c[0])\n"
        "sm = sr.summary\n"
        "print(json.dumps({'n': int(sr.latency_ns.size), 'variant': sr.variant,\n"
        "                  'cold': sr.cold_start_ns, 'keys': sorted(sm), 'run': sm['run'],\n"
        "                  'callers': sm['callers'], 'per': sm['per_caller'],\n"
        "                  'count': sm['latency']['count'], 'notes': sm['notes'],\n"
        "                  'settings_callers': sm['settings']['callers']}))\n")
    p = _py(code, no_tf_env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["n"] == 300 and out["count"] == 300 and out["variant"] == "numpy"
    assert out["callers"] == 4 and out["per"] == 75 and out["settings_callers"] == 4
    assert out["keys"] == sorted(["model", "settings", "host", "latency", "scenario",
                                  "callers", "per_caller", "notes", "run"])
    assert sorted(out["run"]) == ["cold_start_ns", "config", "variant", "warmup"]
    assert out["run"]["variant"] == "numpy" and out["cold"] == [out["run"]["cold_start_ns"]]
    assert out["run"]["warmup"]["calls"] >= 20
    assert any("BLAS threads 1" in n for n in out["notes"])


def test_cli_probe_numpy_without_tf_is_recorded(no_tf_env, tmp_path):
    db = tmp_path / "h.sqlite"
    p = subprocess.run([HFTAGENT, "probe", "--model", "numpy",
                        "--samples", "200", "--warmup", "20", "--json", "--db", str(db)],
                       env=no_tf_env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["model"]["kind"] == "numpy" and [r["variant"] for r in doc["runs"]] == ["numpy"]
    from agent.history import History
    with History(db) as h:
        (run,) = h.runs(limit=None)
        assert run.model_key == "builtin:numpy" and run.variant == "numpy"
        assert run.sample_count == 200 and h.samples(run.id) is not None
    bad = subprocess.run([HFTAGENT, "probe", "--model", "numpy",
                          "--variant", "xla", "--no-history"], env=no_tf_env,
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "TensorFlow variant" in bad.stderr


def test_cpus_of_the_isolated_cpuset_are_accepted_though_this_cgroup_lacks_them(monkeypatch):
    """After a cgroup v2 isolation the caller's cgroup has lost the isolated CPUs: probe and
    gate accept them, since the worker joins the isolated cpuset to pin itself there."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    monkeypatch.setattr(options, "_can_pin", lambda c: False)
    monkeypatch.setattr(options, "_isolated_cpus", lambda host: set())
    with pytest.raises(AgentError, match="outside this process's cpuset"):
        options.parse_cpus(str(cpu))
    monkeypatch.setattr(options, "_isolated_cpus", lambda host: {cpu})
    assert options.parse_cpus(str(cpu)) == [cpu]
