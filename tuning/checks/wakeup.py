"""Wake-up family: how long an idle inference CPU takes to answer the next call.

The first call after a quiet spell pays the idle CPU's wake-up: an idle-state exit on bare
metal, a halt and the hypervisor's wake-up in a VM (hundreds of µs measured in a KVM guest
whose cpuidle driver halted at once). Findings, each with the exact `tune`/`run` command:

- ``wakeup.cpuidle``: the cpuidle driver and governor. ``idle=poll`` never idles; no driver
  (``none``) halts in the architecture's default idle (named per architecture:
  collectors.wakeup.default_idle), ``haltpoll`` polls for guest_halt_poll_ns first,
  ``intel_idle``/``acpi_idle`` pick C-states (their depth is cpu.cstates' and
  wakeup.pm_qos_resume_latency's business). A halting CPU in a VM is a warning unless
  `hftagent run --keep-awake` spinners hold every target CPU (profile key ``keep_awake``).
  Where the target CPUs are isolated (``isolcpus=``, or the cpuset of ``tune apply
  --isolate``) its fix is the wake-up lever the last ``hftagent tune try`` on this box measured
  best (same CPUs, kernel and boot arguments: tuning/trial_state.py), or running ``tune try``
  when there is none — which lever helps differs by box; elsewhere it is the isolation, and
  the finding says why: a CPU that other tasks may run on is seldom idle, the call then waits behind them
  whatever keeps the vCPU awake, and since Linux 5.4 (sched_idle_cpu) the kernel counts a CPU
  running only the SCHED_IDLE spinner as idle when it places waking tasks;
- ``wakeup.guest_halt_poll`` (only where the haltpoll module is loaded): 0 means halt at once;
- ``wakeup.pm_qos``: the effective /dev/cpu_dma_latency limit and who holds it (live host,
  root), against ``cpu_dma_latency_us``; not needed when no enabled idle state of the target
  CPUs is slower than that;
- ``wakeup.pm_qos_resume_latency``: each target CPU's pm_qos_resume_latency_us against
  ``pm_qos_resume_latency_us`` (the tunable of the same id writes it).
"""

from __future__ import annotations

from collectors import cpu as cpuc
from collectors import kernel
from collectors import wakeup as wk
from collectors.parsers import format_cpulist, group_by_value
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.findings import Finding, Status
from tuning.launcher import command_line
from tuning.tunables.pmqos import kernel_value

FAMILY = "wakeup"
CMD = "CMD"  # the placeholder for the user's inference command in a suggested `run` line


def check(ctx: AuditContext) -> list[Finding]:
    out = [_cpuidle(ctx)]
    hp = _halt_poll(ctx)
    if hp is not None:
        out.append(hp)
    out += [_pm_qos(ctx), _resume_latency(ctx)]
    return out


def _run_fix(ctx: AuditContext, **kw) -> str:
    return command_line([CMD], cpus=ctx.cpus, **kw)


def _virt_kind(ctx: AuditContext) -> str | None:
    v = ctx.cache.get("virt")
    return v.kind if v is not None else None


def _spinning(ctx: AuditContext) -> dict[int, list[int]]:
    if "wakeup.spinners" not in ctx.cache:
        ctx.cache["wakeup.spinners"] = wk.keepawake_spinners(ctx.host)
    return ctx.cache["wakeup.spinners"]


def _isolated_by(ctx: AuditContext) -> str | None:
    """What keeps other runnable work off every target CPU (``isolcpus=``, the cpuset of
    `tune apply --isolate`), or None: keep-awake is recommended only then."""
    from tuning.tunables.isolate import isolated_cpuset

    cpus = set(ctx.cpus)
    if cpus <= set(cpuc.isolated_cpus(ctx.host)):
        return "isolcpus"
    iso = isolated_cpuset(ctx.host)
    if iso is not None and cpus <= set(iso.cpus):
        return f"the isolated cpuset {iso.path}"
    return None


