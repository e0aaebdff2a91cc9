"""Memory-management and sysctl tunables (THP, KSM, vm.*, kernel.*)."""

from __future__ import annotations

from collectors.kernel import sysctl_path
from collectors.parsers import parse_bracketed
from tuning.tunables.base import FileTunable, TuneContext, TuneError, int_in, is_word


class _Selector(FileTunable):
    """A sysfs "a [b] c" selector: the value is the bracketed word; offers are all words."""

    family = "memory"
    rel = ""

    def _path(self, ctx: TuneContext):
        return ctx.host.sys(self.rel)

    def available(self, ctx: TuneContext) -> str | None:
        r = ctx.host.read(self._path(ctx))
        return None if r.ok else f"unsupported: {r.path} {r.reason}"

    def normalise(self, text: str) -> str:
        return parse_bracketed(text)[0]

    def valid(self, value: str) -> bool:
        return is_word(value)

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = str(self.wanted(ctx))
        r = ctx.host.read(self._path(ctx))
        offers = parse_bracketed(r.value)[1] if r.ok else []
        if want not in offers:
            raise TuneError(f"{self.key} {want!r} is not offered by the kernel "
                            f"({r.path}: {' '.join(offers)})")
        return {r.path: want}


class ThpEnabled(_Selector):
    """Transparent huge pages mode.

    File: /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never").
    Equivalent: ``echo madvise > /sys/kernel/mm/transparent_hugepage/enabled``.
    """

    id, title, key = "memory.thp_enabled", "Transparent huge pages", "thp_enabled"
    audit_ids = ("kernel.thp_enabled",)
    rel = "kernel/mm/transparent_hugepage/enabled"
    patterns = ("/sys/kernel/mm/transparent_hugepage/enabled",)


class ThpDefrag(_Selector):
    """THP defragmentation policy (direct compaction on fault).

    File: /sys/kernel/mm/transparent_hugepage/defrag ("always defer defer+madvise [madvise]
    never"). Equivalent: ``echo madvise > /sys/kernel/mm/transparent_hugepage/defrag``.
    """

    id, title, key = "memory.thp_defrag", "THP defrag", "thp_defrag"
    audit_ids = ("kernel.thp_defrag",)
    rel = "kernel/mm/transparent_hugepage/defrag"
    patterns = ("/sys/kernel/mm/transparent_hugepage/defrag",)


class Ksm(FileTunable):
    """Kernel samepage merging daemon: 0 = stopped, 1 = running (2 = unmerge all, never
    written by us: rollback writes back whatever was there).

    File: /sys/kernel/mm/ksm/run. Equivalent: ``echo 0 > /sys/kernel/mm/ksm/run``.
    """

    id, family, title, key = "memory.ksm", "memory", "KSM", "ksm"
    audit_ids = ("kernel.ksm",)
    patterns = ("/sys/kernel/mm/ksm/run",)

    def valid(self, value: str) -> bool:
        return int_in(value, 0, 2)

    def available(self, ctx: TuneContext) -> str | None:
        r = ctx.host.read(ctx.host.sys("kernel/mm/ksm/run"))
        return None if r.ok else f"unsupported: {r.path} {r.reason}"

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = profile_int(self.key, self.wanted(ctx))
        if want not in (0, 1):
            raise TuneError(f"ksm {want} is not 0 (stop) or 1 (run)")
        return {ctx.host.display(ctx.host.sys("kernel/mm/ksm/run")): str(want)}


INT_MAX = 2**31 - 1


