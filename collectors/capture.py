"""Capture the /proc and /sys files the agent reads into a directory tree.

``hftagent capture --out DIR`` copies them so the same box can be audited later with
``hftagent audit --root DIR`` (bug reports, golden tests, comparing boxes). The capture is laid
out as the live tree is, symlinks included, so that a capture audits as the box does:

- Only readable regular files are copied, each whole or not at all: a file over the Host's
  read bound for it (:meth:`collectors.host.Host.limit_for`: 64 MiB for /proc/interrupts,
  cpuinfo, stat, softirqs, which grow with CPUs times IRQs; 4 MiB for the rest) is skipped
  and listed, never cut short. Write-only and unreadable files are skipped and listed in
  CAPTURE-SKIPPED too.
- A symlink is never followed out of the tree it lives in (procfs, sysfs, the root's /etc):
  such a link is skipped and listed. A directory link that stays inside is kept as a
  symlink with the same relative target when that target is captured too: current kernels
  make ``cpuN/cpufreq`` a link to ``../cpufreq/policyN``, and ``cpuN/nodeK`` to the node.
  Links into trees that are not captured (a node's ``memoryN`` blocks, ``subsystem``,
  ``driver``) are left out. A file link that stays inside is copied as a regular file.
- ``/sys/bus/pci/devices/<addr>`` are links into ``/sys/devices/pci<dom>:<bus>/...``, where a
  device behind a bridge (almost every GPU and NIC) is a directory inside its bridge's. Each
  device's attributes are copied to its own place there (attributes of the PCI_ATTRS list
  only: config space and resources are big and binary) and the link kept, so every device
  stays listed whatever its parents. A flat tree (a directory per address, as older
  captures have) is copied flat.
- Process entries keep only ``comm`` and ``status`` (no environment, no command lines:
  nothing secret leaves the box).
- From the root's /etc: tuned's active profile and irqbalance's environment files; of the
  systemd units audit looks for (``multi-user.target.wants/*.service``, links into
  /lib/systemd), a small file naming the link's target stands in for each enabled unit.

Everything is written below a descriptor of the capture directory (:class:`_Out`), each
component opened with ``O_NOFOLLOW``: a capture run as root into a directory whose path
another user can change (a home that sudo kept, a shared results directory) writes nothing
outside it, and never through a link, the capture's own links included (made last).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from collectors.host import ERROR, Host, read_bounded, too_large

MEMORY_BLOCK = re.compile(r"memory\d+")
PCI_ADDR = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")

# (relative path under procfs, recurse depth); depth 0 = the file itself.
PROC_ITEMS = [
    ("cmdline", 0), ("stat", 0), ("interrupts", 0), ("softirqs", 0), ("swaps", 0),
    ("meminfo", 0), ("vmstat", 0), ("cpuinfo", 0), ("version", 0), ("loadavg", 0),
    ("pressure", 1), ("sys/kernel", 1), ("sys/vm", 1), ("sys/kernel/random/boot_id", 0),
    ("irq", 2), ("driver/nvidia/version", 0), ("driver/nvidia/gpus", 2),
    ("bus/pci/devices", 0),  # virt.py reads the PCI IDs here where sysfs shows no bus
]
SYS_ITEMS = [
    ("devices/system/cpu", 4), ("devices/system/node", 2), ("devices/system/clocksource", 2),
    ("kernel/mm/transparent_hugepage", 1), ("kernel/mm/ksm", 1), ("hypervisor", 1),
    ("class/dmi/id", 1), ("module/haltpoll/parameters", 0),
]
# /sys/bus/pci/devices/*: only these attributes (config space and resources are big and binary)
PCI_ATTRS = {"class", "vendor", "device", "subsystem_vendor", "subsystem_device",
             "current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
             "numa_node", "local_cpulist", "aer_dev_correctable", "aer_dev_nonfatal",
             "aer_dev_fatal", "enable", "irq", "secondary_bus_number",
             "subordinate_bus_number"}
# Never entered: links into other subsystems, write-only triggers, binary blobs.
SKIP_NAMES = {"uevent", "modalias", "subsystem", "driver", "firmware_node", "of_node",
              "config", "resource", "rom", "remove", "rescan", "reset", "iommu", "iommu_group",
              "msi_bus", "msi_irqs", "consumer", "supplier", "hotplug", "cpuidle_driver"}
# A device's power/ directory is runtime PM (autosuspend_delay_ms reads EIO on most devices):
# only these are taken from it (cpuN/power/energy_perf_bias is the EPB audit reads).
POWER_ATTRS = {"energy_perf_bias", "pm_qos_resume_latency_us"}
ETC_FILES = ("tuned/active_profile", "default/irqbalance", "sysconfig/irqbalance")
SYSTEMD_WANTS = "systemd/system/multi-user.target.wants"
SYSTEMD_UNITS = ("cpupower.service", "tuned.service", "irqbalance.service")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Out:
    """The capture directory, written through its descriptor only: directories below it are
    created (0755) and opened one component at a time with ``O_NOFOLLOW`` (descriptors kept
    per directory), files written ``O_NOFOLLOW``. Paths are given as the capture names them
    (under ``base``). At most MAX_OPEN directories are kept open (a 128-CPU sysfs has
    thousands): the walk is depth-first, so the ones in use are found again at once."""

    MAX_OPEN = 64

    def __init__(self, base: Path, dfd: int) -> None:
        self.base = base
        self.dirs: dict[tuple[str, ...], int] = {(): dfd}

    def _rel(self, path: Path) -> tuple[str, ...]:
        return path.relative_to(self.base).parts

    def _dir(self, parts: tuple[str, ...], create: bool) -> int | None:
        fd = self.dirs.get(parts)
        if fd is not None:
            return fd
        parent = self._dir(parts[:-1], create)
        if parent is None:
            return None
        name = parts[-1]
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and not create:
                return None  # a link (made by the capture) or a file: not a directory here
            raise
        if len(self.dirs) > self.MAX_OPEN:
            self.close()
        self.dirs[parts] = fd
        return fd

    def mkdirs(self, path: Path) -> None:
        self._dir(self._rel(path), True)

    def write(self, path: Path, data: bytes) -> None:
        parts = self._rel(path)
        dfd = self._dir(parts[:-1], True)
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def lexists(self, path: Path) -> bool:
        """Whether ``path`` is there, reached through directories (no link) only."""
        parts = self._rel(path)
        if not parts:
            return True
        dfd = self._dir(parts[:-1], False)
        if dfd is None:
            return False
        try:
            os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def symlink(self, text: str, path: Path) -> None:
        parts = self._rel(path)
        os.symlink(text, parts[-1], dir_fd=self._dir(parts[:-1], True))

    def close(self) -> None:
        for parts, fd in self.dirs.items():
            if parts:  # the top one is the caller's
                os.close(fd)
        self.dirs = {(): self.dirs[()]}


def write_new(dfd: int, name: str, data: bytes) -> None:
    """Write ``data`` as the new file ``name`` of directory ``dfd`` (``O_EXCL|O_NOFOLLOW``,
    mode 0644)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=dfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _inside(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


@dataclass
class _Tree:
    """One source tree (procfs, sysfs, /etc) and where it goes in the capture."""

    src: Path  # as the Host names it (may itself be reached through a link)
    real: str  # its resolved path: links may not leave it
    dst: Path
    shown: str  # how evidence names it: "/proc", "/sys", "/etc"


@dataclass
class CaptureResult:
    files: int = 0
    skipped: list[str] = field(default_factory=list)


class _Capturer:
    def __init__(self, host: Host, out: Path, sink: _Out) -> None:
        self.host = host
        self.out = out
        self.sink = sink
        self.result = CaptureResult()
        # (link path in the capture, its target there, the link's text); made at the end,
        # once it is known whether the target was captured
        self.links: list[tuple[Path, Path, str]] = []
        self.proc = self._tree(host.procfs, out / "proc", "/proc")
        self.sys = self._tree(host.sysfs, out / "sys", "/sys")
        self.etc = self._tree(host.etc(), out / "etc", "/etc")
        # real paths of the sysfs areas this capture walks: a directory link into one of them
        # is kept (its target is captured by that area's walk)
        self.areas: list[str] = []

    @staticmethod
    def _tree(src: Path, dst: Path, shown: str) -> _Tree:
        return _Tree(src, os.path.realpath(src), dst, shown)

    def skip(self, tree: _Tree, path: Path, why: str) -> None:
        self.result.skipped.append(f"{self.show(tree, path)} ({why})")

    def show(self, tree: _Tree, path: Path) -> str:
        """The path as it reads on the box (``/sys/...``), for CAPTURE-SKIPPED."""
        for base in (str(tree.src), tree.real):
            if _inside(str(path), base):
                rel = os.path.relpath(path, base)
                return f"{tree.shown}/{rel}" if rel != "." else tree.shown
        return str(path)

    def dst_of(self, tree: _Tree, real: str) -> Path:
        """Where a resolved source path (inside ``tree``) goes in the capture."""
        rel = os.path.relpath(real, tree.real)
        return tree.dst if rel == "." else tree.dst / rel

    # -- files -------------------------------------------------------------------------------
    def copy_file(self, tree: _Tree, src: Path, dst: Path, gone_ok: bool = False) -> None:
        """Copy one regular file; ``gone_ok``: a file that vanished meanwhile (a process
        that exited) is not worth a CAPTURE-SKIPPED line."""
        try:
            # the whole path resolved, not just its last part: /proc/<pid> in a tree may be
            # a link too
            real = os.path.realpath(src)
            if not _inside(real, tree.real):
                link = os.readlink(src) if src.is_symlink() else real
                self.skip(tree, src, f"symlink out of the tree: -> {link}")
                return
            st = os.stat(real)
            if not stat.S_ISREG(st.st_mode):
                return
            if not st.st_mode & 0o444:  # write-only triggers (drop_caches, compact): never opened
                self.skip(tree, src, "not readable")
                return
            limit = self.host.limit_for(src)
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return  # swapped since the stat
                # a sparse 2 GiB file is refused before a byte is read; a /proc file says 0
                data = None if st.st_size > limit else read_bounded(fd, limit, st.st_size)
            finally:
                os.close(fd)
        except OSError as exc:
            if not (gone_ok and exc.errno in (errno.ENOENT, errno.ESRCH)):
                self.skip(tree, src, "not readable" if exc.errno == errno.EACCES
                          else exc.strerror or str(exc))
            return
        if data is None:  # whole or not at all: an audit of a cut file would be wrong
            why = too_large(st.st_size if st.st_size > limit else None, limit)
            self.skip(tree, src, why.removeprefix(f"{ERROR}: ") + ", not captured")
            return
        self.sink.write(dst, data)
        self.result.files += 1

    # -- directories -------------------------------------------------------------------------
    def item(self, tree: _Tree, rel: str, depth: int) -> None:
        """One PROC_ITEMS/SYS_ITEMS entry: itself a file, a directory, or a link to either."""
        src = tree.src / rel
        if not os.path.lexists(src):
            return
        real = os.path.realpath(src)
        if not _inside(real, tree.real):
            self.skip(tree, src, "symlink out of the tree")
            return
        dst = self.dst_of(tree, real)
        if os.path.isdir(real):
            self.walk(tree, Path(real), dst, depth)
            lexical = tree.dst / rel
            if lexical != dst:  # reached through a link (/sys/class/dmi/id): keep the link
                self.links.append((lexical, dst, os.path.relpath(dst, lexical.parent)))
        else:
            self.copy_file(tree, src, tree.dst / rel)

    def walk(self, tree: _Tree, src: Path, dst: Path, depth: int,
             only: set[str] | None = None) -> None:
        """Copy the directory ``src`` (a real directory, not a link) to ``dst``; ``only``:
        just the files of these names."""
        try:
            names = sorted(os.listdir(src))
        except OSError as exc:
            self.skip(tree, src, exc.strerror or str(exc))
            return
        self.sink.mkdirs(dst)
        for n in names:
            if n in SKIP_NAMES:
                continue
            child = src / n
            try:
                st = child.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                self.dir_link(tree, child, dst / n, depth)
            elif stat.S_ISDIR(st.st_mode):
                if depth > 0 and not MEMORY_BLOCK.fullmatch(n):
                    self.walk(tree, child, dst / n, depth - 1,
                              POWER_ATTRS if n == "power" else None)
            elif stat.S_ISREG(st.st_mode) and (only is None or n in only):
                self.copy_file(tree, child, dst / n)

    def dir_link(self, tree: _Tree, link: Path, dst: Path, depth: int) -> None:
        real = os.path.realpath(link)
        if not _inside(real, tree.real):
            self.skip(tree, link, f"symlink out of the tree: -> {os.readlink(link)}")
            return
        if not os.path.isdir(real):
            if os.path.isfile(real):
                self.copy_file(tree, link, dst)
            return
        if depth <= 0 or not any(_inside(real, a) for a in self.areas):
            return  # a link into a tree this capture does not take (memory blocks, bus/cpu)
        target = self.dst_of(tree, real)
        self.links.append((dst, target, os.path.relpath(target, dst.parent)))

    def pci(self) -> None:
        """/sys/bus/pci/devices: every device at its own place, links kept (module doc)."""
        tree = self.sys
        base = tree.src / "bus/pci/devices"
        try:
            names = sorted(os.listdir(base))
        except OSError as exc:
            if os.path.lexists(base):
                self.skip(tree, base, exc.strerror or str(exc))
            return
        out_base = tree.dst / "bus/pci/devices"
        self.sink.mkdirs(out_base)
        for n in names:
            entry = base / n
            real = os.path.realpath(entry)
            if not _inside(real, tree.real):
                self.skip(tree, entry, "symlink out of the tree")
                continue
            if not os.path.isdir(real):
                continue
            dst = self.dst_of(tree, real) if entry.is_symlink() else out_base / n
            self.attrs(tree, Path(real), dst)
            if entry.is_symlink():
                self.links.append((out_base / n, dst, os.path.relpath(dst, out_base)))

    def attrs(self, tree: _Tree, src: Path, dst: Path) -> None:
        """The PCI_ATTRS files of one device directory (its child devices are not entered:
        each is captured through its own bus/pci/devices entry)."""
        self.sink.mkdirs(dst)
        for a in sorted(PCI_ATTRS):
            p = src / a
            if os.path.lexists(p):
                self.copy_file(tree, p, dst / a)

    def make_links(self) -> None:
        for link, target, text in self.links:
            if self.sink.lexists(link) or not self.sink.lexists(target):
                continue  # already there, or the target was not captured (depth, skipped)
            self.sink.symlink(text, link)

    # -- the rest ----------------------------------------------------------------------------
    def processes(self) -> None:
        for pid in self.host.pids():
            for name in ("comm", "status"):
                src = self.host.proc(pid, name)
                if os.path.lexists(src):
                    self.copy_file(self.proc, src, self.proc.dst / str(pid) / name, gone_ok=True)

    def etc_files(self) -> None:
        for rel in ETC_FILES:
            src = self.etc.src / rel
            if os.path.lexists(src):
                self.copy_file(self.etc, src, self.etc.dst / rel)
        for unit in SYSTEMD_UNITS:
            src = self.etc.src / SYSTEMD_WANTS / unit
            if os.path.lexists(src) and os.path.exists(src):
                # the unit file itself lives outside /etc: record that it is enabled
                text = os.readlink(src) if src.is_symlink() else "regular file"
                dst = self.etc.dst / SYSTEMD_WANTS / unit
                self.sink.write(dst, f"enabled (link to {text})\n".encode())
                self.result.files += 1


def capture_result(host: Host, out: Path, dir_fd: int | None = None) -> CaptureResult:
    """Copy the host's relevant files under ``out/proc``, ``out/sys`` and ``out/etc``; write
    ``out/CAPTURE-SKIPPED``. ``out`` must be a new, empty directory; ``dir_fd``: a descriptor
    of it (``hftagent capture`` creates it exclusively), else it is opened here with
    ``O_NOFOLLOW``. Everything is written below that descriptor (:class:`_Out`)."""
    dfd = os.open(out, _DIR_FLAGS) if dir_fd is None else dir_fd
    sink = _Out(out, dfd)
    try:
        c = _Capturer(host, out, sink)
        for rel, _depth in SYS_ITEMS:
            real = os.path.realpath(c.sys.src / rel)
            if _inside(real, c.sys.real):
                c.areas.append(real)
        for rel, depth in PROC_ITEMS:
            c.item(c.proc, rel, depth)
        for rel, depth in SYS_ITEMS:
            c.item(c.sys, rel, depth)
        c.pci()
        c.processes()
        c.etc_files()
        c.make_links()  # last: nothing is written through a link the capture made
        skipped = c.result.skipped
        sink.write(out / "CAPTURE-SKIPPED",
                   ("\n".join(skipped) + ("\n" if skipped else "")).encode())
    finally:
        sink.close()
        if dir_fd is None:
            os.close(dfd)
    return c.result


def capture(host: Host, out: Path) -> list[str]:
    """:func:`capture_result`; returns the skipped entries (as listed in CAPTURE-SKIPPED)."""
    return capture_result(host, out).skipped
