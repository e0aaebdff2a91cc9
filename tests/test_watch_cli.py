"""`hftagent watch`'s command line (issues #27-#29): options parsed once into a WatchConfig
(agent/watch/options.py), durations converted to ns at parsing and nowhere else, the CPUs
decided by the one target rule, --rate auto by default, an honest load figure, history, and
the --attach options. Parsing and validation only: no session runs here."""

from __future__ import annotations

import numpy as np

from agent.client import FIELDS

F = {name: i for i, name in enumerate(FIELDS)}


def _recs(lat_ns: list[int]) -> tuple[np.ndarray, np.ndarray]:
    recs = np.zeros((len(lat_ns), len(FIELDS)), dtype=np.int64)
    for i, lat in enumerate(lat_ns):
        recs[i, F["seq"]] = i
        recs[i, F["start_ns"]] = 10**9 * (i + 1)
        recs[i, F["end_ns"]] = 10**9 * (i + 1) + lat
        recs[i, F["tid"]] = 1
    return recs, recs[:, F["end_ns"]] - recs[:, F["start_ns"]]


def test_the_detector_takes_its_threshold_in_ns():
    # --threshold-us 2500.5 is 2,500,500 ns once, at parsing: the detector does not convert
    from agent.watch.detect import SpikeDetector
    d = SpikeDetector(2_500_500, 3.0, 10**9, queueing=False, clock=lambda: 0)
    recs, lat = _recs([2_500_400, 2_500_500, 2_500_600])
    assert [sp.seq for sp, _ in d.scan(recs, lat)] == [2]


def test_the_flight_recorder_takes_its_length_in_ns(tmp_path):
    from agent.watch.attribution import Spike
    from agent.watch.flight import FlightRecorder
    fr = FlightRecorder(1_000_000, str(tmp_path / "fl"), 1.0, 0, lambda r: None, [])
    fr.offer(Spike(1, 0, 999_999, 1, 1, 0), {})
    fr.offer(Spike(2, 0, 1_000_000, 1, 1, 0), {})
    assert [sp.seq for sp, _ in fr.pending] == [2]
