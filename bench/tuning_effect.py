"""Tuned vs untuned tails: does each runtime lever move P99/P99.9 under noisy neighbours?

One run, interleaved (every scenario once per round, rounds repeated, the order shuffled per
round with a fixed seed), so that the host's drift is shared by all scenarios:

- ``quiet``: the probe alone on the target CPU;
- ``noisy``: ``--neighbours`` busy processes, unpinned (as a box's other work is);
- ``bursty``: the same number of neighbours busy in 1-5 ms bursts (the tick-sized preemptions
  that hurt a tail more than a steady hog, which CFS shares out evenly);
- ``KIND+LEVER`` for each lever alone under each of ``quiet``, ``noisy`` and ``bursty``:
  ``isolate`` (``hftagent tune apply --isolate --only isolate``: tasks, kthreads, workqueues
  and the cpuset moved off the target CPU, rolled back after the block), ``fifo`` (``hftagent
  run --sched fifo:10``), ``keep-awake`` (``run --keep-awake``), ``pm-qos`` (``run --pm-qos
  0``);
- ``KIND+COMBO`` for each combination the audit or a profile recommends (:data:`COMBOS`):
  ``isolate+keep-awake`` (the audit's wakeup.cpuidle fix once the CPU is isolated),
  ``isolate+pm-qos`` and ``isolate+keep-awake+pm-qos`` (hft-cpu's and hft-gpu's runtime set);
- ``KIND+all``: every lever together (fifo too, which nothing recommends);
- ``stressed`` and ``stressed+all``: agent/gate/stress.py's standard load (CPU/cache, loopback UDP,
  fsync'd writes, alloc/free) pinned to the housekeeping CPUs, as the gate's ``stressed``
  scenario runs it (which needs TensorFlow; this bench runs where TF is not installed).

``--scenarios LIST`` runs only those (``quiet`` always: the ratios are to it), e.g. the five of
the target "under noisy neighbours the full tuned set keeps P99.9 ≤ 1.3× quiet":
``quiet,noisy,bursty,noisy+all,bursty+all``; or issue #25's check that keep-awake on an
isolated CPU keeps P50 within 2× of the isolation alone under busy neighbours:
``quiet,noisy+isolate,noisy+isolate+keep-awake,bursty+isolate,bursty+isolate+keep-awake``.
A keep-awake spinner that stops itself (its guard saw the probe wait behind it: keepawake.c)
is counted per scenario (``keepawake_stopped``, JSON and table).

The probe is a child launched through ``hftagent run --cpus CPU [lever flags] --`` (the real
product path), running the numpy LSTM-shaped probe of watch (agent/watch/probe_worker.py: no
TensorFlow, so it runs on the GPU machine too; ``--workload tflite`` runs the bundled LSTM
.tflite, bench/models/lstm-64x32.tflite, on LiteRT, which needs no TensorFlow either) open loop at ``--rate`` calls/s. Latency is response
time from each call's intended start (coordinated-omission free). ``--rate auto``: the probe's
CPU ``--busy`` (15 %) busy at its quiet P50, measured by a 2 s calibration block.

**Sample size.** P99.9 is claimed only from ≥ 6,636 samples (agent/stats.py), P99 from ≥ 662.
``--min-samples N`` sizes the blocks from the rate and ``--rounds`` so that every scenario gets
≥ N samples (``--block-s`` is then ignored); the table shows each scenario's count ``n`` and
marks a P99.9 below its sufficiency with ``*``. ``--budget-s S`` caps the scenario phase at an
estimated S seconds (per block: the calibration block's start-up cost + 1 s for the
neighbours; 5 s per isolate apply + rollback): blocks are shortened to fit, and the table
then says which scenarios fell short (the JSON has each block's wall time, ``block_wall_s``).
``late`` is the share of calls that started more than half a period after their intended
start (the previous call still running, or the probe preempted while it waited): a large
share means that scenario measures the open loop's queue as well as the calls.

``--busy`` above 0.15 buys samples per second (0.30 doubles them) and stays honest for the
quiet and ``+all`` rows (the CPU is isolated there: the neighbours are not on it); the untuned
``noisy``/``bursty`` rows then queue sooner (3 busy neighbours per CPU: a fair share leaves
the probe a quarter of its CPU), which shows in their ``late`` share and makes their ratios
pessimistic. The default stays 0.15, the rate of the figures published so far.

**Wake-up, quiet, per arm** (``plain``, ``keep-awake`` = ``run --keep-awake``, and with
``--keepawake-loops pause,busy`` also ``keep-awake-busy`` = ``--keep-awake-loop busy``: in a KVM
guest, pause-loop exiting can hand a pausing vCPU back to the host). Target: P50 at
``--slow-rate`` (20/s) ≤ 1.1 × P50 at ``--wake-rate`` (500/s) with keep-awake. One probe
process per arm and round (arms shuffled per round) runs, in a seeded shuffled order,
``--wake-pairs`` (3) pairs of adjacent segments (``--wake-fast-s``, 1 s, at 500/s and
``--wake-slow-s``, 2.5 s, at 20/s; which comes first by coin flip) and one ``--wake-mixed-s``
(10 s) mixed segment: 20.5 s per run, about 300 calls at 20/s and 380 of each mixed class per
arm over 2 rounds (the former design had 2 × 3 s blocks: 120 calls at 20/s). Three figures:

- ``pooled``: P50 of every 20/s call over P50 of every 500/s call of the arm (the figure this
  bench always gave, JSON ``slow_over_fast``; the blocks are now segments of one process, not
  one process per block, and P50 is nearest rank, agent/stats.py, as in the scenario table),
  with a 95 % paired block bootstrap interval (bench/abstats.py: each fast/slow pair resampled
  together, so drift that the two segments of a pair share cancels out of the ratio; none
  from fewer than 5 pairs);
- ``per-pair``: the median of the per-pair ratios P50(slow segment)/P50(adjacent fast
  segment) with a distribution-free interval for that median (order statistics of the ratios;
  its confidence, from the binomial, is printed: 97 % for 6 pairs, as good as 6 pairs allow);
- ``mixed``: one open loop whose interval between intended starts is 2 ms or 50 ms at random
  (1/``--wake-rate`` or 1/``--slow-rate``, ``--wake-mixed-p-slow`` the share of long ones); each
  call is classified by the interval before it, and the figure is P50(after 50 ms)/P50(after
  2 ms), with a 95 % paired block bootstrap over windows of 40 consecutive calls (~1 s; none
  from fewer than 5 windows). The two classes are measured at the same moments, so there is
  no drift between them. It measures the cost of the idle gap itself; the blocks also include
  what sustained load does (500/s keeps the vCPU ~half busy for seconds, which a host
  scheduler or frequency governor may reward), so the mixed figure can be the lower of the
  two. The JSON also gives the P50 of
  fast calls whose previous interval was fast too (``fast_after_fast``): a check that a fast
  call after a slow one is not different.

Idle-gap curve (``--gaps``, plain and keep-awake, round 1 only): latency after each idle gap,
as ``hftagent probe --idle-gaps`` reports it. ``--wake-only`` runs the wake-up curve alone (no
scenarios, no idle-gap curve, no rate calibration); ``--no-wake`` runs the scenarios alone.
``--wake-isolated`` runs the whole wake-up curve on the CPU isolated (one ``tune apply
--isolate`` before, one rollback after).

Output: a table with n, late share, P50/P99/P99.9 and each as a ratio to quiet, the wake-up
table, and ``--json FILE`` (written after the scenarios and again at the end).

    sudo .venv/bin/python bench/tuning_effect.py --json /tmp/tuning_effect.json   # 29 scenarios
    # the P99.9 target with sufficient samples (GPU box, ~125 calls/s: ~330 s)
    sudo python3 bench/tuning_effect.py --scenarios quiet,noisy,bursty,noisy+all,bursty+all \\
        --min-samples 6636 --rounds 3 --budget-s 400 --no-wake --json /tmp/te-p999.json
    # the wake-up figures, 3 arms on an isolated CPU (GPU box: ~135 s)
    sudo python3 bench/tuning_effect.py --wake-only --wake-isolated --keepawake-loops pause,busy \\
        --json /tmp/te-wake.json
    .venv/bin/python bench/tuning_effect.py --block-s 2 --rounds 1 --levers fifo  # smoke
    .venv/bin/python bench/tuning_effect.py --wake-only --rounds 1 --wake-pairs 2 \\
        --wake-fast-s 0.5 --wake-slow-s 1 --wake-mixed-s 3                         # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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

from agent import stats  # noqa: E402

TFLITE_MODEL = str(Path(__file__).resolve().parent / "models" / "lstm-64x32.tflite")
LEVERS = ("isolate", "fifo", "keep-awake", "pm-qos")
# The lever combinations the audit or a profile recommends (fifo: none does): the audit's
# keep-awake fix on isolated CPUs, and the runtime sets of hft-cpu/hft-gpu (runtime_isolation,
# keep_awake, cpu_dma_latency_us) with and without keep-awake.
COMBOS = (("isolate", "keep-awake"), ("isolate", "pm-qos"), ("isolate", "keep-awake", "pm-qos"))
KINDS = ("quiet", "noisy", "bursty")  # neighbour kinds every lever and combination runs under
STOPPED = "keep-awake spinner on CPU"  # ... "stopped:": the spinner's guard line (keepawake.c)
RUN_FLAGS = {"fifo": ["--sched", "fifo:10"], "keep-awake": ["--keep-awake"],
             "keep-awake-busy": ["--keep-awake", "--keep-awake-loop", "busy"],
             "pm-qos": ["--pm-qos", "0"]}
BUSY = ("import os,sys\nwhile True: pass\n")
BURSTY = ("import random,time\nc=time.monotonic\nwhile True:\n"
          "    e=c()+random.uniform(0.001,0.005)\n    while c()<e: pass\n"
          "    time.sleep(random.uniform(0.001,0.008))\n")
ISOLATE_S = 5.0        # estimated cost of one tune apply --isolate + rollback (--budget-s)
MIXED_WINDOW = 40      # calls per resampled window of the mixed wake-up segment (~1 s)
SLOW, FAST, FIRST = 1, 0, -1   # classes of a mixed-segment call (FIRST: no timed predecessor)
MIN_BOOT_BLOCKS = 5    # fewer pairs/windows than this: no bootstrap interval (it would be noise)


def hft(*args: str) -> list[str]:
    """argv of the hftagent CLI of this checkout (the venv's script when it exists)."""
    exe = ROOT / ".venv/bin/hftagent"
    if exe.exists():
        return [str(exe), *args]
    return [sys.executable, "-c", "from agent.cli import main; main()", *args]


def fail(msg: str) -> SystemExit:
    print(f"tuning_effect: error: {msg}", file=sys.stderr)
    return SystemExit(2)


# -- pure logic (tests/test_bench_tuning_effect.py) ---------------------------------------------
def scenario_table(levers: list[str]) -> list[tuple[str, str | None, frozenset[str]]]:
    """Every scenario: (name, neighbour kind, levers): the three kinds bare, each lever alone
    under each kind, each of :data:`COMBOS` made only of ``levers``, every lever, then the
    stressed pair."""
    lv = frozenset(levers)
    noise = {"quiet": None, "noisy": "noisy", "bursty": "bursty"}
    combos = [c for c in COMBOS if set(c) <= lv and frozenset(c) != lv]
    out = [(k, noise[k], frozenset()) for k in KINDS]
    out += [(f"{k}+{x}", noise[k], frozenset({x})) for k in KINDS for x in levers]
    out += [(f"{k}+{'+'.join(c)}", noise[k], frozenset(c)) for k in KINDS for c in combos]
    out += [(f"{k}+all", noise[k], lv) for k in KINDS]
    out += [("stressed", "stress", frozenset()), ("stressed+all", "stress", lv)]
    return out


def without_lever(scenarios: list, lever: str) -> list:
    """The scenarios with ``lever`` taken out of each (it cannot run here), dropping those
    that become a repeat of an earlier one (``noisy+fifo`` is ``noisy`` then); a ``+all``
    that repeats a combination takes its place, keeping the name the targets use."""
    out: list = []
    at: dict = {}
    for name, noise, lv in scenarios:
        lv = lv - {lever}
        i = at.get((noise, lv))
        if i is None:
            at[(noise, lv)] = len(out)
            out.append((name, noise, lv))
        elif name.endswith("+all"):
            out[i] = (name, noise, lv)
    return out


def spinner_stopped(stderr: str) -> list[str]:
    """The lines of a `run --keep-awake` child's stderr in which a spinner stopped itself."""
    return [ln for ln in stderr.splitlines() if STOPPED in ln and " stopped: " in ln]


def select_scenarios(table: list, spec: str | None) -> list:
    """The scenarios named in ``spec`` (comma-separated; None or "all": every one), in the
    table's order, ``quiet`` always among them. ValueError names unknown ones."""
    if spec is None or spec.strip() == "all":
        return list(table)
    want = {x.strip() for x in spec.split(",") if x.strip()}
    known = [s[0] for s in table]
    bad = sorted(want - set(known))
    if bad:
        raise ValueError(f"unknown scenario(s) {', '.join(bad)}; known: {', '.join(known)}")
    want.add("quiet")
    return [s for s in table if s[0] in want]


def block_seconds(min_samples: int, rounds: int, rate: float) -> float:
    """Block length so that ``rounds`` open-loop blocks at ``rate`` give ≥ ``min_samples``.

    A block of s seconds serves the calls scheduled before its deadline: the first starts one
    period in, so about s·rate − 1 of them (agent/probe/harness.time_loop); two spare."""
    per = -(-int(min_samples) // int(rounds))
    return (per + 2) / float(rate)


def fit_budget(block_s: float, blocks: int, isolate_cycles: int, overhead_s: float,
               budget_s: float | None) -> tuple[float, float]:
    """(block length, estimated seconds) for ``blocks`` blocks each costing ``block_s`` plus
    ``overhead_s`` start-up, plus ``ISOLATE_S`` per isolate cycle; the block shortened so the
    estimate fits ``budget_s`` when one is given. ValueError when not even 1 s blocks fit."""
    fixed = blocks * overhead_s + isolate_cycles * ISOLATE_S
    est = blocks * block_s + fixed
    if budget_s is None or est <= budget_s:
        return block_s, est
    fit = (budget_s - fixed) / blocks
    if fit < 1.0:
        raise ValueError(f"--budget-s {budget_s:g} leaves {fit:.1f} s per block "
                         f"({blocks} blocks, {fixed:.0f} s of start-up)")
    return fit, blocks * fit + fixed


def late_share(lag_ns: np.ndarray, rate: float) -> float:
    """Share of calls that started more than half a period after their intended start."""
    if lag_ns.size == 0:
        return 0.0
    return float(np.count_nonzero(lag_ns > 0.5e9 / rate)) / lag_ns.size


def mixed_intervals(seconds: float, fast_ns: int, slow_ns: int, p_slow: float,
                    seed: int) -> np.ndarray:
    """Intervals between intended starts of a mixed segment: ``slow_ns`` with probability
    ``p_slow``, else ``fast_ns`` (seeded), as many as fit in ``seconds`` (at least 2)."""
    rng = np.random.default_rng(seed)
    mean = p_slow * slow_ns + (1 - p_slow) * fast_ns
    n = int(seconds * 1e9 / mean * 1.5) + 16
    draws = np.where(rng.random(n) < p_slow, slow_ns, fast_ns).astype(np.int64)
    keep = int(np.searchsorted(np.cumsum(draws), int(seconds * 1e9), side="right"))
    return draws[:max(2, keep)]


def classify(intervals_ns: np.ndarray, slow_ns: int) -> np.ndarray:
    """Class of each call of a mixed segment by the interval before it: SLOW, FAST, or FIRST
    for call 0 (its predecessor is the warm-up or another segment)."""
    cls = np.where(intervals_ns == slow_ns, SLOW, FAST).astype(np.int8)
    if cls.size:
        cls[0] = FIRST
    return cls


def p50(a: np.ndarray) -> int:
    return int(stats.quantile(np.asarray(a), 50.0))


def median_ci(values: list[float], confidence: float = 0.95) -> dict | None:
    """Median of ``values`` and a distribution-free interval for it: the k-th smallest and
    k-th largest value, k the largest with P(k ≤ B ≤ n − k) ≥ ``confidence`` for B ~
    Binomial(n, 1/2); with too few values for that, min and max. The achieved confidence is
    returned (0 for one value)."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        return None

    def conf(k: int) -> float:  # P(k <= B <= n - k): the median lies in [v(k), v(n-k+1)]
        return 1.0 - 2.0 * sum(math.comb(n, j) for j in range(k)) / 2.0 ** n
    k = 1
    while k + 1 <= (n + 1) // 2 and conf(k + 1) >= confidence:
        k += 1
    return {"median": float(np.median(v)), "ci": [v[k - 1], v[n - k]],
            "confidence": max(0.0, conf(k)), "n": n}


def wake_summary(segments: list[dict], slow_rate: float, fast_rate: float, seed: int,
                 n_boot: int = 2000) -> dict:
    """The three wake-up figures of one arm from its segments.

    ``segments``: dicts {"kind": "rate", "rate", "pair": id, "response_ns"} and {"kind":
    "mixed", "response_ns", "cls"} (cls from :func:`classify`). Pairs are matched by id.
    """
    from bench.abstats import paired_bootstrap
    fk, sk = f"{fast_rate:g}", f"{slow_rate:g}"
    pairs: dict = {}
    for s in segments:
        if s["kind"] == "rate":
            pairs.setdefault(s["pair"], {})[f"{s['rate']:g}"] = s["response_ns"]
    full = [p for _, p in sorted(pairs.items()) if fk in p and sk in p
            and p[fk].size and p[sk].size]
    out: dict = {}
    if full:
        fast = np.concatenate([p[fk] for p in full])
        slow = np.concatenate([p[sk] for p in full])
        out["p50_ns"] = {fk: p50(fast), sk: p50(slow)}
        out["samples"] = {fk: int(fast.size), sk: int(slow.size)}
        out["slow_over_fast"] = p50(slow) / p50(fast)
        out["pairs"] = len(full)
        out["pooled_ci"] = None
        if len(full) >= MIN_BOOT_BLOCKS:
            bs = paired_bootstrap([p[sk] for p in full], [p[fk] for p in full], ps=(0.5,),
                                  n_boot=n_boot, seed=seed)
            out["pooled_ci"] = bs["p50"]["ci"]
        ratios = [p50(p[sk]) / p50(p[fk]) for p in full]
        out["per_pair"] = {"ratios": ratios} | (median_ci(ratios) or {})
    mixed = [s for s in segments if s["kind"] == "mixed"]
    if mixed:
        resp = np.concatenate([s["response_ns"] for s in mixed])
        cls = np.concatenate([s["cls"] for s in mixed])
        prev = np.concatenate([np.r_[FIRST, s["cls"][:-1]] for s in mixed])
        sl, fa = resp[cls == SLOW], resp[cls == FAST]
        ff = resp[(cls == FAST) & (prev == FAST)]
        m: dict = {"counts": {"slow": int(sl.size), "fast": int(fa.size),
                              "fast_after_fast": int(ff.size)}}
        if sl.size and fa.size:
            m["p50_ns"] = {"slow": p50(sl), "fast": p50(fa)} | (
                {"fast_after_fast": p50(ff)} if ff.size else {})
            m["ratio"] = p50(sl) / p50(fa)
            a_blocks, b_blocks = [], []
            for s in mixed:  # windows of consecutive calls, slow and fast of one window paired
                r, c = s["response_ns"], s["cls"]
                for i in range(0, r.size, MIXED_WINDOW):
                    rw, cw = r[i:i + MIXED_WINDOW], c[i:i + MIXED_WINDOW]
                    if (cw == SLOW).any() and (cw == FAST).any():
                        a_blocks.append(rw[cw == SLOW])
                        b_blocks.append(rw[cw == FAST])
            m["windows"] = len(a_blocks)
            m["ci"] = None
            if len(a_blocks) >= MIN_BOOT_BLOCKS:
                bs = paired_bootstrap(a_blocks, b_blocks, ps=(0.5,), n_boot=n_boot,
                                      seed=seed + 1)
                m["ci"] = bs["p50"]["ci"]
        out["mixed"] = m
    return out


def wake_plan(pairs: int, fast_s: float, slow_s: float, mixed_s: float, fast_rate: float,
              slow_rate: float, p_slow: float, rng: random.Random, round_no: int) -> list[dict]:
    """Segments of one wake-up probe run: ``pairs`` adjacent fast/slow pairs (order in a pair
    by coin flip) and one mixed segment, the units in a shuffled order."""
    units: list[list[dict]] = []
    for i in range(pairs):
        pid = round_no * 1000 + i
        pair = [{"kind": "rate", "rate": fast_rate, "seconds": fast_s, "pair": pid},
                {"kind": "rate", "rate": slow_rate, "seconds": slow_s, "pair": pid}]
        if rng.random() < 0.5:
            pair.reverse()
        units.append(pair)
    if mixed_s > 0:
        units.append([{"kind": "mixed", "fast": fast_rate, "slow": slow_rate,
                       "seconds": mixed_s, "p_slow": p_slow,
                       "seed": rng.randrange(1 << 30)}])
    rng.shuffle(units)
    return [seg for unit in units for seg in unit]


# -- the probe worker (a child of `hftagent run`) -------------------------------------------------
def mixed_loop(fn, intervals_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Open loop on a schedule of varying intervals: (response_ns, lag_ns) per call, response
    from the intended start, lag = actual − intended start. The same wait as the harness's
    fixed-rate open loop (sleep, then spin the last stretch); a call still running when the
    next is due delays it, and the delay is in its response."""
    from agent.probe.harness import _SPIN_NS
    n = int(intervals_ns.size)
    resp = np.zeros(n, dtype=np.int64)
    lag = np.zeros(n, dtype=np.int64)
    rv, lv = memoryview(resp), memoryview(lag)
    clock = time.perf_counter_ns
    sleep = time.sleep
    begin = clock()
    intended = (begin + np.cumsum(intervals_ns)).tolist()
    hard_stop = intended[-1] + max(1_000_000_000, intended[-1] - begin)
    i = 0
    while i < n:
        due = intended[i]
        ahead = due - clock()
        if ahead > _SPIN_NS:
            sleep((ahead - _SPIN_NS) * 1e-9)
        while clock() < due:
            pass
        t0 = clock()
        fn()
        t1 = clock()
        rv[i] = t1 - due
        lv[i] = t0 - due
        i += 1
        if t1 >= hard_stop:
            break
    return resp[:i], lag[:i]


def worker(args: argparse.Namespace) -> int:
    from agent.probe.harness import gap_loop, time_loop, warm_up
    if args.workload == "tflite":
        from agent.watch.probe_worker import build_tf_probe
        fn, _ = build_tf_probe(TFLITE_MODEL, "tflite", 1)  # LiteRT only: no TF needed
    else:
        from agent.watch.probe_worker import build_numpy_probe
        fn, _ = build_numpy_probe()
    warm_up(fn, 200, budget_ns=3_000_000_000)
    out: dict = {"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)),
                 "policy": os.sched_getscheduler(0)}
    arrays: dict[str, np.ndarray] = {}

    def at_rate(rate: float, seconds: float, key: str) -> dict:
        s = time_loop(fn, int(seconds * rate) + 1, rate,
                      deadline_ns=time.perf_counter_ns() + int(seconds * 1e9))
        arrays[f"resp{key}"] = s.response_ns
        arrays[f"lag{key}"] = s.column("start_ns") - s.column("intended_ns")
        return {"count": s.count, "unserved": s.unserved}

    if args.mode == "gaps":
        from agent.probe.idle import parse_gaps, summarize
        gaps = parse_gaps(args.gaps)
        res = gap_loop(fn, gaps, 10_000,
                       deadline_ns=time.perf_counter_ns() + int(args.seconds * 1e9))
        out["gaps"] = [{"gap_ns": r["gap_ns"], "p50_ns": r["latency"]["p50_ns"],
                        "p90_ns": r["latency"]["p90_ns"], "count": r["latency"]["count"],
                        "p50_ratio": r["p50_ratio"]} for r in summarize(res)]
    elif args.mode == "wake":
        out["segments"] = []
        for i, seg in enumerate(json.loads(args.plan)):
            if seg["kind"] == "rate":
                out["segments"].append(at_rate(seg["rate"], seg["seconds"], str(i)))
                continue
            fast_ns, slow_ns = (int(round(1e9 / seg[k])) for k in ("fast", "slow"))
            iv = mixed_intervals(seg["seconds"], fast_ns, slow_ns, seg["p_slow"], seg["seed"])
            resp, lag = mixed_loop(fn, iv)
            arrays[f"resp{i}"], arrays[f"lag{i}"] = resp, lag
            arrays[f"cls{i}"] = classify(iv[:resp.size], slow_ns)
            out["segments"].append({"count": int(resp.size), "unserved": int(iv.size - resp.size)})
    else:
        out |= at_rate(args.rate, args.seconds, "")
    if arrays:
        np.savez(args.out + ".npz", **arrays)
    Path(args.out).write_text(json.dumps(out))
    return 0


# -- neighbours -------------------------------------------------------------------------------
@contextlib.contextmanager
def neighbours(kind: str | None, n: int, housekeeping: list[int] | None = None):
    procs = []
    if kind == "stress":
        from agent.gate.stress import housekeeping_load
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


def run_block(args, cpu: str, levers: set[str], seconds: float, mode: str, tmp: Path,
              tag: str, rate: float = 0.0, plan: list[dict] | None = None) -> dict:
    """One probe child through ``hftagent run``: mode "rate" (``rate`` calls/s for
    ``seconds``), "gaps" (the idle-gap curve) or "wake" (the segments of ``plan``)."""
    flags: list[str] = []
    for lever in sorted(levers - {"isolate"}):
        flags += RUN_FLAGS[lever]
    out = tmp / f"{tag}.json"
    if plan is not None:
        seconds = sum(s["seconds"] for s in plan)
    cmd = hft("run", "--cpus", cpu, *flags, "--", sys.executable, str(Path(__file__).resolve()),
              "--worker", "--mode", mode, "--seconds", str(seconds), "--rate", str(rate),
              "--gaps", args.gaps, "--workload", args.workload, "--out", str(out),
              "--plan", json.dumps(plan or []))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * seconds + 120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    stopped = spinner_stopped(r.stderr)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"rc {r.returncode}"])[-1],
                "keepawake_stopped": stopped}
    d = json.loads(out.read_text())
    d["keepawake_stopped"] = stopped
    if mode == "rate":
        with np.load(str(out) + ".npz") as z:
            d["response_ns"], d["lag_ns"] = z["resp"], z["lag"]
    elif mode == "wake":
        with np.load(str(out) + ".npz") as z:
            for i, (seg, got) in enumerate(zip(plan, d["segments"])):
                got |= seg | {"response_ns": z[f"resp{i}"], "lag_ns": z[f"lag{i}"]}
                if seg["kind"] == "mixed":
                    got["cls"] = z[f"cls{i}"]
    return d


