"""Symbols of an ELF shared library: a function's file offset for a uprobe, and its first
instruction bytes.

A uprobe is placed at ``PATH:0xOFFSET`` where OFFSET is the *file* offset of the function:
``st_value − p_vaddr + p_offset`` of the executable PT_LOAD segment that holds it (kernel
Documentation/trace/uprobetracer.rst). The symbol is looked up in ``.dynsym`` first, then in
``.symtab`` (LiteRT's ``InterpreterWrapper::Invoke`` is a LOCAL ``.symtab`` symbol).

Cost: only the ELF header, the section and program headers and the symbol and string tables
are read, with ``mmap``; a name is found by searching the string table for ``\\0NAME\\0`` (C
speed) and then the symbol whose ``st_name`` points there (numpy over the table), so even the
788 MB ``libtensorflow_cc.so.2`` resolves without decoding its 10^6 symbols in Python. Results
are kept per (build-id or device/inode/size/mtime) for the life of the process.

64-bit little-endian ELF only (x86-64, aarch64, riscv64, ppc64le); anything else is refused
with a reason. Nothing here writes or executes anything.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

PT_LOAD, PF_X = 1, 1
SHT_SYMTAB, SHT_DYNSYM, SHT_NOTE, SHT_NOBITS = 2, 11, 7, 8
STT_FUNC, STT_GNU_IFUNC = 2, 10
NT_GNU_BUILD_ID = 3
MACHINES = {62: "x86_64", 183: "aarch64", 243: "riscv64", 21: "ppc64"}

_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                 ("value", "<u8"), ("size", "<u8")])


class ElfError(Exception):
    """The file is not an ELF we can read, or the symbol is not in it (message for users)."""


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
    path: str
    machine: str
    build_id: str | None
    tables: tuple[str, ...]       # which symbol tables it has
    symbols: int                  # how many entries in them together
    stripped: bool                # no .symtab (only the exported .dynsym)


_cache: dict[tuple, tuple[ElfInfo, dict[str, Symbol | None]]] = {}


def _key(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Elf:
    """One mapped file; closed by the caller."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.st = os.fstat(fd)
            if self.st.st_size < 64:
                raise ElfError(f"{path}: not an ELF file (too short)")
            self.m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        except (OSError, ValueError) as exc:
            raise ElfError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") \
                from None
        finally:
            os.close(fd)
        m = self.m
        if m[:4] != b"\x7fELF":
            self.close()
            raise ElfError(f"{path}: not an ELF file")
        if m[4] != 2 or m[5] != 1:
            self.close()
            raise ElfError(f"{path}: only 64-bit little-endian ELF is supported")
        (self.e_machine,) = struct.unpack_from("<H", m, 18)
        (self.phoff, self.shoff) = struct.unpack_from("<QQ", m, 32)
        (self.phentsize, self.phnum, self.shentsize, self.shnum,
         self.shstrndx) = struct.unpack_from("<HHHHH", m, 54)
        if self.shoff + self.shnum * self.shentsize > len(m) or \
                self.phoff + self.phnum * self.phentsize > len(m):
            self.close()
            raise ElfError(f"{path}: truncated ELF headers")
        self.sections = [self._section(i) for i in range(self.shnum)]
        self.segments = [struct.unpack_from("<IIQQQQQQ", m, self.phoff + i * self.phentsize)
                         for i in range(self.phnum)]

    def _section(self, i: int) -> tuple[int, int, int, int, int, int]:
        """(name, type, offset, size, link, entsize) of section ``i``."""
        name, typ, _flags, _addr, off, size, link, _info, _align, ent = struct.unpack_from(
            "<IIQQQQIIQQ", self.m, self.shoff + i * self.shentsize)
        return name, typ, off, size, link, ent

    def _bytes(self, off: int, size: int) -> bytes:
        if off < 0 or size < 0 or off + size > len(self.m):
            raise ElfError(f"{self.path}: a section lies outside the file")
        return self.m[off:off + size]

    def section_name(self, sec) -> str:
        if self.shstrndx >= len(self.sections):
            return ""
        _n, _t, off, size, _l, _e = self.sections[self.shstrndx]
        strtab = self._bytes(off, size)
        end = strtab.find(b"\0", sec[0])
        return strtab[sec[0]:end].decode("ascii", "replace")

    def tables(self) -> list[tuple[str, np.ndarray, bytes]]:
        """[(".dynsym" | ".symtab", symbols, string table)], dynsym first."""
        out = []
        for want, label in ((SHT_DYNSYM, ".dynsym"), (SHT_SYMTAB, ".symtab")):
            for sec in self.sections:
                if sec[1] != want or sec[5] != _SYM.itemsize or sec[4] >= len(self.sections):
                    continue
                n = sec[3] // _SYM.itemsize
                syms = np.frombuffer(self._bytes(sec[2], n * _SYM.itemsize), dtype=_SYM)
                link = self.sections[sec[4]]
                out.append((label, syms, self._bytes(link[2], link[3])))
        return out

    def build_id(self) -> str | None:
        for sec in self.sections:
            if sec[1] != SHT_NOTE:
                continue
            data, pos = self._bytes(sec[2], sec[3]), 0
            while pos + 12 <= len(data):
                namesz, descsz, typ = struct.unpack_from("<III", data, pos)
                pos += 12
                name = data[pos:pos + namesz]
                pos += (namesz + 3) & ~3
                desc = data[pos:pos + descsz]
                pos += (descsz + 3) & ~3
                if typ == NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU":
                    return desc.hex()
        return None

    def file_offset(self, vaddr: int) -> int | None:
        """The file offset of ``vaddr`` in an executable PT_LOAD segment, else None."""
        for typ, flags, off, va, _pa, filesz, _memsz, _align in self.segments:
            if typ == PT_LOAD and flags & PF_X and va <= vaddr < va + filesz:
                return vaddr - va + off
        return None

    def close(self) -> None:
        try:
            self.m.close()
        except (AttributeError, ValueError):
            pass