def _keep_awake_fix(ctx: AuditContext) -> tuple[str, str]:
    """(fix, why it is that fix): on isolated CPUs, the wake-up lever the last ``hftagent tune
    try`` on this box picked (same CPUs, kernel and boot arguments; tuning/trial_state.py), or
    that command itself; elsewhere the isolation first (module docstring)."""
    by = _isolated_by(ctx)
    cpus = format_cpulist(ctx.cpus)
    if by is not None:
        return _trial_fix(ctx, f"CPU {cpus} isolated by {by}")
    return (f"hftagent tune apply --isolate --only isolate --cpus {cpus}",
            f"keep-awake not recommended yet: CPU {cpus} is not isolated (on a CPU other tasks "
            "may use, the call waits behind them whatever keeps it awake, and since Linux 5.4 "
            "a CPU running only the SCHED_IDLE spinner counts as idle where the kernel places "
            "waking tasks); isolate it first, then measure the wake-up levers: hftagent tune "
            "try")


def _trial_fix(ctx: AuditContext, isolated: str) -> tuple[str, str]:
    """The lever the last ``tune try`` measured best here. Which one helps differs by box (a
    PM QoS request, a pause or busy keep-awake loop, halt-polling can each lengthen the tail
    on one host and shorten it on another), so without a trial the fix is to run one."""
    from tuning.trial_state import last_trial, lever_fix

    t, why_none = last_trial(ctx.host, ctx.cpus)
    again = f"hftagent tune try --cpus {format_cpulist(ctx.cpus)}"
    if t is None:
        return again, (f"{isolated}; which wake-up lever helps differs by box ({why_none}): "
                       "measure them")
    when = f"hftagent tune try of {t.created_utc}"
    if t.winner is None:
        return again, f"{isolated}; the {when} found no winner (too few samples): run it longer"
    fix = lever_fix(t.winner, ctx.cpus, isolated=True)
    if not fix:
        return "", f"{isolated}; the {when}: no wake-up lever beat isolation alone here"
    return fix, (f"{isolated}; the {when} picked {t.winner}"
                 + ("" if t.clear else " (its interval overlaps others': not a clear win)"))


def _cpuidle(ctx: AuditContext) -> Finding:
    host = ctx.host
    d = wk.cpuidle_dir(host)
    drv = host.read(d / "current_driver")
    gov = wk.cpuidle_governor(host)
    cl = kernel.cmdline(host)
    idle_arg = (cl.value or {}).get("idle") if cl.ok else None
    title = "cpuidle driver and governor"
    ev = f"{host.display(d)}/current_driver, current_governor"
    if drv.value is None and in_tree(host, drv.path):
        return unsupported("wakeup.cpuidle", FAMILY, title,
                           f"current_driver {why(host, drv.reason, drv.path)}", ev)
    driver = (drv.value or "none").strip()  # no cpuidle directory: no driver
    governor = (gov.value or "").strip() or "none"
    cur = f"driver {driver}, governor {governor}"
    spin = _spinning(ctx)
    covered = [c for c in ctx.cpus if c in spin]
    if idle_arg == "poll":
        return ctx.finding("keep_awake", "wakeup.cpuidle", FAMILY, title, True,
                           current=cur + "; idle=poll: idle CPUs poll, never halt",
                           evidence=f"{cl.path}: idle=poll", expected="CPUs that do not halt")
    if covered == ctx.cpus:
        pids = sorted(p for c in covered for p in spin[c])
        return ctx.finding("keep_awake", "wakeup.cpuidle", FAMILY, title, True,
                           current=cur + f"; kept awake by hftagent run (spinner pid "
                           f"{', '.join(map(str, pids))})", evidence=ev,
                           expected="CPUs that do not halt")
    virt = _virt_kind(ctx)
    want = ctx.profile.expected("keep_awake", "any")
    fix, fix_why = _keep_awake_fix(ctx)
    poll_ns, poll_ev = _halt_poll_value(ctx) if driver == "haltpoll" else (None, "")
    if driver == "haltpoll" and poll_ns is None:
        return ctx.finding("keep_awake", "wakeup.cpuidle", FAMILY, title, False,
                           current=f"{cur}: how long it polls before it halts is unknown "
                           f"({poll_ev})", evidence=ev, status=Status.ERROR,
                           expected="target CPUs kept awake (or halt-polling)")
    halts = driver == "none" or (driver == "haltpoll" and poll_ns == 0)
    if driver == "haltpoll":
        ev += f"; {poll_ev}"
    idle = wk.default_idle(host)
    if halts and virt:
        what = ("halts at once (haltpoll with guest_halt_poll_ns 0)" if driver == "haltpoll"
                else f"waits in the default idle ({idle}; no cpuidle driver)")
        return ctx.finding("keep_awake", "wakeup.cpuidle", FAMILY, title, want == "any",
                           current=f"{cur}: an idle vCPU {what}; its wake-up is a {virt} "
                           f"hypervisor round trip; {fix_why}", evidence=ev,
                           expected="target CPUs kept awake (or halt-polling)", fix=fix)
    note = {"none": f"default idle ({idle}): shallow, left in microseconds without a "
                    "hypervisor",
            "haltpoll": f"polls up to {(poll_ns or 0) / 1000:.0f} µs before it halts"}.get(
                driver, "idle-state depth: cpu.cstates, wakeup.pm_qos_resume_latency")
    return ctx.finding("keep_awake", "wakeup.cpuidle", FAMILY, title, True,
                       current=f"{cur}: {note}", evidence=ev,
                       expected="target CPUs kept awake (or halt-polling)")


def _halt_poll_value(ctx: AuditContext) -> tuple[int | None, str]:
    """guest_halt_poll_ns: the module parameter, else the kernel command line's
    ``haltpoll.guest_halt_poll_ns=`` (a capture may hold the one and not the other); None
    with the reason when neither says."""
    r = wk.halt_poll_ns(ctx.host)
    if r.ok:
        return r.value, r.path
    cl = kernel.cmdline(ctx.host)
    arg = (cl.value or {}).get("haltpoll.guest_halt_poll_ns") if cl.ok else None
    if arg is not None and arg.isdigit():
        return int(arg), f"{cl.path}: haltpoll.guest_halt_poll_ns={arg}"
    return None, f"guest_halt_poll_ns {why(ctx.host, r.reason, r.path)}"


def _halt_poll(ctx: AuditContext) -> Finding | None:
    host = ctx.host
    path = wk.halt_poll_ns_path(host)
    if not host.exists(path):
        return None  # the haltpoll module is not there: nothing to judge ("where it exists")
    r = wk.halt_poll_ns(host)
    title = "Guest halt-polling (haltpoll)"
    shown = host.display(path)
    if not r.ok:
        return Finding("wakeup.guest_halt_poll", FAMILY, title, Status.ERROR,
                       current=f"guest_halt_poll_ns {why(host, r.reason, shown)}", evidence=shown)
    drv = (host.read(wk.cpuidle_dir(host) / "current_driver").value or "none").strip()
    spin = _spinning(ctx)
    kept = all(c in spin for c in ctx.cpus)
    if drv != "haltpoll":
        return ctx.finding("keep_awake", "wakeup.guest_halt_poll", FAMILY, title, True,
                           current=f"guest_halt_poll_ns {r.value} (not in use: cpuidle driver "
                           f"{drv})", evidence=shown)
    ok = r.value > 0 or kept or ctx.profile.expected("keep_awake", "any") == "any"
    cur = f"guest_halt_poll_ns {r.value}" + (": halts at once" if r.value == 0 else
                                              f": polls up to {r.value / 1000:.0f} µs")
    if kept and r.value == 0:
        cur += "; target CPUs kept awake by hftagent run"
    fix = f"echo 200000 > {shown}"
    if _isolated_by(ctx) is not None:  # the lever tune try measured best (_trial_fix)
        other = _trial_fix(ctx, "")[0]
        if other and "guest_halt_poll_ns" not in other:
            fix += f"  (or: {other})"
    return ctx.finding("keep_awake", "wakeup.guest_halt_poll", FAMILY, title, ok, current=cur,
                       expected="> 0 (poll before halting), or target CPUs kept awake",
                       evidence=shown, fix=fix)


def _deep_states(ctx: AuditContext, limit_us: int) -> dict[int, list[str]] | None:
    """{CPU: names of enabled idle states slower than ``limit_us``}; None when unknown."""
    out: dict[int, list[str]] = {}
    for c in ctx.cpus:
        states = cpuc.cpuidle_states(ctx.host, c)
        if states is None:
            return None
        deep = [s.name for s in states if not s.disabled and s.latency_us is not None
                and s.latency_us > limit_us]
        if any(s.latency_us is None for s in states if not s.disabled):
            return None
        if deep:
            out[c] = deep
    return out


