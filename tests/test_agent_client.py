"""The latency client ring: records, ordering, lapping, torn slots, threads, cost."""

from __future__ import annotations

import threading
import time

import numpy as np

from agent.client import FIELDS, LatencyRing, RingError, RingReader

F = {n: i for i, n in enumerate(FIELDS)}


def test_records_round_trip(tmp_path):
    w = LatencyRing(tmp_path / "r", capacity=64)
    r = RingReader(tmp_path / "r")
    assert r.creator_pid == w._pid
    w.record(10, 25, tid=7, nivcsw=1, minflt=3, rq_delay_ns=900, cpu_start=1, cpu_end=0)
    # a start a few µs ago: end() stamps now, and the reader drops latencies over 1 h (a
    # start of 100 ns after boot is one on any machine up for more than an hour)
    t0 = time.perf_counter_ns() - 5_000
    w.end(t0)
    got = r.read()
    assert got.shape == (2, len(FIELDS))
    assert got[0, F["start_ns"]] == 10 and got[0, F["end_ns"]] == 25
    assert got[0, F["tid"]] == 7 and got[0, F["nivcsw"]] == 1 and got[0, F["cpu_end"]] == 0
    assert got[1, F["nivcsw"]] == -1  # not measured by end(): -1, never 0
    assert got[1, F["end_ns"]] > t0
    assert len(r.read()) == 0


def test_lapping_counts_lost_records(tmp_path):
    w = LatencyRing(tmp_path / "r", capacity=32)
    r = RingReader(tmp_path / "r")
    for i in range(5):
        w.record(i, i + 1)
    assert len(r.read()) == 5
    for i in range(100):
        w.record(i, i + 1)
    got = r.read()
    seq = got[:, 0]
    assert np.all(np.diff(seq) == 1) and seq[-1] == 105
    assert r.lost + len(got) + 5 == 105 and r.lost > 0


def test_torn_slot_is_held_back(tmp_path):
    w = LatencyRing(tmp_path / "r", capacity=16)
    r = RingReader(tmp_path / "r")
    for i in range(3):
        w.record(i, i)
    # Simulate a writer caught mid-record in slot 2: its trailing seq is stale.
    import struct
    off = 64 + 2 * len(FIELDS) * 8 + (len(FIELDS) - 1) * 8
    struct.pack_into("<q", w._mm, off, 0)
    assert r.read()[:, 0].tolist() == [1, 2]
    struct.pack_into("<q", w._mm, off, 3)  # the writer finishes
    assert r.read()[:, 0].tolist() == [3]


def test_threads_write_without_losing_or_duplicating(tmp_path):
    w = LatencyRing(tmp_path / "r", capacity=1 << 14)
    r = RingReader(tmp_path / "r")

    def work():
        for i in range(2000):
            w.record(i, i + 1)
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    got = r.read()
    assert sorted(got[:, 0].tolist()) == list(range(1, 8001))
    assert len(set(got[:, F["tid"]].tolist())) == 4


def test_not_a_ring(tmp_path):
    (tmp_path / "x").write_bytes(b"\0" * 4096)
    try:
        RingReader(tmp_path / "x")
    except RingError as exc:
        assert "not a version-1" in str(exc)
    else:
        raise AssertionError("accepted a file that is not a ring")


def test_each_timed_block_is_one_record(tmp_path):
    """The record path (its cost is a benchmark's, bench/collector_cost.py: ~1.3-1.7 µs a
    timed() block, not a timed test) writes one record per block, in order."""
    w = LatencyRing(tmp_path / "r", capacity=4096)
    from agent import client
    client._default = w
    try:
        for _ in range(1000):
            with client.timed():
                pass
    finally:
        client._default = None
    recs = RingReader(tmp_path / "r").read()
    assert len(recs) == 1000
    i0, i1 = F["start_ns"], F["end_ns"]
    assert (recs[:, i1] >= recs[:, i0]).all() and (np.diff(recs[:, i0]) >= 0).all()


def test_timed_nests_and_names_each_thread(tmp_path, monkeypatch):
    """Nested and interleaved timed() blocks keep their own start times (an asyncio handler
    that awaits inside its block interleaves with the next one on the same thread), and each
    thread's records carry its own kernel thread id (cached per thread)."""
    import time

    from agent import client
    w = LatencyRing(tmp_path / "r", capacity=256)
    monkeypatch.setattr(client, "_default", w)
    r = RingReader(tmp_path / "r")
    with client.timed():
        time.sleep(0.02)
        with client.timed():
            pass
    got = r.read()
    lat = got[:, F["end_ns"]] - got[:, F["start_ns"]]
    assert lat[0] < 5_000_000 and lat[1] >= 20_000_000  # inner first, outer spans the sleep
    a, b = client.timed(), client.timed()  # A starts, B starts, A ends, B ends
    a.__enter__()
    time.sleep(0.02)
    b.__enter__()
    a.__exit__(None, None, None)
    time.sleep(0.02)
    b.__exit__(None, None, None)
    got = r.read()
    lat = got[:, F["end_ns"]] - got[:, F["start_ns"]]
    assert 18_000_000 <= lat[0] < 35_000_000 and 18_000_000 <= lat[1] < 35_000_000
    tids = {}

    def work(i):
        for _ in range(50):
            with client.timed():
                pass
        tids[i] = threading.get_native_id()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    got = r.read()
    assert len(got) == 150
    assert set(got[:, F["tid"]].tolist()) == set(tids.values())
    assert (got[:, F["end_ns"]] >= got[:, F["start_ns"]]).all()


