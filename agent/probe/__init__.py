"""The warmed, fixed-shape TF inference probe (``hftagent probe``).

Nothing here imports TensorFlow at import time. Reusable API:

- :func:`agent.probe.variants.build_callable` (model, variant, shape) → BuiltVariant
- :func:`agent.probe.harness.time_loop` (fn, n, rate_hz=None) → Samples (raw int64 columns)
- :func:`agent.probe.harness.warm_up` (fn, min_calls) → Warmup (steady-state check)
- :func:`agent.probe.runner.run_config` (settings, threads) → (ProbeResult, per-run arrays)
- :class:`agent.probe.result.ProbeResult` (``to_dict()``, schema ``hftagent.probe`` v1)
"""

from agent.probe.config import ProbeSettings, ThreadConfig
from agent.probe.harness import COLUMNS, Samples, time_loop, warm_up
from agent.probe.result import SCHEMA, SCHEMA_VERSION, ProbeResult, RunResult


def build_callable(*args, **kwargs):
    """See :func:`agent.probe.variants.build_callable` (imported lazily)."""
    from agent.probe.variants import build_callable as f
    return f(*args, **kwargs)


def run_config(*args, **kwargs):
    """See :func:`agent.probe.runner.run_config`."""
    from agent.probe.runner import run_config as f
    return f(*args, **kwargs)


__all__ = ["COLUMNS", "SCHEMA", "SCHEMA_VERSION", "ProbeResult", "ProbeSettings", "RunResult",
           "Samples", "ThreadConfig", "build_callable", "run_config", "time_loop", "warm_up"]
