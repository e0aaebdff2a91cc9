"""CPU frequency and idle tunables. Per-CPU knobs are applied to every online CPU.

Units: the cpufreq files hold kHz and the values here stay in the files' unit (kHz) because
they are written back verbatim; cpuidle latencies are µs as the kernel reports them.
"""

from __future__ import annotations

from collectors.cpu import cpu_dir, cpufreq, cpuidle_states
from collectors.host import Host
from tuning.tunables.base import (
    FileTunable,
    TuneContext,
    TuneError,
    cpu_target_index,
    int_in,
    is_word,
    resolve,
)

CPU = "/sys/devices/system/cpu"


def _shown(host: Host, path) -> str:
    return host.display(path)


def _no_cpufreq(ctx: TuneContext) -> str | None:
    if not any(cpufreq(ctx.host, c) for c in ctx.online):
        return "unsupported: no cpufreq driver"
    return None


class _PerCpu(FileTunable):
    scope = "cpu"
    family = "cpu"

    def index_of(self, target: str) -> int | None:
        return cpu_target_index(target)


class Governor(_PerCpu):
    """CPU frequency governor, per CPU.

    File: /sys/devices/system/cpu/cpuN/cpufreq/scaling_governor (a word). Offered values:
    .../scaling_available_governors; a profile value not offered by every CPU is refused.
    Missing cpufreq directory (VMs, containers) = unavailable "no cpufreq driver".
    Equivalent: ``cpupower -c all frequency-set -g performance``.
    Ordered first: on intel_pstate, changing the governor resets EPP and the min/max limits.
    """

    id, title, key = "cpu.governor", "CPU frequency governor", "governor"
    patterns = (f"{CPU}/cpu[0-9]*/cpufreq/scaling_governor",)

    def valid(self, value: str) -> bool:
        return is_word(value)

    def available(self, ctx: TuneContext) -> str | None:
        return _no_cpufreq(ctx)

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        gov = self.wanted(ctx)
        out = {}
        for c in ctx.online:
            f = cpufreq(ctx.host, c)
            if f is None:
                continue
            if f.available_governors and gov not in f.available_governors:
                raise TuneError(f"governor {gov!r} is not offered by cpu{c} "
                                f"(scaling_available_governors: {' '.join(f.available_governors)})")
            out[f.paths["governor"]] = str(gov)
        return out


class MinFreq(_PerCpu):
    """Frequency floor: scaling_min_freq raised to the CPU's current scaling_max_freq.

    File: /sys/devices/system/cpu/cpuN/cpufreq/scaling_min_freq (kHz). Profile ``min_freq =
    "max"``. Equivalent: ``cpupower -c all frequency-set -d <max>``. Ordered after turbo: turning
    turbo off lowers scaling_max_freq on intel_pstate, and apply computes each tunable's desired
    values again right before its writes, so "max" is the maximum after that write (a floor
    above it would be clamped by the kernel and never hold).
    """

    id, title, key = "cpu.min_freq", "cpufreq minimum frequency", "min_freq"
    patterns = (f"{CPU}/cpu[0-9]*/cpufreq/scaling_min_freq",)

    def valid(self, value: str) -> bool:
        return int_in(value, 0, None)

    def available(self, ctx: TuneContext) -> str | None:
        return _no_cpufreq(ctx)

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        out = {}
        for c in ctx.online:
            d = cpu_dir(ctx.host, c) / "cpufreq"
            mx = ctx.host.read_int(d / "scaling_max_freq").value
            if mx is None or not ctx.host.exists(d / "scaling_min_freq"):
                continue
            out[_shown(ctx.host, d / "scaling_min_freq")] = str(mx)
        return out


class PstateMinPerf(FileTunable):
    """intel_pstate global performance floor, percent of max (turbo included).

    File: /sys/devices/system/cpu/intel_pstate/min_perf_pct. Set to 100 when the profile asks
    ``min_freq = "max"``. Absent without intel_pstate. Equivalent: ``echo 100 > ...``.
    """

    id, family, title, key = "cpu.pstate_min_perf_pct", "cpu", "intel_pstate min_perf_pct", \
        "min_freq"
    patterns = (f"{CPU}/intel_pstate/min_perf_pct",)
    audit_ids = ("cpu.min_freq",)  # the floor intel_pstate keeps under scaling_min_freq

    def valid(self, value: str) -> bool:
        return int_in(value, 0, 100)

    def _path(self, host: Host):
        return host.sys("devices/system/cpu/intel_pstate/min_perf_pct")

    def available(self, ctx: TuneContext) -> str | None:
        return None if ctx.host.exists(self._path(ctx.host)) else "unsupported: no intel_pstate"

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        return {_shown(ctx.host, self._path(ctx.host)): "100"}


