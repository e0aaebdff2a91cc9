#!/usr/bin/env bash
# The one validation script for the lent GPU machine (a disposable VM, root, no TensorFlow),
# run from the repo root through the device tool. STEPS names what runs, in this order:
#
#     STEPS="irqcost attribution" bash bench/device/validate.sh
#
#   env          (always) kernel, CPUs, cpuidle, cgroups, tracefs          -> $OUT/env.txt
#   capture      the /proc and /sys files the audit reads (bench/device/capture.sh)
#   irqcost      one interrupt's cost to a running task on three CPUs     -> irqcost.json
#   idle_switch  does this kernel record the switch from idle?            -> idle_switch.txt
#   attribution  bench/attribution.py with kernel events, one run per word of RUNS (a
#                comma-separated fault list; "all" = every fault); WATCH_NICE=-10 runs watch's
#                own threads at that nice value; SOURCE=service|attach times bench/service.py
#                (by its ring, or unmodified by uprobes) instead of watch's probe; GPU=1 runs
#                the GPU fault group on bench/gpu_service.py (JAX) instead
#                                                                -> attribution.txt, -runs.tar.gz
#   events_cost  bench/events_ab.py, 3 pairs                                -> events_ab.json
#   own_cost     watch's own summary: sampler + event reads, % of one CPU  -> own_cost.txt
#   collectors   bench/collector_cost.py --seconds 8                   -> collector_cost.json
#   cpus         hftagent cpus quiet, then with a bursty task pinned to CPU $NOISY  -> cpus.txt
#   isolate      bench/isolate_roundtrip.py on the upper half of the CPUs   -> isolate.json
#   gate         the stressed gate untuned, then tuned (rolled back after)      -> gate.json
#   wake         the wake-up ratio on the isolated last CPU                        -> wake.json
#   tuning       bench/tuning_effect.py, P99.9-sufficient, with the keep-awake arms
#                                                                        -> tuning_effect.json
#   litert       probe and watch on the bundled .tflite with LiteRT and no TensorFlow
#                                                                       -> litert.txt
#   attach       bench/attach_overhead.py (added µs per LiteRT call, agreement, attach time),
#                then watch --attach on bench/service.py's LiteRT loop   -> attach_overhead.json,
#                attach.txt
#   attach_cost  bench/attach_overhead.py on bench/models/dense-16.tflite (~1 µs a call): the
#                added µs per call resolved                              -> attach_cost.json
#   roundtrip    bench/device/tuning_roundtrip.sh: every tunable applied and rolled back
#   tune_try     hftagent tune try on CPU $cpu with $BUSY (32) busy processes elsewhere (the
#                lever table, the winner; every lever undone: the cpuset and journal checked)
#                                                                      -> tune_try.txt/.json
#   fix_script   bench/fix_roundtrip.py: the audit's fix script run, then tune rollback; every
#                value the script touched compared with the snapshot before  -> fix_script.txt
#   gate_rerun   bench/gate_rerun.py: $RERUNS identical gate reruns with a busy loop on each
#                housekeeping CPU, then $BURSTS runs with SCHED_FIFO bursts on CPU $cpu
#                                                                       -> gate_rerun.txt
#   own_attach   bench/own_cpu.sh: watch --attach's own CPU on a LiteRT service on CPU $cpu,
#                quiet then under SCHED_FIFO bursts, $D_OWN (45) s each   -> own_attach.txt
#   restarts     bench/restarts.py: $RESTARTS (100) restarts of a LiteRT service under
#                watch --attach-name: calls timed after each first second, fds, leftovers
#                                                                       -> restarts.txt/.json
#   gpu_cost     bench/attach_overhead.py --gpu at --gpu-probes default, then copies (JAX)
#                                                                  -> gpu_cost.txt, _LEVEL.json
#   (LiteRT is not on that machine: carry its cp312 wheel in .whl and install it first, as
#   the device tool's README shows; the steps that need it say so when it is missing)
#   gpu          bench/device/gpu_validation.sh (read-only NVML and nsight checks)
#   gpu_watch    bench/device/gpu_watch.sh (a foreign GPU process named by watch)
# (bench/device/multi_gpu.sh needs the two-GPU kind and stays a call of its own.)
#
# Each step has its own time limit, so a step that runs out leaves the others' results. The
# GPU's settings are never changed. Everything started here is stopped by pid; every tune
# apply is rolled back by the step that made it. The device tool brings back 8 files at most:
# ask for few steps per call.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # keeps a carried wheel's /tmp/site
HFT=(python3 -c 'from agent.cli import main; main()')  # an array: `timeout` cannot run a function
log="$out/log.txt"
n=$(nproc --all)
cpu=$((n - 1))
NOISY=${NOISY:-5}
want() { [[ " ${STEPS:-} " == *" $1 "* ]]; }
step() { echo "== $1 $(date +%T)" >> "$log"; }
rc() { echo "rc=$?" >> "$log"; }
tracefs() { grep -q ' /sys/kernel/tracing ' /proc/mounts || mount -t tracefs nodev /sys/kernel/tracing; }

