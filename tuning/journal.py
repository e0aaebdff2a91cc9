"""The rollback journal: the original value of every target tuning touched, on disk first.

Format version 2 (``journal.json`` in the state directory): JSON Lines, one compact JSON
object per line, ASCII only. The first line is the header, every later line one change::

    {"format":"hftagent-journal","version":2,"boot_id":"87806d1e-...","created":"...",
     "profile":"hft-cpu","cpus":"2-3","procfs":"/proc","sysfs":"/sys"}
    {"op":"add","seq":1,"tunable":"memory.swappiness","target":"/proc/sys/vm/swappiness",
     "original":"60","written":"1","time":"...","detail":""}
    {"op":"written","target":"/proc/sys/vm/swappiness","written":"5","before":"1"}
    {"op":"drop","target":"/proc/sys/vm/swappiness"}

(each record on one line in the file). Replaying the lines gives the entries: ``add`` a new
target with its original, ``written`` a new value written over it (the original stays),
``drop`` a target restored or never written. ``before`` is the value that was in place when
``written`` replaced an earlier written value: a crash before that write leaves it, and it is
ours, not drift (``add`` records carry it too when a rewrite compacts such an entry).

Rules:
- apply appends the ``add`` records of one tunable's targets in one write and fsyncs them
  *before* the first write to any of those targets, so a crash at any point leaves every
  touched target in the journal. That is one fsync per tunable, not two rewrites of the whole
  file per target: the cost is linear in the number of targets (bench/journal_bench.py);
- only lines that end with a newline count. A crash in the middle of an append leaves an
  unterminated last line (a write cut short by SIGKILL at a page boundary, or by a power loss
  before the fsync). It is accepted as *torn* only when every line before it parses and the
  torn bytes can be the start of one record (a ``{"op":"`` prefix, ASCII, no second record,
  at most :data:`MAX_RECORD_BYTES`); anything else is corrupt. A file cut short by something
  else (``truncate``, a copy that stopped) looks the same, and the record it cut may name a
  target apply had written, so a torn journal is never treated as whole: status and rollback
  say so and name the target when the torn bytes show it, rollback restores what the
  complete records list but keeps the file as it is and exits non-zero, and apply refuses
  it (tuning/apply.py). Only the person looking at the box can tell a crash from a cut;
- a ``written`` record after a failed or normalised write is fsynced at once (a lost one
  would turn into false drift); ``drop`` records wait for the next fsync — a lost drop only
  makes the next rollback find that target already at its original;
- the file is rewritten in compact form (temp file opened ``O_EXCL|O_NOFOLLOW``, fsync,
  rename, fsync of the directory) when it is created, when it was torn, when it is a
  version-1 journal, or when superseded records outnumber live ones; an empty journal is
  deleted;
- a target already in the journal keeps its first original (a second apply with another
  profile must not make the intermediate value "original"); only ``written`` is updated;
- it records the procfs/sysfs it was written against: a journal written on a tree copy is
  never checked against, or replayed onto, another tree or the live kernel;
- the default directory is /run/hftagent (tmpfs): a reboot resets kernel state and journal
  together. A journal whose boot id differs from the running kernel's is reported, never
  replayed.
- it is read with ``O_NOFOLLOW|O_NONBLOCK`` from a state directory opened safely
  (tuning.safepath.open_dir): only a regular file with one link, owned by root or by us, of at
  most :data:`MAX_BYTES`; every field is type- and size-checked. Anything else — corrupt,
  deeply nested, huge, a FIFO, a symlink, an unknown version — is a :class:`JournalError`
  and nothing is changed.
- version 1 (one pretty-printed JSON object ``{"format": "hftagent-journal/1", ...,
  "entries": [...]}``, written by earlier releases) is still read, so a journal left on a
  running box by the previous install rolls back; the first change rewrites it as version 2.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from tuning.allowlist import allowed
from tuning.safepath import UnsafePath, open_dir, read_fd_bounded

FORMAT = "hftagent-journal"
VERSION = 2
FORMAT_V1 = "hftagent-journal/1"
FILENAME = "journal.json"
LOCKNAME = "lock"

# Bounds on what is read back. The largest real journal — every per-CPU knob of a 1,024-CPU
# box plus 10,000 IRQs — is about 20 MB; values the kernel prints fit in a page.
MAX_BYTES = 128 << 20
MAX_ENTRIES = 1_000_000
MAX_VALUE = 16384       # original / written / detail / time
MAX_KEY = 512           # tunable / target
# The longest line one record can be: every string field at its bound, each character written
# as a JSON escape (ensure_ascii: up to 12 bytes for a character outside the BMP), plus the
# keys and punctuation. Torn bytes longer than this are more than one record.
MAX_RECORD_BYTES = 12 * (5 * MAX_VALUE + 2 * MAX_KEY) + 256
RECORD_START = '{"op":"'

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
    # The value in place right before ``written`` replaced an earlier written value (a second
    # apply): a crash between journalling the new value and writing it leaves this one, which
    # is still ours, not drift. None for an entry whose first write is its only one.
    before: str | None = None


def _line(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


class Journal:
    """The entries in memory, and the records not yet on disk.

    ``record``/``drop`` change the entries and queue records; ``save`` makes the queued
    records durable (one append and one fsync, or a rewrite). ``dir_fd`` is the state
    directory's descriptor while :func:`locked` holds it; without one (tests), ``save`` opens
    the directory of ``path`` itself."""

    def __init__(self, path: Path, boot_id: str | None, entries: list[Entry] | None = None,
                 created: str = "", updated: str = "", profile: str = "", cpus: str = "",
                 procfs: str = "", sysfs: str = "", *, dir_fd: int | None = None) -> None:
        self.path = path
        self.boot_id = boot_id
        self.created = created
        self.updated = updated
        self.profile = profile
        self.cpus = cpus
        self.procfs = procfs  # the resolved mounts the entries belong to
        self.sysfs = sysfs
        self.version = VERSION
        self.dir_fd = dir_fd
        self._by_target: dict[str, Entry] = {}
        for e in sorted(entries or [], key=lambda x: x.seq):
            self._by_target[e.target] = e
        self._next_seq = max((e.seq for e in self._by_target.values()), default=0) + 1
        self._pending: list[dict] = []
        self._on_disk = False       # the file exists and holds exactly what was replayed
        self._rewrite = True        # the next save rewrites the whole file
        self._records = 0           # records in the file (header excluded)
        self._size = 0
        # The unterminated last line of a torn file (see the module docstring), its byte offset
        # and the target it names when its bytes show one; "" when the file is whole.
        self.torn = ""
        self.torn_at = 0
        self.torn_target: str | None = None

    def torn_note(self) -> str:
        """One line on the torn last record ("" when the file is whole)."""
        if not self.torn:
            return ""
        what = (f"naming {self.torn_target!r}" if self.torn_target is not None
                else "too short to name its target")
        return (f"journal {self.path} ends in a torn record ({len(self.torn.encode()):,} bytes "
                f"at byte {self.torn_at:,}, {what}) after {self._records:,} complete "
                f"record(s): a crash during an append leaves one (its target was never "
                "written: apply writes a target only once its record is on disk), and so does "
                "a file cut short, which loses every record after the cut: then targets apply "
                "wrote (that one and any listed after it) may still hold its values")

    # -- lookup --------------------------------------------------------------------------------
    @property
    def entries(self) -> list[Entry]:
        """The entries in the order they were first journalled (seq)."""
        return list(self._by_target.values())

    def get(self, target: str) -> Entry | None:
        return self._by_target.get(target)

    def record(self, tunable: str, target: str, original: str, written: str,
               detail: str = "") -> Entry:
        """Add (or update ``written`` of) the entry for ``target``; the first original stays."""
        e = self._by_target.get(target)
        if e is not None:
            if e.written != written:
                # ``original`` is what the caller read right before this write: it stays in
                # place if the write never happens (see Entry.before)
                e.before = original if original != e.original else None
                e.written = written
                self._pending.append({"op": "written", "target": target, "written": written,
                                      "before": e.before})
            return e
        e = Entry(self._next_seq, tunable, target, original, written, _now(), detail)
        self._next_seq += 1
        self._by_target[target] = e
        self._pending.append({"op": "add", **asdict(e)})
        return e

    def drop(self, target: str) -> None:
        if self._by_target.pop(target, None) is not None:
            self._pending.append({"op": "drop", "target": target})

    def clear(self) -> None:
        for t in list(self._by_target):
            self.drop(t)

    @property
    def dirty(self) -> bool:
        """Whether something in memory is not on disk yet."""
        return bool(self._pending) or (not self._on_disk and bool(self._by_target))

    # -- persistence ---------------------------------------------------------------------------
    def header(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "boot_id": self.boot_id,
                "created": self.created, "profile": self.profile, "cpus": self.cpus,
                "procfs": self.procfs, "sysfs": self.sysfs}

    def to_dict(self) -> dict:
        return {**self.header(), "updated": self.updated,
                "entries": [asdict(e) for e in self.entries]}

    def save(self, checkpoint: Checkpoint | None = None) -> None:
        """Make every queued record durable: one append and one fsync (or a rewrite in
        compact form; or deleting the file when no entry is left). Nothing queued: nothing is
        touched. Raises JournalError (ENOSPC, EROFS, EACCES...): the caller writes nothing
        more."""
        if not self.dirty and not (self._on_disk and not self._by_target):
            return
        try:
            if self.dir_fd is not None:
                self._save(self.dir_fd, checkpoint)
            else:
                fd = open_dir(self.path.parent, create=True)
                try:
                    self._save(fd, checkpoint)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise JournalError(f"cannot save journal {self.path}: {exc.strerror or exc}; "
                               "stopped before the next write (`tune rollback` restores what "
                               "the journal on disk lists)") from None

    def _save(self, dfd: int, checkpoint: Checkpoint | None) -> None:
        name = self.path.name
        if not self._by_target:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dfd)
            _fsync_fd(dfd)
            self._pending, self._on_disk, self._records, self._size = [], False, 0, 0
            return
        self.updated = _now()
        data = b"".join(_line(r) for r in self._pending)
        live = len(self._by_target)
        if (self._rewrite or not self._on_disk or self._size + len(data) > MAX_BYTES
                or self._records + len(self._pending) > 2 * live + 1024):
            self._rewrite_file(dfd, checkpoint)
            return
        try:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:  # removed behind our back: write it whole again
            self._rewrite_file(dfd, checkpoint)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise UnsafePath(f"{self.path} is not a regular file with one link")
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._records += len(self._pending)
        self._size = st.st_size + len(data)
        self._pending = []

    def _rewrite_file(self, dfd: int, checkpoint: Checkpoint | None) -> None:
        """Atomically replace the file with the header and one ``add`` per entry."""
        self.created = self.created or _now()
        body = [_line(self.header())]
        body += [_line({"op": "add", **asdict(e)}) for e in self._by_target.values()]
        data = b"".join(body)
        if len(data) > MAX_BYTES:
            raise OSError(errno.EFBIG, f"the journal would exceed {MAX_BYTES} bytes")
        tmp = _tmp_name(self.path.name, os.getpid())
        # Our own leftover (an earlier failed save) goes first; then O_EXCL|O_NOFOLLOW: never
        # write through a file or symlink someone else put there.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        if checkpoint:
            checkpoint("journal-temp-written")  # a crash here leaves the old journal intact
        os.replace(tmp, self.path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        _fsync_fd(dfd)
        self._pending = []
        self._on_disk, self._rewrite = True, False
        self._records, self._size = len(self._by_target), len(data)
        self.version = VERSION


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def _tmp_name(name: str, pid: int) -> str:
    return f".{name}.{pid}.tmp"


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; the rename still happened
        pass


def clean_stale_temps(dfd: int) -> None:
    """Remove journal temp files left by a process that died between write and rename (the
    journal itself is intact then). Call with the lock held: no live writer can be mid-save."""
    prefix, suffix = f".{FILENAME}.", ".tmp"
    for name in os.listdir(dfd):
        pid_s = name[len(prefix):-len(suffix)]
        if not (name.startswith(prefix) and name.endswith(suffix) and pid_s.isascii()
                and pid_s.isdigit()):
            continue
        if int(pid_s) != os.getpid():
            try:
                os.kill(int(pid_s), 0)
                continue  # still running (it cannot hold our lock, but leave its file alone)
            except ProcessLookupError:
                pass
            except (PermissionError, OverflowError, ValueError):
                continue  # alive, another user's (or not a pid at all)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dfd)


def journal_path(state_dir: Path) -> Path:
    return state_dir / FILENAME


# ----------------------------------------------------------------------------------------------
# Reading and validation
# ----------------------------------------------------------------------------------------------


def _corrupt(where: str, why: str) -> JournalError:
    return JournalError(f"journal {where} is corrupt ({why}); nothing was changed. Inspect it, "
                        "restore the values it lists by hand if needed, then delete it")


def _str_field(rec: dict, key: str, limit: int, where: str, i: int,
               required: bool = True) -> str:
    v = rec.get(key, None if required else "")
    if not isinstance(v, str):
        raise JournalError(f"journal {where}: record {i} is malformed ({key!r} is not a "
                           "string); nothing was changed")
    if len(v) > limit:
        raise JournalError(f"journal {where}: record {i} has a {key!r} of {len(v):,} "
                           f"characters (at most {limit:,}); nothing was changed")
    return v


def _entry(rec: dict, where: str, i: int) -> Entry:
    seq = rec.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq <= 1 << 62:
        raise JournalError(f"journal {where}: record {i} is malformed (seq); nothing was "
                           "changed")
    target = _str_field(rec, "target", MAX_KEY, where, i)
    e = Entry(seq, _str_field(rec, "tunable", MAX_KEY, where, i), target,
              _str_field(rec, "original", MAX_VALUE, where, i),
              _str_field(rec, "written", MAX_VALUE, where, i),
              _str_field(rec, "time", MAX_VALUE, where, i, required=False),
              _str_field(rec, "detail", MAX_VALUE, where, i, required=False),
              _before(rec, where, i))
    _check_target(target, where, i)
    return e


def _before(rec: dict, where: str, i: int) -> str | None:
    return None if rec.get("before") is None else _str_field(rec, "before", MAX_VALUE, where, i)


def _check_target(target: str, where: str, i: int) -> None:
    if not allowed(target):
        raise JournalError(f"journal {where}: record {i} names {target!r}, which is not "
                           "a target tuning may write; nothing was changed")


def _meta(data: dict, where: str) -> tuple[str | None, str, str]:
    boot = data.get("boot_id")
    if boot is not None and not (isinstance(boot, str) and len(boot) <= MAX_KEY):
        raise JournalError(f"journal {where}: boot_id is not a string; nothing was changed")
    mounts = data.get("procfs"), data.get("sysfs")
    if not all(isinstance(m, str) and m.startswith("/") and len(m) <= 4096 and "\x00" not in m
               for m in mounts):
        raise JournalError(f"journal {where} does not say which /proc and /sys it was written "
                           "against (procfs/sysfs); nothing was changed")
    return boot, str(mounts[0]), str(mounts[1])


def _loads(text: str, where: str, what: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _corrupt(where, f"{what} is not JSON: {exc.msg}") from None
    except RecursionError:
        raise _corrupt(where, f"{what} is nested too deeply") from None


def _short(v: object, limit: int = 64) -> str:
    s = str(v)
    return s if len(s) <= limit else s[:limit] + "…"


def _torn_target(tail: str) -> str | None:
    """The target a torn record names, when its bytes hold the whole ``"target"`` string."""
    m = re.search(r'"target":("(?:[^"\\]|\\.)*")', tail)
    if m is None:
        return None
    try:
        v = json.loads(m.group(1))
    except ValueError:
        return None
    return v if isinstance(v, str) else None


def _not_one_record(tail: str) -> str | None:
    """Why the bytes after the last newline cannot be the start of one record, or None."""
    n = len(tail.encode())
    if n > MAX_RECORD_BYTES:
        return f"{n:,} bytes, more than one record can be ({MAX_RECORD_BYTES:,})"
    if not (tail.startswith(RECORD_START) or RECORD_START.startswith(tail)):
        return f"they do not start like a record ({_short(tail, 24)!r})"
    if not (tail.isascii() and tail.isprintable()):
        return "they hold bytes a record never has (non-ASCII or control characters)"
    if tail.find('{"op":', 1) != -1:
        return "they hold more than one record"
    return None


def _parse_v2(lines: list[str], tail: str, path: Path) -> Journal:
    where = str(path)
    head = _loads(lines[0], where, "the header line")
    if not isinstance(head, dict):
        raise _corrupt(where, "the header line is not an object")
    boot, procfs, sysfs = _meta(head, where)
    j = Journal(path, boot, [], _short(head.get("created", ""), 64), "",
                _short(head.get("profile", ""), MAX_KEY), _short(head.get("cpus", ""), MAX_VALUE),
                procfs, sysfs)
    by_target = j._by_target
    last_time = ""
    for i, line in enumerate(lines[1:], 1):
        rec = _loads(line, where, f"line {i + 1}")
        if not isinstance(rec, dict):
            raise _corrupt(where, f"line {i + 1} is not an object")
        op = rec.get("op")
        if op == "add":
            e = _entry(rec, where, i)
            if e.target in by_target:
                raise JournalError(f"journal {where}: target {e.target!r} appears twice; "
                                   "nothing was changed")
            if len(by_target) >= MAX_ENTRIES:
                raise JournalError(f"journal {where} has more than {MAX_ENTRIES:,} entries; "
                                   "nothing was changed")
            by_target[e.target] = e
            last_time = e.time or last_time
        elif op in ("written", "drop"):
            target = _str_field(rec, "target", MAX_KEY, where, i)
            e = by_target.get(target)
            if e is None:
                raise _corrupt(where, f"line {i + 1} changes {target!r}, which it does not "
                               "list")
            if op == "drop":
                del by_target[target]
            else:
                e.written = _str_field(rec, "written", MAX_VALUE, where, i)
                e.before = _before(rec, where, i)
        else:
            raise _corrupt(where, f"line {i + 1} has an unknown op {_short(op)!r}")
    j._next_seq = max((e.seq for e in by_target.values()), default=0) + 1
    j.updated = last_time
    j._on_disk = True
    j._records = len(lines) - 1
    if tail:
        why = _not_one_record(tail)
        if why is not None:
            at = sum(len(ln.encode()) + 1 for ln in lines)
            raise JournalError(
                f"journal {where} is corrupt: read the header and {len(lines) - 1:,} complete "
                f"record(s) listing {len(by_target):,} target(s), then bytes {at:,}-"
                f"{at + len(tail.encode()):,} without a newline that "
                f"are not one torn record ({why}); nothing was changed and the file is kept. "
                "Inspect it, restore the values it lists by hand if needed, then delete it")
        j.torn = tail
        j.torn_at = sum(len(ln.encode()) + 1 for ln in lines)
        j.torn_target = _torn_target(tail)
    j._rewrite = bool(tail)  # never append after a torn line
    return j


def _parse_v1(data: dict, path: Path) -> Journal:
    where = str(path)
    raw = data.get("entries")
    if not isinstance(raw, list):
        raise JournalError(f"journal {where} has no entry list; nothing was changed")
    if len(raw) > MAX_ENTRIES:
        raise JournalError(f"journal {where} has more than {MAX_ENTRIES:,} entries; nothing "
                           "was changed")
    entries: dict[str, Entry] = {}
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise JournalError(f"journal {where}: entry {i} is malformed; nothing was changed")
        ent = _entry(e, where, i)
        if ent.target in entries:
            raise JournalError(f"journal {where}: target {ent.target!r} appears twice; "
                               "nothing was changed")
        entries[ent.target] = ent
    boot, procfs, sysfs = _meta(data, where)
    j = Journal(path, boot, list(entries.values()), _short(data.get("created", ""), 64),
                _short(data.get("updated", ""), 64), _short(data.get("profile", ""), MAX_KEY),
                _short(data.get("cpus", ""), MAX_VALUE), procfs, sysfs)
    j.version = 1
    j._on_disk, j._rewrite = True, True  # the first change rewrites it as version 2
    return j


def parse(text: str, path: Path) -> Journal:
    """Parse and validate a journal file's text (version 2, or version 1). Raises
    JournalError on anything unexpected."""
    where = str(path)
    lines = text.split("\n")
    tail = lines.pop()  # after the last newline: "" unless the last append was torn
    first = lines[0] if lines else ""
    head = None
    if first.startswith("{") and first.endswith("}"):
        with contextlib.suppress(JournalError):
            head = _loads(first, where, "the header line")
    if isinstance(head, dict) and head.get("format") == FORMAT:
        version = head.get("version")
        if version != VERSION:
            raise JournalError(f"journal {where} has format version {_short(version)!r}, "
                               f"which this hftagent does not know (it reads {VERSION} and "
                               "1; written by a newer release?); nothing was changed")
        return _parse_v2(lines, tail, path)
    if not text.strip():
        raise _corrupt(where, "empty")
    if not lines:
        raise _corrupt(where, "no complete header line")
    data = _loads(text, where, "the file")
    if isinstance(data, dict) and data.get("format") == FORMAT_V1:
        return _parse_v1(data, path)
    raise JournalError(f"journal {where} is not a {FORMAT} file (version {VERSION} or 1); "
                       "nothing was changed")


def _read_bounded(dfd: int, path: Path) -> bytes | None:
    """The bytes of the journal file, or None when there is none. Regular file only (a FIFO
    would block a plain open forever), never through a symlink, owned by root or by us, one
    link, at most MAX_BYTES."""
    try:
        fd = os.open(FILENAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JournalError(f"journal {path} is a symlink: refused; nothing was "
                               "changed") from None
        raise JournalError(f"cannot read journal {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise JournalError(f"journal {path} is not a regular file: refused; nothing was "
                               "changed")
        if st.st_uid not in (0, os.geteuid()):
            raise JournalError(f"journal {path} is owned by uid {st.st_uid}, not by root or "
                               "us: refused; nothing was changed")
        if st.st_nlink != 1:
            raise JournalError(f"journal {path} has {st.st_nlink} hard links: refused; "
                               "nothing was changed")
        if st.st_size > MAX_BYTES:
            raise JournalError(f"journal {path} is {st.st_size:,} bytes, more than a journal "
                               f"can be ({MAX_BYTES:,}): refused; nothing was changed")
        data = read_fd_bounded(fd, MAX_BYTES)
        if len(data) > MAX_BYTES:
            raise JournalError(f"journal {path} grew past {MAX_BYTES:,} bytes while being "
                               "read: refused; nothing was changed")
        return data
    except OSError as exc:
        raise JournalError(f"cannot read journal {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _open_state(state_dir: Path, create: bool, beneath: Path | None) -> int | None:
    try:
        return open_dir(state_dir, create=create, beneath=beneath)
    except UnsafePath as exc:
        raise JournalError(f"state directory {state_dir}: {exc}") from None
    except (NotADirectoryError, FileExistsError):
        raise JournalError(f"state directory {state_dir} is not a directory") from None
    except OSError as exc:
        raise JournalError(f"cannot use state directory {state_dir}: "
                           f"{exc.strerror or exc}") from None


def load(state_dir: Path, *, beneath: Path | None = None, dir_fd: int | None = None
         ) -> Journal | None:
    """The journal in ``state_dir``, or None when there is none. Raises JournalError.
    ``beneath``: the ``--root`` tree the state directory must not lead out of
    (tuning.safepath.open_dir); ``dir_fd``: the directory already opened by :func:`locked`."""
    path = journal_path(state_dir)
    own = dir_fd is None
    dfd = _open_state(state_dir, False, beneath) if own else dir_fd
    if dfd is None:
        return None
    try:
        raw = _read_bounded(dfd, path)
    finally:
        if own:
            os.close(dfd)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JournalError(f"journal {path} is corrupt (not UTF-8); nothing was changed") from None
    j = parse(text, path)
    j.dir_fd = None if own else dir_fd
    return j


def state_exists(state_dir: Path, *, beneath: Path | None = None) -> bool:
    """Whether the state directory exists (checked as :func:`locked` would use it), without
    creating anything. Raises JournalError when it cannot be used."""
    dfd = _open_state(state_dir, False, beneath)
    if dfd is None:
        return False
    os.close(dfd)
    return True


def stale(journal: Journal, boot_id: str | None) -> bool:
    """True when the journal was written under another boot (both ids known and different)."""
    return journal.boot_id is not None and boot_id is not None and journal.boot_id != boot_id


@contextlib.contextmanager
def locked(state_dir: Path, *, beneath: Path | None = None) -> Iterator[int]:
    """Exclusive lock on the state directory: one apply/rollback at a time. Yields the
    directory's descriptor (every journal operation goes through it, so the directory cannot
    be swapped while the lock is held). Raises JournalError when it is held, or when the
    directory cannot be used (not a directory, a symlink leading out of the root, owned or
    writable by someone else, read-only file system, no space, permission)."""
    dfd = _open_state(state_dir, True, beneath)
    assert dfd is not None
    try:
        try:
            fd = os.open(LOCKNAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise JournalError(f"{state_dir}/{LOCKNAME} is a symlink: refused") from None
            raise JournalError(f"cannot use state directory {state_dir}: "
                               f"{exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise JournalError(f"{state_dir}/{LOCKNAME} is not a regular file: refused")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise JournalError(f"another hftagent tune apply/rollback holds "
                                       f"{state_dir}/{LOCKNAME}; try again when it has "
                                       "finished") from None
                raise JournalError(f"cannot lock {state_dir}/{LOCKNAME}: "
                                   f"{exc.strerror or exc}") from None
            try:
                clean_stale_temps(dfd)
            except OSError:
                pass  # a leftover temp file is harmless; never fail the command for it
            yield dfd
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
