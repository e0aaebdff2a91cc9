"""The watch loop: latency source → spike detection → attribution → JSONL log, flight
recorder, metrics, live view, summary.

One :class:`WatchSession` owns: the latency source (the built-in probe worker process on the
probe CPUs, or an external process's client ring), the :class:`~agent.watch.sampler.Sampler`
thread on the housekeeping CPUs, the :class:`~agent.watch.attribution.Attributor`, and the
outputs. The main loop runs every ``loop_s`` (50 ms) on a housekeeping CPU:

1. drain the latency ring (every record since the last loop);
2. mark spikes: latency over ``threshold_us`` or over ``k`` × the rolling P50 (after
   ``min_samples`` samples), and ask the sched collector for a task scan ("who ran");
3. attribute a spike once the sampler has rows past its end (and the scan covers it, or
   0.5 s passed), write its JSONL record (flushed), feed metrics;
4. flight recorder: a spike over ``flight_us`` dumps every ring's rows in
   [start − ``flight_window_s``, end + ``flight_window_s``] and the latency samples around it
   to ``flight_dir`` once the "after" part has been sampled;
5. source liveness: a probe or external process that dies ends the run with exit code 3, the
   spike log kept and closed; so does a latency ring that becomes unreadable (truncated
   under us: a clean error, never a SIGBUS, agent.client.RingReader).

Outputs are opened as a root-safe program must in a shared directory: the spike log's
directory must exist (never created), a symlink is followed only when it belongs to root or
to us (:func:`open_output`), a FIFO without a reader is an error rather than a hang, and a
write error (``/dev/full``, a full disk) ends the run with exit code 1 and one line.
Flight records are written under random temporary names (``O_EXCL|O_NOFOLLOW``) and renamed
into place; a flight record that cannot be written is a warning.

Watch's own probe ring is ``hftagent-watch-<pid>.ring`` in :func:`agent.client.ring_dir`
(``WatchConfig.ring_dir`` overrides it), created by the worker as
:class:`agent.client.LatencyRing` does and read only when it is ours (our euid, created by
the worker); what a killed watch left there is swept first
(:func:`agent.client.sweep_stale_rings`).

A requested stop (:meth:`WatchSession.request_stop`, which the CLI calls from its SIGTERM and
SIGINT handlers) ends the loop at its next turn: pending spikes are attributed, the spike log
is flushed and closed, the worker is stopped and :meth:`run` returns 0. The handler only sets
a flag while the loop runs (never an exception in the middle of a log write); during start-up
(TF import and warm-up can take seconds) it raises :class:`StopRequested` so a stop is not
delayed until the probe is ready.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import secrets
import stat
import subprocess
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from agent.client import (
    FIELDS,
    RingError,
    RingMissing,
    RingReader,
    default_ring_path,
    ring_dir,
    sweep_stale_rings,
)
from agent.errors import AgentError
from agent.watch.attribution import CAUSES, Attributor, Spike
from agent.watch.sampling.native.feed import Feed, NativeUnavailable
from agent.watch.ring import LatencyRing
from agent.watch.sampling.python import NativeSampler, Sampler
from collectors.host import Host

F = {name: i for i, name in enumerate(FIELDS)}
EXIT_SOURCE_DIED = 3
EXIT_OUTPUT_FAILED = 1  # the spike log could not be written


ATTR_STEP_BUDGET = 0.6  # share of loop_s one step may spend attributing spikes
BACKLOG_DROP_S = 2.0  # a spike waiting longer than this for attribution is logged unattributed
INHERIT_NS = 50_000_000  # over the rate limit: a spike this close to the last attributed one
                         # (five 100 Hz sampler rows) takes its cause


class StopRequested(Exception):
    """A stop (SIGTERM/SIGINT) arrived while the session was still starting."""


@dataclass
class WatchConfig:
    probe: str = "tf"  # tf | numpy | external
    model: str = "lstm"
    variant: str = "xla"
    rate_hz: float = 500.0  # 0: auto (the probe worker picks it after its warm-up)
    probe_cpus: list[int] = field(default_factory=list)
    housekeeping_cpus: list[int] = field(default_factory=list)
    pid: int | None = None
    ring_path: str | None = None
    sample_hz: float = 100.0
    threshold_us: float | None = None
    k_p50: float = 3.0
    min_samples: int = 200
    flight_us: float | None = None
    flight_dir: str = "hftagent-flight"
    flight_window_s: float = 1.0
    spike_log: str | None = None
    duration_s: float | None = None
    perf: bool = False
    baseline_s: float = 10.0
    warmup: int = 200
    loop_s: float = 0.05
    max_attributions_per_s: float = 200.0
    sampler: str = "auto"  # auto | native | python (agent/watch/feed.py)
    ring_dir: str | None = None  # where the probe's ring goes (default agent.client.ring_dir)


def cpu_plan(online: list[int], probe_cpus: list[int] | None,
             housekeeping: list[int] | None) -> tuple[list[int], list[int]]:
    """(probe CPUs, housekeeping CPUs). Default: the probe on the last online CPU, everything
    else housekeeping; on a 1-CPU box both share CPU 0 (said in the warnings)."""
    if not online:
        online = sorted(os.sched_getaffinity(0))
    probe = sorted(probe_cpus) if probe_cpus else [online[-1]]
    bad = [c for c in probe if c not in online]
    if bad:
        raise AgentError(f"probe CPU(s) {bad} (--cpus) not online (online: {online})")
    if housekeeping:
        hk = sorted(housekeeping)
        bad = [c for c in hk if c not in online]
        if bad:
            raise AgentError(f"housekeeping CPU(s) {bad} (--housekeeping) not online (online: "
                             f"{online})")
        if set(hk) & set(probe):
            raise AgentError(f"--housekeeping CPUs {hk} overlap the probe CPUs {probe}: the "
                             "sampler must never run on the probe's CPUs")
    else:
        hk = [c for c in online if c not in probe] or list(probe)
    return probe, hk


class LatencyHistogram:
    """Log-bucketed latency counts (1 % wide buckets from 1 µs to ~100 s): bounded memory for
    a days-long run; percentiles within 1 %."""

    BASE = 1.01
    LO_NS = 1000.0

    def __init__(self) -> None:
        self.n_buckets = int(math.log(1e11 / self.LO_NS) / math.log(self.BASE)) + 2
        self.counts = np.zeros(self.n_buckets, dtype=np.int64)
        self.total = 0
        self.max_ns = 0

    def add(self, lat_ns: np.ndarray) -> None:
        if not len(lat_ns):
            return
        idx = np.floor(np.log(np.maximum(lat_ns, self.LO_NS) / self.LO_NS)
                       / math.log(self.BASE)).astype(np.int64) + 1
        idx = np.clip(idx, 0, self.n_buckets - 1)
        np.add.at(self.counts, idx, 1)
        self.total += len(lat_ns)
        self.max_ns = max(self.max_ns, int(lat_ns.max()))

    def quantile(self, q: float) -> float | None:
        if not self.total:
            return None
        rank = max(1, math.ceil(q * self.total))
        i = int(np.searchsorted(np.cumsum(self.counts), rank))
        # the bucket's upper edge (within 1 % above the true value), never above the maximum
        return min(self.LO_NS * self.BASE ** i, float(self.max_ns))


def _iso(wall_ns: int) -> str:
    return datetime.fromtimestamp(wall_ns / 1e9, tz=UTC).isoformat(
        timespec="microseconds")


class WatchSession:
    def __init__(self, cfg: WatchConfig, host: Host | None = None, *, metrics=None,
                 view=None, collectors: list | None = None) -> None:
        self.cfg = cfg
        self.host = host or Host()
        self.metrics = metrics
        self.view = view
        self._extra_collectors = collectors
        self.proc: subprocess.Popen | None = None
        self.reader: RingReader | None = None
        self.sampler: Sampler | None = None
        self.sampler_note: str | None = None  # why the Python sampler runs (auto fallback)
        self.sched = None
        self.irq = None
        self.attributor: Attributor | None = None
        self.lat = LatencyRing(20000)
        self.hist = LatencyHistogram()
        self.samples = 0
        self.spikes = 0
        self.attributed = 0
        self.not_attributed = 0
        self.cause_counts: Counter[str] = Counter()
        self.cause_details: dict[str, Counter[str]] = {}
        self.last_spikes: deque[dict] = deque(maxlen=8)
        self.pending: list[tuple[Spike, int]] = []  # (spike, detected at monotonic ns)
        self.flight_pending: list[tuple[Spike, dict]] = []
        self.flight_files: list[str] = []
        self.attr_delays_ms: list[float] = []
        self.source_error: str | None = None
        self.warnings: list[str] = []
        self.probe_info: dict = {}
        self._log = None
        self._recent_lat = deque(maxlen=2000)
        self._prev_end: dict[int, tuple[int, int, bool]] = {}  # tid → (seq, end_ns, spike)
        self._recs: dict[int, tuple[Spike, dict]] = {}  # seq → (spike, record), recent
        self._p50_ns = 0
        self._wall_off = time.time_ns() - time.monotonic_ns()
        self._attr_budget = max(1.0, 0.1 * cfg.max_attributions_per_s)
        self._attr_budget_t = time.monotonic()
        self.started_ns = 0
        self.ended_ns = 0
        self.stopped_by: str | None = None
        self._looping = False
        self._own_ring: str | None = None
        self.output_error: str | None = None
        self._flight_dfd = -1

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask the loop to end cleanly (safe from a signal handler: sets a flag). While the
        session is still starting, raises :class:`StopRequested` instead, which :meth:`run`
        turns into the same clean stop."""
        if self.stopped_by is None:
            self.stopped_by = reason
        if not self._looping:
            raise StopRequested(reason)

    # -- set-up ------------------------------------------------------------------------------
    def open_outputs(self) -> None:
        """Open the spike log and the flight directory (:func:`open_output`); the CLI calls
        it before anything else starts so a bad path is refused first; :meth:`start` calls
        it too (a no-op when done)."""
        cfg = self.cfg
        if cfg.spike_log is not None and self._log is None:
            self._log = open_output(cfg.spike_log, "--spike-log")
        if cfg.flight_us and self._flight_dfd < 0:
            try:
                self._flight_dfd = open_output_dir(cfg.flight_dir, "--flight-dir")
            except BaseException:
                self.close_outputs()
                raise

    def close_outputs(self) -> None:
        if self._log is not None:
            os.close(self._log)
            self._log = None
        if self._flight_dfd >= 0:
            os.close(self._flight_dfd)
            self._flight_dfd = -1

    def _start_probe(self) -> None:
        cfg = self.cfg
        d = Path(cfg.ring_dir) if cfg.ring_dir else ring_dir()
        swept = sweep_stale_rings(d)  # what a killed watch (SIGKILL) left behind
        if swept:
            self.warnings.append(f"removed {len(swept)} ring file(s) left in {d} by a watch "
                                 "that is gone: " + ", ".join(sorted(swept)[:4]))
        path = str(d / f"hftagent-watch-{os.getpid()}.ring")
        self._own_ring = path  # the worker creates it; we remove it when we stop the worker
        cmd = [sys.executable, "-m", "agent.watch.probe_worker", "--ring", path,
               "--rate", str(cfg.rate_hz), "--cpus", ",".join(map(str, cfg.probe_cpus)),
               "--probe", cfg.probe, "--model", cfg.model, "--variant", cfg.variant,
               "--warmup", str(cfg.warmup)]
        # Own session: a terminal's Ctrl-C (SIGINT to the foreground group) reaches only
        # watch, which then stops the worker itself after the final drain; otherwise the
        # worker could exit first and the stop would look like a dead probe (exit 3).
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = self.proc.stdout.readline()  # blocks through TF import + warm-up
        try:
            msg = json.loads(line) if line else {}
        except json.JSONDecodeError:
            msg = {}
        if not msg.get("ready"):
            err = msg.get("error")
            if not err:
                self.proc.wait(timeout=5)
                tail = (self.proc.stderr.read() or "").strip().splitlines()[-3:]
                err = f"probe worker exited ({self.proc.returncode}): {' | '.join(tail)}"
            self._kill_probe()
            raise AgentError(err)
        self.probe_info = msg
        self.cfg.pid = int(msg["pid"])
        self.cfg.rate_hz = float(msg.get("rate_hz") or self.cfg.rate_hz)  # --rate auto: chosen
        try:
            self.reader = RingReader(path, expect_uid=os.geteuid(), expect_pid=self.cfg.pid)
        except RingError as exc:
            self._kill_probe()
            raise AgentError(str(exc)) from None

    def _attach_external(self) -> None:
        cfg = self.cfg
        path = Path(cfg.ring_path) if cfg.ring_path else default_ring_path(cfg.pid)
        # --pid's default ring must be that process's (a stale ring of a dead process that
        # had the pid, or one planted under its name, is refused); --ring names its own.
        expect_pid = cfg.pid if not cfg.ring_path else None
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.reader = RingReader(path, expect_pid=expect_pid)
                break
            except RingMissing as exc:  # not created yet: wait a little for it
                if time.monotonic() > deadline:
                    raise AgentError(f"{exc} (is the process using agent.client, and is "
                                     "HFTAGENT_RING the same path?)") from None
                time.sleep(0.1)
            except RingError as exc:  # a ring that is there but wrong: at once
                raise AgentError(str(exc)) from None
        if cfg.pid is None:
            cfg.pid = self.reader.creator_pid
        self.probe_info = {"pid": cfg.pid, "probe": f"external process {cfg.pid} ({path})"}
        if not cfg.probe_cpus:
            try:
                cfg.probe_cpus = sorted(os.sched_getaffinity(cfg.pid))
            except OSError:
                pass

    def _native_feed(self) -> Feed | None:
        """The native reader's feed (``--sampler auto|native``), or None: ``--sampler
        python``, or auto where it cannot run (no C compiler, no shared memory; the reason
        goes to the summary). ``--sampler native`` where it cannot run is an error."""
        if self.cfg.sampler == "python":
            return None
        try:
            return Feed(int(1e9 / self.cfg.sample_hz))
        except NativeUnavailable as exc:
            if self.cfg.sampler == "native":
                raise AgentError(str(exc)) from None
            self.sampler_note = f"python (native sampler unavailable: {exc})"
            return None

    def _collectors(self, host: Host | None = None) -> list:
        from collectors.cpu import CpuCollector
        from collectors.irq import IrqCollector, SoftirqCollector
        from collectors.memory import MemoryCollector
        from collectors.numa import NumaCollector
        from collectors.pcie import PcieCollector
        from collectors.sched import SchedCollector
        cpus = self.cfg.probe_cpus
        host = host or self.host
        # The built-in probes time each call with its own run-queue delay, switches and
        # faults (in-process evidence), so their threads' schedstat at 100 Hz would only
        # repeat it: 20 Hz there (each cold /proc read after a wake-up costs 30-50 µs on a
        # VM). An external process's records carry none: every round.
        self.sched = SchedCollector(host, [self.cfg.pid], cpus,
                                    period_s=0.0 if self.cfg.probe == "external" else 0.05)
        self.irq = IrqCollector(host, cpus)
        cands = [CpuCollector(host, cpus), self.sched, self.irq,
                 SoftirqCollector(host, cpus), MemoryCollector(host),
                 NumaCollector(host, cpus), PcieCollector(host)]
        if self.cfg.perf:
            from collectors.perf import PerfCollector
            cands.append(PerfCollector(self.cfg.pid))
        cands.extend(_gpu_collectors(self.host, [self.cfg.pid]))
        cands.extend(self._extra_collectors or [])
        out = []
        self.unavailable: dict[str, str] = {}
        for c in cands:
            try:
                a = c.available()
            except Exception as exc:  # noqa: BLE001 - an adapter bug is "unavailable"
                a = None
                self.unavailable[c.name] = f"error: {type(exc).__name__}: {exc}"
            if a is not None and a.ok:
                out.append(c)
            elif a is not None:
                self.unavailable[c.name] = a.reason or "unavailable"
                try:
                    c.close()
                except Exception:  # noqa: BLE001
                    pass
        return out

    def start(self) -> None:
        cfg = self.cfg
        self.open_outputs()
        try:
            os.sched_setaffinity(0, cfg.housekeeping_cpus)
        except OSError as exc:
            self.warnings.append(f"cannot pin watch to CPUs {cfg.housekeeping_cpus}: "
                                 f"{exc.strerror}")
        if set(cfg.housekeeping_cpus) & set(cfg.probe_cpus):
            self.warnings.append("one CPU only: the sampler shares the probe's CPU")
        if cfg.probe == "external":
            self._attach_external()
        else:
            self._start_probe()
        feed = self._native_feed()
        try:
            collectors = self._collectors(self.host.with_hot_factory(feed.open) if feed else None)
            on_result = self.metrics.set_collector_result if self.metrics is not None else None
            kw = {"capacity_s": max(30.0, cfg.baseline_s + 2 * cfg.flight_window_s + 5),
                  "on_result": on_result}
            if feed is not None:
                self.sampler = NativeSampler(collectors, feed, cfg.sample_hz,
                                             cfg.housekeeping_cpus, **kw)
                try:
                    feed.start(cfg.housekeeping_cpus)
                except NativeUnavailable as exc:
                    feed.close()  # the collectors' files read live from here on
                    if cfg.sampler == "native":
                        raise AgentError(str(exc)) from None
                    self.sampler_note = f"python (native sampler unavailable: {exc})"
                    self.sampler = None
        except BaseException:
            # a stop or an error while starting: no helper and no shared file left behind
            if feed is not None:
                feed.close()
            raise
        if self.sampler is None:
            self.sampler = Sampler(collectors, cfg.sample_hz, cfg.housekeeping_cpus, **kw)
        rings = {e.ring.name: e.ring for e in self.sampler.entries}
        gpu = next((c for c in collectors if hasattr(c, "causes") and
                    getattr(c, "name", "") == "gpu"), None)
        self.attributor = Attributor(rings, cfg.probe_cpus, who_ran=self.sched.who_ran,
                                     others_share=self.sched.others_share,
                                     irq_desc=lambda: self.irq.descriptions,
                                     gpu_detail=gpu.causes if gpu is not None else None,
                                     baseline_s=cfg.baseline_s)
        self.sampler.start()  # a NativeSampler's helper is already running
        self.started_ns = time.monotonic_ns()

    # -- the loop ----------------------------------------------------------------------------
    def step(self) -> None:
        recs = self.reader.read()
        now = time.monotonic_ns()
        if len(recs):
            self._ingest(recs)
        self._attribute_ready(now)
        self._flight_ready()
        if self.metrics is not None:
            self.metrics.set_gauges(self)

    def _ingest(self, recs: np.ndarray) -> None:
        lat = recs[:, F["end_ns"]] - recs[:, F["start_ns"]]
        self.samples += len(recs)
        self.hist.add(lat)
        self.lat.extend(recs)
        self.sched.watch_tids(np.unique(recs[:, F["tid"]]).tolist())
        if self.metrics is not None:
            self.metrics.observe_many(lat)
        cfg = self.cfg
        thr = cfg.threshold_us * 1e3 if cfg.threshold_us else None
        prev_end = self._prev_end
        track = cfg.probe != "external"  # (a thread-per-request server: no growing map)
        for i in range(len(recs)):
            li = int(lat[i])
            p50 = self._p50_ns
            r = recs[i]
            tid, start, end = int(r[F["tid"]]), int(r[F["start_ns"]]), int(r[F["end_ns"]])
            over_abs = thr is not None and li > thr
            over_rel = p50 > 0 and li > cfg.k_p50 * p50 and len(self._recent_lat) >= \
                cfg.min_samples
            spike = over_abs or over_rel
            if spike:
                # Open loop: a sample whose intended start fell inside the previous slow
                # sample of its thread waited for it — its cause is that sample's.
                prev = prev_end.get(tid) if track else None
                # (external records may nest or overlap — concurrent requests, asyncio —
                # without one waiting for the other: no queueing inferred there)
                queued = prev[0] if prev is not None and prev[2] and start < prev[1] and \
                    prev[1] - start >= 0.5 * (li - p50) else -1
                sp = Spike(int(r[F["seq"]]), start, end, int(r[F["pid"]]), tid, p50,
                           *(int(r[F[k]]) for k in ("nivcsw", "nvcsw", "minflt", "majflt",
                                                    "cpu_ns", "rq_delay_ns", "cpu_start",
                                                    "cpu_end")), queued_behind=queued)
                self.spikes += 1
                self.pending.append((sp, time.monotonic_ns()))
                self.sched.request_scan()
            else:
                self._recent_lat.append(li)
            if track:
                prev_end[tid] = (int(r[F["seq"]]), end, spike)
        if len(self._recent_lat) >= 20:
            self._p50_ns = int(np.median(np.fromiter(self._recent_lat, dtype=np.int64)))

    def _attribute_ready(self, now: int) -> None:
        if not self.pending:
            return
        latest = self.sampler.covered_ns()
        scan_ns = self.sched.latest_scan_ns()
        pending_seqs = {sp.seq for sp, _ in self.pending}
        ready, followers, keep = [], [], []
        for sp, t_det in self.pending:
            # A sample queued behind a slow one takes that one's cause (no rows of its own
            # needed, no attribution spent): once the leader is logged — now, or later in
            # this step when the leader is in this batch.
            if sp.queued_behind >= 0 and (sp.queued_behind in self._recs
                                          or sp.queued_behind in pending_seqs):
                followers.append((sp, t_det))
                continue
            waited = now - t_det
            rows_ready = latest >= sp.end_ns + self.attributor.slack_ns
            scan_ready = scan_ns >= sp.end_ns
            if not (rows_ready and (scan_ready or waited > 500_000_000)) and waited < 900_000_000:
                keep.append((sp, t_det))
            else:
                ready.append((sp, t_det))
        if ready:
            keep = self._attribute_batch(ready, now) + keep
        if keep:
            self.sampler.poke()  # spikes wait for rows (the native sampler replays sooner)
        waiting = {x[0].seq for x in keep}
        for sp, t_det in followers:
            lead = self._recs.get(sp.queued_behind)
            if lead is not None:
                self._inherit(sp, lead, "queued")
            elif sp.queued_behind in waiting:
                keep.append((sp, t_det))  # its leader waits for its rows: so does it
                waiting.add(sp.seq)  # (and a sample queued behind this one, after it)
            else:
                # its leader was logged unattributed: this one is attributed on its own
                keep.append((replace(sp, queued_behind=-1), t_det))
        self.pending = sorted(keep, key=lambda x: x[0].seq)

    def _attribute_batch(self, ready: list, now: int) -> list:
        """Attribute the ready spikes (oldest first) within the rate limit and the step's
        time budget; return those left for the next step."""
        recent = self.lat.last(500)[:, [F["minflt"], F["majflt"], F["nivcsw"], F["nvcsw"]]]
        # The rate limit is a token bucket refilled continuously (at most 0.1 s banked).
        # Over it, the step's tokens are spread evenly over its ready spikes (every
        # stride-th is attributed) and the ones between inherit the cause of the attributed
        # spike a few ms before them — a storm stays named throughout instead of its first
        # spikes taking every token and the later ones being too far from any.
        t = time.monotonic()
        rate = self.cfg.max_attributions_per_s
        self._attr_budget = min(max(1.0, 0.1 * rate),
                                self._attr_budget + (t - self._attr_budget_t) * rate)
        self._attr_budget_t = t
        tokens = int(self._attr_budget)
        stride = 1 if len(ready) <= tokens else -(-len(ready) // max(tokens, 1))
        # One step attributes for at most ATTR_STEP_BUDGET of the loop period (checked
        # before each attribution, so one may overrun it), so a spike storm cannot stretch
        # the loop (the run's --duration, the live view, the metrics); what is left waits
        # for the next step, and a spike still waiting after BACKLOG_DROP_S is logged "not
        # attributed" rather than years late.
        step_end = time.monotonic_ns() + int(self.cfg.loop_s * ATTR_STEP_BUDGET * 1e9)
        for n, (sp, _t) in enumerate(ready):
            if time.monotonic_ns() > step_end:
                rest = ready[n:]
                for osp, _ in (x for x in rest if now - x[1] > BACKLOG_DROP_S * 1e9):
                    self._not_attributed(osp, "attribution backlog (spike storm)")
                return [x for x in rest if now - x[1] <= BACKLOG_DROP_S * 1e9]
            if n % stride == 0 and self._attr_budget >= 1:
                self._attr_budget -= 1
                try:
                    self._attribute_one(sp, recent)
                except Exception as exc:  # noqa: BLE001 - one spike's failure is logged
                    self._not_attributed(sp, f"attribution error: {type(exc).__name__}: {exc}")
            else:
                self._inherit_or_drop(sp)
        return []

    def _attribute_one(self, sp: Spike, recent: np.ndarray) -> None:
        with self.sampler.lock:
            a = self.attributor.attribute(sp, recent)
        rec = self._log_spike(sp, a.to_dict())
        self._last_attr = (sp, rec)
        if a.causes and a.cause != "unexplained":
            self.cause_details.setdefault(a.cause, Counter())[_short(a.causes[0].detail)] += 1

    def _head(self, sp: Spike) -> dict:
        """The fields every spike record starts with."""
        return {"time": _iso(sp.end_ns + self._wall_off), "seq": sp.seq,
                "latency_us": round(sp.latency_ns / 1e3, 1)}

    def _log_spike(self, sp: Spike, body: dict) -> dict:
        """Write a spike record with a cause (``body``: cause, causes, evidence...) and do
        the bookkeeping every named spike gets: counts, delays, metrics, live view, the
        flight recorder, the by-seq memory queued samples look their leader up in."""
        delay_ms = (time.monotonic_ns() - sp.end_ns) / 1e6
        rec = {**self._head(sp), "p50_us": round(sp.p50_ns / 1e3, 1), "pid": sp.pid,
               "tid": sp.tid, **body, "attributed_after_ms": round(delay_ms, 1)}
        self._write(rec)
        self.attributed += 1
        self.attr_delays_ms.append(delay_ms)
        if len(self.attr_delays_ms) > 10000:
            del self.attr_delays_ms[:5000]
        self.cause_counts[rec["cause"]] += 1
        self._remember(sp, rec)
        self.last_spikes.append(rec)
        if self.metrics is not None:
            self.metrics.spike(rec["cause"])
        if self.cfg.flight_us and sp.latency_ns >= self.cfg.flight_us * 1e3:
            self.flight_pending.append((sp, rec))
        return rec

    def _inherit_or_drop(self, sp: Spike) -> None:
        """Over the attribution rate limit (a spike storm): a spike within INHERIT_NS of the
        last attributed one shares its sampler rows, so it takes that spike's cause; any
        other is logged not attributed."""
        last = self._last_attr
        # the gap between the two spikes' intervals (0 when they overlap), either order
        gap = max(sp.start_ns - last[0].end_ns, last[0].start_ns - sp.end_ns, 0) \
            if last is not None else None
        if gap is None or gap > INHERIT_NS:
            self._not_attributed(sp, "attribution rate limit")
            return
        self._inherit(sp, last, "rate", gap)

    def _inherit(self, sp: Spike, lead: tuple, why: str, gap: int = 0) -> None:
        """Log ``sp`` with the cause of ``lead`` = (spike, record), marked ``inherited_from``,
        with its own in-process evidence. ``why``: "queued" — it waited for that slow sample
        (open loop: its intended start fell inside it) —, or "rate" — over the attribution
        rate limit, ``gap`` ns from it (the same sampler rows)."""
        lsp, lrec = lead
        note = (f"queued behind spike {lsp.seq}: started "
                f"{(lsp.end_ns - sp.start_ns) / 1e6:.1f} ms late" if why == "queued" else
                f"attribution rate limit: the cause of spike {lsp.seq}, {gap / 1e6:.1f} ms apart")
        # the same record shape as an attributed spike: the host evidence is that of the
        # spike it inherits from (its rows), the in-process evidence its own
        self._log_spike(sp, {"cause": lrec["cause"], "unexplained": lrec.get("unexplained"),
                             "causes": lrec.get("causes", []), "inherited_from": lsp.seq,
                             "note": note, "in_process": sp.in_process()})
        if why == "queued":
            self.queued += 1
        else:
            self.inherited += 1

    def _remember(self, sp: Spike, rec: dict) -> None:
        """Keep the last 4096 logged spikes by seq (a queued one looks up its leader)."""
        self._recs[sp.seq] = (sp, rec)
        if len(self._recs) > 4096:
            for k in list(self._recs)[:1024]:
                del self._recs[k]

    _last_attr: tuple | None = None
    inherited = 0
    queued = 0

    def _not_attributed(self, sp: Spike, why: str) -> None:
        self.not_attributed += 1
        self._write({**self._head(sp), "cause": None, "note": f"not attributed: {why}"})

    def _flight_ready(self) -> None:
        if not self.flight_pending:
            return
        latest = self.sampler.latest_ns()
        w = int(self.cfg.flight_window_s * 1e9)
        keep = []
        for sp, rec in self.flight_pending:
            if latest < sp.end_ns + w and self.source_error is None and not self._stopping:
                keep.append((sp, rec))
                self.sampler.poke()
                continue
            self._dump_flight(sp, rec, w)
        self.flight_pending = keep

    _stopping = False

    def _dump_flight(self, sp: Spike, rec: dict, w: int) -> None:
        d = Path(self.cfg.flight_dir)
        if self._flight_dfd < 0:  # (a session driven without start(): library use)
            self._flight_dfd = open_output_dir(self.cfg.flight_dir, "--flight-dir")
        t0, t1 = sp.start_ns - w, sp.end_ns + w
        with self.sampler.lock:
            rings = {r.name: r.dump(t0, t1) for r in self.sampler.rings()}
        lat = self.lat.last(self.lat.capacity)
        sel = (lat[:, F["end_ns"]] >= t0) & (lat[:, F["start_ns"]] <= t1)
        samples = {k: lat[sel, i].tolist() for k, i in F.items() if k not in ("seq2",)}
        out = {"spike": rec, "window_ns": [t0, t1], "wall_offset_ns": self._wall_off,
               "samples": samples, "collectors": rings}
        path = d / f"spike-{sp.seq}-{sp.end_ns}.json"
        try:
            _write_new(self._flight_dfd, path.name, json.dumps(out).encode())
        except OSError as exc:
            msg = f"flight records not written to {d}: {exc.strerror}"  # once per cause
            if msg not in self.warnings:
                self.warnings.append(msg)
            return
        self.flight_files.append(str(path))
        rec_note = {"flight_record": str(path), "seq": sp.seq}
        self._write({"time": rec["time"], **rec_note})

    def _write(self, rec: dict) -> None:
        """Append one JSONL record to the spike log (one ``write``: appended whole). A write
        error closes the log and ends the run (:attr:`output_error`, exit code 1): a spike
        log that silently stops growing would look like a quiet host."""
        if self._log is None:
            return
        data = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                n = os.write(self._log, data)
                data = data[n:]
        except OSError as exc:
            self.output_error = f"cannot write the spike log {self.cfg.spike_log}: " \
                f"{exc.strerror}"
            os.close(self._log)
            self._log = None

    def check_source(self) -> str | None:
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                tail = ""
                try:
                    tail = " | ".join((self.proc.stderr.read() or "").strip().splitlines()[-2:])
                except (OSError, ValueError):
                    pass
                return f"probe worker (pid {self.proc.pid}) exited with code {rc}" + \
                    (f": {tail}" if tail else "")
        elif self.cfg.pid is not None:
            try:
                os.kill(self.cfg.pid, 0)
            except ProcessLookupError:
                return f"external process {self.cfg.pid} exited"
            except PermissionError:
                pass
            # A zombie still answers kill(0): look at its state.
            st = self.host.read(self.host.proc(self.cfg.pid, "stat")).value
            if st and st[st.rfind(")") + 2:st.rfind(")") + 3] in ("Z", "X"):
                return f"external process {self.cfg.pid} exited"
        return None

    def run(self) -> int:
        """Start, loop until ``duration_s``, a requested stop or the source dying; stop.
        Returns the exit code: 0 (duration reached or stop requested) or 3 (source died)."""
        cfg = self.cfg
        rc = 0
        try:
            self.start()
            end = time.monotonic() + cfg.duration_s if cfg.duration_s else float("inf")
            self._looping = True
            if self.stopped_by is not None:  # a stop that arrived between start() and here
                return 0
            while time.monotonic() < end and self.stopped_by is None:
                t = time.monotonic()
                try:
                    self.step()
                except RingError as exc:  # truncated or unreadable under us
                    self.source_error = str(exc)
                    if self.metrics is not None:
                        self.metrics.down()
                    rc = EXIT_SOURCE_DIED
                    break
                if self.output_error is not None:
                    rc = EXIT_OUTPUT_FAILED
                    break
                err = self.check_source()
                if err and self.stopped_by is None:
                    try:
                        self.step()  # drain what it wrote before dying
                    except RingError:
                        pass
                    self.source_error = err
                    if self.metrics is not None:
                        self.metrics.down()  # probe_up 0 at once, before the final drain
                    rc = EXIT_SOURCE_DIED
                    break
                if self.view is not None:
                    self.view.update(self)
                time.sleep(max(0.0, cfg.loop_s - (time.monotonic() - t)))
        except StopRequested:
            rc = 0
        except KeyboardInterrupt:  # no handler installed (library use): same clean stop
            self.stopped_by = self.stopped_by or "SIGINT"
            rc = 0
        finally:
            self._looping = True  # a second signal during the drain only sets the flag
            self.stop()
        if self.output_error is not None and rc == 0:  # (a write of the final drain)
            rc = EXIT_OUTPUT_FAILED
        return rc

    def stop(self) -> None:
        self._stopping = True
        # Attribute what is still pending (the sampler still has its rows).
        if self.sampler is not None and self.reader is not None:
            try:
                self.step()
                deadline = time.monotonic() + 1.0
                while self.pending and time.monotonic() < deadline:
                    time.sleep(0.05)
                    self._attribute_ready(time.monotonic_ns())
                for sp, _ in self.pending:
                    self._not_attributed(sp, "the run ended first")
                self.pending = []
                self._flight_ready()
            except Exception as exc:  # noqa: BLE001 - stopping must finish
                self.warnings.append(f"final drain failed: {exc}")
        self.ended_ns = time.monotonic_ns()
        if self.metrics is not None:
            self.metrics.down()
        if self.sampler is not None:
            self.sampler.stop()
        self._kill_probe()
        if self.reader is not None:
            self.reader.close()
        self.close_outputs()

    def _kill_probe(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                # a worker in its loop ends its call and closes the ring; one still in its
                # TF import or warm-up may not look at the signal for seconds: killed
                self.proc.wait(timeout=5 if self.probe_info else 1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        path = self._own_ring or (self.reader.path if self.reader is not None else None)
        if path is None:
            return
        try:
            os.unlink(path)
        except OSError:
            pass

    # -- reporting ---------------------------------------------------------------------------
    def rolling(self) -> dict:
        last = self.lat.last(10000)
        if not len(last):
            return {}
        lat = np.sort(last[:, F["end_ns"]] - last[:, F["start_ns"]])
        n = len(lat)

        def q(p):
            return float(lat[min(n - 1, max(0, math.ceil(p * n) - 1))]) / 1e3
        out = {"n": n, "p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999)}
        thr = self.cfg.threshold_us * 1e3 if self.cfg.threshold_us else \
            self.cfg.k_p50 * self._p50_ns
        out["jitter_rate"] = float((lat > thr).mean()) if thr else 0.0
        return out

    def _invalid_warning(self) -> list[str]:
        n = self.reader.invalid if self.reader is not None else 0
        if not n:
            return []
        return [f"{n} record(s) of the latency ring {self.reader.path} failed validation "
                "(impossible timestamps, pids, CPUs or evidence, or a corrupt slot): dropped, "
                "not counted in the percentiles"]

    def _load_warning(self, h: LatencyHistogram) -> list[str]:
        """A built-in probe that keeps its CPU more than half busy measures the queue it
        builds itself (response times from the intended start) more than the host."""
        p50 = h.quantile(0.5)
        if self.cfg.probe == "external" or not p50:
            return []
        busy = p50 / 1e9 * self.cfg.rate_hz
        if busy <= 0.5:
            return []
        from agent.watch.probe_worker import auto_rate
        return [f"the probe keeps CPU {self.cfg.probe_cpus} {100 * busy:.0f} % busy "
                f"(P50 {p50 / 1e3:.0f} µs × {self.cfg.rate_hz:g}/s): any disturbance queues "
                f"the next calls; a --rate of {auto_rate(int(p50)):g} or less "
                "(or --rate auto) leaves it headroom"]

    def summary(self) -> dict:
        h = self.hist
        dur = ((self.ended_ns or time.monotonic_ns()) - self.started_ns) / 1e9 \
            if self.started_ns else 0.0
        col = {}
        if self.sampler is not None:
            for name, st in self.sampler.stats.per_collector.items():
                col[name] = st.to_dict()
            s = self.sampler.stats
            smp = self.sampler
            sampler = {"mode": smp.mode, "rounds": s.rounds, "late_rounds": s.late_rounds,
                       "cpu_share_of_one_cpu": round(s.cpu_ns / 1e9 / dur, 4) if dur else None,
                       "cpu_us_per_round": round(s.cpu_ns / s.rounds / 1e3, 1) if s.rounds else None,
                       "mean_round_us": round(s.busy_ns / s.rounds / 1e3, 1) if s.rounds else None,
                       "pinned_to": self.cfg.housekeeping_cpus, "pin_error": smp.pin_error,
                       "note": self.sampler_note}
            if isinstance(smp, NativeSampler):
                fs = smp.feed.stats()
                sampler.update({
                    "note": smp.native_error,
                    "helper_pid": fs["pid"], "ring_overruns": fs["overruns"],
                    "helper_cpu_share": round(fs["cpu_ns"] / 1e9 / dur, 4) if dur else None,
                    "drain_cpu_share": round(smp.drain_cpu_ns / 1e9 / dur, 4) if dur else None})
        else:
            sampler = {}
        for name, reason in getattr(self, "unavailable", {}).items():
            col[name] = {"state": "unsupported", "reason": reason}
        delays = sorted(self.attr_delays_ms)
        return {
            "source": self.probe_info.get("probe"), "pid": self.cfg.pid,
            "probe_cpus": self.cfg.probe_cpus, "rate_hz": self.cfg.rate_hz,
            "duration_s": round(dur, 2),
            "samples": self.samples, "lost_records": self.reader.lost if self.reader else 0,
            "invalid_records": self.reader.invalid if self.reader else 0,
            "p50_us": _us(h.quantile(0.5)), "p99_us": _us(h.quantile(0.99)),
            "p999_us": _us(h.quantile(0.999)), "max_us": _us(h.max_ns or None),
            # enough samples to claim the percentile at 99 % confidence (as the probe's)
            "sufficient": {"p99": self.samples >= 662, "p999": self.samples >= 6636},
            "spikes": self.spikes, "attributed": self.attributed,
            "not_attributed": self.not_attributed, "inherited": self.inherited,
            "queued": self.queued,
            "causes": {c: {"count": n, "share": round(n / self.attributed, 3),
                           "label": CAUSES.get(c, c),
                           "top": [d for d, _ in self.cause_details.get(c, Counter())
                                   .most_common(3)]}
                       for c, n in self.cause_counts.most_common()},
            "attribution_delay_ms": {"p50": delays[len(delays) // 2] if delays else None,
                                     "max": delays[-1] if delays else None},
            "flight_records": self.flight_files, "collectors": col, "sampler": sampler,
            "source_error": self.source_error, "stopped_by": self.stopped_by,
            "output_error": self.output_error,
            "warnings": self.warnings + self._invalid_warning() + self._load_warning(h) + (
                [self.sampler.native_error] if getattr(self.sampler, "native_error", None)
                else []),
        }


def _trusted_link(path: str, what: str) -> bool:
    """Whether ``path`` is a symlink that may be followed: one owned by root or by us
    (``/dev/stdout``, a link the operator made). Raises for one owned by anyone else (planted
    in a shared directory such as /tmp: following it as root would write where its owner
    chose). False: not a symlink, or nothing there yet (open it with ``O_NOFOLLOW``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise AgentError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISLNK(st.st_mode):
        return False
    if st.st_uid not in (0, os.geteuid()):
        raise AgentError(f"{what} {path} is a symbolic link owned by uid {st.st_uid}: not "
                         "followed (give the real path)")
    return True


def open_output(path: str, what: str) -> int:
    """Open ``path`` for appending (a descriptor; mode 0644 when created) the way a program
    that runs as root must: its directory must exist (never created: ``mkdir -p`` as root
    makes directories anywhere a typo points), a symlink is followed only when
    :func:`_trusted_link` says so (else ``O_NOFOLLOW``: one planted after the check fails the
    open), a FIFO is opened without blocking (no reader: an error, not a hang); what is
    opened must be a regular file, a FIFO or a terminal (``/dev/stdout`` works, ``/dev/full``
    does not), and not another user's file in a sticky world-writable directory (/tmp). A
    directory, a missing directory, a permission problem: :class:`AgentError`, one line."""
    if not path:
        raise AgentError(f"{what} path is empty")
    parent = Path(path).parent
    if not parent.is_dir():
        raise AgentError(f"{what} {path}: directory {parent} does not exist (create it first)")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    if not _trusted_link(path, what):
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AgentError(f"{what} {path} is a symbolic link: not followed (give the real "
                             "path)") from None
        if exc.errno == errno.ENXIO:
            raise AgentError(f"{what} {path} is a FIFO with no reader") from None
        raise AgentError(f"cannot open {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or os.isatty(fd)):
            # /dev/full, /dev/null, a disk: nothing a JSONL log is kept in
            raise AgentError(f"{what} {path} is a device, not a file")
        pst = os.stat(parent)
        if (pst.st_mode & (stat.S_ISVTX | stat.S_IWOTH)) == (stat.S_ISVTX | stat.S_IWOTH) \
                and st.st_uid not in (os.geteuid(), pst.st_uid):
            # a file another user made in a sticky world-writable directory (/tmp): it
            # would get what watch logs (fs.protected_regular=2 refuses such opens too)
            raise AgentError(f"{what} {path} belongs to uid {st.st_uid} in the shared "
                             f"directory {parent}: not written")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_output_dir(path: str, what: str) -> int:
    """A descriptor of directory ``path``, created (one level, mode 0755) when missing; its
    parent must exist. A symlink, and another user's directory in a sticky world-writable
    one, as :func:`open_output` treats them."""
    if not path:
        raise AgentError(f"{what} path is empty")
    parent = Path(path).parent
    if not parent.is_dir():
        raise AgentError(f"{what} {path}: directory {parent} does not exist (create it first)")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    if not _trusted_link(path, what):
        flags |= os.O_NOFOLLOW
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise AgentError(f"cannot create {what} {path}: {exc.strerror}") from None
    try:
        dfd = os.open(path, flags)
    except OSError as exc:
        why = "is a symbolic link: not followed" if exc.errno == errno.ELOOP else \
            "is not a directory" if exc.errno == errno.ENOTDIR else exc.strerror
        raise AgentError(f"{what} {path}: {why}") from None
    st, pst = os.fstat(dfd), os.stat(parent)
    if (pst.st_mode & (stat.S_ISVTX | stat.S_IWOTH)) == (stat.S_ISVTX | stat.S_IWOTH) \
            and st.st_uid not in (os.geteuid(), pst.st_uid):
        os.close(dfd)
        raise AgentError(f"{what} {path} belongs to uid {st.st_uid} in the shared directory "
                         f"{parent}: not written")
    return dfd


def _write_new(dfd: int, name: str, data: bytes) -> None:
    """Write ``data`` as file ``name`` of directory ``dfd``: a new file under a random name
    (``O_EXCL|O_NOFOLLOW``, mode 0644), renamed over ``name`` (never written through a
    symlink there); the temporary file removed on any error."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise


class MetricsFeed:
    """Feeds an :class:`agent.metrics.WatchMetrics` from the session (every sample, every
    attributed spike, every collector result) at the rates its contract expects."""

    def __init__(self, metrics) -> None:
        self.m = metrics
        self._last_gauges = 0.0
        self._up = False

    def set_collector_result(self, res) -> None:
        self.m.set_collector(res.name, res.success, res.duration_s)

    def observe_many(self, lat_ns: np.ndarray) -> None:
        if not self._up:
            self.m.probe_up(True)
            self._up = True
        self.m.observe_many(lat_ns)

    def spike(self, cause: str) -> None:
        self.m.spike(cause)

    def down(self) -> None:
        self.m.probe_up(False)
        self._up = False

    def set_gauges(self, session: WatchSession) -> None:
        """Once a second: the allowlisted host/GPU gauges (agent.metrics.GAUGES) from the
        latest row of each collector ring."""
        t = time.monotonic()
        if t - self._last_gauges < 1.0 or session.sampler is None:
            return
        self._last_gauges = t
        for c in session.cfg.probe_cpus:
            v = _latest(session.sampler.ring("cpu"), f"cpu.{c}.freq_hz")
            if v is not None:
                self.m.set_gauge("cpu_frequency_hertz", v, cpu=str(c))
        gpu = session.sampler.ring("gpu")
        if gpu is not None:
            for g in sorted({n.split(".")[1] for n in gpu.cols if n.count(".") == 2}):
                p = f"gpu.{g}."
                for clock, key in (("sm", "sm_clock_hz"), ("memory", "mem_clock_hz")):
                    self.m.set_gauge("gpu_clock_hertz", _latest(gpu, p + key), gpu=g,
                                     clock=clock)
                mask = _latest(gpu, p + "clock_event_reasons")
                self.m.set_gpu_clock_event_reasons(g, None if mask is None else int(mask))
                self.m.set_gauge("gpu_foreign_processes", _latest(gpu, p + "foreign_processes"),
                                 gpu=g)
        pcie = session.sampler.ring("pcie")
        if pcie is not None:
            for dev in sorted({n[5:].rsplit(".", 1)[0] for n in pcie.cols}):
                p = f"pcie.{dev}."
                speed, width = _latest(pcie, p + "speed_gts"), _latest(pcie, p + "width")
                mspeed, mwidth = _latest(pcie, p + "max_speed_gts"), _latest(pcie, p + "max_width")
                self.m.set_gauge("pcie_link_speed_transfers_per_second",
                                 None if speed is None else speed * 1e9, device=dev)
                self.m.set_gauge("pcie_link_width", width, device=dev)
                known = None not in (speed, mspeed) or None not in (width, mwidth)
                degraded = (speed is not None and mspeed is not None and speed < mspeed) or \
                    (width is not None and mwidth is not None and width < mwidth)
                self.m.set_gauge("pcie_link_degraded", float(degraded) if known else None,
                                 device=dev)


def _latest(ring, name: str) -> float | None:
    """The newest non-NaN value of ``name`` in the ring's latest row (None: not measured)."""
    if ring is None or not ring.rows:
        return None
    idx = ring.window(ring.latest_t1, ring.latest_t1)
    v = ring.column(name, idx)
    return float(v[-1]) if len(v) and v[-1] == v[-1] else None


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(ns / 1e3, 1)


def _short(detail: str) -> str:
    """The example of a cause for the summary: who ran on the CPU, else the detail's head.
    A detail wrapped by a re-labelled cause ("softirq work in ksoftirqd/1 preempted the probe
    (…; X ran on CPU 1)") loses the wrapper's closing parenthesis with its head."""
    if "ran on CPU" not in detail:
        return detail.split(":")[0]
    tail = detail.split(";")[-1].strip()
    while tail.endswith(")") and tail.count(")") > tail.count("("):
        tail = tail[:-1]
    return tail


def _gpu_collectors(host: Host, own_pids: list[int]) -> list:
    """The GPU engineer's collector when it is installed; its absence is "unsupported"."""
    try:
        import importlib
        mod = importlib.import_module("collectors.gpu")
    except ImportError:
        return []
    cls = getattr(mod, "GpuCollector", None)
    if cls is None:
        return []
    try:
        c = cls(own_pids=own_pids, host=host)
    except Exception:  # noqa: BLE001 - a GPU adapter that cannot start is "unsupported"
        return []
    # ~20 Hz (every 5th round at 100 Hz): on the lent H200 under load one sample() took
    # 309 µs median / 1.16 ms P99, 4.95 % of one CPU at 100 Hz (docs/gpu-validation.md);
    # GPU clocks and throttle reasons change on a ms-to-s scale, and a throttle that lasts
    # 50 ms still shows in the window + slack of the spikes it causes.
    c.period_s = GPU_PERIOD_S
    return [c]


GPU_PERIOD_S = 0.05

