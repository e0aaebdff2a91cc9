"""The GPU split end to end (issue #36 build 2, 4), without a GPU: a fake ``libcuda.so.1``
(tests/fixtures/fake_cuda/libcuda.c: the driver's entry points as real exported functions,
a callback thread named cuda-EvtHandlr that sleeps for the "kernel time" before calling the
host function) and a service library that makes one XLA-shaped inference per call (copy in,
four launches, a host function, a wait on a condition variable until the callback thread
signals it, copy out), reached through dlopen as JAX does. The test compiles both into
tmp_path, runs the service in a child it starts, attaches to it and checks that attach
--check lists the GPU probes, that each slow call's parts add up to its wall time within 5 %
and that the long callback sleep is named the GPU wait, woken by the callback thread.

Root, tracefs with uprobe events and a C compiler are needed (skipped otherwise); every
process attached to is one the test started."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.watch.config import WatchConfig
from agent.watch.latency.attached import Attached
from agent.watch.session import WatchSession
from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "fake_cuda"
TRACEFS = Path("/sys/kernel/tracing")
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
# the callback thread's sleep: every 8th call, else (a slow call is longer than what a busy
# loop on the service's CPU makes of a fast one: the slow spikes are the GPU's)
SLOW_US, FAST_US = 20_000, 300
LOOP = r"""
import ctypes, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[3])})   # (the callback thread inherits it)
svc = ctypes.CDLL(sys.argv[1])
assert svc.svc_init(sys.argv[2].encode()) == 0
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[4])
i = 0
while time.monotonic() < end:
    i += 1
    svc.svc_infer(int(sys.argv[5]) if i % 8 == 0 else int(sys.argv[6]))
    time.sleep(0.002)
"""


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> tuple[Path, Path]:
    """(the fake libcuda.so.1, the service library), compiled for this test."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("fakecuda")
    cuda, svc = d / "libcuda.so.1", d / "libhftsvc.so"
    # (-fno-omit-frame-pointer: every entry begins with push %rbp, emulated: libcuda.c)
    subprocess.run([cc, "-O1", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o", str(cuda),
                    str(FIXTURE / "libcuda.c"), "-lpthread"], check=True)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(svc),
                    str(FIXTURE / "service.c"), "-ldl", "-lpthread"], check=True)
    return cuda, svc


def _cpu() -> int:
    return max(os.sched_getaffinity(0))


def _service(fake: tuple[Path, Path], seconds: float = 60) -> subprocess.Popen:
    cuda, svc = fake
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(svc), str(cuda), str(_cpu()),
                          str(seconds), str(SLOW_US), str(FAST_US)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _our_events() -> list[str]:
    return [ln for ln in (TRACEFS / "uprobe_events").read_text().splitlines()
            if f"hftagent_{os.getpid()}/" in ln]


