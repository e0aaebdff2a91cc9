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
from collectors.layout import LayoutBuilder, TokenLayout
from collectors.parsers import parse_cpulist


def cpu_dir(host: Host, cpu: int):
    return host.sys("devices/system/cpu", f"cpu{cpu}")


def online_cpus(host: Host) -> Reading[list[int]]:
    """The online CPU ids: /sys/devices/system/cpu/online [lscpu], or, where a capture lacks
    it or it cannot be read, the CPUs :func:`collectors.system.online_cpus` derives from
    ``present``/``possible`` and the cpuN directories (watch, tune, run and CpuCollector
    then go on; audit says how they were found). None only when nothing says."""
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
# CpuCollector: the fast sampler's view of the CPUs (used by `hftagent watch`)
# ----------------------------------------------------------------------------------------------

# /proc/stat per-CPU fields the sampler keeps (USER_HZ ticks, counters).
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def fast_proc_stat(data: bytes, cpus: frozenset[int] | None) -> dict[str, float]:
    """/proc/stat bytes → ``cpu.N.<field>_ticks`` counters for the CPUs in ``cpus`` (all when
    None), plus ``cpu.all.ctxt`` (counter) and ``cpu.all.procs_running`` /
    ``cpu.all.procs_blocked`` (gauges). Pure; raises ValueError on a file without cpu lines."""
    out: dict[str, float] = {}
    seen = False
    for line in data.split(b"\n"):
        if line[:3] == b"cpu":
            parts = line.split()
            key = parts[0]
            if key == b"cpu":
                continue
            seen = True
            cpu = int(key[3:])
            if cpus is not None and cpu not in cpus:
                continue
            for name, v in zip(_STAT_FIELDS, parts[1:9]):
                out[f"cpu.{cpu}.{name}_ticks"] = float(v)
        elif line[:5] == b"ctxt ":
            out["cpu.all.ctxt"] = float(line[5:])
        elif line[:14] == b"procs_running ":
            out["cpu.all.procs_running"] = float(line[14:])
        elif line[:14] == b"procs_blocked ":
            out["cpu.all.procs_blocked"] = float(line[14:])
    if not seen:
        raise ValueError("no per-CPU lines in /proc/stat")
    return out


def _drop_intr(data: bytes) -> bytes:
    """/proc/stat without its "intr" line (one count per IRQ number: ~500 tokens here, none
    kept — /proc/interrupts is the per-CPU source)."""
    i = data.find(b"\nintr ")
    if i < 0:
        return data
    j = data.find(b"\n", i + 1)
    return data[:i] + data[j:] if j >= 0 else data[:i]


def proc_stat_layout(data: bytes, cpus: frozenset[int] | None) -> TokenLayout:
    """The :class:`~collectors.layout.TokenLayout` of /proc/stat for the same signals as
    :func:`fast_proc_stat` (which it equals on any read with this layout). Pure."""
    b = LayoutBuilder()
    seen = False
    for line in data.split(b"\n"):
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key[:3] == b"cpu" and key != b"cpu":
            seen = True
            cpu = int(key[3:])
            if cpus is None or cpu in cpus:
                b.name(0, key)
                for i, name in enumerate(_STAT_FIELDS[:len(parts) - 1]):
                    b.value(1 + i, f"cpu.{cpu}.{name}_ticks")
        elif key in (b"ctxt", b"procs_running", b"procs_blocked") and len(parts) == 2:
            b.name(0, key)
            b.value(1, "cpu.all.ctxt" if key == b"ctxt" else f"cpu.all.{key.decode()}")
        b.advance(len(parts))
    if not seen:
        raise ValueError("no per-CPU lines in /proc/stat")
    return b.build()


