"""Paths that tuning writes, resolved so that a symlink can never take a write elsewhere.

Tuning runs as root. Everything it writes — the /proc and /sys targets, the journal, its
lock — is reached through paths an unprivileged user may have influenced: a ``--root`` tree
they own, a ``--state-dir`` under /tmp. Three rules, used by tuning/tunables/base.py (targets)
and tuning/journal.py (the state directory):

- :func:`resolve_beneath` resolves a path below a base directory component by component
  (``lstat``, never ``stat``), asks a policy about every symlink it meets, refuses a symlink
  as the last component, and returns the real path, which holds no symlink at all;
- :func:`open_real` opens such a real path walking it from ``/`` with ``O_NOFOLLOW`` on every
  component (``O_PATH`` directories, then ``openat``): a symlink swapped in after the check
  makes the open fail (ELOOP/ENOTDIR) instead of being followed — no check-then-use race;
- :func:`open_dir` opens (and creates, 0700) a directory either strictly below a base with no
  symlink at all, or from ``/`` following only symlinks owned by root or by us (what
  ``fs.protected_symlinks`` does for sticky directories, applied everywhere), and accepts it
  only when it is owned by root or by us and not writable by group or others. Callers then
  use the returned descriptor with ``dir_fd=``: the directory cannot be swapped under them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

MAX_LINKS = 40  # as the kernel's own symlink-follow limit


class UnsafePath(OSError):
    """A path refused because it leaves where it must stay (a symlink out of a root, a
    symlink as the file itself, a file that is not a regular file, a directory others may
    write). An OSError (ELOOP) so a refused write is a failed write, never a written one."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(errno.ELOOP, message, path or None)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _trusted_uids() -> tuple[int, ...]:
    return (0, os.geteuid())


def resolve_beneath(base: Path, parts: list[str],
                    allow_link: Callable[[Path, Path], str | None]) -> Path:
    """The real path of ``base/parts...``, ``base`` being a real directory path.

    Every symlink met on the way is resolved and passed to ``allow_link(link, destination)``,
    which returns None to follow it or the reason it is refused. The last component must be
    a regular file (never a symlink, FIFO or device). Raises UnsafePath when refused and the
    plain OSError (ENOENT, ENOTDIR, EACCES) when the path is not there."""
    todo = [p for p in parts if p not in ("", ".")]
    if any(p == ".." for p in todo):
        raise UnsafePath(f"{base}/{'/'.join(parts)}: '..' is refused")
    cur = str(base)  # strings, not Path: this runs for every read and write of a target
    links = 0
    todo.reverse()
    while todo:
        name = todo.pop()
        nxt = f"{cur}/{name}" if cur != "/" else f"/{name}"
        st = os.lstat(nxt)
        if stat.S_ISLNK(st.st_mode):
            if not todo:
                raise UnsafePath(f"{nxt} is a symlink (the file itself is never followed)",
                                 nxt)
            links += 1
            if links > MAX_LINKS:
                raise UnsafePath(f"{nxt}: too many symlinks", nxt)
            dest = Path(os.path.realpath(nxt))
            why = allow_link(Path(nxt), dest)
            if why:
                raise UnsafePath(f"{nxt} is a symlink to {dest}: {why}", nxt)
            cur = str(dest)
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), nxt)
        if not todo and not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{nxt} is not a regular file", nxt)
        cur = nxt
    if cur == str(base):
        raise UnsafePath(f"{base} is not a regular file", cur)
    return Path(cur)


