"""Real TensorFlow (CPU) on small models: variants, agreement, the LSTM TFLite path, INT8,
the worker runner, JSON/CSV schema and the CLI. Small sample counts: this is not a benchmark."""

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.tf, pytest.mark.slow]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("HFTAGENT_CACHE", str(d))
    yield d
    mp.undo()


@pytest.fixture(scope="module")
def small_lstm(tmp_path_factory):
    """A small LSTM saved as .keras (dynamic batch), the shape of the issue's failing case."""
    import keras
    keras.utils.set_random_seed(3)
    inp = keras.Input((8, 4), name="x")
    out = keras.layers.Dense(3)(keras.layers.LSTM(16)(inp))
    path = tmp_path_factory.mktemp("m") / "lstm.keras"
    keras.Model(inp, out).save(path)
    return str(path)


def _load(path):
    from agent.probe.models import ModelSpec, load_model
    return load_model(ModelSpec(path=path))


def test_lstm_tflite_converts_and_agrees_with_graph(small_lstm):
    from agent.probe.stats import agreement
    from agent.probe.variants import build_callable
    m = _load(small_lstm)
    assert m.input_shape == (None, 8, 4)
    xs = np.random.default_rng(0).standard_normal((16, 8, 4)).astype(np.float32)
    ref = build_callable(m, "graph", (1, 8, 4)).predict(xs)
    for v in ("tflite", "xla", "eager"):
        b = build_callable(m, v, (1, 8, 4))
        out = b.predict(xs)
        a = agreement(ref, out)
        assert a["passes"] and a["argmax_share"] == 1.0 and a["max_rel_err"] < 1e-4, v
        b.bind(xs[:1])()  # the bound hot-loop callable runs


def test_tflite_int8_mlp_with_calib_agrees(cache):
    from agent.probe.models import ModelSpec, load_model
    from agent.probe.stats import agreement
    from agent.probe.variants import build_callable
    m = load_model(ModelSpec(builtin="mlp"))
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((100, 256)).astype(np.float32)
    xs = rng.standard_normal((64, 256)).astype(np.float32)
    ref = build_callable(m, "graph", (1, 256)).predict(xs)
    b = build_callable(m, "tflite-int8", (1, 256), calib=calib)
    assert any("calibrated on 100" in n for n in b.notes)
    a = agreement(ref, b.predict(xs))
    assert a["finite"] and a["max_abs_err"] > 0          # really quantized
    assert a["argmax_share"] >= 0.8                      # close to fp32, not identical
    assert any("full-integer INT8" in n for n in b.notes)


def test_tflite_int8_lstm_survives_the_calibrator(small_lstm):
    """TF 2.21's calibrator segfaults on LSTMs lowered to WHILE loops: the conversion runs in a
    child process, and the variant falls back to dynamic-range INT8 with a note, or is fully
    quantized if a TF release fixes the calibrator. Either way it runs and agrees."""
    from agent.probe.stats import agreement
    from agent.probe.variants import build_callable
    m = _load(small_lstm)
    xs = np.random.default_rng(2).standard_normal((16, 8, 4)).astype(np.float32)
    ref = build_callable(m, "graph", (1, 8, 4)).predict(xs)
    b = build_callable(m, "tflite-int8", (1, 8, 4), calib=xs)
    assert any("full-integer INT8" in n or "fell back to dynamic-range INT8" in n for n in b.notes)
    a = agreement(ref, b.predict(xs))
    assert a["finite"] and a["argmax_share"] >= 0.8


def test_builtin_is_cached_and_deterministic(cache):
    from agent.probe.models import ensure_builtin
    d1, t1 = ensure_builtin("conv1d")
    d2, t2 = ensure_builtin("conv1d")
    assert t1 is not None and t2 is None and d1 == d2
    assert (d1 / "saved_model" / "saved_model.pb").is_file()
    meta = json.loads((d1 / "meta.json").read_text())
    assert meta["input_shape"] == [1, 64, 32]


def test_unavailable_and_failed_variants_have_reasons(small_lstm, tmp_path):
    from agent.probe.variants import VariantUnavailable, build_callable, tftrt_unavailable_reason
    m = _load(small_lstm)
    reason = tftrt_unavailable_reason()
    assert reason  # this CI box has no CUDA/TensorRT
    with pytest.raises(VariantUnavailable, match="CUDA|GPU|TensorRT"):
        build_callable(m, "tf-trt", (1, 8, 4))


