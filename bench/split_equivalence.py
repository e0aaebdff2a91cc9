"""The watch split (issue #15) changed no behaviour: the session and the attributor of a
commit before it, loaded from git history, against the ones in the tree.

1. Session: one synthetic record stream per scenario (storms, queueing chains, rate limits
   down to 5/s, attribution errors, lagging sampler rows and task scans, external sources)
   through both sessions on one virtual clock, with the same fake sampler, sched collector
   and attributor: every spike-log record (but its wall time) and every counter must match.
2. Attributor: random collector traces over every cause family's signals, random hooks
   (who ran, others' share, IRQ descriptions with one action, GPU names) and random
   in-process evidence: every spike's ``Attribution.to_dict()`` must match.

    .venv/bin/python bench/split_equivalence.py [--ref 4af99fb] [--traces 150]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from agent.client import FIELDS  # noqa: E402
from agent.watch.attribution import Attribution, Attributor, CauseScore, Spike  # noqa: E402
from agent.watch.attribution.gpu import GpuCause  # noqa: E402
from agent.watch.ring import SignalRing  # noqa: E402
from collectors.sched import TaskRun  # noqa: E402

# Imports of the old sources whose modules moved since (#15 item 1: NativeSampler is in
# agent/watch/sampling/native/sampler.py now).
MOVED = {"from agent.watch.sampling.python import NativeSampler, Sampler":
         "from agent.watch.sampling.native.sampler import NativeSampler\n"
         "from agent.watch.sampling.python import Sampler"}


def load_at(ref: str, path: str, name: str, tmp: str) -> types.ModuleType:
    src = subprocess.run(["git", "-C", REPO, "show", f"{ref}:{path}"], check=True,
                         capture_output=True, text=True).stdout
    for old, new in MOVED.items():
        src = src.replace(old, new)
    f = os.path.join(tmp, f"{name}.py")
    with open(f, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# -- 1. the session ---------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 10**12

    def __call__(self) -> int:
        return self.t


def virtual_time(clock: Clock) -> types.SimpleNamespace:
    import time as real
    m = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    m.monotonic_ns = clock
    m.monotonic = lambda: clock() / 1e9
    m.time_ns = lambda: 1_700_000_000 * 10**9 + clock()
    m.sleep = lambda s: None
    return m


def fakes(clock: Clock, lag_ns: int, attr_cost_ns: int):
    class Sampler:
        lock = threading.Lock()
        pokes = 0

        def covered_ns(self):
            return clock() - lag_ns

        def latest_ns(self):
            return clock() - lag_ns

        def poke(self):
            self.pokes += 1

    class Sched:
        def latest_scan_ns(self):
            return clock() - 2 * lag_ns

        def watch_tids(self, tids):
            pass

        def request_scan(self):
            pass

    class Attr:
        slack_ns = 1_000_000

        def attribute(self, sp, recent):
            clock.t += attr_cost_ns
            if sp.seq % 97 == 13:
                raise ValueError("boom")
            c = ["cpu_contention", "irq", "unexplained", "softirq"][sp.seq % 4]
            return Attribution(c, [CauseScore(c, 0.6, 0.5, f"d {sp.seq}: x ran on CPU 1",
                                              {"k": int(recent.sum()) if len(recent) else 0})],
                               0.3, sp.in_process())
    return Sampler(), Sched(), Attr()


def stream(seed: int, n_steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    seq, t, out = 0, 10**12 - 10**10, []
    for _ in range(n_steps):
        rows = []
        storm = rng.random() < 0.1
        for _ in range(int(rng.integers(0, 40))):
            seq += 1
            lat = int(rng.lognormal(np.log(400_000), 0.3))
            if storm or rng.random() < 0.03:
                lat += int(rng.integers(1_000_000, 20_000_000))
            r = [0] * len(FIELDS)
            r[FIELDS.index("seq")] = r[FIELDS.index("seq2")] = seq
            r[FIELDS.index("start_ns")], r[FIELDS.index("end_ns")] = t, t + lat
            t += int(rng.integers(100_000, 600_000) if storm else rng.integers(200_000, 2_500_000))
            r[FIELDS.index("pid")], r[FIELDS.index("tid")] = 5, 5 + int(rng.integers(0, 2))
            for f in ("nivcsw", "nvcsw", "minflt", "majflt", "cpu_ns", "rq_delay_ns",
                      "cpu_start", "cpu_end"):
                r[FIELDS.index(f)] = int(rng.integers(0, 3))
            rows.append(r)
        out.append(np.array(rows, dtype=np.int64).reshape(-1, len(FIELDS)))
    return out


def run_session(old_mod, seed: int, cfg: dict, lag_ns: int, cost_ns: int):
    clock = Clock()
    recs: list[dict] = []
    if old_mod is not None:
        old_mod.time = virtual_time(clock)
        s = old_mod.WatchSession(old_mod.WatchConfig(**cfg))
        s._write = recs.append
        ingest, attribute = s._ingest, s._attribute_ready
    else:
        from agent.watch.session import WatchConfig, WatchSession
        s = WatchSession(WatchConfig(**cfg), clock=clock, on_record=recs.append)
        ingest, attribute = s.ingest, s.attribute_pending
    s.sampler, s.sched, s.attributor = fakes(clock, lag_ns, cost_ns)
    for batch in stream(seed, 400):
        clock.t += 50_000_000
        now = clock()
        if len(batch):
            ingest(batch)
        attribute(now)
    for r in recs:
        r.pop("time", None)
    return recs, {"samples": s.samples, "spikes": s.spikes, "attributed": s.attributed,
                  "not_attributed": s.not_attributed, "inherited": s.inherited,
                  "queued": s.queued, "causes": dict(s.cause_counts),
                  "details": {k: dict(v) for k, v in s.cause_details.items()},
                  "delays": list(s.attr_delays_ms), "pending": [sp.seq for sp, _ in s.pending],
                  "pokes": s.sampler.pokes}


SCENARIOS = (
    ({"probe": "numpy", "threshold_us": None, "min_samples": 50}, 30_000_000, 2_000_000),
    ({"probe": "numpy", "threshold_us": 900.0, "max_attributions_per_s": 40}, 200_000_000,
     500_000),
    ({"probe": "external", "threshold_us": 1500.0, "k_p50": 2.5}, 5_000_000, 9_000_000),
    ({"probe": "numpy", "max_attributions_per_s": 5, "loop_s": 0.02}, 0, 4_000_000),
)


def check_session(old_mod, seeds: int) -> dict:
    totals = {"scenarios": 0, "records": 0, "attributed": 0, "inherited": 0, "queued": 0,
              "not_attributed": 0}
    for seed in range(seeds):
        for cfg, lag, cost in SCENARIOS:
            a = run_session(old_mod, seed, cfg, lag, cost)
            b = run_session(None, seed, cfg, lag, cost)
            if a != b:
                raise SystemExit(f"session differs: seed {seed}, {cfg}")
            totals["scenarios"] += 1
            totals["records"] += len(a[0])
            for k in ("attributed", "inherited", "queued", "not_attributed"):
                totals[k] += a[1][k]
    return totals


# -- 2. the attributor ------------------------------------------------------------------------
MS, T0, ROW, N, TID = 1_000_000, 100_000 * 1_000_000, 10_000_000, 1300, 4242
SIGNALS = {
    "sched": [f"sched.{TID}.rq_delay_ns", f"sched.{TID}.nivcsw", f"sched.{TID}.minflt",
              f"sched.{TID}.majflt", f"sched.{TID}.cpu"],
    "softirq": ["softirq.1.TIMER", "softirq.1.NET_RX", "softirq.1.BLOCK", "softirq.0.NET_RX",
                "softirq.0.SCHED"],
    "irq": ["irq.1.LOC", "irq.1.38", "irq.1.41", "irq.0.38", "irq.1.RES"],
    "cpu": ["cpu.1.steal_ticks", "cpu.1.freq_hz", "cpu.1.irq_ticks", "cpu.1.softirq_ticks",
            "cpu.1.core_throttle_total", "cpu.0.steal_ticks", "cpu.0.freq_hz",
            "cpu.0.softirq_ticks"],
    "memory": ["mem.all.pgmajfault", "mem.all.compact_stall", "mem.all.pgscan_direct",
               "psi.memory.some_us", "mem.all.numa_miss", "mem.all.thp_fault_fallback"],
    "numa": ["numa.0.numa_miss", "numa.1.other_node"],
    "gpu": ["gpu.0.clock_event_reasons", "gpu.0.foreign_processes", "gpu.0.probe_gpu",
            "gpu.1.clock_event_reasons", "gpu.1.foreign_processes", "gpu.1.probe_gpu"],
    "pcie": ["pcie.0000:17:00.0.aer_correctable_total", "pcie.0000:17:00.0.speed_gts"],
    "perf": [f"perf.{TID}.cpu_migrations_total"],
}


def _quiet(name: str, g) -> float:
    if name.endswith("freq_hz"):
        return 3.0e9
    if name.endswith(".cpu"):
        return 1.0
    if name.endswith("rq_delay_ns"):
        return float(g.integers(0, 20_000))
    if name.endswith("probe_gpu"):
        return 1.0 if ".0." in name else 0.0
    if name.endswith("clock_event_reasons"):
        return 1.0
    if name.endswith("speed_gts"):
        return 16.0
    if "LOC" in name:
        return float(g.integers(5, 12))
    if name.endswith("_ticks") and "steal" not in name:
        return float(g.integers(0, 2))
    return float(g.integers(0, 2)) if g.random() < 0.3 else 0.0


def _hot(name: str, g) -> float:
    if name.endswith("freq_hz"):
        return float(g.choice([1.2e9, 2.0e9, 2.8e9]))
    if name.endswith(".cpu"):
        return float(g.choice([0, 1]))
    if name.endswith("rq_delay_ns"):
        return float(g.integers(100_000, 5_000_000))
    if name.endswith("probe_gpu"):
        return float(g.choice([0, 1]))
    if name.endswith("clock_event_reasons"):
        return float(g.choice([0x1, 0x21, 0x44, 0x8]))
    if name.endswith("foreign_processes"):
        return float(g.integers(0, 3))
    if name.endswith("speed_gts"):
        return 8.0
    if name.endswith("_ticks"):  # a few ticks of a 10 ms row: shares below the caps
        return float(g.choice([1, 1, 2, 3, 40]))
    return float(g.choice([3, 8, 20, 60, 400]))


def _trace(g, spike_row: int, hot: set[str]) -> dict[str, SignalRing]:
    out = {}
    for fam, names in SIGNALS.items():
        if g.random() < 0.15:
            continue  # a collector that does not run
        r = SignalRing(fam, capacity=2000)
        k = 5 if fam == "cpu" else 1  # /proc/stat at 20 Hz, as watch samples it
        for i in range(N // k):
            vals = {}
            for n in names:
                v = _hot(n, g) if i * k <= spike_row + 1 < (i + 1) * k + 1 and n in hot \
                    else _quiet(n, g)
                vals[n] = None if g.random() < 0.01 else v
            r.append(T0 + i * k * ROW, T0 + (i + 1) * k * ROW, vals)
        out[fam] = r
    return out


def _hooks(g) -> dict:
    h: dict = {}
    if g.random() < 0.7:
        comm = str(g.choice(["stress-ng-cpu", "ksoftirqd/1", "migration/1", "kworker/1:1"]))
        runs = [TaskRun(999, 999, comm, 1, 8_000_000, "R"), TaskRun(7, 7, "x", 1, 100_000, "S")]
        h["who_ran"] = lambda t0, t1, cpus, runs=runs: runs
    if g.random() < 0.5:
        share = float(g.choice([0.05, 0.3, 0.7]))
        h["others_share"] = lambda t0, t1, cpus, share=share: share
    if g.random() < 0.7:
        h["irq_desc"] = lambda: {"38": "IO-APIC 38-fasteoi virtio0",
                                 "41": "PCI-MSI 512000-edge nvme0q1"}
    if g.random() < 0.5:
        h["gpu_detail"] = lambda t0, t1: [GpuCause("GPU shared with PID 4242 (python3)", 0,
                                                   {"pid": 4242})]
    return h


def _spikes(g, spike_row: int, cls) -> list:
    out = []
    for k in range(6):
        start = T0 + spike_row * ROW + int(g.integers(0, 8)) * MS
        lat = int(g.integers(1, 8)) * MS
        d = {"seq": k, "start_ns": start, "end_ns": start + lat, "pid": TID, "tid": TID,
             "p50_ns": 400_000}
        if g.random() >= 0.25:  # else an external record: no in-process evidence
            d.update(nivcsw=int(g.choice([0, 0, 1, 2])), nvcsw=int(g.choice([0, 0, 1, 3])),
                     minflt=int(g.choice([0, 3, 30, 300])), majflt=int(g.choice([0, 0, 0, 2])),
                     cpu_ns=int(g.integers(0, lat)),
                     rq_delay_ns=int(g.choice([0, 10_000, 60_000, 2_000_000])),
                     cpu_start=int(g.choice([1, 1, 0])), cpu_end=int(g.choice([1, 1, 0, 3])),
                     queued_behind=int(g.choice([-1, -1, 0])))
        out.append(cls(**d))
    return out


def check_attribution(old_mod, traces: int) -> dict:
    n, causes = 0, {}
    names = [x for v in SIGNALS.values() for x in v]
    for seed in range(traces):
        g = np.random.default_rng(seed)
        hot = set(g.choice(names, size=int(g.integers(0, 8)), replace=False).tolist())
        rings = _trace(g, 1200, hot)
        hooks = _hooks(g)
        recent = np.column_stack([g.integers(0, 14, 500), np.zeros(500), np.zeros(500),
                                  g.integers(0, 3, 500)]) if g.random() < 0.6 else None
        a_old, a_new = old_mod.Attributor(rings, [1], **hooks), Attributor(rings, [1], **hooks)
        old_sp = _spikes(np.random.default_rng(seed + 10_000), 1200, old_mod.Spike)
        new_sp = _spikes(np.random.default_rng(seed + 10_000), 1200, Spike)
        for so, sn in zip(old_sp, new_sp):
            x = json.dumps(a_old.attribute(so, recent).to_dict(), sort_keys=True)
            y = json.dumps(a_new.attribute(sn, recent).to_dict(), sort_keys=True)
            if x != y:
                raise SystemExit(f"attribution differs: trace {seed}, spike {so.seq}:\n{x}\n{y}")
            c = json.loads(x)["cause"]
            causes[c] = causes.get(c, 0) + 1
            n += 1
    return {"spikes": n, "causes": dict(sorted(causes.items()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="4af99fb", help="a commit before the split")
    ap.add_argument("--traces", type=int, default=150)
    ap.add_argument("--seeds", type=int, default=12)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_session = load_at(args.ref, "agent/watch/session.py", "pre_split_session", tmp)
        old_attr = load_at(args.ref, "agent/watch/attribution.py", "pre_split_attribution", tmp)
        out = {"ref": args.ref, "session": check_session(old_session, args.seeds),
               "attribution": check_attribution(old_attr, args.traces)}
    print(json.dumps(out, indent=1))
    print("identical")


if __name__ == "__main__":
    main()