def _walk_dirs(real: Path) -> int:
    """An O_PATH descriptor of the real directory ``real``, walked from / with O_NOFOLLOW on
    every component (a symlink anywhere is ELOOP/ENOTDIR, never followed)."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in real.parts[1:]:
            nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_real(real: Path, flags: int, mode: int = 0o600) -> int:
    """Open the file at the real path ``real`` (no symlink in it) without following any
    symlink, and only when it is a regular file. ``O_NONBLOCK`` is added: a FIFO planted
    there fails (ENXIO) or is refused instead of blocking the open."""
    if not real.is_absolute():
        real = Path(os.path.abspath(real))
    dfd = _walk_dirs(real.parent)
    try:
        fd = os.open(real.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{real} is not a regular file", str(real))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _checked_realpath(path: Path) -> Path:
    """os.path.realpath, following only symlinks owned by root or by us (a symlink another
    user planted in /tmp is refused). Components that do not exist yet are kept as given."""
    trusted = _trusted_uids()
    todo = list(Path(os.path.abspath(path)).parts[1:])
    cur = Path("/")
    links = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent  # cur holds no symlink, so its parent is the real parent
            continue
        nxt = cur / name
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return nxt.joinpath(*todo)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise UnsafePath(f"{nxt}: too many symlinks", str(nxt))
            if st.st_uid not in trusted:
                raise UnsafePath(f"{nxt} is a symlink owned by uid {st.st_uid}, not by root "
                                 "or us: not followed", str(nxt))
            link = os.readlink(nxt)
            if link.startswith("/"):
                cur = Path("/")
            todo = [p for p in Path(link).parts if p != "/"] + todo
            continue
        cur = nxt
    return cur


def open_dir(path: Path, *, create: bool, beneath: Path | None = None) -> int | None:
    """A read-only descriptor of the directory ``path``, or None when it does not exist and
    ``create`` is False. Missing components are created with mode 0700 when ``create``.

    ``beneath`` (a ``--root`` tree that ``path`` lies in): the components below it must all
    be real directories — a symlink there (``ROOT/run`` -> /etc) is refused, so the journal
    and its lock stay inside the tree. Otherwise the path is resolved from / following only
    symlinks owned by root or by us. Either way the directory itself must be owned by root or
    by us and not writable by group or others. Raises UnsafePath or OSError."""
    absolute = Path(os.path.abspath(path))
    if beneath is not None:
        under = Path(os.path.abspath(beneath))
        start = Path(os.path.realpath(under))
        rest = list(absolute.relative_to(under).parts)
    else:
        real = _checked_realpath(absolute)
        start, rest = Path("/"), list(real.parts[1:])
    fd = _walk_dirs(start)
    try:
        for i, name in enumerate(rest):
            try:
                nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None  # fd is closed below
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass  # created in between: opened (and checked) below like any other
                nfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                where = start.joinpath(*rest[:i + 1])
                if stat.S_ISLNK(st.st_mode):
                    raise UnsafePath(f"{where} is a symlink: refused (the state directory "
                                     "must not lead out of the root)" if beneath is not None
                                     else f"{where} became a symlink: refused",
                                     str(where)) from None
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                                         str(where)) from None
            os.close(fd)
            fd = nfd
        # the final directory, readable (fsync, listdir need a real descriptor)
        rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        st = os.fstat(rfd)
        if st.st_uid not in _trusted_uids():
            raise UnsafePath(f"{absolute} is owned by uid {st.st_uid}, not by root or us: "
                             "refused", str(absolute))
        if st.st_mode & 0o022:
            raise UnsafePath(f"{absolute} is writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): refused", str(absolute))
    except BaseException:
        os.close(rfd)
        raise
    return rfd


def read_fd_bounded(fd: int, limit: int) -> bytes:
    """Read ``fd`` to its end, but never more than ``limit`` + 1 bytes: a result longer than
    ``limit`` says the file grew past it while being read (the caller refuses it)."""
    chunks, got = [], 0
    while got <= limit:
        b = os.read(fd, min(1 << 20, limit + 1 - got))
        if not b:
            break
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a file the user named (a profile, a saved result), at most ``limit``.

    Regular files only: ``/dev/zero`` would read forever and a FIFO would block the open
    forever (``O_NONBLOCK`` makes that open return, and the file type check refuses it).
    Symlinks are followed: the user named the path. Raises FileNotFoundError, UnsafePath (not
    a regular file, too big) or another OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath("not a regular file", str(path))
        if st.st_size > limit:
            raise UnsafePath(f"{st.st_size:,} bytes, more than {limit:,}", str(path))
        data = read_fd_bounded(fd, limit)
        if len(data) > limit:
            raise UnsafePath(f"more than {limit:,} bytes", str(path))
        return data
    finally:
        os.close(fd)
