"""Worker process: one thread configuration, TF initialised after its threads are set.

Run as ``python -m agent.probe.worker DIR``. Reads ``DIR/config.json`` ({"settings",
"threads"}), writes per task ``DIR/run-<i>.json`` (a RunResult) and ``DIR/samples-<i>.npy``
(int64 [len(COLUMNS), n]), ``DIR/model.json`` once the model is loaded and ``DIR/fatal.json``
when nothing can run (bad model or input). Progress events go to the original stdout as JSON
lines; anything else printed (TF, Keras) is redirected to stderr so it cannot corrupt them.
Tasks whose result file exists are skipped: the parent restarts a crashed worker for the rest.
With ``settings.callers`` > 1 (``hftagent gate --scenarios concurrentN``) the timed loop of each
task runs in that many caller threads sharing the one bound callable (:func:`run_task`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from agent.errors import AgentError
from agent.probe import harness, stats
from agent.probe.config import ProbeSettings, ThreadConfig
from agent.probe.result import RunResult


class _Events:
    def __init__(self, fd: int) -> None:
        self._f = os.fdopen(fd, "w", buffering=1)

    def __call__(self, **ev) -> None:
        self._f.write(json.dumps(ev) + "\n")


def load_input(spec: str, shape: tuple[int, ...], dtype: str, seed: int = 7) -> np.ndarray:
    """The probe input: random (seeded normal), zeros, or FILE.npy (exact shape, or a stack of
    samples [N, *shape[1:]] from which the first shape[0] rows are taken)."""
    if spec == "random":
        x = np.random.default_rng(seed).standard_normal(shape)
        return x.astype(dtype) if np.issubdtype(np.dtype(dtype), np.floating) else \
            np.random.default_rng(seed).integers(0, 10, shape).astype(dtype)
    if spec == "zeros":
        return np.zeros(shape, dtype=dtype)
    arr = load_npy(spec, "--input-data")
    if arr.dtype != np.dtype(dtype):
        raise AgentError(f"--input-data {spec} has dtype {arr.dtype}; the signature wants {dtype}")
    if arr.shape == shape:
        return np.ascontiguousarray(arr)
    if arr.shape[1:] == shape[1:] and arr.shape[0] >= shape[0]:
        return np.ascontiguousarray(arr[:shape[0]])
    raise AgentError(f"--input-data {spec} has shape {list(arr.shape)}; expected "
                     f"{list(shape)} or a stack [N,{','.join(map(str, shape[1:]))}]")


def load_npy(path: str, what: str) -> np.ndarray:
    """np.load with one-line errors; rejects non-finite floats (no TF needed)."""
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise AgentError(f"{what}: file not found: {path}") from None
    except (ValueError, OSError) as exc:
        raise AgentError(f"{what}: cannot read {path} as .npy: {exc}") from None
    if not isinstance(arr, np.ndarray):
        raise AgentError(f"{what}: {path} is not a single .npy array")
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise AgentError(f"{what}: {path} has {bad} non-finite values (NaN/Inf)")
    return arr


def apply_threads(cfg: ThreadConfig) -> None:
    """Affinity first (TF's pools inherit it), then TF threading before any op runs.
    TensorFlow is imported only to set a thread count: without --intra/--inter there is
    nothing to set (TF, imported later by the model, starts with the affinity already set),
    and the numpy model never imports it."""
    if cfg.cpus:
        from tuning.tunables.isolate import pin_self
        pin_self(cfg.cpus)  # (inside the isolated cpuset when the CPUs are isolated)
    if cfg.intra is None and cfg.inter is None:
        return
    import tensorflow as tf
    if cfg.intra is not None:
        tf.config.threading.set_intra_op_parallelism_threads(cfg.intra)
    if cfg.inter is not None:
        tf.config.threading.set_inter_op_parallelism_threads(cfg.inter)


def run_task(model, variant: str, shape: tuple[int, ...], settings: ProbeSettings,
             cfg: ThreadConfig, x: np.ndarray, agree: tuple[np.ndarray, np.ndarray] | None,
             calib: np.ndarray | None, emit=lambda **_: None
             ) -> tuple[RunResult, harness.Samples | None]:
    """Build, cold call, warm up, time and summarise one variant at one shape.

    ``settings.callers`` > 1: after the cold call and the warm-up (one thread), that many
    caller threads share the bound callable in the timed loop (harness.concurrent_loop,
    ceil(n / callers) calls each, closed loop); their samples form the one run."""
    from agent.probe.variants import VariantFailed, VariantUnavailable, build_callable
    callers = settings.callers
    r = RunResult(variant=variant, batch=shape[0], config=cfg.to_dict(),
                  mode="open" if settings.rate_hz else "closed", rate_hz=settings.rate_hz,
                  callers=callers)
    emit(phase="build")
    try:
        built = build_callable(model, variant, shape, threads=cfg.intra, calib=calib)
    except VariantUnavailable as exc:
        r.status, r.reason = "unavailable", str(exc)
        return r, None
    except VariantFailed as exc:
        r.status, r.reason = "failed", str(exc)
        return r, None
    r.build_s = built.build_s
    r.notes.extend(built.notes)
    fn = built.bind(x)
    if callers > 1 and variant.startswith("tflite"):
        fn = _locked(fn)
        r.notes.append("LiteRT interpreter shared by the callers through a lock")
    emit(phase="cold")
    try:
        t0 = time.perf_counter_ns()
        fn()
        r.cold_start_ns = time.perf_counter_ns() - t0
    except Exception as exc:  # noqa: BLE001 - e.g. an op missing at run time
        r.status, r.reason = "failed", f"first call failed: {_one_line(exc)}"
        return r, None
    emit(phase="warmup")
    w = harness.warm_up(fn, settings.warmup, budget_ns=int(settings.warmup_budget_s * 1e9))
    r.warmup = w.to_dict()
    per_call = max(int(np.median(w.latency_ns[-max(1, w.window):])), 1)
    if settings.idle_gaps_ns:
        return _idle_gaps(r, fn, settings, per_call, emit)
    if settings.samples:
        n = settings.samples
    else:  # duration only: size the buffer from the warm median
        n = int((settings.duration_s or 1.0) * 1e9 / per_call * 1.5) + 1000
    if settings.rate_hz:
        n_sched = int((settings.duration_s or 1e9) * settings.rate_hz) + 1
        n = min(n, n_sched) if settings.samples else n_sched
    n = min(n, 5_000_000)
    per = -(-n // callers)
    n = per * callers  # every caller makes the same number of calls
    buf = harness.allocate(n)
    budget_ns = int(settings.duration_s * 1e9) if settings.duration_s else None
    expected = n * (1e9 / settings.rate_hz if settings.rate_hz else per_call) / 1e9
    emit(phase="timed", n=n, expected_s=min(expected, settings.duration_s or expected))
    start = time.perf_counter_ns()
    deadline = start + budget_ns if budget_ns else None
    if callers == 1:
        s = harness.time_loop(fn, n, settings.rate_hz, deadline_ns=deadline, buf=buf)
    else:
        try:
            s = harness.concurrent_loop(fn, callers, per, deadline_ns=deadline, buf=buf)
        except harness.CallerFailed as exc:
            r.status, r.reason = "failed", f"{callers} callers: {exc}"
            return r, None
    r.timed_budget_hit = s.count < n
    lat = s.latency_ns
    r.latency = stats.summarize(lat)
    if s.open_loop:
        r.response = stats.summarize(s.response_ns)
    r.jitter = stats.jitter(s.response_ns if s.open_loop else lat,
                            int(settings.threshold_us * 1000))
    r.unserved = s.unserved
    if s.unserved:
        r.notes.append(f"saturated: {s.unserved} of {s.count + s.unserved} requests scheduled "
                       f"at {settings.rate_hz:g}/s never started (offered rate above capacity): "
                       "response percentiles are lower bounds")
    if lat.size:
        head = s.response_ns if s.open_loop else lat  # what the report's headline shows
        p99 = stats.percentiles(head, (99.0,))[99.0]
        r.attribution = stats.tail_attribution(head, s.column("nivcsw"), s.column("minflt"),
                                               s.column("majflt"), p99)
        if callers == 1:
            mean = float(lat.mean())
            r.throughput_per_s = shape[0] * 1e9 / mean if mean > 0 else None
        else:  # the callers overlap: calls completed over the timed loop's wall time
            span = int(s.column("end_ns").max() - s.column("start_ns").min())
            r.throughput_per_s = shape[0] * s.count * 1e9 / span if span > 0 else None
    if r.timed_budget_hit:
        r.notes.append(f"time budget {settings.duration_s:g} s reached after {s.count} of "
                       f"{n} samples")
    if agree is not None and shape[0] == 1:
        emit(phase="agreement")
        xs, ref = agree
        k = xs.shape[0] if variant == "eager" else min(
            xs.shape[0], max(8, int(2e9 / per_call)))
        try:
            out = built.predict(xs[:k])
            r.agreement = stats.agreement(ref[:k], out)
        except Exception as exc:  # noqa: BLE001
            r.notes.append(f"agreement not measured: {_one_line(exc)}")
    elif shape[0] != 1:
        r.notes.append("agreement is measured at batch 1")
    return r, s


def _locked(inner):
    """A LiteRT interpreter must not be invoked from two threads at once: the callers share
    it through a lock, so their latencies include the queueing a shared model causes."""
    import threading
    lock = threading.Lock()

    def fn() -> object:
        with lock:
            return inner()
    return fn


def _idle_gaps(r: RunResult, fn, settings: ProbeSettings, per_call: int, emit
               ) -> tuple[RunResult, None]:
    """``--idle-gaps``: the gap loop (agent.probe.harness.gap_loop) instead of the timed loop;
    the headline is the back-to-back calls (the smallest gap)."""
    from agent.probe import idle
    gaps = settings.idle_gaps_ns
    rounds = idle.rounds_for(gaps, per_call, settings.duration_s, settings.samples)
    round_s = (sum(gaps) + len(gaps) * per_call) / 1e9
    emit(phase="timed", n=rounds * len(gaps), expected_s=rounds * round_s)
    deadline = (time.perf_counter_ns() + int(settings.duration_s * 1e9)
                if settings.duration_s else None)
    arrays = harness.gap_loop(fn, gaps, rounds, deadline_ns=deadline)
    r.mode = "idle-gaps"
    r.idle_gaps = idle.summarize(arrays)
    base = arrays[min(arrays)]
    r.latency = stats.summarize(base[2] - base[1])
    line = idle.headline(r.idle_gaps)
    if line:
        r.notes.append(line)
    return r, None


def _one_line(exc: BaseException) -> str:
    from agent.probe.models import _one_line as f
    return f(exc)


def _die_with_parent() -> None:
    """SIGKILL when the hftagent that started this worker dies (PR_SET_PDEATHSIG, Linux 2.1.57),
    and exit now if it is gone already: a probe stopped or killed leaves no worker timing on
    (agent/probe/runner.py kills it on Ctrl-C; this covers a parent killed outright)."""
    import ctypes
    import signal
    parent = os.environ.get("HFTAGENT_PROBE_PARENT")
    if not parent:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if str(os.getppid()) != parent:
        os._exit(1)


def main(argv: list[str]) -> int:
    _die_with_parent()
    d = Path(argv[0])
    cfgd = json.loads((d / "config.json").read_text())
    settings = ProbeSettings.from_dict(cfgd["settings"])
    threads = ThreadConfig.from_dict(cfgd["threads"])
    emit = _Events(os.dup(1))
    os.dup2(2, 1)  # stray prints (TF, Keras) go to the log, not into the event stream
    try:
        apply_threads(threads)
        from agent.probe.models import load_model, resolve_shape
        model = load_model(settings.model)
        base, warnings = resolve_shape(model.input_shape,
                                       tuple(settings.shape) if settings.shape else None)
        if model.kind in ("builtin", "numpy"):
            warnings = []  # the built-in's dynamic batch dim is ours, fixed to the probe shape
        warnings = list(model.notes) + warnings
        calib = None
        if settings.calib:
            calib = load_npy(settings.calib, "--calib")
            if calib.shape[1:] != base[1:]:
                raise AgentError(f"--calib {settings.calib} has shape {list(calib.shape)}; "
                                 f"expected [N,{','.join(map(str, base[1:]))}]")
            calib = calib.astype(model.input_dtype)
        x1 = load_input(settings.input_data, (1, *base[1:]), model.input_dtype)
    except AgentError as exc:
        (d / "fatal.json").write_text(json.dumps({"error": str(exc)}))
        return 3
    # Agreement inputs: a stack from --input-data when it has several rows, else seeded random.
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((settings.agree_n, *base[1:])).astype(model.input_dtype)
    if settings.input_data not in ("random", "zeros"):
        arr = np.load(settings.input_data)
        if arr.ndim == len(base) and arr.shape[0] >= 2 and arr.shape[1:] == base[1:]:
            xs = arr[:settings.agree_n].astype(model.input_dtype)
    agree = None
    from agent.probe.variants import VariantFailed, VariantUnavailable, build_callable
    # The numpy model has one variant: there is nothing to agree with (and no TF to ask).
    ref_variant = None if model.kind == "numpy" else "tflite" if model.kind == "tflite" \
        else "graph"
    if ref_variant is not None:
        emit(event="reference")
        try:
            ref_fn = build_callable(model, ref_variant, (1, *base[1:]))
            agree = (xs, ref_fn.predict(xs))
        except (VariantFailed, VariantUnavailable) as exc:
            warnings.append(f"no fp32 reference ({ref_variant}): {exc}; agreement not "
                            "measured")
    info = model.describe()
    info["probe_shape"] = list(base)
    info["reference"] = ref_variant or "none (numpy stand-in: one variant)"
    (d / "model.json").write_text(json.dumps({"model": info, "warnings": warnings}))
    for i, (variant, batch) in enumerate(settings.tasks()):
        if (d / f"run-{i}.json").exists() or (d / f"crashed-{i}").exists():
            continue
        (d / f"crashed-{i}").write_text(variant)  # removed on completion: a marker if we die
        emit(event="task", idx=i, variant=variant, batch=batch, phase="start")
        shape = (batch, *base[1:])
        x = x1 if batch == 1 else load_input(settings.input_data, shape, model.input_dtype)
        r, s = run_task(model, variant, shape, settings, threads, x, agree, calib,
                        emit=lambda i=i, v=variant, b=batch, **ev: emit(
                            event="task", idx=i, variant=v, batch=b, **ev))
        if s is not None:
            np.save(d / f"samples-{i}.npy", s.data)
        tmp = d / f"run-{i}.json.tmp"
        tmp.write_text(json.dumps(r.to_dict()))
        os.replace(tmp, d / f"run-{i}.json")
        (d / f"crashed-{i}").unlink()
        emit(event="task", idx=i, variant=variant, batch=batch, phase="done",
             status=r.status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