def test_run_config_end_to_end_json_schema_and_arrays(cache, small_lstm):
    from agent.probe import ProbeSettings, run_config
    from agent.probe.harness import COLUMNS
    from agent.probe.models import ModelSpec
    from agent.probe.result import SCHEMA_VERSION, ProbeResult
    s = ProbeSettings(model=ModelSpec(path=small_lstm), variants=["graph", "tflite", "tf-trt"],
                      samples=700, duration_s=5, warmup=50, warmup_budget_s=2, agree_n=16)
    res, arrays = run_config(s)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["schema"] == "hftagent.probe" and d["schema_version"] == SCHEMA_VERSION
    assert d["model"]["probe_shape"] == [1, 8, 4]
    assert any("dynamic dims" in w for w in d["warnings"])
    by = {r["variant"]: r for r in d["runs"]}
    assert by["tf-trt"]["status"] == "unavailable" and by["tf-trt"]["reason"]
    for v in ("graph", "tflite"):
        r = by[v]
        assert r["status"] == "ok" and r["latency"]["count"] >= 1
        assert r["cold_start_ns"] > 0 and r["warmup"]["calls"] >= 50
        assert r["agreement"]["passes"]
        assert set(r["latency"]) >= {"count", "mean_ns", "stdev_ns", "min_ns", "p50_ns",
                                     "p90_ns", "p99_ns", "p999_ns", "max_ns", "sufficient"}
    i = [r["variant"] for r in d["runs"]].index("graph")
    arr = arrays[i]
    assert set(arr) == set(COLUMNS) and arr["end_ns"].dtype == np.int64
    assert arr["end_ns"].size == by["graph"]["latency"]["count"]
    assert int(np.median(arr["end_ns"] - arr["start_ns"])) > 0
    assert d["recommendation"]["variant"] in ("graph", "tflite")
    assert ProbeResult.from_dict(d).to_dict() == d


def test_cli_json_csv_and_bad_input(cache, small_lstm, tmp_path):
    from agent.cli import get_app
    runner = CliRunner()
    app = get_app()
    out_csv = tmp_path / "s.csv"
    r = runner.invoke(app, ["probe", "--model", small_lstm, "--variant", "graph",
                            "--samples", "100", "--warmup", "20", "--rate", "2000",
                            "--json", "--csv", str(out_csv)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    run = d["runs"][0]
    assert run["mode"] == "open" and run["response"]["count"] == 100
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 100 and rows[0]["variant"] == "graph"
    assert int(rows[5]["response_ns"]) >= int(rows[5]["latency_ns"])
    import os

    from agent.history import History
    with History(os.environ["HFTAGENT_DB"]) as h:  # the run was recorded (conftest's private DB)
        [hist] = h.runs()
    assert hist.kind == "probe" and hist.variant == "graph"

    bad = runner.invoke(app, ["probe", "--model", str(tmp_path / "nope.keras")])
    assert bad.exit_code == 1 and "file not found" in bad.stderr
    corrupt = tmp_path / "bad.keras"
    corrupt.write_bytes(b"not a zip")
    r2 = runner.invoke(app, ["probe", "--model", str(corrupt), "--variant", "graph"])
    assert r2.exit_code == 1 and "not a Keras archive" in r2.stderr
    nan = tmp_path / "calib.npy"
    np.save(nan, np.full((10, 8, 4), np.nan, dtype=np.float32))
    r3 = runner.invoke(app, ["probe", "--model", small_lstm, "--calib", str(nan)])
    assert r3.exit_code == 1 and "non-finite" in r3.stderr
    r4 = runner.invoke(app, ["probe", "--variant", "bogus"])
    assert r4.exit_code == 1 and "unknown variant" in r4.stderr
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 8, 4), dtype=np.float64))
    r5 = runner.invoke(app, ["probe", "--model", small_lstm, "--input-data", str(wrong)])
    assert r5.exit_code == 1 and "dtype" in r5.stderr


def test_cli_nothing_ran_exits_nonzero(cache, small_lstm, tmp_path):
    # A .tflite model has no TF graph: eager/graph cannot run -> exit 1 with one line each.
    from agent.cli import get_app
    from agent.probe.variants import _converter
    m = _load(small_lstm)
    data = _converter(m, (1, 8, 4), str(tmp_path))
    p = tmp_path / "m.tflite"
    p.write_bytes(data.convert())
    r = CliRunner().invoke(get_app(), ["probe", "--model", str(p), "--variant", "eager,graph"])
    assert r.exit_code == 1
    assert "no variant ran" in r.stderr and "eager: unavailable" in r.stderr
