"""The NVML adapter (:class:`Nvml`): NVIDIA GPUs through NVML, for the GPU collector
(:mod:`collectors.gpu`), the audit's GPU checks and tuning.

``pynvml`` (nvidia-ml-py) is imported lazily on the first call, never at import time. Every
NVML call goes through one chokepoint (:meth:`Nvml.call`) that turns NVML errors into a
:class:`~collectors.host.Reading` with ``value=None`` and a reason (NotSupported,
NoPermission, GpuIsLost, FunctionNotFound, Uninitialized, LibraryNotFound, DriverNotLoaded
...). A GPU that reports GpuIsLost is remembered as lost and not called again, so one dead GPU
never blocks the readings of the others (per-device isolation). Each reading method's
docstring names its unit and the ``nvidia-smi`` equivalent. Tests pass a fake library with
the same shape (tests/fakes/nvml.py).

Raw pynvml per-call costs measured on a Hopper GPU (driver 580.159.04, 2026-11-29): clock
1.9-2.2 µs, event reasons 1.6-1.8 µs, utilisation 1.4-1.8 µs, compute processes 8-10 µs,
volatile ECC 1.5-3 µs, replay counter 93-175 µs, violation status 0.4-0.8 ms, application
clocks 0.5-0.6 ms, PCIe throughput 20.6-20.9 ms. The adapter adds ~4 µs per call there
(docs/gpu-validation.md, bench/nvml_cost.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from collectors.host import ERROR, PERMISSION, UNSUPPORTED, Reading
from collectors.pcie import normalize_bus_id

LOST = "lost"

# NVML return codes (nvml.h; stable ABI, identical in every nvidia-ml-py): the chokepoint maps
# them itself so that a fake library needs no constants.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_GPU_NOT_FOUND = 28

_REASONS = {
    NVML_ERROR_UNINITIALIZED: f"{ERROR}: NVML not initialised (Uninitialized)",
    NVML_ERROR_NOT_SUPPORTED: f"{UNSUPPORTED}: not supported on this GPU/driver (NotSupported)",
    NVML_ERROR_NO_PERMISSION: f"{PERMISSION}: NVML refused (NoPermission; retry as root)",
    NVML_ERROR_DRIVER_NOT_LOADED: f"{UNSUPPORTED}: NVIDIA driver not loaded (DriverNotLoaded)",
    NVML_ERROR_LIBRARY_NOT_FOUND: f"{UNSUPPORTED}: libnvidia-ml.so not found (LibraryNotFound)",
    NVML_ERROR_FUNCTION_NOT_FOUND: f"{UNSUPPORTED}: driver too old for this call "
                                   "(FunctionNotFound)",
    NVML_ERROR_GPU_IS_LOST: f"{LOST}: GPU fell off the bus or stopped answering (GpuIsLost)",
    NVML_ERROR_RESET_REQUIRED: f"{LOST}: GPU needs a reset (ResetRequired)",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: f"{ERROR}: NVML library and kernel module versions "
                                        "differ (LibRmVersionMismatch; reboot or reload)",
    NVML_ERROR_GPU_NOT_FOUND: f"{LOST}: GPU not found (GpuNotFound)",
}
# A GPU that answers one of these is not asked again: its other calls would fail the same way,
# and on a lost GPU each call can take the driver's timeout.
_DEVICE_FATAL = {NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, NVML_ERROR_GPU_NOT_FOUND}

# nvmlClockType_t / nvmlClockId_t / policies / counters (nvml.h)
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM = 0, 1, 2
PERF_POLICY_POWER, PERF_POLICY_THERMAL = 0, 1
PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES = 0, 1
MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC = 1, 0
RETIRE_CAUSE_SBE, RETIRE_CAUSE_DBE = 0, 1

COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
COMPUTE_MODE_IDS = {v: k for k, v in COMPUTE_MODES.items()}

# nvmlClocksEventReasons (formerly "throttle reasons"), nvml.h. The idle bit is harmless: the
# GPU downclocks because nothing runs. The HARMFUL bits cut SM clocks while work is running.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "idle",
    0x002: "applications clocks setting",
    0x004: "SW power cap",
    0x008: "HW slowdown",
    0x010: "sync boost",
    0x020: "SW thermal slowdown",
    0x040: "HW thermal slowdown",
    0x080: "HW power brake",
    0x100: "display clock setting",
    0x200: "board limit",
    0x400: "reliability",
}
CLOCK_EVENT_IDLE = 0x001
CLOCK_EVENT_HARMFUL = 0x004 | 0x008 | 0x020 | 0x040 | 0x080 | 0x200 | 0x400


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clocks-event-reasons mask ("none" for 0)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown 0x{unknown:x}")
    return names or ["none"]


def harmful_clock_event_reasons(mask: int) -> list[str]:
    """The reasons in ``mask`` that throttle a GPU doing work (not idle, not sync boost...)."""
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit & CLOCK_EVENT_HARMFUL]


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _done(r: Reading) -> Reading[bool]:
    """A setter's result: NVML's setters return None, so success must become True explicitly
    (a None value without a reason would read as "failed for no reason")."""
    return Reading(True, r.path) if r.reason is None else r


def _import_pynvml() -> Any:
    import pynvml  # lazy: importing it costs ~30 ms and needs no GPU; loading libnvidia-ml is
    return pynvml  # what nvmlInit does


def cpus_from_affinity_words(words: Iterable[int], word_bits: int = 64) -> list[int]:
    """nvmlDeviceGetCpuAffinity's array of unsigned longs (bit i of word w = CPU w*64+i)."""
    out = []
    for w, word in enumerate(words):
        word = int(word)
        for b in range(word_bits):
            if word >> b & 1:
                out.append(w * word_bits + b)
    return out


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (nvidia-smi --query-compute-apps=pid,process_name,used_memory)."""

    pid: int
    used_memory_bytes: int | None
    name: str | None = None


@dataclass(frozen=True)
class PcieLink:
    """PCIe link generation and width, current and max (nvidia-smi --query-gpu=
    pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max)."""

    cur_gen: int | None
    max_gen: int | None
    cur_width: int | None
    max_width: int | None

    def __str__(self) -> str:
        def q(v):
            return "?" if v is None else v
        return (f"gen{q(self.cur_gen)} x{q(self.cur_width)} "
                f"(max gen{q(self.max_gen)} x{q(self.max_width)})")


class Nvml:
    """Lazy NVML adapter. ``Nvml()`` uses nvidia-ml-py; ``Nvml(lib=fake)`` a fake in tests.

    Nothing happens until the first reading: then ``nvmlInit`` runs once. If it fails, every
    reading returns ``None`` with the init failure as its reason. Thread-safe: NVML itself is
    thread-safe and the adapter's own caches are guarded by a lock (the collector reads from
    the sampler thread and its slow thread at once).
    """

    def __init__(self, lib: Any = None, loader: Callable[[], Any] | None = None) -> None:
        self._lib = lib
        self._loader = loader or _import_pynvml
        self._init: Reading[bool] | None = None
        self._handles: dict[int, Any] = {}
        self._lost: dict[int, str] = {}
        self._lock = threading.Lock()

    # -- the chokepoint ----------------------------------------------------------------------
    def init(self) -> Reading[bool]:
        """Load the library and nvmlInit, once. ``value`` True when NVML is usable."""
        done = self._init
        if done is not None:  # fast path, no lock: every reading passes here
            return done
        with self._lock:
            if self._init is not None:
                return self._init
            if self._lib is None:
                try:
                    self._lib = self._loader()
                except ImportError as exc:
                    self._init = Reading(None, "nvml:import pynvml",
                                         f"{UNSUPPORTED}: nvidia-ml-py not installed ({exc})")
                    return self._init
            r = self._raw_call("nvmlInit", ())
            self._init = Reading(True, "nvml:nvmlInit") if r.reason is None else r
            return self._init

    def _raw_call(self, fn: str, args: tuple, gpu: int | None = None) -> Reading:
        path = f"nvml:{fn}" if gpu is None else f"nvml:{fn}(gpu {gpu})"
        f = getattr(self._lib, fn, None)
        if f is None:
            return Reading(None, path, f"{UNSUPPORTED}: nvidia-ml-py has no {fn} "
                                       "(FunctionNotFound)")
        err_cls = getattr(self._lib, "NVMLError", None)
        try:
            return Reading(f(*args), path)
        except Exception as exc:  # noqa: BLE001 - a library error must become a reason, see below
            code = getattr(exc, "value", None)
            if err_cls is not None and isinstance(exc, err_cls) and isinstance(code, int):
                reason = _REASONS.get(code, f"{ERROR}: NVML error {code} ({exc})")
                if gpu is not None and code in _DEVICE_FATAL:
                    self._lost[gpu] = reason
                return Reading(None, path, reason)
            # ctypes/OSError from a broken libnvidia-ml: still one GPU's reading, not a crash.
            return Reading(None, path, f"{ERROR}: {type(exc).__name__}: {exc}")

    def call(self, fn: str, *args: Any) -> Reading:
        """Call a system-level NVML function (no device handle) through the chokepoint."""
        init = self.init()
        if not init.ok:
            return Reading(None, f"nvml:{fn}", init.reason)
        return self._raw_call(fn, args)

    def _handle(self, gpu: int) -> Reading:
        h = self._handles.get(gpu)  # a dict read is atomic under the GIL
        if h is not None:
            return Reading(h, "")
        r = self._raw_call("nvmlDeviceGetHandleByIndex", (gpu,), gpu)
        if r.ok:
            with self._lock:
                self._handles[gpu] = r.value
        return r

    def device_call(self, gpu: int, fn: str, *args: Any) -> Reading:
        """Call a per-device NVML function on GPU ``gpu`` (index) through the chokepoint."""
        init = self.init()
        path = f"nvml:{fn}(gpu {gpu})"
        if not init.ok:
            return Reading(None, path, init.reason)
        if gpu in self._lost:
            return Reading(None, path, self._lost[gpu])
        h = self._handle(gpu)
        if not h.ok:
            return Reading(None, path, h.reason)
        return self._raw_call(fn, (h.value, *args), gpu)

    def is_lost(self, gpu: int) -> bool:
        return gpu in self._lost

    def shutdown(self) -> None:
        with self._lock:
            if self._init is not None and self._init.ok:
                self._raw_call("nvmlShutdown", ())
            self._init = None
            self._handles.clear()
            self._lost.clear()

    # -- system readings ---------------------------------------------------------------------
    def driver_version(self) -> Reading[str]:
        """Driver version string, e.g. "580.159.04" (nvidia-smi --query-gpu=driver_version)."""
        return self.call("nvmlSystemGetDriverVersion").map(_text)

    def cuda_driver_version(self) -> Reading[tuple[int, int]]:
        """Highest CUDA version the driver supports, (major, minor), e.g. (13, 0) from 13000
        (the "CUDA Version" in nvidia-smi's header)."""
        return self.call("nvmlSystemGetCudaDriverVersion").map(
            lambda v: (int(v) // 1000, int(v) % 1000 // 10))

    def device_count(self) -> Reading[int]:
        """Number of GPUs NVML sees (nvidia-smi --query-gpu=count)."""
        return self.call("nvmlDeviceGetCount").map(int)

    def process_name(self, pid: int) -> Reading[str]:
        """Name of a process using a GPU (nvidia-smi --query-compute-apps=process_name)."""
        return self.call("nvmlSystemGetProcessName", pid).map(_text)

    # -- per-device readings -----------------------------------------------------------------
    def name(self, gpu: int) -> Reading[str]:
        """Product name, e.g. "NVIDIA H200" (nvidia-smi --query-gpu=name)."""
        return self.device_call(gpu, "nvmlDeviceGetName").map(_text)

    def uuid(self, gpu: int) -> Reading[str]:
        """GPU UUID (nvidia-smi --query-gpu=uuid)."""
        return self.device_call(gpu, "nvmlDeviceGetUUID").map(_text)

    def pci_bus_id(self, gpu: int) -> Reading[str]:
        """PCI address normalised to the sysfs form "0000:00:06.0" (NVML says
        "00000000:00:06.0"; nvidia-smi --query-gpu=pci.bus_id)."""
        return self.device_call(gpu, "nvmlDeviceGetPciInfo").map(
            lambda p: normalize_bus_id(_text(p.busId)))

    def persistence_mode(self, gpu: int) -> Reading[bool]:
        """Persistence mode on/off (nvidia-smi --query-gpu=persistence_mode)."""
        return self.device_call(gpu, "nvmlDeviceGetPersistenceMode").map(lambda v: int(v) == 1)

    def set_persistence_mode(self, gpu: int, on: bool) -> Reading[bool]:
        """Set persistence mode; value True when NVML accepted it, else None + reason
        (NoPermission without root). Equivalent: ``nvidia-smi -i GPU -pm 1|0``."""
        return _done(self.device_call(gpu, "nvmlDeviceSetPersistenceMode", 1 if on else 0))

    def compute_mode(self, gpu: int) -> Reading[str]:
        """Compute mode: DEFAULT | EXCLUSIVE_PROCESS | PROHIBITED | EXCLUSIVE_THREAD
        (nvidia-smi --query-gpu=compute_mode)."""
        return self.device_call(gpu, "nvmlDeviceGetComputeMode").map(
            lambda v: COMPUTE_MODES[int(v)])

    def set_compute_mode(self, gpu: int, mode: str) -> Reading[bool]:
        """Set the compute mode by name; value True when accepted, else None + reason.
        Equivalent: ``nvidia-smi -i GPU -c EXCLUSIVE_PROCESS``. Raises ValueError for an
        unknown mode name (a caller bug, not a host condition)."""
        if mode not in COMPUTE_MODE_IDS:
            raise ValueError(f"unknown compute mode {mode!r} (one of {', '.join(COMPUTE_MODE_IDS)})")
        return _done(self.device_call(gpu, "nvmlDeviceSetComputeMode", COMPUTE_MODE_IDS[mode]))

    def clock_mhz(self, gpu: int, clock: int = CLOCK_SM) -> Reading[int]:
        """Current clock in MHz (nvidia-smi --query-gpu=clocks.sm / clocks.mem)."""
        return self.device_call(gpu, "nvmlDeviceGetClockInfo", clock).map(int)

    def max_clock_mhz(self, gpu: int, clock: int = CLOCK_SM) -> Reading[int]:
        """Max clock in MHz (nvidia-smi --query-gpu=clocks.max.sm / clocks.max.mem)."""
        return self.device_call(gpu, "nvmlDeviceGetMaxClockInfo", clock).map(int)

    def applications_clock_mhz(self, gpu: int, clock: int = CLOCK_SM) -> Reading[int]:
        """Applications clock target in MHz (nvidia-smi --query-gpu=clocks.applications.graphics).
        ~0.6 ms per call (Hopper, driver 580): audit only."""
        return self.device_call(gpu, "nvmlDeviceGetApplicationsClock", clock).map(int)

    def default_applications_clock_mhz(self, gpu: int, clock: int = CLOCK_SM) -> Reading[int]:
        """Default applications clock in MHz
        (nvidia-smi --query-gpu=clocks.default_applications.graphics). Audit only."""
        return self.device_call(gpu, "nvmlDeviceGetDefaultApplicationsClock", clock).map(int)

    def clock_event_reasons(self, gpu: int) -> Reading[int]:
        """Clocks-event-reasons bitmask (nvidia-smi --query-gpu=clocks_event_reasons.active,
        formerly clocks_throttle_reasons.active). Decode with decode_clock_event_reasons."""
        r = self.device_call(gpu, "nvmlDeviceGetCurrentClocksEventReasons")
        if r.ok:
            return r.map(int)
        if not self.is_lost(gpu) and r.reason and "FunctionNotFound" in r.reason:
            # Drivers before r535 only export the old name; same bits, same meaning.
            return self.device_call(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons").map(int)
        return r

    def violation_ns(self, gpu: int, policy: int) -> Reading[int]:
        """Cumulative time clocks were held below target by ``policy`` (PERF_POLICY_POWER,
        PERF_POLICY_THERMAL), in ns since driver load (nvidia-smi -q -d PERFORMANCE "Clocks
        Event Reasons Counters", shown there in µs). ~0.45 ms per call: slow thread only."""
        return self.device_call(gpu, "nvmlDeviceGetViolationStatus", policy).map(
            lambda v: int(v.violationTime))

    def utilization(self, gpu: int) -> Reading[tuple[int, int]]:
        """(GPU, memory) utilisation in percent over the driver's last sample period
        (nvidia-smi --query-gpu=utilization.gpu,utilization.memory)."""
        return self.device_call(gpu, "nvmlDeviceGetUtilizationRates").map(
            lambda u: (int(u.gpu), int(u.memory)))

    def pcie_link(self, gpu: int) -> PcieLink:
        """Current and max PCIe generation and width; each field None when unreadable
        (nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,...)."""
        def v(fn):
            return self.device_call(gpu, fn).map(int).value
        return PcieLink(v("nvmlDeviceGetCurrPcieLinkGeneration"),
                        v("nvmlDeviceGetMaxPcieLinkGeneration"),
                        v("nvmlDeviceGetCurrPcieLinkWidth"), v("nvmlDeviceGetMaxPcieLinkWidth"))

    def pcie_replay_counter(self, gpu: int) -> Reading[int]:
        """PCIe replays since reset, a count (nvidia-smi -q -d PCIE "Replays Since Reset").
        ~0.1 ms per call (Hopper, driver 580): slow thread only."""
        return self.device_call(gpu, "nvmlDeviceGetPcieReplayCounter").map(int)

    def pcie_throughput_bytes_per_s(self, gpu: int, counter: int) -> Reading[int]:
        """PCIe TX or RX throughput in bytes/s (NVML reports KB/s over a 20 ms window; nvidia-smi
        -q "Tx/Rx Throughput"). BLOCKS ~20 ms per call: never call from a fast path."""
        return self.device_call(gpu, "nvmlDeviceGetPcieThroughput", counter).map(
            lambda kb: int(kb) * 1024)

    def ecc_mode(self, gpu: int) -> Reading[bool]:
        """ECC enabled now (nvidia-smi --query-gpu=ecc.mode.current)."""
        return self.device_call(gpu, "nvmlDeviceGetEccMode").map(lambda v: int(v[0]) == 1)

    def ecc_volatile_uncorrected(self, gpu: int) -> Reading[int]:
        """Uncorrected ECC errors since driver load, a count
        (nvidia-smi --query-gpu=ecc.errors.uncorrected.volatile.total)."""
        return self.device_call(gpu, "nvmlDeviceGetTotalEccErrors", MEMORY_ERROR_UNCORRECTED,
                                VOLATILE_ECC).map(int)

    def retired_pages(self, gpu: int) -> Reading[tuple[int, int, bool]]:
        """(single-bit, double-bit) retired page counts and whether a retirement is pending
        (nvidia-smi --query-gpu=retired_pages.sbe,retired_pages.dbe,retired_pages.pending).
        Not supported on GPUs with row remapping (A100, H100, H200): see remapped_rows."""
        sbe = self.device_call(gpu, "nvmlDeviceGetRetiredPages", RETIRE_CAUSE_SBE)
        if not sbe.ok:
            return sbe
        dbe = self.device_call(gpu, "nvmlDeviceGetRetiredPages", RETIRE_CAUSE_DBE)
        pend = self.device_call(gpu, "nvmlDeviceGetRetiredPagesPendingStatus")
        if not dbe.ok:
            return dbe
        if not pend.ok:
            return pend
        return Reading((len(sbe.value), len(dbe.value), int(pend.value) == 1), sbe.path)

    def remapped_rows(self, gpu: int) -> Reading[tuple[int, int, bool, bool]]:
        """(correctable, uncorrectable) remapped rows, remap pending, remap failure occurred
        (nvidia-smi --query-remapped-rows=remapped_rows.correctable,remapped_rows.uncorrectable,
        remapped_rows.pending,remapped_rows.failure)."""
        return self.device_call(gpu, "nvmlDeviceGetRemappedRows").map(
            lambda t: (int(t[0]), int(t[1]), int(t[2]) == 1, int(t[3]) == 1))

    def numa_node(self, gpu: int) -> Reading[int]:
        """NUMA node of the GPU's memory where NVML knows it (nvidia-smi topo -m "GPU NUMA ID");
        NotSupported on most PCIe GPUs passed to a VM: use sysfs numa_node for the CPU side."""
        return self.device_call(gpu, "nvmlDeviceGetNumaNodeId").map(int)

    def cpu_affinity(self, gpu: int, ncpus: int) -> Reading[list[int]]:
        """CPUs local to the GPU (nvidia-smi topo -m "CPU Affinity")."""
        words = max(1, (ncpus + 63) // 64)
        return self.device_call(gpu, "nvmlDeviceGetCpuAffinity", words).map(
            lambda arr: cpus_from_affinity_words(list(arr)))

    def mig_mode(self, gpu: int) -> Reading[tuple[bool, bool]]:
        """MIG mode (current, pending) (nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending).
        NotSupported on GPUs without MIG."""
        return self.device_call(gpu, "nvmlDeviceGetMigMode").map(
            lambda v: (int(v[0]) == 1, int(v[1]) == 1))

    def compute_processes(self, gpu: int, names: bool = True) -> Reading[list[GpuProcess]]:
        """Compute processes on the GPU (nvidia-smi --query-compute-apps=pid,process_name,
        used_memory). ~8 µs per call (Hopper, driver 580) without names. PIDs are in the driver's PID
        namespace; a name that cannot be read stays None."""
        r = self.device_call(gpu, "nvmlDeviceGetComputeRunningProcesses")
        if not r.ok:
            return r
        out = []
        for p in r.value:
            mem = getattr(p, "usedGpuMemory", None)
            name = self.process_name(int(p.pid)).value if names else None
            out.append(GpuProcess(int(p.pid), None if mem is None else int(mem), name))
        return Reading(out, r.path)
