"""The one opener for every file and directory a command writes at a path the user gave
(issue #30 item 2, issue #34 item 2): ``probe --csv/--plot``, ``cpus --plot``, ``history
export/plot --out``, ``profile --keep-csv``, ``capture --out``, ``deploy --out``, ``watch
--spike-log/--flight-dir``, the history database (``--db``, ``$HFTAGENT_DB``), ``audit
--fix-script`` and ``--textfile``.

A command often runs as root, and the path it is given often lies in a directory another user
can write (/tmp, a shared results directory, a home that ``sudo`` kept), or below one another
user owns. Whatever that user can rename there, they can swap for a link or a directory of
their own after we looked (root then writes a systemd unit where they can replace it). One
rule, the same for every output:

- **Every directory from / down is safe** (:class:`_Walk`, tuning/safepath.py's
  :class:`~tuning.safepath.Walk`: the one walk, which tune's state directory and the
  history database's default directory use too): owned by root or by us, and not
  writable by group or others unless sticky (a root-owned sticky directory like /tmp is safe:
  nobody else can rename or remove what we create there). The walk opens each component with
  ``openat(O_PATH|O_DIRECTORY|O_NOFOLLOW)`` below the one before and checks it with
  ``fstat``; the file or directory we make is created relative to the last descriptor, so a
  rename after the check cannot redirect us.
- **No symlink of another user is followed** (``fs.protected_symlinks``, applied
  everywhere): a link on the way that root or we own (``/var/run`` -> ``/run``, the
  operator's own) is read with ``readlinkat`` and its text walked by the same rule; another
  user's is refused. The file itself is never a symlink: one there is refused, not followed
  and not replaced (the spike log alone follows a link of root's or ours there, by the same
  walk, and a descriptor link of our own process through the kernel: ``/dev/stdout``,
  :func:`open_append`).
- **An existing file is replaced only when it is a regular file we own** (the effective uid).
  A FIFO (which would block the open until a reader came), a directory, a device, a socket
  and another user's file are refused with one line and left as they are.
- **Nothing is written through the path.** A file is written to a temporary file with an
  unpredictable name in the same directory (``O_CREAT|O_EXCL|O_NOFOLLOW``), fsync'd and
  renamed over the path once complete: no half-written output is ever at the path, and a
  rename replaces a directory entry, never the file another user swapped in meanwhile.
- ``exclusive=True`` (a script that root will run later): the file is created at the path
  itself with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (anything there already is refused).
- **Missing directories are never created above the output** (``mkdir -p`` as root makes
  directories wherever a typo points): a missing one is an error. Only the output directory
  itself is made (``capture --out DIR``, :func:`create_dir`: a new one; ``deploy --out`` and
  ``--flight-dir``, :func:`open_dir`: when missing); its parent must exist.

Every refusal is an :class:`OutputError` (an AgentError: one line, exit 1) that names the
option, the path and, for a directory on the way, the component and why.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from pathlib import Path
from typing import IO, Any

from agent.errors import AgentError
from tuning.safepath import UnsafePath, Walk, show, unsafe_dir
from tuning.safepath import trusted_uids as _trusted

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# a descriptor link of a process (/dev/stdout -> /proc/self/fd/1 -> "pipe:[123]"): the
# kernel opens the open file itself, no path; the walk has checked the directory is ours
_FD_DIR = re.compile(r"/proc/\d+(/task/\d+)?/fd")


class OutputError(AgentError):
    """An output path refused or not writable (the message names the option and the path).
    ``missing``: refused because a directory on the way does not exist."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def _kind(st: os.stat_result) -> str | None:
    """Why ``st`` is no file to write, or None for a regular file."""
    m = st.st_mode
    if stat.S_ISREG(m):
        return None
    if stat.S_ISLNK(m):
        return "is a symbolic link: not followed (give the real path)"
    if stat.S_ISDIR(m):
        return "is a directory, not a file"
    if stat.S_ISFIFO(m):
        return "is a FIFO, not a regular file"
    if stat.S_ISCHR(m) or stat.S_ISBLK(m):
        return "is a device, not a regular file"
    return "is not a regular file"