# ----------------------------------------------------------------------------------------------
# #30 items 3-4: the client never raises into the application; watch --pid finds its ring
# ----------------------------------------------------------------------------------------------


def test_a_ring_that_cannot_be_created_is_a_no_op_said_once(tmp_path, monkeypatch, capsys):
    """timed(), start()/end() and ring() never raise into the application: the ring's
    failure (here: a non-empty directory at $HFTAGENT_RING, a missing ring directory, an
    error that is not a RingError) is one line on stderr, once, and the calls go on as
    no-ops."""
    from agent import client
    busy = tmp_path / "busy.ring"
    busy.mkdir()
    (busy / "x").write_text("")

    def broken_create(*a, **kw):
        raise MemoryError("mmap")
    cases = [
        (lambda: monkeypatch.setenv("HFTAGENT_RING", str(busy)), "cannot create latency ring"),
        (lambda: (monkeypatch.delenv("HFTAGENT_RING", raising=False),
                  monkeypatch.setattr(client, "ring_dir", lambda: tmp_path / "gone")),
         "directory"),
        (lambda: (monkeypatch.setenv("HFTAGENT_RING", str(tmp_path / "ok.ring")),
                  monkeypatch.setattr(client, "_create", broken_create)), "MemoryError: mmap"),
    ]
    for setup, why in cases:
        monkeypatch.setattr(client, "_default", None)
        setup()
        capsys.readouterr()
        for _ in range(3):
            with client.timed():
                pass
            client.end(client.start())
            client.ring().record(1, 2)
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("hftagent client: ") and why in err[0], err
        assert "latencies are not recorded" in err[0]
        assert isinstance(client.ring(), client.NullRing) and client.ring().path is None
    monkeypatch.setattr(client, "_default", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy.ring"]  # nothing left


def test_the_application_goes_on_when_its_ring_cannot_be_created(tmp_path):
    """The whole application, as a user runs it: exit 0, its own output, one stderr line."""
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    app = ("from agent.client import timed, start, end\n"
           "for i in range(1000):\n"
           "    with timed():\n"
           "        pass\n"
           "    end(start())\n"
           "print('served 1000')\n")
    env = dict(__import__("os").environ, HFTAGENT_RING=str(tmp_path / "no" / "dir" / "r.ring"))
    r = subprocess.run([sys.executable, "-c", app], cwd=repo, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "served 1000\n", r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_shared_file_mappings_of_proc_pid_maps():
    from agent.watch.latency.ring import shared_file_mappings
    maps = (
        "55d0c0a00000-55d0c0a21000 r--p 00000000 fd:00 1183  /usr/bin/python3.12\n"
        "7f00aa000000-7f00aa3a0000 rw-s 00000000 00:1a 4242  /dev/shm/hftagent-7-00ff.ring\n"
        "7f00ab000000-7f00ab3a0000 rw-s 00000000 00:1a 4242  /dev/shm/hftagent-7-00ff.ring\n"
        "7f00ac000000-7f00ac001000 rw-s 00000000 00:01 9     /dev/zero (deleted)\n"
        "7f00ad000000-7f00ad001000 r--s 00000000 00:1a 77    /dev/shm/ro\n"
        "7f00ae000000-7f00ae001000 rw-s 00001000 00:1a 78    /dev/shm/offset\n"
        "7f00af000000-7f00af001000 rw-s 00000000 103:02 79   /home/u/my ring\n"
        "7f00b0000000-7f00b0001000 rw-p 00000000 00:00 0 \n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0     [stack]\n"
        "garbage line\n")
    assert shared_file_mappings(maps) == [("/dev/shm/hftagent-7-00ff.ring", 0, 0x1a, 4242),
                                          ("/home/u/my ring", 0x103, 2, 79)]


CLIENT_APP = """
import sys, time
from pathlib import Path
from agent import client
client.ring_dir = lambda: Path(sys.argv[1])   # the default name, in the test's directory
time.sleep(float(sys.argv[2]))                # watch starts before the first call
end = time.monotonic() + 30
while time.monotonic() < end:
    with client.timed():
        time.sleep(0.0002)
    time.sleep(0.002)
"""


def test_watch_pid_finds_the_ring_of_a_process_started_after_the_change(tmp_path):
    """#30 item 3: the client's ring has a random name; `watch --pid` finds it in the
    process's /proc/PID/maps (waiting for its first call), reads it, and names it."""
    import json
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "HFTAGENT_RING"}
    app = subprocess.Popen([sys.executable, "-c", CLIENT_APP, str(tmp_path), "1.5"], cwd=repo,
                           env=env)
    try:
        r = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()",
                            "watch", "--pid", str(app.pid), "--duration", "3", "--no-live",
                            "--json", "--sampler", "python", "--trace", "off",
                            "--no-history"],  # (the history database is in tmp_path too)
                           cwd=repo, capture_output=True, text=True, timeout=120)
    finally:
        app.kill()
        app.wait()
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["samples"] > 50 and s["pid"] == app.pid
    names = [p.name for p in tmp_path.iterdir()]
    assert len(names) == 1 and re.fullmatch(rf"hftagent-{app.pid}-[0-9a-f]{{16}}\.ring",
                                            names[0])
    assert names[0] in s["source"]
