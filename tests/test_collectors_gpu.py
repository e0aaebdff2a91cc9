"""GpuCollector (watch) and the GPU causes, against the fake NVML."""

from __future__ import annotations

import threading
import time

from agent.watch.attribution.gpu import causes_for_windows, collector_causes, gpu_causes
from collectors.base import run_collector
from collectors.gpu import GpuCollector, GpuProcess, GpuSample, Nvml
from tests.fakes.nvml import LIBRARY_NOT_FOUND, FakeGpu, FakeNvmlLib, a100_r535_x4, h200_r580


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000_000

    def __call__(self) -> int:
        return self.t


def test_sample_names_and_base_units_on_the_h200():
    col = GpuCollector(Nvml(lib=h200_r580()), slow_thread=False)
    assert col.available().ok
    v = col.sample()
    assert v["gpu.0.sm_clock_hz"] == 345e6
    assert v["gpu.0.mem_clock_hz"] == 3201e6
    assert v["gpu.0.clock_event_reasons"] == 0x1
    assert v["gpu.0.clock_event_harmful"] == 0.0  # idle is harmless
    assert v["gpu.0.util_gpu_ratio"] == 0.0
    assert v["gpu.0.compute_processes"] == 0 and v["gpu.0.foreign_processes"] == 0
    assert "gpu.0.pcie_tx_bytes_per_s" not in v  # slow signal: absent until the slow read
    col.refresh_slow()
    v = col.sample()
    assert v["gpu.0.pcie_tx_bytes_per_s"] == 1000 * 1024
    assert v["gpu.0.pcie_replay_total"] == 0
    assert v["gpu.0.violation_power_ns_total"] == 0


