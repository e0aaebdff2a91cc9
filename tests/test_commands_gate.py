"""`hftagent gate` and `hftagent history` through the CLI on synthetic recorded runs: exit
codes 0/1/2/3, baselines (id, file, last-pass), bad input as one stderr line with exit 1."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from agent.history import History, record_run

runner = CliRunner()
FP = {"version": 1, "hostname": "h", "kernel": "6.1", "cpu_model": "X", "online_cpus": "0-1",
      "governors": "0-1=performance", "turbo": False, "isolated_cpus": "1",
      "nohz_full_cpus": "1", "smt_active": 0, "virtualization": "none", "gpu_models": None,
      "gpu_driver": None, "audit": None}


def lat(n: int, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    r = np.random.default_rng(seed)
    return (r.lognormal(np.log(200e3), 0.2, n) * scale).astype(np.int64)


def add(db, x, fp=FP, variant="tflite", cold=300_000, scenario=None):
    return record_run("probe", {}, x, command="probe", builtin="lstm", variant=variant,
                      fingerprint=fp, cold_start_ns=cold, scenario=scenario, db=db)


def gate(db, *args):
    return runner.invoke(get_app(), ["gate", "--db", str(db), "--seed", "3", *args])


@pytest.fixture
def db(tmp_path):
    return tmp_path / "h.sqlite"


def test_pass_fail_and_last_pass(db):
    add(db, lat(6636, seed=1))
    add(db, lat(6636, seed=2))
    add(db, lat(6636, 1.3, seed=3))
    r = gate(db, "--run", "2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verdicts"][0]["baseline"] == "run 1"
    r = gate(db, "--run", "3")
    assert r.exit_code == 1 and "FAIL" in r.stdout and "p99-regression" in r.stdout
    # last-pass skips the failed run 3: run 4 is compared with run 2.
    add(db, lat(6636, seed=4))
    r = gate(db, "--run", "latest", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["verdicts"][0]["baseline"] == "run 2"
    with History(db) as h:
        assert [x.gate_status for x in h.runs(limit=None)] == ["pass", "fail", "pass", None]


def test_explicit_baseline_id_and_regression_option(db):
    add(db, lat(6636, seed=1))
    add(db, lat(6636, 1.3, seed=2))
    assert gate(db, "--run", "2", "--baseline", "1").exit_code == 1
    assert gate(db, "--run", "2", "--baseline", "1", "--max-p99-regression", "50%"
                ).exit_code == 0


def test_fingerprint_mismatch_exit_2(db):
    add(db, lat(6636, seed=1))
    add(db, lat(6636, seed=2), fp=dict(FP, governors="0-1=powersave"))
    r = gate(db, "--run", "2")
    assert r.exit_code == 2 and "governors" in r.stdout
    assert gate(db, "--run", "2", "--allow-mismatch").exit_code == 0


def test_insufficient_samples_exit_3(db):
    add(db, lat(6636, seed=1))
    add(db, lat(500, seed=2))
    r = gate(db, "--run", "2")
    assert r.exit_code == 3 and "662" in r.stdout


def test_absolute_budgets(db):
    add(db, lat(6636, seed=1), cold=5_000_000)
    assert gate(db, "--run", "1", "--max-cold-start-us", "4300").exit_code == 1
    assert gate(db, "--run", "1", "--max-cold-start-us", "6000").exit_code == 0
    assert gate(db, "--run", "1", "--max-p99-us", "100").exit_code == 1


def test_baseline_from_export_file_and_probe_json(db, tmp_path):
    add(db, lat(6636, seed=1))
    add(db, lat(6636, 1.3, seed=2))
    r = runner.invoke(get_app(), ["history", "show", "1", "--json", "--db", str(db)])
    assert r.exit_code == 0
    f = tmp_path / "base.json"
    f.write_text(r.stdout)
    assert gate(db, "--run", "2", "--baseline", str(f)).exit_code == 1
    # The same run against itself as a file baseline passes.
    assert gate(db, "--run", "1", "--baseline", str(f)).exit_code == 0
    # A probe --json document has no fingerprint: not comparable unless allowed.
    p99 = int(np.sort(lat(6636, seed=1))[int(np.ceil(0.99 * 6636)) - 1])
    probe_doc = {"schema": "hftagent.probe", "schema_version": 1, "runs": [
        {"variant": "tflite", "status": "ok", "cold_start_ns": 1,
         "latency": {"p99_ns": p99, "count": 6636}}]}
    pf = tmp_path / "probe.json"
    pf.write_text(json.dumps(probe_doc))
    assert gate(db, "--run", "2", "--baseline", str(pf)).exit_code == 2
    assert gate(db, "--run", "2", "--baseline", str(pf), "--allow-mismatch").exit_code == 1
    assert gate(db, "--run", "1", "--baseline", str(pf), "--allow-mismatch").exit_code == 0


# -- bad input: one line on stderr, exit 1, nothing lost ------------------------------------
def cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def one_error_line(p: subprocess.CompletedProcess, needle: str) -> None:
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hftagent: error:"), p.stderr
    assert needle in lines[0] and "Traceback" not in p.stderr


def test_bad_inputs(db, tmp_path):
    add(db, lat(1000))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema": "something.else", "x": 1}))
    notjson = tmp_path / "x.csv"
    notjson.write_text("a,b\n1,2\n")
    cases = [
        (["gate", "--run", "99"], "unknown run id 99"),
        (["gate", "--run", "abc"], "must be a run id"),
        (["gate", "--run", "1", "--baseline", str(wrong)], "wrong format"),
        (["gate", "--run", "1", "--baseline", str(notjson)], "not JSON"),
        (["gate", "--run", "1", "--baseline", str(tmp_path / "nope.json")], "not a run id"),
        (["gate", "--run", "1", "--max-p99-regression", "-5%"], "--max-p99-regression"),
        (["gate", "--run", "1", "--max-p99-regression", "lots"], "--max-p99-regression"),
        (["gate", "--run", "1", "--max-jitter-rate", "2"], "--max-jitter-rate"),
        (["gate", "--run", "1", "--max-p99-us", "0"], "--max-p99-us"),
        (["gate", "--run", "1", "--scenarios", "hot"], "unknown scenario"),
        (["history", "show", "7"], "unknown run id 7"),
        (["history", "plot", "--out", str(tmp_path / "x.pdf")], ".png or .svg"),
        (["history", "export", "--format", "xml"], "--format"),
    ]
    for args, needle in cases:
        one_error_line(cli(*args, "--db", str(db)), needle)
    with History(db) as h:
        assert len(h.runs(limit=None)) == 1


def test_corrupt_database_is_one_line_and_untouched(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 1000)
    for args in (["gate", "--run", "1"], ["history"]):
        one_error_line(cli(*args, "--db", str(bad)), "unreadable")
    assert bad.read_bytes() == b"garbage" * 1000


def test_db_from_environment(db, monkeypatch):
    import os
    add(db, lat(700))
    p = cli("history", "--json", env=dict(os.environ, HFTAGENT_DB=str(db)))
    assert p.returncode == 0 and [r["id"] for r in json.loads(p.stdout)] == [1]


# -- history listing and export -------------------------------------------------------------------
def test_history_list_show_export(db, tmp_path):
    add(db, lat(700, seed=1))
    add(db, lat(700, seed=2), variant="xla")
    r = runner.invoke(get_app(), ["history", "--db", str(db), "--limit", "1", "--json"])
    assert r.exit_code == 0 and [x["id"] for x in json.loads(r.stdout)] == [2]
    r = runner.invoke(get_app(), ["history", "--db", str(db), "--model", "lstm"])
    assert r.exit_code == 0 and "xla" in r.stdout and "tflite" in r.stdout
    r = runner.invoke(get_app(), ["history", "--db", str(db), "--model", "nomatch", "--json"])
    assert json.loads(r.stdout) == []
    out = tmp_path / "runs.csv"
    r = runner.invoke(get_app(), ["history", "export", "--db", str(db), "--out", str(out)])
    assert r.exit_code == 0
    rows = out.read_text().splitlines()
    assert rows[0].startswith("id,created_utc,kind") and len(rows) == 3
    r = runner.invoke(get_app(), ["history", "export", "--db", str(db), "--format", "json",
                                  "--samples"])
    doc = json.loads(r.stdout)
    assert doc["schema"] == "hftagent.runs" and len(doc["runs"][1]["latency_ns"]) == 700
    r = runner.invoke(get_app(), ["history", "show", "latest", "--db", str(db)])
    assert r.exit_code == 0 and "run 2" in r.stdout


def test_plot_without_matplotlib_is_one_clear_line(db, monkeypatch):
    add(db, lat(700))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    r = runner.invoke(get_app(), ["history", "plot", "--db", str(db), "--out", "x.png"])
    assert r.exit_code == 1 and "needs matplotlib" in r.stderr


@pytest.mark.parametrize("ext,magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_plot_writes_file(db, tmp_path, ext, magic):
    pytest.importorskip("matplotlib")
    for i in range(3):
        add(db, lat(700, 1 + i / 10, seed=i))
    out = tmp_path / f"p.{ext}"
    r = runner.invoke(get_app(), ["history", "plot", "--db", str(db), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:len(magic)] == magic


# -- issue #13: options given are used or refused, every value checked before any work -----------
def err_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1, (r.exit_code, r.stderr, r.stdout)
    assert lines[0].startswith("hftagent: error:") and "internal error" not in lines[0]
    return lines[0]


def test_history_group_options_reach_the_subcommand(db, tmp_path, monkeypatch):
    """`history --db X show N` and `history --db X plot` read X, not the default database."""
    monkeypatch.setenv("HFTAGENT_DB", str(db))  # the default holds runs 1-2 (tflite)
    add(db, lat(700, seed=1))
    add(db, lat(700, seed=2))
    other = tmp_path / "other.sqlite"
    add(other, lat(700, seed=3), variant="xla")  # run 1 (xla) only
    r = runner.invoke(get_app(), ["history", "--db", str(other), "show", "1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["run"]["variant"] == "xla"
    r = runner.invoke(get_app(), ["history", "--db", str(other), "--json", "show", "1"])
    assert r.exit_code == 0 and json.loads(r.stdout)["run"]["variant"] == "xla"
    r = runner.invoke(get_app(), ["history", "--db", str(other), "export", "--format", "json"])
    assert r.exit_code == 0 and [d["run"]["variant"] for d in json.loads(r.stdout)["runs"]] \
        == ["xla"]
    r = runner.invoke(get_app(), ["history", "--db", str(tmp_path / "none.sqlite"), "show", "1"])
    assert "none.sqlite" in err_line(r)
    r = runner.invoke(get_app(), ["history", "--db", str(other), "show", "2"])
    assert "unknown run id 2" in err_line(r)
    # the same value on both sides is fine; different values are refused
    r = runner.invoke(get_app(), ["history", "--db", str(other), "show", "1", "--db", str(other)])
    assert r.exit_code == 0 and "xla" in r.stdout
    r = runner.invoke(get_app(), ["history", "--db", str(db), "show", "1", "--db", str(other)])
    assert "given twice" in err_line(r)
    # listing filters before a subcommand that has none: refused, never ignored
    for args in (["--limit", "5", "show", "1"], ["--kind", "probe", "show", "1"],
                 ["--model", "x", "show", "1"], ["--json", "export"]):
        assert "does not apply" in err_line(runner.invoke(get_app(), ["history", *args]))
    r = runner.invoke(get_app(), ["history", "--kind", "gate", "export"])  # carried to export
    assert r.exit_code == 0 and r.stdout.strip() == ",".join(
        ("id", "created_utc", "kind", "command", "scenario", "model_key", "model_hash",
         "variant", "tf_version", "host_digest", "sample_count", "p50_ns", "p99_ns",
         "p999_ns", "cold_start_ns", "gate_status"))


def test_history_plot_reads_the_group_db(db, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("HFTAGENT_DB", str(db))
    for i in range(3):
        add(db, lat(700, seed=i))
    other = tmp_path / "other.sqlite"
    add(other, lat(700, seed=9), variant="xla")
    out = tmp_path / "p.png"
    r = runner.invoke(get_app(), ["history", "--db", str(other), "plot", "--out", str(out)])
    assert r.exit_code == 0 and "(1 runs)" in r.stderr, r.output


def test_history_bad_ids_kinds_and_outputs(db, tmp_path):
    import os
    add(db, lat(700))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (["show", "1234567890123456789012345678901234567890"], "run id"),  # was OverflowError
        (["show", "٣"], "run id"), (["show", "+1"], "run id"), (["show", " 1"], "run id"),
        (["--kind", "bogus"], "--kind must be one of"),                   # was exit 0
        (["export", "--kind", "bogus"], "--kind must be one of"),
        (["export", "--out", str(fifo)], "not a regular file"),           # blocked in open()
        (["export", "--out", ""], "--out is empty"),                      # was stdout
        (["export", "--out", "/dev/full"], "not a regular file"),
        (["plot", "--out", str(tmp_path / "fifo.png")], "not a regular file"),
        (["plot", "--out", str(tmp_path / "p.png"), "--variant", "nope"], "--variant 'nope'"),
        (["--db", ""], "--db is empty"), (["--db", str(fifo)], "not a regular file"),
    ]
    os.mkfifo(tmp_path / "fifo.png")
    for args, needle in cases:
        if args[0] != "--db":
            args = ["--db", str(db), *args]
        assert needle in err_line(runner.invoke(get_app(), ["history", *args])), args


@pytest.fixture
def no_probe(monkeypatch):
    """Gate scenarios raise: a bad value that slipped through must not start TensorFlow."""
    import agent.gate.evaluate

    def boom(*_a, **_k):
        raise AssertionError("the gate started probing")
    monkeypatch.setattr(agent.gate.evaluate, "run_scenario", boom)


def test_gate_numbers_and_ids_are_checked(db, tmp_path, no_probe):
    add(db, lat(1000, seed=1))
    add(db, lat(1000, seed=2))
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    cases = [
        (["--max-p99-us", "nan"], "--max-p99-us"),                 # was ValueError
        (["--max-p99-us", "inf"], "--max-p99-us"),                 # was OverflowError
        (["--max-cold-start-us", "-inf"], "--max-cold-start-us"),
        (["--jitter-threshold-us", "1e309"], "--jitter-threshold-us"),
        (["--max-p99-us", "1e16"], "at most 1000000000"),
        (["--max-p99-regression", "٣%"], "--max-p99-regression"),  # float("٣") is 3.0
        (["--seed", "-1"], "--seed must be >= 0"),                 # was numpy's ValueError
        (["--baseline", "1234567890123456789012345678901234567890"], "--baseline"),
        (["--baseline", "٣"], "not a run id"),                     # was run id 3
        (["--baseline", str(nested)], "nested too deeply"),        # was RecursionError
    ]
    for args, needle in cases:
        assert needle in err_line(gate(db, "--run", "2", *args)), args
    for run in ("1234567890123456789012345678901234567890", "٣", " 2", "0"):
        assert "--run" in err_line(gate(db, "--run", run)), run


def test_gate_with_run_refuses_probe_options(db, no_probe):
    add(db, lat(1000, seed=1))
    add(db, lat(1000, seed=2))
    for opt, v in [("--samples", "1000"), ("--duration", "1"), ("--warmup", "10"),
                   ("--cpus", "0"), ("--intra", "1"), ("--inter", "1"), ("--builtin", "mlp"),
                   ("--variant", "xla"), ("--cold-processes", "3"), ("--scenarios", "warm")]:
        assert opt in err_line(gate(db, "--run", "2", opt, v)), opt
    assert gate(db, "--run", "2").exit_code == 0


def test_gate_checks_probe_options_before_creating_the_database(tmp_path, no_probe):
    new = tmp_path / "new.sqlite"
    for args, needle in [(["--samples", "0"], "--samples"), (["--intra", "0"], "--intra"),
                         (["--inter", "-5"], "--inter"), (["--variant", ""], "--variant"),
                         (["--variant", "graph,xla"], "one variant"),
                         (["--scenarios", "concurrent٣"], "unknown scenario"),
                         (["--cpus", "4095"], "--cpus"), (["--samples", "5000001"], "--samples")]:
        assert needle in err_line(gate(new, *args)), args
    assert not new.exists()


def test_parse_scenarios_ascii_only():
    from agent.errors import AgentError
    from agent.gate.evaluate import parse_ratio, parse_scenarios
    assert parse_scenarios("cold,concurrent16") == ["cold", "concurrent16"]
    for bad in ("concurrent٣", "concurrent١٦"):
        with pytest.raises(AgentError, match="unknown scenario"):
            parse_scenarios(bad)
    assert parse_ratio("10%", "--x") == pytest.approx(0.1)
    for bad in ("٣%", "1_0%", "٠.١"):
        with pytest.raises(AgentError, match="--x"):
            parse_ratio(bad, "--x")


# -- the same-session control with short history (issue #39 item 3) ------------------------------
@pytest.fixture
def fake_probe(monkeypatch):
    """``run_scenario`` without a probe worker: synthetic samples, twice as many dealt to the
    candidate and a control in ABBA blocks when the gate asks for one; the calls it got."""
    import agent.gate.evaluate as ev
    from agent.probe.runner import host_info
    calls: list[tuple[str, bool]] = []
    tf = host_info()["tensorflow"]

    def fake(name, settings, config, *, cold_processes=5, control=False):
        calls.append((name, control))
        run = lat(2 * settings.samples if control else settings.samples, seed=len(calls))
        cand, ctl = ev.split_blocks(run) if control else (run, None)
        summary = {"host": {"tensorflow": tf}, "run": {"config": config.to_dict()}}
        return ev.ScenarioRun(name, settings.variants[0], cand, [300_000], summary, ctl)
    monkeypatch.setattr(ev, "run_scenario", fake)
    return calls


PROBE_NOW = ["--model", "numpy", "--samples", "1000", "--max-jitter-rate", "off"]


def test_short_history_gates_against_a_control_interleaved_in_the_session(db, fake_probe):
    r = gate(db, *PROBE_NOW, "--json")  # no baseline: nothing to compare, no control
    assert r.exit_code == 0, r.output
    assert fake_probe[-1] == ("warm", False)
    assert json.loads(r.stdout)["verdicts"][0]["decided_by"] is None
    for earlier in (1, 2):
        r = gate(db, *PROBE_NOW, "--json")
        assert r.exit_code == 0, r.output
        (v,) = json.loads(r.stdout)["verdicts"]
        assert fake_probe[-1] == ("warm", True)
        assert v["decided_by"] == "control" and v["baseline"] == f"run {earlier}"
        assert f"history holds {earlier} earlier run(s)" in v["decision"]
        checks = {c["name"]: c for c in v["checks"]}
        assert checks["p99-regression"]["data"]["decided_by"] == "control"
        assert checks["host-drift"]["status"] == "pass"
    with History(db) as h:
        assert h.samples(3).size == 1000  # the candidate's half is the run
        assert [r.gate_status for r in h.runs(limit=None)] == ["pass"] * 3
    r = gate(db, *PROBE_NOW)  # 3 earlier runs: history knows the spread and decides
    assert r.exit_code == 0, r.output
    assert fake_probe[-1] == ("warm", False)
    assert "decided by run 3, with the run-to-run spread of 3 earlier runs" in r.stdout
    r = gate(db, "--run", "2")  # measured already: no control can be run beside it
    assert r.exit_code == 0, r.output
    assert "decided by run 1, within-run noise only (--run: measured already" in \
        " ".join(r.stdout.split())


def test_no_control_for_a_baseline_of_another_build(db, fake_probe):
    record_run("probe", {}, lat(1000), command="probe", builtin="numpy", variant="numpy",
               tf_version="0.0-another", db=db)
    r = gate(db, *PROBE_NOW, "--json")
    assert r.exit_code == 0, r.output
    assert fake_probe == [("warm", False)]
    (v,) = json.loads(r.stdout)["verdicts"]
    assert v["decided_by"] == "history"
    assert "run 1 measured another build" in v["decision"]
