"""Attribution accuracy of `hftagent watch` under injected faults (bench/faults/kit.py).

Runs a watch session (built-in probe on the probe CPU, sampler on the housekeeping CPU) with no
fault, then under each fault, and reports per fault: spikes, share attributed to the injected
cause ("right"), share attributed to another named cause ("wrong"), share left unexplained,
and the spike → attributed-record delay. Spikes that the kernel events show were the box's
own tasks or the host (hidden time, a late wake-up of an idle CPU: :func:`background`) are
counted apart, with right/wrong and culprit naming over the rest. ``--rescore`` scores the
spike logs of an earlier run (``--log-dir``) again without running anything. The
softirq flood's sender and receiver run on a third CPU where the host has one
(:func:`helper_cpu`; on a 2-CPU VM they share watch's). Needs root for softirq_flood (RPS),
memory_pressure and weights_pageout (process_madvise, and for memory_pressure swapon of a
temporary swap file when there is none).

    .venv/bin/python bench/attribution.py --probe numpy --duration 20 --json out.json

The latency source (``--source``): ``probe``, watch's built-in probe worker; ``service``,
bench/service.py (a serving loop the bench starts on the probe CPU: the numpy LSTM-shaped
model, or ``--model m.tflite`` on LiteRT) watched as an external process (``watch --pid``:
its calls come through agent.client's ring). ``attach`` (``watch --attach``, the same service
timed by uprobes without the client) plugs in at :func:`watch_config`. The faults that need the
service's switches (lock_holder, pipe_late, sleep_in_call, idle_wakeup) run only with
``--source service``; sigstop stops either. weights_pageout (issue #35) drops the pages of the
service's weights, mapped from a file (the numpy model is started with ``--mapped-weights``;
LiteRT maps its .tflite); smt_sibling_hog is skipped with one line where the probe CPU has no
SMT sibling. ``--gpu`` (issue #36) runs bench/gpu_service.py (a jitted JAX model) and the GPU
faults (kit.GPU_FAULTS) instead, with ``--source service`` or ``attach`` (JAX's dispatch,
:data:`GPU_ATTACH_SYMBOL`); where JAX or its GPU is missing it says so in one line and exits 0.

The not-runnable faults (kit.EXPECTED_BY) are scored on the cause's name and, where the spike
record carries it, on who ended the stall. The contract the watch side follows: the entry of
the record's ``causes`` whose ``cause`` is the record's (normally ``causes[0]``) may carry in
its ``evidence``

- ``state``: the state the call's thread left the CPU in for its not-runnable part: "S", "D",
  "T" (or "t");
- ``waker_pid``: the process (thread-group id) of the task whose ``sched_waking``
  (``sched_wakeup`` where waking is absent) made the thread runnable again; null, or 0 (the
  idle task), when no task did: a timer's expiry, an interrupt;
- ``waker_tid``: that task's own thread id (a sibling thread of the same process: a lock handed
  over); ``waker``: a label, "timer" for an hrtimer's expiry;
- ``sender_pid``: the process (thread-group id) that sent the stopping signal
  (``signal_generate``'s task); ``signal``: its name.

A right-cause record with the key is "who checked"; it is "who right" when the waker is the
service's own process (lock_holder: and ``waker_tid``, where given, the thread that held the
lock), the kit's helper (pipe_late's writer; sigstop's sender), or no task (a timer:
sleep_in_call, idle_wakeup; ``waker``, where given, "timer"). ``state``, where given, is
checked against the fault's. For the not-runnable faults a verdict of a host cause
(:data:`HOST_CAUSES`) over the rest is counted apart (the target: none), and the CPU's idle
stretch before the stalled thread woke is the fault's own doing, not the host's
(:func:`background`), unless the timer that ended it was the loop's pacing sleep between calls
(it began, or was due, before the call began: :func:`_pacing_timer_late`). A spike named
``slow_code`` from its timeline alone (its runtime counted the whole excess, no CPU counters:
the code or the hardware under it ran slow) is the box's too under every fault but those
that slow the execution itself (:func:`_own_execution`).

    sudo .venv/bin/python bench/attribution.py --source service --duration 3 \
        --faults none,lock_holder,pipe_late,sigstop,sleep_in_call,idle_wakeup
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from agent.trace.timeline import (  # noqa: E402
    BACKLOG,
    HIDDEN_IRQ,
    HW,
    IDLE_BEFORE_WAKE,
    SLOWED,
)
from agent.watch.attribution import verdict  # noqa: E402
from agent.watch.probe_worker import auto_rate  # noqa: E402
from agent.watch.session import WatchConfig, WatchSession  # noqa: E402
from bench.faults import kit  # noqa: E402
from bench.service import Service  # noqa: E402
from collectors.parsers import parse_proc_stat  # noqa: E402


def watch_config(args, probe_cpu: int, hk_cpu: int, svc: Service | None) -> WatchConfig:
    """Watch's configuration for the source: its own probe, or the service by its pid."""
    from agent.watch.latency.attached import Attached
    from agent.watch.latency.probe import BuiltinProbe
    from agent.watch.latency.ring import ClientRing
    source = BuiltinProbe(args.probe, rate_hz=args.rate)
    if svc is not None:  # attach: uprobes on the unmodified service; else its client ring
        attached = Attached(svc.pid, "service", runtime="litert")
        if getattr(args, "gpu", False):  # JAX: no runtime of the catalogue, a symbol
            attached = Attached(svc.pid, "service", symbol=args.attach_symbol,
                                unsafe_return=True)
        source = {"attach": attached}.get(getattr(args, "source", "probe"),
                                          ClientRing(svc.pid))
    return WatchConfig(source=source, probe_cpus=[probe_cpu], housekeeping_cpus=[hk_cpu],
                       duration_s=None, k_p50=args.k, spike_log=None, baseline_s=10.0,
                       sampler=args.sampler, trace=args.trace, nice=args.watch_nice)


def run_one(fault: str | None, args, probe_cpu: int, hk_cpu: int) -> dict:
    svc = None
    if args.source in ("service", "attach"):
        # started here, on the main thread: its PR_SET_PDEATHSIG follows the thread that
        # started it; it outlives the run by a margin and is stopped below
        seconds = args.settle + args.duration + 120
        if args.gpu:
            from bench.gpu_service import GpuService
            svc = GpuService(cpu=probe_cpu, rate=args.rate, seconds=seconds)
        else:
            model = args.model or {"attach": ATTACH_MODEL}.get(args.source)
            # weights_pageout drops the pages of the numpy model's mapped weights (LiteRT
            # maps its .tflite itself)
            mapped = "/var/tmp" if fault == "weights_pageout" and not model else None
            svc = Service(cpu=probe_cpu, rate=args.rate, model=model, seconds=seconds,
                          mapped_weights=mapped)
    try:
        res = _run_watch(fault, args, probe_cpu, hk_cpu, svc)
    finally:
        done = svc.stop() if svc is not None else None
    if svc is not None:
        res["service"] = done  # its calls and the stalls its switches made
    return res