class Target:
    """Where a path the user gave leads: its real directory (open, :attr:`dfd`), the file's
    name there and what is there now (:attr:`st`, from ``lstat``; None: nothing). Made by
    :func:`locate`; use as a context manager (the directory descriptor is closed on exit)."""

    def __init__(self, path: str, opt: str, directory: Path, name: str, dfd: int,
                 st: os.stat_result | None) -> None:
        self.path, self.opt, self.directory, self.name = path, opt, directory, name
        self.dfd, self.st = dfd, st
        self.shown = show(path)

    @property
    def real(self) -> Path:
        """The file's real path (no symlink in it)."""
        return self.directory / self.name

    def error(self, why: str) -> OutputError:
        """OutputError "OPT PATH why" (``why`` may start with ':')."""
        return OutputError(f"{self.opt} {self.shown}{'' if why.startswith(':') else ' '}{why}")

    def restat(self) -> os.stat_result | None:
        """``lstat`` of the name again (None: nothing there)."""
        try:
            self.st = os.stat(self.name, dir_fd=self.dfd, follow_symlinks=False)
        except FileNotFoundError:
            self.st = None
        except OSError as exc:
            raise self.error(f": {exc.strerror or exc}") from None
        return self.st

    def check_replaceable(self) -> None:
        """Refuse what is at the path unless it is nothing or a regular file we own."""
        if self.st is None:
            return
        why = _kind(self.st)
        if why:
            raise self.error(why)
        if self.st.st_uid != os.geteuid():
            raise self.error(f"belongs to uid {self.st.st_uid}, not to us (uid "
                             f"{os.geteuid()}): not replaced")

    def check_private_dir(self) -> None:
        """Refuse a directory that another user could change under us (:func:`unsafe_dir`;
        :func:`locate`'s walk has checked it and every one above it already: this is for
        callers that keep a Target while others may act)."""
        why = unsafe_dir(os.fstat(self.dfd))
        if why:
            raise self.error(f": its directory {show(self.directory)} {why}: refused")

    def check_writable_dir(self) -> None:
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise self.error(f": cannot write in {show(self.directory)}: permission denied")

    def close(self) -> None:
        if self.dfd >= 0:
            os.close(self.dfd)
            self.dfd = -1

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parts(path: str) -> list[str]:
    """The components of ``path`` from /, as given (``..`` is the walk's: after a link)."""
    if not path.startswith("/"):
        try:
            path = f"{os.getcwd()}/{path}"
        except FileNotFoundError:
            raise OutputError("the current directory was removed: give an absolute path"
                              ) from None
    return path.split("/")


class _Walk(Walk):
    """The walk of every directory on the way (tuning/safepath.py's :class:`Walk`, the one
    rule of the module docstring), its refusals OutputErrors naming ``opt`` and ``shown``."""

    def __init__(self, opt: str, shown: str) -> None:
        self.opt, self.shown = opt, shown
        super().__init__()

    def fail(self, why: str, *, missing: bool = False) -> OutputError:
        return OutputError(f"{self.opt} {self.shown}: {why}", missing=missing)


def _open_parent(parent: str, opt: str, shown: str) -> tuple[Path, int]:
    """The real path of directory ``parent`` and a read-only descriptor of it, walked by the
    module docstring's rule (:class:`_Walk`)."""
    with _Walk(opt, shown) as w:
        w.go(_parts(parent))
        return Path(w.where), w.open_last()


def locate(path: str | os.PathLike[str], opt: str) -> Target:
    """The :class:`Target` of an output path (nothing is created or changed). Raises
    OutputError for an empty path, one that names a directory, a missing or unsafe directory;
    what is at the path itself is for the caller to judge (:meth:`Target.check_replaceable`)."""
    p = os.fspath(path)
    if not p.strip():
        raise OutputError(f"{opt} is empty: give a file")
    shown = show(p)
    head, name = os.path.split(p)
    if name in ("", ".", ".."):
        raise OutputError(f"{opt} {shown} names a directory, not a file")
    real, dfd = _open_parent(head or ".", opt, shown)
    t = Target(p, opt, real, name, dfd, None)
    try:
        t.restat()
    except BaseException:
        t.close()
        raise
    return t


def check_output(path: str | os.PathLike[str], opt: str, *, exclusive: bool = False) -> None:
    """Refuse now, before any work, an output path :func:`open_output` would refuse (and
    one in a directory we cannot write): a typo must not cost a scan or a probe run."""
    with locate(path, opt) as t:
        t.check_replaceable()
        if exclusive:
            if t.st is not None:
                raise t.error("already exists: not replaced (give a new file)")
            t.check_private_dir()
        t.check_writable_dir()


