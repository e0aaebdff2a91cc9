"""What can be attached in a running process: its inference runtime, the library, the one
function that runs once per inference call, its file offset and first instruction.

The catalogue (:data:`RUNTIMES`) holds, per runtime, the library it lives in and the function
that fires exactly once per inference call (measured: shared/notes/attach.md):

==========  =====================================  =========================================
runtime     library (basename)                     function
==========  =====================================  =========================================
litert      libpywrap_litert_common.so             tflite::interpreter_wrapper::
            (ai_edge_litert, Python)               InterpreterWrapper::Invoke(int) (.symtab);
                                                   LiteRtRunCompiledModel (CompiledModel API)
litert-c    libLiteRt.so                           LiteRtRunCompiledModel
tflite-c    libtensorflowlite_c.so                 TfLiteInterpreterInvoke
tf-c        libtensorflow.so.2, libtensorflow_cc   TF_SessionRun
tf-python   lib_pywrap_tensorflow_common.so        TFE_Py_ExecuteCancelable (one per
                                                   tf.function / signature call)
tf-session  libtensorflow_cc, tensorflow_model_    tensorflow::DirectSession::Run (the
            server                                 ThreadPoolOptions overload every Run
                                                   reaches: a C++ TF server's session run)
==========  =====================================  =========================================

A process may map several of these (every TF2 Python process maps ``libtensorflow_cc.so.2``,
whose ``TF_SessionRun`` it never calls): with ``auto`` the plan holds every runtime the process
maps (:attr:`Plan.runtimes`, the candidates), and watch arms them all and keeps the one whose
calls arrive, the outermost per call (agent/watch/latency/attached.py, agent/trace/trial.py).

Every function there returns a status (or NULL on a Python error) rather than throwing: a
C++ exception that unwinds through a frame with a uretprobe aborts the process (the return
trampoline is not an unwindable frame: ``terminate called after throwing``, measured), so
return probes are placed only on these. ``--attach-symbol LIB:SYMBOL`` (any other function)
gets entry-only timing unless ``--unsafe-return`` says the caller knows it cannot throw.

Pinning (issue #34): each library is opened once, through ``/proc/PID/map_files/START-END``
of its executable mapping (the very file the process mapped, also inside a container), else
through ``/proc/PID/root`` one component at a time without following a link; only a regular
file is kept (:class:`Pinned`). Its symbols are read through that descriptor, and the uprobe is
defined on ``/proc/self/fd/N`` of it: the kernel's ``kern_path`` follows that link to the very
open file, so a target that re-maps its address range to another file after the read cannot
move the probe there. After the definition the target's mapping is checked again
(:meth:`Pinned.moved`); any change removes the events. A library that someone other than root
and the target's owner may write is refused unless the caller says otherwise
(``--attach-unsafe-library``). uprobes are per inode: every process that maps the same file
pays the trap on each call (the event filter limits what is recorded, not who traps).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from agent.trace import elf
from collectors.host import Host


@dataclass(frozen=True)
class Runtime:
    name: str
    library: re.Pattern          # matched against the mapped file's basename
    symbols: tuple[str, ...]     # mangled names; a trailing * is a prefix (elf._find)
    shown: str                   # the function as a person reads it


RUNTIMES: tuple[Runtime, ...] = (
    Runtime("litert", re.compile(r"^libpywrap_litert_common\.so$"),
            ("_ZN6tflite19interpreter_wrapper18InterpreterWrapper6InvokeEi",
             "LiteRtRunCompiledModel"),
            "tflite::interpreter_wrapper::InterpreterWrapper::Invoke(int) / "
            "LiteRtRunCompiledModel"),
    Runtime("litert-c", re.compile(r"^libLiteRt\.so$"), ("LiteRtRunCompiledModel",),
            "LiteRtRunCompiledModel"),
    Runtime("tflite-c", re.compile(r"^libtensorflowlite_c\.so"), ("TfLiteInterpreterInvoke",),
            "TfLiteInterpreterInvoke"),
    Runtime("tf-c", re.compile(r"^libtensorflow(_cc)?\.so(\.\d+)*$"), ("TF_SessionRun",),
            "TF_SessionRun"),
    Runtime("tf-python", re.compile(r"^lib_pywrap_tensorflow_common\.so$|"
                                    r"^_pywrap_tensorflow_internal\.so$"),
            ("_Z24TFE_Py_ExecuteCancelableP11TFE_Context*",),
            "TFE_Py_ExecuteCancelable (one per tf.function call)"),
    # Run(options, inputs, outputs, targets, tensors, metadata, ThreadPoolOptions): the other
    # overloads call it (direct_session.cc), so one probe sees every session run; TF 2.21's
    # mangled name ends in ...RunMetadataERKN3tsl6thread17ThreadPoolOptionsE (older TF:
    # tensorflow::thread), hence the prefix. TF_SessionRun calls it: nested, not outermost.
    Runtime("tf-session", re.compile(r"^libtensorflow(_cc)?\.so(\.\d+)*$|"
                                     r"^tensorflow_model_server$"),
            ("_ZN10tensorflow13DirectSession3RunERKNS_10RunOptionsERKSt6vectorISt4pairI"
             "NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEENS_6TensorEESaISD_EERKS4_I"
             "SB_SaISB_EESL_PS4_ISC_SaISC_EEPNS_11RunMetadataERK*",),
            "tensorflow::DirectSession::Run (a C++ TF server's session run)"),
)
NAMES = ("auto",) + tuple(r.name for r in RUNTIMES)

# What a uprobe costs per call (x86-64, shared/notes/attach.md): entry + return on an
# emulated first instruction; the per-instruction figures are in elf.describe_entry.
COST_US = 1.8


class AttachError(Exception):
    """The process cannot be attached, and why (one line for the user)."""


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    path: str
    inode: int
    dev: str = ""        # major:minor as /proc/PID/maps shows it (hex)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class Owner:
    """Who the target runs as (/proc/PID/status ``Uid:``, ``Gid:``, ``Groups:``)."""
    uids: frozenset[int]      # real and effective
    gids: frozenset[int]      # real and effective
    groups: frozenset[int]    # supplementary

    def may_read(self, st: os.stat_result) -> bool:
        """Whether the owner may read a file of this mode and owner (DAC bits; root may)."""
        if 0 in self.uids:
            return True
        if st.st_uid in self.uids:
            return bool(st.st_mode & stat.S_IRUSR)
        if st.st_gid in self.gids | self.groups:
            return bool(st.st_mode & stat.S_IRGRP)
        return bool(st.st_mode & stat.S_IROTH)


def owner_of(host: Host, pid: int) -> Owner:
    """The target's :class:`Owner`; :class:`AttachError` when the process is gone."""
    r = host.read(host.proc(pid, "status"))
    if r.value is None:
        raise AttachError(f"pid {pid}: no such process (or not in this PID namespace)")
    ids: dict[str, list[int]] = {}
    for line in r.value.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            ids[key] = [int(x) for x in rest.split() if x.isdigit()]
    if len(ids.get("Uid", [])) < 2 or len(ids.get("Gid", [])) < 2:
        raise AttachError(f"pid {pid}: cannot read its owner from "
                          f"{host.display(host.proc(pid, 'status'))}")
    return Owner(frozenset(ids["Uid"][:2]), frozenset(ids["Gid"][:2]),
                 frozenset(ids.get("Groups", [])))


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a link"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _not_regular(st: os.stat_result) -> str | None:
    if stat.S_ISREG(st.st_mode):
        return None
    return next((what for test, what in _KINDS if test(st.st_mode)), "not a regular file")


