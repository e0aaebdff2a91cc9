"""The live view of ``hftagent watch`` (rich): rolling P50/P99/P99.9, jitter rate, spikes
and their causes, the last spikes with their named cause, the kernel events' breakdown of
the newest spikes (``--trace``) with where the call's thread spent its wall time (on the CPU,
runnable, not runnable and who woke it, the wake-up, unknown), collector health."""

from __future__ import annotations

import time


class LiveView:
    def __init__(self, refresh_s: float = 0.5) -> None:
        from rich.console import Console
        from rich.live import Live
        self.console = Console(stderr=False)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.refresh_s = refresh_s
        self._last = 0.0
        self._started = False

    def update(self, session) -> None:
        t = time.monotonic()
        if t - self._last < self.refresh_s:
            return
        self._last = t
        if not self._started:
            self.live.start()
            self._started = True
        self.live.update(render(session), refresh=True)

    def close(self) -> None:
        if self._started:
            self.live.stop()


def render(session):
    from rich.console import Group
    from rich.table import Table
    r = session.rolling()
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[bold]{session.probe_info.get('probe', '')}[/] on CPU "
        f"{','.join(map(str, session.cfg.probe_cpus))}",
        f"samples {session.samples}", f"spikes {session.spikes}",
        f"attributed {session.attributed}")
    if r:
        head.add_row(f"P50 {r['p50_us']:.0f} µs", f"P99 {r['p99_us']:.0f} µs",
                     f"P99.9 {r['p999_us']:.0f} µs",
                     f"jitter {100 * r['jitter_rate']:.2f} %  (last {r['n']})")
    causes = Table(title="causes", show_edge=False)
    causes.add_column("cause")
    causes.add_column("spikes", justify="right")
    causes.add_column("share", justify="right")
    n = max(1, session.attributed)
    for c, k in session.cause_counts.most_common(6):
        causes.add_row(c, str(k), f"{100 * k / n:.0f} %")
    last = Table(title="last spikes", show_edge=False)
    for col in ("time", "µs", "cause", "detail"):
        last.add_column(col, overflow="fold")
    for rec in list(session.last_spikes)[::-1]:
        top = rec["causes"][0]["detail"] if rec.get("causes") else ""
        last.add_row(rec["time"][11:23], f"{rec['latency_us']:.0f}", rec["cause"], top[:80])
    # the kernel events' breakdown of the newest spikes that have one (--trace)
    events = [r for r in list(session.last_spikes)[::-1]
              if (r.get("events") or {}).get("summary")][:3]
    ev_lines = []
    for r in events:
        ev_lines.append(f"{r['time'][11:23]}  {r['latency_us']:.0f} µs: "
                        f"{r['events']['summary']}"
                        + ("" if r["events"].get("complete", True) else "  (incomplete)"))
        states = format_states(r["events"].get("timeline") or {})
        if states:
            ev_lines.append(f"{'':14}{states}")
    cols = Table(title="collectors", show_edge=False)
    for col in ("collector", "state", "mean µs"):
        cols.add_column(col)
    if session.sampler is not None:
        for name, st in session.sampler.stats.per_collector.items():
            d = st.to_dict()
            cols.add_row(name, d["state"] if d["state"] == "ok" else f"[red]{d['state']}[/]",
                         "—" if d["mean_us"] is None else str(d["mean_us"]))
    parts = [head, causes, last]
    if ev_lines:
        ev = Table(title="kernel events: excess over P50", show_edge=False, show_header=False)
        ev.add_column("breakdown", overflow="fold")
        from rich.text import Text
        for line in ev_lines:
            ev.add_row(Text(line))  # comms hold "[pid]": never read as markup
        parts.append(ev)
    return Group(*parts, cols)


# the thread's states as the timeline counts them (Timeline.state_ns), in this order
_STATES = (("on_cpu", "on CPU"), ("runnable", "runnable"), ("not_runnable", "not runnable"),
           ("wakeup", "wake-up"), ("unknown", "unknown"))


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f} ms" if us >= 100 else f"{us:.0f} µs"


def format_states(tl: dict) -> str:
    """One line: where the call's thread spent its wall time, and each not-runnable part
    with its state and who woke it (or stopped it), from a record's ``events.timeline``:
    ``on CPU 0.8 ms · runnable 67 µs · not runnable 4.0 ms (S 4.0 ms, woken by thread 5484
    of the same process (python))``. Empty without a followed thread."""
    st = tl.get("state_us") or {}
    if not st:
        return ""
    out = []
    for key, name in _STATES:
        us = st.get(key) or 0
        if us < 1 and key != "on_cpu":
            continue
        text = f"{name} {_ms(us)}"
        if key == "not_runnable":
            parts = [p for p in tl.get("parts") or []
                     if p.get("kind") in ("blocked", "io_wait", "stopped") and p.get("us")]
            said = []
            for p in sorted(parts, key=lambda p: -p["us"])[:2]:
                by = f"{p['signal']} from {p.get('sender')}, continued by {p['waker']}" \
                    if p.get("signal") else f"woken by {p['waker']}"
                said.append(f"{p.get('state') or '?'} {_ms(p['us'])}, {by}")
            if said:
                text += f" ({'; '.join(said)})"
        out.append(text)
    return " · ".join(out)
