"""Run the clock-gap recorder on candidate CPUs and attribute what it saw from /proc deltas.

The recorder (agent/noise/hftnoise.c, compiled on first use into the cache directory by the
same trusted builder as watch's native reader, collectors/native.py) is pinned to one CPU and
spins for the scan's duration. It never outlives us: the scan kills its recorders on any
exception, and a recorder whose hftagent died (SIGKILL included) exits at once (its lifeline,
collectors/native.py). A few CPUs are scanned at a time — at most a quarter of the online CPUs, never the
housekeeping ones — so that the scan itself does not crowd the machine.

Around each batch the per-CPU columns of /proc/interrupts, /proc/softirqs and /proc/stat are
read, so every gap count can be set against the IRQs, softirqs, timer ticks and steal that
landed on that CPU meanwhile. Counts, not times: /proc cannot say how long each one ran.
A gap rate well above everything /proc counted is ``hw_or_hypervisor`` (SMIs, a host that
descheduled the vCPU: correlated with steal ticks where the kernel counts them).

With ``--trace`` (a :class:`agent.noise.events.Tracer`), a private tracefs instance on the
batch's CPUs is opened before its recorders start and closed after, and each CPU's time is
attributed exactly from the kernel events (``causes_source: "events"``; agent.noise.events);
where the instance cannot be had, the /proc deltas above stand (``"proc"``) with the reason.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent.errors import AgentError
from agent.noise.rank import CpuNoise

if TYPE_CHECKING:
    from agent.noise.events import Tracer
    from collectors.native import Helper
from collectors.host import Host
from collectors.parsers import parse_interrupts, parse_proc_stat, parse_softirqs

SOURCE = Path(__file__).with_name("hftnoise.c")
MAX_GAPS = 200_000          # kept per CPU (3.2 MB); past that only counted
MAX_DURATION_S = 60.0


def build() -> Helper:
    """The compiled recorder (cached; started through collectors.native.command). Raises
    AgentError naming why it cannot be built."""
    from collectors.native import NativeUnavailable
    from collectors.native import build as build_native
    try:
        return build_native(SOURCE, "hftnoise", "noise recorder")
    except NativeUnavailable as exc:
        raise AgentError(str(exc)) from None


@dataclass
class Counters:
    """Per-CPU counters at one instant: {cpu: {source: count}}."""

    by_cpu: dict[int, dict[str, int]]


# /proc/interrupts rows that are per-CPU architecture events, by what they mean for a CPU.
_ARCH = {"LOC": "tick", "RES": "ipi:reschedule", "CAL": "ipi:function_call",
         "TLB": "ipi:tlb_shootdown", "IWI": "ipi:irq_work", "NMI": "nmi", "PMI": "nmi",
         "MCE": "mce", "THR": "thermal", "SPU": "spurious", "PIN": "ipi:posted",
         "NPI": "ipi:posted", "PIW": "ipi:posted", "HYP": "hypervisor_callback",
         "HRE": "hyperv_reenlightenment", "HVS": "hyperv_stimer"}


def read_counters(host: Host) -> Counters:
    """IRQs by name, arch rows, softirqs by vector and steal ticks, per CPU. Unreadable files
    just contribute nothing (the attribution then says less, never something false)."""
    out: dict[int, dict[str, int]] = {}
    r = host.read(host.proc("interrupts")).map(parse_interrupts)
    if r.ok:
        cols, rows = r.value
        for row in rows:
            if len(row.counts) != len(cols):
                continue
            if row.numeric:
                name = "irq:" + (row.desc.split()[-1] if row.desc.split() else row.irq)
            else:
                name = _ARCH.get(row.irq, "irq:" + row.irq)
            for cpu, n in zip(cols, row.counts):
                d = out.setdefault(cpu, {})
                d[name] = d.get(name, 0) + n
    s = host.read(host.proc("softirqs")).map(parse_softirqs)
    if s.ok:
        cols, vecs = s.value
        for vec, counts in vecs.items():
            if vec in ("TIMER", "HRTIMER", "NET_RX", "NET_TX", "BLOCK", "IRQ_POLL", "TASKLET",
                       "SCHED", "RCU"):
                for cpu, n in zip(cols, counts):
                    out.setdefault(cpu, {})[f"softirq:{vec}"] = n
    st = host.read(host.proc("stat")).map(parse_proc_stat)
    if st.ok:
        for cpu, t in st.value.cpus.items():
            if cpu >= 0 and "steal" in t:
                out.setdefault(cpu, {})["steal_ticks"] = t["steal"]
    return Counters(out)


def attribute(before: Counters, after: Counters, cpu: int, duration_s: float,
              gaps_per_s: float) -> dict[str, float]:
    """Per-second counts of what landed on ``cpu`` during its scan, top sources first, plus
    ``hw_or_hypervisor``: the gaps per second that nothing /proc counts explains."""
    b, a = before.by_cpu.get(cpu, {}), after.by_cpu.get(cpu, {})
    rates = {k: (a[k] - b.get(k, 0)) / duration_s for k in a if a[k] - b.get(k, 0) > 0}
    steal = rates.pop("steal_ticks", 0.0)
    events = sum(v for k, v in rates.items() if not k.startswith("softirq:"))
    # a softirq mostly runs on the exit of the IRQ that raised it: the same gap, not another
    top = dict(sorted(rates.items(), key=lambda kv: -kv[1])[:6])
    unexplained = max(0.0, gaps_per_s - events)
    if unexplained > 0.5 * gaps_per_s and unexplained >= 1.0:
        top["hw_or_hypervisor"] = round(unexplained, 1)
    if steal:
        top["steal_ticks"] = round(steal, 1)
    return {k: round(v, 1) for k, v in top.items()}


def parse_output(cpu: int, text: str) -> CpuNoise:
    """The recorder's stdout → CpuNoise. Raises ValueError on output it did not write."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("hftnoise=1 "):
        raise ValueError("no header from the noise recorder")
    head = dict(w.split("=", 1) for w in lines[0].split() if "=" in w)
    try:
        t0, t1 = int(head["t0_ns"]), int(head["t1_ns"])
        gaps, kept = int(head["gaps"]), int(head["kept"])
        pairs = np.array([ln.split()[:2] for ln in lines[1:1 + kept]], dtype=np.int64)
        if pairs.shape != (kept, 2) and kept:
            raise ValueError(f"{len(pairs)} gap lines for kept={kept}")
        pairs = pairs.reshape(kept, 2)
        return CpuNoise(cpu=cpu, duration_s=(t1 - t0) / 1e9, gaps=gaps,
                        sum_gap_ns=int(head["sum_gap_ns"]), max_gap_ns=int(head["max_gap_ns"]),
                        gap_ns=pairs[:, 1].copy(), threshold_ns=int(head["threshold_ns"]),
                        min_gap_ns=int(head["min_gap_ns"]), dropped=gaps - kept,
                        gap_start_ns=pairs[:, 0].copy(), t0_ns=t0, t1_ns=t1)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"bad noise recorder output: {exc}") from None


