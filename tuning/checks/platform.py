"""Platform families: virtualization/steal, NUMA (+ target process), PCIe links, other tuners."""

from __future__ import annotations

from collectors import pcie, system
from collectors.host import ABSENT
from collectors.parsers import format_cpulist, group_by_value
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.findings import Finding, Status
from tuning.targets import housekeeping_core

# ------------------------------------------------------------------------------------------
# virtualization
# ------------------------------------------------------------------------------------------


def check_virt(ctx: AuditContext) -> list[Finding]:
    """``virt.hypervisor``: a guest, from every source collectors/virt.py reads (x86 CPUID
    flags, DMI, /sys/hypervisor, /proc/sysinfo, device tree, lparcfg, PCI IDs of virtual
    devices); ``unsupported`` when none of them can tell, never "bare metal" for want of
    evidence (``error`` when one of them is there but unreadable). A partition whose CPUs
    are its own (s390 LPAR or PowerVM in dedicated mode) is ``ok``: no hypervisor
    time-shares them. ``virt.steal``: the steal column of /proc/stat on the target CPUs over
    the steal window (``audit --steal-window``), judged on the least share its whole ticks
    can be (:func:`_steal_finding`; ``unsupported`` without /proc/stat; ``error`` when a
    target CPU has no line in it)."""
    v = ctx.cache.get("virt") or system.virtualization(ctx.host)
    out = []
    if not v.known and v.unreadable:  # a source is there but could not be read
        out.append(Finding("virt.hypervisor", "virt", "Virtualization", Status.ERROR,
                           current=f"unknown: {v.evidence}", expected="bare metal",
                           evidence=", ".join(v.unreadable)))
    elif not v.known:
        out.append(unsupported("virt.hypervisor", "virt", "Virtualization", v.evidence,
                               v.evidence))
    elif v.kind and v.dedicated:
        out.append(Finding("virt.hypervisor", "virt", "Virtualization", Status.OK,
                           current=f"{v.kind} partition with dedicated CPUs",
                           expected="bare metal or dedicated CPUs", evidence=v.evidence))
    elif v.kind:
        out.append(Finding(
            "virt.hypervisor", "virt", "Virtualization", Status.WARN, current=v.kind,
            expected="bare metal", evidence=v.evidence,
            fix="run latency-critical inference on bare metal or dedicated/pinned vCPUs"
                + (" (a partition with dedicated CPUs)" if v.dedicated is False else ""),
            why="A guest does not control frequency, C-states or SMT, and its vCPUs can be "
                "descheduled by the host at any time."))
    else:
        out.append(Finding("virt.hypervisor", "virt", "Virtualization", Status.OK,
                           current="bare metal", expected="bare metal", evidence=v.evidence))
    # the window opened before the other families ran (tuning/audit.py runs this family last)
    st = system.steal_window(ctx.host, ctx.cpus, ctx.steal_window_s,
                             ctx.cache.get("steal_start"))
    if not st.ok:
        if st.reason == ABSENT:
            out.append(unsupported("virt.steal", "virt", "CPU steal",
                                   f"{st.path} {why(ctx.host, st.reason, st.path)}", st.path))
        else:
            out.append(Finding("virt.steal", "virt", "CPU steal", Status.ERROR,
                               current=f"unreadable: {why(ctx.host, st.reason, st.path)}",
                               evidence=st.path))
        return out
    out.append(_steal_finding(ctx, st.value, st.path))
    return out


