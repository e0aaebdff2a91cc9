"""Probe P99 with kernel events on vs off inside one watch run: short blocks, the events of
watch's own tracefs instance switched on and off between them.

Issue #17's target: probe P99 with events on within 2 % of off (a paired A/B with a CI, as
bench/sampler_ab.py does). bench/events_ab.py pairs whole `hftagent watch --trace on|off`
runs (~15 s a pair), so its P99 interval stays ±20-40 % at the pairs it can afford; this
bench gets its ~120 pairs in a few minutes:

- one numpy probe worker on the last CPU at ``--rate`` (1000 Hz) for the whole bench, and
  one `hftagent watch --ring RING --cpus <probe> --housekeeping <rest> --trace on` attached
  to it (``--sample-hz`` 100, its default sampler), started once;
- the bench finds watch's private instance (``<tracefs>/instances/hftagent-<watch pid>``),
  remembers the events watch enabled in it (each ``events/<system>/<event>/enable`` that
  reads 1) and, block by block, writes 0 or 1 to those files: only that instance, never
  the global tracing state or another instance. Not ``events/enable`` itself: a 1 there
  enables *every* event the instance has, not watch's set; it is read back instead as the
  check (``0`` in an off block, ``1`` or ``X`` in an on block);
- ``--pairs`` pairs of blocks, the order inside each pair (on/off or off/on) by a seeded
  coin flip; a block runs ``--block-s`` (1 s) from the end of its toggle write (a write that
  disables the events waits for the tracepoints' RCU grace period: ~4 ms, at times 0.35 s),
  and its samples are those that *started* in it after the first ``--discard-s`` (0.1 s:
  the (un)registration's text-patching IPIs, the write's own wake-ups). At 1000 Hz a block
  keeps ~900 samples, over the 662 an honest P99 needs (agent.stats.P99_MIN_SAMPLES); a
  pair whose block kept fewer than ``--min-samples`` is dropped and counted;
- per block: probe P50/P99 and the events written on the probe CPU (``per_cpu/cpuN/stats``
  of the instance, entries + overrun + read, before and after the block): their rate in the
  on blocks, and the proof that the toggle stops them (every off block must write 0);
- per pair: the on/off ratio of the block P99 (and P50); reported: the median ratio with an
  exact sign-test (order statistic) interval, and the ratio of pooled quantiles with a
  paired block bootstrap interval (bench/abstats.py); verdicts against ``--tol`` (0.02);
- an A/A control (bench/abstats.aa_split): on-blocks of pairs 2j vs 2j+1, and the same for
  off-blocks, through the same two statistics; half the pairs, so expect ~sqrt(2) wider;
- the stall split: on a VM a host stall of a few ms queues enough open-loop samples to set
  a block's P99, so block P99s are bimodal and the pooled P99 is set by the few worst
  blocks (read the pooled figure with that in mind). Blocks over ``--stall-factor`` (2) ×
  the median block P99 are counted per mode, with an exact sign test on the pairs where
  only one block stalled (do events bring stalls?), and the median ratio of the pairs where
  neither did (the recording cost on an undisturbed CPU; a selection, so only to be read
  together with the stall counts).

What it measures: the kernel-side cost of *recording* the events on the probe CPU — the
tracepoint handlers and ring-buffer writes that run there, in the probe's own time slices.
Watch's cost of *reading* them (trace_pipe_raw drains, window decoding) runs on the
housekeeping CPU and is measured by bench/events_ab.py and bench/events_read_cost.py; here
watch runs in both arms (with no events in an off block its reads find nothing).

Needs root and tracefs (``--trace-on mount`` lets watch mount it first). Every exit path,
Ctrl-C and SIGTERM included, stops watch (which removes its instance; the bench removes an
instance a killed watch left), then the probe worker, and removes the ring.

    sudo .venv/bin/python bench/events_p99_ab.py --seed 17 --json events_p99_ab.json  # ~4 min
    sudo .venv/bin/python bench/events_p99_ab.py --pairs 8 --progress               # smoke, ~20 s
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.client import FIELDS, RingReader  # noqa: E402
from agent.stats import P99_MIN_SAMPLES, binom_sf  # noqa: E402
from agent.trace.instance import PREFIX, CpuStats, parse_stats  # noqa: E402
from agent.watch.probe_worker import await_ready  # noqa: E402
from bench.abstats import aa_split, paired_bootstrap, quantile, verdict  # noqa: E402
from bench.events_ab import hftagent  # noqa: E402
from collectors.cpu import cpu_model  # noqa: E402
from collectors.host import Host  # noqa: E402

F = {n: i for i, n in enumerate(FIELDS)}
PS = (0.5, 0.99)
TRACEFS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


# -- pure logic (tests/test_bench_events_p99_ab.py) ----------------------------------------------
def block_order(pairs: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """The two modes of each pair, on/off or off/on by a coin flip."""
    return [("on", "off") if f else ("off", "on") for f in rng.random(pairs) < 0.5]


def samples_per_block(rate_hz: float, block_s: float, discard_s: float) -> int:
    """Probe samples a block keeps at ``rate_hz`` (the kept window is block - discard)."""
    return int(rate_hz * max(0.0, block_s - discard_s))


def assign(start_ns: np.ndarray, lat_ns: np.ndarray,
           windows: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """Latencies of the samples whose start lies in each [t0, t1) window (any sample order)."""
    o = np.argsort(start_ns, kind="stable")
    s, lat = np.asarray(start_ns)[o], np.asarray(lat_ns)[o]
    out = []
    for t0, t1 in windows:
        a, b = np.searchsorted(s, [t0, t1], "left")
        out.append(lat[a:b])
    return out


def written(st: CpuStats) -> int:
    """Events the kernel wrote into a CPU's ring so far: entries still in it + overwritten +
    consumed (the three counters of per_cpu/cpuN/stats; EventSource.rate counts the same)."""
    return st.entries + st.overrun + st.read


def usable_pairs(on: dict[int, np.ndarray], off: dict[int, np.ndarray],
                 min_samples: int) -> list[int]:
    """Pairs whose two blocks both kept at least ``min_samples``."""
    return [i for i in sorted(on) if i in off
            and min(len(on[i]), len(off[i])) >= min_samples]


def sign_ci(x: Sequence[float], level: float = 0.95) -> dict:
    """Median of ``x`` with the exact distribution-free (sign-test) interval: the k-th
    smallest and k-th largest values, k the largest rank with P(Bin(n, 1/2) < k) <=
    (1 - level) / 2; ``level`` in the result is the coverage that k actually gives
    (>= the one asked). Too few values for any such k (n < 6 at 95 %): no interval."""
    v = np.sort(np.asarray(x, dtype=np.float64))
    n = len(v)
    if n == 0:
        raise ValueError("sign_ci of no values")
    alpha = (1 - level) / 2
    k = 0
    while k + 1 <= n // 2 and 1.0 - binom_sf(k + 1, n, 0.5) <= alpha:
        k += 1  # P(X <= k) = 1 - P(X >= k + 1): the tail below rank k + 1
    med = float(np.median(v))
    if k == 0:
        return {"n": n, "median": med, "ci": None, "level": None}
    tail = 1.0 - binom_sf(k, n, 0.5)  # P(X <= k - 1)
    return {"n": n, "median": med, "ci": [float(v[k - 1]), float(v[n - k])],
            "level": round(1 - 2 * tail, 4)}


def pair_ratios(a: Sequence[np.ndarray], b: Sequence[np.ndarray], p: float) -> np.ndarray:
    """Per pair: p-quantile of a[i] over p-quantile of b[i]."""
    return np.array([quantile(x, p) / quantile(y, p) for x, y in zip(a, b)])


def median_ratio(a: Sequence[np.ndarray], b: Sequence[np.ndarray], p: float,
                 level: float = 0.95, tol: float = 0.02) -> dict:
    """The median per-pair ratio with its sign-test interval and verdict against ``tol``."""
    r = sign_ci(pair_ratios(a, b, p), level)
    r["verdict"] = verdict(*r["ci"], tol) if r["ci"] else "no interval (too few pairs)"
    r["excludes_1"] = bool(r["ci"] and (r["ci"][0] > 1 or r["ci"][1] < 1))
    return r


def compare(a: Sequence[np.ndarray], b: Sequence[np.ndarray], ps: Sequence[float],
            n_boot: int, rng: np.random.Generator, tol: float) -> dict:
    """Both statistics, per quantile: {"p50": {"median_pair": .., "pooled": ..}, ...}, the
    pooled values in µs (the blocks are ns)."""
    boot = paired_bootstrap(a, b, ps, n_boot, rng, tol=tol)
    out: dict = {"pairs": len(a)}
    for p in ps:
        k = f"p{p * 100:g}"
        pooled = {x: (round(v / 1e3, 1) if x in ("a", "b") else v) for x, v in boot[k].items()}
        out[k] = {"median_pair": median_ratio(a, b, p, tol=tol), "pooled": pooled}
    return out


def sign_test_p(k: int, n: int) -> float:
    """Two-sided exact sign test: k of n discordant pairs one way, P = 1/2 each."""
    if n == 0:
        return 1.0
    lower = 1.0 - binom_sf(k + 1, n, 0.5)  # P(X <= k)
    return min(1.0, 2 * min(lower, binom_sf(k, n, 0.5)))


def stalls(on: dict[int, np.ndarray], off: dict[int, np.ndarray], kept: Sequence[int],
           p: float = 0.99, factor: float = 2.0) -> dict:
    """Blocks whose p-quantile is over ``factor`` × the median block p-quantile of the kept
    blocks ("stalled": on the dev VM a single stall of the host of several ms queues enough
    open-loop samples to set a block's P99). Counted per mode, with the pairs where only one
    block stalled (discordant) and their two-sided sign test: do events bring stalls? And
    the pairs where neither block stalled ("quiet": the recording cost on an undisturbed
    CPU; a selection, to be read with the stall counts)."""
    q_on = {i: quantile(on[i], p) for i in kept}
    q_off = {i: quantile(off[i], p) for i in kept}
    thr = factor * float(np.median(list(q_on.values()) + list(q_off.values())))
    s_on = {i for i in kept if q_on[i] > thr}
    s_off = {i for i in kept if q_off[i] > thr}
    on_only, off_only = len(s_on - s_off), len(s_off - s_on)
    return {"threshold_us": round(thr / 1e3, 1), "factor": factor,
            "stalled_on": len(s_on), "stalled_off": len(s_off), "both": len(s_on & s_off),
            "on_only": on_only, "off_only": off_only,
            "sign_test_p": round(sign_test_p(on_only, on_only + off_only), 4),
            "quiet_pairs": [i for i in kept if i not in s_on and i not in s_off]}


def analyse(on: dict[int, np.ndarray], off: dict[int, np.ndarray], ps: Sequence[float],
            n_boot: int, rng: np.random.Generator, tol: float, min_samples: int,
            stall_factor: float = 2.0) -> dict:
    """A/B over the usable pairs, the A/A control of each mode, and the stall split (the
    quiet pairs' median ratios where there are >= 6 of them)."""
    kept = usable_pairs(on, off, min_samples)
    if len(kept) < 4:
        raise ValueError(f"only {len(kept)} usable pairs (>= {min_samples} samples in both "
                         "blocks); need 4")
    ab = compare([on[i] for i in kept], [off[i] for i in kept], ps, n_boot, rng, tol)
    aa = {}
    for mode, d in (("on", on), ("off", off)):
        a, b = aa_split([d[i] for i in kept], rng)
        aa[mode] = compare(a, b, ps, n_boot, rng, tol)
    st = stalls(on, off, kept, max(ps), stall_factor)
    quiet = st["quiet_pairs"]
    st["quiet"] = {f"p{p * 100:g}": median_ratio([on[i] for i in quiet], [off[i] for i in quiet],
                                                 p, tol=tol)
                   for p in ps} if len(quiet) >= 6 else None
    return {"kept": kept, "dropped": sorted(set(on) - set(kept)), "ab": ab, "aa": aa,
            "stalls": st}


def off_leaks(blocks: Sequence[dict]) -> list[dict]:
    """Off blocks in which the probe CPU's ring still got events (the toggle did not hold)."""
    return [b for b in blocks if b["mode"] == "off" and (b["events"] or 0) != 0]


# -- the instance's enable files ----------------------------------------------------------------
class InstanceEvents:
    """The events watch enabled in its instance, switched together through their own enable
    files (module docstring: why not ``events/enable``)."""

    def __init__(self, inst: Path) -> None:
        self.inst = inst
        self.files = [p for p in sorted((inst / "events").glob("*/*/enable"))
                      if p.read_text().strip() == "1"]
        if not self.files:
            raise RuntimeError(f"no event enabled in {inst}")
        self.names = [f"{p.parent.parent.name}:{p.parent.name}" for p in self.files]

    def set(self, on: bool) -> None:
        val = b"1" if on else b"0"
        for p in self.files:
            fd = os.open(p, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_TRUNC)
            try:
                os.write(fd, val)
            finally:
                os.close(fd)

    def state(self) -> str:
        """The instance's aggregate ``events/enable``: 0, 1 or X (some on)."""
        return (self.inst / "events" / "enable").read_text().strip()

    def stats(self, cpu: int) -> CpuStats:
        return parse_stats((self.inst / "per_cpu" / f"cpu{cpu}" / "stats").read_text(), cpu)


# -- the run ----------------------------------------------------------------------------------
class Aborted(Exception):
    """One line for stderr: the bench cannot go on."""


def loadavg() -> list[str]:
    try:
        return Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        return []


def _raise_interrupt(signum, _frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _tail(path: Path, n: int = 2) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def find_instance(pid: int) -> Path | None:
    for root in TRACEFS:
        p = root / "instances" / f"{PREFIX}{pid}"
        if p.is_dir():
            return p
    return None


def wait_for_instance(watch: subprocess.Popen, err: Path, timeout_s: float = 90.0) -> Path:
    """watch's instance once it is tracing (tracing_on 1 and events in)."""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if watch.poll() is not None:
            raise Aborted(f"watch exited {watch.returncode} before its instance was up: "
                          f"{_tail(err)}")
        inst = find_instance(watch.pid)
        try:
            if inst and (inst / "tracing_on").read_text().strip() == "1" \
                    and (inst / "events" / "enable").read_text().strip() in ("1", "X"):
                return inst
        except OSError:
            pass
        time.sleep(0.1)
    raise Aborted(f"no tracing instance {PREFIX}{watch.pid} after {timeout_s:g} s "
                  f"(watch --trace on: {_tail(err)})")


def run_blocks(args, order, probe_cpu: int, hk: list[int], tmp: Path) -> dict:
    ring = Path(f"/dev/shm/hftagent-events-p99-ab-{os.getpid()}.ring")
    worker = watch = None
    watch_pid = None
    clock = time.monotonic_ns  # the probe worker's clock for start_ns / end_ns
    chunks, windows = [], []
    w_out, w_err = tmp / "watch.json", tmp / "watch.err"
    est_s = args.warmup_s + len(order) * 2 * args.block_s
    try:
        worker = subprocess.Popen(
            [sys.executable, "-m", "agent.watch.probe_worker", "--ring", str(ring), "--rate",
             str(args.rate), "--cpus", str(probe_cpu), "--probe", "numpy"],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=REPO,
            start_new_session=True)  # our Ctrl-C reaches only us: we stop it, after watch
        info = await_ready(worker.stdout)
        if not info.get("ready"):
            raise Aborted(f"probe worker did not start: {info.get('error', info)}")
        reader = RingReader(ring)
        # --duration only bounds a watch this bench could not stop (it is SIGTERMed at the end)
        cmd = [*hftagent(), "watch", "--ring", str(ring), "--cpus", str(probe_cpu),
               "--housekeeping", ",".join(map(str, hk)), "--duration", f"{est_s * 2 + 120:.0f}",
               "--sample-hz", str(args.hz), "--trace", args.trace_on, "--json", "--no-live",
               "--spike-log", str(tmp / "spikes.jsonl")]
        with open(w_out, "wb") as o, open(w_err, "wb") as e:
            watch = subprocess.Popen(cmd, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                     cwd=REPO, start_new_session=True)
        watch_pid = watch.pid
        inst = wait_for_instance(watch, w_err)
        ev = InstanceEvents(inst)
        # the check, once: off really is 0 in the aggregate file, on is back to watch's set
        ev.set(False)
        if ev.state() != "0":
            raise Aborted(f"{inst}/events/enable reads {ev.state()!r} with all of "
                          f"watch's events written 0")
        ev.set(True)
        if any(p.read_text().strip() != "1" for p in ev.files):
            raise Aborted("an event did not come back on after its enable was written 1")
        time.sleep(args.warmup_s)  # watch's kallsyms load, its baseline, the ring settling
        reader.read()
        block_ns, discard_ns = int(args.block_s * 1e9), int(args.discard_s * 1e9)
        t_first = clock()
        for i, pair in enumerate(order):
            for mode in pair:
                t_switch = clock()
                ev.set(mode == "on")
                t_set = clock()
                state = ev.state()
                s0, ts0 = ev.stats(probe_cpu), clock()
                deadline = t_set + block_ns  # a slow toggle does not shorten the block
                while (left := deadline - clock()) > 0:
                    time.sleep(left / 1e9)
                t_end = clock()
                s1, ts1 = ev.stats(probe_cpu), clock()
                chunks.append(reader.read())
                windows.append({"pair": i, "mode": mode, "switch_ns": t_switch,
                                "t0_ns": t_set + discard_ns, "t1_ns": t_end,
                                "toggle_ms": (t_set - t_switch) / 1e6, "enable": state,
                                "events": written(s1) - written(s0),
                                "stats_s": (ts1 - ts0) / 1e9,
                                "overrun": s1.overrun - s0.overrun,
                                "dropped": s1.dropped - s0.dropped})
                if watch.poll() is not None:
                    raise Aborted(f"watch exited {watch.returncode} during the blocks: "
                                  f"{_tail(w_err)}")
            if args.progress and (i + 1) % 10 == 0 or args.progress and i + 1 == len(order):
                el = (clock() - t_first) / 1e9
                print(f"  pair {i + 1}/{len(order)}, {el:.0f} s", file=sys.stderr, flush=True)
        ev.set(True)  # watch's state as it left it
        time.sleep(0.05)  # a call in flight at the last block's end lands in the ring
        chunks.append(reader.read())
        lost = reader.lost
        summary, rc = stop_watch(watch, w_out)
        return {"info": info, "samples": np.concatenate(chunks), "windows": windows,
                "lost": lost, "events": ev.names, "instance": str(inst),
                "watch_summary": summary, "watch_rc": rc}
    finally:
        if watch is not None and watch.poll() is None:
            stop_watch(watch, w_out)
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        if watch_pid is not None and watch.poll() is not None:
            left = find_instance(watch_pid)  # a watch killed or dead leaves its instance
            if left is not None:
                try:
                    os.rmdir(left)
                except OSError as exc:
                    print(f"events_p99_ab: could not remove {left}: {exc.strerror}",
                          file=sys.stderr)
        ring.unlink(missing_ok=True)


def stop_watch(watch: subprocess.Popen, out: Path) -> tuple[dict | None, int]:
    """SIGTERM (watch's clean stop: spike log closed, instance removed), SIGKILL after 30 s."""
    if watch.poll() is None:
        watch.send_signal(signal.SIGTERM)
        try:
            watch.wait(30)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.wait()
    try:
        return json.loads(out.read_text()), watch.returncode
    except (OSError, ValueError):
        return None, watch.returncode


def fmt_ci(ci) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "[-]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=120, help="on/off block pairs (120)")
    ap.add_argument("--block-s", type=float, default=1.0, help="block length, s (1.0)")
    ap.add_argument("--discard-s", type=float, default=0.1,
                    help="dropped after each toggle write, s (0.1)")
    ap.add_argument("--rate", type=float, default=1000.0,
                    help="probe rate, Hz (1000: ~900 samples a block)")
    ap.add_argument("--hz", type=float, default=100.0, help="watch --sample-hz (100)")
    ap.add_argument("--trace-on", choices=("on", "mount"), default="on",
                    help="watch's --trace (on; mount: let watch mount tracefs first)")
    ap.add_argument("--warmup-s", type=float, default=2.0,
                    help="after watch's instance is up, before the first block, s (2)")
    ap.add_argument("--boot", type=int, default=4000, help="bootstrap resamples (4000)")
    ap.add_argument("--tol", type=float, default=0.02, help="the target: |ratio - 1| (0.02)")
    ap.add_argument("--seed", type=int, help="block order and bootstrap (random if unset)")
    ap.add_argument("--min-samples", type=int, default=P99_MIN_SAMPLES,
                    help=f"drop a pair when either block kept fewer samples "
                         f"({P99_MIN_SAMPLES}: enough for a P99)")
    ap.add_argument("--stall-factor", type=float, default=2.0,
                    help="a block is stalled when its P99 is over this × the median block "
                         "P99 (2)")
    ap.add_argument("--progress", action="store_true", help="a line every 10 pairs on stderr")
    ap.add_argument("--json", help="write all figures here")
    args = ap.parse_args()
    if args.pairs < 8 or args.block_s <= args.discard_s:
        ap.error("need --pairs >= 8 and --block-s > --discard-s")
    per_block = samples_per_block(args.rate, args.block_s, args.discard_s)
    if per_block < args.min_samples:
        ap.error(f"--rate {args.rate:g} × (--block-s - --discard-s) gives {per_block} samples "
                 f"a block, under --min-samples {args.min_samples}: raise --rate or --block-s")
    if os.geteuid() != 0:
        print("events_p99_ab: needs root (tracefs)", file=sys.stderr)
        return 2
    online = sorted(os.sched_getaffinity(0))
    if len(online) < 2:
        print("events_p99_ab: needs 2 CPUs (probe + housekeeping)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    order = block_order(args.pairs, rng)
    probe_cpu, hk = online[-1], online[:-1]
    os.sched_setaffinity(0, hk)
    host = Host()
    old = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    tmp = Path(tempfile.mkdtemp(prefix="hftagent-events-p99-ab-"))
    load0, t_start = loadavg(), time.time()
    try:
        run = run_blocks(args, order, probe_cpu, hk, tmp)
    except KeyboardInterrupt as exc:
        why = str(exc) or "SIGINT"
        print(f"events_p99_ab: interrupted ({why}); probe, watch and its instance stopped",
              file=sys.stderr)
        return 130
    except (Aborted, RuntimeError, OSError) as exc:
        print(f"events_p99_ab: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for s, h in old.items():
            signal.signal(s, h)
    wall, load1 = time.time() - t_start, loadavg()

    x = run["samples"]
    wins = run["windows"]
    lats = assign(x[:, F["start_ns"]], x[:, F["end_ns"]] - x[:, F["start_ns"]],
                  [(w["t0_ns"], w["t1_ns"]) for w in wins])
    w0 = wins[0]["switch_ns"]
    blocks = []
    for wd, ln in zip(wins, lats):
        b = {"pair": wd["pair"], "mode": wd["mode"],
             "t_s": round((wd["switch_ns"] - w0) / 1e9, 3), "n": int(len(ln)),
             "p50_us": round(quantile(ln, 0.5) / 1e3, 1) if len(ln) else None,
             "p99_us": round(quantile(ln, 0.99) / 1e3, 1) if len(ln) else None,
             "events": wd["events"],
             "events_per_s": round(wd["events"] / wd["stats_s"], 1) if wd["stats_s"] else None,
             "enable": wd["enable"], "toggle_ms": round(wd["toggle_ms"], 2),
             "overrun": wd["overrun"], "dropped": wd["dropped"]}
        blocks.append(b)
    on = {b["pair"]: ln for b, ln in zip(blocks, lats) if b["mode"] == "on"}
    off = {b["pair"]: ln for b, ln in zip(blocks, lats) if b["mode"] == "off"}
    try:
        res = analyse(on, off, PS, args.boot, rng, args.tol, args.min_samples,
                      args.stall_factor)
    except ValueError as exc:
        print(f"events_p99_ab: {exc}", file=sys.stderr)
        return 2
    leaks = off_leaks(blocks)
    bad_state = [b for b in blocks if (b["enable"] == "0") != (b["mode"] == "off")]

    def med(key: str, mode: str) -> float | None:
        v = [b[key] for b in blocks if b["mode"] == mode and b[key] is not None]
        return round(float(np.median(v)), 4) if v else None

    on_eps = [b["events_per_s"] for b in blocks
              if b["mode"] == "on" and b["events_per_s"] is not None] or [float("nan")]
    toggles = [b["toggle_ms"] for b in blocks]
    ws = run["watch_summary"] or {}
    warnings = []
    if leaks:
        warnings.append(f"{len(leaks)} off block(s) still wrote events on CPU {probe_cpu} "
                        f"(max {max(b['events'] for b in leaks)}): the toggle did not hold")
    if bad_state:
        warnings.append(f"{len(bad_state)} block(s) whose events/enable did not match the mode")
    if len(res["kept"]) < 30:
        warnings.append(f"only {len(res['kept'])} pairs: the intervals over so few are too "
                        "narrow; take the verdict as indicative (use >= 120)")
    for m in ("on", "off"):
        a = res["aa"][m]["p99"]
        if a["median_pair"]["excludes_1"] or a["pooled"]["excludes_1"]:
            warnings.append(f"the A/A {m}-blocks P99 interval excludes 1: the intervals may "
                            "understate this run's noise")
    out = {
        "bench": "events_p99_ab", "args": vars(args), "seed": seed,
        "command": "sudo .venv/bin/python bench/events_p99_ab.py " + " ".join(sys.argv[1:]),
        "host": {"cpu_model": cpu_model(host), "kernel": os.uname().release,
                 "probe_cpu": probe_cpu, "housekeeping_cpus": hk,
                 "loadavg_start": load0, "loadavg_end": load1},
        "probe": run["info"].get("probe"), "rate_hz": args.rate, "sampler_hz": args.hz,
        "instance": run["instance"], "events_toggled": run["events"],
        "wall_s": round(wall, 1), "ring_lost": run["lost"], "pairs": args.pairs,
        "pairs_used": len(res["kept"]), "pairs_dropped": res["dropped"],
        "order": ["/".join(p) for p in order],
        "samples_per_block_median": {m: med("n", m) for m in ("on", "off")},
        "events_per_s_on_probe_cpu": {"median": float(np.median(on_eps)),
                                      "min": float(min(on_eps)), "max": float(max(on_eps))},
        "off_blocks_with_events": len(leaks),
        "off_events_total": int(sum(b["events"] for b in blocks if b["mode"] == "off")),
        "toggle_ms": {"median": float(np.median(toggles)), "max": float(max(toggles))},
        "median_block_us": {m: {k: med(k, m) for k in ("p50_us", "p99_us")} for m in ("on", "off")},
        "ab": res["ab"], "aa_control": res["aa"], "stalls": res["stalls"],
        "verdict_p99": res["ab"]["p99"]["median_pair"]["verdict"],
        "verdict_p99_pooled": res["ab"]["p99"]["pooled"]["verdict"],
        "watch": {"rc": run["watch_rc"], "spikes": ws.get("spikes"),
                  "sampler_cpu_share": (ws.get("sampler") or {}).get("cpu_share_of_one_cpu"),
                  "events": {k: (ws.get("events") or {}).get(k)
                             for k in ("active", "windows", "lost", "mean_read_us")}},
        "blocks": blocks, "warnings": warnings,
    }

    print(f"events on vs off (toggled in watch's instance) — {out['probe']} at {args.rate:g} Hz "
          f"on CPU {probe_cpu}; watch --sample-hz {args.hz:g} --trace {args.trace_on} on CPU "
          f"{','.join(map(str, hk))}; {out['host']['cpu_model']}, kernel {out['host']['kernel']}")
    print(f"{len(res['kept'])}/{args.pairs} pairs of {args.block_s:g} s blocks (first "
          f"{args.discard_s:g} s after each toggle dropped), median "
          f"{out['samples_per_block_median']['on']:.0f} / {out['samples_per_block_median']['off']:.0f} "
          f"samples a block on/off, ring lost {run['lost']}, loadavg {' '.join(load0)} → "
          f"{' '.join(load1)}, {wall:.0f} s")
    print(f"{len(run['events'])} events toggled; toggle write median {out['toggle_ms']['median']:.1f} ms "
          f"(max {out['toggle_ms']['max']:.1f}); events/s on CPU {probe_cpu} in on blocks: median "
          f"{out['events_per_s_on_probe_cpu']['median']:,.0f} (min {min(on_eps):,.0f}, max "
          f"{max(on_eps):,.0f}); off blocks: {out['off_events_total']} events in total")
    print()
    for p in PS:
        k = f"p{p * 100:g}"
        mp, po = res["ab"][k]["median_pair"], res["ab"][k]["pooled"]
        print(f"{k.upper()} on/off: median pair ratio {mp['median']:.3f}, sign-test "
              f"{(mp['level'] or 0) * 100:.1f} % CI {fmt_ci(mp['ci'])} → {mp['verdict']}; pooled "
              f"{po['a']:.1f} / {po['b']:.1f} µs = {po['ratio']:.3f}, bootstrap 95 % CI "
              f"{fmt_ci(po['ci'])} → {po['verdict']} (±{args.tol:g})")
    for m in ("on", "off"):
        a = res["aa"][m]["p99"]
        print(f"A/A {m}-blocks P99 ({res['aa'][m]['pairs']} pseudo-pairs): median pair "
              f"{a['median_pair']['median']:.3f} {fmt_ci(a['median_pair']['ci'])}, pooled "
              f"{a['pooled']['ratio']:.3f} {fmt_ci(a['pooled']['ci'])}")
    st = res["stalls"]
    print(f"stalled blocks (P99 > {st['factor']:g} × the median block P99, {st['threshold_us']:.0f} "
          f"µs): on {st['stalled_on']}, off {st['stalled_off']} (on only {st['on_only']}, off "
          f"only {st['off_only']}: sign test p = {st['sign_test_p']:.3g})")
    if st["quiet"]:
        for k, r in st["quiet"].items():
            print(f"quiet pairs ({r['n']}, neither block stalled) {k.upper()} on/off: median "
                  f"pair {r['median']:.3f}, sign-test CI {fmt_ci(r['ci'])} → {r['verdict']}")
    for wmsg in warnings:
        print(f"warning: {wmsg}")
    print(f"seed {seed}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if not leaks and not bad_state else 1


if __name__ == "__main__":
    sys.exit(main())
