"""The native reader's Python side: build ``hftsampler``, share a slot table and a byte ring
with it, and hand back each recorded round's bytes (and a layout's values).

How it fits: :class:`~agent.watch.sampling.native.sampler.NativeSampler` registers the files
its hot sources read (:meth:`Feed.register`: a path and a divisor, the helper reads it on
rounds where ``round % div == 0``) before the helper starts and whenever a source's files
change (sched attaching a thread). :meth:`Feed.read_rounds` returns what the helper recorded
since the last call; :meth:`Feed.read` is one file's bytes in a round (an ``OSError`` for a
read the helper got an error on, None when the round does not have the file).

The helper is C (hftsampler.c, next to this file), built on first use with the system's C
compiler into a per-user cache directory, keyed by the source's hash (collectors/native.py).
No compiler, or a build that fails: :class:`NativeUnavailable` with the reason, and watch uses
the Python sampler.

Token layouts (:class:`~collectors.layout.TokenLayout`): :meth:`Feed.set_layout` hands a
file's layout to the helper, which then adds the values, as doubles, to every read that
matches it (the token count, the names, every value a number as collectors/parsers.py
takes one); :meth:`Feed.values` returns them for a recorded round, None when the read came
without them. The sampler then appends the row without parsing
(:meth:`agent.watch.ring.SignalRing.append_seqs`; agent/watch/sampling/native/plans.py).

Shared file (``/dev/shm/hftagent-feed-<pid>-<random>``, mode 0600, unlinked on close): a
4 KiB header, :data:`NSLOTS` 256-byte slots (path, divisor, generation; the helper's error
and read time per slot), :data:`NSLOTS` token layouts of :data:`LAYOUT_BYTES`, then the
ring. :class:`CStruct` describes the structs hftsampler.c lays them out with.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from collectors.layout import TokenLayout
from collectors.native import (
    Helper,
    NativeUnavailable,  # watch catches it
    build,
    command,
)

MAGIC = 0x31534648
VERSION = 4
NSLOTS = 256
LAYOUT_BYTES = 8192
F_VALUES = 1  # frec.flags: the layout's values follow the bytes
L_SIGNED = 1  # lhead.flags: a value may start with "-" (TokenLayout.signed)
NO_LINES = 0xFFFFFFFF  # lhead.lines: the line count is not checked (TokenLayout.lines None)
MAX_DIGITS = 20  # of a value (collectors.layout.MAX_DIGITS, parse_uint's bound)
PATH_LEN = 224
HEADER_BYTES = 4096
SLOT_BYTES = 256
REC_MAGIC = 0x20444E52
PAD_MAGIC = 0x20444150
DEFAULT_CAPACITY = 16 << 20


class CStruct:
    """One of hftsampler.c's shared structs as (field, struct format) pairs, little-endian
    and without padding (every field of them is naturally aligned): ``off[field]`` is its
    offsetof, ``struct`` packs and unpacks the whole. tests/test_native_sampler.py checks
    each offset and size against the C compiler's."""

    def __init__(self, cname: str, fields: tuple[tuple[str, str], ...]) -> None:
        self.cname = cname
        self.fields = fields
        self.off: dict[str, int] = {}
        pos = 0
        for name, fmt in fields:
            self.off[name] = pos
            pos += struct.calcsize("<" + fmt)
        self.size = pos
        self.struct = struct.Struct("<" + "".join(f for _, f in fields))


HEADER = CStruct("header", (
    ("magic", "I"), ("version", "I"), ("period_ns", "Q"), ("table_gen", "Q"), ("stop", "Q"),
    ("capacity", "Q"), ("write_pos", "Q"), ("rounds", "Q"), ("late_rounds", "Q"),
    ("cpu_ns", "Q"), ("pid", "q"), ("state", "Q"), ("error", "256s"), ("reserve_pos", "Q"),
    ("dropped_rounds", "Q")))
SLOT = CStruct("slot", (("state", "I"), ("div", "I"), ("gen", "I"), ("err", "i"),
                        ("reads", "Q"), ("read_ns", "Q"), ("path", f"{PATH_LEN}s")))
