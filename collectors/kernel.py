"""Kernel, memory-management and clock settings read through a :class:`Host`.

Sources:
- /proc/cmdline                                              [cat /proc/cmdline]
- /proc/sys/... sysctls (vm.swappiness, kernel.numa_balancing, kernel.nmi_watchdog,
  kernel.timer_migration, vm.stat_interval, kernel.sched_rt_runtime_us,
  kernel.perf_event_paranoid)                                [sysctl NAME]
- /sys/kernel/mm/transparent_hugepage/{enabled,defrag}       [cat]
- /sys/kernel/mm/ksm/run                                     [cat]
- /proc/swaps                                                [swapon --show]
- /sys/devices/system/clocksource/clocksource0/{current,available}_clocksource
- /proc/sys/kernel/osrelease, /etc/os-release
"""

from __future__ import annotations

from dataclasses import dataclass

from collectors.host import Host, Reading
from collectors.parsers import SwapDevice, parse_bracketed, parse_cmdline, parse_swaps

# sysctl name -> path under /proc/sys (sysctl's dots are slashes).
SYSCTLS = {
    "vm.swappiness": "vm/swappiness",
    "kernel.numa_balancing": "kernel/numa_balancing",
    "kernel.nmi_watchdog": "kernel/nmi_watchdog",
    "kernel.timer_migration": "kernel/timer_migration",
    "vm.stat_interval": "vm/stat_interval",
    "kernel.sched_rt_runtime_us": "kernel/sched_rt_runtime_us",
    "kernel.perf_event_paranoid": "kernel/perf_event_paranoid",
}


def sysctl_path(host: Host, name: str):
    return host.proc("sys", name.replace(".", "/"))


def sysctl_int(host: Host, name: str) -> Reading[int]:
    """Integer sysctl (e.g. ``vm.swappiness``); None + reason when the kernel lacks it."""
    return host.read(sysctl_path(host, name)).map(lambda s: int(s.split()[0]))


def cmdline(host: Host) -> Reading[dict[str, str | None]]:
    return host.read(host.proc("cmdline")).map(parse_cmdline)


@dataclass(frozen=True)
class Choice:
    """A sysfs "a [b] c" selector: the selected value and the offered ones."""

    selected: str | None
    options: tuple[str, ...]
    path: str
    reason: str | None = None


def _choice(host: Host, path) -> Choice:
    r = host.read(path).map(parse_bracketed)
    if r.value is None:
        return Choice(None, (), r.path, r.reason)
    return Choice(r.value[0], tuple(r.value[1]), r.path)


def thp_enabled(host: Host) -> Choice:
    return _choice(host, host.sys("kernel/mm/transparent_hugepage/enabled"))


def thp_defrag(host: Host) -> Choice:
    return _choice(host, host.sys("kernel/mm/transparent_hugepage/defrag"))


def ksm_run(host: Host) -> Reading[int]:
    """0 = stopped, 1 = running, 2 = unmerge all and stop."""
    return host.read_int(host.sys("kernel/mm/ksm/run"))


def swaps(host: Host) -> Reading[list[SwapDevice]]:
    return host.read(host.proc("swaps")).map(parse_swaps)


@dataclass(frozen=True)
class Clocksource:
    current: str | None
    available: tuple[str, ...]
    path: str
    reason: str | None = None  # why ``current`` is None


def clocksource(host: Host) -> Clocksource:
    d = host.sys("devices/system/clocksource/clocksource0")
    cur = host.read(d / "current_clocksource")
    avail = host.read(d / "available_clocksource").value or ""
    return Clocksource(cur.value.strip() if cur.value else None, tuple(avail.split()),
                       cur.path, cur.reason if not cur.value else None)


def kernel_release(host: Host) -> str | None:
    return host.read(host.proc("sys/kernel/osrelease")).value
