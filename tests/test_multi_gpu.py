"""Two GPUs on one box (issue #19), against the fake NVML and a synthetic sysfs tree.

The box: two sockets, NUMA node 0 = CPUs 0-7, node 1 = CPUs 8-15; GPU 0 at 0000:18:00.0
behind root port 0000:17:00.0 on node 0, GPU 1 at 0000:af:00.0 behind 0000:ae:00.0 on node 1
(tests/fakes/nvml.py h200_x2_numa). The tree is laid out as a 6.x kernel lays out sysfs:
bus/pci/devices/<addr> are links to the functions under their root ports in devices/pci*/.

Audit: every GPU finding is one GPU's (id, evidence, data name the index and bus id); a
foreign process on GPU 1 fails GPU 1 only; persistence, compute mode, clocks and the PCIe link
are judged per GPU; each GPU's NUMA node is judged against the target CPUs knowing the other
GPU. Watch: "GPU shared with PID ..." only for a foreign process on the probe's GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.watch.attribution import Attributor, Spike
from agent.watch.attribution.gpu import collector_causes, detail_for
from agent.watch.ring import SignalRing
from collectors.gpu import GpuCollector, Nvml
from collectors.host import Host
from tests.fakes.nvml import NOT_SUPPORTED, h200_x2_numa
from tuning.checks import gpu as checks
from tuning.checks.base import AuditContext
from tuning.findings import Status
from tuning.profiles import load_profile

PROFILE = load_profile("hft-gpu")
GPU_BUS = {0: "0000:18:00.0", 1: "0000:af:00.0"}
PORT = {0: "0000:17:00.0", 1: "0000:ae:00.0"}
NODE_CPUS = {0: "0-7", 1: "8-15"}
OWN, FOREIGN = 100, 4242


def _w(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def _function(d: Path, klass: str, vendor: str, node: int, width: int = 16) -> None:
    for name, v in (("class", klass), ("vendor", vendor), ("device", "0x2335"),
                    ("numa_node", str(node)), ("local_cpulist", NODE_CPUS[node]),
                    ("current_link_speed", "32.0 GT/s PCIe"), ("max_link_speed",
                                                               "32.0 GT/s PCIe"),
                    ("current_link_width", str(width)), ("max_link_width", "16"),
                    ("enable", "1")):
        _w(d / name, v)


def two_gpu_tree(root: Path, gpu1_width: int = 16, gpu_nodes: tuple[int, int] = (0, 1)) -> Path:
    """The two-socket, two-GPU box above (``gpu_nodes``: the GPUs' nodes, to move both onto
    one node); the driver's version file says a driver is loaded."""
    sys_ = root / "sys"
    _w(sys_ / "devices/system/cpu/online", "0-15")
    for n, cpus in NODE_CPUS.items():
        _w(sys_ / f"devices/system/node/node{n}/cpulist", cpus)
    _w(sys_ / "devices/system/node/online", "0-1")
    links = sys_ / "bus/pci/devices"
    links.mkdir(parents=True)
    for g in (0, 1):
        port, bus, node = PORT[g], GPU_BUS[g], gpu_nodes[g]
        dom = f"pci0000:{port[5:7]}"
        pdir = sys_ / "devices" / dom / port
        _function(pdir, "0x060400", "0x8086", node)
        _w(pdir / "secondary_bus_number", str(int(bus[5:7], 16)))
        _w(pdir / "subordinate_bus_number", str(int(bus[5:7], 16)))
        _function(pdir / bus, "0x030200", "0x10de", node, gpu1_width if g == 1 else 16)
        os.symlink(f"../../../devices/{dom}/{port}", links / port)
        os.symlink(f"../../../devices/{dom}/{port}/{bus}", links / bus)
    _w(root / "proc/driver/nvidia/version",
       "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build")
    return root


@pytest.fixture
def tree(tmp_path) -> Path:
    return two_gpu_tree(tmp_path / "box")


@pytest.fixture(autouse=True)
def no_tensorflow(monkeypatch):
    monkeypatch.setattr(checks, "_find_spec", lambda name: None)


def audit(root: Path, lib, *, cpus=(2, 3, 4, 5, 6, 7), pid=None, live=True):
    host = Host(root)
    host.live = live  # the tree stands in for a live box; NVML is the fake
    ctx = AuditContext(host, PROFILE, cpus=list(cpus), online=list(range(16)), pid=pid,
                       gpu=Nvml(lib=lib))
    return {f.id: f for f in checks.check(ctx)}


