"""The end-of-run summary of ``hftagent watch`` for a person (:func:`render`: the lines on
stdout; :func:`closing`: the lines on stderr that say why the run ended), from the summary
dict (:func:`agent.watch.summary.build`, which ``--json`` prints as it is).

One small function per part, each returning its lines (none when it has nothing to say): a
value that is not known is left out or said in words, never printed as ``None``.
"""

from __future__ import annotations


def render(s: dict, spike_log: str | None = None) -> list[str]:
    """The summary's lines, in order: what was watched, the spikes and their causes, the
    attribution delay, the collectors, perf, the sampler, the kernel events, the warnings
    and where the records went."""
    parts = (headline, spikes, causes, delay, collectors, perf, pmu, sampler, events,
             own_cost, warnings)
    lines = [line for part in parts for line in part(s)]
    return lines + outputs(s, spike_log)


def closing(s: dict, spike_log: str | None = None) -> list[str]:
    """The stderr lines on how the run ended: a requested stop, a source that died, a spike
    log that could not be written."""
    kept = f" at {spike_log}" if spike_log else ""
    out = []
    if s["stopped_by"]:
        out.append(f"hftagent: stopped by {s['stopped_by']}"
                   + (f"; spike log flushed to {spike_log}" if spike_log else ""))
    if s["source_error"]:
        out.append(f"hftagent: error: {s['source_error']}; spike log kept{kept}")
    elif s["output_error"]:
        out.append(f"hftagent: error: {s['output_error']}")
    return out


def _us(v: float | None) -> str:
    return "–" if v is None else f"{v:g} µs"


def headline(s: dict) -> list[str]:
    who = s["source"]  # (the source says what it is: agent/watch/latency/)
    pid = f" (pid {s['pid']})" if s.get("pid") is not None and \
        f"pid {s['pid']}" not in who else ""  # (an attached source names its pid)
    rate = s.get("rate_hz")  # (None: a source without a rate of its own)
    at = (f" at {rate:g}/s" if rate else "") + (" (--rate auto)" if s.get("rate_auto") else "")
    figures = "" if not s["samples"] else (
        f", P50 {_us(s['p50_us'])}, P99 {_us(s['p99_us'])}, P99.9 {_us(s['p999_us'])}, "
        f"max {_us(s['max_us'])}")
    lines = [f"watched {who}{pid} on CPU {','.join(map(str, s['probe_cpus']))}{at} for "
             f"{s['duration_s']} s: {s['samples']} samples{figures}"]
    cpu, own = s.get("probe_cpu_busy"), s.get("probe_calls_busy")
    load = ([f"{100 * cpu:.0f} % busy (/proc/stat)"] if cpu is not None else []) + \
        ([f"{100 * own:.0f} % with the probe's calls"] if own is not None else [])
    if load:
        lines.append(f"CPU {','.join(map(str, s['probe_cpus']))}: " + ", ".join(load))
    return lines


def spikes(s: dict) -> list[str]:
    return [f"spikes: {s['spikes']} ({s['attributed']} attributed"
            + (f", {s['queued']} of them queued behind a slow sample and given its cause"
               if s.get("queued") else "")
            + (f", {s['inherited']} inheriting the cause of a spike ms away (over the "
               "attribution rate limit, step budget or watch's CPU budget)"
               if s.get("inherited") else "")
            + (f"; {s['not_attributed']} not attributed: rate limit, backlog or end of run, "
               "each logged with its reason" if s["not_attributed"] else "") + ")"] + (
        [f"  {s['unexplained_with_nearest_exact']} unexplained by the polled rules name their "
         "CPU's latest exact story (nearest_exact)"]
        if s.get("unexplained_with_nearest_exact") else [])


def causes(s: dict) -> list[str]:
    out = []
    for c, d in s["causes"].items():
        top = f"  e.g. {'; '.join(d['top'])}" if d["top"] else ""
        out.append(f"  {c:<20} {d['count']:>6}  {100 * d['share']:5.1f} %{top}")
    return out


def delay(s: dict) -> list[str]:
    d = s["attribution_delay_ms"]
    if d["p50"] is None:
        return []
    return [f"spike → attributed record: P50 {d['p50']:.0f} ms, max {d['max']:.0f} ms"]


def collectors(s: dict) -> list[str]:
    out = [f"{n}: {c['signals_refused']} new signal(s) refused (every column of its ring "
           f"had a value lately; {c.get('columns_reused', 0)} column(s) given to new ones)"
           for n, c in s["collectors"].items() if c.get("signals_refused")]
    bad = {n: c for n, c in s["collectors"].items() if c["state"] != "ok"}
    if not bad:
        return out
    return ["unsupported collectors: " + "; ".join(f"{n} ({c.get('reason') or c['state']})"
                                                   for n, c in bad.items())] + out


def perf(s: dict) -> list[str]:
    p = s["collectors"].get("perf", {})
    if p.get("state") != "ok":
        return []
    counts = ", ".join(f"{v:.0f} {_event(k)}" for k, v in p.get("totals", {}).items())
    hw = ", ".join(_event(k) for k in p.get("unsupported_signals", {}))
    pid = f" (pid {s['pid']})" if s.get("pid") is not None else ""
    return [f"perf{pid}: {counts or 'nothing counted'}"
            + (f"; not supported here: {hw}" if hw else "")]


