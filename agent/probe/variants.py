"""Inference variants: build a fixed-shape callable for a model + variant.

``build_callable(model, variant, shape)`` returns a :class:`BuiltVariant` whose ``bind(x)``
gives the zero-argument callable the harness times (inputs converted once, outside the timed
region) and whose ``predict(xs)`` runs agreement inputs. TensorFlow is imported inside
functions only.

Variants
  eager        plain Keras model call (needs a Keras model: SavedModels hold graphs only)
  graph        tf.function with a fixed input_signature, concrete function
  xla          the same with jit_compile=True
  tflite       LiteRT interpreter (ai-edge-litert), fp32, threads set; converted from a
               fixed-shape SavedModel (see models.py for why never from a concrete function)
  tflite-int8  full-integer post-training quantization (TFLITE_BUILTINS_INT8 only, float
               in/out interface) with a representative dataset
  tf-trt       TF-TRT FP16 (needs TF built with CUDA + TensorRT and a GPU)
  numpy        the built-in numpy model's recurrence (agent/probe/numpy_model.py), the only
               variant of that model and of no other: no TensorFlow is imported

A timed tflite call is set_tensor + invoke + get_tensor: the whole request, as a server would
do it; a timed TF call returns the output tensor without ``.numpy()`` (on CPU the result is
already computed when the call returns).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.probe.models import LoadedModel, _one_line

TF_VARIANTS: tuple[str, ...] = ("eager", "graph", "xla", "tflite", "tflite-int8", "tf-trt")
NUMPY_VARIANTS: tuple[str, ...] = ("numpy",)
VARIANTS: tuple[str, ...] = TF_VARIANTS + NUMPY_VARIANTS
DEFAULT_VARIANTS: tuple[str, ...] = ("graph", "xla", "tflite")


class VariantUnavailable(Exception):
    """The variant cannot exist here (missing runtime/hardware); the message is the reason."""


class VariantFailed(Exception):
    """Building/converting the variant failed (an op TFLite or XLA lacks, ...)."""


@dataclass
class BuiltVariant:
    name: str
    shape: tuple[int, ...]
    build_s: float
    bind: Callable[[np.ndarray], Callable[[], object]]
    predict: Callable[[np.ndarray], np.ndarray]
    notes: list[str] = field(default_factory=list)


def parse_variants(text: str, numpy: bool = False) -> list[str]:
    """``"all"`` or a comma list → ordered, de-duplicated variant names (ValueError if unknown).
    ``"all"`` is every TF variant, or the numpy model's one (``numpy``); which names apply to
    which model is :func:`check_for_model`'s."""
    if text.strip() == "all":
        return list(NUMPY_VARIANTS if numpy else TF_VARIANTS)
    out: list[str] = []
    for v in (p.strip() for p in text.split(",")):
        if not v:
            continue
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r} (known: {', '.join(VARIANTS)}, all)")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError("no variant given")
    return out


def default_variants(numpy: bool = False) -> list[str]:
    return list(NUMPY_VARIANTS if numpy else DEFAULT_VARIANTS)


def check_for_model(variants: list[str], numpy: bool) -> None:
    """ValueError (one line) when a variant cannot apply to the model: a TF variant for the
    numpy model, the numpy variant for a TF model."""
    if numpy:
        bad = [v for v in variants if v not in NUMPY_VARIANTS]
        if bad:
            raise ValueError(f"{bad[0]} is a TensorFlow variant; the numpy model (a numpy "
                             "stand-in, no TensorFlow) has only the numpy variant")
    elif any(v in NUMPY_VARIANTS for v in variants):
        raise ValueError("numpy is the variant of the built-in numpy model only (--model "
                         "numpy); a TensorFlow model has eager, graph, xla, tflite, "
                         "tflite-int8, tf-trt")


def build_callable(model: LoadedModel, variant: str, shape: tuple[int, ...], *,
                   threads: int | None = None, calib: np.ndarray | None = None,
                   workdir: str | None = None) -> BuiltVariant:
    """Build ``variant`` of ``model`` for the fixed input ``shape``.

    ``threads``: LiteRT interpreter threads (None: the CPUs this process may run on).
    ``calib``: representative samples [N, *shape[1:]] for tflite-int8 (None: synthetic, with a
    note). Raises VariantUnavailable / VariantFailed with a one-line reason.
    """
    builders = {"eager": _eager, "graph": _graph, "xla": _xla, "tflite": _tflite,
                "tflite-int8": _tflite_int8, "tf-trt": _tftrt, "numpy": _numpy}
    if variant not in builders:
        raise ValueError(f"unknown variant {variant!r}")
    # Checked before any builder runs: the TF builders import TensorFlow first.
    if (model.numpy_model is not None) != (variant in NUMPY_VARIANTS):
        try:
            check_for_model([variant], model.numpy_model is not None)
        except ValueError as exc:
            raise VariantUnavailable(str(exc)) from None
    t0 = time.perf_counter()
    own = workdir is None
    wd = workdir or tempfile.mkdtemp(prefix="hftagent-probe-")
    try:
        bind, predict, notes = builders[variant](model, tuple(shape), threads=threads,
                                                 calib=calib, workdir=wd)
    finally:
        if own:
            shutil.rmtree(wd, ignore_errors=True)
    return BuiltVariant(variant, tuple(shape), time.perf_counter() - t0, bind, predict, notes)


