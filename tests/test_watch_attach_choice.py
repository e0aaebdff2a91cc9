"""`watch --attach PID` chooses the runtime whose calls arrive (issue #36 build 1): with
several runtimes mapped, every candidate is armed, the trial (agent/trace/trial.py) keeps
the outermost one per call and drops the others. A TF2 Keras model through `tf.function`, a
TF1 `Session.run` loop and a LiteRT loop — each counting its own calls — are timed with the
default choice (≥ 90 % of their calls); a TF process that makes no call gets the stderr line
and exit 4, and `attach --check` lists its candidates, the choice made by trial.

The real tests need root and tracefs with uprobe events (skipped otherwise), and TensorFlow
or LiteRT in the venv; each starts one process of its own (TF's import takes seconds) and
attaches only to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.trace.attach import Plan, Target, check_text
from agent.trace.trial import Trial
from agent.watch.config import WatchConfig
from agent.watch.latency.attached import EXIT_NOTHING_TIMED, Attached
from agent.watch.session import WatchSession
from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]

# A service that counts its own calls: it loads its model, says "ready", starts calling when
# a line arrives on stdin, and on SIGTERM stops and prints how many calls it made.
SERVICE = r"""
import os, signal, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.sched_setaffinity(0, {int(sys.argv[2])})
kind, stop = sys.argv[1], []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
if kind == "keras":
    import tensorflow as tf
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(16,
                                 activation="relu"), tf.keras.layers.Dense(4)])
    f, x = tf.function(model), tf.random.normal([4, 32])
    call = lambda: f(x)
elif kind == "tf1":
    import numpy as np
    import tensorflow as tf
    g = tf.Graph()
    with g.as_default():
        ph = tf.compat.v1.placeholder(tf.float32, [4, 32])
        out = tf.nn.relu(tf.matmul(ph, tf.ones([32, 16])))
    sess, feed = tf.compat.v1.Session(graph=g), {ph: np.ones((4, 32), np.float32)}
    call = lambda: sess.run(out, feed)
elif kind == "litert":
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=sys.argv[3])
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    it.set_tensor(inp["index"], np.zeros(inp["shape"], inp["dtype"]))
    call = it.invoke
else:  # "idle": TF loaded, no inference ever
    import tensorflow as tf
    call = None
if call is not None:
    call()  # warm-up (traced or compiled), not counted
print("ready", flush=True)
sys.stdin.readline()
n = 0
while not stop:
    if call is None:
        time.sleep(0.05)
        continue
    call()
    n += 1
    time.sleep(0.002)
