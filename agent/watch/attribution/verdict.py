"""What a complete timeline says of a polled verdict (issue #35 item 1).

The polled rules read counters of a window around the call (the thread's run-queue wait
summed over 10-50 ms rows, steal ticks and IRQ counts of a CPU, the task scan's who-ran):
context, never proof that the call itself was delayed so. Where the call's own kernel-event
timeline is complete it is proof: :func:`contradiction` says when a cause the timeline sees
directly is not in it, :func:`overrule` replaces such a verdict, and :func:`from_timeline`
rewrites the surviving cause's detail and culprit from the timeline (a polled page_faults
verdict too, where the timeline counted the call's faults: :func:`faults_from_timeline`), so
that every number of a verdict on a complete timeline is the timeline's. The polled detail stays
(``polled_detail``) as context.

A cause the timeline sees directly (:data:`SEEN`) must hold at least
:data:`SUPPORT_MIN_SHARE` of the excess over P50 on the call's CPU: contention a run-queue
wait in which another task or work item ran, irq or softirq their handlers' time (and
their hidden entry/exit), steal the time hidden from the thread while it was on the CPU
(``hw_or_hypervisor``, where the call's CPU time was measured) and the steal counted on the
CPU the call ran on. Contention may also lie in time the timeline cannot account (hidden
time, a state no event says: a switch the window lacks); a thread the timeline never shows
on its CPU is not covered by it. What the timeline cannot see (frequency, NUMA, a move, the
GPU, PCIe; page faults where they were not recorded) happens inside the thread's own time on
the CPU and is never contradicted; a ``page_faults`` verdict that rests on the host's
counters only (pgmajfault, memory PSI: any process's) is, where the call's faults were
recorded and none came inside it (:func:`no_faults`).

A contradicted verdict is replaced, in this order, by the first of:

1. an **on-CPU rule** (:data:`ON_CPU_RULES`): a cause found inside the thread's own time on
   the CPU, ``decided_by: events``: :func:`page_faults` (the call's own faults, counted by
   the timeline, hold :data:`PAGE_FAULT_MIN_SHARE` of the excess), :func:`hidden` (time on
   the CPU that was not the thread's runtime, :data:`HIDDEN_MIN_SHARE`); the one with the
   largest share leads; :func:`smt_sibling` (another task on the SMT sibling of the call's
   CPU while the call kept it, :data:`SMT_MIN_SHARE`); :func:`~.pmu.slow_code` (its CPU
   counters: more instructions, a lower IPC or a lower clock than its calls' median, where
   ``watch --attach`` counted them); where none names the call, :func:`~.pmu.own_execution`
   (``slow_code``, sub-kind unknown: its runtime counted the whole excess, no counters to
   say why). A call the polled rules left
   unexplained asks the same rules (:func:`on_cpu`);
2. the next polled cause (strength ≥ ``MIN_STRENGTH``) the timeline does not contradict,
   ``decided_by: events+polled`` (the events overruled the first, the polled evidence named
   this one);
3. ``unexplained`` with its µs, ``decided_by: events``: not a polled guess.

The replaced cause is kept as ``polled_cause`` and why as ``contradicted``.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.watch.attribution.pmu import own_execution, slow_code
from agent.watch.attribution.rules import MIN_STRENGTH

SUPPORT_MIN_SHARE = 0.2  # a cause the timeline sees holds at least this share of the excess
# The causes a timeline sees directly, and what each one's time is in it
SEEN = {"cpu_contention": "time another task ran while the thread waited for the CPU",
        "irq": "interrupt time", "softirq": "softirq time",
        "steal": "time hidden from the thread while it was on the CPU"}
# On-CPU rules: (record body, its events dict, the timeline's ns per cause, excess ns) → a
# cause entry ({"cause", "detail", "evidence", "score", "strength"}) or None. Each names a
# cause with its own evidence from inside the thread's time on the CPU; the first that
# names one decides (ON_CPU_RULES, at the end of this module).
OnCpuRule = Callable[[dict, dict, dict[str, int], int], dict | None]
# page faults, hidden time name a call when their time holds at least this share of the excess
PAGE_FAULT_MIN_SHARE = 0.3
HIDDEN_MIN_SHARE = 0.3


def steal_cpu(entry: dict) -> int | None:
    """The CPU a polled steal cause counted its ticks on (its evidence's
    ``cpu.<N>.steal_ticks``), None when it does not say."""
    for key in (entry.get("evidence") or {}):
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "cpu" and parts[2] == "steal_ticks" and \
                parts[1].isdigit():
            return int(parts[1])
    return None


def contradiction(entry: dict, ev: dict, per: dict[str, int], excess_ns: int) -> str | None:
    """Why the complete timeline of ``ev`` contradicts the cause ``entry`` names (one line),
    or None. ``per``: the timeline's ns per cause over the excess (steal: hidden time)."""
    cause = entry.get("cause")
    tl = ev.get("timeline") or {}
    cpu = tl.get("cpu", "?")
    if cause == "page_faults":
        return no_faults(entry, tl)
    if cause == "migration":
        return no_migration(entry, tl, excess_ns)
    if cause == "steal":
        counted = steal_cpu(entry)
        if counted is not None and isinstance(cpu, int) and counted != cpu:
            return f"steal was counted on CPU {counted}; the call ran on CPU {cpu}"
        if (ev.get("hw_noise") or {}).get("hidden_us") is None:
            return None  # the thread's CPU time was not measured: the timeline cannot say
    if cause not in SEEN or not (tl.get("probe_run_us") or 0) > 0:
        return None  # (a thread never seen on the CPU: the timeline does not cover it)
    got = per.get(cause, 0)
    room = got
    if cause == "cpu_contention":
        # time the timeline cannot account: hidden from the thread while it was current (a
        # switch the window lacks looks the same as the hypervisor: docs/events.md), or in
        # no known state — a preemption may lie there
        unknown_us = (tl.get("state_us") or {}).get("unknown") or 0
        room += per.get("steal", 0) + int(unknown_us * 1e3)
    if room >= SUPPORT_MIN_SHARE * max(1, excess_ns):
        return None
    return (f"the timeline shows {got / 1e3:,.0f} µs of {SEEN[cause]} on CPU {cpu} in a "
            f"{excess_ns / 1e3:,.0f} µs excess")


