"""`hftagent audit --fix-script FILE`: the audit's fixes as a shell script a person reviews
and runs (as root), and that ``hftagent tune rollback`` undoes.

The script is ``#!/bin/sh`` with ``set -e`` (the first command that fails stops it), one
comment line per finding naming it, in the audit's order, in four parts:

1. Every runtime setting a tunable can make (tuning/tunables: each names the findings it
   fixes, :func:`tuning.tunables.fixing`) is made by ONE ``hftagent tune apply`` call with
   the exact ``--only`` list, journalled, so ``hftagent tune rollback`` restores all of it.
   Each finding says which tunables fix it and what its printed fix would have run.
2. A command no tunable journals (``swapoff -a``, ``systemctl disable``, an ``echo`` to a file
   tune does not own) stays a command, marked "not undone by tune rollback" with the value it
   changes (and the command that puts it back where there is one).
3. Findings with nothing to run: their advice, alternatives and launch templates
   (``hftagent run ... -- CMD``), as comments.
4. The boot arguments, as tuning/tunables/boot.py's recipe in its script form (grubby where
   installed, else /etc/default/grub and update-grub), also marked "not undone by tune
   rollback" with what the kernel booted with. The script never reboots.

hftagent is called by the absolute path of the program that wrote the script
(:func:`hftagent_argv`): root's PATH rarely holds a virtual environment's bin/.

The file is created exclusively through agent/outfile.py (``O_CREAT|O_EXCL|O_NOFOLLOW`` at the
path itself, mode 0700, in a directory nobody else can change under us): an existing file, a
symlink (even a dangling one) or a directory is never written through or replaced.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent.render import boot_args, command_line, is_boot_arg, to_fix
from tuning.findings import Finding, FixStep, fix_steps

OPT = "--fix-script"
NOT_UNDONE = "not undone by tune rollback"


def hftagent_argv() -> list[str]:
    """The command that runs this hftagent from anywhere, as root too: the absolute path of
    the program running now when it is the ``hftagent`` console script, else the console
    script installed beside this interpreter, else this interpreter (absolute, not resolved:
    a virtual environment's python is a link out of it) with ``-m agent.cli``."""
    me = sys.argv[0] if sys.argv else ""
    if Path(me).name == "hftagent" and _runnable(me):
        return [os.path.abspath(me)]
    if sys.executable:
        beside = Path(os.path.abspath(sys.executable)).parent / "hftagent"
        if _runnable(str(beside)):
            return [str(beside)]
    return [os.path.abspath(sys.executable or "python3"), "-m", "agent.cli"]


def _runnable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


@dataclass
class _Parts:
    """The script's parts, filled finding by finding (:func:`_sort`)."""

    me: str                                              # hftagent, quoted
    only: list[str] = field(default_factory=list)        # tune apply --only, in order
    isolate: bool = False                                # tune apply --isolate
    tuned: list[str] = field(default_factory=list)       # findings the one call fixes
    other: list[str] = field(default_factory=list)       # findings with unjournalled commands
    advice: list[str] = field(default_factory=list)      # findings with nothing to run


def tune_selection(command: str) -> tuple[list[str], bool] | None:
    """``hftagent tune apply ... --only X ... [--isolate]`` -> (the ``--only`` values,
    whether ``--isolate`` is given); None for any other command."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if argv[:3] != ["hftagent", "tune", "apply"]:
        return None
    only = [v for opt, v in zip(argv, argv[1:], strict=False) if opt == "--only"]
    return only, "--isolate" in argv


def _own(text: str, me: str) -> str:
    """A printed hftagent command with this hftagent's absolute path."""
    return me + text[len("hftagent"):] if text.startswith("hftagent ") else text


def _restore(f: Finding, step: FixStep) -> str:
    """What an unjournalled command changes and how to put it back."""
    cmd = step.command
    if cmd.startswith("systemctl disable --now "):
        how = f"to restore: systemctl enable --now {cmd[len('systemctl disable --now '):]}; "
    elif cmd.startswith("swapoff -a"):
        how = "to restore: swapon -a (the swap in /etc/fstab); "
    elif cmd.startswith("echo off > /sys/devices/system/cpu/smt/control"):
        how = "to restore: echo on > /sys/devices/system/cpu/smt/control; "
    else:
        how = ""
    return f"{NOT_UNDONE}; {how}it was: {f.current}"


def _sort(f: Finding, parts: _Parts) -> None:
    """Put finding ``f`` in its part: its commands either join the one ``tune apply`` call
    or stay, marked; advice, templates and alternatives become comments."""
    from tuning.tunables import fixing

    lines = [f"# {f.id} ({f.status.value}): {f.title}"]
    journalled = unjournalled = False
    for s in fix_steps(f.fix):
        sel = tune_selection(s.command) if s.command else None
        if s.advice:
            lines.append(f"#   advice: {s.advice}")
        elif s.template:
            lines.append(f"#   start the service with: {_own(command_line(s), parts.me)}")
        elif s.alternative:
            if sel is None:  # a narrower tune apply is what the one call does already
                lines.append(f"#   or, instead: {_own(s.command, parts.me)}")
        elif sel is not None and (sel[0] or sel[1]):
            parts.only += sel[0] or ["isolate"]
            parts.isolate |= sel[1]
            journalled = True
            lines.append(f"#   tune apply --only {' --only '.join(sel[0] or ['isolate'])} "
                         "(below)")
        elif ids := fixing(f.id):
            parts.only += ids
            journalled = True
            lines.append(f"#   tune apply --only {' --only '.join(ids)} (below), journalled; "
                         f"the same as: {s.command}")
        elif s.command.startswith("hftagent "):  # read-only (hftagent cpus): a next step
            lines.append(f"#   then: {_own(command_line(s), parts.me)}")
        else:
            note = f"{s.note}; " if s.note else ""
            lines.append(f"{s.command}  # {note}{_restore(f, s)}")
            unjournalled = True
    if not fix_steps(f.fix):
        lines.append("#   no fix: see `hftagent audit`")
    (parts.other if unjournalled else parts.tuned if journalled else parts.advice).extend(lines)


def _tune_call(parts: _Parts, profile: str, cpus: str) -> str:
    argv = ["tune", "apply", "--profile", profile]
    if cpus:
        argv += ["--cpus", cpus]
    if parts.isolate:
        argv.append("--isolate")
    for tid in dict.fromkeys(parts.only):
        argv += ["--only", tid]
    return f"{parts.me} {shlex.join(argv)}"


def _boot_part(findings: list[Finding], todo: list[Finding]) -> list[str]:
    from tuning.tunables.boot import grub_script

    args = boot_args(findings)
    if not args:
        return []
    boot = [f for f in todo if is_boot_arg(f)]
    out = ["", f"# -- boot arguments ({NOT_UNDONE}; to restore, set them back to what the "
           "kernel booted with, shown as \"now\") --"]
    out += [f"# {f.id} ({f.status.value}): {f.title}: {f.data['kernel_arg']} (now: "
            f"{f.current})" for f in boot]
    return [*out, *grub_script(args), "# then reboot"]


def script_text(findings: list[Finding], header: list[str], *, profile: str = "hft-cpu",
                cpus: str = "", hftagent: list[str] | None = None) -> str:
    """The whole script for ``findings``; ``header`` lines become comments at the top.
    ``profile`` (a built-in name or an absolute path) and ``cpus`` are the audit's: the one
    ``tune apply`` call plans exactly as the audit judged."""
    parts = _Parts(me=shlex.join(hftagent or hftagent_argv()))
    # the audit's own order, not most-severe-first: the checks are ordered as tune applies
    # them (irqbalance stopped before IRQs are moved, the governor before turbo)
    act = {id(f) for f in to_fix(findings)}
    todo = [f for f in findings if id(f) in act]
    for f in todo:
        if not is_boot_arg(f):
            _sort(f, parts)
    out = ["#!/bin/sh", *(f"# {h}" for h in header),
           "# Review it, then run it as root. Runtime settings last until the next boot;",
           "# the boot arguments (last) take effect after you reboot: this script never does.",
           f"# `{parts.me} tune rollback` undoes every runtime setting of the tune apply call;",
           f"# a line marked \"{NOT_UNDONE}\" says what it changes.",
           "set -e"]
    if parts.only:
        out += ["", "# -- runtime settings: one journalled call --", *parts.tuned,
                _tune_call(parts, profile, cpus)]
    if parts.other:
        out += ["", f"# -- {NOT_UNDONE} --", *parts.other]
    if parts.advice:
        out += ["", "# -- nothing to run --", *parts.advice]
    out += _boot_part(findings, todo)
    if not todo:
        out += ["", "# nothing to fix"]
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
