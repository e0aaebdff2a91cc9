"""agent/watch/attribution/numa.py: remote NUMA allocations (a node's numa_miss /
other_node / numa_foreign, or /proc/vmstat's host-wide numa_miss) rising well over their
baseline in a spike's window name ``numa_remote``; the usual trickle names nothing. Synthetic
rings through the Attributor, as in tests/test_watch_attribution.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.watch.attribution import Attributor
from agent.watch.attribution.numa import MAX, SLOPE
from tests.test_watch_attribution import at_spike, quiet_rings, spike, trace


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def trickle(i, g):
    return float(g.integers(0, 3))


def _causes(rng, numa: dict, **memory) -> dict:
    rings = quiet_rings(rng, **{f"memory__{k}": f for k, f in memory.items()})
    base = {"numa.0.numa_miss": trickle, "numa.0.other_node": trickle,
            "numa.1.numa_foreign": trickle}
    base.update(numa)
    rings["numa"] = trace(rng, base, "numa")
    return {c.cause: c for c in Attributor(rings, [1]).attribute(spike()).causes}


def test_a_nodes_remote_allocations_in_the_window_are_named(rng):
    c = _causes(rng, {"numa.0.other_node": at_spike(trickle, 40.0)})["numa_remote"]
    assert list(c.evidence) == ["numa.0.other_node"]
    assert 0 < c.strength <= MAX
    excess = c.evidence["numa.0.other_node"]["excess"]
    assert excess >= 10 and c.strength == pytest.approx(min(MAX, SLOPE * math.log10(excess)))


def test_the_host_wide_vmstat_counter_is_read_too(rng):
    c = _causes(rng, {}, **{"mem.all.numa_miss": at_spike(trickle, 5000.0)})["numa_remote"]
    assert "mem.all.numa_miss" in c.evidence and c.strength == pytest.approx(MAX)


def test_the_usual_trickle_names_nothing(rng):
    assert "numa_remote" not in _causes(rng, {}, **{"mem.all.numa_miss": trickle})
