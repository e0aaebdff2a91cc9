"""Paths that tuning writes, resolved so that a symlink can never take a write elsewhere.

Tuning runs as root. Everything it writes — the /proc and /sys targets, the journal, its
lock — is reached through paths an unprivileged user may have influenced: a ``--root`` tree
they own, a ``--state-dir`` under /tmp. Four rules, used by tuning/tunables/base.py (the
targets), tuning/journal.py (the state directory) and the agent (every directory it writes
into):

- :func:`resolve_beneath` resolves a path below a base directory component by component
  (``lstat``, never ``stat``), asks a policy about every symlink it meets, refuses a symlink
  as the last component, and returns the real path, which holds no symlink at all;
- :func:`open_real` opens such a real path walking it from ``/`` with ``O_NOFOLLOW`` on every
  component (``O_PATH`` directories, then ``openat``): a symlink swapped in after the check
  makes the open fail (ELOOP/ENOTDIR) instead of being followed — no check-then-use race;
- :class:`Walk` is the one rule for every directory we create or write into (issue #34 item
  2; this tree's state directory, the history database's, every output of agent/outfile.py):
  from / down, each directory is opened ``openat(O_PATH|O_DIRECTORY|O_NOFOLLOW)`` below the
  one before and checked with ``fstat`` — owned by root or by us, and not writable by group
  or others unless sticky (a root-owned sticky directory like /tmp: nobody else can rename
  or remove what we make there); a symlink is followed only when root or we own it (what
  ``fs.protected_symlinks`` does for sticky directories, applied everywhere), its text
  walked by the same rule. A refusal names the component and why. Whoever else is on the
  box can then change nothing on the path: not a name in it, not a mode, not an owner;
- :func:`open_dir` opens (and creates, 0700, each missing level in a directory the walk
  has passed) a directory by that walk, either strictly below a base with no symlink at all
  below it, or from ``/``, and accepts it only when it is not writable by group or others
  at all. Callers then use the returned descriptor with ``dir_fd=``: the directory cannot be
  swapped under them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Self

MAX_LINKS = 40  # as the kernel's own symlink-follow limit


_STEP_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path refused because it leaves where it must stay (a symlink out of a root, a
    symlink as the file itself, a file that is not a regular file, a directory others may
    write). An OSError (ELOOP) so a refused write is a failed write, never a written one.
    ``missing``: refused because a directory on the way does not exist (ENOENT)."""

    def __init__(self, message: str, path: str = "", *, missing: bool = False) -> None:
        super().__init__(errno.ENOENT if missing else errno.ELOOP, message, path or None)
        self.message = message
        self.missing = missing

    def __str__(self) -> str:
        return self.message


def trusted_uids() -> tuple[int, ...]:
    """The owners whose directories and links the walk trusts: root and us (effective)."""
    return (0, os.geteuid())


def show(path: str | os.PathLike[str]) -> str:
    """``path`` as a message prints it: a name with a newline or another control character in
    it is shown quoted, so that the error stays one line."""
    s = os.fspath(path)
    return s if s.isprintable() else ascii(s)


def unsafe_dir(st: os.stat_result) -> str | None:
    """Why a directory is unsafe to write below (module docstring), or None: owned by
    someone other than root or us, or writable by group or others and not sticky."""
    if st.st_uid not in trusted_uids():
        return f"belongs to uid {st.st_uid}, not to root or us"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}) and "
                "not sticky")
    return None


