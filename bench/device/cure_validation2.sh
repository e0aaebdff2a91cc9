#!/usr/bin/env bash
# Third-wave validation on the lent 16-CPU GPU machine (a disposable VM, no TensorFlow), as
# root, from the repo root through the device tool:   bash bench/device/cure_validation2.sh
#
#   1. the stressed gate, untuned then tuned (tune apply --isolate --only isolate on the
#      target CPU, rolled back after), on the TF-free numpy model      -> $OUT/gate.json
#   2. the wake-up curve on the isolated target CPU: plain, keep-awake with the pause loop
#      and with the busy loop, interleaved                              -> $OUT/wake.json
#   3. attribution with kernel events (watch --trace mount) under the faults that leave a
#      culprit to name                                                  -> $OUT/attribution.json
#   4. the events on/off cost A/B                                       -> $OUT/events_ab.json
# STEPS="1 2" runs only those steps; WAKE_ROUNDS (2) and WAKE_BLOCK_S (3) size step 2.
# Each step has its own time limit and the order is by priority: a step that runs out of
# time leaves the others' results. The GPU is never touched. Everything started here is
# stopped by pid; every tune apply is rolled back and checked.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD
HFT=(python3 -c 'from agent.cli import main; main()')
log="$out/log.txt"
n=$(nproc --all)
cpu=$((n - 1))
st=/tmp/hft-cv2-state
db=/tmp/hft-cv2-db.sqlite
{
  echo "== env"; nproc --all; uname -r; python3 --version
  python3 -c 'import numpy; print("numpy", numpy.__version__)'
  for f in /sys/devices/system/cpu/cpuidle/current_driver /sys/module/kvm_intel/parameters/ple_gap \
           /sys/module/kvm_amd/parameters/pause_filter_count; do
    [ -e "$f" ] && echo "$f: $(cat "$f")"
  done
  grep -m1 'model name' /proc/cpuinfo; grep -c hypervisor /proc/cpuinfo
} > "$out/env.txt" 2>&1

want() { [[ " ${STEPS:-1 2 3 4} " == *" $1 "* ]]; }
if want 1; then
echo "== 1. stressed gate, CPU $cpu $(date +%T)" >> "$log"
python3 - "$out" "$cpu" "$st" "$db" >> "$log" 2>&1 <<'PY'
import json, subprocess, sys, time
out, cpu, st, db = sys.argv[1:5]
HFT = [sys.executable, "-c", "from agent.cli import main; main()"]
doc = {"cpu": int(cpu)}
def gate(tag):
    t = time.monotonic()
    try:
        r = subprocess.run(HFT + ["gate", "--model", "numpy", "--scenarios", "warm,stressed",
                                  "--cpus", cpu, "--duration", "12", "--db", db, "--json"],
                           capture_output=True, text=True, timeout=70)
    except subprocess.TimeoutExpired:
        doc[tag] = {"rc": None, "error": "timed out after 70 s"}
        print(tag, "timed out")
        return
    d = {"rc": r.returncode, "stderr": r.stderr.strip()[-600:], "s": round(time.monotonic() - t, 1)}
    try:
        d["result"] = json.loads(r.stdout)
    except ValueError:
        d["stdout"] = r.stdout[-600:]
    doc[tag] = d
    print(tag, "rc", r.returncode, "in", d["s"], "s", r.stderr.strip()[-300:])
gate("untuned")
a = subprocess.run(HFT + ["tune", "apply", "--isolate", "--only", "isolate", "--cpus", cpu,
                          "--state-dir", st, "--json"], capture_output=True, text=True, timeout=120)
doc["apply"] = {"rc": a.returncode, "stderr": a.stderr.strip()[-400:]}
print("apply rc", a.returncode, a.stderr.strip()[-200:])
try:
    gate("tuned")
finally:
    rb = subprocess.run(HFT + ["tune", "rollback", "--state-dir", st], capture_output=True,
                        text=True, timeout=120)
    stt = subprocess.run(HFT + ["tune", "status", "--state-dir", st, "--json"],
                         capture_output=True, text=True, timeout=60)
    doc["rollback"] = {"rc": rb.returncode, "stderr": rb.stderr.strip()[-400:],
                       "status": stt.stdout[-400:]}
    print("rollback rc", rb.returncode, rb.stderr.strip()[-200:])
    json.dump(doc, open(f"{out}/gate.json", "w"), indent=1)
PY
fi

if want 2; then
echo "== 2. wake-up curve (isolated CPU $cpu) $(date +%T)" >> "$log"
timeout 150 python3 bench/tuning_effect.py --wake-only --wake-isolated --keepawake-loops pause,busy \
  --cpu "$cpu" --rate 300 --block-s "${WAKE_BLOCK_S:-3}" --rounds "${WAKE_ROUNDS:-2}" \
  --json "$out/wake.json" > "$out/wake.txt" 2>> "$log"
echo "rc=$?" >> "$log"
fi

if want 3; then
echo "== 3. attribution with events $(date +%T)" >> "$log"
grep -q ' /sys/kernel/tracing ' /proc/mounts || mount -t tracefs nodev /sys/kernel/tracing
timeout 90 python3 bench/attribution.py --duration 7 --settle 3 --trace mount \
  --faults none,cpu_hog_rt,softirq_flood,oversubscription --json "$out/attribution.json" \
  > "$out/attribution.txt" 2>> "$log"
echo "rc=$?" >> "$log"
fi

if want 4; then
echo "== 4. events on/off cost $(date +%T)" >> "$log"
timeout 60 python3 bench/events_ab.py --pairs 3 --duration 5 --json "$out/events_ab.json" > "$out/events_ab.txt" 2>> "$log"
echo "rc=$?" >> "$log"
fi
echo "== done $(date +%T)" >> "$log"
