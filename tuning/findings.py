"""Finding: the unit of audit and verify output. Human and JSON rendering come from these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"
    PENDING_REBOOT = "pending-reboot"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


# Order used for the summary line and for "worst status" of a family.
SEVERITY = {Status.OK: 0, Status.UNSUPPORTED: 1, Status.ERROR: 2, Status.WARN: 3,
            Status.PENDING_REBOOT: 4, Status.FAIL: 5}


@dataclass
class Finding:
    """One checked setting.

    id        stable dotted id ("cpu.governor"), used by profiles, metrics and gates
    family    grouping for the report ("cpu", "isolation", "irq", "memory", ...)
    title     short human name
    status    ok | warn | fail | unsupported | pending-reboot | error
    current   what the host has now (rendered compactly; CPU sets as ranges)
    expected  what the profile asks for
    evidence  the file(s) read or command run
    fix       the exact command or kernel argument that fixes it ("" when ok)
    why       one line on why it matters for tail latency
    """

    id: str
    family: str
    title: str
    status: Status
    current: str = ""
    expected: str = ""
    evidence: str = ""
    fix: str = ""
    why: str = ""
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        if not self.data:
            d.pop("data")
        return d


def summarize(findings: list[Finding]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for f in findings:
        counts[f.status.value] += 1
    return counts


def exit_code(findings: list[Finding], fail_on: Status = Status.FAIL) -> int:
    """2 = something to fix (fail or pending-reboot; ``fail_on=WARN``: warnings too);
    else 1 = some check could not run (error: the box is not known to be fine); else 0."""
    bad = {Status.FAIL, Status.PENDING_REBOOT}
    if fail_on == Status.WARN:
        bad.add(Status.WARN)
    if any(f.status in bad for f in findings):
        return 2
    return 1 if any(f.status == Status.ERROR for f in findings) else 0