def pmu(s: dict) -> list[str]:
    """--attach --pmu: the calls counted per thread, or the one line why not (never 0)."""
    p = s.get("pmu")
    if not p:
        return []
    if "status" in p:
        return [f"pmu: {p['status']}"]
    return [f"pmu: {', '.join(p['counters'])} per call: {p['calls_counted']} calls counted "
            f"on {p['threads']} thread(s)"
            + (f", {p['calls_unmatched']} without their samples" if p["calls_unmatched"]
               else "")
            + (f", {p['calls_multiplexed']} multiplexed (not exact: left out)"
               if p["calls_multiplexed"] else "")
            + (f", {p['lost']} samples lost" if p["lost"] else "")
            + (f", {p['threads_failed']} thread(s) not counted" if p.get("threads_failed")
               else "")]


def sampler(s: dict) -> list[str]:
    smp = s["sampler"]
    if not smp:
        return []
    split = ""
    if smp.get("helper_cpu_share") is not None:
        split = (f" (reader {100 * smp['helper_cpu_share']:.2f} %, replay "
                 f"{100 * (smp['drain_cpu_share'] or 0):.2f} %)")
    per_round = smp["cpu_us_per_round"]
    out = [f"sampler ({smp['mode']}) on CPU {','.join(map(str, smp['pinned_to']))}: "
           f"{smp['rounds']} rounds"
           + (f", {per_round} µs CPU/round" if per_round is not None else "")
           + f", {100 * (smp['cpu_share_of_one_cpu'] or 0):.2f} % of one CPU{split}"
           + (f"; {smp['note']}" if smp.get("note") else "")]
    red = smp.get("reduced_by_events") or {}
    if red:  # the polls kernel events cover, slowed while they run
        out.append("polled less while kernel events run: " + ", ".join(
            f"{k} {v['from_hz']:g} → {v['to_hz']:g} Hz" for k, v in red.items()))
    return out


def events(s: dict) -> list[str]:
    ev = s.get("events") or {}
    if not ev.get("active"):
        return []
    rate = ", ".join(f"CPU {c} {r}/s" for c, r in ev.get("rate_per_cpu", {}).items())
    return [f"kernel events: {ev['windows']} spike windows read"
            + (f" ({ev['incomplete']} incomplete)" if ev.get("incomplete") else "")
            + (f", {ev['mean_read_us']} µs each" if ev.get("mean_read_us") else "")
            + (f" ({100 * ev['read_cpu_share_of_one_cpu']:.2f} % of one CPU)"
               if ev.get("read_cpu_share_of_one_cpu") else "")
            + (f"; {rate}" if rate else "") + (f"; {ev['lost']} lost" if ev.get("lost")
                                                else "")]


def own_cost(s: dict) -> list[str]:
    """Watch's own CPU by part, its budget's decisions, and what an attached service is
    charged (the summary's ``own_cpu``)."""
    oc = s.get("own_cpu") or {}
    if oc.get("share_of_one_cpu") is None:
        return []
    parts = ", ".join(f"{p} {100 * v:.2f}" for p, v in oc["by_part"].items() if v)
    out = [f"watch's own CPU: {100 * oc['share_of_one_cpu']:.2f} % of one CPU"
           + (f" ({parts} %)" if parts else "")]
    b = oc.get("budget")
    if b is not None:
        out[0] += (f"; budget {b['pct_of_one_cpu']:g} %: {b['exact_attributions']} spike(s) "
                   f"with exact attribution, {b['skipped_exact_attributions']} without"
                   + (f", {b['shed_polled_rules']} with the cause of a spike ms away on the "
                      "same CPU (its polled rules shed)" if b.get("shed_polled_rules") else "")
                   + (f"; the sampler's rounds slowed ×2 for {b['slow_rounds_s']:.0f} s"
                      if b.get("slow_rounds_s") else ""))
    ch = oc.get("charged_to_service")
    if ch and ch.get("share_of_one_cpu") is not None:
        out.append(f"charged to the attached service: ~{ch['us_per_call']:g} µs a call × "
                   f"{ch['calls_per_s']:g} calls/s = {100 * ch['share_of_one_cpu']:.2f} % of "
                   "one CPU")
    return out


def warnings(s: dict) -> list[str]:
    return [f"warning: {w}" for w in s["warnings"]]


def outputs(s: dict, spike_log: str | None) -> list[str]:
    out = []
    if s["flight_records"]:
        out.append(f"flight records: {len(s['flight_records'])} in "
                   f"{s['flight_records'][0].rsplit('/', 1)[0]}")
    if spike_log:
        out.append(f"spike log: {spike_log}")
    return out


def _event(signal_name: str) -> str:
    """``perf.123.context_switches_total`` → ``context-switches`` (perf's event name)."""
    return signal_name.split(".")[-1].removesuffix("_total").replace("_", "-")
