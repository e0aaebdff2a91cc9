"""One tracefs instance's life: find (or mount) tracefs, create ``instances/<name>``, write
its settings, read its files, remove it on every exit path, and remove the ones a killed
run left behind.

Kernel interface: Documentation/trace/ftrace.rst, "Instances". ``mkdir
<tracefs>/instances/hftagent-<pid>`` creates a trace array of our own, with its own ring
buffer, events, ``tracing_on``, ``trace_clock`` and ``tracing_cpumask``; ``rmdir`` removes it
(EBUSY while one of its files is open, so ours are closed first). Nothing outside that
directory is ever written: not the top-level ``tracing_on``, ``current_tracer`` or events,
not another instance — except removing an instance named ``hftagent-<pid>`` (or its
``-wake`` or ``-calls`` companion) whose creator is dead or its pid reused, at the next start
(:func:`remove_stale`): a SIGKILLed run's guardian (:mod:`.guardian`, started before the
instance) removes it within a second; the next start removes what a guardian killed with its
run left. Every instance this process holds is in :data:`_HELD`: removed at
exit (atexit, KeyboardInterrupt included) and on SIGTERM where nobody else handles it (the
first open installs a handler, main thread, default disposition only, that removes them,
then dies of SIGTERM as it would have). Every refusal is one line (:class:`Unsupported`).
Files are written ``O_NOFOLLOW``, never through a shell.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host
from collectors.parsers import format_cpumask

# Our instances' names: hftagent-<pid> (the probe CPUs), hftagent-<pid>-wake (agent.trace.wake)
# and hftagent-<pid>-calls (agent.trace.calls: watch --attach's uprobe events alone)
PREFIX = "hftagent-"
WAKE_SUFFIX = "-wake"
CALLS_SUFFIX = "-calls"
SUFFIXES = (WAKE_SUFFIX, CALLS_SUFFIX)


@dataclass(frozen=True)
class Unsupported:
    """Why there is no event source; ``reason`` starts with ``unsupported:``."""

    reason: str

    def __bool__(self) -> bool:
        return False


class _Refused(Exception):
    """Set-up failed; the message is the Unsupported reason."""


@dataclass
class CpuStats:
    """``per_cpu/cpuN/stats`` of the instance (kernel trace.c tracing_stats_read)."""

    cpu: int
    entries: int = 0
    overrun: int = 0
    commit_overrun: int = 0
    bytes: int = 0
    dropped: int = 0
    read: int = 0
    oldest_ns: int | None = None
    now_ns: int | None = None


def parse_stats(text: str, cpu: int) -> CpuStats:
    st = CpuStats(cpu)
    for line in text.splitlines():
        key, _, val = line.partition(":")
        val = val.strip()
        try:
            if key == "entries":
                st.entries = int(val)
            elif key == "overrun":
                st.overrun = int(val)
            elif key == "commit overrun":
                st.commit_overrun = int(val)
            elif key == "bytes":
                st.bytes = int(val)
            elif key == "dropped events":
                st.dropped = int(val)
            elif key == "read events":
                st.read = int(val)
            elif key in ("oldest event ts", "now ts"):
                sec, _, frac = val.partition(".")
                ns = int(sec) * 1_000_000_000 + int((frac + "000000")[:6]) * 1000
                if key == "now ts":
                    st.now_ns = ns
                elif ns:
                    st.oldest_ns = ns
        except ValueError:
            continue
    return st


def cpumask_hex(cpus: set[int] | list[int]) -> str:
    """``tracing_cpumask`` format: hex, comma every 32 bits (``ffffffff,00000002``), the
    kernel's cpumask form (collectors.parsers.format_cpumask)."""
    return format_cpumask(cpus)


# -- the process-wide set of instances this process holds, for atexit and "taken" -----------
_HELD: dict[str, weakref.ref] = {}


_AT_EXIT = []  # registered on the first open, not at import


def _close_all_at_exit() -> None:
    for ref in list(_HELD.values()):
        src = ref()
        if src is not None:
            src.close()


def _close_all_then_die(signum: int, _frame) -> None:
    """SIGTERM with no handler of the command's: remove the instances, then die of the
    signal with its default action (the exit status says SIGTERM, as it would have)."""
    signal.signal(signum, signal.SIG_DFL)
    try:
        _close_all_at_exit()
    finally:
        os.kill(os.getpid(), signum)


