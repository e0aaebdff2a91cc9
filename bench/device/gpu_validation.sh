#!/usr/bin/env bash
# Issue 8 on the lent GPU machine, in one device call (read-only: never changes compute mode,
# persistence, clocks or MIG; never resets). Run from the repo root:
#   bash bench/device/gpu_validation.sh        (writes its report to $OUT or /tmp/gpu-validation)
# Steps: settings before; hftagent audit --profile hft-gpu; NVML per-call costs; foreign-process
# attribution (watcher + workload + foreign process); hftagent profile --nsight on the workload;
# settings after (must equal before).
set -u
OUT=${OUT:-/tmp/gpu-validation}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
HFT=(python3 -c 'from agent.cli import main; main()')
Q=persistence_mode,compute_mode,clocks.applications.graphics,clocks.sm,clocks_event_reasons.active,mig.mode.current,pcie.link.gen.current,pcie.link.width.current
step() { echo; echo "=== $* ==="; }
{
step "when / where"
date -u +%FT%TZ; uname -r; python3 --version; git rev-parse --short HEAD 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader

step "GPU settings before (read-only query)"
nvidia-smi --query-gpu=$Q --format=csv | tee "$OUT/settings-before.csv"

step "hftagent audit --profile hft-gpu (live; gpu family shown in full)"
TIMEFORMAT="audit wall %R s"; time "${HFT[@]}" audit --profile hft-gpu --json > "$OUT/audit.json"; echo "audit rc=$? (2 = something to fix)"
python3 - "$OUT/audit.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fs = d["findings"] if isinstance(d, dict) else d
for f in fs:
    if f["family"] == "gpu":
        print(f"{f['status']:12s} {f['id']:26s} {f['current']}")
        if f["status"] not in ("ok", "unsupported") and f.get("fix"):
            print(f"{'':12s} {'':26s} fix: {f['fix']}")
print("other families:", {k: v for k, v in __import__("collections").Counter(f["status"] for f in fs if f["family"] != "gpu").items()})
PY

step "audit on the captured fixture tree (--root: NVML must not be queried)"
"${HFT[@]}" audit --profile hft-gpu --root tests/fixtures/gpu-h200 --json > "$OUT/audit-root.json"
python3 -c "import json,sys; d=json.load(open('$OUT/audit-root.json')); fs=d['findings'] if isinstance(d,dict) else d; [print(f['status'], f['id'], f['current']) for f in fs if f['family']=='gpu']"

step "NVML per-call costs (bench/nvml_cost.py)"
python3 bench/nvml_cost.py

step "foreign GPU process attribution (bench/device/gpu_attrib_demo.py)"
OUT=$OUT python3 bench/device/gpu_attrib_demo.py

step "uninstrumented wall time per inference (200 after 300 warm-up)"
python3 bench/device/gpu_workload.py --iters 200 --warmup 300 | tee "$OUT/wall.txt"
WALL=$(sed -n 's/.*median \([0-9.]*\) us.*/\1/p' "$OUT/wall.txt")

step "hftagent profile --nsight (ncu, --clock-control none) on the workload: 20 warm-up + 200 inferences"
"${HFT[@]}" profile --nsight --inferences 220 --wall-us "$WALL" --keep-csv "$OUT/ncu.csv" --top 6 \
  -- python3 bench/device/gpu_workload.py --iters 200 --warmup 20
echo "profile rc=$?"

step "GPU settings after (must equal before)"
nvidia-smi --query-gpu=$Q --format=csv | tee "$OUT/settings-after.csv"
if diff <(cut -d, -f1-3,6 "$OUT/settings-before.csv") <(cut -d, -f1-3,6 "$OUT/settings-after.csv") >/dev/null; then
  echo "persistence, compute mode, applications clocks, MIG: unchanged"
else echo "SETTINGS CHANGED"; fi
} 2>&1 | tee "$OUT/gpu-validation.txt"