def _run_watch(fault: str | None, args, probe_cpu: int, hk_cpu: int,
               svc: Service | None) -> dict:
    records: list[dict] = []  # the records in memory (the same dicts as the JSONL log)
    s = WatchSession(watch_config(args, probe_cpu, hk_cpu, svc), on_record=records.append)
    s.start()
    pid = s.pid
    params: dict = {"source": args.source}
    if svc is not None:
        params["service"] = {k: svc.info.get(k) for k in ("pid", "tid", "model", "cpu")}
    # Baseline period without the fault, then the fault for the measured part.
    t_fault = time.monotonic() + args.settle
    t_end = t_fault + args.duration
    stack = contextlib.ExitStack()
    fault_error = None
    check0: dict = {}
    t_check0 = 0.0
    started = False
    spikes_before = 0
    rc = 0
    starter: threading.Thread | None = None
    start_errors: list[str] = []
    try:
        while time.monotonic() < t_end:
            s.step()
            if s.check_source():
                rc = 3
                break
            if not started and time.monotonic() >= t_fault:
                spikes_before = len(records)
                started = True
                check0, t_check0 = fault_check(pid), time.monotonic()
                params["p50_us"] = s.summary()["p50_us"]  # read here, not on the thread
                # Started on a thread: a fault's set-up (spawning 32 processes, calibrating
                # the RT hog) took 0.3-0.4 s, during which this loop did not step and every
                # spike's record waited, which measured the bench, not watch.
                starter = threading.Thread(target=_start_in_thread, args=(
                    fault, stack, args, s, pid, probe_cpu, hk_cpu, params, start_errors, svc),
                    daemon=True)
                starter.start()
            if start_errors:
                fault_error = start_errors[0]
                break
            time.sleep(0.05)
        check = _check_delta(check0, fault_check(pid), time.monotonic() - t_check0, probe_cpu) \
            if started else {}
    finally:
        if starter is not None:
            starter.join()
        stack.close()
        s.stop()
    return _result(fault, args, s, records, spikes_before, check, params, fault_error, rc)


def helper_cpu(probe_cpu: int, hk_cpu: int) -> int:
    """The CPU a fault's busy helper processes use: one neither the probe's nor watch's
    housekeeping CPU where the host has one (the lowest), else the housekeeping CPU."""
    spare = sorted(set(os.sched_getaffinity(0)) - {probe_cpu, hk_cpu})
    return spare[0] if spare else hk_cpu