def rt_permitted() -> bool:
    """Whether a child may switch itself to SCHED_FIFO (root alone is not enough in a
    container without CAP_SYS_NICE, or under a cgroup with no RT runtime)."""
    code = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=30).returncode == 0


def cpu_counters(cpu: int, host=None) -> dict[str, int]:
    """The target CPU's steal/irq/softirq ticks (/proc/stat) and interrupts taken (the sum of
    its /proc/interrupts column), to say per block what else the CPU saw."""
    from collectors.host import Host
    from collectors.parsers import parse_interrupts, parse_proc_stat
    host = host or Host()
    out = {"steal_ticks": 0, "irq_ticks": 0, "softirq_ticks": 0, "interrupts": 0}
    st = host.read(host.proc("stat")).map(parse_proc_stat)  # (a parse error: not ok)
    if st.ok and cpu in st.value.cpus:
        t = st.value.cpus[cpu]
        out.update(irq_ticks=t.get("irq", 0), softirq_ticks=t.get("softirq", 0),
                   steal_ticks=t.get("steal", 0))
    irqs = host.read(host.proc("interrupts")).map(parse_interrupts)
    if irqs.ok and cpu in irqs.value[0]:
        i = irqs.value[0].index(cpu)
        out["interrupts"] = sum(r.counts[i] for r in irqs.value[1] if len(r.counts) > i)
    return out