# The memory rule's evidence from the call's own thread (agent/attribution/memory.py: its
# getrusage faults, slow after its own recent page-ins, its thread's schedstat faults)
OWN_FAULT_EVIDENCE = ("majflt", "minflt", "after_faults")


def no_faults(entry: dict, tl: dict) -> str | None:
    """Why a ``page_faults`` verdict resting on the host's counters only (pgmajfault,
    memory PSI: any process's faults and stalls in the window) names a call the timeline
    shows did not fault: its thread's faults were recorded over the whole call (the
    timeline's ``page_faults``) and none came inside it. A verdict with the call's own
    evidence (its getrusage faults, a slow run after its own page-ins, its thread's counted
    faults) is not contradicted: reclaim of its pages or cold caches need no fault in it."""
    pf = tl.get("page_faults")
    evidence = entry.get("evidence") or {}
    if pf is None or (pf.get("count") or 0) > 0 or any(
            k in OWN_FAULT_EVIDENCE or k.startswith("sched.") for k in evidence):
        return None
    return (f"the timeline counts no page fault of the thread inside the call on CPU "
            f"{tl.get('cpu', '?')}: the host's counters are other processes' faults")


def no_migration(entry: dict, tl: dict, excess_ns: int) -> str | None:
    """Why a ``migration`` verdict names a call that the timeline shows on one CPU from its
    start to its end (no move in it, none in the polled evidence either) while the stopper
    threads it names (``ran_on_cpu``: migration/N) ran there for less than
    :data:`SUPPORT_MIN_SHARE` of the excess: the polled window saw them, the call did not
    wait for them. A call that moved, or one the timeline never saw run, is not
    contradicted."""
    evidence = entry.get("evidence") or {}
    if not (tl.get("probe_run_us") or 0) > 0 or tl.get("migrations") or "cpu_start" in evidence:
        return None
    names = [w.get("comm") for w in evidence.get("ran_on_cpu") or [] if w.get("comm")]
    ran_us = sum(e.get("us") or 0 for e in tl.get("entities") or []
                 if any(str(e.get("label", "")).startswith(f"{n}[") for n in names))
    if ran_us * 1e3 >= SUPPORT_MIN_SHARE * max(1, excess_ns):
        return None
    who = ", ".join(names) or "no stopper thread"
    return (f"the timeline shows the thread on CPU {tl.get('cpu', '?')} throughout and "
            f"{who} running {ran_us:,.0f} µs in a {excess_ns / 1e3:,.0f} µs excess")


