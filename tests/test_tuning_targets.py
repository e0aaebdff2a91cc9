"""tuning/targets.py: the one target-CPU rule (isolated, else nohz_full, else all online CPUs
but the housekeeping core) on fixture trees and small synthetic ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.host import Host
from tests.treecopy import make_synthetic
from tuning.targets import TargetError, resolve

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _tree(tmp_path: Path, ncpus: int = 4, **files: str) -> Host:
    root = make_synthetic(tmp_path / "t", ncpus=ncpus)
    cpu = root / "sys/devices/system/cpu"
    for name, text in files.items():
        (cpu / name).write_text(text + "\n")
    return Host(root)


def _siblings(host: Host, pairs: list[tuple[int, int]]) -> None:
    cpu = host.root / "sys/devices/system/cpu"
    for a, b in pairs:
        for c in (a, b):
            d = cpu / f"cpu{c}/topology"
            d.mkdir(parents=True, exist_ok=True)
            (d / "thread_siblings_list").write_text(f"{a},{b}\n")


def test_default_is_all_but_the_housekeeping_core(tmp_path):
    plan = resolve(_tree(tmp_path, 4))
    assert plan.cpus == [1, 2, 3] and plan.housekeeping == [0] and not plan.explicit
    assert plan.source.startswith("default")


def test_default_keeps_cpu0s_smt_sibling_for_housekeeping(tmp_path):
    host = _tree(tmp_path, 4)
    _siblings(host, [(0, 2), (1, 3)])
    plan = resolve(host)
    assert plan.housekeeping == [0, 2] and plan.cpus == [1, 3]


def test_isolated_then_nohz_full(tmp_path):
    assert resolve(_tree(tmp_path / "a", 8, isolated="4-7")).cpus == [4, 5, 6, 7]
    plan = resolve(_tree(tmp_path / "b", 8, nohz_full="2-3"))
    assert plan.cpus == [2, 3] and plan.source == "nohz_full CPUs"
    assert plan.housekeeping == [0, 1, 4, 5, 6, 7]


def test_explicit_cpus_checked_against_online(tmp_path):
    host = _tree(tmp_path, 4)
    assert resolve(host, "2-3").cpus == [2, 3]
    with pytest.raises(TargetError, match="past the last CPU"):
        resolve(host, "3-5")
    (host.root / "sys/devices/system/cpu/possible").write_text("0-3\n")
    (host.root / "sys/devices/system/cpu/online").write_text("0-2\n")
    with pytest.raises(TargetError, match="not online"):
        resolve(host, "3")
    with pytest.raises(TargetError):
        resolve(host, "")


def test_all_online_leaves_no_housekeeping_and_says_so(tmp_path):
    plan = resolve(_tree(tmp_path, 2), "0-1")
    assert plan.housekeeping == []
    with pytest.raises(TargetError, match=r"covers every online CPU.*--cpus 1\)"):
        plan.require_housekeeping("IRQ affinity")


def test_one_cpu_box(tmp_path):
    plan = resolve(_tree(tmp_path, 1))
    assert plan.cpus == [0] and plan.housekeeping == []
    with pytest.raises(TargetError, match="only CPU 0 is online"):
        plan.require_housekeeping()


@pytest.mark.parametrize("tree", ["vm-dev", "gpu-h200", "synthetic-2socket", "synthetic-tuned"])
def test_fixture_trees_resolve_with_a_housekeeping_cpu(tree):
    plan = resolve(Host(FIXTURES / tree))
    assert plan.cpus and plan.housekeeping
    assert set(plan.cpus).isdisjoint(plan.housekeeping)
    assert sorted(plan.cpus + plan.housekeeping) == plan.online


def _gpu(host: Host, addr: str, node: int, local: str, klass: str = "0x030200",
         vendor: str = "0x10de") -> None:
    d = host.root / "sys/bus/pci/devices" / addr
    d.mkdir(parents=True)
    for name, text in (("class", klass), ("vendor", vendor), ("device", "0x2335"),
                       ("numa_node", str(node)), ("local_cpulist", local)):
        (d / name).write_text(text + "\n")


def test_a_named_gpu_picks_its_local_cpus(tmp_path):
    host = _tree(tmp_path, 8)
    _gpu(host, "0000:02:00.0", 0, "0-3")
    _gpu(host, "0000:81:00.0", 1, "4-7")
    _gpu(host, "0000:03:00.0", 0, "0-3", klass="0x030000", vendor="0x1a03")  # a BMC's VGA
    assert resolve(host).cpus == [1, 2, 3, 4, 5, 6, 7]         # unnamed: no GPU step
    p0, p1 = resolve(host, gpu=0), resolve(host, gpu=1)
    assert p0.cpus == [1, 2, 3] and "GPU 0 (0000:02:00.0)" in p0.source
    assert p1.cpus == [4, 5, 6, 7] and "GPU 1 (0000:81:00.0)" in p1.source
    with pytest.raises(TargetError, match="2 NVIDIA GPU"):
        resolve(host, gpu=2)
    (host.root / "sys/devices/system/cpu/isolated").write_text("6-7\n")
    assert resolve(host, gpu=0).cpus == [6, 7]                 # isolation comes first
