"""`watch --attach-name` following a LiteRT service through 30 restarts (issue #38 done-when
1; bench/restarts.py runs the 100 with the figures): every process is timed and its exit
said, every call it made from its first timed one is timed (its own count, an agent.client
ring: none lost at its exit, none given to another process), the summary's ``processes`` say
each incarnation, watch's descriptors do not grow, and nothing of it is left in tracefs.

No timing is asserted: each step waits for a condition with a generous deadline (a busy
2-core box, a faster CI runner). Every process attached to or killed is one the test started
(bench/service.py, its ring's path carrying a marker of this run)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
RESTARTS = 30


def _until(cond, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _said(lines: list[str], *parts: str) -> bool:
    return any(all(p in ln for p in parts) for ln in list(lines))


def _fds(pid: int, looks: int = 60) -> int:
    """The fewest open descriptors of ``pid`` over ``looks`` looks 50 ms apart (a read in
    flight is not growth; an exited thread's schedstat, stat and status close at the sched
    sampler's next round, ~0.75 s after the exit)."""
    n = []
    for _ in range(looks):
        n.append(len(os.listdir(f"/proc/{pid}/fd")))
        time.sleep(0.05)
    return min(n)


def _service(tmp: Path, marker: str, i: int) -> tuple[subprocess.Popen, dict]:
    """bench/service.py on LiteRT (dense-16), no warm-up: every call of the model is one of
    its loop, recorded in its ring (whose path carries the marker)."""
    cpu = max(os.sched_getaffinity(0))
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / "service.py"), "--cpu",
                          str(cpu), "--rate", "300", "--seconds", "120", "--warmup", "0",
                          "--model", str(REPO / "bench" / "models" / "dense-16.tflite"),
                          "--ring", str(tmp / f"{marker}-{i}.ring")],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         cwd=REPO)
    ready = json.loads(p.stdout.readline())
    assert ready.get("ready") and ready["warmup_calls"] == 0, ready
    return p, ready


def _clean(d: Path) -> None:
    """A SIGKILLed service's control directory (its FIFOs: it removes them itself on
    SIGTERM)."""
    if d.parent == Path(tempfile.gettempdir()) and d.name.startswith("hftagent-service-"):
        shutil.rmtree(d, ignore_errors=True)


def _own_count(r) -> int:
    """The calls an ended service recorded: its ring's last sequence number (``r``: a
    reader opened while it ran; SIGTERM unlinks the ring)."""
    try:
        while len(r.read()):
            pass
        return int(r.pos)
    finally:
        r.close()


def test_30_restarts_every_call_from_the_first_timed_one_is_timed_and_nothing_is_left(
        tmp_path):
    needs_uprobes()
    pytest.importorskip("ai_edge_litert")
    from agent.client import RingReader
    marker = f"hftrestart-{secrets.token_hex(4)}"
    w = subprocess.Popen([*CLI, "watch", "--attach-name", marker, "--json", "--no-history",
                          "--no-live", "--trace", "on", "--duration", "600"],
                         stdout=(tmp_path / "out.json").open("w"), stderr=subprocess.PIPE,
                         text=True, cwd=REPO)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(w.stderr.readline, "")),
                              daemon=True)
    reader.start()
    own: dict[int, int] = {}
    fds: list[int] = []
    try:
        assert _until(lambda: _said(lines, "no process of it runs yet")), lines
        for i in range(RESTARTS):
            p, ready = _service(tmp_path, marker, i)
            ring = RingReader(ready["ring"])
            assert _until(partial(_said, lines, f"timing pid {p.pid} ")), lines[-5:]
            time.sleep(0.3)
            p.send_signal(signal.SIGTERM if i % 3 == 2 else signal.SIGKILL)
            p.wait(timeout=30)
            p.stdout.close()
            _clean(Path(ready["dir"]))
            own[p.pid] = _own_count(ring)
            if i in (2, RESTARTS - 1):   # (between two processes: the set armed, no ring open)
                assert _until(partial(_said, lines, f"pid {p.pid} (", ") exited")), lines[-5:]
                fds.append(_fds(w.pid))
        w.send_signal(signal.SIGINT)
        assert w.wait(timeout=120) == 0, lines[-5:]
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    reader.join(5)
    summary = json.loads((tmp_path / "out.json").read_text())
    incs = {d["pid"]: d for d in summary["processes"]}
    short = []
    for pid, n in own.items():
        d = incs[pid]
        assert d["state"] == "exited" and d["rearm_s"] is not None, d
        assert d["own_calls"] == n and isinstance(d["missed"], int), (n, d)
        # every call from its first timed one: none lost at the exit, none of another's
        # (one more: a call SIGKILL cut after its return, before the ring recorded it)
        assert d["calls"] <= n - d["missed"] + 1, (n, d)
        if d["calls"] < n - d["missed"]:
            short.append((n - d["missed"] - d["calls"], d))
        assert _said(lines, f"pid {pid} (", f"exited after {d['calls']} call(s) timed")
    # but one process may lack a few: the trace ring's one re-size after warm-up
    # (agent/trace/sizing.py refit): the kernel stops the instance's tracing while it resizes
    # the ring (kernel/trace/trace.c __tracing_resize_ring_buffer: tracing_stop_tr), and hits
    # in that window are lost
    assert len(short) <= 1 and all(k <= 20 for k, _ in short), short
    assert summary["samples"] == sum(d["calls"] for d in summary["processes"])
    assert fds[1] <= fds[0], fds
    assert not [ln for ln in (TRACEFS / "uprobe_events").read_text().splitlines()
                if f"hftagent_{w.pid}/" in ln]
    assert not any(n.startswith(f"hftagent-{w.pid}") for n in os.listdir(TRACEFS / "instances"))
