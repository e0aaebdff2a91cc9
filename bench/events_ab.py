"""What kernel events cost in one run: `hftagent watch --trace on` against `--trace off`, in
alternating blocks over one probe that keeps running.

Issue #17's targets: sampler + events ≤ 1.5 % of one CPU at 100 Hz, and probe P99 with events
on within 2 % of off (a paired A/B with a CI, as bench/sampler_ab.py does). This bench

- starts one numpy probe worker on the last CPU at ``--rate`` (500 Hz) writing a latency
  ring, and keeps it running for the whole bench (no warm-up per block);
- runs ``--pairs`` pairs of `hftagent watch --ring RING --cpus <probe> --housekeeping <rest>
  --duration D --trace on|off --json`, the order inside each pair by a seeded coin flip; each
  run samples at ``--hz`` (100) with the default sampler (native where a compiler is found);
- keeps, per block, the probe samples that *started* inside the watch run's sampling time
  (its end is the process exit less ``--tail-s``; its start that less the summary's
  duration_s), less the first ``--discard-s`` (the sampler and the tracefs instance opening);
- reports per arm: the summary's sampler CPU share of one CPU (helper + drain for the native
  sampler), the CPU of the whole watch process (wait4 rusage, start-up included), the probe
  CPU's busy share from /proc/stat over the kept window (the kernel's per-event cost is
  charged on that CPU), and with events on the events a second on the probe CPU
  (tracefs per_cpu stats, the summary's ``events.rate_per_cpu``), the windows read, their
  mean read time (wall, the summary's) and their CPU (``Window.cpu_ns``, the reading
  thread's CPU time, summed by a wrapper of ``EventSource.window`` in the watch process):
  ``event_read_cpu_share`` is that CPU over the run, ``event_read_wall_share`` windows × the
  wall mean (what this bench reported before; on a loaded host it counts waiting as cost);
- the probe P99 (and P50) ratio on/off of pooled samples with a 95 % paired block bootstrap
  interval (bench/abstats.py), the verdict against ``--tol`` (0.02), and the A/A control.

Needs root and tracefs (``--trace mount`` style mounting is left to watch: pass
``--trace-on mount`` to mount it first).

    sudo .venv/bin/python bench/events_ab.py --json events_ab.json     # ~3 min (12 pairs)
    sudo .venv/bin/python bench/events_ab.py --pairs 2 --duration 2    # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.client import FIELDS, RingReader  # noqa: E402
from agent.watch.probe_worker import await_ready  # noqa: E402
from bench.abstats import aa_split, paired_bootstrap, quantile  # noqa: E402
from collectors.cpu import cpu_model  # noqa: E402
from collectors.host import Host  # noqa: E402

F = {n: i for i, n in enumerate(FIELDS)}
PS = (0.5, 0.99)


# The event reads' CPU: the thread CPU time of each EventSource.window call (what
# Window.cpu_ns holds; timed around the call here so that a tree without that field is
# measured the same way), summed in the watch process and written to stderr at exit. The
# summary's mean_read_us is wall time, which on a loaded host counts the time the reader
# waited to run (and a first window's wait for the kallsyms table) as if it were CPU.
READ_CPU_TAG = "events_ab read_cpu_ns "
_WRAP = ("import atexit, sys, time\n"
         "from agent.trace import tracefs as _t\n"
         "_acc = [0, 0, 0]\n"
         "_w = _t.EventSource.window\n"
         "def _window(self, *a, **k):\n"
         "    c, t = time.thread_time_ns(), time.perf_counter_ns()\n"
         "    win = _w(self, *a, **k)\n"
         "    _acc[0] += time.thread_time_ns() - c; _acc[1] += time.perf_counter_ns() - t\n"
         "    _acc[2] += 1\n"
         "    return win\n"
         "_t.EventSource.window = _window\n"
         f"atexit.register(lambda: print({READ_CPU_TAG!r} + ' '.join(map(str, _acc)), "
         "file=sys.stderr))\n")


def hftagent(read_cpu: bool = False) -> list[str]:
    """`hftagent` from this tree (agent.cli's entry point, run with the repository as the
    working directory), whatever is installed; ``read_cpu``: with the window reads' CPU
    time reported on stderr (READ_CPU_TAG)."""
    return [sys.executable, "-c", (_WRAP if read_cpu else "") +
            "import sys; sys.argv[0] = 'hftagent'; from agent.cli import main; main()"]


def read_cpu_of(stderr: str) -> tuple[int, int, int] | None:
    """(CPU ns, wall ns, windows) of the event reads from a watch run's stderr."""
    for ln in stderr.splitlines():
        if ln.startswith(READ_CPU_TAG):
            a, b, c = (int(x) for x in ln[len(READ_CPU_TAG):].split())
            return a, b, c
    return None


