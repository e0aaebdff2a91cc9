"""The rollback journal: the original value of every target tuning touched, on disk first.

Format (JSON, one file, ``journal.json`` in the state directory)::

    {
      "format": "hftagent-journal/1",
      "boot_id": "87806d1e-...",          # /proc/sys/kernel/random/boot_id when created
      "created": "2026-11-29T19:30:00+00:00",
      "updated": "...",
      "profile": "hft-cpu",
      "cpus": "2-3",
      "procfs": "/proc", "sysfs": "/sys",   # the mounts it was written against (resolved)
      "entries": [
        {"seq": 1, "tunable": "memory.swappiness", "target": "/proc/sys/vm/swappiness",
         "original": "60", "written": "1", "time": "...", "detail": ""},
        ...
      ]
    }

Rules:
- an entry is saved (temp file, fsync, rename, fsync of the directory) *before* the write it
  covers, so a crash at any point leaves every touched target in the journal;
- a target already in the journal keeps its first original (a second apply with another profile
  must not make the intermediate value "original"); only ``written`` is updated;
- entries are dropped one by one as rollback restores them; an empty journal is deleted;
- it records the procfs/sysfs it was written against: a journal written on a tree copy is
  never checked against, or replayed onto, another tree or the live kernel (`--state-dir`
  makes that easy to get wrong);
- the default directory is /run/hftagent (tmpfs): a reboot resets kernel state and journal
  together. A journal whose boot id differs from the running kernel's is reported, never
  replayed (its originals describe a kernel that no longer exists).
- anything that does not parse as this format is a :class:`JournalError`: nothing is changed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuning.allowlist import allowed

FORMAT = "hftagent-journal/1"
FILENAME = "journal.json"
LOCKNAME = "lock"

Checkpoint = Callable[[str], None]


class JournalError(Exception):
    """The journal cannot be used (corrupt, from an earlier boot, locked); message for the user."""


class StaleJournal(JournalError):
    """The journal was written under another boot."""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass
class Entry:
    seq: int
    tunable: str
    target: str
    original: str
    written: str
    time: str = ""
    detail: str = ""


@dataclass
class Journal:
    path: Path
    boot_id: str | None
    entries: list[Entry] = field(default_factory=list)
    created: str = ""
    updated: str = ""
    profile: str = ""
    cpus: str = ""
    procfs: str = ""  # the resolved mounts the entries belong to
    sysfs: str = ""

    # -- lookup --------------------------------------------------------------------------------
    def get(self, target: str) -> Entry | None:
        for e in self.entries:
            if e.target == target:
                return e
        return None

    def record(self, tunable: str, target: str, original: str, written: str,
               detail: str = "") -> Entry:
        """Add (or update ``written`` of) the entry for ``target``; the first original stays."""
        e = self.get(target)
        if e is not None:
            e.written = written
            return e
        seq = max((x.seq for x in self.entries), default=0) + 1
        e = Entry(seq, tunable, target, original, written, _now(), detail)
        self.entries.append(e)
        return e

    def drop(self, target: str) -> None:
        self.entries = [e for e in self.entries if e.target != target]

    # -- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "boot_id": self.boot_id, "created": self.created,
                "updated": self.updated, "profile": self.profile, "cpus": self.cpus,
                "procfs": self.procfs, "sysfs": self.sysfs,
                "entries": [asdict(e) for e in self.entries]}

    def save(self, checkpoint: Checkpoint | None = None) -> None:
        """Atomically replace the journal file (or delete it when there are no entries).
        Raises JournalError (ENOSPC, EROFS, EACCES...): the caller writes nothing more."""
        try:
            self._save(checkpoint)
        except OSError as exc:
            raise JournalError(f"cannot save journal {self.path}: {exc.strerror or exc}; "
                               "stopped before the next write (`tune rollback` restores what "
                               "the journal on disk lists)") from None

    def _save(self, checkpoint: Checkpoint | None) -> None:
        if not self.entries:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            _fsync_dir(self.path.parent)
            return
        self.created = self.created or _now()
        self.updated = _now()
        data = json.dumps(self.to_dict(), indent=2, sort_keys=False).encode() + b"\n"
        tmp = _tmp_path(self.path, os.getpid())
        # Our own leftover (an earlier failed save) goes first; then O_EXCL|O_NOFOLLOW: never
        # write through a file or symlink someone else put there.
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.EIO, "short write")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if checkpoint:
            checkpoint("journal-temp-written")  # a crash here leaves the old journal intact
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)


def _tmp_path(path: Path, pid: int) -> Path:
    return path.with_name(f".{path.name}.{pid}.tmp")


def clean_stale_temps(state_dir: Path) -> None:
    """Remove journal temp files left by a process that died between write and rename (the
    journal itself is intact then). Call with the lock held: no live writer can be mid-save."""
    prefix, suffix = f".{FILENAME}.", ".tmp"
    for name in os.listdir(state_dir):
        pid_s = name[len(prefix):-len(suffix)]
        if not (name.startswith(prefix) and name.endswith(suffix) and pid_s.isdigit()):
            continue
        if int(pid_s) != os.getpid():
            try:
                os.kill(int(pid_s), 0)
                continue  # still running (it cannot hold our lock, but leave its file alone)
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # alive, another user's
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; the rename still happened
        pass
    finally:
        os.close(fd)


def journal_path(state_dir: Path) -> Path:
    return state_dir / FILENAME


def parse(text: str, path: Path) -> Journal:
    """Parse and validate a journal file's text. Raises JournalError on anything unexpected."""
    where = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise JournalError(f"journal {where} is corrupt (not JSON: {exc.msg} at line "
                           f"{exc.lineno}); nothing was changed. Inspect it, restore the "
                           "values it lists by hand if needed, then delete it") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise JournalError(f"journal {where} is not a {FORMAT} file; nothing was changed")
    raw = data.get("entries")
    if not isinstance(raw, list):
        raise JournalError(f"journal {where} has no entry list; nothing was changed")
    entries = []
    seen = set()
    for i, e in enumerate(raw):
        ok = isinstance(e, dict) and all(isinstance(e.get(k), str) for k in
                                          ("tunable", "target", "original", "written")) \
            and isinstance(e.get("seq"), int)
        if not ok:
            raise JournalError(f"journal {where}: entry {i} is malformed; nothing was changed")
        if not allowed(e["target"]):
            raise JournalError(f"journal {where}: entry {i} names {e['target']!r}, which is not "
                               "a target tuning may write; nothing was changed")
        if e["target"] in seen:
            raise JournalError(f"journal {where}: target {e['target']!r} appears twice; "
                               "nothing was changed")
        seen.add(e["target"])
        entries.append(Entry(e["seq"], e["tunable"], e["target"], e["original"], e["written"],
                             str(e.get("time", "")), str(e.get("detail", ""))))
    boot = data.get("boot_id")
    if boot is not None and not isinstance(boot, str):
        raise JournalError(f"journal {where}: boot_id is not a string; nothing was changed")
    mounts = data.get("procfs"), data.get("sysfs")
    if not all(isinstance(m, str) and m.startswith("/") for m in mounts):
        raise JournalError(f"journal {where} does not say which /proc and /sys it was written "
                           "against (procfs/sysfs); nothing was changed")
    return Journal(path, boot, sorted(entries, key=lambda x: x.seq), str(data.get("created", "")),
                   str(data.get("updated", "")), str(data.get("profile", "")),
                   str(data.get("cpus", "")), str(mounts[0]), str(mounts[1]))


