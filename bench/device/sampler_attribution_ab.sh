#!/usr/bin/env bash
# On the lent GPU machine (device tool), from the repo root: attribution accuracy with the
# native reader against the Python sampler, alternating, for the faults where the two could
# differ (CPU contention needs the task scans; the scans are read live in both). Read-only
# for the GPU. Output under $OUT.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD
faults=${FAULTS:-none,cpu_hog,oversubscription}
{
  echo "== $(date -u +%FT%TZ) $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo); cc: $(command -v cc || echo none)"
  for rep in 1 2; do
    for s in python native; do
      echo "-- rep $rep sampler $s"
      python3 bench/attribution.py --duration 15 --faults "$faults" --sampler "$s" \
        --json "$out/attr-$s-$rep.json" --log-dir "$out/log-$s-$rep" 2>&1 | tail -4
    done
  done
} > "$out/sampler-attribution-ab.txt" 2>&1
cat "$out/sampler-attribution-ab.txt"
(cd "$out" && tar czf sampler-attribution-ab.tgz --remove-files ./attr-*.json ./log-* 2>/dev/null; ls "$out")
