"""Probe P99 with the watch sampler on vs off, in many short alternating blocks of one run.

The issue's target: probe P99 with the sampler on within 5 % of off. On the shared 2-core VM
the tail drifts ±20 % from one 6 s block to the next, which hides a 5 % effect, so this bench

- runs ``--pairs`` pairs of short blocks (default 120 pairs of 1 s), the order inside each
  pair (on/off or off/on) by a seeded coin flip, so drift with any period cannot line up with
  the mode; samples whose start falls in the first ``--discard-s`` (0.1 s) after a switch are
  dropped (the sampler starting or stopping, the ring read);
- estimates the ratio on/off of the pooled P99 and of the pooled P50 (all kept samples of a
  mode together), with a 95 % interval from a paired block bootstrap (``bench/abstats.py``:
  pairs of adjacent on/off blocks resampled with replacement, ``--boot`` resamples);
- gives a verdict: "within 5 %" when the whole interval lies in [0.95, 1.05], "differs" when it
  lies wholly outside, otherwise "inconclusive at this noise";
- adds a negative control: the same statistic on A/A splits (on-blocks of pairs 2j vs 2j+1, and
  the same for off-blocks): the interval noise alone gives. It has half as many pairs and its
  blocks are 1-3 slots apart, not adjacent, so expect it about sqrt(2) wider (or more) than
  the A/B one when the sampler has no effect.

The numpy probe worker runs on the last CPU at --rate (500 Hz); this process (pinned to the
other CPUs) reads its latency ring and, in "on" blocks, runs the default collector set at --hz
(100) on the housekeeping CPU(s), as watch does (``--sampler native``: the native reader and
its replay thread, watch's default where a C compiler is found). The latency is end_ns - start_ns of each
ring record, as everywhere in watch: since 2026-11-30 the worker's response time from the
call's intended start (before, the call's own duration — the figures in docs/benchmarks.md).

    .venv/bin/python bench/sampler_ab.py --json sampler_ab.json      # ~4 min (240 blocks)
    .venv/bin/python bench/sampler_ab.py --pairs 6 --block-s 0.5     # smoke test, ~8 s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.client import FIELDS, RingReader  # noqa: E402
from agent.watch.probe_worker import await_ready  # noqa: E402
from agent.watch.sampling.native.feed import Feed  # noqa: E402
from agent.watch.sampling.native.sampler import NativeSampler  # noqa: E402
from agent.watch.sampling.python import Sampler  # noqa: E402
from bench.abstats import aa_split, paired_bootstrap, quantile  # noqa: E402
from bench.collector_cost import collectors  # noqa: E402
from collectors.cpu import cpu_model  # noqa: E402
from collectors.host import Host  # noqa: E402

F = {n: i for i, n in enumerate(FIELDS)}
PS = (0.5, 0.99)


def loadavg(host: Host) -> list[str] | None:
    r = host.read(host.proc("loadavg"))
    return r.value.split()[:3] if r.ok else None


def run_blocks(args: argparse.Namespace, order: list[tuple[str, str]], host: Host) -> dict:
    """Start the probe worker, run the blocks, return the raw samples and block windows."""
    online = sorted(os.sched_getaffinity(0))
    probe_cpu, hk = online[-1], online[:-1] or online
    os.sched_setaffinity(0, hk)
    ring = Path(f"/dev/shm/hftagent-ab-{os.getpid()}.ring")
    w = subprocess.Popen([sys.executable, "-m", "agent.watch.probe_worker", "--ring", str(ring),
                          "--rate", str(args.rate), "--cpus", str(probe_cpu), "--probe",
                          "numpy"], stdout=subprocess.PIPE, text=True)
    clock = time.monotonic_ns  # the probe worker's clock for start_ns/end_ns
    chunks: list[np.ndarray] = []
    windows: list[dict] = []
    try:
        info = await_ready(w.stdout)
        if not info.get("ready"):
            raise SystemExit(f"probe worker did not start: {info.get('error', info)}")
        r = RingReader(ring)
        time.sleep(args.warmup_s)
        r.read()
        names = None
        block_ns, discard_ns = int(args.block_s * 1e9), int(args.discard_s * 1e9)
        for i, pair in enumerate(order):
            for mode in pair:
                t_switch = clock()
                s = None
                if mode == "on":
                    feed = Feed(int(1e9 / args.hz)) if args.sampler == "native" else None
                    cs = [c for c in collectors(host, info["pid"], probe_cpu)
                          if c.available().ok]
                    names = names or [c.name for c in cs]
                    s = NativeSampler(cs, feed, args.hz, hk) if feed is not None \
                        else Sampler(cs, args.hz, hk)
                    s.start()
                deadline = t_switch + block_ns
                while (left := deadline - clock()) > 0:
                    time.sleep(left / 1e9)
                t_end = clock()
                blk = {"pair": i, "mode": mode, "switch_ns": t_switch,
                       "t0_ns": t_switch + discard_ns, "t1_ns": t_end}
                if s is not None:
                    s.stop()
                    blk["sampler"] = {"rounds": s.stats.rounds,
                                      "late_rounds": s.stats.late_rounds,
                                      "cpu_ms": round(s.stats.cpu_ns / 1e6, 2),
                                      "pin_error": s.pin_error}
                chunks.append(r.read())
                windows.append(blk)
            if args.progress:
                print(f"  pair {i + 1}/{len(order)} {pair[0]}/{pair[1]}", file=sys.stderr,
                      flush=True)
        time.sleep(0.05)  # a call in flight at the last block's end lands in the ring
        chunks.append(r.read())
        lost = r.lost
    finally:
        w.terminate()
        w.wait()
        ring.unlink(missing_ok=True)
    x = np.concatenate(chunks) if chunks else np.empty((0, len(FIELDS)), np.int64)
    return {"info": info, "probe_cpu": probe_cpu, "housekeeping_cpus": hk, "samples": x,
            "windows": windows, "lost": lost, "collectors": names}


def assign(samples: np.ndarray, windows: list[dict]) -> list[np.ndarray]:
    """Latencies (ns) of the samples that *started* inside each block's kept window. Done
    after the run on all records, so a call still running at a block's end counts in it."""
    start = samples[:, F["start_ns"]]
    lat = samples[:, F["end_ns"]] - start
    order = np.argsort(start, kind="stable")
    start, lat = start[order], lat[order]
    out = []
    for wd in windows:
        a, b = np.searchsorted(start, [wd["t0_ns"], wd["t1_ns"]], "left")
        out.append(lat[a:b])
    return out