def load(state_dir: Path) -> Journal | None:
    """The journal in ``state_dir``, or None when there is none. Raises JournalError."""
    path = journal_path(state_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read journal {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JournalError(f"journal {path} is corrupt (not UTF-8); nothing was changed") from None
    return parse(text, path)


def stale(journal: Journal, boot_id: str | None) -> bool:
    """True when the journal was written under another boot (both ids known and different)."""
    return journal.boot_id is not None and boot_id is not None and journal.boot_id != boot_id


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Exclusive lock on the state directory: one apply/rollback at a time. Raises
    JournalError when it is held, or when the directory cannot be used (not a directory,
    read-only file system, no space, permission)."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not state_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        fd = os.open(state_dir / LOCKNAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:  # mkdir: a file (or a symlink to one) is in the way
        raise JournalError(f"state directory {state_dir} is not a directory") from None
    except OSError as exc:
        raise JournalError(f"cannot use state directory {state_dir}: "
                           f"{exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise JournalError(f"another hftagent tune apply/rollback holds {state_dir}/"
                                   f"{LOCKNAME}; try again when it has finished") from None
            raise JournalError(f"cannot lock {state_dir}/{LOCKNAME}: "
                               f"{exc.strerror or exc}") from None
        try:
            clean_stale_temps(state_dir)
        except OSError:
            pass  # a leftover temp file is harmless; never fail the command for it
        yield
    finally:
        os.close(fd)
