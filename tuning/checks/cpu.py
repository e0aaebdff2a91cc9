"""CPU family: governor, frequency floor, turbo, EPP/EPB, C-state exit latency, SMT.

Order matters for the fixes printed (as for `tune apply`): governor before turbo, because
switching the intel_pstate governor can reset no_turbo on some kernels.
"""

from __future__ import annotations

from collectors import cpu as cpuc
from collectors.host import ABSENT
from collectors.parsers import format_cpulist, group_by_value
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.findings import Finding, Status

FAMILY = "cpu"


def _no_cpufreq_reason(ctx: AuditContext) -> str:
    host = ctx.host
    virt = ctx.cache.get("virt")
    shown = host.display(cpuc.cpu_dir(host, ctx.cpus[0]) / "cpufreq")
    if in_tree(host, shown):
        reason = "cpuN/cpufreq absent from this tree"
        if virt is not None and virt.kind:
            reason += f" (a {virt.kind} guest: the hypervisor controls frequency)"
        return reason
    if virt is not None and virt.kind:
        return f"no cpufreq driver in this {virt.kind} guest (the hypervisor controls frequency)"
    return "no cpufreq driver (cpufreq directory absent; check the BIOS and intel_pstate/acpi-cpufreq)"


def _missing(ctx: AuditContext, what: str, cpu: int, reason: str | None = None) -> str:
    """How a per-CPU value that could not be read shows in ``current``."""
    host = ctx.host
    shown = host.display(cpuc.cpu_dir(host, cpu) / what)
    return f"{what} {why(host, reason or ABSENT, shown)}"


def _judge(ctx: AuditContext, key: str, id_: str, title: str, bad: list[int],
           unknown: dict[int, str], **kw) -> Finding:
    """A per-CPU finding: the profile's severity when ``bad``; else ``error`` when some CPUs
    could not be read (``unknown``: CPU -> what), else ok."""
    status = Status.ERROR if unknown and not bad else None
    if status is Status.ERROR:
        kw["fix"] = ""
    return ctx.finding(key, id_, FAMILY, title, not bad and not unknown, status=status, **kw)


def _freq_arg(hz: int) -> str:
    """cpupower's frequency argument: MHz when exact, else kHz (the files' unit), so the
    floor is never set below the CPU's maximum by rounding."""
    return f"{hz // 1_000_000}MHz" if hz % 1_000_000 == 0 else f"{hz // 1000}kHz"


def _mhz(hz: int) -> str:
    return f"{hz // 1_000_000} MHz" if hz % 1_000_000 == 0 else f"{hz / 1e6:.1f} MHz"


def _online(ctx: AuditContext) -> list[Finding]:
    """cpu/online could not be read, so the audit worked from CPUs it derived: say which
    and how (collectors.system.online_cpus). ``error``: the kernel's own list is unknown."""
    derived = ctx.cache.get("online_derived")
    if not derived:
        return []
    return [Finding("cpu.online", FAMILY, "Online CPUs", Status.ERROR,
                    current=f"derived {format_cpulist(ctx.online)}: {derived}",
                    expected="/sys/devices/system/cpu/online readable",
                    evidence=f"{derived}; every other finding uses these CPUs")]


def check(ctx: AuditContext) -> list[Finding]:
    """Governor, frequency floor, turbo, EPP/EPB, C-states, SMT: one function per finding,
    in the order tune applies them (module docstring)."""
    freqs = {c: cpuc.cpufreq(ctx.host, c) for c in ctx.cpus}
    return [*_online(ctx), _governor(ctx, freqs), *_floor(ctx, freqs),
            _turbo(ctx, any(f is not None for f in freqs.values())), *_epp(ctx, freqs),
            _cstates(ctx), _smt(ctx)]


def _base_ev(ctx: AuditContext) -> str:
    return ctx.host.display(cpuc.cpu_dir(ctx.host, ctx.cpus[0]) / "cpufreq")


def _no_dir(ctx: AuditContext, freqs: dict[int, cpuc.CpuFreq | None]) -> dict[int, str]:
    """CPUs without a cpufreq directory while others have one: not "fine", unknown."""
    return {c: _missing(ctx, "cpufreq", c) for c, f in freqs.items() if f is None}


