"""Watch's hot sources (agent/watch/sampling/sources/) against the vm-dev fixture tree (a real
capture of a 2-CPU KVM guest), cross-checked with the audit's parsers, plus counter wrap/reset
and permission-loss handling."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.watch.ring import DeltaTracker, counter_delta
from agent.watch.sampling.python import Sampler
from agent.watch.sampling.sources.cpu import CpuCollector
from agent.watch.sampling.sources.irq import IrqCollector
from agent.watch.sampling.sources.memory import MemoryCollector
from agent.watch.sampling.sources.numa import NumaCollector
from agent.watch.sampling.sources.sched import SchedCollector
from agent.watch.sampling.sources.softirq import SoftirqCollector
from collectors.base import Availability
from collectors.cpu import parse_stat
from collectors.host import Host
from collectors.irq import parse_interrupt_counts
from collectors.memory import parse_psi, parse_vmstat_counters
from collectors.parsers import (
    ParseError,
    parse_interrupts,
    parse_proc_stat,
    parse_softirqs,
    parse_vmstat,
)
from collectors.perf import parse_perf_line
from collectors.sched import parse_stat_fields, parse_status_switches
from collectors.softirq import parse_softirq_counts
from tests.conftest import parked_thread

FIX = Path(__file__).parent / "fixtures" / "vm-dev"


@pytest.fixture
def host() -> Host:
    return Host(FIX)


def test_cpu_collector_matches_proc_stat(host):
    c = CpuCollector(host, [1])
    assert c.available().ok
    got = c.sample()
    ref = parse_proc_stat((FIX / "proc/stat").read_text())
    for f in ("user", "system", "idle", "irq", "softirq", "steal"):
        assert got[f"cpu.1.{f}_ticks"] == ref.cpus[1][f]
    assert "cpu.0.user_ticks" not in got  # restricted to the probe CPU
    assert got["cpu.all.ctxt"] == ref.ctxt
    assert got["cpu.all.procs_running"] == ref.procs_running
    # The VM has no cpufreq driver: unsupported, never a 0 frequency.
    assert "cpu.1.freq_hz" not in got
    assert c.unsupported["cpu.1.freq_hz"].startswith("unsupported")
    c.close()


def test_irq_and_softirq_collectors_match_parsers(host):
    irq = IrqCollector(host, [0, 1])
    got = irq.sample()
    cpus, rows = parse_interrupts((FIX / "proc/interrupts").read_text())
    n = 0
    for row in rows:
        if len(row.counts) == len(cpus):
            for i, c in enumerate(cpus):
                assert got[f"irq.{c}.{row.irq}"] == row.counts[i]
                n += 1
        else:
            assert got[f"irq.all.{row.irq}"] == row.counts[0]
    assert n > 20
    some = next(r for r in rows if r.numeric and r.desc)
    assert irq.descriptions[some.irq] == some.desc
    soft = SoftirqCollector(host, [1]).sample()
    scpus, srows = parse_softirqs((FIX / "proc/softirqs").read_text())
    for name, counts in srows.items():
        assert soft[f"softirq.1.{name}"] == counts[scpus.index(1)]
    assert not any(k.startswith("softirq.0.") for k in soft)


def test_memory_and_numa_collectors(host):
    m = MemoryCollector(host)
    assert m.available().ok
    got = m.sample()
    ref = parse_vmstat((FIX / "proc/vmstat").read_text())
    for k in ("pgfault", "pgmajfault", "compact_stall", "numa_miss"):
        if k in ref:
            assert got[f"mem.all.{k}"] == ref[k]
    assert "mem.all.nr_free_pages" not in got  # gauges of no use to attribution are not kept
    # PSI is in the capture: totals in µs.
    assert got["psi.memory.some_us"] >= 0 and "psi.cpu.some_us" in got
    n = NumaCollector(host, [1])
    assert n.nodes == [0] and n.available().ok
    v = n.sample()
    assert v["numa.0.numa_hit"] > 0 and "numa.0.other_node" in v


def test_sched_collector_live_thread_and_scan():
    """The capture holds no task directories, so this one reads the live /proc: our own
    thread's schedstat/stat/status, and a scan that sees a busy child on our CPU."""
    import subprocess
    import sys
    import time
    cpu = sorted(os.sched_getaffinity(0))[-1]
    h = Host()
    me = os.getpid()
    c = SchedCollector(h, [me], [cpu], scan_period_s=0.0, min_scan_gap_s=0.0, status_every=1)
    assert c.available().ok
    first = c.sample()
    assert first[f"sched.{me}.run_ns"] > 0 and f"sched.{me}.nivcsw" in first
    hog = subprocess.Popen([sys.executable, "-c",
                            f"import os; os.sched_setaffinity(0, [{cpu}])\nwhile True: pass"])
    try:
        t0 = time.monotonic_ns()
        time.sleep(0.4)
        c.sample()
        runs = c.who_ran(t0, time.monotonic_ns())
        assert any(r.pid == hog.pid and r.cpu == cpu and r.run_ns > 10_000_000 for r in runs)
    finally:
        hog.kill()
        hog.wait()
    c.close()


