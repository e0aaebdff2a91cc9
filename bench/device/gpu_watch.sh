#!/usr/bin/env bash
# On the lent GPU machine (device tool), from the repo root: `hftagent watch` attributing a
# real GPU workload's slow inferences while a foreign GPU process runs mid-run.
#   t=0   workload (PyTorch LSTM, agent.client ring) pinned to the last CPU, 500 Hz, 40 s
#   t=2   hftagent watch --probe external --pid W (GPU collector on), 34 s
#   t=14  foreign GPU process (8192² matmul loop) for 10 s
# Read-only for the GPU: no setting is changed. Output: $OUT/gpu-watch.txt, spikes.jsonl.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD
n=$(nproc); pcpu=$((n - 1))
log="$out/gpu-watch.txt"
{
  echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,persistence_mode,compute_mode --format=csv,noheader)"
  taskset -c "$pcpu" python3 bench/device/gpu_watch_workload.py --seconds 40 > "$out/workload.txt" 2>&1 &
  wpid=$!
  for _ in $(seq 100); do grep -q ready "$out/workload.txt" 2>/dev/null && break; sleep 0.2; done
  cat "$out/workload.txt"
  (sleep 12; t0=$(date +%s.%N); echo "foreign start $t0"; python3 bench/device/gpu_workload.py --foreign 10 --out /dev/null; echo "foreign end $(date +%s.%N)") > "$out/foreign.txt" 2>&1 &
  fpid=$!
  python3 -c 'from agent.cli import main; main()' watch --probe external --pid "$wpid" \
    --cpus "$pcpu" --duration 34 --spike-log "$out/spikes.jsonl" --json --no-live \
    > "$out/watch.json" 2> "$out/watch.err"
  echo "watch rc=$?"
  wait "$fpid"; wait "$wpid"
  cat "$out/foreign.txt" "$out/workload.txt" "$out/watch.err"
  python3 - "$out" <<'PY'
import json, sys, collections
out = sys.argv[1]
s = json.load(open(f"{out}/watch.json"))
print("summary:", json.dumps({k: s.get(k) for k in ("samples", "p50_us", "p99_us", "p999_us",
      "spikes", "causes", "attribution_delay_ms", "sampler")}, default=str))
recs = [json.loads(l) for l in open(f"{out}/spikes.jsonl") if l.strip()]
fo = [l.split()[-1] for l in open(f"{out}/foreign.txt") if l.startswith("foreign ")]
print("spike records:", len(recs))
by = collections.Counter(r.get("cause") for r in recs)
print("top causes:", dict(by))
for r in recs[:3] + [r for r in recs if r.get("cause") == "gpu_foreign_process"][:2]:
    c = r["causes"][0] if r.get("causes") else {}
    print(" ", r.get("time"), r.get("latency_us"), r.get("cause"), json.dumps(c.get("evidence"), default=str)[:300])
PY
} > "$log" 2>&1
cat "$log"
