"""A fake nvidia-ml-py (``pynvml``) with the same shape: module-level-like functions taking
device handles, an ``NVMLError`` whose ``.value`` is the NVML return code, structs with the
same attribute names. Presets reproduce driver generations and failure scenarios seen in the
field; each is named after what it reproduces.

Used as ``Nvml(lib=FakeNvmlLib(...))``. Every call is logged in ``calls`` as
``(function, gpu index or None, thread name)`` so tests can prove where a call ran.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

# NVML return codes (nvml.h)
UNINITIALIZED, NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED = 1, 3, 4, 9
LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST = 12, 13, 15

_NAMES = {UNINITIALIZED: "Uninitialized", NOT_SUPPORTED: "Not Supported",
          NO_PERMISSION: "Insufficient Permissions", DRIVER_NOT_LOADED: "Driver Not Loaded",
          LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
          FUNCTION_NOT_FOUND: "Function Not Found", GPU_IS_LOST: "GPU is lost"}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML Error with code {self.value}")


@dataclass
class FakeGpu:
    """One GPU's state. Defaults: the lent H200 at idle (tests/fixtures/gpu-h200-facts)."""

    name: str = "NVIDIA H200"
    bus_id: str = "00000000:00:06.0"
    uuid: str = "GPU-145a5374-015f-f138-bb23-e07b50777cc0"
    persistence: int = 1
    compute_mode: int = 0  # DEFAULT
    clocks: dict[int, int] = field(default_factory=lambda: {0: 345, 1: 345, 2: 3201})
    max_clocks: dict[int, int] = field(default_factory=lambda: {0: 1980, 1: 1980, 2: 3201})
    app_clocks: dict[int, int] = field(default_factory=lambda: {0: 1980, 1: 1980, 2: 3201})
    default_app_clocks: dict[int, int] = field(default_factory=lambda: {0: 1980, 1: 1980,
                                                                        2: 3201})
    reasons: int = 0x1  # idle
    util: tuple[int, int] = (0, 0)
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)  # cur gen, max gen, cur width, max width
    replay: int = 0
    tx_kb: int = 1000
    rx_kb: int = 600
    ecc_mode: tuple[int, int] = (1, 1)
    ecc_uncorrected_volatile: int = 0
    retired: tuple[list[int], list[int], int] | None = None  # None = NotSupported (H100/H200)
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    numa: int | None = None  # None = NotSupported (the H200 VM)
    cpu_affinity: list[int] = field(default_factory=lambda: [0xFFFF])  # CPUs 0-15
    mig: tuple[int, int] | None = (0, 0)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    violation_ns: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost: bool = False


