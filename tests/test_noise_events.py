"""hftagent cpus --trace: a noise scan's gaps attributed exactly from kernel events.

Synthetic scenarios are the kernel's own ``trace`` text (parsed by parse_text, as in
tests/test_trace_timeline.py) fed through a fake event source; the recorder is pid 4242 on
CPU 1 and scans [100.000000, 101.000000] s. One real run (root, tracefs mounted for it and
unmounted after where it was not) names a bursty task pinned to the scanned CPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.errors import AgentError
from agent.noise import events as ne
from agent.noise import rank as rk
from agent.trace.text import parse_text
from agent.trace.tracefs import Unsupported, Window
from tests.eventpages import trace_line as line
from tests.eventpages import trace_switch as sw

REPO = Path(__file__).resolve().parents[1]
REC = 4242
T0 = 100_000_000_000
T1 = 101_000_000_000
US = 1000


SCENARIO = "\n".join([
    # the recorder switched in (after pinning itself) before its loop started
    sw("swapper/1", 0, "99.999000", "hftnoise", REC, "R"),
    # an IRQ while the recorder spins: 4 µs
    line("hftnoise", REC, "100.100000", "irq_handler_entry: irq=24 name=virtio0-input.0",
         "d.h1."),
    line("hftnoise", REC, "100.100004", "irq_handler_exit: irq=24 ret=handled", "d.h1."),
    # a kworker preempts it and runs vmstat_update for 1.2 ms (+ 20 µs around the item)
    sw("hftnoise", REC, "100.300000", "kworker/1:0", 45, "R+"),
    line("kworker/1:0", 45, "100.300010", "workqueue_execute_start: work struct "
         "00000000c0ffee00: function vmstat_update", "....."),
    line("kworker/1:0", 45, "100.301210", "workqueue_execute_end: work struct "
         "00000000c0ffee00: function vmstat_update", "....."),
    sw("kworker/1:0", 45, "100.301220", "hftnoise", REC, "I"),
    # the tick: 3 µs
    line("hftnoise", REC, "100.500000", "local_timer_entry: vector=236", "d.h1."),
    line("hftnoise", REC, "100.500003", "local_timer_exit: vector=236", "d.h1."),
    # a bursty task preempts it twice: 2 × 1 ms
    sw("hftnoise", REC, "100.600000", "hog", 777, "R+"),
    sw("hog", 777, "100.601000", "hftnoise", REC, "R"),
    sw("hftnoise", REC, "100.800000", "hog", 777, "R+"),
    sw("hog", 777, "100.801000", "hftnoise", REC, "R"),
])

# the recorder's gaps (start, length), CLOCK_MONOTONIC ns: each event stretch above lies
# inside one gap (the clock reads bracket it), and one 50 µs gap at 100.7 s has no event
GAPS = [
    (100_099_999_000, 7 * US),          # the IRQ
    (100_299_999_500, 1_222 * US),      # the kworker
    (100_499_999_800, 4 * US),          # the tick
    (100_599_999_900, 1_000_200),       # the hog
    (100_700_000_000, 50 * US),         # nothing: hw_or_hypervisor
    (100_799_999_900, 1_000_200),       # the hog again
]


class FakeSource:
    """EventSource's window() over canned events; counts the windows read."""

    reader = "raw"

    def __init__(self, events):
        self.events = events
        self.windows = []
        self.closed = False

    def __bool__(self):
        return True

    def window(self, t_from, t_to, *, margin_ns=2_000_000, after_ns=0):
        self.windows.append((t_from, t_to))
        evs = [e for e in self.events if t_from - margin_ns <= e.ts_ns <= t_to]
        before = [e for e in self.events if e.ts_ns < t_from - margin_ns
                  and e.name == "sched_switch"]
        return Window(t_from, t_to, before[-1:] + evs)

    def describe(self):
        return {"instance": "fake", "reader": "raw"}

    def close(self):
        self.closed = True


def _attributed(chunk_ns=ne.CHUNK_NS):
    src = FakeSource(parse_text(SCENARIO.splitlines()))
    accs = ne.read_batch(src, [(1, REC, T0, T1)], chunk_ns=chunk_ns)
    starts = np.array([s for s, _ in GAPS], dtype=np.int64)
    lengths = np.array([n for _, n in GAPS], dtype=np.int64)
    return src, accs[1].result(starts, lengths, 1.0)


