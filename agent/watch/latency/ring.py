"""An external client (``--pid PID``, ``--ring PATH``, ``--probe external``): a process that
times its own calls through :mod:`agent.client` and writes them into its latency ring.

``--pid PID`` finds the process's ring in ``/proc/PID/maps`` (:func:`find_ring`): the client
maps its ring shared and writable, so among those mappings the ring is the one that is a
latency ring created by PID, the same file (device and inode) as the mapping, and owned by
PID's effective uid — root reads a process's ring only when the process's own user owns it, so
a ring another user planted (its header's creator pid is theirs to write) is refused. ``--ring``
names a ring itself; its owner must still be the effective uid of ``--pid`` (or of the
header's creator, when it runs). A ring not there yet is waited for up to
:data:`EXTERNAL_WAIT_S`; one that is there but wrong is refused at once. A process that exits
is reported by :meth:`ClientRun.check` (the session ends the run with exit code 3).

Its CPUs: ``--cpus``, else the process's (:func:`~agent.watch.latency.base.process_cpus`) —
one that may run anywhere gets the last target CPU, keeping one free, unless --housekeeping
was given —, else (a ring alone) every target CPU. Its records carry no in-process evidence of
the host's doing, so its threads' schedstat is read every sampler round.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.client import RingError, RingMissing, RingReader, ring_size_ok
from agent.errors import AgentError
from agent.watch.latency.base import Given, Phase, Running, Source, process_alive, process_cpus
from collectors.host import Host

EXTERNAL_WAIT_S = 5.0  # an external ring not created yet is waited for this long


@dataclass(frozen=True)
class ClientRing(Source):
    """``--pid``/``--ring``: the process (None: the ring's creator) and the ring (None: the
    one the process maps)."""

    process: int | None = None
    ring: str | None = None

    RANK = 20
    NAMES = ("external",)
    sched_period_s = 0.0  # its records carry no run-queue delay: every sampler round
    exporter_label = "client"

    kind = property(lambda self: "external")
    said = property(lambda self: "--probe external")
    pid = property(lambda self: self.process)

    @classmethod
    def named(cls, given: Given) -> bool:
        return given.pid is not None or given.ring is not None or given.probe in cls.NAMES

    @classmethod
    def build(cls, host: Host, given: Given) -> ClientRing:
        pid = given.pid
        if pid is None and given.ring is None:
            raise AgentError("--probe external needs --pid or --ring")
        if pid is not None and (pid <= 0 or not host.proc(pid).exists()):
            raise AgentError(f"--pid {pid}: no such process")
        if given.ring is not None:
            check_ring(given.ring)
        return cls(process=pid, ring=given.ring)

    def cpus(self, host: Host, rule: Any, given: list[int] | None,
             keep_one_free: bool) -> list[int]:
        if given:
            return given
        if self.process is None:
            return list(rule.cpus)  # a ring alone: every target CPU
        cpus = process_cpus(host, self.process, rule.online)
        if not cpus or (keep_one_free and cpus == rule.online):
            return [rule.cpus[-1]]  # a process that may run anywhere: keep one free
        return cpus

    def open(self, host: Host, cpus: list[int], warnings: list[str]) -> ClientRun:
        return ClientRun(self, host, cpus, warnings)


def check_ring(ring: str) -> None:
    """A --ring that is there must be a latency ring now (a directory, a FIFO, a device, a
    symlink, a bad header: refused before anything starts); one that is not there yet must
    be able to appear (its directory exists): watch waits a little for it."""
    parent = Path(ring).parent
    if not parent.is_dir():
        raise AgentError(f"--ring {ring}: directory {parent} does not exist")
    if not os.path.lexists(ring):
        return
    try:
        RingReader(ring).close()
    except RingError as exc:
        raise AgentError(f"--ring: {exc}") from None


class ClientRun(Running):
    """The ring of one run, opened at :meth:`start`."""

    source: ClientRing

    def start(self, events: Any = None, phase: Phase | None = None) -> None:
        """Open the process's ring: ``--ring``, or the ring ``--pid`` maps."""
        src = self.source
        deadline = time.monotonic() + EXTERNAL_WAIT_S
        while True:
            try:
                if src.ring:
                    self.reader = self._open_named(Path(src.ring))
                else:
                    self.reader = find_ring(self.host, src.process)
                break
            except RingMissing as exc:  # not created yet: wait a little for it
                if time.monotonic() > deadline:
                    hint = ("is the process using agent.client, and is HFTAGENT_RING the same "
                            "path?" if src.ring else "it appears at the process's first "
                            "timed() or end()")
                    raise AgentError(f"{exc} ({hint})") from None
                time.sleep(0.1)
            except RingError as exc:  # a ring that is there but wrong: at once
                raise AgentError(str(exc)) from None
        if self.pid is None:
            self.pid = self.reader.creator_pid
        self.info = {"pid": self.pid, "probe": f"external process {self.pid} "
                                               f"({self.reader.path})"}

    def _open_named(self, path: Path) -> RingReader:
        """``--ring PATH``: owned by ``--pid``'s effective uid, else by its creator's when
        that process runs (a ring naming another user's process as its creator is refused)."""
        pid = self.source.process
        uid = proc_euid(self.host, pid) if pid is not None else None
        r = RingReader(path, expect_uid=uid)
        if pid is None:
            uid = proc_euid(self.host, r.creator_pid)
            if uid is not None and r.owner_uid != uid:
                r.close()
                raise RingError(f"latency ring {path} is owned by uid {r.owner_uid}, but its "
                                f"creator pid {r.creator_pid} runs as uid {uid}: refused")
        return r

    def check(self) -> str | None:
        """The process exited (or is a zombie), or None while it lives."""
        if self.pid is None or process_alive(self.host, self.pid):
            return None
        return f"external process {self.pid} exited"


