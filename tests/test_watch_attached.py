"""`watch --attach PID` (issue #27): an unmodified process the test starts — a C function in
a library the test builds, called from a loop pinned to one CPU, and a LiteRT interpreter loop
— is timed by uprobes read from watch's own tracefs instance; a hog on its CPU is named; the
uprobe events are gone after the run, and after a SIGKILLed run the next one removes them.

Root and tracefs with uprobe events are needed (skipped otherwise); every process attached
to or disturbed is one the test started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.trace import uprobe
from agent.watch.config import WatchConfig
from agent.watch.latency.attached import Attached, AttachedReader
from agent.watch.session import WatchSession
from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
LOOP = r"""
import ctypes, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[3])})
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    lib.hft_infer(200000)  # ~0.3 ms: a hog burst lands inside a call often
    time.sleep(0.002)
"""



@pytest.fixture(scope="module")
def lib(infer_lib) -> Path:
    return infer_lib  # tests/conftest.py builds it


def _cpu() -> int:
    return max(os.sched_getaffinity(0))


def _loop(lib: Path, seconds: float = 60):
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(lib), str(seconds), str(_cpu())],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _cfg(pid: int, lib: Path, tmp_path: Path, **kw) -> WatchConfig:
    # (unsafe_return: a C function that cannot throw)
    source = Attached(pid, "loop", symbol=f"{lib.name}:hft_infer", unsafe_return=True)
    return WatchConfig(source=source, probe_cpus=[_cpu()],
                       housekeeping_cpus=[c for c in os.sched_getaffinity(0) if c != _cpu()],
                       duration_s=kw.pop("duration_s", 4), trace="on",
                       spike_log=str(tmp_path / "spikes.jsonl"), **kw)


def _our_groups() -> list[str]:
    return [ln for ln in (TRACEFS / "uprobe_events").read_text().splitlines()
            if f"hftagent_{os.getpid()}/" in ln]


def test_the_calls_of_an_unmodified_process_are_samples(lib, tmp_path):
    needs_uprobes()
    child = _loop(lib)
    try:
        s = WatchSession(_cfg(child.pid, lib, tmp_path))
        assert s.run() == 0, s.warnings
        st = s.source.reader.stats() if s.source.reader else None
        summ = s.summary()
    finally:
        child.kill()
        child.wait()
    assert summ["samples"] >= 200, (summ["samples"], s.warnings)
    assert st is None or st["unpaired_returns"] <= 1
    assert summ["source"].startswith(f"attached to pid {child.pid}")
    assert _our_groups() == []                     # removed at the end of the run
    assert not any(n.startswith(f"hftagent-{os.getpid()}")
                   for n in os.listdir(TRACEFS / "instances"))


def test_a_hog_on_the_attached_process_cpu_is_named(lib, tmp_path):
    needs_uprobes()
    sys.path.insert(0, str(REPO))
    from bench.faults.kit import cpu_hog, rt_permitted
    child = _loop(lib)
    rt = {"rt_prio": 1} if rt_permitted() else {"nice": -10}  # FIFO preempts a busy loop too
    try:
        with cpu_hog(_cpu(), burst_ms=(3.0, 9.7), **rt) as pids:
            s = WatchSession(_cfg(child.pid, lib, tmp_path, duration_s=5))
            assert s.run() == 0, s.warnings
    finally:
        child.kill()
        child.wait()
    recs = [json.loads(x) for x in (tmp_path / "spikes.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("cause")]
    assert len(recs) >= 5, (s.summary()["samples"], s.summary()["causes"], s.warnings)
    contention = [r for r in recs if r["cause"] == "cpu_contention"]
    assert len(contention) / len(recs) >= 0.6, s.summary()["causes"]
    named = [r for r in contention if any(t.get("pid") in pids for t in
                                          r["causes"][0]["evidence"].get("ran_on_cpu", []))]
    assert named, contention[0]["causes"][0]


@pytest.mark.parametrize("as_tuples", [False, True])
def test_pairing_keeps_threads_apart_and_counts_what_it_cannot_pair(as_tuples):
    """The same answer whether the hits are whole events (the general pairing) or the
    source's UprobeHit tuples (the always-on one, issue #38)."""
    from agent.trace.event import Event
    from agent.trace.uprobe import UprobeHit

    class Src:
        hits_are_tuples = as_tuples

        def __init__(self, evs):
            self.evs = evs

        def calls_lost(self):
            return 0

        def uprobe_events(self):
            out, self.evs = self.evs, []
            return out

        def is_return(self, ev):
            return ev.name.startswith("ret")

        def is_return_name(self, name):
            return name.startswith("ret")

    class U:
        group, instances = "g", []

    def ev(t, name, tid, cpu=1):
        return UprobeHit(t, cpu, tid, name) if as_tuples else Event(t, cpu, name, tid, {})

    evs = [ev(100, "call0", 11), ev(110, "call0", 12),
           ev(120, "call0", 12),                      # 12 re-entered: its return was lost
           ev(130, "ret0", 12), ev(140, "ret0", 11),
           ev(150, "ret0", 12), ev(160, "ret0", 13),  # two returns without their entry
           ev(200, "call0", 14), ev(210, "call1", 14),  # another probed function inside
           ev(220, "ret1", 14), ev(230, "ret0", 14),
           ev(300, "call0", 11)]                      # open at the end
    r = AttachedReader.__new__(AttachedReader)
    r.host, r.pid, r.events, r.uprobes, r.entry_only = None, 10, Src(evs), U(), False
    r.calls = r.unpaired_returns = r.open_at_exit = r.resynced = r.lost = r.invalid = 0
    r.lost_returns, r._seq, r._open, r._start, r._lost_seen = 0, 0, {}, {}, 0
    r._tids, r._tids_at = {11, 12, 13, 14}, time.monotonic()
    r.trial, r.on_choice, r._dropped = None, None, set()
    rows = r.read()
    got = sorted((int(x[1]), int(x[2]), int(x[4])) for x in rows)  # start, end, tid
    assert got == [(100, 140, 11), (120, 130, 12), (200, 230, 14)]
    assert r.unpaired_returns == 2 and r.lost_returns == 1
    r.finish()
    assert r.open_at_exit == 1                    # 11's last call never returned


