"""What every check gets: the host, the profile, the target CPUs, an optional target PID."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collectors.host import Host
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
