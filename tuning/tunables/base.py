"""The tunable model: one small class per setting, TuneD-style, with a pure ``plan``.

A tunable owns a set of *targets*. A target is one thing the kernel (or the GPU driver, or the
service manager) holds a value for, named by a stable string key:

- a file, by the path a user would type on the box itself ("/proc/sys/vm/swappiness",
  "/sys/devices/system/cpu/cpu3/cpufreq/scaling_governor") — resolved under the Host root, so a
  journal written against a tree copy names the same keys as one written on the live box. It is
  read and written only through :func:`contained` (its real path must stay below its mount;
  the only symlinks followed are sysfs's own, into ``<sysfs>/devices``) and the O_NOFOLLOW
  walk of tuning.safepath;
- a non-file target: "service:irqbalance", "nvml:gpu0:persistence_mode".

Values are normalised strings (the text a user would write with ``echo``), so that the journal,
plan and verify all compare like with like ("madvise", not "always [madvise] never").

Life cycle (see tuning/apply.py for the orchestration):

    reason = t.available(ctx)          # None when it can be tuned here, else why not
    want   = t.desired(ctx)            # {target: value} from the profile and the host's offers;
                                       # raises TuneError on a value the kernel does not offer
    have   = t.read(ctx, want)         # {target: value | None}
    plan   = t.plan(want, have)        # pure: list[Change]
    t.write(ctx, target, value)        # one write, raises OSError
    t.verify(ctx, want)                # read back -> Finding
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from collectors.host import Host
from collectors.parsers import format_cpulist
from tuning.findings import Finding, Status
from tuning.profiles import Profile
from tuning.safepath import UnsafePath, open_real, resolve_beneath


class TuneError(Exception):
    """Bad input or a value the kernel does not offer; the message is for the user.
    Raised while planning, so nothing has been written when it is seen."""


# Change kinds
WRITE = "write"                    # a runtime write apply will do
PENDING_REBOOT = "pending-reboot"  # boot arguments: printed, never applied
MANUAL = "manual"                  # config outside kernel state (irqbalance banned list)
KEEP = "keep"                      # journalled at its current value, not written: something
                                   # apply does may change it as a side effect (an IRQ
                                   # thread's affinity under a cpuset partition change), and
                                   # rollback must put it back


@dataclass(frozen=True)
class Change:
    """One planned change of one target (the output of a pure ``plan``)."""

    tunable: str
    target: str
    current: str | None
    desired: str
    kind: str = WRITE
    scope: str = ""          # "cpu" | "irq" | "gpu" | "" (global): how targets group in output
    index: int | None = None  # the CPU / IRQ / GPU number of the target, for compact ranges
    detail: str = ""         # e.g. the cpuidle state name and latency, the exact grubby command

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
# Writers: the only code that changes a file. Injected so tests can put a kernel simulation
# (bracketed selectors, read-only attributes, EIO/EPERM/EINVAL) in front of a tree copy.
# ----------------------------------------------------------------------------------------------


class Writer(Protocol):
    def write(self, path: Path, text: str) -> None: ...


class FileWriter:
    """Writes like ``echo VALUE > FILE``: one ``write(2)`` of the value and a newline.

    ``path`` is the real path :func:`contained` returned. It is opened walking every component
    from / with ``O_NOFOLLOW`` (tuning.safepath.open_real): a symlink swapped into the tree
    after the check makes the write fail instead of landing outside it. Never creates a file
    (no O_CREAT): a target that is not there is an error, not a new file in /sys. A FIFO or
    device there is refused (``O_NONBLOCK``, regular files only). One write call matters for
    sysfs, whose store() sees each write separately.
    """

    def write(self, path: Path, text: str) -> None:
        fd = open_real(path, os.O_WRONLY | os.O_TRUNC)
        try:
            data = (text + "\n").encode()
            n = os.write(fd, data)
            if n != len(data):  # sysfs takes it whole or fails; a short write is an error
                raise OSError(errno.EIO, f"short write ({n} of {len(data)} bytes)", str(path))
        finally:
            os.close(fd)


# Module-level so the CLI tests can put a kernel simulation in front of a tree copy.
default_writer: Callable[[], Writer] = FileWriter


class ServiceManager(Protocol):
    """Start/stop a system service (irqbalance). The real one runs systemctl with an argv."""

    def is_active(self, name: str) -> bool | None: ...
    def stop(self, name: str) -> None: ...
    def start(self, name: str) -> None: ...


class GpuControl(Protocol):
    """The few NVML calls tuning needs (collectors.gpu's NVML adapter satisfies it; tests use a
    fake). Getters return None when NVML says NotSupported/NoPermission; setters raise."""

    def device_count(self) -> int: ...
    def persistence_mode(self, index: int) -> bool | None: ...
    def set_persistence_mode(self, index: int, on: bool) -> None: ...
    def compute_mode(self, index: int) -> str | None: ...
    def set_compute_mode(self, index: int, mode: str) -> None: ...


@dataclass
class TuneContext:
    """Everything a tunable needs. ``cpus`` are the target (inference) CPUs, possibly []."""

    host: Host
    profile: Profile
    cpus: list[int]
    online: list[int]
    writer: Writer = field(default_factory=lambda: default_writer())
    services: ServiceManager | None = None
    gpu: GpuControl | None = None
    gpu_reason: str = "no NVML adapter"
    services_reason: str = "service control only on the live host"


# ----------------------------------------------------------------------------------------------
# The base class
# ----------------------------------------------------------------------------------------------


class Tunable:
    """Base of every tunable. Subclasses set the class attributes and implement ``desired``,
    ``read_target`` and ``write``; ``plan`` and ``verify`` are generic."""

    id: str = ""            # stable dotted id, shared with audit findings ("cpu.governor")
    family: str = ""
    title: str = ""
    key: str = ""           # the profile setting it implements
    scope: str = ""
    patterns: tuple[str, ...] = ()  # the targets it owns (allowlist patterns, tuning/allowlist.py)
    # The audit findings it fixes (fnmatch patterns: "gpu.*.persistence"); empty: the one
    # whose id is its own. `audit --fix-script` turns those findings into `--only` ids.
    audit_ids: tuple[str, ...] = ()

    # -- what subclasses provide ----------------------------------------------------------
    def available(self, ctx: TuneContext) -> str | None:
        """None when this host exposes the knob, else the reason it cannot be tuned here."""
        return None

    def wanted(self, ctx: TuneContext) -> Any:
        """The profile's expected value, or None when the profile says "any" / nothing."""
        exp = ctx.profile.expected(self.key)
        return None if exp is None or exp == "any" else exp

    def desired(self, ctx: TuneContext) -> dict[str, str]:
        raise NotImplementedError

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        raise NotImplementedError

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        raise NotImplementedError

    def index_of(self, target: str) -> int | None:
        return None

    def owns(self, target: str) -> bool:
        """Whether ``target`` is one of this tunable's targets (a journal entry naming another
        tunable's target is refused as a whole)."""
        return any(target_matches(p, target) for p in self.patterns)

    def gone(self, ctx: TuneContext, target: str) -> bool:
        """Whether ``target`` no longer exists at all — a task that exited since apply
        (tuning/tunables/isolate.py): nothing to restore, and not an error. A target that is
        there but unreadable is not gone. No, unless a subclass says."""
        return False

    def valid(self, value: str) -> bool:
        """Whether ``value`` is something this tunable could write back (a journal's original
        is checked with it before rollback writes anything). Nothing, unless a subclass says."""
        return False

    def detail(self, ctx: TuneContext, target: str) -> str:
        return ""

    # -- generic ------------------------------------------------------------------------------
    def read(self, ctx: TuneContext, targets) -> dict[str, str | None]:
        return {t: self.read_target(ctx, t) for t in targets}

    def plan(self, desired: dict[str, str], current: dict[str, str | None]) -> list[Change]:
        """Pure: one Change per target whose current value differs from the desired one."""
        return [Change(self.id, t, current.get(t), v, WRITE, self.scope, self.index_of(t))
                for t, v in desired.items() if current.get(t) != v]

    def unchangeable(self, exc: OSError) -> bool:
        """Whether a write error means "the kernel will not let this target change" (reported,
        not a failure). Only IRQ affinity says yes (EIO/EPERM on managed or per-CPU IRQs)."""
        return False

    def verify(self, ctx: TuneContext, desired: dict[str, str]) -> Finding:
        """Read every target back and compare with what the profile asked for."""
        setting = ctx.profile.get(self.key)
        current = self.read(ctx, desired)
        bad = {t: v for t, v in current.items() if v != desired[t]}
        status = Status.OK if not bad else (setting.severity if setting else Status.WARN)
        return Finding(
            id=self.id, family=self.family, title=self.title, status=status,
            current=render_values(self, current), expected=render_values(self, desired),
            evidence=", ".join(sorted(bad)[:3]) or (next(iter(desired), "")),
            fix="" if not bad else "hftagent tune apply",
            why=setting.why if setting else "",
            data={"mismatched": sorted(bad)})


