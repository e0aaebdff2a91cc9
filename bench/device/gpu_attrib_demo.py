"""Foreign GPU process attribution on the real GPU (issue 8, step 5), read-only.

`hftagent watch` is not wired yet, so this plays its part with the pieces it will reuse:
collectors.gpu.GpuCollector sampled at 100 Hz in this process (the watcher), the workload
(gpu_workload.py, a PyTorch LSTM timed per inference) in another process, and a foreign GPU
process (8192^2 matmul loop) started mid-run. Every slow inference (> 2x the baseline median)
is then attributed with agent.watch.attribution.gpu.causes_for_windows. Prints a per-second timeline, the
attribution tally by phase, the collector's own cost, and writes attrib.json to OUT.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from agent import stats  # noqa: E402
from agent.watch.attribution.gpu import causes_for_windows  # noqa: E402
from collectors.gpu import GpuCollector, Nvml  # noqa: E402
from collectors.host import Host  # noqa: E402

WORKLOAD = str(Path(__file__).with_name("gpu_workload.py"))


def pct(a, q):
    """Nearest-rank P``q`` (agent.stats, as every other figure of the repository); NaN for no
    samples."""
    return float(stats.quantile(np.asarray(a), q)) if len(a) else float("nan")


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp")) / "attrib"
    out.mkdir(parents=True, exist_ok=True)
    total_s, foreign_at_s, foreign_s, hz = 22.0, 9.0, 7.0, 100
    wl = subprocess.Popen([sys.executable, WORKLOAD, "--seconds", str(total_s), "--warmup", "300",
                           "--out", str(out / "lat.npy")])
    col = GpuCollector(Nvml(), own_pids={wl.pid}, host=Host(), history=16384)
    if not col.available().ok:
        sys.exit(f"GPU collector unavailable: {col.available().reason}")
    ru0, t_start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    costs, foreign, f_t0, f_t1 = [], None, None, None
    nxt = time.monotonic()
    while wl.poll() is None:
        now = time.monotonic()
        if foreign is None and now - t_start >= foreign_at_s:
            foreign = subprocess.Popen([sys.executable, WORKLOAD, "--foreign", str(foreign_s)])
            f_t0 = time.monotonic_ns()
        if foreign is not None and f_t1 is None and foreign.poll() is not None:
            f_t1 = time.monotonic_ns()
        c0 = time.perf_counter_ns()
        col.sample()
        costs.append(time.perf_counter_ns() - c0)
        nxt += 1 / hz
        time.sleep(max(0.0, nxt - time.monotonic()))
    ru1, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - t_start
    col.close()
    if foreign is not None:
        foreign.wait()
        f_t1 = f_t1 or time.monotonic_ns()
    cpu_s = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    hist = list(col.history)

    lat = np.load(out / "lat.npy")
    t0s, lats = lat[:, 0], lat[:, 1]
    base = lats[t0s < (f_t0 or t0s[-1])]
    thr = 2 * np.median(base)
    slow = np.nonzero(lats > thr)[0]
    windows = [(int(t0s[i]), int(t0s[i] + lats[i])) for i in slow]
    causes = causes_for_windows(hist, windows)

    def phase(t):
        if f_t0 is None or t < f_t0:
            return "before foreign"
        return "foreign running" if t <= f_t1 else "after foreign"

    tally: dict[str, Counter] = {}
    fpid = foreign.pid if foreign else None
    right = wrong = 0
    examples = []
    for i, cs in zip(slow, causes, strict=True):
        ph = phase(int(t0s[i]))
        top = cs[0].cause if cs else "unexplained"
        tally.setdefault(ph, Counter())[top.replace(f"PID {fpid} ", "PID <foreign> ")] += 1
        is_foreign = bool(cs) and cs[0].cause.startswith(f"GPU shared with PID {fpid} ")
        if ph == "foreign running":
            right += is_foreign
        elif is_foreign:
            wrong += 1
        if len(examples) < 3 and cs and ph == "foreign running":
            examples.append({"latency_us": round(lats[i] / 1e3, 1), "cause": cs[0].cause,
                             "score": cs[0].score, "evidence": cs[0].evidence})
    in_f = sum(1 for i in slow if phase(int(t0s[i])) == "foreign running")

    print(f"workload pid {wl.pid}, foreign pid {fpid}; {len(lats)} inferences over "
          f"{(t0s[-1] - t0s[0]) / 1e9:.1f} s")
    print("per-second timeline (t from workload start; p50/p99 latency; GPU samples):")
    tmin = t0s[0]
    for sec in range(int((t0s[-1] - tmin) // 1e9) + 1):
        a, b = tmin + sec * 10**9, tmin + (sec + 1) * 10**9
        m = (t0s >= a) & (t0s < b)
        hs = [s for s in hist if a <= s.t_ns < b]
        fp = max((s.values.get("gpu.0.foreign_processes") or 0) for s in hs) if hs else None
        ut = np.mean([s.values.get("gpu.0.util_gpu_ratio") or 0 for s in hs]) if hs else None
        sm = np.median([s.values.get("gpu.0.sm_clock_hz") or 0 for s in hs]) / 1e6 if hs else None
        rs = 0
        for s in hs:
            rs |= int(s.values.get("gpu.0.clock_event_reasons") or 0)
        print(f"  t={sec:2d}s {phase(int(a)):16s} n={int(m.sum()):5d} p50={pct(lats[m], 50) / 1e3:8.1f} us"
              f" p99={pct(lats[m], 99) / 1e3:8.1f} us  foreign={fp} util={ut:.2f} sm={sm:.0f} MHz"
              f" reasons=0x{rs:x}")
    print(f"baseline median {np.median(base) / 1e3:.1f} us, P99 {pct(base, 99) / 1e3:.1f} us; "
          f"slow threshold {thr / 1e3:.1f} us (2x baseline median)")
    print(f"slow inferences: {len(slow)} ({in_f} while the foreign process ran)")
    for ph, c in tally.items():
        print(f"  {ph}: " + "; ".join(f"{k}: {v}" for k, v in c.most_common()))
    if in_f:
        print(f"attributed to the foreign PID while it ran: {right}/{in_f} = {right / in_f:.1%}; "
              f"foreign blamed outside its run: {wrong}")
    for e in examples:
        print(f"  example: {e['latency_us']} us -> {e['cause']} (score {e['score']}): {e['evidence']}")
    cs = np.array(costs) / 1e3
    print(f"GpuCollector.sample() at {hz} Hz: {len(cs)} samples, median {np.median(cs):.1f} us, "
          f"p99 {pct(cs, 99):.1f} us, max {cs.max():.1f} us; watcher process CPU "
          f"{cpu_s / wall:.2%} of one CPU (incl. the slow PCIe thread)")
    json.dump({"workload_pid": wl.pid, "foreign_pid": fpid, "slow": len(slow),
               "slow_in_foreign": in_f, "right": right, "wrong": wrong,
               "tally": {k: dict(v) for k, v in tally.items()}, "examples": examples,
               "sample_us_median": float(np.median(cs)), "sample_us_p99": pct(cs, 99),
               "watcher_cpu_ratio": cpu_s / wall}, open(out / "attrib.json", "w"), indent=1)


if __name__ == "__main__":
    main()
