"""probe --idle-gaps: the gap loop on virtual time, the option parser, the summary and plot."""

from __future__ import annotations

import numpy as np
import pytest

from agent.errors import AgentError
from agent.probe import idle
from agent.probe.harness import gap_loop


class VirtualHost:
    """A clock that sleep() advances, and a call whose cost grows with the idle time before it
    (100 µs warm, +1 µs per idle ms, capped at +400 µs): a deterministic cold-after-quiet curve."""

    def __init__(self) -> None:
        self.now = 1_000_000_000
        self.last_end = self.now
        self.calls = 0

    def clock(self) -> int:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += int(s * 1e9) + 50_000  # every sleep overshoots by 50 µs

    def fn(self) -> None:
        idle_ms = (self.now - self.last_end) / 1e6
        self.now += 100_000 + int(min(idle_ms, 400) * 1_000)
        self.last_end = self.now
        self.calls += 1


def test_gap_loop_interleaves_and_records_actual_gaps():
    v = VirtualHost()
    gaps = [0, 1_000_000, 100_000_000]
    out = gap_loop(v.fn, gaps, 20, sleep=v.sleep, clock=v.clock)
    assert sorted(out) == gaps and v.calls == 1 + 20 * 3  # one throw-away call
    for g, a in out.items():
        assert a.shape == (3, 20)
        assert (a[0] >= g).all()                       # never shorter than asked
        if g:
            assert (a[0] == g + 50_000).all()          # the overshoot is measured, not hidden
    lat = {g: int(np.median(a[2] - a[1])) for g, a in out.items()}
    assert lat[0] == 100_000 and lat[1_000_000] == 101_050 and lat[100_000_000] == 200_050


def test_gap_loop_deadline_stops_after_a_round():
    v = VirtualHost()
    out = gap_loop(v.fn, [0, 10_000_000], 1000, sleep=v.sleep, clock=v.clock,
                   deadline_ns=v.now + 50_000_000)
    n = out[0].shape[1]
    assert 1 <= n < 1000 and out[10_000_000].shape[1] == n


@pytest.mark.parametrize("bad", [[], [-1], [0, -5]])
def test_gap_loop_rejects_bad_gaps(bad):
    with pytest.raises(ValueError):
        gap_loop(lambda: None, bad, 1)


def test_parse_gaps():
    assert idle.parse_gaps("0,1ms,10ms,100ms,1s") == [0, 10**6, 10**7, 10**8, 10**9]
    assert idle.parse_gaps("500us, 2") == [500_000, 2_000_000]   # bare numbers are ms
    assert idle.parse_gaps("1s,1000ms") == [10**9]


@pytest.mark.parametrize("bad", ["", " ", "1h", "-1ms", "٣ms", "1e3", "nan", "10,,20",
                                 "61s", ",".join(str(i) for i in range(20))])
def test_parse_gaps_rejects(bad):
    with pytest.raises(AgentError):
        idle.parse_gaps(bad)


def test_summary_ratios_and_headline(tmp_path):
    v = VirtualHost()
    out = gap_loop(v.fn, [0, 1_000_000, 100_000_000], 30, sleep=v.sleep, clock=v.clock)
    rows = idle.summarize(out)
    assert [r["gap_ns"] for r in rows] == [0, 1_000_000, 100_000_000]
    assert rows[0]["p50_ratio"] == 1.0
    assert rows[2]["p50_ratio"] == pytest.approx(2.0005, rel=1e-3)
    assert "100 ms idle is 2.00× slower at P50" in idle.headline(rows)
    png = tmp_path / "gaps.png"
    idle.plot(rows, str(png), "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_unwritable_path_is_a_clean_error(tmp_path):
    rows = idle.summarize({0: np.array([[0], [0], [1000]]), 10**6: np.array([[10**6], [0], [2000]])})
    with pytest.raises(AgentError, match="cannot write the plot"):
        idle.plot(rows, str(tmp_path / "missing-dir" / "x.png"), "t")


def test_rounds_fit_the_budget():
    assert idle.rounds_for([0, 10**9], 10**6, 10.0, 200) == 9
    assert idle.rounds_for([0], 10**6, None, 50) == 50
