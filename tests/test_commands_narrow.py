"""What a person reads (issue #28 items 1, 3 and 8) for probe, cpus, tune, run, history, gate,
capture and profile: at 80 columns and on a pipe every table is a list and no value of the
JSON is cut; a wide terminal keeps the tables; help texts are paragraphs the renderer wraps
and flags show no ``<bool>``; no ``None``, ``(was )`` or dict repr in any human output on any
fixture tree; strings from the user or the host are printed as text, never as rich markup."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import tuning.tunables.base as tunables_base
from agent.cli import get_app
from tests.conftest import FIXTURES
from tests.treecopy import KernelSim, make_synthetic

runner = CliRunner()
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PIPED = {"COLUMNS": "80"}
TERMINAL_80 = {"COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
TERMINAL_200 = {"COLUMNS": "200", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}
NARROW = [PIPED, TERMINAL_80]
NARROW_IDS = ["piped", "terminal-80"]
HOST_TREES = sorted(p.name for p in FIXTURES.iterdir() if (p / "proc").is_dir())
TABLE_EDGES = ("┏", "┃", "│", "┡", "└")
# what must never reach a person: a Python None, an empty "(was )", a dict repr
NEVER = ("None", "(was )", "{'")


@pytest.fixture(autouse=True)
def kernel_sim(monkeypatch):
    """Every tune write of these tests goes through the kernel simulation (on tree copies)."""
    monkeypatch.setattr(tunables_base, "default_writer", KernelSim)


def cli(*args: str, env: dict | None = None):
    return runner.invoke(get_app(), list(args), env=env or {})


def human(res) -> str:
    return ANSI.sub("", res.stdout)


def assert_narrow(out: str) -> None:
    """A list: no table border, nothing cut with an ellipsis."""
    assert "…" not in out, out
    assert not any(ln.lstrip().startswith(TABLE_EDGES) for ln in out.splitlines()), out


def assert_clean(out: str) -> None:
    for bad in NEVER:
        assert bad not in out, (bad, out)


def on_one_line(out: str, *values: str) -> None:
    """Each value appears whole on some line (never split or cut)."""
    lines = out.splitlines()
    for v in values:
        assert any(v in ln for ln in lines), (v, out)


# -- help -------------------------------------------------------------------------------------
COMMANDS = [["probe"], ["cpus"], ["tune", "plan"], ["tune", "apply"], ["tune", "rollback"],
            ["tune", "status"], ["tune", "threads"], ["run"], ["history"], ["history", "show"],
            ["history", "export"], ["history", "plot"], ["gate"], ["capture"], ["profile"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_help_shows_flags_as_flags_and_wraps_paragraphs_once(cmd):
    res = cli(*cmd, "--help", env=TERMINAL_80)
    assert res.exit_code == 0, res.output
    out = human(res)
    assert "<bool>" not in out  # --json, --help, --no-history: flags take no value
    assert "--help" in out
    prose = out.split("╭")[0]
    paragraphs = [p for p in re.split(r"\n\s*\n", prose) if p.strip()]
    for para in paragraphs[1:]:  # after "Usage:"; each paragraph wrapped once, at 80
        lines = [ln.strip() for ln in para.splitlines()]
        if len(lines) > 1 and not para.splitlines()[0].startswith("   "):
            # every line but the last fills the width (a ragged half line is a source line
            # wrapped by hand and again by the renderer)
            assert all(len(ln) > 50 for ln in lines[:-1]), para


@pytest.mark.parametrize("cmd", ["audit", "watch", "attach", "deploy"])
def test_every_other_command_shows_flags_as_flags_too(cmd):
    """The fix is made once, where a command is loaded (agent/cli.py), not per command."""
    res = cli(cmd, "--help", env=TERMINAL_80)
    assert res.exit_code == 0, res.output
    assert "<bool>" not in human(res) and "--help" in human(res)


def test_flags_show_what_they_take():
    out = human(cli("probe", "--help", env=TERMINAL_200))
    assert re.search(r"--samples\s+N\s", out) and re.search(r"--cpus\s+LIST\s", out)
    assert re.search(r"--db\s+FILE\s", out)
    assert re.search(r"--json\s{2,}Machine-readable", out)


# -- probe ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def numpy_probe():
    """A tiny real probe (the TF-free numpy model: no TensorFlow import), as JSON."""
    res = CliRunner().invoke(get_app(), ["probe", "--model", "numpy", "--samples", "700",
                                         "--warmup", "20", "--batch", "1,2", "--json",
                                         "--no-history"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _render_probe(doc: dict, *, terminal: bool, width: int) -> str:
    from agent.probe.report import render
    from agent.probe.result import ProbeResult
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=terminal, width=width, no_color=True,
                  highlight=False)
    render(ProbeResult.from_dict(doc), con)
    return ANSI.sub("", buf.getvalue())


def _probe_values(doc: dict) -> list[str]:
    from agent.probe.report import _pct, fmt_ns
    from agent.probe.result import RunResult
    vals = [doc["model"]["name"]]
    for d in doc["runs"]:
        r = RunResult.from_dict(d)
        if not r.ok:
            vals.append(r.reason)
            continue
        vals += [_pct(r, q) for q in (50, 90, 99, 99.9)]
        vals += [fmt_ns(r.cold_start_ns), fmt_ns(r.headline["max_ns"]),
                 f"{r.headline['count']:,}"]
    return vals


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal-80"])
def test_probe_at_80_columns_is_a_list_and_no_value_is_cut(numpy_probe, terminal):
    out = _render_probe(numpy_probe, terminal=terminal, width=80)
    assert_narrow(out)
    assert_clean(out)
    on_one_line(out, *_probe_values(numpy_probe))
    for b in (1, 2):  # one item line per run, its status tag first
        assert re.search(rf"^  \[[a-z -]+\] numpy  batch {b}$", out, re.M), out


def test_probe_on_a_wide_terminal_keeps_the_table_whole(numpy_probe):
    out = _render_probe(numpy_probe, terminal=True, width=200)
    assert "┏" in out and "…" not in out
    on_one_line(out, *_probe_values(numpy_probe))


def test_probe_piped_is_no_wider_than_its_width(numpy_probe):
    """Piped at 80 the table was 150 columns; the list's item lines fit (prose lines are
    whole sentences the terminal may wrap, never cut)."""
    out = _render_probe(numpy_probe, terminal=False, width=80)
    items = [ln for ln in out.splitlines() if ln.startswith(("  [", "      "))]
    assert items and all(len(ln) <= 80 for ln in items), items


def test_probe_cli_piped_at_80_columns():
    res = cli("probe", "--model", "numpy", "--samples", "50", "--warmup", "5", "--no-history",
              env=PIPED)
    assert res.exit_code == 0, res.output
    out = human(res)
    assert_narrow(out)
    assert_clean(out)
    assert "ended by: sample count" in out


def test_probe_says_a_reason_several_runs_share_once(numpy_probe):
    doc = json.loads(json.dumps(numpy_probe))
    why = "TensorRT is not in this TensorFlow build (tf-trt needs a GPU build)"
    for r in doc["runs"]:
        r.update(status="unavailable", reason=why, variant="tf-trt")
    doc["recommendation"] = None
    out = _render_probe(doc, terminal=False, width=80)
    assert out.count(why) == 1 and "same reason as tf-trt batch 1" in out
    assert "tf-trt: did not run" in out.split("recommendation: none")[1]


def test_probe_markup_in_a_model_name_is_printed_as_it_is(numpy_probe):
    doc = json.loads(json.dumps(numpy_probe))
    doc["model"]["name"] = "[/bold] x[red]"
    out = _render_probe(doc, terminal=True, width=80)
    assert "[/bold] x[red]" in out


def test_a_tflite_reference_says_it_checks_batching_only(numpy_probe):
    doc = json.loads(json.dumps(numpy_probe))
    doc["model"].update(kind="tflite", name="m.tflite", reference="tflite")
    out = _render_probe(doc, terminal=False, width=80)
    assert "the .tflite model itself: agreement then checks only batching, not accuracy" in out
    assert "TensorFlow" in out.split("reference:")[1]


def test_no_recommendation_gives_the_true_reason_not_agreement():
    """The numpy stand-in has no agreement: "insufficient samples" is the reason, never a
    generic "... and passing agreement"."""
    res = cli("probe", "--model", "numpy", "--samples", "100", "--warmup", "5",
              "--no-history", env=PIPED)
    out = human(res)
    assert res.exit_code == 0, res.output
    assert "recommendation: none" in out
    assert "numpy: insufficient samples for P99 (100 < 662)" in out
    assert "agreement" not in out.split("recommendation: none")[1]


# -- tune -------------------------------------------------------------------------------------
@pytest.fixture
def syn(tmp_path):
    return make_synthetic(tmp_path / "syn")


@pytest.mark.parametrize("env", NARROW, ids=NARROW_IDS)
def test_tune_plan_narrow_is_a_list_with_whole_targets(syn, env):
    res = cli("tune", "plan", "--root", str(syn), "--cpus", "2-3", env=env)
    assert res.exit_code == 2, res.output
    out = human(res)
    assert_narrow(out)
    assert_clean(out)
    from tuning.tunables import by_id
    tunables = by_id()
    doc = json.loads(cli("tune", "plan", "--root", str(syn), "--cpus", "2-3", "--json").stdout)
    for it in doc["items"]:
        for c in it["changes"]:
            if c["kind"] != "write":
                continue
            on_one_line(out, c["desired"], it["id"])
            t = tunables[it["id"]]
            if t.scope and t.index_of(c["target"]) is not None:
                on_one_line(out, f"{t.scope} ")  # per-CPU/IRQ targets as ranges
            else:
                on_one_line(out, c["target"])  # vm/swappiness whole, never vm/swappin│ess
    assert "/proc/sys/vm/swappiness" in out
    # a reason several tunables share is said once
    assert out.count("no cpuset controller") == 1


def test_tune_plan_wide_keeps_the_table(syn):
    out = human(cli("tune", "plan", "--root", str(syn), "--cpus", "2-3", env=TERMINAL_200))
    assert "┏" in out and "…" not in out and "/proc/sys/vm/swappiness" in out


def test_a_profile_named_with_markup_is_printed_as_it_is(syn, tmp_path):
    """A profile named ``[/bold] x`` made `tune plan` fail with rich's MarkupError."""
    src = Path(__file__).resolve().parents[1] / "tuning" / "profiles" / "bench.toml"
    prof = tmp_path / "p.toml"
    prof.write_text(src.read_text().replace('name = "bench"', 'name = "[/bold] x"'))
    for env in (PIPED, TERMINAL_200):
        res = cli("tune", "plan", "--root", str(syn), "--cpus", "2-3", "--profile", str(prof),
                  env=env)
        assert res.exit_code in (0, 2), res.output
        assert "[/bold] x" in human(res)