print(n, flush=True)
sys.stdin.readline()  # alive until told: watch is stopped first
"""


def _needs(module: str) -> None:
    needs_uprobes(cpus=2)
    pytest.importorskip(module)


def _cpu() -> int:
    return max(os.sched_getaffinity(0))


def _service(kind: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SERVICE, kind, str(_cpu()), *args],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        pytest.fail(f"the {kind} service did not start: {line!r}")
    return p


def _timed(kind: str, *args: str) -> tuple[int, int, dict]:
    return _run_timed(_service(kind, *args))


def _run_timed(svc: subprocess.Popen) -> tuple[int, int, dict]:
    """(calls the service made, calls watch timed, the attach info) for a service whose
    calls all fall inside the attached run: it starts calling once the probes are armed and
    stops (SIGTERM) before watch does."""
    cfg = WatchConfig(source=Attached(svc.pid, "python"), probe_cpus=[_cpu()],
                      housekeeping_cpus=[c for c in os.sched_getaffinity(0) if c != _cpu()],
                      duration_s=120, trace="on")
    s = WatchSession(cfg, on_phase=lambda m: None)
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(s.run()), daemon=True)
    try:
        t.start()
        deadline = time.monotonic() + 90  # (TF's 788 MB library: its symbols read cold)
        while s.source.reader is None and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.source.reader is not None, s.warnings
        svc.stdin.write("go\n")
        svc.stdin.flush()
        time.sleep(4)
        svc.send_signal(signal.SIGTERM)
        made = int(svc.stdout.readline())
        time.sleep(1.0)  # the last calls' events read
    finally:
        s.request_stop()
        t.join(60)
        svc.kill()
        svc.wait()
    assert rc == [0], s.warnings
    return made, s.samples, s.source.info


@pytest.mark.slow
def test_a_keras_model_through_tf_function_is_timed_by_default():
    _needs("tensorflow")
    made, timed, info = _timed("keras")
    assert made >= 100, made
    assert info["attach"]["candidates"][0:1] and "tf-python" in info["attach"]["candidates"]
    assert info["attach"]["chosen"]["runtime"] == "tf-python", info["attach"]
    assert timed >= 0.9 * made and timed <= made, (timed, made)


@pytest.mark.slow
def test_a_tf1_session_loop_is_timed_by_its_outermost_call():
    _needs("tensorflow")
    made, timed, info = _timed("tf1")
    assert made >= 100, made
    chosen = info["attach"]["chosen"]
    assert chosen["runtime"] == "tf-c", chosen          # TF_SessionRun, not inside it
    assert chosen["counts"]["tf-session"]["inside"].get("tf-c"), chosen
    assert timed >= 0.9 * made and timed <= made, (timed, made)


@pytest.mark.slow
def test_a_litert_loop_is_timed_by_default():
    _needs("ai_edge_litert")
    made, timed, info = _timed("litert", str(REPO / "bench/models/lstm-64x32.tflite"))
    assert made >= 100, made
    assert info["attach"]["candidates"][0] == "litert"  # (its wheel maps libLiteRt.so too)
    if len(info["attach"]["candidates"]) > 1:
        assert info["attach"]["chosen"]["runtime"] == "litert", info["attach"]
    assert timed >= 0.9 * made and timed <= made, (timed, made)


@pytest.mark.slow
def test_a_tf_process_that_makes_no_call_is_said_and_exits_non_zero():
    _needs("tensorflow")
    svc = _service("idle")
    try:
        w = subprocess.Popen([*CLI, "watch", "--attach", str(svc.pid), "--duration", "7",
                              "--no-live", "--no-history", "--trace", "on", "--json"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        out, err = w.communicate(timeout=180)
        r = subprocess.CompletedProcess(w.args, w.returncode, out, err)
        chk = subprocess.run([*CLI, "attach", str(svc.pid), "--check"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    finally:
        svc.kill()
        svc.wait()
    assert r.returncode == EXIT_NOTHING_TIMED, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "nothing timed" in ln]
    assert len(said) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "armed: " in said[0] and "tf-python" in said[0] and "tf-c" in said[0], said
    assert "try --attach-symbol" in said[0], said
    assert json.loads(r.stdout)["samples"] == 0
    assert f"hftagent_{w.pid}/" not in (TRACEFS / "uprobe_events").read_text()
    assert chk.returncode == 0, chk.stderr
    assert "by trial at attach time" in chk.stdout, chk.stdout
    for rt in ("tf-c", "tf-python", "tf-session"):
        assert f"runtime   {rt}:" in chk.stdout, chk.stdout


# -- the trial's counting, on events given by hand ------------------------------------------

def _trial(**kw) -> Trial:
    runtime_of = {"call0": "tf-c", "ret0": "tf-c", "call1": "tf-python", "ret1": "tf-python",
                  "call2": "tf-session", "ret2": "tf-session"}
    return Trial(runtime_of, ["tf-c", "tf-python", "tf-session"],
                 lambda n: n.startswith("ret"), **kw)


def test_the_outermost_runtime_wins_and_the_nested_one_is_counted_inside():
    t = _trial(calls=3)
    for i in range(3):
        base = 1000 * i
        for name, ts in (("call0", 1), ("call2", 2), ("ret2", 3), ("ret0", 4)):
            t.feed(7, name, base + ts)
    assert t.winner() == "tf-c"
    assert t.tally["tf-session"].inside == {"tf-c": 3} and t.tally["tf-session"].outermost == 0
    assert t.decided(now_ns=3000)
    assert t.counts() == "tf-c 3 outermost; tf-python 0; tf-session 3 (3 inside tf-c)"


def test_threads_are_apart_and_a_lost_return_starts_afresh():
    t = _trial()
    t.feed(1, "call0", 10)
    t.feed(2, "call1", 11)      # another thread: outermost too, not inside tf-c
    t.feed(1, "call0", 20)      # thread 1's first return was lost
    t.feed(1, "call1", 21)      # inside thread 1's open tf-c call
    assert t.tally["tf-c"].outermost == 2 and t.tally["tf-python"].outermost == 1
    assert t.tally["tf-python"].inside == {"tf-c": 1}
    t.feed(3, "ret1", 30)       # a return without its entry: nothing
    assert t.tally["tf-python"].entries == 2


def test_nothing_is_decided_before_a_call_and_time_decides_a_slow_caller():
    t = _trial(calls=20, seconds=2.0)
    assert t.winner() is None and not t.decided(now_ns=10**12)
    t.feed(5, "call1", 1_000_000_000)
    t.feed(5, "ret1", 1_000_100_000)
    assert t.winner() == "tf-python" and not t.decided(now_ns=2_500_000_000)
    assert t.decided(now_ns=3_000_000_000)


def test_a_tie_goes_to_the_catalogue_order():
    t = _trial()
    t.feed(1, "call1", 1)
    t.feed(1, "ret1", 2)
    t.feed(1, "call0", 3)
    t.feed(1, "ret0", 4)
    assert t.winner() == "tf-c"


def test_attach_check_says_the_choice_is_made_by_trial():
    def tgt(rt: str, shown: str) -> Target:
        return Target(rt, "/x/lib.so", "/proc/1/map_files/1-2", shown, shown, 0x10,
                      "push %rbp", ".dynsym", True)
    p = Plan(1, "python", [tgt("tf-c", "TF_SessionRun"),
                           tgt("tf-python", "TFE_Py_ExecuteCancelable")])
    text = "\n".join(check_text(p))
    assert "by trial at attach time" in text and "(tf-c, tf-python)" in text
    assert p.to_dict()["candidates"] == ["tf-c", "tf-python"]
    one = Plan(1, "python", [tgt("litert", "Invoke")])
    assert "by trial" not in "\n".join(check_text(one)) and one.to_dict()["choice"] is None


# -- the same choice without TensorFlow: two libraries named and shaped as TF's -------------

FAKE_TF_C = r"""
/* TF_SessionRun calling DirectSession::Run inside it (through a volatile pointer: not
   inlined), as libtensorflow_cc.so.2 does; the mangled name is TF 2.21's. */
