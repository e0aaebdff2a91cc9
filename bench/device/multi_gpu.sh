#!/usr/bin/env bash
# Issue #19 on a two-GPU machine (device tool, kind nvidia-h200-x2), one call from the repo root:
#   bash bench/device/multi_gpu.sh        (report: $OUT/multi-gpu.txt; raw files beside it)
# Our package is not installed there: it runs from the repo root with PYTHONPATH=$PWD and the
# system python3 (PyTorch on the GPU, no TensorFlow).
# Read-only for the GPUs: only nvidia-smi --query-* and NVML getters; never changes compute
# mode, persistence, clocks or MIG, never resets. The settings of both GPUs are printed before
# and after and diffed. Every process it starts it ends by its PID.
#
#   1. layout: index, bus id, NUMA node, local CPUs of each GPU (nvidia-smi, sysfs), topo -m
#   2. audit --profile hft-gpu --json --pid W --cpus <GPU 0's local CPUs but the lowest>, W = a
#      PyTorch inference workload on GPU 0, F = a foreign PyTorch matmul loop on GPU 1 only (GPU 1
#      has a foreign process, GPU 0 none); every per-GPU value checked against nvidia-smi
#      --query-gpu / --query-compute-apps of both GPUs; then audit without --pid (the default
#      target CPUs, one process per GPU assumed to be its inference one)
#   3. watch --probe external --pid W (W on GPU 0, its latencies through agent.client, 500 Hz,
#      pinned to a CPU local to GPU 0); a foreign matmul loop first on GPU 1 (12 s), then on
#      GPU 0 (12 s): in the GPU-1 phase no spike may be blamed on "GPU shared", in the GPU-0
#      phase the foreign PID is named; both shares
#   4. hftagent run --dry-run for a process bound to GPU 1 (CUDA_VISIBLE_DEVICES=1, and
#      `run --gpu 1` where run has that option): what --cpus defaults to, vs GPU 1's local
#      CPUs (less the housekeeping core, tuning/targets.py)
# CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA's device index is then NVML's (and nvidia-smi's).
set -u -o pipefail  # the report's exit status (3: fewer than two GPUs), not tee's
out=${OUT:-/tmp/multi-gpu}; mkdir -p "$out"
export PYTHONPATH=$PWD CUDA_DEVICE_ORDER=PCI_BUS_ID
HFT=(python3 -c 'from agent.cli import main; main()')
CHECK=(python3 bench/device/multi_gpu_check.py)
Q=index,pci.bus_id,persistence_mode,compute_mode,clocks.applications.graphics,mig.mode.current
SMI_FIELDS=$(python3 -c 'import sys; sys.path.insert(0, "bench/device"); import multi_gpu_check as m; print(m.SMI_FIELDS)')
APPS_FIELDS=$(python3 -c 'import sys; sys.path.insert(0, "bench/device"); import multi_gpu_check as m; print(m.APPS_FIELDS)')
step() { echo; echo "=== $* ==="; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
wait_ready() {  # FILE: until the workload prints "ready" (≤ 60 s)
  for _ in $(seq 300); do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.2; done; return 1
}
wait_context() {  # PID BUS: until PID has a compute context on the GPU at BUS (≤ 30 s)
  for _ in $(seq 150); do
    nvidia-smi --query-compute-apps=gpu_bus_id,pid --format=csv,noheader 2>/dev/null |
      python3 -c 'import sys; from collectors.pcie import normalize_bus_id as n
sys.exit(0 if any(n(b) == n(sys.argv[2]) and p.strip() == sys.argv[1]
                  for b, p in (l.split(",")[:2] for l in sys.stdin if "," in l)) else 1)' "$1" "$2" && return 0
    sleep 0.2
  done; return 1
}
pick() {  # CPULIST INDEX: the INDEX-th CPU from the end of CPULIST (1 = last)
  python3 -c 'import sys; from collectors.parsers import parse_cpulist as p
c = sorted(p(sys.argv[1])); print(c[-int(sys.argv[2])] if len(c) >= int(sys.argv[2]) else c[0])' "$1" "$2"
}
{
trap cleanup EXIT  # the block runs in its own subshell (| tee): its trap, its pids
step "when / where"
date -u +%FT%TZ; uname -r; python3 --version; git rev-parse --short HEAD 2>/dev/null || true
ngpu=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader
if [ "$ngpu" -lt 2 ]; then echo "this machine has $ngpu GPU(s): issue #19 needs two (kind nvidia-h200-x2)"; exit 3; fi

step "GPU settings before (read-only query)"
nvidia-smi --query-gpu=$Q --format=csv | tee "$out/settings-before.csv"

step "layout: GPU index, bus id, NUMA node, local CPUs (sysfs); nvidia-smi topo -m"
"${CHECK[@]}" layout | tee "$out/layout.txt"
nvidia-smi topo -m
read -r _ bus0 node0 local0 < <(sed -n 1p "$out/layout.txt")
read -r _ bus1 node1 local1 < <(sed -n 2p "$out/layout.txt")
all="0-$(( $(nproc --all) - 1 ))"
[ "$local0" = "?" ] && local0=$all; [ "$local1" = "?" ] && local1=$all
# audit target: GPU 0's local CPUs but the lowest (left to housekeeping)
target0=$(python3 -c 'import sys; from collectors.parsers import parse_cpulist as p, format_cpulist as f
c = sorted(p(sys.argv[1])); print(f(c[1:] or c))' "$local0")
cpu_w=$(pick "$local0" 1)                       # the workload's CPU, local to GPU 0
cpu_f1=$(pick "$local1" 1); [ "$cpu_f1" = "$cpu_w" ] && cpu_f1=$(pick "$local1" 2)
cpu_f0=$(pick "$local0" 2)                      # the foreign loop on GPU 0: another CPU
echo "GPU 0 $bus0 node $node0 CPUs $local0; GPU 1 $bus1 node $node1 CPUs $local1"
echo "workload on CPU $cpu_w; foreign on GPU 1 on CPU $cpu_f1, on GPU 0 on CPU $cpu_f0"

step "workload W on GPU 0 (PyTorch LSTM, agent.client), pinned to CPU $cpu_w"
CUDA_VISIBLE_DEVICES=0 taskset -c "$cpu_w" python3 bench/device/gpu_watch_workload.py \
  --seconds 100 > "$out/workload.txt" 2>&1 &
wpid=$!; pids+=("$wpid")
wait_ready "$out/workload.txt" || { echo "workload not ready"; cat "$out/workload.txt"; exit 1; }
cat "$out/workload.txt"

step "audit with W on GPU 0 and a foreign PyTorch process F on GPU 1 only"
CUDA_VISIBLE_DEVICES=1 taskset -c "$cpu_f1" python3 bench/device/gpu_workload.py --foreign 20 \
  > "$out/foreign-audit.txt" 2>&1 &
fapid=$!; pids+=("$fapid")
wait_context "$fapid" "$bus1" && echo "F pid $fapid has a context on GPU 1 ($bus1)" ||
  echo "F pid $fapid: no context on GPU 1 seen within 30 s"
nvidia-smi --query-compute-apps=$APPS_FIELDS --format=csv,noheader,nounits | tee "$out/apps.csv"
TIMEFORMAT="audit wall %R s"
time "${HFT[@]}" audit --profile hft-gpu --pid "$wpid" --cpus "$target0" --json \
  > "$out/audit-pid.json" 2> "$out/audit-pid.err"
echo "audit --pid rc=$? (2 = something to fix)"; cat "$out/audit-pid.err"
nvidia-smi --query-gpu=$SMI_FIELDS --format=csv,noheader,nounits | tee "$out/smi.csv"
nvidia-smi --query-compute-apps=$APPS_FIELDS --format=csv,noheader,nounits > "$out/apps-after.csv"
"${CHECK[@]}" audit "$out/audit-pid.json" "$out/smi.csv" "$out/apps.csv" --pid "$wpid" \
  --foreign "$fapid" --foreign-gpu 1
step "audit without --pid (default target CPUs)"
"${HFT[@]}" audit --profile hft-gpu --json > "$out/audit-nopid.json" 2> "$out/audit-nopid.err"
echo "audit rc=$?"; cat "$out/audit-nopid.err"
python3 - "$out/audit-nopid.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("target CPUs", d.get("target_cpus"))
for f in d["findings"]:
    if f["id"].endswith((".foreign_processes", ".numa")) or f["id"] == "pcie.numa_locality":
        print(f"  {f['status']:12s} {f['id']:26s} {f['current']}")
PY
kill "$fapid" 2>/dev/null; wait "$fapid" 2>/dev/null; cat "$out/foreign-audit.txt"

step "watch on W (GPU 0): foreign matmul loop on GPU 1 (12 s), then on GPU 0 (12 s)"
"${HFT[@]}" watch --probe external --pid "$wpid" --cpus "$cpu_w" --duration 60 \
  --spike-log "$out/spikes.jsonl" --json --no-live > "$out/watch.json" 2> "$out/watch.err" &
watch_pid=$!; pids+=("$watch_pid")
: > "$out/phases.txt"
sleep 14
t0=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=1 taskset -c "$cpu_f1" python3 bench/device/gpu_workload.py --foreign 12 \
  > "$out/foreign1.txt" 2>&1 &
f1=$!; pids+=("$f1"); wait "$f1"
echo "gpu1 $t0 $(date +%s.%N) $f1" >> "$out/phases.txt"
sleep 6
t0=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=0 taskset -c "$cpu_f0" python3 bench/device/gpu_workload.py --foreign 12 \
  > "$out/foreign0.txt" 2>&1 &
f0=$!; pids+=("$f0"); wait "$f0"
echo "gpu0 $t0 $(date +%s.%N) $f0" >> "$out/phases.txt"
wait "$watch_pid"; echo "watch rc=$?"
cat "$out/phases.txt" "$out/foreign1.txt" "$out/foreign0.txt" "$out/watch.err"
python3 - "$out/watch.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("summary:", json.dumps({k: s.get(k) for k in ("samples", "p50_us", "p99_us", "spikes",
      "causes", "attribution_delay_ms", "sampler")}, default=str))