def batches(cpus: list[int], online: int) -> list[list[int]]:
    """Candidate CPUs in groups of at most a quarter of the online CPUs (at least one)."""
    per = max(1, online // 4)
    return [cpus[i:i + per] for i in range(0, len(cpus), per)]


def scan(host: Host, cpus: list[int], online: int, duration_s: float, threshold_ns: int,
         exe: Helper | Path | None = None, progress: Callable[[list[int]], None] | None = None,
         tracer: Tracer | None = None, irq_sender: int | None = None,
         irq_coster: Callable | None = None) -> list[CpuNoise]:
    """Scan ``cpus`` (never the housekeeping ones: the caller checks), a batch at a time.
    With ``tracer`` (``--trace``), each batch's gaps are attributed from kernel events
    where the source opens (agent.noise.events), else from /proc deltas. With
    ``irq_sender`` (a housekeeping CPU), each scanned CPU's interrupt cost is measured too
    (agent/trace/irqcost.py, ~25 ms a CPU, one at a time after the batches): the figure
    ``hftagent watch --irq-cost US`` takes under an external client."""
    if not 0 < duration_s <= MAX_DURATION_S:
        raise AgentError(f"--duration must be > 0 and ≤ {MAX_DURATION_S:g} s")
    from agent.trace.guardian import clean_stale
    # what killed hftagents left in tracefs (uprobe groups, instances), where we may write
    stale = clean_stale(host)
    if tracer is not None:
        tracer.notes += stale
    own = exe is None
    exe = exe or build()
    out: list[CpuNoise] = []
    try:
        for group in batches(cpus, online):
            if progress:
                progress(group)
            # opened before the recorders start: the ring holds each one's switch-in
            src = tracer.open(group, duration_s) if tracer is not None else None
            try:
                out.extend(_scan_batch(host, group, duration_s, threshold_ns, exe, src,
                                       tracer))
            finally:
                if src is not None:
                    src.close()
    finally:
        if own:
            exe.close()
    if irq_sender is not None:
        if irq_coster is None:
            from agent.trace.irqcost import measure as irq_coster
        for r in out:
            if r.error is None:
                r.irq_cost = irq_coster(r.cpu, irq_sender).to_dict()
    return sorted(out, key=lambda r: r.cpu)


def _scan_batch(host: Host, group: list[int], duration_s: float, threshold_ns: int,
                exe: Helper | Path, src, tracer: Tracer | None) -> list[CpuNoise]:
    procs: dict[int, subprocess.Popen] = {}
    try:
        return _run_batch(host, group, duration_s, threshold_ns, exe, src, tracer, procs)
    finally:
        # an exception (a stop: SIGTERM/SIGINT in agent/commands/cpus.py) leaves no recorder
        # spinning; a dead hftagent's die by their lifeline (collectors/native.py)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()


def _run_batch(host: Host, group: list[int], duration_s: float, threshold_ns: int,
               exe: Helper | Path, src, tracer: Tracer | None,
               procs: dict[int, subprocess.Popen]) -> list[CpuNoise]:
    from collectors.native import command
    out: list[CpuNoise] = []
    before = read_counters(host)
    for c in group:
        # argv ends with PARENT_PID WATCH_FD: hftnoise dies with us (hftnoise.c)
        argv, fds = command(exe, str(c), str(int(duration_s * 1e9)), str(threshold_ns),
                            str(MAX_GAPS))
        try:
            procs[c] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, close_fds=True,
                                        pass_fds=fds)
        except OSError as exc:
            out.append(_failed(c, duration_s, f"cannot start the recorder: {exc.strerror}"))
    results = {}
    for c, p in procs.items():
        try:
            so, se = p.communicate(timeout=duration_s + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            results[c] = _failed(c, duration_s, "recorder did not finish in time")
            continue
        if p.returncode != 0:
            msg = se.decode(errors="replace").strip().splitlines()
            results[c] = _failed(c, duration_s, msg[0] if msg else f"exit {p.returncode}")
            continue
        try:
            results[c] = parse_output(c, so.decode(errors="replace"))
        except ValueError as exc:
            results[c] = _failed(c, duration_s, str(exc))
    after = read_counters(host)
    for c in group:
        if c in results:
            r = results[c]
            if r.error is None:
                r.causes = attribute(before, after, c, r.duration_s, r.gaps_per_s)
            out.append(r)
    if src is not None:
        _attribute_events(src, tracer, [r for r in out if r.error is None],
                          {c: p.pid for c, p in procs.items()})
    return out


def _attribute_events(src, tracer: Tracer, results: list[CpuNoise],
                      pids: dict[int, int]) -> None:
    """Each finished CPU's gaps from the batch's kernel events (agent.noise.events). A read
    that fails leaves that batch on /proc deltas, with the reason in the tracer's notes."""
    import time

    from agent.noise.events import read_batch
    t = time.perf_counter_ns()
    runs = [(r.cpu, pids[r.cpu], r.t0_ns, r.t1_ns) for r in results if r.cpu in pids]
    try:
        accs = read_batch(src, runs)
    except Exception as exc:  # noqa: BLE001 - a bad read must not lose the scan
        tracer.notes.append(f"events of CPU {','.join(str(c) for c, *_ in runs)} not read: "
                            f"{type(exc).__name__}: {exc}")
        return
    finally:
        tracer.read_ns += time.perf_counter_ns() - t
    slack = 1000 if getattr(src, "reader", "raw") == "text" else 0
    for r in results:
        acc = accs.get(r.cpu)
        if acc is None:
            continue
        starts = r.gap_start_ns if r.gap_start_ns is not None else np.zeros(0, np.int64)
        r.events = acc.result(starts, r.gap_ns, r.duration_s, slack_ns=slack)
        r.causes_source = "events"


def _failed(cpu: int, duration_s: float, why: str) -> CpuNoise:
    return CpuNoise(cpu=cpu, duration_s=duration_s, gaps=0, sum_gap_ns=0, max_gap_ns=0,
                    gap_ns=np.zeros(0, dtype=np.int64), error=why)


def pinned_processes(host: Host, cpus: list[int]) -> dict[int, list[str]]:
    """CPU → names of processes (other than us) whose affinity is that CPU alone: the work
    already placed there. psutil on the live host; nothing on a tree (no processes there)."""
    if not host.touches_live:
        return {}
    import psutil
    me = os.getpid()
    out: dict[int, list[str]] = {}
    want = set(cpus)
    for p in psutil.process_iter(["pid", "name", "cpu_affinity"]):
        aff = p.info.get("cpu_affinity") or []
        if p.info["pid"] != me and len(aff) == 1 and aff[0] in want:
            out.setdefault(aff[0], []).append(p.info.get("name") or str(p.info["pid"]))
    return out


def audit_finding(host: Host, target_cpus: list[int], housekeeping: list[int],
                  online: int, duration_s: float):
    """``hftagent audit --noise S``: scan the target CPUs (never the housekeeping ones) and
    judge them as one finding: warn when a target CPU is noisy (agent.noise.rank.judge),
    naming it and what landed there, with the quieter CPUs ``hftagent cpus`` would pick."""
    from agent.noise.rank import judge
    from collectors.parsers import format_cpulist
    from tuning.findings import Finding, Status
    cand = [c for c in target_cpus if c not in set(housekeeping)]
    why = ("a CPU that loses time to IRQs, the tick, kworkers or the hypervisor stretches "
           "every inference call that lands on it")
    if not cand:
        return Finding("noise.targets", "noise", "Noise on the target CPUs", Status.UNSUPPORTED,
                       current="unsupported: no target CPU besides the housekeeping core",
                       why=why)
    try:
        results = scan(host, cand, online, duration_s, 1000)
    except AgentError as exc:
        return Finding("noise.targets", "noise", "Noise on the target CPUs", Status.ERROR,
                       current=f"scan failed: {exc}", evidence="agent/noise/hftnoise.c",
                       why=why)
    judge(results)
    failed = [r for r in results if r.error]
    noisy = [r for r in results if r.verdict == "noisy"]
    quiet = [r.cpu for r in results if r.verdict == "quiet"]
    per = "; ".join(f"CPU {r.cpu} {r.noise_us_per_s:.0f} µs/s" for r in results if not r.error)
    if noisy:
        cur = ", ".join(f"CPU {r.cpu} noisy: {r.noise_us_per_s:.0f} µs/s lost ("
                        + ", ".join(f"{k} {v:g}/s" for k, v in list(r.causes.items())[:3])
                        + ")" for r in noisy)
        status = Status.WARN
    elif failed:
        cur, status = "; ".join(f"CPU {r.cpu}: {r.error}" for r in failed), Status.ERROR
    elif all(r.verdict == "quiet" for r in results):
        cur, status = f"all {len(results)} quiet ({per})", Status.OK
    else:  # one candidate between the absolute limits: not called quiet (agent.noise.rank)
        cur = ", ".join(f"CPU {r.cpu} {r.verdict}" for r in results) + \
            f" ({per}; {results[0].basis})"
        status = Status.OK
    return Finding(
        "noise.targets", "noise", "Noise on the target CPUs", status, current=cur,
        expected="no target CPU noisy (lost time over 3x the quietest and over "
                 "200 µs/s)",
        evidence=f"a pinned clock-gap loop for {duration_s:g} s on each of CPU "
                 f"{format_cpulist(cand)}; /proc/interrupts, /proc/softirqs deltas (audit "
                 "stays read-only: it makes no tracefs instance; `hftagent cpus --trace auto` "
                 "attributes the gaps from kernel events)",
        fix="" if status is Status.OK else
            (f"hftagent cpus (quiet candidates here: {format_cpulist(quiet)})" if quiet
             else "hftagent cpus"),
        why=why, data={"cpus": [r.to_dict() for r in results]})
