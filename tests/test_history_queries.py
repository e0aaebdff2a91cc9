"""The commands' queries (agent/history/queries.py): last-pass baselines, the run listing's
filters, run ids as a user types them."""

from __future__ import annotations

import pytest

import agent.history as hs
from agent.history import History, HistoryError, record_run
from tests.test_history_store import FP, lat


def test_last_pass(tmp_path):
    db = tmp_path / "h.sqlite"
    ids = [record_run("probe", {}, lat(700, i), command="probe", builtin="lstm",
                      variant="tflite", fingerprint=FP, db=db) for i in range(4)]
    other = record_run("probe", {}, lat(700), command="probe", builtin="lstm", variant="xla",
                       fingerprint=FP, db=db)
    with History(db) as h:
        # Nothing gated yet: the previous run of the same model/variant/scenario.
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[3]).id == ids[2]
        h.add_gate_result(ids[1], ids[0], "warm", "pass", {})
        h.add_gate_result(ids[2], ids[1], "warm", "fail", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[3]).id == ids[1]
        assert h.last_pass(model_key_="builtin:lstm", variant="xla", scenario="warm",
                           before=other) is None
        assert h.get(ids[2]).gate_status == "fail"
    # No run passed yet: the newest ungated one, never a failed one.
    db2 = tmp_path / "h2.sqlite"
    ids = [record_run("probe", {}, lat(700, i), command="probe", builtin="lstm",
                      variant="tflite", fingerprint=FP, db=db2) for i in range(3)]
    with History(db2) as h:
        h.add_gate_result(ids[1], ids[0], "warm", "fail", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[2]).id == ids[0]
        h.add_gate_result(ids[0], None, "warm", "fail", {})
        assert h.last_pass(model_key_="builtin:lstm", variant="tflite", scenario="warm",
                           before=ids[2]) is None


def test_parse_run_id_takes_ascii_digits_in_sqlite_range():
    assert hs.parse_run_id("42") == 42
    assert hs.parse_run_id(str(2**63 - 1)) == 2**63 - 1
    # int() takes all but the last two of these; sqlite3 overflows on the last two
    for bad in ["", " 1", "1 ", "+1", "1_0", "٣", "-1", "1.0", "0x1", "0", str(2**63),
                "1234567890123456789012345678901234567890"]:
        with pytest.raises(HistoryError, match="--run"):
            hs.parse_run_id(bad, "--run")


def test_unknown_kind_filter_is_refused(tmp_path):
    with History(tmp_path / "h.sqlite") as h:
        assert h.runs(kind="audit") == []
        with pytest.raises(HistoryError, match="--kind must be one of probe, watch"):
            h.runs(kind="bogus")
