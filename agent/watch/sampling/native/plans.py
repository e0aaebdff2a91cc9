"""Replay plans: how a recorded round of the native reader becomes one hot source's row.

One :class:`ReplayPlan` per hot source (agent/watch/sampling/sources/): every track of the
source is registered with the helper (:meth:`ReplayPlan.sync`: its path, on the rounds of the
source's period times the track's ``every``), and each recorded round is then either

- a values row: every file of the round came with the values of its layout, which the helper
  extracted in C (:meth:`ReplayPlan.values`); the sampler appends them without calling the
  source (:meth:`agent.watch.ring.SignalRing.append_seqs`). The source's row counter still
  moves (irq's periodic full parse, sched's stat and status cadence count rows);
- or a parsed row: the round's bytes (:meth:`ReplayPlan.reads`) go through the source's
  :meth:`~agent.watch.sampling.sources.base.HotSource.replay`, as the Python sampler's own
  reads would; afterwards (:meth:`ReplayPlan.learn`) every file whose values did not come gets
  a layout built from its bytes with the source's layout builder (the collector module's
  ``layout``), handed to the helper for the rounds to come.

The layouts here are of the whole read: a source that drops part of a file before splitting
(cpu's /proc/stat without its "intr" line) keeps its own layout of what it splits. So when
only the dropped part changes (the kernel allocates IRQ numbers), the source's layout still
fits, the helper's no longer does, and the next parsed row rebuilds the helper's from the
bytes. A layout the helper cannot take (too big: a big box's /proc/interrupts) is not offered
again until the source's own layout of that file changes.
"""

from __future__ import annotations

from agent.watch.sampling.native.feed import Feed, Slot
from agent.watch.sampling.sources.base import HotSource
from collectors.layout import TokenLayout


class _Reg:
    """One track registered with the helper."""

    __slots__ = ("key", "path", "every", "slot", "layout", "stale", "seen")

    def __init__(self, key: str, path: str, every: int, slot: Slot) -> None:
        self.key = key
        self.path = path
        self.every = every
        self.slot = slot
        self.layout: TokenLayout | None = None  # the layout handed to the helper
        # no values from the helper for this file (it could not take the layout, or none
        # could be built) until the source's own layout of it is another than ``seen``
        self.stale = False
        self.seen: TokenLayout | None = None


class ReplayPlan:
    """The native replay of one hot source (module docstring)."""

    def __init__(self, source: HotSource, feed: Feed, div: int) -> None:
        self.source = source
        self.feed = feed
        self.div = div
        self.regs: dict[str, _Reg] = {}
        self.order: tuple[_Reg, ...] = ()
        self.gen = -1  # the source's track generation the registrations follow
        self._keys: dict[tuple, tuple[str, ...]] = {}  # layouts of a values row → its keys

    def sync(self) -> None:
        """Register the source's tracks with the helper, release the ones it dropped."""
        src = self.source
        src.prepare()
        if src.gen == self.gen:
            return
        tracks, feed = src.tracks, self.feed
        for key, reg in list(self.regs.items()):
            t = tracks.get(key)
            if t is None or str(t.path) != reg.path or t.every != reg.every:
                feed.release(reg.slot)
                del self.regs[key]
        for key, t in tracks.items():
            if key not in self.regs:
                self.regs[key] = _Reg(key, str(t.path), t.every,
                                      feed.register(t.path, self.div * t.every, src.name))
        self.order = tuple(self.regs[k] for k in tracks)
        self.gen = src.gen
        if len(self._keys) > 16:  # rows of layouts long gone
            self._keys.clear()

    def release(self) -> None:
        for reg in self.regs.values():
            self.feed.release(reg.slot)
        self.regs.clear()
        self.order = ()
        self.gen = -1

    def values(self, files: dict, buf: bytes) -> tuple[tuple[str, ...], tuple] | None:
        """(keys, values) of a round whose every file came with its layout's values; None
        otherwise (a file read every row missing from the round, or without values)."""
        values = self.feed.values
        vals: tuple = ()
        lays = []
        for reg in self.order:
            if reg.slot.index not in files:
                if reg.every == 1:
                    return None
                continue  # not due this round (sched's stat and status)
            lay = reg.layout
            if lay is None or reg.stale:
                return None
            v = values(reg.slot, lay, files, buf)
            if v is None:
                return None
            vals += v
            lays.append(lay)
        if not lays:
            return None
        k = tuple(lays)
        keys = self._keys.get(k)
        if keys is None:
            keys = self._keys[k] = tuple(key for lay in lays for key in lay.keys)
        return keys, vals

    def reads(self, files: dict, buf: bytes) -> dict:
        """The round's reads of the source's tracks, ``{key: bytes | OSError}``; a track
        the helper has no slot for is read live now."""
        out: dict = {}
        read = self.feed.read
        tracks = self.source.tracks
        for reg in self.order:
            if reg.slot.index == -2:
                t = tracks.get(reg.key)
                if t is not None:
                    try:
                        out[reg.key] = t.hf.read()
                    except OSError as exc:
                        out[reg.key] = exc
                continue
            got = read(reg.slot, files, buf)
            if got is not None:
                out[reg.key] = got
        return out

    def learn(self, files: dict, buf: bytes) -> None:
        """After a row parsed from this round's bytes: a new layout for each file whose
        values did not come because its layout no longer fits (module docstring)."""
        feed, src = self.feed, self.source
        for reg in self.order:
            i = reg.slot.index
            hit = files.get(i) if i >= 0 else None
            if hit is None or hit[0] != reg.slot.gen or hit[2] < 0:
                continue  # not read this round, or an error: nothing to learn from
            lay = reg.layout
            if lay is not None and not reg.stale and \
                    feed.values(reg.slot, lay, files, buf) is not None:
                continue
            t = src.tracks.get(reg.key)
            if t is None or t.build is None:
                continue  # values a layout cannot give (cpu's kHz → Hz)
            if reg.stale and t.layout is reg.seen:
                continue
            data = buf[hit[1]:hit[1] + hit[2]]
            if lay is not None and not reg.stale and lay.values(data) is not None:
                continue  # it fits: handed over after this round was read
            try:
                new = src.layout(reg.key, data)
            except ValueError:
                new = None
            reg.seen = t.layout
            if new is None:
                reg.layout, reg.stale = None, True
                continue
            reg.layout = new
            reg.stale = not feed.set_layout(reg.slot, new)
