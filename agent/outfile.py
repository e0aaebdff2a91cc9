"""The one opener for every file a command writes at a path the user gave (issue #30 item 2):
``probe --csv/--plot``, ``cpus --plot``, ``history export/plot --out``, ``profile
--keep-csv``, ``capture --out``, the history database (``--db``, ``$HFTAGENT_DB``) and
``audit --fix-script``.

A command often runs as root, and the path it is given often lies in a directory another user
can write (/tmp, a shared results directory, a home that ``sudo`` kept). Where such a
directory does not have ``fs.protected_symlinks``/``protected_regular`` set, whatever that
user put at the path would be written through. The rules, the same for every output:

- **No symlink of another user is followed.** The file itself is never a symlink: one there is
  refused, not followed and not replaced. The directories on the way follow only symlinks
  owned by root or by us (``/var/run`` -> ``/run``, the operator's own links: what
  ``fs.protected_symlinks`` does in sticky directories, applied everywhere; another user's
  link is refused), and the real directory is then opened from ``/`` with ``O_NOFOLLOW`` on
  every component (tuning/safepath.py): a link swapped in after the check fails the open.
- **An existing file is replaced only when it is a regular file we own** (the effective uid).
  A FIFO (which would block the open until a reader came), a directory, a device, a socket
  and another user's file are refused with one line and left as they are.
- **Nothing is written through the path.** A file is written to a temporary file with an
  unpredictable name in the same directory (``O_CREAT|O_EXCL|O_NOFOLLOW``), fsync'd and
  renamed over the path once complete: no half-written output is ever at the path, and a
  rename replaces a directory entry, never the file another user swapped in meanwhile.
- ``exclusive=True`` (a script that root will run later): the file is created at the path
  itself with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (anything there already is refused), and only in a
  directory owned by root or by us that nobody else can write, or a sticky one (where nobody
  else can rename or remove our file).
- **Directories are never created** (``mkdir -p`` as root makes directories wherever a typo
  points): a missing one is an error. ``capture --out DIR`` creates DIR itself (exclusively,
  :func:`create_dir`).

Every refusal is an :class:`OutputError` (an AgentError: one line, exit 1) that names the
option and the path.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any

from agent.errors import AgentError
from tuning.safepath import UnsafePath, _checked_realpath, _walk_dirs

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class OutputError(AgentError):
    """An output path refused or not writable (the message names the option and the path).
    ``missing``: refused because a directory on the way does not exist."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def show(path: str | os.PathLike[str]) -> str:
    """``path`` as a message prints it: a name with a newline or another control character in
    it is shown quoted, so that the error stays one line."""
    s = os.fspath(path)
    return s if s.isprintable() else ascii(s)


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
        """Refuse a directory that another user could change under us: owned by someone
        other than root or us, or writable by group or others without the sticky bit."""
        st = os.fstat(self.dfd)
        if st.st_uid not in (0, os.geteuid()):
            raise self.error(f": its directory {show(self.directory)} belongs to uid "
                             f"{st.st_uid}: refused")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise self.error(f": its directory {show(self.directory)} is writable by group or "
                             f"others (mode {stat.S_IMODE(st.st_mode):04o}) and not sticky: "
                             "refused")

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


def _open_parent(parent: str, opt: str, shown: str) -> tuple[Path, int]:
    """The real path of directory ``parent`` and a read-only descriptor of it (module
    docstring: trusted symlinks only, then an O_NOFOLLOW walk from /)."""
    where = show(parent)
    try:
        real = _checked_realpath(Path(parent))
        pfd = _walk_dirs(real)
    except UnsafePath as exc:
        raise OutputError(f"{opt} {shown}: {exc}") from None
    except FileNotFoundError:
        raise OutputError(f"{opt} {shown}: directory {where} does not exist (create it "
                          "first)", missing=True) from None
    except NotADirectoryError:
        raise OutputError(f"{opt} {shown}: {where} is not a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(f"{opt} {shown}: a directory on the way became a symbolic link "
                              "while it was checked: refused") from None
        raise OutputError(f"{opt} {shown}: {exc.strerror or exc}") from None
    try:
        dfd = os.open(".", _DIR_FLAGS, dir_fd=pfd)
    except OSError as exc:
        raise OutputError(f"{opt} {shown}: {where}: {exc.strerror or exc}") from None
    finally:
        os.close(pfd)
    return real, dfd


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


def create_dir(path: str | os.PathLike[str], opt: str, *, parents: bool = False,
               mode: int = 0o755) -> int:
    """Create the new directory ``path`` (it must not exist: anything there, a symlink
    included, is refused) and return a read-only descriptor of it, opened with
    ``O_NOFOLLOW``. ``parents``: missing directories above it are created too (mode 0755,
    each ``mkdirat`` + ``O_NOFOLLOW`` open below the last one that exists, so nothing another
    user plants on the way is followed). The caller writes below the descriptor."""
    p = os.fspath(path)
    if not p.strip():
        raise OutputError(f"{opt} is empty: give a directory")
    shown = show(p)
    parts = [x for x in Path(os.path.normpath(p)).parts]
    if not parts or parts[-1] in ("/", ".", ".."):
        raise OutputError(f"{opt} {shown} already exists; give a new directory")
    made: list[str] = []
    top = os.path.join(*parts[:-1]) if len(parts) > 1 else "."
    if parents:
        while not os.path.lexists(top) and top not in ("", ".", "/"):
            made.insert(0, os.path.basename(top))
            top = os.path.dirname(top) or "."
    _real, dfd = _open_parent(top, opt, shown)
    try:
        for name in [*made, parts[-1]]:
            try:
                os.mkdir(name, mode, dir_fd=dfd)
            except FileExistsError:
                raise OutputError(f"{opt} {shown} already exists; give a new directory"
                                  ) from None
            except OSError as exc:
                raise OutputError(f"{opt} {shown}: cannot create it: {exc.strerror or exc}"
                                  ) from None
            try:
                nfd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError as exc:
                raise OutputError(f"{opt} {shown}: {name} changed while it was created: "
                                  f"{exc.strerror or exc}") from None
            os.close(dfd)
            dfd = nfd
            if os.fstat(dfd).st_uid != os.geteuid():
                raise OutputError(f"{opt} {shown}: {name} is not the directory we created")
    except BaseException:
        os.close(dfd)
        raise
    return dfd
