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
    """(child, probes): a child calling hft_infer, and perf uprobes on it (perf's own: they
    are the descriptors', nothing in uprobe_events)."""
    needs_uprobes()
    off = _offset(infer_lib, "hft_infer")
    child = subprocess.Popen([sys.executable, "-c", LOOP, str(infer_lib)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        why = pmu.probe(child.pid, pmu.SOFTWARE)
        if why:   # (a sandbox whose seccomp refuses perf_event_open)
            pytest.skip(why)
        yield child, [pmu.Probe("call0", str(infer_lib), off, False),
                      pmu.Probe("ret0", str(infer_lib), off, True)]
    finally:
        child.kill()
        child.wait()


def _tids(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def _fds() -> int:
    """Our perf descriptors (the rest of pytest's may open and close meanwhile)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            pass
    return n


def test_each_hit_is_one_sample_of_the_group_and_calls_join_exactly(traced):
    child, probes = traced
    before = _fds()
    with pmu.Counters(probes, pmu.SOFTWARE, pages=1) as c:
        c.set_threads(_tids(child.pid))
        # 3 counters + entry + return, and the ring's (mmap keeps a dup of the leader's)
        assert len(c.groups) == 1 and c.fds() == 6
        assert _fds() == before + 6
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.3)
        c.set_threads(_tids(child.pid))             # the thread started since: picked up
        # perf's own uprobes: the descriptors', nothing defined in uprobe_events
        assert probes[0].path not in (TRACEFS / "uprobe_events").read_text()
        assert len(c.groups) == 2 and _fds() == before + 12
        got: dict[int, list[tuple[pmu.Sample, pmu.Sample]]] = {}
        end = time.monotonic() + 1.5
        while time.monotonic() < end:                # a 4 KiB ring: it wraps many times
            c.read()
            for tid, g in c.groups.items():
                got.setdefault(tid, []).extend(g.calls)
                g.calls.clear()
            time.sleep(0.02)
        lost = c.lost
    assert _fds() == before                          # every descriptor closed
    assert len(got) == 2 and all(len(v) >= 20 for v in got.values()), \
        {t: len(v) for t, v in got.items()}
    names = {"task_clock_ns", "page_faults", "context_switches"}
    for calls in got.values():
        ts = [a.ts_ns for a, _ in calls]
        assert ts == sorted(ts)
        for a, b in calls:                           # one call of this thread each
            assert (a.event, b.event) == ("call0", "ret0") and a.ts_ns < b.ts_ns
            n = pmu.counts(a, b, names)
            assert 0 < n["task_clock_ns"] <= b.ts_ns - a.ts_ns + 50_000
            assert b.values["ret0"] == a.values["ret0"] + 1   # its own return, none between
        assert lost or all(x[1].values["call0"] + 1 == y[0].values["call0"]
                           for x, y in zip(calls, calls[1:]))  # no call missed


def _s(ts, ev, tc=0, en=None):
    return pmu.Sample(ts, ev, 0, ("task_clock_ns",), (tc,), en if en is not None else ts, ts)


def test_pairing_takes_the_outermost_entry_to_its_return_and_a_gap_starts_again():
    g = pmu.Group(1)
    for s in [_s(90, "ret0"), _s(101, "call0"), _s(150, "call1"), _s(180, "ret1"),
              _s(201, "ret0"), _s(300, "call0"), _s(310, "call0"), _s(400, "ret0")]:
        g.pair(s, s.event.startswith("ret"), False)
    assert [(a.ts_ns, b.ts_ns) for a, b in g.calls] == [(101, 201), (310, 400)]
    g.pair(_s(500, "call0"), False, False)
    g.gap()
    g.pair(_s(600, "ret0"), True, False)             # its entry was before the gap
    assert len(g.calls) == 2
    e = pmu.Group(2)
    for t in (10, 20, 35):
        e.pair(_s(t, "call0"), False, True)           # entry-only: one entry to the next
    assert [(a.ts_ns, b.ts_ns) for a, b in e.calls] == [(10, 20), (20, 35)]


def test_join_takes_the_nearest_call_within_its_window_in_either_order():
    q = deque([(_s(1_000, "call0", 1), _s(9_000, "ret0", 5)),
               (_s(100_000, "call0", 10), _s(200_001, "ret0", 90)),
               (_s(300_000, "call0", 100), _s(400_000, "ret0", 130))])
    # the perf sample came 1 ns before the trace event at the entry, 1 ns after at the end
    first, last = pmu.join(q, 100_001, 200_000)
    assert (first.ts_ns, last.ts_ns) == (100_000, 200_001)
    assert pmu.counts(first, last, {"task_clock_ns"}) == {"task_clock_ns": 80}
    assert [a.ts_ns for a, _ in q] == [300_000]       # the calls before it: dropped
    assert pmu.join(q, 500_000, 600_000) is None      # not there (yet)
    assert len(q) == 1
    mux = deque([(_s(10, "call0", 0, en=10), _s(50, "ret0", 30, en=60))])
    assert pmu.join(mux, 10, 50) == "multiplexed"


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
    buf, recs, lost = r.records()
    assert lost == 3 and [(t, bytes(buf[a:a + n])) for t, a, n in recs] == \
        [(pmu.RECORD_LOST, body)]
    assert struct.unpack_from("<Q", r.map, pmu.TAIL_OFF)[0] == start + len(rec)
    assert r.records() == (b"", [], 0)                # nothing new: nothing read


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


def test_a_dropped_probe_leaves_every_group_and_its_descriptor_closes(traced, infer_lib):
    child, probes = traced
    other = pmu.Probe("call1", str(infer_lib), _offset(infer_lib, "hft_other"), False)
    before = _fds()
    with pmu.Counters([*probes, other], pmu.SOFTWARE, pages=1) as c:
        c.set_threads(_tids(child.pid))
        assert _fds() == before + 7
        c.drop({"call1"})                  # a trial's loser
        assert _fds() == before + 6 and [p.name for p in c.probes] == ["call0", "ret0"]
        assert all("call1" not in g.probe_fds for g in c.groups.values())
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(0.2)
        c.read()                           # the group still samples its other probes
        assert any(g.calls for g in c.groups.values())
    assert _fds() == before


def test_threads_past_the_cap_are_said_and_hold_nothing(traced, monkeypatch):
    child, probes = traced
    child.stdin.write("go\n")   # a second thread
    child.stdin.flush()
    time.sleep(0.2)
    monkeypatch.setattr(pmu, "MAX_THREADS", 1)
    before = _fds()
    with pmu.Counters(probes, pmu.SOFTWARE, pages=1) as c:
        c.set_threads(_tids(child.pid))
        assert len(c.groups) == 1 and _fds() == before + 6
        assert list(c.failed.values()) == ["over 1 threads or 50% of the descriptor limit "
                                           "(RLIMIT_NOFILE)"]
    assert _fds() == before
