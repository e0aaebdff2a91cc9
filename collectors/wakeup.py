"""How fast an idle CPU answers: cpuidle driver and governor, guest halt-polling, PM QoS.

Files:
- /sys/devices/system/cpu/cpuidle/{current_driver,current_governor} (``current_governor_ro``
  on kernels without a writable governor): ``none`` or no directory means no cpuidle driver —
  the architecture's default idle (:data:`DEFAULT_IDLE`: HLT/MWAIT C1 on x86, WFI on arm64
  and RISC-V, ...), which in a VM is a halt the hypervisor must wake;
- /proc/sys/kernel/arch (``uname -m``, Linux >= 6.0), else /proc/cpuinfo's keys: which
  architecture's idle that is (:func:`arch`);
- /sys/module/haltpoll/parameters/guest_halt_poll_ns: how long the ``haltpoll`` cpuidle
  driver (KVM guests, Linux ≥ 5.4) polls before it halts; 0 = halt at once;
- /sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us: the per-CPU PM QoS limit,
  spelled "0" (no constraint), "n/a" (no latency at all) or N µs;
- /dev/cpu_dma_latency: the system-wide CPU latency request. Reading it gives the effective
  limit (a binary s32, µs; 2000000000 = no request). Opening it adds a request at that
  no-constraint default until it is closed, which changes nothing. Only root may open it;
- /proc/PID/fd/*: who holds /dev/cpu_dma_latency open (each open descriptor is a request).

Equivalents: ``cpupower idle-info``, ``cat /sys/module/haltpoll/parameters/*``,
``ls -l /proc/*/fd | grep cpu_dma_latency``.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from dataclasses import dataclass, field

from collectors.host import Host, Reading

PM_QOS_DEVICE = "cpu_dma_latency"
NO_REQUEST_US = 2_000_000_000  # PM_QOS_CPU_LATENCY_DEFAULT_VALUE: nobody asked for anything
SPINNER_COMM = "hftkeepawake"  # tuning/keepawake.c, started by `hftagent run --keep-awake`
MAX_FDS = 100_000  # descriptors looked at for holders: bounded, a report says when it stopped


# What an idle CPU with no cpuidle driver runs (the architecture's arch_cpu_idle()), by
# architecture family, for a person: x86 default_idle/mwait_idle; arm64 cpu_do_idle; RISC-V
# wait_for_interrupt; POWER ppc_md.power_save (an LPAR cedes the CPU to the hypervisor,
# pseries_lpar_idle); s390 an enabled wait PSW (arch/s390/kernel/idle.c).
DEFAULT_IDLE = {
    "x86": "HLT/MWAIT",
    "arm": "WFI",
    "riscv": "WFI",
    "powerpc": "the platform's power_save: snooze/stop, or an LPAR's cede to the hypervisor",
    "s390": "an enabled wait PSW, which gives the CPU back to LPAR or z/VM",
    "loongarch": "IDLE",
}
UNKNOWN_IDLE = "the architecture's default idle"

# ``uname -m`` values, first match by prefix, to a family of DEFAULT_IDLE
_MACHINES = (("x86_64", "x86"), ("i386", "x86"), ("i486", "x86"), ("i586", "x86"),
             ("i686", "x86"), ("aarch64", "arm"), ("arm", "arm"), ("riscv", "riscv"),
             ("ppc", "powerpc"), ("s390", "s390"), ("loongarch", "loongarch"))


def arch_from_machine(machine: str) -> str | None:
    """``uname -m`` ("x86_64", "aarch64", "ppc64le", "s390x", "riscv64") to its family."""
    m = machine.strip().lower()
    return next((fam for pre, fam in _MACHINES if m.startswith(pre)), None)


def arch_from_cpuinfo(text: str) -> str | None:
    """The family from /proc/cpuinfo's keys, which each architecture spells its own way
    (arch/*/kernel/cpuinfo.c, setup.c): x86 "flags" + "vendor_id"; arm/arm64 "CPU
    implementer"; RISC-V "isa"; POWER "cpu" + "timebase"; s390 "vendor_id : IBM/S390". None
    when it says nothing known."""
    keys: dict[str, str] = {}
    for ln in text.splitlines():
        k, sep, v = ln.partition(":")
        if sep:
            keys.setdefault(k.strip().lower(), v.strip())
    if keys.get("vendor_id", "").upper().startswith("IBM/S390"):
        return "s390"
    if "flags" in keys and "vendor_id" in keys:
        return "x86"
    if "cpu implementer" in keys:
        return "arm"
    if "isa" in keys and keys["isa"].lower().startswith("rv"):
        return "riscv"
    if "timebase" in keys and "cpu" in keys:
        return "powerpc"
    return None


def arch(host: Host) -> Reading[str]:
    """The host's architecture family (a key of :data:`DEFAULT_IDLE`, or None with a reason):
    kernel.arch, else /proc/cpuinfo; the live host without either, ``uname -m``."""
    r = host.read(host.proc("sys/kernel/arch"))
    fam = arch_from_machine(r.value) if r.ok else None
    if fam is not None:
        return Reading(fam, r.path)
    ci = host.read(host.proc("cpuinfo"))
    fam = arch_from_cpuinfo(ci.value) if ci.ok else None
    if fam is not None:
        return Reading(fam, ci.path)
    if host.live:
        fam = arch_from_machine(os.uname().machine)
        if fam is not None:
            return Reading(fam, "uname -m")
    return Reading(None, ci.path, "unsupported: neither kernel.arch nor cpuinfo names a known "
                   "architecture")


def default_idle(host: Host) -> str:
    """What an idle CPU of this host runs without a cpuidle driver, in words."""
    r = arch(host)
    return DEFAULT_IDLE.get(r.value, UNKNOWN_IDLE) if r.ok else UNKNOWN_IDLE


def cpuidle_dir(host: Host):
    return host.sys("devices/system/cpu/cpuidle")


def cpuidle_governor(host: Host) -> Reading[str]:
    d = cpuidle_dir(host)
    r = host.read(d / "current_governor")
    return r if r.ok else host.read(d / "current_governor_ro")


def halt_poll_ns_path(host: Host):
    return host.sys("module/haltpoll/parameters/guest_halt_poll_ns")


def halt_poll_ns(host: Host) -> Reading[int]:
    """guest_halt_poll_ns of the haltpoll driver; absent when the module is not there."""
    return host.read_int(halt_poll_ns_path(host))


def resume_latency_path(host: Host, cpu: int):
    return host.sys(f"devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us")


def resume_latency(host: Host, cpu: int) -> Reading[str]:
    """A CPU's pm_qos_resume_latency_us as the kernel spells it ("0", "n/a", "10")."""
    def parse(text: str) -> str:
        t = text.strip()
        if t == "n/a":
            return t
        return str(int(t))
    return host.read(resume_latency_path(host, cpu)).map(parse)


def resume_latency_us(value: str) -> float:
    """The limit in µs: "n/a" = 0 (no latency at all), "0" = no constraint (infinite)."""
    if value == "n/a":
        return 0.0
    v = int(value)
    return float("inf") if v == 0 else float(v)


@dataclass
class Holders:
    """Processes holding /dev/cpu_dma_latency open: (pid, comm) each, and how many processes
    could not be looked at (another user's fds need root)."""

    held_by: list[tuple[int, str]] = field(default_factory=list)
    unreadable: int = 0
    scanned_fds: int = 0
    truncated: bool = False


def pm_qos_holders(host: Host) -> Holders:
    """Who holds the CPU latency request device open. Meaningful on the live host only."""
    out = Holders()
    target = str(host.root / "dev" / PM_QOS_DEVICE)
    for pid in host.pids():
        fd_dir = host.proc(pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            out.unreadable += 1
            continue
        except OSError:
            continue  # exited
        for fd in fds:
            if out.scanned_fds >= MAX_FDS:
                out.truncated = True
                return out
            out.scanned_fds += 1
            link = host.readlink(fd_dir / fd)
            if link == target:
                comm = host.read(host.proc(pid, "comm")).value
                out.held_by.append((pid, (comm or "?").strip()))
                break
    return out


def cpu_dma_latency(host: Host) -> Reading[int]:
    """The effective system-wide CPU latency limit in µs (live host, root)."""
    path = host.root / "dev" / PM_QOS_DEVICE
    shown = f"/dev/{PM_QOS_DEVICE}"
    if not host.live:
        return Reading(None, shown, "unsupported: a captured tree has no PM QoS device")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        return Reading(None, shown, "permission")
    except FileNotFoundError:
        return Reading(None, shown, "absent")
    except OSError as exc:
        return Reading(None, shown, f"error: {exc.strerror or exc}")
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            return Reading(None, shown, "error: not a character device")
        data = os.read(fd, 4)
    except OSError as exc:
        return Reading(None, shown, f"error: {os.strerror(exc.errno or errno.EIO)}")
    finally:
        os.close(fd)
    if len(data) != 4:
        return Reading(None, shown, f"error: read {len(data)} bytes, not 4")
    return Reading(struct.unpack("=i", data)[0], shown)


def keepawake_spinners(host: Host) -> dict[int, list[int]]:
    """{CPU: [pid]} of running `hftagent run --keep-awake` spinners (pinned to one CPU each)."""
    from collectors.parsers import parse_cpulist, parse_kv

    out: dict[int, list[int]] = {}
    for pid in host.pids():
        comm = host.read(host.proc(pid, "comm")).value
        if not comm or not comm.startswith(SPINNER_COMM):
            continue
        st = host.read(host.proc(pid, "status"))
        if not st.ok:
            continue
        kv = parse_kv(st.value, ":")
        if kv.get("State", "").startswith(("Z", "X")):
            continue
        try:
            cpus = parse_cpulist(kv.get("Cpus_allowed_list", ""))
        except ValueError:
            continue
        if len(cpus) == 1:
            out.setdefault(cpus[0], []).append(pid)
    return out
