"""History for a person: the run listing and one run in its kind's own shape (a probe or gate
run its latency figures, an audit its findings, a cpus scan its ranking, a watch its causes),
then the host it ran on and its gate results. Every string from the database is printed as
text, never as markup; a percentile a run had too few samples to claim is marked ``*``
(agent.stats.REQUIRED_SAMPLES), as the probe's tables mark it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console

    from .store import Run


def _us(ns: Any) -> str:
    if ns is None:
        return "—"
    return f"{ns / 1e3:,.0f}" if ns >= 100_000 else f"{ns / 1e3:.1f}"



def _us_marked(ns: Any, count: int | None, q: float) -> str:
    """A percentile in µs, ``*`` when the run's samples are too few to claim it (as the
    probe's tables mark it: agent.stats.REQUIRED_SAMPLES)."""
    from agent.stats import REQUIRED_SAMPLES
    if ns is None:
        return ""
    return _us(ns) + ("*" if (count or 0) < REQUIRED_SAMPLES[q] else "")


def render_list(runs: list[Run], path: object, con: Console | None = None) -> None:
    """The run listing: one row per run (a table on a wide terminal, a list otherwise:
    agent/textout.py), titled with the database's path."""
    from agent import textout
    con = con or textout.console()
    cols = [textout.Column("id", right=True, label="run"), textout.Column("UTC"),
            textout.Column("kind"), textout.Column("model"), textout.Column("variant"),
            textout.Column("n", right=True), textout.Column("P50µs", right=True),
            textout.Column("P99µs", right=True), textout.Column("P99.9µs", right=True),
            textout.Column("gate")]
    rows = []
    for r in runs:
        k = r.kind + (f"/{r.scenario}" if r.scenario else "")
        cells = {"id": str(r.id), "UTC": r.created_utc[:16].replace("T", " "), "kind": k,
                 "model": Text((r.model_key or "").removeprefix("builtin:")),
                 "variant": Text(r.variant or ""), "n": str(r.sample_count or ""),
                 "P50µs": _us_marked(r.p50_ns, r.sample_count, 50.0),
                 "P99µs": _us_marked(r.p99_ns, r.sample_count, 99.0),
                 "P99.9µs": _us_marked(r.p999_ns, r.sample_count, 99.9),
                 "gate": r.gate_status or ""}
        rows.append(textout.Row(cells, tag=r.kind))
    title = Text(f"{len(runs)} run(s) in ")
    title.append(str(path))
    textout.show(con, title, cols, rows, head=("id", "UTC"), tag_column="kind")


def _plain(v: Any) -> str:
    """A stored value as a person reads it: never ``None``, a dict repr or a list repr."""
    if v is None or v == "":
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_plain(x)}" for k, x in v.items()) or "—"
    if isinstance(v, list | tuple):
        return ", ".join(_plain(x) for x in v) or "—"
    return str(v)


FINGERPRINT_KEYS = ("hostname", "kernel", "cpu_model", "online_cpus", "governors", "turbo",
                    "isolated_cpus", "nohz_full_cpus", "virtualization", "gpu_models",
                    "gpu_driver", "audit")


def render_run(r: Run, gate_results: list[dict], con: Console | None = None) -> None:
    """One run in its kind's own shape: a probe or gate run its latency figures; an audit its
    findings; a cpus scan its ranking; a watch its causes. Then the host it ran on and its
    gate results. Every string from the database is printed as text, never as markup."""
    from agent import textout
    con = con or textout.console()
    w = max(con.width, 40)
    head = [("kind", f"{r.kind} ({r.command})"), ("UTC", r.created_utc)]
    if r.scenario:
        head.append(("scenario", r.scenario))
    textout.line(con, (f"run {r.id}", "bold"))
    for ln in textout.pack(head, w, indent="  "):
        con.print(ln, soft_wrap=True)
    summary = r.summary if isinstance(r.summary, dict) else {}
    shape = {"audit": _show_audit, "cpus": _show_cpus, "watch": _show_watch}.get(r.kind,
                                                                                 _show_latency)
    shape(con, r, summary)
    fp = r.fingerprint if isinstance(r.fingerprint, dict) else {}
    textout.line(con, ("host", "bold"))
    pairs = [(k, _plain(fp.get(k))) for k in FINGERPRINT_KEYS if fp.get(k) not in (None, "")]
    for ln in textout.pack(pairs, w, indent="  ") or [Text("  (no fingerprint recorded)")]:
        con.print(ln, soft_wrap=True, style="dim")
    for g in gate_results:
        textout.line(con, f"gate #{g['id']} [{_plain(g.get('scenario'))}] vs "
                     f"{_plain(g.get('baseline_id'))}: ", (_plain(g.get("status")), "bold"))


def _show_latency(con: Console, r: Run, summary: dict) -> None:
    """probe and gate runs: the model, the variant and the latency figures."""
    from agent import textout
    pairs = [("model", Text(r.model_key or "—")), ("hash", (r.model_hash or "—")[:16]),
             ("variant", Text(r.variant or "—")), ("TF", r.tf_version or "—"),
             ("samples", f"{r.sample_count or 0:,}"), ("P50", _us_unit(r.p50_ns)),
             ("P99", _us_unit(r.p99_ns)), ("P99.9", _us_unit(r.p999_ns)),
             ("cold start", _us_unit(r.cold_start_ns))]
    lat = summary.get("latency") if isinstance(summary.get("latency"), dict) else {}
    suff = lat.get("sufficient") if isinstance(lat.get("sufficient"), dict) else {}
    for q in ("p99", "p999"):
        if suff.get(q) is False:
            pairs = [(k, v + "*" if k == {"p99": "P99", "p999": "P99.9"}[q] else v)
                     for k, v in pairs]
    for ln in textout.pack(pairs, max(con.width, 40), indent="  "):
        con.print(ln, soft_wrap=True)
    if any(suff.get(q) is False for q in ("p99", "p999")):
        textout.line(con, "  * = fewer samples than needed to claim this percentile",
                     style="dim")


