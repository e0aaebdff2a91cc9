#!/usr/bin/env bash
# Kernel-event checks on the lent 16-CPU GPU machine (a disposable Firecracker VM, no
# TensorFlow), as root, from the repo root through the device tool:
#     STEPS="1 2" bash bench/device/events_check.sh           # ~2 min
#
#   1. does this kernel record the switch from idle? A private tracefs instance traces
#      sched_switch alone on the last CPU while a task pinned there sleeps 1 ms 500 times;
#      counts switches to and from pid 0 in the instance's own trace file
#                                                              -> $OUT/idle_switch.txt
#   2. attribution with kernel events (watch --trace mount) under FAULTS (default: every
#      fault of the kit), or one run per word of RUNS (e.g. RUNS="all softirq_flood"),
#      each fault's spike records kept whole, all runs in one tarball (the device tool
#      brings back 8 files at most)    -> $OUT/attribution.txt (the tables of every run),
#                                         $OUT/attribution-runs.tar.gz (runN/attribution.
#                                         {json,txt}, runN/attribution-logs/FAULT.jsonl)
#      WATCH_NICE=-10: watch's own threads and helper at that nice value (watch --nice)
# The global tracing state is never touched: the instance is removed on every path.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD
log="$out/log.txt"
n=$(nproc --all)
cpu=$((n - 1))
{ echo "== env"; nproc --all; uname -r; python3 --version; cat /proc/loadavg; } > "$out/env.txt" 2>&1
grep -q ' /sys/kernel/tracing ' /proc/mounts || mount -t tracefs nodev /sys/kernel/tracing

want() { [[ " ${STEPS:-1 2} " == *" $1 "* ]]; }
if want 1; then
echo "== 1. switch from idle, CPU $cpu $(date +%T)" >> "$log"
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
  grep sched_switch "$inst/trace" | head -12
} > "$out/idle_switch.txt" 2>&1
rmdir "$inst"; trap - EXIT
cat "$out/idle_switch.txt" | head -3 >> "$log"
fi

if want 2; then
# RUNS: one attribution run per word, each a comma-separated fault list ("all": every
# fault); default one run of FAULTS. Every run's JSON, table and spike logs go into one
# tarball, the tables also into attribution.txt.
all=none,cpu_hog,cpu_hog_rt,softirq_flood,memory_pressure,oversubscription,migration
rm -rf /tmp/attribution-runs; mkdir -p /tmp/attribution-runs
i=0
for faults in ${RUNS:-${FAULTS:-all}}; do
  i=$((i + 1)); d=/tmp/attribution-runs/run$i; mkdir -p "$d"
  [ "$faults" = all ] && faults=$all
  echo "== 2.$i attribution with events: $faults $(date +%T)" >> "$log"
  timeout 300 python3 bench/attribution.py --duration 7 --settle 3 --trace mount \
    --faults "$faults" ${WATCH_NICE:+--watch-nice "$WATCH_NICE"} \
    --json "$d/attribution.json" --log-dir "$d/attribution-logs" \
    > "$d/attribution.txt" 2>> "$log"
  echo "rc=$?" >> "$log"
  { echo "== run$i: $faults"; sed -n '/^$/,$p' "$d/attribution.txt"; } >> "$out/attribution.txt"
done
tar -C /tmp -czf "$out/attribution-runs.tar.gz" attribution-runs
fi
echo "== done $(date +%T)" >> "$log"
