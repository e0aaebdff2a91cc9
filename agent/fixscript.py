"""`hftagent audit --fix-script FILE`: the audit's fixes as a shell script a person reviews
and runs (as root).

The script is ``#!/bin/sh`` with ``set -e`` (the first command that fails stops it), one
comment line per finding naming it, then that finding's commands, in the audit's order (the
order tune applies them in). Advice that is not a command, alternatives and launch templates
(``hftagent run ... -- CMD``) are comments. The boot arguments come last, as
tuning/tunables/boot.py's recipe in its script form (grubby where installed, else
/etc/default/grub and update-grub). The script never reboots.

The file is created exclusively through agent/outfile.py (``O_CREAT|O_EXCL|O_NOFOLLOW`` at the
path itself, mode 0700, in a directory nobody else can change under us): an existing file, a
symlink (even a dangling one) or a directory is never written through or replaced.
"""

from __future__ import annotations

import os

from agent.render import boot_args, command_line, is_boot_arg, to_fix
from tuning.findings import Finding, fix_steps

OPT = "--fix-script"


def script_text(findings: list[Finding], header: list[str]) -> str:
    """The whole script for ``findings``; ``header`` lines become comments at the top."""
    from tuning.tunables.boot import grub_script

    out = ["#!/bin/sh", *(f"# {h}" for h in header),
           "# Review it, then run it as root. Runtime settings last until the next boot;",
           "# the boot arguments (last) take effect after you reboot: this script never does.",
           "set -e", ""]
    # the audit's own order, not most-severe-first: the checks are ordered as tune applies
    # them (irqbalance stopped before IRQs are moved, the governor before turbo)
    act = {id(f) for f in to_fix(findings)}
    todo = [f for f in findings if id(f) in act]
    for f in todo:
        if is_boot_arg(f):
            continue
        out.append(f"# {f.id} ({f.status.value}): {f.title}")
        steps = fix_steps(f.fix)
        if not steps:
            out.append("#   no fix: see `hftagent audit`")
        for s in steps:
            if s.advice:
                out.append(f"#   advice: {s.advice}")
            elif s.alternative:
                out.append(f"#   or, instead: {s.command}")
            elif s.template:
                out.append(f"#   start the service with: {command_line(s)}")
            else:
                out.append(command_line(s))
    args = boot_args(findings)
    if args:
        out.append("")
        for f in todo:
            if is_boot_arg(f):
                out.append(f"# {f.id} ({f.status.value}): {f.title}: {f.data['kernel_arg']}")
        out += grub_script(args)
        out.append("# then reboot")
    if not todo:
        out.append("# nothing to fix")
    return "\n".join(out) + "\n"


def check_path(path: str) -> None:
    """Refuse before any work what :func:`write_script` would refuse (agent/outfile.py's
    exclusive rules): an empty name, anything already at the path (a file, a symlink, even a
    dangling one, a directory), a missing or unwritable directory. Raises OutputError."""
    from agent.outfile import check_output
    check_output(path, OPT, exclusive=True)


def write_script(path: str, text: str) -> None:
    """Create ``path`` exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``, agent/outfile.py) with
    ``text``, mode exactly 0700; on any failure nothing is left behind (OutputError)."""
    from agent.outfile import open_output
    with open_output(path, OPT, mode=0o700, exclusive=True) as out:
        os.fchmod(out.fileno(), 0o700)  # the umask narrowed the mode given to open
        out.write(text)
