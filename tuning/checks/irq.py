"""IRQ family: irqbalance, IRQs allowed on the target CPUs, default_smp_affinity.

``irq.affinity`` judges the IRQs user space can move; those the kernel refuses to move
(EIO from kernel/irq/proc.c write_irq_affinity: managed queue vectors, per-CPU and
unbalanceable IRQs, told apart by collectors.irq.immovable from the kernel's debugfs state or
the managed queue names on an MSI chip) are ``irq.managed``, ``unsupported`` with the boot
argument that helps (``isolcpus=managed_irq,domain,<targets>``, Linux 5.6+), and a managed IRQ
that argument already holds off the targets (its effective_affinity_list) counts as off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors import irq as irqc
from collectors import kernel, system
from collectors.host import ABSENT
from collectors.irq import IrqAffinity
from collectors.parsers import format_cpulist, format_cpumask, isolation_cpus
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.checks.isolation import housekeeping_and_isolated, no_housekeeping
from tuning.findings import Finding, Status

FAMILY = "irq"
MANAGED_IRQ_KERNEL = "5.6"  # isolcpus=managed_irq (commit 11ea68f553e2)


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
    """irqbalance, the IRQs allowed on the target CPUs (and those the kernel will not move),
    the default affinity of new IRQs: one function per finding."""
    house, _ = housekeeping_and_isolated(ctx)
    if not house:
        return [no_housekeeping(ctx, "irq.affinity", FAMILY, "IRQ affinity",
                                ctx.host.display(ctx.host.proc("irq")))]
    gone = _irq_dir_gone(ctx)
    return [_irqbalance(ctx), *_affinity(ctx, house, gone),
            _default_affinity(ctx, house, gone)]


def _irq_dir_gone(ctx: AuditContext) -> str | None:
    """Why there are no IRQs to judge, or None. One cause, one status: /proc/irq absent (or
    empty, as procfs masked in a container) is ``unsupported`` for both IRQ findings;
    anything else unreadable is ``error``."""
    host = ctx.host
    irq_dir = host.proc("irq")
    shown = host.display(irq_dir)
    if not host.exists(irq_dir):
        return f"{shown} {why(host, ABSENT, shown)}"
    if not host.listdir(irq_dir):
        return f"{shown} is empty" + (" in this tree" if in_tree(host, shown) else " (masked?)")
    return None


def _irqbalance(ctx: AuditContext) -> Finding:
    """``irq.irqbalance``, found by name in the process table; without one (a tree captured
    without processes) "not running" is not known: unsupported. A partial one (no PID 1)
    cannot say "not running" either: error."""
    host = ctx.host
    table = ctx.cache.setdefault("process_table", system.process_table(host))
    comm_ev = table.path
    title = "irqbalance daemon"
    if not table.ok:
        return unsupported("irq.irqbalance", FAMILY, title, f"no process table: {table.reason}"
                           + (" in this tree" if in_tree(host, comm_ev) else ""), comm_ev)
    running = sorted(p for p, n in table.value.names.items() if n == "irqbalance")
    if not running:
        partial = table.value.partial
        return ctx.finding("irqbalance", "irq.irqbalance", FAMILY, title, True,
                           current="not running" if not partial else
                           f"not among the {len(table.value.names)} processes shown; "
                           f"the process table is partial: {partial}",
                           evidence=comm_ev, status=Status.ERROR if partial else None)
    want = ctx.profile.expected("irqbalance", "off")
    banned = _irqbalance_banned(ctx)
    ok = want == "any" or (want == "banned" and banned is not None
                           and set(ctx.cpus) <= set(banned))
    cur = f"running (pid {', '.join(map(str, running))})"
    if banned is not None:
        cur += f", banned CPUs {format_cpulist(banned)}"
    fix = ("systemctl disable --now irqbalance" if want == "off" else
           f'set IRQBALANCE_BANNED_CPULIST={format_cpulist(ctx.cpus)} in /etc/default/irqbalance '
           '(or /etc/sysconfig/irqbalance); systemctl restart irqbalance')
    return ctx.finding("irqbalance", "irq.irqbalance", FAMILY, title, ok, current=cur,
                       evidence=f"{comm_ev}, {host.display(host.etc('default', 'irqbalance'))}",
                       fix=fix)


@dataclass
class _Placement:
    """The IRQs that may run on the target CPUs, told apart (:func:`_place`)."""

    hits: list[str] = field(default_factory=list)    # movable: "N (name)"
    active: list[str] = field(default_factory=list)  # ... and fired on a target CPU
    kept: list[str] = field(default_factory=list)    # managed, held off by isolcpus=managed_irq
    stuck: list[IrqAffinity] = field(default_factory=list)  # the kernel will not move them
    steer: set[int] = field(default_factory=set)     # CPUs isolcpus=managed_irq isolates


def _place(ctx: AuditContext, affs: list[IrqAffinity]) -> _Placement:
    target = set(ctx.cpus)
    counts: dict[str, tuple[int, ...]] = {}
    cols: list[int] = []
    r = irqc.interrupts(ctx.host)
    if r.ok:
        cols, rows = r.value
        counts = {row.irq: row.counts for row in rows if row.numeric}
    p = _Placement(steer=_managed_irq_cpus(ctx))
    for a in affs:
        if a.affinity is None or not (set(a.affinity) & target):
            continue
        label = f"{a.irq}" + (f" ({a.name})" if a.name else "")
        if a.immovable:
            if a.managed and _steered_off(a, target, p.steer):
                p.kept.append(label)
            else:
                p.stuck.append(a)
            continue
        p.hits.append(label)
        c = counts.get(str(a.irq))
        if c and any(c[i] for i, cpu in enumerate(cols) if cpu in target and i < len(c)):
            p.active.append(label)
    return p


def _affinity_current(ctx: AuditContext, affs: list[IrqAffinity], p: _Placement,
                      unreadable: list[IrqAffinity]) -> str:
    host = ctx.host
    note = ("; target covers every online CPU, so every IRQ lands on it: pick --cpus"
            if set(ctx.cpus) == set(ctx.online) else "")
    cur = (f"{len(p.hits)} of {len(affs)} IRQs may run on {format_cpulist(ctx.cpus)}"
           f" ({len(p.active)} fired there){note}") if p.hits else \
        f"none of {len(affs)} IRQs may run on {format_cpulist(ctx.cpus)}"
    more = ([f"{len(p.stuck)} more the kernel will not move (irq.managed)"] if p.stuck else []) \
        + ([f"{len(p.kept)} managed held off them by isolcpus=managed_irq"] if p.kept else [])
    if more:
        cur += "; " + "; ".join(more)
    if unreadable:
        reasons = sorted({why(host, a.reason, a.path) for a in unreadable})
        cur += (f"; {len(unreadable)} unreadable ({', '.join(reasons)}: IRQ "
                f"{format_cpulist([a.irq for a in unreadable])})")
    return cur


def _affinity(ctx: AuditContext, house: list[int], gone: str | None) -> list[Finding]:
    """``irq.affinity``: the IRQs user space can move that may run on the target CPUs; then
    ``irq.managed`` for those the kernel will not move (:func:`_immovable_finding`)."""
    host = ctx.host
    irq_shown = host.display(host.proc("irq"))
    title = "IRQs allowed on target CPUs"
    if gone is not None:
        return [unsupported("irq.affinity", FAMILY, title, gone, irq_shown)]
    affs = irqc.irq_affinities(host)
    if not affs:
        return [Finding("irq.affinity", FAMILY, title, Status.ERROR,
                        current=f"no {irq_shown}/N directories readable", evidence=irq_shown)]
    p = _place(ctx, affs)
    unreadable = [a for a in affs if a.affinity is None]
    house_s = format_cpulist(house)
    irqs = " ".join(h.split()[0] for h in p.hits)
    fix = (f"for i in {irqs}; do echo {house_s} > /proc/irq/$i/smp_affinity_list; done  "
           f"(or: hftagent tune apply --only irq.affinity --cpus {format_cpulist(ctx.cpus)})")
    # none allowed on the target among those read: not ok while some could not be read
    status = Status.ERROR if unreadable and not p.hits else None
    out = [ctx.finding("irq_affinity", "irq.affinity", FAMILY, title,
                       not p.hits and not unreadable,
                       current=_affinity_current(ctx, affs, p, unreadable),
                       expected=f"none (IRQs on housekeeping CPUs {house_s})",
                       evidence=f"{irq_shown}/*/smp_affinity_list, "
                                f"{host.display(host.proc('interrupts'))}",
                       fix="" if status else fix, status=status,
                       data={"irqs": p.hits, "active": p.active}
                       | ({"kept_by_managed_irq": p.kept} if p.kept else {}))]
    if p.stuck:
        out.append(_immovable_finding(ctx, p.stuck, p.steer))
    return out


def _default_affinity(ctx: AuditContext, house: list[int], gone: str | None) -> Finding:
    """``irq.default_affinity``: the mask newly requested IRQs get."""
    host = ctx.host
    title = "Default affinity of new IRQs"
    d = irqc.default_affinity(host)
    if gone is not None:
        return unsupported("irq.default_affinity", FAMILY, title, gone, d.path)
    if not d.ok:
        text = f"{d.path} {why(host, d.reason, d.path)}"
        return Finding("irq.default_affinity", FAMILY, title,
                       Status.ERROR if d.reason != ABSENT else Status.UNSUPPORTED,
                       current=f"unsupported: {text}" if d.reason == ABSENT else
                       f"unreadable: {text}", evidence=d.path)
    online = set(ctx.online)
    cur_cpus = [c for c in d.value if c in online]
    return ctx.finding("irq_affinity", "irq.default_affinity", FAMILY, title,
                       not set(cur_cpus) & set(ctx.cpus), current=format_cpulist(cur_cpus),
                       expected=f"housekeeping CPUs only ({format_cpulist(house)})",
                       evidence=d.path,
                       fix=f"echo {format_cpumask(house)} > /proc/irq/default_smp_affinity")


# -- IRQs the kernel will not move -----------------------------------------------------------


def _managed_irq_cpus(ctx: AuditContext) -> set[int]:
    """The CPUs ``isolcpus=managed_irq,...`` isolates from managed IRQs; {} without the
    flag or when /proc/cmdline cannot be read or parsed (then nothing is steered: the
    IRQs count as where their mask lets them run)."""
    cl = ctx.cache.setdefault("cmdline", kernel.cmdline(ctx.host))
    raw = cl.value.get("isolcpus") if cl.ok else None
    if "managed_irq" not in irqc.isolcpus_flags(raw):
        return set()
    try:
        return set(isolation_cpus(raw, system.nr_cpu_ids(ctx.host, ctx.online)))
    except ValueError:
        return set()


def _steered_off(a: IrqAffinity, target: set[int], steer: set[int]) -> bool:
    """Whether ``isolcpus=managed_irq`` keeps managed IRQ ``a`` off the targets: every
    target CPU of its mask is isolated and the mask has another CPU (the kernel then picks
    its effective CPU among those, kernel/irq/manage.c irq_do_set_affinity), and where the
    kernel shows its effective affinity, that holds no target CPU."""
    mask = set(a.affinity or ())
    if not steer or not (mask & target) <= steer or not mask - steer:
        return False
    return a.effective is None or not set(a.effective) & target


def _immovable_finding(ctx: AuditContext, stuck: list[IrqAffinity], steer: set[int]) -> Finding:
    """``irq.managed``: IRQs that may run on the target CPUs and that the kernel refuses to
    move (a write to their smp_affinity_list fails with EIO: kernel/irq/proc.c
    write_irq_affinity), so no runtime command can fix them and the audit does not pretend
    one can.

    Which IRQs those are is decided by collectors/irq.py :func:`~collectors.irq.immovable`
    (the kernel's IRQD_* state in debugfs where it can be read, else the queue names of the
    drivers that allocate managed vectors, on an MSI chip). For a managed IRQ whose mask
    also holds a housekeeping CPU, the kernel argument ``isolcpus=managed_irq,domain,<targets>``
    (Linux 5.6+) makes the kernel run it on that CPU; one whose mask holds only target CPUs
    stays there whatever the arguments (blk-mq maps a queue to the CPUs of its mask, so it
    serves I/O submitted from them); per-CPU and unbalanceable IRQs have no argument either.
    ``unsupported``: it cannot be fixed at runtime; it does not fail the audit.
    """
    target = set(ctx.cpus)
    tgt = format_cpulist(ctx.cpus)
    arg = f"isolcpus=managed_irq,domain,{tgt}"
    helped = [a for a in stuck if a.managed and set(a.affinity or ()) - target]
    alone = [a for a in stuck if a.managed and a not in helped]
    other = [a for a in stuck if not a.managed]

    def names(group: list[IrqAffinity]) -> str:
        return ", ".join(f"{a.irq}" + (f" ({a.name})" if a.name else "") for a in group[:8]) \
            + (f" and {len(group) - 8} more" if len(group) > 8 else "")

    parts = []
    if helped:
        how = (f"boot with {arg} (Linux {MANAGED_IRQ_KERNEL}+): the kernel then runs managed "
               "IRQs on the housekeeping CPUs of their mask")
        if steer:
            how = (f"isolcpus=managed_irq is set but leaves target CPUs "
                   f"{format_cpulist(sorted(target - steer))} out: boot with {arg}")
        parts.append(f"IRQ {names(helped)}: managed, with housekeeping CPUs in the mask; {how}")
    if alone:
        parts.append(f"IRQ {names(alone)}: managed, only target CPUs in the mask: no boot "
                     "argument moves it (a queue serves I/O submitted from the CPUs of its "
                     "mask)")
    if other:
        parts.append(f"IRQ {names(other)}: "
                     + ", ".join(sorted({a.immovable or "" for a in other})))
    evidence = sorted({a.immovable_evidence for a in stuck})
    return Finding(
        "irq.managed", FAMILY, "IRQs the kernel will not move", Status.UNSUPPORTED,
        current=f"unsupported: {len(stuck)} IRQ{'s' if len(stuck) > 1 else ''} may run on "
                f"{tgt} and the kernel refuses to move {'them' if len(stuck) > 1 else 'it'} "
                "(a write to smp_affinity_list fails with EIO): " + "; ".join(parts),
        expected=f"none on {tgt}, or managed IRQs steered off by isolcpus=managed_irq",
        evidence="; ".join(evidence[:4]) + (f" (+{len(evidence) - 4} more)"
                                            if len(evidence) > 4 else ""),
        why="A managed queue IRQ (NVMe, virtio-blk/scsi) fires on the CPU its queue is "
            "mapped to; only the boot argument keeps it off isolated CPUs.",
        data={"irqs": [f"{a.irq}" + (f" ({a.name})" if a.name else "") for a in stuck]}
        | ({"kernel_arg": arg} if helped else {}))
