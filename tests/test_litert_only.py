"""A box with LiteRT and no TensorFlow (issue #27 item 5): `probe` and `watch --probe tf` on a
.tflite model import LiteRT only. TensorFlow is hidden from every process of the test by a
package on PYTHONPATH that raises ModuleNotFoundError, as on a host where it is not installed;
the .tflite itself is made with TensorFlow beforehand (in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tf]
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


@pytest.fixture(scope="module")
def tflite_model(tmp_path_factory) -> Path:
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("ai_edge_litert")
    d = tmp_path_factory.mktemp("litert")
    inp = tf.keras.Input((16, 8), batch_size=1)
    x = tf.keras.layers.Dense(16, activation="relu")(tf.keras.layers.Flatten()(inp))
    m = tf.keras.Model(inp, tf.keras.layers.Dense(3)(x))
    p = d / "m.tflite"
    p.write_bytes(tf.lite.TFLiteConverter.from_keras_model(m).convert())
    return p


@pytest.fixture(scope="module")
def no_tf_env(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("notf")
    for mod in ("tensorflow", "keras", "tf_keras"):
        (d / mod).mkdir()
        (d / mod / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{mod}'\", name={mod!r})\n")
    repo = str(Path(__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=f"{d}{os.pathsep}{repo}", TF_CPP_MIN_LOG_LEVEL="2")


def test_the_blocker_hides_tensorflow(no_tf_env):
    r = subprocess.run([sys.executable, "-c", "import tensorflow"], env=no_tf_env,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "No module named 'tensorflow'" in r.stderr


def test_probe_on_a_tflite_model_needs_no_tensorflow(tflite_model, no_tf_env, tmp_path):
    r = subprocess.run([*CLI, "probe", "--model", str(tflite_model), "--variant", "tflite",
                        "--samples", "300", "--warmup", "50", "--json", "--no-history"],
                       env=no_tf_env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    (run,) = [x for x in doc["runs"] if x["variant"] == "tflite"]
    assert run["status"] == "ok" and run["latency"]["count"] == 300
    assert "No module named" not in r.stderr


def test_watch_tf_probe_on_a_tflite_model_needs_no_tensorflow(tflite_model, no_tf_env, tmp_path):
    r = subprocess.run([*CLI, "watch", "--probe", "tf", "--model", str(tflite_model),
                        "--variant", "tflite", "--duration", "2", "--no-live", "--json",
                        "--trace", "off", "--rate", "200"],
                       env=no_tf_env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert "tflite" in s["source"] and s["samples"] > 50


@pytest.mark.parametrize("argv", [["probe", "--samples", "100", "--no-history"],
                                  ["watch", "--duration", "2", "--no-live", "--trace", "off"]])
def test_the_builtin_model_without_tensorflow_is_one_line_naming_the_way_out(argv, no_tf_env,
                                                                              tmp_path):
    r = subprocess.run([*CLI, *argv], env=no_tf_env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    errors = [x for x in r.stderr.splitlines() if x.startswith("hftagent: error:")]
    assert len(errors) == 1, r.stderr[-2000:]
    assert "needs TensorFlow, which is not installed here" in errors[0]
    assert "--variant tflite" in errors[0] and "--probe numpy" in errors[0]