def fmt_ci(d: dict) -> str:
    return f"[{d['ci'][0]:.3f}, {d['ci'][1]:.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=120, help="on/off block pairs (120)")
    ap.add_argument("--sampler", choices=("python", "native"), default="python",
                    help="the sampler the on blocks run (native: "
                         "agent/watch/sampling/native/hftsampler.c)")
    ap.add_argument("--block-s", type=float, default=1.0, help="block length, s (1.0)")
    ap.add_argument("--discard-s", type=float, default=0.1,
                    help="dropped after each switch, s (0.1)")
    ap.add_argument("--rate", type=float, default=500.0, help="probe rate, Hz (500)")
    ap.add_argument("--hz", type=float, default=100.0, help="sampler rate, Hz (100)")
    ap.add_argument("--boot", type=int, default=4000, help="bootstrap resamples (4000)")
    ap.add_argument("--tol", type=float, default=0.05, help="the target: |ratio - 1| (0.05)")
    ap.add_argument("--warmup-s", type=float, default=1.0)
    ap.add_argument("--seed", type=int, help="block order and bootstrap (random if unset)")
    ap.add_argument("--min-samples", type=int, default=20,
                    help="drop a pair when either block kept fewer samples (20)")
    ap.add_argument("--progress", action="store_true", help="one line per pair on stderr")
    ap.add_argument("--json", help="write all figures here")
    args = ap.parse_args()
    if args.pairs < 4 or args.block_s <= args.discard_s:
        ap.error("need --pairs >= 4 and --block-s > --discard-s")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    order = [("on", "off") if f else ("off", "on") for f in rng.random(args.pairs) < 0.5]

    host = Host()
    load0, t_start = loadavg(host), time.time()
    run = run_blocks(args, order, host)
    load1, wall = loadavg(host), time.time() - t_start
    lats = assign(run["samples"], run["windows"])

    blocks = []
    wins = run["windows"]
    w0 = wins[0]["switch_ns"]
    gaps = [(b["switch_ns"] - a["t1_ns"]) / 1e6 for a, b in zip(wins, wins[1:])]
    for wd, ln in zip(wins, lats):
        b = {"pair": wd["pair"], "mode": wd["mode"],
             "t_s": round((wd["switch_ns"] - w0) / 1e9, 3), "n": int(len(ln))}
        for p in PS:
            b[f"p{p * 100:g}_us"] = round(quantile(ln, p) / 1e3, 1) if len(ln) else None
        if "sampler" in wd:
            b["sampler"] = wd["sampler"]
        blocks.append(b)
    on = {b["pair"]: ln for b, ln in zip(blocks, lats) if b["mode"] == "on"}
    off = {b["pair"]: ln for b, ln in zip(blocks, lats) if b["mode"] == "off"}
    kept = [i for i in range(args.pairs)
            if min(len(on[i]), len(off[i])) >= args.min_samples]
    dropped = sorted(set(range(args.pairs)) - set(kept))
    if len(kept) < 4:
        print(f"only {len(kept)} usable pairs (min {args.min_samples} samples a block)",
              file=sys.stderr)
        return 2

    t_boot = time.perf_counter()
    ab = paired_bootstrap([on[i] for i in kept], [off[i] for i in kept], PS, args.boot,
                          rng, tol=args.tol)
    aa = {}
    for mode, d in (("on", on), ("off", off)):
        a, b = aa_split([d[i] for i in kept], rng)
        aa[mode] = paired_bootstrap(a, b, PS, args.boot, rng, tol=args.tol)
    boot_s = time.perf_counter() - t_boot

    def us(d: dict) -> dict:  # the pooled quantiles "a"/"b" from ns to µs
        return {k: round(v / 1e3, 1) if k in ("a", "b") else v for k, v in d.items()}

    result = {}
    for p in PS:
        k = f"p{p * 100:g}"
        r = us(ab[k])
        result[k] = {"on_us": r["a"], "off_us": r["b"],
                     **{x: r[x] for x in r if x not in ("a", "b")}}
    med = {m: float(np.median([b["p99_us"] for b in blocks
                               if b["mode"] == m and b["pair"] in kept])) for m in ("on", "off")}
    on_blocks = [b for b in blocks if "sampler" in b]
    out = {
        "bench": "sampler_ab", "args": vars(args), "seed": seed,
        "host": {"cpu_model": cpu_model(host),
                 "cpus": sorted({run["probe_cpu"], *run["housekeeping_cpus"]}),
                 "probe_cpu": run["probe_cpu"], "housekeeping_cpus": run["housekeeping_cpus"],
                 "loadavg_start": load0, "loadavg_end": load1},
        "probe": run["info"].get("probe"), "rate_hz": args.rate, "sampler_hz": args.hz,
        "collectors": run["collectors"], "wall_s": round(wall, 1),
        "bootstrap_s": round(boot_s, 2), "ring_lost": run["lost"],
        "switch_gap_ms_median": round(float(np.median(gaps)), 2) if gaps else None,
        "pairs": args.pairs, "pairs_used": len(kept), "pairs_dropped": dropped,
        "order": ["/".join(pr) for pr in order],
        "samples": {"on": ab["n_a"], "off": ab["n_b"]},
        "sampler_rounds_per_on_block": float(np.median([b["sampler"]["rounds"]
                                                        for b in on_blocks])),
        "n_boot": args.boot, "level": 0.95, "tol": args.tol,
        **result,
        "verdict": result["p99"]["verdict"],
        "median_block_p99_us": med,
        "ratio_median_block_p99_on_off": med["on"] / med["off"],
        "aa_control": {m: {k: us(v) if isinstance(v, dict) else v for k, v in d.items()}
                       for m, d in aa.items()},
        "blocks": blocks,
    }
    warnings = []
    if len(kept) < 30:
        warnings.append(f"only {len(kept)} pairs: a bootstrap over so few pairs gives too "
                        "narrow an interval; the verdict is not to be trusted (use >= 30)")
    bad = [f"{m}-blocks" for m in ("on", "off") if aa[m]["p99"]["excludes_1"]]
    if bad:
        warnings.append(f"the A/A P99 interval excludes 1 ({', '.join(bad)}; by chance alone "
                        "about 1 run in 10): the intervals may understate this run's noise; "
                        "treat the verdict with caution")
    out["warnings"] = warnings

    print(f"sampler on vs off — {out['probe']} at {args.rate:g} Hz on CPU {run['probe_cpu']}, "
          f"sampler at {args.hz:g} Hz on CPU {','.join(map(str, run['housekeeping_cpus']))}; "
          f"{out['host']['cpu_model']}")
    print(f"{len(kept)} pairs of {args.block_s:g} s blocks (first {args.discard_s:g} s of each "
          f"dropped), {ab['n_a']} on / {ab['n_b']} off samples, ring lost {run['lost']}, "
          f"loadavg {' '.join(load0 or [])} → {' '.join(load1 or [])}, {wall:.0f} s"
          + (f"; dropped pairs {dropped}" if dropped else ""))
    span = {m: [b["p99_us"] for b in blocks if b["mode"] == m and b["pair"] in kept]
            for m in ("on", "off")}
    print(f"block P99 µs: on {min(span['on']):.0f}–{max(span['on']):.0f}, off "
          f"{min(span['off']):.0f}–{max(span['off']):.0f}; median block P99 on/off "
          f"{med['on']:.0f}/{med['off']:.0f} = {out['ratio_median_block_p99_on_off']:.3f}")
    print()
    hdr = (f"{'':26} {'on|A µs':>8} {'off|B µs':>8} {'ratio':>7}  {'95 % CI':<16} "
           f"{'width':>6}  verdict")
    print(hdr)
    print("-" * len(hdr))
    for p in PS:
        k = f"p{p * 100:g}"
        r = result[k]
        print(f"{'pooled ' + k.upper() + ' on/off':26} {r['on_us']:8.1f} {r['off_us']:8.1f} "
              f"{r['ratio']:7.3f}  {fmt_ci(r):<16} {r['ci_width']:6.3f}  {r['verdict']}")
    for m in ("on", "off"):
        for p in PS:
            k = f"p{p * 100:g}"
            r = out["aa_control"][m][k]
            print(f"{f'A/A {m}-blocks {k.upper()}':26} {r['a']:8.1f} {r['b']:8.1f} "
                  f"{r['ratio']:7.3f}  {fmt_ci(r):<16} {r['ci_width']:6.3f}  {r['verdict']}")
    print(f"(A/A: {aa['on']['pairs']} pseudo-pairs of blocks 1-3 slots apart — expect its CI "
          f"≈ √2× wider, or more, than the A/B one from noise alone; {args.boot} paired block "
          f"resamples each, {boot_s:.1f} s; seed {seed})")
    r = result["p99"]
    print()
    print(f"verdict: probe P99 with the sampler on vs off: ratio {r['ratio']:.3f}, 95 % CI "
          f"{fmt_ci(r)} vs [{1 - args.tol:.2f}, {1 + args.tol:.2f}] → {r['verdict']}"
          + (" (CI excludes 1)" if r["excludes_1"] and r["verdict"] != "differs" else ""))
    for w in out["warnings"]:
        print(f"warning: {w}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