def _governor(ctx: AuditContext, freqs: dict[int, cpuc.CpuFreq | None]) -> Finding:
    have = {c: f for c, f in freqs.items() if f is not None}
    base_ev = _base_ev(ctx)
    if not have:
        setting = ctx.profile.get("governor")
        return unsupported("cpu.governor", FAMILY, "CPU frequency governor",
                           _no_cpufreq_reason(ctx), base_ev, setting.why if setting else "")
    want = ctx.profile.expected("governor", "performance")
    unknown = _no_dir(ctx, freqs)
    unknown.update({c: _missing(ctx, "cpufreq/scaling_governor", c, f.reasons["governor"])
                    for c, f in have.items() if f.governor is None})
    govs = {c: unknown.get(c) or f.governor for c, f in freqs.items()}
    bad = [c for c, f in have.items() if f.governor is not None and f.governor != want]
    offered = have[min(have)].available_governors
    fix = f"cpupower -c {format_cpulist(bad)} frequency-set -g {want}"
    if offered and want not in offered:
        fix += f"  (note: {want!r} not offered by {have[min(have)].driver}: {' '.join(offered)})"
    return _judge(ctx, "governor", "cpu.governor", "CPU frequency governor", bad, unknown,
                  current=group_by_value(govs),
                  evidence=f"{base_ev}/scaling_governor (per CPU {format_cpulist(ctx.cpus)})",
                  fix=fix)


def _floor(ctx: AuditContext, freqs: dict[int, cpuc.CpuFreq | None]) -> list[Finding]:
    """``cpu.min_freq``: unsupported without cpufreq, judged when the profile asks "max"."""
    if all(f is None for f in freqs.values()):
        return [unsupported("cpu.min_freq", FAMILY, "Frequency floor (scaling_min_freq)",
                            _no_cpufreq_reason(ctx), _base_ev(ctx))]
    if ctx.profile.expected("min_freq", "max") != "max":
        return []
    return [_min_freq(ctx, freqs, _no_dir(ctx, freqs), _base_ev(ctx))]


def _turbo(ctx: AuditContext, have_cpufreq: bool) -> Finding:
    host = ctx.host
    t = cpuc.turbo(host)
    want = ctx.profile.expected("turbo", "any")
    if t.enabled is None:
        virt = ctx.cache.get("virt")
        reason = ("neither intel_pstate/no_turbo nor cpufreq/boost exists"
                  if have_cpufreq or not virt or not virt.kind else _no_cpufreq_reason(ctx))
        return unsupported("cpu.turbo", FAMILY, "Turbo / boost", reason,
                           host.display(host.sys("devices/system/cpu/intel_pstate")))
    cur = "on" if t.enabled else "off"
    if t.interface == "intel_pstate/no_turbo":
        fix = f"echo {1 if want == 'off' else 0} > /sys/devices/system/cpu/intel_pstate/no_turbo"
    else:
        fix = f"echo {0 if want == 'off' else 1} > /sys/devices/system/cpu/cpufreq/boost"
    extra = f" (intel_pstate {t.pstate_status})" if t.pstate_status else ""
    return ctx.finding("turbo", "cpu.turbo", FAMILY, "Turbo / boost",
                       want == "any" or want == cur, current=cur + extra,
                       evidence=t.path or "", fix=fix)


def _epp(ctx: AuditContext, freqs: dict[int, cpuc.CpuFreq | None]) -> list[Finding]:
    """``cpu.epp`` where the CPUs have EPP, else ``cpu.epb`` where they have EPB."""
    have = {c: f for c, f in freqs.items() if f is not None}
    want = ctx.profile.expected("epp", "performance")
    epp = {c: f.epp for c, f in have.items() if f.epp is not None}
    base_ev = _base_ev(ctx)
    if epp:
        # the CPUs that lack what the others have could not be read
        unknown = _no_dir(ctx, freqs)
        unknown.update({c: _missing(ctx, "cpufreq/energy_performance_preference", c,
                                    f.reasons.get("epp"))
                        for c, f in have.items() if f.epp is None})
        bad = [c for c, v in epp.items() if v != want]
        return [_judge(
            ctx, "epp", "cpu.epp", "Energy-performance preference (EPP)", bad, unknown,
            current=group_by_value({c: unknown.get(c) or epp[c] for c in ctx.cpus}),
            evidence=f"{base_ev}/energy_performance_preference",
            fix=f"for c in {' '.join(map(str, bad))}; do echo {want} > "
                f"/sys/devices/system/cpu/cpu$c/cpufreq/energy_performance_preference; done")]
    if any(f.epb is not None for f in have.values()):
        return [_epb(ctx, freqs)]
    if not have:
        return []
    shown = f"{base_ev}/energy_performance_preference"
    reason = ("no energy_performance_preference nor energy_perf_bias files"
              + (" in this tree" if in_tree(ctx.host, shown) else ""))
    return [unsupported("cpu.epp", FAMILY, "Energy-performance preference", reason, base_ev)]


