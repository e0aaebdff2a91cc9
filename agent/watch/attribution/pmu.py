"""A slow call that kept its CPU, told apart by its CPU counters (issue #35 item 2e): it
**did more work** (instructions up on the calls' baseline), **ran slower** (IPC down: cache
and memory stalls) or **ran at a lower clock** (effective frequency = cycles / on-CPU ns
down). Cause ``slow_code``, the sub-kind in its detail and evidence.

The counts are exact per call: agent/trace/pmu.py samples the thread's cycles, instructions
and task clock at the call's entry and return uprobe hits (``watch --attach`` only; a perf
group per thread of the process). :class:`PerCall` keeps each call's counts for a while
(the spikes are attributed within a second or two), the medians of the last
:data:`BASELINE_CALLS` calls as the baseline, and :func:`annotate` puts them in a spike's
record as ``pmu``.

The three factors multiply exactly into the on-CPU time: t = instructions / (IPC × f), so
t / t₀ = (I / I₀) × (IPC₀ / IPC) × (f₀ / f) against the baseline medians, and each factor's
share of the growth is its log over log(t / t₀) (:func:`classify`). A factor past its
threshold (:data:`MORE_WORK`, :data:`LOWER_IPC`, :data:`LOWER_CLOCK`) may name the call; the
one with the largest share does; none past its threshold: nothing special (``kind`` None).

The on-CPU rule :func:`slow_code` (agent/watch/attribution/verdict.py ON_CPU_RULES) names it
for a call whose timeline shows it kept its CPU, with a score of the named factor's share of
the on-CPU growth that the excess over P50 holds.

Without counters for the call (no PMU exposed, as in most guests), :func:`own_execution`
still names ``slow_code`` where the timeline proves the excess was the thread's own
execution: it was on its CPU for nearly all of the call, its runtime stretches (sched_stat_runtime) cover the call and
counted all of it (no hidden time), its page faults were recorded, and what the breakdown
leaves unexplained holds :data:`OWN_MIN_SHARE` of the excess. The sub-kind is then
``unknown``: more work or a slower CPU (a busy SMT sibling of another guest, memory
bandwidth, a lower clock) cannot be told apart without counters, and the detail says so.
Asked only when no other on-CPU rule names the call.

``--pmu auto|on|off`` (:func:`arm`): auto counts where a hardware cycles counter opens for
the process, else says ``pmu: unsupported: <reason>`` once (the run's summary; ``attach
--check`` says the same); on refuses to run without one (one line, exit 2); off: nothing is
opened. Without a PMU nothing is reported: never a 0, never an estimate.

Equivalent by hand: ``perf stat -e cycles,instructions,task-clock -p PID`` (whole-process
totals, not per call) or ``perf record -e '{cycles,instructions,probe_lib:fn,
probe_lib:fn__return}:S' -p PID`` then ``perf script -F tid,time,event,period``.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from agent.errors import AgentError

MODES = ("auto", "on", "off")
BASELINE_CALLS = 1000   # the baseline: medians of the last this many calls counted
MIN_BASELINE = 30       # fewer calls counted: no baseline, no verdict
KEEP_CALLS = 20_000     # calls whose counts are kept for their spikes (the newest)
# a factor names the call from these ratios to its baseline median on
MORE_WORK = 1.25        # instructions ≥ 1.25 × the median: it did more work
LOWER_IPC = 0.8         # IPC ≤ 0.8 × the median: it ran slower (cache/memory)
LOWER_CLOCK = 0.85      # cycles / on-CPU ns ≤ 0.85 × the median: it ran at a lower clock
COUNTERS: Any = None   # the counter set (agent.trace.pmu.HARDWARE when None; tests: SOFTWARE)
KINDS = {"more_work": "did more work", "lower_ipc": "ran slower (lower IPC: cache/memory)",
         "lower_clock": "ran at a lower clock"}
# own_execution: the unexplained rest holds at least this share of the excess, the runtime
# stretches cover at least this share of the call's wall time
OWN_MIN_SHARE = 0.5
OWN_COVER = 0.9


def metrics(c: dict[str, int]) -> dict[str, float] | None:
    """The call's instructions, IPC, effective GHz and on-CPU ns from its counts (None
    without cycles, instructions and on-CPU time: a software-only group)."""
    cyc, ins, t = c.get("cycles"), c.get("instructions"), c.get("task_clock_ns")
    if not cyc or not ins or not t or cyc <= 0 or ins <= 0 or t <= 0:
        return None
    return {"instructions": float(ins), "ipc": ins / cyc, "ghz": cyc / t, "on_cpu_ns": float(t)}


def classify(call: dict[str, float], base: dict[str, float]) -> dict:
    """What made ``call`` (:func:`metrics`) longer on the CPU than ``base`` (the medians):
    ``{"kind": more_work|lower_ipc|lower_clock|None, "ratios": {...}, "shares": {...}}``,
    shares of log(t / t₀) per factor (they sum to 1 where the on-CPU time grew)."""
    ratios = {"instructions": call["instructions"] / base["instructions"],
              "ipc": call["ipc"] / base["ipc"], "ghz": call["ghz"] / base["ghz"]}
    logs = {"more_work": math.log(ratios["instructions"]),
            "lower_ipc": -math.log(ratios["ipc"]), "lower_clock": -math.log(ratios["ghz"])}
    total = sum(logs.values())
    shares = {k: round(v / total, 3) if total > 0 else 0.0 for k, v in logs.items()}
    past = {"more_work": ratios["instructions"] >= MORE_WORK,
            "lower_ipc": ratios["ipc"] <= LOWER_IPC, "lower_clock": ratios["ghz"] <= LOWER_CLOCK}
    named = [k for k in logs if past[k] and logs[k] > 0]
    kind = max(named, key=lambda k: logs[k]) if named and total > 0 else None
    return {"kind": kind, "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "shares": shares}


class PerCall:
    """Each counted call's counts by (tid, start_ns), and the baseline; fed the reader's rows
    (:meth:`feed`), told its threads (:meth:`set_threads`). ``counters``: an open
    :class:`agent.trace.pmu.Counters`."""

    def __init__(self, counters: Any, uprobes: Any = None) -> None:
        self.counters = counters
        self.uprobes = uprobes    # watch's (a trial's losers dropped there are dropped here)
        self.calls: OrderedDict[tuple[int, int], dict[str, int]] = OrderedDict()
        self.recent: deque[tuple[float, float, float, float]] = deque(maxlen=BASELINE_CALLS)
        self.pending: list[tuple[int, int, int, int]] = []   # (tid, t0, t1, reads tried)
        self.counted = self.unmatched = self.multiplexed = 0

    def set_threads(self, tids) -> None:
        self.counters.set_threads(tids)

    def feed(self, rows: list[list[int]]) -> None:
        """Drain the rings and join each call of ``rows`` (the reader's rows of
        agent.client.FIELDS: tid, start_ns, end_ns) to its samples; a call whose samples are
        not there yet is tried again on the next reads (:data:`agent.trace.pmu.
        PENDING_READS`)."""
        from agent.client import FIELDS
        from agent.trace import pmu
        ti, si, ei = FIELDS.index("tid"), FIELDS.index("start_ns"), FIELDS.index("end_ns")
        self.counters.read()
        dropped = getattr(self.uprobes, "dropped", None)
        if dropped and dropped & {p.name for p in self.counters.probes}:
            self.counters.drop(dropped)
        todo = self.pending + [(r[ti], r[si], r[ei], 0) for r in rows]
        self.pending = []
        for tid, t0, t1, tries in todo:
            g = self.counters.groups.get(tid)
            got = pmu.join(g.calls, t0, t1) if g else None
            if got is None:
                if g is not None and tries + 1 < pmu.PENDING_READS:
                    self.pending.append((tid, t0, t1, tries + 1))
                else:
                    self.unmatched += 1
                    if g is not None:
                        pmu.prune(g.calls, t1)
                continue
            if got == "multiplexed":
                self.multiplexed += 1
                continue
            self.add(tid, t0, pmu.counts(*got, names=self.names()))

    def names(self) -> set[str]:
        return {c.name for c in self.counters.counters}

    def add(self, tid: int, t0: int, c: dict[str, int]) -> None:
        self.counted += 1
        self.calls[(tid, t0)] = c
        if len(self.calls) > KEEP_CALLS:
            self.calls.popitem(last=False)
        m = metrics(c)
        if m is not None:
            self.recent.append((m["instructions"], m["ipc"], m["ghz"], m["on_cpu_ns"]))

    def of(self, tid: int, start_ns: int) -> dict[str, int] | None:
        return self.calls.get((tid, start_ns))

    def baseline(self) -> dict[str, float] | None:
        """The medians of the last :data:`BASELINE_CALLS` calls (None below
        :data:`MIN_BASELINE`)."""
        if len(self.recent) < MIN_BASELINE:
            return None
        med = np.median(np.array(self.recent), axis=0)
        return dict(zip(("instructions", "ipc", "ghz", "on_cpu_ns"), map(float, med)))

    def stats(self) -> dict:
        return {"counters": sorted(self.names()), "calls_counted": self.counted,
                "calls_unmatched": self.unmatched, "calls_multiplexed": self.multiplexed,
                "lost": self.counters.lost, "threads": self.counters.opened,
                "threads_failed": len(self.counters.failed)}

    def close(self) -> None:
        self.counters.close()


class Refused(AgentError):
    """``--pmu on`` where no hardware counter opens (watch exits 2)."""


class Unsupported:
    """``--pmu auto`` where no hardware counter opens: the one line, nothing opened."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def stats(self) -> dict:
        return {"status": self.reason}