@pytest.mark.parametrize("env", NARROW, ids=NARROW_IDS)
def test_tune_apply_status_rollback_narrow(syn, env):
    state = syn / "run" / "hftagent"
    res = cli("tune", "apply", "--root", str(syn), "--cpus", "2-3", env=env)
    assert res.exit_code in (0, 2), res.output
    out = human(res)
    assert_narrow(out)
    assert_clean(out)
    assert "[applied] memory.swappiness  /proc/sys/vm/swappiness" in out
    assert "verify" in out and str(state / "journal.json") in out
    for cmd in ("status", "rollback"):
        res = cli("tune", cmd, "--root", str(syn), env=env)
        assert res.exit_code in (0, 2), res.output
        out = human(res)
        assert_narrow(out)
        assert_clean(out)
        assert "memory.swappiness" in out


@pytest.mark.parametrize("env", NARROW + [TERMINAL_200], ids=NARROW_IDS + ["terminal-200"])
def test_tune_status_never_says_was_nothing(syn, env, monkeypatch):
    """A target whose original value was empty (a new cgroup's cpuset.cpus) or unreadable:
    status printed ``0 (was )``."""
    import tuning.apply as ap
    items = [ap.RollbackItem("isolate.cpuset", "/sys/fs/cgroup/hft/cpuset.cpus", "", "2-3",
                             "2-3", "holds"),
             ap.RollbackItem("kernel.nmi_watchdog", "/proc/sys/kernel/nmi_watchdog", "1", "0",
                             None, "unreadable")]
    monkeypatch.setattr(ap, "status", lambda ctx, sd: ap.StatusReport(
        items, str(sd / "journal.json"), True, profile="[/bold] p", cpus="2-3"))
    res = cli("tune", "status", "--root", str(syn), env=env)
    out = human(res)
    assert res.exit_code == 2, res.output
    assert_clean(out)
    assert "2-3 (was (empty))" in out and "[/bold] p" in out


