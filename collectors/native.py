"""Build a small C helper on first use, with the system's C compiler, into a per-user cache,
and start it so that no other user can have it run something else.

Shared by the native sampler (agent/watch/sampling/native/hftsampler.c, started by its
feed.py), the noise recorder and the interrupt-cost helper (agent/noise/hftnoise.c,
hftirqcost.c) and the keep-awake spinner (tuning/keepawake.c, started by ``hftagent run
--keep-awake``). They often run as root, so the binary they execute must be one that only
root or we could have written, and stay that binary until it runs:

- The cache directory is opened by a walk from ``/``, one component at a time, each opened
  ``O_PATH|O_NOFOLLOW`` relative to the one before and checked through its descriptor
  (``fstat``): a directory owned by root or by us, not writable by group or others — a
  sticky directory (/tmp) only as a parent, where others cannot rename or remove our entry.
  A symlink on the way is followed only when it is owned by root or by us (what
  ``fs.protected_symlinks`` does for sticky directories, applied everywhere; as
  tuning/safepath.py does for the journal). So no component of the path can be replaced by
  another user between the check and the use (the ``renameat2(RENAME_EXCHANGE)`` race on a
  parent that a lstat-then-exec-by-path check loses), and a ``$HFTAGENT_CACHE`` or ``$HOME``
  of another user is refused (as root: one line that says which variable to set).
- The binary (``<name>-<hash of source and machine>``) is opened ``O_NOFOLLOW`` in that
  directory's descriptor and checked through its own descriptor (a regular, executable file
  owned by root or by us, not writable by group or others). It is compiled from the source's
  bytes already hashed (fed on stdin: the file is not read twice), into a temporary name, and
  renamed into place whole (a concurrent build never leaves a half-written file).
- It is executed through the directory's descriptor: ``/proc/self/fd/N/<name>-<hash>`` with
  N passed to the child, never by the path the environment named. The name's last component
  keeps the process name (``comm``) readable: ``hftkeepawake-…``, ``hftnoise-…``.

Every helper also dies with its parent: :meth:`Helper.command` appends the parent's pid and
the read end of a per-process pipe (:func:`lifeline`) whose write end only this process holds.
The helper sets ``PR_SET_PDEATHSIG``, checks ``getppid()`` against the pid (the parent may
have died before the prctl) and blocks a thread in ``read`` on the pipe, which returns 0 when
the parent is gone however it ended (``kill -9`` included). The keep-awake spinner, which must
outlive its launcher's exec, watches a pidfd instead (``lifeline=False``).

Cache: ``$HFTAGENT_CACHE``, else ``$XDG_CACHE_HOME/hftagent``, else ``~/.cache/hftagent``.
Compiler: ``$CC``, else cc, gcc or clang on PATH; as root, only one whose real path and every
directory above it are root's (or ours) and writable by nobody else, run by that real path.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
from pathlib import Path

MAX_LINKS = 40  # as the kernel's own symlink-follow limit
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NativeUnavailable(RuntimeError):
    """A helper cannot be built or run here; the message says why."""


class CacheRefused(NativeUnavailable):
    """The cache directory or a cached binary could have been written by another user."""


def cache_dir() -> Path:
    return cache_dir_from()[0]


def cache_dir_from() -> tuple[Path, str]:
    """The cache directory and the variable it comes from ($HFTAGENT_CACHE, $XDG_CACHE_HOME
    or $HOME), for the refusal's message."""
    env = os.environ.get("HFTAGENT_CACHE")
    if env:
        return Path(env), "$HFTAGENT_CACHE"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "hftagent", "$XDG_CACHE_HOME"
    return Path.home() / ".cache" / "hftagent", "$HOME"


def _trusted_uids() -> tuple[int, ...]:
    return (0, os.geteuid())


def _owner_name(uid: int) -> str:
    return "root" if uid == 0 else f"uid {uid}"


def _not_trusted() -> str:
    return "not by root" if os.geteuid() == 0 else "not by root or you"