def profile_int(key: str, raw: object) -> int:
    """A profile value that must be an integer (TOML int, or a string of one)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    raise TuneError(f"{key} {raw!r} is not an integer")


class Sysctl(FileTunable):
    """An integer sysctl under /proc/sys (dots are slashes). Equivalent: ``sysctl -w NAME=V``
    (runtime only; nothing is written to /etc/sysctl.d).

    ``lo``..``hi`` is the range the kernel accepts; a profile value outside it is refused while
    planning (TuneError), so nothing is written."""

    name = ""
    lo: int = 0
    hi: int | None = None

    def _path(self, ctx: TuneContext):
        return sysctl_path(ctx.host, self.name)

    def available(self, ctx: TuneContext) -> str | None:
        r = ctx.host.read(self._path(ctx))
        return None if r.ok else f"unsupported: {r.path} {r.reason}"

    def valid(self, value: str) -> bool:
        return int_in(value, self.lo, self.hi)

    def owns(self, target: str) -> bool:
        return target == "/proc/sys/" + self.name.replace(".", "/")

    def _range(self, ctx: TuneContext) -> str:
        return f"{self.lo}..{'' if self.hi is None else self.hi}"

    def _check(self, ctx: TuneContext, want: int) -> None:
        if not self.valid(str(want)):
            raise TuneError(f"{self.name} {want} is outside the range the kernel accepts "
                            f"({self._range(ctx)})")

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = profile_int(self.key, self.wanted(ctx))
        self._check(ctx, want)
        return {ctx.host.display(self._path(ctx)): str(want)}


class Swappiness(Sysctl):
    """vm.swappiness (0..200): how eagerly anonymous memory is swapped.
    File: /proc/sys/vm/swappiness. Equivalent: ``sysctl -w vm.swappiness=1``."""

    id, family, title, key, name = ("memory.swappiness", "memory", "vm.swappiness",
                                    "swappiness", "vm.swappiness")
    audit_ids = ("kernel.swappiness",)
    # 0..200 since Linux 5.8 (0..100 before; the older kernel refuses 101..200 with EINVAL)
    lo, hi = 0, 200


class NumaBalancing(Sysctl):
    """kernel.numa_balancing: 0 off, 1 on (a bitmask on newer kernels: 2 = memory tiering,
    3 = both; 0..3 accepted).
    File: /proc/sys/kernel/numa_balancing. Equivalent: ``sysctl -w kernel.numa_balancing=0``."""

    id, family, title, key, name = ("memory.numa_balancing", "memory", "NUMA balancing",
                                    "numa_balancing", "kernel.numa_balancing")
    audit_ids = ("kernel.numa_balancing",)
    lo, hi = 0, 3


class TimerMigration(Sysctl):
    """kernel.timer_migration: 0 keeps timers on the CPU that armed them.
    File: /proc/sys/kernel/timer_migration. Equivalent: ``sysctl -w kernel.timer_migration=0``."""

    id, family, title, key, name = ("kernel.timer_migration", "kernel", "Timer migration",
                                    "timer_migration", "kernel.timer_migration")
    lo, hi = 0, 1


class StatInterval(Sysctl):
    """vm.stat_interval in seconds: period of the per-CPU vmstat update work.
    File: /proc/sys/vm/stat_interval. Equivalent: ``sysctl -w vm.stat_interval=10``."""

    id, family, title, key, name = ("kernel.stat_interval", "kernel", "vmstat interval",
                                    "stat_interval", "vm.stat_interval")
    lo, hi = 1, INT_MAX


class NmiWatchdog(Sysctl):
    """kernel.nmi_watchdog: 0 stops the periodic perf NMI on every CPU.
    File: /proc/sys/kernel/nmi_watchdog (absent on kernels/VMs without a hard-lockup detector).
    Equivalent: ``sysctl -w kernel.nmi_watchdog=0``."""

    id, family, title, key, name = ("kernel.nmi_watchdog", "kernel", "NMI watchdog",
                                    "nmi_watchdog", "kernel.nmi_watchdog")
    lo, hi = 0, 1


class SchedRtRuntime(Sysctl):
    """kernel.sched_rt_runtime_us: -1 disables RT throttling (a SCHED_FIFO inference thread is
    no longer stopped for 50 ms each second). A runaway FIFO thread can then own its CPU: use
    with isolated CPUs only. File: /proc/sys/kernel/sched_rt_runtime_us (µs).
    Equivalent: ``sysctl -w kernel.sched_rt_runtime_us=-1``."""

    id, family, title, key, name = ("kernel.sched_rt_runtime_us", "kernel", "RT throttling",
                                    "sched_rt_runtime_us", "kernel.sched_rt_runtime_us")
    lo, hi = -1, INT_MAX

    def _period(self, ctx: TuneContext) -> int | None:
        return ctx.host.read_int(sysctl_path(ctx.host, "kernel.sched_rt_period_us")).value

    def _range(self, ctx: TuneContext) -> str:
        period = self._period(ctx)
        return f"-1, or 0..{'sched_rt_period_us' if period is None else period}"

    def _check(self, ctx: TuneContext, want: int) -> None:
        # -1 (no throttling) or a runtime no longer than the period (the kernel: EINVAL)
        period = self._period(ctx)
        if want < -1 or (period is not None and want > period):
            raise TuneError(f"{self.name} {want} is outside the range the kernel accepts "
                            f"({self._range(ctx)})")


class PerfEventParanoid(Sysctl):
    """kernel.perf_event_paranoid: who may use perf events (2: user space only for
    unprivileged users, 1: kernel too, 0: CPU-wide too, -1: everything; Debian/Ubuntu's 3 or
    4: nothing). The profile's value is a ceiling, as the audit judges it (``<= 1``): a host
    already below it is left as it is, never made stricter.
    File: /proc/sys/kernel/perf_event_paranoid. Equivalent: ``sysctl -w
    kernel.perf_event_paranoid=1``."""

    id, family, title, key, name = ("kernel.perf_event_paranoid", "kernel",
                                    "perf_event_paranoid", "perf_event_paranoid",
                                    "kernel.perf_event_paranoid")
    # the kernel stores any int (proc_dointvec, no range): rollback writes back what was there
    lo, hi = -INT_MAX - 1, INT_MAX

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = profile_int(self.key, self.wanted(ctx))
        self._check(ctx, want)
        r = ctx.host.read_int(self._path(ctx))
        keep = r.ok and r.value is not None and r.value <= want
        return {ctx.host.display(self._path(ctx)): str(r.value if keep else want)}
