"""Where the history database is, and whether a path may be one.

Location (read at call time, never at import): ``--db`` > ``$HFTAGENT_DB`` >
``$XDG_STATE_HOME/hftagent/history.sqlite`` > ``~/.local/state/hftagent/history.sqlite``.

The path is checked by the output opener's rules first (agent/outfile.py): never a symlink,
a regular file we own, in a directory nobody else can change; its directory is never
created, except the default one in the state directory (0700, tuning/safepath.py, by the
same rule, checked before anything is made). SQLite then opens the file by its path: the
store checks after the open that the path still leads to the directory and the file it
walked (agent/history/store.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.errors import AgentError
from agent.outfile import OutputError, Target, locate, show


class HistoryError(AgentError):
    """The history database cannot be used (corrupt, newer schema, unknown run id...)."""


def default_db_path() -> Path:
    """$XDG_STATE_HOME/hftagent/history.sqlite, else ~/.local/state/hftagent/history.sqlite."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hftagent" / "history.sqlite"


def resolve_db(db: str | os.PathLike | None = None) -> Path:
    """``db`` if given, else $HFTAGENT_DB, else :func:`default_db_path` (env read now).

    An empty ``db`` is an error, not "the default": an option that is given is never
    ignored."""
    if db is not None:
        if not str(db).strip():
            raise HistoryError("--db is empty: give a database file (or leave --db out for "
                               "the default)")
        return Path(db)
    env = os.environ.get("HFTAGENT_DB")
    return Path(env) if env else default_db_path()


WHAT = "history database"


def is_default(db: str | os.PathLike | None) -> bool:
    """Whether the database is the state directory's (neither --db nor $HFTAGENT_DB): the
    only one whose missing directories are created (mode 0700, tuning/safepath.py)."""
    return db is None and not os.environ.get("HFTAGENT_DB")


def locate_db(path: Path) -> Target:
    """The database's :class:`agent.outfile.Target`, by the output opener's rules (no symlink
    of another user followed, the file itself never a symlink, its directory never created),
    and refused unless it is nothing yet or a regular file we own in a directory nobody else
    can change under us (SQLite opens it by path, after this check). HistoryError."""
    try:
        t = locate(path, WHAT)
    except OutputError as exc:
        raise HistoryError(str(exc)) from None
    try:
        t.check_replaceable()
        t.check_private_dir()
    except OutputError as exc:
        t.close()
        raise HistoryError(str(exc)) from None
    return t


def db_exists(db: str | os.PathLike | None = None) -> bool:
    """Whether the history database exists (False only when nothing is at its path). Anything
    there that cannot be our database (a directory, a FIFO, a device, a symlink, another
    user's file) raises HistoryError, so that a listing never reports "no runs yet" for a
    path that is wrong."""
    path = resolve_db(db)
    try:
        t = locate(path, WHAT)
    except OutputError as exc:
        if exc.missing:
            return False
        raise HistoryError(str(exc)) from None
    with t:
        if t.st is None:
            return False
    with locate_db(path) as t:
        return t.st is not None


SQLITE_MAGIC = b"SQLite format 3\0"


def header(path: Path) -> bytes | None:
    """The first 16 bytes of ``path`` (None if it cannot be opened). O_NOFOLLOW, O_NONBLOCK
    and fstat: a symlink or a FIFO swapped in after the check is neither followed, nor
    blocks the open, nor is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HistoryError(f"{WHAT} path {path} is not a regular file")
        return os.read(fd, 16)
    finally:
        os.close(fd)


def try_write(t: Target, exists: bool) -> None:
    """Whether a run can be recorded at ``t``, tried rather than guessed from mode bits (root
    passes every access() check, yet not a read-only mount or an immutable directory): a file
    created and removed in its directory (SQLite puts its -wal and -shm files there), and the
    database itself opened for writing (not written)."""
    import secrets
    probe = f".hftagent-{secrets.token_hex(8)}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=t.dfd))
        os.unlink(probe, dir_fd=t.dfd)
    except OSError as exc:
        raise HistoryError(f"cannot {'write' if exists else 'create'} {WHAT} {t.shown}: "
                           f"{t.directory} is not a writable directory ({exc.strerror})"
                           ) from None
    if exists:
        try:
            os.close(os.open(t.name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=t.dfd))
        except OSError as exc:
            raise HistoryError(f"{WHAT} {t.shown} is not writable ({exc.strerror})") from None


def default_dir(path: Path, *, create: bool) -> bool:
    """Whether the state directory of the default database exists, made (0700, each missing
    level) when ``create``. Every directory from / down is walked by the one rule
    (tuning/safepath.py's Walk: root's or ours, writable by nobody else unless root's and
    sticky, no other user's link followed) before anything is made in it: a refusal names
    the component and leaves nothing behind. The directory itself is writable by nobody
    else at all. HistoryError."""
    from tuning.safepath import UnsafePath, open_dir
    try:
        fd = open_dir(path.parent, create=create)
    except UnsafePath as exc:
        raise HistoryError(f"{WHAT} {show(path)}: {exc}") from None
    except OSError as exc:
        raise HistoryError(f"cannot create {WHAT} {show(path)}: {exc.strerror or exc}"
                           ) from None
    if fd is None:
        return False
    os.close(fd)
    return True
