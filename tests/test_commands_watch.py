"""`hftagent watch`'s command line (issues #27-#29): options parsed once into a WatchConfig
(agent/watch/options.py), durations converted to ns at parsing and nowhere else, the CPUs
decided by the one target rule, --rate auto by default, an honest load figure, history, and
the --attach options. Parsing and validation only: no session runs here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from agent.client import FIELDS

F = {name: i for i, name in enumerate(FIELDS)}


def _recs(lat_ns: list[int]) -> tuple[np.ndarray, np.ndarray]:
    recs = np.zeros((len(lat_ns), len(FIELDS)), dtype=np.int64)
    for i, lat in enumerate(lat_ns):
        recs[i, F["seq"]] = i
        recs[i, F["start_ns"]] = 10**9 * (i + 1)
        recs[i, F["end_ns"]] = 10**9 * (i + 1) + lat
        recs[i, F["tid"]] = 1
    return recs, recs[:, F["end_ns"]] - recs[:, F["start_ns"]]


def test_the_detector_takes_its_threshold_in_ns():
    # --threshold-us 2500.5 is 2,500,500 ns once, at parsing: the detector does not convert
    from agent.watch.detect import SpikeDetector
    d = SpikeDetector(2_500_500, 3.0, 10**9, queueing=False, clock=lambda: 0)
    recs, lat = _recs([2_500_400, 2_500_500, 2_500_600])
    assert [sp.seq for sp, _ in d.scan(recs, lat)] == [2]


def test_the_flight_recorder_takes_its_length_in_ns(tmp_path):
    from agent.watch.attribution import Spike
    from agent.watch.flight import FlightRecorder
    fr = FlightRecorder(1_000_000, str(tmp_path / "fl"), 1.0, 0, lambda r: None, [])
    fr.offer(Spike(1, 0, 999_999, 1, 1, 0), {})
    fr.offer(Spike(2, 0, 1_000_000, 1, 1, 0), {})
    assert [sp.seq for sp, _ in fr.pending] == [2]


# -- the command, its session fenced ---------------------------------------------------------
FIXTURES = Path(__file__).resolve().parent / "fixtures"


class Reached(Exception):
    """The command got past its checks to the session's run."""


@pytest.fixture
def fenced(monkeypatch):
    """WatchSession.run records the config it was given and ends the run at once (0)."""
    from agent.watch.session import WatchSession
    seen: list = []

    def run(self):
        seen.append(self.cfg)
        return 0
    monkeypatch.setattr(WatchSession, "run", run)
    return seen


@pytest.fixture
def unreached(monkeypatch):
    from agent.watch.session import WatchSession

    def run(self):
        raise Reached("a bad input reached the session")
    monkeypatch.setattr(WatchSession, "run", run)


def cli(*args: str):
    return CliRunner().invoke(get_app(), ["watch", *args])


def one_line(res, needle: str) -> None:
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and not isinstance(res.exception, Reached), (res.exit_code,
                                                                           res.output)
    assert len(err) == 1 and err[0].startswith("hftagent: error: ") and needle in err[0], err


def test_the_default_rate_is_auto_and_an_empty_run_prints_no_none(fenced):
    # was --rate 500: on a slow host the probe flooded its own CPU (issue #28 item 3); and a
    # run that never started printed "watched None (pid None) ... P50 None µs"
    res = cli("--probe", "numpy", "--duration", "1", "--no-history", "--no-live")
    assert res.exit_code == 0, res.output
    (cfg,) = fenced
    assert cfg.source.rate_hz == 0.0  # (the worker picks it after its warm-up)
    assert "None" not in res.stdout and "watched the numpy probe on CPU" in res.stdout
    assert "(--rate auto)" in res.stdout
    assert cli("--help").stdout.count("auto") >= 1


def test_a_given_rate_is_kept(fenced):
    assert cli("--probe", "numpy", "--rate", "200", "--no-history", "--no-live").exit_code == 0
    assert fenced[0].source.rate_hz == 200.0  # (0.0: auto)


