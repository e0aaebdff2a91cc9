#!/usr/bin/env bash
# What `watch --attach PID` costs watch itself (issue #38): own CPU, in all and by part
# (the summary's own_cpu), attached to a LiteRT service (bench/service.py, 500 calls/s on
# CPU 1), first quiet, then under SCHED_FIFO bursts on the service's CPU (bench/faults/kit.py
# cpu_hog: 2-200 ms bursts at RT priority 10: hundreds of spikes a minute).
#
#   sudo D=60 OUT=/tmp/own bench/own_cpu.sh [TREE]
#
# CPU (default 1) is the service's and the hog's CPU; PY (default the checkout's .venv python)
# the interpreter, for a box without the venv (bench/device/validate.sh's own_attach step);
# PHASES=quiet measures the quiet phase only (more sittings in the same time). HOG_MS
# (default "2,200": busy 2 ms of every 200 ms) sets the bursts: a burst makes a spike only when
# it starts inside a call, so a host whose calls are short needs them more often for hundreds
# of spikes a minute ("3,50" on a 16-CPU H200 host, P50 ~0.37 ms). STORM=stop makes the
# storm's spikes without SCHED_FIFO (a container that refuses it, where a nice 0 hog makes
# none: the sleeping service wins EEVDF's wake-up placement): the service is stopped for
# `busy` ms of every `period` (SIGSTOP, SIGCONT), a spike for each stop inside a call.
#
# ATTACH=name follows the service as `watch --attach-name 'bench/service\.py'` (a regular
# expression on its command line: the identity's /proc polls are measured too) instead of
# `--attach PID`.
#
# TREE: the hftagent checkout whose watch is measured (default: this one), so two trees can
# be compared side by side in one sitting with the same service and hog (this one's).
# Prints one line per phase (samples, spikes, attributed, own share of one CPU, budget
# decisions), the spikes' causes and the parts; the summaries stay in OUT/quiet.json and
# OUT/storm.json.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
TREE=$(cd "${1:-$HERE}" && pwd)
D=${D:-60}
OUT=${OUT:-$(mktemp -d /tmp/own-cpu.XXXXXXXX)}
PY=${PY:-$HERE/.venv/bin/python}
CPU=${CPU:-1}
mkdir -p "$OUT"
watch() {  # the tree's own watch (its directory first on sys.path)
  local src=(--attach "$SVC")
  [ "${ATTACH:-pid}" = name ] && src=(--attach-name 'bench/service\.py')
  (cd "$TREE" && "$PY" -c 'import sys; sys.argv[0] = "hftagent"
from agent.cli import main; sys.exit(main())' watch "${src[@]}" --duration "$D" \
    --json --no-history --no-live "$@")
}
cd "$HERE"
"$PY" bench/service.py --cpu "$CPU" --rate 500 --seconds $((2 * D + 40)) --plain \
  --model bench/models/lstm-64x32.tflite > "$OUT/service.log" 2>&1 & SVC=$!
HOG=
trap 'kill $SVC $HOG 2>/dev/null || true; wait 2>/dev/null || true' EXIT
sleep 8
watch > "$OUT/quiet.json" 2> "$OUT/quiet.err" || true
phases="quiet storm"
if [ "${PHASES:-}" = quiet ]; then
  phases=quiet
else
HOG_MS=${HOG_MS:-2,200}
if [ "${STORM:-fifo}" = stop ]; then  # (SIGTERM: the service is continued before it ends)
"$PY" -c "import os, signal, sys, time
pid = int(sys.argv[1]); busy, period = (float(x) / 1e3 for x in sys.argv[3].split(','))
def end(*_):
    os.kill(pid, signal.SIGCONT); sys.exit(0)
signal.signal(signal.SIGTERM, end)
t_end = time.monotonic() + float(sys.argv[2]) + 15
while time.monotonic() < t_end:
    os.kill(pid, signal.SIGSTOP); time.sleep(busy); os.kill(pid, signal.SIGCONT)
    time.sleep(period - busy)" "$SVC" "$D" "$HOG_MS" > "$OUT/hog.log" 2>&1 & HOG=$!
else
# (SIGTERM ends the with block, so its hog process goes too: never a SCHED_FIFO loop left)
"$PY" -c "import signal, sys, time; from bench.faults.kit import cpu_hog
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
busy, period = (float(x) for x in sys.argv[3].split(','))
with cpu_hog(int(sys.argv[1]), burst_ms=(busy, period), rt_prio=10):
    time.sleep(float(sys.argv[2]) + 15)" "$CPU" "$D" "$HOG_MS" \
  > "$OUT/hog.log" 2>&1 & HOG=$!
fi
sleep 2
if kill -0 "$HOG" 2>/dev/null; then
  watch > "$OUT/storm.json" 2> "$OUT/storm.err" || true
else  # (no SCHED_FIFO here: a container without RT runtime) never a quiet run called a storm
  echo "storm: not measured: the hog did not start ($(tail -1 "$OUT/hog.log"))"
  phases=quiet
fi
fi
for f in $phases; do
  "$PY" - "$OUT/$f.json" "$f" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
oc = s.get("own_cpu") or {}
b = oc.get("budget") or {}
print(f"{sys.argv[2]}: samples {s.get('samples')} spikes {s.get('spikes')} "
      f"({60 * (s.get('spikes') or 0) / max(s.get('duration_s') or 1, 1):.0f}/min) attributed "
      f"{s.get('attributed')} exact {b.get('exact_attributions')} skipped "
      f"{b.get('skipped_exact_attributions')} own {100 * (oc.get('share_of_one_cpu') or 0):.2f} %")
d = s.get("attribution_delay_ms") or {}
print(f"  shed {b.get('shed_polled_rules')}, rounds slowed {b.get('slow_rounds_s')} s, record "
      f"delay P50/max {d.get('p50') or 0:.0f}/{d.get('max') or 0:.0f} ms")
causes = s.get("causes") or {}
if causes:
    print("  causes:", ", ".join(f"{k} {v.get('count')}" for k, v in causes.items()),
          f"(unexplained naming an exact story: {s.get('unexplained_with_nearest_exact') or 0})")
print("  by part (% of one CPU):", ", ".join(
    f"{k} {100 * v:.2f}" for k, v in (oc.get("by_part") or {}).items() if v is not None))
PY
done
echo "summaries: $OUT"
