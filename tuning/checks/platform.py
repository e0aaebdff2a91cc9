"""Platform families: virtualization/steal, NUMA (+ target process), PCIe links, other tuners."""

from __future__ import annotations

from collectors import pcie, system
from collectors.parsers import format_cpulist, group_by_value
from tuning.checks.base import AuditContext, unsupported
from tuning.findings import Finding, Status

# ------------------------------------------------------------------------------------------
# virtualization
# ------------------------------------------------------------------------------------------


def check_virt(ctx: AuditContext) -> list[Finding]:
    v = ctx.cache.get("virt") or system.virtualization(ctx.host)
    out = []
    if not v.known:
        out.append(Finding("virt.hypervisor", "virt", "Virtualization", Status.ERROR,
                           current=f"unknown: {v.evidence}", expected="bare metal",
                           evidence=v.evidence))
    elif v.kind:
        out.append(Finding(
            "virt.hypervisor", "virt", "Virtualization", Status.WARN, current=v.kind,
            expected="bare metal", evidence=v.evidence,
            fix="run latency-critical inference on bare metal or dedicated/pinned vCPUs",
            why="A guest does not control frequency, C-states or SMT, and its vCPUs can be "
                "descheduled by the host at any time."))
    else:
        out.append(Finding("virt.hypervisor", "virt", "Virtualization", Status.OK,
                           current="bare metal", expected="bare metal", evidence=v.evidence))
    st = system.steal_share(ctx.host, ctx.cpus, ctx.steal_window_s)
    if not st.ok:
        out.append(Finding("virt.steal", "virt", "CPU steal", Status.ERROR,
                           current=f"unreadable: {st.reason}", evidence=st.path))
        return out
    limit = float(ctx.profile.expected("steal_max_pct", 1.0))
    pct = {c: round(100 * s, 2) for c, s in st.value.items()}
    worst = max(pct.values(), default=0.0)
    window = (f"over {ctx.steal_window_s:.1f} s" if ctx.host.live and ctx.steal_window_s > 0
              else "since boot")
    out.append(ctx.finding(
        "steal_max_pct", "virt.steal", "virt", "CPU steal (hypervisor)", worst <= limit,
        current=f"max {worst:.2f}% {window} ({group_by_value({c: f'{p:.2f}%' for c, p in pct.items()})})",
        expected=f"<= {limit}%", evidence=f"{st.path} (steal column)",
        fix="ask the host for dedicated (pinned, not overcommitted) vCPUs",
        data={"steal_pct": pct}))
    return out


# ------------------------------------------------------------------------------------------
# NUMA and the target process
# ------------------------------------------------------------------------------------------


def check_numa(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    nodes = system.numa_nodes(host)
    out = []
    ev = host.display(host.sys("devices/system/node")) + "/node*/cpulist"
    if not nodes:
        out.append(unsupported("numa.nodes", "numa", "NUMA topology",
                               "no /sys/devices/system/node (kernel without NUMA)", ev))
    else:
        used = system.node_of_cpus(nodes, ctx.cpus)
        cur = "; ".join(f"node{n}: {format_cpulist(c)}" for n, c in sorted(nodes.items()))
        cur += f"; target CPUs on node(s) {','.join(map(str, sorted(used)))}"
        node = min(used) if used else 0
        out.append(ctx.finding(
            "numa_single_node", "numa.target_nodes", "numa", "Target CPUs on one NUMA node",
            len(used) <= 1, current=cur, expected="one node", evidence=ev,
            fix=f"choose --cpus within one node, e.g. {format_cpulist(nodes[node])}; "
                f"launch with numactl --physcpubind=<cpus> --membind={node}"))
    if ctx.pid is not None:
        out.extend(_check_pid(ctx, nodes))
    return out


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
        out.append(ctx.finding(
            "numa_single_node", "process.membind", "process", f"Memory nodes of {name}",
            len(mems) == 1 and set(mems) <= used,
            current=f"Mems_allowed_list {format_cpulist(mems)}; CPUs on node(s) "
                    f"{format_cpulist(sorted(used))}",
            expected="one node, the node of its CPUs", evidence=ev,
            fix=f"numactl --membind={min(used) if used else 0} --physcpubind="
                f"{format_cpulist(ctx.cpus)} CMD"))
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


def check_pcie(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    devs = pcie.pci_devices(host)
    ev = host.display(host.sys("bus/pci/devices"))
    linked = [d for d in devs if d.has_link]
    if not devs:
        return [unsupported("pcie.links", "pcie", "PCIe links", "no PCI devices in sysfs", ev)]
    out = []
    if not linked:
        out.append(Finding("pcie.links", "pcie", "PCIe links", Status.UNSUPPORTED,
                           current=f"unsupported: none of {len(devs)} PCI devices reports link "
                                   "speed/width (virtual or legacy PCI)", evidence=ev))
    else:
        width = [d for d in linked if d.width_degraded]
        speed = [d for d in linked if d.speed_degraded and not d.width_degraded]
        desc = [f"{d.address} {d.klass} {d.link_str()}" for d in width + speed]
        cur = "; ".join(desc) if desc else f"all {len(linked)} links at max speed and width"
        # a width drop is always suspicious; a gen drop on an idle device can be ASPM power
        # saving, so speed-only drops are warnings (the GPU check re-tests under load)
        status = None
        if not width and speed:
            status = Status.WARN
        out.append(ctx.finding(
            "pcie_link", "pcie.links", "pcie", "PCIe links downtrained", not desc, current=cur,
            expected="current = max (gen and width)", evidence=f"{ev}/*/current_link_*",
            fix="reseat the card / check slot wiring and BIOS link settings; a gen drop at "
                "idle may be ASPM: re-check under load (lspci -vv: LnkSta vs LnkCap)",
            status=status, data={"degraded": desc}))
    nodes = system.numa_nodes(host)
    target_nodes = system.node_of_cpus(nodes, ctx.cpus) if nodes else set()
    far = [d for d in devs if d.klass in INTERESTING and d.numa_node is not None
           and target_nodes and d.numa_node not in target_nodes]
    local = [d for d in devs if d.klass in INTERESTING]
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
                + "; ".join(f"{d.address}: --cpus {format_cpulist(nodes.get(d.numa_node, []))}"
                            for d in far)))
    return out


# ------------------------------------------------------------------------------------------
# Other tuners
# ------------------------------------------------------------------------------------------

TUNER_PROCS = {"tuned": "tuned", "irqbalance": "irqbalance",
               "power-profiles-daemon": "power-profiles-daemon", "thermald": "thermald"}


def check_tuners(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    procs = ctx.cache.setdefault("procs", system.process_names(host))
    found = sorted({n for n in procs.values() if n in TUNER_PROCS})
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
    return [ctx.finding(
        "other_tuners", "tuners.others", "tuners", "Other tuners that may override settings", ok,
        current="; ".join(parts) or "none found", expected="none",
        evidence="/proc/*/comm, /etc/tuned/active_profile, /etc/systemd/system/*.wants",
        fix="systemctl disable --now " + " ".join(sorted(set(
            [f"{n}.service" for n in found] + units))) + "  (or make their profile agree)")]