class FileTunable(Tunable):
    """A tunable whose targets are files under procfs/sysfs."""

    def read_target(self, ctx: TuneContext, target: str) -> str | None:
        """The normalised value; None when unreadable or malformed (a selector without a
        [selected] word, a mask that does not parse) or when its path is refused (see
        :func:`contained`): unreadable, never a value."""
        try:
            text = read_value(contained(ctx.host, target))
        except OSError:
            return None
        if text is None:
            return None
        try:
            return self.normalise(text)
        except ValueError:
            return None

    def normalise(self, text: str) -> str:
        return " ".join(text.split())

    def write(self, ctx: TuneContext, target: str, value: str) -> None:
        ctx.writer.write(contained(ctx.host, target), value)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def resolve(host: Host, target: str) -> Path:
    """The user-facing path of a file target ("/proc/sys/vm/swappiness") to the Host's path,
    lexically (for reads of neighbouring files; writes go through :func:`contained`)."""
    for prefix, under in (("/proc/", host.proc), ("/sys/", host.sys)):
        if target.startswith(prefix):
            rel = target[len(prefix):]
            if ".." in Path(rel).parts:
                raise TuneError(f"refusing path with '..': {target}")
            return under(rel)
    raise TuneError(f"not a /proc or /sys target: {target}")