def test_a_trials_choice_forgets_the_losers_open_calls():
    """issue #36: when the trial drops a runtime, its calls open now are forgotten and a
    kept call nested in a loser's starts at its own entry; the losers' later hits are
    skipped."""
    from agent.trace.event import Event
    from agent.trace.trial import Trial

    class Src:
        evs: list = []

        def calls_lost(self):
            return 0

        def uprobe_events(self):
            out, self.evs = self.evs, []
            return out

        def is_return(self, ev):
            return ev.name.startswith("ret")

        def is_return_name(self, name):
            return name.startswith("ret")

        hits_are_tuples = False  # (Events: the general pairing)

    class U:
        group, instances = "g", []

    r = AttachedReader.__new__(AttachedReader)
    r.host, r.pid, r.events, r.uprobes, r.entry_only = None, 10, Src(), U(), False
    r.calls = r.unpaired_returns = r.open_at_exit = r.resynced = r.lost = r.invalid = 0
    r.lost_returns, r._seq, r._open, r._start, r._lost_seen = 0, 0, {}, {}, 0
    r._tids, r._tids_at, r._dropped = {11}, time.monotonic(), set()
    names = {"call0": "a", "ret0": "a", "call1": "b", "ret1": "b"}
    r.trial = Trial(names, ["a", "b"], lambda n: n.startswith("ret"), calls=2)
    r.on_choice = lambda trial: {"call0", "ret0"}   # "b" kept, "a" dropped
    ev = lambda t, n: Event(t, 1, n, 11, {})  # noqa: E731
    r.events.evs = [ev(10, "call1"), ev(20, "ret1"), ev(30, "call1"), ev(40, "ret1"),
                    ev(50, "call0"), ev(60, "call1")]  # decided; b open inside a
    rows = r.read()
    assert r.trial is None and len(rows) == 2
    r.events.evs = [ev(70, "ret1"), ev(80, "ret0"), ev(90, "call0")]
    rows = r.read()
    assert [(int(x[1]), int(x[2])) for x in rows] == [(60, 70)]   # b's own entry
    assert not r._open.get(11) and r.unpaired_returns == 0


