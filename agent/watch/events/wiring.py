"""The event source inside ``hftagent watch`` (``--trace auto|on|off|mount``).

:class:`SpikeEvents` owns the :class:`~.tracefs.EventSource` of one watch run: it opens it
on the probe CPUs when the session starts (``auto``: where tracefs is usable, else one
``unsupported: <reason>`` warning and the run goes on as without events; ``on``: an error
instead; ``mount``: tracefs mounted first when it is not; ``off``: never), re-sizes the ring
once after warm-up (:meth:`maybe_refit`), reads one window per attributed spike
(:meth:`for_spike`) and closes the source on every exit path (:meth:`close`; the source's own
``atexit`` hook and its stale-instance removal at the next start cover the rest).

Per spike: the events of the probe CPU from the sample's intended start − 2 ms to its end +
1 ms, the :func:`~.timeline.timeline` of the probe's thread over ``[start, end]``,
:func:`~.timeline.hw_noise` against the sample's CPU time, and :func:`~.timeline.breakdown`
of the excess over the rolling P50. Only spikes the attribution rate limiter lets through
(agent/watch/schedule.py) reach it, so the cost is bounded by ``--max-attributions``; a
window that cannot be read gives a record with ``complete: false`` and the reason, never an
error of the run.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.errors import AgentError

from .timeline import HW, PROBE, UNEXPLAINED, breakdown, format_breakdown, hw_noise, timeline
from .tracefs import EventSource

MODES = ("auto", "on", "off", "mount")
MARGIN_BEFORE_NS = 2_000_000  # events before the intended start: who was on the CPU then
MARGIN_AFTER_NS = 1_000_000
REFIT_AFTER_S = 2.0  # the rate measured over at least this long before refit()


class SpikeEvents:
    """``opener``: :meth:`EventSource.open` (tests pass a fake returning canned windows)."""

    def __init__(self, mode: str, host, cpus: list[int], buffer_s: float = 10.0, *,
                 opener: Callable | None = None) -> None:
        if mode not in MODES:
            raise AgentError(f"--trace must be auto, on, off or mount, not {mode!r}")
        self.mode = mode
        self.host = host
        self.cpus = list(cpus)
        self.buffer_s = buffer_s
        self.opener = opener or EventSource.open
        self.source = None
        self.reason: str | None = None  # why there are no events (one line)
        self.sizing: str | None = None
        self.refit_note: str | None = None
        self.windows = 0  # windows read
        self.incomplete = 0
        self.read_ns = 0
        self._opened_ns = 0
        self._refitted = False
        self._ran = False
        self._final: dict = {}  # the source's description, rate and losses at close

    def open(self, now_ns: int) -> str | None:
        """Open the source; returns the warning line for ``auto``/``mount`` when it cannot
        (None when it runs or with ``off``). ``on``: :class:`AgentError` instead."""
        if self.mode == "off":
            self.reason = "off (--trace off)"
            return None
        src = self.opener(self.host, self.cpus, self.buffer_s, mount=self.mode == "mount")
        if not src:
            self.reason = src.reason
            if self.mode == "on":
                raise AgentError(f"--trace on: {src.reason}")
            return f"kernel events: {src.reason}"
        self.source = src
        self._ran = True
        self.sizing = getattr(src, "sizing", None)
        self._opened_ns = now_ns
        return None

    @property
    def active(self) -> bool:
        return self.source is not None

    def maybe_refit(self, now_ns: int, warmed: bool) -> None:
        """Once, after warm-up (``warmed``) and ≥ REFIT_AFTER_S of measured rate."""
        if self._refitted or self.source is None or not warmed or \
                now_ns - self._opened_ns < REFIT_AFTER_S * 1e9:
            return
        self._refitted = True
        try:
            self.refit_note = self.source.refit()
        except Exception as exc:  # noqa: BLE001 - a resize is best effort
            self.refit_note = f"refit failed: {type(exc).__name__}: {exc}"

    def for_spike(self, sp) -> tuple[dict, list[tuple[str, str, int]]]:
        """The spike record's ``events`` part and the breakdown as (cause, culprit, ns)
        triples for the metrics (empty when the window could not be read)."""
        cpu = sp.cpu_end if sp.cpu_end >= 0 and sp.cpu_end in self.cpus else self.cpus[0]
        try:
            win = self.source.window(sp.start_ns, sp.end_ns + MARGIN_AFTER_NS,
                                     margin_ns=MARGIN_BEFORE_NS)
            tl = timeline(win.events, cpu, {sp.tid}, sp.start_ns, sp.end_ns,
                          comms=win.comms, complete=win.complete, reason=win.reason)
            hw = hw_noise(tl, probe_cpu_ns=sp.cpu_ns if sp.cpu_ns >= 0 else None)
            items = breakdown(tl, sp.excess_ns, hw=hw)
        except Exception as exc:  # noqa: BLE001 - a bad window never ends the run
            self.windows += 1
            self.incomplete += 1
            return {"complete": False,
                    "reason": f"event window not read: {type(exc).__name__}: {exc}"}, []
        self.windows += 1
        self.read_ns += win.read_ns
        if not tl.complete:
            self.incomplete += 1
        out = {"timeline": tl.to_dict(),
               "breakdown": [{"what": label, "us": round(ns / 1e3, 1)} for label, ns in items],
               "summary": format_breakdown(items), "hw_noise": hw.to_dict(),
               "complete": tl.complete, "reason": tl.reason,
               "read_us": round(win.read_ns / 1e3, 1)}
        if win.lost:
            out["lost_events"] = win.lost
        return out, _triples(tl, items)

    def info(self) -> dict:
        """For the summary: the mode, whether events ran (``active``) or why not, the
        source's description, event rate and losses (as at close once closed)."""
        d: dict = {"mode": self.mode, "active": self._ran, "windows": self.windows,
                   "incomplete": self.incomplete}
        if self.reason:
            d["reason"] = self.reason
        d.update(self._source_info() if self.source is not None else self._final)
        if self.refit_note:
            d["refit"] = self.refit_note
        if self.windows:
            d["mean_read_us"] = round(self.read_ns / 1e3 / self.windows, 1)
        return d

    def _source_info(self) -> dict:
        try:
            return {"source": self.source.describe(),
                    "rate_per_cpu": {str(c): round(r) for c, r in self.source.rate().items()},
                    "lost": self.source.lost()}
        except Exception as exc:  # noqa: BLE001 - reporting only
            return {"source_error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        if self.source is not None:
            self._final = self._source_info()
        src, self.source = self.source, None
        if src is not None:
            try:
                src.close()
            except Exception:  # noqa: BLE001 - closing must finish; atexit retries
                pass


def _triples(tl, items: list[tuple[str, int]]) -> list[tuple[str, str, int]]:
    """The breakdown's items as (cause, culprit, ns): the entity kind and its short name
    (:attr:`~.timeline.Entity.culprit`); ``hw_or_hypervisor`` and ``unexplained`` are their
    own cause and culprit."""
    by_label = {e.label: e for e, _ in tl.ranked() if e.kind != PROBE}
    out = []
    for label, ns in items:
        if label in (HW, UNEXPLAINED):
            out.append((label, label, ns))
        elif (e := by_label.get(label)) is not None:
            out.append((e.kind, e.culprit, ns))
    return out
