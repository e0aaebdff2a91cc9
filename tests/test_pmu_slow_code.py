"""agent/watch/attribution/pmu.py: a slow call that kept its CPU told apart by its counters —
more work (instructions up), slower (IPC down), a lower clock (cycles / on-CPU ns down) or
nothing special — from synthetic counts; the on-CPU rule ``slow_code``; and ``watch --attach
--pmu`` end to end on a traced child: with software counters (what this box has) every call
is counted and joined, and with the hardware ones a box without a PMU says
``pmu: unsupported: ...`` once, never a 0, and ``--pmu on`` exits 2 with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.trace import pmu as trace_pmu
from agent.watch.attribution import pmu, verdict
from agent.watch.attribution.spike import Spike
from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
BASE = {"instructions": 1e6, "ipc": 2.0, "ghz": 3.0, "on_cpu_ns": 166_667.0}


def _call(instructions=1e6, ipc=2.0, ghz=3.0) -> dict:
    return {"instructions": instructions, "ipc": ipc, "ghz": ghz,
            "on_cpu_ns": instructions / ipc / ghz}


@pytest.mark.parametrize("call, kind", [
    (_call(instructions=2.5e6), "more_work"),            # 2.5× the instructions
    (_call(ipc=0.9), "lower_ipc"),                       # same work, half the IPC
    (_call(ghz=1.8), "lower_clock"),                     # same work and IPC, 60 % clock
    (_call(instructions=1.1e6, ipc=1.9, ghz=2.9), None),  # a little of each: nothing special
    (_call(), None),
])
def test_the_three_factors_and_nothing_special(call, kind):
    got = pmu.classify(call, BASE)
    assert got["kind"] == kind, got


def test_the_largest_factor_names_a_call_where_two_moved_and_shares_sum_to_one():
    got = pmu.classify(_call(instructions=1.3e6, ipc=0.8), BASE)   # 1.3× work, 0.4× IPC
    assert got["kind"] == "lower_ipc"
    assert abs(sum(got["shares"].values()) - 1) < 0.01
    assert got["shares"]["lower_ipc"] > got["shares"]["more_work"] > 0
    # faster in one factor, slower in another: only a factor that grew the time names it
    assert pmu.classify(_call(instructions=3e6, ipc=4.0, ghz=3.0), BASE)["kind"] == "more_work"


def test_metrics_need_cycles_instructions_and_time_never_a_zero():
    assert pmu.metrics({"task_clock_ns": 5, "page_faults": 0}) is None   # software only
    assert pmu.metrics({"cycles": 0, "instructions": 5, "task_clock_ns": 5}) is None
    m = pmu.metrics({"cycles": 3000, "instructions": 6000, "task_clock_ns": 1000})
    assert m == {"instructions": 6000.0, "ipc": 2.0, "ghz": 3.0, "on_cpu_ns": 1000.0}


class _Counters:
    """What PerCall reads of agent.trace.pmu.Counters."""

    entries, returns = ["call0"], ["ret0"]
    counters = trace_pmu.HARDWARE
    groups: dict = {}
    failed: dict = {}
    lost = opened = 0

    def read(self):
        return 0

    def close(self):
        pass


def _per_call(n=100) -> pmu.PerCall:
    per = pmu.PerCall(_Counters())
    for i in range(n):   # the baseline: 1 M instructions at IPC 2, 3 GHz (167 µs)
        per.add(7, i * 1_000_000, {"cycles": 500_000, "instructions": 1_000_000,
                                   "task_clock_ns": 166_667})
    return per


def _tl(**kw) -> dict:
    tl = {"cpu": 3, "wall_us": 600.0, "probe_run_us": 600.0, "preemptions": 0, "blocks": 0,
          "migrations": 0, "state_us": {"on_cpu": 600.0, "runnable": 0.0}}
    tl.update(kw)
    return {"timeline": tl}


def _spike(start_ns: int) -> Spike:
    return Spike(seq=1, start_ns=start_ns, end_ns=start_ns + 600_000, pid=1, tid=7,
                 p50_ns=170_000)


@pytest.mark.parametrize("counts, kind, words", [
    ({"cycles": 1_500_000, "instructions": 3_000_000, "task_clock_ns": 500_000},
     "more_work", "did more work: 3,000,000 instructions, 3.00× its median 1,000,000"),
    ({"cycles": 1_500_000, "instructions": 1_000_000, "task_clock_ns": 500_000},
     "lower_ipc", "ran slower (lower IPC: cache/memory): IPC 0.67 against its median 2.00"),
    ({"cycles": 500_000, "instructions": 1_000_000, "task_clock_ns": 500_000},
     "lower_clock", "ran at a lower clock: 1.00 GHz (cycles / on-CPU ns) against its median "
                    "3.00 GHz"),
])
def test_the_rule_names_slow_code_with_its_evidence(counts, kind, words):
    per = _per_call()
    per.add(7, 555, counts)
    body: dict = {}
    assert pmu.annotate(per, _spike(555), body) is body["pmu"]
    got = pmu.slow_code(body, _tl(), {}, 430_000)
    assert got["cause"] == "slow_code" and got["evidence"]["kind"] == kind
    assert words in got["detail"], got["detail"]
    assert got["evidence"]["baseline"]["ipc"] == 2.0 and got["score"] > 0.5
    # through the on-CPU rules: it leads a call the polled rules left unexplained
    rec = {"cause": "unexplained", "causes": [], "pmu": body["pmu"]}
    assert verdict.on_cpu(rec, _tl(), {}, 430_000) and rec["cause"] == "slow_code"
    assert rec["decided_by"] == "events"


def test_the_rule_stays_silent_where_the_call_left_its_cpu_or_nothing_moved():
    per = _per_call()
    per.add(7, 555, {"cycles": 1_500_000, "instructions": 3_000_000, "task_clock_ns": 500_000})
    body: dict = {}
    pmu.annotate(per, _spike(555), body)
    assert pmu.slow_code(body, _tl(preemptions=1), {}, 430_000) is None
    assert pmu.slow_code(body, _tl(state_us={"on_cpu": 100.0, "blocked": 500.0}), {},
                         430_000) is None
    per.add(7, 777, {"cycles": 500_000, "instructions": 1_000_000, "task_clock_ns": 166_667})
    same: dict = {}
    pmu.annotate(per, _spike(777), same)
    assert same["pmu"]["slow_code"]["kind"] is None
    assert pmu.slow_code(same, _tl(), {}, 430_000) is None
    assert pmu.annotate(per, _spike(999), {}) is None          # a call not counted
    few = _per_call(n=5)
    few.add(7, 555, {"cycles": 1, "instructions": 3, "task_clock_ns": 5})
    thin: dict = {}
    pmu.annotate(few, _spike(555), thin)
    assert "baseline" not in thin["pmu"] and pmu.slow_code(thin, _tl(), {}, 1) is None


def test_slow_code_is_a_cause_the_exporter_counts():
    from agent.causes import CAUSES
    from agent.export.metrics import CAUSES as EXPORTED
    assert "slow_code" in CAUSES and "slow_code" in EXPORTED
    assert verdict.ON_CPU_RULES[-1] is pmu.slow_code


# ---- end to end on a traced child --------------------------------------------------------

LOOP = r"""
import ctypes, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[3])})
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
i = 0
while time.monotonic() < end:
    i += 1
    lib.hft_infer(1000000 if i % 50 == 0 else 100000)  # every 50th call: 10x the work
    time.sleep(0.002)