def _steal_finding(ctx: AuditContext, win: dict[int, system.StealWindow],
                   path: str) -> Finding:
    """``virt.steal`` from each target CPU's steal window: over the limit only where the
    least share its ticks can be (:attr:`~collectors.system.StealWindow.min_share`) is,
    so one tick (5 % of a 0.2 s window as read, possibly none) never flips the audit; a
    share read over the limit that the ticks cannot prove is said so."""
    limit = float(ctx.profile.expected("steal_max_pct", 1.0))
    pct = {c: round(100 * w.share, 2) for c, w in win.items()}
    worst = max(pct.values(), default=0.0)
    proven = max((100 * w.min_share for w in win.values()), default=0.0)
    live = ctx.host.live and ctx.steal_window_s > 0
    window = f"over {ctx.steal_window_s:.1f} s" if live else "since boot"
    missing = [c for c in ctx.cpus if c not in pct]
    unknown = bool(missing) and proven <= limit  # what was read passes; the rest is unknown
    cur = (f"max {worst:.2f}% {window} "
           f"({group_by_value({c: f'{p:.2f}%' for c, p in pct.items()})})") if pct else "none"
    if worst > limit >= proven:
        c, w = max(win.items(), key=lambda kv: kv[1].share)
        cur += (f"; {w.steal_ticks} steal tick(s) of {w.ticks} on CPU {c} can be "
                f"{100 * w.min_share:.1f}-{100 * w.max_share:.1f}% (whole USER_HZ ticks): "
                "not shown over the limit")
    if missing:  # /proc/stat prints every online CPU: a target without its line is unknown
        cur += f"; CPU {format_cpulist(missing)} not in {path}"
    data: dict = {"steal_pct": pct}
    if live:
        data.update(steal_ticks={c: w.steal_ticks for c, w in win.items()},
                    window_ticks={c: w.ticks for c, w in win.items()},
                    steal_pct_min={c: round(100 * w.min_share, 2) for c, w in win.items()})
    return ctx.finding(
        "steal_max_pct", "virt.steal", "virt", "CPU steal (hypervisor)", proven <= limit,
        current=cur, expected=f"<= {limit}%", evidence=f"{path} (steal column)",
        fix="" if unknown else "ask the host for dedicated (pinned, not overcommitted) vCPUs",
        status=Status.ERROR if unknown else None, data=data)


# ------------------------------------------------------------------------------------------
# NUMA and the target process
# ------------------------------------------------------------------------------------------


def check_numa(ctx: AuditContext) -> list[Finding]:
    """Target CPUs on one node. Node ids need not start at 0 (nodes 1.. only is a real
    layout); a node whose cpulist cannot be read matters only when some target CPU is on
    no readable node (a CPU is on exactly one node)."""
    host = ctx.host
    readings = system.numa_node_cpulists(host)
    base = host.display(host.sys("devices/system/node"))
    ev = base + "/node*/cpulist"
    if not readings:
        reason = (f"{base} {why(host, ABSENT, base)}" if in_tree(host, base) else
                  f"no {base} (kernel without NUMA)")
        return [unsupported("numa.nodes", "numa", "NUMA topology", reason, ev)]
    nodes = {n: r.value for n, r in readings.items() if r.ok}
    unreadable = {n: why(host, r.reason, r.path) for n, r in readings.items() if not r.ok}
    used = system.node_of_cpus(nodes, ctx.cpus)
    covered = {c for n in used for c in nodes[n]}
    nowhere = [c for c in ctx.cpus if c not in covered]
    cur = "; ".join(f"node{n}: {format_cpulist(c)}" for n, c in sorted(nodes.items()))
    if unreadable:
        cur += ("; " if cur else "") + "; ".join(f"node{n}: cpulist {r}"
                                                 for n, r in sorted(unreadable.items()))
    cur += f"; target CPUs on node(s) {','.join(map(str, sorted(used))) or 'none'}"
    if nowhere:
        cur += f"; CPUs {format_cpulist(nowhere)} on no readable node"
    status = None
    if len(used) <= 1 and nowhere:
        status = Status.ERROR  # one node among what was read: the rest is unknown
    pick = _node_choice(ctx, nodes, used)
    fix = "" if pick is None else (
        f"choose --cpus within one node, e.g. {format_cpulist(pick[1])}; launch with "
        f"numactl --physcpubind={format_cpulist(pick[1])} --membind={pick[0]} CMD")
    return [ctx.finding(
        "numa_single_node", "numa.target_nodes", "numa", "Target CPUs on one NUMA node",
        len(used) <= 1 and not nowhere, current=cur, expected="one node", evidence=ev,
        fix="" if status else fix, status=status)]


