"""The last ``hftagent tune try`` on this box, as the audit reads it (tuning never imports
agent/: the command writes this file through :func:`write_state`, the audit's wake-up check
reads it through :func:`last_trial`).

File: ``tune-try.json`` in tune's state directory (ROOT/run/hftagent, next to the journal: a
tmpfs on a live box, so a reboot forgets it with the boot it measured). Written whole under a
random temporary name (O_EXCL|O_NOFOLLOW, mode 0600) and renamed into place; read without
following a symlink, bounded, a regular file only. It holds the target CPUs, the kernel
release and the boot command line the trial ran under, the arms' P99.9 figures and the
winner: a trial counts for the audit only on the same CPUs, kernel and boot arguments.

Equivalent: ``cat /run/hftagent/tune-try.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host
from collectors.parsers import format_cpulist

FILENAME = "tune-try.json"
FORMAT = "hftagent.tune-try"
VERSION = 1
MAX_BYTES = 1 << 20


def state_file(host: Host, state_dir: Path | None = None) -> Path:
    return (state_dir if state_dir is not None else host.run_dir("hftagent")) / FILENAME


def boot_identity(host: Host) -> dict[str, str | None]:
    """What a trial's result depends on besides the CPUs: the kernel release and the boot
    command line (``uname -r``, ``cat /proc/cmdline``)."""
    from collectors.kernel import kernel_release
    cl = host.read(host.proc("cmdline"))
    return {"kernel": kernel_release(host), "cmdline": cl.value.strip() if cl.ok else None}


def lever_fix(name: str, cpus: list[int], *, isolated: bool = False) -> str:
    """The command that sets arm ``name`` on ``cpus`` for an inference command (CMD); with
    ``isolated`` (the CPUs are isolated already) without the isolation step. "" for ``none``
    and, once isolated, for ``isolate``: nothing to set."""
    from tuning.launcher import command_line
    iso = f"hftagent tune apply --isolate --only isolate --cpus {format_cpulist(cpus)}"
    lever = {"pm-qos": command_line(["CMD"], cpus=cpus, pm_qos=0),
             "keep-awake": command_line(["CMD"], cpus=cpus, keep_awake=True),
             "keep-awake-busy": command_line(["CMD"], cpus=cpus, keep_awake=True,
                                             keep_awake_loop="busy"),
             "halt-poll": "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns"
             }.get(name)
    if name == "none" or (isolated and name == "isolate"):
        return ""
    if lever is None:
        return iso if name == "isolate" else ""
    return lever if isolated else f"{iso}; then {lever}"


def write_state(host: Host, doc: dict, state_dir: Path | None = None) -> Path:
    """Write ``doc`` (the command's result: cpus, winner, arms...) with this box's identity as
    the state file; returns its path. Raises OSError/UnsafePath."""
    from tuning.apply import state_beneath
    from tuning.safepath import open_dir

    path = state_file(host, state_dir)
    body = {"format": FORMAT, "version": VERSION, **boot_identity(host), **doc}
    data = json.dumps(body, indent=1, default=str).encode()
    dfd = open_dir(path.parent, create=True, beneath=state_beneath(host, path.parent))
    assert dfd is not None
    tmp = f".{FILENAME}.{secrets.token_hex(8)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, FILENAME, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    finally:
        os.close(dfd)
    return path


@dataclass
class LastTrial:
    """The last trial that applies to these CPUs on this kernel and boot (or why none)."""

    winner: str | None
    clear: bool
    created_utc: str
    path: str


def _read(path: Path) -> dict | None:
    """The state file's JSON, or None when there is none. ValueError when it cannot be used."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise ValueError("owned or writable by another user")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise ValueError("larger than a trial's result")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a tune try result")
    return doc


def last_trial(host: Host, cpus: list[int]) -> tuple[LastTrial | None, str]:
    """(the last trial for ``cpus`` on this kernel and boot, or None; why none, in words)."""
    path = state_file(host)
    shown = host.display(path)
    try:
        doc = _read(path)
    except ValueError as exc:
        return None, f"{shown}: {exc}"
    if doc is None:
        return None, "no hftagent tune try on this box yet"
    now = boot_identity(host)
    if doc.get("cpus") != list(cpus):
        return None, (f"the last tune try measured CPU {format_cpulist(doc.get('cpus') or [])}"
                      if isinstance(doc.get("cpus"), list) and all(
                          isinstance(c, int) for c in doc["cpus"]) else
                      f"{shown} names no CPUs")
    for key, what in (("kernel", "kernel"), ("cmdline", "boot command line")):
        if doc.get(key) != now[key]:
            return None, f"the last tune try ran under another {what}"
    w = doc.get("winner")
    if w is not None and not isinstance(w, str):
        return None, f"{shown}: its winner is not a name"
    return LastTrial(w, bool(doc.get("clear")), str(doc.get("created_utc", "?")), shown), ""