def _us_unit(ns: Any) -> str:
    return "—" if ns is None else f"{_us(ns)} µs"


def _show_audit(con: Console, r: Run, summary: dict) -> None:
    """An audit run: its status counts and every finding that is not ok."""
    from agent import textout
    from agent.render import STYLE
    from tuning.findings import Status
    findings = [f for f in summary.get("findings") or [] if isinstance(f, dict)]
    counts = summary.get("summary") if isinstance(summary.get("summary"), dict) else {}
    textout.line(con, "  ", ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                 or f"{len(findings)} findings", (f"  profile {_plain(summary.get('profile'))}"
                                                  f", target CPUs "
                                                  f"{_plain(summary.get('target_cpus'))}",
                                                  "dim"))
    todo = [f for f in findings if f.get("status") not in ("ok", "unsupported")]
    if not todo:
        textout.line(con, "  nothing to fix", style="green")
    said: dict[str, str] = {}
    for f in todo:
        st = str(f.get("status"))
        try:
            style = STYLE[Status(st)]
        except ValueError:
            style = ""
        textout.line(con, "  ", (f"[{st}]", style), " ", _plain(f.get("title")),
                     (f"  ({_plain(f.get('id'))})", "dim"))
        if f.get("current"):
            textout.line(con, f"      current:  {_plain(f.get('current'))}")
        if f.get("expected"):
            textout.line(con, f"      expected: {_plain(f.get('expected'))}")
        fix = f.get("fix")
        if fix:
            if fix in said:
                textout.line(con, f"      fix: as for {said[fix]}")
            else:
                said[fix] = _plain(f.get("id"))
                for i, cmd in enumerate(str(fix).splitlines()):
                    textout.line(con, ("      fix: " if i == 0 else "           ") + cmd)
    unsupported = sum(1 for f in findings if f.get("status") == "unsupported")
    if unsupported:
        textout.line(con, f"  {unsupported} unsupported here (hftagent history show "
                     f"{r.id} --json lists them)", style="dim")


def _show_cpus(con: Console, r: Run, summary: dict) -> None:
    """A cpus scan: the ranking with each CPU's verdict and lost time, the recommendation."""
    from agent import textout
    from collectors.parsers import format_cpulist
    cpus = {c.get("cpu"): c for c in summary.get("cpus") or [] if isinstance(c, dict)}
    ranked = [c for c in summary.get("ranked") or [] if c in cpus]
    ranked += [c for c in cpus if c not in ranked]
    left = summary.get("left_out") if isinstance(summary.get("left_out"), dict) else {}
    for c in ranked:
        d = cpus[c]
        verdict = "error" if d.get("error") else _plain(d.get("verdict"))
        pairs = [("lost µs/s", _plain(d.get("noise_us_per_s"))),
                 ("gaps/s", _plain(d.get("gaps_per_s")))]
        why = d.get("error") or left.get(str(c)) or left.get(c)
        if why:
            pairs.append(("left out", _plain(why)))
        textout.line(con, "  ", (f"[{verdict}]", "green" if verdict == "quiet" else "yellow"),
                     f" CPU {c}")
        for ln in textout.pack(pairs, max(con.width, 40)):
            con.print(ln, soft_wrap=True)
    rec = [c for c in summary.get("recommended") or [] if isinstance(c, int)]
    textout.line(con, "  recommended: ", (f"--cpus {format_cpulist(rec)}", "bold") if rec
                 else ("none", "red"))


def _show_watch(con: Console, r: Run, summary: dict) -> None:
    """A watch run: its samples and spikes, the latency figures, the spikes by cause."""
    from agent import textout
    pairs = [(k, _plain(summary.get(k))) for k in ("samples", "spikes")
             if summary.get(k) is not None]
    for key, label in (("p50_ns", "P50"), ("p99_ns", "P99"), ("p999_ns", "P99.9")):
        v = summary.get(key, getattr(r, key, None))
        if isinstance(v, int | float):
            pairs.append((label, _us_unit(v)))
    if r.model_key:
        pairs.insert(0, ("probe", Text(r.model_key)))
    for ln in textout.pack(pairs, max(con.width, 40), indent="  "):
        con.print(ln, soft_wrap=True)
    causes = summary.get("causes") if isinstance(summary.get("causes"), dict) else {}
    if not causes:
        textout.line(con, "  no spike attributed" if summary.get("spikes") else
                     "  no causes recorded", style="dim")
        return
    textout.line(con, "  spikes by cause:")
    total = sum(v for v in causes.values() if isinstance(v, int | float)) or 0
    for name, n in sorted(causes.items(), key=lambda kv: -(kv[1] if isinstance(kv[1], int |
                                                                                    float)
                                                           else 0)):
        share = f" ({n / total:.0%})" if total and isinstance(n, int | float) else ""
        textout.line(con, f"    {_plain(name)}: {_plain(n)}{share}")
