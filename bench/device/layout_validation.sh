#!/usr/bin/env bash
# On the lent GPU machine (device tool), from the repo root: after the native reader learned
# token layouts and the 1 Hz / poked replay (2026-11-30c) — the collector cost at 100 Hz three
# times (Python vs native side by side in each run), the GPU-sharing attribution run
# (gpu_watch.sh) and the fault-injection attribution bench with watch's default sampler.
# Read-only for the GPU. Output under $OUT (copied back by the device tool); ~8 minutes.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD
{
  echo "== $(date -u +%FT%TZ) $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo); cc: $(command -v cc || echo none)"
  for i in 1 2 3; do
    python3 bench/collector_cost.py --seconds 8 --json "$out/collector_cost_$i.json" > /dev/null \
      && python3 bench/collector_cost.py --summary "$out/collector_cost_$i.json" | grep native
  done
  bash bench/device/gpu_watch.sh > /dev/null 2>&1; tail -8 "$out/gpu-watch.txt"
  python3 bench/attribution.py --duration 15 --json "$out/attribution.json" 2>&1 | tail -9
} > "$out/layout-validation.txt" 2>&1
cat "$out/layout-validation.txt"
# The device tool brings back at most 8 files: everything but the summary in one archive.
(cd "$out" && tar czf layout-validation.tgz --remove-files --exclude ./layout-validation.txt \
  ./*.json ./*.jsonl ./*.txt 2>/dev/null; ls "$out")
