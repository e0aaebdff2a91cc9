"""The recording hooks (agent/history/record.py): probe results, the audit's counts riding
along, warnings instead of failures, a model's content hash."""

from __future__ import annotations

import numpy as np
import pytest

import agent.history as hs
from agent.history import History, HistoryError, record_probe, record_run
from tests.test_history_store import FP, lat


def test_model_hash_changes_with_content(tmp_path):
    d = tmp_path / "sm"
    (d / "variables").mkdir(parents=True)
    (d / "saved_model.pb").write_bytes(b"a")
    (d / "variables/v").write_bytes(b"b")
    h1 = hs.model_hash(str(d))
    (d / "variables/v").write_bytes(b"c")
    assert hs.model_hash(str(d)) != h1 and len(h1) == 64
    assert hs.model_hash(str(tmp_path / "missing")) is None


def test_audit_summary_rides_along_in_later_fingerprints(tmp_path):
    db = tmp_path / "h.sqlite"
    report = {"findings": [{"id": "a", "status": "ok"}, {"id": "b", "status": "fail"},
                           {"id": "c", "status": "fail"}]}
    aid = record_run("audit", report, None, command="audit", fingerprint=dict(FP), db=db)
    pid = record_run("probe", {}, lat(700), command="probe", fingerprint=dict(FP), db=db)
    other = record_run("probe", {}, lat(700), command="probe", db=db,
                       fingerprint=dict(FP, kernel="6.9"))
    with History(db) as h:
        assert h.get(aid).fingerprint["audit"] == {"ok": 1, "fail": 2}
        assert h.get(pid).fingerprint["audit"] == {"run_id": aid, "ok": 1, "fail": 2}
        assert h.get(other).fingerprint["audit"] is None   # another host configuration


def _probe_result(n_runs: int = 2):
    from agent.probe import stats
    from agent.probe.harness import COLUMNS, Samples
    from agent.probe.result import ProbeResult, RunResult
    runs, arrays = [], []
    for i in range(n_runs):
        x = lat(800, i)
        data = np.zeros((len(COLUMNS), x.size), dtype=np.int64)
        data[COLUMNS.index("end_ns")] = x
        runs.append(RunResult(variant=["xla", "tflite"][i], batch=1, config={"id": "c"},
                              cold_start_ns=5_000 + i, latency=stats.summarize(x)))
        arrays.append(Samples(data, open_loop=False))
    runs.append(RunResult(variant="tf-trt", batch=1, config={"id": "c"}, status="unavailable"))
    arrays.append(None)
    res = ProbeResult(host={"tensorflow": "2.21.0"}, model={"name": "builtin:lstm"},
                      settings={"model": {"path": None, "builtin": "lstm"}}, runs=runs,
                      created_utc="2025-01-01T00:00:00Z")
    return res, arrays


def test_record_probe_hook(tmp_path):
    db = tmp_path / "h.sqlite"
    res, arrays = _probe_result()
    ids = record_probe(res, arrays, db=db, fingerprint=FP)
    assert len(ids) == 2                                   # the unavailable run has no samples
    with History(db) as h:
        a, b = h.get(ids[0]), h.get(ids[1])
        assert (a.variant, b.variant) == ("xla", "tflite")
        assert a.tf_version == "2.21.0" and a.cold_start_ns == 5_000 and a.scenario == "warm"
        assert a.summary["run"]["variant"] == "xla"
        np.testing.assert_array_equal(h.samples(ids[1]), lat(800, 1))
    # run_config's {column: array} form is accepted as well
    ids2 = record_probe(res, [s.as_dict() if s else None for s in arrays], db=db, fingerprint=FP)
    with History(db) as h:
        np.testing.assert_array_equal(h.samples(ids2[0]), lat(800, 0))


def test_hooks_warn_instead_of_failing(tmp_path, capsys):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"junk" * 100)
    res, arrays = _probe_result(1)
    assert record_probe(res, arrays, db=bad, fingerprint=FP, warn=True) == []
    assert record_run("audit", {}, None, command="audit", db=bad, fingerprint=FP,
                      warn=True) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("hftagent: warning: run not recorded") for e in err)
    with pytest.raises(HistoryError):
        record_probe(res, arrays, db=bad, fingerprint=FP)
    assert bad.read_bytes() == b"junk" * 100