def test_gaps_are_attributed_exactly_irq_kworker_tick_task_and_hw():
    _, res = _attributed()
    by = {e["entity"]: e for e in res["events"]}
    assert by["IRQ 24 virtio0-input.0"]["us_per_s"] == 4.0
    assert by["IRQ 24 virtio0-input.0"]["kind"] == "irq"
    assert by["IRQ 24 virtio0-input.0"]["count"] == 1
    assert by["kworker/1:0 (vmstat_update)"]["us_per_s"] == 1200.0
    assert by["kworker/1:0 (vmstat_update)"]["kind"] == "workqueue"
    assert by["kworker/1:0"]["us_per_s"] == 20.0          # the kworker around its item
    assert by["local timer tick"]["us_per_s"] == 3.0
    assert by["hog"] == {"entity": "hog", "kind": "task", "us_per_s": 2000.0, "count": 2,
                         "pids": [{"pid": 777, "us_per_s": 2000.0}]}
    assert res["events"][0]["entity"] == "hog"             # largest first
    # the one gap no event overlaps, and only it
    assert res["hw_or_hypervisor_gaps"] == 1
    assert res["hw_or_hypervisor_us_per_s"] == 50.0
    assert res["gaps_in_unknown"] == 0
    assert res["events_by_kind_us_per_s"]["hw_or_hypervisor"] == 50.0
    assert res["events_by_kind_us_per_s"]["workqueue"] == 1200.0
    assert res["events_complete"] is True
    # gap time inside events: everything but the hw gap and the clock reads around events
    total = sum(n for _, n in GAPS)
    assert res["gap_time_explained_pct"] == round(100 * (4 + 1220 + 3 + 2000) * US / total, 1)


def test_chunked_reads_give_the_same_attribution():
    src1, one = _attributed()
    src4, four = _attributed(chunk_ns=300_000_000)
    assert len(src1.windows) == 1 and len(src4.windows) == 4
    strip = lambda r: {e["entity"]: (e["us_per_s"], e["count"]) for e in r["events"]}  # noqa: E731
    assert strip(one) == strip(four)
    assert one["hw_or_hypervisor_gaps"] == four["hw_or_hypervisor_gaps"] == 1


def test_a_gap_the_events_cannot_see_is_not_called_hardware():
    # no event at all on the CPU (none kept, or the ring lost them): the walk cannot tell
    # who ran, so a gap there is counted apart, never as hardware
    src = FakeSource([])
    accs = ne.read_batch(src, [(1, REC, T0, T1)])
    res = accs[1].result(np.array([100_050_000_000]), np.array([20 * US]), 1.0)
    assert res["hw_or_hypervisor_gaps"] == 0 and res["gaps_in_unknown"] == 1
    assert res["unknown_us_per_s"] > 0


def test_overlap_counts_partial_cover():
    parts = [np.array([[10, 20], [30, 40]], dtype=np.int64)]
    lo = np.array([0, 15, 22, 35, 50])
    hi = np.array([5, 35, 28, 60, 60])
    assert ne._overlap(parts, lo, hi).tolist() == [0, 10, 0, 5, 0]


def test_cpu_noise_carries_the_events_and_its_top_cause():
    _, res = _attributed()
    r = rk.CpuNoise(cpu=1, duration_s=1.0, gaps=6, sum_gap_ns=sum(n for _, n in GAPS),
                    max_gap_ns=1_222 * US, gap_ns=np.array([n for _, n in GAPS]),
                    causes={"tick": 250.0}, causes_source="events", events=res)
    d = r.to_dict()
    assert d["causes_source"] == "events" and d["events"][0]["entity"] == "hog"
    assert d["hw_or_hypervisor_us_per_s"] == 50.0 and d["causes"] == {"tick": 250.0}
    assert r.top_cause() == ("hog", 2000.0, "µs/s")
    r2 = rk.CpuNoise(cpu=2, duration_s=1.0, gaps=1, sum_gap_ns=1, max_gap_ns=1,
                     gap_ns=np.array([1]), causes={"tick": 250.0})
    assert r2.to_dict()["causes_source"] == "proc" and r2.top_cause() == ("tick", 250.0, "/s")


def test_tracer_modes():
    refused = lambda *a, **k: Unsupported("unsupported: tracefs not mounted at /x")  # noqa: E731
    with pytest.raises(AgentError, match=r"^--trace on: unsupported: tracefs not mounted at /x$"):
        ne.Tracer("on", None, opener=refused).open([1], 1.0)
    calls = []
    auto = ne.Tracer("auto", None, opener=lambda *a, **k: calls.append(k) or refused())
    assert auto.open([1], 1.0) is None and auto.open([2], 1.0) is None
    assert len(calls) == 1                                  # not retried per batch
    assert auto.info() == {"mode": "auto", "active": False, "batches": 0,
                           "reason": "unsupported: tracefs not mounted at /x"}
    off = ne.Tracer("off", None, opener=lambda *a, **k: pytest.fail("opened"))
    assert off.open([1], 1.0) is None and off.info()["reason"] == "off (--trace off)"
    seen = []
    mnt = ne.Tracer("mount", None, opener=lambda h, c, b, **k: seen.append((c, b, k)) or
                    FakeSource([]))
    assert mnt.open([1, 2], 1.0)
    assert seen == [([1, 2], 4.0, {"mount": True, "keep_s": 4.0})]
    assert mnt.info()["active"] is True and mnt.info()["source"]["instance"] == "fake"
    with pytest.raises(AgentError, match="--trace must be auto, on, off or mount"):
        ne.Tracer("sometimes", None)