class CpuBusy:
    """The probe CPU's /proc/stat line every 50 ms: (monotonic ns, busy ticks, all ticks)."""

    def __init__(self, cpu: int) -> None:
        self.tag = f"cpu{cpu} "
        self.rows: list[tuple[int, int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[int, int, int] | None:
        with open("/proc/stat") as fh:
            for ln in fh:
                if ln.startswith(self.tag):
                    v = [int(x) for x in ln.split()[1:]]
                    idle = v[3] + v[4]  # idle + iowait
                    total = sum(v[:8])  # guest time is inside user already
                    return time.monotonic_ns(), total - idle, total
        return None

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            r = self._read()
            if r is not None:
                self.rows.append(r)

    def start(self) -> CpuBusy:
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(2)

    def share(self, t0: int, t1: int) -> float | None:
        a = [r for r in self.rows if t0 <= r[0] <= t1]
        if len(a) < 2 or a[-1][2] == a[0][2]:
            return None
        return (a[-1][1] - a[0][1]) / (a[-1][2] - a[0][2])


def run_watch(args, mode: str, ring: Path, probe_cpu: int, hk: list[int], log: Path) -> dict:
    cmd = [*hftagent(read_cpu=mode == "on"), "watch", "--ring", str(ring), "--cpus", str(probe_cpu),
           "--housekeeping", ",".join(map(str, hk)), "--duration", str(args.duration),
           "--sample-hz", str(args.hz), "--trace", args.trace_on if mode == "on" else "off",
           "--json", "--no-live", "--spike-log", str(log)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t_launch = time.monotonic_ns()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=REPO)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        t_exit = time.monotonic_ns()
        out.seek(0)
        err.seek(0)
        body, errtext = out.read().decode(), err.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"watch --trace {mode} exited {p.returncode}: "
                         f"{errtext.strip().splitlines()[-1:] or body[:200]}")
    summ = json.loads(body)
    return {"mode": mode, "t_launch_ns": t_launch, "t_exit_ns": t_exit, "summary": summ,
            "cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": (t_exit - t_launch) / 1e9,
            "stderr": "\n".join(ln for ln in errtext.strip().splitlines()
                                 if not ln.startswith(READ_CPU_TAG)),
            "read_cpu": read_cpu_of(errtext)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=12, help="on/off block pairs (12)")
    ap.add_argument("--duration", type=float, default=6.0, help="watch --duration, s (6)")
    ap.add_argument("--discard-s", type=float, default=0.5,
                    help="dropped at the start of each watch run's sampling, s (0.5)")
    ap.add_argument("--tail-s", type=float, default=0.3,
                    help="dropped before each watch exit (its stop path), s (0.3)")
    ap.add_argument("--rate", type=float, default=500.0, help="probe rate, Hz (500)")
    ap.add_argument("--hz", type=float, default=100.0, help="watch --sample-hz (100)")
    ap.add_argument("--trace-on", choices=("on", "mount"), default="on",
                    help="the --trace of the events arm (on; mount: mount tracefs first)")
    ap.add_argument("--boot", type=int, default=4000, help="bootstrap resamples (4000)")
    ap.add_argument("--tol", type=float, default=0.02, help="the target: |ratio - 1| (0.02)")
    ap.add_argument("--seed", type=int, help="block order and bootstrap (random if unset)")
    ap.add_argument("--min-samples", type=int, default=200,
                    help="drop a pair when either block kept fewer samples (200)")
    ap.add_argument("--json", help="write all figures here")
    args = ap.parse_args()
    if args.pairs < 2 or args.duration <= args.discard_s + args.tail_s:
        ap.error("need --pairs >= 2 and --duration > --discard-s + --tail-s")
    if os.geteuid() != 0:
        print("events_ab: needs root (tracefs)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    order = [("on", "off") if f else ("off", "on") for f in rng.random(args.pairs) < 0.5]

    host = Host()
    online = sorted(os.sched_getaffinity(0))
    probe_cpu, hk = online[-1], online[:-1] or online
    os.sched_setaffinity(0, hk)
    tmp = Path(tempfile.mkdtemp(prefix="hftagent-events-ab-"))
    ring = Path(f"/dev/shm/hftagent-events-ab-{os.getpid()}.ring")
    w = subprocess.Popen([sys.executable, "-m", "agent.watch.probe_worker", "--ring", str(ring),
                          "--rate", str(args.rate), "--cpus", str(probe_cpu), "--probe",
                          "numpy"], stdout=subprocess.PIPE, text=True)
    busy = CpuBusy(probe_cpu).start()
    runs: list[dict] = []
    t_start = time.time()
    try:
        info = await_ready(w.stdout)
        if not info.get("ready"):
            raise SystemExit(f"probe worker did not start: {info.get('error', info)}")
        reader = RingReader(ring)
        chunks = []
        for i, pair in enumerate(order):
            for mode in pair:
                r = run_watch(args, mode, ring, probe_cpu, hk, tmp / f"spikes-{i}-{mode}.jsonl")
                r["pair"] = i
                runs.append(r)
                chunks.append(reader.read())
                print(f"  pair {i + 1}/{args.pairs} {mode}: watch {r['wall_s']:.1f} s, "
                      f"sampler {r['summary']['sampler'].get('cpu_share_of_one_cpu')}",
                      file=sys.stderr, flush=True)
        time.sleep(0.05)
        chunks.append(reader.read())
        lost = reader.lost
    finally:
        busy.stop()
        w.terminate()
        w.wait()
        ring.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.time() - t_start
    x = np.concatenate(chunks)
    start = x[:, F["start_ns"]]
    lat = x[:, F["end_ns"]] - start
    o = np.argsort(start, kind="stable")
    start, lat = start[o], lat[o]

    blocks = []
    lats: dict[str, dict[int, np.ndarray]] = {"on": {}, "off": {}}
    for r in runs:
        s = r["summary"]
        t1 = r["t_exit_ns"] - int(args.tail_s * 1e9)
        t0 = t1 - int(s["duration_s"] * 1e9) + int(args.discard_s * 1e9)
        a, b = np.searchsorted(start, [t0, t1], "left")
        ln = lat[a:b]
        lats[r["mode"]][r["pair"]] = ln
        smp, ev = s.get("sampler", {}), s.get("events", {}) or {}
        dur = s["duration_s"] or float("nan")
        rc = r.get("read_cpu")  # (cpu ns, wall ns, windows) of the event reads
        blk = {"pair": r["pair"], "mode": r["mode"], "n": int(len(ln)),
               "kept_s": round((t1 - t0) / 1e9, 2),
               "p50_us": round(quantile(ln, 0.5) / 1e3, 1) if len(ln) else None,
               "p99_us": round(quantile(ln, 0.99) / 1e3, 1) if len(ln) else None,
               "watch_wall_s": round(r["wall_s"], 2), "watch_duration_s": s["duration_s"],
               "sampler_mode": smp.get("mode"),
               "sampler_cpu_share": smp.get("cpu_share_of_one_cpu"),
               "helper_cpu_share": smp.get("helper_cpu_share"),
               "drain_cpu_share": smp.get("drain_cpu_share"),
               "late_rounds": smp.get("late_rounds"), "rounds": smp.get("rounds"),
               "watch_process_cpu_share": round(r["cpu_s"] / r["wall_s"], 4),
               "probe_cpu_busy_share": busy.share(t0, t1),
               "spikes": s.get("spikes"), "attributed": s.get("attributed"),
               "events_active": bool(ev.get("active")),
               "events_per_s": (ev.get("rate_per_cpu") or {}).get(str(probe_cpu)),
               "event_windows": ev.get("windows"), "event_mean_read_us": ev.get("mean_read_us"),
               "events_lost": ev.get("lost"),
               "event_mean_read_cpu_us": round(rc[0] / 1e3 / rc[2], 1) if rc and rc[2] else None,
               # CPU: the reads' thread CPU time; wall: windows × the summary's mean_read_us
               "event_read_cpu_share": round(rc[0] / 1e9 / dur, 5) if rc else 0.0,
               "event_read_wall_share": round(ev.get("windows", 0) * ev.get("mean_read_us", 0)
                                              / 1e6 / dur, 5) if ev.get("windows") else 0.0}
        blocks.append(blk)
    on_arm = [b for b in blocks if b["mode"] == "on"]
    if not all(b["events_active"] for b in on_arm):
        print("events did not run in every --trace on block (see the watch summaries)",
              file=sys.stderr)
        return 2
    kept = [i for i in range(args.pairs)
            if min(len(lats["on"][i]), len(lats["off"][i])) >= args.min_samples]
    if len(kept) < 2:
        print(f"only {len(kept)} usable pairs", file=sys.stderr)
        return 2
    ab = paired_bootstrap([lats["on"][i] for i in kept], [lats["off"][i] for i in kept], PS,
                          args.boot, rng, tol=args.tol)
    aa = {}
    if len(kept) >= 4:
        for mode in ("on", "off"):
            a, b = aa_split([lats[mode][i] for i in kept], rng)
            aa[mode] = paired_bootstrap(a, b, PS, args.boot, rng, tol=args.tol)

    def med(key: str, mode: str) -> float | None:
        v = [b[key] for b in blocks if b["mode"] == mode and b[key] is not None]
        return round(float(np.median(v)), 5) if v else None

    arms = {m: {k: med(k, m) for k in ("sampler_cpu_share", "helper_cpu_share",
                                       "drain_cpu_share", "watch_process_cpu_share",
                                       "probe_cpu_busy_share", "event_read_cpu_share",
                                       "event_read_wall_share", "event_mean_read_cpu_us",
                                       "events_per_s", "event_mean_read_us", "event_windows",
                                       "spikes", "p99_us", "p50_us")}
            for m in ("on", "off")}
    on_total = (arms["on"]["sampler_cpu_share"] or 0) + (arms["on"]["event_read_cpu_share"] or 0)

    def us(d: dict) -> dict:
        return {k: round(v / 1e3, 1) if k in ("a", "b") else v for k, v in d.items()}

    result = {}
    for p in PS:
        k = f"p{p * 100:g}"
        r = us(ab[k])
        result[k] = {"on_us": r["a"], "off_us": r["b"],
                     **{x: r[x] for x in r if x not in ("a", "b")}}
    warnings = []
    if len(kept) < 30:
        warnings.append(f"only {len(kept)} pairs: the bootstrap interval over so few pairs is "
                        "too narrow; take the verdict as indicative (bench/sampler_ab.py uses "
                        "120)")
    if aa and any(aa[m]["p99"]["excludes_1"] for m in aa):
        warnings.append("the A/A P99 interval excludes 1: the intervals may understate this "
                        "run's noise")
    out = {"bench": "events_ab", "args": vars(args), "seed": seed,
           "command": "sudo .venv/bin/python bench/events_ab.py " + " ".join(sys.argv[1:]),
           "host": {"cpu_model": cpu_model(host), "kernel": os.uname().release,
                    "probe_cpu": probe_cpu, "housekeeping_cpus": hk},
           "probe": info.get("probe"), "rate_hz": args.rate, "sampler_hz": args.hz,
           "wall_s": round(wall, 1), "ring_lost": lost, "pairs": args.pairs,
           "pairs_used": len(kept), "order": ["/".join(p) for p in order],
           "samples": {"on": ab["n_a"], "off": ab["n_b"]},
           "arms_median_per_block": arms,
           "sampler_plus_event_reads_share_on": round(on_total, 5),
           "target_share_of_one_cpu": 0.015,
           **result, "verdict_p99": result["p99"]["verdict"],
           "aa_control": {m: {k: us(v) if isinstance(v, dict) else v for k, v in d.items()}
                          for m, d in aa.items()},
           "blocks": blocks, "warnings": warnings}

    print(f"events on vs off — {out['probe']} at {args.rate:g} Hz on CPU {probe_cpu}; watch "
          f"--sample-hz {args.hz:g} on CPU {','.join(map(str, hk))}; {out['host']['cpu_model']}, "
          f"kernel {out['host']['kernel']}")
    print(f"{len(kept)} pairs of watch --duration {args.duration:g} runs, {ab['n_a']} on / "
          f"{ab['n_b']} off samples, ring lost {lost}, {wall:.0f} s")
    print()
    print(f"{'median per block':34} {'on':>9} {'off':>9}")
    for k in ("sampler_cpu_share", "helper_cpu_share", "drain_cpu_share",
              "event_read_cpu_share", "event_read_wall_share", "watch_process_cpu_share",
              "probe_cpu_busy_share", "events_per_s", "event_windows", "event_mean_read_us",
              "event_mean_read_cpu_us", "spikes"):
        a, b = arms["on"][k], arms["off"][k]
        print(f"{k:34} {'-' if a is None else f'{a:9.4g}':>9} {'-' if b is None else f'{b:9.4g}':>9}")
    print(f"sampler + event reads with events on: {on_total * 100:.2f} % of one CPU "
          f"(target ≤ 1.5 %)")
    print()
    for p in PS:
        k = f"p{p * 100:g}"
        r = result[k]
        print(f"pooled {k.upper()} on/off: {r['on_us']:.1f} / {r['off_us']:.1f} µs = "
              f"{r['ratio']:.3f}, 95 % CI [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] → {r['verdict']} "
              f"(±{args.tol:g})")
    for m, d in aa.items():
        r = d["p99"]
        print(f"A/A {m}-blocks P99: {r['ratio']:.3f}, CI [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]")
    for wmsg in warnings:
        print(f"warning: {wmsg}")
    print(f"seed {seed}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
