"""Rendering of a ProbeResult and the per-sample CSV. No TensorFlow.

Tables on a terminal at least 120 columns wide, lists below that and on a pipe
(agent/textout.py): no percentile, reason or path is ever cut. The model's name and every
string from the user or the model file is printed as text, never as rich markup."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import IO

from rich.console import Console
from rich.text import Text

from agent import textout
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
    head = f"{a['argmax_share']:.1%}" if a["argmax_share"] is not None \
        else f"rel {a['max_rel_err']:.1e}"
    return head + ("" if a["passes"] else " ✗")


def _reference(m: dict) -> str:
    """What agreement compares with, said as it is: for a .tflite model there is no fp32
    original (the worker's reference is the .tflite itself)."""
    kind = m.get("kind")
    if kind == "numpy":
        return "none (numpy stand-in: one variant)"
    if kind == "tflite":
        return ("the .tflite model itself: agreement then checks only batching, not accuracy "
                "(a real fp32 reference needs the SavedModel or .keras original and "
                "TensorFlow)")
    return f"fp32 {m.get('reference', 'graph')}"


def _ends(st: dict) -> str:
    n, budget = st.get("samples"), st.get("duration_s")
    if n and budget:
        return f"{n:,} samples or {budget:g} s, whichever comes first"
    if n:
        return f"{n:,} samples (no time budget)"
    if budget:
        return f"{budget:g} s"
    return "—"


def render(result: ProbeResult, console: Console | None = None, *,
           partial: str | None = None) -> None:
    """The report: header, per configuration the variants (a table on a wide terminal, a
    list otherwise: agent/textout.py) and each run's detail, throughput and sweep tables,
    warnings, the recommendation with its true reasons. ``partial``: the run was stopped
    (say so, first and last: the figures are what finished)."""
    con = console or textout.console()
    m, h, st = result.model, result.host, result.settings
    if partial:
        textout.line(con, ("partial result", "bold yellow"), f": {partial}")
    mode = (f"open at {st['rate_hz']:g} calls/s (response time from the intended start)"
            if st.get("rate_hz") else "closed")
    header = [
        ("model", Text(f"{m.get('name') or '—'} ({m.get('kind') or '—'})")),
        ("input", Text(" ".join(str(x) for x in (m.get("input_name"), m.get("probe_shape"),
                                                  m.get("input_dtype")) if x is not None))),
        ("runtime", "numpy (no TensorFlow on this path)" if m.get("kind") == "numpy" else
         f"TF {h.get('tensorflow') or 'not installed'} · LiteRT "
         f"{h.get('litert') or 'not installed'}"),
        ("CPUs", str(h.get("cpu_count") or "—")),
        ("loop", mode), ("warm-up", f"≥ {st['warmup']} calls"),
        ("a run ends at", _ends(st)),
        ("jitter threshold", f"{st['threshold_us']:g} µs"),
        ("reference", _reference(m)),
    ]
    textout.line(con, ("hftagent probe", "bold"))
    for ln in textout.pack(header, max(con.width, 40), indent="  "):
        con.print(ln, soft_wrap=True)
    configs = list(dict.fromkeys(r.config["id"] for r in result.runs))
    for cid in configs:
        runs = [r for r in result.runs if r.config["id"] == cid]
        _side_by_side(con, runs, cid)
        for r in runs:
            if r.ok and r.idle_gaps:
                _idle_gaps(con, r)
            elif r.ok:
                _detail(con, r)
    if len({r.batch for r in result.runs}) > 1:
        _throughput(con, result.runs)
    if len(configs) > 1:
        _sweep(con, result)
    for w in result.warnings:
        textout.line(con, ("warning: ", "yellow"), w)
    textout.line(con, "* = fewer samples than needed to claim this percentile "
                 f"(≥{P99_MIN_SAMPLES:,} for P99, ≥{P999_MIN_SAMPLES:,} for P99.9; "
                 "nearest-rank percentiles)", style="dim")
    if all(r.idle_gaps for r in result.runs if r.ok) and any(r.ok for r in result.runs):
        pass  # the idle-gap curve is the result: no timed loop to recommend a variant by
    elif partial:
        # a variant that did not finish is not beaten: nothing is recommended from a part
        textout.line(con, ("recommendation: none", "bold yellow"),
                     " — the run was stopped before every variant finished; run it to the end")
    else:
        _recommendation(con, result)
    if partial:
        textout.line(con, ("partial result", "bold yellow"),
                     f": {partial}; runs marked 'not run' did not finish")


def _recommendation(con: Console, result: ProbeResult) -> None:
    from agent.probe.runner import not_recommended
    rec = result.recommendation
    if rec:
        textout.line(con, ("recommendation: ", "bold green"), rec["variant"],
                     f" — P99 {fmt_ns(rec['p99_ns'])} ({rec['reason']}; {rec['config']['id']})")
    else:
        textout.line(con, ("recommendation: none", "bold red"),
                     " — no run can be recommended:")
        # a run that did not run has its reason on its own line above: not said twice
        pairs = [(n, "did not run" if why.startswith("did not run") else why)
                 for n, why in not_recommended(result.runs)]
        for reason, names in _by_reason(pairs):
            textout.line(con, f"  {', '.join(names)}: {reason}")
    if result.sweep_recommendation:
        sr = result.sweep_recommendation
        textout.line(con, ("threads: ", "bold green"), sr["config"]["id"],
                     f" → {sr['command'] or 'no reproducible configuration passed'}")
        if sr.get("note"):
            textout.line(con, f"  note: {sr['note']}", style="yellow")


def _by_reason(pairs: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """A reason shared by several runs is said once, naming them all."""
    out: dict[str, list[str]] = {}
    for name, why in pairs:
        out.setdefault(why, []).append(name)
    return list(out.items())


def _mark(r: RunResult) -> tuple[str, str]:
    """The run's status word and its style (the list's tag, the table's last column)."""
    if not r.ok:
        return r.status, "red"
    if r.recommended:
        return "best", "bold green"
    if r.agreement and not r.agreement["passes"]:
        return "not recommended", "yellow"
    if r.saturated:
        return "saturated", "yellow"
    if not (r.warmup or {}).get("stable", True):
        return "warm-up unstable", "yellow"
    return "ok", "green"


def _ended(r: RunResult) -> str:
    """Which ended the timed loop: its sample count or its time budget (the run's note says
    after how many samples)."""
    if not r.ok or r.headline is None or r.idle_gaps:
        return ""
    return "time budget" if r.timed_budget_hit else "sample count"


VARIANT_COLUMNS = [textout.Column("variant"), textout.Column("batch", right=True, label="batch"),
                   textout.Column("build", right=True), textout.Column("cold", right=True),
                   textout.Column("n", right=True), textout.Column("P50", right=True),
                   textout.Column("P90", right=True), textout.Column("P99", right=True),
                   textout.Column("P99.9", right=True), textout.Column("max", right=True),
                   textout.Column("jitter", right=True), textout.Column("agree", right=True),
                   textout.Column("ended by"), textout.Column("", label="status"),
                   textout.Column("reason")]


def _side_by_side(con: Console, runs: Sequence[RunResult], cid: str) -> None:
    rows = []
    said: dict[str, str] = {}  # a reason several runs share is said once
    for r in runs:
        tag, style = _mark(r)
        cells: dict[str, textout.Cell] = {"variant": r.variant, "batch": str(r.batch)}
        if not r.ok:
            why = r.reason or ""
            if why in said:
                cells["reason"] = Text(f"same reason as {said[why]}")
            else:
                said[why] = f"{r.variant} batch {r.batch}"
                cells["reason"] = Text(why)
        else:
            j = r.jitter or {}
            cells.update({
                "build": f"{r.build_s:.2f} s" if r.build_s is not None else "—",
                "cold": fmt_ns(r.cold_start_ns), "n": f"{r.headline['count']:,}",
                "P50": _pct(r, 50), "P90": _pct(r, 90), "P99": _pct(r, 99),
                "P99.9": _pct(r, 99.9), "max": fmt_ns(r.headline["max_ns"]),
                "jitter": f"{j['rate']:.3%}" if j.get("rate") is not None else "—",
                "agree": _agree(r), "ended by": _ended(r)})
        cells[""] = Text(tag, style=style)
        rows.append(textout.Row(cells, tag=tag, tag_style=style))
    cols = [c for c in VARIANT_COLUMNS
            if c.name != "reason" or any(not r.ok for r in runs)]
    textout.show(con, f"variants · {cid}", cols, rows, head=("variant", "batch"),
                 tag_column="")


def _detail(con: Console, r: RunResult) -> None:
    lat = r.latency or {}
    w = r.warmup or {}
    wins = w.get("window_p50_ns", [])
    curve = " → ".join(fmt_ns(v) for v in wins[:8]) + (" → …" if len(wins) > 8 else "")
    textout.line(con, (r.variant, "bold"), f" batch {r.batch}: mean {fmt_ns(lat.get('mean_ns'))}"
                 f" ± {fmt_ns(lat.get('stdev_ns'))}, min {fmt_ns(lat.get('min_ns'))}")
    lines = [f"warm-up: {w.get('reason')}; window P50s {curve}"]
    if r.response:  # open loop: the table shows response time; service time here
        lines.append("service time (call only, without queueing): " + ", ".join(
            f"P{q:g} {_pct(r, q, 'latency')}" for q in PERCENTILES) +
            f", max {fmt_ns(lat.get('max_ns'))}")
    if r.saturation and r.saturation.get("utilisation") is not None:
        sat = r.saturation
        lines.append(f"offered load {sat['utilisation']:.2f}x what one caller serves"
                     f"{' (saturated)' if r.saturated else ''}; last request started "
                     f"{fmt_ns(sat['behind_ns'])} after its intended time")
    j = r.jitter or {}
    if j:
        lines.append(f"tail jitter > {j['threshold_ns'] / 1e3:g} µs: {j['count']}/"
                     f"{j['samples']} = {(j['rate'] or 0):.3%} (95% CI {j['wilson95_low']:.3%}"
                     f"–{j['wilson95_high']:.3%})")
    a = r.attribution or {}
    if a.get("slow_count"):
        lines.append(f"slowest 1% (≥ {fmt_ns(a['slow_threshold_ns'])}, {a['slow_count']} "
                     f"samples): {_share(a['slow_share_ivcsw'])} with an involuntary context "
                     f"switch, {_share(a['slow_share_fault'])} with a page fault "
                     f"(all samples: {_share(a['all_share_ivcsw'])}, "
                     f"{_share(a['all_share_fault'])})")
    g = r.agreement
    if g:
        lines.append(f"agreement vs the reference on {g['n']} inputs: "
                     + (f"argmax {g['argmax_share']:.1%}, " if g["argmax_share"] is not None
                        else "")
                     + f"max abs err {g['max_abs_err']:.2e}, max rel err {g['max_rel_err']:.2e}"
                     + ("" if g["passes"] else f" — fails {g['rule']}: not recommended"))
    if r.throughput_per_s:
        lines.append(f"throughput {r.throughput_per_s:,.0f} samples/s")
    for ln in lines:
        textout.line(con, "  ", Text(ln))
    for n in r.notes:
        textout.line(con, "  ", Text(n), style="dim")


def _idle_gaps(con: Console, r: RunResult) -> None:
    """The cold-after-quiet table of ``probe --idle-gaps``."""
    from agent.probe.idle import fmt_gap, headline
    cols = [textout.Column("idle gap"), textout.Column("slept (mean)", right=True),
            textout.Column("calls", right=True), textout.Column("P50", right=True),
            textout.Column("P90", right=True), textout.Column("P99", right=True),
            textout.Column("max", right=True), textout.Column("P50 ×", right=True),
            textout.Column("P99 ×", right=True)]
    rows = []
    for row in r.idle_gaps or []:
        lat = row["latency"]
        suff = lat.get("sufficient", {})

        def p(q: str, lat=lat, suff=suff) -> str:
            return fmt_ns(lat.get(q + "_ns")) + ("" if suff.get(q, True) else "*")
        rows.append(textout.Row({
            "idle gap": fmt_gap(row["gap_ns"]), "slept (mean)": fmt_ns(row["slept_mean_ns"]),
            "calls": str(lat["count"]), "P50": p("p50"), "P90": p("p90"), "P99": p("p99"),
            "max": fmt_ns(lat.get("max_ns")),
            "P50 ×": f"{row['p50_ratio']:.2f}" if row.get("p50_ratio") else "—",
            "P99 ×": f"{row['p99_ratio']:.2f}" if row.get("p99_ratio") else "—"}))
    textout.show(con, f"{r.variant}: latency after an idle gap (interleaved rounds)", cols,
                 rows, head=("idle gap",))
    line = headline(r.idle_gaps or [])
    if line:
        textout.line(con, f"  {line}")


def _share(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def _throughput(con: Console, runs: Sequence[RunResult]) -> None:
    cols = [textout.Column("config"), textout.Column("variant"),
            textout.Column("batch", right=True), textout.Column("P50", right=True),
            textout.Column("P99", right=True), textout.Column("samples/s", right=True)]
    rows = [textout.Row({"config": r.config["id"], "variant": r.variant, "batch": str(r.batch),
                         "P50": _pct(r, 50), "P99": _pct(r, 99),
                         "samples/s": f"{r.throughput_per_s:,.0f}" if r.throughput_per_s
                         else "—"}) for r in runs if r.ok]
    textout.show(con, "throughput by batch size", cols, rows,
                 head=("variant", "batch"))


def _sweep(con: Console, result: ProbeResult) -> None:
    cols = [textout.Column("config"), textout.Column("variant"),
            textout.Column("P50", right=True), textout.Column("P99", right=True),
            textout.Column("P99.9", right=True), textout.Column("", label="status")]
    rows = []
    for r in result.runs:
        if r.ok and r.batch == 1:
            tag, style = _mark(r)
            rows.append(textout.Row({"config": r.config["id"], "variant": r.variant,
                                     "P50": _pct(r, 50), "P99": _pct(r, 99),
                                     "P99.9": _pct(r, 99.9), "": Text(tag, style=style)},
                                    tag=tag, tag_style=style))
    textout.show(con, "thread sweep (batch 1)", cols, rows, head=("config", "variant"),
                 tag_column="")


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
