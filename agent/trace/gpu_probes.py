"""A few uprobes on libcuda's driver entry points, for the GPU split of an attached call
(``watch --attach PID --gpu-probes LEVEL``; the split itself:
agent/watch/attribution/gpu_split.py).

One JAX/XLA inference makes about 45 driver calls (shared/notes/gpu-attach.md: 18
``cuCtxSetCurrent``, 8 ``cuEventRecord``, 7 ``cuStreamWaitEvent``, 5 ``cuLaunchHostFunc``, 4
``cuLaunchKernelEx``, one copy each way); probing them all would cost ~80 µs a call at ~1.75 µs
a hit. A level (:data:`LEVELS`) names the few that are probed:

=========  =========================================================================
off        none
default    cuLaunchKernel, cuLaunchKernelEx (entry); cuStreamSynchronize,
           cuEventSynchronize, cuCtxSynchronize (entry and return): 4 hits a JAX call,
           ~7 µs, within issue #36's 2.5 % of a 400 µs call
copies     default, plus the copies cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2,
           cuMemcpyHtoD_v2, cuMemcpyDtoH_v2 (entry with the byte count, and return) and
           cuLaunchHostFunc (entry): 13 hits, ~23 µs
full       copies, plus cuEventRecord, cuStreamWaitEvent, cuEventQuery (entry)
=========  =========================================================================

Every probed function is a C entry point of the driver API that returns a ``CUresult``
(never throws), so return probes are safe there. The byte count of a copy is the third
integer argument (``ByteCount``, after the two pointers: cuda.h), fetched at the entry from
its register (x86-64 ``%dx``, aarch64 ``%x2``: the SysV and AAPCS64 calling conventions).

Symbols resolve from libcuda's dynamic symbol table: JAX and TF reach libcuda through dlopen
and ``cuGetProcAddress``, and the exported entry points still fire (measured, notes). The
library is found and pinned exactly as attach pins a runtime's (agent/trace/attach.py
:func:`~agent.trace.attach.pin`: map_files, one descriptor, the probe defined on it, the
mapping checked again after), and a symbol is probed only where :func:`agent.trace.elf.resolve`
finds a function in an executable segment of that very file. uprobes are per inode: every
process that maps the same libcuda pays the trap while watch runs (the events' filter keeps
the attached process's threads' hits only).
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent.trace import elf
from agent.trace.uprobe import UprobeError, Uprobes
from collectors.host import Host

LEVELS = ("off", "default", "copies", "full")
DEFAULT_LEVEL = "default"
LIBCUDA = re.compile(r"^libcuda\.so(\.\d+)*$")
HIT_US = 1.75   # one uprobe hit on an emulated entry (x86-64, shared/notes/gpu-attach.md)
STEP_US = 8.6   # one hit on an entry that is single-stepped (shared/notes/attach.md)

LAUNCH, COPY, HOST_FUNC, SYNC, EVENT = "launch", "copy", "host_func", "sync", "event"
# (the register of the third integer argument, by ELF machine: elf.MACHINES' names)
THIRD_ARG = {"x86_64": "%dx", "aarch64": "%x2"}


@dataclass(frozen=True)
class Probe:
    """One driver function: what it is for the split (``kind``), whether its return is
    probed, whether its byte count is fetched (``bytes_arg``), the level from which it is
    placed, and how many times one JAX inference calls it (``per_call``, notes)."""

    symbol: str
    kind: str
    level: str
    returns: bool = False
    bytes_arg: bool = False
    per_call: float = 0.0
    direction: str = ""     # copies: "HtoD" or "DtoH"

    @property
    def hits_per_call(self) -> float:
        return self.per_call * (2 if self.returns else 1)


PROBES: tuple[Probe, ...] = (
    Probe("cuLaunchKernel", LAUNCH, "default"),
    Probe("cuLaunchKernelEx", LAUNCH, "default", per_call=4),
    Probe("cuStreamSynchronize", SYNC, "default", returns=True),
    Probe("cuEventSynchronize", SYNC, "default", returns=True),
    Probe("cuCtxSynchronize", SYNC, "default", returns=True),
    Probe("cuMemcpyHtoDAsync_v2", COPY, "copies", True, True, 1, "HtoD"),
    Probe("cuMemcpyDtoHAsync_v2", COPY, "copies", True, True, 1, "DtoH"),
    Probe("cuMemcpyHtoD_v2", COPY, "copies", True, True, 0, "HtoD"),
    Probe("cuMemcpyDtoH_v2", COPY, "copies", True, True, 0, "DtoH"),
    Probe("cuLaunchHostFunc", HOST_FUNC, "copies", per_call=5),
    Probe("cuEventRecord", EVENT, "full", per_call=8),
    Probe("cuStreamWaitEvent", EVENT, "full", per_call=7),
    Probe("cuEventQuery", EVENT, "full"),
)


class GpuProbeError(Exception):
    """A bad --gpu-probes value, or libcuda's probes cannot be placed (one line)."""


