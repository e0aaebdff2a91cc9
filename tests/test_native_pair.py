"""watch --attach's pairing in C (agent/watch/latency/native_pair.py, hftpair.c) gives what
the Python pairing (AttachedReader._pair, the reference) gives: the same rows, in the same
order, with the same counters (unpaired and lost returns, calls open at a thread's exit, a
resync after lost hits), read after read, on pages written byte by byte
(tests/eventpages.py): nested probes, threads of another process, two CPUs merged in time,
time extends and absolute stamps, long-form records, discarded records, kernel events among
the hits. Needs a C compiler (the library is built as the helpers are)."""

from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from agent.trace.pages import PageLayout
from agent.trace.uprobe import UprobeEvents
from agent.watch.latency import native_pair
from agent.watch.latency.attached import AttachedReader
from tests.eventpages import PageWriter, load_formats, payload
from tests.test_trace_uprobe_hits import _fmt

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")

CALL0 = _fmt("call0", 3001, [("__probe_ip", 8)])
RET0 = _fmt("ret0", 3002, [("__probe_func", 8), ("__probe_ret_ip", 16)])
CALL1 = _fmt("call1", 3003, [("__probe_ip", 8)])
RET1 = _fmt("ret1", 3004, [("__probe_func", 8), ("__probe_ret_ip", 16)])
SWITCH = load_formats()["sched_switch"]
PID = 100
MINE = {100, 101, 102, 103}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HFTAGENT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("HFTAGENT_PY_PAIRING", raising=False)


class _Source(UprobeEvents):
    """The event source's part the reader uses: the calls pages handed out once, the lost
    count."""

    def __init__(self) -> None:
        super().__init__()
        self._closed, self.reader, self._layout = False, "raw", PageLayout()
        self._formats = {f.id: f for f in (CALL0, RET0, CALL1, RET1, SWITCH)}
        self._uprobe_ids = {CALL0.id: False, RET0.id: True, CALL1.id: False, RET1.id: True}
        self._uprobe_names = {"call0": False, "ret0": True, "call1": False, "ret1": True}
        self.pages: list[tuple[int, bytes]] = []
        self.lost = 0
        self.drained_ns = 1 << 62  # (never a kernel drain)

    def _calls_pages(self):
        out, self.pages = self.pages, []
        return out

    def calls_lost(self) -> int:
        return self.lost


class _Reader(AttachedReader):
    def __init__(self, events, native: bool, tids: set[int]) -> None:
        self.live = set(tids)
        super().__init__(None, PID, events, type("U", (), {"instances": [], "group": "g"})(),
                         False)
        self._native_tried = not native  # (the Python reference: never tries C)

    def threads(self) -> set[int]:
        return set(self.live)


def _record(kind: str, tid: int) -> bytes:
    if kind == "sw":
        return payload(SWITCH, 0, prev_comm="a", prev_pid=1, next_comm="b", next_pid=2)
    fmt = {"call0": CALL0, "ret0": RET0, "call1": CALL1, "ret1": RET1}[kind]
    return payload(fmt, tid, **({"__probe_ip": 9} if kind.startswith("call") else
                                {"__probe_func": 1, "__probe_ret_ip": 2}))


def _pages(cpu: int, recs: list[tuple[int, str, int]], rng: random.Random) -> list:
    """``(ts, kind, tid)`` in time order → pages of one CPU, with the ring's other record
    shapes mixed in."""
    out, w, n = [], None, 0

    def page(w):  # (now and then a read shorter than a sub-buffer: the data only)
        return w.build()[:16 + len(w.body)] if rng.random() < 0.2 else w.build()

    for ts, kind, tid in recs:
        if w is None or n >= 60:
            if w is not None:
                out.append((cpu, page(w)))
            w, n = PageWriter(ts), 0
            if rng.random() < 0.2:
                w.time_stamp(ts)
        if rng.random() < 0.05:
            w.discarded(16)
        w.event(ts, _record(kind, tid), long_form=rng.random() < 0.1)
        n += 1
    if w is not None:
        out.append((cpu, page(w)))
    return out


