"""Plots a person reads at a glance and pipes that close early (issue #28 items 5 and 6):
history plot, cpus --plot and probe --idle-gaps draw no overlapping labels, give every mark a
legend entry and draw a percentile the samples cannot claim as such (hollow or dotted, as the
tables mark it with ``*``); a reader that stops early (`| head -1`) ends the command quietly
with exit status 0 and never a message about ``--out None``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def _labels_overlap(fig, axis) -> list[tuple[str, str]]:
    """Pairs of visible tick labels on ``axis`` whose boxes intersect once drawn."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in labels]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.overlaps(bb)]


# -- history plot -----------------------------------------------------------------------------
class Run:
    def __init__(self, rid, p50, p99, p999, n, gate=None):
        self.id, self.p50_ns, self.p99_ns, self.p999_ns = rid, p50, p99, p999
        self.sample_count, self.gate_status = n, gate


@pytest.mark.parametrize("lo_us,hi_us", [(10_000, 50_000), (90, 60_000), (12, 14),
                                         (5, 5_000_000)])
def test_latency_axis_labels_never_overlap(lo_us, hi_us):
    """`10,00020,000`: the 1-2-5 ticks of a log axis printed in full µs ran together."""
    import matplotlib.pyplot as plt

    from agent.plot import log_axis
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.set_xscale("log")
    ax.set_xlim(lo_us, hi_us)
    log_axis(ax.xaxis, [lo_us, hi_us])
    assert not _labels_overlap(fig, ax.xaxis)
    assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 2
    plt.close(fig)


def test_history_plot_marks_insufficient_percentiles_and_failed_gates_in_the_legend():
    import matplotlib.pyplot as plt

    from agent.history.plot import distribution as _distribution
    from agent.history.plot import percentiles_across_runs as _percentiles_across_runs
    runs = [Run(i, 11_000_000, 27_000_000, 35_000_000, 2000, "fail" if i == 3 else "pass")
            for i in range(1, 7)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.5))
    _percentiles_across_runs(ax1, runs)
    legend = [t.get_text() for t in ax1.get_legend().get_texts()]
    assert {"P50", "P99", "P99.9", "gate failed"} <= set(legend)
    assert any("hollow" in t for t in legend)
    # P99.9 from 2,000 samples is hollow; P50 and P99 are filled
    hollow = [ln for ln in ax1.get_lines() if ln.get_markerfacecolor() in ("white", "w")
              and len(ln.get_xdata())]
    assert hollow and all(ln.get_color() == "tab:red" for ln in hollow)
    lat = (np.random.default_rng(1).lognormal(np.log(12_000), 0.3, 2000) * 1000
           ).astype(np.int64)
    _distribution(ax2, lat, runs[-1])
    texts = [t.get_text() for t in ax2.get_legend().get_texts()]
    assert any(t.startswith("P99.9") and "*" in t and "2,000 < 6,636" in t for t in texts)
    assert any(t.startswith("P99 ") and "*" not in t for t in texts)
    for ax in (ax1, ax2):
        assert not _labels_overlap(fig, ax.xaxis) and not _labels_overlap(fig, ax.yaxis)
    plt.close(fig)


def test_history_plot_with_enough_samples_has_no_hollow_marks():
    import matplotlib.pyplot as plt

    from agent.history.plot import percentiles_across_runs as _percentiles_across_runs
    runs = [Run(i, 100_000, 200_000, 300_000, 10_000) for i in range(1, 4)]
    fig, ax = plt.subplots()
    _percentiles_across_runs(ax, runs)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["P50", "P99", "P99.9"]
    plt.close(fig)