def _start_in_thread(fault, stack, args, s, pid, probe_cpu, hk_cpu, params, errors,
                     svc=None) -> None:
    # this thread was started from watch's (reniced with --watch-nice): the fault's helpers
    # it starts must not inherit that
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 0)
    except OSError:
        pass
    try:
        _start_fault(fault, stack, args, s, pid, probe_cpu, hk_cpu, params, svc)
    except (RuntimeError, OSError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")


def _start_fault(fault, stack, args, s, pid, probe_cpu, hk_cpu, params, svc=None) -> None:
    """Enter the fault's context (kit raises when a helper dies at once); None: the control
    run, no fault."""
    if fault is None:
        return
    if fault in kit.EXPECTED_BY:
        _start_not_runnable(fault, stack, args, pid, helper_cpu(probe_cpu, hk_cpu), params,
                            svc)
    elif fault == "cpu_hog":
        params["pids"] = stack.enter_context(kit.cpu_hog(probe_cpu, nice=args.hog_nice))
    elif fault == "cpu_hog_rt":
        # The watch tests' hog: SCHED_FIFO, busy 3 × the probe's P50 so far
        # (at least 1.5 ms) of every ~4.9 × that (jittered)
        burst = kit.rt_burst_for((params.get("p50_us") or 500.0) / 1e3)
        params["rt_burst_ms"] = burst
        # SCHED_FIFO where a child may use it, else the same bursts at nice -10
        params["policy"] = "SCHED_FIFO 1" if kit.rt_permitted() else "nice -10"
        params["pids"] = stack.enter_context(kit.cpu_hog(
            probe_cpu, burst_ms=burst, rt_prio=1 if kit.rt_permitted() else 0,
            nice=0 if kit.rt_permitted() else -10))
    elif fault == "softirq_flood":
        # the flood's sender and receiver are busy all through each burst: on a host with a
        # third CPU they run there, not on watch's housekeeping CPU (what the fault injects
        # is the probe CPU's softirqs, not a watch starved of its own CPU)
        helper = helper_cpu(probe_cpu, hk_cpu)
        params["helper_cpu"] = helper
        params["pids"] = stack.enter_context(kit.softirq_flood(probe_cpu, helper))
    elif fault == "memory_pressure":
        stack.enter_context(kit.memory_pressure(pid))
    elif fault == "oversubscription":
        params["pids"] = stack.enter_context(kit.oversubscription(nice=args.hog_nice))
    elif fault == "migration":
        stack.enter_context(kit.migration(pid, (probe_cpu, hk_cpu),
                                          hz=args.migration_hz))
    else:
        _start_new_fault(fault, stack, args, pid, probe_cpu, hk_cpu, params, svc)


def _start_new_fault(fault, stack, args, pid, probe_cpu, hk_cpu, params, svc) -> None:
    """The on-CPU faults (issue #35) and the GPU faults (issue #36): ``params["injected"]``
    is the fault's own account, filled when it ends."""
    helper = helper_cpu(probe_cpu, hk_cpu)
    if fault == "smt_sibling_hog":
        inj = stack.enter_context(kit.smt_sibling_hog(probe_cpu))
    elif fault == "gpu_other_process":
        inj = stack.enter_context(kit.gpu_other_process(cpu=helper))
    elif fault == "gpu_enqueue_hog":  # cpu_hog_rt's bursts on the service's CPU
        params["rt_burst_ms"] = burst = kit.rt_burst_for((params.get("p50_us") or 500.0) / 1e3)
        rt = kit.rt_permitted()
        inj = kit.Injected(stack.enter_context(kit.cpu_hog(
            probe_cpu, burst_ms=burst, rt_prio=1 if rt else 0, nice=0 if rt else -10)))
    elif svc is None:
        raise RuntimeError(f"{fault} needs --source service or attach")
    elif fault == "weights_pageout":
        if not svc.info.get("weights"):
            raise RuntimeError("weights_pageout: the service reads no weights from a file")
        inj = stack.enter_context(kit.weights_pageout(svc.pid, svc.info["weights"],
                                                      hz=args.stalls_per_s, cpu=helper))
    elif fault == "gpu_long_kernel":
        inj = stack.enter_context(kit.gpu_long_kernel(svc, args.stalls_per_s))
    elif fault == "gpu_big_copy":
        inj = stack.enter_context(kit.gpu_big_copy(svc, args.stalls_per_s))
    else:
        raise RuntimeError(f"{fault}: not a fault of bench/faults/kit.py")
    params.update(pids=list(inj), injected=inj.info)


def _start_not_runnable(fault, stack, args, pid, helper, params, svc) -> None:
    """A fault of kit.EXPECTED_BY; ``params["who"]``: who the events should name (scored by
    :func:`who_figures`), ``params["injected"]``: the fault's own account, filled when it
    ends."""
    hold, per_s = args.hold_ms, args.stalls_per_s
    if fault == "sigstop":
        inj = stack.enter_context(kit.sigstop(pid, hold, per_s, cpu=helper))
    elif svc is None:
        raise RuntimeError(f"{fault} needs --source service")
    elif fault == "lock_holder":
        inj = stack.enter_context(kit.lock_holder(svc, hold, per_s))
    elif fault == "pipe_late":
        inj = stack.enter_context(kit.pipe_late(svc, hold, per_s, cpu=helper))
    elif fault == "sleep_in_call":
        inj = stack.enter_context(kit.sleep_in_call(svc, hold, per_s))
    else:
        inj = stack.enter_context(kit.idle_wakeup(svc, args.slack_us, per_s))
    by, whom, state = kit.EXPECTED_BY[fault]
    who = {"by": by, "whom": whom, "state": state}
    if whom == "service":
        who.update(pids=[pid], tids=[inj.info["holder_tid"]])
    elif whom == "helper":
        who["pids"] = list(inj)
    params.update(pids=list(inj), who=who, injected=inj.info)


def _result(fault, args, s, records, spikes_before, check, params, fault_error, rc) -> dict:
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        with open(os.path.join(args.log_dir, f"{fault or 'none'}.jsonl"), "w") as fh:
            for r in records[spikes_before:]:
                fh.write(json.dumps(r) + "\n")
    summ = s.summary()
    out = {"fault": fault or "none", "samples": summ["samples"],
           "p50_us": summ["p50_us"], "p99_us": summ["p99_us"]}
    out.update(score(fault, records[spikes_before:], params))
    stats = getattr(s.source.reader, "stats", None)  # an attached source's pairing
    if callable(stats):
        out["attach"] = {**stats(), "warnings": s.warnings[-6:]}
    out.update({"sampler": summ["sampler"].get("mode"),
                "sampler_cpu_share": summ["sampler"].get("cpu_share_of_one_cpu"),
                "source_error": summ["source_error"], "rc": rc,
                "trace": s.trace.info(),
                "fault_check": check, "fault_params": params, "fault_error": fault_error})
    return out


def score(fault: str | None, records: list[dict], params: dict) -> dict:
    """The figures of one fault from its spike records (what watch wrote, or a log of it:
    ``--rescore``)."""
    recs = [r for r in records if "cause" in r and r.get("cause")]
    n = len(recs)
    causes = Counter(r["cause"] for r in recs)
    exp = kit.EXPECTED.get(fault) if fault else None
    right = causes.get(exp, 0) if exp else 0
    unexpl = causes.get("unexplained", 0)
    wrong = n - right - unexpl
    bg = background(recs, exp, params.get("pids") or [], fault)
    fault_n = n - len(bg)
    bg_causes = Counter(r["cause"] for r in recs if r["seq"] in bg)
    right_fault = right - (bg_causes.get(exp, 0) if exp else 0)
    wrong_fault = wrong - sum(v for c, v in bg_causes.items() if c not in (exp, "unexplained"))
    delays = sorted(r["attributed_after_ms"] for r in recs)
    # Unexplained spikes of their own: the time the thread lost neither on the CPU (as the
    # guest counts it) nor waiting on its run queue — IRQ time or the hypervisor's (steal).
    gaps = sorted((r["latency_us"] - r["in_process"]["cpu_ns"] / 1e3
                   - max(0, r["in_process"]["rq_delay_ns"]) / 1e3) / 1e3
                  for r in recs if r["cause"] == "unexplained" and r.get("inherited_from") is None
                  and (r.get("in_process") or {}).get("cpu_ns") is not None)  # (not attach's)
    return {"expected": exp, "spikes": n,
            "right": right, "wrong": wrong, "unexplained": unexpl,
            "inherited": sum(1 for r in recs if r.get("inherited_from") is not None),
            "not_attributed": sum(1 for r in records if "cause" in r and r["cause"] is None),
            "queued": sum(1 for r in recs if r.get("note", "").startswith("queued behind")),
            "right_share": round(right / n, 3) if n and exp else None,
            "wrong_share": round(wrong / n, 3) if n else None,
            # the box's own tasks and the host, as the events saw them (see background)
            "background": len(bg), "background_tasks": dict(Counter(bg.values()).most_common(5)),
            "right_share_of_fault": round(right_fault / fault_n, 3) if fault_n and exp else None,
            "wrong_share_of_fault": round(wrong_fault / fault_n, 3) if fault_n else None,
            "causes": dict(causes.most_common()),
            "delay_ms_p50": delays[len(delays) // 2] if delays else None,
            "delay_ms_max": delays[-1] if delays else None,
            "unexplained_own": len(gaps),
            "unexplained_lost_ms_p50": round(gaps[len(gaps) // 2], 2) if gaps else None,
            "events": event_figures(fault, exp, recs, params.get("pids") or [], set(bg)),
            **contradiction_figures(recs),
            **(who_figures(fault, exp, recs, params.get("who") or {}, set(bg))
               if fault in kit.EXPECTED_BY else {})}


def contradiction_figures(recs: list[dict]) -> dict:
    """How many verdicts contradict their call's complete timeline (:func:`contradiction`;
    the target: 0), of how many with one, by why, with up to 5 of their seqs."""
    complete = [r for r in recs if r.get("inherited_from") is None
                and (r.get("events") or {}).get("complete")]
    found = [(r["seq"], why) for r in complete if (why := contradiction(r)) is not None]
    return {"complete_timelines": len(complete), "contradictions": len(found),
            "contradiction_kinds": dict(Counter(w for _s, w in found)),
            "contradiction_seqs": [seq for seq, _w in found[:5]]}


# What a not-runnable fault must never be named: a cause of the host or of another task on
# the CPU (issue #26: a stopped probe was named wakeup_latency for 272 of 328 spikes).
HOST_CAUSES = ("wakeup_latency", "cpu_contention", "irq", "softirq", "steal")
NOT_RUNNABLE = ("blocked", "stopped", "io_wait")


def _cause_entry(rec: dict) -> dict:
    """The ``causes`` entry of the record's own cause (normally the first)."""
    causes = rec.get("causes") or []
    return next((c for c in causes if c.get("cause") == rec.get("cause")),
                causes[0] if causes else {})


def who_right(who: dict, ev: dict) -> bool | None:
    """Whether a record's evidence names who ended the stall as ``who`` says (see the module
    docstring's contract); None when the evidence does not say (no ``waker_pid`` /
    ``sender_pid``)."""
    key = "sender_pid" if who.get("by") == "sender" else "waker_pid"
    if key not in ev:
        return None
    pid = ev[key]
    if who.get("whom") == "timer":
        return pid in (None, 0) and ev.get("waker", "timer") == "timer"
    if pid not in (who.get("pids") or []):
        return False
    tid = ev.get("waker_tid") if key == "waker_pid" else None
    return tid is None or not who.get("tids") or tid in who["tids"]


def who_figures(fault: str, exp: str | None, recs: list[dict], who: dict,
                bg: set[int] = frozenset()) -> dict:  # type: ignore[assignment]
    """A not-runnable fault's figures: over its right records not inherited from another
    spike, how many say who ended the stall and how many name the right one (and the state);
    over its records less those the events show the host or the box's tasks caused (``bg``:
    seqs, :func:`background`), how many blame the host or another task
    (:data:`HOST_CAUSES`)."""
    right = [r for r in recs if r["cause"] == exp and r.get("inherited_from") is None]
    checked = hit = st_checked = st_hit = 0
    for r in right:
        ev = _cause_entry(r).get("evidence") or {}
        ok = who_right(who, ev)
        if ok is not None:
            checked += 1
            hit += ok
        if ev.get("state") is not None and who.get("state"):
            st_checked += 1
            st_hit += str(ev["state"]).upper() == who["state"]
    rest = [r for r in recs if r["seq"] not in bg]
    host = 0 if exp in HOST_CAUSES else sum(1 for r in rest if r["cause"] in HOST_CAUSES)
    return {"who": {**who, "right_own": len(right), "checked": checked, "right": hit,
                    "right_share": round(hit / checked, 3) if checked else None,
                    "state_checked": st_checked, "state_right": st_hit},
            "host_named": host,
            "host_named_share": round(host / len(rest), 3) if rest and exp not in HOST_CAUSES
            else None}


# What names each fault's culprit in a spike's kernel-event breakdown (agent/trace):
# the kit's own tasks by pid for the CPU faults, the NET_RX softirq for the flood. The
# memory and migration faults have no culprit that runs instead of the probe (page reclaim
# and affinity flips happen in the probe's own context): culprit naming does not apply.
_TASK_FAULTS = ("cpu_hog", "cpu_hog_rt", "oversubscription")
# The causes the events see run instead of the probe (agent/watch/attribution/events.py), and
# no cause at all: a residual in their records is unexplained by the record too.
EVENT_VISIBLE = ("cpu_contention", "irq", "softirq", "unexplained")


def _names_culprit(fault: str, rec: dict, pids: list[int] | None) -> bool:
    """Whether the breakdown names the fault's culprit: a task of the kit (``pids``; None:
    any task with a pid, e.g. the box's own that ran there instead) or NET_RX."""
    whats = [b["what"] for b in rec["events"].get("breakdown", []) if b["what"] != "unexplained"]
    if fault in _TASK_FAULTS:
        if pids is None:
            ents = rec["events"].get("timeline", {}).get("entities", [])
            return any(e.get("kind") == "task" and e.get("label", "").endswith("]")
                       or e.get("kind") == "workqueue" for e in ents)
        tags = tuple(f"[{p}]" for p in pids)
        return any(t in w for w in whats for t in tags)
    if fault == "softirq_flood":
        return any("NET_RX" in w for w in whats)
    return False


def event_figures(fault: str | None, exp: str | None, recs: list[dict], pids: list[int],
                  box: set[int] = frozenset()) -> dict:
    """Per fault, over the spikes attributed directly (not inherited) that carry a kernel-
    event timeline: how many, the share of the right ones whose breakdown names the culprit
    (over the right ones that are not the box's or the host's, ``box``: :func:`background`),
    the unexplained time as a share of the summed excess over P50, and (for the quiet run)
    how many spikes blame a task of the fault kit."""
    timed = [r for r in recs if r.get("inherited_from") is None
             and "timeline" in (r.get("events") or {})]
    def residual(r: dict, also: tuple[str, ...] = ()) -> float:
        return sum(b["us"] for b in r["events"].get("breakdown", [])
                   if b["what"] == "unexplained" or b["what"] in also)

    unexpl = sum(residual(r) for r in timed)
    # the same without the in-situ slowdown estimate (measured items only)
    unexpl_measured = sum(residual(r, (SLOWED,)) for r in timed)
    excess = sum(max(0.0, r["latency_us"] - (r.get("p50_us") or 0.0)) for r in timed)
    # The residual of a spike whose cause lies inside the probe's own time (page faults,
    # migration: the polled rules name it from the probe's counters) is not unexplained by
    # the record, only invisible to the events; the record-level figure leaves it out.
    unexpl_rec = sum(residual(r) for r in timed if r["cause"] in EVENT_VISIBLE)
    tasks: Counter = Counter()
    for r in timed:  # what ran most instead of the probe, when that was a task
        ents = [e for e in r["events"]["timeline"].get("entities", []) if e["kind"] != "probe"]
        top = max(ents, key=lambda e: e["us"], default=None)
        if top is not None and top["kind"] == "task":
            tasks[top["label"]] += 1
    out = {"timed": len(timed), "top_tasks": dict(tasks.most_common(5)), "own": sum(1 for r in recs if r.get("inherited_from") is None),
           "unexplained_us": round(unexpl, 1), "excess_us": round(excess, 1),
           "unexplained_share": round(unexpl / excess, 4) if excess else None,
           "unexplained_share_measured_only":
               round(unexpl_measured / excess, 4) if excess else None,
           "unexplained_share_of_record": round(unexpl_rec / excess, 4) if excess else None}
    if fault in _TASK_FAULTS or fault == "softirq_flood":
        right = [r for r in timed if r["cause"] == exp and r["seq"] not in box]
        named = sum(1 for r in right if _names_culprit(fault, r, pids))
        # any task named (the box's own that ran instead of the kit's counts here)
        anyone = sum(1 for r in right if _names_culprit(fault, r, None))
        out.update(right_timed=len(right), culprit_named=named,
                   culprit_named_share=round(named / len(right), 3) if right else None,
                   culprit_named_any_share=round(anyone / len(right), 3) if right else None)
    return out


# What the host did, not the fault: time the probe was on its CPU while the guest did not
# run it (hidden time: steal), or its CPU idle while its wake-up came late (the host ran
# the halted vCPU late). Both are measured per spike by the kernel events (timeline.py).
HOST_ITEMS = {HW: "host: hidden time (steal)", IDLE_BEFORE_WAKE: "host: late wake-up"}
HOST_CAUSE = {HW: "steal", IDLE_BEFORE_WAKE: "wakeup_latency"}  # a fault that injects it


def background(recs: list[dict], exp: str | None, pids: list[int],
               fault: str | None = None) -> dict[int, str]:
    """The spikes the box's own tasks or the host caused, not the fault: seq → label.

    A box task: the verdict is contention and the kernel events show a task (or a kworker's
    work item) outside the fault kit (not one of ``pids``) on the probe CPU for at least
    half the excess over P50 and for longer than the kit's own tasks together (so a CPU
    fault's spike in which the box's kdamond ran instead of the kit's hogs is the box's).
    Under a not-runnable fault, a call that the events show running for its whole excess
    and not waiting (:func:`_ran_slow`) is not the fault's either.
    The host: the events' breakdown puts at least half the excess in :data:`HOST_ITEMS`
    (whatever the verdict: a contention verdict for a sample the host stole 1.9 of 2.3 ms
    from is not the CPU fault's doing), unless the fault injects that very cause; under a
    not-runnable fault the CPU's idle stretch before the thread woke is the fault's. Exact
    evidence, not the polled guess; a spike that inherited its cause from such a spike
    (queued behind it) follows it. A quiet box has them too: the control run counts them.
    Counted apart so that "right" and "culprit named" measure the fault; the raw shares
    stay in the output."""
    out: dict[int, str] = {}
    kit_tags = tuple(f"[{p}]" for p in pids)
    for r in recs:
        src = r.get("inherited_from")
        if src is not None:
            if src in out:
                out[r["seq"]] = out[src]
            continue
        excess = r["latency_us"] - (r.get("p50_us") or 0.0)
        if excess <= 0:
            continue
        label = _box_task(r, excess, kit_tags) or _host(r, excess, exp, fault)
        if label is not None:
            out[r["seq"]] = label
    return out


def _timeline(r: dict) -> dict:
    """A spike record's kernel-event timeline ({} where the events were not read)."""
    return (r.get("events") or {}).get("timeline") or {}


def _box_task(r: dict, excess: float, kit_tags: tuple[str, ...]) -> str | None:
    if r.get("cause") != "cpu_contention":
        return None
    ents = _timeline(r).get("entities") or []
    kit_us, others = 0.0, []
    for e in ents:
        if e.get("kind") not in ("task", "workqueue"):  # (kworkers' work items too)
            continue
        if kit_tags and e.get("label", "").endswith(kit_tags):
            kit_us += e["us"]
        else:
            others.append(e)
    top = max(others, key=lambda e: e["us"], default=None)
    if top is not None and top["us"] >= 0.5 * excess and top["us"] > kit_us:
        return top["label"]
    return None


# not-runnable faults whose own waits never end by a timer: a futex handed over by a thread,
# a pipe filled by a writer, a stop ended by SIGCONT (sleep_in_call's and idle_wakeup's do)
NOT_TIMER_FAULTS = ("lock_holder", "pipe_late", "sigstop")


def _timer_wait(r: dict) -> bool:
    """The record's own cause says the thread slept (S) until a timer woke it: a pacing sleep
    whose expiry came late, as the events read it (agent/trace/timeline.py)."""
    ev = _cause_entry(r).get("evidence") or {}
    return ev.get("state") == "S" and ev.get("waker") == "timer"


def _pacing_timer_late(r: dict) -> bool:
    """The events show a late wake-up from a timer that was due before the call began: the
    loop's own pacing sleep (between calls) fired late, not a wait the fault injected in
    the call (sleep_in_call's sleep starts inside it): the thread went to sleep, or its timer
    was due, before the call's start (the times are from it)."""
    parts = _timeline(r).get("parts") or []
    return any(p.get("kind") == "wakeup" and p.get("waker") == "timer" and (
        p.get("from_us", 0) < 0 or (p.get("timer_due_us") is not None and
                                    p["timer_due_us"] <= 0)) for p in parts)


RAN_SLOW = "slowed while running (no wait)"


def _ran_slow(r: dict, excess: float) -> bool:
    """The events show the call's thread on its CPU for the whole excess and waiting for at
    most a quarter of it (not runnable, or woken late): nothing a not-runnable fault does.
    A VM's host slows a running vCPU so (bench/own_slowdown.py: ~0.1-0.25 % of all calls on
    a quiet box); the control run has them too."""
    st = _timeline(r).get("state_us") or {}
    if not st or r.get("p50_us") is None:
        return False
    waited = st.get("not_runnable", 0.0) + st.get("wakeup", 0.0) + st.get("unknown", 0.0)
    return waited <= 0.25 * excess and st.get("on_cpu", 0.0) - r["p50_us"] >= 0.5 * excess


# the expected causes of the faults that slow the call's own execution on its CPU
OWN_EXECUTION_FAULTS = ("slow_code", "smt_sibling")


def _own_execution(r: dict) -> bool:
    """The record names ``slow_code`` from the timeline alone (sub-kind unknown: the call's
    runtime counted its whole excess, no CPU counters to say why): the code or the hardware
    under it ran slow, nothing a fault of the kit does but those that slow the execution
    itself (:data:`OWN_EXECUTION_FAULTS`); the control run has them too."""
    lead = (r.get("causes") or [{}])[0]
    return r.get("cause") == "slow_code" and \
        (lead.get("evidence") or {}).get("kind") == "unknown"


def _runnable_on_idle(r: dict, idle_us: float) -> bool:
    """The events show the thread runnable (woken, not yet running) for as long as its CPU
    idled: the idle CPU ran it late (the host's), the fault had already let it go."""
    st = _timeline(r).get("state_us") or {}
    return st.get("runnable", 0.0) >= 0.9 * idle_us


def _host(r: dict, excess: float, exp: str | None, fault: str | None = None) -> str | None:
    if fault in kit.EXPECTED_BY and _ran_slow(r, excess) or \
            exp not in OWN_EXECUTION_FAULTS and _own_execution(r):
        return RAN_SLOW
    bd = (r.get("events") or {}).get("breakdown") or []
    if exp in NOT_RUNNABLE and _pacing_timer_late(r):
        # the late pacing wake-up and the calls it queued (the backlog behind it)
        late = sum(b["us"] for b in bd if b["what"] in (IDLE_BEFORE_WAKE, BACKLOG))
        if late >= 0.5 * excess:
            return HOST_ITEMS[IDLE_BEFORE_WAKE]
    for b in bd:
        if b["what"] == IDLE_BEFORE_WAKE and exp in NOT_RUNNABLE and not (
                fault in NOT_TIMER_FAULTS and _timer_wait(r)) and not _pacing_timer_late(r) \
                and not _runnable_on_idle(r, b["us"]):
            # the fault kept the thread from running while its CPU idled: that idle stretch
            # is the fault's, not a late wake-up of the host's (it is what the fault tests),
            # unless the events say a timer ended it under a fault whose waits never do, or
            # the timer was the loop's pacing one, due before the call began, or the thread
            # was already runnable while the CPU idled
            continue
        if b["what"] in HOST_ITEMS and b["us"] >= 0.5 * excess and \
                HOST_CAUSE[b["what"]] != exp:
            return HOST_ITEMS[b["what"]]
    return None


# A verdict contradicts its call's complete timeline (issue #35; the target: none) when the
# timeline shows the call's thread on its CPU and the record names
# - contention, an IRQ or a softirq for which the timeline holds less than
#   CONTRADICTION_SHARE of the excess (contention: a task or work item that ran while the
#   thread waited; also time the timeline cannot account, where a preemption may lie:
#   hidden time, a state no event says), or steal with no time hidden from the thread
#   while it was on the CPU, where its CPU time was measured;
# - steal counted on another CPU than the call's;
# - a culprit (``ran_on_cpu``) the timeline does not show on the call's CPU.
# Looser than watch's own rule (agent/watch/attribution/verdict.py: 20 %): what is counted
# here is a verdict the timeline plainly denies.
CONTRADICTION_SHARE = 0.1
_TIMED = {"cpu_contention": ("task", "workqueue"), "irq": ("irq", "vector", "timer", "ipi"),
          "softirq": ("softirq",)}


def contradiction(r: dict) -> str | None:
    """Why the record's verdict contradicts its call's complete timeline (one of "steal on
    another CPU", "culprit not on the call's CPU", "<cause> not in the timeline"), or None
    (also for a record without a complete timeline, or whose thread the timeline never
    shows on its CPU)."""
    ev = r.get("events") or {}
    tl = ev.get("timeline") or {}
    if not ev.get("complete") or not tl or r.get("inherited_from") is not None:
        return None
    cause, entry, cpu = r.get("cause"), _cause_entry(r), tl.get("cpu")
    evidence = entry.get("evidence") or {}
    if cause == "steal" and any(k.startswith("cpu.") and k.endswith(".steal_ticks") and
                                k != f"cpu.{cpu}.steal_ticks" for k in evidence):
        return "steal on another CPU"
    labels = [e.get("label", "") for e in tl.get("entities") or []
              if e.get("kind") in ("task", "workqueue")]
    for who in evidence.get("ran_on_cpu") or []:
        if who.get("cpu") != cpu or not any(lb.startswith(f"{who.get('comm')}[")
                                            for lb in labels):
            return "culprit not on the call's CPU"
    if cause == "page_faults" and verdict.no_faults(entry, tl) is not None:
        return "page_faults not in the timeline"
    excess = r.get("latency_us", 0.0) - (r.get("p50_us") or 0.0)
    if not (tl.get("probe_run_us") or 0) > 0 or excess <= 0:
        return None
    held = _timeline_us(r, cause)
    if held is not None and held < CONTRADICTION_SHARE * excess:
        return f"{cause} not in the timeline"
    return None


def _timeline_us(r: dict, cause: str) -> float | None:
    """The µs the record's breakdown gives ``cause`` (with what the timeline cannot account,
    for contention); None for a cause the timeline does not see."""
    ev = r["events"]
    kinds = {e.get("label"): e.get("kind") for e in ev["timeline"].get("entities") or []}
    bd = ev.get("breakdown") or []
    if cause == "steal":
        if (ev.get("hw_noise") or {}).get("hidden_us") is None:
            return None
        return sum(b["us"] for b in bd if b["what"] == HW)
    if cause not in _TIMED:
        return None
    us = sum(b["us"] for b in bd if kinds.get(b["what"]) in _TIMED[cause])
    if cause == "cpu_contention":
        us += sum(b["us"] for b in bd if b["what"] == HW)
        us += (ev["timeline"].get("state_us") or {}).get("unknown") or 0.0
    else:  # the interrupts' hidden entry/exit and the slowdown after them
        us += sum(b["us"] for b in bd if b["what"] in (HIDDEN_IRQ, SLOWED))
    return us


def fault_check(pid: int) -> dict:
    """What each fault claims to produce, read from the kernel: NET_RX/NET_TX and softirq
    ticks per CPU, the probe's own faults, its threads' CPUs and migration counts."""
    st = open(f"/proc/{pid}/stat").read()
    f = st[st.rfind(")") + 2:].split()
    vm = {ln.split()[0]: int(ln.split()[1]) for ln in open("/proc/vmstat")}
    return {"softirq": kit.softirq_counts(), "minflt": int(f[7]), "majflt": int(f[9]),
            "pgmajfault": vm.get("pgmajfault", 0), "pswpin": vm.get("pswpin", 0),
            "threads": kit.thread_cpu_and_migrations(pid), "ticks": _cpu_ticks(),
            "cgroup": _cgroup_cpu_stat()}


def _cpu_ticks() -> dict[int, tuple[int, int]]:
    """CPU → (irq + softirq, steal) USER_HZ ticks from /proc/stat."""
    with open("/proc/stat") as fh:
        st = parse_proc_stat(fh.read())
    return {c: (t.get("irq", 0) + t.get("softirq", 0), t.get("steal", 0))
            for c, t in st.cpus.items() if c >= 0}


def _cgroup_cpu_stat() -> dict[str, int]:
    """This process's cgroup v2 cpu.stat (nr_throttled, throttled_usec): a container's CPU
    quota stops every task in it, which no run-queue figure of the probe shows."""
    try:
        rel = next(ln.split("::", 1)[1].strip() for ln in open("/proc/self/cgroup")
                   if ln.startswith("0::"))
        return {k: int(v) for k, v in (ln.split() for ln in
                                       open(f"/sys/fs/cgroup{rel}/cpu.stat"))}
    except (OSError, StopIteration, ValueError):
        return {}


def _check_delta(a: dict, b: dict, dt: float, probe_cpu: int) -> dict:
    if not a:
        return {}
    sa, sb = a["softirq"], b["softirq"]
    mig = [m1 - m0 for t, (_c, m0) in a["threads"].items()
           if t in b["threads"] and m0 is not None and (m1 := b["threads"][t][1]) is not None]
    return {
        "seconds": round(dt, 1),
        "net_rx_per_s_by_cpu": [round((y - x) / dt) for x, y in zip(sa["NET_RX"], sb["NET_RX"])],
        "softirq_share_of_probe_cpu": round((sb["softirq_ticks"][probe_cpu]
                                             - sa["softirq_ticks"][probe_cpu]) / (100 * dt), 3),
        "probe_minflt": b["minflt"] - a["minflt"], "probe_majflt": b["majflt"] - a["majflt"],
        "vmstat_pgmajfault": b["pgmajfault"] - a["pgmajfault"],
        "vmstat_pswpin": b["pswpin"] - a["pswpin"],
        "probe_thread_migrations": max(mig) if mig else None,
        "probe_cpu_irq_ticks": b["ticks"][probe_cpu][0] - a["ticks"][probe_cpu][0],
        "probe_cpu_steal_ticks": b["ticks"][probe_cpu][1] - a["ticks"][probe_cpu][1],
        "cgroup_throttled": {k: b["cgroup"].get(k, 0) - a["cgroup"].get(k, 0)
                             for k in ("nr_throttled", "throttled_usec")} if a["cgroup"] else None}


def parser() -> argparse.ArgumentParser:
    """The command line (main's)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", default="numpy", choices=("numpy", "tf"))
    ap.add_argument("--rate", default="500",
                    help="probe starts per second, or 'auto': 500/s or less so the probe "
                         "keeps its CPU ≤ 25 %% busy (its calls measured first; on a host where "
                         "the numpy probe takes 1.5 ms, 500/s keeps the CPU 75 %% busy and "
                         "response times measure the probe's own queue)")
    ap.add_argument("--k", type=float, default=3.0)
    ap.add_argument("--sampler", default="auto", choices=("auto", "native", "python"))
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=6.0)
    ap.add_argument("--hog-nice", type=int, default=0)
    ap.add_argument("--migration-hz", type=float, default=20.0)
    ap.add_argument("--source", default="probe", choices=("probe", "service", "attach"),
                    help="what watch times: its own probe (--probe), bench/service.py "
                    "watched by its pid (agent.client's ring), or the same service timed "
                    "without its ring by uprobes on LiteRT (watch --attach; default model "
                    "bench/models/lstm-64x32.tflite)")
    ap.add_argument("--model", help="--source service: a .tflite model the service runs on "
                    "LiteRT (default: the numpy LSTM-shaped probe)")
    ap.add_argument("--faults", help="comma-separated: none and kit.EXPECTED's names "
                    f"(default: {DEFAULT_FAULTS} for the probe, every fault but the GPU's "
                    f"for the service, {GPU_DEFAULT_FAULTS} with --gpu)")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU fault group: bench/gpu_service.py (a jitted JAX model) "
                    "instead of bench/service.py (--source service or attach); skipped with "
                    "one line, exit 0, where JAX or its GPU is missing")
    ap.add_argument("--attach-symbol", default=GPU_ATTACH_SYMBOL,
                    help="--gpu --source attach: the LIB:SYMBOL timed (default: jaxlib's "
                    "dispatch of a jitted call, which returns before the GPU is done)")
    ap.add_argument("--hold-ms", type=float, default=5.0,
                    help="not-runnable faults: how long each stall is")
    ap.add_argument("--stalls-per-s", type=float, default=4.0,
                    help="not-runnable faults: stalls a second (at random moments)")
    ap.add_argument("--slack-us", type=float, default=5000.0,
                    help="idle_wakeup: the timer slack of its late wake-ups")
    ap.add_argument("--trace", default="auto", choices=("auto", "on", "off", "mount"),
                    help="watch's kernel events (agent/trace): the culprit and "
                    "unexplained-time figures need them")
    ap.add_argument("--watch-nice", type=int, default=0,
                    help="watch --nice: its own threads' and helper's nice value (0: as is)")
    ap.add_argument("--json")
    ap.add_argument("--log-dir", help="write each fault's spike records (JSONL) here")
    ap.add_argument("--rescore", metavar="JSON",
                    help="run nothing: score again the spike logs in --log-dir of the run "
                    "that wrote JSON (its faults and their parameters), and print the tables")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.rescore:
        if not args.log_dir:
            ap.error("--rescore needs the --log-dir that run wrote")
        try:
            out = rescore(args.rescore, args.log_dir)
        except (OSError, ValueError, KeyError) as e:
            print(f"attribution: cannot rescore: {e}", file=sys.stderr)
            return 2
        report(out)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"rescored": args.rescore, "results": out}, fh, indent=1)
        return 0
    faults = fault_list(args.faults, args.source, args.gpu)
    if isinstance(faults, str) or args.model and (args.source == "probe" or args.gpu):
        why = faults if isinstance(faults, str) else \
            "--model is bench/service.py's (--source service, no --gpu)"
        print(f"attribution: {why}", file=sys.stderr)
        return 2
    if args.gpu and (why := kit.jax_gpu_missing()):
        print(f"attribution: --gpu skipped: {why}", file=sys.stderr)
        return 0
    online = sorted(os.sched_getaffinity(0))
    probe_cpu, hk_cpu = online[-1], online[0]
    if args.rate == "auto":
        if args.probe != "numpy" or args.model:
            ap.error("--rate auto measures the numpy probe only")
        p50_ms = kit.numpy_probe_p50_ms(probe_cpu)
        args.rate = auto_rate(int(p50_ms * 1e6))
        print(f"--rate auto: probe P50 {p50_ms:.3f} ms → {args.rate:g}/s", flush=True)
    else:
        args.rate = float(args.rate)
    out = []
    for f in faults:
        if why := unsupported(f, probe_cpu):
            print(f"attribution: {f} skipped: {why}", file=sys.stderr)
            continue
        try:
            res = run_one(None if f == "none" else f, args, probe_cpu, hk_cpu)
        except RuntimeError as exc:  # the service did not start (ServiceError), one line
            print(f"attribution: {exc}", file=sys.stderr)
            return 2
        out.append(res)
        print(json.dumps(res), flush=True)
    report(out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": out,
                       "loadavg": open("/proc/loadavg").read().split()[:3]}, fh, indent=1)
    return 0


ATTACH_MODEL = str(Path(__file__).resolve().parent / "models" / "lstm-64x32.tflite")
DEFAULT_FAULTS = ("none,cpu_hog,cpu_hog_rt,softirq_flood,memory_pressure,oversubscription,"
                  "migration,smt_sibling_hog")
# --gpu: bench/gpu_service.py and its faults
GPU_DEFAULT_FAULTS = ",".join(["none", *kit.GPU_FAULTS])
# What --source attach times in bench/gpu_service.py (JAX has no runtime in
# agent/trace/attach.py's catalogue): jaxlib's vectorcall of a jitted function, once per
# call, returning NULL on an error (no C++ exception crosses it: a return probe is safe).
# JAX dispatches asynchronously: the call returns once the work is queued, and the copy
# back, which waits for the GPU, comes after it — attach times the enqueue part only.
GPU_ATTACH_SYMBOL = "libjax_common:PjitFunction_tp_vectorcall"


def fault_list(text: str | None, source: str, gpu: bool = False) -> list[str] | str:
    """The faults to run, in order, or why not (one line): ``none`` and kit.EXPECTED's
    names; the service's switches only with ``--source service`` (or attach); the GPU
    faults only with ``--gpu`` (bench/gpu_service.py), which has no probe source."""
    if text is None:
        text = GPU_DEFAULT_FAULTS if gpu else DEFAULT_FAULTS if source == "probe" else \
            ",".join(["none", *(f for f in kit.EXPECTED if f not in kit.GPU_FAULTS)])
    names = [f.strip() for f in text.split(",") if f.strip()]
    if not names:
        return "--faults: no fault named"
    unknown = [f for f in names if f != "none" and f not in kit.EXPECTED]
    if unknown:
        return f"--faults: unknown {', '.join(unknown)} (known: none, {', '.join(kit.EXPECTED)})"
    if gpu and source == "probe":
        return "--gpu times bench/gpu_service.py: --source service or attach"
    need = [f for f in names if f in kit.SERVICE_FAULTS]
    if need and source == "probe":
        return f"--faults: {', '.join(need)} need the service's switches (--source service)"
    need = [f for f in names if f in kit.GPU_FAULTS]
    if need and not gpu:
        return f"--faults: {', '.join(need)} need --gpu (bench/gpu_service.py)"
    if gpu and "weights_pageout" in names:
        return "--faults: weights_pageout is bench/service.py's (not with --gpu)"
    return names


def unsupported(fault: str, probe_cpu: int) -> str | None:
    """Why ``fault`` cannot run on this box (one line), or None."""
    if fault == "smt_sibling_hog" and not kit.smt_siblings(probe_cpu):
        return f"unsupported: no SMT sibling of CPU {probe_cpu}"
    return None


def rescore(path: str, log_dir: str) -> list[dict]:
    """Each fault of the run that wrote ``path``, scored again from its log in ``log_dir``
    (the run's own figures that are not spike scores are kept)."""
    with open(path) as fh:
        results = json.load(fh)["results"]
    out = []
    for res in results:
        with open(os.path.join(log_dir, f"{res['fault']}.jsonl")) as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        fault = None if res["fault"] == "none" else res["fault"]
        out.append({**res, **score(fault, records, res.get("fault_params") or {})})
    return out


def report(out: list[dict]) -> None:
    pct = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    print(f"\n{'fault':<18}{'spikes':>7}{'right':>8}{'wrong':>8}{'unexpl':>8}  "
          f"{'P50 µs':>8}{'P99 µs':>9}  delay P50/max ms    box/host  right/wrong of the rest")
    for r in out:
        us = f"{100 * r['unexplained'] / r['spikes']:.0f}%" if r["spikes"] else "-"
        print(f"{r['fault']:<18}{r['spikes']:>7}{pct(r['right_share']):>8}"
              f"{pct(r['wrong_share']):>8}{us:>8}  {str(r['p50_us']):>8}"
              f"{str(r['p99_us']):>9}  {str(r['delay_ms_p50']) + '/' + str(r['delay_ms_max']):<18}"
              f"{r['background']:>9}  {pct(r['right_share_of_fault'])}/"
              f"{pct(r['wrong_share_of_fault'])}")
    print(f"\n{'fault':<18}{'timed':>7}{'culprit named':>20}{'unexpl time':>13}"
          f"{'of record':>11}{'no est.':>9}  top tasks (kernel events)")
    for r in out:
        e = r["events"]
        cn = "-" if e.get("culprit_named_share") is None else \
            f"{100 * e['culprit_named_share']:.0f}%"
        if e.get("culprit_named_any_share") is not None and r["fault"] in _TASK_FAULTS:
            cn += f" ({100 * e['culprit_named_any_share']:.0f}% any)"
        un = "-" if e["unexplained_share"] is None else f"{100 * e['unexplained_share']:.1f}%"
        ur = "-" if e["unexplained_share_of_record"] is None else \
            f"{100 * e['unexplained_share_of_record']:.1f}%"
        um = "-" if e.get("unexplained_share_measured_only") is None else \
            f"{100 * e['unexplained_share_measured_only']:.1f}%"
        print(f"{r['fault']:<18}{e['timed']:>7}{cn:>20}{un:>13}{ur:>11}{um:>9}  "
              f"{e['top_tasks']}")
    who = [r for r in out if r.get("who")]
    if who:
        print(f"\n{'fault':<18}{'expected':>16}{'right':>7}{'who said':>10}{'who right':>11}"
              f"{'state right':>13}{'host-named':>12}  who")
        for r in who:
            w = r["who"]
            exp = f"{r['expected']} {w.get('state', '')}"
            st = f"{w['state_right']}/{w['state_checked']}"
            print(f"{r['fault']:<18}{exp:>16}{w['right_own']:>7}{w['checked']:>10}"
                  f"{pct(w['right_share']):>11}{st:>13}"
                  f"{pct(r['host_named_share']):>12}  {w['by']} {w['whom']} "
                  f"{w.get('pids', '')}{' tid ' + str(w['tids']) if w.get('tids') else ''}")
    n = sum(r.get("contradictions", 0) for r in out)
    of = sum(r.get("complete_timelines", 0) for r in out)
    print(f"\nverdicts that contradict the call's complete timeline: {n} of {of} (target 0)"
          + "".join(f"; {r['fault']} {r['contradictions']} {r['contradiction_kinds']}"
                    for r in out if r.get("contradictions")))
    for r in out:
        if r.get("fault_error"):
            print(f"{r['fault']}: the fault did not run: {r['fault_error']}")


if __name__ == "__main__":
    sys.exit(main())