class Output:
    """A file being written by :func:`open_output`. Write to it (or to :attr:`file`, the
    underlying file object); :meth:`close` puts it in place (fsync, then the rename) and
    :meth:`discard` removes it. As a context manager: closed on success, discarded on error,
    and an OSError (a full disk) becomes one OutputError line."""

    def __init__(self, t: Target, fd: int, tmp: str | None, binary: bool) -> None:
        self.path, self.opt, self._t, self._tmp = t.path, t.opt, t, tmp
        self._done = False
        self.file: IO[Any] = (os.fdopen(fd, "wb") if binary else
                              os.fdopen(fd, "w", encoding="utf-8", newline=""))

    @property
    def name(self) -> str:
        return self.path

    def write(self, data: Any) -> int:
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def fileno(self) -> int:
        return self.file.fileno()

    def _unlink_written(self) -> None:
        try:
            os.unlink(self._tmp or self._t.name, dir_fd=self._t.dfd)
        except OSError:
            pass

    def discard(self) -> None:
        """Remove what was written (the temporary file, or the new file when exclusive)."""
        if self._done:
            return
        self._done = True
        try:
            self.file.close()
        except OSError:
            pass
        self._unlink_written()
        self._t.close()

    def close(self) -> None:
        """Flush, fsync and put the file in place. Raises OutputError (the output removed)
        when that fails or when the path now holds something that may not be replaced."""
        if self._done:
            return
        t = self._t
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            if self._tmp is not None:
                t.restat()  # changed since it was checked? (a swap after this only replaces
                t.check_replaceable()  # a directory entry: the rename never writes through)
                os.rename(self._tmp, t.name, src_dir_fd=t.dfd, dst_dir_fd=t.dfd)
            os.fsync(t.dfd)  # the new name is durable only once the directory is on disk
        except OSError as exc:
            self.discard()
            raise OutputError(f"cannot write {self.opt} {t.shown}: {exc.strerror or exc}"
                              ) from None
        except BaseException:
            self.discard()
            raise
        self._done = True
        t.close()

    @property
    def closed(self) -> bool:
        return self._done

    def __enter__(self) -> Output:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        self.discard()
        if isinstance(exc, OSError) and not isinstance(exc, UnsafePath):
            raise OutputError(f"cannot write {self.opt} {self._t.shown}: "
                              f"{exc.strerror or exc}") from None


def open_output(path: str | os.PathLike[str], opt: str, *, mode: int = 0o644,
                exclusive: bool = False, binary: bool = False) -> Output:
    """Open an output file by the rules of the module docstring: an :class:`Output` (text,
    UTF-8, no newline translation; ``binary=True`` for bytes) that is put in place when
    closed. ``mode``: of a new file (less the umask); a file we replace keeps its own mode.
    ``exclusive``: created at the path itself, ``O_EXCL`` (see the module docstring).
    Raises OutputError (one line) when the path is refused or cannot be written."""
    t = locate(path, opt)
    try:
        t.check_replaceable()
        if exclusive:
            if t.st is not None:
                raise t.error("already exists: not replaced (give a new file)")
            t.check_private_dir()
            name, tmp = t.name, None
        else:
            name = tmp = f".hftagent-{secrets.token_hex(8)}.tmp"
            if t.st is not None:
                mode = stat.S_IMODE(t.st.st_mode)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode, dir_fd=t.dfd)
        except FileExistsError:
            raise t.error("already exists: not replaced (give a new file)") from None
        except OSError as exc:
            raise OutputError(f"cannot write {opt} {t.shown}: {exc.strerror or exc}") from None
        if t.st is not None and not exclusive:
            os.fchmod(fd, mode)  # the replaced file's own mode, not the umask's
    except BaseException:
        t.close()
        raise
    return Output(t, fd, tmp, binary)


def _split_dir(path: str | os.PathLike[str], opt: str) -> tuple[str, str, str]:
    """(shown, parent, name) of a directory path the user gave (trailing slashes dropped;
    ``name`` empty for / itself)."""
    p = os.fspath(path)
    if not p.strip():
        raise OutputError(f"{opt} is empty: give a directory")
    head, name = os.path.split(p.rstrip("/") or "/")
    return show(p), head or ".", name


def _mkdir(w: _Walk, name: str, mode: int) -> bool:
    """mkdirat ``name`` in the walk's last directory: True when made, False when something is
    there already."""
    try:
        os.mkdir(name, mode, dir_fd=w.fd)
    except FileExistsError:
        return False
    except OSError as exc:
        raise w.fail(f"cannot create it in {show(w.where)}: {exc.strerror or exc}") from None
    return True


def create_dir(path: str | os.PathLike[str], opt: str, *, mode: int = 0o755) -> int:
    """Create the new directory ``path`` (it must not exist: anything there, a symlink
    included, is refused; its parent must exist and pass the walk's rule) and return a
    read-only descriptor of it, opened with ``O_NOFOLLOW`` below the checked parent. The
    caller writes below the descriptor."""
    shown, head, name = _split_dir(path, opt)
    if name in ("", ".", ".."):
        raise OutputError(f"{opt} {shown} already exists; give a new directory")
    with _Walk(opt, shown) as w:
        w.go(_parts(head))
        if not _mkdir(w, name, mode):
            raise OutputError(f"{opt} {shown} already exists; give a new directory")
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=w.fd)
        except OSError as exc:
            raise w.fail(f"it changed while it was created: {exc.strerror or exc}") from None
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise OutputError(f"{opt} {shown}: it is not the directory we created")
    return fd