def _at_exit_and_term() -> None:
    """Once per process, on the first open: atexit, and SIGTERM where its disposition is
    still the default and this is the main thread (only it may set handlers)."""
    if _AT_EXIT:
        return
    _AT_EXIT.append(True)
    atexit.register(_close_all_at_exit)
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _close_all_then_die)


def _proc_is_dead_or_reused(host: Host, pid: int, created_wall: float) -> bool:
    """Whether the creator of an ``hftagent-<pid>`` instance is gone: no such process, a
    zombie, or a process started after the instance was made (the pid was reused)."""
    st = host.read(host.proc(pid, "stat"))
    if not st.ok:
        return True
    text = st.value
    try:
        after = text[text.rindex(")") + 2:].split()
        state, start_ticks = after[0], int(after[19])
    except (ValueError, IndexError):
        return False  # unreadable: leave it alone
    if state in ("Z", "X"):
        return True
    btime = None
    stat = host.read(host.proc("stat"))
    for line in (stat.value or "").splitlines():
        if line.startswith("btime "):
            btime = int(line.split()[1])
    if btime is None:
        return False
    started = btime + start_ticks / os.sysconf("SC_CLK_TCK")
    # btime has 1 s resolution: a process that started more than 2 s after the instance
    # was created cannot be its creator
    return started > created_wall + 2.0


def _instance_name() -> str:
    return f"{PREFIX}{os.getpid()}"


def find_tracefs(host: Host) -> Path | None:
    """The tracefs mount: /sys/kernel/tracing, else the debugfs view (older set-ups)."""
    for p in (host.sys("kernel", "tracing"), host.sys("kernel", "debug", "tracing")):
        try:
            if (p / "instances").is_dir():
                return p
        except PermissionError:
            # tracefs is mode 0700 (root only): one clear line, not a traceback
            raise _Refused(f"unsupported: no permission to use tracefs at "
                           f"{host.display(p)} (needs root)") from None
    return None


def _mount_tracefs(target: Path) -> None:
    """mount -t tracefs nodev TARGET (mount(2) through libc: no shell, no mount binary)."""
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(b"nodev", os.fsencode(str(target)), b"tracefs", ctypes.c_ulong(0), None)
    if rc != 0:
        e = ctypes.get_errno()
        raise _Refused(f"unsupported: cannot mount tracefs at {target}: {os.strerror(e)}")


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_bytes(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def online_cpus(host: Host) -> set[int]:
    """The online CPUs (``devices/system/cpu/online``, a cpulist)."""
    text = host.read(host.sys("devices", "system", "cpu", "online")).value or ""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def remove_stale(host: Host, inst_dir: Path, notes: list[str]) -> None:
    """Remove the instances ``hftagent-<pid>`` (and ``-wake``, ``-calls``) of ``inst_dir`` whose
    creator is gone (:func:`_proc_is_dead_or_reused`), never one this process holds;
    each removal, or refusal, is a line in ``notes``."""
    for entry in host.listdir(inst_dir):
        m = re.fullmatch(re.escape(PREFIX) + r"(\d+)(" + "|".join(map(re.escape, SUFFIXES))
                         + ")?", entry)
        if not m:
            continue
        path = inst_dir / entry
        if str(path).removesuffix(m.group(2) or "") in _HELD:
            continue  # ours, open
        pid = int(m.group(1))
        try:
            created = path.lstat().st_mtime
        except OSError:
            continue
        if pid != os.getpid() and not _proc_is_dead_or_reused(host, pid, created):
            continue
        try:
            os.rmdir(path)
            notes.append(f"removed stale tracefs instance {entry} (pid {pid} gone)")
        except OSError as exc:
            notes.append(f"stale tracefs instance {entry} left: "
                              f"{exc.strerror or exc}")


def remove_instance(path: Path, what: str, notes: list[str]) -> None:
    """Stop and remove one of our instances; a refusal is a line in ``notes``, never an
    exception."""
    try:
        _write(path / "tracing_on", "0")
    except OSError:
        pass
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        notes.append(f"{what} not removed: {exc.strerror or exc}")