def test_attach_check_lists_the_gpu_probes_of_a_process_that_maps_libcuda(fake, infer_lib):
    needs_uprobes()
    child = _service(fake)
    plain = subprocess.Popen([sys.executable, "-c", "import ctypes, sys, time; "
                              f"ctypes.CDLL({str(infer_lib)!r}); print('ready', flush=True); "
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert plain.stdout.readline().strip() == "ready"
    try:
        r = subprocess.run([*CLI, "attach", "--check", str(child.pid), "--attach-symbol",
                            "libhftsvc.so:svc_infer", "--gpu-probes", "copies"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        j = subprocess.run([*CLI, "attach", "--check", str(child.pid), "--attach-symbol",
                            "libhftsvc.so:svc_infer", "--gpu-probes", "default", "--json"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        # no runtime of the catalogue (a JAX process): the GPU probes still shown, one line
        # on stderr, exit 1
        alone = subprocess.run([*CLI, "attach", "--check", str(child.pid)], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
        none = subprocess.run([*CLI, "attach", "--check", str(plain.pid), "--attach-symbol",
                               f"{infer_lib.name}:hft_infer"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    finally:
        for p in (child, plain):
            p.kill()
            p.wait()
    assert r.returncode == 0, r.stderr
    gpu = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("gpu")]
    for sym in ("cuLaunchKernelEx", "cuMemcpyHtoDAsync_v2", "cuLaunchHostFunc",
                "cuStreamSynchronize"):
        assert any(f"gpu probe {sym} " in ln for ln in gpu), r.stdout
    assert any("libcuda.so.1" in ln for ln in gpu)
    assert any("µs per call" in ln and "13 hits" in ln for ln in gpu), gpu
    assert all("entry push %rbp" in ln for ln in gpu if ln.strip().startswith("gpu probe"))
    d = json.loads(j.stdout)["gpu_probes"]
    assert d["level"] == "default" and d["expected_hits_per_call"] == 4
    assert {p["symbol"] for p in d["probes"]} == {"cuLaunchKernel", "cuLaunchKernelEx",
                                                  "cuStreamSynchronize",
                                                  "cuEventSynchronize", "cuCtxSynchronize"}
    assert alone.returncode == 1 and len(alone.stderr.strip().splitlines()) == 1, alone.stderr
    assert "known inference runtime" in alone.stderr
    assert "gpu probe cuLaunchKernelEx" in alone.stdout and "--attach-symbol" in alone.stdout
    assert none.returncode == 0, none.stderr
    assert not [ln for ln in none.stdout.splitlines() if ln.strip().startswith("gpu")]
    assert _our_events() == []


def test_a_slow_gpu_call_is_split_and_its_gpu_wait_named(fake, tmp_path):
    needs_uprobes()
    child = _service(fake)
    try:
        src = Attached(child.pid, "svc", symbol="libhftsvc.so:svc_infer", unsafe_return=True,
                       gpu_probes="copies")
        cfg = WatchConfig(source=src, probe_cpus=[_cpu()],
                          housekeeping_cpus=[c for c in os.sched_getaffinity(0)
                                             if c != _cpu()],
                          duration_s=5, trace="on", spike_log=str(tmp_path / "spikes.jsonl"),
                          cpu_budget=100)
        s = WatchSession(cfg)
        assert s.run() == 0, s.warnings
        summary = s.summary()     # (watch --json's: the source's gpu lines carried)
    finally:
        child.kill()
        child.wait()
    assert _our_events() == []            # the call's and the GPU probes' events removed
    hits = summary["gpu"]["hits"]
    assert hits.get("cuLaunchKernelEx", 0) >= 4 * 100, summary
    assert hits.get("cuLaunchHostFunc", 0) >= 100 and hits.get("cuMemcpyDtoHAsync_v2", 0)
    # 4 launches, 2 copies with their returns, 1 host function per call (the probe paid)
    assert 8 <= summary["gpu"]["hits_per_call"] <= 10, summary["gpu"]
    assert summary["gpu"]["spikes_split"] >= 5 and summary["gpu"]["parts_us"]["gpu_wait"] > 0
    recs = [json.loads(x) for x in (tmp_path / "spikes.jsonl").read_text().splitlines()]
    slow = [r for r in recs if r.get("gpu") and r["gpu"]["wall_us"] >= 0.9 * SLOW_US]
    assert len(slow) >= 5, ([r.get("latency_us") for r in recs], s.warnings)
    for r in slow:
        g = r["gpu"]
        assert abs(sum(g["parts"].values()) - g["wall_us"]) <= 0.05 * g["wall_us"], g
        assert g["launches"] == 4 and g["host_funcs"] == 1, g
        assert g["copies"]["count"] == 2 and g["copies"]["bytes"] in (4096 + 8192, None)
    named = [r for r in slow if r["gpu"]["largest"] == "gpu_wait" and
             r["gpu"]["parts"]["gpu_wait"] >= 0.7 * SLOW_US and
             any(w["how"] == "callback thread" and "cuda-EvtHandlr" in str(w["woken_by"])
                 for w in r["gpu"].get("gpu_waits", []))]
    assert len(named) >= 0.8 * len(slow), [r["gpu"] for r in slow if r not in named][:2]
    # the verdict comes from the split (gpu_verdict.py): the GPU took longer, no other
    # process or throttle seen, where the call's timeline is complete
    complete = [r for r in named if r["events"].get("complete")]
    assert complete, [r["events"].get("reason") for r in named][:3]
    for r in complete:
        assert (r["cause"], r["decided_by"]) == ("gpu_kernel", "events+gpu"), r["causes"][0]
        assert r["causes"][0]["evidence"]["gpu_part"] == "gpu_wait"