class Turbo(FileTunable):
    """Turbo / boost, per profile policy ``turbo = "on" | "off"``.

    Files: /sys/devices/system/cpu/intel_pstate/no_turbo (inverted: 1 = turbo off) when
    intel_pstate drives the CPUs, else /sys/devices/system/cpu/cpufreq/boost (1 = boost on).
    Equivalent: ``cpupower set --turbo-boost 0``. ``bench`` turns it off for repeatability.
    """

    id, family, title, key = "cpu.turbo", "cpu", "Turbo / boost", "turbo"
    patterns = (f"{CPU}/intel_pstate/no_turbo", f"{CPU}/cpufreq/boost")

    def valid(self, value: str) -> bool:
        return value in ("0", "1")

    def _file(self, host: Host):
        base = host.sys("devices/system/cpu")
        for rel, on in (("intel_pstate/no_turbo", "0"), ("cpufreq/boost", "1")):
            if host.exists(base / rel):
                return base / rel, on
        return None, None

    def available(self, ctx: TuneContext) -> str | None:
        path, _ = self._file(ctx.host)
        return None if path else "unsupported: neither intel_pstate/no_turbo nor cpufreq/boost"

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        path, on = self._file(ctx.host)
        want_on = self.wanted(ctx) == "on"
        off = "1" if on == "0" else "0"
        return {_shown(ctx.host, path): on if want_on else off}


class Epp(_PerCpu):
    """HWP energy-performance preference, per CPU.

    File: /sys/devices/system/cpu/cpuN/cpufreq/energy_performance_preference; offered values in
    .../energy_performance_available_preferences. Equivalent: ``x86_energy_perf_policy``.
    Ordered after the governor: intel_pstate pins EPP to "performance" under the performance
    governor and refuses other values with EBUSY (rollback retries such entries last).
    """

    id, title, key = "cpu.epp", "Energy-performance preference (EPP)", "epp"
    patterns = (f"{CPU}/cpu[0-9]*/cpufreq/energy_performance_preference",)

    def valid(self, value: str) -> bool:
        return is_word(value) or int_in(value, 0, 255)  # a name, or a raw HWP EPP 0..255

    def available(self, ctx: TuneContext) -> str | None:
        for c in ctx.online:
            f = cpufreq(ctx.host, c)
            if f and f.epp is not None:
                return None
        return "unsupported: no energy_performance_preference (no HWP)"

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = str(self.wanted(ctx))
        out = {}
        for c in ctx.online:
            f = cpufreq(ctx.host, c)
            if f is None or f.epp is None:
                continue
            if f.available_epp and want not in f.available_epp:
                raise TuneError(f"EPP {want!r} is not offered by cpu{c} "
                                f"(available: {' '.join(f.available_epp)})")
            out[f.paths["epp"]] = want
        return out


# EPB is 0 (performance) .. 15 (power saving); the names the kernel documents.
EPB_VALUES = {"performance": 0, "balance_performance": 4, "balance-performance": 4,
              "normal": 6, "default": 6, "balance_power": 8, "balance-power": 8, "power": 15}


class Epb(_PerCpu):
    """Energy-performance bias (pre-HWP and HWP hint), per CPU, 0..15.

    File: /sys/devices/system/cpu/cpuN/power/energy_perf_bias. Profile ``epp = "performance"``
    maps to 0. Equivalent: ``x86_energy_perf_policy -c all performance``.
    """

    id, title, key = "cpu.epb", "Energy-performance bias (EPB)", "epp"
    patterns = (f"{CPU}/cpu[0-9]*/power/energy_perf_bias",)

    def valid(self, value: str) -> bool:
        return int_in(value, 0, 15)

    def _path(self, ctx: TuneContext, c: int):
        return cpu_dir(ctx.host, c) / "power/energy_perf_bias"

    def available(self, ctx: TuneContext) -> str | None:
        if any(ctx.host.exists(self._path(ctx, c)) for c in ctx.online):
            return None
        return "unsupported: no energy_perf_bias"

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        want = str(self.wanted(ctx))
        if want not in EPB_VALUES:
            raise TuneError(f"epp {want!r} has no energy_perf_bias equivalent "
                            f"({', '.join(sorted(EPB_VALUES))})")
        return {_shown(ctx.host, self._path(ctx, c)): str(EPB_VALUES[want])
                for c in ctx.online if ctx.host.exists(self._path(ctx, c))}


class CpuIdle(_PerCpu):
    """Deep C-states disabled by exit-latency budget, per CPU and state.

    Files: /sys/devices/system/cpu/cpuN/cpuidle/stateK/{name,latency,disable}. Every state
    whose exit latency (µs) exceeds ``cstate_max_exit_latency_us`` is disabled (disable=1);
    states within budget are left as they are. States are chosen by name and latency, never by
    a fixed index (indices differ between intel_idle, acpi_idle and haltpoll). POLL is never
    disabled. Equivalent: ``cpupower -c all idle-set -D <latency_us>``.
    """

    id, title, key = "cpu.cstates", "Idle states over the exit-latency budget", \
        "cstate_max_exit_latency_us"
    patterns = (f"{CPU}/cpu[0-9]*/cpuidle/state[0-9]*/disable",)

    def valid(self, value: str) -> bool:
        return value in ("0", "1")

    def available(self, ctx: TuneContext) -> str | None:
        if any(cpuidle_states(ctx.host, c) for c in ctx.online):
            return None
        return "unsupported: no cpuidle states"

    def _states(self, ctx: TuneContext):
        for c in ctx.online:
            yield from cpuidle_states(ctx.host, c) or []

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        budget = int(self.wanted(ctx))
        return {f"{s.path}/disable": "1" for s in self._states(ctx)
                if s.name != "POLL" and s.latency_us is not None and s.latency_us > budget}

    def detail(self, ctx: TuneContext, target: str) -> str:
        d = target.rsplit("/", 1)[0]
        p = resolve(ctx.host, d)
        name = ctx.host.read(p / "name").value
        lat = ctx.host.read(p / "latency").value
        return f"{name} (exit latency {lat} µs)"
