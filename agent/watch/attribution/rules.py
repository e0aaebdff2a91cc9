"""The rules between causes: what one cause family's finding does to another's, how the
findings of one cause are merged, and how the ranked scores and the "unexplained" residual
are made (:func:`combine`).

In this order:

1. **Kernel threads by name**: CPU contention whose top task is a kernel thread doing a
   cause's work is that cause (:data:`KERNEL_THREADS`): ``ksoftirqd/N`` is softirq work,
   ``migration/N`` the stopper thread that moves tasks.
2. **A move first**: when the sample ran outside the probe's CPUs, contention met on a CPU
   it was moved to is the move's consequence (× :data:`MOVED_FACTOR`).
3. **Its own page-in**: a sample that slept on its own page faults — the disk interrupts,
   BLOCK softirqs and kblockd work on its CPU are that I/O's completion, and the wait after
   it the wake-up: consequences of the faults, not separate causes (× :data:`PAGE_IN_FACTOR`),
   unless a run-queue wait measured in-process explains the sample by itself. One that
   paged in without sleeping: the BLOCK softirq on its CPU (its readahead's completions).
4. **Merge**: one score per cause, the strongest, with the evidence of all.
5. **Rank**: the residual "unexplained" is Π(1 − s) (each s capped at :data:`RESIDUAL_CAP`:
   no finding explains a sample entirely); scores are the strengths and the residual
   normalised to sum 1. The primary cause is the top one when its strength is at least
   :data:`MIN_STRENGTH`, else "unexplained".
"""

from __future__ import annotations

from agent.watch.attribution.spike import Attribution, CauseScore, Spike, wait_explains

MIN_STRENGTH = 0.35  # the top cause is named only from this strength on
RESIDUAL_CAP = 0.99  # a strength counts at most this much towards the residual
MOVED_FACTOR = 0.5  # contention on a CPU the sample was moved to
PAGE_IN_FACTOR = 0.5  # IRQs, softirqs and contention around the sample's own page-in
# (task name prefix, the cause it is, the detail it gets)
KERNEL_THREADS = (
    ("ksoftirqd/", "softirq", "softirq work in {comm} preempted the probe ({detail})"),
    ("migration/", "migration", "{comm} stopper thread preempted the probe ({detail})"),
)


def combine(scores: list[CauseScore], spike: Spike) -> Attribution:
    """The attribution of ``spike`` from its cause families' scores (each > 0)."""
    kernel_threads(scores)
    after_a_move(scores)
    own_page_in(scores, spike)
    ranked = merge(scores)
    resid = 1.0
    for c in ranked:
        resid *= 1.0 - min(c.strength, RESIDUAL_CAP)
    total = sum(c.strength for c in ranked) + resid
    for c in ranked:
        c.score = c.strength / total
    unexplained = resid / total
    primary = ranked[0].cause if ranked and ranked[0].strength >= MIN_STRENGTH \
        else "unexplained"
    return Attribution(primary, ranked, unexplained, spike.in_process())


def kernel_threads(scores: list[CauseScore]) -> None:
    """Rule 1: contention by a softirq or migration kernel thread is that cause, named."""
    for s in scores:
        if s.cause == "cpu_contention" and s.evidence.get("ran_on_cpu"):
            top = s.evidence["ran_on_cpu"][0]["comm"]
            for prefix, cause, detail in KERNEL_THREADS:
                if top.startswith(prefix):
                    s.cause = cause
                    s.detail = detail.format(comm=top, detail=s.detail)
                    break


def after_a_move(scores: list[CauseScore]) -> None:
    """Rule 2: in-process placement evidence first."""
    mig = next((s for s in scores if s.cause == "migration"), None)
    if mig is not None and mig.evidence.get("outside_probe_cpus"):
        for s in scores:
            if s.cause == "cpu_contention":
                s.strength *= MOVED_FACTOR
                s.detail += " (on a CPU it was moved to)"


def own_page_in(scores: list[CauseScore], spike: Spike) -> None:
    """Rule 3: the consequences of a sample's own page-in I/O. A sample that slept on its
    faults: the interrupts, softirqs and contention around it. One that paged in without
    sleeping (minor faults over its usual: swap-cache hits after readahead; or the page-ins'
    after-effect): the BLOCK softirq on its CPU, which completes the block I/O submitted
    there — its own readahead's (16-vCPU guest, memory_pressure: BLOCK 0.62 against 18 minor
    faults' 0.36 made a leader and the 26 samples queued behind it softirq)."""
    pf = next((s for s in scores if s.cause == "page_faults"), None)
    if pf is None:
        return
    blocked = bool(pf.evidence.get("blocked_in_call"))
    paged = blocked or any(k in pf.evidence for k in ("majflt", "minflt", "after_faults"))
    for s in scores:
        if blocked and (s.cause in ("irq", "softirq") or (
                s.cause == "cpu_contention" and not wait_explains(spike))) or \
                paged and s.cause == "softirq" and s.detail.startswith("softirq BLOCK "):
            s.strength *= PAGE_IN_FACTOR
            s.detail += " (completing or following the sample's own page-in I/O)"


def merge(scores: list[CauseScore]) -> list[CauseScore]:
    """Rule 4, then ranked by strength (ties in the families' order)."""
    merged: dict[str, CauseScore] = {}
    for s in scores:
        old = merged.get(s.cause)
        if old is None or s.strength > old.strength:
            if old is not None:
                s.evidence = {**old.evidence, **s.evidence}
            merged[s.cause] = s
        else:
            old.evidence = {**s.evidence, **old.evidence}
    return sorted(merged.values(), key=lambda c: -c.strength)
