"""Exact attribution of a noise scan from kernel events (``hftagent cpus --trace``).

While the recorders of one batch spin, one :class:`agent.trace.EventSource` (a
private tracefs instance ``instances/hftagent-<pid>``, ``tracing_cpumask`` = the batch's
CPUs, ``trace_clock`` ``mono``) records sched/irq/softirq/irq_vectors/workqueue events on
those CPUs. The recorder (hftnoise.c) reads CLOCK_MONOTONIC and prints each kept gap's
start and length in that clock, so gaps and events share one time base (docs/events.md,
"The instance").

Per CPU, after the batch, the recorder's ``[t0, t1]`` is read back in chunks of
:data:`CHUNK_NS` (bounded memory whatever the duration) and walked by
:func:`agent.trace.timeline` with the recorder's pid as the probe. Everything that
is not the recorder running is what ran instead: IRQ handlers by name, softirqs by vector,
the local timer tick, IPIs, other APIC vectors, work items (``kworker/1:0
(vmstat_update)``), other tasks by comm. Each is reported as µs per second of scan and a
count (stretches of it).

A recorded gap that no event interval overlaps is ``hw_or_hypervisor`` (time and count),
as rtla hwnoise counts a gap with no interrupt: the CPU was taken away below the kernel
(SMI, a host that descheduled the vCPU). A gap inside a stretch the events cannot name
(``no events (task unknown)``) is counted apart, never as hardware.

The tracing itself costs the traced CPUs a little (each event ~0.1-0.5 µs, in the gap it
describes): ``--trace off`` measures without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from agent.errors import AgentError
from agent.trace.timeline import (
    HW,
    IDLE,
    IPI,
    IRQ,
    PROBE,
    SOFTIRQ,
    TASK,
    TIMER,
    UNKNOWN,
    VECTOR,
    WORK,
    Entity,
    Timeline,
    timeline,
)

MODES = ("auto", "on", "off", "mount")
CHUNK_NS = 2_000_000_000   # one window (and one timeline) per 2 s of scan: a 1 s scan is one
TOP_N = 8                  # entities kept per CPU in the output
MAX_PIDS = 4               # pids listed per task entity (the longest-running)
BUFFER_MARGIN_S = 3.0      # ring and kept pages cover the batch plus start-up and the read
# bounded metric label values (export.py): the entity kinds and hw_or_hypervisor
KINDS = (IRQ, SOFTIRQ, TIMER, IPI, VECTOR, WORK, TASK, IDLE, HW)


def entity_key(e: Entity) -> tuple[str, str]:
    """(kind, name) an entity is reported under: tasks by comm (pids merged), work items as
    ``kworker/1:0 (function)``, interrupts by their timeline label."""
    if e.kind == TASK:
        return TASK, e.name
    if e.kind == WORK:
        return WORK, e.name
    if e.kind in (IRQ, SOFTIRQ, TIMER, IPI, VECTOR):
        return e.kind, e.label
    return e.kind, e.name


@dataclass
class CpuEvents:
    """What the events say about one CPU's scan, accumulated over its chunks' timelines."""

    cpu: int
    pid: int                  # the recorder's pid (= its only thread)
    t0_ns: int
    t1_ns: int
    totals: dict[tuple[str, str], int] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    pids: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)  # pid -> ns
    unknown_ns: int = 0
    complete: bool = True
    reason: str | None = None
    lost: int = 0
    _cov: list[np.ndarray] = field(default_factory=list, repr=False)   # [[start, end]...]
    _unk: list[np.ndarray] = field(default_factory=list, repr=False)

    def add(self, tl: Timeline) -> None:
        """One chunk's timeline (chunks in time order, not overlapping)."""
        cov, unk = [], []
        for sp in tl.spans():
            e = sp.entity
            if e.kind == PROBE:
                continue
            if e.kind == UNKNOWN:
                self.unknown_ns += sp.ns
                unk.append((sp.start_ns, sp.end_ns))
                continue
            k = entity_key(e)
            self.totals[k] = self.totals.get(k, 0) + sp.ns
            self.counts[k] = self.counts.get(k, 0) + 1
            if e.kind == TASK and e.pid is not None:
                ps = self.pids.setdefault(k, {})
                ps[e.pid] = ps.get(e.pid, 0) + sp.ns
            cov.append((sp.start_ns, sp.end_ns))
        if cov:
            self._cov.append(np.asarray(cov, dtype=np.int64))
        if unk:
            self._unk.append(np.asarray(unk, dtype=np.int64))
        if not tl.complete and self.complete:
            self.complete, self.reason = False, tl.reason

    def result(self, gap_start_ns: np.ndarray, gap_ns: np.ndarray, duration_s: float, *,
               top: int = TOP_N, slack_ns: int = 0) -> dict:
        """The per-CPU ``events`` part of ``hftagent cpus``' output (see the module
        docstring). ``gap_start_ns``/``gap_ns``: the recorder's kept gaps; ``slack_ns``:
        how far an event may lie outside a gap and still explain it (the ``trace`` text
        reader's µs rounding; 0 for raw pages)."""
        per_s = 1e3 * max(duration_s, 1e-9)  # ns -> µs per second
        s = np.asarray(gap_start_ns, dtype=np.int64)
        e = s + np.asarray(gap_ns, dtype=np.int64)
        over = _overlap(self._cov, s - slack_ns, e + slack_ns)
        in_unknown = _overlap(self._unk, s - slack_ns, e + slack_ns) > 0
        hw = (over == 0) & ~in_unknown
        hw_ns = int(np.asarray(gap_ns)[hw].sum()) if hw.any() else 0
        total_gap = int(np.asarray(gap_ns).sum())
        explained = int(np.minimum(over, np.asarray(gap_ns)).sum()) if over.size else 0
        ranked = sorted(self.totals.items(), key=lambda kv: (-kv[1], kv[0]))
        events = []
        for (kind, name), ns in ranked[:top]:
            item = {"entity": name, "kind": kind, "us_per_s": round(ns / per_s, 1),
                    "count": self.counts[(kind, name)]}
            if (kind, name) in self.pids:
                # the pids that ran longest under that comm, longest first
                item["pids"] = [{"pid": p, "us_per_s": round(n / per_s, 1)} for p, n in
                                sorted(self.pids[(kind, name)].items(),
                                       key=lambda kv: (-kv[1], kv[0]))[:MAX_PIDS]]
            events.append(item)
        by_kind: dict[str, float] = {}
        for (kind, _), ns in self.totals.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + ns / per_s
        if hw_ns:
            by_kind[HW] = hw_ns / per_s
        out = {
            "events": events,
            "events_left_out": max(0, len(ranked) - top),
            "events_other_us_per_s": round(sum(ns for _, ns in ranked[top:]) / per_s, 1),
            "events_by_kind_us_per_s": {k: round(v, 1) for k, v in
                                        sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "hw_or_hypervisor_us_per_s": round(hw_ns / per_s, 1),
            "hw_or_hypervisor_gaps": int(hw.sum()),
            "gaps_in_unknown": int(in_unknown.sum()),
            "gap_time_explained_pct": round(100.0 * explained / total_gap, 1) if total_gap
            else None,
            "events_complete": self.complete,
        }
        if self.unknown_ns:
            out["unknown_us_per_s"] = round(self.unknown_ns / per_s, 1)
        if self.reason:
            out["events_reason"] = self.reason
        if self.lost:
            out["lost_events"] = self.lost
        return out


def _overlap(parts: list[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """ns of [lo, hi] covered by the (disjoint, time-ordered) intervals in ``parts``."""
    if not parts or not lo.size:
        return np.zeros(lo.shape, dtype=np.int64)
    iv = np.concatenate(parts)
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    st, en = iv[:, 0], iv[:, 1]
    cum = np.concatenate(([0], np.cumsum(en - st)))

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(st, t, side="right") - 1
        j = np.maximum(i, 0)
        part = np.clip(t - st[j], 0, en[j] - st[j])
        return np.where(i >= 0, cum[j] + part, 0)

    return np.maximum(covered_until(hi) - covered_until(lo), 0)


def read_batch(src, runs: Iterable[tuple[int, int, int, int]], *,
               chunk_ns: int = CHUNK_NS) -> dict[int, CpuEvents]:
    """Read the batch's events back: ``runs`` = (cpu, recorder pid, t0_ns, t1_ns) per CPU
    whose recorder finished. One window per chunk for all the batch's CPUs."""
    accs = {cpu: CpuEvents(cpu, pid, t0, t1) for cpu, pid, t0, t1 in runs if t1 > t0}
    if not accs:
        return accs
    lo = min(a.t0_ns for a in accs.values())
    hi = max(a.t1_ns for a in accs.values())
    a = lo
    while a < hi:
        b = min(hi, a + chunk_ns)
        win = src.window(a, b)
        for acc in accs.values():
            x0, x1 = max(a, acc.t0_ns), min(b, acc.t1_ns)
            if x1 <= x0:
                continue
            acc.add(timeline(win.events, acc.cpu, {acc.pid}, x0, x1, comms=win.comms,
                             complete=win.complete, reason=win.reason))
            acc.lost += win.lost
        a = b
    return accs


class Tracer:
    """``--trace auto|on|off|mount`` for a scan: one source per batch (the instance name is
    per process, so batches take turns). ``auto``/``mount``: a refusal is kept as
    ``reason`` and the scan falls back to /proc deltas; ``on``: :class:`AgentError`
    (``--trace on: unsupported: ...``). ``opener``: :meth:`EventSource.open` (tests pass a
    fake)."""

    def __init__(self, mode: str, host, *, opener: Callable | None = None) -> None:
        if mode not in MODES:
            raise AgentError(f"--trace must be auto, on, off or mount, not {mode!r}")
        self.mode = mode
        self.host = host
        if opener is None:
            from agent.trace import EventSource
            opener = EventSource.open
        self.opener = opener
        self.reason: str | None = "off (--trace off)" if mode == "off" else None
        self.batches = 0
        self.read_ns = 0
        self.describe: dict | None = None
        self.notes: list[str] = []
        self._refused = mode == "off"

    def open(self, cpus: list[int], duration_s: float):
        """The source for one batch, or None (fall back to /proc)."""
        if self._refused:
            return None
        b = duration_s + BUFFER_MARGIN_S
        src = self.opener(self.host, cpus, b, mount=self.mode == "mount", keep_s=b)
        if not src:
            self.reason = src.reason
            if self.mode == "on":
                raise AgentError(f"--trace on: {src.reason}")
            self._refused = True  # the next batch would be refused alike
            return None
        self.batches += 1
        if self.describe is None:
            try:
                self.describe = src.describe()
            except Exception:  # noqa: BLE001 - reporting only
                self.describe = None
        return src

    def info(self) -> dict:
        d: dict = {"mode": self.mode, "active": self.batches > 0, "batches": self.batches}
        if self.reason:
            d["reason"] = self.reason
        if self.batches:
            d["read_ms"] = round(self.read_ns / 1e6, 1)
        if self.describe:
            d["source"] = {k: self.describe.get(k) for k in
                           ("instance", "reader", "buffer_kb_per_cpu", "missing", "notes")
                           if k in self.describe}
        if self.notes:
            d["notes"] = self.notes[:8]
        return d
