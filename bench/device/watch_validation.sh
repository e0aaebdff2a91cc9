#!/usr/bin/env bash
# On the lent GPU machine (device tool), from the repo root: the watch benchmarks on a
# 16-CPU host — collector cost at 100 Hz (floor, built-in and external configurations), the
# GPU-sharing attribution run (gpu_watch.sh), and the fault-injection attribution bench
# (watch's default sampler: native where the machine has a C compiler).
# Read-only for the GPU. Output under $OUT (copied back by the device tool).
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD
{
  echo "== $(date -u +%FT%TZ) $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo); cc: $(command -v cc || echo none)"
  python3 bench/collector_cost.py --seconds 10 --json "$out/collector_cost.json" > /dev/null \
    && python3 bench/collector_cost.py --summary "$out/collector_cost.json"
  bash bench/device/gpu_watch.sh > /dev/null 2>&1; tail -8 "$out/gpu-watch.txt"
  python3 bench/attribution.py --duration 15 --json "$out/attribution.json" 2>&1 | tail -9
} > "$out/watch-validation.txt" 2>&1
cat "$out/watch-validation.txt"
# The device tool brings back at most 8 files: everything but the summary in one archive.
(cd "$out" && tar czf watch-validation.tgz --remove-files --exclude ./watch-validation.txt \
  ./*.json ./*.jsonl ./*.txt 2>/dev/null; ls "$out")