def overrule(body: dict, ev: dict, per: dict[str, int], excess_ns: int,
             unexplained_ns: int) -> bool:
    """Replace the record's cause where its complete timeline contradicts it (see the module
    docstring); True when it did."""
    causes = body.get("causes") or []
    polled = body.get("cause")
    entry = next((c for c in causes if c.get("cause") == polled), None)
    if entry is None:
        return False
    why = contradiction(entry, ev, per, excess_ns)
    if why is None:
        return False
    body["polled_cause"] = polled
    body["contradicted"] = {"cause": polled, "why": why}
    found = on_cpu_cause(body, ev, per, excess_ns)
    if found is not None:
        _lead(body, found, "events")
        return True
    for c in causes:
        if c is not entry and c.get("cause") not in ("unexplained", polled) and \
                (c.get("strength") or 0) >= MIN_STRENGTH and \
                contradiction(c, ev, per, excess_ns) is None:
            causes.remove(c)
            _lead(body, c, "events+polled")
            return True
    _lead(body, unexplained(ev, excess_ns, unexplained_ns, why), "events")
    return True


def _lead(body: dict, entry: dict, decided_by: str) -> None:
    body["cause"] = entry["cause"]
    body["decided_by"] = decided_by
    body.setdefault("causes", []).insert(0, entry)


def unexplained(ev: dict, excess_ns: int, unexplained_ns: int, why: str) -> dict:
    """The ``unexplained`` entry of a call whose timeline contradicts the polled cause and
    shows nothing else: its µs, and how long the thread was on the CPU."""
    tl = ev.get("timeline") or {}
    st = tl.get("state_us") or {}
    evidence = {"unexplained_us": round(unexplained_ns / 1e3, 1),
                "excess_us": round(excess_ns / 1e3, 1), "wall_us": tl.get("wall_us")}
    on = ""
    if "on_cpu" in st:
        evidence.update(on_cpu_us=st["on_cpu"], runnable_us=st.get("runnable"))
        on = f"; the thread was on CPU {tl.get('cpu', '?')} {st['on_cpu']:,.0f} of " \
             f"{tl.get('wall_us') or 0:,.0f} µs"
    return {"cause": "unexplained", "score": 1.0, "strength": 0.0, "evidence": evidence,
            "detail": f"nothing the timeline shows explains {unexplained_ns / 1e3:,.0f} µs of "
                      f"the {excess_ns / 1e3:,.0f} µs excess (kernel events){on}; not the "
                      f"polled cause: {why}"}


def from_timeline(entry: dict, ev: dict, per: dict[str, int],
                  top: dict[str, tuple[str, int]]) -> None:
    """The detail of a cause the timeline sees and supports, from the timeline: its time on
    the call's CPU and its top culprit (the polled detail kept as ``polled_detail``).
    Contention is named by :func:`~agent.watch.attribution.events.name_tasks`; steal only
    where hidden time was measured."""
    cause = entry.get("cause")
    if cause == "page_faults":
        faults_from_timeline(entry, ev)
        return
    if cause not in ("irq", "softirq", "steal") or per.get(cause, 0) <= 0:
        return
    if cause == "steal" and (ev.get("hw_noise") or {}).get("hidden_us") is None:
        return
    detail = entry.get("detail") or ""
    if detail.endswith("(kernel events)"):
        return
    cpu = (ev.get("timeline") or {}).get("cpu", "?")
    us = per[cause] / 1e3
    if cause == "steal":
        new = (f"{us:,.0f} µs hidden from the thread while it was on CPU {cpu}: the "
               "hypervisor ran something else (kernel events)")
    else:
        new = f"{top[cause][0]} ran {us:,.0f} µs on CPU {cpu} (kernel events)"
    entry["polled_detail"] = detail
    entry["detail"] = new
    entry.setdefault("evidence", {})["events_us"] = round(us, 1)


