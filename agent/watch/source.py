"""Where a watch run's latency records come from (:class:`LatencySource`): the built-in probe
worker (:mod:`agent.watch.probe_worker`, its own process on the probe CPUs) or an external
process that records its own calls through :mod:`agent.client`.

Watch's own probe ring is ``hftagent-watch-<pid>-<random>.ring`` in
:func:`agent.client.ring_dir` (``WatchConfig.ring_dir`` overrides it; the random part means
no other user can block the name beforehand), created by the worker as
:class:`agent.client.LatencyRing` does and read only when it is ours (our euid, created by the
worker); what a killed watch left there is swept first (:func:`agent.client.sweep_stale_rings`).

``--pid PID`` finds the process's ring in ``/proc/PID/maps`` (:func:`find_ring`): the client
maps its ring shared and writable, so among those mappings the ring is the one that is a
latency ring created by PID, the same file (device and inode) as the mapping, and owned by
PID's effective uid — root reads a process's ring only when the process's own user owns it, so
a ring another user planted (its header's creator pid is theirs to write) is refused. ``--ring``
names a ring itself; its owner must still be the effective uid of ``--pid`` (or of the
header's creator, when it runs). A ring not there yet is waited for up to
:data:`EXTERNAL_WAIT_S`; one that is there but wrong is refused at once. A source that dies is
reported by :meth:`LatencySource.check` (the session ends the run with exit code 3).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from agent.client import (
    RingError,
    RingMissing,
    RingReader,
    ring_dir,
    ring_name,
    ring_size_ok,
    sweep_stale_rings,
)
from agent.errors import AgentError
from agent.trace import attach, uprobe
from agent.watch.attached import AttachedReader, process_cpus
from agent.watch.config import WatchConfig
from agent.watch.probe_worker import await_ready
from collectors.host import Host
from collectors.parsers import format_cpulist

EXTERNAL_WAIT_S = 5.0  # an external ring not created yet is waited for this long


class LatencySource:
    """The probe worker or the external process, and the :class:`RingReader` of its ring.
    ``warnings``: the session's list. Starting sets ``cfg.pid`` (the worker's, or the ring's
    creator), ``cfg.rate_hz`` (``--rate auto``: the worker's choice) and, for an external
    process given without ``--cpus``, ``cfg.probe_cpus`` (its affinity)."""

    def __init__(self, cfg: WatchConfig, host: Host, warnings: list[str]) -> None:
        self.cfg = cfg
        self.host = host
        self.warnings = warnings
        self.proc: subprocess.Popen | None = None
        self.reader: RingReader | None = None
        self.info: dict = {}  # the worker's "ready" line, or what the external process is
        self._own_ring: str | None = None
        self._uprobes = None  # agent.trace.uprobe.Uprobes of --attach

    def start_probe(self, progress=None) -> None:
        """Start the built-in probe worker and wait for its "ready" line (TF import and
        warm-up: seconds), telling ``progress(str)`` each phase the worker reports; an error
        is :class:`AgentError` with the worker's own line."""
        cfg = self.cfg
        d = Path(cfg.ring_dir) if cfg.ring_dir else ring_dir()
        swept = sweep_stale_rings(d)  # what a killed watch (SIGKILL) left behind
        if swept:
            self.warnings.append(f"removed {len(swept)} ring file(s) left in {d} by a watch "
                                 "that is gone: " + ", ".join(sorted(swept)[:4]))
        path = str(d / ring_name("hftagent-watch"))
        self._own_ring = path  # the worker creates it; we remove it when we stop the worker
        cmd = [sys.executable, "-m", "agent.watch.probe_worker", "--ring", path,
               "--rate", str(cfg.rate_hz), "--cpus", ",".join(map(str, cfg.probe_cpus)),
               "--probe", cfg.probe, "--model", cfg.model, "--variant", cfg.variant,
               "--warmup", str(cfg.warmup)]
        # Own session: a terminal's Ctrl-C (SIGINT to the foreground group) reaches only
        # watch, which then stops the worker itself after the final drain; otherwise the
        # worker could exit first and the stop would look like a dead probe (exit 3).
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        # phase lines, then "ready" (TF import, build and warm-up: seconds)
        msg = await_ready(self.proc.stdout, progress)
        if not msg.get("ready"):
            err = msg.get("error")
            if not err:
                self.proc.wait(timeout=5)
                tail = (self.proc.stderr.read() or "").strip().splitlines()[-3:]
                err = f"probe worker exited ({self.proc.returncode}): {' | '.join(tail)}"
            self.stop()
            raise AgentError(err)
        self.info = msg
        cfg.pid = int(msg["pid"])
        cfg.rate_hz = float(msg.get("rate_hz") or cfg.rate_hz)  # --rate auto: chosen
        try:
            self.reader = RingReader(path, expect_uid=os.geteuid(), expect_pid=cfg.pid)
        except RingError as exc:
            self.stop()
            raise AgentError(str(exc)) from None

    def attach_external(self) -> None:
        """Open an external process's ring: ``--ring``, or the ring ``--pid`` maps."""
        cfg = self.cfg
        deadline = time.monotonic() + EXTERNAL_WAIT_S
        while True:
            try:
                if cfg.ring_path:
                    self.reader = self._open_named(Path(cfg.ring_path))
                else:
                    self.reader = find_ring(self.host, cfg.pid)
                break
            except RingMissing as exc:  # not created yet: wait a little for it
                if time.monotonic() > deadline:
                    hint = ("is the process using agent.client, and is HFTAGENT_RING the same "
                            "path?" if cfg.ring_path else "it appears at the process's first "
                            "timed() or end()")
                    raise AgentError(f"{exc} ({hint})") from None
                time.sleep(0.1)
            except RingError as exc:  # a ring that is there but wrong: at once
                raise AgentError(str(exc)) from None
        if cfg.pid is None:
            cfg.pid = self.reader.creator_pid
        self.info = {"pid": cfg.pid, "probe": f"external process {cfg.pid} "
                                              f"({self.reader.path})"}
        if not cfg.probe_cpus:
            try:
                cfg.probe_cpus = sorted(os.sched_getaffinity(cfg.pid))
            except OSError:
                pass

    def prepare_attach(self) -> None:
        """``--attach PID``, before the event source opens: the probe CPUs are the CPUs the
        process's threads may run on (the instance traces those), the rest housekeeping."""
        cfg = self.cfg
        try:
            comm = attach.comm_of(self.host, cfg.pid)
        except attach.AttachError as exc:
            raise AgentError(str(exc)) from None
        cpus = process_cpus(self.host, cfg.pid)
        if cpus:
            if cfg.probe_cpus and sorted(cfg.probe_cpus) != cpus:
                self.warnings.append(f"--attach: pid {cfg.pid} ({comm}) may run on CPUs "
                                     f"{format_cpulist(cpus)}: those are traced")
            cfg.probe_cpus = cpus
            hk = [c for c in cfg.housekeeping_cpus if c not in cpus]
            cfg.housekeeping_cpus = hk or [c for c in range(os.cpu_count() or 1)
                                           if c not in cpus] or cpus
        if len(cpus) > 4:
            self.warnings.append(f"--attach: pid {cfg.pid} is not pinned ({len(cpus)} CPUs): "
                                 "kernel events are recorded on all of them (pin the service "
                                 "for a smaller cost and a cleaner attribution)")

    def attach_uprobes(self, events, progress=None) -> None:
        """``--attach PID``: uprobes on the runtime's once-per-call function, enabled in the
        kernel-event instance ``events`` (an EventSource), read by an
        :class:`~agent.watch.attached.AttachedReader`. AgentError with one line when the
        process cannot be attached."""
        cfg = self.cfg
        try:
            plan = attach.plan(self.host, cfg.pid, cfg.attach_runtime, cfg.attach_symbol,
                               cfg.unsafe_return, progress)
        except attach.AttachError as exc:
            raise AgentError(str(exc)) from None
        self.warnings += [f"attach: {n}" for n in uprobe.remove_stale(self.host,
                                                                      events.tracefs)]
        u = uprobe.Uprobes(events.tracefs, plan.targets)
        try:
            u.define()
            reader = AttachedReader(self.host, cfg.pid, events, u,
                                    entry_only=not any(t.returns for t in plan.targets))
            events.add_uprobes(u, sorted(reader.threads()))
        except (uprobe.UprobeError, OSError, ValueError) as exc:
            u.remove()
            raise AgentError(f"--attach {cfg.pid}: {getattr(exc, 'strerror', None) or exc}") \
                from None
        self._uprobes = u
        self.reader = reader
        t = plan.targets[0]
        self.info = {"pid": cfg.pid, "probe": f"attached to pid {cfg.pid} ({plan.comm}): "
                     f"{t.runtime} {t.shown}", "attach": plan.to_dict()}
        self.warnings += [f"attach: {n}" for n in attach.host_notes(self.host)]
        self.warnings.append(
            f"attached: {len(plan.targets)} uprobe(s) in {os.path.basename(t.library)}; every "
            f"process that maps it pays ~{attach.COST_US} µs a call while watch runs"
            + ("; entry-only timing: samples are call periods, not latencies"
               if reader.entry_only else ""))

    def _open_named(self, path: Path) -> RingReader:
        """``--ring PATH``: owned by ``--pid``'s effective uid, else by its creator's when
        that process runs (a ring naming another user's process as its creator is refused)."""
        pid = self.cfg.pid
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
        """Why the source is gone (the worker exited, the external process exited or is a
        zombie), or None while it lives."""
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                tail = ""
                try:
                    tail = " | ".join((self.proc.stderr.read() or "").strip().splitlines()[-2:])
                except (OSError, ValueError):
                    pass
                return f"probe worker (pid {self.proc.pid}) exited with code {rc}" + \
                    (f": {tail}" if tail else "")
        elif self.cfg.pid is not None:
            try:
                os.kill(self.cfg.pid, 0)
            except ProcessLookupError:
                return f"{self._what()} {self.cfg.pid} exited"
            except PermissionError:
                pass
            # A zombie still answers kill(0): look at its state.
            st = self.host.read(self.host.proc(self.cfg.pid, "stat")).value
            if st and st[st.rfind(")") + 2:st.rfind(")") + 3] in ("Z", "X"):
                return f"{self._what()} {self.cfg.pid} exited"
        return None

    def _what(self) -> str:
        return "attached process" if self._uprobes is not None else "external process"

    def stop(self) -> None:
        """Stop the probe worker (SIGTERM; SIGKILL when it does not end in time) and remove
        its ring; nothing for an external process."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                # a worker in its loop ends its call and closes the ring; one still in its
                # TF import or warm-up may not look at the signal for seconds: killed
                self.proc.wait(timeout=5 if self.info else 1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        path = self._own_ring or (self.reader.path if self.reader is not None else None)
        if path is None:
            return
        try:
            os.unlink(path)
        except OSError:
            pass

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self._uprobes is not None:
            left = self._uprobes.remove()
            if left:
                self.warnings.append("uprobe events not removed: " + "; ".join(left))
            self._uprobes = None


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