def procs(lib, gpu0=(), gpu1=()):
    lib.gpus[0].processes = [(p, 2**30) for p in gpu0]
    lib.gpus[1].processes = [(p, 2**30) for p in gpu1]
    lib.process_names = {OWN: "infer", FOREIGN: "python3", 555: "strategy-b"}
    return lib


# -- audit -------------------------------------------------------------------------------------
def test_every_gpu_finding_names_its_gpu_index_and_bus_id(tree):
    fs = audit(tree, h200_x2_numa())
    per_gpu = [f for f in fs.values() if f.id not in ("gpu.driver", "gpu.tf_cuda")]
    assert fs["gpu.driver"].current.startswith("580.159.04, CUDA 13.0, 2 GPU(s)")
    assert {f.id.split(".")[1] for f in per_gpu} == {"0", "1"}
    assert len(per_gpu) == 22  # 11 checks per GPU
    for f in per_gpu:
        g = int(f.id.split(".")[1])
        assert f.data["gpu"] == g and f.data["bus_id"] == GPU_BUS[g], f.id
        assert GPU_BUS[g] in f.title, f.id
        assert f"-i {g} " in f.evidence or GPU_BUS[g] in f.evidence, (f.id, f.evidence)
        other = GPU_BUS[1 - g]
        assert other not in f.evidence and other not in f.title, f.id


def test_foreign_process_on_gpu1_fails_gpu1_only(tree):
    lib = procs(h200_x2_numa(), gpu0=[OWN], gpu1=[FOREIGN])
    fs = audit(tree, lib, pid=OWN)
    f0, f1 = fs["gpu.0.foreign_processes"], fs["gpu.1.foreign_processes"]
    assert f0.status == Status.OK and f0.data["foreign"] == []
    assert "target pid 100 has a context on this GPU" in f0.current
    assert f1.status == Status.FAIL and f1.data["foreign"] == [FOREIGN]
    assert "4242 (python3)" in f1.current and "has no context on this GPU" in f1.current
    assert "off GPU 1" in f1.fix and "4242" in f1.fix and "-i 1 " in f1.evidence


def test_without_pid_one_process_per_gpu_is_that_gpus_inference(tree):
    # One strategy per GPU: each GPU's single process is its inference process.
    fs = audit(tree, procs(h200_x2_numa(), gpu0=[OWN], gpu1=[555]))
    assert fs["gpu.0.foreign_processes"].status == Status.OK
    assert fs["gpu.1.foreign_processes"].status == Status.OK
    # A second process on GPU 1 is foreign there, and only there.
    fs = audit(tree, procs(h200_x2_numa(), gpu0=[OWN], gpu1=[555, FOREIGN]))
    assert fs["gpu.0.foreign_processes"].status == Status.OK
    assert fs["gpu.1.foreign_processes"].status == Status.FAIL
    assert fs["gpu.1.foreign_processes"].data["foreign"] == [FOREIGN]


def test_persistence_compute_mode_clocks_and_link_are_each_gpus_own(tmp_path):
    root = two_gpu_tree(tmp_path / "box", gpu1_width=8)
    lib = h200_x2_numa()
    lib.gpus[0].persistence, lib.gpus[0].compute_mode = 0, 3  # off, EXCLUSIVE_PROCESS
    lib.gpus[1].reasons = 0x8  # HW slowdown
    lib.gpus[1].pcie = (5, 5, 8, 16)
    fs = audit(root, lib)
    assert fs["gpu.0.persistence"].status == Status.FAIL
    assert fs["gpu.0.persistence"].fix.startswith("nvidia-smi -i 0 -pm 1")
    assert fs["gpu.1.persistence"].status == Status.OK
    assert fs["gpu.0.compute_mode"].status == Status.OK
    assert fs["gpu.1.compute_mode"].status == Status.FAIL
    assert fs["gpu.1.compute_mode"].fix == "nvidia-smi -i 1 -c EXCLUSIVE_PROCESS"
    assert fs["gpu.0.clocks"].status == Status.OK
    assert fs["gpu.1.clocks"].status == Status.FAIL and "HW slowdown" in fs["gpu.1.clocks"].current
    assert "-i 1 " in fs["gpu.1.clocks"].fix
    assert fs["gpu.0.pcie_link"].status == Status.OK
    link = fs["gpu.1.pcie_link"]
    assert link.status == Status.FAIL and "gen5 x8 (max gen5 x16)" in link.current
    assert "sysfs gen5 x8" in link.current  # GPU 1's own sysfs function, joined by bus id
    assert f"/{GPU_BUS[1]}/current_link_speed" in link.evidence
    assert f"lspci -vv -s {GPU_BUS[1]}" in link.fix


