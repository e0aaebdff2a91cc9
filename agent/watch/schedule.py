"""When each spike is attributed, and what happens to those that cannot be.

A detected spike waits (:class:`AttributionScheduler`) until the sampler has rows past its end
(plus the attributor's slack) and the sched collector's task scan covers it — or
:data:`SCAN_WAIT_NS` passed (attributed without knowing who ran), or :data:`MAX_WAIT_NS`
passed (attributed with what there is). Then, per loop step:

- **Queued** (open loop, :mod:`agent.watch.detect`): a sample queued behind a slow one takes
  that one's cause once the leader is logged ("queued behind spike N", ``inherited_from``);
  no rows of its own needed, no attribution spent. A follower whose leader still waits waits
  with it (a chain keeps its tail); one whose leader was logged unattributed is attributed
  on its own.
- **Rate limit**: a token bucket of ``max_per_s`` attributions a second, refilled
  continuously, at most :data:`BUCKET_BANK_S` of them banked. Over it, the step's tokens are
  spread evenly over its ready spikes (every stride-th is attributed) and the ones between
  inherit the cause of the last attributed spike when it is within :data:`INHERIT_NS` (the
  same sampler rows), else are logged "not attributed: attribution rate limit" — a storm
  stays named throughout instead of its first spikes taking every token.
- **Watch's CPU budget** (:mod:`agent.watch.budget`): while watch's always-on parts alone
  spend it, a ready spike on the same CPU as the last attributed one whose window covers the
  same sampler rows against the same baseline (``same_rows``: the attributor's; its polled
  rules would weigh the same host evidence) takes its cause ("watch's CPU budget
  (…) spent by its always-on parts: the cause of spike N"), unless the call had major
  faults of its own: the polled rules are the one cost of a storm that grows with its spikes
  (issue #38). ``shed``: the budget's :meth:`~agent.watch.budget.CpuBudget.shed_note`.
- **Step budget**: one step attributes for at most :data:`ATTR_STEP_BUDGET` of the loop
  period (checked before each attribution, so one may overrun it), so a storm cannot stretch
  the loop (the run's ``--duration``, the live view, the metrics); the rest waits for the
  next step. One that has waited :data:`BUDGET_INHERIT_NS` already takes the cause of the
  last attributed spike when it is within :data:`INHERIT_NS` ("attribution step budget: the
  cause of spike N"), in that step or, after a step that ran out, at the start of the next
  (not its first full attribution), so a storm that costs more to attribute than the
  budget allows stays named within ~0.1 s of detection (issue #17: spike → record ≤ 200
  ms). The wait is one loop period, 50 ms: under a softirq flood on a 16-vCPU guest a window read and
  walk took 20-25 ms, so at 0.1 s a burst's leaders, 2-3 ms apart, took a step each and the
  last waited 220 ms. One that waited as long with no attributed spike that close is
  attributed without its kernel-event window (the polled rules only; its record's
  ``events`` says "not read: attribution step budget"), within :data:`LIGHT_STEP_BUDGET`
  more of the loop period and the rate limit's tokens: the window is what a storm's spikes cost (7-13 ms of read under
  a 16-vCPU guest's flood, against ~1 ms for the polled rules). A spike still waiting after
  :data:`BACKLOG_DROP_S` is logged "not attributed: attribution backlog (spike storm)"
  rather than years late.

The scheduler decides; a :class:`Sink` (the session) attributes, logs and drops. The clock
(monotonic ns) is injected, so storms run on virtual time in tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from agent.watch.attribution import Spike

ATTR_STEP_BUDGET = 0.6  # share of loop_s one step may spend attributing spikes
LIGHT_STEP_BUDGET = 0.2  # and past it, attributing waiting ones without their event windows
BACKLOG_DROP_S = 2.0  # a spike waiting longer than this for attribution is logged unattributed
BUDGET_INHERIT_NS = 50_000_000  # past the step budget, a spike that already waited this long
                                 # takes a close spike's cause instead of waiting on
INHERIT_NS = 50_000_000  # over the rate limit: a spike this close to the last attributed one
                         # (five 100 Hz sampler rows) takes its cause
BUCKET_BANK_S = 0.1  # the token bucket holds at most this many seconds of tokens (≥ 1)
SCAN_WAIT_NS = 500_000_000  # rows there but no task scan yet: attribute without it after this
MAX_WAIT_NS = 900_000_000  # no rows yet: attribute with what there is after this
REMEMBER = 4096  # logged spikes kept by seq (a queued sample looks its leader up)


class Sink(Protocol):
    """What the scheduler asks of the session."""

    def attribute(self, sp: Spike, *, events: bool = True) -> dict:
        """Attribute ``sp`` and log it; the record (may raise: logged "attribution error").
        ``events=False``: without reading its kernel-event window (past the step budget)."""

    def log(self, sp: Spike, body: dict) -> dict:
        """Log ``sp`` with a cause it inherits (``body``: cause, causes, inherited_from...)."""

    def drop(self, sp: Spike, why: str) -> None:
        """Log ``sp`` "not attributed: ``why``"."""


class TokenBucket:
    """``rate`` tokens a second, refilled continuously, at most ``max(1, BUCKET_BANK_S ×
    rate)`` held (full at the start)."""

    def __init__(self, rate: float, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.rate = rate
        self.capacity = max(1.0, BUCKET_BANK_S * rate)
        self.tokens = self.capacity
        self.clock = clock
        self._t = clock()

    def refill(self) -> None:
        t = self.clock()
        self.tokens = min(self.capacity, self.tokens + (t - self._t) / 1e9 * self.rate)
        self._t = t

    def take(self) -> bool:
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class AttributionScheduler:
    """The pending spikes and the rules above. ``slack`` of the rows is the caller's: it
    passes the time its rows cover minus the attributor's slack."""

    def __init__(self, *, max_per_s: float, loop_s: float,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.clock = clock
        # set together by the session that has a CPU budget: its note while it sheds polled
        # rules (else None), and whether two spikes' polled rules see the same sampler rows
        self.shed: Callable[[], str | None] | None = None
        self.same_rows: Callable[[Spike, Spike], bool] | None = None
        self.shed_n = 0  # spikes that took a close spike's polled cause (the CPU budget)
        self.bucket = TokenBucket(max_per_s, clock)
        self.step_budget_ns = int(loop_s * ATTR_STEP_BUDGET * 1e9)
        self.light_budget_ns = int(loop_s * LIGHT_STEP_BUDGET * 1e9)
        self.light = 0  # attributed without their event windows (past the step budget)
        self._over_budget = False  # the last step ran out of its budget
        self.pending: list[tuple[Spike, int]] = []  # (spike, detected at, monotonic ns)
        self.inherited = 0  # logged with the cause of a spike ms away (over the rate limit)
        self.queued = 0  # logged with the cause of the slow sample they waited for
        self.last_attributed: tuple[Spike, dict] | None = None  # (spike, record)
        self._logged: dict[int, tuple[Spike, dict]] = {}  # seq → (spike, record), recent

    def add(self, sp: Spike, detected_ns: int) -> None:
        self.pending.append((sp, detected_ns))

    def step(self, now: int, rows_ns: int, scan_ns: int, sink: Sink) -> bool:
        """Attribute, inherit or drop what is ready at ``now``; ``rows_ns``: the sampler's
        rows cover up to here (less the attributor's slack), ``scan_ns``: the latest task
        scan. True when spikes still wait for rows (the caller pokes the sampler)."""
        if not self.pending:
            return False
        pending_seqs = {sp.seq for sp, _ in self.pending}
        ready, followers, keep = [], [], []
        for sp, t_det in self.pending:
            # A sample queued behind a slow one takes that one's cause once the leader is
            # logged — now, or later in this step when the leader is in this batch.
            if sp.queued_behind >= 0 and (sp.queued_behind in self._logged
                                          or sp.queued_behind in pending_seqs):
                followers.append((sp, t_det))
                continue
            waited = now - t_det
            rows_ready = rows_ns >= sp.end_ns
            scan_ready = scan_ns >= sp.end_ns
            if not (rows_ready and (scan_ready or waited > SCAN_WAIT_NS)) and \
                    waited < MAX_WAIT_NS:
                keep.append((sp, t_det))
            else:
                ready.append((sp, t_det))
        if ready:
            keep = self._batch(ready, now, sink) + keep
        waits = bool(keep)
        waiting = {x[0].seq for x in keep}
        for sp, t_det in followers:
            lead = self._logged.get(sp.queued_behind)
            if lead is not None:
                self._inherit(sp, lead, "queued", sink)
            elif sp.queued_behind in waiting:
                keep.append((sp, t_det))  # its leader waits for its rows: so does it
                waiting.add(sp.seq)  # (and a sample queued behind this one, after it)
            else:
                # its leader was logged unattributed: this one is attributed on its own
                keep.append((replace(sp, queued_behind=-1), t_det))
        self.pending = sorted(keep, key=lambda x: x[0].seq)
        return waits

    def drop_all(self, sink: Sink, why: str) -> None:
        """Log every pending spike "not attributed: ``why``" (the end of the run)."""
        for sp, _ in self.pending:
            sink.drop(sp, why)
        self.pending = []

    def _batch(self, ready: list, now: int, sink: Sink) -> list:
        """Attribute the ready spikes (oldest first) within the rate limit and the step's
        time budget; return those left for the next step."""
        self.bucket.refill()
        tokens = int(self.bucket.tokens)
        stride = 1 if len(ready) <= tokens else -(-len(ready) // max(tokens, 1))
        step_end = self.clock() + self.step_budget_ns
        # the last step ran out of its budget: a storm. A spike that has waited already and
        # lies close to the last attributed one takes its cause at once, as past the budget,
        # rather than the new step's first full attribution
        storm, self._over_budget = self._over_budget, False
        shed = self.shed() if self.shed is not None else None  # (once a step: it reads clocks)
        for n, (sp, t_det) in enumerate(ready):
            if storm and now - t_det >= BUDGET_INHERIT_NS and \
                    self._inherit_close(sp, "budget", sink):
                continue
            if shed is not None and self._shed(sp, shed, sink):
                continue
            if self.clock() > step_end:
                self._over_budget = True
                rest, keep = ready[n:], []
                light_end = step_end + self.light_budget_ns
                for osp, t_det in rest:
                    waited = now - t_det
                    if waited > BACKLOG_DROP_S * 1e9:
                        sink.drop(osp, "attribution backlog (spike storm)")
                    elif waited < BUDGET_INHERIT_NS:
                        keep.append((osp, t_det))
                    elif self._inherit_close(osp, "budget", sink):
                        pass
                    elif self.clock() < light_end and self.bucket.take():
                        self._attribute(osp, sink, events=False)
                        self.light += 1
                    else:
                        keep.append((osp, t_det))
                return keep
            if n % stride == 0 and self.bucket.take():
                self._attribute(sp, sink)
            else:
                self._inherit_or_drop(sp, sink)
        return []

    def _attribute(self, sp: Spike, sink: Sink, **kw) -> None:
        try:
            rec = sink.attribute(sp, **kw)
        except Exception as exc:  # noqa: BLE001 - one spike's failure is logged
            sink.drop(sp, f"attribution error: {type(exc).__name__}: {exc}")
        else:
            self._remember(sp, rec)
            self.last_attributed = (sp, rec)

    def _inherit_or_drop(self, sp: Spike, sink: Sink) -> None:
        """Over the rate limit: a spike within INHERIT_NS of the last attributed one shares
        its sampler rows, so it takes that spike's cause; any other is not attributed."""
        if not self._inherit_close(sp, "rate", sink):
            sink.drop(sp, "attribution rate limit")

    def _shed(self, sp: Spike, note: str, sink: Sink) -> bool:
        """The CPU budget sheds ``sp``'s polled rules: it takes the cause of the last
        attributed spike when that one ran on the same CPUs, its polled rules saw the same
        sampler rows (:attr:`same_rows`) and ``sp`` had no major fault of its own; False
        otherwise."""
        last = self.last_attributed
        if last is None or self.same_rows is None or sp.majflt > 0 or \
                (sp.cpu_start, sp.cpu_end) != (last[0].cpu_start, last[0].cpu_end) or \
                not self.same_rows(sp, last[0]):
            return False
        self._inherit(sp, last, "cpu", sink, _gap(sp, last[0]), note)
        self.shed_n += 1
        return True

    def _inherit_close(self, sp: Spike, why: str, sink: Sink) -> bool:
        """``sp`` takes the cause of the last attributed spike when it is within INHERIT_NS
        of it (the same sampler rows); False when there is none that close."""
        last = self.last_attributed
        gap = _gap(sp, last[0]) if last is not None else None
        if gap is None or gap > INHERIT_NS:
            return False
        self._inherit(sp, last, why, sink, gap)
        return True

    def _inherit(self, sp: Spike, lead: tuple[Spike, dict], why: str, sink: Sink,
                 gap: int = 0, budget: str = "") -> None:
        """Log ``sp`` with the cause of ``lead``, marked ``inherited_from``, with its own
        in-process evidence. ``why``: "queued" — it waited for that slow sample —, "rate" —
        over the rate limit, ``gap`` ns from it (the same sampler rows) —, "budget" — past
        the step budget — or "cpu" — watch's CPU budget (``budget``: its note) shed its
        polled rules."""
        lsp, lrec = lead
        limit = "attribution rate limit" if why == "rate" else "attribution step budget"
        if why == "queued":
            note = (f"queued behind spike {lsp.seq}: started "
                    f"{(lsp.end_ns - sp.start_ns) / 1e6:.1f} ms late")
        elif why == "cpu":
            note = (f"{budget}: the cause of spike {lsp.seq}, {gap / 1e6:.1f} ms apart on "
                    "the same CPU (the same sampler rows)")
        else:
            note = f"{limit}: the cause of spike {lsp.seq}, {gap / 1e6:.1f} ms apart"
        # the same record shape as an attributed spike: the host evidence is that of the
        # spike it inherits from (its rows), the in-process evidence its own
        rec = sink.log(sp, {"cause": lrec["cause"], "unexplained": lrec.get("unexplained"),
                            "causes": lrec.get("causes", []), "inherited_from": lsp.seq,
                            "note": note, "in_process": sp.in_process()})
        self._remember(sp, rec)
        if why == "queued":
            self.queued += 1
        else:
            self.inherited += 1

    def _remember(self, sp: Spike, rec: dict) -> None:
        """Keep the last REMEMBER logged spikes by seq (a queued one looks up its leader)."""
        self._logged[sp.seq] = (sp, rec)
        if len(self._logged) > REMEMBER:
            for k in list(self._logged)[:1024]:
                del self._logged[k]


def _gap(a: Spike, b: Spike) -> int:
    """The gap between two spikes' intervals, ns (0 when they overlap), either order."""
    return max(a.start_ns - b.end_ns, b.start_ns - a.end_ns, 0)
