"""node_exporter textfile mode: `hftagent audit --textfile DIR` writes hftagent_audit.prom.

For fleets that already run node_exporter with ``--collector.textfile.directory=DIR``: the
audit result becomes the same ``hftagent_audit_*`` series the watch exporter serves, so the
rules and dashboard work with either source.

The write is atomic (agent/outfile.py): a hidden temp file in DIR (node_exporter only reads
``*.prom``, so it never sees a half-written file), fsync, rename over the target, fsync of DIR.
A reader sees the old file or the new one, never a mix; a crash leaves at most a stray
``.hftagent-*.tmp`` file. No timestamps on samples (node_exporter refuses them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from agent.errors import AgentError
from agent.export.metrics import audit_state
from agent.export.server import audit_families

if TYPE_CHECKING:
    from tuning.findings import Finding

TEXTFILE_NAME = "hftagent_audit.prom"


class _AuditCollector:
    def __init__(self, state: dict[str, str], at: float) -> None:
        self.state, self.at = state, at

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        yield from audit_families(self.state, self.at)


def render_textfile(findings: Iterable[Finding], now: float | None = None) -> bytes:
    """The .prom content for these findings (text exposition format)."""
    state, _dropped = audit_state(findings)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_AuditCollector(state, time.time() if now is None else now))  # type: ignore[arg-type]
    return generate_latest(reg)


def write_textfile(findings: Iterable[Finding], directory: str | os.PathLike[str], *,
                   filename: str = TEXTFILE_NAME, now: float | None = None) -> Path:
    """Write the audit result to DIRECTORY/FILENAME atomically; return the path written.

    Raises AgentError (one line for the CLI) when DIRECTORY is missing or not writable.
    """
    return write_prom(render_textfile(findings, now), directory, filename)


def render_families(families: Iterable) -> bytes:
    """Text exposition of already-built metric families (``hftagent cpus --textfile``)."""
    fams = list(families)

    class _Static:
        def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
            return iter(fams)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Static())  # type: ignore[arg-type]
    return generate_latest(reg)


def write_prom(data: bytes, directory: str | os.PathLike[str], filename: str) -> Path:
    """Write ``data`` to DIRECTORY/FILENAME atomically (see the module docstring), mode 0644
    (node_exporter may run as another user), through agent/outfile.py: every directory from
    / down root's or ours and not writable by others, no other user's link followed, only a
    regular file of ours replaced."""
    from agent.outfile import open_output
    d = Path(directory)
    if not d.is_dir():
        raise AgentError(f"--textfile: {d} is not a directory")
    if not filename.endswith(".prom") or "/" in filename:
        raise AgentError(f"--textfile: bad file name {filename!r} (must be NAME.prom)")
    target = d / filename
    with open_output(target, "--textfile", binary=True) as out:
        os.fchmod(out.fileno(), 0o644)
        out.write(data)
    return target
