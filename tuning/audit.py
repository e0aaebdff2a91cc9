"""`hftagent audit`: read-only checks of every host setting that hurts tail latency.

Families are reported in a fixed order (FAMILIES); the virt family runs last, so that the
others run inside its steal window. Each family is isolated: a check that raises is reported
as one ``error`` finding for its family and the others still run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from collectors import cpu as cpuc
from collectors import kernel, system
from collectors.host import Host
from collectors.parsers import format_cpulist
from tuning.checks import cpu, gpu, irq, isolation, platform, wakeup
from tuning.checks import kernel as kernel_checks
from tuning.checks.base import AuditContext, why
from tuning.findings import Finding, Status, summarize
from tuning.profiles import Profile

SCHEMA_VERSION = 1

# (family, check), in the report's order. Virtualization first: later checks use its verdict
# (ctx.cache["virt"], read before any family runs) to say "unsupported in this guest" instead
# of "missing". The virt family *runs* last (RUN_LAST): its steal window opens before the
# first family and the checks run inside it, instead of waiting 0.2 s for it (issue #28).
# The target process (--pid) is a family of its own: a numa check that breaks must not take
# the process findings with it.
FAMILIES: list[tuple[str, Callable[[AuditContext], list[Finding]]]] = [
    ("virt", platform.check_virt),
    ("cpu", cpu.check),
    ("wakeup", wakeup.check),
    ("isolation", isolation.check),
    ("irq", irq.check),
    ("kernel", kernel_checks.check),
    ("numa", platform.check_numa),
    ("process", platform.check_process),
    ("pcie", platform.check_pcie),
    ("tuners", platform.check_tuners),
    ("gpu", gpu.check),
]
RUN_LAST = ("virt",)


class AuditInputError(ValueError):
    """Bad --cpus / --pid: the audit cannot run as asked."""


@dataclass
class AuditReport:
    profile: str
    target_cpus: list[int]
    host: dict
    findings: list[Finding]
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "profile": self.profile,
            "target_cpus": format_cpulist(self.target_cpus),
            "host": self.host,
            "summary": summarize(self.findings),
            "findings": [f.to_dict() for f in self.findings],
        }


def resolve_cpus(host: Host, spec: str | None) -> tuple[list[int], list[int]]:
    """(target CPUs, online CPUs) by the one rule of tuning/targets.py (isolated, else
    nohz_full, else all online but the housekeeping core). Online CPUs come from cpu/online,
    or, where that is missing, from present/possible and the cpuN directories
    (collectors.system.online_cpus; the cpu family says so)."""
    from tuning.targets import TargetError, resolve
    try:
        plan = resolve(host, spec)
    except TargetError as exc:
        raise AuditInputError(str(exc)) from None
    return plan.cpus, plan.online


def host_facts(host: Host, ctx: AuditContext) -> dict:
    virt = ctx.cache["virt"]
    derived = ctx.cache.get("online_derived")
    return ({"online_cpus_derived": derived} if derived else {}) | {
        "kernel": kernel.kernel_release(host),
        "cpu_model": cpuc.cpu_model(host),
        "online_cpus": format_cpulist(ctx.online),
        "isolated_cpus": format_cpulist(cpuc.isolated_cpus(host)),
        "numa_nodes": len(system.numa_nodes(host)) or 1,
        # "none" only when a source shows bare metal; none could tell: "unknown" (issue #28)
        "virtualization": virt.kind or ("none" if virt.known else "unknown"),
        "live": host.live,
    }


def run_audit(host: Host, profile: Profile, cpus: str | None = None, pid: int | None = None,
              steal_window_s: float = 0.2, families: list[str] | None = None,
              steal_start: system.StatSnapshot | None = None) -> AuditReport:
    """``steal_start``: a steal window the caller opened earlier (the CLI opens it as the
    process starts); else it opens here, before the checks."""
    t0 = time.perf_counter()
    if steal_start is None and host.live and steal_window_s > 0:
        steal_start = system.stat_snapshot(host)
    target, online = resolve_cpus(host, cpus)
    ctx = AuditContext(host=host, profile=profile, cpus=target, online=online, pid=pid,
                       steal_window_s=steal_window_s)
    oc = system.online_cpus(host).value
    if oc.derived:
        ctx.cache["online_derived"] = f"{oc.path} {why(host, oc.reason, oc.path)}; {oc.derived}"
    if pid is not None:
        if pid <= 0:
            raise AuditInputError(f"bad --pid {pid}")
        info = system.process_info(host, pid)
        if info is None:
            raise AuditInputError(f"--pid {pid}: no such process")
        ctx.cache["pidinfo"] = info
    ctx.cache["virt"] = system.virtualization(host)
    ctx.cache["steal_start"] = steal_start
    found: dict[str, list[Finding]] = {}
    for name, fn in sorted(FAMILIES, key=lambda f: f[0] in RUN_LAST):
        if families and name not in families:
            continue
        try:
            found[name] = fn(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken family must not hide the others
            found[name] = [Finding(f"{name}.check", name, f"{name} checks", Status.ERROR,
                                   current=f"check failed: {type(exc).__name__}: {exc}")]
    findings = [f for name, _ in FAMILIES for f in found.get(name, [])]
    return AuditReport(profile=profile.name, target_cpus=target, host=host_facts(host, ctx),
                       findings=findings, duration_s=time.perf_counter() - t0)