def _epb(ctx: AuditContext, freqs: dict[int, cpuc.CpuFreq | None]) -> Finding:
    """``cpu.epb``: 0 = performance ... 15 = powersave; "performance" expected means 0."""
    have = {c: f for c, f in freqs.items() if f is not None}
    epb = {c: f.epb for c, f in have.items() if f.epb is not None}
    unknown = _no_dir(ctx, freqs)
    unknown.update({c: _missing(ctx, "power/energy_perf_bias", c, f.reasons.get("epb"))
                    for c, f in have.items() if f.epb is None})
    bad = [c for c, v in epb.items() if v != 0]
    return _judge(
        ctx, "epp", "cpu.epb", "Energy-performance bias (EPB)", bad, unknown,
        current=group_by_value({c: unknown.get(c) or epb[c] for c in ctx.cpus}),
        expected="0 (performance)",
        evidence=ctx.host.display(cpuc.cpu_dir(ctx.host, ctx.cpus[0]) / "power/energy_perf_bias"),
        fix="x86_energy_perf_policy performance")


def _min_freq(ctx: AuditContext, freqs: dict[int, cpuc.CpuFreq | None],
              no_dir: dict[int, str], base_ev: str) -> Finding:
    """scaling_min_freq vs each CPU's own cpuinfo_max_freq: hybrid parts (P- and E-cores)
    and favoured cores (Turbo Boost Max 3.0) have different maxima, and a floor above a CPU's
    own maximum is refused (EINVAL) or clamped by the kernel."""
    unknown = dict(no_dir)
    low: dict[int, int] = {}  # CPU -> its cpuinfo_max_freq, for CPUs whose floor is below it
    maxes: dict[int, str] = {}
    cur: dict[int, str] = {}
    for c, f in freqs.items():
        if f is None:
            cur[c] = unknown[c]
            continue
        if f.cpuinfo_max_hz is not None:
            maxes[c] = _mhz(f.cpuinfo_max_hz)
        if f.min_hz is None:
            unknown[c] = _missing(ctx, "cpufreq/scaling_min_freq", c, f.reasons.get("min_hz"))
        elif f.cpuinfo_max_hz is None:
            unknown[c] = _missing(ctx, "cpufreq/cpuinfo_max_freq", c,
                                  f.reasons.get("cpuinfo_max_hz"))
        elif f.min_hz < f.cpuinfo_max_hz:
            low[c] = f.cpuinfo_max_hz
        cur[c] = unknown.get(c) or _mhz(f.min_hz)
    values = set(maxes.values())
    expected = (f"cpuinfo_max_freq ({values.pop()})" if len(values) == 1 else
                f"cpuinfo_max_freq of each CPU ({group_by_value(maxes)})" if values else
                "cpuinfo_max_freq")
    by_max: dict[int, list[int]] = {}
    for c, mx in low.items():
        by_max.setdefault(mx, []).append(c)
    fix = "; ".join(f"cpupower -c {format_cpulist(cs)} frequency-set -d {_freq_arg(mx)}"
                    for mx, cs in sorted(by_max.items(), key=lambda kv: min(kv[1])))
    return _judge(ctx, "min_freq", "cpu.min_freq", "Frequency floor (scaling_min_freq)",
                  sorted(low), unknown, current=group_by_value(cur), expected=expected,
                  evidence=f"{base_ev}/scaling_min_freq vs cpuinfo_max_freq", fix=fix)