def _numpy(model: LoadedModel, shape, **_):
    """The numpy model's recurrence: numpy only (BLAS threads: the worker's environment,
    OPENBLAS_NUM_THREADS/OMP_NUM_THREADS/MKL_NUM_THREADS, set to 1 by agent/probe/runner.py)."""
    m = model.numpy_model
    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    note = ("numpy stand-in (LSTM-shaped numpy recurrence, no TensorFlow): a host "
            "measurement, not a TensorFlow one"
            + (f"; BLAS threads {threads}" if threads else ""))

    def bind(x: np.ndarray) -> Callable[[], object]:
        # NumpyLSTM's callable reuses its buffers: one per calling thread, so that callers
        # sharing it (gate's concurrentN) never compute into each other's state.
        import threading
        local = threading.local()
        local.fn = m.bind(x)  # the binding thread's, built now (shape errors show here)

        def call() -> object:
            fn = getattr(local, "fn", None)
            if fn is None:
                fn = local.fn = m.bind(x)
            return fn()
        return call
    return bind, m.predict, [note]


def _spec(model: LoadedModel, shape: tuple[int, ...]) -> Any:
    import tensorflow as tf
    return tf.TensorSpec(shape, tf.as_dtype(model.input_dtype), name="x")


def _tf_body(model: LoadedModel) -> Callable[[Any], Any]:
    """The model as a function of one tensor returning one tensor."""
    if model.keras_model is not None:
        km = model.keras_model
        return lambda x: km(x, training=False)
    if model.signature_fn is not None:
        fn, name, out = model.signature_fn, model.input_name, model.output_name
        if out is None:
            return lambda x: fn(**{name: x})
        return lambda x: fn(**{name: x})[out]
    raise VariantUnavailable(f"a {model.kind} model has no TensorFlow graph (only tflite runs)")


def _tf_binders(fn: Callable[[Any], Any], batched: bool = False):
    import tensorflow as tf

    def bind(x: np.ndarray) -> Callable[[], object]:
        xt = tf.constant(x)
        leaves = tf.nest.flatten(fn(xt))
        if any("GPU" in (getattr(t, "device", "") or "") for t in leaves):
            # TF's GPU kernels run asynchronously: a timed call that returns device tensors
            # measures only the launch. Copy the outputs back, as a trading process must to
            # act on the signal, so the time covers the inference and its D2H copy.
            return lambda: [t.numpy() for t in tf.nest.flatten(fn(xt))]
        return lambda: fn(xt)

    def predict(xs: np.ndarray) -> np.ndarray:
        if batched:
            return np.asarray(fn(tf.constant(xs)))
        return np.concatenate([np.asarray(fn(tf.constant(xs[i:i + 1])))
                               for i in range(xs.shape[0])])
    return bind, predict


def _eager(model: LoadedModel, shape, **_):
    if model.keras_model is None:
        raise VariantUnavailable(f"eager needs a Keras model; a {model.kind} holds compiled "
                                 "graphs only (pass a .keras file)")
    km = model.keras_model
    bind, predict = _tf_binders(lambda x: km(x, training=False), batched=True)
    return bind, predict, []


def _concrete(model: LoadedModel, shape, jit: bool):
    import tensorflow as tf
    body = _tf_body(model)
    try:
        cf = tf.function(body, input_signature=[_spec(model, shape)],
                         jit_compile=jit).get_concrete_function()
    except Exception as exc:  # noqa: BLE001 - tracing errors come in many types
        raise VariantFailed(f"tracing failed: {_one_line(exc)}") from None
    return cf


def _graph(model: LoadedModel, shape, **_):
    cf = _concrete(model, shape, jit=False)
    bind, predict = _tf_binders(cf)
    return bind, predict, []


def _xla(model: LoadedModel, shape, **_):
    cf = _concrete(model, shape, jit=True)
    bind, predict = _tf_binders(cf)
    return bind, predict, ["XLA compiles on the first call: cold start includes compilation"]


