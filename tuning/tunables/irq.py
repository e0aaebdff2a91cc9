"""Interrupt placement: irqbalance, the default IRQ mask, and every IRQ's affinity.

Order (see tuning/tunables/__init__.py): irqbalance is stopped before IRQs are moved (it would
move them back within seconds), default_smp_affinity before the existing IRQs (an IRQ that is
requested in between lands off the target CPUs too). Rollback runs in reverse: IRQs first,
irqbalance restarted last.
"""

from __future__ import annotations

import errno
import shutil
import subprocess

from collectors.irq import irq_affinities
from collectors.parsers import format_cpulist, format_cpumask, parse_cpulist, parse_cpumask
from tuning.tunables.base import (
    MANUAL,
    Change,
    FileTunable,
    Tunable,
    TuneContext,
    TuneError,
)


def _housekeeping(ctx: TuneContext) -> list[int]:
    """The online CPUs that are not targets: where interrupts may go."""
    rest = sorted(set(ctx.online) - set(ctx.cpus))
    if not rest:
        raise TuneError(f"target CPUs {format_cpulist(ctx.cpus)} cover every online CPU "
                        f"({format_cpulist(ctx.online)}): interrupts need at least one other CPU")
    return rest


def _no_targets(ctx: TuneContext) -> str | None:
    if not ctx.cpus:
        return "no target CPUs: pass --cpus (or isolate CPUs with isolcpus=)"
    return None


class DefaultIrqAffinity(FileTunable):
    """Mask newly requested IRQs get: the online CPUs minus the target CPUs.

    File: /proc/irq/default_smp_affinity (hex mask, 32-bit words, most significant first).
    Equivalent: ``echo 3 > /proc/irq/default_smp_affinity``.
    """

    id, family, title, key = "irq.default_affinity", "irq", "Default IRQ affinity", \
        "irq_affinity"
    patterns = ("/proc/irq/default_smp_affinity",)

    def valid(self, value: str) -> bool:
        try:
            return bool(parse_cpumask(value))
        except ValueError:
            return False

    def _path(self, ctx: TuneContext):
        return ctx.host.proc("irq/default_smp_affinity")

    def available(self, ctx: TuneContext) -> str | None:
        if not ctx.host.exists(self._path(ctx)):
            return "unsupported: no /proc/irq/default_smp_affinity"
        return _no_targets(ctx)

    def normalise(self, text: str) -> str:
        return format_cpumask(parse_cpumask(text))

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        return {ctx.host.display(self._path(ctx)): format_cpumask(_housekeeping(ctx))}


class IrqAffinity(FileTunable):
    """Every movable IRQ off the target CPUs.

    Files: /proc/irq/N/smp_affinity_list (CPU list). New affinity = current minus the target
    CPUs, or the housekeeping CPUs when nothing would be left. IRQs that already avoid the
    targets are not touched. A write refused with EIO or EPERM (managed IRQs of nvme/virtio
    queues, per-CPU and chained interrupts: kernel/irq/proc.c write_irq_affinity) means the
    kernel will not move that IRQ: it is reported "unchangeable", not a failure — the same
    call TuneD makes. The IRQs the host already shows to be such
    (collectors.irq.immovable: debugfs IRQD_* state, managed queue names) are still tried,
    the kernel's answer deciding, and the plan says which they are and that only the boot
    argument ``isolcpus=managed_irq,...`` helps (the audit's ``irq.managed``).
    Equivalent: ``echo 0-1 > /proc/irq/N/smp_affinity_list``.
    """

    id, family, title, key, scope = "irq.affinity", "irq", "IRQ affinity", "irq_affinity", "irq"
    patterns = ("/proc/irq/[0-9]*/smp_affinity_list",)

    def __init__(self) -> None:
        self._immovable: dict[str, str] = {}  # target -> evidence, from the last desired()

    def valid(self, value: str) -> bool:
        try:
            return bool(parse_cpulist(value))
        except ValueError:
            return False

    def available(self, ctx: TuneContext) -> str | None:
        if not ctx.host.exists(ctx.host.proc("irq")):
            return "unsupported: no /proc/irq"
        return _no_targets(ctx)

    def index_of(self, target: str) -> int | None:
        parts = target.split("/")
        return int(parts[3]) if len(parts) > 4 and parts[3].isdigit() else None

    def normalise(self, text: str) -> str:
        return format_cpulist(parse_cpulist(text))

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        house = _housekeeping(ctx)
        targets = set(ctx.cpus)
        out = {}
        self._immovable = {}
        for a in irq_affinities(ctx.host):
            if a.affinity is None:
                continue
            new = sorted(set(a.affinity) - targets) or house
            out[a.path] = format_cpulist(new)
            if a.immovable and set(a.affinity) & targets:
                self._immovable[a.path] = a.immovable_evidence
        return out

    def detail(self, ctx: TuneContext, target: str) -> str:
        why = self._immovable.get(target)
        return f"the kernel will likely refuse (EIO): {why}" if why else ""

    def plan_note(self, ctx: TuneContext) -> str:
        if not self._immovable:
            return ""
        n = len(self._immovable)
        return (f"{n} IRQ{'s' if n > 1 else ''} the kernel will likely refuse to move "
                "(managed or per-CPU, audit: irq.managed): boot with "
                f"isolcpus=managed_irq,domain,{format_cpulist(ctx.cpus)} to keep managed "
                "ones off the targets")

    def unchangeable(self, exc: OSError) -> bool:
        return exc.errno in (errno.EIO, errno.EPERM)