MAX_VALUE_BYTES = 1 << 20  # a sysfs value fits a page; /proc/irq/N lists a few KB at most


def read_value(path: Path) -> str | None:
    """The text of a target file at the real path :func:`contained` returned, read the way a
    write reaches it (every component walked with O_NOFOLLOW, a regular file only, never
    blocking on a FIFO), stripped of its trailing newline; None when it cannot be read or is
    larger than any kernel value."""
    try:
        fd = open_real(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks, got = [], 0
        while True:  # a seq_file hands out a page per read: read to the end
            b = os.read(fd, 65536)
            if not b:
                break
            got += len(b)
            if got > MAX_VALUE_BYTES:
                return None
            chunks.append(b)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace").rstrip("\n")


def is_file_target(target: str) -> bool:
    return target.startswith(("/proc/", "/sys/"))


def _mount_base(host: Host, mount: Path, name: str) -> Path:
    """The real path of a mount. One derived from the root (``ROOT/proc``, no ``--procfs``)
    must stay inside the root: ``ROOT/sys`` -> /sys would make a tree copy write the live
    kernel."""
    return _real_mount(str(mount), str(host.root), mount == host.root / name)


@functools.lru_cache(maxsize=64)
def _real_mount(mount: str, root: str, derived: bool) -> Path:
    # Cached per process: a mount swapped for a symlink later still cannot be written
    # through, because every write walks the real path with O_NOFOLLOW (FileWriter).
    real = Path(os.path.realpath(mount))
    if derived:
        rroot = Path(os.path.realpath(root))
        if not real.is_relative_to(rroot):
            raise UnsafePath(f"{mount} is a symlink to {real}, outside the root {root}: "
                             "refused", mount)
    return real


def contained(host: Host, target: str) -> Path:
    """The real path of a file target, checked so that no write can leave its mount.

    The path is resolved below the real path of its mount (``host.procfs`` / ``host.sysfs``)
    component by component. The only symlinks followed are the kind sysfs itself makes: ones
    under sysfs that resolve to a directory under ``<sysfs>/devices`` (cpuN/cpufreq ->
    ../cpufreq/policyN, /sys/class/... -> /sys/devices/...) — on the live host and in a tree
    copy or capture alike, where those links are relative and stay inside the tree. procfs
    targets follow none. The file itself must be a regular file, never a symlink.

    Raises UnsafePath (an OSError) when refused, FileNotFoundError and the like when the
    file is not there, TuneError for a key that is not a /proc or /sys path."""
    if target.startswith("/proc/"):
        prefix, mount, name = "/proc/", host.procfs, "proc"
    elif target.startswith("/sys/"):
        prefix, mount, name = "/sys/", host.sysfs, "sys"
    else:
        raise TuneError(f"not a /proc or /sys target: {target}")
    if "\x00" in target:
        raise UnsafePath(f"refusing a path with a NUL byte: {target!r}")
    base = _mount_base(host, mount, name)
    devices = base / "devices"

    def allow(link: Path, dest: Path) -> str | None:
        if name != "sys":
            return "procfs targets never go through a symlink"
        if not dest.is_relative_to(devices) or dest == devices:
            return (f"only symlinks to directories under {devices} (the ones sysfs makes) "
                    "are followed")
        return None

    return resolve_beneath(base, target[len(prefix):].split("/"), allow)


_NUMBER = r"(?:0|[1-9][0-9]*)"  # ASCII digits, no sign, no leading zero


@functools.lru_cache(maxsize=256)
def _pattern_re(pattern: str) -> re.Pattern[str]:
    """An allowlist-style pattern as a regex: ``[0-9]*`` is one decimal number (ASCII digits
    only: "irq/1x", "cpu٣" and a NUL after the digits never match); everything else is
    literal."""
    return re.compile(_NUMBER.join(re.escape(p) for p in pattern.split("[0-9]*")))


def target_matches(pattern: str, target: str) -> bool:
    """A target against one allowlist-style pattern (paths such as
    "/proc/irq/[0-9]*/smp_affinity_list", keys such as "nvml:gpu[0-9]*:compute_mode"): the
    whole target must match, ``[0-9]*`` standing for one decimal number."""
    return _pattern_re(pattern).fullmatch(target) is not None


def int_in(value: str, lo: int, hi: int | None) -> bool:
    """Whether ``value`` is the text of an integer in lo..hi (hi None: no upper bound)."""
    try:
        v = int(value)
    except ValueError:
        return False
    return lo <= v and (hi is None or v <= hi)


def is_word(value: str) -> bool:
    """A kernel keyword ("performance", "balance_power", "defer+madvise")."""
    return re.fullmatch(r"[a-z][a-z0-9_+-]*", value) is not None


def render_values(tunable: Tunable, values: dict[str, str | None]) -> str:
    """Compact rendering of per-target values: "cpu 0-7=performance; cpu 8-15=powersave"."""
    if not values:
        return ""
    groups: dict[str, list[int]] = {}
    loose: dict[str, str | None] = {}
    for t, v in values.items():
        idx = tunable.index_of(t)
        if idx is None:
            loose[t] = v
        else:
            groups.setdefault("unreadable" if v is None else v, []).append(idx)
    parts = [f"{tunable.scope} {format_cpulist(ids)}={v}"
             for v, ids in sorted(groups.items(), key=lambda kv: min(kv[1]))]
    if len(loose) == 1 and not parts:
        v = next(iter(loose.values()))
        return "unreadable" if v is None else v
    parts += [f"{t}={'unreadable' if v is None else v}" for t, v in loose.items()]
    return "; ".join(parts)


def cpu_target_index(target: str) -> int | None:
    """CPU number of a "/sys/devices/system/cpu/cpuN/..." target."""
    parts = target.split("/")
    if len(parts) > 5 and parts[5].startswith("cpu") and parts[5][3:].isdigit():
        return int(parts[5][3:])
    return None