def faults_from_timeline(entry: dict, ev: dict) -> None:
    """A ``page_faults`` verdict the polled rules gave (getrusage's major faults, pgmajfault,
    memory PSI) to a call whose timeline counted its faults: the detail from the timeline —
    the count, their handlers' µs, those the thread slept in and its µs in D reading their
    pages — the polled one kept as ``polled_detail``. Where the faults were not recorded
    (no ``page_faults`` in the timeline) or none came inside the call, the polled detail
    stays (reclaim, a TLB shootdown, cold caches after a page-in need no fault of its own)."""
    tl = ev.get("timeline") or {}
    pf = tl.get("page_faults") or {}
    n, us, slept = pf.get("count") or 0, pf.get("us") or 0.0, pf.get("slept") or 0
    detail = entry.get("detail") or ""
    if n <= 0 or "kernel events" in detail:
        return
    io_us = sum(p.get("us") or 0.0 for p in tl.get("parts") or []
                if p.get("kind") == "io_wait") if slept else 0.0
    more = (f"; the thread slept in {slept:,} of them (major: their pages read), "
            f"{io_us:,.0f} µs in D") if slept else ""
    entry["polled_detail"] = detail
    entry["detail"] = (f"{n:,} page faults inside the call, up to {us:,.0f} µs in their "
                       f"handlers on CPU {tl.get('cpu', '?')}{more} (kernel events)")
    entry.setdefault("evidence", {}).update(page_faults=n, page_fault_us=us,
                                            faults_slept=slept, io_wait_us=round(io_us, 1))