def block_figures(lat: np.ndarray, c0: dict, c1: dict) -> dict:
    """One block's own nearest-rank quantiles (agent.stats) and the target CPU's counter
    deltas over it."""
    a = np.sort(np.asarray(lat))
    q = (lambda p: int(stats.quantile_sorted(a, p))) if len(a) else (lambda p: None)
    return {"n": int(len(a)), "p50_ns": q(50.0), "p99_ns": q(99.0), "max_ns": q(100.0)} | {
        k: c1[k] - c0[k] for k in c0}


def summary(lat: np.ndarray) -> dict:
    from agent.probe.stats import summarize
    s = summarize(lat)
    return {k: s[k] for k in ("count", "p50_ns", "p99_ns", "p999_ns", "max_ns")} | {
        "sufficient": s["sufficient"]}


def wake_curve(args, cpu: str, arms: list[str], rng: random.Random, tmp: Path, wake: dict,
               gaps: dict, errors: dict) -> None:
    """The quiet wake-up segments of each arm (and, unless --wake-only, the idle-gap curve of
    plain and keep-awake): one probe run per arm and round, arms shuffled per round."""
    for rnd in range(args.rounds):
        for key in rng.sample(arms, len(arms)):
            lv = {key} if key != "plain" else set()
            plan = wake_plan(args.wake_pairs, args.wake_fast_s, args.wake_slow_s,
                             args.wake_mixed_s, args.wake_rate, args.slow_rate,
                             args.wake_mixed_p_slow, rng, rnd)
            print(f"wake-up round {rnd + 1}/{args.rounds}: {key}", file=sys.stderr, flush=True)
            d = run_block(args, cpu, lv, 0.0, "wake", tmp, f"wake-{key}-{rnd}", plan=plan)
            if "error" in d:
                errors.setdefault(f"wake-{key}", []).append(d["error"])
            else:
                wake.setdefault(key, []).extend(d["segments"])
            if rnd == 0 and not args.wake_only and key in ("plain", "keep-awake"):
                d = run_block(args, cpu, lv, max(args.block_s * 2, 10.0), "gaps", tmp,
                              f"gaps-{key}")
                gaps[key] = d.get("gaps") or d


