"""Writable copies of fixture trees, a small synthetic bare-metal tree, and a kernel simulation.

Tests NEVER write the real /proc or /sys: every tuning test runs on a copy made here with
``--root``/``Host(root=copy)``.

:class:`KernelSim` stands in for the kernel's side of a write on a tree copy, so a round trip
can be compared byte for byte with the pristine copy:
- a sysfs selector ("always [madvise] never") is rewritten with the new bracket, and a word it
  does not offer is EINVAL, as the kernel does;
- smp_affinity_list keeps smp_affinity (the mask) in step, formatted at the file's width;
- default_smp_affinity is printed at the file's width ("ffff" for 16 CPUs);
- an attribute without write bits is EACCES even for root (kernfs has no store() for it);
- intel_pstate/no_turbo is coupled to every CPU's limits as intel_pstate does it: turbo off
  lowers scaling_max_freq to base_frequency (and clamps scaling_min_freq under it), turbo on
  raises it back to cpuinfo_max_freq; a scaling_min_freq above scaling_max_freq reads back as
  scaling_max_freq (the policy's effective floor);
- ``fail={suffix: errno}`` injects EIO/EPERM/EINVAL/EBUSY for targets ending in ``suffix``;
- ``fail_after={suffix: errno}`` changes the value and *then* fails, as the kernel does when a
  store() takes the bytes but a short write is reported (EIO), or ``systemctl stop`` exits
  non-zero although the unit stopped;
- ``after_write`` is called after every successful write (fault injection counts writes).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from collectors.parsers import format_cpulist, format_cpumask, parse_cpulist, parse_cpumask

FIXTURES = Path(__file__).parent / "fixtures"


def copy_fixture(name: str, dst: Path) -> Path:
    """Copy tests/fixtures/<name> to ``dst`` (a fresh directory) and return it."""
    shutil.copytree(FIXTURES / name, dst, symlinks=True)
    return dst


def snapshot(root: Path, exclude: tuple[str, ...] = ("run",)) -> dict[str, str]:
    """{relative path: sha256 of the bytes} of every regular file under ``root``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir.split(os.sep)[0] in exclude:
            dirnames[:] = []
            continue
        for f in filenames:
            p = Path(dirpath) / f
            if p.is_symlink() or not p.is_file():
                continue
            out[os.path.relpath(p, root)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _mask_at_width(cpus: list[int], like: str) -> str:
    """Format a CPU mask with the same word count and first-word width as ``like``."""
    words = format_cpumask(cpus).split(",")
    old = like.strip().split(",")
    while len(words) < len(old):
        words.insert(0, "00000000")
    first = words[0][-len(old[0]):] if len(words) == len(old) else words[0]
    return ",".join([first] + words[1:])


class KernelSim:
    """A Writer that behaves like the kernel's store() for the files tuning writes."""

    def __init__(self, fail: dict[str, int] | None = None,
                 after_write: Callable[[Path], None] | None = None,
                 fail_after: dict[str, int] | None = None) -> None:
        self.fail = dict(fail or {})
        self.fail_after = dict(fail_after or {})
        self.after_write = after_write
        self.writes: list[tuple[str, str]] = []

    def write(self, path: Path, text: str) -> None:
        for suffix, err in self.fail.items():
            if str(path).endswith(suffix):
                raise OSError(err, os.strerror(err), str(path))
        st = os.stat(path)  # FileNotFoundError like the kernel's ENOENT
        if not st.st_mode & 0o222:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        cur = path.read_text()
        value = text.strip()
        name = path.name
        if "[" in cur:
            options = [w.strip("[]") for w in cur.split()]
            if value not in options:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
            new = " ".join(f"[{w}]" if w == value else w for w in options) + "\n"
        elif name == "smp_affinity_list":
            try:
                cpus = parse_cpulist(value)
            except ValueError:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path)) from None
            new = format_cpulist(cpus) + "\n"
            mask = path.with_name("smp_affinity")
            if mask.exists():
                mask.write_text(_mask_at_width(cpus, mask.read_text()) + "\n")
        elif name in ("default_smp_affinity", "smp_affinity"):
            try:
                cpus = parse_cpumask(value)
            except ValueError:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path)) from None
            new = _mask_at_width(cpus, cur) + "\n"
        else:
            try:
                int(value)
            except ValueError:
                if cur.strip().lstrip("-").isdigit():  # integer attribute given a word
                    raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path)) from None
            new = value + "\n"
            if name == "scaling_min_freq":
                new = f"{min(int(value), _int(path.with_name('scaling_max_freq')))}\n"
        path.write_text(new)
        if name == "no_turbo" and path.parent.name == "intel_pstate":
            _turbo_limits(path.parent.parent, turbo=value == "0")
        self.writes.append((str(path), value))
        if self.after_write:
            self.after_write(path)
        for suffix, err in self.fail_after.items():
            if str(path).endswith(suffix):
                raise OSError(err, os.strerror(err), str(path))