def page_faults(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> dict | None:
    """``page_faults`` where the call's own user page faults (the timeline's
    ``page_faults``: exceptions:page_fault_user of the followed thread inside the call)
    took at least :data:`PAGE_FAULT_MIN_SHARE` of the excess: their count and µs (each
    fault's entry to the next event on the CPU, capped: an upper bound of the handler's
    time) in the detail; those the thread slept in (a read) apart."""
    tl = ev.get("timeline") or {}
    pf = tl.get("page_faults") or {}
    n, us = pf.get("count") or 0, pf.get("us") or 0.0
    if n <= 0 or us * 1e3 < PAGE_FAULT_MIN_SHARE * max(1, excess_ns):
        return None
    slept = pf.get("slept") or 0
    cpu = tl.get("cpu", "?")
    more = f"; the thread slept in {slept} of them (a read)" if slept else ""
    return {"cause": "page_faults", "score": round(min(1.0, us * 1e3 / max(1, excess_ns)), 3),
            "strength": 1.0,
            "detail": f"{n:,} page faults inside the call took up to {us:,.0f} µs of the "
                      f"{excess_ns / 1e3:,.0f} µs excess on CPU {cpu} (kernel events: each "
                      f"fault's entry to the thread's next event){more}",
            "evidence": {"page_faults": n, "page_fault_us": us, "faults_slept": slept,
                         "excess_us": round(excess_ns / 1e3, 1)}}


def hidden(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> dict | None:
    """``hidden`` where the call's time on the CPU that the scheduler did not count as the
    thread's runtime (the timeline's ``runtime.hidden_us``: wall time of its stretches
    between two runtime updates minus the runtime sched_stat_runtime reported for them,
    less each stretch's time outside the call)
    holds at least :data:`HIDDEN_MIN_SHARE` of the excess. The task clock leaves out what
    the hypervisor stole from the vCPU (PARAVIRT_TIME_ACCOUNTING) and an SMI's or NMI's
    time; a lower bound: only the stretches the events bound are measured."""
    tl = ev.get("timeline") or {}
    rt = tl.get("runtime") or {}
    h = rt.get("hidden_us") or 0.0
    if h * 1e3 < HIDDEN_MIN_SHARE * max(1, excess_ns):
        return None
    cpu = tl.get("cpu", "?")
    return {"cause": "hidden", "score": round(min(1.0, h * 1e3 / max(1, excess_ns)), 3),
            "strength": 1.0,
            "detail": f"{h:,.0f} µs of the {excess_ns / 1e3:,.0f} µs excess on CPU {cpu} was "
                      f"not the thread's runtime ({rt.get('runtime_us', 0):,.0f} µs counted "
                      f"in {rt.get('compared_us', 0):,.0f} µs on the CPU"
                      f"{_outside(rt)}: sched_stat_runtime): the hypervisor preempted the "
                      "vCPU, or an SMI/NMI ran (kernel events)",
            "evidence": {"hidden_us": h, "runtime_us": rt.get("runtime_us"),
                         "on_cpu_compared_us": rt.get("compared_us"),
                         "excess_us": round(excess_ns / 1e3, 1)}}


def _outside(rt: dict) -> str:
    """The compared stretches' time outside the call, where there is any (what hid there
    is left out of the hidden time)."""
    out = rt.get("outside_us") or 0
    return f", {out:,.0f} µs of it outside the call" if out else ""


# the SMT sibling names a call when another task ran there for this share of the excess
SMT_MIN_SHARE = 0.5
SMT_ON_CPU_SHARE = 0.9  # the call ran on its CPU for this share of its wall time at least


def kept_its_cpu(tl: dict) -> bool:
    """The call ran on its CPU without leaving it: no preemption, no block, no move, and on
    the CPU (interrupts on top included) for :data:`SMT_ON_CPU_SHARE` of its wall time."""
    st = tl.get("state_us") or {}
    wall = tl.get("wall_us") or 0
    return not (tl.get("preemptions") or tl.get("blocks") or tl.get("migrations")) and \
        (st.get("on_cpu") if "on_cpu" in st else tl.get("probe_run_us") or 0) >= \
        SMT_ON_CPU_SHARE * wall > 0


def smt_sibling(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> dict | None:
    """``smt_sibling`` where the call kept its CPU (:func:`kept_its_cpu`) and tasks other
    than idle and the call's own process ran on the SMT sibling of that CPU for at least
    :data:`SMT_MIN_SHARE` of the excess (the timeline's ``smt_sibling``: the sibling's
    sched_switch over the call, agent/watch/attribution/smt.py): they shared the core's
    execution units, caches and memory bandwidth. Its score is the share of the excess the
    call's own faults and hidden time leave (those are measured; the sibling's slowdown is
    not), so that a call whose faults took the excess is named for them."""
    tl = ev.get("timeline") or {}
    sib = tl.get("smt_sibling") or {}
    busy_ns = (sib.get("busy_us") or 0) * 1e3
    if not sib.get("tasks") or not kept_its_cpu(tl) or \
            busy_ns < SMT_MIN_SHARE * max(1, excess_ns):
        return None
    measured = ((tl.get("page_faults") or {}).get("us") or 0) + \
        ((tl.get("runtime") or {}).get("hidden_us") or 0)
    left = max(0.0, min(busy_ns, excess_ns - measured * 1e3))
    if left <= 0:
        return None
    top, cpu = sib["tasks"][0], tl.get("cpu", "?")
    return {"cause": "smt_sibling", "score": round(min(1.0, left / max(1, excess_ns)), 3),
            "strength": 1.0,
            "detail": f"{top['comm']} (pid {top['pid']}) ran {top['us']:,.0f} µs on CPU "
                      f"{sib['cpu']}, the SMT sibling of CPU {cpu}, during the call's "
                      f"{tl.get('wall_us') or 0:,.0f} µs (the call kept its CPU; "
                      f"{excess_ns / 1e3:,.0f} µs over its P50): they shared the core "
                      "(kernel events)",
            "evidence": {"sibling_cpu": sib["cpu"], "ran_on_sibling": sib["tasks"],
                         "sibling_busy_us": sib.get("busy_us"),
                         "sibling_idle_us": sib.get("idle_us"),
                         "excess_us": round(excess_ns / 1e3, 1)}}


ON_CPU_RULES: list[OnCpuRule] = [page_faults, hidden, smt_sibling, slow_code]


def on_cpu_cause(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> dict | None:
    """The on-CPU rules' cause with the largest share of the excess; where none names one,
    :func:`~.pmu.own_execution` (the excess was the thread's own execution, without counters
    to say why); None when that does not either."""
    found = [c for rule in ON_CPU_RULES if (c := rule(body, ev, per, excess_ns)) is not None]
    if not found:
        return own_execution(body, ev, per, excess_ns)
    return max(found, key=lambda c: c["score"])


def on_cpu(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> bool:
    """The first on-CPU rule that names a cause leads the record (``decided_by: events``):
    for a call the polled rules left unexplained, whose complete timeline decided nothing
    else. True when one did."""
    found = on_cpu_cause(body, ev, per, excess_ns)
    if found is None:
        return False
    if body.get("cause") not in (None, found["cause"]):
        body["polled_cause"] = body.get("cause")
    _lead(body, found, "events")
    return True