REC = CStruct("rec", (("magic", "I"), ("len", "I"), ("round", "Q"), ("t_ns", "Q"),
                      ("nfiles", "I"), ("pad", "I")))
FREC = CStruct("frec", (("slot", "H"), ("flags", "H"), ("n", "i"), ("gen", "I"),
                        ("lgen", "I")))
LHEAD = CStruct("lhead", (("lgen", "I"), ("ntok", "I"), ("nvals", "I"), ("nnames", "I"),
                          ("heap_len", "I"), ("flags", "I"), ("lines", "I"), ("pad", "I")))
LREF = CStruct("lref", (("pos", "I"), ("len", "H"), ("off", "H")))
C_STRUCTS = (HEADER, SLOT, REC, FREC, LHEAD, LREF)
C_CONSTANTS = {"MAGIC": MAGIC, "VERSION": VERSION, "NSLOTS": NSLOTS, "PATH_LEN": PATH_LEN,
               "HEADER_BYTES": HEADER_BYTES, "REC_MAGIC": REC_MAGIC, "PAD_MAGIC": PAD_MAGIC,
               "LAYOUT_BYTES": LAYOUT_BYTES, "F_VALUES": F_VALUES, "L_SIGNED": L_SIGNED,
               "MAX_DIGITS": MAX_DIGITS, "NO_LINES": NO_LINES}

_H = HEADER.off
_H_PERIOD, _H_TABLE_GEN, _H_STOP, _H_CAP = _H["period_ns"], _H["table_gen"], _H["stop"], \
    _H["capacity"]
_H_WPOS, _H_ROUNDS, _H_LATE, _H_CPU = _H["write_pos"], _H["rounds"], _H["late_rounds"], \
    _H["cpu_ns"]
_H_PID, _H_STATE, _H_ERROR = _H["pid"], _H["state"], _H["error"]
_H_RESERVE, _H_DROPPED = _H["reserve_pos"], _H["dropped_rounds"]
_ERROR_LEN = struct.calcsize("256s")
_REC = REC.struct  # magic, len, round, t_ns, nfiles, pad
_FREC = FREC.struct  # slot, flags, n, gen, lgen
_LHEAD = LHEAD.struct  # lgen, ntok, nvals, nnames, heap_len, flags, lines, pad
_LREF = LREF.struct  # pos, len, off
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_SLOT_HEAD = struct.Struct("<" + "".join(f for n, f in SLOT.fields if n != "path"))
_S = SLOT.off

SOURCE = Path(__file__).with_name("hftsampler.c")


def build_helper(source: Path = SOURCE, out_dir: Path | None = None) -> Helper:
    """The compiled helper for ``source`` (collectors/native.py builds and caches it, and
    starts it through its checked cache directory: :func:`collectors.native.command`). Raises :class:`NativeUnavailable` (not x86-64, no compiler, failed build, a cache
    directory or cached binary that someone else could have written)."""
    # The reader's side of the shared ring relies on x86-64's ordered loads and stores
    # (Python has no fences).
    return build(source, "hftsampler", "native sampler", out_dir,
                 machines=("x86_64", "amd64"), machines_why="x86-64")


