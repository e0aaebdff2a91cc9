"""The files ``hftagent watch`` writes, opened as a program that runs as root must in a
shared directory: the spike log (:class:`SpikeLog`, :func:`open_output`) and the flight
records' directory (:func:`open_output_dir`, :func:`write_new`).

Both are opened by agent/outfile.py's one rule (every directory from / down root's or ours and
not writable by others, no other user's link followed); the spike log's directory must exist
(never created), a FIFO without a reader is an error rather than a hang, and a write
error (``/dev/full``, a full disk) ends the run with exit code 1 and one line. Flight records
are written under random temporary names (``O_EXCL|O_NOFOLLOW``) and renamed into place.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable


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


def open_output(path: str, what: str) -> int:
    """Open ``path`` for appending: :func:`agent.outfile.open_append` (every directory from /
    down root's or ours and not writable by others, no other user's link followed, the
    directory never created; a regular file of ours, a FIFO with a reader or a terminal)."""
    from agent.outfile import open_append
    return open_append(path, what)


def open_output_dir(path: str, what: str) -> int:
    """A descriptor of directory ``path``, created (one level, mode 0755) when missing; its
    parent must exist: :func:`agent.outfile.open_dir` (the same rule as the spike log's)."""
    from agent.outfile import open_dir
    return open_dir(path, what, create=True)


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

