#!/usr/bin/env bash
# Second-wave validation on the lent 16-CPU GPU machine (a disposable VM), as root, from the
# repo root through the device tool:   bash bench/device/cure_validation.sh
#
#   1. hftagent cpus, quiet                                    -> $OUT/cpus-quiet.json
#   2. hftagent cpus with a bursty task pinned to CPU $NOISY   -> $OUT/cpus-loaded.json
#      (the loaded CPU must not be recommended; tune plan must accept the recommendation)
#   3. runtime isolation round trip (tune apply/rollback --isolate, real tasks and cpusets)
#                                                              -> $OUT/isolate.json
#   4. bench/tuning_effect.py: quiet / noisy / bursty / stressed, each lever alone and all
#      together, the wake-up and idle-gap curves               -> $OUT/tuning_effect.json
# The GPU is never touched (no NVML writes; nothing runs on it). Everything started here is
# stopped by pid. Well under 10 minutes.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD
HFT=(python3 -c 'from agent.cli import main; main()')  # an array: `timeout` cannot run a function
log="$out/log.txt"
NOISY=${NOISY:-5}
n=$(nproc --all)
{
  echo "== env"; nproc --all; uname -r; python3 --version
  mount | grep -E 'cgroup|tracefs' ; ls /sys/fs/cgroup | head -30
  for f in /sys/devices/system/cpu/cpuidle/current_driver /sys/devices/system/cpu/cpuidle/current_governor_ro \
           /sys/devices/system/cpu/cpuidle/current_governor /sys/devices/system/cpu/isolated \
           /sys/devices/system/cpu/nohz_full /sys/devices/virtual/workqueue/cpumask; do
    [ -e "$f" ] && echo "$f: $(cat "$f")"
  done
  cat /proc/cmdline
} > "$out/env.txt" 2>&1

echo "== 1. cpus quiet $(date +%T)" >> "$log"
timeout 180 "${HFT[@]}" cpus --duration 1 --json > "$out/cpus-quiet.json" 2>> "$log"; echo "rc=$?" >> "$log"

echo "== 2. cpus with a bursty task pinned to CPU $NOISY $(date +%T)" >> "$log"
export NOISY
python3 -c '
import os, random, time
os.sched_setaffinity(0, [int(os.environ["NOISY"])])
c = time.monotonic
while True:
    e = c() + random.uniform(0.0005, 0.003)
    while c() < e: pass
    time.sleep(random.uniform(0.001, 0.004))
' & hog=$!
sleep 0.5
timeout 180 "${HFT[@]}" cpus --duration 1 --json > "$out/cpus-loaded.json" 2>> "$log"; echo "rc=$?" >> "$log"
kill "$hog"; wait "$hog" 2>/dev/null
python3 - "$out" >> "$log" 2>&1 <<'PY'
import json, subprocess, sys
out = sys.argv[1]
for name in ("cpus-quiet", "cpus-loaded"):
    try:
        d = json.load(open(f"{out}/{name}.json"))
    except Exception as exc:
        print(name, "unreadable:", exc); continue
    rows = {r["cpu"]: r for r in d["cpus"]}
    print(name, "recommended", d["recommended"], "commands", d["commands"][:1])
    for c, r in sorted(rows.items()):
        print(f"  cpu {c}: {r['verdict']:5} noise {r['noise_us_per_s']:9.1f} us/s gaps/s {r['gaps_per_s']:8.1f} p999 {r['p999_gap_ns']} max {r['max_gap_ns']} {r['causes']}")
    if d["recommended"]:
        cpus = ",".join(map(str, d["recommended"]))
        p = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", "tune",
                            "plan", "--cpus", cpus], capture_output=True, text=True)
        print(f"  tune plan --cpus {cpus}: rc {p.returncode}", p.stderr.strip()[:200])
PY

echo "== 3. isolation round trip $(date +%T)" >> "$log"
timeout 180 python3 bench/isolate_roundtrip.py --cpus "$((n / 2))-$((n - 1))" --state-dir /tmp/iso-rt \
  --json "$out/isolate.json" >> "$log" 2>&1; echo "rc=$?" >> "$log"

if [ -z "${SKIP_EFFECT:-}" ]; then  # SKIP_EFFECT=1: steps 1-3 only (~1 minute)
  echo "== 4. tuning effect $(date +%T)" >> "$log"
  timeout 480 python3 bench/tuning_effect.py --cpu "$((n - 1))" --block-s 5 --rounds 2 \
    --json "$out/tuning_effect.json" > "$out/tuning_effect.txt" 2>> "$log"; echo "rc=$?" >> "$log"
fi
echo "== done $(date +%T)" >> "$log"
