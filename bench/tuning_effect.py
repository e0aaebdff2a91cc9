"""Tuned vs untuned tails: does each runtime lever move P99/P99.9 under noisy neighbours?

One run, interleaved (every scenario once per round, rounds repeated, the order shuffled per
round with a fixed seed), so that the host's drift is shared by all scenarios:

- ``quiet``: the probe alone on the target CPU;
- ``noisy``: ``--neighbours`` busy processes, unpinned (as a box's other work is);
- ``bursty``: the same number of neighbours busy in 1-5 ms bursts (the tick-sized preemptions
  that hurt a tail more than a steady hog, which CFS shares out evenly);
- ``noisy+LEVER`` for each lever alone: ``isolate`` (``hftagent tune apply --isolate``: tasks,
  kthreads, workqueues and the cpuset moved off the target CPU, rolled back after the block),
  ``fifo`` (``hftagent run --sched fifo:10``), ``keep-awake`` (``run --keep-awake``),
  ``pm-qos`` (``run --pm-qos 0``);
- ``noisy+all`` and ``bursty+all``: every lever together (the profiles' full set);
- ``stressed`` and ``stressed+all``: agent/stress.py's standard load (CPU/cache, loopback UDP,
  fsync'd writes, alloc/free) pinned to the housekeeping CPUs, as the gate's ``stressed``
  scenario runs it (which needs TensorFlow; this bench runs where TF is not installed).

The probe is a child launched through ``hftagent run --cpus CPU [lever flags] --`` (the real
product path), running the numpy LSTM-shaped probe of watch (agent/watch/probe_worker.py: no
TensorFlow, so it runs on the GPU machine too; ``--workload tflite`` uses the built-in TF model
through LiteRT where TF is installed) open loop at ``--rate`` calls/s. Latency is response
time from each call's intended start (coordinated-omission free).

Two curves, quiet, with and without keep-awake:
- the wake-up curve: P50 at ``--slow-rate`` (20/s) vs ``--rate`` (500/s): the target is
  P50(20/s) ≤ 1.1 × P50(500/s) with keep-awake;
- the idle-gap curve (``--gaps``): latency after each idle gap, as ``hftagent probe
  --idle-gaps`` reports it.

``--keepawake-loops pause,busy`` adds the spinner's no-pause loop (``run --keep-awake
--keep-awake-loop busy``) to the wake-up curve, side by side with the default pause loop: in a
KVM guest, pause-loop exiting can hand a pausing vCPU back to the host. ``--wake-only`` runs
the wake-up curve alone (no scenarios, no idle-gap curve).

Output: a table with P50/P99/P99.9 and each as a ratio to quiet, and ``--json FILE``.

    sudo .venv/bin/python bench/tuning_effect.py --json /tmp/tuning_effect.json   # ~4 min
    .venv/bin/python bench/tuning_effect.py --block-s 2 --rounds 1 --levers fifo  # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.probe import stats  # noqa: E402

LEVERS = ("isolate", "fifo", "keep-awake", "pm-qos")
RUN_FLAGS = {"fifo": ["--sched", "fifo:10"], "keep-awake": ["--keep-awake"],
             "keep-awake-busy": ["--keep-awake", "--keep-awake-loop", "busy"],
             "pm-qos": ["--pm-qos", "0"]}
BUSY = ("import os,sys\nwhile True: pass\n")
BURSTY = ("import random,time\nc=time.monotonic\nwhile True:\n"
          "    e=c()+random.uniform(0.001,0.005)\n    while c()<e: pass\n"
          "    time.sleep(random.uniform(0.001,0.008))\n")


def hft(*args: str) -> list[str]:
    """argv of the hftagent CLI of this checkout (the venv's script when it exists)."""
    exe = ROOT / ".venv/bin/hftagent"
    if exe.exists():
        return [str(exe), *args]
    return [sys.executable, "-c", "from agent.cli import main; main()", *args]


# -- the probe worker (a child of `hftagent run`) -------------------------------------------------
def worker(args: argparse.Namespace) -> int:
    from agent.probe.harness import gap_loop, time_loop, warm_up
    if args.workload == "tflite":
        from agent.watch.probe_worker import build_tf_probe
        fn, _ = build_tf_probe("lstm", "tflite", 1)
    else:
        from agent.watch.probe_worker import build_numpy_probe
        fn, _ = build_numpy_probe()
    warm_up(fn, 200, budget_ns=3_000_000_000)
    out: dict = {"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)),
                 "policy": os.sched_getscheduler(0)}
    if args.mode == "gaps":
        from agent.probe.idle import parse_gaps, summarize
        gaps = parse_gaps(args.gaps)
        arrays = gap_loop(fn, gaps, 10_000,
                          deadline_ns=time.perf_counter_ns() + int(args.seconds * 1e9))
        out["gaps"] = [{"gap_ns": r["gap_ns"], "p50_ns": r["latency"]["p50_ns"],
                        "p90_ns": r["latency"]["p90_ns"], "count": r["latency"]["count"],
                        "p50_ratio": r["p50_ratio"]} for r in summarize(arrays)]
    else:
        s = time_loop(fn, int(args.seconds * args.rate) + 1, args.rate,
                      deadline_ns=time.perf_counter_ns() + int(args.seconds * 1e9))
        np.save(args.out + ".npy", s.response_ns)
        out["count"] = s.count
        out["unserved"] = s.unserved
    Path(args.out).write_text(json.dumps(out))
    return 0


# -- neighbours -------------------------------------------------------------------------------
@contextlib.contextmanager
def neighbours(kind: str | None, n: int, housekeeping: list[int] | None = None):
    procs = []
    if kind == "stress":
        from agent.stress import housekeeping_load
        with housekeeping_load(housekeeping or [0]) as load:
            yield load
        return
    if kind:
        code = BUSY if kind == "noisy" else BURSTY
        procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
        time.sleep(0.3)
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@contextlib.contextmanager
def isolated(cpu: str, state_dir: str, log: list):
    r = subprocess.run(hft("tune", "apply", "--isolate", "--only", "isolate",
                           "--cpus", cpu, "--state-dir", state_dir, "--json"),
                       capture_output=True, text=True, timeout=120)
    log.append({"apply_rc": r.returncode, "stderr": r.stderr.strip()[-400:]})
    if r.returncode not in (0, 2):
        raise RuntimeError(f"tune apply --isolate failed: {r.stderr.strip()[-300:]}")
    try:
        yield
    finally:
        rb = subprocess.run(hft("tune", "rollback", "--state-dir", state_dir),
                            capture_output=True, text=True, timeout=120)
        log.append({"rollback_rc": rb.returncode, "stderr": rb.stderr.strip()[-400:]})


def run_block(args, cpu: str, levers: set[str], seconds: float, rate: float, mode: str,
              tmp: Path, tag: str) -> dict:
    flags: list[str] = []
    for lever in sorted(levers - {"isolate"}):
        flags += RUN_FLAGS[lever]
    out = tmp / f"{tag}.json"
    cmd = hft("run", "--cpus", cpu, *flags, "--", sys.executable, str(Path(__file__).resolve()),
              "--worker", "--mode", mode, "--seconds", str(seconds), "--rate", str(rate),
              "--gaps", args.gaps, "--workload", args.workload, "--out", str(out))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"rc {r.returncode}"])[-1]}
    d = json.loads(out.read_text())
    if mode == "rate":
        d["response_ns"] = np.load(str(out) + ".npy")
    return d


