#!/usr/bin/env bash
# Real tuning round trip on the lent GPU machine (a disposable VM). Run as root from the repo
# root through the device tool:   bash bench/device/tuning_roundtrip.sh
#
# It changes REAL kernel settings of that machine and puts them back:
#   1. snapshot every kernel value the tunables can touch      -> $OUT/before.tsv
#   2. tune plan, apply (journal in /run/hftagent), status      -> $OUT/*.json
#   3. snapshot while applied                                   -> $OUT/applied.tsv
#   4. tune rollback, snapshot                                  -> $OUT/after.tsv
#   5. crash test on the real kernel: an apply killed (os._exit, like SIGKILL) after its 12th
#      step, then tune rollback, snapshot                      -> $OUT/after-crash.tsv
#   6. diff before/after and before/after-crash (must be empty) -> $OUT/RESULT
# GPU settings are never touched: --skip gpu on every command, the hft-cpu profile leaves GPU
# persistence/compute mode at "any", and nvidia-smi's view is recorded before and after.
# One invocation, well under 2 minutes.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD
hft() { python3 -c 'from agent.cli import main; main()' "$@"; }
CPUS=${CPUS:-}
if [ -z "$CPUS" ]; then  # upper half of the online CPUs are the "inference" CPUs
  n=$(nproc --all); CPUS="$((n / 2))-$((n - 1))"
fi
ARGS=(--profile hft-cpu --cpus "$CPUS" --skip gpu)

snap() {  # every file a tunable may write, with its exact content
  for f in /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag \
           /sys/kernel/mm/ksm/run /proc/sys/vm/swappiness /proc/sys/vm/stat_interval \
           /proc/sys/kernel/numa_balancing /proc/sys/kernel/timer_migration \
           /proc/sys/kernel/nmi_watchdog /proc/sys/kernel/sched_rt_runtime_us \
           /proc/irq/default_smp_affinity /proc/irq/*/smp_affinity_list \
           /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor \
           /sys/devices/system/cpu/cpu*/cpufreq/scaling_min_freq \
           /sys/devices/system/cpu/cpu*/cpufreq/energy_performance_preference \
           /sys/devices/system/cpu/cpu*/power/energy_perf_bias \
           /sys/devices/system/cpu/cpu*/cpuidle/state*/disable \
           /sys/devices/system/cpu/intel_pstate/no_turbo /sys/devices/system/cpu/intel_pstate/min_perf_pct \
           /sys/devices/system/cpu/cpufreq/boost; do
    [ -e "$f" ] && printf '%s\t%s\n' "$f" "$(tr '\n' ' ' < "$f" 2>&1)"
  done
}
gpu_view() { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,persistence_mode,compute_mode,clocks.applications.graphics --format=csv 2>&1; }

{ uname -r; python3 --version; id -u; echo "cpus=$CPUS"; } > "$out/env.txt"
gpu_view > "$out/gpu-before.csv"
snap > "$out/before.tsv"

t0=$(date +%s.%N)
hft tune plan "${ARGS[@]}" > "$out/plan.txt" 2>&1; echo "plan rc=$?" >> "$out/rc.txt"
hft tune plan "${ARGS[@]}" --json > "$out/plan.json" 2>>"$out/stderr.txt"
hft tune apply "${ARGS[@]}" --json > "$out/apply.json" 2>>"$out/stderr.txt"; echo "apply rc=$?" >> "$out/rc.txt"
cp /run/hftagent/journal.json "$out/journal.json" 2>/dev/null
snap > "$out/applied.tsv"
hft tune status > "$out/status.txt" 2>&1; echo "status rc=$?" >> "$out/rc.txt"
hft tune status --json > "$out/status.json" 2>>"$out/stderr.txt"
hft tune apply "${ARGS[@]}" --json > "$out/apply-again.json" 2>>"$out/stderr.txt"; echo "apply-again rc=$?" >> "$out/rc.txt"
hft tune rollback > "$out/rollback.txt" 2>&1; echo "rollback rc=$?" >> "$out/rc.txt"
hft tune rollback --json > "$out/rollback-again.json" 2>&1; echo "rollback-again rc=$?" >> "$out/rc.txt"
snap > "$out/after.tsv"

# Crash on the real kernel: die after the 12th checkpoint of apply, then roll back.
python3 - "$CPUS" > "$out/crash.txt" 2>&1 <<'PY'
import os, sys
from collectors.host import Host
from tuning.apply import apply_plan, build_context, make_plan
from tuning.profiles import load_profile
host = Host()
ctx = build_context(host, load_profile("hft-cpu"), sys.argv[1])
plan = make_plan(ctx, skip=["gpu"])
n = 0
def cp(step):
    global n
    n += 1
    if n == 12:
        print(f"killing apply at step {n} ({step})", flush=True)
        os._exit(137)
apply_plan(ctx, plan, host.run_dir("hftagent"), profile="hft-cpu", checkpoint=cp)
print("apply finished before step 12 (fewer than 12 steps)")
PY
echo "crash rc=$?" >> "$out/rc.txt"
cp /run/hftagent/journal.json "$out/journal-after-crash.json" 2>/dev/null
snap > "$out/crashed.tsv"
hft tune status > "$out/status-after-crash.txt" 2>&1
hft tune rollback > "$out/rollback-after-crash.txt" 2>&1; echo "rollback-after-crash rc=$?" >> "$out/rc.txt"
snap > "$out/after-crash.tsv"
t1=$(date +%s.%N)

gpu_view > "$out/gpu-after.csv"
{
  echo "elapsed_s=$(python3 -c "print(round($t1-$t0,2))")"
  echo "changed while applied: $(diff "$out/before.tsv" "$out/applied.tsv" | grep -c '^>')"
  echo "changed at crash:      $(diff "$out/before.tsv" "$out/crashed.tsv" | grep -c '^>')"
  if diff -u "$out/before.tsv" "$out/after.tsv" > "$out/diff-after.txt"; then
    echo "round trip: originals back (before.tsv == after.tsv)"; ok1=1
  else echo "round trip: DIFFERENCES, see diff-after.txt"; ok1=0; fi
  if diff -u "$out/before.tsv" "$out/after-crash.tsv" > "$out/diff-after-crash.txt"; then
    echo "crash + rollback: originals back (before.tsv == after-crash.tsv)"; ok2=1
  else echo "crash + rollback: DIFFERENCES, see diff-after-crash.txt"; ok2=0; fi
  if diff -q "$out/gpu-before.csv" "$out/gpu-after.csv" >/dev/null; then
    echo "GPU settings: unchanged"; else echo "GPU settings: DIFFER (see gpu-*.csv)"; fi
  [ -e /run/hftagent/journal.json ] && echo "journal left: /run/hftagent/journal.json" || echo "journal: gone"
  cat "$out/rc.txt"
} > "$out/RESULT"
cat "$out/RESULT"
[ "${ok1:-0}" = 1 ] && [ "${ok2:-0}" = 1 ]