def proc_euid(host: Host, pid: int) -> int | None:
    """The effective uid of process ``pid`` (``/proc/PID/status``'s ``Uid:`` line, its second
    field), or None when the process is gone or the line cannot be read."""
    st = host.read(host.proc(pid, "status")).value
    for line in (st or "").splitlines():
        if line.startswith("Uid:"):
            f = line.split()
            try:
                return int(f[2])
            except (IndexError, ValueError):
                return None
    return None


def shared_file_mappings(maps: str) -> list[tuple[str, int, int, int]]:
    """``(path, major, minor, inode)`` of each shared writable file mapping at offset 0 in
    ``/proc/PID/maps`` text (``start-end rw-s offset major:minor inode path``), in order,
    each file once. A deleted file (``path (deleted)``), an anonymous or a private mapping
    is left out."""
    out: list[tuple[str, int, int, int]] = []
    seen: set[tuple[int, int, int]] = set()
    for line in maps.splitlines():
        f = line.split(None, 5)
        if len(f) < 6 or f[1][:2] != "rw" or f[1][3:4] != "s":
            continue
        _, _, off, dev, ino, path = f
        if not path.startswith("/") or path.endswith(" (deleted)"):
            continue
        try:
            major, _, minor = dev.partition(":")
            key = (int(major, 16), int(minor, 16), int(ino))
            if int(off, 16) != 0 or key[2] == 0:
                continue
        except ValueError:
            continue
        if key not in seen:
            seen.add(key)
            out.append((path, *key))
    return out


def find_ring(host: Host, pid: int) -> RingReader:
    """The latency ring process ``pid`` maps (module docstring): among its shared writable
    file mappings, the regular files that are latency rings created by ``pid``, the very file
    mapped (device and inode, checked again through the open descriptor) and owned by
    ``pid``'s effective uid. Raises :class:`RingMissing` when it maps none yet,
    :class:`RingError` when its maps cannot be read, when the only rings there are refused
    (saying why), or when it maps more than one."""
    shown = host.display(host.proc(pid, "maps"))
    maps = host.read(host.proc(pid, "maps"))
    uid = proc_euid(host, pid)
    if maps.value is None or uid is None:
        if maps.reason == "absent" or (maps.value is not None and uid is None):
            raise RingError(f"--pid {pid}: no such process")
        raise RingError(f"cannot read {shown} to find the latency ring of pid {pid}: "
                        f"{maps.reason} (run watch as that process's user or as root)")
    found: list[RingReader] = []
    refused: list[str] = []
    pseudo = (str(host.procfs).rstrip("/") + "/", str(host.sysfs).rstrip("/") + "/")
    for path, major, minor, ino in shared_file_mappings(maps.value):
        if path.startswith(pseudo):
            continue  # a PCI BAR's resource file (a user-space driver): reading has effects
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        # only the mapped regular file, of a size a ring has, is opened: never a device
        if not stat.S_ISREG(st.st_mode) or (os.major(st.st_dev), os.minor(st.st_dev),
                                            st.st_ino) != (major, minor, ino) \
                or not ring_size_ok(st.st_size):
            continue
        try:
            r = RingReader(path, expect_file=(st.st_dev, st.st_ino))
        except RingError:
            continue  # another shared file of the process (not a latency ring)
        if r.creator_pid != pid or r.owner_uid != uid:
            refused.append(f"latency ring {path} mapped by pid {pid} is "
                           + (f"owned by uid {r.owner_uid}, not the process's uid {uid}"
                              if r.owner_uid != uid else f"pid {r.creator_pid}'s, not its own")
                           + ": refused")
            r.close()
            continue
        found.append(r)
    if len(found) == 1:
        return found[0]
    for r in found:
        r.close()
    if found:
        raise RingError(f"pid {pid} maps {len(found)} latency rings ("
                        + ", ".join(str(r.path) for r in found) + "): give one with --ring")
    if refused:
        raise RingError(refused[0])
    raise RingMissing(f"pid {pid} maps no latency ring yet")


SOURCE = ClientRing