class CpuCollector:
    """Per-CPU time split and steal, current frequency, thermal throttle counts.

    Sources: /proc/stat (``cpu.N.{user,nice,system,idle,iowait,irq,softirq,steal}_ticks``,
    USER_HZ ticks, counters; ``cpu.all.ctxt`` counter; ``cpu.all.procs_running`` gauge)
    [mpstat -P ALL 1]; /sys/devices/system/cpu/cpuN/cpufreq/scaling_cur_freq (``cpu.N.freq_hz``,
    gauge; kHz in the file) [cpupower monitor]; /sys/devices/system/cpu/cpuN/thermal_throttle/
    {core,package}_throttle_count (``cpu.N.core_throttle_total`` /
    ``cpu.N.package_throttle_total``, counters). No cpufreq driver (VMs) or no thermal_throttle
    directory: those signals are absent and listed in :attr:`unsupported`, never 0.
    """

    name = "cpu"
    replayable = True  # reads only host.open_hot files: the native sampler can feed it
    # 20 Hz: the kernel generates all of /proc/stat (every CPU and the per-IRQ "intr" line)
    # on each read, and its time fields move in USER_HZ (10 ms) ticks anyway.
    period_s = 0.05

    def __init__(self, host: Host, cpus: list[int] | None = None) -> None:
        self.host = host
        r = online_cpus(host)
        self.cpus = sorted(cpus) if cpus else (r.value or [])
        self._filter = frozenset(self.cpus) if cpus else None
        self._stat = None
        self._freq: dict[int, object] = {}
        self._throttle: dict[str, object] = {}
        self._layout: TokenLayout | None = None
        self._plan: tuple | None = None  # native replay: the layout of the whole file
        self._planned = False  # a plan was offered for this row (and, if sample() runs, unused)
        self._throttle_layouts: dict[str, TokenLayout] = {}
        self.unsupported: dict[str, str] = {}

    def available(self):
        from collectors.base import Availability
        try:
            self._open()
        except OSError as exc:
            return Availability.no(f"/proc/stat: {exc.strerror}")
        return Availability.yes()

    def _open(self) -> None:
        if self._stat is not None:
            return
        self._stat = self.host.open_hot(self.host.proc("stat"))
        for c in self.cpus:
            p = cpu_dir(self.host, c) / "cpufreq/scaling_cur_freq"
            # Check first: a failed open_hot leaves a half-built HotFile behind.
            if self.host.exists(p):
                self._freq[c] = self.host.open_hot(p)
            else:
                self.unsupported[f"cpu.{c}.freq_hz"] = "unsupported: no cpufreq driver"
            for kind in ("core", "package"):
                p = cpu_dir(self.host, c) / f"thermal_throttle/{kind}_throttle_count"
                key = f"cpu.{c}.{kind}_throttle_total"
                if self.host.exists(p):
                    self._throttle[key] = self.host.open_hot(p)
                    self._throttle_layouts[key] = TokenLayout(1, (), (), (0,), (key,))
                else:
                    self.unsupported[key] = "unsupported: no thermal_throttle counters"

    def is_counter(self, name: str) -> bool:
        return name.endswith(("_ticks", "_total", ".ctxt"))

    def sample(self) -> dict[str, float | None]:
        self._open()
        raw = self._stat.read()
        data = _drop_intr(raw)
        tok = data.split()
        out: dict[str, float | None] | None = \
            self._layout.values(tok) if self._layout is not None else None
        rebuilt = out is None
        if rebuilt:  # first read, or a CPU came or went: rebuild from these bytes
            self._layout = proc_stat_layout(data, self._filter)
            out = self._layout.values(tok)
        if self._planned:  # the native reader's values did not fit this row: does its layout?
            self._planned = False
            rebuilt = rebuilt or self._plan is None or \
                self._plan[0][1].values(raw.split()) is None  # (the "intr" line grew)
        if rebuilt:
            self._plan = None
            if not self._freq:  # the native reader's layout: the whole file, "intr" too
                whole = proc_stat_layout(raw, self._filter)
                self._plan = ((self._stat, whole),
                              *((hf, self._throttle_layouts[k])
                                for k, hf in self._throttle.items()))
        for c, hf in self._freq.items():
            out[f"cpu.{c}.freq_hz"] = float(int(hf.read()) * 1000)
        for key, hf in self._throttle.items():
            out[key] = float(int(hf.read()))
        return out

    def replay_plan(self) -> tuple | None:
        """The native sampler's shortcut (agent/watch/feed.py): this row is the values of
        the whole /proc/stat's layout (the same keys as :meth:`sample`'s, which drops the
        "intr" line first) and of the throttle counters. None with cpufreq files (their kHz
        are scaled) or before the first sample."""
        self._planned = self._plan is not None
        return self._plan

    def close(self) -> None:
        self._plan = None
        for hf in [self._stat, *self._freq.values(), *self._throttle.values()]:
            if hf is not None:
                hf.close()
        self._stat = None
        self._freq.clear()
        self._throttle.clear()