@pytest.mark.parametrize("tree", HOST_TREES)
def test_tune_and_run_on_every_fixture_tree_say_no_none(tree, tmp_path):
    root = tmp_path / tree
    shutil.copytree(FIXTURES / tree, root, symlinks=True)
    for env in (PIPED, TERMINAL_80, TERMINAL_200):
        for args in (["tune", "plan", "--root", str(root)],
                     ["tune", "apply", "--dry-run", "--root", str(root)],
                     ["tune", "status", "--root", str(root)],
                     ["run", "--dry-run", "--root", str(root), "--", "true"]):
            res = cli(*args, env=env)
            assert res.exit_code in (0, 1, 2), (args, res.output)
            out = human(res)
            assert_clean(out)
            if env is not TERMINAL_200:
                assert "…" not in out


@pytest.mark.parametrize("env", NARROW, ids=NARROW_IDS)
def test_run_dry_run_prints_every_value_of_its_json_whole(env):
    root = FIXTURES / "synthetic-2socket"
    args = ("run", "--dry-run", "--root", str(root), "--intra", "2", "--", "python3", "x.py")
    doc = json.loads(cli(*args[:-3], "--json", *args[-3:]).stdout)
    out = human(cli(*args, env=env))
    assert_clean(out)
    on_one_line(out, doc["cpus"], doc["command"], *(f"{k}={v}" for k, v in doc["env"].items()))