def _node_choice(ctx: AuditContext, nodes: dict[int, list[int]],
                 prefer: set[int] | None = None) -> tuple[int, list[int]] | None:
    """(node, CPUs to propose as --cpus) for a fix that asks for one node: the node holding
    the most target CPUs (among ``prefer``, when given and any qualifies), its online CPUs
    less the housekeeping core (tuning/targets.py: the lowest online CPU and its SMT
    siblings, which takes the kernel's unbound work). Following the fix must never put
    inference on CPU 0. None when no node has a CPU left."""
    house = set(housekeeping_core(ctx.host, ctx.online)) if ctx.online else set()
    online = set(ctx.online)
    left = {n: [c for c in cl if c in online and c not in house] for n, cl in nodes.items()}
    left = {n: cl for n, cl in left.items() if cl}
    if not left:
        return None
    pool = [n for n in left if prefer and n in prefer] or list(left)
    target = set(ctx.cpus)
    node = min(pool, key=lambda n: (-len(target & set(left[n])), n))
    return node, left[node]


def check_process(ctx: AuditContext) -> list[Finding]:
    """The target process (``--pid``): its CPU affinity, memory nodes and TF thread pools."""
    if ctx.pid is None:
        return []
    nodes = {n: r.value for n, r in system.numa_node_cpulists(ctx.host).items() if r.ok}
    return _check_pid(ctx, nodes)


def _check_pid(ctx: AuditContext, nodes: dict[int, list[int]]) -> list[Finding]:
    info = ctx.cache.get("pidinfo")
    ev = ctx.host.display(ctx.host.proc(ctx.pid, "status"))
    name = f"pid {ctx.pid} ({info.comm})"
    out = []
    allowed = info.cpus_allowed or []
    outside = sorted(set(allowed) - set(ctx.cpus))
    out.append(ctx.finding(
        "numa_single_node", "process.affinity", "process", f"CPU affinity of {name}",
        bool(allowed) and not outside, current=f"Cpus_allowed_list {format_cpulist(allowed)}",
        expected=f"within target CPUs {format_cpulist(ctx.cpus)}", evidence=ev,
        fix=f"taskset -a -p -c {format_cpulist(ctx.cpus)} {ctx.pid}  "
            f"(or start it with hftagent run --cpus {format_cpulist(ctx.cpus)} -- CMD)"))
    mems = info.mems_allowed or []
    if nodes and len(nodes) > 1:
        used = system.node_of_cpus(nodes, allowed)
        target_nodes = system.node_of_cpus(nodes, ctx.cpus)
        node = min(target_nodes or used or nodes)
        out.append(ctx.finding(
            "numa_single_node", "process.membind", "process", f"Memory nodes of {name}",
            len(mems) == 1 and set(mems) <= used,
            current=f"Mems_allowed_list {format_cpulist(mems)}; CPUs on node(s) "
                    f"{format_cpulist(sorted(used))}",
            expected="one node, the node of its CPUs", evidence=ev,
            fix=f"numactl --membind={node} --physcpubind={format_cpulist(ctx.cpus)} CMD"))
    threads = info.threads or 0
    ncpu = len(allowed) or 1
    env = info.environ
    if env is None:
        out.append(Finding("process.tf_threads", "process", f"TF thread pools of {name}",
                           Status.UNSUPPORTED, current=f"environment {info.environ_reason}",
                           evidence=ctx.host.display(ctx.host.proc(ctx.pid, "environ"))))
    else:
        keys = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
        vals = {k: env.get(k) for k in keys}
        problems = []
        intra = vals["TF_NUM_INTRAOP_THREADS"]
        inter = vals["TF_NUM_INTEROP_THREADS"]
        if intra is None:
            problems.append("TF_NUM_INTRAOP_THREADS unset (TF uses every CPU it sees)")
        elif intra.isdigit() and int(intra) > ncpu:
            problems.append(f"intra-op {intra} > {ncpu} allowed CPUs")
        if inter is None:
            problems.append("TF_NUM_INTEROP_THREADS unset")
        elif inter.isdigit() and int(inter) > 1:
            problems.append(f"inter-op {inter} > 1")
        cur = ", ".join(f"{k}={v if v is not None else 'unset'}" for k, v in vals.items())
        cur += f"; {threads} threads on {ncpu} allowed CPUs"
        if problems:
            cur += " — " + "; ".join(problems)
        out.append(ctx.finding(
            "tf_threads", "process.tf_threads", "process", f"TF thread pools of {name}",
            not problems, current=cur, expected=f"intra-op <= {ncpu}, inter-op = 1",
            evidence=ctx.host.display(ctx.host.proc(ctx.pid, "environ")),
            fix=f"hftagent run --cpus {format_cpulist(ctx.cpus)} --intra {ncpu} --inter 1 -- CMD"))
    return out


