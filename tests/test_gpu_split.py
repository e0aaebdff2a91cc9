"""The GPU split of an attached call (issue #36 build 2): the probe plan per --gpu-probes
level, the hits the attached reader hands over, and the split of synthetic calls (a timeline
dict as agent/trace/accounting.py writes it, hits as the GPU probes record them) into
enqueue, copies, GPU wait, completion lag and rest, which always add up to the wall time.
No GPU, no root: tests/test_gpu_split_attach.py attaches to a fake libcuda."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.trace import gpu_probes as gp
from agent.trace.event import Event
from agent.trace.gpu_probes import COPY, HOST_FUNC, LAUNCH, SYNC, GpuHits, Hit
from agent.watch.attribution import gpu_split as gs
from agent.watch.attribution.spike import Spike

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
US = 1000
T0 = 10_000_000_000
TID, CB, WORKER = 100, 101, 102


def _h(us: float, kind: str, tid: int = TID, ret: bool = False, nbytes: int = -1,
       symbol: str = "") -> Hit:
    sym = symbol or {LAUNCH: "cuLaunchKernelEx", COPY: "cuMemcpyHtoDAsync_v2",
                     HOST_FUNC: "cuLaunchHostFunc", SYNC: "cuStreamSynchronize"}[kind]
    return Hit(T0 + int(us * US), tid, sym, kind, ret, nbytes)


def _xla_call(wait_us: float = 4000, lag_us: float = 5) -> tuple[list[Hit], dict]:
    """One call as XLA makes it: copy in (20 µs), 4 launches, a host function, the wait for
    the callback thread (CB) that wakes it, the copy out; its timeline dict."""
    hits = [_h(10, COPY, nbytes=4096), _h(30, COPY, ret=True),
            *(_h(40 + 10 * i, LAUNCH) for i in range(4)), _h(90, HOST_FUNC),
            _h(100 + wait_us + lag_us + 10, COPY, nbytes=8192, symbol="cuMemcpyDtoHAsync_v2"),
            _h(100 + wait_us + lag_us + 25, COPY, ret=True, symbol="cuMemcpyDtoHAsync_v2")]
    end = 100 + wait_us + lag_us + 40
    tl = {"spans": [[0.0, 100.0, "probe python[100]"],
                    [100.0, wait_us, "blocked (S), woken by thread 101 (cuda-EvtHandlr)"],
                    [100.0 + wait_us, lag_us, "cuda-EvtHandlr[101]"],
                    [100.0 + wait_us + lag_us, 40.0, "probe python[100]"]],
          "parts": [{"kind": "blocked", "state": "S", "from_us": 100.0,
                     "to_us": 100.0 + wait_us, "ended_by": "waking",
                     "waker": "thread 101 of the same process (cuda-EvtHandlr)",
                     "waker_tid": CB, "same_process": True}]}
    return hits, {"tl": tl, "end": T0 + int(end * US)}


def _adds_up(out: dict) -> None:
    assert abs(sum(out["parts"].values()) - out["wall_us"]) <= 0.05 * out["wall_us"]


def test_a_callback_wait_is_gpu_wait_and_its_wake_up_the_completion_lag():
    hits, c = _xla_call(wait_us=4000, lag_us=5)
    out = gs.split_call(T0, c["end"], TID, hits, c["tl"])
    _adds_up(out)
    p = out["parts"]
    assert p["gpu_wait"] == pytest.approx(4000, abs=1)
    assert p["completion_lag"] == pytest.approx(5, abs=0.5)
    assert p["copies"] == pytest.approx(35, abs=1)       # 20 µs in, 15 µs out
    assert p["enqueue"] == pytest.approx(100 - 20 + 10, abs=1)  # to the last enqueue, less copies
    assert out["largest"] == "gpu_wait"
    assert out["launches"] == 4 and out["host_funcs"] == 1
    assert out["copies"] == {"count": 2, "bytes": 4096 + 8192, "us": 35.0}
    assert out["gpu_waits"][0]["how"] == "callback thread"
    assert "cuda-EvtHandlr" in out["gpu_waits"][0]["woken_by"]
    assert out["summary"].startswith("gpu_wait 4,000 µs; enqueue 90 µs; copies 35 µs;")
    assert "woken by thread 101 of the same process (cuda-EvtHandlr)" in out["summary"]
    assert out["summary"].endswith("2 copies, 12,288 B")


def test_the_parts_add_up_to_the_wall_time_whatever_overlaps():
    segs = gs.paint(0, 1000, [(-5, 300, "enqueue"), (100, 200, "copies"),
                              (250, 900, "gpu_wait"), (800, 1200, "completion_lag")])
    assert segs[0][0] == 0 and segs[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    t = gs.totals(segs)
    assert sum(t.values()) == 1000
    assert t == {"enqueue": 150, "copies": 100, "gpu_wait": 550, "completion_lag": 200,
                 "rest": 0}
    assert gs.totals(gs.paint(0, 10, [])) == {**dict.fromkeys(gs.PARTS, 0), "rest": 10}


def test_a_wake_up_by_a_thread_that_enqueued_gpu_work_is_not_the_gpu():
    """A thread of the process that itself launched work (a host worker) woke the caller:
    a host-side wait, left in rest."""
    hits, c = _xla_call()
    hits.append(_h(50, LAUNCH, tid=CB))
    hits.sort()
    out = gs.split_call(T0, c["end"], TID, hits, c["tl"])
    _adds_up(out)
    assert out["parts"]["gpu_wait"] == 0 and out["parts"]["rest"] >= 4000


def test_another_process_waking_the_caller_is_not_the_gpu():
    hits, c = _xla_call()
    c["tl"]["parts"][0].update(same_process=False, waker="sshd[9]", waker_tid=9)
    out = gs.split_call(T0, c["end"], TID, hits, c["tl"])
    assert out["parts"]["gpu_wait"] == 0 and "gpu_waits" not in out


def test_a_sync_call_is_gpu_wait_with_or_without_the_timeline():
    hits = [_h(0, LAUNCH), _h(20, SYNC), _h(520, SYNC, ret=True)]
    tl = {"spans": [[0, 25, "probe svc[100]"], [25, 490, "blocked (S), woken by irq"],
                    [515, 3, "swapper"], [518, 12, "probe svc[100]"]],
          "parts": [{"kind": "blocked", "from_us": 25.0, "to_us": 515.0, "ended_by": "waking",
                     "waker": "IRQ 30 nvidia", "same_process": False}]}
    for t in (tl, None):
        out = gs.split_call(T0, T0 + 530 * US, TID, hits, t)
        _adds_up(out)
        assert out["parts"]["gpu_wait"] >= 490, (t is None, out)
        assert out["syncs"] == 1 and out["timeline"] is (t is not None)
    assert out["gpu_waits"][0]["how"] == "sync call"
    with_tl = gs.split_call(T0, T0 + 530 * US, TID, hits, tl)
    assert with_tl["parts"]["completion_lag"] == pytest.approx(3, abs=0.5)


def test_without_the_timeline_the_off_cpu_time_is_rest():
    hits, c = _xla_call()
    out = gs.split_call(T0, c["end"], TID, hits, None)
    _adds_up(out)
    assert out["parts"]["gpu_wait"] == 0 and out["timeline"] is False
    assert out["parts"]["enqueue"] > 4000   # (to the copy out: nothing says it waited)


def test_copies_of_other_threads_are_counted_apart_not_in_the_sum():
    hits, c = _xla_call()
    hits += [_h(60, COPY, tid=WORKER, nbytes=1 << 20), _h(400, COPY, tid=WORKER, ret=True)]
    hits.sort()
    out = gs.split_call(T0, c["end"], TID, hits, c["tl"])
    _adds_up(out)
    assert out["copies_other_threads"] == {"count": 1, "bytes": 1 << 20, "us": 340.0}
    assert out["copies"]["count"] == 2


def test_a_copy_without_its_byte_count_says_unknown_not_zero():
    hits = [_h(0, COPY), _h(10, COPY, ret=True)]
    out = gs.split_call(T0, T0 + 20 * US, TID, hits, None)
    assert out["copies"] == {"count": 1, "bytes": None, "us": 10.0}


def test_a_slow_copy_is_named_against_the_latest_copies_p50():
    fast = [10.0] * 50                       # 10 ns per byte
    usual = gs.usual_rates(fast)
    assert usual == (10.0, None)
    slow = [_h(0, COPY, nbytes=100_000), _h(4000, COPY, ret=True)]   # 40 ns per byte
    c = gs.slow_copy(slow, usual, excess_ns=3_000_000)
    assert c is not None and c["cause"] == "gpu_copy"
    assert c["evidence"]["ns_per_byte"] == pytest.approx(40)
    ok = [_h(0, COPY, nbytes=100_000), _h(1100, COPY, ret=True)]      # 11 ns per byte
    assert gs.slow_copy(ok, usual, excess_ns=1_000_000) is None
    # a slow copy that is a small share of the excess is not the cause
    assert gs.slow_copy(slow, usual, excess_ns=100_000_000) is None
    # no byte counts: per copy, against the per-copy P50
    per_copy = gs.usual_rates([-5000.0] * 20)
    nob = [_h(0, COPY), _h(900, COPY, ret=True)]
    assert gs.slow_copy(nob, per_copy, excess_ns=1_000_000)["evidence"]["ns_per_copy"] == 900_000


def test_the_polled_gpu_causes_are_carried_with_their_evidence():
    body = {"causes": [{"cause": "gpu_foreign_process", "detail": "GPU shared with PID 4242 "
                        "(python3)", "evidence": {"gpu.0.foreign_processes": 1}},
                       {"cause": "cpu_contention", "detail": "x", "evidence": {}},
                       {"cause": "gpu_throttle", "detail": "GPU 0: hw_slowdown",
                        "evidence": {"gpu.0.clock_event_reasons": 8}}]}
    got = gs.gpu_causes(body, [], (None, None), 1_000_000)
    assert [c["cause"] for c in got] == ["gpu_foreign_process", "gpu_throttle"]
    assert got[0]["detail"].startswith("GPU shared with PID 4242")


class _U:
    """A GpuUprobes as GpuHits reads it (names, targets, instances)."""

    def __init__(self, probes: list[gp.Probe]) -> None:
        self.targets = [gp.GpuTarget(p, "/x/libcuda.so.1", "", 0x10 * i,
                                     "bytes=%dx:u64" if p.bytes_arg else "")
                        for i, p in enumerate(probes)]
        self.names = [n for i, p in enumerate(probes)
                      for n in ([f"gpu{i}"] + ([f"gpuret{i}"] if p.returns else []))]
        self.instances: list = []


def _spike(t0: int, t1: int) -> Spike:
    return Spike(1, t0, t1, 7, TID, p50_ns=300 * US)


def test_hits_are_taken_kept_in_time_order_and_split_per_spike():
    probes = gp.probes_for("copies")
    u = _U(probes)
    hits = GpuHits(u)  # type: ignore[arg-type]
    idx = {p.symbol: i for i, p in enumerate(probes)}
    h2d = idx["cuMemcpyHtoDAsync_v2"]
    assert not hits.take(Event(T0, 1, "call0", TID, {}))   # the call probe: not a GPU hit
    assert hits.take(Event(T0 + 20 * US, 1, f"gpuret{h2d}", TID, {}))
    assert hits.take(Event(T0 + 10 * US, 1, f"gpu{h2d}", TID, {"bytes": 4096}))  # late
    assert hits.take(Event(T0 + 30 * US, 1, f"gpu{idx['cuLaunchKernelEx']}", TID, {}))
    assert [h.ts_ns for h in hits.between(T0, T0 + 100 * US)] == \
        [T0 + 10 * US, T0 + 20 * US, T0 + 30 * US]
    assert hits.between(T0 + 11 * US, T0 + 25 * US)[0].ret
    assert hits.counts == {"cuMemcpyHtoDAsync_v2": 2, "cuLaunchKernelEx": 1}
    assert hits.stats(calls=1)["cost_us_per_call"] == pytest.approx(3 * gp.HIT_US, abs=0.1)
    # a hit without fields (a reader that keeps none): no byte count, still a copy
    from collections import namedtuple
    Bare = namedtuple("Bare", "ts_ns cpu pid name")
    assert hits.take(Bare(T0 + 40 * US, 1, TID, f"gpu{h2d}"))
    assert hits.between(T0 + 40 * US, T0 + 40 * US)[0].nbytes == -1
    body: dict = {"causes": []}
    out = gs.annotate(hits, _spike(T0, T0 + 50 * US), body)
    assert out is body["gpu"] and out["launches"] == 1
    st = hits.stats(calls=1)
    assert st["spikes_split"] == 1
    assert sum(st["parts_us"].values()) == pytest.approx(50, abs=0.5)
    assert gs.annotate(hits, _spike(T0 + 60 * US, T0 + 90 * US), {}) is None  # no hit there


def test_levels_hold_the_ones_before_and_say_their_cost():
    names = {lv: [p.symbol for p in gp.probes_for(lv)] for lv in gp.LEVELS}
    assert names["off"] == []
    assert set(names["default"]) == {"cuLaunchKernel", "cuLaunchKernelEx",
                                      "cuStreamSynchronize", "cuEventSynchronize",
                                      "cuCtxSynchronize"}
    assert set(names["default"]) < set(names["copies"]) < set(names["full"])
    assert {"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyHtoD_v2",
            "cuMemcpyDtoH_v2", "cuLaunchHostFunc"} <= set(names["copies"])
    assert len(names["full"]) < 45   # never every driver call
    assert all(p.bytes_arg for p in gp.probes_for("copies") if p.kind == COPY)
    plan = gp.GpuPlan("copies", [gp.GpuTarget(p, "/l", "", 0, "") for p in
                                  gp.probes_for("copies")], library="/l")
    # one JAX inference (notes): 4 launches, 2 copies with their returns, 5 host functions
    assert plan.hits_per_call == 4 + 2 * 2 + 5
    assert plan.cost_us_per_call == pytest.approx(13 * gp.HIT_US, abs=0.1)
    lines = gp.check_lines(plan)
    assert any("cuLaunchHostFunc" in ln and "5 hit" in ln for ln in lines)
    assert any(f"~{plan.cost_us_per_call} µs per call" in ln for ln in lines)
    assert gp.check_lines(None) == []


def test_a_bad_level_is_refused():
    with pytest.raises(gp.GpuProbeError, match="--gpu-probes must be one of off, default, copies"):
        gp.check_level("most")


@pytest.mark.parametrize("args", [
    ["watch", "--attach", "1", "--gpu-probes", "lots"],
    ["watch", "--probe", "numpy", "--gpu-probes", "lots"],
    ["attach", "1", "--gpu-probes", "lots"],
])
def test_cli_a_bad_gpu_probes_value_is_one_line_and_an_error(args):
    r = subprocess.run([*CLI, *args, "--no-history"] if args[0] == "watch" else [*CLI, *args],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--gpu-probes must be one of" in r.stderr and "Traceback" not in r.stderr


def test_gpu_probes_without_attach_is_refused():
    from agent.errors import AgentError
    from agent.watch import latency
    from collectors.host import Host
    with pytest.raises(AgentError, match="--gpu-probes is for --attach PID"):
        latency.choose(Host(), latency.Given(probe="numpy", gpu_probes="default"))
    import os
    assert latency.choose(Host(), latency.Given(attach=os.getpid())).gpu_probes == "default"
    assert latency.choose(Host(), latency.Given(attach=os.getpid(),
                                                gpu_probes="off")).gpu_probes == "off"


def test_the_exporter_sums_the_split_by_part():
    from agent.export.metrics import GPU_PARTS, WatchMetrics
    from agent.export.server import spike_families
    assert GPU_PARTS == gs.PARTS
    m = WatchMetrics()
    assert not [f for f in spike_families(m.snapshot()) if f.name.endswith("spike_gpu_seconds")]
    m.gpu_split({"enqueue": 100.0, "gpu_wait": 4000.0, "rest": 0.0, "bogus": 7.0})
    m.gpu_split({"gpu_wait": 1000.0, "completion_lag": 5.0})
    fam = next(f for f in spike_families(m.snapshot()) if f.name.endswith("spike_gpu_seconds"))
    got = {s.labels["part"]: s.value for s in fam.samples if s.name.endswith("_total")}
    assert got == pytest.approx({"enqueue": 100e-6, "copies": 0.0, "gpu_wait": 5000e-6,
                                 "completion_lag": 5e-6, "rest": 0.0})


def test_a_single_stepped_entry_is_costed_as_one_and_said():
    """A probe whose first instruction is not emulated (not a push) is single-stepped: on
    the dev VM ~20 µs a hit against ~1.4 emulated (measured on the fake libcuda built
    without a frame pointer); the plan's cost and attach --check say so."""
    from agent.trace import elf
    launch = gp.probes_for("default")[1]
    assert launch.symbol == "cuLaunchKernelEx"
    pushed = gp.GpuTarget(launch, "/l", "", 0, "", entry=elf.describe_entry(b"\x55\x48",
                                                                            "x86_64"))
    stepped = gp.GpuTarget(launch, "/l", "", 0, "", entry=elf.describe_entry(
        b"\xb8\x00\x00\x00\x00\xc3", "x86_64"))
    assert pushed.hit_us == gp.HIT_US and stepped.hit_us == gp.STEP_US
    assert gp.GpuPlan("default", [pushed], library="/l").cost_us_per_call == \
        pytest.approx(4 * gp.HIT_US, abs=0.1)
    plan = gp.GpuPlan("default", [stepped], library="/l")
    assert plan.cost_us_per_call == pytest.approx(4 * gp.STEP_US, abs=0.1)
    assert any("single-stepped entries (cuLaunchKernelEx)" in ln for ln in gp.check_lines(plan))
    assert not any("single-stepped entries" in ln for ln in
                   gp.check_lines(gp.GpuPlan("default", [pushed], library="/l")))
