"""Probe P99 with the watch sampler on vs off, alternating blocks in one run (A/B/A/B...).

The numpy probe worker runs on the last CPU at --rate; this process reads its latency ring
and, in "on" blocks, runs the default collector set at --hz on the housekeeping CPU(s).

    .venv/bin/python bench/sampler_ab.py --blocks 10 --block-s 6 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.client import FIELDS, RingReader  # noqa: E402
from agent.watch.sampler import Sampler  # noqa: E402
from bench.collector_cost import collectors  # noqa: E402
from collectors.host import Host  # noqa: E402

F = {n: i for i, n in enumerate(FIELDS)}


def q(a: np.ndarray, p: float) -> float:
    a = np.sort(a)
    return float(a[min(len(a) - 1, max(0, int(np.ceil(p * len(a))) - 1))]) / 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--block-s", type=float, default=6.0)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--hz", type=float, default=100.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    online = sorted(os.sched_getaffinity(0))
    probe_cpu, hk = online[-1], online[:-1] or online
    os.sched_setaffinity(0, hk)
    ring = f"/dev/shm/hftagent-ab-{os.getpid()}.ring"
    w = subprocess.Popen([sys.executable, "-m", "agent.watch.probe_worker", "--ring", ring,
                          "--rate", str(args.rate), "--cpus", str(probe_cpu), "--probe",
                          "numpy"], stdout=subprocess.PIPE, text=True)
    info = json.loads(w.stdout.readline())
    r = RingReader(ring)
    lat: dict[str, list[np.ndarray]] = {"on": [], "off": []}
    blocks = []
    host = Host()
    try:
        time.sleep(1.0)
        r.read()
        for b in range(args.blocks):
            mode = "on" if b % 2 == 0 else "off"
            s = None
            if mode == "on":
                s = Sampler([c for c in collectors(host, info["pid"], probe_cpu)
                             if c.available().ok], args.hz, hk)
                s.start()
            time.sleep(args.block_s)
            if s is not None:
                s.stop()
            x = r.read()
            ln = x[:, F["end_ns"]] - x[:, F["start_ns"]]
            lat[mode].append(ln)
            blocks.append({"mode": mode, "n": len(ln), "p50_us": q(ln, 0.5),
                           "p99_us": q(ln, 0.99)})
            print(json.dumps(blocks[-1]), flush=True)
    finally:
        w.terminate()
        w.wait()
        os.unlink(ring)
    on, off = np.concatenate(lat["on"]), np.concatenate(lat["off"])
    med_on = float(np.median([b["p99_us"] for b in blocks if b["mode"] == "on"]))
    med_off = float(np.median([b["p99_us"] for b in blocks if b["mode"] == "off"]))
    out = {"probe": info["probe"], "rate_hz": args.rate, "sampler_hz": args.hz,
           "blocks": blocks, "pooled": {"on_p50_us": q(on, 0.5), "off_p50_us": q(off, 0.5),
                                        "on_p99_us": q(on, 0.99), "off_p99_us": q(off, 0.99)},
           "median_block_p99_us": {"on": med_on, "off": med_off},
           "ratio_median_block_p99_on_off": round(med_on / med_off, 3),
           "ratio_pooled_p99_on_off": round(q(on, 0.99) / q(off, 0.99), 3),
           "loadavg": open("/proc/loadavg").read().split()[:3]}
    print(json.dumps({k: v for k, v in out.items() if k != "blocks"}, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
