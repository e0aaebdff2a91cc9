"""Crafted 64-bit little-endian ELF files (struct.pack) for the ELF reader's tests and the
bad-input corpus: a small valid "library" whose every header field a test may then break,
and sparse giants whose tables claim hundreds of MiB.

Layout of :func:`library` (offsets in :class:`Layout`)::

    0x0000  ELF header                 0x0040  program headers: R (0x0-0x1000), R+X (text)
    0x1000  .text (TEXT_SIZE bytes)    then    .note.gnu.build-id, .dynsym, .dynstr,
                                               section headers: null .text .note .dynsym .dynstr
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

EHDR = struct.Struct("<4s5B7xHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")
PT_LOAD, PF_X, PF_R = 1, 1, 4
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_NOTE, SHT_DYNSYM = 1, 2, 3, 7, 11
STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 1, 2, 10
TEXT_OFF = TEXT_VADDR = 0x1000
TEXT_SIZE = 0x100
# The function bytes: push %rbp; mov %rsp,%rbp; ... then a recognisable tail per function.
PROLOGUE = b"\x55\x48\x89\xe5"
BUILD_ID = bytes(range(20))


@dataclass(frozen=True)
class Layout:
    """Where each part of a :func:`library` lies (file offsets)."""
    phoff: int
    shoff: int
    note: int
    syms: int
    strs: int
    size: int

    def shdr(self, i: int) -> int:
        """The offset of section header ``i`` (0 null, 1 .text, 2 note, 3 .dynsym, 4 .dynstr)."""
        return self.shoff + i * SHDR.size


def sym(name: int, typ: int = STT_FUNC, value: int = TEXT_VADDR, *, bind: int = 1,
        shndx: int = 1, size: int = 16) -> bytes:
    return SYM.pack(name, (bind << 4) | typ, 0, shndx, value, size)


def ehdr(phoff: int, phnum: int, shoff: int, shnum: int, *, phentsize: int = PHDR.size,
         shentsize: int = SHDR.size, klass: int = 2, machine: int = 62) -> bytes:
    return EHDR.pack(b"\x7fELF", klass, 1, 1, 0, 0, 3, machine, 1, 0, phoff, shoff, 0,
                     EHDR.size, phentsize, phnum, shentsize, shnum, 0)


def strtab(names: list[str]) -> tuple[bytes, dict[str, int]]:
    """(the table, {name: its offset})."""
    out, where = bytearray(b"\0"), {}
    for n in names:
        where[n] = len(out)
        out += n.encode() + b"\0"
    return bytes(out), where


def text() -> bytes:
    """TEXT_SIZE bytes: a function every 16 bytes, each PROLOGUE then its index."""
    return b"".join(PROLOGUE + bytes([i]) * 12 for i in range(TEXT_SIZE // 16))


def note() -> bytes:
    return struct.pack("<III", 4, len(BUILD_ID), 3) + b"GNU\0" + BUILD_ID


def library(symbols: list[bytes], strings: bytes, *, table: int = SHT_DYNSYM
            ) -> tuple[bytearray, Layout]:
    """A small library: ``symbols`` (from :func:`sym`) in a ``table`` whose string table is
    ``strings``; (its bytes, where its parts lie)."""
    body = bytearray(TEXT_OFF)
    body += text()
    n_off = len(body)
    body += note()
    s_off = len(body)
    body += sym(0, 0, 0, bind=0, shndx=0, size=0) + b"".join(symbols)
    t_off = len(body)
    body += strings
    body += bytes(-len(body) % 8)
    shoff = len(body)
    nsyms = len(body[s_off:t_off])
    body += SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    body += SHDR.pack(0, SHT_PROGBITS, 6, TEXT_VADDR, TEXT_OFF, TEXT_SIZE, 0, 0, 16, 0)
    body += SHDR.pack(0, SHT_NOTE, 2, 0, n_off, s_off - n_off, 0, 0, 4, 0)
    body += SHDR.pack(0, table, 2, 0, s_off, nsyms, 4, 1, 8, SYM.size)
    body += SHDR.pack(0, SHT_STRTAB, 2, 0, t_off, len(strings), 0, 0, 1, 0)
    body[0:EHDR.size] = ehdr(EHDR.size, 2, shoff, 5)
    body[EHDR.size:EHDR.size + 2 * PHDR.size] = (
        PHDR.pack(PT_LOAD, PF_R, 0, 0, 0, TEXT_OFF, TEXT_OFF, 0x1000)
        + PHDR.pack(PT_LOAD, PF_R | PF_X, TEXT_OFF, TEXT_VADDR, TEXT_VADDR, TEXT_SIZE,
                    TEXT_SIZE, 0x1000))
    return body, Layout(EHDR.size, shoff, n_off, s_off, t_off, len(body))


def plain(names: list[str] = ("hft_infer", "hft_other")) -> tuple[bytearray, Layout]:
    """A valid library whose functions ``names`` are the first ones of .text."""
    strings, where = strtab(list(names))
    return library([sym(where[n], value=TEXT_VADDR + 16 * i) for i, n in enumerate(names)],
                   strings)


def sparse_giant(path: Path, size: int, sym_size: int, str_size: int,
                 live_symbols: int = 0) -> None:
    """A ``size``-byte sparse file: a valid header, one R+X segment, and a .symtab of
    ``sym_size`` bytes and .strtab of ``str_size`` bytes that are holes, except the first
    ``live_symbols`` symbols: defined ones whose names point a page apart through the string
    table (each visit touches a new page)."""
    sym_off, str_off = 1 << 20, (1 << 20) + sym_size
    shoff = size - 4096
    with open(path, "wb") as f:
        f.write(ehdr(EHDR.size, 1, shoff, 3))
        f.write(PHDR.pack(PT_LOAD, PF_R | PF_X, 0, 0, 0, 4096, 4096, 0x1000))
        f.seek(sym_off)
        f.write(b"".join(sym((i * 4096) % max(str_size - 64, 1), STT_OBJECT, 64)
                         for i in range(live_symbols)))
        f.seek(shoff)
        f.write(SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
                + SHDR.pack(0, SHT_SYMTAB, 0, 0, sym_off, sym_size, 2, 1, 8, SYM.size)
                + SHDR.pack(0, SHT_STRTAB, 0, 0, str_off, str_size, 0, 0, 1, 0))
        f.truncate(size)
