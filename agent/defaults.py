"""Defaults more than one command shares, defined once.

The tail-jitter threshold is the share of samples over a fixed latency that the probe reports
(``hftagent probe --threshold-us``), the gate tests (``hftagent gate --jitter-threshold-us``),
and the exporter counts (``hftagent_probe_exceedances_total{threshold_us}``; the alert rules in
deploy/prometheus burn against the 5,000 µs series). Nothing here is imported heavily: plain
numbers only.
"""

from __future__ import annotations

# The jitter threshold, µs: 5 ms, the alerting limit of the field notes (a trading-signal
# model that answers later than this misses its order).
JITTER_THRESHOLD_US: float = 5000.0

# The exceedance counters every exporter carries (µs), the jitter threshold among them, so
# a fleet's dashboards and alerts find the same series on every box; `hftagent watch` adds
# its own --threshold-us to these (agent/watch/metrics_feed.py).
EXCEEDANCE_THRESHOLDS_US: tuple[int, ...] = (500, 1000, int(JITTER_THRESHOLD_US))

# The largest latency threshold or budget a command takes, µs (1,000 s): beyond it a
# threshold is no threshold (probe --threshold-us, watch --threshold-us).
MAX_THRESHOLD_US: float = 1e9

# The variables a BLAS pool (OpenBLAS, OpenMP, MKL) reads its thread count from, once, when
# numpy loads: hftagent's own numpy (agent/cli.py) and the numpy probe's workers
# (agent/probe/runner.py) load it with 1.
BLAS_THREAD_VARS: tuple[str, ...] = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                     "MKL_NUM_THREADS")
