"""Tail statistics of probe samples: percentiles, the summary, tail-jitter rate, in-process tail
attribution and output agreement.

Pure numpy, no TensorFlow. All latencies are int64 nanoseconds. Nearest-rank percentiles,
the sample-sufficiency figures (``REQUIRED_SAMPLES``: ≥ 662 samples to claim P99, ≥ 6,636 for
P99.9) and the Wilson interval are :mod:`agent.stats`' (imported here, so ``stats.X`` keeps
working for the probe's callers).
"""

from __future__ import annotations

import math

import numpy as np

from agent.stats import (  # noqa: F401  (re-exported for the probe's callers)
    PERCENTILES,
    REQUIRED_SAMPLES,
    nearest_rank_index,
    pkey,
    required_samples,
    wilson_interval,
)


def percentiles(values: np.ndarray, qs: tuple[float, ...] = PERCENTILES) -> dict[float, int]:
    """Nearest-rank percentiles of ``values`` (one sort, or partition for a single q)."""
    n = int(values.size)
    if n == 0:
        return {}
    s = np.sort(values, kind="stable")
    return {q: int(s[nearest_rank_index(q, n)]) for q in qs}


def summarize(latency_ns: np.ndarray) -> dict:
    """count, mean, stdev (n − 1), min, P50, P90, P99, P99.9, max and sufficiency per percentile.

    Values are int nanoseconds except mean/stdev (float ns). An empty array gives count 0 and
    None everywhere else (missing is never 0).
    """
    n = int(latency_ns.size)
    out: dict = {"count": n}
    if n == 0:
        for k in ("mean_ns", "stdev_ns", "min_ns", "max_ns"):
            out[k] = None
        for q in PERCENTILES:
            out[pkey(q) + "_ns"] = None
        out["sufficient"] = {pkey(q): False for q in PERCENTILES}
        out["required"] = {pkey(q): required_samples(q) for q in PERCENTILES}
        return out
    v = latency_ns.astype(np.float64)
    out["mean_ns"] = float(v.mean())
    out["stdev_ns"] = float(v.std(ddof=1)) if n > 1 else 0.0
    out["min_ns"] = int(latency_ns.min())
    for q, val in percentiles(latency_ns).items():
        out[pkey(q) + "_ns"] = val
    out["max_ns"] = int(latency_ns.max())
    out["sufficient"] = {pkey(q): n >= required_samples(q) for q in PERCENTILES}
    out["required"] = {pkey(q): required_samples(q) for q in PERCENTILES}
    return out


def jitter(latency_ns: np.ndarray, threshold_ns: int) -> dict:
    """Tail-jitter rate: share of samples strictly over ``threshold_ns``, 95 % Wilson interval."""
    n = int(latency_ns.size)
    k = int(np.count_nonzero(latency_ns > threshold_ns))
    lo, hi = wilson_interval(k, n)
    return {"threshold_ns": int(threshold_ns), "count": k, "samples": n,
            "rate": (k / n) if n else None, "wilson95_low": lo, "wilson95_high": hi}


def tail_attribution(latency_ns: np.ndarray, nivcsw: np.ndarray, minflt: np.ndarray,
                     majflt: np.ndarray, slow_threshold_ns: int) -> dict:
    """First, in-process attribution of slow samples (latency ≥ ``slow_threshold_ns``).

    For the slow samples and, as a baseline, for all samples: the share that saw an involuntary
    context switch of the probing thread, a page fault (minor or major), or either. A slow tail
    that is far more often preempted than the baseline points at CPU contention; the rest is
    left for host-level attribution (``hftagent watch``).
    """
    slow = latency_ns >= slow_threshold_ns
    cs = nivcsw > 0
    pf = (minflt + majflt) > 0
    either = cs | pf
    n_slow = int(np.count_nonzero(slow))
    n = int(latency_ns.size)

    def share(mask: np.ndarray, within: np.ndarray | None, count: int) -> float | None:
        if count == 0:
            return None
        hits = mask if within is None else (mask & within)
        return int(np.count_nonzero(hits)) / count

    return {
        "slow_threshold_ns": int(slow_threshold_ns),
        "slow_count": n_slow,
        "slow_share_ivcsw": share(cs, slow, n_slow),
        "slow_share_fault": share(pf, slow, n_slow),
        "slow_share_either": share(either, slow, n_slow),
        "all_share_ivcsw": share(cs, None, n),
        "all_share_fault": share(pf, None, n),
        "all_share_either": share(either, None, n),
    }


def agreement(reference: np.ndarray, output: np.ndarray, min_share: float = 0.95,
              max_rel_err: float = 0.05) -> dict:
    """Agreement of a variant's outputs with the fp32 graph reference, row by row.

    ``reference`` and ``output`` are [N, ...] (one row per agreement input). Always reports the
    max absolute error and the max relative error, taken as max |out − ref| / max |ref| (relative
    to the reference's largest magnitude: element-wise ratios explode near zero). Outputs whose
    last axis has 2..1000 entries are treated as classifier-like and also get the share of rows
    with identical argmax. Passing: argmax share ≥ ``min_share`` (95 %, the seeds' INT8 rule) for
    classifier-like outputs, else relative error ≤ ``max_rel_err``.
    """
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(output, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"output shape {out.shape} differs from reference {ref.shape}")
    n = int(ref.shape[0]) if ref.ndim else 1
    diff = np.abs(out - ref)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    finite = bool(np.isfinite(out).all())
    classifier = ref.ndim >= 2 and 2 <= ref.shape[-1] <= 1000
    share = None
    if classifier:
        a = ref.reshape(-1, ref.shape[-1]).argmax(axis=1)
        b = out.reshape(-1, out.shape[-1]).argmax(axis=1)
        share = float(np.mean(a == b))
        passes = finite and share >= min_share
    else:
        passes = finite and rel <= max_rel_err
    return {"n": n, "classifier_like": classifier, "argmax_share": share,
            "max_abs_err": max_abs, "max_rel_err": rel, "finite": finite,
            "passes": bool(passes),
            "rule": (f"argmax share >= {min_share:.0%}" if classifier
                     else f"max relative error <= {max_rel_err:.0%}")}
