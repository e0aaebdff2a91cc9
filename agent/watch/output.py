"""The files ``hftagent watch`` writes, opened as a program that runs as root must in a
shared directory: the spike log (:class:`SpikeLog`, :func:`open_output`) and the flight
records' directory (:func:`open_output_dir`, :func:`write_new`).

The spike log's directory must exist (never created), a symlink is followed only when it
belongs to root or to us, a FIFO without a reader is an error rather than a hang, and a write
error (``/dev/full``, a full disk) ends the run with exit code 1 and one line. Flight records
are written under random temporary names (``O_EXCL|O_NOFOLLOW``) and renamed into place.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from agent.errors import AgentError


class SpikeLog:
    """The JSONL spike log (``--spike-log``; None: none). ``on_record`` (optional) is given
    every record too, the same dict (benchmarks and tests keep them in memory)."""

    def __init__(self, path: str | None,
                 on_record: Callable[[dict], None] | None = None) -> None:
        self.path = path
        self.on_record = on_record
        self.error: str | None = None  # why the log could not be written (the run ends)
        self._fd = -1

    def open(self) -> None:
        """Open the log (:func:`open_output`); a no-op when open or when there is none."""
        if self.path is not None and self._fd < 0 and self.error is None:
            self._fd = open_output(self.path, "--spike-log")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def write(self, rec: dict) -> None:
        """Append one JSONL record (one ``write``: appended whole). A write error closes the
        log and sets :attr:`error` (the session ends the run, exit code 1): a spike log that
        silently stops growing would look like a quiet host."""
        if self.on_record is not None:
            self.on_record(rec)
        if self._fd < 0:
            return
        data = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                n = os.write(self._fd, data)
                data = data[n:]
        except OSError as exc:
            self.error = f"cannot write the spike log {self.path}: {exc.strerror}"
            os.close(self._fd)
            self._fd = -1


def _trusted_link(path: str, what: str) -> bool:
    """Whether ``path`` is a symlink that may be followed: one owned by root or by us
    (``/dev/stdout``, a link the operator made). Raises for one owned by anyone else (planted
    in a shared directory such as /tmp: following it as root would write where its owner
    chose). False: not a symlink, or nothing there yet (open it with ``O_NOFOLLOW``)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise AgentError(f"{what} {path}: {exc.strerror}") from None
    if not stat.S_ISLNK(st.st_mode):
        return False
    if st.st_uid not in (0, os.geteuid()):
        raise AgentError(f"{what} {path} is a symbolic link owned by uid {st.st_uid}: not "
                         "followed (give the real path)")
    return True


def open_output(path: str, what: str) -> int:
    """Open ``path`` for appending (a descriptor; mode 0644 when created) the way a program
    that runs as root must: its directory must exist (never created: ``mkdir -p`` as root
    makes directories anywhere a typo points), a symlink is followed only when
    :func:`_trusted_link` says so (else ``O_NOFOLLOW``: one planted after the check fails the
    open), a FIFO is opened without blocking (no reader: an error, not a hang); what is
    opened must be a regular file, a FIFO or a terminal (``/dev/stdout`` works, ``/dev/full``
    does not), and not another user's file in a sticky world-writable directory (/tmp). A
    directory, a missing directory, a permission problem: :class:`AgentError`, one line."""
    if not path:
        raise AgentError(f"{what} path is empty")
    parent = Path(path).parent
    if not parent.is_dir():
        raise AgentError(f"{what} {path}: directory {parent} does not exist (create it first)")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    if not _trusted_link(path, what):
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AgentError(f"{what} {path} is a symbolic link: not followed (give the real "
                             "path)") from None
        if exc.errno == errno.ENXIO:
            raise AgentError(f"{what} {path} is a FIFO with no reader") from None
        raise AgentError(f"cannot open {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or os.isatty(fd)):
            # /dev/full, /dev/null, a disk: nothing a JSONL log is kept in
            raise AgentError(f"{what} {path} is a device, not a file")
        pst = os.stat(parent)
        if (pst.st_mode & (stat.S_ISVTX | stat.S_IWOTH)) == (stat.S_ISVTX | stat.S_IWOTH) \
                and st.st_uid not in (os.geteuid(), pst.st_uid):
            # a file another user made in a sticky world-writable directory (/tmp): it
            # would get what watch logs (fs.protected_regular=2 refuses such opens too)
            raise AgentError(f"{what} {path} belongs to uid {st.st_uid} in the shared "
                             f"directory {parent}: not written")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_output_dir(path: str, what: str) -> int:
    """A descriptor of directory ``path``, created (one level, mode 0755) when missing; its
    parent must exist. A symlink, and another user's directory in a sticky world-writable
    one, as :func:`open_output` treats them."""
    if not path:
        raise AgentError(f"{what} path is empty")
    parent = Path(path).parent
    if not parent.is_dir():
        raise AgentError(f"{what} {path}: directory {parent} does not exist (create it first)")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    if not _trusted_link(path, what):
        flags |= os.O_NOFOLLOW
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            raise AgentError(f"cannot create {what} {path}: {exc.strerror}") from None
    try:
        dfd = os.open(path, flags)
    except OSError as exc:
        why = "is a symbolic link: not followed" if exc.errno == errno.ELOOP else \
            "is not a directory" if exc.errno == errno.ENOTDIR else exc.strerror
        raise AgentError(f"{what} {path}: {why}") from None
    st, pst = os.fstat(dfd), os.stat(parent)
    if (pst.st_mode & (stat.S_ISVTX | stat.S_IWOTH)) == (stat.S_ISVTX | stat.S_IWOTH) \
            and st.st_uid not in (os.geteuid(), pst.st_uid):
        os.close(dfd)
        raise AgentError(f"{what} {path} belongs to uid {st.st_uid} in the shared directory "
                         f"{parent}: not written")
    return dfd


def write_new(dfd: int, name: str, data: bytes) -> None:
    """Write ``data`` as file ``name`` of directory ``dfd``: a new file under a random name
    (``O_EXCL|O_NOFOLLOW``, mode 0644), renamed over ``name`` (never written through a
    symlink there); the temporary file removed on any error."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=dfd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise

