"""agent/noise/survey.py: the whole scan behind `hftagent cpus` (batches into the caller's
list, the recorder closed on every way out), the ranking against a tree's layout, and the
run's document (no recommendation from a stopped scan)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.noise import rank as rk
from agent.noise import scan as sc
from agent.noise import survey
from collectors.host import Host
from tests.treecopy import make_synthetic


def _noise(cpu: int, us_per_s: float) -> rk.CpuNoise:
    return rk.CpuNoise(cpu=cpu, duration_s=1.0, gaps=20, sum_gap_ns=int(us_per_s * 1000),
                       max_gap_ns=20_000, gap_ns=np.full(20, 2_000, dtype=np.int64))


class _Exe:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class _Stop(BaseException):
    pass


def test_batches_go_into_the_callers_list_and_a_stop_keeps_those_that_finished(monkeypatch):
    exe = _Exe()
    monkeypatch.setattr(sc, "build", lambda: exe)
    seen: list = []

    def fake_scan(host, group, online, duration_s, threshold_ns, **kw):
        seen.append((list(group), threshold_ns, kw["exe"], kw["irq_sender"]))
        if len(seen) > 1:
            raise _Stop
        return [_noise(c, 100.0) for c in group]
    monkeypatch.setattr(sc, "scan", fake_scan)
    events: list = []
    got: list = []
    with pytest.raises(_Stop):
        survey.scan_candidates(None, list(range(1, 8)), 8, 0.5, 2.5, into=got, irq_sender=0,
                               built=lambda: events.append("built"),
                               progress=events.append)
    first = seen[0][0]
    assert events == ["built"] and [r.cpu for r in got] == first and exe.closed
    assert seen[0][1:] == (2500, exe, 0) and seen[1][0] != first


def test_recommend_judges_and_ranks_on_the_trees_layout(tmp_path):
    host = Host(make_synthetic(tmp_path / "t", ncpus=4))
    rs = [_noise(1, 100.0), _noise(2, 90_000.0), _noise(3, 120.0)]
    choice = survey.recommend(host, rs, [1, 2, 3], count=None, allow_siblings=True)
    assert [r.verdict for r in rs] == ["quiet", "noisy", "quiet"]
    assert choice.recommended == [1, 3] and 2 in choice.left_out


def test_a_stopped_scan_documents_no_recommendation():
    rs = [_noise(1, 100.0), _noise(3, 120.0)]
    rk.judge(rs)
    choice = rk.rank(rs, siblings={}, cpu_node={})
    kw = dict(duration_s=1.0, threshold_us=1.0, online=[0, 1, 2, 3], housekeeping=[0],
              candidates=[1, 2, 3])
    whole = survey.document(rs, choice, {"active": False}, complete=True, **kw)
    assert whole["recommended"] == [1, 3]
    assert whole["commands"] == ["hftagent tune plan --cpus 1,3",
                                 "hftagent tune apply --cpus 1,3",
                                 "hftagent run --cpus 1,3 -- CMD"]
    part = survey.document(rs, choice, {"active": False}, complete=False, **kw)
    assert part["recommended"] == [] and part["commands"] == []
    assert part["cpus"] == whole["cpus"] and part["ranked"] == whole["ranked"]
