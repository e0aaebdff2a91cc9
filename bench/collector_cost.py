"""Cost of the watch collectors: µs per call per collector, and the sampler thread's CPU share
at --hz (default 100) with the default collector set, plus the latency client's cost per record.

    .venv/bin/python bench/collector_cost.py --seconds 20 --json out.json

"hot" = back-to-back calls (caches warm); "at rate" = the sampler thread sleeping between
rounds as in watch (cold caches, wake-up included): the figure the 2 % target is about, for
the collector set watch runs with a built-in probe (``at_rate``) and with an external process
(``at_rate_external``: the probe threads' schedstat every round), next to ``at_rate_floor``:
the same thread waking at --hz with no collector (the host's cost of a wake-up).
``at_rate_native`` / ``at_rate_native_external``: the same collector sets fed by the native
reader (agent/watch/sampling/native/hftsampler.c at --hz, replayed in batches): its share is
the helper's CPU time plus the drain thread's, each also given alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.watch.sampling.native.feed import Feed, NativeUnavailable  # noqa: E402
from agent.watch.sampling.native.sampler import NativeSampler  # noqa: E402
from agent.watch.sampling.python import Sampler  # noqa: E402
from agent.watch.sampling.sources.cpu import CpuCollector  # noqa: E402
from agent.watch.sampling.sources.irq import IrqCollector  # noqa: E402
from agent.watch.sampling.sources.memory import MemoryCollector  # noqa: E402
from agent.watch.sampling.sources.numa import NumaCollector  # noqa: E402
from agent.watch.sampling.sources.sched import SchedCollector  # noqa: E402
from agent.watch.sampling.sources.softirq import SoftirqCollector  # noqa: E402
from collectors.host import Host  # noqa: E402
from collectors.pcie import PcieCollector  # noqa: E402


def collectors(host: Host, pid: int, cpu: int, source: str = "builtin") -> list:
    """The collector set `hftagent watch` samples, configured as watch configures it for a
    built-in probe (sched at 20 Hz) or an external process (sched every round)."""
    from agent.watch.latency.probe import BuiltinProbe
    from agent.watch.latency.ring import ClientRing
    sched_period = {"external": ClientRing}.get(source, BuiltinProbe).sched_period_s
    return [CpuCollector(host, [cpu]), SchedCollector(host, [pid], [cpu], period_s=sched_period),
            IrqCollector(host, [cpu]), SoftirqCollector(host, [cpu]), MemoryCollector(host),
            NumaCollector(host, [cpu]), PcieCollector(host)]


def _at_rate(cands: list, args, hk: list[int], feed=None) -> dict:
    cs = [c for c in cands if c.available().ok]
    s = NativeSampler(cs, feed, args.hz, hk) if feed is not None else Sampler(cs, args.hz, hk)
    s.start()
    time.sleep(args.seconds)
    s.stop()
    st = s.stats
    extra = {}
    if feed is not None:
        extra = {"helper_share_of_one_cpu": round(s.helper_cpu_ns() / 1e9 / args.seconds, 4),
                 "drain_share_of_one_cpu": round(s.drain_cpu_ns / 1e9 / args.seconds, 4),
                 "native_error": s.native_error, "overruns": feed.overruns,
                 "dropped_rows": {k: v.dropped_rows for k, v in st.per_collector.items()},
                 "layout_rows": {k: v.layout_rows for k, v in st.per_collector.items()}}
    return {"sampler": s.mode, "hz": args.hz, "seconds": args.seconds, "rounds": st.rounds, **extra,
            "sampler_cpu_share_of_one_cpu": round(st.cpu_ns / 1e9 / args.seconds, 4),
            "cpu_us_per_round": round(st.cpu_ns / max(1, st.rounds) / 1e3, 1),
            "per_collector_mean_us": {k: v.to_dict()["mean_us"] for k, v in
                                      st.per_collector.items()},
            "per_collector_us_per_round": {k: round(v.busy_ns / max(1, st.rounds) / 1e3, 1)
                                           for k, v in st.per_collector.items()}}


RATE_KEYS = ("at_rate_floor", "at_rate", "at_rate_native", "at_rate_external",
             "at_rate_native_external")


def summary(d: dict) -> str:
    """One line per configuration: sampler, share of one CPU (total, reader, replay)."""
    lines = [f"{d.get('cpu_model')}: hot µs per call {d.get('hot_us_per_call')}"]
    for k in RATE_KEYS:
        x = d.get(k, {})
        lines.append(f"{k}: " + (x["unavailable"] if "unavailable" in x else
                                 f"{x.get('sampler')} {x.get('sampler_cpu_share_of_one_cpu')} "
                                 f"(reader {x.get('helper_share_of_one_cpu')}, replay "
                                 f"{x.get('drain_share_of_one_cpu')}) per collector µs/round "
                                 f"{x.get('per_collector_us_per_round')}"))
    lines.append(f"client µs per record: {d.get('client_us_per_record')}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hz", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json")
    ap.add_argument("--summary", metavar="JSON", help="print the summary of a result file")
    args = ap.parse_args()
    if args.summary:
        with open(args.summary) as fh:
            print(summary(json.load(fh)))
        return 0
    online = sorted(os.sched_getaffinity(0))
    probe_cpu, hk = online[-1], online[:-1] or online
    os.sched_setaffinity(0, hk)
    host = Host()
    # A busy-ish target process on the probe CPU for the sched collector to follow.
    import subprocess
    target = subprocess.Popen([sys.executable, "-c",
                               f"import os,time; os.sched_setaffinity(0,[{probe_cpu}])\n"
                               "while True:\n t=time.perf_counter()\n"
                               " while time.perf_counter()-t<0.0004: pass\n time.sleep(0.0016)"])
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                  if ln.startswith("model name")), None)
    out: dict = {"cpu_model": model, "hot_us_per_call": {},
                 "loadavg": open("/proc/loadavg").read().split()[:3]}
    try:
        time.sleep(0.3)
        for c in collectors(host, target.pid, probe_cpu):
            if not c.available().ok:
                out["hot_us_per_call"][c.name] = None
                continue
            c.sample()
            n = 20 if c.name == "pcie" else 2000
            out["hot_us_per_call"][c.name] = round(
                min(timeit.repeat(c.sample, number=n, repeat=3)) / n * 1e6, 1)
            c.close()
        # The floor: the same thread waking at --hz with nothing to read (what one wake-up
        # costs on this host), then the collector set as watch runs it for each source.
        out["at_rate_floor"] = _at_rate([], args, hk)
        out["at_rate"] = _at_rate(collectors(host, target.pid, probe_cpu, "builtin"), args, hk)
        out["at_rate_external"] = _at_rate(
            collectors(host, target.pid, probe_cpu, "external"), args, hk)
        # The native reader (watch's default where a C compiler is found): the same
        # collectors fed from hftsampler's recorded rounds.
        for key, source in (("at_rate_native", "builtin"), ("at_rate_native_external", "external")):
            try:
                feed = Feed(int(1e9 / args.hz))
            except NativeUnavailable as exc:
                out[key] = {"unavailable": str(exc)}
                continue
            out[key] = _at_rate(collectors(Host(), target.pid, probe_cpu, source), args, hk, feed)
    finally:
        target.kill()
        target.wait()
    from agent import client
    from agent.client import LatencyRing
    client._default = LatencyRing(f"/dev/shm/hftagent-bench-{os.getpid()}.ring")

    def rec():
        with client.timed():
            pass

    def se():
        client.end(client.start())

    def empty():
        pass
    n = 200_000
    out["client_us_per_record"] = {
        name: round(min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6, 3)
        for name, f in (("timed", rec), ("start_end", se), ("empty_call", empty))}
    client._default.close(unlink=True)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
