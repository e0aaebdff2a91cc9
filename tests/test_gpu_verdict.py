"""The verdict of a slow GPU call from its split (issue #36, agent/watch/attribution/
gpu_verdict.py): the part that grew names the cause — a GPU wait another process's (named),
a throttle's or the GPU's own (longer kernels), a copy, or the CPU causes of the enqueue
stretch and of the completion lag — never a GPU cause for a call the CPU slowed. Synthetic
calls: a timeline dict as agent/trace/accounting.py writes it, hits as the GPU probes record
them (as tests/test_gpu_split.py builds them)."""

from __future__ import annotations

import pytest

from agent.trace.gpu_probes import COPY, HOST_FUNC, LAUNCH, Hit
from agent.watch.attribution import gpu_split as gs
from agent.watch.attribution import gpu_verdict as gv
from agent.watch.attribution.spike import Spike

US = 1000
T0 = 10_000_000_000
TID, CB, HOG = 100, 101, 555
P50_US = 300.0
FOREIGN = {"cause": "gpu_foreign_process", "score": 0.6, "strength": 0.6,
           "detail": "GPU shared with PID 4242 (python3)",
           "evidence": {"gpu.0.foreign_processes": 1.0}}
THROTTLE = {"cause": "gpu_throttle", "score": 0.7, "strength": 0.7,
            "detail": "GPU 0: hw_slowdown", "evidence": {"gpu.0.clock_event_reasons": 8}}


def _h(us: float, kind: str, ret: bool = False, nbytes: int = -1) -> Hit:
    sym = {LAUNCH: "cuLaunchKernelEx", COPY: "cuMemcpyDtoHAsync_v2",
           HOST_FUNC: "cuLaunchHostFunc"}[kind]
    return Hit(T0 + int(us * US), TID, sym, kind, ret, nbytes)


def _call(enqueue_hog_us: float = 0, wait_us: float = 200, lag_us: float = 5,
          lag_hog: bool = False, copy_us: float = 0, other_wait_us: float = 0
          ) -> tuple[list[Hit], dict, int]:
    """One XLA-shaped call: the caller runs 50 µs, (a hog runs ``enqueue_hog_us`` on its CPU
    while it is runnable), launches 4 kernels and a host function, (copies for
    ``copy_us``), (blocks ``other_wait_us`` woken by another process), blocks ``wait_us``
    until the callback thread wakes it, waits ``lag_us`` to run again (a hog runs then where
    ``lag_hog``, else the CPU is idle), runs 40 µs. Returns hits, timeline dict, end ns."""
    h = enqueue_hog_us
    spans = [[0.0, 50.0, "probe svc[100]"]]
    if h:
        spans.append([50.0, h, "hog[555]"])
    spans.append([50.0 + h, 50.0 + copy_us, "probe svc[100]"])
    hits = [*(_h(60 + h + 5 * i, LAUNCH) for i in range(4)), _h(85 + h, HOST_FUNC)]
    if copy_us:
        hits += [_h(90 + h, COPY, nbytes=1 << 20), _h(90 + h + copy_us, COPY, ret=True)]
    b = 100.0 + h + copy_us
    parts = []
    if other_wait_us:
        spans.append([b, other_wait_us, "blocked (S), woken by sshd[9]"])
        parts.append({"kind": "blocked", "state": "S", "from_us": b, "to_us": b + other_wait_us,
                      "ended_by": "waking", "waker": "sshd[9]", "waker_tid": 9})
        b += other_wait_us
    spans.append([b, wait_us, "blocked (S), woken by thread 101 (cuda-EvtHandlr)"])
    parts.append({"kind": "blocked", "state": "S", "from_us": b, "to_us": b + wait_us,
                  "ended_by": "waking", "waker_ctx": True,
                  "waker": "thread 101 of the same process (cuda-EvtHandlr)",
                  "waker_tid": CB, "same_process": True})
    spans.append([b + wait_us, lag_us, "hog[555]" if lag_hog else "swapper/1"])
    end = b + wait_us + lag_us + 40
    spans.append([b + wait_us + lag_us, 40.0, "probe svc[100]"])
    ents = [{"label": "probe svc[100]", "kind": "probe", "us": 0.0},
            {"label": "hog[555]", "kind": "task", "us": h + (lag_us if lag_hog else 0)},
            {"label": "swapper/1", "kind": "idle", "us": 0 if lag_hog else lag_us}]
    tl = {"cpu": 1, "wall_us": end, "spans": spans, "parts": parts, "entities": ents,
          "probe_run_us": 140.0 + copy_us, "preemptions": 1 if h else 0, "blocks": 1,
          "state_us": {"on_cpu": 140.0 + copy_us, "runnable": h + (lag_us if lag_hog else 0)}}
    return hits, tl, T0 + int(end * US)


def _body(tl: dict, *polled: dict) -> dict:
    """A record whose complete timeline made it ``blocked`` (woken by the callback thread)."""
    blocked = {"cause": "blocked", "score": 1.0, "strength": 1.0,
               "detail": "blocked (S), woken by thread 101 (kernel events)", "evidence": {}}
    return {"cause": "blocked", "decided_by": "events", "polled_cause": "gpu_foreign_process"
            if polled else None, "causes": [blocked, *(dict(p) for p in polled)],
            "events": {"complete": True, "timeline": tl}}