def _writers(st: os.stat_result, owner: Owner) -> str | None:
    """Who other than root and the target's owner may write the file, or None."""
    if st.st_uid not in owner.uids | {0}:
        return f"owned by uid {st.st_uid} (neither root nor the process's owner)"
    if st.st_mode & stat.S_IWOTH:
        return "writable by every user"
    if st.st_mode & stat.S_IWGRP and st.st_gid not in owner.gids | {0}:
        return f"writable by group {st.st_gid}"
    return None


class Pinned:
    """One library opened once, kept open for the attach's life: its symbols are read
    through :attr:`fd`, its uprobes defined on :attr:`probe_path` (``/proc/self/fd/N``: the
    kernel follows that link to this very open file). The :class:`~agent.trace.uprobe.Uprobes`
    that defines them closes it (:meth:`close`, also when the object is collected)."""

    def __init__(self, host: Host, pid: int, m: Mapping, fd: int, via: str,
                 through_root: bool) -> None:
        self.host, self.pid, self.mapping, self.fd, self.via = host, pid, m, fd, via
        self.through_root = through_root      # not map_files: a path the target can re-point
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino

    @property
    def probe_path(self) -> str:
        return str(self.host.proc("self", "fd", self.fd))

    @property
    def map_files(self) -> Path:
        m = self.mapping
        return self.host.proc(self.pid, "map_files", f"{m.start:x}-{m.end:x}")

    def moved(self) -> str | None:
        """None while the target still maps this file at the range it was read from, else
        one line saying what changed (the caller removes what it defined and refuses). Two
        witnesses: the maps line at that range still names the path and inode first read
        (a swap before our open shows there), and map_files there is still our file's
        device and inode (a swap and a swap back); without map_files (no CAP_SYS_ADMIN)
        the maps line's inode is compared with ours."""
        m = self.mapping
        what = f"pid {self.pid} no longer maps {m.name} at {m.start:x}-{m.end:x} as read"
        now = _mapped_at(self.host, self.pid, m)
        if now is None:
            return f"{what} (nothing is mapped there now): refused, nothing attached"
        try:
            st = os.stat(self.map_files)
            ours = (st.st_dev, st.st_ino) == (self.dev, self.ino)
        except OSError:
            ours = now[0] == self.ino
        if now != (m.inode, m.path) or not ours:
            return (f"{what} (now inode {now[0]} {now[1]}; read inode {self.ino}): the mapping "
                    "changed after its symbols were read; refused, nothing attached")
        return None

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # pragma: no cover - best effort, plan() closes what it drops
        try:
            self.close()
        except OSError:
            pass