def _workload(rng: random.Random, t0: int, n: int) -> dict[int, list]:
    """Calls on two CPUs: threads of the process and of another, nested probes, lost and
    unpaired returns, kernel events, gaps long enough for time extends."""
    per_cpu: dict[int, list] = {0: [], 1: []}
    t = t0
    for _ in range(n):
        tid = rng.choice([100, 101, 102, 103, 555])
        cpu = rng.choice([0, 1])
        t += rng.choice([1, 50, 1000, 200_000_000])  # (2^27 ns gaps: time extends)
        r = rng.random()
        if r < 0.05:
            per_cpu[cpu].append((t, "ret0", tid))  # unpaired (or closing another's)
        elif r < 0.1:
            per_cpu[cpu].append((t, "call0", tid))  # its return lost
        elif r < 0.15:
            per_cpu[cpu].append((t, "sw", 0))
        else:
            nested = rng.random() < 0.4
            per_cpu[cpu].append((t, "call0", tid))
            if nested:
                t += rng.randint(1, 500)
                per_cpu[cpu].append((t, "call1", tid))
                t += rng.randint(1, 500)
                per_cpu[cpu].append((t, "ret1", tid))
            t += rng.randint(1, 10_000)
            # the return may come on the other CPU (the thread migrated)
            per_cpu[rng.choice([cpu, 1 - cpu])].append((t, "ret0", tid))
    for recs in per_cpu.values():
        recs.sort(key=lambda x: x[0])
    return per_cpu


def _same(py: _Reader, nat: _Reader) -> None:
    a, b = py.stats(), nat.stats()
    assert a == b
    assert py.open_at_exit == nat.open_at_exit and py.resynced == nat.resynced


@pytest.mark.parametrize("seed", range(12))
def test_the_c_pairing_gives_the_python_pairing_s_rows_read_after_read(seed):
    if native_pair.library() is None:
        pytest.fail(f"the library did not build: {native_pair.unavailable()}")
    rng = random.Random(seed)
    src_py, src_c = _Source(), _Source()
    py, nat = _Reader(src_py, False, MINE), _Reader(src_c, True, MINE)
    t = 1_000_000
    for step in range(8):
        per_cpu = _workload(rng, t, rng.randint(0, 150))
        t = max([t] + [r[0] for recs in per_cpu.values() for r in recs]) + 1
        pages = [p for cpu in (1, 0) for p in _pages(cpu, per_cpu[cpu], rng)]
        src_py.pages, src_c.pages = list(pages), list(pages)
        if step == 4:  # hits lost: both pair again from a clean state
            src_py.lost = src_c.lost = 3
        if step == 5:  # a thread ended (inside a call, maybe), another started
            for r in (py, nat):
                r.live = (MINE - {101}) | {104}
                r._tids_at = 0.0
        a, b = py.read(), nat.read()
        assert nat.native is not None
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b), (seed, step)
        _same(py, nat)
    py.finish()
    nat.finish()
    _same(py, nat)
    assert py.calls > 0


def test_a_thread_that_starts_between_reads_is_timed_from_its_first_read():
    """A thread not known at the last look is looked for once per read: its calls count."""
    src = _Source()
    r = _Reader(src, True, {100})
    r.live = {100, 107}  # started since
    src.pages = _pages(0, [(10, "call0", 107), (20, "ret0", 107), (30, "call0", 999),
                           (40, "ret0", 999)], random.Random(0))
    rows = r.read()
    assert r.native is not None
    assert len(rows) == 1
    from agent.watch.latency.attached import F
    assert rows[0, F["tid"]] == 107 and rows[0, F["pid"]] == PID
    assert (rows[0, F["start_ns"]], rows[0, F["end_ns"]]) == (10, 20)


def test_calls_open_in_the_python_pairing_are_handed_over():
    """After a runtime trial (read by the Python pairing), the open calls go on in C."""
    src = _Source()
    r = _Reader(src, True, {100})
    r._native_tried = True  # as during a trial: the Python pairing reads
    src.pages = _pages(0, [(10, "call0", 100), (15, "call1", 100)], random.Random(0))
    assert len(r.read()) == 0 and r._open
    r._native_tried = False
    src.pages = _pages(0, [(20, "ret1", 100), (30, "ret0", 100)], random.Random(0))
    rows = r.read()
    from agent.watch.latency.attached import F
    assert r.native is not None and not r._open
    assert [(x[F["start_ns"]], x[F["end_ns"]]) for x in rows.tolist()] == [(10, 30)]


def test_without_the_library_the_python_pairing_reads(monkeypatch):
    monkeypatch.setattr(native_pair, "library", lambda: None)
    src = _Source()
    r = _Reader(src, True, {100})
    src.pages = _pages(0, [(10, "call0", 100), (30, "ret0", 100)], random.Random(0))
    assert len(r.read()) == 1 and r.native is None


def test_a_name_it_cannot_code_is_left_to_python():
    assert native_pair.code_of("call0", False) == 1 and native_pair.code_of("ret0", True) == -1
    assert native_pair.code_of("call30", False) == 31
    assert native_pair.code_of("call31", False) is None
    assert native_pair.code_of("gpu0", False) is None
    assert native_pair.code_of("ret0", False) is None