class Walk:
    """The walk from / of every directory we create or write into (module docstring, issue
    #34 item 2): every directory entered is opened ``O_PATH|O_DIRECTORY|O_NOFOLLOW`` below
    the last and passes :func:`unsafe_dir`; a link is followed only when root or we own it
    (its text walked in its place, by the same rule). :attr:`fd` and :attr:`where` (the real
    path) are the last directory. Refusals are :meth:`fail`'s (UnsafePath here; the output
    opener's subclass, agent/outfile.py, makes them OutputErrors naming the option). Close
    it (a context manager)."""

    def __init__(self) -> None:
        self.stack: list[tuple[int, str]] = []  # (descriptor, real path) from / down
        self.links = 0
        self.to_root()

    def fail(self, why: str, *, missing: bool = False) -> Exception:
        return UnsafePath(why, missing=missing)

    @property
    def fd(self) -> int:
        return self.stack[-1][0]

    @property
    def where(self) -> str:
        return self.stack[-1][1]

    def join(self, name: str) -> str:
        return f"/{name}" if self.where == "/" else f"{self.where}/{name}"

    def close(self) -> None:
        while self.stack:
            os.close(self.stack.pop()[0])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_root(self) -> None:
        self.close()
        self._push(os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), "/")

    def _push(self, fd: int, where: str) -> None:
        try:
            why = unsafe_dir(os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        if why:
            os.close(fd)
            raise self.fail(f"{show(where)} {why}: refused")
        self.stack.append((fd, where))

    def go(self, parts: list[str], *, make: int | None = None) -> None:
        """Walk ``parts`` (names, ``..``, ``.``) from the last directory. ``make``: a missing
        directory is created with this mode (in a directory that passed the rule) instead of
        refused."""
        todo = list(parts)
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if len(self.stack) > 1:  # every entry is a real directory: its real parent
                    os.close(self.stack.pop()[0])
                continue
            text = self.step(name, todo, make=make)
            if text is not None:  # a link we may follow: its text in its place
                if text.startswith("/"):
                    self.to_root()
                todo[:0] = text.split("/")

    def step(self, name: str, rest: list[str] | None = None, *,
             make: int | None = None) -> str | None:
        """Enter directory ``name``, or return the text of the link ``name`` when root or we
        own it. ``rest``: what is left to walk (for the message of a missing directory);
        ``make``: create ``name`` (this mode) when missing."""
        nxt = self.join(name)
        try:
            fd = os.open(name, _STEP_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            if make is None:
                full = "/".join([nxt, *(p for p in rest or () if p)])
                raise self.fail(f"directory {show(full)} does not exist (create it first)",
                                missing=True) from None
            try:
                os.mkdir(name, make, dir_fd=self.fd)
            except FileExistsError:
                pass  # made in between: entered (and checked) below like any other
            except OSError as exc:
                raise self.fail(f"cannot create {show(nxt)}: {exc.strerror or exc}") from None
            return self.step(name, rest)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise self.fail(f"{show(nxt)}: {exc.strerror or exc}") from None
            return self.link_text(name)
        self._push(fd, nxt)
        return None

    def link_text(self, name: str) -> str:
        """The text of the link ``name`` of the last directory, when root or we own it;
        :meth:`fail` for anything else (not a directory, another user's link)."""
        nxt = show(self.join(name))
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            text = os.readlink(name, dir_fd=self.fd) if stat.S_ISLNK(st.st_mode) else ""
        except OSError as exc:
            raise self.fail(f"{nxt}: {exc.strerror or exc}") from None
        if not stat.S_ISLNK(st.st_mode):
            raise self.fail(f"{nxt} is not a directory" if not stat.S_ISDIR(st.st_mode)
                            else f"{nxt} changed while it was checked: refused")
        if st.st_uid not in trusted_uids():
            raise self.fail(f"{nxt} is a symbolic link owned by uid {st.st_uid}: not "
                            "followed (only root's and our own are)")
        self.links += 1
        if self.links > MAX_LINKS:
            raise self.fail(f"{nxt}: too many levels of symbolic links")
        return text

    def open_last(self) -> int:
        """A read-only descriptor of the last directory (the walk's own stay open)."""
        try:
            return os.open(".", _DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise self.fail(f"{show(self.where)}: {exc.strerror or exc}") from None


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


def open_dir(path: Path, *, create: bool, beneath: Path | None = None) -> int | None:
    """A read-only descriptor of the directory ``path``, or None when it does not exist and
    ``create`` is False. Missing components are created with mode 0700 when ``create``.

    Every directory from / down is walked by :class:`Walk`'s rule (issue #34 item 2: root's
    or ours, writable by nobody else unless root's and sticky, no other user's link
    followed) before anything is created in it, so a refusal leaves nothing behind.
    ``beneath`` (a ``--root`` tree that ``path`` lies in): the components below it must all
    be real directories — a symlink there (``ROOT/run`` -> /etc) is refused, so the journal
    and its lock stay inside the tree. The directory itself must not be writable by group
    or others at all (sticky or not). Raises UnsafePath (naming the component) or OSError."""
    absolute = Path(os.path.abspath(path))
    make = 0o700 if create else None
    try:
        with Walk() as w:
            if beneath is None:
                w.go(list(absolute.parts[1:]), make=make)
            else:
                under = Path(os.path.abspath(beneath))
                w.go(list(under.parts[1:]))
                for name in absolute.relative_to(under).parts:
                    if w.step(name, make=make) is not None:
                        raise UnsafePath(f"{show(w.join(name))} is a symlink: refused (the "
                                         "state directory must not lead out of the root)")
            rfd = w.open_last()
    except UnsafePath as exc:
        if exc.missing and not create:
            return None
        raise
    st = os.fstat(rfd)
    if st.st_mode & 0o022:
        os.close(rfd)
        raise UnsafePath(f"{show(absolute)} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}): refused", str(absolute))
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
