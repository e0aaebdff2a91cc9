"""Kernel and memory family: THP, KSM, swap, sysctls, clocksource, perf_event_paranoid."""

from __future__ import annotations

from collections.abc import Callable

from collectors import kernel as k
from collectors.host import ABSENT
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.findings import Finding, Status

FAMILY = "kernel"

# Lower rank = less background work. "OK" when current rank <= expected rank.
THP_ENABLED_RANK = {"never": 0, "madvise": 1, "always": 2}
THP_DEFRAG_RANK = {"never": 0, "madvise": 1, "defer": 2, "defer+madvise": 2, "always": 3}

# (profile key, sysctl, title, comparison (current, expected) -> ok, how to say expected)
SYSCTL_CHECKS: list[tuple[str, str, str, Callable[[int, int], bool], str]] = [
    ("swappiness", "vm.swappiness", "vm.swappiness", lambda c, e: c <= e, "<= {e}"),
    ("numa_balancing", "kernel.numa_balancing", "Automatic NUMA balancing",
     lambda c, e: c == e, "{e}"),
    ("nmi_watchdog", "kernel.nmi_watchdog", "NMI watchdog", lambda c, e: c == e, "{e}"),
    ("timer_migration", "kernel.timer_migration", "Timer migration", lambda c, e: c == e, "{e}"),
    ("stat_interval", "vm.stat_interval", "vmstat update interval (s)",
     lambda c, e: c >= e, ">= {e}"),
    ("sched_rt_runtime_us", "kernel.sched_rt_runtime_us", "RT throttling",
     lambda c, e: c == e, "{e}"),
    ("perf_event_paranoid", "kernel.perf_event_paranoid", "perf_event_paranoid (for our perf collector)",
     lambda c, e: c <= e, "<= {e}"),
]


def _missing(ctx: AuditContext, id_: str, title: str, reason: str | None, path: str,
             live_absent: str) -> Finding:
    """A setting that could not be read. Absent from the live kernel: ``unsupported`` with
    what that means there (``live_absent``); absent from a captured tree: ``unsupported``,
    "absent from this tree" (the kernel or the capture may lack it); unreadable or garbage:
    ``error``."""
    text = why(ctx.host, reason, path)
    if reason == ABSENT:
        return unsupported(id_, FAMILY, title, f"{path} {text}" if in_tree(ctx.host, path)
                           else f"{reason} ({live_absent})", path)
    return Finding(id_, FAMILY, title, Status.ERROR, current=f"unreadable: {path}: {text}",
                   evidence=path)


def _thp(ctx: AuditContext, key: str, id_: str, title: str, choice: k.Choice,
         rank: dict[str, int], path_leaf: str) -> Finding:
    if choice.selected is None:
        return _missing(ctx, id_, title, choice.reason, choice.path, "kernel without THP")
    want = ctx.profile.expected(key, "madvise")
    ok = want == "any" or rank.get(choice.selected, 99) <= rank.get(want, 0)
    return ctx.finding(key, id_, FAMILY, title, ok, current=choice.selected,
                       expected=f"{want} or stricter", evidence=choice.path,
                       fix=f"echo {want} > /sys/kernel/mm/transparent_hugepage/{path_leaf}  "
                           f"(boot: transparent_hugepage={want})" if path_leaf == "enabled" else
                           f"echo {want} > /sys/kernel/mm/transparent_hugepage/{path_leaf}")


def check(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    out = [
        _thp(ctx, "thp_enabled", "kernel.thp_enabled", "Transparent huge pages",
             k.thp_enabled(host), THP_ENABLED_RANK, "enabled"),
        _thp(ctx, "thp_defrag", "kernel.thp_defrag", "THP defrag (compaction on fault)",
             k.thp_defrag(host), THP_DEFRAG_RANK, "defrag"),
    ]
    ksm = k.ksm_run(host)
    if not ksm.ok:
        out.append(_missing(ctx, "kernel.ksm", "KSM (same-page merging)", ksm.reason, ksm.path,
                            "kernel without KSM"))
    else:
        out.append(ctx.finding("ksm", "kernel.ksm", FAMILY, "KSM (same-page merging)",
                               ksm.value == 0, current={0: "stopped", 1: "running",
                                                        2: "unmerging"}.get(ksm.value, str(ksm.value)),
                               expected="stopped (0)", evidence=ksm.path,
                               fix="echo 2 > /sys/kernel/mm/ksm/run  (unmerge, then stop)"))
    sw = k.swaps(host)
    if not sw.ok:
        out.append(_missing(ctx, "kernel.swap", "Swap devices", sw.reason, sw.path,
                            "kernel without swap support"))
    else:
        want = ctx.profile.expected("swap", "off")
        devs = sw.value
        cur = ", ".join(f"{d.name} ({d.size_bytes >> 20} MiB, {d.used_bytes >> 20} MiB used)"
                        for d in devs) or "none"
        out.append(ctx.finding("swap", "kernel.swap", FAMILY, "Swap devices",
                               want == "any" or not devs, current=cur, expected="none",
                               evidence=sw.path,
                               fix="swapoff -a; remove swap entries from /etc/fstab"))
    for key, name, title, ok_fn, exp_fmt in SYSCTL_CHECKS:
        r = k.sysctl_int(host, name)
        if not r.ok:
            out.append(_missing(ctx, f"kernel.{name.split('.')[1]}", title, r.reason, r.path,
                                f"kernel does not offer {name}"))
            continue
        want = ctx.profile.expected(key)
        out.append(ctx.finding(key, f"kernel.{name.split('.')[1]}", FAMILY, title,
                               ok_fn(r.value, want), current=str(r.value),
                               expected=exp_fmt.format(e=want), evidence=r.path,
                               fix=f"sysctl -w {name}={want}  (persist in /etc/sysctl.d/)"))
    out.append(_clocksource(ctx))
    return out


def _clocksource(ctx: AuditContext) -> Finding:
    cs = k.clocksource(ctx.host)
    want = ctx.profile.expected("clocksource", "tsc")
    if cs.current is None:
        return _missing(ctx, "kernel.clocksource", "Clocksource", cs.reason, cs.path,
                        "no clocksource0")
    if cs.current == want:
        return ctx.finding("clocksource", "kernel.clocksource", FAMILY, "Clocksource", True,
                           current=cs.current, evidence=cs.path)
    virt = ctx.cache.get("virt")
    if want not in cs.available and virt is not None and virt.kind:
        return unsupported("kernel.clocksource", FAMILY, "Clocksource",
                           f"{want} not offered by the {virt.kind} hypervisor "
                           f"(current {cs.current}; available: {' '.join(cs.available)})",
                           cs.path)
    fix = (f"echo {want} > /sys/devices/system/clocksource/clocksource0/current_clocksource"
           if want in cs.available else
           "TSC marked unstable: check `dmesg | grep -i tsc`; kernel arg tsc=reliable only if "
           "the TSC is invariant (constant_tsc nonstop_tsc)")
    return ctx.finding("clocksource", "kernel.clocksource", FAMILY, "Clocksource", False,
                       current=f"{cs.current} (available: {' '.join(cs.available)})",
                       evidence=cs.path, fix=fix)