def test_a_window_that_raises_leaves_the_batch_on_proc_deltas():
    from agent.noise import scan as sc

    class Boom(FakeSource):
        def window(self, *a, **k):
            raise OSError(5, "Input/output error")

    tr = ne.Tracer("auto", None, opener=lambda *a, **k: Boom([]))
    src = tr.open([1], 1.0)
    r = rk.CpuNoise(cpu=1, duration_s=1.0, gaps=1, sum_gap_ns=10, max_gap_ns=10,
                    gap_ns=np.array([10]), gap_start_ns=np.array([T0 + 5]), t0_ns=T0, t1_ns=T1)
    sc._attribute_events(src, tr, [r], {1: REC})
    assert r.causes_source == "proc" and r.events is None
    assert "not read: OSError" in tr.info()["notes"][0]


def test_cli_refuses_a_bad_trace_value_in_one_line():
    r = subprocess.run([str(REPO / ".venv/bin/hftagent"), "cpus", "--trace", "sometimes"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == ("hftagent: error: --trace must be auto, on, off or mount, "
                                "not 'sometimes'")


def test_textfile_cause_series_are_bounded(tmp_path):
    from agent.export.textfile import render_families, write_prom
    from agent.noise.export import TEXTFILE_NAME, families
    _, res = _attributed()
    r = rk.CpuNoise(cpu=1, duration_s=1.0, gaps=6, sum_gap_ns=3_300_000, max_gap_ns=1,
                    gap_ns=np.array([1]), causes_source="events", events=res)
    r2 = rk.CpuNoise(cpu=2, duration_s=1.0, gaps=1, sum_gap_ns=1, max_gap_ns=1,
                     gap_ns=np.array([1]))
    doc = {"cpus": [r.to_dict(), r2.to_dict()], "recommended": [1]}
    text = write_prom(render_families(families(doc, 1.7e9)), tmp_path, TEXTFILE_NAME).read_text()
    got = {m[0]: float(m[1]) for m in re.findall(
        r'hftagent_cpu_noise_cause_ratio\{cause="(\w+)",cpu="1"\} (\S+)', text)}
    assert got["workqueue"] == pytest.approx(1200e-6)
    assert got["hw_or_hypervisor"] == pytest.approx(50e-6)
    assert got["task"] == pytest.approx(2020e-6)            # the hog + the kworker's task
    causes = set(re.findall(r'cause="([^"]+)"', text))
    assert causes <= set(ne.KINDS) and "hog" not in text   # kinds only, never a comm
    assert 'cpu="2",' not in text.split("hftagent_cpu_noise_recommended")[0].split(
        "cause_ratio")[-1]
    if shutil.which("promtool"):
        p = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                           capture_output=True)
        assert p.returncode == 0, p.stdout + p.stderr


def _tracefs_mounted() -> bool:
    try:
        with open("/proc/mounts") as f:  # noqa: PTH123 - test-only check of the real box
            return any(ln.split()[2] == "tracefs" for ln in f if len(ln.split()) > 2)
    except OSError:
        return False


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the recorder")
def test_real_scan_names_a_bursty_task_on_the_scanned_cpu(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (tracefs)")
    # the online CPUs, not this process's affinity (a test runner may be pinned to one)
    from collectors.parsers import parse_cpulist
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text().strip())
    if len(online) < 2 or 1 not in online:
        pytest.skip("needs CPU 1 and a housekeeping CPU")
    sys.path.insert(0, str(REPO))
    from bench.faults.kit import cpu_hog
    was_mounted = _tracefs_mounted()
    env = dict(os.environ, HFTAGENT_CACHE=str(tmp_path / "cache"))
    try:
        with cpu_hog(1, burst_ms=(1.0, 5.0)) as pids:
            comm = Path(f"/proc/{pids[0]}/comm").read_text().strip()
            r = subprocess.run(
                [str(REPO / ".venv/bin/hftagent"), "cpus", "--duration", "1", "--trace",
                 "mount", "--candidates", "1", "--json", "--no-history"],
                capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    finally:
        if not was_mounted and _tracefs_mounted():
            subprocess.run(["umount", "/sys/kernel/tracing"], check=False)  # we mounted it
    assert r.returncode in (0, 2), r.stderr                 # 2: CPU 1 noisy, none to pick
    doc = json.loads(r.stdout)
    if not doc["trace"]["active"]:
        pytest.skip(f"tracefs not usable here: {doc['trace'].get('reason')}")
    (cpu1,) = doc["cpus"]
    assert cpu1["cpu"] == 1 and cpu1["causes_source"] == "events", cpu1
    hog = [e for e in cpu1["events"] if e["kind"] == "task" and e["entity"] == comm]
    mine = [p for p in hog[0]["pids"] if p["pid"] == pids[0]] if hog else []
    assert mine, cpu1["events"]
    # busy 1 ms of every 5 ms: about a fifth of the CPU, whatever else runs there
    assert mine[0]["us_per_s"] > 50_000, hog
    assert cpu1["events_complete"] is True
    assert cpu1["gap_time_explained_pct"] > 50
    inst = doc["trace"]["source"]["instance"]
    assert re.fullmatch(r".*/instances/hftagent-\d+", inst)
    if not was_mounted:
        return                                              # unmounted: gone with it
    assert not Path(inst).exists()                          # removed after the batch
