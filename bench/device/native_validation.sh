#!/usr/bin/env bash
# On the lent GPU machine (device tool), from the repo root: a second sample of the collector
# cost (Python sampler vs the native reader), and the CPU-contention faults with the kernel's
# account of steal, IRQ time and cgroup CPU throttling on the probe CPU (fault_check), to
# explain spikes that lose time neither on the CPU nor on a run queue. Read-only for the GPU.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD
{
  echo "== $(date -u +%FT%TZ) $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo); cc: $(command -v cc || echo none)"
  echo "cgroup: $(cat /proc/self/cgroup); cpu.max: $(cat /sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/cpu.max 2>/dev/null || echo n/a)"
  python3 bench/collector_cost.py --seconds 10 --json "$out/collector_cost.json" > /dev/null \
    && python3 bench/collector_cost.py --summary "$out/collector_cost.json"
  python3 bench/attribution.py --duration 15 --faults none,cpu_hog,oversubscription \
    --json "$out/attribution.json" --log-dir "$out/log" 2>&1 | tail -4
  python3 - "$out/attribution.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    c = r.get("fault_check") or {}
    print(r["fault"], r.get("sampler"), "unexpl own", r.get("unexplained_own"), "lost ms p50",
          r.get("unexplained_lost_ms_p50"), "steal", c.get("probe_cpu_steal_ticks"), "irq",
          c.get("probe_cpu_irq_ticks"), "throttled", c.get("cgroup_throttled"))
PY
} > "$out/native-validation.txt" 2>&1
cat "$out/native-validation.txt"
(cd "$out" && tar czf native-validation.tgz --remove-files ./*.json ./log 2>/dev/null; ls "$out")
