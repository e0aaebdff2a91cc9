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
    with pytest.raises(AgentError, match="--plot .*missing-dir does not exist"):
        idle.plot(rows, str(tmp_path / "missing-dir" / "x.png"), "t")


def test_rounds_fit_the_budget():
    assert idle.rounds_for([0, 10**9], 10**6, 10.0, 200) == 9
    assert idle.rounds_for([0], 10**6, None, 50) == 50


def test_idle_gaps_options():
    from agent.probe import options
    kw = dict(model=None, builtin=None, signature=None, shape=None, input_data="random",
              variant="tflite", samples=None, duration=None, warmup=200, rate=None,
              threshold_us=5000.0, calib=None, intra=None, inter=None, cpus=None, sweep=None,
              batch="1")
    s, _ = options.build(**kw, idle_gaps="0,1ms,1s")
    assert s.idle_gaps_ns == [0, 10**6, 10**9] and s.samples == 200 and s.duration_s == 60.0
    with pytest.raises(AgentError, match="--idle-gaps"):
        options.build(**{**kw, "rate": 100.0}, idle_gaps="0,1ms")
    with pytest.raises(AgentError, match="--idle-gaps"):
        options.build(**kw, idle_gaps="")


@pytest.mark.slow
@pytest.mark.tf
def test_probe_idle_gaps_prints_the_curve_and_writes_the_plot(tmp_path):
    import os
    import subprocess
    import sys
    png = tmp_path / "gaps.png"
    p = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", "probe",
                        "--variant", "tflite", "--idle-gaps", "0,1ms,20ms", "--samples", "30",
                        "--plot", str(png), "--no-history", "--json"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert p.returncode == 0, p.stderr
    import json
    (run,) = json.loads(p.stdout)["runs"]
    assert run["mode"] == "idle-gaps"
    assert [r["gap_ns"] for r in run["idle_gaps"]] == [0, 10**6, 2 * 10**7]
    assert all(r["latency"]["count"] == 30 for r in run["idle_gaps"])
    assert run["idle_gaps"][0]["p50_ratio"] == 1.0
    assert png.read_bytes()[:4] == b"\x89PNG"