def _mapped_at(host: Host, pid: int, m: Mapping) -> tuple[int, str] | None:
    """(inode, path) of what /proc/PID/maps shows at ``m``'s exact range now (None:
    nothing there, or the process is gone)."""
    r = host.read(host.proc(pid, "maps"))
    want = f"{m.start:x}-{m.end:x}"
    for line in (r.value or "").splitlines():
        f = line.split(None, 5)
        if len(f) >= 5 and f[0] == want and f[4].isdigit():
            return int(f[4]), f[5] if len(f) == 6 else ""
    return None


_PATH = os.O_PATH | os.O_CLOEXEC


def _reopen(host: Host, opath: int) -> int:
    """A readable descriptor of the regular file ``opath`` (an O_PATH descriptor) names:
    reopened through /proc/self/fd, so nothing else is opened and no device's open() runs.
    Raises ValueError naming what the file is when it is not a regular file."""
    kind = _not_regular(os.fstat(opath))
    if kind:
        raise ValueError(kind)
    return os.open(host.proc("self", "fd", opath),
                   os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)


def _open_map_file(host: Host, pid: int, m: Mapping) -> int:
    """The mapped file through /proc/PID/map_files (needs CAP_SYS_ADMIN: OSError without)."""
    opath = os.open(host.proc(pid, "map_files", f"{m.start:x}-{m.end:x}"), _PATH)
    try:
        return _reopen(host, opath)
    finally:
        os.close(opath)


