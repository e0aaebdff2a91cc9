"""What every check gets: the host, the profile, the target CPUs, an optional target PID.

Missing data, the rule every check follows: a value that could not be read is never ``ok``.
- The whole source is absent (no cpufreq directory on any target CPU, no /proc/irq, no sysctl
  file): ``unsupported``, with the reason.
- Part of it is absent, unreadable or does not parse (one CPU of eight without cpufreq, a
  C-state latency that is not a number, a node whose cpulist cannot be read): ``error``,
  naming what could not be read — unless what was read already fails or warns, which then
  stands, with the unreadable part in ``current`` too.
- A file missing from a captured tree (``--root``) is "absent from this tree": whether the
  kernel lacked it or the capture missed it cannot be told from the tree (:func:`why`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors.host import ABSENT, PERMISSION, Host
from tuning.findings import Finding, Status
from tuning.profiles import Profile


@dataclass
class AuditContext:
    host: Host
    profile: Profile
    cpus: list[int]  # target CPUs (where inference runs)
    online: list[int]
    pid: int | None = None
    steal_window_s: float = 0.2
    # Lazily created NVML adapter (collectors.gpu), shared by GPU checks; None = not tried yet.
    gpu: Any = None
    cache: dict[str, Any] = field(default_factory=dict)

    def finding(self, key: str, id: str, family: str, title: str, ok: bool, *, current: str,
                evidence: str, fix: str = "", expected: str | None = None,
                status: Status | None = None, data: dict | None = None) -> Finding:
        """Build a finding for profile setting ``key``: ok, or the profile's severity."""
        setting = self.profile.get(key)
        if status is None:
            status = Status.OK if ok else (setting.severity if setting else Status.WARN)
        return Finding(
            id=id, family=family, title=title, status=status, current=current,
            expected=expected if expected is not None else
            (str(setting.expected) if setting else ""),
            evidence=evidence, fix="" if status == Status.OK else fix,
            why=setting.why if setting else "", data=data or {})


def unsupported(id: str, family: str, title: str, reason: str, evidence: str = "",
                why: str = "") -> Finding:
    return Finding(id=id, family=family, title=title, status=Status.UNSUPPORTED,
                   current=f"unsupported: {reason}", evidence=evidence, why=why)


def in_tree(host: Host, shown: str) -> bool:
    """Whether the file shown as ``shown`` ("/proc/...", "/sys/...", "/etc/...") is read from
    a captured tree rather than from the running kernel."""
    if shown.startswith("/proc"):
        return host.procfs.resolve() != Path("/proc")
    if shown.startswith("/sys"):
        return host.sysfs.resolve() != Path("/sys")
    return host.root.resolve() != Path("/")


def why(host: Host, reason: str | None, shown: str) -> str:
    """A reading's reason as a report says it: "absent from this tree" for a file missing
    from a capture, "permission denied (retry as root)", or the reason itself."""
    if reason == ABSENT:
        return "absent from this tree" if in_tree(host, shown) else "absent"
    if reason == PERMISSION:
        return "permission denied (retry as root)"
    return reason or "unreadable"
