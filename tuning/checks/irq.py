"""IRQ family: irqbalance, IRQs allowed on the target CPUs, default_smp_affinity."""

from __future__ import annotations

from collectors import irq as irqc
from collectors import system
from collectors.host import ABSENT
from collectors.parsers import format_cpulist, format_cpumask
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.checks.isolation import housekeeping_and_isolated, no_housekeeping
from tuning.findings import Finding, Status

FAMILY = "irq"


def _irqbalance_banned(ctx: AuditContext) -> list[int] | None:
    """IRQBALANCE_BANNED_CPULIST from irqbalance's environment file, if set."""
    from collectors.parsers import parse_cpulist

    for rel in (("default", "irqbalance"), ("sysconfig", "irqbalance")):
        r = ctx.host.read(ctx.host.etc(*rel))
        for line in (r.value or "").splitlines():
            line = line.strip()
            if line.startswith("IRQBALANCE_BANNED_CPULIST="):
                try:
                    return parse_cpulist(line.partition("=")[2].strip().strip('"\''))
                except ValueError:
                    return None
    return None


def check(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    out: list[Finding] = []
    house, _ = housekeeping_and_isolated(ctx)
    if not house:
        return [no_housekeeping(ctx, "irq.affinity", FAMILY, "IRQ affinity",
                                host.display(host.proc("irq")))]
    house_s = format_cpulist(house)
    target = set(ctx.cpus)

    # -- irqbalance --------------------------------------------------------------------------
    procs = ctx.cache.setdefault("procs", system.process_names(host))
    running = sorted(p for p, n in procs.items() if n == "irqbalance")
    want = ctx.profile.expected("irqbalance", "off")
    banned = _irqbalance_banned(ctx)
    if not running:
        out.append(ctx.finding("irqbalance", "irq.irqbalance", FAMILY, "irqbalance daemon", True,
                               current="not running", evidence=host.display(host.procfs) + "/*/comm"))
    else:
        ok = want == "any" or (want == "banned" and banned is not None and target <= set(banned))
        cur = f"running (pid {', '.join(map(str, running))})"
        if banned is not None:
            cur += f", banned CPUs {format_cpulist(banned)}"
        fix = ("systemctl disable --now irqbalance" if want == "off" else
               f'set IRQBALANCE_BANNED_CPULIST={format_cpulist(ctx.cpus)} in /etc/default/irqbalance '
               '(or /etc/sysconfig/irqbalance); systemctl restart irqbalance')
        out.append(ctx.finding("irqbalance", "irq.irqbalance", FAMILY, "irqbalance daemon", ok,
                               current=cur,
                               evidence=f"{host.display(host.procfs)}/*/comm, "
                                        f"{host.display(host.etc('default', 'irqbalance'))}",
                               fix=fix))

    # -- IRQs allowed on target CPUs ---------------------------------------------------------
    # One cause, one status: /proc/irq absent (or empty, as procfs masked in a container) is
    # `unsupported` for both IRQ findings; anything else unreadable is `error`.
    irq_dir = host.proc("irq")
    irq_shown = host.display(irq_dir)
    gone = None
    if not host.exists(irq_dir):
        gone = f"{irq_shown} {why(host, ABSENT, irq_shown)}"
    elif not host.listdir(irq_dir):
        gone = f"{irq_shown} is empty" + (" in this tree" if in_tree(host, irq_shown) else
                                          " (masked?)")
    affs = irqc.irq_affinities(host) if gone is None else []
    counts: dict[str, tuple[int, ...]] = {}
    cols: list[int] = []
    r = irqc.interrupts(host)
    if r.ok:
        cols, rows = r.value
        counts = {row.irq: row.counts for row in rows if row.numeric}
    if gone is not None:
        out.append(unsupported("irq.affinity", FAMILY, "IRQs allowed on target CPUs", gone,
                               irq_shown))
    elif not affs:
        out.append(Finding("irq.affinity", FAMILY, "IRQs allowed on target CPUs", Status.ERROR,
                           current=f"no {irq_shown}/N directories readable",
                           evidence=irq_shown))
    else:
        hits = []
        active = []
        unreadable = [a for a in affs if a.affinity is None]
        for a in affs:
            if a.affinity is None or not (set(a.affinity) & target):
                continue
            label = f"{a.irq}" + (f" ({a.name})" if a.name else "")
            hits.append(label)
            c = counts.get(str(a.irq))
            if c and any(c[i] for i, cpu in enumerate(cols) if cpu in target and i < len(c)):
                active.append(label)
        if set(ctx.cpus) == set(ctx.online):
            note = "; target covers every online CPU, so every IRQ lands on it: pick --cpus"
        else:
            note = ""
        cur = (f"{len(hits)} of {len(affs)} IRQs may run on {format_cpulist(ctx.cpus)}"
               f" ({len(active)} fired there){note}") if hits else \
            f"none of {len(affs)} IRQs may run on {format_cpulist(ctx.cpus)}"
        if unreadable:
            reasons = sorted({why(host, a.reason, a.path) for a in unreadable})
            cur += (f"; {len(unreadable)} unreadable ({', '.join(reasons)}: IRQ "
                    f"{format_cpulist([a.irq for a in unreadable])})")
        irqs = " ".join(h.split()[0] for h in hits)
        fix = (f"for i in {irqs}; do echo {house_s} > /proc/irq/$i/smp_affinity_list; done  "
               f"(or: hftagent tune apply --cpus {format_cpulist(ctx.cpus)})")
        # none allowed on the target among those read: not ok while some could not be read
        status = Status.ERROR if unreadable and not hits else None
        out.append(ctx.finding("irq_affinity", "irq.affinity", FAMILY,
                               "IRQs allowed on target CPUs", not hits and not unreadable,
                               current=cur,
                               expected=f"none (IRQs on housekeeping CPUs {house_s})",
                               evidence=f"{host.display(host.proc('irq'))}/*/smp_affinity_list, "
                                        f"{host.display(host.proc('interrupts'))}",
                               fix="" if status else fix, status=status,
                               data={"irqs": hits, "active": active}))

    # -- default_smp_affinity ----------------------------------------------------------------
    d = irqc.default_affinity(host)
    if gone is not None:
        out.append(unsupported("irq.default_affinity", FAMILY, "Default affinity of new IRQs",
                               gone, d.path))
    elif not d.ok:
        text = f"{d.path} {why(host, d.reason, d.path)}"
        out.append(Finding("irq.default_affinity", FAMILY, "Default affinity of new IRQs",
                           Status.ERROR if d.reason != ABSENT else Status.UNSUPPORTED,
                           current=f"unsupported: {text}" if d.reason == ABSENT else
                           f"unreadable: {text}", evidence=d.path))
    else:
        online = set(ctx.online)
        cur_cpus = [c for c in d.value if c in online]
        bad = set(cur_cpus) & target
        out.append(ctx.finding("irq_affinity", "irq.default_affinity", FAMILY,
                               "Default affinity of new IRQs", not bad,
                               current=format_cpulist(cur_cpus),
                               expected=f"housekeeping CPUs only ({house_s})", evidence=d.path,
                               fix=f"echo {format_cpumask(house)} > /proc/irq/default_smp_affinity"))
    return out
