"""agent.trace.tracefs on the real kernel: the private instance, its settings, the
windows it reads, and its removal (close, atexit, and after kill -9 at the next start).

Needs root and tracefs. Where /sys/kernel/tracing is not mounted, the tests mount tracefs on
a temporary directory of their own (the same tracefs, seen at another path) and unmount it
after, so the host's mounts are left as found; they skip where that is refused. They never
touch the global tracing state, and check that they did not.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from agent.trace import EventSource, Unsupported, breakdown, instance, sizing, timeline, wake
from agent.trace import tracefs as tfs
from collectors.host import Host

REPO = Path(__file__).resolve().parents[1]
CPU = 1 if (os.cpu_count() or 1) > 1 else 0
GLOBAL_FILES = ("tracing_on", "current_tracer", "trace_clock", "buffer_size_kb",
                "tracing_cpumask", "set_event")


def _umount(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(os.fsencode(str(path)), 0)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A Host whose tracefs is usable: the live one, or tracefs mounted on a temporary
    directory (sysfs view: that mount plus symlinks to the real devices tree)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (tracefs is root-only)")
    live = Host()
    try:
        if tfs.find_tracefs(live) is not None:
            yield live
            return
    except tfs._Refused as exc:
        pytest.skip(str(exc))
    sysroot = tmp_path_factory.mktemp("sys")
    (sysroot / "kernel" / "tracing").mkdir(parents=True)
    (sysroot / "devices").symlink_to("/sys/devices")
    try:
        tfs._mount_tracefs(sysroot / "kernel" / "tracing")
    except tfs._Refused as exc:
        pytest.skip(str(exc))
    try:
        yield Host(sysfs=sysroot)
    finally:
        _umount(sysroot / "kernel" / "tracing")


def _global_state(root: Path) -> dict:
    out = {name: (root / name).read_text() for name in GLOBAL_FILES}
    out["instances"] = sorted(n for n in os.listdir(root / "instances")
                              if not n.startswith(instance.PREFIX))
    return out


def _open(host, **kw) -> EventSource:
    src = EventSource.open(host, [CPU], **kw)
    assert src, getattr(src, "reason", "")
    return src


def _child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_instance_settings_and_global_state_untouched(host):
    root = tfs.find_tracefs(host)
    before = _global_state(root)
    src = _open(host, buffer_s=2)
    try:
        p = src.path
        assert p.is_dir() and p.name == f"hftagent-{os.getpid()}"
        assert "[mono]" in (p / "trace_clock").read_text()
        assert (p / "options" / "overwrite").read_text().strip() == "1"
        assert int((p / "tracing_cpumask").read_text().replace(",", ""), 16) == 1 << CPU
        assert (p / "tracing_on").read_text().strip() == "1"
        kb = int((p / "per_cpu" / f"cpu{CPU}" / "buffer_size_kb").read_text())
        assert kb == src.buffer_kb >= sizing.MIN_CPU_KB
        for c in range(os.cpu_count() or 1):
            if c != CPU and (p / "per_cpu" / f"cpu{c}").is_dir():
                assert int((p / "per_cpu" / f"cpu{c}" / "buffer_size_kb").read_text()) < 64
        assert "KiB per probe CPU" in src.sizing
        for ev in ("sched:sched_switch", "irq:irq_handler_entry", "irq:softirq_entry",
                   "irq_vectors:local_timer_entry"):
            if (p / "events" / ev.replace(":", "/")).is_dir():
                assert ev in src.events
                assert (p / "events" / ev.replace(":", "/") / "enable").read_text().strip() == "1"
        assert not any(e.startswith("irq_vectors:vector_") for e in src.events)
        assert _global_state(root) == before
    finally:
        src.close()
    assert not src.path.exists()
    assert _global_state(root) == before
    src.close()  # idempotent


def test_window_shows_a_pinned_child_with_monotonic_timestamps(host):
    src = _open(host, buffer_s=2)
    try:
        child = _child(f"""
            import os, time
            os.sched_setaffinity(0, {{{CPU}}})
            t = []
            for _ in range(20):
                t.append(time.monotonic_ns())
                time.sleep(0.002)
            t.append(time.monotonic_ns())
            print(*t)
            """)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        stamps = list(map(int, out.split()))
        first, last = stamps[0], stamps[-1]
        win = src.window(first, last)
        assert win.complete, win.reason
        outs = [e.ts_ns for e in win.events if e.name == "sched_switch" and
                e.fields["prev_pid"] == child.pid and e.fields["prev_state"].startswith("S")]
        # mono is CLOCK_MONOTONIC: each sleep's switch-out lies between the child's own
        # clock reads before and after that sleep
        for a, b in zip(stamps, stamps[1:]):
            assert any(a < ts < b for ts in outs), (a, b)
        assert win.read_ns > 0
        tl = timeline(win.events, CPU, {child.pid}, first, last, comms=win.comms)
        assert tl.blocks >= 19 and tl.probe_run_ns > 0
        assert sum(tl.totals.values()) == last - first
        assert breakdown(tl, 1_000_000)[-1][0] == "unexplained"
        # a second window over the same stretch still finds it (kept pages)
        again = src.window(first, last)
        assert sum(1 for e in again.events if e.name == "sched_switch" and
                   e.fields["prev_pid"] == child.pid) >= 19
    finally:
        src.close()


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a CPU besides the probe's")
def test_wake_instance_records_who_woke_and_who_stopped_the_probe_from_another_cpu(host):
    """A reader pinned to the probe CPU blocks on a pipe that a writer on another CPU fills:
    its sched_waking fires on the writer's CPU, outside the main instance's cpumask, and
    the wake instance has it (filtered to wake-ups of the probe CPU's tasks); a SIGSTOP and
    SIGCONT sent from here name this process as the sender and the waker."""
    other = next(c for c in sorted(os.sched_getaffinity(0)) if c != CPU)
    src = _open(host, buffer_s=2)
    reader = writer = None
    try:
        wd = src.describe()["wake"]
        assert wd.get("events"), wd
        assert "sched:sched_waking" in wd["events"] or "sched:sched_wakeup" in wd["events"]
        assert wd["filters"]["signal:signal_generate"] == wake.SIGNAL_FILTER
        assert int((src.wake_path / "tracing_cpumask").read_text().replace(",", ""), 16) \
            & (1 << other)
        r, w = os.pipe()
        reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, sys, time
            os.sched_setaffinity(0, {{{CPU}}})
            print("ready", flush=True)
            for _ in range(3):
                os.read({r}, 1)
            print(time.monotonic_ns(), flush=True)
            """)], pass_fds=(r,), stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "ready"
        t0 = time.monotonic_ns()
        writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import os, time
            os.sched_setaffinity(0, {{{other}}})
            for _ in range(3):
                time.sleep(0.005)
                os.write({w}, b"x")
            """)], pass_fds=(w,))
        writer.wait(timeout=30)
        t1 = int(reader.stdout.readline())
        os.kill(reader.pid, signal.SIGSTOP)
        time.sleep(0.005)
        os.kill(reader.pid, signal.SIGCONT)
        reader.wait(timeout=30)
        t2 = time.monotonic_ns()
        win = src.window(t0, t2)
        assert win.wake_complete, win.wake_reason
        wakes = [e for e in win.events if e.name in ("sched_waking", "sched_wakeup")
                 and e.fields["pid"] == reader.pid and e.cpu == other]
        assert any(e.pid == writer.pid for e in wakes), wakes
        assert all(e.fields["irq_ctx"] == "" for e in wakes if e.pid == writer.pid)
        sigs = [e for e in win.events if e.name == "signal_generate"
                and e.fields["pid"] == reader.pid]
        assert [e.fields["sig"] for e in sigs][:2] == [19, 18] and sigs[0].pid == os.getpid()
        tl = timeline(win.events, CPU, {reader.pid}, t0, t1, comms=win.comms, follow=True)
        woken = [p for p in tl.parts if p.waker_tid == writer.pid]
        assert woken and all(p.kind == "blocked" and p.state == "S" for p in woken)
        assert all(p.waker_cpu == other for p in woken)
    finally:
        for p in (reader, writer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        src.close()
    assert not src.wake_path.exists()


def test_the_timers_of_sleeps_on_the_probe_cpu_are_recorded_with_their_expiry(host):
    """hrtimer_start of hrtimer_wakeup (a sleep's timer) on the probe CPU, enabled in the
    wake instance once kallsyms gives the callback's address: the expiry the sleeper asked
    for, on the trace clock."""
    src = _open(host, buffer_s=2)
    try:
        src._symbols(0)  # (loaded: as after ~0.3 s of a run)
        now = time.monotonic_ns()
        src.window(now - 1_000_000, now)
        if src.timer_starts.startswith("unsupported"):
            pytest.skip(src.timer_starts)
        assert src.timer_starts == "on", src.timer_starts
        assert src.describe()["wake"]["filters"]["timer:hrtimer_start"].startswith(
            "function == 0x")
        child = _child(f"""
            import os, time
            os.sched_setaffinity(0, {{{CPU}}})
            t = []
            for _ in range(3):
                t.append(time.monotonic_ns())
                time.sleep(0.005)
            print(*t)
            """)
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        stamps = list(map(int, out.split()))
        win = src.window(stamps[0] - 1_000_000, time.monotonic_ns())
        starts = [e for e in win.events if e.name == "hrtimer_start" and e.pid == child.pid]
        assert len(starts) >= 3, [e for e in win.events if e.name == "hrtimer_start"]
        for a, e in zip(stamps, starts):
            # the expiry asked for: 5 ms after the clock read before the sleep
            assert 4_000_000 < e.fields["softexpires"] - a < 7_000_000, (a, e)
            assert e.fields["function"] == "hrtimer_wakeup"
    finally:
        src.close()


def test_direct_reads_on_the_probe_cpu_are_io_waits_ended_by_the_block_completion(host):
    """A child pinned to the probe CPU reads a file with O_DIRECT (each read a block
    request, the page cache bypassed): each wait is D, after its own block_rq_issue, ended
    by the completion's interrupt (io_wait). Reads only; skipped where the file system
    refuses O_DIRECT (tmpfs)."""
    big = max((p for p in (REPO / ".venv").rglob("*.so") if p.is_file()),
              key=lambda p: p.stat().st_size, default=None)
    if big is None:
        pytest.skip("no file to read")
    src = _open(host, buffer_s=2)
    try:
        child = _child(f"""
            import mmap, os, random, sys, time
            os.sched_setaffinity(0, {{{CPU}}})
            try:
                fd = os.open({str(big)!r}, os.O_RDONLY | os.O_DIRECT)
                buf = mmap.mmap(-1, 4096)
                os.preadv(fd, [buf], 0)
            except OSError as exc:
                print("skip", exc)
                sys.exit(0)
            blocks = os.fstat(fd).st_size // 4096
            t0 = time.monotonic_ns()
            for _ in range(20):
                os.preadv(fd, [buf], random.randrange(blocks) * 4096)
            print(t0, time.monotonic_ns())
            """)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        if out.startswith("skip"):
            pytest.skip(out.strip())
        t0, t1 = map(int, out.split())
        win = src.window(t0, t1)
        assert win.complete, win.reason
        tl = timeline(win.events, CPU, {child.pid}, t0, t1, comms=win.comms, follow=True)
        io = [p for p in tl.parts if p.kind == "io_wait"]
        assert len(io) >= 15, [(p.kind, p.state, p.waker) for p in tl.parts]
        assert all(p.state == "D" and p.waker_tid is None for p in io)
        assert any(p.io for p in io)  # (its own request seen on the CPU; kblockd may issue)
        assert tl.state_ns["not_runnable"] > 0
    finally:
        src.close()


def test_text_reader_reads_the_same_kind_of_window(host):
    src = _open(host, buffer_s=1, reader="text")
    try:
        assert src.reader == "text"
        t0 = time.monotonic_ns()
        child = _child(f"""
            import os, time
            os.sched_setaffinity(0, {{{CPU}}})
            for _ in range(10):
                time.sleep(0.001)
            """)
        child.communicate(timeout=30)
        t1 = time.monotonic_ns()
        win = src.window(t0, t1)
        assert any(e.name == "sched_switch" and e.fields["prev_pid"] == child.pid
                   for e in win.events)
        assert all(e.ts_ns % 1000 == 0 for e in win.events)  # µs text timestamps
        # after_ns: the same events up to the end, then one per CPU at most past it
        mid = (t0 + t1) // 2
        w2 = src.window(t0, mid, after_ns=t1 - mid)
        assert [e for e in w2.events if e.ts_ns <= mid] == src.window(t0, mid).events
        assert len([e for e in w2.events if e.ts_ns > mid]) <= len(src.cpus)
    finally:
        src.close()


def test_window_before_the_instance_started_is_incomplete(host):
    t_before = time.monotonic_ns() - 1_000_000_000
    src = _open(host, buffer_s=1)
    try:
        win = src.window(t_before, t_before + 1_000_000)
        assert not win.complete and "before the instance started" in win.reason
        future = src.window(time.monotonic_ns(), time.monotonic_ns() + 10**10)
        assert not future.complete and "after the read" in future.reason
    finally:
        src.close()


def test_storm_is_counted_as_lost_and_memory_stays_bounded(host):
    src = _open(host, buffer_s=0.01)  # the minimum ring: 512 KiB, a few ms of this storm
    try:
        start = time.monotonic_ns()
        child = _child(f"""
            import os, time
            os.sched_setaffinity(0, {{{CPU}}})
            r1, w1 = os.pipe(); r2, w2 = os.pipe()
            if os.fork() == 0:
                os.close(w1)  # else it never sees EOF on r1
                while os.read(r1, 1):
                    os.write(w2, b"x")
                os._exit(0)
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                os.write(w1, b"x"); os.read(r2, 1)
            os.close(w1)
            """)
        try:
            child.communicate(timeout=60)
        finally:
            child.kill()
        win = src.window(start, start + 1_000_000)
        # the window says why it is incomplete: the kernel overwrote events (lost), or the
        # kept pages were evicted to stay within keep_bytes (on a loaded machine the drain
        # can keep up with the kernel and the memory bound is what cuts the window)
        assert not win.complete, win.reason
        assert "lost" in win.reason or "no longer kept" in win.reason, win.reason
        assert src.lost() > 0 or "no longer kept" in win.reason
        for ring in src._rings.values():
            assert ring.kept_bytes <= src.keep_bytes
        # windows near the end are still whole
        now = time.monotonic_ns()
        assert src.window(now - 2_000_000, now - 1_000_000).complete
    finally:
        src.close()


def test_second_open_in_one_process_is_refused_with_one_line(host):
    src = _open(host, buffer_s=1)
    try:
        again = EventSource.open(host, [CPU])
        assert isinstance(again, Unsupported) and not again
        assert again.reason.startswith("unsupported:") and "already in use" in again.reason
        assert src.path.is_dir()  # the refusal did not remove the first one
    finally:
        src.close()


def test_name_taken_by_a_live_process_is_refused(host, monkeypatch):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.1)
        root = tfs.find_tracefs(host)
        taken = root / "instances" / f"{instance.PREFIX}{sleeper.pid}"
        os.mkdir(taken)
        try:
            monkeypatch.setattr(tfs, "_instance_name", lambda: taken.name)
            got = EventSource.open(host, [CPU])
            assert not got and "name taken" in got.reason
            assert taken.is_dir()  # a live process's instance is left alone
        finally:
            os.rmdir(taken)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_instance_of_a_sigkilled_watch_is_removed_at_the_next_start(host):
    child = _child(f"""
        import sys, time
        from collectors.host import Host
        from agent.trace import EventSource
        host = Host(sysfs={str(host.sysfs)!r})
        src = EventSource.open(host, [{CPU}], buffer_s=1)
        src._open_calls()  # (watch --attach's: made by add_uprobes)
        print(src.path if src else src.reason, flush=True)
        time.sleep(60)
        """)
    path = Path(child.stdout.readline().strip())
    assert path.name == f"hftagent-{child.pid}", child.stderr.read() if child.poll() else path
    assert path.is_dir()
    wake = path.with_name(path.name + instance.WAKE_SUFFIX)
    assert wake.is_dir()  # its wake instance (every CPU's wake-ups of the probe CPUs)
    calls = path.with_name(path.name + instance.CALLS_SUFFIX)
    assert calls.is_dir()  # its calls instance (the attached process's uprobe events)
    from agent.trace.guardian import SCRIPT  # its guardian killed with it (kill -9 -1, OOM)
    for g in [k for k in psutil.Process(child.pid).children() if SCRIPT in k.cmdline()]:
        g.kill()   # a zombie until its parent goes: not waited for
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert path.is_dir() and wake.is_dir() and calls.is_dir()  # kill -9 ran no clean-up
    src = _open(host, buffer_s=1)
    try:
        assert not path.exists() and not wake.exists() and not calls.exists()
        for p in (path, wake, calls):
            assert any(f"removed stale tracefs instance {p.name}" in n for n in src.notes)
    finally:
        src.close()


def test_instance_removed_at_normal_exit_without_close(host):
    child = _child(f"""
        from collectors.host import Host
        from agent.trace import EventSource
        src = EventSource.open(Host(sysfs={str(host.sysfs)!r}), [{CPU}], buffer_s=1)
        print(src.path if src else src.reason, flush=True)
        """)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    path = Path(out.strip())
    assert path.name.startswith(instance.PREFIX) and not path.exists()


def test_a_forked_child_does_not_remove_its_parents_instance(host):
    src = _open(host, buffer_s=1)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            src.close()
            os._exit(0)
        os.waitpid(pid, 0)
        assert src.path.is_dir()
    finally:
        src.close()


def test_no_permission_is_one_line(host):
    child = _child(f"""
        import os
        from collectors.host import Host
        from agent.trace import EventSource
        host = Host(sysfs={str(host.sysfs)!r})
        os.setgid(65534); os.setuid(65534)
        got = EventSource.open(host, [{CPU}])
        print(got.reason if not got else "opened")
        """)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert out.startswith("unsupported:") and "root" in out, out


def test_refit_resizes_from_the_measured_rate(host):
    src = _open(host, buffer_s=1, rate_hint=10_000_000)  # far too big: bounded to the max
    try:
        assert src.buffer_kb >= sizing.MAX_CPU_KB - 8 and "bounded" in src.sizing
        time.sleep(0.3)
        line = src.refit()
        assert line is not None and "measured" in line
        assert src.buffer_kb < sizing.MAX_CPU_KB // 2
        assert src.rate()[CPU] >= 0
    finally:
        src.close()


def test_grow_enlarges_the_rings_within_the_bound(host):
    src = _open(host, buffer_s=1, rate_hint=1_000)  # the minimum
    try:
        kb = src.buffer_kb
        line = src.grow()
        assert line is not None and "grown ×4 after" in line
        got = (src.path / "per_cpu" / f"cpu{CPU}" / "buffer_size_kb").read_text().split()[0]
        # what the kernel made of it (it rounds up to whole pages)
        assert src.buffer_kb == int(got) and 4 * kb <= int(got) <= 4 * kb + 8
        assert src.sizing == line
        for _ in range(12):  # up to the bound, never past it
            if src.grow() is None:
                break
            assert src.buffer_kb <= sizing.MAX_CPU_KB + 8
        assert src.grow() is None and src.buffer_kb >= sizing.MAX_CPU_KB // 2
        assert src.keep_bytes <= sizing.KEEP_MAX_BYTES
    finally:
        src.close()
    assert src.grow() is None  # closed


def test_bad_cpus_and_reader_are_one_line(host):
    got = EventSource.open(host, [4096])
    assert not got and "not online" in got.reason
    assert not EventSource.open(host, [])
    got = EventSource.open(host, [CPU], reader="nope")
    assert not got and "reader" in got.reason
    assert not list((tfs.find_tracefs(host) / "instances").glob(f"hftagent-{os.getpid()}"))


# --- without a live tracefs ------------------------------------------------------------------

def test_not_mounted_is_unsupported_and_mount_only_on_a_live_root(tmp_path):
    sysfs = tmp_path / "sys"
    (sysfs / "kernel" / "tracing").mkdir(parents=True)
    h = Host(root=tmp_path, sysfs=sysfs, procfs=tmp_path)
    got = EventSource.open(h, [0])
    assert not got and got.reason.startswith("unsupported: tracefs not mounted at")
    assert "--trace mount" in got.reason
    got = EventSource.open(h, [0], mount=True)
    assert not got and "non-live root" in got.reason


def test_cpumask_and_sizing():
    assert instance.cpumask_hex([1]) == "00000002"
    assert instance.cpumask_hex([0, 33]) == "00000002,00000001"
    kb, why = sizing.size_ring_kb(10, 1)
    assert kb == 10 * sizing.ASSUMED_RATE_EPS * sizing.ASSUMED_EVENT_BYTES // 1024 + 1
    assert "10 s at 20,000 events/s" in why
    kb, why = sizing.size_ring_kb(10, 64, rate_eps=1e6)
    assert kb == sizing.MAX_TOTAL_KB // 64 and "bounded" in why
    assert sizing.size_ring_kb(0.001, 1)[0] == sizing.MIN_CPU_KB


def test_the_calls_instance_holds_only_the_uprobe_events_and_is_never_refitted(host):
    """watch --attach's uprobe events get an instance of their own (agent/trace/calls.py),
    made at the first add_uprobes: the probe CPUs' mask, small rings, nothing enabled but
    what is added; the kernel-event instance's refit may then shrink its rings (no call is
    recorded there), the calls rings keep their size; close removes it."""
    src = _open(host, buffer_s=1, rate_hint=10_000_000)
    try:
        path = src._open_calls()
        assert path.name == src.name + instance.CALLS_SUFFIX and path.is_dir()
        assert src._open_calls() == path                     # made once
        assert int((path / "tracing_cpumask").read_text(), 16) == 1 << CPU
        assert (path / "trace_clock").read_text().find("[mono]") >= 0
        assert (path / "tracing_on").read_text().strip() == "1"
        enabled = [d for d, _, files in os.walk(path / "events") if "enable" in files and
                   d != str(path / "events") and (Path(d) / "enable").read_text()[:1] == "1"]
        assert enabled == []                                 # nothing but what is added
        calls_kb = src.calls_kb
        assert calls_kb >= 1024 and src.describe()["calls"]["buffer_kb_per_cpu"] == calls_kb
        src._uprobe_ids[1] = False   # (as add_uprobes records an enabled uprobe event)
        big = src.buffer_kb
        time.sleep(0.3)
        line = src.refit()
        assert line is not None and "measured" in line and src.buffer_kb < big // 2
        got = (path / "per_cpu" / f"cpu{CPU}" / "buffer_size_kb").read_text().split()[0]
        assert int(got) == calls_kb
        assert src._calls_pages() == [] and src.calls_lost() == 0
    finally:
        src.close()
    assert not path.exists()
