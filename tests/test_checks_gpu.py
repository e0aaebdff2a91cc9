"""The GPU audit family against the fake NVML and fixture trees."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from collectors.gpu import Nvml
from collectors.host import Host
from tests.fakes.nvml import (
    LIBRARY_NOT_FOUND,
    NOT_SUPPORTED,
    FakeGpu,
    FakeNvmlLib,
    a100_r535_x4,
    h200_r580,
    v100_r470,
)
from tuning.checks import gpu as checks
from tuning.checks.base import AuditContext
from tuning.findings import Status
from tuning.profiles import load_profile

FIX = Path(__file__).resolve().parent / "fixtures"
PROFILE = load_profile("hft-gpu")


@pytest.fixture
def gpu_tree(tmp_path) -> Path:
    """The captured H200 tree plus the driver's version file (the capture skipped
    /proc/driver): a box with the driver loaded."""
    root = tmp_path / "h200"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n")
    os.symlink(FIX / "gpu-h200/sys", root / "sys")
    return root


@pytest.fixture(autouse=True)
def no_tensorflow(monkeypatch):
    monkeypatch.setattr(checks, "_find_spec", lambda name: None)


def run(root: Path, lib, *, live: bool = True, cpus=(2, 3), pid=None, online=range(16)):
    host = Host(root)
    host.live = live  # the fixture stands in for a live box; NVML is the fake
    ctx = AuditContext(host, PROFILE, cpus=list(cpus), online=list(online), pid=pid,
                       gpu=None if lib is None else Nvml(lib=lib))
    return {f.id: f for f in checks.check(ctx)}


def test_no_driver_is_one_unsupported_finding():
    [f] = checks.check(AuditContext(Host(FIX / "vm-dev"), PROFILE, [0], [0, 1]))
    assert (f.id, f.status) == ("gpu.driver", Status.UNSUPPORTED)
    assert "/proc/driver/nvidia/version absent from this tree" in f.current  # a tree


def test_captured_h200_tree_without_driver_file_is_unsupported_and_never_calls_nvml(tree_copy):
    root = tree_copy("gpu-h200")
    shutil.rmtree(root / "proc/driver/nvidia")  # as if the driver were not loaded
    lib = h200_r580()
    host = Host(root)
    [f] = checks.check(AuditContext(host, PROFILE, [0], list(range(16)), gpu=Nvml(lib=lib)))
    assert f.status == Status.UNSUPPORTED and lib.calls == []


def test_root_tree_never_queries_nvml(gpu_tree):
    lib = h200_r580()
    fs = run(gpu_tree, lib, live=False)
    assert lib.calls == []
    assert fs["gpu.nvml"].status == Status.UNSUPPORTED
    assert "NVML reads the live machine; --root given" in fs["gpu.nvml"].current
    # what sysfs in the tree says still counts
    assert fs["gpu.0.pcie_link"].status == Status.OK and "gen5 x16" in fs["gpu.0.pcie_link"].current
    assert fs["gpu.0.numa"].status == Status.OK


def test_nvml_init_failure_is_one_unsupported_finding(gpu_tree):
    fs = run(gpu_tree, FakeNvmlLib(init_error=LIBRARY_NOT_FOUND))
    assert list(fs) == ["gpu.nvml"]
    assert "LibraryNotFound" in fs["gpu.nvml"].current


def test_h200_as_captured(gpu_tree):
    fs = run(gpu_tree, h200_r580())
    assert set(fs) == {"gpu.driver", "gpu.tf_cuda"} | {
        f"gpu.0.{k}" for k in ("persistence", "compute_mode", "foreign_processes", "clocks",
                               "app_clocks", "pcie_link", "pcie_replay", "ecc", "retired_pages",
                               "numa", "mig")}
    assert fs["gpu.driver"].current.startswith("580.159.04, CUDA 13.0")
    assert fs["gpu.0.persistence"].status == Status.OK
    cm = fs["gpu.0.compute_mode"]
    assert cm.status == Status.FAIL and cm.fix == "nvidia-smi -i 0 -c EXCLUSIVE_PROCESS"
    clk = fs["gpu.0.clocks"]
    assert clk.status == Status.OK and "idle downclock (harmless)" in clk.current
    assert fs["gpu.0.retired_pages"].status == Status.OK  # remapped rows clean; pages NotSupported
    assert "NVML NUMA node NotSupported" in fs["gpu.0.numa"].current
    assert fs["gpu.0.mig"].status == Status.OK
    assert fs["gpu.tf_cuda"].status == Status.UNSUPPORTED


@pytest.mark.parametrize("mask,names", [(0x8, "HW slowdown"), (0x40, "HW thermal slowdown"),
                                        (0x80, "HW power brake"), (0x4, "SW power cap"),
                                        (0x20, "SW thermal slowdown")])
def test_throttle_reasons_fail_and_are_named(gpu_tree, mask, names):
    f = run(gpu_tree, FakeNvmlLib([FakeGpu(reasons=mask)]))["gpu.0.clocks"]
    assert f.status == Status.FAIL and names in f.current and f.fix


def test_width_drop_always_fails_gen_drop_only_under_load(gpu_tree):
    f = run(gpu_tree, FakeNvmlLib([FakeGpu(pcie=(5, 5, 8, 16))]))["gpu.0.pcie_link"]
    assert f.status == Status.FAIL and "reseat" in f.fix
    idle = run(gpu_tree, FakeNvmlLib([FakeGpu(pcie=(1, 5, 16, 16), reasons=0x1)]))
    assert idle["gpu.0.pcie_link"].status == Status.OK
    assert "power saving" in idle["gpu.0.pcie_link"].current
    busy = run(gpu_tree, FakeNvmlLib([FakeGpu(pcie=(3, 5, 16, 16), reasons=0x0, util=(90, 40))]))
    assert busy["gpu.0.pcie_link"].status == Status.FAIL


def test_foreign_processes_with_and_without_pid(gpu_tree):
    lib = FakeNvmlLib([FakeGpu(processes=[(100, 2**30), (4242, 2**20)])],
                      process_names={100: "infer", 4242: "python3"})
    f = run(gpu_tree, lib, pid=100)["gpu.0.foreign_processes"]
    assert f.status == Status.FAIL and "4242 (python3)" in f.current and "4242" in f.fix
    assert f.data["foreign"] == [4242]
    lib1 = FakeNvmlLib([FakeGpu(processes=[(100, 2**30)])])
    assert run(gpu_tree, lib1)["gpu.0.foreign_processes"].status == Status.OK
    assert run(gpu_tree, lib, pid=None)["gpu.0.foreign_processes"].status == Status.FAIL


def test_ecc_and_pending_remap(gpu_tree):
    fs = run(gpu_tree, FakeNvmlLib([FakeGpu(ecc_uncorrected_volatile=2,
                                            remapped=(0, 0, 1, 0))]))
    assert fs["gpu.0.ecc"].status == Status.FAIL
    assert fs["gpu.0.retired_pages"].status == Status.PENDING_REBOOT
    fs = run(gpu_tree, FakeNvmlLib([FakeGpu(remapped=(0, 1, 0, 1))]))
    assert fs["gpu.0.retired_pages"].status == Status.FAIL


def test_lowered_application_clocks(gpu_tree):
    g = FakeGpu(app_clocks={0: 1410, 1: 1410, 2: 3201})
    f = run(gpu_tree, FakeNvmlLib([g]))["gpu.0.app_clocks"]
    assert f.status == Status.FAIL and "-rac" in f.fix


def test_not_supported_reading_is_unsupported_not_ok(gpu_tree):
    lib = FakeNvmlLib([FakeGpu(errors={"nvmlDeviceGetPersistenceMode": NOT_SUPPORTED})])
    f = run(gpu_tree, lib)["gpu.0.persistence"]
    assert f.status == Status.UNSUPPORTED and "NotSupported" in f.current


def test_several_gpus_one_lost(gpu_tree):
    lib = a100_r535_x4()
    lib.gpus[1].lost = True
    fs = run(gpu_tree, lib, cpus=[40, 41], online=range(64))
    assert fs["gpu.1.lost"].status == Status.FAIL and "Xid" in fs["gpu.1.lost"].fix
    assert "gpu.1.persistence" not in fs
    for g in (0, 2, 3):
        assert fs[f"gpu.{g}.persistence"].status == Status.OK
    # NUMA: A100s are not in the H200 tree's sysfs, so NVML's CPU affinity answers. CPUs
    # 40-41 are local to GPUs 2-3: GPU 0 is either unused or driven across nodes (warn).
    f0 = fs["gpu.0.numa"]
    assert f0.status == Status.WARN and "no target CPU is local to this GPU" in f0.current
    assert "GPU 2: 40-41" in f0.current and "unknown (PCI function not in sysfs)" in f0.current
    assert fs["gpu.2.numa"].status == Status.OK


def test_mig_not_supported_is_off(gpu_tree):
    assert run(gpu_tree, v100_r470())["gpu.0.mig"].status == Status.OK
    fs = run(gpu_tree, FakeNvmlLib([FakeGpu(mig=(0, 1))]))
    assert fs["gpu.0.mig"].status == Status.WARN  # pending on, profile wants off (severity warn)
    fs = run(gpu_tree, FakeNvmlLib([FakeGpu(mig=(1, 0))]))
    assert fs["gpu.0.mig"].status == Status.PENDING_REBOOT  # reset pending to reach off


def _tf(monkeypatch, tmp_path, info: str):
    pkg = tmp_path / "tensorflow"
    (pkg / "python/platform").mkdir(parents=True)
    (pkg / "python/platform/build_info.py").write_text(
        "import collections\n\nbuild_info = collections.OrderedDict(" + info + ")\n")
    monkeypatch.setattr(checks, "_find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(pkg)]))


@pytest.mark.parametrize("cuda,lib,status", [
    ("12.5.1", h200_r580, Status.OK), ("13.2", h200_r580, Status.WARN),
    ("12.3", v100_r470, Status.FAIL)])
def test_tf_cuda_build_vs_driver_without_importing_tf(gpu_tree, monkeypatch, tmp_path, cuda, lib,
                                                      status):
    _tf(monkeypatch, tmp_path, f"[('cuda_version', '{cuda}'), ('cudnn_version', '9'), "
                               "('is_cuda_build', True)]")
    f = run(gpu_tree, lib())["gpu.tf_cuda"]
    assert f.status == status and f"CUDA {cuda}, cuDNN 9" in f.current


def test_tf_cpu_build_is_unsupported(gpu_tree, monkeypatch, tmp_path):
    _tf(monkeypatch, tmp_path, "[('is_cuda_build', False), ('is_rocm_build', False)]")
    f = run(gpu_tree, h200_r580())["gpu.tf_cuda"]
    assert f.status == Status.UNSUPPORTED and "CPU-only" in f.current


def test_real_tf_build_info_file_parses_when_installed(monkeypatch):
    import importlib.util
    monkeypatch.setattr(checks, "_find_spec", importlib.util.find_spec)
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow not installed")
    r = checks.tf_build_info()
    assert r.ok and "is_cuda_build" in r.value