def print_scenarios(rows: dict, late: dict, cpu: str, n: int, rate: float, rounds: int,
                    block_s: float) -> None:
    print(f"\ntarget CPU {cpu}, {n} neighbours, {rate:g} calls/s, "
          f"{rounds} x {block_s:g} s blocks\n")
    print(f"{'scenario':<18}{'n':>7}{'late':>7}{'P50':>10}{'P99':>10}{'P99.9':>11}"
          f"{'P50/q':>8}{'P99/q':>8}{'P99.9/q':>9}")

    def us(v):
        return f"{v / 1e3:.0f}µs" if v is not None else "-"

    def x(v):
        return f"{v:.2f}" if v is not None else "-"
    for name, r in rows.items():
        star = "" if r["sufficient"]["p999"] else "*"
        print(f"{name:<18}{r['count']:>7}{late[name] * 100:>6.1f}%{us(r['p50_ns']):>10}"
              f"{us(r['p99_ns']):>10}{us(r['p999_ns']) + star:>11}{x(r['p50_x_quiet']):>8}"
              f"{x(r['p99_x_quiet']):>8}{x(r['p999_x_quiet']):>9}")
    need = stats.P999_MIN_SAMPLES
    short = [k for k, r in rows.items() if not r["sufficient"]["p999"]]
    if rows and not short:
        print(f"P99.9 sufficient in every scenario (n >= {need:,})")
    elif short:
        print(f"* P99.9 from fewer than {need:,} samples (a ranked order statistic, not a "
              f"claim): {', '.join(short)}")