def test_a_reading_one_gpu_lacks_is_unsupported_on_that_gpu_only(tree):
    lib = h200_x2_numa()
    lib.gpus[1].errors = {"nvmlDeviceGetPersistenceMode": NOT_SUPPORTED}
    fs = audit(tree, lib)
    assert fs["gpu.0.persistence"].status == Status.OK
    assert fs["gpu.1.persistence"].status == Status.UNSUPPORTED
    assert fs["gpu.1.persistence"].evidence == "nvml:nvmlDeviceGetPersistenceMode(gpu 1)"


def test_numa_target_on_node0_passes_gpu0_and_warns_gpu1(tree):
    """Before: GPU 1 failed on every two-socket box whose target CPUs sit on one node."""
    fs = audit(tree, h200_x2_numa(), cpus=range(2, 8))
    assert fs["gpu.0.numa"].status == Status.OK
    assert "GPU local CPUs 0-7, NUMA node 0" in fs["gpu.0.numa"].current
    f1 = fs["gpu.1.numa"]
    assert f1.status == Status.WARN
    assert "GPU local CPUs 8-15, NUMA node 1" in f1.current
    assert "no target CPU is local to this GPU (target CPUs local to GPU 0: 2-7)" in f1.current
    assert "taskset -c 8-15 / numactl --cpunodebind=1 --membind=1" in f1.fix


def test_numa_target_over_both_nodes_passes_one_gpu_per_node(tree):
    """Before: both GPUs failed ("not local") when the target CPUs were 2-7 and 10-15."""
    fs = audit(tree, h200_x2_numa(), cpus=[*range(2, 8), *range(10, 16)])
    for g, other in ((0, "GPU 1 (10-15)"), (1, "GPU 0 (2-7)")):
        f = fs[f"gpu.{g}.numa"]
        assert f.status == Status.OK, f.current
        assert f"the other target CPUs are local to {other}" in f.current


def test_numa_with_pid_judges_the_gpu_it_uses(tree):
    # The process runs on GPU 1 from node-0 CPUs: GPU 1 fails, GPU 0 is not judged.
    lib = procs(h200_x2_numa(), gpu1=[OWN])
    fs = audit(tree, lib, cpus=range(2, 8), pid=OWN)
    assert fs["gpu.1.numa"].status == Status.FAIL
    assert "not local: 2-7" in fs["gpu.1.numa"].current
    assert fs["gpu.0.numa"].status == Status.OK
    assert "not judged: target pid 100 has no context on this GPU (its GPU(s): 1)" in \
        fs["gpu.0.numa"].current
    # On GPU 0 from node-0 CPUs: right; GPU 1 not judged (no warning either).
    fs = audit(tree, procs(h200_x2_numa(), gpu0=[OWN]), cpus=range(2, 8), pid=OWN)
    assert fs["gpu.0.numa"].status == Status.OK and fs["gpu.1.numa"].status == Status.OK


def test_numa_no_gpu_local_to_the_target_fails_every_gpu(tmp_path):
    root = two_gpu_tree(tmp_path / "box", gpu_nodes=(0, 0))
    lib = h200_x2_numa()
    lib.gpus[1].cpu_affinity = [0x00FF]
    fs = audit(root, lib, cpus=range(10, 16))
    for g in (0, 1):
        f = fs[f"gpu.{g}.numa"]
        assert f.status == Status.FAIL and "not local: 10-15" in f.current


def test_root_tree_judges_both_gpus_from_sysfs_without_nvml(tree):
    lib = h200_x2_numa()
    fs = audit(tree, lib, live=False)
    assert lib.calls == []
    assert fs["gpu.0.pcie_link"].status == Status.OK
    assert fs["gpu.1.pcie_link"].evidence == f"/sys/bus/pci/devices/{GPU_BUS[1]}/current_link_speed"
    assert fs["gpu.0.numa"].status == Status.OK
    assert fs["gpu.1.numa"].status == Status.WARN


# -- watch -------------------------------------------------------------------------------------
MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 100_000 * MS

    def __call__(self) -> int:
        return self.t


