"""Per-CPU PM QoS resume latency of the target CPUs.

The cpuidle governor (menu, teo, haltpoll) never picks an idle state whose exit latency
exceeds a CPU's resume-latency limit, so a limit on the inference CPUs keeps them in shallow
states without touching the others (unlike /dev/cpu_dma_latency, which holds every CPU, or
cpuidle's per-state ``disable``, which is global per state).
"""

from __future__ import annotations

from tuning.tunables.base import FileTunable, TuneContext, TuneError, cpu_target_index

S32_MAX = 2**31 - 1


def kernel_value(us: int) -> str:
    """The profile's µs to the file's spelling: 0 (no latency at all) is "n/a"."""
    return "n/a" if us == 0 else str(us)


class PmQosResumeLatency(FileTunable):
    """Each target CPU's PM QoS resume-latency limit, from the profile's
    ``pm_qos_resume_latency_us`` (µs).

    File: /sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us (Linux ≥ 4.14 for CPUs,
    CONFIG_PM). The kernel spells it oddly (drivers/base/power/sysfs.c): ``0`` means *no
    constraint* (the default), ``n/a`` means *no latency at all* (only polling), N means at
    most N µs. The profile's value is the limit in µs, and its 0 means polling only, written
    ``n/a`` — which keeps the CPU busy-polling while idle (power, and on a VM a vCPU the host
    sees as busy). Journalled: rollback writes the original back, "0" included.
    Equivalent: ``echo 10 > /sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us``.
    """

    id, family, title = "wakeup.pm_qos_resume_latency", "wakeup", "Per-CPU PM QoS resume latency"
    key, scope = "pm_qos_resume_latency_us", "cpu"
    patterns = ("/sys/devices/system/cpu/cpu[0-9]*/power/pm_qos_resume_latency_us",)

    def _path(self, ctx: TuneContext, cpu: int):
        return ctx.host.sys(f"devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us")

    def available(self, ctx: TuneContext) -> str | None:
        if not ctx.cpus:
            return "no target CPUs: pass --cpus (or isolate CPUs with isolcpus=)"
        missing = [c for c in ctx.cpus if not ctx.host.exists(self._path(ctx, c))]
        if missing:
            return ("unsupported: no power/pm_qos_resume_latency_us for CPU "
                    f"{','.join(map(str, missing))} (a kernel without CPU PM QoS, CONFIG_PM)")
        return None

    def valid(self, value: str) -> bool:
        return value == "n/a" or (value.isdigit() and int(value) < S32_MAX)

    def normalise(self, text: str) -> str:
        t = text.strip()
        if t == "n/a":
            return t
        return str(int(t))

    def index_of(self, target: str) -> int | None:
        return cpu_target_index(target)

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = self.wanted(ctx)
        if not isinstance(want, int) or isinstance(want, bool) or not 0 <= want < S32_MAX:
            raise TuneError(f"pm_qos_resume_latency_us must be 0..{S32_MAX - 1} µs, got "
                            f"{want!r}")
        return {ctx.host.display(self._path(ctx, c)): kernel_value(want) for c in ctx.cpus}

    def detail(self, ctx: TuneContext, target: str) -> str:
        return "n/a = polling only (no idle state)" if self.wanted(ctx) == 0 else ""
