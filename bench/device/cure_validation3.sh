#!/usr/bin/env bash
# Fourth-wave validation on the lent 16-CPU GPU machine (a disposable Firecracker VM, no
# TensorFlow, no CAP_SYS_NICE), as root, from the repo root through the device tool:
#     STEPS="1 2 3" bash bench/device/cure_validation3.sh      # ~6 min
#     STEPS="4" bash bench/device/cure_validation3.sh          # ~6 min
#
#   1. one interrupt's cost to a running task on three CPUs (agent/noise/irqcost.py)
#                                                               -> $OUT/irqcost.json
#   2. attribution with kernel events (watch --trace mount) under every fault of the kit,
#      the interrupts' hidden cost measured by watch itself      -> $OUT/attribution.json
#   3. the wake-up ratio on the isolated target CPU: plain, keep-awake (pause, busy), per-
#      round pairs and the interleaved-gap measure                -> $OUT/wake.json
#   4. tuned vs untuned tails with >= 6,636 samples per scenario (P99.9 sufficient) for
#      quiet, noisy, bursty, noisy+all, bursty+all               -> $OUT/tuning_effect.json
#   5. quiet, bursty, bursty+all, noisy+all again (another seed), with each block's own
#      figures and the target CPU's counters                     -> $OUT/tuning_effect_bursty.json
# Each step has its own time limit; a step that runs out leaves the others' results. The GPU
# is never touched. Everything started here is stopped by pid; every tune apply is rolled
# back by the bench that made it (and checked: tune status in the log).
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD
log="$out/log.txt"
n=$(nproc --all)
cpu=$((n - 1))
{
  echo "== env"; nproc --all; uname -r; python3 --version
  python3 -c 'import numpy; print("numpy", numpy.__version__)'
  for f in /sys/devices/system/cpu/cpuidle/current_driver /sys/module/kvm_intel/parameters/ple_gap; do
    [ -e "$f" ] && echo "$f: $(cat "$f")"
  done
  grep -m1 'model name' /proc/cpuinfo; grep -c hypervisor /proc/cpuinfo; cat /proc/loadavg
  echo "siblings of CPU $((n - 1)): $(cat /sys/devices/system/cpu/cpu$((n - 1))/topology/thread_siblings_list)"
  lscpu | grep -Ei 'thread|core|socket|numa|l2|l3' 
} > "$out/env.txt" 2>&1

want() { [[ " ${STEPS:-1 2 3 4} " == *" $1 "* ]]; }
if want 1; then
echo "== 1. interrupt cost $(date +%T)" >> "$log"
timeout 60 python3 - "$out" "$cpu" >> "$log" 2>&1 <<'PY'
import json, sys
from agent.noise.irqcost import measure
out, cpu = sys.argv[1], int(sys.argv[2])
res = [measure(c, 0).to_dict() for c in (cpu, cpu // 2, 1) for _ in range(2)]
for r in res:
    print(r["note"])
json.dump(res, open(f"{out}/irqcost.json", "w"), indent=1)
PY
echo "rc=$?" >> "$log"
fi

if want 2; then
echo "== 2. attribution with events, every fault $(date +%T)" >> "$log"
grep -q ' /sys/kernel/tracing ' /proc/mounts || mount -t tracefs nodev /sys/kernel/tracing
timeout 200 python3 bench/attribution.py --duration 7 --settle 3 --trace mount \
  --faults none,cpu_hog,cpu_hog_rt,softirq_flood,memory_pressure,oversubscription,migration \
  --json "$out/attribution.json" --log-dir "$out/attribution-logs" \
  > "$out/attribution.txt" 2>> "$log"
echo "rc=$?" >> "$log"
# the spike logs are big: keep the first 40 records of each fault
for f in "$out"/attribution-logs/*.jsonl; do head -40 "$f" > "$f.head" && mv "$f.head" "$f"; done
fi

if want 3; then
echo "== 3. wake-up ratio (isolated CPU $cpu) $(date +%T)" >> "$log"
timeout 170 python3 bench/tuning_effect.py --cpu "$cpu" --wake-only --wake-isolated \
  --keepawake-loops pause,busy --json "$out/wake.json" > "$out/wake.txt" 2>> "$log"
echo "rc=$?" >> "$log"
fi

if want 4; then
echo "== 4. tuning effect, P99.9-sufficient samples $(date +%T)" >> "$log"
timeout 420 python3 bench/tuning_effect.py --cpu "$cpu" \
  --scenarios quiet,noisy,bursty,noisy+all,bursty+all --min-samples 6636 --rounds 3 \
  --budget-s 400 --no-wake --json "$out/tuning_effect.json" > "$out/tuning_effect.txt" 2>> "$log"
echo "rc=$?" >> "$log"
fi
if want 5; then
echo "== 5. bursty + all, again (per-block figures) $(date +%T)" >> "$log"
timeout 330 python3 bench/tuning_effect.py --cpu "$cpu" \
  --scenarios quiet,bursty,bursty+all,noisy+all --min-samples 6636 --rounds 3 \
  --budget-s 320 --no-wake --seed "${SEED:-29}" --json "$out/tuning_effect_bursty.json" \
  > "$out/tuning_effect_bursty.txt" 2>> "$log"
echo "rc=$?" >> "$log"
fi
echo "== done $(date +%T)" >> "$log"
