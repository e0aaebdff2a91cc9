"""Boot-time isolation: isolcpus / nohz_full / rcu_nocbs / irqaffinity / skew_tick.

These are kernel command-line arguments: nothing can fix them at runtime, so a missing one is
``pending-reboot`` with the exact argument and the grubby command that adds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors import cpu as cpuc
from collectors import kernel, system
from collectors.host import ABSENT, UNSUPPORTED
from collectors.parsers import format_cpulist, isolation_cpus, parse_cpulist
from tuning.checks.base import AuditContext, unsupported, why
from tuning.findings import Finding, Status

FAMILY = "isolation"


def housekeeping_and_isolated(ctx: AuditContext) -> tuple[list[int], list[int]]:
    """(housekeeping CPUs, CPUs to isolate): every online CPU that is not a target, and the
    targets (tuning/targets.py: one rule for every command). Targets that cover every online
    CPU leave no housekeeping CPU: ([], targets), which the checks report as such."""
    house = [c for c in ctx.online if c not in set(ctx.cpus)]
    return house, sorted(ctx.cpus)


def no_housekeeping(ctx: AuditContext, id_: str, family: str, title: str,
                    evidence: str) -> Finding:
    """The finding for targets that leave no housekeeping CPU (one CPU online: unsupported;
    else the --cpus given cannot be isolated, said with the CPUs that could)."""
    if len(ctx.online) <= 1:
        return unsupported(id_, family, title,
                           f"only {len(ctx.online)} CPU online: nothing left to isolate", evidence)
    return Finding(id_, family, title, Status.ERROR,
                   current=f"target CPUs {format_cpulist(ctx.cpus)} cover every online CPU",
                   expected="at least one housekeeping CPU for the kernel, IRQs and the agent "
                            f"(e.g. --cpus {format_cpulist(ctx.online[1:])})",
                   evidence=evidence)


def boot_arg_dict(args: list[str]) -> dict[str, str]:
    """``["isolcpus=managed_irq,domain,2-3", "skew_tick=1"]`` as ``{key: value}`` (each
    argument split at its first '=': values hold ',' and '-', never '=')."""
    out: dict[str, str] = {}
    for a in args:
        key, _, value = a.partition("=")
        out[key] = value
    return out


def grubby(args: dict[str, str]) -> str:
    """The one GRUB recipe (tuning/tunables/boot.py's grub_commands) for ``args``, one command
    a line."""
    from tuning.tunables.boot import grub_commands
    return "\n".join(grub_commands(args))


@dataclass
class _Boot:
    """What every boot-argument finding is judged against."""

    ctx: AuditContext
    path: str              # /proc/cmdline as shown
    args: dict[str, str]   # the kernel command line
    iso: list[int]         # the CPUs to isolate (the targets)
    house: list[int]       # the housekeeping CPUs
    nr_cpus: int           # "1-N", "all" in the boot arguments
    want: object           # the profile's isolation setting

    def finding(self, id_: str, title: str, current_cpus: list[int] | None, raw: str | None,
                arg: str, ok: bool, current: str | None = None, evidence: str | None = None,
                status: Status | None = None) -> Finding:
        cur = f"{id_.split('.')[1]}={raw}" if raw is not None else "not set"
        if current_cpus is not None and raw is not None:
            cur += f" (covers {format_cpulist(current_cpus) or 'nothing'})"
        st = status or (Status.OK if ok or not self.want else Status.PENDING_REBOOT)
        return self.ctx.finding("isolation", id_, FAMILY, title, ok, current=current or cur,
                                expected=arg, evidence=evidence or self.path,
                                fix="" if st is Status.ERROR else grubby(boot_arg_dict([arg])),
                                status=st, data={"kernel_arg": arg})

    def cpus_of(self, key: str, title: str, raw: str, arg: str) -> list[int] | Finding:
        """The CPUs a boot argument names, or the error finding when it does not parse."""
        try:
            return isolation_cpus(raw, self.nr_cpus, param=key)
        except ValueError as exc:
            return self.finding(f"isolation.{key}", title, None, raw, arg, False,
                                current=f"cannot parse {key}={raw}: {exc}",
                                status=Status.ERROR)


def check(ctx: AuditContext) -> list[Finding]:
    """isolcpus, nohz_full, rcu_nocbs, irqaffinity, skew_tick: one function per finding."""
    host = ctx.host
    cl = kernel.cmdline(host)
    if not cl.ok:
        # the whole source absent (or a kernel that does not offer it): unsupported, as for
        # every check (tuning/checks/base.py); unreadable or unparsable: error
        if cl.reason == ABSENT or (cl.reason or "").startswith(UNSUPPORTED):
            return [unsupported("isolation.cmdline", FAMILY, "Kernel command line",
                                why(host, cl.reason, cl.path).removeprefix("unsupported: "),
                                cl.path)]
        return [Finding("isolation.cmdline", FAMILY, "Kernel command line", Status.ERROR,
                        current=f"unreadable: {why(host, cl.reason, cl.path)}", evidence=cl.path)]
    house, iso = housekeeping_and_isolated(ctx)
    if not house:
        return [no_housekeeping(ctx, "isolation.isolcpus", FAMILY, "CPU isolation", cl.path)]
    b = _Boot(ctx, cl.path, cl.value, iso, house, system.nr_cpu_ids(host, ctx.online),
              ctx.profile.expected("isolation", True))
    return [_isolcpus(b),
            _cpus_arg(b, "nohz_full", "nohz_full (no timer tick)"),
            _cpus_arg(b, "rcu_nocbs", "rcu_nocbs (RCU callbacks offloaded)"),
            _irqaffinity(b), _skew_tick(b)]


def _isolcpus(b: _Boot) -> Finding:
    """``isolation.isolcpus``: the kernel publishes the result in
    /sys/devices/system/cpu/isolated as well (and isolation set up without the boot argument
    shows there only)."""
    host = b.ctx.host
    raw = b.args.get("isolcpus")
    arg = f"isolcpus=managed_irq,domain,{format_cpulist(b.iso)}"
    title = "isolcpus (scheduler isolation)"
    if raw:
        cur = b.cpus_of("isolcpus", title, raw, arg)
        if isinstance(cur, Finding):
            return cur
        return b.finding("isolation.isolcpus", title, cur, raw, arg, set(b.iso) <= set(cur))
    sysfs = cpuc.isolated_cpus(host)
    shown = host.display(host.sys("devices/system/cpu/isolated"))
    cur_s = "not on the kernel command line"
    if sysfs:
        cur_s += f"; {shown} lists {format_cpulist(sysfs)}"
    return b.finding("isolation.isolcpus", title, sysfs, None, arg, set(b.iso) <= set(sysfs),
                     current=cur_s if sysfs else None,
                     evidence=f"{b.path}, {shown}" if sysfs else None)


def _cpus_arg(b: _Boot, key: str, title: str) -> Finding:
    """``isolation.nohz_full``, ``isolation.rcu_nocbs``: the argument covers the targets."""
    raw = b.args.get(key)
    arg = f"{key}={format_cpulist(b.iso)}"
    cur = b.cpus_of(key, title, raw, arg) if raw else []
    if isinstance(cur, Finding):
        return cur
    return b.finding(f"isolation.{key}", title, cur, raw, arg, set(b.iso) <= set(cur))


def _irqaffinity(b: _Boot) -> Finding:
    """``isolation.irqaffinity``: IRQs at boot on the housekeeping CPUs only."""
    raw = b.args.get("irqaffinity")
    title = "irqaffinity (boot-time IRQ CPUs)"
    arg = f"irqaffinity={format_cpulist(b.house)}"
    try:
        irq_cpus = parse_cpulist(raw, b.nr_cpus) if raw else None
    except ValueError as exc:
        return b.finding("isolation.irqaffinity", title, None, raw, arg, False,
                         current=f"cannot parse irqaffinity={raw}: {exc}", status=Status.ERROR)
    return b.finding("isolation.irqaffinity", title, irq_cpus, raw, arg,
                     irq_cpus is not None and not (set(irq_cpus) & set(b.iso)))


def _skew_tick(b: _Boot) -> Finding:
    raw = b.args.get("skew_tick")
    return b.finding("isolation.skew_tick", "skew_tick (offset per-CPU ticks)", None, raw,
                     "skew_tick=1", raw == "1")
