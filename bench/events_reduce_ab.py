"""The sampler's CPU with kernel events on, before vs after the events' polling reduction
(issue #17 item 5: agent/watch/wiring.py reduce_for_events).

Alternating pairs (order by a seeded coin flip) of `hftagent watch --probe numpy --cpus
<last CPU> --duration D --trace on --json`, one arm with HFTAGENT_EVENTS_REDUCE=0 (polled as
without events: "before"), the other without it ("after"). With ``--load hog`` a periodic
SCHED_FIFO hog on the probe CPU (bench/faults/kit.py preempting_hog) keeps spikes coming, so
the spike-requested task scans count; ``--load none`` is a quiet run. Reports per arm the
median per run of the summary's sampler CPU share of one CPU (helper + drain for the native
sampler), the helper's and the drain thread's, spikes, attributed, the attribution delay
and the sources the summary lists in ``sampler.reduced_by_events``.

    sudo .venv/bin/python bench/events_reduce_ab.py --pairs 4 --duration 6 --load hog
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KEYS = ("cpu_share_of_one_cpu", "helper_cpu_share", "drain_cpu_share")


def run(arm: str, args, cpu: int) -> dict:
    env = dict(os.environ)
    env.pop("HFTAGENT_EVENTS_REDUCE", None)
    if arm == "before":
        env["HFTAGENT_EVENTS_REDUCE"] = "0"
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as log:
        cmd = [sys.executable, "-c", "import sys; sys.argv[0] = 'hftagent'; "
               "from agent.cli import main; main()", "watch", "--probe", "numpy",
               "--cpus", str(cpu), "--duration", str(args.duration), "--sample-hz",
               str(args.hz), "--trace", args.trace, "--json", "--no-live", "--spike-log",
               log.name]
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"watch ({arm}) exited {p.returncode}: {p.stderr.strip()[-300:]}")
    s = json.loads(p.stdout)
    smp = s["sampler"]
    if not (s.get("events") or {}).get("active"):
        raise SystemExit(f"events did not run ({arm}): {(s.get('events') or {}).get('reason')}")
    return {"arm": arm, **{k: smp.get(k) for k in KEYS}, "mode": smp.get("mode"),
            "spikes": s["spikes"], "attributed": s["attributed"],
            "delay_ms_max": s["attribution_delay_ms"]["max"],
            "reduced_by_events": smp.get("reduced_by_events")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--hz", type=float, default=100.0)
    ap.add_argument("--trace", choices=("on", "mount"), default="on")
    ap.add_argument("--load", choices=("none", "hog"), default="hog")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("events_reduce_ab: needs root (tracefs)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    load = contextlib.nullcontext()
    if args.load == "hog":
        from bench.faults.kit import preempting_hog
        load = preempting_hog(cpu)[0]
    runs = []
    with load:
        for i in range(args.pairs):
            order = ("before", "after") if rng.random() < 0.5 else ("after", "before")
            for arm in order:
                r = run(arm, args, cpu)
                r["pair"] = i
                runs.append(r)
                print(f"  pair {i + 1}/{args.pairs} {arm}: sampler "
                      f"{r['cpu_share_of_one_cpu']} (helper {r['helper_cpu_share']}, drain "
                      f"{r['drain_cpu_share']}), {r['spikes']} spikes", file=sys.stderr,
                      flush=True)
    out = {"bench": "events_reduce_ab", "args": vars(args), "seed": seed, "probe_cpu": cpu,
           "runs": runs, "median": {}}
    print(f"watch --trace {args.trace} --sample-hz {args.hz:g}, {args.pairs} pairs of "
          f"{args.duration:g} s, load {args.load}, probe CPU {cpu}, seed {seed}")
    print(f"{'median per run':24} {'before':>9} {'after':>9}")
    for k in (*KEYS, "spikes", "attributed", "delay_ms_max"):
        med = {}
        for arm in ("before", "after"):
            v = [r[k] for r in runs if r["arm"] == arm and r[k] is not None]
            med[arm] = float(np.median(v)) if v else None
        out["median"][k] = med
        print(f"{k:24} " + " ".join("-".rjust(9) if med[a] is None else f"{med[a]:9.4g}"
                                    for a in ("before", "after")))
    after = next((r["reduced_by_events"] for r in runs if r["arm"] == "after"), {})
    print("reduced_by_events (after): " + "; ".join(
        f"{k} {v['from_hz']:g} → {v['to_hz']:g} Hz" for k, v in (after or {}).items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
