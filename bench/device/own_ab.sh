#!/usr/bin/env bash
# watch --attach's own CPU on the lent GPU machine, two trees side by side in one sitting
# (bench/own_cpu.sh each, alternating, the same service and hog): this checkout against
# BASE (a tree of an earlier commit, e.g. `git archive <commit> | tar -x -C .base-tree`).
#
#   BASE=.base-tree ROUNDS=2 D_OWN=40 [PY=python3] OUT=$OUT bash bench/device/own_ab.sh
#
# LiteRT must be importable (the device tool's README: its cp312 wheel installed with
# pip --target and on PYTHONPATH). Writes $OUT/own_ab.txt: each run's quiet and burst lines.
set -u
out=${OUT:-/tmp/out}
mkdir -p "$out"
n=$(nproc)
cpu=$((n - 1))
grep -q ' /sys/kernel/tracing ' /proc/mounts || mount -t tracefs nodev /sys/kernel/tracing
base=$(cd "${BASE:?BASE: the earlier tree}" && pwd)
{
  echo "== $(nproc) CPUs, $(uname -r), service and hog on CPU $cpu, D=${D_OWN:-40} s a phase, ${STORM:-fifo} bursts ${HOG_MS:-2,200} ms (busy, period)"
  for i in $(seq 1 "${ROUNDS:-2}"); do
    for t in new base; do
      tree=.; [ "$t" = base ] && tree=$base
      echo "-- $t $i"
      D=${D_OWN:-40} CPU=$cpu PY=${PY:-python3} OUT=/tmp/own-$t-$i timeout 240 \
        bash bench/own_cpu.sh "$tree" 2>&1 | grep -v '^summaries'
    done
  done
} > "$out/own_ab.txt" 2>&1