def test_capture_says_where_in_one_whole_line(tmp_path):
    out_dir = tmp_path / "a-rather-long-directory-name-for-a-captured-tree" / "cap"
    out_dir.parent.mkdir()  # capture makes DIR only: its parent must exist
    res = cli("capture", "--root", str(FIXTURES / "vm-dev"), "--out", str(out_dir), env=PIPED)
    assert res.exit_code == 0, res.output
    assert_clean(res.stdout)
    on_one_line(res.stdout, str(out_dir), str(out_dir / "CAPTURE-SKIPPED"))


# -- cpus -------------------------------------------------------------------------------------
def _noise(cpu: int, us_per_s: float, error: str | None = None):
    from agent.noise.rank import CpuNoise
    return CpuNoise(cpu=cpu, duration_s=1.0, gaps=20, sum_gap_ns=int(us_per_s * 1000),
                    max_gap_ns=12_345_678, gap_ns=np.arange(1000, 21000, 1000, dtype=np.int64),
                    causes={"LOC": 250.0}, error=error)


def _cpus_outcome(results, stopped=None, not_scanned=()):
    from agent.commands.cpus import CpusOutcome
    from agent.noise import rank as rk
    rk.judge(results)
    choice = rk.rank(results, siblings={}, cpu_node={})
    doc = {"commands": [] if stopped else ["hftagent tune plan --cpus 1"],
           "trace": {"active": False, "reason": "no tracefs in this test"},
           "cpus": [r.to_dict() for r in results]}
    return CpusOutcome(results, choice, doc, stopped, list(not_scanned))