{
  echo "== env"; nproc --all; uname -r; python3 --version
  python3 -c 'import numpy; print("numpy", numpy.__version__)'
  for f in /sys/devices/system/cpu/cpuidle/current_driver /sys/devices/system/cpu/isolated \
           /sys/module/kvm_intel/parameters/ple_gap /sys/devices/virtual/workqueue/cpumask; do
    [ -e "$f" ] && echo "$f: $(cat "$f")"
  done
  grep -m1 'model name' /proc/cpuinfo; cat /proc/loadavg; cat /proc/cmdline
  mount | grep -E 'cgroup|tracefs'
  echo "perf event sources: $(ls /sys/bus/event_source/devices 2>&1 | tr '\n' ' ')"
  echo "perf_event_paranoid: $(cat /proc/sys/kernel/perf_event_paranoid 2>&1)"
  grep -o -m1 -w 'hypervisor\|arch_perfmon\|pdcm' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
} > "$out/env.txt" 2>&1

if want capture; then step capture; bash bench/device/capture.sh >> "$log" 2>&1; rc; fi

if want irqcost; then
step "irqcost (CPUs $cpu, $((cpu / 2)), 1)"
timeout 60 python3 - "$out" "$cpu" >> "$log" 2>&1 <<'PY'
import json, sys
from agent.trace.irqcost import measure
out, cpu = sys.argv[1], int(sys.argv[2])
res = [measure(c, 0).to_dict() for c in (cpu, cpu // 2, 1) for _ in range(2)]
for r in res:
    print(r["note"])
json.dump(res, open(f"{out}/irqcost.json", "w"), indent=1)
PY
rc
fi

if want idle_switch; then
step "idle_switch (CPU $cpu)"
tracefs
inst=/sys/kernel/tracing/instances/hftcheck-$$-$RANDOM
mkdir "$inst" && trap 'echo 0 > "$inst/events/sched/sched_switch/enable"; rmdir "$inst"' EXIT
printf '%x' $((1 << cpu)) > "$inst/tracing_cpumask"
echo 4096 > "$inst/buffer_size_kb"
echo 1 > "$inst/events/sched/sched_switch/enable"
taskset -c "$cpu" python3 -c 'import time
for _ in range(500): time.sleep(0.001)'
echo 0 > "$inst/events/sched/sched_switch/enable"
{
  echo "switches: $(grep -c sched_switch "$inst/trace")"
  echo "to idle (next_pid=0): $(grep -c 'next_pid=0 ' "$inst/trace")"
  echo "from idle (prev_pid=0): $(grep -c 'prev_pid=0 ' "$inst/trace")"
} > "$out/idle_switch.txt" 2>&1
rmdir "$inst"; trap - EXIT
fi

if want attribution; then
tracefs
all=none,cpu_hog,cpu_hog_rt,softirq_flood,memory_pressure,oversubscription,migration
rm -rf /tmp/attribution-runs; mkdir -p /tmp/attribution-runs
i=0
for faults in ${RUNS:-all}; do
  i=$((i + 1)); d=/tmp/attribution-runs/run$i; mkdir -p "$d"
  [ "$faults" = all ] && faults=$all
  step "attribution run$i: $faults"
  timeout 300 python3 bench/attribution.py --duration "${DURATION:-7}" --settle 3 --trace mount \
    --faults "$faults" ${WATCH_NICE:+--watch-nice "$WATCH_NICE"} --source "${SOURCE:-probe}" ${GPU:+--gpu} \
    --json "$d/attribution.json" --log-dir "$d/attribution-logs" \
    > "$d/attribution.txt" 2>> "$log"
  rc
  { echo "== run$i: $faults"; sed -n '/^$/,$p' "$d/attribution.txt"; } >> "$out/attribution.txt"
done
tar -C /tmp -czf "$out/attribution-runs.tar.gz" attribution-runs
fi

if want events_cost; then
step events_cost; tracefs
timeout 200 python3 bench/events_ab.py --pairs 3 --duration 5 --trace-on mount \
  --json "$out/events_ab.json" > "$out/events_ab.txt" 2>> "$log"
rc
fi

if want own_cost; then
# watch's own summary (own_cpu_share_of_one_cpu: sampler + event reads), default rate, events
# on: the built-in numpy probe, then the bundled .tflite on LiteRT, $RUNS_COST runs of 10 s each
step "own_cost, CPU $cpu"; tracefs
for k in $(seq "${RUNS_COST:-3}"); do
  for p in numpy tflite; do
    extra=(--probe numpy); [ "$p" = tflite ] && extra=(--probe tf --model bench/models/lstm-64x32.tflite --variant tflite)
    timeout 60 "${HFT[@]}" watch "${extra[@]}" --cpus "$cpu" --duration 10 --trace on --no-live \
      --no-history --json > "/tmp/own_$p$k.json" 2>> "$log"
    python3 - "/tmp/own_$p$k.json" "$p" >> "$out/own_cost.txt" 2>> "$log" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); smp, ev = s["sampler"], s["events"]
gpu = (s["collectors"].get("gpu") or {}).get("period_s_now")
print(f"{sys.argv[2]:7s} own {100 * s['own_cpu_share_of_one_cpu']:.2f} % = sampler "
      f"{100 * smp['cpu_share_of_one_cpu']:.2f} % (reader {100 * (smp.get('helper_cpu_share') or 0):.2f}, "
      f"replay {100 * (smp.get('drain_cpu_share') or 0):.2f}) + event reads "
      f"{100 * (ev.get('read_cpu_share_of_one_cpu') or 0):.2f} % ({ev['windows']} windows); "
      f"spikes {s['spikes']}, gpu period {gpu} s, samples {s['samples']}")
PY
  done
done
rc
fi

if want collectors; then
step collectors
timeout 120 python3 bench/collector_cost.py --seconds 8 --json "$out/collector_cost.json" \
  > "$out/collector_cost.txt" 2>> "$log"
rc
fi

if want cpus; then
step "cpus quiet, then CPU $NOISY loaded"
{ timeout 180 "${HFT[@]}" cpus --duration 1; echo "rc=$?"; } > "$out/cpus.txt" 2>&1
NOISY=$NOISY python3 -c '
import os, random, time
os.sched_setaffinity(0, [int(os.environ["NOISY"])])
c = time.monotonic
while True:
    e = c() + random.uniform(0.0005, 0.003)
    while c() < e: pass
    time.sleep(random.uniform(0.001, 0.004))
' & hog=$!
sleep 0.5
{ echo "== CPU $NOISY loaded"; timeout 180 "${HFT[@]}" cpus --duration 1; echo "rc=$?"; } >> "$out/cpus.txt" 2>&1
kill "$hog"; wait "$hog" 2>/dev/null
fi

if want isolate; then
step isolate
timeout 180 python3 bench/isolate_roundtrip.py --cpus "$((n / 2))-$((n - 1))" \
  --state-dir /tmp/iso-rt --json "$out/isolate.json" >> "$log" 2>&1
rc
fi

if want gate; then
step "gate, CPU $cpu"
st=/tmp/hft-validate-state; db=/tmp/hft-validate-db.sqlite
g() { timeout 70 "${HFT[@]}" gate --model numpy --scenarios warm,stressed --cpus "$cpu" \
        --duration 12 --db "$db" --json > "$out/gate-$1.json" 2>> "$log"; echo "gate $1 rc=$?" >> "$log"; }
g untuned
timeout 120 "${HFT[@]}" tune apply --isolate --only isolate --cpus "$cpu" --state-dir "$st" >> "$log" 2>&1
g tuned
timeout 120 "${HFT[@]}" tune rollback --state-dir "$st" >> "$log" 2>&1; rc
fi

if want wake; then
step "wake (isolated CPU $cpu)"
timeout 170 python3 bench/tuning_effect.py --cpu "$cpu" --wake-only --wake-isolated \
  --keepawake-loops pause,busy --json "$out/wake.json" > "$out/wake.txt" 2>> "$log"
rc
fi

if want tuning; then
step "tuning effect, CPU $cpu"
timeout 540 python3 bench/tuning_effect.py --cpu "$cpu" \
  --scenarios "${SCENARIOS:-quiet,noisy,bursty,noisy+isolate,noisy+keep-awake,noisy+isolate+keep-awake,noisy+all,bursty+all}" \
  --min-samples "${MIN_SAMPLES:-6636}" --rounds "${ROUNDS:-2}" --budget-s "${BUDGET_S:-500}" \
  --no-wake --json "$out/tuning_effect.json" > "$out/tuning_effect.txt" 2>> "$log"
rc
fi

TFLITE=bench/models/lstm-64x32.tflite
if want litert; then
step "litert (no TensorFlow: $(python3 -c 'import tensorflow' 2>&1 | tail -1))"
{
  timeout 120 "${HFT[@]}" probe --model "$TFLITE" --variant tflite --samples 3000 --no-history --cpus "$cpu"
  echo "rc=$?"
  timeout 120 "${HFT[@]}" watch --probe tf --model "$TFLITE" --variant tflite --duration 5 --no-live --trace off --cpus "$cpu"
  echo "rc=$?"
} > "$out/litert.txt" 2>&1
fi

if want attach; then
step "attach, CPU $cpu"; tracefs
timeout 300 python3 bench/attach_overhead.py --cpu "$cpu" --pairs "${PAIRS:-12}" --calls "${CALLS:-10000}" \
  --json "$out/attach_overhead.json" > "$out/attach.txt" 2>> "$log"
rc
python3 bench/service.py --cpu "$cpu" --rate 500 --model "$TFLITE" --seconds 40 > /tmp/svc.out 2>> "$log" & svc=$!
sleep 4
{ echo "== attach --check"; timeout 60 "${HFT[@]}" attach "$svc" --check
  echo "== watch --attach (10 s, a periodic nice -10 hog on CPU $cpu from 4 s)"
  ( sleep 4; timeout 4 python3 -c "
import os, time
os.sched_setaffinity(0, {$cpu}); os.nice(-10)
c = time.perf_counter_ns
while True:
    e = c() + 3_000_000
    while c() < e: pass
    time.sleep(0.012)" ) &
  timeout 60 "${HFT[@]}" watch --attach "$svc" --duration 10 --no-live --spike-log /tmp/attach-spikes.jsonl
  echo "rc=$?"; echo "uprobe_events after: $(grep -c hftagent_ /sys/kernel/tracing/uprobe_events)"
} >> "$out/attach.txt" 2>&1
kill "$svc" 2>/dev/null; wait "$svc" 2>/dev/null
fi

if want attach_cost; then
# the µs a uprobe pair adds per call, on a ~1 µs LiteRT call (the LSTM's block-to-block drift
# on a shared host is tens of µs: the attach step's figure cannot resolve 2 µs)
step "attach_cost, CPU $cpu"; tracefs
timeout 240 python3 bench/attach_overhead.py --cpu "$cpu" --pairs "${PAIRS:-20}" --calls 20000 \
  --model bench/models/dense-16.tflite --json "$out/attach_cost.json" > "$out/attach_cost.txt" 2>> "$log"
rc
fi

if want tune_try; then
step "tune_try, CPU $cpu, ${BUSY:-32} busy processes"
busy=()
for _ in $(seq "${BUSY:-32}"); do python3 -c 'while True: pass' & busy+=($!); done
timeout 420 "${HFT[@]}" tune try --cpus "$cpu" --rounds "${ROUNDS:-3}" --block-s "${BLOCK_S:-8}" \
  --no-history > "$out/tune_try.txt" 2>> "$log"
echo "tune try rc=$?" >> "$log"
kill "${busy[@]}" 2>/dev/null; wait "${busy[@]}" 2>/dev/null
{ echo "after: isolated cpusets: $(ls -d /sys/fs/cgroup/hftagent-* /sys/fs/cgroup/cpuset/hftagent-* 2>/dev/null | tr '\n' ' ')"
  echo "after: journal: $(ls /run/hftagent/trial 2>/dev/null | tr '\n' ' ')"
  echo "after: state file:"; cat /run/hftagent/tune-try.json 2>/dev/null | head -c 3000; } >> "$out/tune_try.txt"
"${HFT[@]}" audit --cpus "$cpu" 2>/dev/null | grep -A3 "wakeup.cpuidle" >> "$out/tune_try.txt"
fi

if want fix_script; then
step "fix_script"
timeout 300 python3 bench/fix_roundtrip.py --cpus "$cpu" --json "$out/fix_script.json" \
  > "$out/fix_script.txt" 2>> "$log"; rc
fi

if want gate_rerun; then
step "gate_rerun, probe CPU $cpu"
timeout 590 python3 bench/gate_rerun.py --cpu "$cpu" --reruns "${RERUNS:-20}" \
  --bursts "${BURSTS:-20}" --json "$out/gate_rerun.json" > "$out/gate_rerun.txt" 2>> "$log"; rc
fi

if want own_attach; then
step "own_attach, CPU $cpu"; tracefs
D=${D_OWN:-45} CPU=$cpu PY=python3 OUT=/tmp/own-attach timeout 400 bash bench/own_cpu.sh \
  > "$out/own_attach.txt" 2>> "$log"; rc
fi

if want restarts; then
step "restarts, CPU $cpu"; tracefs
timeout 590 python3 bench/restarts.py --restarts "${RESTARTS:-100}" --cpu "$cpu" \
  --json "$out/restarts.json" > "$out/restarts.txt" 2>> "$log"; rc
fi

if want gpu_cost; then
# the GPU probes' cost per JAX call, each level against none, ABBA blocks (issue #36)
step "gpu_cost, CPU $cpu"; tracefs
for lv in default copies; do
  timeout 280 python3 bench/attach_overhead.py --gpu --gpu-probes "$lv" --cpu "$cpu" \
    --json "$out/gpu_cost_$lv.json" >> "$out/gpu_cost.txt" 2>> "$log"; rc
done
fi

if want roundtrip; then step roundtrip; bash bench/device/tuning_roundtrip.sh >> "$log" 2>&1; rc; fi
if want gpu; then step gpu; bash bench/device/gpu_validation.sh >> "$log" 2>&1; rc; fi
if want gpu_watch; then step gpu_watch; bash bench/device/gpu_watch.sh >> "$log" 2>&1; rc; fi
echo "== done $(date +%T)" >> "$log"