def _check_dir(st: os.stat_result, where: str, *, last: bool) -> str | None:
    """Why the directory ``where`` cannot be trusted, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is not a directory"
    if st.st_uid not in _trusted_uids():
        return f"{where} is owned by {_owner_name(st.st_uid)}, {_not_trusted()}"
    if st.st_mode & 0o022 and (last or not st.st_mode & stat.S_ISVTX):
        return (f"{where} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o})")
    return None


def open_trusted_dir(path: Path, *, create: bool) -> tuple[int, Path]:
    """An ``O_PATH`` descriptor of the directory ``path`` and its real path, every component
    from / checked through its descriptor (module docstring); missing components created 0700
    when ``create``. Raises :class:`CacheRefused` (the reason names the component) or OSError
    (ENOENT without ``create``, EACCES...)."""
    todo = list(Path(os.path.abspath(path)).parts[1:])
    todo.reverse()
    fd = os.open("/", _DIR_FLAGS)
    real: list[str] = []
    links = 0
    try:
        why = _check_dir(os.fstat(fd), "/", last=not todo)
        if why:
            raise CacheRefused(why)
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            where = "/" + "/".join([*real, name])
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create or name == "..":
                    raise
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass  # made in between: opened and checked below like any other
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise CacheRefused(f"{where} is not a directory") from None
                if st.st_uid not in _trusted_uids():
                    raise CacheRefused(f"{where} is a symlink owned by "
                                       f"{_owner_name(st.st_uid)}, {_not_trusted()}: "
                                       "not followed") from None
                links += 1
                if links > MAX_LINKS:
                    raise CacheRefused(f"{where}: too many symlinks") from None
                # read through the (checked) directory's descriptor: the link read is the
                # link checked; nobody else can replace it there
                target = os.readlink(name, dir_fd=fd)
                parts = [p for p in Path(target).parts if p != "/"]
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                    real = []
                todo.extend(reversed(parts))
                continue
            os.close(fd)
            fd = nfd
            if name == "..":
                real = real[:-1]
            else:
                real.append(name)
            why = _check_dir(os.fstat(fd), "/" + "/".join(real), last=not todo)
            if why:
                raise CacheRefused(why)
    except BaseException:
        os.close(fd)
        raise
    return fd, Path("/" + "/".join(real))


def _open_binary(dfd: int, name: str, what: str, shown: Path) -> int | None:
    """An ``O_PATH`` descriptor of the cached binary ``name`` in the directory ``dfd``,
    checked through it; None when absent or not executable (it is rebuilt). Raises
    :class:`CacheRefused` for one that someone else could have written."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheRefused(f"cached {what} {shown} is a symlink: not used") from None
        raise NativeUnavailable(f"cached {what} {shown}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in _trusted_uids() or \
                st.st_mode & 0o022:
            raise CacheRefused(f"cached {what} {shown} is not a file owned by you and "
                               "writable only by you: not used")
    except BaseException:
        os.close(fd)
        raise
    if not st.st_mode & stat.S_IXUSR:
        os.close(fd)
        return None
    return fd


def _trusted_file(path: str, what: str) -> str:
    """``path``'s real path, when it and every directory above it are root's or ours and
    writable by nobody else (a compiler root will run). Raises NativeUnavailable."""
    real = Path(os.path.realpath(path))
    try:
        dfd, _ = open_trusted_dir(real.parent, create=False)
    except CacheRefused as exc:
        raise NativeUnavailable(f"{what} {path} is not used: {exc}") from None
    except OSError as exc:
        raise NativeUnavailable(f"{what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.stat(real.name, dir_fd=dfd, follow_symlinks=False)
    except OSError as exc:
        raise NativeUnavailable(f"{what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in _trusted_uids() or st.st_mode & 0o022:
        raise NativeUnavailable(f"{what} {path} is not a file owned by root or you and "
                                "writable only by its owner: not used")
    return str(real)


def compiler(what: str) -> tuple[str, str]:
    """(name, path to run) of the C compiler: $CC or cc/gcc/clang on PATH; as root, one whose
    real path and its directories are trusted, run by that real path (the name stays argv[0]:
    ccache and the like look at it)."""
    want = os.environ.get("CC")
    if want:
        cc = shutil.which(want)
        if cc is None:
            raise NativeUnavailable(f"building the {what} failed: CC={want} not found")
    else:
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            raise NativeUnavailable(f"no C compiler (cc) to build the {what}")
    if os.geteuid() == 0:
        return os.path.basename(cc), _trusted_file(cc, "CC" if want else "C compiler")
    return os.path.basename(cc), cc


# -- the lifeline: one pipe per process, its write end held until the process is gone ------
_LIFELINE: dict[int, tuple[int, int]] = {}  # our pid -> (read end, write end)


def _drop_inherited_lifeline() -> None:
    """In a forked child: the parent's pipe is not ours to hold (its helpers would wait for
    us too). Closed; the child makes its own on first use."""
    for r, w in _LIFELINE.values():
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
    _LIFELINE.clear()


def lifeline() -> int:
    """The read end of this process's lifeline pipe (created on first use, both ends
    ``O_CLOEXEC``): a helper given it reads EOF once this process is gone."""
    pid = os.getpid()
    got = _LIFELINE.get(pid)
    if got is None:
        if not _LIFELINE:
            os.register_at_fork(after_in_child=_drop_inherited_lifeline)
        _drop_inherited_lifeline()
        got = _LIFELINE[pid] = os.pipe2(os.O_CLOEXEC)
    return got[0]


class Helper:
    """A built helper, held through the descriptor of its checked cache directory.

    :meth:`command` gives the argv and the descriptors to pass (``subprocess`` ``pass_fds``)
    to start it: it runs as ``/proc/self/fd/N/<name>``, N being that descriptor in the child.
    ``path`` (also its ``str`` and ``os.fspath``) is where it lies: for messages and tests
    that run it with arguments of their own. Every directory in it was checked (no other
    user can change them), but what hftagent starts goes through :meth:`command`, which
    does not depend on that check having been right."""

    def __init__(self, name: str, what: str, dfd: int, path: Path) -> None:
        from collectors.host import Host  # the one place that knows where procfs is
        self.name = name
        self.what = what
        self.path = path
        self._dfd = dfd
        self.exe = str(Host().proc("self", "fd", dfd, path.name))

    def command(self, *args: str, lifeline: bool = True) -> tuple[list[str], tuple[int, ...]]:
        """(argv, pass_fds) to start the helper with ``args``; with ``lifeline`` (the default)
        the argv ends with this process's pid and the lifeline pipe's read end (module
        docstring), which the helper's usage line names PARENT_PID WATCH_FD."""
        return _command(self.exe, (self._dfd,), args, lifeline)

    def close(self) -> None:
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1

    def __enter__(self) -> Helper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never from a finalizer
            pass

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"Helper({self.name!r}, {str(self.path)!r})"


def _command(exe: str, fds: tuple[int, ...], args: tuple[str, ...], with_lifeline: bool
             ) -> tuple[list[str], tuple[int, ...]]:
    argv = [exe, *args]
    if with_lifeline:
        r = lifeline()
        argv += [str(os.getpid()), str(r)]
        fds = (*fds, r)
    return argv, fds


def command(exe: Helper | str | os.PathLike[str], *args: str, lifeline: bool = True
            ) -> tuple[list[str], tuple[int, ...]]:
    """(argv, pass_fds) to start ``exe``: a :class:`Helper` through its directory's
    descriptor; a plain path (a test's stand-in, never a cached helper) as it is."""
    if isinstance(exe, Helper):
        return exe.command(*args, lifeline=lifeline)
    return _command(os.fspath(exe), (), args, lifeline)


def build(source: Path, name: str, what: str, out_dir: Path | None = None,
          machines: tuple[str, ...] | None = None, machines_why: str = "",
          shared: bool = False) -> Helper:
    """The compiled ``source`` (``<cache>/<name>-<hash>``), compiled (~0.3 s) when not cached,
    as a :class:`Helper` to start with :meth:`Helper.command`. ``what`` names the helper in
    messages ("native sampler"). ``machines``: the ``uname -m`` values it may be built for
    (None: any), ``machines_why`` says why. Raises :class:`NativeUnavailable` (wrong
    machine, no compiler, failed build) or :class:`CacheRefused` (a cache directory, a
    directory above it or a cached binary that someone else could have written).
    ``shared``: a shared library (``-shared -fPIC``) to load with ctypes through
    :attr:`Helper.exe` (the same checked directory descriptor), not a program to start."""
    machine = os.uname().machine
    if machines is not None and machine not in machines:
        raise NativeUnavailable(f"the {what} needs {machines_why or '/'.join(machines)} "
                                f"(this is {machine})")
    try:
        src = source.read_bytes()
    except OSError as exc:
        raise NativeUnavailable(f"{what} source missing: {exc.strerror}") from None
    key = hashlib.sha256(src + machine.encode() + (b"\0shared" if shared else b"")
                         ).hexdigest()[:16]
    if out_dir is not None:
        d, origin = out_dir, ""
    else:
        d, origin = cache_dir_from()
    try:
        dfd, real = open_trusted_dir(d, create=True)
    except CacheRefused as exc:
        from_ = f" (from {origin})" if origin else ""
        who = "root" if os.geteuid() == 0 else "you"
        fix = (f"; set HFTAGENT_CACHE to a directory owned by {who} that only {who} can "
               "write" if origin else "")
        raise CacheRefused(f"cache directory {d}{from_} not used: {exc}{fix}") from None
    except OSError as exc:
        raise NativeUnavailable(f"cannot create {d}: {exc.strerror or exc}") from None
    try:
        exe = f"{name}-{key}"
        fd = _open_binary(dfd, exe, what, real / exe)
        if fd is None:
            _compile(src, dfd, real, exe, what, shared)
            fd = _open_binary(dfd, exe, what, real / exe)
            if fd is None:
                raise NativeUnavailable(f"building the {what} failed: {real / exe} is not "
                                        "executable")
        os.close(fd)  # checked; it is run through the directory's descriptor
        return Helper(name, what, dfd, real / exe)
    except BaseException:
        os.close(dfd)
        raise


def _compile(src: bytes, dfd: int, real: Path, exe: str, what: str,
             shared: bool = False) -> None:
    """Compile ``src`` into ``real/exe`` (``dfd`` is ``real``, checked): into a temporary
    name, checked and made executable through its descriptor, then renamed over ``exe``."""
    cc_name, cc = compiler(what)
    tmp = f".{exe}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        # Through the real path: every directory in it is root's or ours and writable by
        # nobody else (open_trusted_dir), so no other user can redirect it.
        kind = ["-shared", "-fPIC"] if shared else ["-pthread"]
        r = subprocess.run([cc_name, "-O2", "-std=gnu11", "-Wall", *kind, "-o",
                            str(real / tmp), "-x", "c", "-"], executable=cc, input=src,
                           capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unlink(dfd, tmp)
        raise NativeUnavailable(f"building the {what} failed: {exc}") from None
    if r.returncode != 0:
        _unlink(dfd, tmp)
        lines = r.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        first = next((ln for ln in lines if "error" in ln), lines[0])
        raise NativeUnavailable(f"building the {what} failed: {first}")
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise NativeUnavailable(f"building the {what} failed: the compiler's output "
                                        f"{real / tmp} is not a file of ours")
            os.fchmod(fd, 0o755)
        finally:
            os.close(fd)
        # atomic: a concurrent build never leaves a half-written binary
        os.rename(tmp, exe, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as exc:
        _unlink(dfd, tmp)
        raise NativeUnavailable(f"building the {what} failed: {real / tmp}: "
                                f"{exc.strerror or exc}") from None
    except BaseException:
        _unlink(dfd, tmp)
        raise


def _unlink(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass
