"""CPU family: governor, frequency floor, turbo, EPP/EPB, C-state exit latency, SMT.

Order matters for the fixes printed (as for `tune apply`): governor before turbo, because
switching the intel_pstate governor can reset no_turbo on some kernels.
"""

from __future__ import annotations

from collectors import cpu as cpuc
from collectors.parsers import format_cpulist, group_by_value
from tuning.checks.base import AuditContext, unsupported
from tuning.findings import Finding, Status

FAMILY = "cpu"


def _no_cpufreq_reason(ctx: AuditContext) -> str:
    virt = ctx.cache.get("virt")
    if virt is not None and virt.kind:
        return f"no cpufreq driver in this {virt.kind} guest (the hypervisor controls frequency)"
    return "no cpufreq driver (cpufreq directory absent; check the BIOS and intel_pstate/acpi-cpufreq)"


def check(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    freqs = {c: cpuc.cpufreq(host, c) for c in ctx.cpus}
    have = {c: f for c, f in freqs.items() if f is not None}
    out: list[Finding] = []
    cpus_s = format_cpulist(ctx.cpus)
    base_ev = host.display(cpuc.cpu_dir(host, ctx.cpus[0]) / "cpufreq")

    # -- governor ------------------------------------------------------------------------
    if not have:
        reason = _no_cpufreq_reason(ctx)
        for id_, title in (("cpu.governor", "CPU frequency governor"),
                           ("cpu.min_freq", "Frequency floor (scaling_min_freq)")):
            out.append(unsupported(id_, FAMILY, title, reason, base_ev,
                                   ctx.profile.get("governor").why if id_ == "cpu.governor"
                                   and ctx.profile.get("governor") else ""))
    else:
        want = ctx.profile.expected("governor", "performance")
        govs = {c: f.governor for c, f in have.items()}
        bad = [c for c, g in govs.items() if g != want]
        offered = have[min(have)].available_governors
        fix = f"cpupower -c {format_cpulist(bad)} frequency-set -g {want}"
        if offered and want not in offered:
            fix += f"  (note: {want!r} not offered by {have[min(have)].driver}: {' '.join(offered)})"
        out.append(ctx.finding("governor", "cpu.governor", FAMILY, "CPU frequency governor",
                               not bad, current=group_by_value(govs),
                               evidence=f"{base_ev}/scaling_governor (per CPU {cpus_s})",
                               fix=fix))
        # -- frequency floor ------------------------------------------------------------
        if ctx.profile.expected("min_freq", "max") == "max":
            lows = {c: f for c, f in have.items()
                    if f.min_hz is not None and f.cpuinfo_max_hz is not None
                    and f.min_hz < f.cpuinfo_max_hz}
            cur = group_by_value({c: f"{(f.min_hz or 0) // 1_000_000} MHz" if f.min_hz else None
                                  for c, f in have.items()})
            mx = max((f.cpuinfo_max_hz or 0) for f in have.values())
            out.append(ctx.finding(
                "min_freq", "cpu.min_freq", FAMILY, "Frequency floor (scaling_min_freq)",
                not lows, current=cur, expected=f"cpuinfo_max_freq ({mx // 1_000_000} MHz)",
                evidence=f"{base_ev}/scaling_min_freq vs cpuinfo_max_freq",
                fix=f"cpupower -c {format_cpulist(lows)} frequency-set -d {mx // 1_000_000}MHz"))

    # -- turbo -----------------------------------------------------------------------------
    t = cpuc.turbo(host)
    want_turbo = ctx.profile.expected("turbo", "any")
    if t.enabled is None:
        if have or not ctx.cache.get("virt") or not ctx.cache["virt"].kind:
            out.append(unsupported("cpu.turbo", FAMILY, "Turbo / boost",
                                   "neither intel_pstate/no_turbo nor cpufreq/boost exists",
                                   host.display(host.sys("devices/system/cpu/intel_pstate"))))
        else:
            out.append(unsupported("cpu.turbo", FAMILY, "Turbo / boost", _no_cpufreq_reason(ctx),
                                   host.display(host.sys("devices/system/cpu/intel_pstate"))))
    else:
        cur = "on" if t.enabled else "off"
        ok = want_turbo == "any" or want_turbo == cur
        if t.interface == "intel_pstate/no_turbo":
            fix = f"echo {1 if want_turbo == 'off' else 0} > /sys/devices/system/cpu/intel_pstate/no_turbo"
        else:
            fix = f"echo {0 if want_turbo == 'off' else 1} > /sys/devices/system/cpu/cpufreq/boost"
        extra = f" (intel_pstate {t.pstate_status})" if t.pstate_status else ""
        out.append(ctx.finding("turbo", "cpu.turbo", FAMILY, "Turbo / boost", ok,
                               current=cur + extra, evidence=t.path or "", fix=fix))

    # -- EPP / EPB -------------------------------------------------------------------------
    want_epp = ctx.profile.expected("epp", "performance")
    epp = {c: f.epp for c, f in have.items() if f.epp is not None}
    epb = {c: f.epb for c, f in have.items() if f.epb is not None}
    if epp:
        bad = [c for c, v in epp.items() if v != want_epp]
        out.append(ctx.finding(
            "epp", "cpu.epp", FAMILY, "Energy-performance preference (EPP)", not bad,
            current=group_by_value(epp), evidence=f"{base_ev}/energy_performance_preference",
            fix=f"for c in {' '.join(map(str, bad))}; do echo {want_epp} > "
                f"/sys/devices/system/cpu/cpu$c/cpufreq/energy_performance_preference; done"))
    elif epb:
        # EPB: 0 = performance ... 15 = powersave; "performance" expected means 0
        bad = [c for c, v in epb.items() if v != 0]
        out.append(ctx.finding(
            "epp", "cpu.epb", FAMILY, "Energy-performance bias (EPB)", not bad,
            current=group_by_value(epb), expected="0 (performance)",
            evidence=host.display(cpuc.cpu_dir(host, ctx.cpus[0]) / "power/energy_perf_bias"),
            fix="x86_energy_perf_policy performance"))
    elif have:
        out.append(unsupported("cpu.epp", FAMILY, "Energy-performance preference",
                               "no energy_performance_preference nor energy_perf_bias files",
                               base_ev))

    # -- C-states --------------------------------------------------------------------------
    out.append(_cstates(ctx))
    # -- SMT -------------------------------------------------------------------------------
    out.append(_smt(ctx))
    return out


def _cstates(ctx: AuditContext) -> Finding:
    host = ctx.host
    budget = ctx.profile.expected("cstate_max_exit_latency_us", 10)
    per_cpu = {c: cpuc.cpuidle_states(host, c) for c in ctx.cpus}
    ev = host.display(cpuc.cpu_dir(host, ctx.cpus[0]) / "cpuidle")
    if all(v is None for v in per_cpu.values()):
        drv = cpuc.cpuidle_driver(host)
        return unsupported("cpu.cstates", FAMILY, "Idle states (C-states) exit latency",
                           f"no cpuidle states (driver: {drv.value or drv.reason})", ev)
    deep: dict[str, list[int]] = {}  # "C6 (133 µs)" -> CPUs where it is enabled
    enabled_desc: dict[int, str] = {}
    for c, states in per_cpu.items():
        names = []
        for s in states or []:
            if s.disabled:
                continue
            names.append(f"{s.name}:{s.latency_us}µs")
            if s.latency_us is not None and s.latency_us > budget:
                deep.setdefault(f"{s.name} ({s.latency_us} µs)", []).append(c)
        enabled_desc[c] = " ".join(names) or "none"
    cur = group_by_value(enabled_desc)
    if deep:
        cur = "enabled above budget: " + "; ".join(
            f"{k} on {format_cpulist(v)}" for k, v in sorted(deep.items()))
    bad_cpus = sorted({c for v in deep.values() for c in v})
    return ctx.finding(
        "cstate_max_exit_latency_us", "cpu.cstates", FAMILY,
        "Idle states (C-states) exit latency", not deep, current=cur,
        expected=f"no enabled state with exit latency > {budget} µs",
        evidence=f"{ev}/state*/{{name,latency,disable}}",
        fix=f"cpupower -c {format_cpulist(bad_cpus)} idle-set -D {budget}",
        data={"enabled_above_budget": {k: format_cpulist(v) for k, v in deep.items()}})


def _smt(ctx: AuditContext) -> Finding:
    s = cpuc.smt(ctx.host, ctx.cpus)
    want = ctx.profile.expected("smt", "any")
    if s.control in ("notsupported", "notimplemented") or (s.control is None and not s.siblings):
        return ctx.finding("smt", "cpu.smt", FAMILY, "SMT (hyper-threading)", True,
                           current=f"not supported ({s.control or 'no smt control'})",
                           evidence=s.path)
    outside = sorted({sib for c, sibs in s.siblings.items() for sib in sibs
                      if sib not in ctx.cpus})
    cur = "on" if s.active else "off"
    if s.active and outside:
        cur += f"; target CPUs share cores with {format_cpulist(outside)}"
    ok = want == "any" or (want == "off" and not s.active) or (want == "on" and bool(s.active))
    st = None
    if want == "any" and s.active and outside:
        st = Status.WARN
        ok = False
    fix = ("echo off > /sys/devices/system/cpu/smt/control  (or kernel arg nosmt)"
           if want == "off" else
           f"include SMT siblings in --cpus or keep {format_cpulist(outside)} idle")
    return ctx.finding("smt", "cpu.smt", FAMILY, "SMT (hyper-threading)", ok, current=cur,
                       evidence=f"{s.path}, topology/thread_siblings_list", fix=fix, status=st)