# ------------------------------------------------------------------------------------------
# PCIe
# ------------------------------------------------------------------------------------------

INTERESTING = ("gpu-3d", "display-vga", "display", "network", "network-infiniband",
               "accelerator")
BMC_VGA_VENDORS = pcie.BMC_VGA_VENDORS


def _unknown_link(d: pcie.PciDevice) -> str:
    what = "; ".join(f"{k} {v}" for k, v in sorted(d.unreadable.items())
                     if k.startswith("current_link")) or "current link unreadable"
    return f"{d.address} {d.klass} link state unknown ({what})"


def check_pcie(ctx: AuditContext) -> list[Finding]:
    """Links below their max gen/width, and GPU/NIC NUMA node vs the target CPUs.

    A link whose current speed or width the kernel cannot state ("Unknown", width 0) is not
    "at max": ``error`` naming it, unless it is a bridge with nothing behind it (an empty
    hot-plug slot, whose link is down because no card is there)."""
    host = ctx.host
    devs = pcie.pci_devices(host)
    ev = host.display(host.sys("bus/pci/devices"))
    linked = [d for d in devs if d.has_link]
    if not devs:
        reason = (f"{ev} {why(host, ABSENT, ev)}" if in_tree(host, ev)
                  else "no PCI devices in sysfs")
        return [unsupported("pcie.links", "pcie", "PCIe links", reason, ev)]
    out = []
    if not linked:
        out.append(Finding("pcie.links", "pcie", "PCIe links", Status.UNSUPPORTED,
                           current=f"unsupported: none of {len(devs)} PCI devices reports link "
                                   "speed/width (virtual or legacy PCI)", evidence=ev))
    else:
        empty = [d for d in linked if d.link_unknown and d.is_bridge and d.empty_bridge]
        unknown = [d for d in linked if d.link_unknown and d not in empty]
        known = [d for d in linked if not d.link_unknown]
        width = [d for d in known if d.width_degraded]
        speed = [d for d in known if d.speed_degraded and not d.width_degraded]
        desc = [f"{d.address} {d.klass} {d.link_str()}" for d in width + speed]
        cur = "; ".join(desc + [_unknown_link(d) for d in unknown]) if desc or unknown else \
            f"all {len(known)} links at max speed and width"
        if empty:
            cur += (f" ({len(empty)} empty slot{'s' if len(empty) > 1 else ''} with the link "
                    f"down: {', '.join(d.address for d in empty)})")
        # a width drop is always suspicious; a gen drop on an idle device can be ASPM power
        # saving, so speed-only drops are warnings (the GPU check re-tests under load)
        status = None
        if not width and speed:
            status = Status.WARN
        elif not width and unknown:
            status = Status.ERROR
        out.append(ctx.finding(
            "pcie_link", "pcie.links", "pcie", "PCIe links downtrained",
            not desc and not unknown, current=cur,
            expected="current = max (gen and width)", evidence=f"{ev}/*/current_link_*",
            fix="" if status is Status.ERROR else
                "reseat the card / check slot wiring and BIOS link settings; a gen drop at "
                "idle may be ASPM: re-check under load (lspci -vv: LnkSta vs LnkCap)",
            status=status,
            data={"degraded": desc, **({"unknown": [d.address for d in unknown]}
                                       if unknown else {}),
                  **({"empty_slots": [d.address for d in empty]} if empty else {})}))
    nodes = {n: r.value for n, r in system.numa_node_cpulists(host).items() if r.ok}
    target_nodes = system.node_of_cpus(nodes, ctx.cpus) if nodes else set()
    local = [d for d in devs if d.klass in INTERESTING
             and not (d.klass.startswith("display") and (d.vendor or "").lower()
                      in BMC_VGA_VENDORS)]
    far = [d for d in local if d.numa_node is not None
           and target_nodes and d.numa_node not in target_nodes]
    if local:
        cur = "; ".join(
            f"{d.address} {d.klass} node {d.numa_node if d.numa_node is not None else 'n/a'}"
            for d in local[:8])
        out.append(ctx.finding(
            "numa_single_node", "pcie.numa_locality", "pcie", "GPU/NIC NUMA node vs target CPUs",
            not far, current=cur,
            expected=f"node(s) {','.join(map(str, sorted(target_nodes))) or 'n/a'}",
            evidence=f"{ev}/*/numa_node",
            fix="pin inference to the CPUs of the device's node: "
                + "; ".join(f"{d.address}: --cpus {cpus}" for d in far
                            if (cpus := _device_node_cpus(ctx, nodes, d)))))
    return out


