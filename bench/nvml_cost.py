"""Per-call cost of the NVML readings, raw pynvml vs through the adapter's chokepoint, and of
GpuCollector.sample() (fast path) vs refresh_slow() (the slow thread's work).

    python3 bench/nvml_cost.py            # the live GPU (read-only calls only)
    python3 bench/nvml_cost.py --fake     # the fake library: the adapter's own overhead

Figures from the lent H200 are in docs/gpu-validation.md. Without a GPU (and without --fake)
it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.gpu import (  # noqa: E402
    CLOCK_SM,
    PCIE_UTIL_TX_BYTES,
    PERF_POLICY_POWER,
    GpuCollector,
    Nvml,
)

# (label, adapter reading, raw function name + extra args, calls) -- calls kept low for the slow
READINGS = [
    ("sm clock", lambda nv: nv.clock_mhz(0, CLOCK_SM), ("nvmlDeviceGetClockInfo", CLOCK_SM), 2000),
    ("clock event reasons", lambda nv: nv.clock_event_reasons(0),
     ("nvmlDeviceGetCurrentClocksEventReasons",), 2000),
    ("utilization", lambda nv: nv.utilization(0), ("nvmlDeviceGetUtilizationRates",), 2000),
    ("compute processes", lambda nv: nv.compute_processes(0, names=False),
     ("nvmlDeviceGetComputeRunningProcesses",), 1000),
    ("volatile uncorrected ECC", lambda nv: nv.ecc_volatile_uncorrected(0),
     ("nvmlDeviceGetTotalEccErrors", 1, 0), 2000),
    ("PCIe replay counter", lambda nv: nv.pcie_replay_counter(0),
     ("nvmlDeviceGetPcieReplayCounter",), 100),
    ("violation status (power)", lambda nv: nv.violation_ns(0, PERF_POLICY_POWER),
     ("nvmlDeviceGetViolationStatus", PERF_POLICY_POWER), 50),
    ("PCIe throughput TX", lambda nv: nv.pcie_throughput_bytes_per_s(0, PCIE_UTIL_TX_BYTES),
     ("nvmlDeviceGetPcieThroughput", PCIE_UTIL_TX_BYTES), 5),
]


def per_call_us(fn, n: int) -> float:
    fn()
    best = []
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best.append((time.perf_counter_ns() - t0) / n / 1e3)
    return min(best)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fake", action="store_true", help="measure against tests/fakes/nvml.py")
    a = ap.parse_args()
    if a.fake:
        from tests.fakes.nvml import h200_r580
        lib = h200_r580()
    else:
        try:
            import pynvml as lib
        except ImportError as exc:
            print(f"nvml_cost: nvidia-ml-py not installed ({exc})")
            return 0
    nv = Nvml(lib=lib)
    init = nv.init()
    if not init.ok:
        print(f"nvml_cost: NVML unavailable: {init.reason}")
        return 0
    h = lib.nvmlDeviceGetHandleByIndex(0)
    print(f"{'reading':28s} {'raw µs':>10s} {'adapter µs':>11s}  value")
    for label, read, (fn, *args), n in READINGS:
        raw = getattr(lib, fn)
        r = read(nv)
        if not r.ok:
            print(f"{label:28s} {'-':>10s} {'-':>11s}  {r.reason}")
            continue
        t_raw = per_call_us(lambda raw=raw, args=args: raw(h, *args), n)
        t_ad = per_call_us(lambda read=read: read(nv), n)
        print(f"{label:28s} {t_raw:10.2f} {t_ad:11.2f}  {r.value!r}"[:110])
    col = GpuCollector(nv, slow_thread=False)
    t = [0.0] * 500
    for i in range(len(t)):
        t0 = time.perf_counter_ns()
        col.sample()
        t[i] = (time.perf_counter_ns() - t0) / 1e3
    t.sort()
    print(f"GpuCollector.sample() (fast path, {len(col.gpus)} GPU): median "
          f"{statistics.median(t):.1f} µs, p99 {t[int(len(t) * 0.99)]:.1f} µs")
    t0 = time.perf_counter_ns()
    col.refresh_slow()
    print(f"GpuCollector.refresh_slow() (slow thread, once): "
          f"{(time.perf_counter_ns() - t0) / 1e6:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