def check_line(pid: int) -> str:
    """``attach --check``'s pmu line: what ``watch --attach --pmu auto`` would count, or
    ``unsupported: <reason>`` (the counters opened on the process's main thread to find out,
    closed at once)."""
    from agent.trace import pmu
    why = pmu.probe(pid)
    return why or ("cycles, instructions and on-CPU ns per call (a perf group per thread, "
                   "sampled at the call's entry and return)")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise AgentError(f"--pmu must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


def arm(run: Any, mode: str, warnings: list[str]) -> PerCall | Unsupported | None:
    """The per-call counters of an attached run (``run``: agent.watch.latency.attached.
    AttachedRun, started), handed to its reader; None for ``off`` and for other sources.
    ``on`` without a hardware counter: AgentError with the reason (watch exits 2)."""
    reader = getattr(run, "reader", None)
    uprobes = getattr(run, "_uprobes", None)
    if mode == "off":
        return None
    if reader is None or uprobes is None or not hasattr(reader, "pmu"):
        if mode == "on":
            raise Refused(f"--pmu on is for --attach PID (each attached call's counters), "
                          f"not {run.source.said}")
        return None
    from agent.trace import pmu
    counters = COUNTERS or pmu.HARDWARE
    why = pmu.probe(run.source.process, counters)
    if why is None:
        try:
            c = pmu.Counters(probes(uprobes), counters)
            per = PerCall(c, uprobes)
            per.set_threads(sorted(reader.threads()))
        except pmu.PmuError as exc:
            why = str(exc)
        except OSError as exc:
            why = f"unsupported: {exc.strerror or exc}"
        else:
            if per.counters.groups:
                reader.pmu = per
                return per
            per.close()
            why = "unsupported: no thread's counters opened (" + "; ".join(
                sorted(set(c.failed.values()))) + ")"
    if mode == "on":
        raise Refused(f"--pmu on: {why}")
    return Unsupported(why)


def probes(uprobes: Any) -> list:
    """The uprobes of watch's events (agent.trace.uprobe.Uprobes: ``call<i>``/``ret<i>`` on
    target i) as perf's own (agent.trace.pmu.Probe): the same pinned library and offset, the
    trial's dropped ones left out."""
    from agent.trace.pmu import Probe
    out = []
    for n in uprobes.names:
        if n in uprobes.dropped:
            continue
        t = uprobes.targets[int(n.removeprefix("call").removeprefix("ret"))]
        out.append(Probe(n, t.pin.probe_path, t.offset, n in uprobes.returns))
    return out


def annotate(per: Any, sp: Any, body: dict) -> dict | None:
    """The spike's call's counts, metrics and classification as ``body["pmu"]`` (where it
    was counted)."""
    if not isinstance(per, PerCall):
        return None
    c = per.of(sp.tid, sp.start_ns)
    if c is None:
        return None
    out: dict[str, Any] = {"counts": c}
    m, base = metrics(c), per.baseline()
    if m is not None:
        out.update(instructions=int(m["instructions"]), ipc=round(m["ipc"], 3),
                   ghz=round(m["ghz"], 3), on_cpu_us=round(m["on_cpu_ns"] / 1e3, 1))
        if base is not None:
            out["baseline"] = {"instructions": int(base["instructions"]),
                               "ipc": round(base["ipc"], 3), "ghz": round(base["ghz"], 3),
                               "on_cpu_us": round(base["on_cpu_ns"] / 1e3, 1)}
            out["slow_code"] = classify(m, base)
    body["pmu"] = out
    return out


def slow_code(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> dict | None:
    """``slow_code`` for a call that kept its CPU (:func:`~.verdict.kept_its_cpu`) whose
    counters name a factor (:func:`classify`): score = the factor's share × the on-CPU
    growth over the baseline median, as a share of the excess."""
    from agent.watch.attribution.verdict import kept_its_cpu
    p = body.get("pmu") or {}
    sc, base = p.get("slow_code") or {}, p.get("baseline") or {}
    kind = sc.get("kind")
    tl = ev.get("timeline") or {}
    if kind is None or not kept_its_cpu(tl):
        return None
    growth_ns = (p["on_cpu_us"] - base["on_cpu_us"]) * 1e3
    score = min(1.0, sc["shares"][kind] * growth_ns / max(1, excess_ns))
    if score <= 0:
        return None
    r = sc["ratios"]
    what = {"more_work": f"{p['instructions']:,} instructions, {r['instructions']:.2f}× its "
                         f"median {base['instructions']:,}",
            "lower_ipc": f"IPC {p['ipc']:.2f} against its median {base['ipc']:.2f}",
            "lower_clock": f"{p['ghz']:.2f} GHz (cycles / on-CPU ns) against its median "
                           f"{base['ghz']:.2f} GHz"}
    return {"cause": "slow_code", "score": round(score, 3), "strength": 1.0,
            "detail": f"the call {KINDS[kind]}: {what[kind]}; {p['on_cpu_us']:,.0f} µs on CPU "
                      f"{tl.get('cpu', '?')} against a median {base['on_cpu_us']:,.0f} µs "
                      f"(CPU counters; {sc['shares'][kind]:.0%} of the on-CPU growth)",
            "evidence": {"kind": kind, "instructions": p["instructions"], "ipc": p["ipc"],
                         "ghz": p["ghz"], "on_cpu_us": p["on_cpu_us"], "baseline": base,
                         "ratios": r, "shares": sc["shares"],
                         "excess_us": round(excess_ns / 1e3, 1)}}


def own_execution(body: dict, ev: dict, per: dict[str, int], excess_ns: int) -> dict | None:
    """``slow_code`` (sub-kind ``unknown``) for a call without CPU counters whose timeline
    proves its excess was the thread's own execution (module docstring): it was on its CPU
    and its runtime stretches covered :data:`OWN_COVER` of the call, and they hid nothing (``runtime.hidden_us`` 0: the task clock counted every µs, so the
    vCPU was not preempted); its faults were recorded; the breakdown's unexplained rest, less
    the faults' time, holds :data:`OWN_MIN_SHARE` of the excess. Score: that rest's share."""
    p = body.get("pmu") or {}
    if p.get("counts"):  # counters for the call: slow_code decides from them, or nothing
        return None
    tl = ev.get("timeline") or {}
    rt, pf = tl.get("runtime") or {}, tl.get("page_faults")
    wall = tl.get("wall_us") or 0
    on_cpu = (tl.get("state_us") or {}).get("on_cpu", 0)
    if not rt.get("stretches") or pf is None or rt.get("hidden_us") or \
            on_cpu < OWN_COVER * wall or \
            (rt.get("wall_us") or 0) - (rt.get("outside_us") or 0) < OWN_COVER * wall:
        return None
    rest = sum(b.get("us") or 0 for b in ev.get("breakdown") or ()
               if b.get("what") == "unexplained") - (pf.get("us") or 0)
    rest_ns = min(rest * 1e3, excess_ns)
    if rest_ns < OWN_MIN_SHARE * max(1, excess_ns):
        return None
    cpu = tl.get("cpu", "?")
    irq = sum(b.get("us") or 0 for b in ev.get("breakdown") or ()
              if b.get("what") != "unexplained")
    return {"cause": "slow_code", "score": round(min(1.0, rest_ns / max(1, excess_ns)), 3),
            "strength": 1.0,
            "detail": f"the call's own execution: {rest:,.0f} µs of the {excess_ns / 1e3:,.0f} "
                      f"µs excess on CPU {cpu}, all of it the thread's runtime "
                      f"({rt.get('runtime_us', 0):,.0f} µs counted in "
                      f"{rt.get('wall_us', 0):,.0f} µs on the CPU: nothing hidden), "
                      f"{pf.get('count', 0)} page faults, {irq:,.0f} µs of interrupts and "
                      "other tasks; "
                      "more work or a slower CPU (a busy SMT sibling of another guest, memory "
                      "bandwidth, a lower clock): no CPU counters here to tell which "
                      "(kernel events)",
            "evidence": {"kind": "unknown", "own_us": round(rest, 1),
                         "runtime_us": rt.get("runtime_us"), "on_cpu_us": rt.get("wall_us"),
                         "outside_us": rt.get("outside_us"), "faults": pf.get("count"),
                         "others_us": round(irq, 1),
                         "excess_us": round(excess_ns / 1e3, 1)}}
