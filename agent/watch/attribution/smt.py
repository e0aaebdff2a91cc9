"""What ran on the SMT sibling of a call's CPU during the call (issue #35 item 2d).

Two hardware threads of one core share its execution units, L1/L2 and the core's memory
bandwidth: a call that keeps its CPU runs slower while another task runs on the sibling,
and nothing on its own CPU says so. Where the core has a sibling
(/sys/devices/system/cpu/cpuN/topology/thread_siblings_list through the Host:
:func:`siblings`; ``lscpu -e``'s CORE column), the kernel-event instance traces the sibling
too (agent/watch/attribution/events.py adds it to the source's CPUs, so its
``tracing_cpumask`` holds it), and :func:`sibling_runs` reads the sibling's ``sched_switch``
(and the ``common_pid`` of its other events: a switch from idle is not recorded on every
kernel, 6.18 among them) over the call: each task's µs there, idle apart. The on-CPU rule
:func:`~.verdict.smt_sibling` names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

SHOWN = 3  # tasks listed in the record (largest first)


def siblings(host: Any, cpus: Iterable[int]) -> dict[int, list[int]]:
    """The other online hardware threads of each CPU's core ({} without SMT, or where the
    topology files are missing: nothing to add)."""
    if host is None:
        return {}
    from collectors.cpu import online_cpus, smt
    try:
        sib = smt(host, sorted(set(cpus))).siblings
        online = set(online_cpus(host).value or ())
    except (OSError, ValueError):
        return {}
    # only online siblings: the event source refuses an offline CPU (x86 drops an offline
    # thread from its core's list; not every architecture does)
    out = {c: sorted((set(v) - {c}) & online) for c, v in sib.items()}
    return {c: v for c, v in out.items() if v}


def _marks(events: Iterable[Any], cpu: int) -> list[tuple[int, int, int, dict[int, str]]]:
    """(ns, pid current just before, pid current just after, comms) of each event on ``cpu``,
    in time order: a switch changes the current task, any other event names it."""
    out = []
    for e in sorted((e for e in events if e.cpu == cpu), key=lambda e: e.ts_ns):
        if e.name == "sched_switch":
            prev, nxt = int(e.get("prev_pid", -1)), int(e.get("next_pid", -1))
            out.append((e.ts_ns, prev, nxt, {prev: e.get("prev_comm", ""),
                                             nxt: e.get("next_comm", "")}))
        else:
            out.append((e.ts_ns, e.pid, e.pid, {}))
    return out


def sibling_runs(events: Iterable[Any], cpu: int, t0: int, t1: int, own_pid: int,
                 comms: dict[int, str] | None = None,
                 tgid_of: Callable[[int], int | None] | None = None) -> dict:
    """What ran on CPU ``cpu`` (the sibling) in ``[t0, t1]``: ``tasks`` (comm, tid, pid, µs;
    largest first, the call's own process apart as ``own_us``), ``idle_us``, ``busy_us`` (the
    other tasks' µs) and ``unknown_us`` (between two events that disagree on who ran: a
    switch the kernel did not record). Between two events the task the first left current
    and the second found current ran, where they agree; before the first event the one it
    found current, after the last the one it left current."""
    marks = _marks(events, cpu)
    names: dict[int, str] = dict(comms or {})
    for m in marks:
        names.update({p: c for p, c in m[3].items() if c})
    before = [m for m in marks if m[0] <= t0]
    inside = [m for m in marks if t0 < m[0] < t1]
    ran: dict[int, int] = {}
    unknown = 0
    start, cur = t0, (before[-1][2] if before else inside[0][1] if inside else None)
    for ts, prev, nxt, _ in inside:
        if cur is not None and cur == prev:
            ran[cur] = ran.get(cur, 0) + ts - start
        else:
            unknown += ts - start
        start, cur = ts, nxt
    if cur is None:
        unknown += t1 - start
    else:
        ran[cur] = ran.get(cur, 0) + t1 - start
    tg = tgid_of or (lambda tid: tid)
    tasks, own = [], 0
    for tid, ns in ran.items():
        if tid <= 0:
            continue
        pid = tg(tid)
        if pid == own_pid or tid == own_pid:
            own += ns
            continue
        tasks.append({"comm": names.get(tid, "?"), "tid": tid,
                      "pid": pid if pid is not None else tid, "us": round(ns / 1e3, 1)})
    tasks.sort(key=lambda t: -t["us"])
    return {"cpu": cpu, "wall_us": round((t1 - t0) / 1e3, 1),
            "busy_us": round(sum(t["us"] for t in tasks), 1),
            "idle_us": round(ran.get(0, 0) / 1e3, 1), "own_us": round(own / 1e3, 1),
            "unknown_us": round(unknown / 1e3, 1), "tasks": tasks[:SHOWN]}