def _fixed_saved_model(model: LoadedModel, shape, workdir: str) -> str:
    """A SavedModel dir with a fixed-shape serving signature, for the converters."""
    if model.keras_model is not None:
        if model.fixed_saved_model and shape[0] == 1:
            return model.fixed_saved_model  # the built-in's cached [1, ...] export
        out = os.path.join(workdir, f"sm-{'x'.join(map(str, shape))}")
        if not os.path.isdir(out):
            model.keras_model.export(out, verbose=False, input_signature=[_spec(model, shape)])
        return out
    if model.kind == "savedmodel":
        # Converted as is; dynamic dims are resized after conversion. An LSTM exported with a
        # dynamic batch cannot be lowered (TensorListReserve needs a static element_shape):
        # the conversion error says so and how to re-export.
        return model.path
    raise VariantUnavailable(f"cannot convert a {model.kind} model")


def _converter(model: LoadedModel, shape, workdir: str):
    import tensorflow as tf
    sm = _fixed_saved_model(model, shape, workdir)
    keys = [model.signature] if model.kind == "savedmodel" else None
    return tf.lite.TFLiteConverter.from_saved_model(sm, signature_keys=keys)


def _convert(conv: Any) -> bytes:
    try:
        return conv.convert()
    except Exception as exc:  # noqa: BLE001 - ConverterError and friends
        text = str(exc)
        hint = ""
        if "TensorListReserve" in text or "element_shape to be static" in text:
            hint = (" (a recurrent layer exported with a dynamic dim: re-export the model with "
                    "a fixed input_signature, e.g. model.export(path, input_signature="
                    "[tf.TensorSpec([1, T, F])]))")
        elif "select tf ops" in text.lower() or "SELECT_TF_OPS" in text:
            hint = " (the model needs TF ops that LiteRT builtins lack)"
        first = next((ln for ln in text.splitlines() if "error:" in ln), _one_line(exc))
        raise VariantFailed(f"TFLite conversion failed: {first.strip()[:240]}{hint}") from None


def _interpreter(data: bytes, shape, threads: int | None):
    from ai_edge_litert.interpreter import Interpreter
    n = threads if threads and threads > 0 else len(os.sched_getaffinity(0))
    it = Interpreter(model_content=data, num_threads=n)
    d = it.get_input_details()[0]
    if tuple(d["shape"]) != tuple(shape):
        it.resize_tensor_input(d["index"], list(shape), strict=False)
    it.allocate_tensors()
    d = it.get_input_details()[0]
    o = it.get_output_details()[0]
    iidx, oidx = d["index"], o["index"]
    set_tensor, invoke, get_tensor = it.set_tensor, it.invoke, it.get_tensor
    dtype = d["dtype"]

    def bind(x: np.ndarray) -> Callable[[], object]:
        xx = np.ascontiguousarray(x, dtype=dtype)

        def call() -> object:
            set_tensor(iidx, xx)
            invoke()
            return get_tensor(oidx)
        return call

    def predict(xs: np.ndarray) -> np.ndarray:
        outs = []
        for i in range(xs.shape[0]):
            set_tensor(iidx, np.ascontiguousarray(xs[i:i + 1], dtype=dtype))
            invoke()
            outs.append(get_tensor(oidx).copy())
        return np.concatenate(outs)
    bind.interpreter = it  # type: ignore[attr-defined]
    return bind, predict, n


def _tflite(model: LoadedModel, shape, *, threads, workdir, **_):
    if model.tflite_bytes is not None:
        data = model.tflite_bytes
    else:
        data = _convert(_converter(model, shape, workdir))
    try:
        bind, predict, n = _interpreter(data, shape, threads)
    except Exception as exc:  # noqa: BLE001
        raise VariantFailed(f"LiteRT interpreter failed: {_one_line(exc)}") from None
    return bind, predict, [f"LiteRT num_threads={n}, {len(data) / 1024:.0f} KiB"]


def _tflite_int8(model: LoadedModel, shape, *, threads, calib, workdir, **_):
    if model.tflite_bytes is not None:
        raise VariantUnavailable("a .tflite file cannot be re-quantized: pass the SavedModel "
                                 "or .keras model")
    notes = []
    if calib is None:
        rng = np.random.default_rng(12345)
        calib = rng.standard_normal((128, *shape[1:])).astype(model.input_dtype)
        notes.append("synthetic calibration data (standard normal): INT8 scales are not "
                     "representative; pass --calib FILE.npy with 100+ real samples")
    else:
        notes.append(f"calibrated on {calib.shape[0]} samples from --calib")
    data, how, calibrated = _full_integer(model, shape, calib, workdir)
    if not calibrated:
        notes = []  # dynamic range: the calibration data was not used
    notes.append(how)
    try:
        bind, predict, n = _interpreter(data, shape, threads)
    except Exception as exc:  # noqa: BLE001
        raise VariantFailed(f"LiteRT interpreter failed: {_one_line(exc)}") from None
    notes.append(f"LiteRT num_threads={n}, {len(data) / 1024:.0f} KiB, float in/out")
    return bind, predict, notes