class Feed:
    """The shared file, its slot table and the ring reader; starts and stops the helper."""

    def __init__(self, period_ns: int, capacity: int = DEFAULT_CAPACITY,
                 helper: Helper | Path | None = None, shm_dir: str | None = None) -> None:
        self._own_helper = helper is None
        self.helper = helper or build_helper()  # a Path: a test's stand-in, run as it is
        self.capacity = min(1 << 30, max(1 << 16, capacity)) & ~7  # record lengths are u32
        d = shm_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        fd, path = tempfile.mkstemp(prefix=f"hftagent-feed-{os.getpid()}-", dir=d)
        self.path = path
        try:
            # allocated now: a sparse file on a full tmpfs would SIGBUS watch at a write
            os.posix_fallocate(fd, 0, HEADER_BYTES + NSLOTS * (SLOT_BYTES + LAYOUT_BYTES)
                               + self.capacity)
            self.mm = mmap.mmap(fd, 0)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            raise NativeUnavailable(f"cannot create the shared file in {d}: "
                                    f"{exc.strerror}") from None
        os.close(fd)
        struct.pack_into("<IIQ", self.mm, _H["magic"], MAGIC, VERSION, int(period_ns))
        _U64.pack_into(self.mm, _H_CAP, self.capacity)
        self._lbase = HEADER_BYTES + NSLOTS * SLOT_BYTES
        self._base = self._lbase + NSLOTS * LAYOUT_BYTES
        self._layouts: dict[int, tuple[TokenLayout, int]] = {}  # slot → (layout, lgen)
        self._lgen = 0
        self._unpack: dict[int, struct.Struct] = {}  # nvals → "<nd"
        self._free = list(range(NSLOTS - 1, -1, -1))
        self._slots: dict[int, Slot] = {}  # index → slot registered there
        self._gen = [0] * NSLOTS
        self._table_gen = 0
        self.rpos = 0
        self.proc: subprocess.Popen | None = None
        self.overruns = 0  # times the reader fell a whole ring behind (rounds lost)
        self.corrupt = 0  # records that failed the framing checks (never expected)

    def set_period(self, period_ns: int) -> None:
        """The helper's round period: read when it starts and again after every round (the
        next wait is the new period; an aligned 8-byte store, which the helper's load sees
        whole)."""
        _U64.pack_into(self.mm, _H_PERIOD, int(period_ns))

    def period_ns(self) -> int:
        return _U64.unpack_from(self.mm, _H_PERIOD)[0]

    # -- the slot table ----------------------------------------------------------------------
    def register(self, path, div: int = 1, owner: str | None = None) -> Slot:
        """Have the helper read ``path`` on rounds where ``round % div == 0`` (from its next
        table check on). A full table or a path longer than :data:`PATH_LEN` gives a slot
        with ``index`` -2: the helper never reads it (the caller reads it live)."""
        p = os.fsencode(path)
        slot = Slot(os.fsdecode(p), max(1, div), owner)
        if not self._free or len(p) >= PATH_LEN:
            return slot
        i = self._free.pop()
        self._gen[i] = (self._gen[i] + 1) & 0xFFFFFFFF
        off = HEADER_BYTES + i * SLOT_BYTES
        self.mm[off + _S["path"]:off + _S["path"] + PATH_LEN] = p.ljust(PATH_LEN, b"\0")
        _SLOT_HEAD.pack_into(self.mm, off, 0, slot.div, self._gen[i], 0, 0, 0)
        _U32.pack_into(self.mm, off + _S["state"], 1)  # published last: the helper opens it
        self._clear_layout(i)
        slot.index, slot.gen = i, self._gen[i]
        self._slots[i] = slot
        self._bump()
        return slot

    def release(self, slot: Slot) -> None:
        """The helper stops reading ``slot``'s file (its index is free again)."""
        i = slot.index
        if i < 0 or self._slots.get(i) is not slot or self.mm is None:
            return
        _U32.pack_into(self.mm, HEADER_BYTES + i * SLOT_BYTES + _S["state"], 0)
        self._clear_layout(i)
        del self._slots[i]
        self._free.append(i)
        slot.index = -1
        self._bump()

    def _clear_layout(self, i: int) -> None:
        if self._layouts.pop(i, None) is not None:
            _U64.pack_into(self.mm, self._lbase + i * LAYOUT_BYTES, 0)  # lgen (and ntok) 0

    def set_layout(self, slot: Slot, layout: TokenLayout) -> bool:
        """Have the helper extract ``layout``'s values from ``slot``'s reads (from its next
        table check on). False when it cannot: no slot, or the layout does not fit
        :data:`LAYOUT_BYTES` (remembered: the file is replayed from its bytes)."""
        i = slot.index
        if i < 0 or self._slots.get(i) is not slot:
            return False
        cur = self._layouts.get(i)
        if cur is not None and cur[0] is layout:
            return cur[1] != 0
        vals = [(p, pre) for p, pre in zip(layout.val_pos, layout.prefixes)]
        names = list(zip(layout.name_pos, layout.names))
        size = _LHEAD.size + _LREF.size * (len(vals) + len(names)) + \
            sum(len(b) for _, b in vals + names)
        if not vals or size > LAYOUT_BYTES or any(p >= layout.n for p, _ in vals + names) or \
                (layout.lines is not None and not 0 <= layout.lines < NO_LINES):
            # Not for the helper (a big box's /proc/interrupts): remembered, so that this
            # layout is not packed again on every row; the file is replayed from its bytes.
            self._clear_layout(i)
            self._layouts[i] = (layout, 0)
            self._bump()
            return False
        heap = bytearray()
        refs = []
        for pos, b in vals + names:
            refs.append(_LREF.pack(pos, len(b), len(heap)))
            heap += b
        body = b"".join(refs) + bytes(heap)
        off = self._lbase + i * LAYOUT_BYTES
        self._lgen = self._lgen % 0xFFFFFFFF + 1  # never 0 (0: no layout)
        _U32.pack_into(self.mm, off + LHEAD.off["lgen"], 0)  # first: a copy in progress is torn
        self.mm[off + _LHEAD.size:off + _LHEAD.size + len(body)] = body
        _LHEAD.pack_into(self.mm, off, 0, layout.n, len(vals), len(names), len(heap),
                         L_SIGNED if layout.signed else 0,
                         NO_LINES if layout.lines is None else layout.lines, 0)
        _U32.pack_into(self.mm, off + LHEAD.off["lgen"], self._lgen)  # published last
        self._layouts[i] = (layout, self._lgen)
        self._bump()
        return True

    def registered(self) -> list[Slot]:
        """The slots registered now."""
        return list(self._slots.values())

    def layout_of(self, slot: Slot) -> tuple[TokenLayout, bool] | None:
        """The layout last handed over for ``slot`` and whether the helper could take it."""
        cur = self._layouts.get(slot.index) if slot.index >= 0 else None
        return None if cur is None else (cur[0], cur[1] != 0)

    # -- a recorded round --------------------------------------------------------------------
    def read(self, slot: Slot, files: dict, buf: bytes) -> bytes | OSError | None:
        """``slot``'s bytes in a round (``files`` and ``buf`` from :meth:`read_rounds`); the
        helper's read error as the OSError a live read would raise; None when the round does
        not have them (not read that round, or read under an earlier registration)."""
        hit = files.get(slot.index) if slot.index >= 0 else None
        if hit is None or hit[0] != slot.gen:
            return None
        n = hit[2]
        if n < 0:
            return OSError(-n, os.strerror(-n), slot.path)
        return buf[hit[1]:hit[1] + n]

    def values(self, slot: Slot, layout: TokenLayout, files: dict, buf: bytes
               ) -> tuple[float, ...] | None:
        """``layout``'s values as the helper extracted them from ``slot``'s read in a round;
        None when the read came without them (not read, an error, a read that did not match,
        another layout or one the helper could not take)."""
        i = slot.index
        hit = files.get(i) if i >= 0 else None
        if hit is None:
            return None
        have = self._layouts.get(i)
        k = len(layout.keys)
        if have is None or have[0] is not layout or not have[1] or hit[0] != slot.gen or \
                hit[4] != have[1] or hit[5] != k:
            return None
        u = self._unpack.get(k)
        if u is None:
            u = self._unpack[k] = struct.Struct(f"<{k}d")
        return u.unpack_from(buf, hit[3])

    def _bump(self) -> None:
        self._table_gen += 1
        _U64.pack_into(self.mm, _H_TABLE_GEN, self._table_gen)

    # -- helper ------------------------------------------------------------------------------
    def start(self, cpus: list[int] | None = None) -> None:
        """Start the helper and wait until it runs; then remove the shared file's name (both
        sides have it mapped: nothing is left in /dev/shm whatever happens next). Call it from
        the thread that stays alive for the run (PR_SET_PDEATHSIG follows the forking
        thread; the lifeline pipe covers the rest: collectors/native.py). Its own session: a
        terminal's Ctrl-C or a service stop reaches watch, which stops it through the stop
        flag."""
        arg = ",".join(str(c) for c in cpus) if cpus else "-"
        try:
            # argv ends with PARENT_PID WATCH_FD (hftsampler.c's usage)
            argv, fds = command(self.helper, self.path, arg)
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         close_fds=True, pass_fds=fds, start_new_session=True)
        except OSError as exc:
            raise NativeUnavailable(f"cannot start the native sampler: {exc.strerror}") \
                from None
        deadline = time.monotonic() + 5
        while self.state() == 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                reason = self.exit_reason()
                self.stop()
                raise NativeUnavailable(f"native sampler did not start: {reason}")
            time.sleep(0.002)
        if self.state() == 3:
            err = self.error()
            self.stop()
            raise NativeUnavailable(f"native sampler failed: {err}")
        self._unlink()

    def _unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def state(self) -> int:
        return _U64.unpack_from(self.mm, _H_STATE)[0]

    def rounds(self) -> int:
        """The rounds the helper has recorded so far (0 once the shared file is closed)."""
        return _U64.unpack_from(self.mm, _H_ROUNDS)[0] if self.mm is not None else 0

    def cpu_ns(self) -> int:
        """The helper's CPU time as it last wrote it (the last figure once the file is
        closed): one read of the header, for the CPU budget's refills."""
        if self.mm is None:
            return self._last_stats["cpu_ns"]
        return _U64.unpack_from(self.mm, _H_CPU)[0]

    def unread(self) -> bool:
        """Whether the helper has written rounds that :meth:`read_rounds` has not read."""
        return self.mm is not None and _U64.unpack_from(self.mm, _H_WPOS)[0] != self.rpos

    def ask_round(self) -> bool:
        """Ask the helper for a round now (SIGUSR1: hftsampler.c ends its wait, makes the
        round and the next one a period after it). False where it is not asked: not the
        built helper (a test's stand-in, a path, would die of the signal), not running, or no round
        recorded yet (the helper blocks the signal before its first round)."""
        if not isinstance(self.helper, Helper) or self.proc is None or not self.rounds():
            return False
        try:
            self.proc.send_signal(signal.SIGUSR1)  # (none once it is reaped: never another's)
        except OSError:
            return False
        return self.proc.returncode is None

    def error(self) -> str:
        raw = bytes(self.mm[_H_ERROR:_H_ERROR + _ERROR_LEN])
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_reason(self) -> str:
        if self.proc is None:
            return "not started"
        rc = self.proc.poll()
        if rc is None:
            return "running"
        err = self.error()
        if not err and self.proc.stderr is not None:
            try:
                err = self.proc.stderr.read().decode(errors="replace").strip()
            except (OSError, ValueError):
                err = ""
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        return f"{how}{': ' + err if err else ''}"

    def stats(self) -> dict:
        """The helper's counters (the last ones read once the shared file is closed)."""
        mm = self.mm
        if mm is None:
            return dict(self._last_stats)
        self._last_stats = {"rounds": _U64.unpack_from(mm, _H_ROUNDS)[0],
                "late_rounds": _U64.unpack_from(mm, _H_LATE)[0],
                "cpu_ns": _U64.unpack_from(mm, _H_CPU)[0],
                "pid": struct.unpack_from("<q", mm, _H_PID)[0],
                "overruns": self.overruns,
                "dropped_rounds": _U64.unpack_from(mm, _H_DROPPED)[0]}
        return dict(self._last_stats)

    _last_stats: dict = {"rounds": 0, "late_rounds": 0, "cpu_ns": 0, "pid": 0, "overruns": 0,
                         "dropped_rounds": 0}

    def slot_costs(self) -> dict[str, tuple[int, int]]:
        """owner → (reads, ns inside open/pread) over the slots in use."""
        out: dict[str, list[int]] = {}
        for i, f in self._slots.items():
            _, _, _, _, reads, ns = _SLOT_HEAD.unpack_from(self.mm, HEADER_BYTES + i * SLOT_BYTES)
            acc = out.setdefault(f.owner or "?", [0, 0])
            acc[0] += reads
            acc[1] += ns
        return {k: (v[0], v[1]) for k, v in out.items()}

    def stop(self) -> None:
        if getattr(self, "mm", None) is None:
            return
        _U64.pack_into(self.mm, _H_STOP, 1)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # stuck (a read that never returns): SIGKILL
                self.proc.wait()
            if self.proc.stderr is not None and not self.proc.stderr.closed:
                self.proc.stderr.close()

    def kill(self) -> None:
        """Stop a helper that stopped making rounds (SIGKILL; its reason stays readable)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.stop()
        if getattr(self, "mm", None) is not None:
            self.stats()  # keep the final counters
            self.mm.close()
            self.mm = None
        self._unlink()
        if getattr(self, "_own_helper", False) and isinstance(self.helper, Helper):
            self.helper.close()

    # -- reading rounds ----------------------------------------------------------------------
    def read_rounds(self) -> tuple[bytes, list[tuple[int, int, dict]]]:
        """The rounds recorded since the last call: (buffer, [(round, t_ns, {slot: (gen,
        offset in buffer, n, offset of the layout values or -1, lgen, nvals)})]); n < 0 is
        -errno. One copy of the new ring bytes, then offsets into it. A reader a whole ring
        behind loses those rounds (``overruns``)."""
        mm, cap, base = self.mm, self.capacity, self._base
        w = _U64.unpack_from(mm, _H_WPOS)[0]
        r = self.rpos
        if w == r:
            return b"", []
        if w - r > cap:
            self.overruns += 1
            self.rpos = w
            return b"", []
        a, b = r % cap, w % cap
        if a < b:
            buf = mm[base + a:base + b]
        else:  # wrapped: the tail, then the head
            buf = mm[base + a:base + cap] + mm[base:base + b]
        # The helper stores reserve_pos (where the record it is copying will end) before it
        # touches a byte: past r + cap, some of what was just copied may be newer bytes.
        if _U64.unpack_from(mm, _H_RESERVE)[0] - r > cap:
            self.overruns += 1
            self.rpos = _U64.unpack_from(mm, _H_WPOS)[0]
            return b"", []
        self.rpos = w
        out = []
        pos, end = 0, len(buf)
        unpack_rec, unpack_f = _REC.unpack_from, _FREC.unpack_from
        rsize, fsize = _REC.size, _FREC.size
        while pos + 8 <= end:
            magic, ln = struct.unpack_from("<II", buf, pos)
            if magic == PAD_MAGIC and ln >= 8:
                pos += ln
                continue
            if magic != REC_MAGIC or ln < rsize or pos + ln > end:
                self.corrupt += 1  # cannot happen with a well-behaved writer; never misread
                break
            _, _, rnd, t_ns, nfiles, _ = unpack_rec(buf, pos)
            files = {}
            p, rec_end = pos + rsize, pos + ln
            for _ in range(nfiles):
                if p + fsize > rec_end:
                    break
                slot, flags, n, gen, lgen = unpack_f(buf, p)
                p += fsize
                body = (n + 7) & ~7 if n > 0 else 0
                if p + body > rec_end:
                    break
                if flags & F_VALUES:  # flags >> 1 doubles follow the bytes
                    nv = 8 * (flags >> 1)
                    if p + body + nv > rec_end:
                        break
                    files[slot] = (gen, p, n, p + body, lgen, nv >> 3)
                    p += body + nv
                else:
                    files[slot] = (gen, p, n, -1, 0, 0)
                    p += body
            out.append((rnd, t_ns, files))
            pos += ln
        return buf, out


class Slot:
    """A file registered with the helper: its path, ``index`` in the slot table (-1 once
    released, -2 when it got none: never read by the helper), the slot's generation when
    registered (a round read under an earlier registration is not this file's), divisor and
    owner (the collector, for :meth:`Feed.slot_costs`)."""

    __slots__ = ("path", "index", "gen", "div", "owner")

    def __init__(self, path: str, div: int, owner: str | None) -> None:
        self.path = path
        self.index = -2
        self.gen = 0
        self.div = div
        self.owner = owner

    def reads(self, feed: Feed) -> int:
        """How many times the helper has read it."""
        if self.index < 0 or feed.mm is None:
            return 0
        return _SLOT_HEAD.unpack_from(feed.mm, HEADER_BYTES + self.index * SLOT_BYTES)[4]
