"""capture -> audit round trip: the audit of a capture equals the audit of what was captured.

For every fixture tree: ``hftagent capture --root TREE --out TMP``, then the audit of TMP must
equal the audit of TREE, finding for finding, field for field. A tree has no live-only values
(both audits read files), so nothing is masked there.

For the live machine the same holds apart from the values a capture cannot carry or that move
between the two reads (LIVE_ONLY below, each with its reason); their statuses must still agree
except where the reason says why they cannot.
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from tests.conftest import FIXTURES, TREES

runner = CliRunner()
ALL_TREES = (*TREES, "synthetic-baremetal", "synthetic-hybrid")

# finding id (or prefix ending in ".") -> why its `current` may differ between a live audit and
# the audit of a capture taken right after it.
LIVE_ONLY = {
    "virt.steal": "steal since boot, from a /proc/stat read a moment later",
    "irq.affinity": "'N fired there' counts interrupts, which keep arriving",
    "irq.irqbalance": "lists the pids of a process that may start or stop in between",
    "tuners.others": "lists running processes, which may start or stop in between",
    "kernel.swap": "the MiB of swap in use move",
    "gpu.": "NVML reads the live GPU only; a capture has its sysfs side "
            "(and 'no NVIDIA driver loaded' live reads 'absent from this tree' captured)",
    "process.": "only comm and status are captured (no environment), and --pid is live",
    "wakeup.pm_qos": "who holds /dev/cpu_dma_latency is read from the live /proc/*/fd",
}
# ids whose status too may differ live, and why
LIVE_STATUS = {
    "gpu.": "NVML findings exist live only",
    "irq.irqbalance": "irqbalance may start or stop between the two reads",
    "tuners.others": "a tuner may start or stop between the two reads",
    "wakeup.pm_qos": "the PM QoS device and its holders exist live only",
}
# A file the live kernel lacks is stated as such live ("no cpufreq driver in this guest"), and
# as "absent from this tree" in the capture's audit: a tree cannot tell the kernel's absence
# from the capture's. Such findings are compared by status.
TREE_WORDING = "absent from this tree"
# host facts that differ by nature: the live audit reads the live kernel
LIVE_HOST = {"live": "True for the running kernel, False for any tree"}


def audit(*args: str) -> dict:
    res = runner.invoke(get_app(), ["audit", "--json", "--steal-window", "0", "--no-history",
                                    *args])
    assert res.exit_code in (0, 1, 2), res.output
    return json.loads(res.stdout)


def capture(tmp_path, *args: str):
    tmp_path.mkdir(exist_ok=True)  # capture makes DIR only: its parent must exist
    out = tmp_path / "cap"
    res = runner.invoke(get_app(), ["capture", "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("captured ")
    return out


def _masked(fid: str, table: dict[str, str]) -> bool:
    return any(fid == k or (k.endswith(".") and fid.startswith(k)) for k in table)


@pytest.mark.parametrize("tree", ALL_TREES)
def test_audit_of_the_capture_equals_the_audit_of_the_tree(tree, tmp_path):
    root = FIXTURES / tree
    out = capture(tmp_path, "--root", str(root))
    assert audit("--root", str(root)) == audit("--root", str(out))


@pytest.mark.parametrize("tree", ["synthetic-baremetal", "synthetic-2socket"])
def test_round_trip_with_every_target_and_profile(tree, tmp_path):
    root = FIXTURES / tree
    out = capture(tmp_path, "--root", str(root))
    for args in (("--cpus", "0-3"), ("--profile", "hft-gpu"), ("--profile", "bench")):
        assert audit("--root", str(root), *args) == audit("--root", str(out), *args), args


def test_capture_of_a_capture_is_the_same_capture(tmp_path):
    root = FIXTURES / "synthetic-baremetal"
    a = capture(tmp_path / "a", "--root", str(root))
    b = capture(tmp_path / "b", "--root", str(a))

    def listing(top):
        out = {}
        for dirpath, dirs, files in os.walk(top):
            for n in dirs + files:
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, top)
                out[rel] = ("link", os.readlink(p)) if os.path.islink(p) else \
                    ("dir",) if os.path.isdir(p) else ("file", open(p, "rb").read())
        return out
    assert listing(a) == listing(b)


def test_epb_only_box_round_trips(tree_copy, tmp_path):
    """cpuN/power/energy_perf_bias is what audit reads without HWP EPP: it must be captured
    (the capture once skipped every directory called "power")."""
    root = tree_copy("synthetic-baremetal")
    for p in root.glob("sys/devices/system/cpu/cpufreq/policy*/energy_performance_*"):
        p.unlink()
    want = audit("--root", str(root))
    assert {f["id"]: f for f in want["findings"]}["cpu.epb"]["status"] == "ok"
    out = capture(tmp_path, "--root", str(root))
    assert want == audit("--root", str(out))
    assert not (out / "sys/devices/system/cpu/cpu5/power/autosuspend_delay_ms").exists()


def test_etc_facts_round_trip(tree_copy, tmp_path):
    """tuned's profile, irqbalance's banned CPUs and enabled tuner units come from /etc."""
    root = tree_copy("synthetic-2socket")
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/irqbalance").write_text('IRQBALANCE_BANNED_CPULIST="2-7"\n')
    unit = root / "lib/systemd/system/tuned.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Unit]\n")
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    os.symlink("../../../../lib/systemd/system/tuned.service", wants / "tuned.service")
    want = audit("--root", str(root))
    f = {x["id"]: x for x in want["findings"]}
    assert "banned CPUs 2-7" in f["irq.irqbalance"]["current"]
    assert "enabled units: tuned.service" in f["tuners.others"]["current"]
    out = capture(tmp_path, "--root", str(root))
    assert want == audit("--root", str(out))
    assert "enabled" in (out / "etc/systemd/system/multi-user.target.wants/tuned.service"
                         ).read_text()


def test_live_capture_round_trip(tmp_path):
    """This machine, captured, audits as it does live, apart from LIVE_ONLY values."""
    live = audit()
    out = capture(tmp_path)
    cap = audit("--root", str(out))
    assert live["target_cpus"] == cap["target_cpus"]
    for k, v in live["host"].items():
        if k not in LIVE_HOST:
            assert cap["host"].get(k) == v, k
    lf = {f["id"]: f for f in live["findings"]}
    cf = {f["id"]: f for f in cap["findings"]}
    ids = [i for i in lf if not _masked(i, LIVE_STATUS)]
    assert ids == [i for i in cf if not _masked(i, LIVE_STATUS)]
    for fid in ids:
        assert lf[fid]["status"] == cf[fid]["status"], (fid, lf[fid], cf[fid])
        if not _masked(fid, LIVE_ONLY) and TREE_WORDING not in cf[fid]["current"]:
            assert lf[fid] == cf[fid], fid


def test_a_live_capture_names_the_cpu_with_py_cpuinfo(tmp_path):
    import json

    from typer.testing import CliRunner

    from agent.cli import get_app
    res = CliRunner().invoke(get_app(), ["capture", "--out", str(tmp_path / "cap")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "cap" / "CPU-IDENTITY.json").read_text())
    assert doc.get("arch") or doc.get("error")
    tree = tmp_path / "tree"
    res = CliRunner().invoke(get_app(), ["capture", "--root", str(tmp_path / "cap"),
                                         "--out", str(tree)])
    assert not (tree / "CPU-IDENTITY.json").exists()    # a tree's CPU is not this host's