def _pm_qos(ctx: AuditContext) -> Finding:
    host = ctx.host
    title = "CPU latency PM QoS (/dev/cpu_dma_latency)"
    ev = f"/dev/{wk.PM_QOS_DEVICE}, /proc/*/fd"
    want = ctx.profile.expected("cpu_dma_latency_us")
    if not host.live:
        return unsupported("wakeup.pm_qos", FAMILY, title,
                           "a captured tree has no PM QoS device or processes", ev)
    eff = wk.cpu_dma_latency(host)
    holders = wk.pm_qos_holders(host)
    held = ("held by " + ", ".join(f"{c}[{p}]" for p, c in holders.held_by)
            if holders.held_by else "no process holds a request")
    if holders.unreadable:
        held += f" (+ {holders.unreadable} process(es) not readable: retry as root)"
    if holders.truncated:
        held += f" (stopped after {holders.scanned_fds} descriptors)"
    if eff.ok:
        limit = "none (no request)" if eff.value >= wk.NO_REQUEST_US else f"{eff.value} µs"
        cur = f"effective limit {limit}; {held}"
    else:
        cur = f"effective limit {why(host, eff.reason, eff.path)}; {held}"
    if want is None:
        return ctx.finding("cpu_dma_latency_us", "wakeup.pm_qos", FAMILY, title, True,
                           current=cur, evidence=ev, expected="any")
    deep = _deep_states(ctx, want)
    expected = f"≤ {want} µs while the model runs, unless no idle state is slower"
    if deep == {}:
        return ctx.finding("cpu_dma_latency_us", "wakeup.pm_qos", FAMILY, title, True,
                           current=cur + f"; not needed: no enabled idle state of CPU "
                           f"{format_cpulist(ctx.cpus)} is slower than {want} µs",
                           evidence=ev, expected=expected)
    fix = _run_fix(ctx, pm_qos=want)
    if not eff.ok:
        return ctx.finding("cpu_dma_latency_us", "wakeup.pm_qos", FAMILY, title, False,
                           current=cur, evidence=ev, expected=expected, status=Status.ERROR)
    slow = ("" if deep is None else "; slower states enabled: " + group_by_value(
        {c: " ".join(v) for c, v in deep.items()}))
    return ctx.finding("cpu_dma_latency_us", "wakeup.pm_qos", FAMILY, title,
                       eff.value <= want, current=cur + slow, evidence=ev, expected=expected,
                       fix=fix)


def _resume_latency(ctx: AuditContext) -> Finding:
    host = ctx.host
    title = "Per-CPU PM QoS resume latency"
    want = ctx.profile.expected("pm_qos_resume_latency_us")
    first = wk.resume_latency_path(host, ctx.cpus[0])
    ev = f"{host.display(first)} (per CPU {format_cpulist(ctx.cpus)})"
    vals = {c: wk.resume_latency(host, c) for c in ctx.cpus}
    if all(not r.ok for r in vals.values()):
        r0 = vals[ctx.cpus[0]]
        reason = why(host, r0.reason, r0.path)
        if r0.reason == "absent" and not in_tree(host, r0.path):
            reason = "no power/pm_qos_resume_latency_us (a kernel without CPU PM QoS)"
        return unsupported("wakeup.pm_qos_resume_latency", FAMILY, title,
                           f"pm_qos_resume_latency_us {reason}", ev)
    shown = {c: (r.value if r.ok else None) for c, r in vals.items()}
    cur = group_by_value({c: ("0 (no constraint)" if v == "0" else
                              "n/a (polling only)" if v == "n/a" else
                              (f"{v} µs" if v is not None else None)) for c, v in shown.items()})
    if want is None:
        return ctx.finding("pm_qos_resume_latency_us", "wakeup.pm_qos_resume_latency", FAMILY,
                           title, True, current=cur, evidence=ev, expected="any")
    target = kernel_value(want)
    bad = [c for c, v in shown.items() if v is not None and v != target]
    unknown = [c for c, v in shown.items() if v is None]
    status = Status.ERROR if unknown and not bad else None
    src = ctx.profile.source
    prof = src[len("builtin:"):] if src.startswith("builtin:") else src
    fix = (f"hftagent tune apply --profile {prof} --cpus "
           f"{format_cpulist(ctx.cpus)} --only wakeup.pm_qos_resume_latency")
    return ctx.finding("pm_qos_resume_latency_us", "wakeup.pm_qos_resume_latency", FAMILY,
                       title, not bad and not unknown, current=cur, evidence=ev,
                       expected=(f"{target} (polling only)" if want == 0 else
                                 f"{target} µs") + " on every target CPU",
                       fix="" if status else fix, status=status)