def _device_node_cpus(ctx: AuditContext, nodes: dict[int, list[int]],
                      d: pcie.PciDevice) -> str:
    """The --cpus a fix proposes for a device's node (:func:`_node_choice`: never the
    housekeeping core); "" when that leaves none."""
    pick = _node_choice(ctx, {d.numa_node: nodes.get(d.numa_node, [])}) \
        if d.numa_node is not None else None
    return format_cpulist(pick[1]) if pick else ""


# ------------------------------------------------------------------------------------------
# Other tuners
# ------------------------------------------------------------------------------------------

TUNER_PROCS = {"tuned": "tuned", "irqbalance": "irqbalance",
               "power-profiles-daemon": "power-profiles-daemon", "thermald": "thermald"}


def check_tuners(ctx: AuditContext) -> list[Finding]:
    """Daemons that set CPU, IRQ or power settings behind our back: running (by name in the
    process table), enabled as systemd units, or tuned's active profile. Without a process
    table (a tree captured without processes) and nothing else found: ``unsupported``, not
    "none found"; a partial table (no PID 1) that shows none: ``error``."""
    host = ctx.host
    table = ctx.cache.setdefault("process_table", system.process_table(host))
    names = table.value.names if table.ok else {}
    found = sorted({n for n in names.values() if n in TUNER_PROCS})
    prof = system.tuned_profile(host)
    units = []
    for unit in ("cpupower.service", "tuned.service", "irqbalance.service"):
        if host.etc("systemd/system/multi-user.target.wants", unit).exists():
            units.append(unit)
    parts = []
    if found:
        parts.append("running: " + ", ".join(found))
    if prof.ok:
        parts.append(f"tuned profile {prof.value.strip()}")
    if units:
        parts.append("enabled units: " + ", ".join(units))
    want = ctx.profile.expected("other_tuners", "none")
    ok = want == "any" or not (found or units)
    wants = host.display(host.etc("systemd/system")) + "/*.wants"
    evidence = (f"{table.path}, {host.display(host.etc('tuned', 'active_profile'))}, {wants}")
    status = None
    unknown = ""
    if not table.ok:
        unknown = f"running daemons unknown: no process table ({table.reason})"
    elif table.value.partial:
        unknown = f"running daemons unknown: the process table is partial ({table.value.partial})"
    if unknown:
        parts.append(unknown)
        if ok and want != "any":
            if not table.ok:
                return [unsupported("tuners.others", "tuners",
                                    "Other tuners that may override settings",
                                    "; ".join(parts), evidence)]
            status = Status.ERROR
    return [ctx.finding(
        "other_tuners", "tuners.others", "tuners", "Other tuners that may override settings", ok,
        current="; ".join(parts) or "none found", expected="none", evidence=evidence,
        status=status,
        fix="systemctl disable --now " + " ".join(sorted(set(
            [f"{n}.service" for n in found] + units))) + "  (or make their profile agree)")]
