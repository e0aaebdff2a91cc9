"""The GPU collector for `hftagent watch` and the exporter (:class:`GpuCollector`), over the
NVML adapter (:mod:`collectors.nvml`, re-exported here for its callers).

:class:`GpuCollector` is the uniform collector (collectors.base): fast signals in ``sample()``
(58 µs median per call for one idle Hopper GPU; 309 µs median, 1.2 ms p99 with the GPU busy and the
slow thread running, see docs/gpu-validation.md), slow ones on their own thread (PCIe
throughput blocks ~20 ms per call; violation status 0.4-1.0 ms; replay counter 0.1-0.2 ms).
It keeps a time-ordered :attr:`GpuCollector.history` of its samples, with the foreign
processes seen then; the GPU causes read from it are attribution's
(:mod:`agent.watch.attribution.gpu`: "GPU throttle (reason)", "GPU shared with PID ...
(name)", "PCIe replay / errors").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from collectors.base import Availability
from collectors.host import UNSUPPORTED, Host, Reading
from collectors.nvml import (  # noqa: F401 - the adapter's names, re-exported
    CLOCK_EVENT_HARMFUL,
    CLOCK_EVENT_IDLE,
    CLOCK_EVENT_REASONS,
    CLOCK_GRAPHICS,
    CLOCK_MEM,
    CLOCK_SM,
    COMPUTE_MODE_IDS,
    COMPUTE_MODES,
    LOST,
    MEMORY_ERROR_UNCORRECTED,
    PCIE_UTIL_RX_BYTES,
    PCIE_UTIL_TX_BYTES,
    PERF_POLICY_POWER,
    PERF_POLICY_THERMAL,
    RETIRE_CAUSE_DBE,
    RETIRE_CAUSE_SBE,
    VOLATILE_ECC,
    GpuProcess,
    Nvml,
    PcieLink,
    cpus_from_affinity_words,
    decode_clock_event_reasons,
    harmful_clock_event_reasons,
)


# -- GPU inventory (audit) -------------------------------------------------------------------
def nvidia_driver_version(host: Host) -> Reading[str]:
    """The loaded kernel module's version line (/proc/driver/nvidia/version), read via Host so
    that a fixture tree answers for itself."""
    return host.read(host.proc("driver/nvidia/version"))


# -- the collector ---------------------------------------------------------------------------
@dataclass
class GpuSample:
    """One fast sample of all GPUs, with the foreign processes seen then (for attribution)."""

    t_ns: int
    values: dict[str, float | None]
    foreign: dict[int, list[GpuProcess]] = field(default_factory=dict)


class GpuCollector:
    """The `gpu` collector for watch and the exporter.

    ``sample()`` (fast path, every tick) per GPU N, base units:
      gpu.N.sm_clock_hz, gpu.N.mem_clock_hz        clocks.sm, clocks.mem
      gpu.N.clock_event_reasons                    clocks_event_reasons.active (bitmask)
      gpu.N.clock_event_harmful                    1 when a throttling bit is set, else 0
      gpu.N.util_gpu_ratio, gpu.N.util_mem_ratio   utilization.gpu/.memory, 0-1
      gpu.N.compute_processes, gpu.N.foreign_processes   count (foreign = not in own_pids)
      gpu.N.probe_gpu                              1 when GPU N is the probe's GPU, else 0
      gpu.N.ecc_uncorrected_volatile_total         ecc.errors.uncorrected.volatile.total
      gpu.N.full_sample                            1 when this sample read every signal above,
                                                   0 when only the process lists (the probe on
                                                   no GPU: ``idle_full_s``)
    from the slow thread (latest value, refreshed every ``slow_interval_s``):
      gpu.N.pcie_tx_bytes_per_s, gpu.N.pcie_rx_bytes_per_s    (~20 ms blocking call each)
      gpu.N.pcie_replay_total                      replays since reset
      gpu.N.violation_power_ns_total, gpu.N.violation_thermal_ns_total
    A reading that fails is None (never 0). A lost GPU yields Nones for that GPU only.
    ``own_pids`` are the inference processes; any other compute process is foreign. Process
    names are resolved once per new PID (NVML, then /proc/PID/comm through ``host``).

    The probe's GPU(s) (``gpu.N.probe_gpu``): ``probe_gpus`` when given, else every GPU on
    which one of ``own_pids`` has a compute context at that sample (None where the process
    list could not be read). The GPU causes blame only those: a foreign process, a throttle or
    PCIe replays on another GPU of a two-GPU box do not slow an inference that never touches
    it. A probe with a context on no GPU (a CPU-only model, or a PID that NVML reports in
    another PID namespace) gets no GPU cause at all.
    """

    name = "gpu"
    # The sampler's period (watch sets 20 Hz: agent/watch/wiring.py GPU_PERIOD_S) while a GPU
    # is, or may be, the probe's; ``idle_period_s`` while the last sample found the probe on
    # none (a CPU-only model: no GPU cause can blame a GPU it never touches), so that a
    # context it opens later is seen within that time (:meth:`current_period_s`).
    period_s = 0.0
    idle_period_s = 1.0
    # While the probe is on no GPU, a sample reads the process lists only (one NVML call per
    # GPU: whether it opens a context), and the clocks, throttle reasons, utilisation and ECC
    # (5 more calls per GPU: a whole sample once a second cost ~0.55 ms of CPU with one GPU,
    # driver R580) this often: the exporter's GPU gauges stay at most this old
    # (agent/watch/metrics_feed.py), and no GPU cause blames a GPU the probe never touches
    # (issue #38).
    idle_full_s = 10.0

    def __init__(self, nvml: Nvml | None = None, *, own_pids: Iterable[int] = (),
                 gpus: Sequence[int] | None = None, probe_gpus: Iterable[int] | None = None,
                 host: Host | None = None,
                 slow_interval_s: float = 1.0, slow_thread: bool = True,
                 history: int = 4096, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.nvml = nvml or Nvml()
        self.own_pids = set(own_pids)
        self.host = host
        self._gpus = list(gpus) if gpus is not None else None
        self.probe_gpus = None if probe_gpus is None else frozenset(probe_gpus)
        self._clock = clock
        self._names: dict[int, str | None] = {}
        self._slow: dict[str, float | None] = {}
        self._slow_lock = threading.Lock()
        self._slow_interval_s = slow_interval_s
        self._want_thread = slow_thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.history: deque[GpuSample] = deque(maxlen=history)
        # whether the last sample found one of own_pids on a probe GPU (None: not known yet,
        # or a process list could not be read)
        self.probe_on_gpu: bool | None = None
        self._full_ns = 0  # (clock ns) the last sample that read every signal

    # -- interface ---------------------------------------------------------------------------
    def available(self) -> Availability:
        init = self.nvml.init()
        if not init.ok:
            return Availability.no(init.reason or "NVML unavailable")
        n = self.nvml.device_count()
        if not n.ok:
            return Availability.no(n.reason or "cannot count GPUs")
        if n.value == 0:
            return Availability.no(f"{UNSUPPORTED}: NVML sees no GPU")
        return Availability.yes()

    @property
    def gpus(self) -> list[int]:
        if self._gpus is None:
            n = self.nvml.device_count().value or 0
            self._gpus = list(range(n))
        return self._gpus

    def current_period_s(self) -> float:
        """How long the sampler should wait before the next :meth:`sample`: ``period_s``
        unless the last sample showed the probe on no GPU (then ``idle_period_s``)."""
        if self.probe_on_gpu is False:
            return max(self.period_s, self.idle_period_s)
        return self.period_s

    def start(self) -> None:
        """Start the slow thread (idempotent). sample() starts it on first use."""
        if self._want_thread and self._thread is None:
            self._thread = threading.Thread(target=self._slow_loop, name="hftagent-gpu-slow",
                                            daemon=True)
            self._thread.start()

    def sample(self) -> dict[str, float | None]:
        self.start()
        nv = self.nvml
        out: dict[str, float | None] = {}
        foreign_all: dict[int, list[GpuProcess]] = {}
        now = self._clock()
        # The probe on no GPU (the last sample found none of its contexts): the process
        # lists only (whether it opens one), the rest every ``idle_full_s``.
        light = self.probe_on_gpu is False and self.probe_gpus is None and \
            now - self._full_ns < self.idle_full_s * 1e9
        if not light:
            self._full_ns = now
        for g in self.gpus:
            p = f"gpu.{g}."
            out[p + "full_sample"] = 0.0 if light else 1.0
            if light:
                self._processes(g, p, out, foreign_all)
                continue
            sm = nv.clock_mhz(g, CLOCK_SM).value
            mem = nv.clock_mhz(g, CLOCK_MEM).value
            out[p + "sm_clock_hz"] = None if sm is None else sm * 1e6
            out[p + "mem_clock_hz"] = None if mem is None else mem * 1e6
            reasons = nv.clock_event_reasons(g).value
            out[p + "clock_event_reasons"] = reasons
            out[p + "clock_event_harmful"] = (None if reasons is None
                                              else float(bool(reasons & CLOCK_EVENT_HARMFUL)))
            util = nv.utilization(g).value
            out[p + "util_gpu_ratio"] = None if util is None else util[0] / 100
            out[p + "util_mem_ratio"] = None if util is None else util[1] / 100
            self._processes(g, p, out, foreign_all)
            out[p + "ecc_uncorrected_volatile_total"] = nv.ecc_volatile_uncorrected(g).value
        flags = [out[f"gpu.{g}.probe_gpu"] for g in self.gpus]
        self.probe_on_gpu = None if None in flags else any(flags)
        if light and self.probe_on_gpu is not False:
            self._full_ns = 0  # it has a context now (or it is unknown): full from the next
        with self._slow_lock:
            out.update(self._slow)
        self.history.append(GpuSample(now, dict(out), foreign_all))
        return out

    def _processes(self, g: int, p: str, out: dict, foreign_all: dict) -> None:
        """GPU ``g``'s compute processes: their count, the foreign ones (named), and whether
        the probe is one of them."""
        procs = self.nvml.compute_processes(g, names=False).value
        if procs is None:
            out[p + "compute_processes"] = out[p + "foreign_processes"] = None
        else:
            foreign = [self._named(x) for x in procs if x.pid not in self.own_pids]
            out[p + "compute_processes"] = len(procs)
            out[p + "foreign_processes"] = len(foreign)
            if foreign:
                foreign_all[g] = foreign
        if self.probe_gpus is not None:
            out[p + "probe_gpu"] = float(g in self.probe_gpus)
        else:
            out[p + "probe_gpu"] = (None if procs is None else
                                    float(any(x.pid in self.own_pids for x in procs)))

    def refresh_slow(self) -> dict[str, float | None]:
        """Read the slow signals once (blocks ~40 ms per GPU). The slow thread calls this."""
        nv = self.nvml
        vals: dict[str, float | None] = {}
        for g in self.gpus:
            p = f"gpu.{g}."
            vals[p + "pcie_tx_bytes_per_s"] = nv.pcie_throughput_bytes_per_s(
                g, PCIE_UTIL_TX_BYTES).value
            vals[p + "pcie_rx_bytes_per_s"] = nv.pcie_throughput_bytes_per_s(
                g, PCIE_UTIL_RX_BYTES).value
            vals[p + "pcie_replay_total"] = nv.pcie_replay_counter(g).value
            vals[p + "violation_power_ns_total"] = nv.violation_ns(g, PERF_POLICY_POWER).value
            vals[p + "violation_thermal_ns_total"] = nv.violation_ns(g, PERF_POLICY_THERMAL).value
        with self._slow_lock:
            self._slow = vals
        return vals

    def _slow_loop(self) -> None:
        """Every ``slow_interval_s``: the slow signals, unless the last sample found the probe
        on no GPU (a CPU-only service: no GPU cause can blame a GPU it never touches). Those
        reads cost ~3 ms of CPU a second per GPU (nvmlDeviceGetPcieThroughput waits out the
        driver's 20 ms sampling period, R580): the largest part of an attached CPU service's
        own cost where NVML sees a GPU (issue #38). A context it opens later turns them on at the
        next sample."""
        while not self._stop.is_set():
            if self.probe_on_gpu is not False:
                try:
                    self.refresh_slow()
                except Exception:  # noqa: BLE001 - the slow thread must outlive one bad read
                    pass
            self._stop.wait(self._slow_interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    # -- processes --------------------------------------------------------------------------
    def _named(self, p: GpuProcess) -> GpuProcess:
        if p.pid not in self._names:
            name = self.nvml.process_name(p.pid).value
            if not name and self.host is not None:
                name = self.host.read(self.host.proc(p.pid, "comm")).value
            self._names[p.pid] = name
        return GpuProcess(p.pid, p.used_memory_bytes, self._names[p.pid])
