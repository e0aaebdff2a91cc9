"""Host fingerprint: the host facts that change tail latency, so runs from differently
configured hosts are flagged instead of compared silently.

Cheap reads only (a few sysfs/procfs files through :class:`collectors.host.Host`; no
py-cpuinfo, no NVML, no TensorFlow). Sources [equivalent command]:

- kernel release: /proc/sys/kernel/osrelease                       [uname -r]
- CPU model: /proc/cpuinfo "model name"                             [lscpu]
- governors per online CPU, grouped: cpuN/cpufreq/scaling_governor  [cpupower frequency-info]
- turbo: intel_pstate/no_turbo or cpufreq/boost
- isolated / nohz_full CPU lists: /sys/devices/system/cpu/{isolated,nohz_full}
- SMT: /sys/devices/system/cpu/smt/active
- virtualization (hypervisor flag, DMI vendor)                       [systemd-detect-virt]
- NVIDIA driver: /proc/driver/nvidia/version; GPU models:
  /proc/driver/nvidia/gpus/*/information "Model:"                   [nvidia-smi -L]

A value that cannot be read is ``None`` (never 0 or ""). ``COMPARED`` lists the keys whose
difference makes two runs "not comparable"; the rest (hostname, audit summary) are shown only.
The model, its variant and the TensorFlow version are *not* host facts: changing them is what
the gate is for.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any

FINGERPRINT_VERSION = 1

COMPARED: tuple[str, ...] = ("kernel", "cpu_model", "online_cpus", "governors", "turbo",
                             "isolated_cpus", "nohz_full_cpus", "smt_active", "virtualization",
                             "gpu_models", "gpu_driver")


def collect(host: Any = None, audit_summary: dict | None = None) -> dict:
    """The fingerprint of ``host`` (default: this machine, root /).

    Never raises for unreadable facts: each becomes None. ``audit_summary`` (e.g. counts of
    audit statuses) is carried along for display.
    """
    from collectors import cpu, kernel, system
    from collectors.host import Host
    from collectors.parsers import format_cpulist

    host = host or Host("/")
    fp: dict[str, Any] = {"version": FINGERPRINT_VERSION, "hostname": socket.gethostname()}

    def safe(fn, default=None):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - a fact we cannot read is None, never a crash
            return default

    fp["kernel"] = safe(lambda: kernel.kernel_release(host))
    fp["cpu_model"] = safe(lambda: cpu.cpu_model(host))
    online = safe(lambda: cpu.online_cpus(host).value) or []
    fp["online_cpus"] = format_cpulist(online) if online else None
    fp["governors"] = safe(lambda: _governors(host, online, cpu, format_cpulist))
    t = safe(lambda: cpu.turbo(host))
    fp["turbo"] = None if t is None else t.enabled
    fp["isolated_cpus"] = safe(lambda: format_cpulist(cpu.isolated_cpus(host)))
    fp["nohz_full_cpus"] = safe(lambda: format_cpulist(cpu.nohz_full_cpus(host)))
    fp["smt_active"] = safe(lambda: host.read_int(host.sys("devices/system/cpu/smt/active")
                                                  ).value)
    v = safe(lambda: system.virtualization(host))
    # "none": a source shows bare metal; "unknown": none could tell a guest from it
    fp["virtualization"] = None if v is None else (v.kind or ("none" if v.known else "unknown"))
    fp["gpu_driver"], fp["gpu_models"] = safe(lambda: _gpus(host), (None, None))
    fp["audit"] = audit_summary
    return fp


def _governors(host, online: list[int], cpu, format_cpulist) -> str | None:
    """"0-7=performance; 8-15=powersave", or None when no CPU has cpufreq (VMs)."""
    groups: dict[str, list[int]] = {}
    for c in online:
        f = cpu.cpufreq(host, c)
        if f is not None and f.governor:
            groups.setdefault(f.governor, []).append(c)
    if not groups:
        return None
    return "; ".join(f"{format_cpulist(cs)}={g}" for g, cs in
                     sorted(groups.items(), key=lambda kv: kv[1][0]))


def _gpus(host) -> tuple[str | None, str | None]:
    from collectors.gpu import nvidia_driver_version
    drv = nvidia_driver_version(host).value
    driver = None
    if drv:
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..."
        words = drv.split()
        driver = next((w for w in words if w.count(".") >= 1 and w.replace(".", "").isdigit()),
                      drv.splitlines()[0].strip())
    models: list[str] = []
    gdir = host.proc("driver/nvidia/gpus")
    try:
        entries = sorted(os.listdir(gdir))
    except OSError:
        entries = []
    for e in entries:
        info = host.read(host.proc("driver/nvidia/gpus", e, "information")).value or ""
        for line in info.splitlines():
            if line.startswith("Model:"):
                models.append(line.split(":", 1)[1].strip())
    return driver, (", ".join(models) if models else None)


def differences(a: dict | None, b: dict | None) -> list[str]:
    """Human lines for each compared fact that differs ("governors: performance → powersave").
    A missing fingerprint on either side is one difference."""
    if not a or not b:
        return ["host fingerprint missing on " + ("both runs" if not a and not b else
                                                  "the baseline" if not a else "the current run")]
    out = []
    for k in COMPARED:
        if a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)!r} → {b.get(k)!r}")
    return out


def digest(fp: dict | None) -> str | None:
    """Short stable hash of the compared facts (for listing and grouping runs)."""
    if not fp:
        return None
    body = json.dumps({k: fp.get(k) for k in COMPARED}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:12]
