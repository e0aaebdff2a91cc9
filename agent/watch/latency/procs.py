"""Which processes are the service (``watch --attach-name/--attach-unit/--attach-cgroup``):
an identity, checked once (:func:`identity`), and a cheap poller of the pids that match it
now (:class:`Matcher`). Pure: reads through the Host model, runs ``systemctl`` by argv (no
shell), writes nothing.

- ``--attach-name NAME``: a process whose name (``/proc/PID/comm``, 15 bytes: the kernel's
  TASK_COMM_LEN) is NAME, or whose command line (``/proc/PID/cmdline``, arguments joined by
  spaces) the regular expression NAME matches (``re.search``). Watch itself and its
  ancestors (``sudo``, a shell, ``timeout`` whose command lines name the service too) never
  match, nor a process without a command line (a kernel thread, a zombie). A poll lists
  /proc only when a process was created since the last listing (the last pid of the pid
  namespace, ``/proc/loadavg``'s fifth field, changed: a fork; an exec creates no pid and
  is what the young pids' reads below are for), and reads comm and cmdline of the pids it
  has not seen only (a pid's verdict is kept while it lives), so a poll on a quiet box
  costs one small read (listing /proc and its ~100 pids was ~0.3 ms of CPU a poll, ~0.2 %
  of one CPU at 6.7 polls a second, issue #38). Between listings an exit is not seen
  here: the caller checks its processes' lives. A process that does not
  match is looked at again during its first :data:`RECHECK_S` (a service is started by fork
  and exec: the child carries its parent's command line until it execs).
- ``--attach-unit UNIT``: the unit's main process (``systemctl show -p MainPID -p LoadState
  UNIT``: what ``systemctl show -p MainPID --value UNIT`` prints) where systemd runs (sd_booted:
  ``/run/systemd/system``); systemctl is asked again only when the unit's cgroup.procs
  changes (a poll reads that file: system.slice/UNIT, or the ``ControlGroup`` systemd named;
  a stopped unit has none, and its reappearance is the change), and once a second only
  while no cgroup of the unit has ever been found. Without systemd: every process of
  ``/sys/fs/cgroup[/unified|/systemd]/system.slice/UNIT/cgroup.procs``. ``.service`` is
  added to a name without a unit suffix, as systemctl does.
- ``--attach-cgroup PATH``: every process of a cgroup directory under /sys/fs/cgroup (its
  ``cgroup.procs`` and its descendants'), absolute or relative to /sys/fs/cgroup; a path out
  of it (``..``, a symbolic link on the way) is refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host, HotFile
from collectors.tasks import parse_stat_identity

TASK_COMM_LEN = 16          # include/linux/sched.h: comm holds 15 bytes and a NUL
CGROUP_ROOT = "/sys/fs/cgroup"
UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".target", ".mount", ".timer")
_UNIT_RE = re.compile(r"^[A-Za-z0-9:_.\\@-]{1,255}$")   # systemd's unit name characters
MAX_CGROUP_DEPTH = 8        # descendants read below the given directory
SYSTEMCTL_TIMEOUT_S = 3.0
RECHECK_S = 3.0             # a new pid that does not match is read again this long
ASK_EVERY_S = 1.0           # systemctl at most this often where no cgroup tells a change

Systemctl = Callable[[str], "dict[str, str] | None"]


class IdentityError(ValueError):
    """A bad --attach-name/--attach-unit/--attach-cgroup (the message is one line)."""


@dataclass(frozen=True)
class Identity:
    """The service as the options named it: ``kind`` (name, unit, cgroup), ``value`` as
    given; ``unit`` the unit with its suffix; ``cgroup`` the directory relative to
    /sys/fs/cgroup (``--attach-cgroup``)."""

    kind: str
    value: str
    unit: str = ""
    cgroup: str = ""

    @property
    def said(self) -> str:
        return f"--attach-{self.kind} {self.value}"

    @property
    def label(self) -> str:
        """The service label (the exporter's): what the options named, never a pid."""
        return self.unit or self.value


def identity(host: Host, name: str | None, unit: str | None, cgroup: str | None,
             systemctl: Systemctl | None = None) -> Identity:
    """The one identity given, checked (a regex that compiles, a unit that exists, a cgroup
    directory under /sys/fs/cgroup). IdentityError with one line."""
    given = [(k, v) for k, v in (("name", name), ("unit", unit), ("cgroup", cgroup))
             if v is not None]
    if len(given) > 1:
        raise IdentityError(f"--attach-{given[0][0]} and --attach-{given[1][0]} name two "
                            "services: give one")
    kind, value = given[0]
    if not value.strip():
        raise IdentityError(f"--attach-{kind} is empty")
    if kind == "name":
        _regex(value)
        return Identity("name", value)
    if kind == "unit":
        return _unit(host, value, systemctl or run_systemctl)
    return Identity("cgroup", value, cgroup=cgroup_dir(host, value))


def _regex(value: str) -> re.Pattern:
    try:
        return re.compile(value)
    except re.error as exc:
        raise IdentityError(f"--attach-name {value!r}: not a regular expression ({exc})"
                            ) from None


def _unit(host: Host, value: str, systemctl: Systemctl) -> Identity:
    if not _UNIT_RE.match(value) or value.startswith("-"):
        raise IdentityError(f"--attach-unit {value!r}: not a unit name (letters, digits and "
                            r":_.\@- only)")
    unit = value if value.endswith(UNIT_SUFFIXES) else f"{value}.service"
    if systemd_runs(host):
        props = systemctl(unit)
        if props is None:
            raise IdentityError(f"--attach-unit {value}: systemctl did not answer")
        if props.get("LoadState") in ("not-found", "", None):
            raise IdentityError(f"--attach-unit {value}: no such unit ({unit} not found)")
    elif unit_cgroup(host, unit) is None:
        raise IdentityError(f"--attach-unit {value}: no such unit (systemd is not running "
                            f"and no cgroup {unit} is under {CGROUP_ROOT})")
    return Identity("unit", value, unit=unit)


def systemd_runs(host: Host) -> bool:
    """sd_booted(3): systemd is PID 1 when /run/systemd/system is a directory."""
    return host.run_dir("systemd", "system").is_dir()


def run_systemctl(unit: str) -> dict[str, str] | None:
    """``systemctl show -p MainPID -p LoadState -p ControlGroup -- UNIT`` (argv, no shell):
    its properties, None when it cannot be run or fails."""
    try:
        r = subprocess.run(["systemctl", "show", "-p", "MainPID", "-p", "LoadState", "-p",
                            "ControlGroup", "--",
                            unit], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S,
                           check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return dict(ln.partition("=")[::2] for ln in r.stdout.splitlines() if "=" in ln)


def _cgroup_root(host: Host) -> Path:
    return host.sys("fs", "cgroup")


def unit_cgroup(host: Host, unit: str) -> Path | None:
    """The unit's cgroup directory: the unified hierarchy's, else the hybrid layout's
    (``unified``, then systemd's named v1 hierarchy), or None."""
    for base in ((), ("unified",), ("systemd",)):
        d = _cgroup_root(host).joinpath(*base, "system.slice", unit)
        if _real_dir(d):
            return d
    return None


def _real_dir(d: Path) -> bool:
    try:
        return os.path.isdir(d) and not os.path.islink(d)
    except OSError:
        return False


def cgroup_dir(host: Host, value: str) -> str:
    """``--attach-cgroup``'s directory relative to /sys/fs/cgroup: an absolute path must be
    under it; no ``..``, no symbolic link on the way, a directory with ``cgroup.procs``."""
    rel = value
    if value.startswith("/"):
        parts = Path(os.path.normpath(value)).parts
        if parts[:4] != ("/", "sys", "fs", "cgroup") or ".." in Path(value).parts:
            raise IdentityError(f"--attach-cgroup {value}: not a cgroup directory (it must be "
                                f"under {CGROUP_ROOT})")
        rel = "/".join(parts[4:])
    if ".." in Path(rel).parts:
        raise IdentityError(f"--attach-cgroup {value}: '..' is refused (a directory under "
                            f"{CGROUP_ROOT})")
    d = _cgroup_root(host)
    for part in Path(rel).parts:
        d = d / part
        if os.path.islink(d):
            raise IdentityError(f"--attach-cgroup {value}: {host.display(d)} is a symbolic "
                                "link: refused")
    if not _real_dir(d) or not os.path.isfile(d / "cgroup.procs"):
        raise IdentityError(f"--attach-cgroup {value}: no cgroup directory "
                            f"{host.display(d)} (with cgroup.procs)")
    return rel


def cgroup_pids(host: Host, d: Path, depth: int = MAX_CGROUP_DEPTH) -> set[int]:
    """The pids of cgroup directory ``d`` and its descendants (links not followed)."""
    text = host.read(d / "cgroup.procs").value or ""
    pids = {int(x) for x in text.split() if x.isdigit()}
    if depth > 0:
        for name in host.listdir(d):
            sub = d / name
            if _real_dir(sub):
                pids |= cgroup_pids(host, sub, depth - 1)
    return pids


def started(host: Host, pid: int) -> int | None:
    """Process ``pid``'s start time (/proc/PID/stat field 22, clock ticks after boot): what
    tells a new process from an old one with the same pid. None when gone."""
    try:
        return parse_stat_identity(host.read(host.proc(pid, "stat")).value or "").starttime
    except ValueError:
        return None


def running_for_s(started_ticks: int | None, uptime: str | None) -> float | None:
    """Seconds a process started at ``started_ticks`` (:func:`started`) has run, by
    /proc/uptime's text ``uptime``; None where either is unknown."""
    try:
        return float((uptime or "").split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError, TypeError):
        return None


def ancestors(host: Host, pid: int) -> set[int]:
    """``pid`` and its ancestors (their command lines may name the service too)."""
    out: set[int] = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = host.read(host.proc(pid, "stat")).value or ""
        try:
            pid = int(st[st.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            break
    return out


class Matcher:
    """The pids of an :class:`Identity` now (:meth:`poll`), cheaply (module docstring).
    ``own``: watch's pid (it and its ancestors never match); ``systemctl``: how a unit's
    main process is asked (:func:`run_systemctl`)."""

    def __init__(self, host: Host, ident: Identity, own: int | None = None,
                 systemctl: Systemctl | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host, self.ident = host, ident
        self.exclude = ancestors(host, os.getpid() if own is None else own)
        self.systemctl = systemctl or run_systemctl
        self._regex = _regex(ident.value) if ident.kind == "name" else None
        self.clock = clock
        self._verdict: dict[int, bool] = {}     # pid -> matches (kept while it lives)
        self._young: dict[int, float] = {}      # pid -> first seen, while not matching
        self._procs: str | None = None          # the unit cgroup.procs last asked about
        self._asked_at = -ASK_EVERY_S
        self._first = True                      # what runs at the first poll is not young
        self._main: set[int] = set()
        self._cgroup: Path | None = None        # the unit's cgroup as systemd named it
        self._seen_cgroup = False
        self._live: set[int] | None = None      # the pids of the last listing of /proc
        self._listed_at: bytes | None = None    # the namespace's last pid before it
        self._loadavg: HotFile | bool | None = None  # /proc/loadavg open (False: unreadable)
        self._judged: set[int] | None = None    # the listing every pid of has a verdict
        self._matched: set[int] = set()         # ... and those that match

    def poll(self) -> set[int]:
        """The pids that are the service now."""
        if self.ident.kind == "name":
            return self._by_name()
        if self.ident.kind == "unit":
            return self._by_unit()
        return cgroup_pids(self.host, _cgroup_root(self.host) / self.ident.cgroup)

    def _pids(self) -> set[int]:
        """The pids of /proc: listed again only when the namespace's last pid changed
        (module docstring; /proc/loadavg kept open and read with one pread: through
        Host.read, its path handling was ~0.2 ms a poll); every time where it is not
        readable."""
        last = None
        if self._loadavg is None:
            try:
                self._loadavg = self.host.open_hot(self.host.proc("loadavg"))
            except OSError:
                self._loadavg = False
        if self._loadavg:
            try:
                fields = self._loadavg.read().split()
                last = fields[4] if len(fields) > 4 else None
            except OSError:
                pass
        if last is None or last != self._listed_at or self._live is None:
            self._live, self._listed_at = set(self.host.pids()), last  # (last read first)
        return self._live

    def close(self) -> None:
        """Close /proc/loadavg (idempotent)."""
        if self._loadavg:
            self._loadavg.close()
        self._loadavg = False

    def _by_name(self) -> set[int]:
        live, now = self._pids(), self.clock()
        if live is self._judged and not self._young:  # the same listing, nothing to read
            return set(self._matched)
        up = self.host.read(self.host.proc("uptime")).value if self._first else None
        for gone in set(self._verdict) - live:
            del self._verdict[gone]
            self._young.pop(gone, None)
        for pid in [p for p, t in self._young.items() if now - t >= RECHECK_S]:
            del self._young[pid]
        for pid in (live - set(self._verdict)) | set(self._young):
            yes = self._verdict[pid] = pid not in self.exclude and self.matches(pid)
            if yes:
                self._young.pop(pid, None)
            elif pid not in self.exclude and (not self._first or self._recent(pid, up)):
                self._young.setdefault(pid, now)
        self._first = False
        self._judged = live
        self._matched = {p for p, yes in self._verdict.items() if yes}
        return set(self._matched)

    def _recent(self, pid: int, up: str | None) -> bool:
        """Whether ``pid`` started less than :data:`RECHECK_S` ago (the first poll's
        processes: one may be between its fork and its exec), by its start time in
        /proc/PID/stat against /proc/uptime (``up``)."""
        ran = running_for_s(started(self.host, pid), up)
        return ran is not None and ran < RECHECK_S

    def _learned(self, cg: str) -> Path | None:
        """The unit's cgroup directory as systemd names it (``ControlGroup``: a unit in
        another slice than system.slice), on the unified hierarchy or the hybrid layout's."""
        if not cg.startswith("/") or ".." in Path(cg).parts:
            return self._cgroup
        for base in ((), ("unified",), ("systemd",)):
            d = _cgroup_root(self.host).joinpath(*base, cg.lstrip("/"))
            if _real_dir(d):
                return d
        return self._cgroup

    def matches(self, pid: int) -> bool:
        """Whether process ``pid`` is the named service (its comm, else its cmdline)."""
        raw = self.host.read_bytes(self.host.proc(pid, "cmdline")).value
        if not raw:
            return False   # a kernel thread, a zombie, or gone
        comm = (self.host.read(self.host.proc(pid, "comm")).value or "").strip()
        if comm and comm == self.ident.value[:TASK_COMM_LEN - 1]:
            return True
        line = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        assert self._regex is not None
        return bool(self._regex.search(line))

    def _by_unit(self) -> set[int]:
        d = self._cgroup or unit_cgroup(self.host, self.ident.unit)
        procs = self.host.read(d / "cgroup.procs").value if d is not None else None
        if not systemd_runs(self.host):
            return cgroup_pids(self.host, d) if d is not None else set()
        now = self.clock()
        self._seen_cgroup = self._seen_cgroup or d is not None
        # no cgroup where one was seen: the unit is stopped (asked again when it reappears);
        # none ever seen (a layout we do not know yet): asked once a second
        blind = procs is None and not self._seen_cgroup
        if procs != self._procs or (blind and now - self._asked_at >= ASK_EVERY_S):
            self._procs, self._asked_at = procs, now
            props = self.systemctl(self.ident.unit) or {}
            self._cgroup = self._learned(props.get("ControlGroup", ""))
            if self._cgroup is not None and self._cgroup != d:   # learned now: its state
                self._procs = self.host.read(self._cgroup / "cgroup.procs").value
                self._seen_cgroup = True
            main = props.get("MainPID", "0")
            self._main = {int(main)} if main.isdigit() and int(main) > 0 else set()
        return set(self._main)
