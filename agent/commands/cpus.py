"""`hftagent cpus`: rank the CPUs by measured noise and recommend the inference CPUs."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from agent.commands.common import DbOpt, JsonOpt, NoHistoryOpt, cli_errors, fail, make_host

HELP = """Scan each candidate CPU for noise and recommend the inference CPUs.

A small C loop pinned to each candidate reads the clock for --duration seconds and records
every gap over --threshold-us (or 8x the smallest gap seen): the time that CPU lost to IRQs,
softirqs, the tick, kworkers, other tasks or the hypervisor. A few CPUs are scanned at a time
(at most a quarter of the online CPUs), never the housekeeping core. The ranking takes the
quietest CPUs, one per physical core, on the GPU's / NIC's NUMA node when known, and avoids
CPUs other processes are pinned to. It prints the --cpus to use and the exact tune and run
commands. With kernel events (--trace; root) each CPU's lost time is attributed exactly:
µs per second per IRQ, softirq, tick, work item and task, and the gaps no event explains
as hw_or_hypervisor; without them, from /proc counter deltas. Read-only: nothing on the
host is changed (--trace uses a private tracefs instance, removed after each batch).
SIGTERM or SIGINT (Ctrl-C) during the scan stops it: the recorders are killed and the
instance removed, nothing is recorded, exit status 128 + the signal's number (143, 130); a
recorder whose hftagent was killed (kill -9 included) exits at once."""


def cpus(
    duration: Annotated[float, typer.Option("--duration", help="Seconds of scan per CPU "
                                            "(0 < S <= 60).")] = 1.0,
    candidates: Annotated[str | None, typer.Option("--candidates", help="CPUs to scan. "
                                                   "Default: all online CPUs but the "
                                                   "housekeeping core.")] = None,
    threshold_us: Annotated[float, typer.Option("--threshold-us", help="Smallest gap counted "
                                                "as noise (µs).")] = 1.0,
    count: Annotated[int | None, typer.Option("--count", help="How many CPUs to recommend. "
                                              "Default: every quiet one the rules allow.")] = None,
    allow_siblings: Annotated[bool, typer.Option("--allow-siblings", help="Allow both SMT "
                                                 "siblings of a core.")] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write a PNG of the per-CPU "
                                             "noise here.")] = None,
    trace: Annotated[str, typer.Option("--trace", help="Kernel events (tracefs) to attribute "
                                       "each CPU's gaps exactly: auto (where tracefs is "
                                       "mounted and usable, else /proc deltas and the reason), "
                                       "on (an error where unusable), off, or mount (mount "
                                       "tracefs at /sys/kernel/tracing first when it is not "
                                       "mounted). Needs root.")] = "auto",
    db: DbOpt = None,
    no_history: NoHistoryOpt = False,
    textfile: Annotated[str | None, typer.Option("--textfile", help="Also write the per-CPU "
                                                 "noise as DIR/hftagent_cpu_noise.prom for "
                                                 "node_exporter's textfile collector.")] = None,
    json_out: JsonOpt = False,
) -> None:
    from agent.noise import rank as rk
    from agent.noise import scan as sc
    from collectors import cpu as cpuc
    from collectors.parsers import format_cpulist
    from collectors.system import numa_nodes
    from tuning.targets import TargetError, housekeeping_core, online_cpus

    if not 0 < duration <= sc.MAX_DURATION_S:
        raise fail(f"--duration must be > 0 and <= {sc.MAX_DURATION_S:g} s")
    if not 0 < threshold_us <= 1e6:
        raise fail("--threshold-us must be > 0 and <= 1000000")
    if count is not None and count < 1:
        raise fail("--count must be >= 1")
    if trace not in ("auto", "on", "off", "mount"):
        raise fail(f"--trace must be auto, on, off or mount, not {trace!r}")
    if db is not None and no_history:
        raise fail("--db and --no-history contradict each other: give one")
    if plot is not None:
        from agent.commands.common import check_output_file
        check_output_file(plot, "--plot")
        from agent.plot import available
        available("--plot")  # before the scan, used after it
    if textfile is not None:
        from agent.commands.common import check_output_dir
        check_output_dir(textfile, "--textfile")
    from agent.commands.common import check_history_db
    no_history = not check_history_db(db, no_history)  # --db checked before the scan (#28.4)
    host = make_host()
    try:
        online, _ = online_cpus(host)
    except TargetError as exc:
        raise fail(str(exc)) from None
    if len(online) < 2:
        raise fail(f"only CPU {format_cpulist(online)} is online: nothing to choose from "
                   "(one CPU must stay for housekeeping)")
    house = housekeeping_core(host, online)
    if candidates is not None:
        from collectors.parsers import parse_cpu_option
        try:
            cand = parse_cpu_option(candidates, online)
        except ValueError as exc:
            raise fail(str(exc).replace("--cpus", "--candidates")) from None
        clash = sorted(set(cand) & set(house))
        if clash:
            raise fail(f"--candidates {candidates!r} covers the housekeeping core "
                       f"(CPU {format_cpulist(house)}): scan other CPUs")
    else:
        cand = [c for c in online if c not in house]
    if not cand:
        raise fail("no candidate CPUs left besides the housekeeping core")
    if count is not None and count > len(cand):
        raise fail(f"--count {count} is more than the {len(cand)} candidate CPU(s)")

    def progress(group: list[int]) -> None:
        if not json_out:
            print(f"scanning CPU {format_cpulist(group)} for {duration:g} s ...",
                  file=sys.stderr, flush=True)

    from agent.noise.events import Tracer
    tracer = Tracer(trace, host)
    try:
        with _stop_on_signals():
            results = sc.scan(host, cand, len(online), duration, int(threshold_us * 1000),
                              progress=progress, tracer=tracer, irq_sender=house[0])
    except _Stopped as stop:
        print(f"hftagent: cpus stopped by {stop.name} during the scan: recorders killed, "
              "nothing recorded", file=sys.stderr)
        raise typer.Exit(128 + stop.signum) from None
    rk.judge(results)
    smt = cpuc.smt(host, cand).siblings
    nodes = numa_nodes(host)
    cpu_node = {c: n for n, cs in nodes.items() for c in cs}
    dev_nodes = device_nodes(host)
    choice = rk.rank(results, siblings=smt, cpu_node=cpu_node, device_nodes=dev_nodes,
                     pinned=sc.pinned_processes(host, cand), count=count,
                     allow_siblings=allow_siblings)
    rec = format_cpulist(choice.recommended) if choice.recommended else None
    commands = ([f"hftagent tune plan --cpus {rec}", f"hftagent tune apply --cpus {rec}",
                 f"hftagent run --cpus {rec} -- CMD"] if rec else [])
    doc = {"duration_s": duration, "threshold_us": threshold_us, "online": online,
           "housekeeping": house, "candidates": cand,
           "cpus": [r.to_dict() for r in results], "ranked": choice.ranked,
           "recommended": choice.recommended, "left_out": choice.left_out,
           "device_nodes": choice.device_nodes, "commands": commands,
           "trace": tracer.info()}
    if plot:
        _plot(results, choice.recommended, plot)
    if textfile:
        import time

        from agent.export.textfile import render_families, write_prom
        from agent.noise.export import TEXTFILE_NAME, families
        write_prom(render_families(families(doc, time.time())), textfile, TEXTFILE_NAME)
    if json_out:
        print(json.dumps(doc, indent=2))
    else:
        _render(results, choice, house, rec, commands, doc["trace"])
    if not no_history:
        # the noise fingerprint of this box, comparable over time and across boxes
        # (hftagent history list --kind cpus; history show N)
        from agent.gate.history import record_run
        record_run("cpus", doc, None, command="cpus", db=db, warn=True)
    if not choice.recommended:
        raise typer.Exit(2)


class _Stopped(BaseException):
    """SIGTERM or SIGINT during the scan. A BaseException (as KeyboardInterrupt), so that no
    ``except Exception`` on the way swallows it: it unwinds the scan through its ``finally``
    blocks, which kill the recorders (agent/noise/scan.py) and close the tracefs instance."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM/SIGINT raise :class:`_Stopped` in the main thread while the block runs; after
    the first, both are ignored until the block is left, so a second Ctrl-C cannot cut the
    clean-up short. The previous handlers come back on the way out. Outside the main thread
    (library use) nothing is installed."""

    def stop(signum: int, _frame) -> None:
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        raise _Stopped(signum)

    try:
        old = {s: signal.signal(s, stop) for s in _STOP_SIGNALS}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def device_nodes(host) -> list[int]:
    """NUMA nodes of the GPUs and NICs (PCI class display/3D or network), when known."""
    from collectors.pcie import is_gpu, is_nic, pci_devices
    return sorted({d.numa_node for d in pci_devices(host)
                   if d.numa_node is not None and d.numa_node >= 0 and (is_gpu(d) or is_nic(d))})


def _render(results, choice, house, rec, commands, trace: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from agent.probe.report import fmt_ns
    from collectors.parsers import format_cpulist

    con = Console()
    t = Table(title=f"CPU noise (housekeeping core: CPU {format_cpulist(house)})")
    for col in ("cpu", "verdict", "noise µs/s", "gaps/s", "P99 gap", "P99.9 gap", "max gap",
                "top cause"):
        t.add_column(col)
    for r in sorted(results, key=lambda r: choice.ranked.index(r.cpu)
                    if r.cpu in choice.ranked else 1 << 30):
        if r.error:
            t.add_row(str(r.cpu), "error", "", "", "", "", "", "")
            continue
        p = r.gap_percentiles()
        top = r.top_cause()
        t.add_row(str(r.cpu), r.verdict, f"{r.noise_us_per_s:.1f}", f"{r.gaps_per_s:.0f}",
                  fmt_ns(p["p99"]), fmt_ns(p["p999"]), fmt_ns(r.max_gap_ns),
                  _top(top))
    con.print(t, highlight=False)
    if not trace.get("active") and trace.get("reason"):
        con.print(f"kernel events: {trace['reason']}; attributed from /proc counters",
                  highlight=False, markup=False)
    costs = [r.irq_cost["cost_us"] for r in results
             if r.irq_cost and r.irq_cost.get("cost_us") is not None]
    if costs:
        con.print(f"one interrupt costs a running task {min(costs):.1f}-{max(costs):.1f} µs "
                  f"here (median {sorted(costs)[len(costs) // 2]:.1f}; hftagent watch "
                  "--irq-cost US under an external client)", highlight=False, markup=False)
    for r in results:
        if r.error:
            con.print(f"  CPU {r.cpu}: {r.error}", highlight=False, markup=False)
        elif r.events is not None:
            con.print(f"  CPU {r.cpu} (kernel events): {_events_line(r.events)}",
                      highlight=False, markup=False)
        else:
            causes = (", ".join(f"{k} {v:g}" for k, v in r.causes.items())
                      or "nothing counted")
            con.print(f"  CPU {r.cpu} (/proc counts per s): {causes}", highlight=False,
                      markup=False)
    for cpu, why in sorted(choice.left_out.items()):
        con.print(f"  CPU {cpu} left out: {why}", style="dim")
    if rec:
        con.print(f"recommended: [bold]--cpus {rec}[/bold]")
        for c in commands:
            con.print(f"  {c}")
    else:
        con.print("[red]no CPU can be recommended[/red]: every candidate is noisy or failed")


def _rate(us_per_s: float) -> str:
    return f"{us_per_s / 1e3:.1f} ms/s" if us_per_s >= 1000 else f"{us_per_s:.1f} µs/s"


def _top(top: tuple[str, float, str] | None) -> str:
    if top is None:
        return ""
    what, v, unit = top
    return f"{what} {_rate(v)}" if unit == "µs/s" else f"{what} {v:g}/s"


def _events_line(ev: dict, top: int = 5) -> str:
    """``python3 181.2 ms/s ×200, local timer tick 12.5 µs/s ×250, hw_or_hypervisor
    3.1 µs/s (2 gaps), 99.5 % of gap time inside events``."""
    parts = [f"{e['entity']} {_rate(e['us_per_s'])} ×{e['count']}" for e in ev["events"][:top]]
    if ev.get("hw_or_hypervisor_gaps"):
        parts.append(f"hw_or_hypervisor {_rate(ev['hw_or_hypervisor_us_per_s'])} "
                     f"({ev['hw_or_hypervisor_gaps']} gaps)")
    if ev.get("gap_time_explained_pct") is not None:
        parts.append(f"{ev['gap_time_explained_pct']:g} % of gap time inside events")
    if not ev.get("events_complete", True):
        parts.append(f"incomplete: {ev.get('events_reason')}")
    return ", ".join(parts) or "no events"


def _plot(results, recommended, path: str) -> None:
    from agent.plot import pyplot, save
    plt = pyplot("--plot")
    ok = [r for r in results if r.error is None]
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(ok) + 2), 3.5))
    ax.bar([str(r.cpu) for r in ok], [r.noise_us_per_s for r in ok],
           color=["tab:green" if r.cpu in recommended else
                  ("tab:red" if r.verdict == "noisy" else "tab:gray") for r in ok])
    ax.set_xlabel("CPU (green: recommended, red: noisy)")
    ax.set_ylabel("noise (µs lost per s)")
    ax.set_title("hftagent cpus")
    fig.tight_layout()
    save(fig, path)


def register(app: typer.Typer) -> None:
    app.command("cpus", help=HELP)(cli_errors(cpus))
