"""The verdict of a slow GPU call from its split (issue #36): the part that grew decides.

:func:`~.gpu_split.annotate` cuts a slow attached call of a libcuda process into enqueue,
copies, GPU wait, completion lag and rest; :func:`decide` then names the cause from the part
with the largest *excess*, where the split covers the call (the kernel events' complete
timeline: the waits off the CPU are known). Before, a call that spent its excess waiting for
the GPU was ``blocked`` (off the CPU, woken by the CUDA callback thread): true, and useless.

Each part's excess over the usual call is bounded from below, with no per-part baseline: the
P50 call's part cannot be longer than the P50 call (``part − P50``), and what the timeline
shows running instead of the caller inside a stretch is excess for sure (the copies: their
µs per byte over the latest copies' P50, where :func:`~.gpu_split.slow_copy` found them
slow). The largest must hold :data:`GPU_MIN_SHARE` of the call's excess, else the record
keeps its verdict.

=================  ========================================================================
largest part       cause
=================  ========================================================================
gpu_wait           ``gpu_foreign_process`` (another process on the probe's GPU: NVML's
                   running processes, the polled GPU rule names it), else ``gpu_throttle``
                   (an NVML clock-event reason), else ``gpu_kernel``: the GPU took longer
                   (longer kernels, a bigger input), with the wait's µs against the P50
                   call. Only the time the caller was off the CPU woken by its process's
                   callback thread, or inside a sync call, is GPU wait (the split's rule):
                   a GPU cause never contradicts the timeline
copies             ``gpu_copy``: the copies' count, bytes and µs (their µs per byte against
                   the P50 where the slow-copy rule measured it)
enqueue            the CPU causes of the enqueue stretch: what ran on the caller's CPU then
                   (``cpu_contention`` naming the task, ``irq``, ``softirq``) where it holds
                   :data:`STRETCH_MIN_SHARE` of the stretch's excess, else the on-CPU rules
                   (:data:`~.verdict.ON_CPU_RULES`: page faults, hidden time, the SMT
                   sibling) over it
completion_lag     the CPU causes of the lag (GPU done → the caller running): another task
                   on the caller's CPU (``cpu_contention``), else ``wakeup_latency`` (the
                   CPU had nothing else to run: the wake-up itself came late)
=================  ========================================================================

A record the split decides says ``decided_by: events+gpu`` and keeps the verdict it had as
``polled_cause`` (decided by the polled rules) or ``events_cause`` (by the timeline alone);
each cause entry's evidence has ``gpu_part`` and the part's µs and excess. A cause of the
CPU is checked against the timeline (:func:`~.verdict.contradiction`) before it leads.
"""

from __future__ import annotations

import re
from typing import Any

from agent.watch.attribution import verdict
from agent.watch.attribution.events import EVENT_CAUSE

GPU_MIN_SHARE = 0.4      # the largest part's excess holds at least this share of the call's
STRETCH_MIN_SHARE = 0.5  # what ran on the CPU names a stretch's excess from this share on
_TASK = re.compile(r"^(?P<comm>.*)\[(?P<tid>\d+)\]$")

Ranges = list[tuple[int, int]]  # absolute ns


def _kind(label: str, kinds: dict[str, str]) -> str | None:
    """The timeline entity kind of a span's label (None: the caller's own, or unknown)."""
    if label.startswith("probe "):
        return None
    if label in kinds:
        return kinds[label]
    m = _TASK.match(label)
    return "task" if m and int(m["tid"]) > 0 else None