def test_durations_are_ns_from_the_option_on(fenced):
    res = cli("--probe", "numpy", "--threshold-us", "2500.5", "--flight-us", "0.002",
              "--no-history", "--no-live", "--flight-dir", str(Path(os.getcwd())))
    assert res.exit_code == 0, res.output
    assert fenced[0].threshold_ns == 2_500_500 and fenced[0].flight_ns == 2
    assert not hasattr(fenced[0], "__dataclass_fields__") or \
        "threshold_us" not in fenced[0].__dataclass_fields__


@pytest.mark.parametrize("args,needle", [
    (["--threshold-us", "0.0001"], "--threshold-us must be at least 0.001 µs"),
    (["--flight-us", "0.0001"], "--flight-us must be at least 0.001 µs"),
    (["--threshold-us", "1e10"], "--threshold-us must be at most 1e+09 µs, not 1e+10"),
    (["--flight-us", "nan"], "--flight-us must be a finite number > 0"),
])
def test_a_duration_below_a_ns_or_out_of_range_is_one_line(unreached, args, needle):
    # 0.0001 µs was 0.1 ns: every sample a spike, and with --listen a ValueError traceback
    one_line(cli("--probe", "numpy", *args), needle)


# -- the load figure and its advice (issue #28 item 3) -----------------------------------------
def _flooded(rate_auto: bool, cpu_ms: float = 2.2):
    """A built-in probe at 500/s whose calls take ``cpu_ms`` of CPU each, back to back: its
    response times (from the intended start) grow to tens of ms. (load_warning's arguments
    but the two busy shares, histogram first.)"""
    from agent.watch.ring import LatencyRing
    from agent.watch.summary import LatencyHistogram
    n, period, cpu = 2000, 2_000_000, int(cpu_ms * 1e6)
    recs = np.zeros((n, len(FIELDS)), dtype=np.int64)
    recs[:, F["start_ns"]] = np.arange(n) * period
    end = 0
    for i in range(n):  # one server: a call starts at its intended time or after the last
        end = recs[i, F["end_ns"]] = max(int(recs[i, F["start_ns"]]), end) + cpu
    recs[:, F["cpu_ns"]] = cpu
    ring = LatencyRing()
    ring.extend(recs)
    hist = LatencyHistogram()
    hist.add(recs[:, F["end_ns"]] - recs[:, F["start_ns"]])
    return hist, ring, [1], 500.0, rate_auto


def test_the_load_figure_is_a_measured_share_and_never_advises_auto_to_auto():
    from agent.watch.latency.probe import load_warning
    (w,) = load_warning(*_flooded(rate_auto=True))
    # was: "keeps CPU [1] 19xx % busy (P50 ... × 500/s) ... (or --rate auto)" to a user on auto
    pcts = [int(x) for x in re.findall(r"(\d+) % busy", w)]
    assert pcts and all(p <= 100 for p in pcts), w
    assert "--rate auto)" not in w and "a --rate of 113 or less" in w, w


def test_a_chosen_rate_is_told_of_auto_and_other_work_of_a_quieter_cpu():
    from agent.watch.latency.probe import calls_busy, load_warning
    flooded = _flooded(rate_auto=False)
    (w,) = load_warning(*flooded)
    assert "100 % busy" in w and "(or --rate auto)" in w, w
    # most of the busy CPU is someone else's: no rate advice, a quieter CPU
    busy = calls_busy(flooded[1], [1])
    (w,) = load_warning(*flooded, (0.3, busy[1]), 0.97)
    assert "97 % busy (30 % the probe's own calls)" in w and "--rate" not in w, w


def test_a_probe_with_headroom_gets_no_load_warning():
    from agent.watch.latency.probe import calls_busy, load_warning
    flooded = _flooded(rate_auto=True, cpu_ms=0.5)
    assert load_warning(*flooded) == []
    assert calls_busy(flooded[1], [1])[0] == pytest.approx(0.25, abs=0.01)


# -- the CPUs: the one target rule (tuning/targets.py) -----------------------------------------
TREES = ["vm-dev", "gpu-h200", "synthetic-2socket", "synthetic-tuned", "synthetic-baremetal",
         "synthetic-hybrid"]