def test_a_killed_watch_leaves_events_the_next_run_removes(lib, tmp_path):
    needs_uprobes()
    child = _loop(lib)
    code = (
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from agent.watch.config import WatchConfig\n"
        "from agent.watch.latency.attached import Attached\n"
        "from agent.watch.session import WatchSession\n"
        f"src = Attached({child.pid}, 'loop', symbol={lib.name + ':hft_infer'!r},"
        " unsafe_return=True)\n"
        f"cfg = WatchConfig(source=src, probe_cpus=[{_cpu()}],"
        f" housekeeping_cpus=[0], duration_s=60, trace='on')\n"
        "s = WatchSession(cfg, on_phase=lambda m: None)\n"
        "s.start(); print('attached', flush=True)\n"
        "time.sleep(60)\n")
    w = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "attached"
        group = f"hftagent_{w.pid}/"
        assert group in (TRACEFS / "uprobe_events").read_text()
        # its guardian killed with it (agent/trace/guardian.py): nothing removes them
        import psutil

        from agent.trace.guardian import SCRIPT
        for g in [k for k in psutil.Process(w.pid).children() if SCRIPT in k.cmdline()]:
            g.kill()
        w.send_signal(signal.SIGKILL)
        w.wait()
        assert group in (TRACEFS / "uprobe_events").read_text()  # left by the kill
        s = WatchSession(_cfg(child.pid, lib, tmp_path, duration_s=1))
        assert s.run() == 0, s.warnings
        assert group not in (TRACEFS / "uprobe_events").read_text()
        said = s.warnings + [json.dumps(s.trace.info())]   # the events source's notes
        assert any("removed stale uprobe events" in x for x in said), said
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
        child.kill()
        child.wait()
        for ln in (TRACEFS / "uprobe_events").read_text().splitlines():
            if f"hftagent_{w.pid}/" in ln:   # never leave ours behind, whatever failed
                try:   # its guardian may remove it meanwhile
                    uprobe._append(TRACEFS / "uprobe_events", "-:" + ln.split()[0][2:])
                except FileNotFoundError:
                    pass


CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


