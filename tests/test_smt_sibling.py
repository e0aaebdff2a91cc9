"""The SMT sibling of a call's CPU (issue #35 item 2d, agent/watch/attribution/smt.py and
verdict.smt_sibling): the topology read through the Host from a synthetic sysfs tree (this
VM has no SMT), the sibling added to the event source's CPUs, what ran on it over the call
from its sched_switch, and the on-CPU rule that names it only for a call that kept its CPU
while another process ran on the sibling for most of the excess."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from agent.trace.event import Event
from agent.trace.text import parse_text
from agent.trace.tracefs import Window
from agent.watch.attribution import smt, verdict
from agent.watch.attribution.events import SpikeEvents, apply_verdict
from agent.watch.attribution.spike import Spike
from bench.attribution import contradiction
from collectors.host import Host
from tests.eventpages import trace_line as line
from tests.eventpages import trace_switch as sw

PROBE, PROC, HOG = 4242, 4240, 777
T0, T1 = 100_001_000_000, 100_003_000_000  # a 2 ms call, P50 400 µs: 1.6 ms excess
P50 = 400_000
US = 1000


def _topology(root: Path, siblings: dict[int, str], online: str = "0-3") -> Host:
    (root / "devices" / "system" / "cpu").mkdir(parents=True)
    (root / "devices" / "system" / "cpu" / "online").write_text(online + "\n")
    for cpu, text in siblings.items():
        d = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True, exist_ok=True)
        (d / "thread_siblings_list").write_text(text + "\n")
    return Host(sysfs=str(root))


def test_siblings_come_from_the_topology_through_the_host(tmp_path):
    host = _topology(tmp_path / "smt", {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert smt.siblings(host, [1]) == {1: [3]}
    assert smt.siblings(host, [0, 1]) == {0: [2], 1: [3]}
    off = _topology(tmp_path / "off", {1: "1,3"}, online="0-2")   # its sibling offline
    assert smt.siblings(off, [1]) == {}
    flat = _topology(tmp_path / "flat", {0: "0", 1: "1"})   # one thread a core
    assert smt.siblings(flat, [0, 1]) == {}
    (tmp_path / "none").mkdir()
    assert smt.siblings(Host(sysfs=str(tmp_path / "none")), [1]) == {}
    assert smt.siblings(None, [1]) == {}


def test_the_sibling_is_traced_with_the_probe_cpus(tmp_path):
    host = _topology(tmp_path, {1: "1,3", 3: "1,3"})
    asked: list = []
    ev = SpikeEvents("on", host, [1], opener=lambda h, cpus, *a, **k: asked.append(cpus) or
                     _Source(""))
    assert ev.open(0) is None
    assert asked == [[1, 3]] and ev.cpus == [1] and ev.siblings == {1: [3]}
    asked.clear()
    flat = SpikeEvents("on", _topology(tmp_path / "flat", {1: "1"}), [1],
                       opener=lambda h, cpus, *a, **k: asked.append(cpus) or _Source(""))
    assert flat.open(0) is None and asked == [[1]]


def _e(us: float, cpu: int, name: str, pid: int, **fields) -> Event:
    return Event(T0 + int(us * US), cpu, name, pid, fields)


def _switch(us: float, cpu: int, prev: int, nxt: int, pc: str = "", nc: str = "") -> Event:
    return _e(us, cpu, "sched_switch", prev, prev_pid=prev, next_pid=nxt, prev_comm=pc,
              next_comm=nc)


def test_sibling_runs_from_its_switches_and_its_events():
    evs = [_switch(-300, 3, 0, HOG, "swapper/3", "hog"),       # the hog current at the start
           _switch(600, 3, HOG, 0, "hog", "swapper/3"),        # idle 600 µs in...
           _e(900, 3, "local_timer_entry", HOG),               # ...a hog event (no switch
           _switch(1500, 3, HOG, 4250, "hog", "svc-worker"),   # from idle): 600-900 unknown
           _switch(1800, 3, 4250, HOG, "svc-worker", "hog"),   # the call's own process
           _e(100, 1, "local_timer_entry", PROBE)]             # another CPU: not counted
    got = smt.sibling_runs(evs, 3, T0, T0 + 2000 * US, PROC,
                           tgid_of=lambda t: PROC if t == 4250 else t)
    assert got["tasks"] == [{"comm": "hog", "tid": HOG, "pid": HOG, "us": 1400.0}]
    assert (got["busy_us"], got["own_us"], got["unknown_us"], got["idle_us"]) == \
        (1400.0, 300.0, 300.0, 0.0)
    # nothing seen on the sibling: unknown, never idle
    assert smt.sibling_runs([], 3, T0, T0 + 1000 * US, PROC)["unknown_us"] == 1000.0


def _tl(**kw) -> dict:
    sib = {"cpu": 3, "busy_us": 1900.0, "idle_us": 0.0, "own_us": 0.0, "unknown_us": 0.0,
           "tasks": [{"comm": "hog", "tid": HOG, "pid": HOG, "us": 1900.0}]}
    tl = {"cpu": 1, "wall_us": 2000.0, "probe_run_us": 2000.0, "preemptions": 0, "blocks": 0,
          "state_us": {"on_cpu": 2000.0, "runnable": 0.0}, "smt_sibling": sib}
    tl.update(kw)
    return {"complete": True, "timeline": tl}


def test_the_rule_names_the_sibling_task_only_for_a_call_that_kept_its_cpu():
    got = verdict.smt_sibling({}, _tl(), {}, 1_600_000)
    assert got["cause"] == "smt_sibling" and got["score"] == 1.0
    assert got["detail"].startswith("hog (pid 777) ran 1,900 µs on CPU 3, the SMT sibling "
                                    "of CPU 1")
    assert got["evidence"]["ran_on_sibling"][0]["us"] == 1900.0
    assert "ran_on_cpu" not in got["evidence"]   # (not a task on the call's CPU)
    assert verdict.smt_sibling({}, _tl(preemptions=1), {}, 1_600_000) is None
    assert verdict.smt_sibling({}, _tl(state_us={"on_cpu": 900.0, "blocked": 1100.0}),
                               {}, 1_600_000) is None
    idle = _tl()
    idle["timeline"]["smt_sibling"].update(busy_us=200.0, idle_us=1800.0)
    assert verdict.smt_sibling({}, idle, {}, 1_600_000) is None   # the sibling mostly idle
    assert verdict.smt_sibling({}, _tl(smt_sibling=None), {}, 1_600_000) is None
    # the call's own faults took the excess: they lead, the sibling is not named for it
    faulted = _tl(page_faults={"count": 900, "us": 1500.0, "slept": 0})
    lead = verdict.on_cpu_cause({}, faulted, {}, 1_600_000)
    assert lead["cause"] == "page_faults"


class _Source:
    def __init__(self, text: str) -> None:
        self.events = parse_text(text.splitlines())

    def __bool__(self) -> bool:
        return True

    def window(self, t_from, t_to, *, margin_ns=0, after_ns=0):
        return Window(t_from, t_to, self.events, read_ns=1_000)


def _ticks(cpu: int, pid: int, comm: str, *at: str) -> list[str]:
    out = []
    for ts in at:
        out += [line(comm, pid, ts, "local_timer_entry: vector=236", "d.h1.", cpu=cpu),
                line(comm, pid, ts[:-1] + "3", "local_timer_exit: vector=236", "d.h1.",
                     cpu=cpu)]
    return out


SHARED_CORE = "\n".join([
    sw("swapper/1", 0, "100.000500", "probe", PROBE, "R"),
    sw("swapper/3", 0, "100.000400", "hog", HOG, "R").replace("[001]", "[003]"),
    *_ticks(1, PROBE, "probe", "100.001500", "100.002500", "100.003200"),
    *_ticks(3, HOG, "hog", "100.001400", "100.002400", "100.003100"),
])


def test_a_call_slowed_beside_a_sibling_hog_is_named_smt_sibling_end_to_end(tmp_path):
    """The polled rules named contention (the window's run-queue wait); the call kept its
    CPU 1 all along while hog ran on CPU 3, its sibling: the timeline overrules the polled
    cause and the on-CPU rule names the sibling's task with its µs."""
    host = _topology(tmp_path, {1: "1,3", 3: "1,3"})
    ev = SpikeEvents("on", host, [1], opener=lambda *a, **k: _Source(SHARED_CORE))
    assert ev.open(0) is None
    sp = Spike(1, T0, T1, PROC, PROBE, P50, cpu_start=1, cpu_end=1)
    body = {"cause": "cpu_contention", "seq": 1, "latency_us": 2000.0, "p50_us": 400.0,
            "causes": [{"cause": "cpu_contention", "score": 0.6, "strength": 0.8,
                        "detail": "thread waited 1900 µs on the run queue in the window",
                        "evidence": {"thread_rq_delay_window_us": 1900.0}}]}
    body["events"], triples = ev.for_spike(sp)
    sib = body["events"]["timeline"]["smt_sibling"]
    assert sib["cpu"] == 3 and sib["tasks"][0]["comm"] == "hog"
    assert sib["busy_us"] == pytest.approx(2000, abs=1)
    before = copy.deepcopy(body)
    apply_verdict(body, triples, sp.excess_ns)
    assert body["cause"] == "smt_sibling" and body["decided_by"] == "events", body["causes"][0]
    assert body["polled_cause"] == "cpu_contention"
    assert "hog (pid 777) ran 2,000 µs on CPU 3" in body["causes"][0]["detail"]
    assert contradiction(body) is None and contradiction(before) is not None
    # without SMT the same call is unexplained, as before
    flat = SpikeEvents("on", None, [1], opener=lambda *a, **k: _Source(SHARED_CORE))
    assert flat.open(0) is None
    plain = copy.deepcopy(before)
    plain["events"], triples = flat.for_spike(sp)
    assert "smt_sibling" not in plain["events"]["timeline"]
    apply_verdict(plain, triples, sp.excess_ns)
    assert plain["cause"] == "unexplained"