@pytest.mark.parametrize("tree", TREES)
def test_the_cpus_come_from_the_one_rule(tree):
    from agent.watch.config import plan_cpus
    from agent.watch.latency.probe import BuiltinProbe
    from agent.watch.latency.ring import ClientRing
    from collectors.host import Host
    from tuning.targets import resolve
    host = Host(FIXTURES / tree)
    rule = resolve(host)
    probe, hk = plan_cpus(host, BuiltinProbe())
    assert probe == [rule.cpus[-1]] and hk == rule.housekeeping
    # --cpus checked by the resolver; the sampler still never lands on another target CPU
    probe, hk = plan_cpus(host, BuiltinProbe(), str(rule.cpus[0]))
    assert probe == [rule.cpus[0]] and not set(hk) & set(rule.cpus)
    assert plan_cpus(host, ClientRing(ring="r"))[0] == rule.cpus  # a ring alone: every target
    if rule.housekeeping:
        assert plan_cpus(host, BuiltinProbe(), None, str(rule.housekeeping[0]))[1] == \
            [rule.housekeeping[0]]


@pytest.mark.parametrize("args,needle", [
    (["--cpus", "0,,1"], "--cpus"), (["--housekeeping", ""], "--housekeeping"),
    (["--cpus", "999"], "--cpus"),
])
def test_bad_cpu_lists_are_one_line_naming_their_option(unreached, args, needle):
    one_line(cli("--probe", "numpy", *args), needle)


# -- history (issue #28 item 4) ------------------------------------------------------------------
def _summary() -> dict:
    return {"source": "numpy-lstm", "source_kind": "numpy", "pid": None, "probe_cpus": [1],
            "rate_hz": 166.0, "rate_auto": True, "duration_s": 2.0, "samples": 330,
            "p50_us": 876.7, "p99_us": 5982.5, "p999_us": 11197.7, "max_us": 11829.0,
            "spikes": 12, "attributed": 11, "not_attributed": 1,
            "causes": {"cpu_contention": {"count": 10, "share": 0.909, "label": "x",
                                          "top": ["python ran on CPU 1"]},
                       "steal": {"count": 1, "share": 0.091, "label": "y", "top": []}},
            "collectors": {"gpu": {"state": "unsupported", "reason": "no NVML"}},
            "sampler": {}, "events": {}, "flight_records": [], "warnings": [],
            "attribution_delay_ms": {"p50": 40, "max": 90}, "stopped_by": None,
            "source_error": None, "output_error": None}


def test_record_watch_stores_the_summary_causes_and_the_fingerprint(tmp_path):
    from agent.history import History, record_watch
    db = tmp_path / "h.sqlite"
    rid = record_watch(_summary(), probe="numpy", db=db, fingerprint={"hostname": "h"})
    with History(db) as h:
        r = h.get(rid)
    assert r.kind == "watch" and r.command == "watch" and r.variant == "numpy"
    assert r.model_key == "builtin:numpy" and r.fingerprint["hostname"] == "h"
    assert r.host_digest
    assert r.summary["causes"] == {"cpu_contention": 10, "steal": 1}
    assert r.summary["cause_examples"] == {"cpu_contention": ["python ran on CPU 1"]}
    assert (r.summary["samples"], r.summary["spikes"]) == (330, 12)
    assert (r.summary["p50_us"], r.summary["p99_us"]) == (876.7, 5982.5)
    assert (r.p50_ns, r.p99_ns, r.p999_ns, r.sample_count) == (876_700, 5_982_500, 11_197_700,
                                                               330)
    assert "collectors" not in r.summary and "sampler" not in r.summary
    # an external process has no model
    rid = record_watch(dict(_summary(), source_kind="external"), probe="external", db=db,
                       fingerprint={"hostname": "h"})
    with History(db) as h:
        assert h.get(rid).model_key is None and h.get(rid).variant is None


def test_a_watch_run_is_recorded_with_db(monkeypatch, tmp_path):
    import agent.watch.runner as runner
    monkeypatch.setattr(runner, "run_watch", lambda req, host, **kw: (0, _summary()))
    db = tmp_path / "h.sqlite"
    res = cli("--probe", "numpy", "--no-live", "--db", str(db))
    assert res.exit_code == 0, res.output
    from agent.history import History
    with History(db) as h:
        (r,) = h.runs(kind="watch")
    assert r.summary["causes"] == {"cpu_contention": 10, "steal": 1}
    assert cli("--probe", "numpy", "--no-live", "--no-history").exit_code == 0
    with History(db) as h:
        assert len(h.runs(kind="watch")) == 1


