"""A small GPU inference workload for the lent H200 (no TensorFlow there): a PyTorch LSTM
[1, 64, 32] -> 128 (the default-like model of the probe), batch 1, fixed shape, timed in a hot
loop. Writes int64 (start_monotonic_ns, latency_ns) pairs to --out (.npy) and prints the
median. ``--foreign`` instead runs a big matmul loop: the "foreign GPU process".

Timestamps are CLOCK_MONOTONIC (time.monotonic_ns), the collector's clock, so slow samples
can be matched with GPU samples taken in another process.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch


def infer_loop(iters: int, warmup: int, seconds: float | None, out: str | None) -> None:
    torch.backends.cudnn.benchmark = False
    x = torch.randn(1, 64, 32).cuda()  # host randn + copy: no setup kernel profiled
    lstm = torch.nn.LSTM(32, 128, batch_first=True).cuda().eval()
    head = torch.nn.Linear(128, 1).cuda().eval()
    with torch.inference_mode():
        for _ in range(warmup):
            head(lstm(x)[0][:, -1])
        torch.cuda.synchronize()
        n = iters if seconds is None else 10_000_000
        rec = np.zeros((n, 2), dtype=np.int64)
        end = None if seconds is None else time.monotonic_ns() + int(seconds * 1e9)
        i = 0
        while i < n:
            t0 = time.monotonic_ns()
            head(lstm(x)[0][:, -1])
            torch.cuda.synchronize()
            t1 = time.monotonic_ns()
            rec[i] = (t0, t1 - t0)
            i += 1
            if end is not None and t1 >= end:
                break
    rec = rec[:i]
    med = float(np.median(rec[:, 1])) / 1e3
    print(f"workload pid {os.getpid()}: {i} inferences, median {med:.1f} us, "
          f"p99 {np.percentile(rec[:, 1], 99) / 1e3:.1f} us", flush=True)
    if out:
        np.save(out, rec)


def foreign_loop(seconds: float) -> None:
    a = torch.randn(8192, 8192, device="cuda")
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        a = (a @ a).clamp_(-1, 1)
        k += 1
        if k % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(f"foreign pid {os.getpid()}: {k} matmuls 8192^2 in {seconds:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--foreign", type=float, default=None, help="run the foreign load for S s")
    a = ap.parse_args()
    if a.foreign is not None:
        foreign_loop(a.foreign)
    else:
        infer_loop(a.iters, a.warmup, a.seconds, a.out)


if __name__ == "__main__":
    main()
