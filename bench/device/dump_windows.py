"""Device diagnostic (not a product path): run bench/attribution.py's cpu_hog_rt fault and
write the raw events of the first windows whose timeline shows no probe run although the
probe's counters say it ran on that CPU. Usage: python3 bench/device/dump_windows.py OUTDIR"""
import json
import os
import sys

sys.path.insert(0, os.getcwd())
import agent.watch.events.wiring as wiring  # noqa: E402

dumps = []
_orig = wiring.timeline


def spy(events, cpu, probe, t0, t1, **kw):
    tl = _orig(events, cpu, probe, t0, t1, **kw)
    if tl.probe_run_ns == 0 and len(dumps) < 6:
        dumps.append({"t0": t0, "t1": t1, "cpu": cpu, "probe": sorted(probe),
                      "events": [[e.ts_ns - t0, e.cpu, e.name, e.pid,
                                  {k: v for k, v in e.fields.items()
                                   if k in ("prev_pid", "next_pid", "prev_state", "pid",
                                            "action", "vector", "irq", "comm")}]
                                 for e in events]})
    return tl


wiring.timeline = spy
outdir = sys.argv[1]
sys.argv = ["attribution.py", "--duration", "5", "--settle", "3", "--trace", "mount",
            "--faults", "cpu_hog_rt", "--watch-nice", "-10", "--json",
            os.path.join(outdir, "attr.json")]
import bench.attribution as ba  # noqa: E402

ba.main()
with open(os.path.join(outdir, "windows.json"), "w") as fh:
    json.dump(dumps, fh, indent=0)
print("dumped", len(dumps))
