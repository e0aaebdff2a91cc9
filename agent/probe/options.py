"""Turn command-line option values into ProbeSettings + thread configurations (no TF).

Every bad value raises AgentError with one line for the user, before any worker starts: the
numbers against their ranges (config.py's limits), the CPU list against this process's
affinity, and the files given as --model, --calib and --input-data (exist, regular, readable
.npy, finite) so that mistakes fail before a worker spends seconds importing TensorFlow, and a
FIFO or a device never blocks or feeds a worker without end.

``--model numpy`` (or ``--builtin numpy``) names the TF-free built-in numpy stand-in
(agent/probe/numpy_model.py), never a file called "numpy" (give ./numpy for that): its one
variant is ``numpy``, and the options that only set TensorFlow or LiteRT (--intra, --inter,
--sweep threads, --calib, --signature) are refused for it.
"""

from __future__ import annotations

import math
import os
import re
import stat

from agent.errors import AgentError
from agent.probe.config import (
    CALLER_THREAD,
    DEFAULT_DURATION_S,
    DEFAULT_SIGNATURE,
    MAX_BATCH,
    MAX_DURATION_S,
    MAX_INPUT_ELEMENTS,
    MAX_NPY_BYTES,
    MAX_RATE_HZ,
    MAX_SAMPLES,
    MAX_THREADS,
    MAX_THRESHOLD_US,
    MAX_WARMUP,
    ProbeSettings,
    ThreadConfig,
)
from agent.probe.models import BUILTIN_NAMES, DEFAULT_BUILTIN, NUMPY_MODEL, ModelSpec
from agent.probe.variants import check_for_model, default_variants, parse_variants

_UINT = re.compile(r"[0-9]+")
IDLE_GAPS_BUDGET_S = 60.0  # --idle-gaps: the rounds' time budget


def parse_int_list(text: str, what: str, minimum: int = 1,
                   maximum: int | None = None) -> list[int]:
    """"1,64,32" → [1, 64, 32]. ASCII digits only (int() would also take "٣", "+1", "1_0"),
    no empty elements ("1,,2" is a typo, not [1, 2])."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip():
        raise AgentError(f"{what} is empty: give a comma list of integers")
    if not all(_UINT.fullmatch(p) for p in parts):
        raise AgentError(f"{what} must be a comma list of integers, not {text!r}")
    vals = [int(p) for p in parts]
    if any(v < minimum for v in vals):
        raise AgentError(f"{what} values must be >= {minimum}: {text!r}")
    if maximum is not None and any(v > maximum for v in vals):
        raise AgentError(f"{what} values must be <= {maximum}: {text!r}")
    return vals


def is_numpy_model(model: str | None, builtin: str | None) -> bool:
    """Whether --model/--builtin name the numpy built-in (``--model numpy`` is that model,
    never a path)."""
    return model == NUMPY_MODEL or (model is None and builtin == NUMPY_MODEL)


def parse_cpus(text: str | None) -> list[int] | None:
    """The worker's CPUs by the one target rule (tuning/targets.py): ``--cpus`` checked
    against the online CPUs, else the default target CPUs (isolated, else nohz_full, else all
    online but the housekeeping core); either way only CPUs this process may run on. None
    (unpinned) when the default leaves none this process may use."""
    from collectors.host import Host
    from tuning.targets import TargetError, resolve
    try:
        host = Host()
        plan = resolve(host, text)
    except TargetError as exc:
        msg = str(exc)
        raise AgentError(msg if "--cpus" in msg else f"--cpus {text!r}: {msg}") from None
    iso = _isolated_cpus(host)
    usable = [c for c in plan.cpus if c in iso or _can_pin(c)]
    if text is not None and len(usable) != len(plan.cpus):
        from collectors.parsers import format_cpulist
        bad = format_cpulist(sorted(set(plan.cpus) - set(usable)))
        raise AgentError(f"--cpus {text!r}: CPU(s) {bad} are outside this process's cpuset "
                         "(the worker could not be pinned there)")
    return usable or None


def _isolated_cpus(host) -> set[int]:
    """The CPUs of the isolated cpuset `tune apply --isolate` made: the worker joins it to
    pin itself there (tuning.tunables.isolate.pin_self), from any cgroup."""
    from tuning.tunables.isolate import isolated_cpuset
    iso = isolated_cpuset(host)
    return set(iso.cpus) if iso is not None else set()


def _can_pin(cpu: int) -> bool:
    """Whether a worker started from here may be pinned to ``cpu``: its cpuset allows it.
    Not the current affinity: after ``tune apply --isolate`` a shell is confined to the
    housekeeping CPUs, yet the worker it starts may pin itself to an isolated one. Tried on
    this process and put back at once."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        return False
    os.sched_setaffinity(0, before)
    return True