def _render_cpus(out, *, terminal: bool, width: int) -> str:
    from agent.commands.cpus import render
    buf = io.StringIO()
    render(out, [0], Console(file=buf, force_terminal=terminal, width=width, no_color=True))
    return ANSI.sub("", buf.getvalue())


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal-80"])
def test_cpus_at_80_columns_is_a_list_with_every_value(terminal):
    from agent.probe.report import fmt_ns
    rs = [_noise(1, 300.0), _noise(2, 350.0), _noise(3, 123_456.7), _noise(4, 0, "boom")]
    out = _render_cpus(_cpus_outcome(rs), terminal=terminal, width=80)
    assert_narrow(out)
    assert_clean(out)
    for r in rs[:3]:
        p = r.gap_percentiles()
        on_one_line(out, f"CPU {r.cpu}", f"{r.noise_us_per_s:,.1f}", fmt_ns(p["p99"]),
                    fmt_ns(r.max_gap_ns))
    on_one_line(out, "[noisy] CPU 3", "[quiet] CPU 1", "[error] CPU 4", "boom")
    assert out.count("verdicts judged against the quietest of 3 CPUs") == 1


def test_cpus_wide_keeps_the_table():
    rs = [_noise(1, 300.0), _noise(2, 123_456.7)]
    out = _render_cpus(_cpus_outcome(rs), terminal=True, width=200)
    assert "┏" in out and "…" not in out and "123,456.7" in out


def test_cpus_one_candidate_is_never_called_quiet_on_a_comparison_it_did_not_have():
    """One candidate losing 15 ms/s was "quiet" (3x itself); alone it is unranked, and the
    basis says why."""
    from agent.noise import rank as rk
    (r,) = rs = [_noise(1, 15_000.0)]
    rk.judge(rs)
    assert r.verdict == "unranked" and "alone" in r.basis and "two candidates" in r.basis
    assert r.to_dict()["verdict_basis"] == r.basis
    out = _render_cpus(_cpus_outcome([_noise(1, 15_000.0)]), terminal=False, width=80)
    assert "[unranked] CPU 1" in out and "quiet" not in out.split("CPU noise")[1].split(
        "verdicts")[0]
    for us, verdict in ((150.0, "quiet"), (60_000.0, "noisy")):  # absolute limits alone
        rs = [_noise(1, us)]
        rk.judge(rs)
        assert rs[0].verdict == verdict and "absolute" in rs[0].basis
    rs = [_noise(1, 15_000.0), _noise(2, 16_000.0)]   # two: a comparison
    rk.judge(rs)
    assert {r.verdict for r in rs} == {"quiet"} and "quietest of 2" in rs[0].basis


def test_cpus_stopped_prints_the_cpus_scanned_marked_partial():
    import signal

    from agent.commands.common import Stopped
    out = _render_cpus(_cpus_outcome([_noise(1, 300.0)], Stopped(signal.SIGINT), [2, 3]),
                       terminal=False, width=80)
    assert out.startswith("partial result: stopped by SIGINT")
    assert "CPU 1" in out and "not scanned: CPU 2-3" in out and "recommended:" not in out