def check_level(level: str) -> str:
    """``level`` when it is one of :data:`LEVELS`, else :class:`GpuProbeError`."""
    if level not in LEVELS:
        raise GpuProbeError(f"--gpu-probes must be one of {', '.join(LEVELS)}, not {level!r}")
    return level


def probes_for(level: str) -> list[Probe]:
    """The probes a level places (each level holds the ones before it)."""
    upto = LEVELS.index(check_level(level))
    return [p for p in PROBES if LEVELS.index(p.level) <= upto] if upto else []


@dataclass
class GpuTarget:
    """One probe placed in one pinned libcuda (what :class:`GpuUprobes` defines)."""

    probe: Probe
    library: str
    via: str
    offset: int
    fetch: str            # the entry's fetch-args ("" when none)
    pin: Any = field(default=None, repr=False, compare=False)
    entry: str = ""       # the instruction at the entry (elf.describe_entry)

    @property
    def hit_us(self) -> float:
        """What one hit costs: an entry that is single-stepped costs ~5× an emulated one."""
        return STEP_US if "single-stepped" in self.entry else HIT_US

    @property
    def returns(self) -> bool:
        return self.probe.returns

    @property
    def symbol(self) -> str:
        return self.probe.symbol

    def to_dict(self) -> dict:
        p = self.probe
        return {"symbol": p.symbol, "kind": p.kind, "library": self.library,
                "offset": self.offset, "returns": p.returns, "bytes": p.bytes_arg,
                "entry": self.entry, "expected_hits_per_call": p.hits_per_call,
                "expected_us_per_call": round(p.hits_per_call * self.hit_us, 2)}


@dataclass
class GpuPlan:
    level: str
    targets: list[GpuTarget] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    library: str | None = None     # the libcuda the process maps (None: none)

    @property
    def hits_per_call(self) -> float:
        return sum(t.probe.hits_per_call for t in self.targets)

    @property
    def cost_us_per_call(self) -> float:
        return round(sum(t.probe.hits_per_call * t.hit_us for t in self.targets), 1)

    def to_dict(self) -> dict:
        return {"level": self.level, "library": self.library,
                "probes": [t.to_dict() for t in self.targets], "notes": self.notes,
                "expected_hits_per_call": self.hits_per_call,
                "expected_cost_us_per_call": self.cost_us_per_call}

    def close(self) -> None:
        for pinned in {id(t.pin): t.pin for t in self.targets if t.pin is not None}.values():
            pinned.close()


def plan(host: Host, pid: int, level: str, unsafe_library: bool = False) -> GpuPlan | None:
    """The GPU probes for process ``pid`` at ``level``: None when the level is ``off`` or the
    process maps no libcuda. A libcuda that cannot be pinned or read, or that lacks a
    symbol, is a note (the run goes on without those probes)."""
    from agent.trace.attach import AttachError, exec_mappings, owner_of, pin
    probes = probes_for(level)
    if not probes:
        return None
    m = next((m for m in exec_mappings(host, pid) if LIBCUDA.match(m.name)), None)
    if m is None:
        return None
    p = GpuPlan(level, library=m.path)
    try:
        pinned = pin(host, pid, m, owner_of(host, pid), unsafe_library)
    except AttachError as exc:
        p.notes.append(f"GPU probes: {exc}")
        return p
    try:
        info, found = elf.resolve(pinned.fd, [q.symbol for q in probes], None, m.name)
        moved = pinned.moved()
        if moved:
            raise AttachError(moved)
    except (AttachError, elf.ElfError) as exc:
        pinned.close()
        p.notes.append(f"GPU probes: {exc}")
        return p
    reg = THIRD_ARG.get(info.machine)
    for q in probes:
        s = found.get(q.symbol)
        if s is None:
            p.notes.append(f"GPU probes: {m.name} has no function {q.symbol}")
            continue
        fetch = f"bytes={reg}:u64" if q.bytes_arg and reg else ""
        p.targets.append(GpuTarget(q, m.path, pinned.via, s.offset, fetch, pinned,
                                   elf.describe_entry(s.first_bytes, info.machine)))
    p.notes += [f"GPU probes: {r}" for r in info.reasons]
    if not p.targets:
        pinned.close()
    return p