def test_history_plot_cli_writes_the_png(tmp_path):
    from typer.testing import CliRunner

    from agent.cli import get_app
    from agent.history import History
    db = tmp_path / "h.sqlite"
    rng = np.random.default_rng(2)
    with History(db) as h:
        for i in range(4):
            rid = h.add_run(kind="probe", command="gate", summary={}, scenario="warm",
                            samples_ns=(rng.lognormal(np.log(1.2e7), 0.3, 2000)).astype(
                                np.int64), model_path=None, model_key_="builtin:lstm",
                            model_hash_="h", variant="xla", tf_version=None,
                            fingerprint={}, cold_start_ns=None)
            h.add_gate_result(rid, None, "warm", "fail" if i == 2 else "pass", {})
    out = tmp_path / "p.png"
    res = CliRunner().invoke(get_app(), ["history", "--db", str(db), "plot", "--out",
                                         str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- probe --idle-gaps ------------------------------------------------------------------------
def _gap_rows(rounds: int):
    from agent.probe import idle
    rng = np.random.default_rng(0)
    arrays = {}
    for g in (0, 1_000_000, 10_000_000, 100_000_000):
        start = np.arange(rounds, dtype=np.int64) * 10**7
        end = start + (rng.lognormal(np.log(300 + g / 1e5), 0.3, rounds) * 1000).astype(
            np.int64)
        arrays[g] = np.vstack([np.full(rounds, g), start, end])
    return idle.summarize(arrays)


def test_idle_gap_plot_draws_p99_from_60_rounds_as_insufficient(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    import agent.plot as ap
    from agent.probe import idle
    figs = []
    monkeypatch.setattr(ap, "save", lambda fig, path, *a, **k: figs.append(fig))
    idle.plot(_gap_rows(60), str(tmp_path / "g.png"), "t")
    (fig,) = figs
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "P50" and legend[1].startswith("P99*") and "662" in legend[1]
    p99 = [ln for ln in ax.get_lines() if ln.get_color() == "tab:orange"]
    assert any(ln.get_linestyle() == ":" for ln in p99)
    assert all(ln.get_markerfacecolor() in ("white", "w") for ln in p99 if ln.get_marker()
               not in (None, "None", ""))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1 ms", "10 ms", "100 ms"]
    assert not _labels_overlap(fig, ax.xaxis)
    plt.close(fig)
    figs.clear()
    idle.plot(_gap_rows(700), str(tmp_path / "g.png"), "t")  # enough calls: plain P99
    legend = [t.get_text() for t in figs[0].axes[0].get_legend().get_texts()]
    assert legend == ["P50", "P99"]
    plt.close(figs[0])


# -- cpus --plot ------------------------------------------------------------------------------
def test_cpus_plot_has_a_legend_entry_for_every_colour(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    import agent.plot as ap
    from agent.commands.cpus import _plot
    from agent.noise import rank as rk

    def n(c, us):
        return rk.CpuNoise(cpu=c, duration_s=1.0, gaps=10, sum_gap_ns=int(us * 1000),
                           max_gap_ns=1000, gap_ns=np.full(10, 1000, dtype=np.int64))
    rs = [n(1, 300), n(2, 350), n(3, 40_000), n(4, 500)]
    rk.judge(rs)
    figs = []
    monkeypatch.setattr(ap, "save", lambda fig, path, *a, **k: figs.append(fig))
    _plot(rs, [1, 2], str(tmp_path / "c.png"))
    ax = figs[0].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["recommended", "quiet",
                                                                   "noisy"]
    plt.close(figs[0])


# -- pipes ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_db(tmp_path_factory):
    """Runs with enough samples that the output outgrows a pipe's buffer."""
    from agent.history import History
    db = tmp_path_factory.mktemp("pipe") / "h.sqlite"
    with History(db) as h:
        for _ in range(3):
            h.add_run(kind="probe", command="probe", summary={}, scenario="warm",
                      samples_ns=np.arange(100_000, dtype=np.int64), model_path=None,
                      model_key_="builtin:lstm", model_hash_=None, variant="xla",
                      tf_version=None, fingerprint={}, cold_start_ns=None)
    return db


@pytest.mark.parametrize("args", [
    ["export", "--format", "json", "--samples"], ["export"], ["show", "1", "--json"],
    ["show", "latest"], [],
], ids=["export-json", "export-csv", "show-json", "show", "list"])
def test_a_reader_that_stops_early_ends_the_command_quietly(big_db, args):
    """`history export | head -1` printed `cannot write --out None: Broken pipe`; click
    answered the EPIPE with exit status 1."""
    env = dict(os.environ, COLUMNS="80")
    p = subprocess.Popen([sys.executable, "-m", "agent.cli", "history", "--db", str(big_db),
                          *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout is not None
    first = p.stdout.read(10)
    p.stdout.close()  # the reader goes away: later writes get EPIPE
    err = p.stderr.read().decode()
    rc = p.wait(timeout=60)
    assert first
    assert rc == 0, err
    assert err == "", err
    assert "None" not in err


def test_a_watch_run_plot_title_names_the_command_not_none():
    """A watch or cpus run has no model, variant or scenario: the title is the command, never
    "None None [None]" (issue #39)."""
    from types import SimpleNamespace

    from agent.history.plot import title
    watch = SimpleNamespace(model_key=None, variant=None, scenario=None, command="watch")
    assert title(watch) == "watch"
    gate = SimpleNamespace(model_key="builtin:lstm", variant="xla", scenario="warm",
                           command="gate")
    assert title(gate) == "builtin:lstm xla [warm]"
