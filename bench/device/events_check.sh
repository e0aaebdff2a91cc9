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
#      fault of the kit), each fault's spike records kept whole, in one tarball (the device
#      tool brings back 8 files at most)              -> $OUT/attribution.{json,txt},
#                                                        $OUT/attribution-logs.tar.gz
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
echo "== 2. attribution with events $(date +%T)" >> "$log"
rm -rf /tmp/attribution-logs
timeout 240 python3 bench/attribution.py --duration 7 --settle 3 --trace mount \
  --faults "${FAULTS:-none,cpu_hog,cpu_hog_rt,softirq_flood,memory_pressure,oversubscription,migration}" \
  ${WATCH_NICE:+--watch-nice "$WATCH_NICE"} \
  --json "$out/attribution.json" --log-dir /tmp/attribution-logs \
  > "$out/attribution.txt" 2>> "$log"
echo "rc=$?" >> "$log"
tar -C /tmp -czf "$out/attribution-logs.tar.gz" attribution-logs
fi
echo "== done $(date +%T)" >> "$log"