def test_pcie_throughput_runs_only_on_the_slow_thread():
    # the real call blocks ~20 ms; the probe (100) has a context on the GPU
    lib = FakeNvmlLib([FakeGpu(processes=[(100, 2**30)])], pcie_delay_s=0.02)
    col = GpuCollector(Nvml(lib=lib), own_pids={100}, slow_interval_s=0.05)
    try:
        durations = []
        deadline = time.monotonic() + 3
        while lib.count("nvmlDeviceGetPcieThroughput") < 4 and time.monotonic() < deadline:
            t0 = time.perf_counter()
            col.sample()
            durations.append(time.perf_counter() - t0)
            time.sleep(0.005)
    finally:
        col.close()
    threads = {t for f, _, t in lib.calls if f == "nvmlDeviceGetPcieThroughput"}
    assert threads == {"hftagent-gpu-slow"}
    assert threading.current_thread().name not in threads
    assert lib.count("nvmlDeviceGetPcieThroughput") >= 4
    assert sorted(durations)[len(durations) // 2] < 0.02  # the fast path never waits for it
    assert col._thread is None  # close() joined it


def test_the_slow_signals_are_not_read_while_the_probe_is_on_no_gpu():
    """A CPU-only service (no context of the probe's on any GPU): the slow thread reads
    nothing (its PCIe reads cost CPU); a context opened later turns them back on."""
    g = FakeGpu(processes=[(4242, 2**30)])
    lib = FakeNvmlLib([g])
    col = GpuCollector(Nvml(lib=lib), own_pids={100}, slow_interval_s=0.01)
    try:
        col.sample()  # (starts the slow thread; it may read once before this sample's verdict)
        assert col.probe_on_gpu is False
        time.sleep(0.05)
        before = lib.count("nvmlDeviceGetPcieThroughput")
        time.sleep(0.2)
        assert lib.count("nvmlDeviceGetPcieThroughput") == before
        g.processes.append((100, 2**20))  # the probe opens a context
        col.sample()
        deadline = time.monotonic() + 5
        while lib.count("nvmlDeviceGetPcieThroughput") == before and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        assert lib.count("nvmlDeviceGetPcieThroughput") > before
    finally:
        col.close()


def test_foreign_processes_are_counted_and_named():
    lib = FakeNvmlLib([FakeGpu(processes=[(100, 2**30), (4242, 14 * 2**20)])],
                      process_names={4242: "python3"})
    col = GpuCollector(Nvml(lib=lib), own_pids={100}, slow_thread=False)
    v = col.sample()
    assert v["gpu.0.compute_processes"] == 2 and v["gpu.0.foreign_processes"] == 1
    assert col.history[-1].foreign == {0: [GpuProcess(4242, 14 * 2**20, "python3")]}
    col.sample()
    assert lib.count("nvmlSystemGetProcessName") == 1  # names resolved once per PID


def test_lost_gpu_gives_nones_for_that_gpu_only():
    lib = a100_r535_x4()
    lib.gpus[3].lost = True
    res = run_collector(GpuCollector(Nvml(lib=lib), slow_thread=False))
    assert res.success
    assert res.values["gpu.3.sm_clock_hz"] is None
    assert res.values["gpu.3.foreign_processes"] is None
    assert res.values["gpu.0.sm_clock_hz"] == 345e6


def test_unavailable_without_nvml():
    av = GpuCollector(Nvml(lib=FakeNvmlLib(init_error=LIBRARY_NOT_FOUND))).available()
    assert not av.ok and "LibraryNotFound" in av.reason
    assert not GpuCollector(Nvml(lib=FakeNvmlLib([]))).available().ok  # no GPU


def _s(t_ms: int, reasons: int = 0, foreign=None, **kv) -> GpuSample:
    vals = {"gpu.0.clock_event_reasons": reasons, **{f"gpu.0.{k}": v for k, v in kv.items()}}
    return GpuSample(t_ms * 1_000_000, vals, foreign or {})


def test_throttle_cause_names_harmful_reasons_and_ignores_idle():
    assert gpu_causes([_s(0, 0x1), _s(10, 0x1)]) == []
    c = gpu_causes([_s(0, 0x1), _s(10, 0x8 | 0x40)])
    assert [x.cause for x in c] == ["GPU throttle (HW slowdown, HW thermal slowdown)"]
    c = gpu_causes([_s(0, 0, violation_power_ns_total=5), _s(10, 0, violation_power_ns_total=9)])
    assert c[0].cause == "GPU throttle (power violation)"


def test_foreign_process_cause_scores_a_newcomer_higher():
    p = GpuProcess(4242, 2**20, "python3")
    win = [_s(100, foreign={0: [p]})]
    new = gpu_causes(win, baseline=[_s(50)])
    old = gpu_causes(win, baseline=[_s(50, foreign={0: [p]})])
    assert new[0].cause == "GPU shared with PID 4242 (python3)" and new[0].score > old[0].score


def test_pcie_replay_cause():
    c = gpu_causes([_s(0, pcie_replay_total=3), _s(10, pcie_replay_total=7)])
    assert c[0].cause == "PCIe replay / errors" and "+4" in c[0].evidence
    assert gpu_causes([_s(0, pcie_replay_total=3), _s(10, pcie_replay_total=3)]) == []


def test_windows_are_widened_to_the_neighbouring_samples():
    p = GpuProcess(7, None, "x")
    hist = [_s(0), _s(10, foreign={0: [p]}), _s(20), _s(30)]
    # A 1 ms spike at 12-13 ms has no sample inside: the samples at 10 and 20 ms bound it.
    [c] = causes_for_windows(hist, [(12_000_000, 13_000_000)])
    assert c[0].cause == "GPU shared with PID 7 (x)"
    [c] = causes_for_windows(hist, [(25_000_000, 26_000_000)])
    assert c == []


def test_collector_attributes_a_foreign_process_started_mid_run():
    g = FakeGpu(processes=[(100, None)])
    lib = FakeNvmlLib([g], process_names={4242: "python3"})
    clock = Clock()
    col = GpuCollector(Nvml(lib=lib), own_pids={100}, slow_thread=False, clock=clock)
    for _ in range(5):
        col.sample()
        clock.t += 10_000_000
    assert collector_causes(col, clock.t - 15_000_000, clock.t - 14_000_000) == []
    g.processes.append((4242, 2**30))
    col.sample()
    spike = clock.t
    clock.t += 10_000_000
    col.sample()
    causes = collector_causes(col, spike - 500_000, spike + 500_000)
    assert causes[0].cause == "GPU shared with PID 4242 (python3)"
    assert causes[0].score == 0.85 and causes[0].gpu == 0


def test_the_period_slows_while_the_probe_is_on_no_gpu_and_returns_with_a_context():
    g = FakeGpu(processes=[(4242, 2**30)])  # a foreign process only: the probe (100) is not
    col = GpuCollector(Nvml(lib=FakeNvmlLib([g])), own_pids={100}, slow_thread=False)
    col.period_s = 0.05
    assert col.current_period_s() == 0.05  # not known before a sample
    col.sample()
    assert col.probe_on_gpu is False and col.current_period_s() == col.idle_period_s == 1.0
    g.processes.append((100, 2**20))  # the probe opens a context
    col.sample()
    assert col.probe_on_gpu is True and col.current_period_s() == 0.05
    g.errors["nvmlDeviceGetComputeRunningProcesses"] = 999  # unreadable: not known
    col.sample()
    assert col.probe_on_gpu is None and col.current_period_s() == 0.05


def test_a_named_probe_gpu_keeps_the_full_rate():
    col = GpuCollector(Nvml(lib=a100_r535_x4()), own_pids={100}, probe_gpus=[2],
                       slow_thread=False)
    col.period_s = 0.05
    col.sample()
    assert col.probe_on_gpu is True and col.current_period_s() == 0.05


def test_the_sampler_follows_the_gpu_period_and_does_not_wait_for_an_idle_one():
    from agent.watch.sampling.python import Sampler
    g = FakeGpu()
    col = GpuCollector(Nvml(lib=FakeNvmlLib([g])), own_pids={100}, slow_thread=False)
    col.period_s = 0.05
    s = Sampler([col], hz=100.0)
    t = 0
    for _ in range(300):  # 3 s of 100 Hz rounds on virtual time
        t += 10_000_000
        s.round(t)
    runs = s.stats.per_collector["gpu"].runs
    assert 3 <= runs <= 5  # ~1 Hz, not the 60 of 20 Hz
    assert s.covered_ns() == t  # its 1 s rows hold no record back
    g.processes.append((100, 2**20))
    for _ in range(200):  # within a second the context is seen, then 20 Hz
        t += 10_000_000
        s.round(t)
    assert s.stats.per_collector["gpu"].runs - runs >= 30
    assert s.period_now_ns(s.entries[0]) == 50_000_000


def test_on_no_gpu_a_sample_reads_the_process_lists_and_the_rest_every_10_s():
    """A CPU-only probe (issue #38): one NVML call per GPU a sample (whether it opens a
    context), every signal every ``idle_full_s`` (the exporter's gauges), every signal at
    once again when it opens one."""
    class Clock:
        t = 1_000_000_000

        def __call__(self):
            return self.t
    clock = Clock()
    g = FakeGpu(processes=[(4242, 2**30)])
    lib = FakeNvmlLib([g])
    col = GpuCollector(Nvml(lib=lib), own_pids={100}, slow_thread=False, clock=clock)
    first = col.sample()  # not known yet: every signal
    assert first["gpu.0.full_sample"] == 1.0 and first["gpu.0.sm_clock_hz"] is not None
    assert col.probe_on_gpu is False
    clocks = lib.count("nvmlDeviceGetClockInfo")
    for _ in range(9):
        clock.t += 1_000_000_000
        v = col.sample()
        assert v["gpu.0.full_sample"] == 0.0 and "gpu.0.sm_clock_hz" not in v
        assert v["gpu.0.foreign_processes"] == 1 and v["gpu.0.probe_gpu"] == 0.0
    assert lib.count("nvmlDeviceGetClockInfo") == clocks
    clock.t += 1_000_000_000  # 10 s after the last full one
    assert col.sample()["gpu.0.full_sample"] == 1.0
    assert lib.count("nvmlDeviceGetClockInfo") > clocks
    clock.t += 1_000_000_000
    assert col.sample()["gpu.0.full_sample"] == 0.0
    g.processes.append((100, 2**20))  # the probe opens a context: seen by the light sample,
    clock.t += 1_000_000_000          # every signal from the next one on
    assert col.sample()["gpu.0.probe_gpu"] == 1.0 and col.probe_on_gpu is True
    clock.t += 50_000_000
    v = col.sample()
    assert v["gpu.0.full_sample"] == 1.0 and v["gpu.0.sm_clock_hz"] is not None


def test_the_gpu_gauges_come_from_the_newest_full_sample():
    from types import SimpleNamespace

    from agent.export.metrics import WatchMetrics
    from agent.watch.metrics_feed import MetricsFeed
    from agent.watch.ring import SignalRing
    gpu = SignalRing("gpu", 16)
    gpu.append(0, 10, {"gpu.0.sm_clock_hz": 1.98e9, "gpu.0.full_sample": 1.0})
    gpu.append(10, 20, {"gpu.0.foreign_processes": 0.0, "gpu.0.full_sample": 0.0})
    sess = SimpleNamespace(sampler=SimpleNamespace(ring={"gpu": gpu}.get),
                           cfg=SimpleNamespace(probe_cpus=[]))
    wm = WatchMetrics()
    MetricsFeed(wm).set_gauges(sess)
    assert wm.snapshot().gauges["gpu_clock_hertz"][("0", "sm")] == 1.98e9
    gpu.append(20, 30, {"gpu.0.sm_clock_hz": None, "gpu.0.full_sample": 1.0})  # lost
    wm = WatchMetrics()
    MetricsFeed(wm).set_gauges(sess)
    assert ("0", "sm") not in wm.snapshot().gauges["gpu_clock_hertz"]