def check_lines(p: GpuPlan | None) -> list[str]:
    """``attach --check``'s lines for the GPU probes (none without libcuda)."""
    if p is None:
        return []
    lines = [f"  gpu       --gpu-probes {p.level}: {len(p.targets)} probe(s) in {p.library}"]
    for t in p.targets:
        q = t.probe
        lines.append(f"  gpu probe {q.symbol} ({q.kind}{', return' if q.returns else ''}"
                     f"{', bytes' if t.fetch else ''}) at 0x{t.offset:x}: ~{q.hits_per_call:g} "
                     f"hit(s) per JAX call; entry {t.entry}")
    lines += [f"  note      {n}" for n in p.notes]
    stepped = [t.symbol for t in p.targets if t.hit_us > HIT_US]
    if p.targets:
        lines.append(f"  gpu cost  ~{p.cost_us_per_call} µs per call ({p.hits_per_call:g} hits "
                     f"at ~{HIT_US} µs, ~{STEP_US} µs where single-stepped; counts of one JAX "
                     "inference); every process that maps this libcuda pays the trap too "
                     "while watch runs")
    if stepped:
        lines.append(f"  gpu note  single-stepped entries ({', '.join(stepped)}) cost ~"
                     f"{STEP_US / HIT_US:.0f}× an emulated one a hit: --gpu-probes default "
                     "or off places fewer")
    return lines


class GpuUprobes(Uprobes):
    """The GPU probes' events, in watch's group: ``gpu<i>`` (entry, with the byte count where
    fetched) and ``gpuret<i>`` (return) per target; defined, enabled, filtered and removed
    as :class:`~agent.trace.uprobe.Uprobes` does."""

    ENTRY, RETURN = "gpu", "gpuret"

    def _fetch(self, t: Any) -> str:
        return f" {t.fetch}" if t.fetch else ""

    def _where(self, t: Any) -> str:
        return f"GPU uprobe on {t.library}:{t.symbol}"


class Hit(NamedTuple):
    """One GPU probe hit of the attached process: ``ret`` a return; ``nbytes`` the copy's
    byte count at its entry (-1: not fetched, or a return)."""

    ts_ns: int
    tid: int
    symbol: str
    kind: str
    ret: bool
    nbytes: int = -1


KEEP_HITS = 100_000      # the hits kept for spikes still to be attributed (~20 MB at most)
COPY_RATES = 1024        # the latest copies' ns per byte kept (their P50: a slow copy)


