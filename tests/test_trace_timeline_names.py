"""Names captured when seen (issue #35 item 4): a waker or a signal's sender on another CPU
that has exited before its window is read keeps its comm — from its own
``sched_process_exit`` (the wake instance records every exit), in the window or after it —
instead of showing as "?[pid]"; /proc/PID/comm still names one that lives."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections import deque

import pytest

from agent.trace import timeline
from agent.trace import tracefs as tfs
from agent.trace.event import parse_format
from agent.trace.pages import Page
from agent.trace.window import _CpuRing
from collectors.host import Host
from tests.eventpages import PageWriter, load_formats, payload

FMTS = load_formats()
# sched_process_exit's format as kernel 6.18 prints it (the fixture predates it); another
# id than the fixture's events
EXIT_FORMAT = """name: sched_process_exit
ID: 9369
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
\tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;

print fmt: "comm=%s pid=%d prio=%d group_dead=%s", REC->comm, REC->pid, REC->prio
"""
EXIT = parse_format(EXIT_FORMAT, "sched")
PROBE, PROBE_CPU, OTHER_CPU = 4100, 1, 0
KILLER, WAKER = 4242, 4243  # neither is in the fake /proc
T0 = 1_000_000_000


def switch(prev: int, prev_comm: str, state: int, nxt: int, nxt_comm: str) -> bytes:
    return payload(FMTS["sched_switch"], prev, prev_comm=prev_comm, prev_pid=prev,
                   prev_prio=120, prev_state=state, next_comm=nxt_comm, next_pid=nxt,
                   next_prio=120)


def main_page() -> bytes:
    """The probe CPU: the probe runs, blocks (S) at +100 µs, the CPU idles, the probe runs
    again from +600 µs (woken from the other CPU at +500 µs)."""
    w = PageWriter(T0)
    w.event(T0 + 10_000, switch(0, "swapper/1", 0, PROBE, "probe"))
    w.event(T0 + 100_000, switch(PROBE, "probe", 1, 0, "swapper/1"))
    w.event(T0 + 600_000, switch(0, "swapper/1", 0, PROBE, "probe"))
    return w.build()


def wake_page(exit_at: int) -> bytes:
    """The other CPU: WAKER wakes the probe at +500 µs, then exits at ``exit_at``."""
    w = PageWriter(T0)
    w.event(T0 + 500_000, payload(FMTS["sched_waking"], WAKER, comm="probe", pid=PROBE,
                                  prio=120, target_cpu=PROBE_CPU))
    w.event(exit_at, payload(EXIT, WAKER, comm="waker-job", pid=WAKER, prio=120))
    return w.build()


def source(tmp_path, exit_at: int, *, alive: bool = False) -> tfs.EventSource:
    """An EventSource over those pages (no tracefs: nothing to drain), whose /proc is a
    tree under ``tmp_path`` that has the waker only when ``alive``."""
    proc = tmp_path / "proc"
    proc.mkdir()
    if alive:
        (proc / str(WAKER)).mkdir()
        (proc / str(WAKER) / "comm").write_text("waker-alive\n")
    (tmp_path / "sys").mkdir()
    src = tfs.EventSource()
    src.host = Host(tmp_path)
    src._closed = False
    src.reader = "raw"
    src._formats = {f.id: f for f in (*FMTS.values(), EXIT)}
    src._switch_ids = {FMTS["sched_switch"].id}
    src.keep_ns = src.keep_bytes = 1 << 62
    src.cpus = [PROBE_CPU]
    src.wake_reason = None
    src.timer_starts = "unsupported: test"
    ring = _CpuRing(PROBE_CPU)
    ring.pages = deque([Page(PROBE_CPU, T0, main_page(), 0)])
    wring = _CpuRing(OTHER_CPU)
    wring.pages = deque([Page(OTHER_CPU, T0, wake_page(exit_at), 0)])
    src._rings, src._wake_rings = {PROBE_CPU: ring}, {OTHER_CPU: wring}
    return src


def waker_of_the_part(src: tfs.EventSource) -> str:
    win = src.window(T0 + 50_000, T0 + 700_000, margin_ns=50_000)
    tl = timeline(win.events, PROBE_CPU, {PROBE}, T0 + 50_000, T0 + 700_000,
                  comms=win.comms, follow=True)
    parts = [p for p in tl.parts if p.waker_tid == WAKER]
    assert len(parts) == 1, [(p.kind, p.waker) for p in tl.parts]
    return parts[0].waker


def test_a_waker_that_exited_after_the_window_is_named_from_its_exit_event(tmp_path):
    src = source(tmp_path, exit_at=T0 + 5_000_000)  # gone 4.3 ms after the window's end
    assert waker_of_the_part(src) == f"waker-job[{WAKER}]"


def test_a_waker_that_exited_inside_the_window_is_named_from_its_exit_event(tmp_path):
    src = source(tmp_path, exit_at=T0 + 650_000)
    assert waker_of_the_part(src) == f"waker-job[{WAKER}]"


def test_a_living_waker_is_named_from_proc_and_a_lost_one_stays_unknown(tmp_path):
    assert waker_of_the_part(source(tmp_path, T0 + 5_000_000, alive=True)) == \
        f"waker-alive[{WAKER}]"
    (tmp_path / "b").mkdir()
    src = source(tmp_path / "b", T0 + 5_000_000)
    src._wake_rings[OTHER_CPU].pages = deque([Page(OTHER_CPU, T0, _waking_only(), 0)])
    assert waker_of_the_part(src) == f"?[{WAKER}]"  # no exit seen, no /proc: never guessed


def _waking_only() -> bytes:
    w = PageWriter(T0)
    w.event(T0 + 500_000, payload(FMTS["sched_waking"], WAKER, comm="probe", pid=PROBE,
                                  prio=120, target_cpu=PROBE_CPU))
    return w.build()


def test_a_stop_signals_sender_that_exited_is_named_from_its_exit_event(tmp_path):
    """``kill -STOP`` from another CPU, gone before the window is read: the stopped part's
    sender is its comm, not "?[pid]"."""
    src = source(tmp_path, exit_at=T0 + 5_000_000)
    w = PageWriter(T0)
    w.event(T0 + 90_000, payload(FMTS["signal_generate"], KILLER, sig=19, errno=0, code=0,
                                 comm="probe", pid=PROBE, group=1, result=0))
    w.event(T0 + 500_000, payload(FMTS["sched_waking"], WAKER, comm="probe", pid=PROBE,
                                  prio=120, target_cpu=PROBE_CPU))
    w.event(T0 + 2_000_000, payload(EXIT, KILLER, comm="kill", pid=KILLER, prio=120))
    src._wake_rings[OTHER_CPU].pages = deque([Page(OTHER_CPU, T0, w.build(), 0)])
    src._rings[PROBE_CPU].pages = deque([Page(PROBE_CPU, T0, _stopped_page(), 0)])
    win = src.window(T0 + 50_000, T0 + 700_000, margin_ns=50_000)
    tl = timeline(win.events, PROBE_CPU, {PROBE}, T0 + 50_000, T0 + 700_000,
                  comms=win.comms, follow=True)
    stopped = [p for p in tl.parts if p.signal == 19]
    assert [(p.sender_tid, p.sender) for p in stopped] == [(KILLER, f"kill[{KILLER}]")]


def _stopped_page() -> bytes:
    w = PageWriter(T0)
    w.event(T0 + 10_000, switch(0, "swapper/1", 0, PROBE, "probe"))
    w.event(T0 + 100_000, switch(PROBE, "probe", 4, 0, "swapper/1"))  # T: stopped
    w.event(T0 + 600_000, switch(0, "swapper/1", 0, PROBE, "probe"))
    return w.build()


def test_live_a_waker_on_another_cpu_that_exited_keeps_its_name(tmp_path):
    """Live (root, tracefs): a writer on another CPU from its fork on, named hft-waker from
    its exec on (run through a link of that name), wakes a reader pinned to the probe CPU
    three times and exits before the window is read: the wake instance's exit record names
    it."""
    if os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs root (tracefs) and two CPUs")
    host = Host()
    if tfs.find_tracefs(host) is None:
        pytest.skip("tracefs not mounted")
    cpu = max(os.sched_getaffinity(0))
    other = min(os.sched_getaffinity(0))
    src = tfs.EventSource.open(host, [cpu], buffer_s=2)
    if not src:
        pytest.skip(src.reason)
    reader = writer = None
    try:
        if "sched:sched_process_exit" not in src.describe()["wake"].get("events", []):
            pytest.skip(f"no exit events: {src.describe()['wake']}")
        r, w = os.pipe()
        reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os
            os.sched_setaffinity(0, {{{cpu}}})
            print("ready", flush=True)
            for _ in range(3):
                os.read({r}, 1)
            """)], pass_fds=(r,), stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "ready"
        t0 = time.monotonic_ns()
        named = tmp_path / "hft-waker"
        named.symlink_to(os.path.realpath(sys.executable))
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {other})  # (the child never runs on the probe CPU)
        try:
            writer = subprocess.Popen([str(named), "-c", textwrap.dedent(f"""
                import os, time
                for _ in range(3):
                    time.sleep(0.005)
                    os.write({w}, b"x")
                """)], pass_fds=(w,))
        finally:
            os.sched_setaffinity(0, mine)
        writer.wait(timeout=30)
        reader.wait(timeout=30)
        t1 = time.monotonic_ns()
        assert not os.path.exists(f"/proc/{writer.pid}")  # reaped: /proc cannot name it
        win = src.window(t0, t1)
        tl = timeline(win.events, cpu, {reader.pid}, t0, t1, comms=win.comms, follow=True)
        woken = [p.waker for p in tl.parts if p.waker_tid == writer.pid]
        assert woken and set(woken) == {f"hft-waker[{writer.pid}]"}, \
            [(p.kind, p.waker) for p in tl.parts]
    finally:
        for p in (reader, writer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        src.close()