def _cstates(ctx: AuditContext) -> Finding:
    host = ctx.host
    budget = ctx.profile.expected("cstate_max_exit_latency_us", 10)
    per_cpu = {c: cpuc.cpuidle_states(host, c) for c in ctx.cpus}
    ev = host.display(cpuc.cpu_dir(host, ctx.cpus[0]) / "cpuidle")
    if all(v is None for v in per_cpu.values()):
        drv = cpuc.cpuidle_driver(host)
        what = drv.value or why(host, drv.reason, drv.path)
        if in_tree(host, ev) and drv.value != "none":
            # no states, and no current_driver saying "none": the capture may lack them
            return unsupported("cpu.cstates", FAMILY, "Idle states (C-states) exit latency",
                               f"cpuN/cpuidle absent from this tree (driver: {what})", ev)
        return unsupported("cpu.cstates", FAMILY, "Idle states (C-states) exit latency",
                           f"no cpuidle states (driver: {what})", ev)
    deep: dict[str, list[int]] = {}  # "C6 (133 µs)" -> CPUs where it is enabled
    unread: dict[str, list[int]] = {}  # "C6 latency unreadable" -> CPUs
    enabled_desc: dict[int, str] = {}
    for c, states in per_cpu.items():
        if states is None:
            unread.setdefault(_missing(ctx, "cpuidle", c), []).append(c)
            enabled_desc[c] = "unknown"
            continue
        names = []
        for s in states:
            if s.disabled:
                continue
            if s.latency_us is None:
                # an enabled (or maybe enabled) state whose exit latency is unknown: it may
                # be the deep one
                unread.setdefault(f"{s.name} {s.reason or 'latency unreadable'}", []).append(c)
                names.append(f"{s.name}:?µs")
                continue
            names.append(f"{s.name}:{s.latency_us}µs")
            if s.latency_us > budget:
                if s.disabled is None:
                    unread.setdefault(f"{s.name} ({s.latency_us} µs) {s.reason}", []).append(c)
                else:
                    deep.setdefault(f"{s.name} ({s.latency_us} µs)", []).append(c)
        enabled_desc[c] = " ".join(names) or "none"
    cur = group_by_value(enabled_desc)
    if deep:
        cur = "enabled above budget: " + "; ".join(
            f"{k} on {format_cpulist(v)}" for k, v in sorted(deep.items()))
    if unread:
        cur += "; could not read: " + "; ".join(
            f"{k} on {format_cpulist(v)}" for k, v in sorted(unread.items()))
    bad_cpus = sorted({c for v in deep.values() for c in v})
    return _judge(
        ctx, "cstate_max_exit_latency_us", "cpu.cstates",
        "Idle states (C-states) exit latency", bad_cpus,
        {c: k for k, v in unread.items() for c in v}, current=cur,
        expected=f"no enabled state with exit latency > {budget} µs",
        evidence=f"{ev}/state*/{{name,latency,disable}}",
        fix=f"cpupower -c {format_cpulist(bad_cpus)} idle-set -D {budget}",
        data={"enabled_above_budget": {k: format_cpulist(v) for k, v in deep.items()}})


def _smt(ctx: AuditContext) -> Finding:
    s = cpuc.smt(ctx.host, ctx.cpus)
    want = ctx.profile.expected("smt", "any")
    # The sibling lists are the facts: a CPU that shares its core shows it there, whatever
    # smt/control says (a guest's kernel reports "notsupported" for vCPUs the hypervisor
    # presents as thread pairs).
    pairs = any(len(v) > 1 for v in s.siblings.values())
    if not pairs and s.control in ("notsupported", "notimplemented"):
        return ctx.finding("smt", "cpu.smt", FAMILY, "SMT (hyper-threading)", True,
                           current=f"not supported ({s.control})", evidence=s.path)
    if not pairs and s.control is None and len(s.siblings) < len(ctx.cpus):
        missing = [c for c in ctx.cpus if c not in s.siblings]
        shown = ctx.host.display(cpuc.cpu_dir(ctx.host, missing[0]) / "topology")
        return unsupported("cpu.smt", FAMILY, "SMT (hyper-threading)",
                           f"smt/control and thread_siblings_list of CPUs "
                           f"{format_cpulist(missing)} {why(ctx.host, ABSENT, shown)}", s.path)
    active = True if pairs else s.active
    outside = sorted({sib for c, sibs in s.siblings.items() for sib in sibs
                      if sib not in ctx.cpus})
    cur = "on" if active else "off"
    if pairs and s.control in ("notsupported", "notimplemented"):
        cur += f" (thread siblings share cores although smt/control says {s.control})"
    if active and outside:
        cur += f"; target CPUs share cores with {format_cpulist(outside)}"
    ok = want == "any" or (want == "off" and not active) or (want == "on" and bool(active))
    st = None
    if want == "any" and active and outside:
        st = Status.WARN
        ok = False
    fix = ("echo off > /sys/devices/system/cpu/smt/control  (or kernel arg nosmt)"
           if want == "off" else
           f"include SMT siblings in --cpus or keep {format_cpulist(outside)} idle")
    return ctx.finding("smt", "cpu.smt", FAMILY, "SMT (hyper-threading)", ok, current=cur,
                       evidence=f"{s.path}, topology/thread_siblings_list", fix=fix, status=st)
