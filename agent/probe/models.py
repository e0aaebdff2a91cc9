"""Models for the probe: built-in signal models (built deterministically, cached) and loading
a user model (SavedModel directory, ``.keras`` file, ``.tflite`` file).

TensorFlow is imported inside functions only (this module is imported by the CLI).

Built-ins are built from a fixed seed on first use and cached under the user's cache dir
(``$HFTAGENT_CACHE``, else ``$XDG_CACHE_HOME/hftagent``, else ``~/.cache/hftagent``) as a
``.keras`` file (eager and any-batch graphs) plus a SavedModel exported with a fixed
``[1, ...]`` input signature (``serving_default``). The fixed signature matters: an LSTM
exported with a dynamic batch keeps a TensorList with a dynamic element shape that the TFLite
converter cannot lower (and converting from a concrete function fails at invoke time with
READ_VARIABLE on a resource variable), so TFLite is always converted from a fixed-shape
SavedModel.

The built-in ``numpy`` (``--model numpy`` or ``--builtin numpy``) is no TensorFlow model: an
LSTM-shaped numpy recurrence (agent/probe/numpy_model.py), a stand-in for host acceptance
where TensorFlow is absent. Loading it imports neither TensorFlow nor Keras; its one variant
is ``numpy``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import AgentError

SEED = 20240611
CACHE_FORMAT = 1


def _lstm(keras: Any) -> Any:
    """LSTM order-flow signal model: [1, 64, 32] float32 → LSTM(128) → Dense(3)."""
    inp = keras.Input((64, 32), name="orderflow")
    x = keras.layers.LSTM(128, name="lstm")(inp)
    out = keras.layers.Dense(3, name="signal")(x)
    return keras.Model(inp, out, name="lstm_orderflow")


def _mlp(keras: Any) -> Any:
    """Feature MLP: [1, 256] → Dense(256, relu) → Dense(128, relu) → Dense(3)."""
    inp = keras.Input((256,), name="features")
    x = keras.layers.Dense(256, activation="relu", name="dense1")(inp)
    x = keras.layers.Dense(128, activation="relu", name="dense2")(x)
    out = keras.layers.Dense(3, name="signal")(x)
    return keras.Model(inp, out, name="mlp_features")


def _conv1d(keras: Any) -> Any:
    """Temporal conv net: [1, 64, 32] → Conv1D(64,5) → Conv1D(64,5) → GAP → Dense(3)."""
    inp = keras.Input((64, 32), name="orderflow")
    x = keras.layers.Conv1D(64, 5, activation="relu", name="conv1")(inp)
    x = keras.layers.Conv1D(64, 5, activation="relu", name="conv2")(x)
    x = keras.layers.GlobalAveragePooling1D(name="gap")(x)
    out = keras.layers.Dense(3, name="signal")(x)
    return keras.Model(inp, out, name="conv1d_orderflow")


BUILTINS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "lstm": (_lstm, "LSTM order-flow signal model [1,64,32] → LSTM(128) → Dense(3)"),
    "mlp": (_mlp, "feature MLP [1,256] → 256 → 128 → Dense(3)"),
    "conv1d": (_conv1d, "temporal conv net [1,64,32] → 2×Conv1D(64,5) → Dense(3)"),
}
DEFAULT_BUILTIN = "lstm"
# The TF-free built-in (agent/probe/numpy_model.py): not in BUILTINS, which Keras builds.
NUMPY_MODEL = "numpy"
BUILTIN_NAMES: tuple[str, ...] = (*BUILTINS, NUMPY_MODEL)


def cache_dir() -> Path:
    """The user's cache dir for hftagent (env read here, at call time, never at import)."""
    if os.environ.get("HFTAGENT_CACHE"):
        return Path(os.environ["HFTAGENT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hftagent"


def builtin_dir(name: str) -> Path:
    import keras
    return cache_dir() / "models" / f"{name}-f{CACHE_FORMAT}-seed{SEED}-keras{keras.__version__}"


def ensure_builtin(name: str) -> tuple[Path, float | None]:
    """Build and cache built-in ``name`` if absent. Returns (dir, build seconds or None if
    cached). The dir holds ``model.keras``, ``saved_model/`` and ``meta.json``; it is built in a
    temp dir and renamed into place, so a crash never leaves a half-written cache entry."""
    if name not in BUILTINS:
        raise AgentError(f"unknown built-in model {name!r} (known: {', '.join(BUILTINS)})")
    final = builtin_dir(name)
    if (final / "meta.json").is_file():
        return final, None
    import keras
    import tensorflow as tf

    t0 = time.perf_counter()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        keras.utils.set_random_seed(SEED)
        model = BUILTINS[name][0](keras)
        model.save(tmp / "model.keras")
        shape = [1, *model.inputs[0].shape[1:]]
        model.export(str(tmp / "saved_model"), verbose=False,
                     input_signature=[tf.TensorSpec(shape, tf.float32, name=model.inputs[0].name)])
        meta = {"name": name, "description": BUILTINS[name][1], "seed": SEED,
                "input_shape": shape, "keras": keras.__version__, "tensorflow": tf.__version__}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process cached it first: theirs is as good as ours.
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final, time.perf_counter() - t0


@dataclass
class ModelSpec:
    """What to probe (JSON-serialisable: it travels to worker processes)."""

    path: str | None = None
    builtin: str = DEFAULT_BUILTIN
    signature: str = "serving_default"

    @property
    def is_numpy(self) -> bool:
        """The TF-free built-in numpy stand-in."""
        return self.path is None and self.builtin == NUMPY_MODEL

    def kind(self) -> str:
        """keras | savedmodel | tflite | builtin | numpy, from the path alone (no TF needed)."""
        if self.path is None:
            return NUMPY_MODEL if self.builtin == NUMPY_MODEL else "builtin"
        p = Path(self.path)
        if not p.exists():
            raise AgentError(f"model not found: {self.path}")
        if p.is_dir():
            if not (p / "saved_model.pb").is_file() and not (p / "saved_model.pbtxt").is_file():
                raise AgentError(f"not a SavedModel directory (no saved_model.pb): {self.path}")
            return "savedmodel"
        if p.suffix == ".keras":
            return "keras"
        if p.suffix == ".tflite":
            return "tflite"
        raise AgentError(f"unsupported model file {self.path}: expected a SavedModel directory, "
                         "a .keras file or a .tflite file")


@dataclass
class LoadedModel:
    """A loaded model, its single input and chosen output.

    ``input_shape`` is the signature's shape (None for dynamic dims). ``keras_model`` is set
    for builtin/.keras; ``signature_fn`` for SavedModels; ``tflite_bytes`` for .tflite files.
    ``fixed_saved_model`` is a SavedModel dir with a fixed [1, ...] signature when one exists.
    ``numpy_model`` is the :class:`agent.probe.numpy_model.NumpyLSTM` of the ``numpy`` kind.
    """

    name: str
    kind: str
    path: str
    signature: str | None
    input_name: str
    input_shape: tuple[int | None, ...]
    input_dtype: str
    output_name: str | None
    keras_model: Any = None
    signature_fn: Any = None
    tflite_bytes: bytes | None = None
    fixed_saved_model: str | None = None
    numpy_model: Any = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "path": self.path,
                "signature": self.signature, "input_name": self.input_name,
                "input_shape": list(self.input_shape), "input_dtype": self.input_dtype,
                "output_name": self.output_name}


def load_model(spec: ModelSpec) -> LoadedModel:
    """Load ``spec`` (imports TensorFlow, except for the numpy built-in). Bad input raises
    AgentError with one clear line."""
    kind = spec.kind()
    if kind == NUMPY_MODEL:
        return load_numpy_model()
    if kind == "tflite":
        return _load_tflite(Path(spec.path))  # type: ignore[arg-type]
    try:
        return _load_tf_model(spec, kind)
    except ModuleNotFoundError as exc:
        raise tf_missing(exc, spec) from None


def tf_missing(exc: ModuleNotFoundError, spec: ModelSpec) -> Exception:
    """The one line for a model that needs TensorFlow on a box without it (a LiteRT-only
    production box); ``exc`` itself when another module is missing."""
    if (exc.name or "").split(".")[0] not in ("tensorflow", "keras"):
        return exc
    what = f"the built-in model {spec.builtin}" if spec.kind() == "builtin" else \
        f"{Path(spec.path or '').name} ({spec.kind()})"
    return AgentError(f"{what} needs TensorFlow, which is not installed here: give a .tflite "
                      f"model (--model FILE.tflite --variant tflite runs on LiteRT alone) or "
                      f"the numpy stand-in (probe --model numpy, watch --probe numpy)")


def _load_tf_model(spec: ModelSpec, kind: str) -> LoadedModel:
    """A built-in, Keras or SavedModel model (imports TensorFlow)."""
    if kind == "builtin":
        d, _ = ensure_builtin(spec.builtin)
        m = _load_keras(d / "model.keras", f"builtin:{spec.builtin}")
        m.kind = "builtin"
        m.fixed_saved_model = str(d / "saved_model")
        return m
    if kind == "keras":
        return _load_keras(Path(spec.path), Path(spec.path).name)  # type: ignore[arg-type]
    return _load_saved_model(Path(spec.path), spec.signature)  # type: ignore[arg-type]


def load_numpy_model() -> LoadedModel:
    """The built-in numpy stand-in (numpy only: no TensorFlow, Keras or LiteRT import)."""
    from agent.probe.numpy_model import NumpyLSTM
    m = NumpyLSTM()
    return LoadedModel(name=f"builtin:{NUMPY_MODEL}", kind=NUMPY_MODEL, path="",
                       signature=None, input_name="orderflow", input_shape=m.input_shape,
                       input_dtype="float32", output_name=None, numpy_model=m)


def _load_keras(path: Path, name: str) -> LoadedModel:
    import keras
    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as exc:  # noqa: BLE001 - corrupt files raise anything
        raise AgentError(f"cannot load Keras model {path}: {_one_line(exc)}") from None
    if len(model.inputs) != 1:
        raise AgentError(f"model {path} has {len(model.inputs)} inputs; the probe supports "
                         "single-input models")
    t = model.inputs[0]
    return LoadedModel(name=name, kind="keras", path=str(path), signature=None,
                       input_name=t.name, input_shape=tuple(t.shape),
                       input_dtype=str(t.dtype), output_name=None, keras_model=model)


def _load_saved_model(path: Path, signature: str) -> LoadedModel:
    import tensorflow as tf
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # noqa: BLE001
        raise AgentError(f"cannot load SavedModel {path}: {_one_line(exc)}") from None
    sigs = getattr(loaded, "signatures", {}) or {}
    if signature not in sigs:
        have = ", ".join(sorted(sigs)) or "none"
        raise AgentError(f"SavedModel {path} has no signature {signature!r} (has: {have}); "
                         "pick one with --signature")
    fn = sigs[signature]
    inputs = fn.structured_input_signature[1]
    if len(inputs) != 1:
        raise AgentError(f"signature {signature!r} has {len(inputs)} inputs; the probe "
                         "supports single-input signatures")
    (in_name, in_spec), = inputs.items()
    outputs = fn.structured_outputs
    notes = []
    if isinstance(outputs, dict):
        out_name = sorted(outputs)[0]
        if len(outputs) > 1:
            notes.append(f"signature has {len(outputs)} outputs; agreement uses {out_name!r}")
    else:
        out_name = None
    m = LoadedModel(name=path.name, kind="savedmodel", path=str(path), signature=signature,
                    input_name=in_name, input_shape=tuple(in_spec.shape.as_list()),
                    input_dtype=in_spec.dtype.name, output_name=out_name, signature_fn=fn,
                    notes=notes)
    m._keepalive = loaded  # type: ignore[attr-defined]  # the signature needs its object alive
    if all(d is not None for d in m.input_shape):
        m.fixed_saved_model = str(path)
    return m


def _load_tflite(path: Path) -> LoadedModel:
    from ai_edge_litert.interpreter import Interpreter
    data = path.read_bytes()
    try:
        it = Interpreter(model_content=data)
    except Exception as exc:  # noqa: BLE001
        raise AgentError(f"cannot load TFLite model {path}: {_one_line(exc)}") from None
    ins = it.get_input_details()
    if len(ins) != 1:
        raise AgentError(f"TFLite model {path} has {len(ins)} inputs; the probe supports "
                         "single-input models")
    d = ins[0]
    shape = tuple(None if s < 0 else int(s) for s in d["shape_signature"])
    return LoadedModel(name=path.name, kind="tflite", path=str(path), signature=None,
                       input_name=d["name"], input_shape=shape,
                       input_dtype=_np_dtype_name(d["dtype"]), output_name=None,
                       tflite_bytes=data)


def _np_dtype_name(dt: Any) -> str:
    import numpy as np
    return np.dtype(dt).name


def resolve_shape(sig_shape: tuple[int | None, ...], user: tuple[int, ...] | None
                  ) -> tuple[tuple[int, ...], list[str]]:
    """The fixed input shape to probe and warnings about dynamic dims.

    A dynamic leading (batch) dim defaults to 1; any other dynamic dim must come from
    ``--shape``. A user shape must match every static dim of the signature.
    """
    warnings: list[str] = []
    dynamic = [i for i, d in enumerate(sig_shape) if d is None]
    if user is not None:
        if len(user) != len(sig_shape):
            raise AgentError(f"--shape {_fmt(user)} has {len(user)} dims; the signature's input "
                             f"is {_fmt(sig_shape)}")
        for i, (s, u) in enumerate(zip(sig_shape, user, strict=True)):
            if s is not None and s != u:
                raise AgentError(f"--shape {_fmt(user)} does not match the signature's input "
                                 f"{_fmt(sig_shape)} at dim {i}")
            if u < 1:
                raise AgentError(f"--shape {_fmt(user)}: dims must be >= 1")
        shape = tuple(user)
    else:
        if [i for i in dynamic if i != 0]:
            raise AgentError(f"the signature's input {_fmt(sig_shape)} has dynamic dims "
                             f"{[i for i in dynamic if i != 0]}: fix them with --shape")
        shape = tuple(1 if d is None else d for d in sig_shape)
    if dynamic:
        warnings.append(f"signature input {_fmt(sig_shape)} has dynamic dims; probing "
                        f"{_fmt(shape)}. Serving with a dynamic dim retraces (and recompiles "
                        "under XLA) for every new shape: export a fixed input_signature")
    return shape, warnings


def _fmt(shape: tuple) -> str:
    return "[" + ",".join("None" if d is None else str(d) for d in shape) + "]"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else type(exc).__name__
    return msg[:300]
