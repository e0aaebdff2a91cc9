"""Gate and history costs: bootstrap (exact order statistic vs naive resampling), a full
evaluate(), record_run and sample compression. Run: python bench/gate_bench.py [DB]
(DB: an existing history database whose latest run's real samples are used for the
compression figure; default: synthetic lognormal samples)."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agent.gate import evaluate as g
from agent.history import History, record_run
from agent.history.schema import encode_samples
from agent.probe.config import DEFAULT_SAMPLES
from agent.stats import nearest_rank_index

N, B = DEFAULT_SAMPLES, 2000  # the probe's default sample count (6,636), 2,000 resamples


def timeit(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    rng = np.random.default_rng(0)
    a = rng.lognormal(np.log(200e3), 0.25, N).astype(np.int64)
    b = rng.lognormal(np.log(200e3), 0.25, N).astype(np.int64)
    k = nearest_rank_index(99.0, N)

    def naive():
        idx = rng.integers(0, N, size=(B, N))
        return np.partition(a[idx], k, axis=1)[:, k]
    t_exact = timeit(lambda: g.quantile_ratio_interval(a, b, rng=rng), 20)
    t_naive = timeit(naive, 3)
    t_eval = timeit(lambda: g.evaluate(g.GateInput("b", b), g.GateInput("a", a), g.Limits()), 20)
    print(f"P99 ratio interval, exact order-statistic bootstrap ({B} resamples, n={N}): "
          f"{t_exact * 1e3:.2f} ms")
    print(f"naive resampling bootstrap, one side only ({B}x{N} indices): {t_naive * 1e3:.0f} ms")
    print(f"full evaluate() incl. binomial + Fisher: {t_eval * 1e3:.1f} ms")
    fp = {"kernel": "x"}
    with tempfile.TemporaryDirectory() as td:
        db = Path(td) / "h.sqlite"
        record_run("probe", {}, a, command="bench", fingerprint=fp, db=db)
        t_rec = timeit(lambda: record_run("probe", {}, a, command="bench", fingerprint=fp,
                                          db=db), 20)
        with History(db) as h:
            t_read = timeit(lambda: h.samples(1), 50)
    print(f"record_run with {N} samples (open, insert, commit; fingerprint given): "
          f"{t_rec * 1e3:.1f} ms; read samples back: {t_read * 1e3:.2f} ms")
    x = a
    src = "synthetic lognormal"
    if len(sys.argv) > 1:
        with History(sys.argv[1], create=False) as h:
            rid = h.latest_id()
            x, src = h.samples(rid), f"run {rid} of {sys.argv[1]} (real probe samples)"
    _, n, blob, _ = encode_samples(x)
    print(f"samples compressed: {n} x 8 B = {n * 8} B -> {len(blob)} B "
          f"({n * 8 / len(blob):.1f}x), {src}")


if __name__ == "__main__":
    main()