def _full_integer(model: LoadedModel, shape, calib: np.ndarray,
                  workdir: str) -> tuple[bytes, str, bool]:
    """Full-integer INT8 conversion in a child process (see agent/probe/quantize.py); when TF's
    calibrator crashes that child, dynamic-range INT8 instead, said plainly in the note."""
    import signal
    import subprocess
    import sys

    import tensorflow as tf
    sm = _fixed_saved_model(model, shape, workdir)
    sig = model.signature if model.kind == "savedmodel" and model.signature else "-"
    calib_path = os.path.join(workdir, "int8-calib.npy")
    out = os.path.join(workdir, "int8.tflite")
    np.save(calib_path, np.ascontiguousarray(calib, dtype=np.float32))
    proc = subprocess.run([sys.executable, "-P", "-m", "agent.probe.quantize", sm, sig, calib_path, out],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode == 0:
        with open(out, "rb") as fh:
            return fh.read(), "full-integer INT8 (int8 weights and activations)", True
    if proc.returncode > 0:
        msg = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise VariantFailed(f"INT8 {msg}")
    try:
        sig_name = signal.Signals(-proc.returncode).name
    except ValueError:
        sig_name = f"signal {-proc.returncode}"
    conv = _converter(model, shape, workdir)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]  # no representative dataset: dynamic range
    return _convert(conv), (f"TF's INT8 calibrator crashed ({sig_name}) on this model, as it "
                            "does on recurrent layers lowered to WHILE loops: fell back to "
                            "dynamic-range INT8 (int8 weights, float activations)"), False


def tftrt_unavailable_reason() -> str | None:
    """Why TF-TRT cannot run here, or None when it can (imports TensorFlow)."""
    import tensorflow as tf
    if not tf.test.is_built_with_cuda():
        return "TensorFlow is built without CUDA (tensorflow-cpu)"
    if not tf.config.list_physical_devices("GPU"):
        return "no GPU visible to TensorFlow"
    try:
        from tensorflow.python.compiler.tensorrt import trt_convert  # noqa: F401
        from tensorflow.python.compiler.tensorrt.utils import is_linked_tensorrt_version
    except ImportError as exc:
        return f"TF-TRT not importable: {exc}"
    try:
        if not is_linked_tensorrt_version((7, 0, 0)):
            return "TensorFlow is not linked against TensorRT"
    except Exception as exc:  # noqa: BLE001
        return f"TensorRT check failed: {_one_line(exc)}"
    return None


def _tftrt(model: LoadedModel, shape, *, workdir, **_):
    # Not exercised in CI (no GPU here); written to the TF-TRT V2 API: FP16,
    # minimum_segment_size 3, 1 GiB workspace (the seeds' settings).
    reason = tftrt_unavailable_reason()
    if reason:
        raise VariantUnavailable(reason)
    import tensorflow as tf
    from tensorflow.python.compiler.tensorrt import trt_convert as trt
    sm = _fixed_saved_model(model, shape, workdir)
    try:
        conv = trt.TrtGraphConverterV2(
            input_saved_model_dir=sm, precision_mode=trt.TrtPrecisionMode.FP16,
            minimum_segment_size=3, max_workspace_size_bytes=1 << 30)
        conv.convert()
        x = np.zeros(shape, dtype=model.input_dtype)
        conv.build(input_fn=lambda: [tf.constant(x)])
        out = os.path.join(workdir, "trt")
        conv.save(out)
        loaded = tf.saved_model.load(out)
    except Exception as exc:  # noqa: BLE001
        raise VariantFailed(f"TF-TRT conversion failed: {_one_line(exc)}") from None
    sig = loaded.signatures["serving_default"]
    (name,) = sig.structured_input_signature[1]
    out_key = sorted(sig.structured_outputs)[0]
    fn = lambda x: sig(**{name: x})[out_key]  # noqa: E731
    bind, predict = _tf_binders(fn)
    bind.keepalive = loaded  # type: ignore[attr-defined]
    return bind, predict, ["TF-TRT FP16, minimum_segment_size=3, 1 GiB workspace"]