class SystemctlServices:
    """The live host's service manager, through ``systemctl`` with an argv (no shell)."""

    def __init__(self, systemctl: str | None = None) -> None:
        self.systemctl = systemctl or shutil.which("systemctl")

    def is_active(self, name: str) -> bool | None:
        if not self.systemctl:
            return None
        r = subprocess.run([self.systemctl, "is-active", name], capture_output=True, text=True,
                           check=False)
        state = r.stdout.strip()
        if state in ("active", "activating", "reloading"):
            return True
        if state in ("inactive", "failed", "deactivating"):
            return False
        return None  # "unknown" (not installed) or no systemd

    def _run(self, verb: str, name: str) -> None:
        if not self.systemctl:
            raise OSError(errno.ENOENT, "systemctl not found")
        r = subprocess.run([self.systemctl, verb, name], capture_output=True, text=True,
                           check=False)
        if r.returncode != 0:
            raise OSError(errno.EIO, f"systemctl {verb} {name}: {r.stderr.strip()}")

    def stop(self, name: str) -> None:
        self._run("stop", name)

    def start(self, name: str) -> None:
        self._run("start", name)


class Irqbalance(Tunable):
    """irqbalance, per profile: ``off`` stops the service (journalled; rollback starts it
    again), ``banned`` prints the IRQBALANCE_BANNED_CPULIST line to set (a config file under
    /etc outlives the tmpfs journal, so we never edit it).

    Target: "service:irqbalance", values "active" / "inactive". Equivalent:
    ``systemctl stop irqbalance``. Needs the live host (a tree copy has no service manager).
    """

    id, family, title, key = "irq.irqbalance", "irq", "irqbalance", "irqbalance"
    TARGET = "service:irqbalance"
    patterns = (TARGET,)

    def valid(self, value: str) -> bool:
        return value in ("active", "inactive")

    def available(self, ctx: TuneContext) -> str | None:
        if ctx.services is None:
            return ctx.services_reason
        if ctx.services.is_active("irqbalance") is None:
            return "unsupported: irqbalance is not installed (or no systemd)"
        return None

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        if self.wanted(ctx) == "banned":
            if not ctx.cpus:
                return {}
            return {self.TARGET: f"banned:{format_cpulist(ctx.cpus)}"}
        return {self.TARGET: "inactive"}

    def plan(self, desired: dict[str, str], current: dict[str, str | None]) -> list[Change]:
        out = []
        for t, v in desired.items():
            if v.startswith("banned:"):
                if current.get(t) == "inactive":
                    continue  # not running: nothing to ban from
                cpus = v.partition(":")[2]
                out.append(Change(self.id, t, current.get(t), v, MANUAL, detail=(
                    f"set IRQBALANCE_BANNED_CPULIST={cpus} in /etc/default/irqbalance "
                    "(Debian/Ubuntu) or /etc/sysconfig/irqbalance (RHEL), then "
                    "`systemctl restart irqbalance`")))
            elif current.get(t) != v:
                out.append(Change(self.id, t, current.get(t), v))
        return out

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        if ctx.services is None:
            return None
        state = ctx.services.is_active("irqbalance")
        return None if state is None else ("active" if state else "inactive")

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        if ctx.services is None:
            raise OSError(errno.ENOTSUP, ctx.services_reason)
        if value == "inactive":
            ctx.services.stop("irqbalance")
        elif value == "active":
            ctx.services.start("irqbalance")
        else:
            raise OSError(errno.EINVAL, f"bad irqbalance state {value!r}")
