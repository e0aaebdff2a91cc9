"""`hftagent audit --fix-script FILE`: the audit's fixes as a shell script a person reviews
and runs (as root).

The script is ``#!/bin/sh`` with ``set -e`` (the first command that fails stops it), one
comment line per finding naming it, then that finding's commands, in the audit's order (the
order tune applies them in). Advice that is not a
command, alternatives and launch templates (``hftagent run ... -- CMD``) are comments. The
boot arguments come last, as tuning/tunables/boot.py's recipe in its script form (grubby where
installed, else /etc/default/grub and update-grub). The script never reboots.

The file is created exclusively (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0700): an existing file,
a symlink (even a dangling one) or a directory is never written through or replaced.
"""

from __future__ import annotations

import errno
import os
import stat

from agent.render import boot_args, command_line, is_boot_arg, to_fix
from tuning.findings import Finding, fix_steps


class FixScriptError(Exception):
    """The script file cannot be created; the message is one line for the user."""


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
    """Refuse before any work: an empty name, an existing file, symlink or directory, a
    missing or unwritable directory (:class:`FixScriptError`)."""
    if not path.strip():
        raise FixScriptError("--fix-script is empty: give a new file name")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise FixScriptError(f"--fix-script {path!r}: {exc.strerror or exc}") from None
    else:
        what = ("a directory" if stat.S_ISDIR(st.st_mode) else
                "a symlink" if stat.S_ISLNK(st.st_mode) else "an existing file")
        raise FixScriptError(f"--fix-script {path!r} is {what}: give a new file name "
                             "(it is never overwritten)")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise FixScriptError(f"--fix-script {path!r}: directory {parent!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FixScriptError(f"--fix-script {path!r}: cannot write in {parent!r}: "
                             "permission denied")


def write_exclusive(path: str, text: str, mode: int = 0o700) -> None:
    """Create ``path`` (never an existing one, never through a symlink) with ``text`` and
    exactly ``mode``; on any failure nothing is left behind."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ELOOP):
            raise FixScriptError(f"--fix-script {path!r} exists: give a new file name "
                                 "(it is never overwritten)") from None
        raise FixScriptError(f"cannot create --fix-script {path!r}: "
                             f"{exc.strerror or exc}") from None
    try:
        os.fchmod(fd, mode)  # the umask narrowed the mode given to open
        data = text.encode()
        while data:
            data = data[os.write(fd, data):]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        raise FixScriptError(f"cannot write --fix-script {path!r}: "
                             f"{exc.strerror or exc}") from None
    os.close(fd)