class FakeNvmlLib:
    """The fake library. ``missing`` names functions the "driver" lacks (FunctionNotFound)."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver: str = "580.159.04",
                 cuda: int = 13000, init_error: int | None = None,
                 missing: tuple[str, ...] = (), process_names: dict[int, str] | None = None,
                 pcie_delay_s: float = 0.0, root: bool = True) -> None:
        self.gpus = [FakeGpu()] if gpus is None else gpus
        self.driver, self.cuda = driver, cuda
        self.init_error = init_error
        self.missing = set(missing)
        self.process_names = process_names or {}
        self.pcie_delay_s = pcie_delay_s
        self.root = root
        self.initialised = False
        self.init_count = 0
        self.calls: list[tuple[str, int | None, str]] = []
        self._lock = threading.Lock()

    # -- helpers -----------------------------------------------------------------------------
    def _log(self, fn: str, gpu: int | None) -> None:
        with self._lock:
            self.calls.append((fn, gpu, threading.current_thread().name))

    def _sys(self, fn: str) -> None:
        self._log(fn, None)
        if fn in self.missing:
            raise FakeNVMLError(FUNCTION_NOT_FOUND)
        if not self.initialised:
            raise FakeNVMLError(UNINITIALIZED)

    def _dev(self, fn: str, h: FakeGpu) -> FakeGpu:
        self._log(fn, self.gpus.index(h))
        if fn in self.missing:
            raise FakeNVMLError(FUNCTION_NOT_FOUND)
        if not self.initialised:
            raise FakeNVMLError(UNINITIALIZED)
        if h.lost:
            raise FakeNVMLError(GPU_IS_LOST)
        if fn in h.errors:
            raise FakeNVMLError(h.errors[fn])
        return h

    def count(self, fn: str, gpu: int | None = None) -> int:
        return sum(1 for f, g, _ in self.calls if f == fn and (gpu is None or g == gpu))

    # -- system ------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._log("nvmlInit", None)
        self.init_count += 1
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._sys("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._sys("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._sys("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._sys("nvmlSystemGetProcessName")
        if pid not in self.process_names:
            raise FakeNVMLError(6)  # NotFound: the process exited
        return self.process_names[pid]

    def nvmlDeviceGetCount(self) -> int:
        self._sys("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._sys("nvmlDeviceGetHandleByIndex")
        if i >= len(self.gpus):
            raise FakeNVMLError(2)  # InvalidArgument
        if self.gpus[i].lost:
            raise FakeNVMLError(GPU_IS_LOST)
        return self.gpus[i]

    # -- device ------------------------------------------------------------------------------
    def nvmlDeviceGetName(self, h):
        return self._dev("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(self, h):
        return self._dev("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(self, h):
        g = self._dev("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=g.bus_id.encode(), busIdLegacy=g.bus_id[4:].encode())

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._dev("nvmlDeviceGetPersistenceMode", h).persistence

    def nvmlDeviceSetPersistenceMode(self, h, mode):
        g = self._dev("nvmlDeviceSetPersistenceMode", h)
        if not self.root:
            raise FakeNVMLError(NO_PERMISSION)
        g.persistence = mode

    def nvmlDeviceGetComputeMode(self, h):
        return self._dev("nvmlDeviceGetComputeMode", h).compute_mode

    def nvmlDeviceSetComputeMode(self, h, mode):
        g = self._dev("nvmlDeviceSetComputeMode", h)
        if not self.root:
            raise FakeNVMLError(NO_PERMISSION)
        g.compute_mode = mode

    def nvmlDeviceGetClockInfo(self, h, t):
        return self._dev("nvmlDeviceGetClockInfo", h).clocks[t]

    def nvmlDeviceGetMaxClockInfo(self, h, t):
        return self._dev("nvmlDeviceGetMaxClockInfo", h).max_clocks[t]

    def nvmlDeviceGetApplicationsClock(self, h, t):
        return self._dev("nvmlDeviceGetApplicationsClock", h).app_clocks[t]

    def nvmlDeviceGetDefaultApplicationsClock(self, h, t):
        return self._dev("nvmlDeviceGetDefaultApplicationsClock", h).default_app_clocks[t]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetViolationStatus(self, h, policy):
        g = self._dev("nvmlDeviceGetViolationStatus", h)
        return SimpleNamespace(referenceTime=int(time.time() * 1e6),
                               violationTime=g.violation_ns[policy])

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._dev("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util[0], memory=g.util[1])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._dev("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._dev("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._dev("nvmlDeviceGetCurrPcieLinkWidth", h).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._dev("nvmlDeviceGetMaxPcieLinkWidth", h).pcie[3]

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._dev("nvmlDeviceGetPcieReplayCounter", h).replay

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        g = self._dev("nvmlDeviceGetPcieThroughput", h)
        if self.pcie_delay_s:
            time.sleep(self.pcie_delay_s)  # the real call blocks ~20 ms
        return g.tx_kb if counter == 0 else g.rx_kb

    def nvmlDeviceGetEccMode(self, h):
        return list(self._dev("nvmlDeviceGetEccMode", h).ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        g = self._dev("nvmlDeviceGetTotalEccErrors", h)
        return g.ecc_uncorrected_volatile if (error_type, counter_type) == (1, 0) else 0

    def nvmlDeviceGetRetiredPages(self, h, cause):
        g = self._dev("nvmlDeviceGetRetiredPages", h)
        if g.retired is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return list(g.retired[cause])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        g = self._dev("nvmlDeviceGetRetiredPagesPendingStatus", h)
        if g.retired is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return g.retired[2]

    def nvmlDeviceGetRemappedRows(self, h):
        g = self._dev("nvmlDeviceGetRemappedRows", h)
        if g.remapped is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return g.remapped

    def nvmlDeviceGetNumaNodeId(self, h):
        g = self._dev("nvmlDeviceGetNumaNodeId", h)
        if g.numa is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return g.numa

    def nvmlDeviceGetCpuAffinity(self, h, size):
        return list(self._dev("nvmlDeviceGetCpuAffinity", h).cpu_affinity[:size])

    def nvmlDeviceGetMigMode(self, h):
        g = self._dev("nvmlDeviceGetMigMode", h)
        if g.mig is None:
            raise FakeNVMLError(NOT_SUPPORTED)
        return list(g.mig)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        g = self._dev("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in g.processes]


# -- presets: driver generations ---------------------------------------------------------------
def h200_r580() -> FakeNvmlLib:
    """The lent H200 at idle, driver 580.159.04 / CUDA 13.0, as captured in
    tests/fixtures/gpu-h200-facts: persistence on, compute mode Default, reasons 0x1 (idle),
    SM 345 of 1980 MHz, gen5 x16, NUMA node NotSupported, retired pages NotSupported, MIG off."""
    return FakeNvmlLib([FakeGpu()])


def v100_r470() -> FakeNvmlLib:
    """A V100 on driver 470 (CUDA 11.4): no nvmlDeviceGetCurrentClocksEventReasons yet (only the
    old "ThrottleReasons" name), no row remapping (retired pages instead), no MIG, gen3 x16."""
    g = FakeGpu(name="Tesla V100-SXM2-16GB", bus_id="00000000:3B:00.0", pcie=(3, 3, 16, 16),
                clocks={0: 1530, 1: 1530, 2: 877}, max_clocks={0: 1530, 1: 1530, 2: 877},
                app_clocks={0: 1312, 1: 1312, 2: 877}, default_app_clocks={0: 1312, 1: 1312,
                                                                           2: 877},
                reasons=0x0, retired=([], [], 0), remapped=None, mig=None, numa=None)
    return FakeNvmlLib([g], driver="470.256.02", cuda=11040,
                       missing=("nvmlDeviceGetCurrentClocksEventReasons",))


def a100_r535_x4() -> FakeNvmlLib:
    """Four A100s on driver 535 (CUDA 12.2), two NUMA nodes: GPUs 0-1 local to CPUs 0-31,
    GPUs 2-3 to CPUs 32-63."""
    gpus = []
    for i, bus in enumerate(("07", "0F", "87", "8F")):
        lo = i < 2
        gpus.append(FakeGpu(name="NVIDIA A100-SXM4-80GB", bus_id=f"00000000:{bus}:00.0",
                            uuid=f"GPU-a100-{i}", pcie=(4, 4, 16, 16),
                            cpu_affinity=[0xFFFFFFFF, 0] if lo else [0xFFFFFFFF << 32, 0],
                            numa=None))
    return FakeNvmlLib(gpus, driver="535.183.01", cuda=12020)


def h200_x2_numa() -> FakeNvmlLib:
    """Two H200s on a two-socket box, one per NUMA node (the layout of issue #19): GPU 0 at
    0000:18:00.0 behind root port 0000:17:00.0 on node 0 (CPUs 0-7), GPU 1 at 0000:af:00.0
    behind 0000:ae:00.0 on node 1 (CPUs 8-15). NVML spells the bus ids upper case with an
    8-digit domain; its index order is PCI bus order. Idle, persistence on, compute mode
    Default, as the lent H200 (tests/fixtures/gpu-h200-facts)."""
    return FakeNvmlLib([
        FakeGpu(bus_id="00000000:18:00.0", uuid="GPU-h200-node0", cpu_affinity=[0x00FF]),
        FakeGpu(bus_id="00000000:AF:00.0", uuid="GPU-h200-node1", cpu_affinity=[0xFF00]),
    ])
