"""Probe benchmarks (figures go to docs/benchmarks.md, section "Probe").

1. Harness overhead: identity function in time_loop (rusage + CPU time on) vs a bare
   perf_counter_ns loop, side by side in alternating blocks; medians.
2. Start to first result for the cached default model (`hftagent probe --json`), wall time.
3. Every variant of the default model side by side (`hftagent probe --variant all --json`).

Usage: .venv/bin/python bench/probe_bench.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from agent.probe.harness import bare_loop, time_loop

N = 200_000


def overhead(blocks: int = 5) -> None:
    f = lambda: None  # noqa: E731
    p50_bare, p50_h, it_bare, it_h = [], [], [], []
    for _ in range(blocks):
        t = time.perf_counter_ns()
        b = bare_loop(f, N)
        it_bare.append((time.perf_counter_ns() - t) / N)
        t = time.perf_counter_ns()
        s = time_loop(f, N)
        it_h.append((time.perf_counter_ns() - t) / N)
        p50_bare.append(np.median(b))
        p50_h.append(np.median(s.latency_ns))
    print(f"harness overhead ({blocks} alternating blocks of {N:,} calls, medians):")
    print(f"  measured latency P50: bare {np.median(p50_bare):.0f} ns, harness "
          f"{np.median(p50_h):.0f} ns -> bias {np.median(p50_h) - np.median(p50_bare):+.0f} ns")
    print(f"  loop cost per sample: bare {np.median(it_bare):.0f} ns, harness "
          f"{np.median(it_h):.0f} ns -> +{np.median(it_h) - np.median(it_bare):.0f} ns "
          "(getrusage + process_time_ns + 7 stores)")


def cli(args: list[str]) -> tuple[float, dict]:
    t = time.perf_counter()
    exe = str(Path(sys.executable).with_name("hftagent"))
    r = subprocess.run([exe, "probe", "--json", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    return wall, json.loads(r.stdout)


def table(d: dict) -> None:
    print(f"  {'variant':12} {'n':>6} {'P50 µs':>10} {'P99 µs':>10} {'P99.9 µs':>10}  note")
    for r in d["runs"]:
        if r["status"] != "ok":
            print(f"  {r['variant']:12} {r['status']}: {r['reason'][:80]}")
            continue
        lat = r["latency"]
        suf = lat["sufficient"]
        print(f"  {r['variant']:12} {lat['count']:>6} {lat['p50_ns'] / 1e3:>10.1f} "
              f"{lat['p99_ns'] / 1e3:>9.1f}{'' if suf['p99'] else '*'} "
              f"{lat['p999_ns'] / 1e3:>9.1f}{'' if suf['p999'] else '*'}"
              f"  {'recommended' if r['recommended'] else ''}")
    print(f"  recommendation: {d['recommendation'] and d['recommendation']['variant']}")


if __name__ == "__main__":
    overhead()
    cli(["--samples", "10", "--variant", "graph"])  # make sure the built-in is cached
    walls = [cli(["--variant", "graph", "--samples", "10", "--warmup", "10"])[0]
             for _ in range(3)]
    print(f"start to first result (cached default model, graph, 10 samples): "
          f"median {np.median(walls):.1f} s of {walls}")
    if "--quick" not in sys.argv:
        wall, d = cli(["--variant", "all"])
        print(f"default model, --variant all ({wall:.0f} s):")
        table(d)