def _open_in_root(host: Host, pid: int, m: Mapping) -> int:
    """``m.path`` under the target's root, one component at a time from a descriptor of
    /proc/PID/root, following no link (O_NOFOLLOW on every component) and opening nothing
    but the final regular file. OSError or ValueError (what the file is) when refused."""
    parts = m.path.split("/")[1:]
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise ValueError("not a plain absolute path")
    fd = os.open(host.proc(pid, "root"), _PATH | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        last = os.open(parts[-1], _PATH | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = last
        return _reopen(host, fd)
    finally:
        os.close(fd)


def _why(exc: Exception) -> str:
    return (exc.strerror or str(exc)).lower() if isinstance(exc, OSError) else str(exc)


def pin(host: Host, pid: int, m: Mapping, owner: Owner, unsafe_library: bool = False
        ) -> Pinned:
    """Open the library of mapping ``m`` once (:class:`Pinned`): through map_files, else
    through the target's root (then only the inode the process maps, and only a file its
    owner may read). :class:`AttachError` (one line) for anything else, and for a library
    someone other than root and the owner may write, or on a FUSE filesystem (asked before
    any open), unless ``unsafe_library``."""
    mf = host.display(host.proc(pid, "map_files", f"{m.start:x}-{m.end:x}"))
    fuse = _fuse(host, pid, m)
    if fuse and not unsafe_library:
        raise AttachError(f"pid {pid}: {m.path} is on a FUSE filesystem ({fuse}), whose server "
                          "decides what every read returns or never answers: refused "
                          "(--attach-unsafe-library overrides)")
    try:
        fd, via, root = _open_map_file(host, pid, m), mf, False
    except ValueError as exc:
        raise AttachError(f"pid {pid}: {m.path} (through {mf}) is {exc}: refused") from None
    except OSError as first:
        via, root = host.display(host.proc(pid, "root")) + m.path, True
        try:
            fd = _open_in_root(host, pid, m)
        except (OSError, ValueError) as exc:
            what = f"is {exc}" if isinstance(exc, ValueError) else f"cannot be opened: {_why(exc)}"
            raise AttachError(f"pid {pid}: {m.path} cannot be opened through {mf} "
                              f"({_why(first)}) and {via} {what}: refused") from None
    p = Pinned(host, pid, m, fd, via, root)
    try:
        _vet(p, m, owner, unsafe_library)
    except AttachError:
        p.close()
        raise
    return p


def _vet(p: Pinned, m: Mapping, owner: Owner, unsafe_library: bool) -> None:
    st = os.fstat(p.fd)
    if p.through_root:
        # through the root: a path the target's owner can re-point, so only the inode the
        # process maps, and only what that owner may read itself
        if st.st_ino != m.inode:
            raise AttachError(f"pid {p.pid}: {p.via} is inode {st.st_ino}, not the inode "
                              f"{m.inode} the process maps: refused")
        if not owner.may_read(st):
            raise AttachError(f"pid {p.pid}: {p.via} is not readable by the process's owner: "
                              "refused")
    who = _writers(st, owner)
    if who and not unsafe_library:
        raise AttachError(f"pid {p.pid}: {m.path} is {who}: a uprobe there would run code "
                          "another user can change; refused (--attach-unsafe-library "
                          "overrides)")


def _fuse(host: Host, pid: int, m: Mapping) -> str | None:
    """The type of ``m``'s filesystem when it is FUSE (its device, from the maps line, in
    the target's /proc/PID/mountinfo), else None. Asked before anything is opened: a FUSE
    server, a process of whoever mounted it, answers every lookup, open and read of the
    file, or never answers (our open or our read of the symbols would hang)."""
    major, _, minor = m.dev.partition(":")
    try:
        want = f"{int(major, 16)}:{int(minor, 16)}"
    except ValueError:
        return None
    for line in (host.read(host.proc(pid, "mountinfo")).value or "").splitlines():
        f = line.split()
        if len(f) > 2 and f[2] == want and "-" in f[3:-1]:
            kind = f[f.index("-", 3) + 1]
            if kind in ("fuse", "fuseblk") or kind.startswith("fuse."):
                return kind
    return None


@dataclass
class Target:
    """One function to probe in one pinned library."""
    runtime: str
    library: str           # the path the process mapped
    map_files: str         # where the library was opened (map_files, else the root path)
    symbol: str            # the mangled name found
    shown: str
    offset: int
    entry: str             # the instruction at the entry (elf.describe_entry)
    table: str
    returns: bool          # a return probe is placed (status-returning functions only)
    pin: Pinned | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "pin"}


@dataclass
class Plan:
    pid: int
    comm: str
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # why something is not attached
    mapped: list[str] = field(default_factory=list)    # the libraries it maps (basenames)

    @property
    def runtimes(self) -> list[str]:
        """The runtimes of the targets, in catalogue order: more than one are candidates
        that watch tries (the choice is made by trial at attach time)."""
        return list(dict.fromkeys(t.runtime for t in self.targets))

    def to_dict(self) -> dict:
        return {"pid": self.pid, "comm": self.comm,
                "targets": [t.to_dict() for t in self.targets], "notes": self.notes,
                "candidates": self.runtimes,
                "choice": "by trial at attach time" if len(self.runtimes) > 1 else None,
                "cost_us_per_call": COST_US if self.targets else None}

    def close(self) -> None:
        """Close the pinned libraries (``attach --check``; watch hands them to Uprobes)."""
        for t in self.targets:
            if t.pin is not None:
                t.pin.close()


def exec_mappings(host: Host, pid: int) -> list[Mapping]:
    """The executable file mappings of ``pid`` (from /proc/PID/maps), each file once.
    :class:`AttachError` when the process is gone, its maps cannot be read (saying why), or
    it is a kernel thread."""
    r = host.read(host.proc(pid, "maps"))
    if r.value is None:
        if r.reason == "absent":
            raise AttachError(f"pid {pid}: no such process (or not in this PID namespace)")
        raise AttachError(_maps_denied(host, pid, r.reason or "unreadable"))
    if not r.value.strip() and _kernel_thread(host, pid):
        raise AttachError(f"pid {pid} ({comm_of(host, pid)}) is a kernel thread: it runs no "
                          "user code to probe")
    out: list[Mapping] = []
    seen: set[int] = set()
    for line in r.value.splitlines():
        f = line.split(None, 5)
        if len(f) < 6 or "x" not in f[1] or not f[5].startswith("/"):
            continue
        path = f[5]
        if path.endswith(" (deleted)"):
            continue
        try:
            lo, _, hi = f[0].partition("-")
            m = Mapping(int(lo, 16), int(hi, 16), path, int(f[4]), f[3])
        except ValueError:
            continue
        if m.inode and m.inode not in seen:
            seen.add(m.inode)
            out.append(m)
    return out


PF_KTHREAD = 0x00200000     # include/linux/sched.h: /proc/PID/stat's flags field
CAP_SYS_PTRACE = 19


def _kernel_thread(host: Host, pid: int) -> bool:
    st = host.read(host.proc(pid, "stat")).value or ""
    try:
        return bool(int(st[st.rindex(")") + 2:].split()[6]) & PF_KTHREAD)
    except (ValueError, IndexError):
        return False


def _caps(host: Host, pid: int | str, field_name: str) -> int | None:
    for line in (host.read(host.proc(pid, "status")).value or "").splitlines():
        if line.startswith(field_name + ":"):
            try:
                return int(line.split()[1], 16)
            except (IndexError, ValueError):
                return None
    return None


def _maps_denied(host: Host, pid: int, reason: str) -> str:
    """Why /proc/PID/maps could not be read: the kernel's ptrace read check (fs/proc/base.c
    mm_access, PTRACE_MODE_READ_FSCREDS) passes for root unless root lacks CAP_SYS_PTRACE
    against a process holding capabilities it lacks, or a security module (Landlock keeps a
    sandboxed process to its own domain; AppArmor, SELinux, a BPF LSM) refuses it."""
    shown = host.display(host.proc(pid, "maps"))
    reason = "permission denied" if reason == "permission" else reason
    if os.geteuid() != 0:
        return f"cannot read {shown}: {reason} (attach needs root)"
    ours, theirs = _caps(host, "self", "CapEff"), _caps(host, pid, "CapPrm")
    if ours is not None and not ours >> CAP_SYS_PTRACE & 1:
        extra = (theirs or 0) & ~ours
        return (f"cannot read {shown}: {reason}, although running as root: this process "
                "lacks CAP_SYS_PTRACE" + (f" and pid {pid} holds capabilities it does not "
                                           f"(mask 0x{extra:x})" if extra else ""))
    return (f"cannot read {shown}: {reason}, although running as root with CAP_SYS_PTRACE: "
            "a security module or a sandbox this process runs in (Landlock, AppArmor, "
            f"SELinux, a BPF LSM) keeps it from inspecting pid {pid}")


def comm_of(host: Host, pid: int) -> str:
    r = host.read(host.proc(pid, "comm"))
    if r.value is None:
        raise AttachError(f"pid {pid}: no such process (or not in this PID namespace)")
    return r.value.strip()


def plan(host: Host, pid: int, runtime: str = "auto", symbol: str | None = None,
         unsafe_return: bool = False, progress=None, unsafe_library: bool = False) -> Plan:
    """What to probe in process ``pid``. ``runtime``: one of :data:`NAMES`; ``symbol``:
    ``LIB:SYMBOL`` (any function of a mapped library whose basename is or starts with LIB).
    Each library is pinned (:func:`pin`; ``unsafe_library`` lets one that another user may
    write through); the targets hold their :class:`Pinned`, which :meth:`Plan.close` or
    the :class:`~agent.trace.uprobe.Uprobes` given them closes.
    Raises :class:`AttachError` when nothing can be attached, saying why."""
    if runtime not in NAMES:
        raise AttachError(f"--attach-runtime must be one of {', '.join(NAMES)}, not {runtime!r}")
    p = Plan(pid, comm_of(host, pid))
    maps = exec_mappings(host, pid)
    p.mapped = sorted({m.name for m in maps if ".so" in m.name})
    r = _Reader(host, pid, maps, owner_of(host, pid), unsafe_library,
                progress)
    try:
        if symbol is not None:
            r.symbol(p, symbol, unsafe_return)
        else:
            r.runtimes(p, runtime)
    except BaseException:
        r.close_except([])
        raise
    r.close_except(p.targets)
    return p


class _Reader:
    """One plan's reading: the libraries pinned so far (each once), and what they hold."""

    def __init__(self, host: Host, pid: int, maps: list[Mapping], owner: Owner,
                 unsafe_library: bool, progress) -> None:
        self.host, self.pid, self.maps, self.owner = host, pid, maps, owner
        self.unsafe_library, self.progress = unsafe_library, progress
        self.pins: dict[tuple[int, str], Pinned] = {}

    def close_except(self, targets: list[Target]) -> None:
        keep = {id(t.pin) for t in targets}
        for pinned in self.pins.values():
            if id(pinned) not in keep:
                pinned.close()

    def symbol(self, p: Plan, symbol: str, unsafe_return: bool) -> None:
        lib, sep, sym = symbol.partition(":")
        if not sep or not lib or not sym:
            raise AttachError(f"--attach-symbol must be LIB:SYMBOL, not {symbol!r}")
        libs = [m for m in self.maps if m.name == lib or m.name.startswith(lib)
                or m.path == lib]
        if not libs:
            raise AttachError(f"pid {self.pid} ({p.comm}) maps no library named {lib!r}")
        self.add(p, libs[0], [sym], "symbol", sym, unsafe_return, required=True)

    def runtimes(self, p: Plan, runtime: str) -> None:
        """Every runtime of the catalogue (or the one named) whose function the process
        maps: with ``auto`` they are all candidates (the process may map several and call
        one: watch's trial keeps the one whose calls arrive)."""
        chosen = [r for r in RUNTIMES if runtime in ("auto", r.name)]
        self.warm(chosen)
        notes: list[str] = []
        for r in chosen:
            one = Plan(self.pid, p.comm)
            for m in self.maps:
                if r.library.search(m.name):
                    self.add(one, m, list(r.symbols), r.name, r.shown, True)
            notes += one.notes
            p.targets += one.targets
        if p.targets:
            return
        # nothing found: every candidate library's reason reaches the line
        known = ", ".join(sorted({m.name for m in self.maps if ".so" in m.name})[:12])
        which = "a known inference runtime" if runtime == "auto" else f"the {runtime} runtime"
        extra = f"; {'; '.join(notes)}" if notes else ""
        raise AttachError(f"pid {self.pid} ({p.comm}) maps no function of {which} "
                          f"(libraries: {known or 'none'}){extra}; "
                          "--attach-symbol LIB:SYMBOL names another")

    def warm(self, runtimes: list[Runtime]) -> None:
        """Read each library's symbols of every runtime it may hold in one pass (TF's C API
        and its session run share the 788 MB ``libtensorflow_cc.so.2``; the reader keeps
        what it found): :meth:`add` then finds them read. A failure here is said by add."""
        for m in self.maps:
            names = [n for r in runtimes if r.library.search(m.name) for n in r.symbols]
            if len(names) > 1:
                try:
                    elf.resolve(self.pin(m).fd, names, self.progress, m.name)
                except (AttachError, elf.ElfError):
                    continue

    def pin(self, m: Mapping) -> Pinned:
        key = (m.inode, m.path)
        if key not in self.pins:
            self.pins[key] = pin(self.host, self.pid, m, self.owner, self.unsafe_library)
        return self.pins[key]

    def add(self, p: Plan, m: Mapping, names: list[str], runtime: str, shown: str,
            returns: bool, required: bool = False) -> None:
        """Add the functions ``names`` of mapping ``m`` to ``p``; why none is there is a
        note (an AttachError when ``required``)."""
        try:
            pinned = self.pin(m)
            info, found = elf.resolve(pinned.fd, names, self.progress, m.name)
            moved = pinned.moved()
            if moved:
                raise AttachError(moved)
        except (AttachError, elf.ElfError) as exc:
            if required:
                raise AttachError(str(exc)) from None
            p.notes.append(str(exc))
            return
        if not any(found.values()):
            why = (f"{m.name} has none of {', '.join(n.rstrip('*') for n in names)}"
                   + (" (stripped: no .symtab)" if info.stripped else "")
                   + "".join(f"; {r}" for r in info.reasons))
            if required:
                raise AttachError(f"pid {p.pid}: {why}")
            p.notes.append(why)
            return
        for name in names:
            s = found.get(name)
            if s is not None:
                p.targets.append(Target(runtime, m.path, pinned.via, s.name, shown, s.offset,
                                        elf.describe_entry(s.first_bytes, info.machine),
                                        s.table, returns, pinned))


def host_notes(host: Host) -> list[str]:
    """What this kernel makes of a uprobe attach: the return probe's syscall (Linux 6.11+)
    against old seccomp profiles, and ``panic_on_warn`` (a WARN_ON_ONCE seen on 6.18 in
    uprobe_register → install_breakpoint → ext4_map_blocks would then panic the host)."""
    notes = []
    rel = host.read(host.proc("sys", "kernel", "osrelease")).value
    m = re.match(r"(\d+)\.(\d+)", rel or "")
    if m and (int(m.group(1)), int(m.group(2))) >= (6, 11):
        notes.append(f"kernel {rel.strip()}: return probes use the uretprobe syscall (6.11+); "
                     "a seccomp profile that predates it (older systemd, Docker, libseccomp) "
                     "kills the traced process on its first return")
    pw = host.read(host.proc("sys", "kernel", "panic_on_warn")).value
    if pw and pw.strip() == "1":
        notes.append("kernel.panic_on_warn=1: a kernel WARN while placing the uprobe (seen "
                     "once on 6.18 via ext4) would panic this host")
    return notes


def check_text(p: Plan, host: Host | None = None) -> list[str]:
    """``hftagent attach --check``'s report, one fact a line."""
    lines = [f"pid {p.pid} ({p.comm}): {len(p.targets)} function(s) can be attached"]
    if len(p.runtimes) > 1:
        lines.append(f"  choice    by trial at attach time: watch --attach arms the candidates "
                     f"({', '.join(p.runtimes)}) together and keeps the one whose calls arrive "
                     "(the outermost per call); --attach-runtime R takes one without a trial")
    for t in p.targets:
        lines += [f"  runtime   {t.runtime}: {t.shown}",
                  f"  library   {t.library}",
                  f"  symbol    {t.symbol} ({t.table})",
                  f"  offset    0x{t.offset:x} (the file opened once, through {t.map_files})",
                  f"  entry     {t.entry}",
                  f"  timing    {'entry and return (the function returns a status)' if t.returns else 'entry only (--unsafe-return adds the return probe)'}"]
    lines += [f"  note      {n}" for n in p.notes]
    if p.targets:
        lines += [f"  cost      ~{COST_US} µs per call with the return probe (x86-64, emulated "
                  "first instruction); every other process that maps the same library pays "
                  "the trap too while watch runs",
                  ]
        lines += [f"  kernel    {n}" for n in (host_notes(host) if host is not None else [])]
    return lines