class Box:
    """The fake two-GPU box sampled as watch samples it: the GPU collector at 10 ms, each
    sample appended to the 'gpu' ring over its interval (agent.watch.sampling.python)."""

    def __init__(self, **kw) -> None:
        self.lib = procs(h200_x2_numa(), gpu0=[OWN])
        self.clock = Clock()
        self.col = GpuCollector(Nvml(lib=self.lib), own_pids={OWN}, slow_thread=False,
                                clock=self.clock, **kw)
        self.ring = SignalRing("gpu", capacity=4000)

    def run(self, rows: int) -> None:
        for _ in range(rows):
            t0 = self.clock.t
            vals = self.col.sample()
            self.clock.t += 10 * MS
            self.ring.append(t0, self.clock.t, {k: v for k, v in vals.items() if v is not None})

    def foreign_on(self, gpu: int | None) -> None:
        for g in self.lib.gpus:
            g.processes = [p for p in g.processes if p[0] != FOREIGN]
        if gpu is not None:
            self.lib.gpus[gpu].processes.append((FOREIGN, 8 * 2**30))

    def spike(self, seq: int) -> Spike:
        start = self.clock.t - 25 * MS
        return Spike(seq=seq, start_ns=start, end_ns=start + 3 * MS, pid=OWN, tid=OWN,
                     p50_ns=300_000, nivcsw=0, nvcsw=0, minflt=0, majflt=0, cpu_ns=3 * MS,
                     rq_delay_ns=0, cpu_start=1, cpu_end=1)

    def attribute(self, seq: int):
        a = Attributor({"gpu": self.ring}, [1], gpu_detail=detail_for(self.col))
        return a.attribute(self.spike(seq))


def test_probe_gpu_is_the_gpu_the_probe_has_a_context_on():
    box = Box()
    box.foreign_on(1)
    box.run(1)
    v = box.ring
    row = {n: v.data[0, i] for n, i in v.cols.items()}
    assert row["gpu.0.probe_gpu"] == 1.0 and row["gpu.1.probe_gpu"] == 0.0
    assert row["gpu.0.foreign_processes"] == 0 and row["gpu.1.foreign_processes"] == 1


def test_watch_blames_a_foreign_process_only_on_the_probes_gpu():
    """Both phases of bench/device/multi_gpu.sh: the probe on GPU 0; a foreign matmul loop
    first on GPU 1 (never blamed: 'GPU shared' must not appear), then on GPU 0 (blamed, the
    PID named). Before the fix the GPU 1 phase was blamed on the foreign process too."""
    box = Box()
    box.run(1200)  # 12 s quiet baseline
    box.foreign_on(1)
    box.run(300)
    phase1 = box.attribute(1)
    assert phase1.cause != "gpu_foreign_process"
    assert not any("GPU shared" in c.detail for c in phase1.causes)
    assert collector_causes(box.col, box.clock.t - 30 * MS, box.clock.t) == []
    box.foreign_on(None)
    box.run(300)
    box.foreign_on(0)
    box.run(300)
    phase2 = box.attribute(2)
    top = phase2.causes[0]
    assert phase2.cause == "gpu_foreign_process"
    assert top.detail == "GPU shared with PID 4242 (python3)"
    assert top.evidence["gpu.0.foreign_processes"] == 1.0
    assert top.evidence["processes"][0].startswith("gpu 0: compute process 4242 (python3")


def test_throttle_on_the_other_gpu_is_not_the_probes():
    box = Box()
    box.run(1200)
    box.lib.gpus[1].reasons = 0x8  # HW slowdown on GPU 1
    box.run(10)
    assert box.attribute(1).cause == "unexplained"
    box.lib.gpus[1].reasons, box.lib.gpus[0].reasons = 0x1, 0x8
    box.run(10)
    a = box.attribute(2)
    assert a.cause == "gpu_throttle" and a.causes[0].detail.startswith("GPU 0:")


def test_explicit_probe_gpus_override_the_context():
    # --gpu 1 style: the probe's GPU is given (its context may not be visible to NVML).
    box = Box(probe_gpus=[1])
    box.run(1200)
    box.foreign_on(0)
    box.run(100)
    assert box.attribute(1).cause != "gpu_foreign_process"
    box.foreign_on(1)
    box.run(100)
    a = box.attribute(2)
    assert a.cause == "gpu_foreign_process" and a.causes[0].detail == \
        "GPU shared with PID 4242 (python3)"


def test_a_probe_with_no_gpu_context_gets_no_gpu_blame():
    # A CPU-only model (or a PID NVML reports from another PID namespace): no GPU is the
    # probe's, so a foreign process on any GPU is not "sharing" with it.
    box = Box()
    box.lib.gpus[0].processes = []
    box.run(1200)
    box.foreign_on(0)
    box.run(100)
    assert box.attribute(1).cause != "gpu_foreign_process"
