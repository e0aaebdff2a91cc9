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
==========  =====================================  =========================================

Every function there returns a status (or NULL on a Python error) rather than throwing: a
C++ exception that unwinds through a frame with a uretprobe aborts the process (the return
trampoline is not an unwindable frame: ``terminate called after throwing``, measured), so
return probes are placed only on these. ``--attach-symbol LIB:SYMBOL`` (any other function)
gets entry-only timing unless ``--unsafe-return`` says the caller knows it cannot throw.

Paths: the library is probed through ``/proc/PID/map_files/START-END`` of its executable
mapping, i.e. the very inode the process mapped (also inside a container, and even if the
file on disk was replaced since). uprobes are per inode: every process that maps the same
file pays the trap on each call (the event filter limits what is recorded, not who traps).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

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

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass
class Target:
    """One function to probe in one mapped library."""
    runtime: str
    library: str           # the path the process mapped
    map_files: str         # /proc/PID/map_files/START-END (the probe's path)
    symbol: str            # the mangled name found
    shown: str
    offset: int
    entry: str             # the instruction at the entry (elf.describe_entry)
    table: str
    returns: bool          # a return probe is placed (status-returning functions only)


@dataclass
class Plan:
    pid: int
    comm: str
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)     # why something is not attached

    def to_dict(self) -> dict:
        return {"pid": self.pid, "comm": self.comm,
                "targets": [t.__dict__ for t in self.targets], "notes": self.notes,
                "cost_us_per_call": COST_US if self.targets else None}


def exec_mappings(host: Host, pid: int) -> list[Mapping]:
    """The executable file mappings of ``pid`` (from /proc/PID/maps), each file once.
    :class:`AttachError` when the process is gone or its maps cannot be read."""
    r = host.read(host.proc(pid, "maps"))
    if r.value is None:
        if r.reason == "absent":
            raise AttachError(f"pid {pid}: no such process (or not in this PID namespace)")
        raise AttachError(f"cannot read {host.display(host.proc(pid, 'maps'))}: {r.reason} "
                          "(attach needs root)")
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
            m = Mapping(int(lo, 16), int(hi, 16), path, int(f[4]))
        except ValueError:
            continue
        if m.inode and m.inode not in seen:
            seen.add(m.inode)
            out.append(m)
    return out


def _readable(host: Host, pid: int, m: Mapping) -> tuple[str, str]:
    """(path to read the ELF from, path for the uprobe). The uprobe goes on map_files (the
    mapped inode); the symbols are read from it too where we may (root), else through the
    process's root (same file unless replaced since)."""
    mf = str(host.proc(pid, "map_files", f"{m.start:x}-{m.end:x}"))
    for cand in (mf, str(host.proc(pid, "root")) + m.path):
        try:
            fd = os.open(cand, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        os.close(fd)
        return cand, mf
    raise AttachError(f"pid {pid}: cannot open {m.path} (through {mf}): attach needs root")


def comm_of(host: Host, pid: int) -> str:
    r = host.read(host.proc(pid, "comm"))
    if r.value is None:
        raise AttachError(f"pid {pid}: no such process (or not in this PID namespace)")
    return r.value.strip()


def plan(host: Host, pid: int, runtime: str = "auto", symbol: str | None = None,
         unsafe_return: bool = False, progress=None) -> Plan:
    """What to probe in process ``pid``. ``runtime``: one of :data:`NAMES`; ``symbol``:
    ``LIB:SYMBOL`` (any function of a mapped library whose basename is or starts with LIB).
    Raises :class:`AttachError` when nothing can be attached, saying why."""
    if runtime not in NAMES:
        raise AttachError(f"--attach-runtime must be one of {', '.join(NAMES)}, not {runtime!r}")
    p = Plan(pid, comm_of(host, pid))
    maps = exec_mappings(host, pid)
    if symbol is not None:
        lib, sep, sym = symbol.partition(":")
        if not sep or not lib or not sym:
            raise AttachError(f"--attach-symbol must be LIB:SYMBOL, not {symbol!r}")
        libs = [m for m in maps if m.name == lib or m.name.startswith(lib)
                or m.path == lib]
        if not libs:
            raise AttachError(f"pid {pid} ({p.comm}) maps no library named {lib!r}")
        _add(host, p, libs[0], [sym], "symbol", sym, unsafe_return, progress, required=True)
        return p
    wanted = [r for r in RUNTIMES if runtime in ("auto", r.name)]
    found: list[Plan] = []
    for r in wanted:
        one = Plan(pid, p.comm)
        for m in maps:
            if r.library.search(m.name):
                _add(host, one, m, list(r.symbols), r.name, r.shown, True, progress)
        if one.targets:
            found.append(one)
    if found:
        # auto: the first runtime of the catalogue the process maps (the Python LiteRT
        # wrapper before the C APIs it embeds; TF's C API before its Python dispatch);
        # the others are named, so the user can choose one of them instead
        p.targets = found[0].targets
        p.notes += [f"also maps {f.targets[0].runtime} ({f.targets[0].shown}): "
                    f"--attach-runtime {f.targets[0].runtime} times that instead"
                    for f in found[1:]]
        if not one.targets:
            p.notes += one.notes
    if not p.targets:
        known = ", ".join(sorted({m.name for m in maps if ".so" in m.name})[:12])
        which = "a known inference runtime" if runtime == "auto" else f"the {runtime} runtime"
        extra = f"; {'; '.join(p.notes)}" if p.notes else ""
        raise AttachError(f"pid {pid} ({p.comm}) maps no function of {which} "
                          f"(libraries: {known or 'none'}){extra}; "
                          "--attach-symbol LIB:SYMBOL names another")
    return p


def _add(host: Host, p: Plan, m: Mapping, names: list[str], runtime: str, shown: str,
         returns: bool, progress, required: bool = False) -> None:
    """Add the functions ``names`` of mapping ``m`` to ``p``; one that is missing is a note
    when the runtime has none of them (or an AttachError when ``required``)."""
    path, mf = _readable(host, p.pid, m)
    try:
        info, found = elf.resolve(path, names, progress, m.name)
    except elf.ElfError as exc:
        if required:
            raise AttachError(str(exc)) from None
        p.notes.append(str(exc))
        return
    if not any(found.values()):
        why = (f"{m.name} has none of {', '.join(n.rstrip('*') for n in names)}"
               + (" (stripped: no .symtab)" if info.stripped else ""))
        if required:
            raise AttachError(f"pid {p.pid}: {why}")
        p.notes.append(why)
        return
    for name in names:
        s = found.get(name)
        if s is None:
            continue
        p.targets.append(Target(runtime, m.path, mf, s.name, shown, s.offset,
                                elf.describe_entry(s.first_bytes, info.machine), s.table,
                                returns))


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
    for t in p.targets:
        lines += [f"  runtime   {t.runtime}: {t.shown}",
                  f"  library   {t.library}",
                  f"  symbol    {t.symbol} ({t.table})",
                  f"  offset    0x{t.offset:x} (probed through {t.map_files})",
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
