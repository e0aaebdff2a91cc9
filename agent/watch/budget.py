"""What watch itself costs, and the CPU budget that bounds it (``watch --cpu-budget PCT``,
default 1 % of one CPU).

:class:`OwnCpu` measures watch's own CPU time, in all and by part. The whole is the process's
CPU time (CLOCK_PROCESS_CPUTIME_ID: every thread of watch — the loop, the sampler, the
exporter — never the probe worker or the watched service, which are other processes) plus
the native sampler's helper (its own CPU time, which it writes into the shared feed); the
parts are thread CPU clocks (CLOCK_THREAD_CPUTIME_ID) around each piece of work on the loop
thread, and the sampler thread's own clock:

    sampler      the sampler thread (and the native helper): the collectors' rounds
    source       reading the latency source: the latency ring, or for --attach the uprobe
                 events from the tracefs instance and their pairing into calls
    detection    the samples' bookkeeping: histogram, metrics, spike detection
    attribution  the polled rules of every spike (agent/watch/attribution) and its record
    events       exact attribution: a spike's kernel-event window read and timeline walk
                 (agent/watch/attribution/events.py, agent/trace)
    flight       the flight records (--flight-us)
    other        the rest: the exporter's scrapes, the live view, the loop's own turns

:class:`CpuBudget` is a token bucket of CPU nanoseconds that decides which spikes get exact
attribution. It fills at the budget (``share`` × one CPU) less what the always-on parts
(everything but ``events``) measurably spent over the same wall time, but never slower than
:data:`RESERVED` of the budget, or the CPU of one exact attribution every 2 s
(:data:`FLOOR_EXACT_PER_S`, at their measured cost) when that is less (so watch's whole cost
is at most the always-on parts plus that floor when those alone are over it: the summary
shows both; an overspend of theirs is owed by the refills after it, up to one burst, so the
floor holds over time and not only for each interval between two spikes), holds at most
:data:`BURST_S` seconds of the budget, and each exact attribution is charged its measured
cost afterwards. A spike that finds the bucket empty is still recorded, with the polled
rules' cause and the note :attr:`CpuBudget.note`: no spike is dropped. Where the always-on
parts alone spend the budget (their share over about :data:`ON_TAU_S`, until it falls under
:data:`SPENT_EXIT` of the budget), the budget also sheds the polled rules of a spike that lies
on the same CPU within ms of one that had them: it takes that spike's polled cause
(:meth:`CpuBudget.shed_note`, :mod:`agent.watch.schedule`), and the session asks the native
sampler for no extra round, has its helper's rounds come twice as far apart and steps just
after each (:meth:`CpuBudget.spent`, agent/watch/session.py, ``NativeSampler.slow``). The
bucket may go into debt by one attribution's cost (the cost is known only after), and never
further than :data:`BURST_S` of the budget, so a storm that ends is followed by exact
attribution again within seconds.

Both clocks are injected (``clock``: monotonic ns; the CPU readers of :class:`OwnCpu`):
tests run storms on virtual time and virtual CPU time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

PARTS = ("sampler", "source", "detection", "attribution", "events", "flight", "other")
LOOP_PARTS = ("source", "detection", "attribution", "events", "flight")  # thread clocks
EXACT = "events"  # the part the budget decides
BURST_S = 5.0  # the bucket holds this many seconds of the budget (1 %: 50 ms of CPU)
# exact attribution always earns at least this share of the budget: where the always-on parts
# alone spend the budget (a loaded or slow box), spikes would otherwise never get the exact
# story again, and skipping them would not bring the always-on parts under the budget anyway.
# A quarter, not a half (issue #38): in a storm of ~160 spikes a minute the always-on parts
# reach ~1.2 % of one CPU on a 2-vCPU VM, and half the 1 % budget on top came to 1.6-1.7 %,
# over the storm's 1.5 %; a quarter still gives ~2 exact attributions a second at ~1.4 ms each
RESERVED = 0.25
# ...and no more than one exact attribution every 1 / FLOOR_EXACT_PER_S seconds at their
# measured cost (a running mean), when that is less: the floor keeps the exact story coming,
# and in a storm of hundreds of spikes a minute one story every 2 s tells it as well as two a
# second — the quarter share was ~0.25 % of one CPU on top of always-on parts already at
# 1.5 % there (issue #38); an expensive attribution (20 ms under a softirq flood) still gets
# the quarter share's one every 8 s
FLOOR_EXACT_PER_S = 0.5
COST_WEIGHT = 0.2  # the running mean's weight of the newest exact attribution's cost
# the always-on parts' share of one CPU, smoothed over about this long: at or over the budget,
# a spike's polled rules are shed where a spike ms away on the same CPU had them (the same
# sampler rows: schedule.py), the one cost of a storm that grows with its spikes and that the
# exact part's floor cannot bound — the polled rules and record were 0.33-0.63 % of one CPU
# at 400-800 spikes a minute on a 16-CPU host, over always-on parts at 1.0-1.6 % (issue #38)
ON_TAU_S = 2.0
# ...and that holds until their share falls under this much of the budget (a Schmitt
# trigger): what past the budget saves (the polled rules shed, no round asked, the helper's
# rounds slowed: NativeSampler.slow) would otherwise bring a storm's share back just under
# the budget, end the savings, and bring it back over within seconds
SPENT_EXIT = 0.8
DEFAULT_PCT = 1.0
# a refill this soon after the previous one changes nothing worth its reads (the process's CPU
# clock, the helper's): ~20 µs each, several per spike in a storm (issue #38)
REFILL_NS = 1_000_000

Clock = Callable[[], int]


def parse_pct(value: float | None) -> float:
    """``--cpu-budget PCT`` as a share of one CPU (1 → 0.01); AgentError with one line
    unless 0 < PCT ≤ 100."""
    from agent.errors import AgentError
    if value is None:
        return DEFAULT_PCT / 100
    if not (0 < value <= 100):  # (NaN fails both)
        raise AgentError(f"--cpu-budget must be a share of one CPU in % (0 < PCT ≤ 100), "
                         f"not {value:g}")
    return value / 100


class OwnCpu:
    """Watch's own CPU time (module docstring). ``process_ns``: the process's CPU clock;
    ``thread_ns``: the calling thread's. :meth:`watch_sampler` names the sampler's readers
    once it runs; :meth:`begin` sets the zero (after start-up: the symbol reads, the
    interrupt-cost measurement and the kernel symbol table's load, which the session waits
    for, are start-up, not watch's running cost)."""

    def __init__(self, process_ns: Clock = time.process_time_ns,
                 thread_ns: Clock = time.thread_time_ns) -> None:
        self.process_ns = process_ns
        self.thread_ns = thread_ns
        self.parts = dict.fromkeys(LOOP_PARTS, 0)
        self._sampler_ns: Clock | None = None  # the sampler thread's CPU clock
        self._helper_ns: Clock | None = None   # the native helper's CPU time
        self._zero = (0, 0, 0)  # (process, sampler, helper) at begin()
        self._final: tuple[int, dict[str, int]] | None = None  # (total, by part) at end()

    def watch_sampler(self, thread_ns: Clock | None, helper_ns: Clock | None) -> None:
        """The sampler's CPU readers (None: not measured apart)."""
        self._sampler_ns, self._helper_ns = thread_ns, helper_ns

    def begin(self) -> None:
        self._zero = (self.process_ns(), _read(self._sampler_ns), _read(self._helper_ns))
        self.parts = dict.fromkeys(LOOP_PARTS, 0)
        self._final = None

    def end(self) -> None:
        """Keep the figures as they are now (the session's end, before the sampler's thread
        ends and its clock with it): later reads return these."""
        self._final = (self.total_ns(), self.by_part())

    def part(self, name: str) -> _Part:
        """Charge the calling thread's CPU time in the block (``with own.part(name):``) to
        part ``name``. (A small class, not a generator context manager: a loop step opens
        three or four, each paid cold after the step's sleep.)"""
        return _Part(self, name)

    def total_ns(self) -> int:
        """Watch's CPU time since :meth:`begin`: its process's and the native helper's."""
        if self._final is not None:
            return self._final[0]
        p0, _, h0 = self._zero
        return self.process_ns() - p0 + _read(self._helper_ns) - h0

    def by_part(self) -> dict[str, int]:
        """ns per part (:data:`PARTS`); ``other``: the total less the measured parts (≥ 0:
        the clocks tick at their own granularity)."""
        if self._final is not None:
            return dict(self._final[1])
        _, s0, h0 = self._zero
        out = {"sampler": _read(self._sampler_ns) - s0 + _read(self._helper_ns) - h0,
               **self.parts}
        out["other"] = max(0, self.total_ns() - sum(out.values()))
        return {p: out[p] for p in PARTS}


class _Part:
    __slots__ = ("own", "name", "t")

    def __init__(self, own: OwnCpu, name: str) -> None:
        self.own, self.name = own, name

    def __enter__(self) -> None:
        self.t = self.own.thread_ns()

    def __exit__(self, *exc) -> None:
        self.own.parts[self.name] += self.own.thread_ns() - self.t


def _read(clock: Clock | None) -> int:
    if clock is None:
        return 0
    try:
        return int(clock())
    except (OSError, ValueError):  # a thread that ended (its clock id is gone): count 0
        return 0


def thread_clock(thread: object) -> Clock | None:
    """The CPU clock of a running :class:`threading.Thread` as a reader (None when it has not
    started, or the platform has no per-thread clock ids)."""
    ident = getattr(thread, "ident", None)
    if ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return None
    try:
        cid = time.pthread_getcpuclockid(ident)
    except OSError:
        return None
    return lambda: time.clock_gettime_ns(cid)


class CpuBudget:
    """The token bucket of CPU ns for exact attribution (module docstring). ``share``: of
    one CPU (0.01: 1 %); ``own``: the measured costs; ``clock``: monotonic ns."""

    def __init__(self, share: float, own: OwnCpu, clock: Clock = time.monotonic_ns,
                 burst_s: float = BURST_S) -> None:
        self.share = share
        self.own = own
        self.clock = clock
        self.capacity_ns = share * burst_s * 1e9
        self.tokens_ns = self.capacity_ns
        self.exact = 0    # spikes the budget let have exact attribution
        self.skipped = 0  # spikes it refused it (recorded with the polled rules' cause)
        self._t: int | None = None
        self._always = 0
        self._owed = 0.0  # the always-on parts' overspend not yet taken from the earnings
        self.cost_ns: float | None = None  # an exact attribution's cost, running mean
        self.on_share = 0.0  # the always-on parts' share of one CPU (ON_TAU_S smoothing)
        self._spent = False  # spent(): over the budget, not yet under SPENT_EXIT of it

    @property
    def pct(self) -> float:
        return self.share * 100

    @property
    def note(self) -> str:
        """What a spike refused exact attribution says."""
        return f"exact attribution skipped: watch's CPU budget ({self.pct:g} % of one CPU) spent"

    def begin(self) -> None:
        """Start filling now (full: one burst is there at once)."""
        self._t = self.clock()
        self._always = self._always_on()
        self._owed = 0.0
        self.tokens_ns = self.capacity_ns

    def _always_on(self) -> int:
        return self.own.total_ns() - self.own.parts[EXACT]

    def refill(self) -> None:
        if self._t is None:
            self.begin()
            return
        t = self.clock()
        if t - self._t < REFILL_NS:
            return  # (a storm's spikes of one step decide within µs of each other)
        used = self._always_on()
        budget = (t - self._t) * self.share
        # what the always-on parts overspent beyond the reserved share is owed by the next
        # refills: their cost is lumpy (a spike's polled rules come just before the refill
        # that decides it, the quiet sleep between steps after), and a floor applied to each
        # short interval alone paid the sleeps' surplus and the floor for the lumps — exact
        # attribution earned ~0.6 % of one CPU, not 0.25 %, under ~260 spikes a minute on a
        # 16-CPU host (issue #38)
        raw = budget - (used - self._always) - self._owed
        floor = (t - self._t) / 1e9 * self.floor_ns_per_s()
        self._owed = min(self.capacity_ns, max(0.0, floor - raw))  # (a bounded memory)
        earned = max(raw, floor)
        self.tokens_ns = min(self.capacity_ns,
                             max(-self.capacity_ns, self.tokens_ns + earned))
        if t > self._t:
            a = 1.0 - math.exp(-(t - self._t) / (ON_TAU_S * 1e9))
            self.on_share += a * ((used - self._always) / (t - self._t) - self.on_share)
        self._t, self._always = t, used

    def allow(self) -> bool:
        """Whether the next spike gets exact attribution (counted either way)."""
        self.refill()
        ok = self.tokens_ns > 0
        if ok:
            self.exact += 1
        else:
            self.skipped += 1
        return ok

    def shed_note(self) -> str | None:
        """The note of a spike whose polled rules the budget sheds (it takes the polled
        cause of a spike ms away on the same CPU) while the always-on parts alone spend the
        budget; None while they are under it."""
        if not self.spent():
            return None
        return f"watch's CPU budget ({self.pct:g} % of one CPU) spent by its always-on parts"

    def spent(self) -> bool:
        """Whether the always-on parts alone spend the budget now: their smoothed share
        reached it, and has not fallen under :data:`SPENT_EXIT` of it since."""
        self.refill()
        if self.on_share >= self.share:
            self._spent = True
        elif self.on_share < SPENT_EXIT * self.share:
            self._spent = False
        return self._spent

    def has_tokens(self) -> bool:
        """Whether a spike now would get exact attribution (not counted: :meth:`allow`
        decides when it is attributed)."""
        self.refill()
        return self.tokens_ns > 0

    def floor_ns_per_s(self) -> float:
        """What the floor earns exact attribution, CPU ns a second: RESERVED of the budget,
        or FLOOR_EXACT_PER_S attributions at their mean cost when that is less (once one
        has been charged)."""
        floor = self.share * RESERVED * 1e9
        if self.cost_ns is not None:
            floor = min(floor, FLOOR_EXACT_PER_S * self.cost_ns)
        return floor

    def floor_gap_s(self) -> float | None:
        """Seconds between the exact attributions the floor alone pays for, at their mean
        cost (None before the first one is charged, or with no floor)."""
        floor = self.floor_ns_per_s()
        if self.cost_ns is None or floor <= 0:
            return None
        return self.cost_ns / floor

    def charge(self, cpu_ns: int) -> None:
        """One exact attribution's measured cost."""
        self.tokens_ns -= cpu_ns
        self.cost_ns = cpu_ns if self.cost_ns is None else \
            self.cost_ns + COST_WEIGHT * (cpu_ns - self.cost_ns)

    def to_dict(self) -> dict:
        return {"pct_of_one_cpu": round(self.pct, 3), "burst_s": round(
            self.capacity_ns / self.share / 1e9, 3) if self.share else None,
            "exact_attributions": self.exact, "skipped_exact_attributions": self.skipped}


def cost_summary(own: OwnCpu, budget: CpuBudget | None, duration_s: float,
                 charged_us_per_call: float | None, calls: int, shed: int = 0,
                 slow_s: float = 0.0) -> dict:
    """The summary's ``own_cpu``: watch's CPU share of one CPU in all and by part, the budget
    and what it decided (``shed``: the spikes whose polled rules it shed; ``slow_s``: the
    seconds the native sampler's rounds were slowed past it), and for an
    attached process the cost charged to it: µs a call (the attach overhead figure,
    bench/attach_overhead.py) × its calls a second."""
    def share(ns: int) -> float | None:
        return round(ns / 1e9 / duration_s, 5) if duration_s > 0 else None
    out: dict = {"share_of_one_cpu": share(own.total_ns()),
                 "by_part": {p: share(ns) for p, ns in own.by_part().items()},
                 "budget": dict(budget.to_dict(), shed_polled_rules=shed,
                                slow_rounds_s=round(slow_s, 1))
                 if budget is not None else None}
    if charged_us_per_call is not None:
        rate = calls / duration_s if duration_s > 0 else None
        out["charged_to_service"] = {
            "us_per_call": charged_us_per_call,
            "calls_per_s": round(rate, 1) if rate is not None else None,
            "share_of_one_cpu": round(charged_us_per_call * rate / 1e6, 5)
            if rate is not None else None}
    return out