"""


def _cpu() -> int:
    return max(os.sched_getaffinity(0))


def _loop(lib: Path, seconds: float = 60):
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(lib), str(seconds), str(_cpu())],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _cfg(pid: int, lib: Path, tmp_path: Path, **kw):
    from agent.watch.config import WatchConfig
    from agent.watch.latency.attached import Attached
    source = Attached(pid, "loop", symbol=f"{lib.name}:hft_infer", unsafe_return=True)
    return WatchConfig(source=source, probe_cpus=[_cpu()],
                       housekeeping_cpus=[c for c in os.sched_getaffinity(0) if c != _cpu()],
                       duration_s=kw.pop("duration_s", 3), trace="on",
                       spike_log=str(tmp_path / "spikes.jsonl"), **kw)


def _links() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return out


def _ours() -> list[str]:
    return [ln for ln in (TRACEFS / "uprobe_events").read_text().splitlines()
            if f"hftagent_{os.getpid()}/" in ln]


def test_every_attached_call_is_counted_and_joined_with_software_counters(
        infer_lib, tmp_path, monkeypatch):
    needs_uprobes()
    from agent.watch.session import WatchSession
    monkeypatch.setattr(pmu, "COUNTERS", trace_pmu.SOFTWARE)
    child = _loop(infer_lib)
    why = trace_pmu.probe(child.pid, trace_pmu.SOFTWARE)
    if why:   # (a sandbox whose seccomp refuses perf_event_open)
        child.kill()
        child.wait()
        pytest.skip(why)
    seen: dict = {}
    real_feed = pmu.PerCall.feed
    from agent.client import FIELDS
    ti, si, ei = FIELDS.index("tid"), FIELDS.index("start_ns"), FIELDS.index("end_ns")

    def feed(self, rows):   # each row's counts as joined, kept for the checks below
        real_feed(self, rows)
        for r in rows:
            got = self.of(r[ti], r[si])
            if got is not None:
                seen[(r[ti], r[si])] = (got, r)
    monkeypatch.setattr(pmu.PerCall, "feed", feed)
    fds = _links()
    try:
        s = WatchSession(_cfg(child.pid, infer_lib, tmp_path))
        assert s.run() == 0, s.warnings
        calls = s.source.reader.stats()["calls"] if s.source.reader else 0
        summ = s.summary()
    finally:
        child.kill()
        child.wait()
    assert isinstance(s.pmu, pmu.PerCall), s.pmu.stats()
    st = summ["pmu"]
    assert st["counters"] == ["context_switches", "page_faults", "task_clock_ns"]
    assert calls >= 200 and st["calls_counted"] >= 0.95 * calls, (calls, st)
    assert st["calls_multiplexed"] == 0 and st["threads"] >= 1
    for counts, row in seen.values():   # on-CPU ns inside the call's wall time, never 0
        wall = row[ei] - row[si]
        assert 0 < counts["task_clock_ns"] <= wall + 100_000, (counts, wall)
    assert len(seen) >= 0.9 * st["calls_counted"]
    assert not [x for x in _links() - fds if "perf_event" in x], _links() - fds  # all closed
    assert _ours() == []                               # the uprobe events removed after
    from agent.watch.report import render
    assert any(x.startswith("pmu: context_switches, page_faults, task_clock_ns per call: ")
               for x in render(summ))
    import json
    recs = [json.loads(x) for x in (tmp_path / "spikes.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r.get("cause")]
    counted = [r for r in recs if "pmu" in r]   # a spike's call: its counts in its record
    assert len(recs) >= 5 and len(counted) >= 0.9 * len(recs), (len(counted), len(recs))
    # every 50th call did 10x the work: their own on-CPU ns tell exactly those apart (the
    # counters stop while the thread is off its CPU: a preempted call's wall time grows, not
    # its on-CPU ns)
    import statistics
    usual = statistics.median(c["task_clock_ns"] for c, _ in seen.values())
    big = sum(1 for c, _ in seen.values() if c["task_clock_ns"] >= 4 * usual)
    assert 0.5 * len(seen) / 50 <= big <= 2 * len(seen) / 50, (big, len(seen), usual)
    assert all(r["pmu"]["counts"]["task_clock_ns"] > 0 and "ipc" not in r["pmu"]
               for r in counted)                 # (software counters: no IPC, never a 0)


def test_without_a_pmu_auto_says_unsupported_once_and_on_exits_2(infer_lib, tmp_path):
    needs_uprobes()
    child = _loop(infer_lib)
    try:
        if trace_pmu.probe(child.pid) is None:
            pytest.skip("this box exposes a PMU")
        from agent.watch.report import render
        from agent.watch.session import WatchSession
        s = WatchSession(_cfg(child.pid, infer_lib, tmp_path, duration_s=1))
        assert s.run() == 0, s.warnings
        summ = s.summary()
        lines = [x for x in render(summ) if x.startswith("pmu:")]
        assert lines == [f"pmu: {summ['pmu']['status']}"]
        assert lines[0].startswith("pmu: unsupported: no hardware cycles counter")
        assert _ours() == []
        r = subprocess.run([sys.executable, "-m", "agent.cli", "watch", "--attach",
                            str(child.pid), "--attach-symbol", f"{infer_lib.name}:hft_infer",
                            "--unsafe-return", "--pmu", "on", "--duration", "2"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 2, (r.stdout, r.stderr)
        err = [x for x in r.stderr.splitlines() if x.startswith("hftagent: error:")]
        assert err == [x for x in err if x.startswith(
            "hftagent: error: --pmu on: unsupported: no hardware cycles counter")] and err
        assert "Traceback" not in r.stderr
        assert _ours() == []
        chk = subprocess.run([sys.executable, "-m", "agent.cli", "attach", "--check",
                              str(child.pid), "--attach-symbol",
                              f"{infer_lib.name}:hft_infer"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
        assert chk.returncode == 0, chk.stderr
        assert [x for x in chk.stdout.splitlines() if x.startswith("pmu:")] == \
            [lines[0]], chk.stdout
    finally:
        child.kill()
        child.wait()


def test_pmu_on_needs_attach_and_a_bad_mode_is_one_line():
    from types import SimpleNamespace

    from agent.errors import AgentError
    from agent.watch import options
    from collectors.host import Host
    probe_run = SimpleNamespace(reader=object(), source=SimpleNamespace(said="--probe numpy"))
    with pytest.raises(pmu.Refused, match=r"^--pmu on is for --attach PID .*--probe numpy$"):
        pmu.arm(probe_run, "on", [])
    assert pmu.arm(probe_run, "auto", []) is None and pmu.arm(probe_run, "off", []) is None
    with pytest.raises(AgentError, match=r"^--pmu must be one of auto, on, off, not "):
        options.build(Host(), pmu="sometimes", duration=1)


def test_where_a_pmu_exists_the_calls_that_did_more_work_are_slow_code(infer_lib, tmp_path):
    """The hardware path end to end (skipped on a box without a PMU, e.g. a Firecracker
    guest): every 50th call does 10x the work; its record names slow_code, more_work."""
    needs_uprobes()
    import json

    from agent.watch.session import WatchSession
    child = _loop(infer_lib)
    try:
        why = trace_pmu.probe(child.pid)
        if why:
            pytest.skip(why)
        s = WatchSession(_cfg(child.pid, infer_lib, tmp_path, duration_s=5))
        assert s.run() == 0, s.warnings
    finally:
        child.kill()
        child.wait()
    assert isinstance(s.pmu, pmu.PerCall) and s.pmu.counted >= 500, s.pmu.stats()
    recs = [json.loads(x) for x in (tmp_path / "spikes.jsonl").read_text().splitlines()]
    more = [r for r in recs if (r.get("pmu") or {}).get("slow_code", {}).get("kind")
            == "more_work"]
    assert len(more) >= 5, [r.get("pmu") for r in recs[:3]]
    for r in more:   # 10x the instructions of the median call, told as such
        assert r["pmu"]["slow_code"]["ratios"]["instructions"] >= 5
    named = [r for r in more if r["cause"] == "slow_code"]
    assert len(named) >= 0.5 * len(more), [(r["cause"], r.get("decided_by")) for r in more]
    assert all(r["causes"][0]["evidence"]["kind"] == "more_work" for r in named)


def test_a_trials_losers_are_dropped_from_the_groups_once_watch_drops_them():
    from types import SimpleNamespace

    class C(_Counters):
        probes = [trace_pmu.Probe(n, "/x", 0, n.startswith("ret"))
                  for n in ("call0", "ret0", "call1", "ret1")]
        dropped_here: list = []

        def drop(self, names):
            self.dropped_here.append(set(names))
            self.probes = [p for p in self.probes if p.name not in names]
    c = C()
    u = SimpleNamespace(dropped=set())
    per = pmu.PerCall(c, u)
    per.feed([])
    assert c.dropped_here == []                       # the trial still runs
    u.dropped = {"call1", "ret1"}                     # watch chose target 0
    per.feed([])
    per.feed([])
    assert c.dropped_here == [{"call1", "ret1"}]      # once
    assert [p.name for p in c.probes] == ["call0", "ret0"]