class _Kept:
    """The GpuHits that annotate reads (between, rates, the summary's sums)."""

    def __init__(self, hits: list[Hit]) -> None:
        self.hits, self.rates = sorted(hits), [10.0] * 20
        self.spikes_split, self.parts_ns = 0, {}

    def between(self, a: int, b: int) -> list[Hit]:
        return [h for h in self.hits if a <= h.ts_ns <= b]


def _decide(hits: list[Hit], tl: dict, end: int, body: dict) -> dict:
    sp = Spike(1, T0, end, 7, TID, p50_ns=int(P50_US * US))
    out = gs.annotate(_Kept(hits), sp, body)  # type: ignore[arg-type]
    assert out is not None and abs(sum(out["parts"].values()) - out["wall_us"]) < 1
    return body


def test_a_foreign_process_on_the_gpu_is_named_for_a_long_gpu_wait():
    hits, tl, end = _call(wait_us=4000)
    body = _decide(hits, tl, end, _body(tl, FOREIGN))
    assert body["cause"] == "gpu_foreign_process" and body["decided_by"] == "events+gpu"
    lead = body["causes"][0]
    assert lead["detail"].startswith("GPU shared with PID 4242 (python3): the caller waited "
                                     "4,000 µs for the GPU")
    assert lead["evidence"]["gpu_part"] == "gpu_wait"
    assert lead["evidence"]["gpu.0.foreign_processes"] == 1.0
    assert body["events_cause"] == "blocked"
    assert [c["cause"] for c in body["causes"]].count("gpu_foreign_process") == 1


def test_a_throttle_is_named_where_no_other_process_shares_the_gpu():
    hits, tl, end = _call(wait_us=4000)
    body = _decide(hits, tl, end, _body(tl, THROTTLE))
    assert body["cause"] == "gpu_throttle" and "hw_slowdown" in body["causes"][0]["detail"]


def test_a_long_kernel_is_gpu_kernel_with_its_wait_against_the_p50():
    hits, tl, end = _call(wait_us=3000)
    body = _decide(hits, tl, end, _body(tl))
    lead = body["causes"][0]
    assert body["cause"] == "gpu_kernel"
    assert lead["evidence"]["gpu_wait_us"] == pytest.approx(3000, abs=1)
    assert "10.0× the call's P50 of 300 µs" in lead["detail"]
    assert "cuda-EvtHandlr" in lead["detail"]


def test_an_enqueue_slowed_by_a_cpu_hog_is_contention_not_the_gpu():
    """NVML saw another process on the GPU in the window, but the call's excess is the hog
    that ran on its CPU while it launched: the GPU is not blamed."""
    hits, tl, end = _call(enqueue_hog_us=3000, wait_us=200)
    body = _decide(hits, tl, end, _body(tl, FOREIGN))
    lead = body["causes"][0]
    assert body["cause"] == "cpu_contention", body
    assert lead["evidence"]["gpu_part"] == "enqueue"
    assert lead["evidence"]["ran_on_cpu"][0]["comm"] == "hog"
    assert lead["detail"].startswith("hog[555] ran 3,000 µs on CPU 1 in the enqueue")


def test_a_completion_lag_is_the_cpu_that_kept_the_caller_from_running():
    hits, tl, end = _call(wait_us=200, lag_us=3000, lag_hog=True)
    body = _decide(hits, tl, end, _body(tl, FOREIGN))
    assert body["cause"] == "cpu_contention"
    assert body["causes"][0]["evidence"]["gpu_part"] == "completion_lag"
    assert "completion lag" in body["causes"][0]["detail"]
    hits, tl, end = _call(wait_us=200, lag_us=2000)   # the CPU idle: a late wake-up
    body = _decide(hits, tl, end, _body(tl))
    assert body["cause"] == "wakeup_latency"


def test_a_long_copy_is_gpu_copy():
    hits, tl, end = _call(copy_us=3000, wait_us=200)
    body = _decide(hits, tl, end, _body(tl))
    lead = body["causes"][0]
    assert body["cause"] == "gpu_copy" and lead["evidence"]["gpu_part"] == "copies"
    assert lead["evidence"]["bytes"] == 1 << 20


def test_the_split_decides_nothing_where_the_gpu_is_not_where_the_time_went():
    # the caller's excess is a wait for another process (rest): the verdict stays
    hits, tl, end = _call(wait_us=200, other_wait_us=3000)
    body = _decide(hits, tl, end, _body(tl, FOREIGN))
    assert body["cause"] == "blocked" and body["decided_by"] == "events"
    # an incomplete timeline decides nothing either
    hits, tl, end = _call(wait_us=4000)
    body = _body(tl, FOREIGN)
    body["events"]["complete"] = False
    assert _decide(hits, tl, end, body)["cause"] == "blocked"


def test_part_excess_is_a_lower_bound_from_the_p50_and_what_ran_instead():
    hits, tl, end = _call(enqueue_hog_us=1000, wait_us=500)
    segs: list = []
    split = gs.split_call(T0, end, TID, hits, tl, segs)
    ex = gv.part_excess(split, segs, tl, T0, P50_US)
    assert ex["gpu_wait"] == pytest.approx(200, abs=1)    # 500 − P50
    assert ex["enqueue"] == pytest.approx(1000, abs=1)    # the hog's µs in the stretch
    assert ex["copies"] == 0
    assert gv.ran_in(tl, T0, gv.of_part(segs, "enqueue")) == {
        "cpu_contention": (1000 * US, "hog[555]")}
