"""The GPU split of one slow attached call (``watch --attach PID`` on a process that maps
libcuda; the probes: agent/trace/gpu_probes.py): its wall time cut into parts that add up
to it, each with its evidence.

=================  ========================================================================
part               what it is, and where it comes from
=================  ========================================================================
enqueue            from the call's start to the calling thread's last enqueue (its last
                   launch, host function or copy), less the parts below and its
                   other waits off the CPU inside it: the CPU work of issuing the GPU's work
                   (on the CPU, or runnable and waiting for it). Its CPU
                   causes: what the timeline shows on the CPU then (``enqueue.others``)
copies             inside the calling thread's copy calls (entry to return): their count,
                   bytes (the ``ByteCount`` argument) and µs; copies by the process's
                   other threads (XLA's worker makes them) are counted apart, not in the sum
gpu_wait           the caller blocked until the GPU finished: off the CPU and woken by a
                   thread of its own process that enqueued no GPU work in the call (the
                   CUDA callback or event thread: XLA waits for a ``cuLaunchHostFunc``
                   callback), after the call enqueued some; or inside a sync call
                   (cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize)
completion_lag     from that wake-up (the waker's ``sched_waking``: "GPU done") to the
                   caller running again (the timeline's next run of the thread)
rest               everything else: CPU work after the last enqueue, the caller's waits
                   off the CPU that were not for the GPU
=================  ========================================================================

Precedence where two overlap (each nanosecond is given once): copies, completion lag, GPU
wait, the caller's other waits off the CPU (rest: a lock, I/O, another process's wake-up),
enqueue; rest where nothing covers it. Without the timeline (no kernel events, or past the CPU budget) the
parts off the CPU are unknown and fall in ``rest``; ``timeline`` says so.

GPU causes, named with their evidence when the data exists: the polled GPU causes of the
same spike (agent/watch/attribution/gpu.py: another process on the probe's GPU from NVML's
running processes, a clock-event/throttle reason), and a slow copy: the call's copies' ns
per byte at least :data:`SLOW_COPY_RATIO` × the P50 of the latest copies, and their time at
least :data:`SLOW_COPY_SHARE` of the call's excess over its P50 (``gpu_copy``).
:func:`annotate` then lets the part that grew name the record's cause
(agent/watch/attribution/gpu_verdict.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agent.stats import median
from agent.trace.gpu_probes import COPY, HOST_FUNC, LAUNCH, SYNC, GpuHits, Hit
from agent.watch.attribution import gpu_verdict

PARTS = ("enqueue", "copies", "gpu_wait", "completion_lag", "rest")  # (export: GPU_PARTS)
_PRIO = {"copies": 0, "completion_lag": 1, "gpu_wait": 2, "rest": 3, "enqueue": 4}
SLOW_COPY_RATIO = 3.0
SLOW_COPY_SHARE = 0.2
GPU_CAUSES = ("gpu_foreign_process", "gpu_throttle")
ENQUEUES = (LAUNCH, HOST_FUNC, COPY)

Span = tuple[int, int, str]     # (start_ns, end_ns, part)


def paint(t0: int, t1: int, spans: Iterable[Span]) -> list[Span]:
    """``[t0, t1]`` cut into consecutive segments, each given to the covering span of the
    highest precedence (:data:`_PRIO`), ``rest`` where none covers it."""
    spans = [(max(a, t0), min(b, t1), p) for a, b, p in spans if min(b, t1) > max(a, t0)]
    cuts = sorted({t0, t1, *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
    out: list[Span] = []
    for lo, hi in zip(cuts, cuts[1:]):
        over = [p for a, b, p in spans if a <= lo and b >= hi]
        out.append((lo, hi, min(over, key=_PRIO.__getitem__) if over else "rest"))
    return out


def totals(segments: Iterable[Span]) -> dict[str, int]:
    """ns per part of :func:`paint`'s segments (they sum to the call's wall time)."""
    out = dict.fromkeys(PARTS, 0)
    for a, b, p in segments:
        out[p] += b - a
    return out


def paired(hits: Sequence[Hit], kind: str) -> list[tuple[int, int | None, Hit]]:
    """(entry ns, return ns or None, entry hit) of each call of ``kind``, per thread and
    symbol (a return without its entry is left out)."""
    out: list[tuple[int, int | None, Hit]] = []
    open_: dict[tuple[int, str], int] = {}
    for h in hits:
        if h.kind != kind:
            continue
        key = (h.tid, h.symbol)
        if not h.ret:
            if key in open_:   # its return was not seen
                i = open_.pop(key)
                out[i] = (out[i][0], None, out[i][2])
            open_[key] = len(out)
            out.append((h.ts_ns, None, h))
        elif key in open_:
            i = open_.pop(key)
            out[i] = (out[i][0], h.ts_ns, out[i][2])
    return out


def _copies(hits: Sequence[Hit], tid: int) -> tuple[dict, list[Span], dict]:
    """The caller's copies (dict and spans) and the other threads' (dict)."""
    own: dict = {"count": 0, "bytes": None, "us": 0.0}
    other: dict = {"count": 0, "bytes": None, "us": 0.0}
    spans: list[Span] = []
    for a, b, h in paired(hits, COPY):
        d = own if h.tid == tid else other
        d["count"] += 1
        if h.nbytes >= 0:   # (None: no byte count came with the hits)
            d["bytes"] = (d["bytes"] or 0) + h.nbytes
        if b is not None:
            d["us"] = round(d["us"] + (b - a) / 1e3, 1)
            if h.tid == tid:
                spans.append((a, b, "copies"))
    return own, spans, other


def _parts_waits(tl: dict, t0: int, t1: int, tid_hits: dict[int, list[Hit]], tid: int,
                 syncs: list[Span]) -> tuple[list[Span], list[dict]]:
    """GPU-wait and completion-lag spans from the timeline's not-runnable parts, and what
    each names (its waker, how)."""
    spans: list[Span] = []
    said: list[dict] = []
    enqueuers = {t for t, hs in tid_hits.items() if any(h.kind in ENQUEUES for h in hs)}
    first_enqueue = min((h.ts_ns for hs in tid_hits.values() for h in hs
                         if h.kind in ENQUEUES), default=None)
    runs = sorted(t0 + int(s[0] * 1e3) for s in tl.get("spans") or []
                  if str(s[2]).startswith("probe "))
    for part in tl.get("parts") or []:
        if part.get("to_us") is None:
            continue
        a, b = t0 + int(part["from_us"] * 1e3), t0 + int(part["to_us"] * 1e3)
        if part.get("kind") != "blocked":   # I/O, stopped, a late timer: another wait
            spans.append((a, b, "rest"))
            continue
        in_sync = any(sa <= max(a, t0) and b <= sb for sa, sb, _ in syncs)
        woken_by_gpu = part.get("same_process") and part.get("waker_tid") not in enqueuers \
            and part.get("waker_tid") != tid and first_enqueue is not None \
            and first_enqueue <= b
        if not (in_sync or woken_by_gpu):
            spans.append((a, b, "rest"))   # a wait for something else (not on the CPU)
            continue
        spans.append((a, b, "gpu_wait"))
        run = next((r for r in runs if r >= b), None)
        if part.get("ended_by") == "waking" and run is not None:
            spans.append((b, run, "completion_lag"))
        said.append({"woken_by": part.get("waker", "unknown"),
                     "how": "sync call" if in_sync else "callback thread",
                     "us": round((min(b, t1) - max(a, t0)) / 1e3, 1),
                     "lag_us": round((run - b) / 1e3, 1) if run is not None and
                     part.get("ended_by") == "waking" else None})
    return spans, said


def _enqueue_causes(tl: dict | None, t0: int, segments: list[Span]) -> dict:
    """What the timeline shows on the CPU during the enqueue's segments: the thread's own run
    and the largest others (the CPU causes of a slow enqueue)."""
    mine = [(a, b) for a, b, p in segments if p == "enqueue"]
    if not tl or not mine:
        return {}
    per: dict[str, float] = {}
    for s in tl.get("spans") or []:
        a = t0 + int(s[0] * 1e3)
        b = a + int(s[1] * 1e3)
        for lo, hi in mine:
            ns = min(b, hi) - max(a, lo)
            if ns > 0:
                per[str(s[2])] = per.get(str(s[2]), 0) + ns
    own = sum(ns for label, ns in per.items() if label.startswith("probe "))
    others = sorted(((label, ns) for label, ns in per.items() if not label.startswith("probe ")),
                    key=lambda kv: -kv[1])[:3]
    return {"on_cpu_us": round(own / 1e3, 1),
            "others": [{"what": label, "us": round(ns / 1e3, 1)} for label, ns in others]}


def split_call(t0: int, t1: int, tid: int, hits: Sequence[Hit], tl: dict | None,
               segments_out: list[Span] | None = None) -> dict:
    """The split of one call ``[t0, t1]`` of thread ``tid`` (module docstring): ``parts``
    (µs each, summing to ``wall_us``), the copies, the waits and their wakers. The painted
    segments are appended to ``segments_out`` where given (the verdict reads them)."""
    by_tid: dict[int, list[Hit]] = {}
    for h in hits:
        by_tid.setdefault(h.tid, []).append(h)
    mine = by_tid.get(tid, [])
    own, copy_spans, other = _copies(hits, tid)
    syncs: list[Span] = [(a, b, "gpu_wait") for a, b, h in paired(mine, SYNC) if b is not None]
    last = max((h.ts_ns for h in mine if h.kind in ENQUEUES), default=None)
    spans: list[Span] = copy_spans + syncs
    if last is not None:
        spans.append((t0, last, "enqueue"))
    waits: list[dict] = []
    if tl:
        part_spans, waits = _parts_waits(tl, t0, t1, by_tid, tid, syncs)
        spans += part_spans
    waits += [{"woken_by": None, "how": "sync call", "us": round((b - a) / 1e3, 1)}
              for a, b, _ in syncs if not tl]
    segments = paint(t0, t1, spans)
    if segments_out is not None:
        segments_out.extend(segments)
    ns = totals(segments)
    kinds = [h.kind for h in mine if not h.ret]
    out = {"wall_us": round((t1 - t0) / 1e3, 1),
           "parts": {p: round(v / 1e3, 1) for p, v in ns.items()},
           "largest": max(ns, key=ns.__getitem__),
           "launches": kinds.count(LAUNCH), "host_funcs": kinds.count(HOST_FUNC),
           "syncs": kinds.count(SYNC), "copies": own, "timeline": bool(tl)}
    if other["count"]:
        out["copies_other_threads"] = other
    if waits:
        out["gpu_waits"] = waits
    enq = _enqueue_causes(tl, t0, segments)
    if enq:
        out["enqueue"] = enq
    out["summary"] = summary_line(out)
    return out


def summary_line(out: dict) -> str:
    """One line for a person: the parts largest first (µs of the wall time), the GPU wait's
    waker, the copies."""
    parts = sorted(((p, us) for p, us in out["parts"].items() if us > 0), key=lambda kv: -kv[1])
    line = "; ".join(f"{p} {us:,.0f} µs" for p, us in parts) + f" of {out['wall_us']:,.0f} µs"
    woken = [w["woken_by"] for w in out.get("gpu_waits", []) if w.get("woken_by")]
    if woken:
        line += f" (GPU wait woken by {woken[0]})"
    c = out["copies"]
    if c["count"]:
        line += f"; {c['count']} copies" + (f", {c['bytes']:,} B" if c["bytes"] else "")
    return line


def usual_rates(rates: Iterable[float]) -> tuple[float | None, float | None]:
    """(P50 ns per byte, P50 ns per copy) of the latest copies (:attr:`GpuHits.rates`:
    positive ns per byte, negative ns per copy where no byte count came)."""
    r = np.fromiter(rates, float)
    per_byte, per_copy = r[r > 0], -r[r < 0]
    return (median(per_byte) if len(per_byte) else None,
            median(per_copy) if len(per_copy) else None)


def slow_copy(hits: Sequence[Hit], usual: tuple[float | None, float | None], excess_ns: int
              ) -> dict | None:
    """The slow-copy cause of a call (module docstring), or None. ``usual``: from
    :func:`usual_rates`; by ns per byte where the copies' byte counts came, else by ns per
    copy."""
    pairs = [(b - a, h.nbytes) for a, b, h in paired(hits, COPY) if b is not None]
    if not pairs:
        return None
    ns = sum(p[0] for p in pairs)
    nbytes = sum(p[1] for p in pairs) if all(p[1] > 0 for p in pairs) else None
    rate, p50, unit = (ns / nbytes, usual[0], "byte") if nbytes else \
        (ns / len(pairs), usual[1], "copy")
    if not p50 or rate < SLOW_COPY_RATIO * p50 or ns < SLOW_COPY_SHARE * excess_ns:
        return None
    return {"cause": "gpu_copy", "detail": f"{len(pairs)} copy(ies)"
            + (f", {nbytes} bytes" if nbytes else "") + f" in {ns / 1e3:.1f} µs: "
            f"{rate / p50:.1f}× the usual µs per {unit}",
            "evidence": {f"ns_per_{unit}": round(rate, 4), f"p50_ns_per_{unit}": round(p50, 4),
                         "bytes": nbytes, "copies": len(pairs)}}


def gpu_causes(body: dict, hits: Sequence[Hit], usual: tuple[float | None, float | None],
               excess_ns: int) -> list[dict]:
    """The GPU causes of one spike: the polled ones (NVML: a foreign process, a throttle)
    from its attribution ``body``, and a slow copy."""
    out = [{"cause": c["cause"], "detail": c.get("detail", ""),
            "evidence": c.get("evidence", {})}
           for c in body.get("causes") or [] if c.get("cause") in GPU_CAUSES]
    slow = slow_copy(hits, usual, excess_ns)
    return out + ([slow] if slow else [])


def annotate(kept: GpuHits, sp: Any, body: dict) -> dict | None:
    """Add ``body["gpu"]`` for spike ``sp`` (a :class:`~.spike.Spike` of an attached process
    with GPU probes: the session calls it for each one) from the hits ``kept`` (the
    attached run's :class:`GpuHits`): its split (:func:`split_call`) and GPU causes; the
    parts are summed into ``kept.parts_ns`` for the run's summary. None (nothing added)
    when no GPU probe fired in the call."""
    hits = kept.between(sp.start_ns, sp.end_ns)
    if not hits:
        return None
    tl = (body.get("events") or {}).get("timeline")
    segments: list[Span] = []
    out = split_call(sp.start_ns, sp.end_ns, sp.tid, hits, tl, segments)
    causes = gpu_causes(body, hits, usual_rates(kept.rates), sp.excess_ns)
    if causes:
        out["causes"] = causes
    body["gpu"] = out
    gpu_verdict.decide(body, out, segments, sp)
    kept.spikes_split += 1
    for p, us in out["parts"].items():
        kept.parts_ns[p] = kept.parts_ns.get(p, 0) + int(us * 1e3)
    return out