def print_wake(wake_rows: dict, slow_rate: float, fast_rate: float) -> None:
    if not wake_rows:
        return
    print(f"\nwake-up, quiet: P50 at {slow_rate:g}/s over P50 at {fast_rate:g}/s "
          f"(target <= 1.1 with keep-awake)")
    print(f"{'arm':<17}{'pooled [95% CI]':<22}{'per-pair median [CI]':<30}"
          f"{'mixed [95% CI]':<22}{'P50 fast/slow':<18}samples fast/slow")

    def ci(v):
        return f"[{v[0]:.2f}, {v[1]:.2f}]" if v else "[-]"
    fk, sk = f"{fast_rate:g}", f"{slow_rate:g}"
    for key, w in wake_rows.items():
        pooled = pair = mixed = "-"
        p50s = samples = "-"
        if "slow_over_fast" in w:
            pooled = f"{w['slow_over_fast']:.2f} {ci(w['pooled_ci'])}"
            pp = w["per_pair"]
            pair = f"{pp['median']:.2f} {ci(pp['ci'])} {pp['confidence']:.0%} ({pp['n']})"
            p50s = f"{w['p50_ns'][fk] / 1e3:.0f}/{w['p50_ns'][sk] / 1e3:.0f}µs"
            samples = f"{w['samples'][fk]}/{w['samples'][sk]}"
        m = w.get("mixed") or {}
        if "ratio" in m:
            mixed = f"{m['ratio']:.2f} {ci(m['ci'])}"
            samples += (f"; mixed {m['counts']['fast']}/{m['counts']['slow']}"
                        f" ({m['windows']} windows)")
        print(f"{key:<17}{pooled:<22}{pair:<30}{mixed:<22}{p50s:<18}{samples}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="rate", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=6.0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--plan", default="[]", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", default=None, help="the inference CPU (default: the last target "
                    "CPU of hftagent's rule)")
    ap.add_argument("--neighbours", type=int, default=None, help="busy neighbours (default "
                    "3 x online CPUs)")
    ap.add_argument("--rate", default="auto", help="calls/s of the scenarios, or auto: the "
                    "probe's CPU --busy busy at its quiet P50 (at most 500/s), so that the "
                    "neighbours' share of the CPU slows the calls without saturating the "
                    "probe (a saturated open loop measures its queue, not the tail)")
    ap.add_argument("--busy", type=float, default=0.15, help="the busy share --rate auto aims "
                    "at (default 0.15; 0.30 doubles the samples per second, and the untuned "
                    "noisy rows then queue sooner: see their late share)")
    ap.add_argument("--scenarios", default=None, help="comma-separated scenarios to run "
                    "(quiet always; default all), e.g. quiet,noisy,bursty,noisy+all,bursty+all")
    ap.add_argument("--min-samples", type=int, default=None, help="size the blocks so that "
                    "every scenario gets at least N samples over the rounds (6636: P99.9 "
                    "sufficient); overrides --block-s")
    ap.add_argument("--budget-s", type=float, default=None, help="shorten the scenario blocks "
                    "so that the scenario phase fits an estimated S seconds")
    ap.add_argument("--block-s", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levers", default=",".join(LEVERS))
    ap.add_argument("--gaps", default="0,1ms,10ms,100ms,1s")
    ap.add_argument("--workload", choices=("numpy", "tflite"), default="numpy")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--wake-rate", type=float, default=500.0, help="the fast rate of the "
                    "wake-up curve")
    ap.add_argument("--slow-rate", type=float, default=20.0, help="the slow rate of the "
                    "wake-up curve")
    ap.add_argument("--wake-pairs", type=int, default=3, help="adjacent fast/slow segment "
                    "pairs per arm and round (default 3)")
    ap.add_argument("--wake-fast-s", type=float, default=1.0, help="seconds of a fast segment")
    ap.add_argument("--wake-slow-s", type=float, default=2.5, help="seconds of a slow segment")
    ap.add_argument("--wake-mixed-s", type=float, default=10.0, help="seconds of the mixed "
                    "segment per arm and round (0: none)")
    ap.add_argument("--wake-mixed-p-slow", type=float, default=0.5, help="share of long "
                    "intervals in the mixed segment")
    ap.add_argument("--keepawake-loops", default="pause", help="the spinner loops the wake-up "
                    "curve compares: pause, busy or pause,busy")
    ap.add_argument("--wake-only", action="store_true", help="only the wake-up curve")
    ap.add_argument("--no-wake", action="store_true", help="only the scenarios (no wake-up "
                    "or idle-gap curve)")
    ap.add_argument("--wake-isolated", action="store_true", help="run the wake-up curve on the "
                    "CPU isolated (tune apply --isolate, rolled back after): the spinner alone "
                    "makes the kernel count its CPU idle and place other tasks there")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        args.rate = float(args.rate)
        return worker(args)

    if args.rate != "auto":
        try:
            args.rate = float(args.rate)
        except ValueError:
            raise fail(f"--rate takes calls/s or auto, not {args.rate!r}") from None
        if not args.rate > 0:
            raise fail("--rate must be > 0")
    checks = [(args.rounds >= 1, "--rounds must be >= 1"),
              (args.block_s > 0, "--block-s must be > 0"),
              (0 < args.busy < 1, "--busy takes a share in (0, 1)"),
              (args.min_samples is None or args.min_samples >= 1, "--min-samples must be >= 1"),
              (args.budget_s is None or args.budget_s > 0, "--budget-s must be > 0"),
              (args.wake_rate > 0 and args.slow_rate > 0, "--wake-rate/--slow-rate must be > 0"),
              (args.wake_pairs >= 0, "--wake-pairs must be >= 0"),
              (args.wake_fast_s > 0 and args.wake_slow_s > 0,
               "--wake-fast-s/--wake-slow-s must be > 0"),
              (args.wake_mixed_s >= 0, "--wake-mixed-s must be >= 0"),
              (0 < args.wake_mixed_p_slow < 1, "--wake-mixed-p-slow takes a share in (0, 1)"),
              (args.wake_pairs > 0 or args.wake_mixed_s > 0,
               "the wake-up curve needs --wake-pairs > 0 or --wake-mixed-s > 0"),
              (not (args.wake_only and args.no_wake), "--wake-only and --no-wake exclude "
               "each other")]
    for ok, msg in checks:
        if not ok:
            raise fail(msg)
    levers = [x for x in args.levers.split(",") if x]
    bad = set(levers) - set(LEVERS)
    if bad:
        raise fail(f"unknown lever(s) {', '.join(sorted(bad))}; known: {', '.join(LEVERS)}")
    loops = [x for x in args.keepawake_loops.split(",") if x]
    if not loops or set(loops) - {"pause", "busy"}:
        raise fail("--keepawake-loops takes pause, busy or pause,busy")
    try:
        scenarios = select_scenarios(scenario_table(levers), args.scenarios)
    except ValueError as exc:
        raise fail(str(exc)) from None

    from collectors.host import Host
    from tuning.targets import resolve
    plan = resolve(Host())
    cpu = args.cpu or str(plan.cpus[-1])
    ncpu = len(plan.online)
    n = args.neighbours if args.neighbours is not None else 3 * ncpu
    unavailable = {}
    if "fifo" in levers and not rt_permitted():
        levers.remove("fifo")
        unavailable["fifo"] = ("SCHED_FIFO refused here (no CAP_SYS_NICE or no RT runtime "
                               "in this cgroup): left out of every scenario")
        scenarios = without_lever(scenarios, "fifo")
    tmp0 = Path(tempfile.mkdtemp(prefix="hftagent-tuning-effect-cal-"))
    overhead_s = 1.5  # per-block start-up estimate until the calibration measures it
    if args.rate == "auto" and not args.wake_only:
        t0 = time.monotonic()
        cal = run_block(args, cpu, set(), 2.0, "rate", tmp0, "calibrate", rate=100.0)
        overhead_s = max(0.5, time.monotonic() - t0 - 2.0)
        if "error" in cal:
            raise fail(f"calibration failed: {cal['error']}")
        p50_cal = float(np.median(cal["response_ns"]))
        args.rate = round(min(500.0, args.busy / (p50_cal / 1e9)), 1)
        print(f"rate auto: quiet P50 {p50_cal / 1e3:.0f} µs, {args.busy:.0%} busy -> "
              f"{args.rate:g} calls/s (block start-up {overhead_s:.1f} s)", file=sys.stderr)
    # scenario blocks also start and stop their neighbours (and run them during start-up)
    block_overhead_s = overhead_s + 1.0
    if args.rate == "auto":
        args.rate = 0.0  # --wake-only: unused, the wake-up curve has its own rates
    if args.wake_only:
        scenarios = []
    blocks = len(scenarios) * args.rounds
    iso_cycles = sum(1 for s in scenarios if "isolate" in s[2]) * args.rounds
    if blocks and args.min_samples is not None:
        args.block_s = math.ceil(block_seconds(args.min_samples, args.rounds, args.rate)
                                 * 100) / 100
    if blocks:
        try:
            fit, est = fit_budget(args.block_s, blocks, iso_cycles, block_overhead_s,
                                  args.budget_s)
        except ValueError as exc:
            raise fail(str(exc)) from None
        if fit < args.block_s:
            print(f"--budget-s {args.budget_s:g}: blocks shortened from {args.block_s:g} s "
                  f"to {fit:.2f} s (~{int(fit * args.rate) * args.rounds} samples per "
                  f"scenario)", file=sys.stderr)
            args.block_s = round(fit, 2)
        print(f"scenarios: {blocks} blocks of {args.block_s:g} s "
              f"(~{max(0, int(args.block_s * args.rate) - 1) * args.rounds} samples per "
              f"scenario), ~{est:.0f} s", file=sys.stderr, flush=True)
    arms = ["plain"] + [("keep-awake" if lp == "pause" else f"keep-awake-{lp}") for lp in loops]
    if not args.no_wake:
        per_run = args.wake_pairs * (args.wake_fast_s + args.wake_slow_s) + args.wake_mixed_s
        print(f"wake-up: {len(arms)} arms x {args.rounds} rounds x {per_run:g} s, "
              f"~{len(arms) * args.rounds * (per_run + overhead_s):.0f} s"
              + (" + isolate" if args.wake_isolated else ""), file=sys.stderr, flush=True)

    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="hftagent-tuning-effect-"))
    state_dir = str(tmp / "state")
    pooled: dict[str, list[np.ndarray]] = {s[0]: [] for s in scenarios}
    lags: dict[str, list[np.ndarray]] = {s[0]: [] for s in scenarios}
    walls: dict[str, list[float]] = {s[0]: [] for s in scenarios}
    blocks: dict[str, list[dict]] = {s[0]: [] for s in scenarios}
    errors: dict[str, list[str]] = {}
    stops: dict[str, list[str]] = {}  # scenario: the spinner guard's line, one per block
    iso_log: list = []
    loads: dict[str, list] = {}
    t_start = time.time()
    for rnd in range(args.rounds if scenarios else 0):
        order = scenarios[:]
        rng.shuffle(order)
        for name, noise, lv in order:
            print(f"round {rnd + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            house = [c for c in plan.online if str(c) != cpu]
            t_block = time.monotonic()
            c0 = cpu_counters(int(cpu))
            with neighbours(noise, n, house) as nb:
                ctx = isolated(cpu, state_dir, iso_log) if "isolate" in lv else \
                    contextlib.nullcontext()
                try:
                    with ctx:
                        d = run_block(args, cpu, set(lv), args.block_s, "rate", tmp,
                                      f"{name}-{rnd}", rate=args.rate)
                except RuntimeError as exc:
                    d = {"error": str(exc)}
            walls[name].append(round(time.monotonic() - t_block, 2))
            stops.setdefault(name, []).extend(d.get("keepawake_stopped") or [])
            if noise == "stress":
                loads.setdefault(name, []).append(nb.to_dict())
            if "error" in d:
                errors.setdefault(name, []).append(d["error"])
            else:
                pooled[name].append(d["response_ns"])
                lags[name].append(d["lag_ns"])
                blocks[name].append(block_figures(d["response_ns"], c0, cpu_counters(int(cpu))))
    rows, late = {}, {}
    for name, _, _ in scenarios:
        if pooled[name]:
            rows[name] = summary(np.concatenate(pooled[name]))
            late[name] = late_share(np.concatenate(lags[name]), args.rate)
            rows[name]["late_share"] = late[name]
            rows[name]["blocks"] = len(pooled[name])
            rows[name]["block_wall_s"] = walls[name]
            rows[name]["per_block"] = blocks[name]
            rows[name]["keepawake_stopped"] = len(stops.get(name, []))
    q = rows.get("quiet")
    for r in rows.values():
        for k in ("p50", "p99", "p999"):
            r[f"{k}_x_quiet"] = (r[f"{k}_ns"] / q[f"{k}_ns"]) if q and q[f"{k}_ns"] else None

    doc = {"cpu": cpu, "neighbours": n, "online": ncpu, "rate": args.rate, "busy": args.busy,
           "block_s": args.block_s, "rounds": args.rounds, "min_samples": args.min_samples,
           "p999_min_samples": stats.P999_MIN_SAMPLES, "workload": args.workload,
           "wake_isolated": args.wake_isolated, "keepawake_loops": loops, "levers": levers,
           "scenario_names": [s[0] for s in scenarios], "unavailable": unavailable,
           "scenarios": rows, "errors": errors, "isolation_log": iso_log, "loads": loads,
           "kernel": os.uname().release}

    def write_doc() -> None:
        if args.json:
            doc["elapsed_s"] = round(time.time() - t_start, 1)
            Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    if scenarios:
        write_doc()

    # wake-up curve and idle gaps, quiet, with and without keep-awake (interleaved)
    wake: dict = {}
    gaps: dict = {}
    if not args.no_wake:
        wake_ctx = isolated(cpu, state_dir, iso_log) if args.wake_isolated else \
            contextlib.nullcontext()
        try:
            with wake_ctx:
                wake_curve(args, cpu, arms, rng, tmp, wake, gaps, errors)
        except RuntimeError as exc:
            errors.setdefault("wake", []).append(str(exc))
    wake_rows = {key: wake_summary(segs, args.slow_rate, args.wake_rate, args.seed)
                 for key, segs in wake.items()}
    doc |= {"wakeup": wake_rows, "idle_gaps": gaps,
            "wake_design": {"pairs": args.wake_pairs, "fast_s": args.wake_fast_s,
                            "slow_s": args.wake_slow_s, "mixed_s": args.wake_mixed_s,
                            "mixed_p_slow": args.wake_mixed_p_slow,
                            "fast_rate": args.wake_rate, "slow_rate": args.slow_rate,
                            "mixed_window_calls": MIXED_WINDOW}}
    if scenarios:
        print_scenarios(rows, late, cpu, n, args.rate, args.rounds, args.block_s)
    print_wake(wake_rows, args.slow_rate, args.wake_rate)
    for key, g in gaps.items():
        if isinstance(g, list):
            print(f"idle gaps {key}: " + ", ".join(
                f"{r['gap_ns'] / 1e6:g} ms {r['p50_ns'] / 1e3:.0f}µs" for r in g))
    for name, lines in stops.items():
        if lines:
            print(f"keep-awake stopped itself in {len(lines)} block(s) of {name}: {lines[0]}")
    for lv, why in unavailable.items():
        print(f"lever {lv}: {why}")
    for name, errs in errors.items():
        print(f"errors in {name}: {errs[0]}")
    write_doc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