class GpuHits:
    """The hits of the GPU probes, fed by the attached reader (:meth:`take`), in time order,
    the latest :data:`KEEP_HITS`; :meth:`between` gives a spike's. Per symbol, how many hits
    arrived (``counts``: the measured hits per call). Copies with both ends probed give
    their ns per byte (:attr:`rates`)."""

    def __init__(self, uprobes: GpuUprobes) -> None:
        self.uprobes = uprobes
        self._of: dict[str, tuple[GpuTarget, bool]] = {}
        for n in uprobes.names:
            i = int(n.removeprefix("gpuret").removeprefix("gpu"))
            self._of[n] = (uprobes.targets[i], n.startswith("gpuret"))
        self._ts: list[int] = []
        self._hits: list[Hit] = []
        self.counts: dict[str, int] = {}
        # the latest copies' ns per byte (> 0), or -ns per copy where no byte count came
        self.rates: deque[float] = deque(maxlen=COPY_RATES)
        # the spikes split from these hits and their parts' ns (agent/watch/attribution/
        # gpu_split.py adds them: the run's summary says them)
        self.spikes_split = 0
        self.parts_ns: dict[str, int] = {}
        self._copy_open: dict[tuple[int, str], tuple[int, int]] = {}

    def take(self, ev: Any) -> bool:
        """Keep ``ev`` when it is one of the GPU probes' hits (True), else False (the
        reader pairs it as a call's)."""
        of = self._of.get(ev.name)
        if of is None:
            return False
        t, ret = of
        q = t.probe
        # (a reader that hands over hits without their fields gives no byte count)
        fields = getattr(ev, "fields", None) or {}
        h = Hit(ev.ts_ns, ev.pid, q.symbol, q.kind, ret,
                -1 if ret else int(fields.get("bytes", -1)))
        self.counts[q.symbol] = self.counts.get(q.symbol, 0) + 1
        if q.kind == COPY and q.returns:
            self._copy_rate(h)
        if self._ts and h.ts_ns < self._ts[-1]:
            i = bisect.bisect_right(self._ts, h.ts_ns)
            self._ts.insert(i, h.ts_ns)
            self._hits.insert(i, h)
        else:
            self._ts.append(h.ts_ns)
            self._hits.append(h)
        if len(self._ts) > 2 * KEEP_HITS:
            del self._ts[:KEEP_HITS], self._hits[:KEEP_HITS]
        return True

    def _copy_rate(self, h: Hit) -> None:
        key = (h.tid, h.symbol)
        if not h.ret:
            self._copy_open[key] = (h.ts_ns, h.nbytes)
            return
        t0, n = self._copy_open.pop(key, (None, -1))
        if t0 is not None:   # ns per byte; ns per copy (negative) where the bytes are unknown
            self.rates.append((h.ts_ns - t0) / n if n > 0 else -(h.ts_ns - t0))

    def between(self, t0_ns: int, t1_ns: int) -> list[Hit]:
        """The hits in ``[t0_ns, t1_ns]``, every thread's, in time order."""
        lo = bisect.bisect_left(self._ts, t0_ns)
        hi = bisect.bisect_right(self._ts, t1_ns)
        return self._hits[lo:hi]

    def set_threads(self, tids: list[int]) -> None:
        """The events' thread filter follows the process's threads (as the call probes')."""
        for inst in self.uprobes.instances:
            try:
                self.uprobes.set_filter(inst, tids)
            except OSError:
                pass

    def stats(self, calls: int) -> dict:
        """Hits per symbol, and per call where calls were timed (the cost actually paid)."""
        total = sum(self.counts.values())
        out: dict = {"hits": dict(self.counts), "spikes_split": self.spikes_split,
                     "parts_us": {p: round(ns / 1e3, 1) for p, ns in self.parts_ns.items()}}
        if calls:
            out["hits_per_call"] = round(total / calls, 2)
            out["cost_us_per_call"] = round(total / calls * HIT_US, 1)
        return out


@dataclass
class Armed:
    """What :func:`arm` placed: the plan, the events and their hits (None: nothing placed),
    and the lines to say (a note, or why the probes could not be placed)."""

    plan: GpuPlan | None = None
    uprobes: GpuUprobes | None = None
    hits: GpuHits | None = None
    notes: list[str] = field(default_factory=list)


def arm(host: Host, pid: int, level: str, unsafe_library: bool, tracing: Any,
        tids: list[int]) -> Armed:
    """Place the GPU probes of ``level`` in process ``pid`` and enable them in ``tracing``
    (the EventSource of watch's instance, whose call probes are enabled already), filtered
    to ``tids``. A process without libcuda, or a level of ``off``, places nothing. Where the
    kernel refuses, nothing GPU stays defined and the run goes on without the split (a
    note says why): the call timing never depends on them."""
    out = Armed()
    try:
        out.plan = plan(host, pid, level, unsafe_library)
    except Exception as exc:  # noqa: BLE001 - the process left, its maps unreadable: no split
        out.notes.append(f"GPU probes not placed: {exc}")
        return out
    if out.plan is None:
        return out
    out.notes += out.plan.notes
    if not out.plan.targets:
        return out
    u = GpuUprobes(tracing.tracefs, out.plan.targets)
    try:
        u.define()
        tracing.add_uprobes(u, tids)
    except (UprobeError, OSError, ValueError) as exc:
        tracing.drop_uprobes(u)   # (removes what was defined, forgets what was enabled)
        out.notes.append(f"GPU probes not placed: {getattr(exc, 'strerror', None) or exc}")
        return out
    out.uprobes, out.hits = u, GpuHits(u)
    out.notes.append(f"GPU probes ({level}): {len(out.plan.targets)} in "
                     f"{out.plan.library}, ~{out.plan.cost_us_per_call} µs per call expected "
                     f"({out.plan.hits_per_call:g} hits of a JAX inference)")
    return out