def ran_in(tl: dict, t0: int, ranges: Ranges) -> dict[str, tuple[int, str]]:
    """What the timeline shows running instead of the caller in ``ranges``: ns per cause of
    agent/causes.py (:data:`~.events.EVENT_CAUSE`: task and work item → cpu_contention, the
    interrupts → irq, softirq) and the largest culprit label of each, as {cause: (ns,
    label)}."""
    kinds = {e.get("label", ""): e.get("kind", "") for e in tl.get("entities") or []}
    ns: dict[str, int] = {}
    top: dict[str, tuple[int, str]] = {}
    per_label: dict[str, int] = {}
    for s in tl.get("spans") or []:
        a = t0 + int(s[0] * 1e3)
        b = a + int(s[1] * 1e3)
        got = sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in ranges)
        kind = _kind(str(s[2]), kinds)
        if got > 0 and kind is not None and kind in EVENT_CAUSE and \
                EVENT_CAUSE[kind] in verdict.SEEN:
            per_label[str(s[2])] = per_label.get(str(s[2]), 0) + got
            cause = EVENT_CAUSE[kind]
            ns[cause] = ns.get(cause, 0) + got
            if per_label[str(s[2])] > top.get(cause, (0, ""))[0]:
                top[cause] = (per_label[str(s[2])], str(s[2]))
    return {c: (n, top[c][1]) for c, n in ns.items()}


def of_part(segments: list[tuple[int, int, str]], part: str) -> Ranges:
    return [(a, b) for a, b, p in segments if p == part]


def part_excess(split: dict, segments: list[tuple[int, int, str]], tl: dict, t0: int,
                p50_us: float) -> dict[str, float]:
    """Each part's excess over the usual call, a lower bound in µs (module docstring)."""
    parts = split["parts"]
    out = {"gpu_wait": max(0.0, parts["gpu_wait"] - p50_us)}
    for part in ("enqueue", "completion_lag"):
        others = sum(n for n, _ in ran_in(tl, t0, of_part(segments, part)).values()) / 1e3
        out[part] = max(0.0, parts[part] - p50_us, others)
    slow = next((c for c in split.get("causes") or [] if c["cause"] == "gpu_copy"), None)
    copies = max(0.0, parts["copies"] - p50_us)
    if slow is not None:
        e = slow["evidence"]
        unit = "byte" if "ns_per_byte" in e else "copy"
        usual = e[f"p50_ns_per_{unit}"] / max(1e-9, e[f"ns_per_{unit}"])
        copies = max(copies, parts["copies"] * (1 - usual))
    out["copies"] = copies
    return out


def decide(body: dict, split: dict, segments: list[tuple[int, int, str]], sp: Any) -> bool:
    """Name the cause of spike ``sp`` (a :class:`~.spike.Spike`) from its GPU ``split``
    (:func:`~.gpu_split.split_call`'s dict and painted ``segments``), where the record's
    timeline is complete and the split used it: see the module docstring. True when the
    split decided the record's cause."""
    ev = body.get("events") or {}
    tl = ev.get("timeline") or {}
    if not ev.get("complete") or not split.get("timeline") or not tl or sp.excess_ns <= 0:
        return False
    t0, excess_us = sp.start_ns, sp.excess_ns / 1e3
    ex = part_excess(split, segments, tl, t0, sp.p50_ns / 1e3)
    part = max(ex, key=ex.__getitem__)
    if ex[part] < GPU_MIN_SHARE * excess_us:
        return False
    if part == "gpu_wait":
        entry = _gpu_wait(split, sp)
    elif part == "copies":
        entry = _copies(split, sp)
    else:
        entry = _cpu_stretch(body, ev, part, of_part(segments, part), ex[part], sp)
    if entry is None:
        return False
    entry.setdefault("evidence", {}).update(
        gpu_part=part, part_us=split["parts"][part], part_excess_us=round(ex[part], 1),
        excess_us=round(excess_us, 1))
    _lead(body, entry)
    return True


def _lead(body: dict, entry: dict) -> None:
    old, by = body.get("cause"), body.get("decided_by")
    if old != entry["cause"]:
        body["polled_cause" if by in (None, "polled") else "events_cause"] = old
    body["cause"] = entry["cause"]
    body["decided_by"] = "events+gpu"
    causes = body.setdefault("causes", [])
    causes[:] = [c for c in causes if c.get("cause") != entry["cause"]]
    causes.insert(0, entry)


