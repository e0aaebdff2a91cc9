"""The live view of ``hftagent watch`` (rich): rolling P50/P99/P99.9, jitter rate, spikes
and their causes, the last spikes with their named cause, the kernel events' breakdown of
the newest spikes (``--trace``), collector health."""

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
    ev_lines = [f"{r['time'][11:23]}  {r['latency_us']:.0f} µs: {r['events']['summary']}"
                + ("" if r["events"].get("complete", True) else "  (incomplete)")
                for r in events]
    cols = Table(title="collectors", show_edge=False)
    for col in ("collector", "state", "mean µs"):
        cols.add_column(col)
    if session.sampler is not None:
        for name, st in session.sampler.stats.per_collector.items():
            d = st.to_dict()
            cols.add_row(name, d["state"] if d["state"] == "ok" else f"[red]{d['state']}[/]",
                         str(d["mean_us"]))
    parts = [head, causes, last]
    if ev_lines:
        ev = Table(title="kernel events: excess over P50", show_edge=False, show_header=False)
        ev.add_column("breakdown", overflow="fold")
        from rich.text import Text
        for line in ev_lines:
            ev.add_row(Text(line))  # comms hold "[pid]": never read as markup
        parts.append(ev)
    return Group(*parts, cols)
