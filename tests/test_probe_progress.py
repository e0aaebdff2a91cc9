"""probe on a long run (issue #28 items 2 and 3): a progress line per phase from the first
second (one plain line each on a pipe); --samples keeps a time budget and the report says
which ended the run; Ctrl-C prints what finished, marked partial, and leaves no worker; an
open loop that cannot keep its schedule is saturated, with or without --duration, and never
recommended. Real runs use the TF-free numpy model (no TensorFlow import: seconds)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from agent.cli import get_app

runner = CliRunner()
NUMPY = ("probe", "--model", "numpy", "--no-history", "--warmup", "5")


def probe(*args: str, env: dict | None = None):
    return runner.invoke(get_app(), [*NUMPY, *args], env=env or {"COLUMNS": "80"})


# -- the time budget --------------------------------------------------------------------------
def _settings(**kw):
    from agent.probe import options
    base = dict(model="numpy", builtin=None, signature=None, shape=None, input_data="random",
                variant=None, samples=None, duration=None, warmup=5, rate=None,
                threshold_us=5000.0, calib=None, intra=None, inter=None, cpus=None,
                sweep=None, batch="1", idle_gaps=None)
    base.update(kw)
    return options.build(**base)[0]


def test_samples_keep_the_time_budget_for_probe():
    """`--samples 700` dropped the 6 s budget: eager + tflite-int8 ran 6 min 52 s in
    silence."""
    s = _settings(samples=700, keep_budget=True)
    assert (s.samples, s.duration_s) == (700, 6.0)
    s = _settings(samples=700, duration=2.0, keep_budget=True)
    assert (s.samples, s.duration_s) == (700, 2.0)
    s = _settings(samples=30, idle_gaps="0,1ms", keep_budget=True)
    assert (s.samples, s.duration_s) == (30, 60.0)
    s = _settings(samples=700)  # the gate's verdict needs its samples: no budget there
    assert (s.samples, s.duration_s) == (700, None)


def test_the_report_says_which_ended_the_run():
    res = probe("--samples", "100000", "--duration", "0.3", "--json")
    assert res.exit_code == 0, res.output
    (r,) = json.loads(res.stdout)["runs"]
    assert r["timed_budget_hit"] and any(n.startswith("time budget 0.3 s reached after")
                                         for n in r["notes"])
    out = probe("--samples", "100000", "--duration", "0.3").stdout
    assert "ended by: time budget" in out and "time budget 0.3 s reached after" in out
    assert "a run ends at: 100,000 samples or 0.3 s, whichever comes first" in out
    out = probe("--samples", "20").stdout
    assert "ended by: sample count" in out and "20 samples or 6 s" in out


# -- progress ---------------------------------------------------------------------------------
def test_progress_on_a_pipe_is_one_line_per_phase():
    res = probe("--samples", "20", "--batch", "1,2")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("hftagent probe: ")]
    phases = [ln.removeprefix("hftagent probe: ") for ln in lines]
    assert phases[0] == "starting the worker, loading the model"
    for b in (1, 2):
        for what in ("building (convert / compile)", "first call", "warming up",
                     "timing up to 20 samples", "done (ok)"):
            assert any(p.startswith(f"numpy batch {b}: {what}") for p in phases), phases
    assert len(phases) == len(set(phases))  # one line each, never repeated


def test_progress_starts_before_the_worker_reports():
    """The first line is printed before the worker has loaded anything (within the first
    second of a command whose model load can take ~20 s), and flushed at once."""
    from agent.probe.progress import describe, progress_hook

    class Pipe:
        lines: list[str] = []

        def write(self, s):
            Pipe.lines.append(s)

        def flush(self):
            pass

        def isatty(self):
            return False
    with progress_hook(stream=Pipe()) as hook:
        hook(0, 1, {"event": "worker", "phase": "load"})
        assert Pipe.lines[0].startswith("hftagent probe: starting the worker")
    assert describe(0, 2, {"event": "task", "variant": "xla", "batch": 1, "phase": "timed",
                           "n": 6636, "expected_s": 3.2}) == \
        "[1/2] xla batch 1: timing up to 6,636 samples, ~3.2 s"


# -- saturation -------------------------------------------------------------------------------
def _open_samples(n: int, rate_hz: float, service_ns: int, own_ns: int = 2_000,
                  stall: dict[int, int] | None = None):
    """An open loop that is back to back once behind: each call starts when the last one
    ended plus the loop's own cost, never before its intended time; ``stall``: calls that
    take that much longer."""
    from agent.probe.harness import COLUMNS, Samples
    period = 1e9 / rate_hz
    data = np.zeros((len(COLUMNS), n), dtype=np.int64)
    t = 0
    for i in range(n):
        intended = int(i * period)
        start = max(intended + 1_000, t + own_ns)
        took = service_ns + (stall or {}).get(i, 0)
        data[0, i], data[1, i], data[2, i] = intended, start, start + took
        t = start + took
    return Samples(data, open_loop=True, rate_hz=rate_hz)


def test_saturation_is_the_offered_load_not_a_deadline():
    from agent.probe.runner import saturation
    sat = saturation(_open_samples(1000, 5000.0, 500_000))  # 5000/s of 500 µs calls
    assert sat["saturated"] and 2.4 < sat["utilisation"] < 2.7
    assert sat["behind_ns"] > 200_000_000  # 1000 x 300 µs behind by the end
    ok = saturation(_open_samples(1000, 1000.0, 300_000))
    assert not ok["saturated"] and ok["utilisation"] < 0.5
    # one stall of 20 ms in an otherwise easy run: a queue that drains, not saturation
    s = _open_samples(1000, 1000.0, 300_000, stall={10: 20_000_000})
    assert s.data[1, 11] > s.data[0, 11] + 10_000_000  # the queue it left behind
    assert not saturation(s)["saturated"]


def test_a_saturated_open_loop_is_marked_and_never_recommended():
    """`probe --rate 5000 --samples 1000`: no deadline is reached, no request is unserved,
    yet the loop falls behind from the first calls: it was "◀ best"."""
    res = probe("--rate", "5000", "--samples", "700", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (r,) = doc["runs"]
    assert r["unserved"] == 0 and r["saturation"]["saturated"], r["saturation"]
    assert not r["recommended"] and doc["recommendation"] is None
    assert any(n.startswith("saturated: 5000 calls/s offered") for n in r["notes"])
    from agent.probe.result import RunResult
    from agent.probe.runner import eligible
    assert "saturated at 5000/s" in eligible(RunResult.from_dict(r))[1]
    out = probe("--rate", "5000", "--samples", "700").stdout
    assert "[saturated] numpy  batch 1" in out and "best" not in out
    assert re.search(r"numpy: saturated at 5000/s \(offered load [0-9.]+x", out), out


def test_an_open_loop_that_keeps_up_is_not_saturated():
    res = probe("--rate", "100", "--samples", "30", "--json")
    assert res.exit_code == 0, res.output
    (r,) = json.loads(res.stdout)["runs"]
    assert not r["saturation"]["saturated"] and r["saturation"]["utilisation"] < 1


# -- Ctrl-C -----------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stopped_probe_prints_what_finished_and_leaves_no_worker(tmp_path, sig):
    """The first run (batch 1) finishes; the second (batch 512: each call 512x the work)
    is stopped in its timed loop: the first is printed with its figures, the second as not
    run, the whole marked partial; the worker is gone when the parent exits; 130/143."""
    env = dict(os.environ, COLUMNS="80", HFTAGENT_DB=str(tmp_path / "h.sqlite"))
    p = subprocess.Popen([sys.executable, "-m", "agent.cli", *NUMPY, "--batch", "1,512",
                          "--samples", "400", "--duration", "120"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = None
    seen = []
    try:
        assert p.stderr is not None
        for line in p.stderr:
            seen.append(line)
            if "numpy batch 512: timing" in line:
                break
        else:
            pytest.fail("no timing phase: " + "".join(seen))
        kids = _children(p.pid)
        assert kids, "no worker"
        worker = kids[0]
        time.sleep(0.2)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, (p.returncode, out, err)
    assert not _alive(worker), "the worker outlived the probe"
    assert out.startswith(f"partial result: stopped by {sig.name}")
    assert re.search(r"^  \[[a-z -]+\] numpy  batch 1$", out, re.M), out
    assert re.search(r"P50: [0-9,.]+ µs", out)
    assert "[failed] numpy  batch 512" in out and "not run: stopped" in out
    assert f"probe stopped by {sig.name}" in err
    # a part is not a contest: no variant is recommended from it (issue #39)
    assert "recommendation: none — the run was stopped" in out
    assert not re.search(r"^recommendation: numpy", out, re.M), out
    from agent.history import db_exists
    assert not db_exists(str(tmp_path / "h.sqlite"))  # a partial run is not recorded
