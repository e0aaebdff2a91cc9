"""Turn command-line option values into ProbeSettings + thread configurations (no TF).

Every bad value raises AgentError with one line for the user. Files given as --calib and
--input-data are checked here (exist, readable .npy, finite) so mistakes fail before a worker
spends seconds importing TensorFlow.
"""

from __future__ import annotations

import math

from agent.errors import AgentError
from agent.probe.config import ProbeSettings, ThreadConfig
from agent.probe.models import BUILTINS, ModelSpec
from agent.probe.variants import DEFAULT_VARIANTS, parse_variants


def parse_int_list(text: str, what: str, minimum: int = 1) -> list[int]:
    try:
        vals = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise AgentError(f"{what} must be a comma list of integers, not {text!r}") from None
    if not vals or any(v < minimum for v in vals):
        raise AgentError(f"{what} values must be >= {minimum}: {text!r}")
    return vals


def parse_cpus(text: str) -> list[int]:
    import os

    from collectors.parsers import parse_cpulist
    try:
        cpus = parse_cpulist(text)
    except ValueError:
        raise AgentError(f"--cpus {text!r} is not a CPU list (e.g. 2-5,8)") from None
    if not cpus:
        raise AgentError("--cpus is empty")
    allowed = os.sched_getaffinity(0)
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise AgentError(f"--cpus {text!r}: CPUs {bad or cpus} are not available to this process")
    return cpus


def build(*, model: str | None, builtin: str, signature: str, shape: str | None,
          input_data: str, variant: str | None, samples: int | None, duration: float | None,
          warmup: int, rate: float | None, threshold_us: float, calib: str | None,
          intra: int | None, inter: int | None, cpus: str | None, sweep: str | None,
          batch: str) -> tuple[ProbeSettings, list[ThreadConfig]]:
    """Validated settings and the thread configurations to run (one unless sweeping)."""
    from agent.probe.worker import load_npy
    if builtin not in BUILTINS:
        raise AgentError(f"unknown --builtin {builtin!r} (known: {', '.join(BUILTINS)})")
    spec = ModelSpec(path=model, builtin=builtin, signature=signature)
    spec.kind()  # existence and type, before any worker starts
    try:
        variants = parse_variants(variant) if variant else list(DEFAULT_VARIANTS)
    except ValueError as exc:
        raise AgentError(str(exc)) from None
    shp = parse_int_list(shape, "--shape") if shape else None
    if samples is not None and samples < 1:
        raise AgentError("--samples must be >= 1")
    # "not x > 0" (rather than "x <= 0") also rejects NaN; isfinite rejects inf
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise AgentError("--duration must be a finite number of seconds > 0")
    if warmup < 1:
        raise AgentError("--warmup must be >= 1")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise AgentError("--rate must be a finite number of calls/s > 0")
    if not (threshold_us > 0 and math.isfinite(threshold_us)):
        raise AgentError("--threshold-us must be a finite number > 0")
    if input_data not in ("random", "zeros"):
        load_npy(input_data, "--input-data")
    if calib:
        arr = load_npy(calib, "--calib")
        if arr.ndim < 2 or arr.shape[0] < 1:
            raise AgentError(f"--calib {calib}: expected a stack of samples [N, ...], got "
                             f"shape {list(arr.shape)}")
    batches = parse_int_list(batch, "--batch")
    if intra is not None and intra < 0:
        raise AgentError("--intra must be >= 0 (0: TF default)")
    cpu_list = parse_cpus(cpus) if cpus is not None else None
    if sweep not in (None, "threads"):
        raise AgentError(f"--sweep {sweep!r}: only 'threads' is supported")
    # Explicit --duration alone means "run for this long"; --samples alone means "this many";
    # neither: 6,636 samples (P99.9) within the default per-run budget.
    settings = ProbeSettings(model=spec, variants=variants, shape=shp, input_data=input_data,
                             warmup=warmup, rate_hz=rate, threshold_us=threshold_us, calib=calib,
                             batch=batches, sweep=sweep)
    if samples is not None or duration is not None:
        settings.samples = samples
        settings.duration_s = duration
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
