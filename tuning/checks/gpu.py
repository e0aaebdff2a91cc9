"""GPU family of the audit (owner: GPU work, issue 8). Without an NVIDIA driver: one
`unsupported` finding with the reason."""

from __future__ import annotations

from tuning.checks.base import AuditContext, unsupported
from tuning.findings import Finding


def check(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    version = host.read(host.proc("driver/nvidia/version"))
    if not version.ok:
        return [unsupported("gpu.driver", "gpu", "NVIDIA GPU", "no NVIDIA driver loaded",
                            evidence=version.path,
                            why="GPU persistence, exclusivity and clocks decide GPU tail latency.")]
    return [unsupported("gpu.driver", "gpu", "NVIDIA GPU", "GPU checks not implemented yet",
                        evidence=version.path)]
