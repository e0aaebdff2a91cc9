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

The watch's CPU signals (:func:`files`, :func:`parse`, :func:`layout`; sampled by
agent/watch/sampling/sources/cpu.py): /proc/stat ``cpu.N.{user,nice,system,idle,iowait,irq,
softirq,steal}_ticks`` (USER_HZ ticks, counters), ``cpu.all.ctxt`` (counter),
``cpu.all.procs_running`` / ``procs_blocked`` (gauges) [mpstat -P ALL 1]; scaling_cur_freq
``cpu.N.freq_hz`` (gauge) [cpupower monitor]; thermal_throttle ``cpu.N.core_throttle_total``
/ ``cpu.N.package_throttle_total`` (counters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from collectors.host import ABSENT, Host, Reading
from collectors.layout import LayoutBuilder, TokenLayout, parser_text
from collectors.parsers import ParseError, is_uint, parse_cpulist, parse_proc_stat, parse_uint


def cpu_dir(host: Host, cpu: int):
    return host.sys("devices/system/cpu", f"cpu{cpu}")


def online_cpus(host: Host) -> Reading[list[int]]:
    """The online CPU ids: /sys/devices/system/cpu/online [lscpu], or, where a capture lacks
    it or it cannot be read, the CPUs :func:`collectors.system.online_cpus` derives from
    ``present``/``possible`` and the cpuN directories (watch, tune, run and watch's CPU
    collector then go on; audit says how they were found). None only when nothing says."""
    from collectors.system import online_cpus as derived  # (collectors.system imports us)
    r = derived(host)
    return Reading(r.value.cpus, r.path) if r.value is not None else \
        Reading(None, r.path, r.reason)


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
    """cpufreq state of one CPU; frequencies in Hz (the files hold kHz).

    A value that could not be read is None, with the reason in ``reasons`` under the field's
    name ("min_hz": "absent", "cpuinfo_max_hz": "error: cannot parse: ...")."""

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
    reasons: dict[str, str] = field(default_factory=dict)


def _khz(host: Host, path, reasons: dict[str, str] | None = None,
         key: str = "") -> int | None:
    r = host.read_int(path)
    if r.value is None and reasons is not None:
        reasons[key] = r.reason or "unreadable"
    return None if r.value is None else r.value * 1000


def cpufreq(host: Host, cpu: int) -> CpuFreq | None:
    """cpufreq of one CPU, or None when the CPU has no cpufreq directory (no driver).

    Current kernels make ``cpuN/cpufreq`` a link to ``../cpufreq/policyN`` (one policy per
    CPU with intel_pstate, one per cluster on arm64): it is read through the link."""
    d = cpu_dir(host, cpu) / "cpufreq"
    if not host.exists(d):
        return None
    out = CpuFreq(cpu=cpu)
    why = out.reasons
    gov = host.read(d / "scaling_governor")
    if gov.value is None:
        why["governor"] = gov.reason or "unreadable"
    out.driver = host.read(d / "scaling_driver").value
    out.governor = gov.value.strip() if gov.value is not None else None
    out.available_governors = (host.read(d / "scaling_available_governors").value or "").split()
    out.min_hz = _khz(host, d / "scaling_min_freq", why, "min_hz")
    out.max_hz = _khz(host, d / "scaling_max_freq", why, "max_hz")
    out.cpuinfo_min_hz = _khz(host, d / "cpuinfo_min_freq", why, "cpuinfo_min_hz")
    out.cpuinfo_max_hz = _khz(host, d / "cpuinfo_max_freq", why, "cpuinfo_max_hz")
    out.cur_hz = _khz(host, d / "scaling_cur_freq")
    epp = host.read(d / "energy_performance_preference")
    out.epp = epp.value.strip() if epp.value is not None else None
    if epp.value is None:
        why["epp"] = epp.reason or "unreadable"
    out.available_epp = (host.read(d / "energy_performance_available_preferences").value
                         or "").split()
    epb = host.read_int(cpu_dir(host, cpu) / "power/energy_perf_bias")
    out.epb = epb.value
    if epb.value is None:
        why["epb"] = epb.reason or "unreadable"
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
    """One cpuidle state of a CPU. ``latency_us`` is the exit latency the kernel reports;
    None (and ``disabled`` None) when unreadable, with the reason in ``reason``."""

    cpu: int
    index: int
    name: str
    latency_us: int | None
    disabled: bool | None
    path: str
    reason: str | None = None


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
        dis = host.read_int(sd / "disable")
        lat = host.read_int(sd / "latency")
        why = "; ".join(f"{f} {r.reason}" for f, r in (("latency", lat), ("disable", dis))
                        if r.reason is not None) or None
        out.append(IdleState(cpu, int(idx), (host.read(sd / "name").value or name).strip(),
                             lat.value, None if dis.value is None else dis.value != 0,
                             host.display(sd), why))
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


# ----------------------------------------------------------------------------------------------
# The watch's CPU signals: files(), parse() and layout() (agent/watch/sampling/ samples them)
# ----------------------------------------------------------------------------------------------

# /proc/stat per-CPU fields the watch keeps (USER_HZ ticks, counters).
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_STAT_SCALARS = (b"ctxt", b"procs_running", b"procs_blocked")  # cpu.all.<name>

_MISSING = {"freq_hz": "unsupported: no cpufreq driver",
            "throttle_total": "unsupported: no thermal_throttle counters"}


def files(host: Host, cpus: list[int]) -> dict[str, Path]:
    """The files of the watch's CPU signals, by key: ``stat`` (/proc/stat) and for each of
    ``cpus`` ``cpu.N.freq_hz`` (cpuN/cpufreq/scaling_cur_freq, kHz) and
    ``cpu.N.core_throttle_total`` / ``cpu.N.package_throttle_total``
    (cpuN/thermal_throttle/{core,package}_throttle_count). A path need not exist (a VM has no
    cpufreq driver): :func:`missing_reason` says what that means."""
    out = {"stat": host.proc("stat")}
    for c in cpus:
        out[f"cpu.{c}.freq_hz"] = cpu_dir(host, c) / "cpufreq/scaling_cur_freq"
        for kind in ("core", "package"):
            out[f"cpu.{c}.{kind}_throttle_total"] = \
                cpu_dir(host, c) / f"thermal_throttle/{kind}_throttle_count"
    return out


def missing_reason(key: str) -> str:
    """Why a signal of :func:`files` is absent when its file is ("unsupported: ...")."""
    return _MISSING["freq_hz" if key.endswith(".freq_hz") else "throttle_total"]


def parse_stat(data: bytes, cpus: frozenset[int] | None = None) -> dict[str, float]:
    """/proc/stat bytes → ``cpu.N.<field>_ticks`` (counters, USER_HZ ticks) for the CPUs in
    ``cpus`` (all when None), ``cpu.all.ctxt`` (counter), ``cpu.all.procs_running`` and
    ``cpu.all.procs_blocked`` (gauges). :func:`collectors.parsers.parse_proc_stat` reads
    the file (the audit's parser: what it refuses raises ParseError here). Pure."""
    st = parse_proc_stat(parser_text(data, "/proc/stat"))
    out: dict[str, float] = {}
    for c, fields in st.cpus.items():
        if c < 0 or (cpus is not None and c not in cpus):
            continue
        for name in STAT_FIELDS:
            if name in fields:
                out[f"cpu.{c}.{name}_ticks"] = float(fields[name])
    for key in _STAT_SCALARS:
        v = getattr(st, key.decode())
        if v is not None:
            out[f"cpu.all.{key.decode()}"] = float(v)
    return out


def stat_layout(data: bytes, cpus: frozenset[int] | None = None) -> TokenLayout | None:
    """The token layout of /proc/stat giving :func:`parse_stat`'s values (names: every cpu
    line's, and the kept scalars'); None for a read it cannot describe. Also for the whole
    file with its "intr" line (one count per IRQ number: skipped, as the parser does). Pure."""
    b = LayoutBuilder()
    for line in data.split(b"\n"):
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key.startswith(b"cpu"):
            b.name(0, key)
            if key != b"cpu":
                if not is_uint(key[3:]):
                    return None
                c = int(key[3:])
                if cpus is None or c in cpus:
                    for i, name in enumerate(STAT_FIELDS[:len(parts) - 1]):
                        b.value(1 + i, f"cpu.{c}.{name}_ticks")
        elif key in _STAT_SCALARS and len(parts) >= 2:
            b.name(0, key)
            b.value(1, f"cpu.all.{key.decode()}")
        b.advance(len(parts))
    return b.build(data)


def parse_freq(data: bytes, key: str) -> dict[str, float]:
    """cpufreq/scaling_cur_freq bytes (one kHz count) → ``{key: Hz}`` (a gauge). Pure."""
    tok = data.split()
    if len(tok) != 1:
        raise ParseError(f"bad {key} file {data[:24]!r}")
    return {key: float(parse_uint(tok[0], key) * 1000)}


def parse_count(data: bytes, key: str) -> dict[str, float]:
    """A file holding one counter (thermal_throttle/*_throttle_count) → ``{key: n}``. Pure."""
    tok = data.split()
    if len(tok) != 1:
        raise ParseError(f"bad {key} file {data[:24]!r}")
    return {key: float(parse_uint(tok[0], key))}


def count_layout(data: bytes, key: str) -> TokenLayout | None:
    """The layout of a one-counter file (:func:`parse_count`). Pure."""
    return TokenLayout.of(data, (), (), (0,), (key,)) if len(data.split()) == 1 else None


def parse(reads: dict[str, bytes], cpus: frozenset[int] | None = None) -> dict[str, float]:
    """The CPU signals of one read of :func:`files` (``{key: bytes}``). Pure."""
    out: dict[str, float] = {}
    for key, data in reads.items():
        out.update(parse_stat(data, cpus) if key == "stat" else
                   parse_freq(data, key) if key.endswith(".freq_hz") else parse_count(data, key))
    return out


def layout(key: str, data: bytes, cpus: frozenset[int] | None = None) -> TokenLayout | None:
    """The token layout of one file of :func:`files`; None for the cpufreq files (their kHz
    are scaled to Hz, which a layout does not do). Pure."""
    if key == "stat":
        return stat_layout(data, cpus)
    return None if key.endswith(".freq_hz") else count_layout(data, key)
