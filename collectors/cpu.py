"""CPU topology, frequency scaling and idle states, read through a :class:`Host`.

Sources (equivalent commands in brackets):
- /sys/devices/system/cpu/{online,present,isolated,nohz_full}     [lscpu, cat]
- /sys/devices/system/cpu/cpuN/cpufreq/*  (scaling_governor, scaling_min_freq,
  cpuinfo_max_freq, scaling_available_governors, energy_performance_preference,
  scaling_cur_freq; kHz in the files, Hz in our values)                [cpupower frequency-info]
- /sys/devices/system/cpu/intel_pstate/{no_turbo,status,min_perf_pct},
  /sys/devices/system/cpu/cpufreq/boost                                [cpupower frequency-info]
- /sys/devices/system/cpu/cpuN/cpuidle/stateK/{name,latency,disable}  [cpupower idle-info]
- /sys/devices/system/cpu/cpuN/power/energy_perf_bias                 [x86_energy_perf_policy]
- /sys/devices/system/cpu/smt/{control,active}, topology/thread_siblings_list

A missing cpufreq directory (VMs, containers) is "unsupported: no cpufreq driver", never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors.host import ABSENT, Host, Reading
from collectors.parsers import parse_cpulist


def cpu_dir(host: Host, cpu: int):
    return host.sys("devices/system/cpu", f"cpu{cpu}")


def online_cpus(host: Host) -> Reading[list[int]]:
    """/sys/devices/system/cpu/online as a list of CPU ids."""
    return host.read(host.sys("devices/system/cpu/online")).map(parse_cpulist)


def isolated_cpus(host: Host) -> list[int]:
    """/sys/devices/system/cpu/isolated (isolcpus= domain isolation); [] when absent."""
    r = host.read(host.sys("devices/system/cpu/isolated")).map(parse_cpulist)
    return r.value or []


def nohz_full_cpus(host: Host) -> list[int]:
    r = host.read(host.sys("devices/system/cpu/nohz_full")).map(
        lambda s: [] if s.strip() in ("", "(null)") else parse_cpulist(s))
    return r.value or []


@dataclass
class CpuFreq:
    """cpufreq state of one CPU; frequencies in Hz (the files hold kHz)."""

    cpu: int
    driver: str | None = None
    governor: str | None = None
    available_governors: list[str] = field(default_factory=list)
    min_hz: int | None = None
    max_hz: int | None = None
    cpuinfo_min_hz: int | None = None
    cpuinfo_max_hz: int | None = None
    cur_hz: int | None = None
    epp: str | None = None
    available_epp: list[str] = field(default_factory=list)
    epb: int | None = None
    paths: dict[str, str] = field(default_factory=dict)


def _khz(host: Host, path) -> int | None:
    r = host.read_int(path)
    return None if r.value is None else r.value * 1000


def cpufreq(host: Host, cpu: int) -> CpuFreq | None:
    """cpufreq of one CPU, or None when the CPU has no cpufreq directory (no driver)."""
    d = cpu_dir(host, cpu) / "cpufreq"
    if not host.exists(d):
        return None
    gov = host.read(d / "scaling_governor")
    out = CpuFreq(cpu=cpu)
    out.driver = host.read(d / "scaling_driver").value
    out.governor = gov.value
    out.available_governors = (host.read(d / "scaling_available_governors").value or "").split()
    out.min_hz = _khz(host, d / "scaling_min_freq")
    out.max_hz = _khz(host, d / "scaling_max_freq")
    out.cpuinfo_min_hz = _khz(host, d / "cpuinfo_min_freq")
    out.cpuinfo_max_hz = _khz(host, d / "cpuinfo_max_freq")
    out.cur_hz = _khz(host, d / "scaling_cur_freq")
    out.epp = host.read(d / "energy_performance_preference").value
    out.available_epp = (host.read(d / "energy_performance_available_preferences").value
                         or "").split()
    out.epb = host.read_int(cpu_dir(host, cpu) / "power/energy_perf_bias").value
    out.paths = {"governor": host.display(d / "scaling_governor"),
                 "min": host.display(d / "scaling_min_freq"),
                 "epp": host.display(d / "energy_performance_preference")}
    return out


@dataclass
class Turbo:
    """Turbo state. ``enabled`` None when neither interface exists."""

    enabled: bool | None
    interface: str | None  # "intel_pstate/no_turbo" | "cpufreq/boost" | None
    path: str | None
    pstate_status: str | None = None
    min_perf_pct: int | None = None


def turbo(host: Host) -> Turbo:
    """intel_pstate's no_turbo (inverted: 1 = turbo off) or the generic cpufreq/boost."""
    base = host.sys("devices/system/cpu")
    nt = host.read_int(base / "intel_pstate/no_turbo")
    status = host.read(base / "intel_pstate/status").value
    mpp = host.read_int(base / "intel_pstate/min_perf_pct").value
    if nt.ok:
        return Turbo(nt.value == 0, "intel_pstate/no_turbo", nt.path, status, mpp)
    boost = host.read_int(base / "cpufreq/boost")
    if boost.ok:
        return Turbo(boost.value == 1, "cpufreq/boost", boost.path, status, mpp)
    return Turbo(None, None, None, status, mpp)


@dataclass(frozen=True)
class IdleState:
    """One cpuidle state of a CPU. ``latency_us`` is the exit latency the kernel reports."""

    cpu: int
    index: int
    name: str
    latency_us: int | None
    disabled: bool | None
    path: str


def cpuidle_states(host: Host, cpu: int) -> list[IdleState] | None:
    """cpuidle states of one CPU; None when the CPU has no cpuidle directory."""
    d = cpu_dir(host, cpu) / "cpuidle"
    if not host.exists(d):
        return None
    out = []
    for name, sd in host.glob_dirs(d, "state"):
        idx = name[5:]
        if not idx.isdigit():
            continue
        dis = host.read_int(sd / "disable").value
        out.append(IdleState(cpu, int(idx), host.read(sd / "name").value or name,
                             host.read_int(sd / "latency").value,
                             None if dis is None else dis != 0, host.display(sd)))
    return sorted(out, key=lambda s: s.index)


def cpuidle_driver(host: Host) -> Reading[str]:
    return host.read(host.sys("devices/system/cpu/cpuidle/current_driver"))


@dataclass
class Smt:
    control: str | None  # on | off | forceoff | notsupported | notimplemented
    active: bool | None
    siblings: dict[int, list[int]]
    path: str


def smt(host: Host, cpus: list[int]) -> Smt:
    base = host.sys("devices/system/cpu/smt")
    control = host.read(base / "control").value
    active = host.read_int(base / "active").value
    sib: dict[int, list[int]] = {}
    for c in cpus:
        r = host.read(cpu_dir(host, c) / "topology/thread_siblings_list").map(parse_cpulist)
        if r.ok:
            sib[c] = r.value
    if active is None and sib:
        active = any(len(v) > 1 for v in sib.values())
    return Smt(control, None if active is None else bool(active), sib,
               host.display(base / "control"))


def cpu_model(host: Host) -> str | None:
    """The CPU model name from /proc/cpuinfo (cheap; py-cpuinfo stays off the critical path)."""
    r = host.read(host.proc("cpuinfo"))
    if not r.ok:
        return None
    for line in r.value.splitlines():
        if line.startswith(("model name", "Processor", "cpu model")):
            return line.partition(":")[2].strip()
    return None


def cpuinfo_flags(host: Host) -> set[str]:
    r = host.read(host.proc("cpuinfo"))
    for line in (r.value or "").splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def absent(r: Reading) -> bool:
    return r.reason == ABSENT