def _int(p: Path) -> int:
    return int(p.read_text().split()[0])


def _turbo_limits(cpu_dir: Path, turbo: bool) -> None:
    """intel_pstate: no_turbo moves each policy's max (and a floor above it) with it."""
    for f in sorted(cpu_dir.glob("cpu[0-9]*/cpufreq")):
        top = _int(f / "cpuinfo_max_freq")
        base = _int(f / "base_frequency") if (f / "base_frequency").exists() else top
        mx = top if turbo else base
        (f / "scaling_max_freq").write_text(f"{mx}\n")
        if _int(f / "scaling_min_freq") > mx:
            (f / "scaling_min_freq").write_text(f"{mx}\n")


def _w(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n")


def make_synthetic(dst: Path, ncpus: int = 4, boot_id: str = "synthetic-boot-1") -> Path:
    """A SYNTHETIC bare-metal-like tree: intel_pstate cpufreq with HWP, intel_idle C-states,
    THP/KSM on, default sysctls, four IO-APIC/MSI IRQs on every CPU. Not a capture."""
    dst.mkdir(parents=True, exist_ok=True)
    _w(dst / "SYNTHETIC", "synthetic tree built by tests/treecopy.py (not a capture)")
    cpu = dst / "sys/devices/system/cpu"
    allc = f"0-{ncpus - 1}"
    _w(cpu / "online", allc)
    _w(cpu / "present", allc)
    _w(cpu / "isolated", "")
    _w(cpu / "intel_pstate/no_turbo", "0")
    _w(cpu / "intel_pstate/min_perf_pct", "20")
    _w(cpu / "intel_pstate/status", "active")
    for c in range(ncpus):
        f = cpu / f"cpu{c}/cpufreq"
        _w(f / "scaling_driver", "intel_pstate")
        _w(f / "scaling_governor", "powersave")
        _w(f / "scaling_available_governors", "performance powersave")
        _w(f / "scaling_min_freq", "800000")
        _w(f / "scaling_max_freq", "3500000")
        _w(f / "cpuinfo_min_freq", "800000")
        _w(f / "cpuinfo_max_freq", "3500000")
        _w(f / "base_frequency", "2000000")  # intel_pstate (HWP): the max with turbo off
        _w(f / "energy_performance_preference", "balance_performance")
        _w(f / "energy_performance_available_preferences",
           "default performance balance_performance balance_power power")
        _w(cpu / f"cpu{c}/power/energy_perf_bias", "6")
        _w(cpu / f"cpu{c}/power/pm_qos_resume_latency_us", "0")  # 0: no constraint
        for i, (name, lat) in enumerate((("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 133))):
            s = cpu / f"cpu{c}/cpuidle/state{i}"
            _w(s / "name", name)
            _w(s / "latency", str(lat))
            _w(s / "disable", "0")
    mm = dst / "sys/kernel/mm"
    _w(mm / "transparent_hugepage/enabled", "[always] madvise never")
    _w(mm / "transparent_hugepage/defrag", "[always] defer defer+madvise madvise never")
    _w(mm / "ksm/run", "1")
    ps = dst / "proc/sys"
    for rel, v in (("vm/swappiness", "60"), ("vm/stat_interval", "1"),
                   ("kernel/numa_balancing", "1"), ("kernel/timer_migration", "1"),
                   ("kernel/nmi_watchdog", "1"), ("kernel/sched_rt_runtime_us", "950000"),
                   ("kernel/perf_event_paranoid", "2"),
                   ("kernel/random/boot_id", boot_id), ("kernel/osrelease", "6.8.0-synthetic")):
        _w(ps / rel, v)
    _w(dst / "proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro quiet")
    header = "".join(f"{'CPU' + str(c):>11}" for c in range(ncpus))
    rows = []
    mask = format_cpumask(range(ncpus)).lstrip("0") or "0"
    for irq, dev in ((24, "eth0-TxRx-0"), (25, "eth0-TxRx-1"), (26, "ttyS0"),
                     (27, "nvme0q1")):
        d = dst / f"proc/irq/{irq}"
        _w(d / "smp_affinity_list", allc)
        _w(d / "smp_affinity", mask)
        _w(d / "effective_affinity_list", "0")
        rows.append(f"{irq:>4}:" + "".join(f"{0:>11}" for _ in range(ncpus))
                    + f"  PCI-MSI  {dev}")
    _w(dst / "proc/irq/default_smp_affinity", mask)
    _w(dst / "proc/interrupts", header + "\n" + "\n".join(rows))
    return dst