def rt_permitted() -> bool:
    """Whether a child may switch itself to SCHED_FIFO (root alone is not enough in a
    container without CAP_SYS_NICE, or under a cgroup with no RT runtime)."""
    code = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=30).returncode == 0


def summary(lat: np.ndarray) -> dict:
    s = stats.summarize(lat)
    return {k: s[k] for k in ("count", "p50_ns", "p99_ns", "p999_ns", "max_ns")} | {
        "sufficient": s["sufficient"]}


def wake_curve(args, cpu: str, arms: list[str], rng: random.Random, tmp: Path, wake: dict,
               gaps: dict, errors: dict) -> None:
    """The quiet wake-up curve of each arm (and, unless --wake-only, the idle-gap curve of
    plain and keep-awake), interleaved per round."""
    for rnd in range(args.rounds):
        for key in rng.sample(arms, len(arms)):
            lv = {key} if key != "plain" else set()
            for rate in (args.wake_rate, args.slow_rate):
                d = run_block(args, cpu, lv, args.block_s, rate, "rate", tmp,
                              f"wake-{key}-{rate:g}-{rnd}")
                if "error" not in d:
                    wake.setdefault(key, {}).setdefault(f"{rate:g}", []).append(d["response_ns"])
                else:
                    errors.setdefault(f"wake-{key}", []).append(d["error"])
            if rnd == 0 and not args.wake_only and key in ("plain", "keep-awake"):
                d = run_block(args, cpu, lv, max(args.block_s * 2, 10.0), args.rate, "gaps",
                              tmp, f"gaps-{key}")
                gaps[key] = d.get("gaps") or d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="rate", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=6.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", default=None, help="the inference CPU (default: the last target "
                    "CPU of hftagent's rule)")
    ap.add_argument("--neighbours", type=int, default=None, help="busy neighbours (default "
                    "3 x online CPUs)")
    ap.add_argument("--rate", default="auto", help="calls/s of the noisy scenarios, or auto: "
                    "the probe's CPU 15 %% busy at its quiet P50 (at most 500/s), so that the "
                    "neighbours' share of the CPU slows the calls without saturating the "
                    "probe (a saturated open loop measures its queue, not the tail)")
    ap.add_argument("--wake-rate", type=float, default=500.0, help="the fast rate of the "
                    "wake-up curve")
    ap.add_argument("--slow-rate", type=float, default=20.0)
    ap.add_argument("--block-s", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levers", default=",".join(LEVERS))
    ap.add_argument("--gaps", default="0,1ms,10ms,100ms,1s")
    ap.add_argument("--workload", choices=("numpy", "tflite"), default="numpy")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--keepawake-loops", default="pause", help="the spinner loops the wake-up "
                    "curve compares: pause, busy or pause,busy")
    ap.add_argument("--wake-only", action="store_true", help="only the wake-up curve")
    ap.add_argument("--wake-isolated", action="store_true", help="run the wake-up curve on the "
                    "CPU isolated (tune apply --isolate, rolled back after): the spinner alone "
                    "makes the kernel count its CPU idle and place other tasks there")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        args.rate = float(args.rate)
        return worker(args)

    from collectors.host import Host
    from tuning.targets import resolve
    plan = resolve(Host())
    cpu = args.cpu or str(plan.cpus[-1])
    ncpu = len(plan.online)
    n = args.neighbours if args.neighbours is not None else 3 * ncpu
    levers = [x for x in args.levers.split(",") if x]
    bad = set(levers) - set(LEVERS)
    if bad:
        ap.error(f"unknown lever(s) {sorted(bad)}; known: {', '.join(LEVERS)}")
    loops = [x for x in args.keepawake_loops.split(",") if x]
    if not loops or set(loops) - {"pause", "busy"}:
        ap.error("--keepawake-loops takes pause, busy or pause,busy")
    unavailable = {}
    if "fifo" in levers and not rt_permitted():
        levers.remove("fifo")
        unavailable["fifo"] = ("SCHED_FIFO refused here (no CAP_SYS_NICE or no RT runtime "
                               "in this cgroup): left out of every scenario")
    tmp0 = Path(tempfile.mkdtemp(prefix="hftagent-tuning-effect-cal-"))
    if args.rate == "auto":
        cal = run_block(args, cpu, set(), 2.0, 100.0, "rate", tmp0, "calibrate")
        if "error" in cal:
            raise SystemExit(f"calibration failed: {cal['error']}")
        p50 = float(np.median(cal["response_ns"]))
        args.rate = round(min(500.0, 0.15 / (p50 / 1e9)), 1)
        print(f"rate auto: quiet P50 {p50 / 1e3:.0f} µs -> {args.rate:g} calls/s",
              file=sys.stderr)
    else:
        args.rate = float(args.rate)
    scenarios: list[tuple[str, str | None, set[str]]] = [
        ("quiet", None, set()), ("noisy", "noisy", set()), ("bursty", "bursty", set())]
    scenarios += [(f"noisy+{lv}", "noisy", {lv}) for lv in levers]
    scenarios += [("noisy+all", "noisy", set(levers)), ("bursty+all", "bursty", set(levers)),
                  ("stressed", "stress", set()), ("stressed+all", "stress", set(levers))]
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="hftagent-tuning-effect-"))
    state_dir = str(tmp / "state")
    pooled: dict[str, list[np.ndarray]] = {s[0]: [] for s in scenarios}
    errors: dict[str, list[str]] = {}
    iso_log: list = []
    loads: dict[str, list] = {}
    t_start = time.time()
    for rnd in range(0 if args.wake_only else args.rounds):
        order = scenarios[:]
        rng.shuffle(order)
        for name, noise, lv in order:
            print(f"round {rnd + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            house = [c for c in plan.online if str(c) != cpu]
            with neighbours(noise, n, house) as nb:
                ctx = isolated(cpu, state_dir, iso_log) if "isolate" in lv else \
                    contextlib.nullcontext()
                try:
                    with ctx:
                        d = run_block(args, cpu, lv, args.block_s, args.rate, "rate", tmp,
                                      f"{name}-{rnd}")
                except RuntimeError as exc:
                    d = {"error": str(exc)}
            if noise == "stress":
                loads.setdefault(name, []).append(nb.to_dict())
            if "error" in d:
                errors.setdefault(name, []).append(d["error"])
            else:
                pooled[name].append(d["response_ns"])
    rows = {}
    for name, _, _ in scenarios:
        if pooled[name]:
            rows[name] = summary(np.concatenate(pooled[name]))
    q = rows.get("quiet")
    for r in rows.values():
        for k in ("p50", "p99", "p999"):
            r[f"{k}_x_quiet"] = (r[f"{k}_ns"] / q[f"{k}_ns"]) if q and q[f"{k}_ns"] else None

    # wake-up curve and idle gaps, quiet, with and without keep-awake (interleaved)
    wake: dict = {}
    gaps: dict = {}
    arms = ["plain"] + [("keep-awake" if lp == "pause" else f"keep-awake-{lp}") for lp in loops]
    wake_ctx = isolated(cpu, state_dir, iso_log) if args.wake_isolated else \
        contextlib.nullcontext()
    try:
        with wake_ctx:
            wake_curve(args, cpu, arms, rng, tmp, wake, gaps, errors)
    except RuntimeError as exc:
        errors.setdefault("wake", []).append(str(exc))
    wake_rows = {}
    for key, by_rate in wake.items():
        p50 = {r: int(np.median(np.concatenate(v))) for r, v in by_rate.items()}
        fast, slow = p50.get(f"{args.wake_rate:g}"), p50.get(f"{args.slow_rate:g}")
        wake_rows[key] = {"p50_ns": p50, "slow_over_fast": (slow / fast) if fast and slow
                          else None}
    doc = {"cpu": cpu, "neighbours": n, "online": ncpu, "rate": args.rate,
           "block_s": args.block_s, "rounds": args.rounds, "workload": args.workload,
           "wake_isolated": args.wake_isolated, "keepawake_loops": loops,
           "levers": levers, "unavailable": unavailable, "scenarios": rows, "wakeup": wake_rows, "idle_gaps": gaps,
           "errors": errors, "isolation_log": iso_log, "loads": loads, "kernel": os.uname().release,
           "elapsed_s": round(time.time() - t_start, 1)}
    print(f"\ntarget CPU {cpu}, {n} neighbours, {args.rate:g} calls/s, "
          f"{args.rounds} x {args.block_s:g} s blocks\n")
    print(f"{'scenario':<18}{'P50':>10}{'P99':>10}{'P99.9':>10}{'P50/q':>8}{'P99/q':>8}"
          f"{'P99.9/q':>9}")
    for name, r in rows.items():
        def us(v):
            return f"{v / 1e3:.0f}µs" if v is not None else "-"

        def x(v):
            return f"{v:.2f}" if v is not None else "-"
        star = "" if r["sufficient"]["p999"] else "*"
        print(f"{name:<18}{us(r['p50_ns']):>10}{us(r['p99_ns']):>10}"
              f"{us(r['p999_ns']) + star:>10}{x(r['p50_x_quiet']):>8}{x(r['p99_x_quiet']):>8}"
              f"{x(r['p999_x_quiet']):>9}")
    for key, w in wake_rows.items():
        print(f"wake-up {key}: P50 {w['p50_ns']} ns; {args.slow_rate:g}/s over "
              f"{args.wake_rate:g}/s = {w['slow_over_fast']}")
    for lv, why in unavailable.items():
        print(f"lever {lv}: {why}")
    for name, errs in errors.items():
        print(f"errors in {name}: {errs[0]}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