def test_a_service_restarted_for_days_keeps_schedstat_rows_for_its_new_threads():
    """A service followed by name, its calling thread new at each restart: each thread's
    eight sched.<tid>.* columns are retired at its exit and given to a later thread's 5 s
    after, before the ring grows (issue #38: 512 columns were full past ~60 restarts, and
    new threads had no run-queue wait; the ring was 12 MB by then). 80 threads of this
    process, one after another, each restart 6 s of clock after the exit."""
    import time

    import numpy as np
    cpu = sorted(os.sched_getaffinity(0))[-1]
    me = os.getpid()
    c = SchedCollector(Host(), [], [cpu], scan_period_s=1e9, status_every=1)
    s = Sampler([c], hz=100, capacity_s=0.16)
    ring = s.ring("sched")
    now = [10**9]

    def rounds(n: int) -> None:
        for _ in range(n):
            now[0] += 10_000_000
            s.round(now[0])
    for k in range(80):
        with parked_thread() as tid:
            c.watch_tids([tid], pids={tid: me})
            rounds(4)
            run = ring.column(f"sched.{tid}.run_ns", ring._order()[-3:])
            assert not np.isnan(run).any(), (k, ring.dropped_signals)  # (deltas: from row 2)
        end = time.monotonic() + 10
        while time.monotonic() < end:  # (the task may outlive join() a moment)
            rounds(1)
            if tid in c.dropped:
                break
            time.sleep(0.002)
        assert tid in c.dropped, k
        now[0] += 6 * 10**9  # (the restart: no row between)
    # (each thread's columns retired at its exit, taken by the next one 6 s later: 8 wide)
    assert ring.reused_signals == 79 * 8 and ring.width == 8 and not ring.dropped_signals
    assert not s.entries[0].deltas._prev  # (no gone thread's last reads kept)
    assert not c._threads and not c.tracks  # (every thread's files closed)
    c.close()