def _find(elf: _Elf, tables, name: str) -> Symbol | None:
    """The function called ``name``; a name ending in ``*`` is a prefix (a C++ symbol whose
    mangled tail carries a dependency's version, e.g. absl's ``lts_20250814`` in
    ``TFE_Py_ExecuteCancelable``'s argument types)."""
    prefix = name.endswith("*")
    needle = name.rstrip("*").encode()
    tail = b"" if prefix else b"\0"
    for label, syms, strtab in tables:
        pos = strtab.find(b"\0" + needle + tail)
        while pos >= 0:
            hits = np.nonzero((syms["name"] == pos + 1)
                              & np.isin(syms["info"] & 0xF, (STT_FUNC, STT_GNU_IFUNC))
                              & (syms["value"] != 0))[0]
            if hits.size:
                s = syms[int(hits[0])]
                off = elf.file_offset(int(s["value"]))
                if off is not None:
                    bind = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK"}.get(int(s["info"]) >> 4, "?")
                    end = strtab.find(b"\0", pos + 1)
                    full = strtab[pos + 1:end].decode("ascii", "replace")
                    return Symbol(full, label, int(s["value"]), int(s["size"]), off,
                                  bytes(elf._bytes(off, min(16, len(elf.m) - off))), bind)
            pos = strtab.find(b"\0" + needle + tail, pos + 1)
    return None


def resolve(path: str, names: list[str], progress=None, shown: str | None = None
            ) -> tuple[ElfInfo, dict[str, Symbol | None]]:
    """(what the file is, {name: Symbol or None}) for the function ``names`` in ``path``.

    ``progress(str)``, when given, is told when a big file (> 100 MB) is being read, so a
    command can say it is working (naming it ``shown``, default the path's basename). Raises :class:`ElfError` for a file that is not a
    64-bit little-endian ELF."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ElfError(f"{path}: {exc.strerror or exc}") from None
    key = _key(st)
    info, known = _cache.get(key, (None, {}))
    missing = [n for n in names if n not in known]
    if info is not None and not missing:
        return info, {n: known[n] for n in names}
    if progress and st.st_size > 100 << 20:
        progress(f"reading the symbols of {shown or os.path.basename(path)} "
                 f"({st.st_size / 1e6:.0f} MB)")
    elf = _Elf(path)
    try:
        tables = elf.tables()
        info = ElfInfo(path, MACHINES.get(elf.e_machine, f"machine {elf.e_machine}"),
                       elf.build_id(), tuple(t[0] for t in tables),
                       sum(len(t[1]) for t in tables),
                       not any(t[0] == ".symtab" for t in tables))
        for n in missing:
            known[n] = _find(elf, tables, n)
    finally:
        elf.close()
    _cache[key] = (info, known)
    return info, {n: known[n] for n in names}


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