print("gpu collector:", json.dumps((s.get("collectors") or {}).get("gpu"), default=str))
PY
"${CHECK[@]}" watch "$out/spikes.jsonl" "$out/phases.txt"
kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null

step "hftagent run --dry-run for a process bound to GPU 1: default --cpus"
CUDA_VISIBLE_DEVICES=1 "${HFT[@]}" run --dry-run --json -- python3 -c pass > "$out/run-gpu1.json"
echo "run (CUDA_VISIBLE_DEVICES=1) rc=$?"; cat "$out/run-gpu1.json"
"${CHECK[@]}" run "$out/run-gpu1.json" "$local1" --gpu 1 --label "CUDA_VISIBLE_DEVICES=1 run"
if "${HFT[@]}" run --help 2>/dev/null | grep -q -- '--gpu'; then
  "${HFT[@]}" run --gpu 1 --dry-run --json -- python3 -c pass > "$out/run-gpu1-option.json"
  echo "run --gpu 1 rc=$?"; cat "$out/run-gpu1-option.json"
  "${CHECK[@]}" run "$out/run-gpu1-option.json" "$local1" --gpu 1 --label "run --gpu 1"
else echo "run has no --gpu option in this tree"; fi

step "GPU settings after (must equal before)"
nvidia-smi --query-gpu=$Q --format=csv | tee "$out/settings-after.csv"
if diff "$out/settings-before.csv" "$out/settings-after.csv" >/dev/null; then
  echo "persistence, compute mode, applications clocks, MIG of both GPUs: unchanged"
else echo "SETTINGS CHANGED"; fi
} 2>&1 | tee "$out/multi-gpu.txt"
