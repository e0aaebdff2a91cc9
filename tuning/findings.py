"""Finding: the unit of audit and verify output. Human and JSON rendering come from these."""

from __future__ import annotations

import re
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


# -- fixes a person can paste ---------------------------------------------------------------

# The programs a fix line may start with. A fix (or the part of it) that starts with one of
# them is a command, printed whole on its own line and written to ``audit --fix-script``;
# anything else ("include SMT siblings in --cpus ...", "check `dmesg | grep -i xid` ...") is
# advice for a person, printed as words and never run.
FIX_PROGRAMS = frozenset({
    "cpupower", "echo", "for", "grubby", "hftagent", "if", "numactl", "nvidia-smi", "sed",
    "swapoff", "sysctl", "systemctl", "taskset", "x86_energy_perf_policy",
})
# words that continue a compound command after "; " ("for ...; do ...; done")
_SHELL_WORDS = frozenset({"do", "done", "then", "else", "elif", "fi"})
# a placeholder the person fills in: "hftagent run ... -- CMD", "--physcpubind=<cpus>"
_PLACEHOLDER = re.compile(r"(^|\s)CMD(\s|$)|<[a-z][a-z ]*>")


@dataclass(frozen=True)
class FixStep:
    """One step of a finding's fix: a shell ``command`` (one line, with an optional ``note``
    printed after it as a shell comment; ``alternative``: instead of the command before it)
    or ``advice`` (words, no command)."""

    command: str = ""
    note: str = ""
    advice: str = ""
    alternative: bool = False

    @property
    def template(self) -> bool:
        """A command with a placeholder (``CMD``, ``<cpus>``): how to start the service,
        not something to run as it is."""
        return bool(self.command) and _PLACEHOLDER.search(self.command) is not None


def _first_word(text: str) -> str:
    return text.split(maxsplit=1)[0] if text.strip() else ""


def _quote_state(text: str) -> list[bool]:
    """For each character: whether it lies outside quotes (single, double, backticks)."""
    out, quote = [], ""
    for ch in text:
        if quote:
            out.append(False)
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
            out.append(False)
        else:
            out.append(True)
    return out


def _split_note(text: str) -> tuple[str, str]:
    """``"sysctl -w vm.swappiness=1  (persist in /etc/sysctl.d/)"`` -> (command, note): a
    trailing parenthesised remark after a space, outside quotes, is not shell."""
    if not text.endswith(")"):
        return text, ""
    outside = _quote_state(text)
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if not outside[i]:
            continue
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                if i > 0 and text[i - 1].isspace():
                    return text[:i].rstrip(), text[i + 1:-1].strip()
                return text, ""
    return text, ""


def _split_commands(text: str) -> list[str]:
    """``"a; b"`` at its top-level "; " (a sed script's "; " stays inside its quotes)."""
    outside = _quote_state(text)
    parts, start = [], 0
    for i in range(len(text) - 1):
        if text[i] == ";" and text[i + 1] == " " and outside[i]:
            parts.append(text[start:i].strip())
            start = i + 2
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def fix_steps(fix: str) -> list[FixStep]:
    """A finding's ``fix`` as steps: each line of it (the GRUB recipe is one command a line)
    split into the command part, a trailing "(note)" and any advice after a "; " that no
    command follows ("swapoff -a; remove swap entries from /etc/fstab"). A note "(or: CMD)"
    is a second command, the alternative to the first."""
    steps: list[FixStep] = []
    for line in fix.splitlines():
        text = line.strip()
        if not text:
            continue
        main, note = _split_note(text)
        if _first_word(main) not in FIX_PROGRAMS:
            steps.append(FixStep(advice=text))
            continue
        parts = _split_commands(main)
        n = 1
        while n < len(parts) and _first_word(parts[n]) in FIX_PROGRAMS | _SHELL_WORDS:
            n += 1
        alt = ""
        if note.startswith("or:") and _first_word(note[3:]) in FIX_PROGRAMS:
            alt, note = note[3:].strip(), ""
        rest = "; ".join(parts[n:])
        if rest and note:  # the note belongs to the advice it follows
            rest, note = f"{rest} ({note})", ""
        steps.append(FixStep(command="; ".join(parts[:n]), note=note))
        if rest:
            steps.append(FixStep(advice=rest))
        if alt:
            steps.append(FixStep(command=alt, note="or, instead of the line above",
                                 alternative=True))
    return steps
