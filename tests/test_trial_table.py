"""agent/trial/table.py: each arm's figures and intervals, the winner rule (lowest P99.9 upper
bound; a lever worse than isolation alone never wins; overlapping intervals said), the
table."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from agent import stats
from agent.trial.arms import ARMS
from agent.trial.table import ArmFigures, Figure, figures, not_better, pick, render

ARM = {a.name: a for a in ARMS}


def fig(name: str, p999: int, lo: int | None, hi: int | None, n: int = 8000) -> ArmFigures:
    f = ArmFigures(name, ARM[name].label, ARM[name].lever, n)
    f.q["p999"] = Figure(p999, lo, hi)
    return f


def test_figures_pool_the_blocks_and_bound_each_percentile():
    rng = np.random.default_rng(1)
    blocks = [rng.integers(400_000, 600_000, 4000) for _ in range(2)]
    f = figures(ARM["isolate"], blocks)
    a = np.sort(np.concatenate(blocks))
    assert f.n == 8000 and f.sufficient  # ≥ 6,636
    assert f.q["p50"].value_ns == stats.quantile_sorted(a, 50.0)
    for k in ("p50", "p99", "p999"):
        g = f.q[k]
        assert g.lo_ns is not None and g.hi_ns is not None and g.lo_ns <= g.value_ns <= g.hi_ns
    small = figures(ARM["none"], [blocks[0][:500]])
    assert not small.sufficient and small.p999.hi_ns is None  # 500 samples cannot bound it
    assert figures(ARM["none"], []).n == 0


def test_the_lowest_upper_bound_wins_not_the_lowest_point_estimate():
    arms = [fig("none", 900, 800, 5000), fig("isolate", 600, 550, 700),
            fig("pm-qos", 500, 300, 2000)]  # lowest P99.9, but a wide interval
    v = pick(arms)
    assert v.winner == "isolate"
    assert "pm-qos" in v.overlaps and not v.clear and "not clear" in v.note


def test_a_clear_win():
    v = pick([fig("none", 9000, 8000, 12000), fig("isolate", 3000, 2800, 3300),
              fig("pm-qos", 2000, 1900, 2100)])
    assert (v.winner, v.clear, v.overlaps) == ("pm-qos", True, [])


def test_a_lever_worse_than_isolation_alone_is_never_the_winner():
    """GPU box shape: keep-awake (pause) made the tail worse than isolation alone. Its upper
    bound is lower (isolation's interval is wide), but its P99.9 is above isolation's."""
    iso = fig("isolate", 3700, 2500, 57000)
    pause = fig("keep-awake", 13500, 2200, 14000)
    v = pick([fig("none", 60000, 40000, 90000), iso, pause])
    assert v.winner == "isolate"
    assert "its P99.9 is above isolation alone's" in v.note
    assert not_better(pause, iso) is not None
    # and a lever that ties isolation's upper bound is not better either
    tie = fig("pm-qos", 3000, 2000, 57000)
    assert pick([iso, tie]).winner == "isolate"
    assert not_better(tie, iso) == "its P99.9 upper bound is not below isolation alone's"


def test_without_isolation_figures_no_lever_is_called_the_winner():
    """Isolation alone's blocks all failed: nothing to compare a lever with."""
    empty = ArmFigures("isolate", ARM["isolate"].label, False, 0)
    v = pick([empty, fig("pm-qos", 50, 40, 60)])
    assert v.winner is None and "isolation alone has no figures" in v.note
    # isolation unbounded above (fewer samples): a lever may win, but never clearly
    v = pick([fig("isolate", 100, 50, None), fig("pm-qos", 50, 40, 60)])
    assert v.winner == "pm-qos" and not v.clear and v.overlaps == ["isolate"]


def test_no_upper_bound_anywhere_means_no_winner():
    v = pick([fig("none", 100, 50, None, n=500), fig("isolate", 90, 50, None, n=500)])
    assert v.winner is None and "too few samples" in v.note


def test_the_table_marks_an_unclaimable_p999_and_names_the_winner():
    out = io.StringIO()
    con = Console(file=out, width=160, force_terminal=False, color_system=None)
    arms = [fig("none", 9000, 8000, 12000, n=500), fig("isolate", 3000, 2800, 3300)]
    render(con, arms, pick(arms))
    text = out.getvalue()
    assert "9.0*" in text or "9000*" in text.replace(",", "")
    assert "fewer than 6,636 samples" in text and "none" in text
    assert "winner: isolation alone" in text


@pytest.mark.parametrize("hi,shown", [(None, "∞"), (2_500_000, "2500")])
def test_an_unbounded_side_is_shown_as_such(hi, shown):
    from agent.trial.table import cell
    assert cell(Figure(2_000_000, 1_500_000, hi)).endswith(f"{shown}]")