def test_cli_attach_metrics_spike_log_and_ctrl_c_leave_nothing(lib, tmp_path):
    """`hftagent watch --attach PID` as a person runs it: its calls reach /metrics and the
    spike log, Ctrl-C (SIGINT) ends it with exit 0 and no uprobe event of it is left."""
    import urllib.request
    needs_uprobes()
    child = _loop(lib)
    log = tmp_path / "spikes.jsonl"
    p = subprocess.Popen([*CLI, "watch", "--attach", str(child.pid), "--attach-symbol",
                          f"{lib.name}:hft_infer", "--unsafe-return", "--duration", "60",
                          "--spike-log", str(log), "--no-live", "--json", "--no-history",
                          "--threshold-us", "1", "--listen", "127.0.0.1:0", "--trace", "on"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("metrics: "):
            line = p.stderr.readline()
            assert line, p.communicate(timeout=30)
        url = line.strip().removeprefix("metrics: ")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (log.exists() and log.stat().st_size > 0):
            time.sleep(0.2)
        assert f"hftagent_{p.pid}/" in (TRACEFS / "uprobe_events").read_text()
        deadline = time.monotonic() + 30
        while True:  # (a condition: the first record can come before the 100th call)
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            count = [ln for ln in body.splitlines()
                     if ln.startswith("hftagent_probe_latency_seconds_count")]
            assert count and float(count[0].split()[-1]) > 0, body[:2000]
            if float(count[0].split()[-1]) > 100 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        info = [ln for ln in body.splitlines() if ln.startswith("hftagent_probe_info{")]
        assert info and 'source="attach"' in info[0], info   # the bounded source label
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        child.kill()
        child.wait()
    assert p.returncode == 0, err
    s = json.loads(out)
    assert s["samples"] > 100 and s["source"].startswith("attached to pid")
    assert log.read_text().strip()                       # spikes (threshold 1 µs) logged
    assert f"hftagent_{p.pid}/" not in (TRACEFS / "uprobe_events").read_text()


def test_cli_attach_bad_input_is_one_line_and_leaves_nothing(lib, tmp_path):
    needs_uprobes()
    child = _loop(lib)
    before = (TRACEFS / "uprobe_events").read_text()
    try:
        for args, msg in ((["--attach", str(child.pid)], "known inference runtime"),
                          (["--attach", str(child.pid), "--attach-symbol",
                            f"{lib.name}:no_such_fn"], "has none of"),
                          (["--attach", "999999999"], "no such process")):
            r = subprocess.run([*CLI, "watch", *args, "--duration", "2", "--no-live",
                                "--no-history", "--trace", "on"], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 1 and msg in r.stderr, (args, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    finally:
        child.kill()
        child.wait()
    assert (TRACEFS / "uprobe_events").read_text() == before


def test_cli_attach_live_view_in_a_terminal(lib):
    needs_uprobes()
    from tests.test_watch_live_perf import ANSI, HEAD, _in_pty
    child = _loop(lib)
    try:
        rc, raw, err = _in_pty(["--attach", str(child.pid), "--attach-symbol",
                                f"{lib.name}:hft_infer", "--unsafe-return", "--duration", "3",
                                "--no-history", "--trace", "on"], base=[*CLI, "watch"])
    finally:
        child.kill()
        child.wait()
    assert rc == 0, err
    text = ANSI.sub("", raw)
    heads = [int(m.group(2)) for m in HEAD.finditer(text)]   # samples in each refresh
    assert heads and max(heads) > 100, text[-2000:]


def test_cli_attach_refuses_a_library_another_user_may_write(lib, tmp_path):
    """issue #34: a world-writable library is refused in one line before any event is
    defined (whoever may write it could change the code root's probe lands in)."""
    needs_uprobes()
    import shutil
    ww = tmp_path / "libhftww.so"
    shutil.copy(lib, ww)
    os.chmod(ww, 0o777)
    child = _loop(ww)
    before = (TRACEFS / "uprobe_events").read_text()
    try:
        r = subprocess.run([*CLI, "watch", "--attach", str(child.pid), "--attach-symbol",
                            f"{ww.name}:hft_infer", "--duration", "2", "--no-live",
                            "--no-history", "--trace", "on"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    finally:
        child.kill()
        child.wait()
    assert r.returncode == 1 and "writable by every user" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert (TRACEFS / "uprobe_events").read_text() == before


def test_cli_attach_unsafe_library_accepts_a_world_writable_library(lib, tmp_path):
    """The refusal above, overridden: with --attach-unsafe-library watch times the calls of
    the same world-writable library, and says nothing is left behind."""
    needs_uprobes()
    import shutil
    ww = tmp_path / "libhftww.so"
    shutil.copy(lib, ww)
    os.chmod(ww, 0o777)
    child = _loop(ww)
    try:
        w = subprocess.Popen([*CLI, "watch", "--attach", str(child.pid), "--attach-symbol",
                              f"{ww.name}:hft_infer", "--unsafe-return",
                              "--attach-unsafe-library", "--duration", "2", "--no-live",
                              "--no-history", "--trace", "on", "--json"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = w.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert w.returncode == 0, err
    assert json.loads(out)["samples"] > 0
    # (its own group only: other tests on the box define and remove theirs meanwhile)
    assert f"hftagent_{w.pid}/" not in (TRACEFS / "uprobe_events").read_text()


def test_attach_unsafe_library_without_attach_is_refused():
    from agent.errors import AgentError
    from agent.watch import latency
    from collectors.host import Host
    with pytest.raises(AgentError, match="--attach-unsafe-library is for --attach"):
        latency.choose(Host(), latency.Given(probe="numpy", attach_unsafe_library=True))
    src = latency.choose(Host(), latency.Given(attach=os.getpid(),
                                               attach_unsafe_library=True))
    assert src.unsafe_library


def test_only_lost_calls_restart_the_pairing_not_lost_kernel_events():
    """The timed calls have rings of their own (agent/trace/calls.py): events the kernel
    rings lost (a storm of sched/irq events) leave an open call open; hits the calls rings
    lost make the pairing start again from a clean state (``resynced``)."""
    from agent.trace.event import Event

    class Src:
        def __init__(self):
            self.evs, self.kernel_lost, self.calls = [], 0, 0

        def lost(self):
            return self.kernel_lost

        def calls_lost(self):
            return self.calls

        def uprobe_events(self):
            out, self.evs = self.evs, []
            return out

        def is_return(self, ev):
            return ev.name.startswith("ret")

        def is_return_name(self, name):
            return name.startswith("ret")

        hits_are_tuples = False  # (Events: the general pairing)

    class U:
        group, instances = "g", []

    src = Src()
    r = AttachedReader.__new__(AttachedReader)
    r.host, r.pid, r.events, r.uprobes, r.entry_only = None, 10, src, U(), False
    r.calls = r.unpaired_returns = r.open_at_exit = r.resynced = r.lost = r.invalid = 0
    r.lost_returns, r._seq, r._open, r._start, r._lost_seen = 0, 0, {}, {}, 0
    r._tids, r._tids_at = {11}, time.monotonic()
    r.trial, r.on_choice, r._dropped = None, None, set()
    src.evs = [Event(100, 1, "call0", 11, {})]
    assert len(r.read()) == 0
    src.kernel_lost, src.evs = 500, [Event(200, 1, "ret0", 11, {})]
    assert [(int(x[1]), int(x[2])) for x in r.read()] == [(100, 200)] and r.resynced == 0
    src.evs = [Event(300, 1, "call0", 11, {})]
    r.read()
    src.calls, src.evs = 1, [Event(400, 1, "ret0", 11, {})]
    assert len(r.read()) == 0 and r.resynced == 1 and r.unpaired_returns == 1
