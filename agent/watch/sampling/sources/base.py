"""The hot sources' common part: files kept open, read each round, turned into a row.

A :class:`HotSource` is a collector (``available``/``sample``/``close``, what
:class:`~agent.watch.sampling.python.Sampler` runs) whose signals are the values of /proc and
/sys files. It holds one :class:`Track` per file: the path (from the collector module's
``files()``), the collector module's parser and layout builder for it, how often it is read
(``every``: on one of every ``every`` rows), the descriptor kept open and the current token
layout. A row is :meth:`HotSource.row` of the reads of one round, ``{key: bytes}`` (an
``OSError`` in place of the bytes of a read that failed):

- the Python sampler: :meth:`sample` reads the tracks due this row with ``os.pread`` on the
  kept descriptors (collectors/host.py HotFile) and makes the row;
- the native sampler (agent/watch/sampling/native/): the C reader reads the same paths on the
  same cadence into its ring, and :meth:`replay` makes the row from a recorded round's bytes;
  its replay plan may instead take the row's values as the reader extracted them with each
  track's layout (:meth:`layout`). Neither changes what a row holds.

Each track's value path: the layout's values when the read has its shape (one ``split``, two
``itemgetter``), else the collector module's parser, then a new layout from the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from collectors.base import Availability
from collectors.host import Host, HotFile
from collectors.layout import TokenLayout


class Track:
    """One file a hot source reads. ``parse(data)`` → its signals (raises ParseError);
    ``build(data)`` → its token layout or None (None as ``build``: values a layout cannot
    give, such as kHz scaled to Hz); ``pre(data)``: bytes the Python path drops before
    either (``/proc/stat``'s "intr" line); ``every``: read on one row in ``every``;
    ``python_layout`` False: the Python path parses every read (the parser is the cheaper
    one: /proc/<pid>/status, ~55 tokens for two values), the layout is the C reader's."""

    __slots__ = ("key", "path", "every", "hf", "parse", "build", "pre", "layout",
                 "python_layout")

    def __init__(self, key: str, path: Path, hf: HotFile, parse: Callable[[bytes], dict],
                 build: Callable[[bytes], TokenLayout | None] | None, every: int = 1,
                 pre: Callable[[bytes], bytes] | None = None,
                 python_layout: bool = True) -> None:
        self.key = key
        self.path = path
        self.hf = hf
        self.parse = parse
        self.build = build
        self.every = max(1, every)
        self.pre = pre
        self.python_layout = python_layout and build is not None
        self.layout: TokenLayout | None = None


class HotSource:
    """A collector whose row is made from files read each round (module docstring)."""

    name = "hot"
    period_s = 0.0
    what = "source"  # for "cannot open" reasons: "/proc/stat: Permission denied"

    def __init__(self, host: Host) -> None:
        self.host = host
        self.tracks: dict[str, Track] = {}
        self.gen = 0  # bumped whenever a track comes or goes (the native plan follows)
        self.rows = 0  # rows made, by either sampler
        self.unsupported: dict[str, str] = {}
        self._opened = False

    # -- tracks ------------------------------------------------------------------------------
    def _add(self, key: str, path: Path, parse, build, every: int = 1, pre=None,
             python_layout: bool = True) -> Track:
        """Open ``path`` and track it (raises OSError as the open does)."""
        t = Track(key, path, self.host.open_hot(path), parse, build, every, pre, python_layout)
        self.tracks[key] = t
        self.gen += 1
        return t

    def _drop(self, key: str) -> None:
        t = self.tracks.pop(key, None)
        if t is not None:
            t.hf.close()
            self.gen += 1

    def open(self) -> None:
        """Open the tracks (each source's :meth:`_open_tracks`); a failed open closes those
        already opened and raises."""
        if self._opened:
            return
        try:
            self._open_tracks()
        except BaseException:
            self.close()
            raise
        self._opened = True

    def _open_tracks(self) -> None:
        raise NotImplementedError

    def prepare(self) -> None:
        """Bring the tracks up to date before a row (open them; sched attaches threads)."""
        if not self._opened:
            self.open()

    def available(self) -> Availability:
        try:
            self.open()
        except OSError as exc:
            return Availability.no(f"{self.what}: {exc.strerror}")
        return Availability.yes()

    # -- rows --------------------------------------------------------------------------------
    def sample(self) -> dict[str, float | None]:
        """One row, reading the tracks due now (the Python sampler)."""
        self.prepare()
        n = self.rows
        reads: dict[str, bytes | OSError] = {}
        for t in self.tracks.values():
            if t.every != 1 and n % t.every:
                continue
            try:
                reads[t.key] = t.hf.read()
            except OSError as exc:
                reads[t.key] = exc
        self.rows = n + 1
        return self.row(reads)

    def replay(self, reads: dict[str, bytes | OSError]) -> dict[str, float | None]:
        """One row from a recorded round's reads (the native sampler)."""
        self.rows += 1
        return self.row(reads)

    def row(self, reads: dict[str, bytes | OSError]) -> dict[str, float | None]:
        """The signals of one round's reads; a failed read raises its OSError."""
        tracks, values = self.tracks, self.values
        if len(reads) == 1:  # most sources read one file: its (fresh) dict is the row
            for key, data in reads.items():
                if isinstance(data, OSError):
                    raise data
                return values(tracks[key], data)  # type: ignore[return-value]
        out: dict[str, float | None] = {}
        for key, data in reads.items():
            if isinstance(data, OSError):
                raise data
            out.update(values(tracks[key], data))
        return out

    def values(self, t: Track, data: bytes) -> dict[str, float]:
        """A track's signals: its layout's values, else the parser's (and a new layout)."""
        if t.pre is not None:
            data = t.pre(data)
        lay = t.layout
        if lay is not None:
            v = lay.values(data)
            if v is not None:
                return v
        out = t.parse(data)
        if t.python_layout:
            t.layout = t.build(data)  # type: ignore[misc]
        return out

    def layout(self, key: str, data: bytes) -> TokenLayout | None:
        """The token layout of a whole read of track ``key`` (no ``pre``) or None; raises
        ValueError for bytes it cannot describe."""
        t = self.tracks.get(key)
        return t.build(data) if t is not None and t.build is not None else None

    def next_row_parses(self) -> bool:
        """Whether the next row must come from :meth:`row` (the native plan then makes no
        row from values): irq's periodic full parse."""
        return False

    def is_counter(self, name: str) -> bool:
        return True

    def close(self) -> None:
        for t in self.tracks.values():
            t.hf.close()
        if self.tracks:
            self.gen += 1
        self.tracks.clear()
        self._opened = False