int ds_run(int n) __asm__("_ZN10tensorflow13DirectSession3RunERKNS_10RunOptionsERKSt6vectorISt4p"
    "airINSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEENS_6TensorEESaISD_EERKS4_ISB_SaI"
    "SB_EESL_PS4_ISC_SaISC_EEPNS_11RunMetadataERKN3tsl6thread17ThreadPoolOptionsE");
int ds_run(int n) { volatile int s = 0; for (int i = 0; i < n; i++) s += i; return s; }
int (*volatile ds)(int) = ds_run;
int TF_SessionRun(int n) { return ds(n) + 1; }
"""
FAKE_TF_PY = r"""
int tfe(int n) __asm__("_Z24TFE_Py_ExecuteCancelableP11TFE_ContextPKcS2_fake");
int tfe(int n) { volatile int s = 0; for (int i = 0; i < n; i++) s += i; return s; }
"""
FAKE_SERVICE = r"""
import ctypes, os, signal, sys, time
os.sched_setaffinity(0, {int(sys.argv[3])})
c = ctypes.CDLL(sys.argv[1] + "/libtensorflow_cc.so.2")
py = ctypes.CDLL(sys.argv[1] + "/lib_pywrap_tensorflow_common.so")
call = c.TF_SessionRun if sys.argv[2] == "c" else \
    getattr(py, "_Z24TFE_Py_ExecuteCancelableP11TFE_ContextPKcS2_fake")
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
sys.stdin.readline()
n = 0
while not stop:
    call(100000)
    n += 1
    time.sleep(0.002)
print(n, flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def fake_tf(tmp_path_factory) -> Path:
    import shutil
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("faketf")
    for src, name in ((FAKE_TF_C, "libtensorflow_cc.so.2"),
                      (FAKE_TF_PY, "lib_pywrap_tensorflow_common.so")):
        (d / "x.c").write_text(src)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(d / name), str(d / "x.c")],
                       check=True)
    return d


@pytest.mark.parametrize("api, chosen", [("c", "tf-c"), ("py", "tf-python")])
def test_the_outermost_runtime_that_fires_is_kept_without_tensorflow(fake_tf, api, chosen):
    _needs("ctypes")
    svc = subprocess.Popen([sys.executable, "-c", FAKE_SERVICE, str(fake_tf), api,
                            str(_cpu())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    assert svc.stdout.readline().strip() == "ready"
    made, timed, info = _run_timed(svc)
    assert info["attach"]["candidates"] == ["tf-c", "tf-python", "tf-session"]
    got = info["attach"]["chosen"]
    assert got["runtime"] == chosen, got
    if api == "c":   # DirectSession::Run fired, inside TF_SessionRun: not chosen
        assert got["counts"]["tf-session"]["inside"].get("tf-c"), got
    assert made >= 100 and made * 0.9 <= timed <= made, (timed, made)


def test_no_call_at_all_is_said_once_and_exits_4_without_tensorflow(fake_tf):
    _needs("ctypes")
    svc = subprocess.Popen([sys.executable, "-c", FAKE_SERVICE, str(fake_tf), "c",
                            str(_cpu())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        assert svc.stdout.readline().strip() == "ready"   # and never told to start
        r = subprocess.run([*CLI, "watch", "--attach", str(svc.pid), "--duration", "6",
                            "--no-live", "--no-history", "--trace", "on"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        short = subprocess.run([*CLI, "watch", "--attach", str(svc.pid), "--duration", "1",
                                "--attach-runtime", "tf-python", "--no-live",
                                "--no-history", "--trace", "on"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        svc.kill()
        svc.wait()
    assert r.returncode == EXIT_NOTHING_TIMED, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "nothing timed" in ln]
    assert len(said) == 1 and "armed: tf-c TF_SessionRun; tf-python" in said[0], r.stderr
    assert "libtensorflow_cc.so.2" not in said[0].split("also maps")[-1], said
    # a run shorter than the quiet time says it at its end; a runtime not armed is the hint
    assert short.returncode == EXIT_NOTHING_TIMED, short.stderr
    said = [ln for ln in short.stderr.splitlines() if "nothing timed" in ln]
    assert len(said) == 1 and "try --attach-runtime tf-c or tf-session" in said[0], said
