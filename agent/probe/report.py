"""Rendering of a ProbeResult (rich tables) and the per-sample CSV. No TensorFlow."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import IO

from rich.console import Console
from rich.table import Table

from agent.probe.harness import COLUMNS, Samples
from agent.probe.result import ProbeResult, RunResult
from agent.stats import P99_MIN_SAMPLES, P999_MIN_SAMPLES, PERCENTILES, pkey

CSV_COLUMNS: tuple[str, ...] = ("config", "variant", "batch", "index", *COLUMNS,
                                "latency_ns", "response_ns")


def fmt_ns(ns: float | int | None) -> str:
    """Human latency: µs below 10 ms, else ms."""
    if ns is None:
        return "—"
    if ns < 10_000_000:
        return f"{ns / 1e3:,.1f} µs"
    return f"{ns / 1e6:,.1f} ms"


def _pct(r: RunResult, q: float, what: str = "headline") -> str:
    s = getattr(r, what) or {}
    v = s.get(pkey(q) + "_ns")
    if v is None:
        return "—"
    return fmt_ns(v) + ("" if s["sufficient"][pkey(q)] else "*")


def _agree(r: RunResult) -> str:
    a = r.agreement
    if not a:
        return "—"
    head = f"{a['argmax_share']:.1%}" if a["argmax_share"] is not None else f"rel {a['max_rel_err']:.1e}"
    return head + ("" if a["passes"] else " ✗")


def render(result: ProbeResult, console: Console | None = None) -> None:
    con = console or Console()
    if not con.is_terminal:
        con.width = max(con.width, 150)  # piped: keep table rows on one line
    m = result.model
    h = result.host
    con.print(f"[bold]hftagent probe[/bold] · model [cyan]{m.get('name')}[/cyan] "
              f"({m.get('kind')}) · input {m.get('input_name')} {m.get('probe_shape')} "
              f"{m.get('input_dtype')} · " + (
                  "numpy (no TensorFlow on this path)" if m.get("kind") == "numpy" else
                  f"TF {h.get('tensorflow')} · LiteRT {h.get('litert')}")
              + f" · {h.get('cpu_count')} CPUs")
    st = result.settings
    mode = (f"open loop at {st['rate_hz']:g} Hz (table: response time from the intended start)"
            if st.get('rate_hz') else "closed loop")
    con.print(f"{mode} · warm-up ≥ {st['warmup']} calls · target {st['samples'] or '—'} samples"
              f" · budget {st['duration_s'] or '—'} s/run · jitter threshold "
              f"{st['threshold_us']:g} µs · reference: "
              + ("none (numpy stand-in: one variant)" if m.get("kind") == "numpy" else
                 f"fp32 {m.get('reference', 'graph')}"))
    configs = list(dict.fromkeys(r.config["id"] for r in result.runs))
    for cid in configs:
        runs = [r for r in result.runs if r.config["id"] == cid]
        _side_by_side(con, runs, cid, result.settings.get("rate_hz"))
        for r in runs:
            if r.ok and r.idle_gaps:
                _idle_gaps(con, r)
            elif r.ok:
                _detail(con, r)
    batches = sorted({r.batch for r in result.runs})
    if len(batches) > 1:
        _throughput(con, result.runs)
    if len(configs) > 1:
        _sweep(con, result)
    for w in result.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}")
    con.print("[dim]* = fewer samples than needed to claim this percentile "
              f"(≥{P99_MIN_SAMPLES:,} for P99, ≥{P999_MIN_SAMPLES:,} for P99.9; nearest-rank "
              "percentiles)[/dim]")
    rec = result.recommendation
    if all(r.idle_gaps for r in result.runs if r.ok) and any(r.ok for r in result.runs):
        return  # the idle-gap curve is the result: no timed loop to recommend a variant by
    if rec:
        con.print(f"[bold green]recommendation:[/bold green] {rec['variant']} — P99 "
                  f"{fmt_ns(rec['p99_ns'])} ({rec['reason']}; {rec['config']['id']})")
    else:
        con.print("[bold red]recommendation: none[/bold red] — no variant ran with enough "
                  "samples for P99 and passing agreement")
    if result.sweep_recommendation:
        sr = result.sweep_recommendation
        con.print(f"[bold green]threads:[/bold green] {sr['config']['id']}"
                  f" → {sr['command'] or 'no reproducible configuration passed'}")
        if sr.get("note"):
            con.print(f"  note: {sr['note']}", style="yellow")


def _side_by_side(con: Console, runs: Sequence[RunResult], cid: str, rate: float | None) -> None:
    t = Table(title=f"variants · {cid}", title_justify="left")
    for col in ("variant", "batch", "build", "cold", "n", "P50", "P90", "P99",
                "P99.9", "max", "jitter", "agree", ""):
        t.add_column(col, justify="right" if col not in ("variant", "") else "left")
    for r in runs:
        if not r.ok:
            t.add_row(r.variant, str(r.batch), "", "", "", f"[red]{r.status}[/red]", "", "",
                      "", "", "", "", (r.reason or "")[:70])
            continue
        j = r.jitter or {}
        mark = "[bold green]◀ best[/bold green]" if r.recommended else (
            "[yellow]not recommended[/yellow]" if r.agreement and not r.agreement["passes"]
            else "[yellow]saturated[/yellow]" if r.unserved
            else "[yellow]warm-up unstable[/yellow]" if not (r.warmup or {}).get("stable")
            else "")
        t.add_row(r.variant, str(r.batch), f"{r.build_s:.2f}s", fmt_ns(r.cold_start_ns),
                  f"{r.headline['count']:,}", _pct(r, 50), _pct(r, 90), _pct(r, 99),
                  _pct(r, 99.9), fmt_ns(r.headline["max_ns"]),
                  f"{j.get('rate', 0):.3%}" if j.get("rate") is not None else "—",
                  _agree(r), mark)
    con.print(t)


def _detail(con: Console, r: RunResult) -> None:
    lat = r.latency or {}
    w = r.warmup or {}
    curve = " → ".join(fmt_ns(v) for v in w.get("window_p50_ns", [])[:8])
    if len(w.get("window_p50_ns", [])) > 8:
        curve += " → …"
    lines = [f"[bold]{r.variant}[/bold] batch {r.batch}: mean {fmt_ns(lat.get('mean_ns'))} "
             f"± {fmt_ns(lat.get('stdev_ns'))}, min {fmt_ns(lat.get('min_ns'))}",
             f"  warm-up: {w.get('reason')}; window P50s {curve}"]
    if r.response:  # open loop: the table shows response time; service time here
        lines.append("  service time (call only, without queueing): " + ", ".join(
            f"P{q:g} {_pct(r, q, 'latency')}" for q in PERCENTILES) +
            f", max {fmt_ns(lat.get('max_ns'))}")
    j = r.jitter or {}
    if j:
        lines.append(f"  tail jitter > {j['threshold_ns'] / 1e3:g} µs: {j['count']}/"
                     f"{j['samples']} = {(j['rate'] or 0):.3%} (95% CI {j['wilson95_low']:.3%}"
                     f"–{j['wilson95_high']:.3%})")
    a = r.attribution or {}
    if a.get("slow_count"):
        lines.append(f"  slowest 1% (≥ {fmt_ns(a['slow_threshold_ns'])}, {a['slow_count']} "
                     f"samples): {_share(a['slow_share_ivcsw'])} with an involuntary context "
                     f"switch, {_share(a['slow_share_fault'])} with a page fault "
                     f"(all samples: {_share(a['all_share_ivcsw'])}, "
                     f"{_share(a['all_share_fault'])})")
    g = r.agreement
    if g:
        lines.append(f"  agreement vs fp32 reference on {g['n']} inputs: "
                     + (f"argmax {g['argmax_share']:.1%}, " if g["argmax_share"] is not None else "")
                     + f"max abs err {g['max_abs_err']:.2e}, max rel err {g['max_rel_err']:.2e}"
                     + ("" if g["passes"] else f" — [red]fails {g['rule']}: not recommended[/red]"))
    if r.throughput_per_s:
        lines.append(f"  throughput {r.throughput_per_s:,.0f} samples/s")
    for n in r.notes:
        lines.append(f"  [dim]{n}[/dim]")
    con.print("\n".join(lines))


def _idle_gaps(con: Console, r: RunResult) -> None:
    """The cold-after-quiet table of ``probe --idle-gaps``."""
    from agent.probe.idle import fmt_gap, headline
    t = Table(title=f"{r.variant}: latency after an idle gap (interleaved rounds)")
    for col in ("idle gap", "slept (mean)", "calls", "P50", "P90", "P99", "max", "P50 ×",
                "P99 ×"):
        t.add_column(col, justify="right" if col != "idle gap" else "left")
    for row in r.idle_gaps or []:
        lat = row["latency"]
        suff = lat.get("sufficient", {})

        def p(q: str, lat=lat, suff=suff) -> str:
            return fmt_ns(lat.get(q + "_ns")) + ("" if suff.get(q, True) else "*")
        t.add_row(fmt_gap(row["gap_ns"]), fmt_ns(row["slept_mean_ns"]), str(lat["count"]),
                  p("p50"), p("p90"), p("p99"), fmt_ns(lat.get("max_ns")),
                  f"{row['p50_ratio']:.2f}" if row.get("p50_ratio") else "—",
                  f"{row['p99_ratio']:.2f}" if row.get("p99_ratio") else "—")
    con.print(t)
    line = headline(r.idle_gaps or [])
    if line:
        con.print(f"  {line}")


def _share(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def _throughput(con: Console, runs: Sequence[RunResult]) -> None:
    t = Table(title="throughput by batch size", title_justify="left")
    for col in ("config", "variant", "batch", "P50", "P99", "samples/s"):
        t.add_column(col, justify="left" if col in ("config", "variant") else "right")
    for r in runs:
        if r.ok:
            t.add_row(r.config["id"], r.variant, str(r.batch), _pct(r, 50), _pct(r, 99),
                      f"{r.throughput_per_s:,.0f}" if r.throughput_per_s else "—")
    con.print(t)


def _sweep(con: Console, result: ProbeResult) -> None:
    t = Table(title="thread sweep (batch 1)", title_justify="left")
    for col in ("config", "variant", "P50", "P99", "P99.9", ""):
        t.add_column(col, justify="left" if col in ("config", "variant", "") else "right")
    for r in result.runs:
        if r.ok and r.batch == 1:
            t.add_row(r.config["id"], r.variant, _pct(r, 50), _pct(r, 99), _pct(r, 99.9),
                      "◀ best" if r.recommended else "")
    con.print(t)


def write_csv(out: IO[str], result: ProbeResult, arrays: Sequence[Samples | None]) -> int:
    """One row per timed sample of every run (columns: CSV_COLUMNS). Returns rows written."""
    w = csv.writer(out)
    w.writerow(CSV_COLUMNS)
    rows = 0
    for r, s in zip(result.runs, arrays, strict=True):
        if s is None:
            continue
        lat = s.latency_ns
        resp = s.response_ns
        data = s.data
        for i in range(s.count):
            w.writerow((r.config["id"], r.variant, r.batch, i, *data[:, i].tolist(),
                        int(lat[i]), int(resp[i])))
        rows += s.count
    return rows