def test_cpus_cli_stopped_mid_scan_keeps_what_finished(tmp_path, monkeypatch):
    """Ctrl-C during the second batch: the first batch's CPUs are printed (partial), the
    recorders of the second are gone (agent/noise/scan.py kills them on the way out), exit
    130, nothing recorded."""
    import signal

    import agent.commands.cpus as c
    from agent.commands.common import Stopped
    from agent.noise import scan as sc
    from collectors.host import Host
    root = make_synthetic(tmp_path / "t", 8)
    monkeypatch.setattr(c, "make_host", lambda *a, **k: Host(str(root)))

    class Exe:
        closed = False

        def close(self):
            Exe.closed = True
    monkeypatch.setattr(sc, "build", Exe)
    calls = []

    def fake_scan(host, group, online, duration, thr, **kw):
        calls.append(list(group))
        if len(calls) > 1:
            raise Stopped(signal.SIGINT)
        return [_noise(g, 300.0 + g) for g in group]
    monkeypatch.setattr(sc, "scan", fake_scan)
    monkeypatch.setattr(sc, "pinned_processes", lambda host, cpus: {})
    res = cli("cpus", "--duration", "0.1", "--trace", "off", env=PIPED)
    assert res.exit_code == 130, res.output
    out = human(res)
    assert out.startswith("partial result: stopped by SIGINT") and Exe.closed
    first, second = calls
    for cpu in first:
        assert f"CPU {cpu}" in out
    assert "not scanned: CPU" in out and "recommended:" not in out
    assert "nothing recorded" in res.stderr
    # a line before anything slow starts (a first build of the recorder compiles it)
    assert res.stderr.startswith("hftagent cpus: 7 candidate CPU(s), 0.1 s each")
    from agent.history import db_exists
    assert not db_exists(None)


# -- history ----------------------------------------------------------------------------------
@pytest.fixture
def history_db(tmp_path):
    """One run of each kind, with markup and odd values in the strings the database holds."""
    from agent.history import History
    db = tmp_path / "h.sqlite"
    fp = {"hostname": "box[/bold]", "kernel": "6.1", "cpu_model": "Xeon", "turbo": None,
          "governors": {"performance": "0-3"}, "audit": {"ok": 3, "warn": 1},
          "gpu_models": ["H200", "H200"], "isolated_cpus": ""}
    finding = {"id": "cpu.governor", "family": "cpu", "title": "CPU governor [/bold]",
               "status": "warn", "current": "powersave", "expected": "performance",
               "fix": "cpupower frequency-set -g performance", "why": "w", "evidence": "e",
               "data": {}}
    ok = dict(finding, id="cpu.ok", title="A fine check", status="ok", fix="")
    unsup = dict(finding, id="cpu.u", title="U", status="unsupported", fix="",
                 current="unsupported: no cpufreq")
    with History(db) as h:
        common = dict(scenario=None, model_path=None, model_key_=None, model_hash_=None,
                      variant=None, tf_version=None, fingerprint=fp, cold_start_ns=None,
                      samples_ns=None)
        h.add_run(kind="audit", command="audit", summary={
            "profile": "hft-cpu", "target_cpus": "1-3", "summary": {"ok": 1, "warn": 1,
                                                                    "unsupported": 1},
            "findings": [finding, ok, unsup]}, **common)
        h.add_run(kind="cpus", command="cpus", summary={
            "cpus": [{"cpu": 1, "noise_us_per_s": 15000.0, "gaps_per_s": 400.0,
                      "verdict": "unranked", "error": None},
                     {"cpu": 2, "noise_us_per_s": 90000.0, "gaps_per_s": 4000.0,
                      "verdict": "noisy", "error": None}],
            "ranked": [1, 2], "recommended": [1],
            "left_out": {"2": "noisy: 90000 µs/s lost"}}, **common)
        h.add_run(kind="watch", command="watch", summary={
            "causes": {"preemption": 12, "irq[/b]": 3}, "samples": 10000, "spikes": 15,
            "p50_ns": 120000, "p99_ns": 900000}, **dict(common, model_key_="builtin:lstm"))
        h.add_run(kind="watch", command="watch", summary={}, **common)  # nothing in it
        h.add_run(kind="probe", command="probe", summary={"latency": {
            "count": 2000, "sufficient": {"p99": True, "p999": False}}},
            **dict(common, samples_ns=np.arange(1000, 3000, dtype=np.int64) * 1000,
                   scenario="warm", model_key_="builtin:[red]x", model_hash_="abc",
                   variant="xla", tf_version="2.21", cold_start_ns=5_000_000))
    return db