def test_missing_proc_files_are_unavailable_not_zero(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    h = Host(tmp_path)
    a = MemoryCollector(h).available()
    assert not a.ok and "vmstat" in a.reason
    assert not SoftirqCollector(h).available().ok
    assert not NumaCollector(h, [0]).available().ok
    s = SchedCollector(h, [12345], [0]).available()
    assert not s.ok and s.reason.startswith("absent")


def test_watch_parsers_edge_cases():
    with pytest.raises(ParseError):
        parse_stat(b"intr 1 2\nctxt 5\n", None)
    out, desc = parse_interrupt_counts(
        b"           CPU0       CPU1\n  5:  1  2  IO-APIC 5-edge  acpi\n"
        b"LOC:  10  20  Local timer interrupts\nERR:  3\n", None)
    assert out == {"irq.0.5": 1, "irq.1.5": 2, "irq.0.LOC": 10, "irq.1.LOC": 20, "irq.all.ERR": 3}
    assert desc["5"] == "IO-APIC 5-edge acpi"
    rest = ["R"] + ["0"] * 48
    rest[7], rest[9], rest[11], rest[12], rest[36] = "7", "3", "11", "4", "1"  # stat fields
    comm, state, mn, mj, ticks, cpu = parse_stat_fields(  # 10, 12, 14, 15, 39
        b"42 (a) b (c)) " + " ".join(rest).encode())
    assert (comm, state, mn, mj, ticks, cpu) == ("a) b (c)", "R", 7, 3, 15, 1)
    assert parse_status_switches(b"Name:\tx\nvoluntary_ctxt_switches:\t12\n"
                                 b"nonvoluntary_ctxt_switches:\t3\n") == (12, 3)
    assert parse_psi(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=123\n"
                     b"full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", "io") == \
        {"psi.io.some_us": 123.0, "psi.io.full_us": 7.0}
    assert parse_perf_line("0.100,<not supported>,,cycles,0,100.00,,") == \
        ("cycles", None, "<not supported>")
    assert parse_perf_line("0.100,<not counted>,,page-faults,0,100.00,,") == \
        ("page-faults", 0.0, "<not counted>")
    assert parse_perf_line("0.200,17,,context-switches,100,100.00,,")[:2] == \
        ("context-switches", 17.0)
    assert parse_perf_line("# time counts unit events") is None


def test_status_switches_without_a_final_newline():
    """Defect: the last digit was dropped when status had no final newline (1234 -> 123)."""
    assert parse_status_switches(b"Name:\tx\nvoluntary_ctxt_switches:\t12\n"
                                 b"nonvoluntary_ctxt_switches:\t1234") == (12, 1234)
    for bad in (b"Name:\tx\n", b"\nvoluntary_ctxt_switches:\t-1\nnonvoluntary_ctxt_switches: 1",
                b"\nvoluntary_ctxt_switches:\t\nnonvoluntary_ctxt_switches:\t1\n",
                b"\nvoluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\tnan\n"):
        with pytest.raises(ParseError):
            parse_status_switches(bad)


@pytest.mark.parametrize("total", [b"nan", b"-5", b"inf", b"1e9", b"", b"12x", b"9" * 30])
def test_psi_rejects_totals_that_are_not_counts(total):
    """Defect: PSI took total=nan and negative totals."""
    with pytest.raises(ParseError):
        parse_psi(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=" + total + b"\n", "io")


def test_truncated_stat_and_short_softirq_rows_are_parse_errors():
    with pytest.raises(ParseError):
        parse_stat_fields(b"42 (a) R 1 2 3")
    with pytest.raises(ParseError):
        parse_stat_fields(b"no parentheses")
    with pytest.raises(ParseError, match="1 counts for 2 CPUs"):
        parse_softirq_counts(b"   CPU0   CPU1\n  HI: 1 2\nNET_RX: 5\n", None)
    with pytest.raises(ParseError):
        parse_interrupt_counts(b"CPU0 CPUx\n 5: 1 2\n", None)
    with pytest.raises(ParseError):
        parse_interrupt_counts(b"CPU0 CPU1\n 5: nan 2\n", None)  # float() took nan
    # a numbered row without a count per CPU is a parse error, as collectors/parsers.py has
    # it: neither absent nor (a short one) an irq.all.<n> total
    for bad in (b"CPU0 CPU1\n 5: x y\n 6: 7 8\n", b"CPU0 CPU1\n 5: 3\n 6: 7 8\n"):
        with pytest.raises(ParseError, match="row '5'"):
            parse_interrupt_counts(bad, None)
    # ERR and MIS print one total whatever the CPU count
    assert parse_interrupt_counts(b"CPU0 CPU1\n 6: 7 8\nERR: 3\n", None)[0] == \
        {"irq.0.6": 7.0, "irq.1.6": 8.0, "irq.all.ERR": 3.0}


def test_irq_names_keep_every_action_and_none_for_unnamed(tmp_path):
    """Defect: an IRQ without an action was named by its descriptor ("65536-edge"), and a
    shared line "ehci_hcd:usb1, mmc0" kept only "mmc0"."""
    from collectors.irq import action_names, irq_affinities

    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc/interrupts").write_text(
        "           CPU0       CPU1\n"
        "  0:         36          0   IR-IO-APIC    2-edge      timer\n"
        " 16:          1          2   IR-IO-APIC   16-fasteoi   ehci_hcd:usb1, mmc0\n"
        " 17:          0          0  IR-PCI-MSI 65536-edge\n"
        " 18:          3          0   IO-APIC-edge      i8042\n"  # before Linux 4.x
        " 19:          0          4     GICv3  27 Level     arch_timer\n"  # arm64
        " 20:          0          0   PCI-MSI 1-edge      PCIe PME, aerdrv\n"
        " 21:          0          0   None      -edge\n")
    for n in range(16, 22):
        d = tmp_path / f"proc/irq/{n}"
        d.mkdir(parents=True)
        (d / "smp_affinity_list").write_text("0-1\n")
    (tmp_path / "proc/irq/0").mkdir()
    (tmp_path / "proc/irq/٣").mkdir()  # not IRQ 3
    names = {a.irq: a.name for a in irq_affinities(Host(tmp_path))}
    assert names == {0: "timer", 16: "ehci_hcd:usb1,mmc0", 17: "", 18: "i8042",
                     19: "arch_timer", 20: "PCIe PME,aerdrv", 21: ""}
    # the same on watch's descriptions (what its attribution names IRQs from)
    _, desc = parse_interrupt_counts(b"CPU0\n 16: 1 IR-IO-APIC 16-fasteoi ehci_hcd:usb1, mmc0\n"
                                     b" 17: 0 IR-PCI-MSI 65536-edge\n", None)
    assert {r: action_names(d) for r, d in desc.items()} == {"16": "ehci_hcd:usb1,mmc0",
                                                           "17": ""}


def test_task_scan_skips_non_ascii_pid_dirs(tmp_path):
    """A /proc entry named "٣" is not pid 3 (str.isdigit() and int() take Unicode digits)."""

    def stat(pid: int, threads: int) -> str:
        rest = ["R"] + ["0"] * 40
        rest[17], rest[36] = str(threads), "0"  # num_threads; last ran on CPU 0
        return f"{pid} (t) " + " ".join(rest)

    for rel, text in (("5/stat", stat(5, 1)), ("٣/stat", stat(3, 1)),
                      ("7/stat", stat(7, 2)), ("7/task/٣/stat", stat(3, 1))):
        (tmp_path / "proc" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc" / rel).write_text(text)
    (tmp_path / "sys").mkdir()
    c = SchedCollector(Host(tmp_path), [99999], [0])
    assert c.scan()["sched.cpu0.runnable"] == 1.0  # pid 5 only


def test_counter_wrap_and_reset():
    assert counter_delta(10, 15) == 5
    # /proc/interrupts counts are 32-bit per CPU: a wrap is a delta, not a negative.
    assert counter_delta(2**32 - 3, 4) == 7
    # A reset (the source restarted) is unknown, never negative and never invented.
    d = counter_delta(5_000_000_000, 12)
    assert d != d
    assert counter_delta(None, 3) != counter_delta(None, 3)
    t = DeltaTracker(lambda n: n.endswith("_total"))
    assert t.update({"a_total": 100.0, "g": 5.0}) == {"g": 5.0}
    assert t.update({"a_total": 130.0, "g": 6.0}) == {"a_total": 30.0, "g": 6.0}
    out = t.update({"a_total": 10.0})
    assert out["a_total"] != out["a_total"] and t.resets == 1
    assert t.update({"a_total": 25.0}) == {"a_total": 15.0}


class _Flaky:
    """A collector that loses its permission after ``ok_runs`` samples."""

    name = "flaky"
    period_s = 0.0

    def __init__(self, ok_runs: int) -> None:
        self.left = ok_runs
        self.closed = False

    def available(self) -> Availability:
        return Availability.yes()

    def is_counter(self, name: str) -> bool:
        return True

    def sample(self):
        if self.left <= 0:
            raise PermissionError(13, "Permission denied", "/proc/1/schedstat")
        self.left -= 1
        return {"flaky.x": float(self.left)}

    def close(self) -> None:
        self.closed = True


def test_collector_losing_permission_degrades_to_unsupported(host):
    flaky = _Flaky(3)
    cpu = CpuCollector(host, [1])
    s = Sampler([flaky, cpu], hz=100)
    for i in range(10):
        s.round(now_ns=1_000_000_000 + i * 60_000_000)
    st = s.stats.per_collector
    assert st["flaky"].state == "unsupported" and "Permission" in st["flaky"].reason
    assert flaky.closed
    assert st["flaky"].runs == 4  # never retried after it degraded
    assert st["cpu"].state == "ok" and st["cpu"].runs == 10
    assert s.ring("cpu").rows == 10


def test_permission_loss_on_a_real_file(tmp_path):
    """The hot file disappears under the collector (a tree unmounted / the process gone)."""
    root = tmp_path / "vm"
    shutil.copytree(FIX / "proc", root / "proc", ignore=shutil.ignore_patterns("[0-9]*"))
    (root / "sys").mkdir()
    h = Host(root)
    soft = SoftirqCollector(h, [1])
    s = Sampler([soft], hz=100, max_failures=2)
    s.round(now_ns=10**9)
    soft.tracks["softirqs"].hf.close()  # the descriptor goes bad: EBADF on the next pread
    (root / "proc/softirqs").unlink()
    for i in range(1, 5):
        s.round(now_ns=10**9 + i * 10**7)
    assert s.stats.per_collector["softirq"].state == "unsupported"


# -- the sampler's fast paths equal the pure parsers ---------------------------------------------

def _copy_proc(tmp_path: Path) -> Host:
    root = tmp_path / "vm"
    shutil.copytree(FIX / "proc", root / "proc", ignore=shutil.ignore_patterns("[0-9]*"))
    shutil.copytree(FIX / "sys", root / "sys", symlinks=True, ignore_dangling_symlinks=True)
    return Host(root)


def test_position_cached_reads_equal_the_line_parsers_and_follow_layout_changes(tmp_path):
    h = _copy_proc(tmp_path)
    proc = h.procfs
    cpu, irq, soft, mem = (CpuCollector(h, [1]), IrqCollector(h, [1]), SoftirqCollector(h, [1]),
                           MemoryCollector(h))
    for c in (cpu, irq, soft, mem):
        assert c.available().ok

    def check() -> None:
        assert {k: v for k, v in cpu.sample().items() if "_ticks" in k or ".all." in k} == \
            parse_stat((proc / "stat").read_bytes(), frozenset([1]))
        assert irq.sample() == parse_interrupt_counts((proc / "interrupts").read_bytes(),
                                                      frozenset([1]))[0]
        assert soft.sample() == parse_softirq_counts((proc / "softirqs").read_bytes(),
                                                     frozenset([1]))
        got = mem.sample()
        assert {k: v for k, v in got.items() if k.startswith("mem.")} == \
            parse_vmstat_counters((proc / "vmstat").read_bytes())
        assert got["psi.memory.some_us"] == \
            parse_psi((proc / "pressure/memory").read_bytes(), "memory")["psi.memory.some_us"]

    check()
    check()  # second read: the cached layout
    # Counts change (longer numbers), then the layout itself: an IRQ row appears, a softirq
    # row goes, a vmstat key is added before the kept ones, a CPU line is added.
    ints = (proc / "interrupts").read_bytes().replace(b"          0", b"   98765432", 3)
    lines = ints.split(b"\n")
    lines.insert(2, b" 99:        7        11   IO-APIC  99-edge      new-device")
    (proc / "interrupts").write_bytes(b"\n".join(lines))
    soft_lines = (proc / "softirqs").read_bytes().split(b"\n")
    (proc / "softirqs").write_bytes(b"\n".join(soft_lines[:2] + soft_lines[3:]))
    (proc / "vmstat").write_bytes(b"nr_new_counter 5\n" + (proc / "vmstat").read_bytes())
    st = (proc / "stat").read_bytes()
    (proc / "stat").write_bytes(st.replace(b"\nintr ", b"\ncpu2 1 2 3 4 5 6 7 8 9 10\nintr ", 1))
    check()
    assert irq.sample()["irq.1.99"] == 11.0
    assert irq.descriptions["99"].endswith("new-device")


def test_pcie_collector_reads_kept_open_link_and_aer_files():
    from collectors.pcie import PcieCollector
    h = Host(Path(__file__).parent / "fixtures" / "synthetic-tuned")
    c = PcieCollector(h)
    assert c.available().ok and c.devices
    v = c.sample()
    dev = next(d for d in c.devices if f"pcie.{d}.speed_gts" in v)
    base = h.sys("bus/pci/devices") / dev
    from collectors.parsers import parse_aer, parse_pci_speed
    assert v[f"pcie.{dev}.speed_gts"] == parse_pci_speed((base / "current_link_speed").read_text())
    aer = parse_aer((base / "aer_dev_correctable").read_text())
    for k, n in aer.items():
        assert v[f"pcie.{dev}.aer_{k}_total"] == float(n)
    assert all(v2 is not None for v2 in v.values())
    c.close()
    assert c._files == []


def test_ring_append_raw_equals_update_then_append():
    from agent.watch.ring import SignalRing
    is_c = lambda n: n.endswith("_total")  # noqa: E731
    a, b = SignalRing("a", 8), SignalRing("b", 8)
    ta, tb = DeltaTracker(is_c), DeltaTracker(is_c)
    seq = [{"x_total": 10.0, "g": 1.0}, {"x_total": 15.0, "g": None, "y_total": 3.0},
           {"x_total": 2.0**32 - 3, "g": 2.0, "y_total": 4.0},
           {"x_total": 4.0, "y_total": 1.0, **{f"n{i}": float(i) for i in range(20)}}]
    for i, v in enumerate(seq):
        a.append(i, i + 1, ta.update(v))
        b.append_raw(i, i + 1, v, tb)
    idx = a.window(0, 10)
    assert a.cols == b.cols and list(idx) == list(b.window(0, 10))
    import numpy as np
    np.testing.assert_array_equal(a.data[idx], b.data[idx])
    np.testing.assert_array_equal(a.t1[idx], b.t1[idx])
    assert ta.resets == tb.resets == 1  # y went back: a reset (NaN), never negative
    assert b.column("x_total", idx)[-1] == 7.0  # x wrapped at 2**32: a delta
    assert b.column("n19", idx)[-1] == 19.0  # grew past its initial 8 columns


def test_ring_append_seq_equals_append_raw():
    """The native replay's values rows (append_seq: deltas without per-key Python) store
    exactly what append_raw stores: the first row (no previous value), gauges among the
    counters, columns out of key order, a 32-bit wrap, a reset, a NaN, a longer row."""
    import numpy as np

    from agent.watch.ring import SignalRing
    is_c = lambda n: not n.startswith("g")  # noqa: E731
    keys = ("g_run", "a", "b", "g_blk", "c")
    rows = [(1.0, 10.0, 5.0, 0.0, 7.0), (2.0, 12.0, 5.0, 1.0, 9.0),
            (3.0, 2.0**32 + 1, 6.0, 0.0, 10.0),  # a: no wrap here, just big
            (1.0, 2.0**32 + 5, 8.0, 0.0, 3.0),  # c went back: a reset
            (0.0, 2.0**32 + 9, float("nan"), 0.0, 4.0),  # b: NaN
            (0.0, 2.0**32 + 9, 9.0, 2.0, 5.0), (5.0, 2.0**32 + 20, 10.0, 2.0, 6.0)]
    for pre in ({}, {"b": 1.0, "zz": 1.0}):  # contiguous columns, then another order
        a, b = SignalRing("a", 6), SignalRing("b", 6)  # wraps: 7 rows in 6
        ta, tb = DeltaTracker(is_c), DeltaTracker(is_c)
        if pre:
            a.append_raw(0, 1, pre, ta)
            a.append_raw(0, 1, pre, ta)
            b.append_raw(0, 1, pre, tb)
            b.append_raw(0, 1, pre, tb)
        c, tc = SignalRing("c", 6), DeltaTracker(is_c)  # the same rows in two batches
        if pre:
            c.append_raw(0, 1, pre, tc)
            c.append_raw(0, 1, pre, tc)
        for i, v in enumerate(rows):
            a.append_raw(i + 1, i + 2, dict(zip(keys, v)), ta)
            b.append_seq(i + 1, i + 2, keys, v, tb)
        batch = [(i + 1, i + 2, v) for i, v in enumerate(rows)]
        c.append_seqs(batch[:2], keys, tc)
        c.append_seqs(batch[2:], keys, tc)
        assert a.cols == b.cols == c.cols and a.rows == b.rows == c.rows
        assert ta.resets == tb.resets == tc.resets >= 2 and ta._prev == tb._prev == tc._prev
        idx = a.window(0, 100)
        for x in (b, c):
            np.testing.assert_array_equal(a.data[idx], x.data[idx])
            np.testing.assert_array_equal(a.t0[idx], x.t0[idx])
        assert b._seqs  # the fast path was taken
        assert b.column("a", idx)[-1] == 11.0 and b.column("g_blk", idx)[-1] == 2.0
    wrap = SignalRing("w", 4)
    tw = DeltaTracker(lambda n: True)
    for v in (2.0**32 - 3, 2.0**32 - 1, 4.0):  # /proc/interrupts' unsigned int wraps
        wrap.append_seq(0, 1, ("x",), (v,), tw)
    assert wrap.column("x", wrap.window(0, 2)).tolist()[-2:] == [2.0, 5.0]


def test_sched_scan_sees_a_busy_thread_of_a_multithreaded_process():
    """The scan reads single-threaded processes from /proc/PID/stat and lists task/ only for
    the others: a busy non-main thread is still found, under its own tid."""
    import subprocess
    import sys
    import time
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = (f"import os, threading, time\nos.sched_setaffinity(0, [{cpu}])\n"
            "def spin():\n    print(threading.get_native_id(), flush=True)\n    while True: pass\n"
            "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        tid = int(p.stdout.readline())
        c = SchedCollector(Host(), [os.getpid()], [cpu], scan_period_s=0.0, min_scan_gap_s=0.0)
        c.scan()
        t0 = time.monotonic_ns()
        time.sleep(0.3)
        c.scan()
        runs = c.who_ran(t0, time.monotonic_ns())
        spin = [r for r in runs if r.tid == tid]
        assert spin and spin[0].pid == p.pid and spin[0].run_ns > 50_000_000
        assert not any(r.tid == p.pid and r.run_ns > 50_000_000 for r in runs)  # main sleeps
    finally:
        p.kill()
        p.wait()


def test_sched_rate_follows_the_source_evidence():
    """A built-in probe measures its own run-queue delay per call: watch samples its
    threads at 20 Hz, with stat and status on each of those rounds; an external process's
    records carry none: every sampler round, stat/status every 5th."""
    from agent.watch.latency.probe import BuiltinProbe
    from agent.watch.latency.ring import ClientRing
    from agent.watch.session import WatchConfig, WatchSession
    me = os.getpid()
    slow = SchedCollector(Host(), [me], [0], period_s=0.05)
    fast = SchedCollector(Host(), [me], [0])
    assert (slow.period_s, slow.status_every) == (0.05, 1)
    assert (fast.period_s, fast.status_every) == (0.0, 5)
    s = Sampler([slow, fast], hz=100)
    assert [e.period_ns for e in s.entries] == [50_000_000, 10_000_000]
    for probe, period in ((BuiltinProbe("numpy"), 0.05), (ClientRing(me), 0.0)):
        w = WatchSession(WatchConfig(source=probe, probe_cpus=[0]))
        w.source.pid = me  # (a built-in probe's once it runs)
        w.host = Host()
        w.open_collectors()
        assert w.sched.period_s == period, probe
        v = w.sched.sample()
        assert f"sched.{me}.nivcsw" in v  # stat/status on the first round either way


def test_cpu_collector_follows_the_derived_cpus_without_cpu_online(tmp_path):
    """A capture without /sys/devices/system/cpu/online: the CPU source samples the CPUs
    collectors.system derives (it had none, so watch lost every per-CPU signal)."""
    h = _copy_proc(tmp_path)
    (h.sysfs / "devices/system/cpu/online").unlink()
    c = CpuCollector(h)
    assert c.cpus == [0, 1] and c.available().ok
    got = c.sample()
    assert "cpu.0.user_ticks" in got and "cpu.1.steal_ticks" in got
    c.close()


def test_sched_follows_a_thread_of_a_process_named_by_the_records_alone():
    """A service followed by name (--attach-name) gives the collector no pids: its threads
    come from the records, with their process. Without it a thread is dropped as absent
    (no schedstat rows: its spikes past the CPU budget had no polled run-queue wait); with
    it the thread's signals are read, its process is no "other" in the scans, at most
    max_threads new threads are taken a round (and only theirs kept), and the process's exit
    drops them (no error: the collector watches no process of its own); a dropped thread's
    tid named again in another process (pid_max wrapped) is a new thread."""
    import subprocess
    import sys
    import time
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = (f"import os, threading, time\nos.sched_setaffinity(0, [{cpu}])\n"
            "def spin():\n    print(threading.get_native_id(), flush=True)\n"
            "    t = time.monotonic() + 0.3\n    while time.monotonic() < t: pass\n"
            "    time.sleep(60)\n"
            "threading.Thread(target=spin, daemon=True).start()\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        tid = int(p.stdout.readline())
        blind = SchedCollector(Host(), [], [cpu], scan_period_s=0.0, min_scan_gap_s=0.0)
        blind.watch_tids([tid])
        blind.prepare()
        assert blind.dropped == {tid: "absent"} and not blind.tracks
        c = SchedCollector(Host(), [], [cpu], scan_period_s=0.0, min_scan_gap_s=0.0,
                           max_threads=2)
        c.watch_tids([tid, p.pid, 1], {tid: p.pid, p.pid: p.pid, 1: 1})
        assert c._wanted == {tid, p.pid} and c._tid_pid == {tid: p.pid, p.pid: p.pid}
        c.prepare()
        c.scan()
        t0 = time.monotonic_ns()
        time.sleep(0.3)
        v = c.sample()
        assert v[f"sched.{tid}.run_ns"] > 0 and f"sched.{tid}.rq_delay_ns" in v
        assert not any(r.pid == p.pid for r in c.who_ran(t0, time.monotonic_ns()))
        p.kill()
        p.wait()
        c.sample()  # its threads are dropped, not an error
        assert not c._threads and tid in c.dropped and not c._tid_pid
        c.watch_tids([tid], {tid: p.pid})  # (a record late: the same thread, gone)
        assert tid in c.dropped and not c._wanted
        c.watch_tids([tid], {tid: 4_000_001})  # the tid again, in another process: new
        assert tid not in c.dropped and c._wanted == {tid} and c._tid_pid[tid] == 4_000_001
        c.close()
    finally:
        p.kill()
        p.wait()