def _gpu_wait(split: dict, sp: Any) -> dict:
    """The GPU cause of a call whose excess is its GPU wait."""
    wait = split["parts"]["gpu_wait"]
    waits = split.get("gpu_waits") or []
    how = f" (woken by {waits[0]['woken_by']})" if waits and waits[0].get("woken_by") else ""
    said = f"the caller waited {wait:,.0f} µs for the GPU{how}"
    polled = {c["cause"]: c for c in split.get("causes") or []}
    for cause in ("gpu_foreign_process", "gpu_throttle"):
        if cause in polled:
            c = polled[cause]
            return {"cause": cause, "score": 1.0, "strength": 1.0,
                    "detail": f"{c.get('detail', '')}: {said}",
                    "evidence": {**(c.get("evidence") or {}), "gpu_wait_us": wait}}
    p50 = sp.p50_ns / 1e3
    return {"cause": "gpu_kernel", "score": 1.0, "strength": 1.0,
            "detail": f"the GPU took longer: {said}, {wait / max(1e-3, p50):,.1f}× the "
                      f"call's P50 of {p50:,.0f} µs (no other process on the GPU, no "
                      "throttle seen: longer kernels or a bigger input)",
            "evidence": {"gpu_wait_us": wait, "p50_us": round(p50, 1),
                         "launches": split.get("launches"), "syncs": split.get("syncs")}}


def _copies(split: dict, sp: Any) -> dict:
    c = split["copies"]
    slow = next((x for x in split.get("causes") or [] if x["cause"] == "gpu_copy"), None)
    size = f", {c['bytes']:,} B" if c.get("bytes") else ""
    detail = f"{c['count']} copy(ies){size} took {split['parts']['copies']:,.0f} µs"
    if slow is not None:
        detail = slow["detail"]
    return {"cause": "gpu_copy", "score": 1.0, "strength": 1.0, "detail": detail,
            "evidence": {"copies": c["count"], "bytes": c.get("bytes"), "copies_us": c["us"],
                         **((slow or {}).get("evidence") or {})}}


def _cpu_stretch(body: dict, ev: dict, part: str, ranges: Ranges, excess_us: float,
                 sp: Any) -> dict | None:
    """The CPU cause of the enqueue stretch or of the completion lag: what ran instead of the
    caller on its CPU there, else (enqueue) the on-CPU rules, else (lag) a late wake-up; None
    where nothing the timeline allows names it."""
    tl = ev["timeline"]
    cpu = tl.get("cpu", "?")
    ran = ran_in(tl, sp.start_ns, ranges)
    whole = {c: n for c, (n, _) in ran_in(tl, sp.start_ns, [(sp.start_ns, sp.end_ns)]).items()}
    stretch = "the enqueue (call start → last launch)" if part == "enqueue" else \
        "the completion lag (GPU done → the caller running)"
    if ran:
        cause, (ns, label) = max(ran.items(), key=lambda kv: kv[1][0])
        if ns >= STRETCH_MIN_SHARE * excess_us * 1e3:
            entry = {"cause": cause, "score": round(min(1.0, ns / 1e3 / excess_us), 3),
                     "strength": 1.0,
                     "detail": f"{label} ran {ns / 1e3:,.0f} µs on CPU {cpu} in {stretch} "
                               "(kernel events)",
                     "evidence": {"events_us": round(ns / 1e3, 1)}}
            m = _TASK.match(label)
            if cause == "cpu_contention" and m:
                entry["evidence"]["ran_on_cpu"] = [
                    {"comm": m["comm"], "pid": int(m["tid"]), "tid": int(m["tid"]),
                     "cpu": cpu, "run_us": round(ns / 1e3), "from": "kernel events"}]
            if verdict.contradiction(entry, ev, whole, sp.excess_ns) is None:
                return entry
    if part == "enqueue":
        return verdict.on_cpu_cause(body, ev, whole, int(excess_us * 1e3))
    if ran:
        return None   # others ran, not enough to name: not a late wake-up either
    return {"cause": "wakeup_latency", "score": 1.0, "strength": 1.0,
            "detail": f"CPU {cpu} ran nothing else in {stretch}: the caller's wake-up after "
                      "the GPU finished came late (kernel events)",
            "evidence": {}}
