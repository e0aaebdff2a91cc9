"""agent/trace/pmu.py against a real traced process of the test's own: a perf group per thread
(software counters: what every box has, a PMU or not), the uprobe events as sampling members,
each hit one sample of the group's values read from the mmap'd ring (a ring small enough to
wrap), the per-call join, and every descriptor closed (counted in /proc/self/fd).

Root and uprobe events are needed (skipped otherwise); the uprobe events are the test's own
group (``hftagent_<pytest's pid>``), removed at the end."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest

from agent.trace import pmu
from tests.conftest import needs_uprobes

TRACEFS = Path("/sys/kernel/tracing")
# two threads calling the probed function; the second starts late (a thread picked up later)
LOOP = r"""
import ctypes, os, sys, threading, time
lib = ctypes.CDLL(sys.argv[1])
def run(n):
    end = time.monotonic() + 30
    while time.monotonic() < end:
        lib.hft_infer(n)
        time.sleep(0.001)
print("ready", flush=True)
sys.stdin.readline()
threading.Thread(target=run, args=(20000,), daemon=True).start()
run(60000)
"""


def _offset(lib: Path, sym: str) -> int:
    from agent.trace.elf import resolve
    return resolve(str(lib), [sym])[1][sym].offset


@pytest.fixture
def traced(infer_lib):
    """(child, group, names): a child calling hft_infer, our uprobe events on it."""
    needs_uprobes()
    off = _offset(infer_lib, "hft_infer")
    group = f"hftagent_{os.getpid()}"
    ue = TRACEFS / "uprobe_events"

    def append(line: str) -> None:
        fd = os.open(ue, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    child = subprocess.Popen([sys.executable, "-c", LOOP, str(infer_lib)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        append(f"p:{group}/call0 {infer_lib}:0x{off:x}")
        append(f"r:{group}/ret0 {infer_lib}:0x{off:x}")
        yield child, group
    finally:
        child.kill()
        child.wait()
        for n in ("ret0", "call0"):
            try:
                append(f"-:{group}/{n}")
            except OSError:
                pass


def _tids(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_each_hit_is_one_sample_of_the_group_and_calls_join_exactly(traced):
    child, group = traced
    before = _fds()
    with pmu.Counters(TRACEFS, group, ["call0"], ["ret0"], pmu.SOFTWARE, pages=1) as c:
        c.set_threads(_tids(child.pid))
        # 3 counters + entry + return, and the ring's (mmap keeps a dup of the leader's)
        assert len(c.groups) == 1 and c.fds() == 6
        assert _fds() == before + 6
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.3)
        c.set_threads(_tids(child.pid))             # the thread started since: picked up
        assert len(c.groups) == 2 and _fds() == before + 12
        got: dict[int, list[pmu.Sample]] = {}
        end = time.monotonic() + 1.5
        while time.monotonic() < end:                # a 4 KiB ring: it wraps many times
            c.read()
            for tid, g in c.groups.items():
                got.setdefault(tid, []).extend(g.samples)
                g.samples.clear()
            time.sleep(0.02)
        lost = c.lost
    assert _fds() == before                          # every descriptor closed
    assert len(got) == 2 and all(len(v) >= 50 for v in got.values()), \
        {t: len(v) for t, v in got.items()}
    for tid, samples in got.items():
        ts = [s.ts_ns for s in samples]
        assert ts == sorted(ts)
        names = {"task_clock_ns", "page_faults", "context_switches"}
        calls = 0
        for a, b in zip(samples, samples[1:]):
            if a.event == "call0" and b.event == "ret0":  # one call of this thread
                n = pmu.counts(a, b, names)
                assert 0 < n["task_clock_ns"] <= b.ts_ns - a.ts_ns + 50_000
                assert b.values["ret0"] == a.values["ret0"] + 1
                calls += 1
        assert calls >= 20 or lost, (tid, calls, lost)
        # hits counted in the group match the samples where none was lost in between
        assert samples[-1].values["call0"] >= len([s for s in samples if s.event == "call0"])


def test_join_takes_the_outermost_entry_and_its_return():
    s = lambda ts, ev, tc, en=None: pmu.Sample(  # noqa: E731
        ts, ev, 0, {"task_clock_ns": tc}, en if en is not None else ts, ts)
    q = deque([s(90, "ret0", 5), s(101, "call0", 10), s(150, "call1", 40),
               s(180, "ret1", 60), s(201, "ret0", 90), s(300, "call0", 100)])
    first, last = pmu.join(q, 100, 200, {"call0", "call1"}, {"ret0", "ret1"})
    assert (first.ts_ns, last.ts_ns) == (101, 201)
    assert pmu.counts(first, last, {"task_clock_ns"}) == {"task_clock_ns": 80}
    assert [x.ts_ns for x in q] == [201, 300]        # what came before the return: dropped
    assert pmu.join(q, 300, 400, {"call0"}, {"ret0"}) is None   # its return not there yet
    mux = deque([s(10, "call0", 0, en=10), s(50, "ret0", 30, en=60)])
    assert pmu.join(mux, 10, 50, {"call0"}, {"ret0"}) == "multiplexed"


def test_a_record_that_wraps_the_ring_end_is_reassembled():
    class _M(bytearray):
        def close(self):
            pass
    r = pmu.Ring.__new__(pmu.Ring)
    import threading
    size = 64
    r.map, r.off, r.size, r._fence = _M(4096 + size), 4096, size, threading.Lock()
    body = struct.pack("<QQ", 7, 3)                   # PERF_RECORD_LOST: id, lost
    rec = struct.pack("<IHH", pmu.RECORD_LOST, 0, 8 + len(body)) + body
    start = size - 12                                 # the record straddles the end
    for i, b in enumerate(rec):
        r.map[4096 + (start + i) % size] = b
    struct.pack_into("<QQ", r.map, pmu.HEAD_OFF, start + len(rec), start)
    recs, lost = r.records()
    assert lost == 3 and recs == [(pmu.RECORD_LOST, body)]
    assert struct.unpack_from("<Q", r.map, pmu.TAIL_OFF)[0] == start + len(rec)


def test_no_counter_is_said_in_one_line_never_zero(traced):
    child, _ = traced
    why = pmu.probe(child.pid)
    if why is None:
        pytest.skip("this box exposes a PMU: hardware counters open")
    assert why.startswith("unsupported: no hardware cycles counter (perf_event_open: ")
    assert "\n" not in why
    before = _fds()
    assert pmu.probe(child.pid) == why and _fds() == before   # nothing left open
    assert pmu.probe(child.pid, pmu.SOFTWARE) is None


def test_attr_is_the_kernels_layout():
    a = pmu.attr(pmu.Counter("call0", pmu.TYPE_TRACEPOINT, 1234), sampling=True)
    assert len(a) == pmu.ATTR_SIZE
    typ, size, config, period, stype, rfmt, flags = struct.unpack_from("<IIQQQQQ", a, 0)
    assert (typ, size, config, period) == (2, 136, 1234, 1)
    assert stype == (1 << 16) | (1 << 1) | (1 << 2) | (1 << 7) | (1 << 4)
    assert rfmt == 15 and flags & (1 << 25)
    assert struct.unpack_from("<i", a, 92)[0] == 1   # clockid: CLOCK_MONOTONIC