@pytest.mark.parametrize("env", [PIPED, TERMINAL_80, TERMINAL_200],
                         ids=["piped", "terminal-80", "terminal-200"])
def test_history_show_renders_each_kind_in_its_shape(history_db, env):
    db = str(history_db)
    audit = human(cli("history", "--db", db, "show", "1", env=env))
    assert "[warn] CPU governor [/bold]" in audit and "current:  powersave" in audit
    assert "fix: cpupower frequency-set -g performance" in audit
    assert "model" not in audit.split("host")[0]  # no probe-shaped fields
    cpus = human(cli("history", "--db", db, "show", "2", env=env))
    assert "[unranked] CPU 1" in cpus and "[noisy] CPU 2" in cpus
    assert "recommended: --cpus 1" in cpus and "noisy: 90000 µs/s lost" in cpus
    watch = human(cli("history", "--db", db, "show", "3", env=env))
    assert "preemption: 12 (80%)" in watch and "irq[/b]: 3 (20%)" in watch
    assert "spikes: 15" in watch and "P99: 900 µs" in watch
    empty = human(cli("history", "--db", db, "show", "4", env=env))
    assert "no causes recorded" in empty
    probe = human(cli("history", "--db", db, "show", "5", env=env))
    assert "builtin:[red]x" in probe and "P99.9: 2,997 µs*" in probe
    for out in (audit, cpus, watch, empty, probe):
        assert_clean(out)
        assert "hostname: box[/bold]" in out and "audit: ok 3, warn 1" in out
        assert "turbo" not in out  # not recorded: left out, never "None"


@pytest.mark.parametrize("env", NARROW, ids=NARROW_IDS)
def test_history_listing_has_a_kind_and_is_a_list_when_narrow(history_db, env):
    out = human(cli("history", "--db", str(history_db), env=env))
    assert_narrow(out)
    assert_clean(out)
    for tag in ("[audit] run 1", "[cpus] run 2", "[watch] run 3", "[probe] run 5"):
        assert tag in out, out
    assert "P99.9µs: 2,997*" in out  # 2,000 samples cannot claim P99.9
    wide = human(cli("history", "--db", str(history_db), env=TERMINAL_200))
    assert "┏" in wide and "kind" in wide and "audit" in wide


# -- gate -------------------------------------------------------------------------------------
@pytest.fixture
def gate_db(tmp_path):
    from agent.history import History
    db = tmp_path / "g.sqlite"
    rng = np.random.default_rng(3)
    with History(db) as h:
        for _ in range(2):
            h.add_run(kind="probe", command="probe", summary={}, scenario="warm",
                      samples_ns=(rng.lognormal(np.log(2e5), 0.2, 3000)).astype(np.int64),
                      model_path=None, model_key_="builtin:lstm", model_hash_="h",
                      variant="tflite", tf_version="2.21", fingerprint={"hostname": "b"},
                      cold_start_ns=1000)
    return db


@pytest.mark.parametrize("env", NARROW, ids=NARROW_IDS)
def test_gate_narrow_is_a_list_with_every_check(gate_db, env):
    args = ("gate", "--run", "2", "--baseline", "1", "--db", str(gate_db), "--seed", "1")
    res = cli(*args, env=env)
    assert res.exit_code in (0, 1), res.output
    out = human(res)
    assert_narrow(out)
    assert_clean(out)
    doc = json.loads(cli(*args, "--json").stdout)
    for v in doc["verdicts"]:
        for c in v["checks"]:
            on_one_line(out, f"[{c['status']}] {c['name']}")
            for k in ("value", "limit"):
                if c[k]:
                    on_one_line(out, c[k])
    assert "gate: " in out
