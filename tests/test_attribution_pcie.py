"""agent/watch/attribution/pcie.py: a PCIe device's AER error counters rising in a spike's
window name ``pcie_errors``, with the counter and its increase; counters that stay flat, and
counters that are not AER error totals, name nothing. Synthetic rings through the Attributor,
as in tests/test_watch_attribution.py."""

from __future__ import annotations

import numpy as np
import pytest

from agent.watch.attribution import Attributor
from tests.test_watch_attribution import at_spike, quiet_rings, spike, trace

DEV = "0000:18:00.0"


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def _pcie(rng, **signals):
    quiet = {f"pcie.{DEV}.aer_correctable_total": lambda i, g: 0.0,
             f"pcie.{DEV}.aer_fatal_total": lambda i, g: 0.0,
             f"pcie.{DEV}.width": lambda i, g: 16.0}
    quiet.update(signals)
    rings = quiet_rings(rng)
    rings["pcie"] = trace(rng, quiet, "pcie")
    return Attributor(rings, [1]).attribute(spike())


def test_an_aer_error_in_the_window_is_named_with_its_counter(rng):
    name = f"pcie.{DEV}.aer_correctable_total"
    a = _pcie(rng, **{name: at_spike(lambda i, g: 0.0, 3.0)})
    pc = [c for c in a.causes if c.cause == "pcie_errors"]
    assert len(pc) == 1
    assert pc[0].evidence == {name: 3.0} and f"{name}: +3" in pc[0].detail
    assert pc[0].strength == pytest.approx(0.6)


def test_flat_aer_counters_and_other_signals_name_nothing(rng):
    # a width change or a non-AER total in the window is no AER error
    a = _pcie(rng, **{f"pcie.{DEV}.width": at_spike(lambda i, g: 16.0, 8.0),
                      f"pcie.{DEV}.replay_total": at_spike(lambda i, g: 0.0, 5.0)})
    assert "pcie_errors" not in [c.cause for c in a.causes]
