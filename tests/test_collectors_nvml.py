"""The NVML adapter against the fake library: lazy init, the error chokepoint, per-device
isolation, driver generations. Named after what each scenario reproduces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from collectors.gpu import (
    CLOCK_SM,
    Nvml,
    cpus_from_affinity_words,
    decode_clock_event_reasons,
    harmful_clock_event_reasons,
)
from tests.fakes.nvml import (
    DRIVER_NOT_LOADED,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    FakeGpu,
    FakeNvmlLib,
    a100_r535_x4,
    h200_r580,
    v100_r470,
)

REPO = Path(__file__).resolve().parents[1]


def test_importing_gpu_modules_never_imports_pynvml():
    code = ("import sys, collectors.gpu, collectors.nsight, tuning.checks.gpu, "
            "agent.commands.profile; assert 'pynvml' not in sys.modules, 'pynvml imported'; "
            "from collectors.gpu import Nvml; Nvml(); assert 'pynvml' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_init_is_lazy_and_runs_once():
    lib = h200_r580()
    nv = Nvml(lib=lib)
    assert lib.init_count == 0
    assert nv.persistence_mode(0).value is True
    assert nv.compute_mode(0).value == "DEFAULT"
    assert lib.init_count == 1


def test_h200_r580_readings_match_the_capture():
    nv = Nvml(lib=h200_r580())
    assert nv.driver_version().value == "580.159.04"
    assert nv.cuda_driver_version().value == (13, 0)
    assert nv.device_count().value == 1
    # NVML says 00000000:00:06.0, sysfs 0000:00:06.0: the adapter gives the sysfs form.
    assert nv.pci_bus_id(0).value == "0000:00:06.0"
    assert (nv.clock_mhz(0, CLOCK_SM).value, nv.max_clock_mhz(0, CLOCK_SM).value) == (345, 1980)
    assert nv.clock_event_reasons(0).value == 0x1
    link = nv.pcie_link(0)
    assert (link.cur_gen, link.max_gen, link.cur_width, link.max_width) == (5, 5, 16, 16)
    assert nv.pcie_throughput_bytes_per_s(0, 0).value == 1000 * 1024
    assert nv.mig_mode(0).value == (False, False)
    assert nv.cpu_affinity(0, 16).value == list(range(16))
    assert nv.remapped_rows(0).value == (0, 0, False, False)


def test_not_supported_is_none_with_reason_never_zero():
    nv = Nvml(lib=h200_r580())
    numa = nv.numa_node(0)  # NotSupported on the H200 VM (gpu-h200-facts)
    assert numa.value is None
    assert numa.reason.startswith("unsupported") and "NotSupported" in numa.reason
    pages = nv.retired_pages(0)  # row remapping GPUs do not retire pages
    assert pages.value is None and "NotSupported" in pages.reason


def test_library_not_found_makes_every_reading_none_with_the_init_reason():
    lib = FakeNvmlLib(init_error=LIBRARY_NOT_FOUND)
    nv = Nvml(lib=lib)
    for r in (nv.device_count(), nv.persistence_mode(0), nv.driver_version()):
        assert r.value is None and "LibraryNotFound" in r.reason
    assert lib.init_count == 1  # the failure is remembered, not retried per reading


def test_driver_not_loaded():
    nv = Nvml(lib=FakeNvmlLib(init_error=DRIVER_NOT_LOADED))
    assert "DriverNotLoaded" in nv.init().reason


def test_nvidia_ml_py_missing():
    def loader():
        raise ImportError("No module named 'pynvml'")
    r = Nvml(loader=loader).device_count()
    assert r.value is None and "nvidia-ml-py not installed" in r.reason


def test_a_library_crash_becomes_an_error_reading_not_an_exception():
    lib = h200_r580()

    def boom(h):
        raise OSError("libnvidia-ml.so: undefined symbol")
    lib.nvmlDeviceGetName = boom
    r = Nvml(lib=lib).name(0)
    assert r.value is None and r.reason.startswith("error: OSError")


def test_lost_gpu_is_isolated_and_not_called_again():
    lib = a100_r535_x4()
    nv = Nvml(lib=lib)
    assert nv.name(1).ok
    lib.gpus[1].lost = True  # Xid 79 mid-run: fell off the bus
    r = nv.clock_event_reasons(1)
    assert r.value is None and r.reason.startswith("lost") and nv.is_lost(1)
    before = len(lib.calls)
    assert nv.persistence_mode(1).reason.startswith("lost")
    assert len(lib.calls) == before  # the lost GPU is not asked again
    for g in (0, 2, 3):
        assert nv.persistence_mode(g).value is True
        assert nv.clock_event_reasons(g).ok


def test_gpu_lost_before_first_handle():
    lib = a100_r535_x4()
    lib.gpus[2].lost = True
    nv = Nvml(lib=lib)
    assert nv.name(2).reason.startswith("lost")
    assert nv.is_lost(2)
    assert nv.name(3).value == "NVIDIA A100-SXM4-80GB"


def test_v100_r470_falls_back_to_throttle_reasons_name():
    lib = v100_r470()
    nv = Nvml(lib=lib)
    assert nv.clock_event_reasons(0).value == 0
    assert lib.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1
    assert nv.cuda_driver_version().value == (11, 4)
    assert nv.mig_mode(0).value is None  # no MIG on Volta
    assert nv.retired_pages(0).value == (0, 0, False)


def test_setters_roundtrip_for_the_tuning_tunables():
    lib = h200_r580()
    nv = Nvml(lib=lib)
    assert nv.set_compute_mode(0, "EXCLUSIVE_PROCESS").value is True
    assert nv.compute_mode(0).value == "EXCLUSIVE_PROCESS"
    assert nv.set_persistence_mode(0, False).value is True
    assert nv.persistence_mode(0).value is False
    with pytest.raises(ValueError):
        nv.set_compute_mode(0, "SHARED")


def test_setter_without_root_is_a_permission_reason():
    lib = FakeNvmlLib([FakeGpu()], root=False)
    r = Nvml(lib=lib).set_compute_mode(0, "EXCLUSIVE_PROCESS")
    assert r.value is None and r.reason.startswith("permission") and "NoPermission" in r.reason
    assert lib.gpus[0].compute_mode == 0


def test_per_call_error_injection_keeps_other_readings():
    lib = FakeNvmlLib([FakeGpu(errors={"nvmlDeviceGetUtilizationRates": NO_PERMISSION,
                                       "nvmlDeviceGetPcieReplayCounter": NOT_SUPPORTED})])
    nv = Nvml(lib=lib)
    assert nv.utilization(0).reason.startswith("permission")
    assert nv.pcie_replay_counter(0).reason.startswith("unsupported")
    assert nv.clock_mhz(0).value == 345


def test_clock_event_reason_decoding():
    assert decode_clock_event_reasons(0) == ["none"]
    assert decode_clock_event_reasons(0x1) == ["idle"]
    assert harmful_clock_event_reasons(0x1) == []
    assert harmful_clock_event_reasons(0x10 | 0x100 | 0x2) == []  # sync boost, display, apps
    assert harmful_clock_event_reasons(0x4 | 0x8 | 0x20 | 0x40 | 0x80) == [
        "SW power cap", "HW slowdown", "SW thermal slowdown", "HW thermal slowdown",
        "HW power brake"]
    assert decode_clock_event_reasons(0x1 | 0x1000) == ["idle", "unknown 0x1000"]


def test_cpu_affinity_words():
    assert cpus_from_affinity_words([0b101]) == [0, 2]
    assert cpus_from_affinity_words([0, 1]) == [64]
    assert Nvml(lib=a100_r535_x4()).cpu_affinity(2, 64).value == list(range(32, 64))


def test_the_adapter_and_the_collector_are_separate_modules_and_import_no_agent_code():
    """collectors/nvml.py is the NVML adapter, collectors/gpu.py the collector (it re-exports
    the adapter's names); the GPU cause rules are attribution's (agent/watch/attribution/gpu.py):
    neither collector module imports agent code, nor holds a cause rule."""
    code = ("import sys, collectors.gpu, collectors.nvml; "
            "assert collectors.gpu.Nvml is collectors.nvml.Nvml; "
            "assert not [m for m in sys.modules if m == 'agent' or m.startswith('agent.')], "
            "sorted(m for m in sys.modules if m.startswith('agent')); "
            "assert not hasattr(collectors.gpu, 'gpu_causes') and "
            "not hasattr(collectors.gpu.GpuCollector, 'causes')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert r.returncode == 0, r.stderr
