"""The flight recorder of ``hftagent watch`` (``--flight-us``, ``--flight-dir``).

A spike of at least ``flight_ns`` (``--flight-us``) is held until the sampler has rows up to ``window_s`` past
its end (or the run ends, or its source died); then every collector ring's rows in
[start − ``window_s``, end + ``window_s``] and the latency samples overlapping that window are
written to ``flight_dir/spike-<seq>-<end_ns>.json`` (a new file under a random name, renamed
into place: :func:`agent.watch.output.write_new`), and a ``{"flight_record": path}`` line
goes to the spike log. A record that cannot be written (a full disk, the directory removed
under a running watch) is one warning per cause, not one per record; the run goes on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from agent.client import FIELDS
from agent.watch.attribution import Spike
from agent.watch.output import open_output_dir, write_new
from agent.watch.ring import LatencyRing

F = {name: i for i, name in enumerate(FIELDS)}


class FlightRecorder:
    """``note(record)``: writes a line to the spike log; ``warnings``: the session's list
    (a warning is added once per distinct text)."""

    def __init__(self, flight_ns: int | None, directory: str, window_s: float,
                 wall_off_ns: int, note: Callable[[dict], None], warnings: list[str]) -> None:
        self.flight_ns = flight_ns
        self.directory = directory
        self.window_ns = int(window_s * 1e9)
        self.wall_off_ns = wall_off_ns
        self.note = note
        self.warnings = warnings
        self.pending: list[tuple[Spike, dict]] = []  # (spike, its record), waiting for rows
        self.files: list[str] = []  # records written
        self._dfd = -1

    def open(self) -> None:
        """Open (create one level) the directory; a no-op without ``--flight-us``."""
        if self.flight_ns and self._dfd < 0:
            self._dfd = open_output_dir(self.directory, "--flight-dir")

    def close(self) -> None:
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1

    def offer(self, sp: Spike, rec: dict) -> None:
        """A logged spike: kept for a record when it is at least ``flight_ns``."""
        if self.flight_ns and sp.latency_ns >= self.flight_ns:
            self.pending.append((sp, rec))

    def step(self, latest_ns: int, final: bool, sampler, lat: LatencyRing) -> int:
        """Write the records whose "after" part is sampled (``latest_ns``: the sampler's
        newest row), or all of them when ``final`` (the run ends, the source died); the
        number still waiting (the caller pokes the sampler)."""
        keep = []
        for sp, rec in self.pending:
            if latest_ns < sp.end_ns + self.window_ns and not final:
                keep.append((sp, rec))
                continue
            self.dump(sp, rec, sampler, lat)
        self.pending = keep
        return len(keep)

    def dump(self, sp: Spike, rec: dict, sampler, lat: LatencyRing,
             window_ns: int | None = None) -> None:
        """Write the record of ``sp`` now (``sampler``: its ``lock`` and ``rings()``)."""
        w = self.window_ns if window_ns is None else window_ns
        d = Path(self.directory)
        if self._dfd < 0:  # (a session driven without start(): library use)
            self._dfd = open_output_dir(self.directory, "--flight-dir")
        t0, t1 = sp.start_ns - w, sp.end_ns + w
        with sampler.lock:
            rings = {r.name: r.dump(t0, t1) for r in sampler.rings()}
        rows = lat.last(lat.capacity)
        sel = (rows[:, F["end_ns"]] >= t0) & (rows[:, F["start_ns"]] <= t1)
        samples = {k: rows[sel, i].tolist() for k, i in F.items() if k not in ("seq2",)}
        out = {"spike": rec, "window_ns": [t0, t1], "wall_offset_ns": self.wall_off_ns,
               "samples": samples, "collectors": rings}
        path = d / f"spike-{sp.seq}-{sp.end_ns}.json"
        try:
            write_new(self._dfd, path.name, json.dumps(out).encode())
        except OSError as exc:
            msg = f"flight records not written to {d}: {exc.strerror}"  # once per cause
            if msg not in self.warnings:
                self.warnings.append(msg)
            return
        self.files.append(str(path))
        self.note({"time": rec["time"], "flight_record": str(path), "seq": sp.seq})