def open_dir(path: str | os.PathLike[str], opt: str, *, create: bool = False,
             mode: int = 0o755) -> int:
    """A read-only descriptor of the output directory ``path``, walked by the module
    docstring's rule (the directory itself included); made (``mode``, one level: its parent
    must exist) when missing and ``create``."""
    shown, head, name = _split_dir(path, opt)
    with _Walk(opt, shown) as w:
        w.go(_parts(head))
        if create and name not in ("", ".", ".."):
            _mkdir(w, name, mode)
        w.go([name])
        return w.open_last()


def open_below(dfd: int, name: str, opt: str, shown: str, *, create: bool = False,
               mode: int = 0o755) -> int:
    """A read-only descriptor of the real subdirectory ``name`` of the checked directory
    ``dfd`` (made when missing and ``create``): never a link, and by the walk's rule. For a
    tree a command writes (``deploy --out``): nothing below its top is followed."""
    where = show(name)
    if create:
        try:
            os.mkdir(name, mode, dir_fd=dfd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise OutputError(f"{opt} {shown}: cannot create {where}: {exc.strerror or exc}"
                              ) from None
    try:
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError as exc:
        why = ("is a symbolic link or not a directory: not followed" if exc.errno in
               (errno.ELOOP, errno.ENOTDIR) else exc.strerror or str(exc))
        raise OutputError(f"{opt} {shown}: {where} {why}") from None
    why = unsafe_dir(os.fstat(fd))
    if why:
        os.close(fd)
        raise OutputError(f"{opt} {shown}: {where} {why}: refused")
    return fd


def open_append(path: str | os.PathLike[str], opt: str) -> int:
    """Open ``path`` for appending (a descriptor; mode 0644 when created) by the module
    docstring's rule: the spike log. Its directory must exist; the file itself may be a link
    root or we own (``/dev/stdout``: its text walked by the same rule; a descriptor link of a
    process of ours opened by the kernel), a regular file of ours with one link, a FIFO (no
    reader: an error, not a hang) or a terminal; a directory, a device, another user's file:
    OutputError, one line."""
    p = os.fspath(path)
    if not p.strip():
        raise OutputError(f"{opt} is empty: give a file")
    shown = show(p)
    head, name = os.path.split(p)
    with _Walk(opt, shown) as w:
        w.go(_parts(head or "."))
        name, follow = _final_link(w, name)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags if follow else flags | os.O_NOFOLLOW, 0o644, dir_fd=w.fd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise OutputError(f"{opt} {shown} is a FIFO with no reader") from None
            raise OutputError(f"cannot open {opt} {shown}: {exc.strerror or exc}") from None
        try:
            _check_appendable(fd, w, opt, shown)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _final_link(w: _Walk, name: str) -> tuple[str, bool]:
    """Follow the links root or we own at the end of the walk (their directories walked by
    the rule): the file's name in :attr:`_Walk.fd`, and whether the kernel is to follow it
    (a descriptor link of one of our processes, ``/proc/PID/fd/N``)."""
    while True:
        if name in ("", ".", ".."):
            raise w.fail("names a directory, not a file")
        try:
            st = os.stat(name, dir_fd=w.fd, follow_symlinks=False)
        except FileNotFoundError:
            return name, False
        except OSError as exc:
            raise w.fail(f"{exc.strerror or exc}") from None
        if not stat.S_ISLNK(st.st_mode):
            return name, False
        if _FD_DIR.fullmatch(w.where) and st.st_uid in _trusted():
            return name, True
        text = w.link_text(name)
        head, name = os.path.split(text)
        if text.startswith("/"):
            w.to_root()
        w.go(head.split("/"))


def _check_appendable(fd: int, w: _Walk, opt: str, shown: str) -> None:
    """Refuse an opened spike log that is no place for it; then make it blocking again. A
    terminal is any user's (``sudo``'s /dev/pts/N); a FIFO or a file must be root's or ours
    (another user's FIFO in /tmp would read what we log)."""
    st = os.fstat(fd)
    if not os.isatty(fd):
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            raise OutputError(f"{opt} {shown} is a device, not a file")  # /dev/full, a disk
        if st.st_uid not in _trusted():
            sticky = os.fstat(w.fd).st_mode & stat.S_ISVTX
            where = f" in the shared directory {show(w.where)}" if sticky else ""
            raise OutputError(f"{opt} {shown} belongs to uid {st.st_uid}{where}, not to root "
                              "or us: not written")
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:  # a hard link made by another user
            raise OutputError(f"{opt} {shown} has {st.st_nlink} hard links: not written")
    os.set_blocking(fd, True)
