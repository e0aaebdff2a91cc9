"""The rootable Host model: every /proc and /sys path the agent touches is resolved here.

A Host is built from a root directory (``/`` on a live box, a fixture tree in tests) with
optional ``procfs`` / ``sysfs`` overrides, the way node_exporter takes ``--path.procfs`` and
``--path.sysfs``. Nothing outside this module spells "/proc" or "/sys".

Reads never raise for the ordinary ways a file can be missing: they return a :class:`Reading`
whose ``value`` is ``None`` and whose ``reason`` says why (absent, permission, unsupported,
error). Missing is never 0.

Files read over and over (watch's /proc/<pid>/schedstat, /proc/stat ...) are read with
``os.pread`` on descriptors kept open (:meth:`Host.open_hot`, :class:`HotFile`): 0.6 µs
against 8.7 µs for open+read, measured on a 2-CPU KVM guest.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Generic, TypeVar

T = TypeVar("T")

ABSENT = "absent"
PERMISSION = "permission"
UNSUPPORTED = "unsupported"
ERROR = "error"


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A value read from the host, or ``None`` with the reason it could not be read."""

    value: T | None
    path: str
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.value is not None

    def map(self, fn) -> Reading:
        """Apply a pure parser to the value; a parser error becomes an ``error`` reading."""
        if self.value is None:
            return self
        try:
            return Reading(fn(self.value), self.path)
        except (ValueError, IndexError, KeyError) as exc:
            return Reading(None, self.path, f"{ERROR}: cannot parse: {exc}")


def _nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)


class HostError(Exception):
    """The host tree itself is unusable (e.g. the root does not exist)."""


def _reason_for(exc: OSError) -> str:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ABSENT
    if exc.errno in (errno.EACCES, errno.EPERM):
        return PERMISSION
    if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENODEV, errno.ENXIO):
        return f"{UNSUPPORTED}: {os.strerror(exc.errno)}"
    return f"{ERROR}: {exc.strerror or exc}"


class HotFile:
    """A /proc or /sys file kept open and re-read with ``os.pread`` (no open/close per read)."""

    __slots__ = ("path", "fd", "_size")

    def __init__(self, path: str, size: int = 65536) -> None:
        self.path = path
        self.fd = -1  # set first: __del__ must work even when open() below raises
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._size = size

    def read(self) -> bytes:
        data = os.pread(self.fd, self._size, 0)
        if len(data) < 1024:
            return data  # short: all of it (a file bigger than this returns at least a page)
        # A seq_file with many records (/proc/interrupts on a big box, /proc/vmstat with many
        # counters) hands out about one page per read whatever the buffer: read on at the
        # offset reached until a read returns nothing.
        parts = [data]
        got = len(data)
        while True:
            more = os.pread(self.fd, max(self._size - got, 4096), got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        if got > self._size // 2:
            self._size = max(self._size, 2 * got)
        return data if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except OSError:
            pass


class Host:
    """Resolves /proc and /sys paths under a root and reads them safely.

    ``Host()`` is the live machine. ``Host(root="tests/fixtures/vm")`` reads a captured tree:
    ``<root>/proc/...`` and ``<root>/sys/...``; ``procfs``/``sysfs`` override each mount
    independently. ``live`` is True only when both mounts are the real ones, which is what
    decides whether process-level facts (running processes, PIDs, environment of ``--pid``)
    may be taken from the kernel through psutil-like means.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        procfs: str | os.PathLike[str] | None = None,
        sysfs: str | os.PathLike[str] | None = None,
    ) -> None:
        root_p = Path(root)
        if not root_p.is_dir():
            raise HostError(f"root {str(root)!r} is not a directory")
        self.root = root_p
        self.procfs = Path(procfs) if procfs is not None else root_p / "proc"
        self.sysfs = Path(sysfs) if sysfs is not None else root_p / "sys"
        for name, p in (("procfs", self.procfs), ("sysfs", self.sysfs)):
            if (procfs is not None or sysfs is not None or root_p != Path("/")) and not p.is_dir():
                raise HostError(f"{name} {str(p)!r} is not a directory")
        self.live = self.procfs.resolve() == Path("/proc") and self.sysfs.resolve() == Path("/sys")

    def __repr__(self) -> str:
        return f"Host(procfs={str(self.procfs)!r}, sysfs={str(self.sysfs)!r})"

    @property
    def touches_live(self) -> bool:
        """True when *either* mount is the real /proc or /sys: a write through this Host could
        reach the running kernel (``live`` needs both, for process-level facts)."""
        return self.procfs.resolve() == Path("/proc") or self.sysfs.resolve() == Path("/sys")

    # -- path resolution ---------------------------------------------------------------------
    def proc(self, *parts: str | int) -> Path:
        """Path under procfs: ``host.proc("irq", 5, "smp_affinity_list")``."""
        return self.procfs.joinpath(*map(str, parts))

    def sys(self, *parts: str | int) -> Path:
        """Path under sysfs: ``host.sys("devices/system/cpu/online")``."""
        return self.sysfs.joinpath(*map(str, parts))

    def etc(self, *parts: str) -> Path:
        """Path under the root's /etc (os-release, tuned's active profile...)."""
        return self.root.joinpath("etc", *parts)

    def run_dir(self, *parts: str) -> Path:
        return self.root.joinpath("run", *parts)

    def display(self, path: Path) -> str:
        """The path as a user would read it on the box itself (``/proc/...``), for evidence."""
        for base, mount in ((self.procfs, "/proc"), (self.sysfs, "/sys"), (self.root, "")):
            try:
                rel = path.relative_to(base)
            except ValueError:
                continue
            return f"{mount}/{rel}" if str(rel) != "." else (mount or "/")
        return str(path)

    # -- reading -----------------------------------------------------------------------------
    def read(self, path: Path) -> Reading[str]:
        """Read a whole text file, stripped of its trailing newline. Regular files only: a
        FIFO planted in a --root tree would block open() (and read()) forever."""
        shown = self.display(path)
        try:
            with open(path, "rb", buffering=0, opener=_nonblocking) as fh:
                if not S_ISREG(os.fstat(fh.fileno()).st_mode):
                    return Reading(None, shown, f"{ERROR}: not a regular file")
                return Reading(fh.read().decode("utf-8", "replace").rstrip("\n"), shown)
        except OSError as exc:
            return Reading(None, shown, _reason_for(exc))

    def read_int(self, path: Path) -> Reading[int]:
        return self.read(path).map(lambda s: int(s.split()[0]))

    def exists(self, path: Path) -> bool:
        return path.exists()

    def listdir(self, path: Path) -> list[str]:
        """Entries of a directory, sorted; empty when it is absent or unreadable."""
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def glob_dirs(self, path: Path, prefix: str) -> Iterator[tuple[str, Path]]:
        for name in self.listdir(path):
            if name.startswith(prefix):
                yield name, path / name

    def readlink(self, path: Path) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def open_hot(self, path: Path) -> HotFile:
        """Open a file for repeated ``pread`` (watch's sampler). Raises OSError."""
        return HotFile(str(path))

    # -- process helpers ---------------------------------------------------------------------
    def pids(self) -> list[int]:
        return sorted(int(n) for n in self.listdir(self.procfs) if n.isdigit())

    def boot_id(self) -> str | None:
        return self.read(self.proc("sys/kernel/random/boot_id")).value
