"""Symbols of an ELF shared library: a function's file offset for a uprobe, and its first
instruction bytes.

A uprobe is placed at ``PATH:0xOFFSET`` where OFFSET is the *file* offset of the function:
``st_value − p_vaddr + p_offset`` of the executable PT_LOAD segment that holds it (kernel
Documentation/trace/uprobetracer.rst). The symbol is looked up in ``.dynsym`` first, then in
``.symtab`` (LiteRT's ``InterpreterWrapper::Invoke`` is a LOCAL ``.symtab`` symbol). Only a
defined ``STT_FUNC`` whose address lies in the file bytes of an executable PT_LOAD segment,
and whose offset lies inside the file, is returned; a name that matches anything else (an
OBJECT, an IFUNC resolver, an address outside every executable segment, an offset past the
end of the file) is refused with one line in :attr:`ElfInfo.reasons`.

Bounded (issue #34): the file is mapped read-only, never copied; every header, table and note
is checked against the file size before it is touched, and a malformed one is an
:class:`ElfError` with a one-line reason. The symbol and string tables one call may touch
are capped at :data:`READ_CAP` (``libtensorflow_cc.so.2``, the biggest library we attach to,
has 284 MiB of them), and they are walked in windows of :data:`WINDOW_SYMBOLS` symbols whose
pages are released after each window, so the resident set stays at about one window (TF's
library: 61 MB peak, not 245 MB); a window that is a hole of a sparse file (SEEK_DATA) is
skipped unread, as zeros name no defined symbol. A name is matched in one pass over the table,
one byte of the name at a time over the symbols still matching (numpy), so the cost is
linear in the table whatever the string table repeats. Results are kept per
(device, inode, size, mtime, ctime) for the life of the process.

The file must not shrink while it is read: a truncation under the mapping is a SIGBUS that
ends the reading process (whoever may write the library can stop `attach --check`, nothing
more: the reading places nothing).

64-bit little-endian ELF only (x86-64, aarch64, riscv64, ppc64le); anything else is refused
with a reason. Nothing here writes or executes anything.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

PT_LOAD, PF_X = 1, 1
SHT_SYMTAB, SHT_STRTAB, SHT_DYNSYM, SHT_NOTE = 2, 3, 11, 7
STT_FUNC, STT_GNU_IFUNC = 2, 10
SHN_UNDEF, PN_XNUM = 0, 0xFFFF
NT_GNU_BUILD_ID = 3
MACHINES = {62: "x86_64", 183: "aarch64", 243: "riscv64", 21: "ppc64"}
TYPES = {0: "NOTYPE", 1: "OBJECT", 3: "SECTION", 4: "FILE", 5: "COMMON", 6: "TLS"}

# Bytes of symbol and string tables one resolve() may touch: libtensorflow_cc.so.2 (TF 2.20)
# has 284 MiB (.dynsym 10 + .dynstr 79 + .symtab 28 + .strtab 167), libtensorflow_framework
# 25, LiteRT's libpywrap_litert_common 14, lib_pywrap_tensorflow_common 7.
READ_CAP = 512 << 20
HEADERS_CAP = 4 << 20          # section and program header tables (TF's: 2.2 KiB)
NOTES_CAP = 1 << 20            # note sections read for the build-id
WINDOW_SYMBOLS = 1 << 18       # symbols per window (6 MiB) ...
STRINGS_WINDOW = 16 << 20      # ... and string table bytes: the resident set's bound
NAME_MAX = 4096                # bytes of a symbol name shown

_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                 ("value", "<u8"), ("size", "<u8")])
_SHDR = np.dtype([("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"),
                  ("offset", "<u8"), ("size", "<u8"), ("link", "<u4"), ("info", "<u4"),
                  ("align", "<u8"), ("entsize", "<u8")])
_PHDR = np.dtype([("type", "<u4"), ("flags", "<u4"), ("offset", "<u8"), ("vaddr", "<u8"),
                  ("paddr", "<u8"), ("filesz", "<u8"), ("memsz", "<u8"), ("align", "<u8")])


class ElfError(Exception):
    """The file is not an ELF we can read (message for users, one line)."""


@dataclass(frozen=True)
class Symbol:
    name: str
    table: str            # ".dynsym" or ".symtab"
    vaddr: int            # st_value
    size: int
    offset: int           # file offset: where the uprobe goes
    first_bytes: bytes    # the instruction bytes at the entry (up to 16)
    binding: str          # GLOBAL, LOCAL, WEAK


@dataclass(frozen=True)
class ElfInfo:
    path: str                     # the path read, or the name shown for a descriptor
    machine: str
    build_id: str | None
    tables: tuple[str, ...]       # which symbol tables it has
    symbols: int                  # how many entries in them together
    stripped: bool                # no .symtab (only the exported .dynsym)
    reasons: list[str] = field(default_factory=list)   # one line per refused name


@dataclass(frozen=True)
class _Table:
    label: str
    sym_off: int
    count: int
    str_off: int
    str_size: int


_cache: dict[tuple, tuple[ElfInfo, dict[str, tuple[Symbol | None, str | None]]]] = {}


def _key(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


class _Elf:
    """One mapped file (read-only, never copied); closed by the caller."""

    def __init__(self, fd: int, name: str, size: int) -> None:
        self.fd, self.name, self.size = fd, name, size
        try:
            self.m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise self.error(f"cannot map: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            self._headers()
        except BaseException:
            self.close()
            raise

    def error(self, why: str) -> ElfError:
        return ElfError(f"{self.name}: {why}")

    def _headers(self) -> None:
        m = self.m
        if m[:4] != b"\x7fELF":
            raise self.error("not an ELF file")
        if m[4] != 2 or m[5] != 1:
            raise self.error("only 64-bit little-endian ELF is supported")
        (self.e_machine,) = struct.unpack_from("<H", m, 18)
        phoff, shoff = struct.unpack_from("<QQ", m, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", m, 54)
        if shoff and (shnum == 0 or phnum == PN_XNUM):
            # extended numbering (gABI): the real counts are in section 0's sh_size / sh_info
            (first,) = self._table(shoff, 1, shentsize, _SHDR, "section", "e_shentsize")
            shnum = int(first["size"]) if shnum == 0 else shnum
            phnum = int(first["info"]) if phnum == PN_XNUM else phnum
        self.sections = self._table(shoff, shnum if shoff else 0, shentsize, _SHDR, "section",
                                    "e_shentsize")
        self.segments = self._table(phoff, phnum if phoff else 0, phentsize, _PHDR, "program",
                                    "e_phentsize")
        load = self.segments[(self.segments["type"] == PT_LOAD)
                             & (self.segments["flags"] & PF_X != 0)]
        load = load[np.argsort(load["vaddr"], kind="stable")]
        self.x_vaddr, self.x_filesz = load["vaddr"], load["filesz"]
        self.x_offset = load["offset"]

    def _table(self, off: int, n: int, entsize: int, dtype: np.dtype, what: str,
               field_name: str) -> np.ndarray:
        """A copy of ``n`` headers of ``entsize`` bytes at ``off``, each checked to lie in
        the file (the copy is at most HEADERS_CAP)."""
        if n == 0:
            return np.zeros(0, dtype)
        if entsize < dtype.itemsize:
            raise self.error(f"{field_name} {entsize} is smaller than a {what} header "
                             f"({dtype.itemsize} bytes)")
        if n * entsize > HEADERS_CAP:
            raise self.error(f"{n} {what} headers of {entsize} bytes exceed the "
                             f"{_mib(HEADERS_CAP)} header cap")
        if off + n * entsize > self.size:
            raise self.error(f"truncated ELF headers: the {what} headers (at {off:#x}) end "
                             f"past the end of the file ({self.size} bytes)")
        return np.ndarray((n,), dtype, buffer=self.m, offset=off, strides=(entsize,)).copy()

    def _inside(self, sec: np.void, what: str) -> tuple[int, int]:
        off, size = int(sec["offset"]), int(sec["size"])
        if off + size > self.size:
            raise self.error(f"truncated ELF: {what} ({size} bytes at {off:#x}) ends past the "
                             f"end of the file ({self.size} bytes)")
        return off, size

    def tables(self) -> list[_Table]:
        """The first .dynsym and the first .symtab (gABI: at most one of each), checked, and
        within READ_CAP together."""
        out, total = [], 0
        for want, label in ((SHT_DYNSYM, ".dynsym"), (SHT_SYMTAB, ".symtab")):
            hits = np.nonzero(self.sections["type"] == want)[0]
            if not hits.size:
                continue
            sec = self.sections[int(hits[0])]
            if int(sec["entsize"]) != _SYM.itemsize:
                raise self.error(f"{label} has entries of {int(sec['entsize'])} bytes, "
                                 f"not {_SYM.itemsize}")
            link = int(sec["link"])
            if link >= len(self.sections) or self.sections[link]["type"] != SHT_STRTAB:
                raise self.error(f"{label} links section {link}, which is not a string table")
            sym_off, sym_size = self._inside(sec, label)
            str_off, str_size = self._inside(self.sections[link], f"{label}'s string table")
            out.append(_Table(label, sym_off, sym_size // _SYM.itemsize, str_off, str_size))
            total += sym_size + str_size
        if total > READ_CAP:
            raise self.error(f"symbol tables of {_mib(total)} exceed the {_mib(READ_CAP)} "
                             "read cap")
        return out

    def build_id(self) -> str | None:
        budget = NOTES_CAP
        for sec in self.sections[self.sections["type"] == SHT_NOTE]:
            off, size = self._inside(sec, "a note section")
            if size > budget:
                break
            budget -= size
            found = _build_id_note(self.m[off:off + size])
            if found is not None:
                return found
        return None

    def hole(self, off: int, size: int) -> bool:
        """Whether the ``size`` bytes at ``off`` are all a hole of a sparse file (zeros never
        name a defined symbol nor start a name: skipped unread, so a sparse giant's claimed
        tables cost no page cache, which on tmpfs would be memory). The descriptor's file
        position is put back."""
        try:
            here = os.lseek(self.fd, 0, os.SEEK_CUR)
        except OSError:
            return False
        try:
            return os.lseek(self.fd, off, os.SEEK_DATA) >= off + size
        except OSError as exc:
            return exc.errno == errno.ENXIO                # no data from off to the end
        finally:
            os.lseek(self.fd, here, os.SEEK_SET)

    def release(self, off: int = 0, size: int | None = None) -> None:
        """Drop the pages of ``size`` bytes at ``off`` (default: all) from our resident set;
        they stay in the page cache, and a later touch maps them again."""
        start = off - off % mmap.PAGESIZE
        end = self.size if size is None else min(off + size, self.size)
        try:
            self.m.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError, AttributeError):
            pass

    def close(self) -> None:
        try:
            self.m.close()
        except (AttributeError, ValueError, BufferError):
            pass


def _build_id_note(data: bytes) -> str | None:
    """The GNU build-id in one note section's bytes, each note's sizes checked."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, typ = struct.unpack_from("<III", data, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        pos = desc_at + ((descsz + 3) & ~3)
        if pos > len(data):
            return None
        if typ == NT_GNU_BUILD_ID and data[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":
            return data[desc_at:desc_at + descsz].hex()
    return None


def _matching(elf: _Elf, syms: np.ndarray, t: _Table, needle: bytes, exact: bool
              ) -> np.ndarray:
    """Indices of the defined symbols of ``syms`` whose name is ``needle`` (or starts with
    it): one byte at a time over the symbols still matching, so at most len(needle) + 1
    passes over the table whatever the string table repeats; the string table is visited in
    windows of STRINGS_WINDOW bytes (names sorted by offset), each released after use."""
    want = needle + (b"\0" if exact else b"")
    names = syms["name"].astype(np.int64)
    cand = np.nonzero((syms["shndx"] != SHN_UNDEF) & (names + len(want) <= t.str_size))[0]
    cand = cand[np.argsort(names[cand], kind="stable")]
    pos = names[cand]
    out = [np.zeros(0, np.int64)]
    for a in range(0, t.str_size, STRINGS_WINDOW):
        lo, hi = np.searchsorted(pos, (a, a + STRINGS_WINDOW))
        if lo == hi or elf.hole(t.str_off + a, min(STRINGS_WINDOW, t.str_size - a)):
            continue
        view = np.frombuffer(elf.m, np.uint8, min(STRINGS_WINDOW + len(want), t.str_size - a),
                             t.str_off + a)
        idx, rel = cand[lo:hi], pos[lo:hi] - a
        for i, b in enumerate(want):
            keep = view[rel + i] == b
            idx, rel = idx[keep], rel[keep]
            if not idx.size:
                break
        out.append(idx)
        del view
        elf.release(t.str_off + a, STRINGS_WINDOW + len(want))
    return np.sort(np.concatenate(out))


def _name_at(strtab: np.ndarray, pos: int) -> str:
    raw = strtab[pos:pos + NAME_MAX].tobytes()
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def _placed(elf: _Elf, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(in an executable segment's file bytes, also inside the file, file offset) for each
    address: the segment is the one with the highest p_vaddr at or below it."""
    n = values.size
    if not elf.x_vaddr.size:
        return np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, np.uint64)
    k = np.searchsorted(elf.x_vaddr, values, side="right").astype(np.int64) - 1
    seg = np.maximum(k, 0)
    rel = values - elf.x_vaddr[seg]                 # wraps where k < 0: masked below
    inseg = (k >= 0) & (rel < elf.x_filesz[seg])
    start = elf.x_offset[seg]
    room = np.where(start < elf.size, np.uint64(elf.size) - np.minimum(start, elf.size), 0)
    infile = inseg & (rel < room)
    return inseg, infile, np.where(infile, start + np.where(infile, rel, 0), 0)


def _pick(elf: _Elf, table: str, syms: np.ndarray, strtab: np.ndarray, hits: np.ndarray,
          want: str) -> tuple[Symbol | None, str | None]:
    """The first of ``hits`` that is a function a uprobe may go at, else why none is."""
    if not hits.size:
        return None, None
    s = syms[hits]
    typ = s["info"] & 0xF
    inseg, infile, offsets = _placed(elf, s["value"])
    func = typ == STT_FUNC
    ok = np.nonzero(func & infile)[0]
    if ok.size:
        i = int(ok[0])
        one, off = s[i], int(offsets[i])
        bind = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK"}.get(int(one["info"]) >> 4, "?")
        return Symbol(_name_at(strtab, int(one["name"])), table, int(one["value"]),
                      int(one["size"]), off, bytes(elf.m[off:min(off + 16, elf.size)]),
                      bind), None
    bad = np.nonzero(func & inseg)[0]
    if bad.size:
        i = int(bad[0])
        return None, (f"{want}: at {int(s['value'][i]):#x}, its file offset lies past the end "
                      f"of the file ({elf.size} bytes) ({table})")
    if func.any():
        i = int(np.nonzero(func)[0][0])
        return None, (f"{want}: at {int(s['value'][i]):#x}, outside every executable "
                      f"segment ({table})")
    t = int(typ[0])
    kind = TYPES.get(t, f"type {t}")
    what = ("an IFUNC (its address is the resolver's, not the function's)"
            if t == STT_GNU_IFUNC else
            f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind} symbol, not a function")
    return None, f"{want}: {what} ({table})"


def _lookup(elf: _Elf, tables: list[_Table], names: list[str]
            ) -> dict[str, tuple[Symbol | None, str | None]]:
    """{name: (Symbol, None) or (None, why refused or None when absent)}, .dynsym first; a
    name ending in ``*`` is a prefix (a C++ symbol whose mangled tail carries a dependency's
    version, e.g. absl's ``lts_20250814`` in ``TFE_Py_ExecuteCancelable``'s argument
    types). The tables are walked in windows whose pages are released after each."""
    out: dict[str, tuple[Symbol | None, str | None]] = {n: (None, None) for n in names}
    for t in tables:
        for start in range(0, t.count, WINDOW_SYMBOLS):
            todo = [n for n in names if out[n][0] is None and n.rstrip("*")
                    and "\0" not in n]
            if not todo:
                return out
            n_syms = min(WINDOW_SYMBOLS, t.count - start)
            if elf.hole(t.sym_off + start * _SYM.itemsize, n_syms * _SYM.itemsize):
                continue
            strtab = np.frombuffer(elf.m, np.uint8, t.str_size, t.str_off)
            syms = np.frombuffer(elf.m, _SYM, n_syms, t.sym_off + start * _SYM.itemsize)
            for n in todo:
                hits = _matching(elf, syms, t, n.rstrip("*").encode(), not n.endswith("*"))
                found, why = _pick(elf, t.label, syms, strtab, hits, n)
                if found is not None or out[n][1] is None:
                    out[n] = (found, why if found is None else None)
            del strtab, syms
            elf.release(t.sym_off + start * _SYM.itemsize, WINDOW_SYMBOLS * _SYM.itemsize)
    return out


def _open(source: str | int, shown: str | None) -> tuple[int, bool, str]:
    """(descriptor, whether we opened it, the name errors use)."""
    if isinstance(source, int) and not isinstance(source, bool):
        return source, False, shown or f"descriptor {source}"
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the open
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise ElfError(f"{source}: {exc.strerror or exc}") from None
    return fd, True, str(source)


def resolve(source: str | int, names: list[str], progress: Callable[[str], None] | None = None,
            shown: str | None = None) -> tuple[ElfInfo, dict[str, Symbol | None]]:
    """(what the file is, {name: Symbol or None}) for the function ``names`` in ``source``:
    a path, or an open descriptor (read only through it, by mapping it; never closed here,
    never re-opened by path). A name that matches only something a uprobe must not go at
    is None, with one line saying why in ``info.reasons``.

    ``progress(str)``, when given, is told when more than 100 MB of tables are to be read
    (after the headers are checked), so a command can say it is working (naming it
    ``shown``, default the path's basename).
    Raises :class:`ElfError` (one line) for a file that is not a 64-bit little-endian ELF,
    is malformed, or whose symbol tables exceed :data:`READ_CAP`."""
    fd, own, name = _open(source, shown)
    try:
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise ElfError(f"{name}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ElfError(f"{name}: not a regular file")
        key = _key(st)
        info, known = _cache.get(key, (None, {}))
        missing = [n for n in names if n not in known]
        if info is None or missing:
            if st.st_size < 64:
                raise ElfError(f"{name}: not an ELF file (too short)")
            said = f"reading the symbols of {shown or os.path.basename(name)} " \
                   f"({st.st_size / 1e6:.0f} MB)"
            info = _read(fd, name, st.st_size, missing, known,
                         (lambda: progress(said)) if progress else (lambda: None))
            _cache[key] = (info, known)
    finally:
        if own:
            os.close(fd)
    reasons = [known[n][1] for n in names if known[n][1]]
    return replace(info, reasons=reasons), {n: known[n][0] for n in names}


def _read(fd: int, name: str, size: int, missing: list[str],
          known: dict[str, tuple[Symbol | None, str | None]], big: Callable[[], None]
          ) -> ElfInfo:
    """Map the file, look ``missing`` up into ``known``; what the file is. ``big()`` is
    called once the headers hold and the tables to read exceed 100 MB."""
    elf = _Elf(fd, name, size)
    try:
        tables = elf.tables()
        if sum(t.count * _SYM.itemsize + t.str_size for t in tables) > 100 << 20:
            big()
        info = ElfInfo(name, MACHINES.get(elf.e_machine, f"machine {elf.e_machine}"),
                       elf.build_id(), tuple(t.label for t in tables),
                       sum(t.count for t in tables),
                       not any(t.label == ".symtab" for t in tables))
        known.update(_lookup(elf, tables, missing))
    finally:
        elf.release()
        elf.close()
    return info


def describe_entry(first: bytes, machine: str) -> str:
    """What the probed instruction is, as far as it matters to the uprobe's cost (x86-64:
    ``push %rbp`` and the 5-byte nop are emulated or optimized, most others single-stepped,
    ~8.6 µs a hit against ~1.1 µs: shared/notes/attach.md)."""
    if machine != "x86_64" or not first:
        return f"{first[:4].hex(' ')} ({machine})"
    if first[:4] == b"\xf3\x0f\x1e\xfa":          # endbr64 then the real first instruction
        rest = describe_entry(first[4:], machine)
        return f"endbr64; {rest}"
    if first[:1] == b"\x55":
        return "push %rbp (emulated: ~1.1 µs a hit, ~1.8 µs with the return probe)"
    if first[:5] == b"\x0f\x1f\x44\x00\x00":
        return "nopl 0x0(%rax,%rax,1) (5-byte nop: the optimized uprobe path, ~0.5 µs)"
    if first[:2] in (b"\x41\x57", b"\x41\x56", b"\x41\x55", b"\x41\x54", b"\x53") or \
            first[:1] in (b"\x53", b"\x56", b"\x57"):
        return f"push (emulated): {first[:2].hex(' ')}"
    return f"{first[:6].hex(' ')} (may be single-stepped: up to ~10 µs a hit)"