@pytest.mark.parametrize("args,needle", [
    (["--db", "/nonexistent/dir/h.sqlite"], "does not exist"),
    (["--db", "{tmp}/h.sqlite", "--no-history"], "contradict"),
])
def test_a_bad_db_is_one_line_before_the_run(unreached, tmp_path, args, needle):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    one_line(cli("--probe", "numpy", *args), needle)
    assert not Path("/nonexistent/dir").exists()  # never created


# -- --attach PID (issue #27 item 1): parsing and validation only ----------------------------
@pytest.fixture(scope="module")
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p.pid
    p.kill()
    p.wait()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_attach_sets_the_config(fenced, sleeper):
    res = cli("--attach", str(sleeper), "--attach-symbol", "libc.so.6:nanosleep",
              "--unsafe-return", "--no-history", "--no-live", "--trace", "on")
    assert not isinstance(res.exception, Reached) and res.exit_code == 0, res.output
    (cfg,) = fenced
    src = cfg.source
    assert (src.kind, src.pid, src.runtime, src.symbol, src.unsafe_return) == \
        ("attach", sleeper, "auto", "libc.so.6:nanosleep", True)
    fenced.clear()
    assert cli("--attach", str(sleeper), "--attach-runtime", "litert", "--no-history",
               "--no-live").exit_code == 0
    src = fenced[0].source
    assert (src.runtime, src.symbol, src.unsafe_return) == \
        ("litert", None, False)


@pytest.mark.parametrize("args,needle", [
    (["--probe", "numpy"], "--attach and --probe"),
    (["--pid", "{pid}"], "--attach and --pid"),
    (["--ring", "/tmp/x.ring"], "--attach and --ring"),
    (["--attach-runtime", "bogus"], "--attach-runtime must be one of auto, litert"),
    (["--attach-symbol", "nocolon"], "--attach-symbol must be LIB:SYMBOL"),
    (["--attach-symbol", "lib:"], "--attach-symbol must be LIB:SYMBOL"),
    (["--attach-symbol", ""], "--attach-symbol is empty"),
    (["--unsafe-return"], "--unsafe-return is for --attach-symbol"),
    (["--attach-runtime", "litert", "--attach-symbol", "a:b"], "give one"),
    (["--model", "lstm"], "--model is for --probe tf, not --attach"),
])
def test_bad_attach_options_are_one_line(unreached, sleeper, args, needle):
    args = [a.replace("{pid}", str(sleeper)) for a in args]
    one_line(cli("--attach", str(sleeper), *args), needle)


@pytest.mark.parametrize("args,needle", [
    (["--attach-runtime", "litert"], "--attach-runtime is for --attach"),
    (["--attach-symbol", "a:b"], "--attach-symbol is for --attach"),
    (["--unsafe-return"], "--unsafe-return is for --attach"),
])
def test_attach_options_need_attach(unreached, args, needle):
    one_line(cli("--probe", "numpy", *args), needle)


def test_a_dead_attach_pid_is_one_line(unreached):
    one_line(cli("--attach", str(_dead_pid())), "no such process")
    one_line(cli("--attach", "0"), "--attach 0")


def test_attach_help_documents_the_unsafe_return():
    out = " ".join(cli("--help").stdout.split())
    assert "--attach" in out and "--unsafe-return" in out and "abort" in out


def test_phases_reach_a_pipe_once_they_last(capsys):
    """On a pipe watch says a start-up phase that lasts over 1 s (one line), drops one the
    end of start-up cut short, and a start that fails at once is still one line (issue #28
    item 2)."""
    import subprocess
    import sys
    import time

    from agent.commands.watch import _Phases
    p = _Phases(tty=False)
    p("loading the model")
    deadline = time.monotonic() + 10
    while "loading the model" not in capsys.readouterr().err:
        assert time.monotonic() < deadline, "a phase of over 1 s was never said"
        time.sleep(0.1)
    p("warming up")
    p("")                      # start-up over at once: the warm-up line is dropped
    time.sleep(1.5)
    assert capsys.readouterr().err == ""
    bad = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", "watch",
                          "--pid", "999999999", "--no-live", "--no-history"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