def check_file(path: str, what: str, *, directory_ok: bool = False,
               max_bytes: int | None = None) -> None:
    """``path`` exists and is a regular file (or a directory where ``directory_ok``); a FIFO
    would block the reader, a device (/dev/zero) would feed it without end."""
    if not path.strip():
        raise AgentError(f"{what} is empty: give a file")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise AgentError(f"{what}: file not found: {path}") from None
    except OSError as exc:
        raise AgentError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        if directory_ok:
            return
        raise AgentError(f"{what}: {path} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise AgentError(f"{what}: {path} is not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise AgentError(f"{what}: {path} is {st.st_size} bytes (at most {max_bytes >> 20} MiB)")
    if not os.access(path, os.R_OK):
        raise AgentError(f"{what}: cannot read {path}: permission denied")


def _check_model_file(path: str, kind: str) -> None:
    """The file's magic, so that an empty or foreign file fails here and not in a worker after
    TF's import: a .keras file is a zip archive, a .tflite file a FlatBuffer with the
    identifier "TFL3" at offset 4."""
    import zipfile
    if kind == "keras":
        if not zipfile.is_zipfile(path):
            raise AgentError(f"--model {path}: not a Keras archive (a .keras file is a zip)")
        return
    with open(path, "rb") as f:
        head = f.read(8)
    if head[4:8] != b"TFL3":
        raise AgentError(f"--model {path}: not a TFLite model (no TFL3 identifier)")


def _finite_in(value: float | None, what: str, unit: str, maximum: float) -> None:
    # "not 0 < x <= max" (rather than "x <= 0 or x > max") also rejects NaN; max rejects inf
    if value is not None and not 0 < value <= maximum:
        raise AgentError(f"{what} must be a finite number of {unit} > 0 and at most "
                         f"{maximum:g}, not {value:g}")


def _int_in(value: int | None, what: str, lo: int, hi: int, note: str = "") -> None:
    if value is not None and not lo <= value <= hi:
        raise AgentError(f"{what} must be between {lo} and {hi}{note}, not {value}")


def _refuse_tf_options(**given) -> None:
    """The numpy model runs no TensorFlow or LiteRT: their options would be ignored."""
    why = {"intra": "--intra sets TensorFlow's/LiteRT's thread pools",
           "inter": "--inter sets TensorFlow's inter-op pool",
           "sweep": "--sweep threads measures TensorFlow thread pools",
           "calib": "--calib calibrates tflite-int8",
           "signature": "--signature picks a SavedModel signature"}
    for name, value in given.items():
        if value is not None:
            raise AgentError(f"{why[name]}; the numpy model (a numpy stand-in, single-threaded "
                             "BLAS) has none: drop it")


def build(*, model: str | None, builtin: str | None, signature: str | None, shape: str | None,
          input_data: str, variant: str | None, samples: int | None, duration: float | None,
          warmup: int, rate: float | None, threshold_us: float, calib: str | None,
          intra: int | None, inter: int | None, cpus: str | None, sweep: str | None,
          batch: str, idle_gaps: str | None = None, keep_budget: bool = False
          ) -> tuple[ProbeSettings, list[ThreadConfig]]:
    """Validated settings and the thread configurations to run (one unless sweeping).

    ``keep_budget`` (``hftagent probe``): ``--samples N`` without ``--duration`` keeps the
    default time budget (6 s a run; 60 s with ``--idle-gaps``): a run ends at N samples or at
    the budget, whichever comes first, and the report says which. Without it (the gate, whose
    verdict needs its samples) ``--samples`` alone has no budget.

    ``builtin``/``signature`` None: the default (an explicit other value is an error where it
    could not apply: a built-in with --model, a signature without a SavedModel)."""
    from agent.probe.worker import load_npy
    if builtin is not None and builtin not in BUILTIN_NAMES:
        raise AgentError(f"unknown --builtin {builtin!r} (known: {', '.join(BUILTIN_NAMES)})")
    numpy = is_numpy_model(model, builtin)
    if model == NUMPY_MODEL:
        if builtin not in (None, DEFAULT_BUILTIN, NUMPY_MODEL):
            raise AgentError(f"--builtin {builtin} and --model exclude each other")
        model, builtin = None, NUMPY_MODEL
    if numpy:
        _refuse_tf_options(intra=intra, inter=inter, sweep=sweep, calib=calib,
                           signature=signature)
    if model is not None:
        check_file(model, "--model", directory_ok=True)
        if builtin not in (None, DEFAULT_BUILTIN):
            raise AgentError(f"--builtin {builtin} and --model exclude each other")
    spec = ModelSpec(path=model, builtin=builtin or DEFAULT_BUILTIN,
                     signature=DEFAULT_SIGNATURE if signature is None else signature)
    kind = spec.kind()  # existence and type, before any worker starts
    if kind in ("keras", "tflite"):
        _check_model_file(model, kind)
    if signature is not None:
        if not signature.strip():
            raise AgentError("--signature is empty")
        if signature != DEFAULT_SIGNATURE and kind != "savedmodel":
            raise AgentError(f"--signature {signature!r} applies to a SavedModel --model only "
                             f"(this model is {kind})")
    try:
        variants = (parse_variants(variant, numpy) if variant is not None
                    else default_variants(numpy))
        check_for_model(variants, numpy)
    except ValueError as exc:
        raise AgentError(f"--variant: {exc}") from None
    shp = parse_int_list(shape, "--shape") if shape is not None else None
    if shp is not None and math.prod(shp) > MAX_INPUT_ELEMENTS:
        raise AgentError(f"--shape {shape}: {math.prod(shp)} elements per input, more than "
                         f"{MAX_INPUT_ELEMENTS}")
    _int_in(samples, "--samples", 1, MAX_SAMPLES)
    _finite_in(duration, "--duration", "seconds", MAX_DURATION_S)
    _int_in(warmup, "--warmup", 1, MAX_WARMUP)
    _finite_in(rate, "--rate", "calls/s", MAX_RATE_HZ)
    _finite_in(threshold_us, "--threshold-us", "µs", MAX_THRESHOLD_US)
    if input_data not in ("random", "zeros"):
        check_file(input_data, "--input-data", max_bytes=MAX_NPY_BYTES)
        load_npy(input_data, "--input-data")
    if calib is not None:
        check_file(calib, "--calib", max_bytes=MAX_NPY_BYTES)
        arr = load_npy(calib, "--calib")
        if arr.ndim < 2 or arr.shape[0] < 1:
            raise AgentError(f"--calib {calib}: expected a stack of samples [N, ...], got "
                             f"shape {list(arr.shape)}")
    batches = parse_int_list(batch, "--batch", maximum=MAX_BATCH)
    # 0 would hand the choice back to TF (its default: omit the option for that); for
    # inter-op, -1 runs ops in the caller thread (config.CALLER_THREAD), other negatives
    # mean nothing
    _int_in(intra, "--intra", 1, MAX_THREADS, " (omit it for TF's default)")
    if inter is not None and inter != CALLER_THREAD:
        _int_in(inter, "--inter", 1, MAX_THREADS,
                f" or {CALLER_THREAD} (caller thread; omit it for TF's default)")
    cpu_list = parse_cpus(cpus)
    if sweep not in (None, "threads"):
        raise AgentError(f"--sweep {sweep!r}: only 'threads' is supported")
    if sweep == "threads" and (intra is not None or inter is not None):
        raise AgentError("--sweep threads measures its own grid of --intra/--inter: give "
                         "either the sweep or the thread counts")
    # Explicit --duration alone means "run for this long"; --samples alone means "this many";
    # neither: 6,636 samples (P99.9) within the default per-run budget.
    settings = ProbeSettings(model=spec, variants=variants, shape=shp, input_data=input_data,
                             warmup=warmup, rate_hz=rate, threshold_us=threshold_us, calib=calib,
                             batch=batches, sweep=sweep)
    if samples is not None or duration is not None:
        settings.samples = samples
        settings.duration_s = duration
        if keep_budget and duration is None:
            settings.duration_s = IDLE_GAPS_BUDGET_S if idle_gaps is not None \
                else DEFAULT_DURATION_S
    if idle_gaps is not None:
        from agent.probe.idle import parse_gaps
        if rate is not None or sweep is not None:
            raise AgentError("--idle-gaps paces the calls itself: not with --rate or --sweep")
        settings.idle_gaps_ns = parse_gaps(idle_gaps)
        if samples is None and duration is None:
            settings.samples, settings.duration_s = 200, IDLE_GAPS_BUDGET_S  # rounds, budget
    if sweep == "threads":
        from agent.probe.runner import sweep_configs
        if variant is None:
            settings.variants = ["xla"]  # one fast variant keeps the grid to ~1 minute
        if samples is None and duration is None:
            settings.duration_s = 3.0
        configs = sweep_configs(cpu_list)
    else:
        configs = [ThreadConfig(intra=intra, inter=inter, cpus=cpu_list)]
    return settings, configs
