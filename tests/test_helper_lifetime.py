"""Helpers die with their parent, and a stopped cpus/watch removes its tracefs instance
(issue #30, item 8 and Build 7).

- Each native helper (hftnoise, hftirqcost, hftsampler) exits when its lifeline pipe reads
  EOF (collectors/native.py), checked alone: the test holds the write end and closes it while
  the helper's parent (the test) lives on; and at once when the parent it was told of is
  not its parent.
- A process running a helper through its caller's code is killed (SIGKILL, SIGTERM,
  SIGINT): the helper is gone within a second or two, whatever it was doing.
- ``cpus --trace on`` and ``watch --trace on`` stopped by SIGTERM or SIGINT remove their
  instance, and their helpers are gone; killed by SIGKILL, the helpers are gone and their
  guardian (agent/trace/guardian.py) removes the instance within a second; in every case
  the guardian goes too. (A guardian killed with its run leaves the instance to the next
  start: tests/test_trace_tracefs.py, tests/test_trace_guardian.py.)

The tracefs parts mount tracefs on a directory of the test's own (the same kernel tracefs,
seen elsewhere; the host's mounts are left as found) and touch only the instances their
children created. Needs root, tracefs and a C compiler where it says so.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from collectors.native import build

REPO = Path(__file__).resolve().parents[1]
GONE_S = 2.0      # a helper must be gone this soon after its parent (the "~1 s")
START_S = 60.0    # for a child to reach its scan (imports on a busy 2-core machine)

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build "
                              "the helpers")


def _cpus() -> tuple[int, int]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs (one scanned, one to send IPIs from)")
    return cpus[-1], cpus[0]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _gone_within(pid: int, seconds: float = GONE_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return _gone(pid)


def _within(cond, seconds: float = GONE_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not cond():
        time.sleep(0.02)
    return cond()


def _guardian_of(child: subprocess.Popen) -> int | None:
    """The pid of ``child``'s tracefs guardian (agent/trace/guardian.py)."""
    from agent.trace.guardian import SCRIPT
    try:
        kids = psutil.Process(child.pid).children()
    except psutil.NoSuchProcess:
        return None
    for k in kids:
        try:
            if SCRIPT in k.cmdline():
                return k.pid
        except psutil.NoSuchProcess:
            continue
    return None


def _wait_for(what, timeout: float = START_S, child: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        if child is not None and child.poll() is not None:
            pytest.fail(f"the child ended first: {child.returncode}: "
                        f"{child.stderr.read() if child.stderr else ''}")
        time.sleep(0.05)
    pytest.fail("timed out")


def _helper_of(child: subprocess.Popen, prefix: str) -> int | None:
    """The pid of ``child``'s descendant whose comm starts with ``prefix``."""
    try:
        kids = psutil.Process(child.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for k in kids:
        try:
            if k.name().startswith(prefix):
                return k.pid
        except psutil.NoSuchProcess:
            continue
    return None


# A child started from a background job of a non-interactive shell (a CI runner's `cmd &`)
# inherits SIGINT ignored, and Python keeps it ignored: the SIGINT cases would then wait for
# the child's own end (a 60 s sleep against a 60 s timeout). The child takes SIGINT as a
# terminal's Ctrl-C would reach it.
_SIGINT_DEFAULT = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def _child(code: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _SIGINT_DEFAULT + textwrap.dedent(code)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The helper cache (``$HFTAGENT_CACHE`` of the children), every helper built in it."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the helpers")
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def helpers(cache) -> dict:
    from agent.noise import scan
    from agent.trace import irqcost
    from agent.watch.sampling.native import feed
    return {"hftnoise": build(scan.SOURCE, "hftnoise", "noise recorder", cache),
            "hftirqcost": build(irqcost.SOURCE, "hftirqcost", "interrupt-cost helper", cache),
            "hftsampler": feed.build_helper(out_dir=cache)}


def _start_with_pipe(helpers, name: str, ppid: int, tmp_path: Path):
    """Start ``name`` the way its caller does but with a lifeline of the test's own: (proc,
    write end, feed or None)."""
    from agent.watch.sampling.native.feed import Feed
    cpu, sender = _cpus()
    r, w = os.pipe2(os.O_CLOEXEC)
    feed = None
    h = helpers[name]
    if name == "hftnoise":
        args = (str(cpu), str(30 * 10**9), "1000", "1000")
    elif name == "hftirqcost":
        args = (str(cpu), str(sender), "50000", "200000")  # 10 s quiet, then 10 s of IPIs
    else:
        feed = Feed(10_000_000, capacity=1 << 16, helper=h, shm_dir=str(tmp_path))
        args = (feed.path, "-")
    argv, fds = h.command(*args, lifeline=False)
    p = subprocess.Popen([*argv, str(ppid), str(r)], pass_fds=(*fds, r),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(r)
    return p, w, feed


@needs_cc
@pytest.mark.parametrize("name", ["hftnoise", "hftirqcost", "hftsampler"])
def test_a_helper_exits_when_its_lifeline_reads_eof(helpers, name, tmp_path):
    p, w, feed = _start_with_pipe(helpers, name, os.getpid(), tmp_path)
    try:
        time.sleep(0.3)
        assert p.poll() is None, p.stderr.read()  # the pipe open: it runs
        if feed is not None:
            assert feed.state() == 1  # making rounds
        os.close(w)
        w = -1
        assert p.wait(timeout=GONE_S) == 7  # "parent gone", though the test lives on
    finally:
        if w >= 0:
            os.close(w)
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
        if feed is not None:
            feed.close()


@needs_cc
@pytest.mark.parametrize("name", ["hftnoise", "hftirqcost"])
def test_a_helper_whose_named_parent_is_not_its_parent_exits_at_once(helpers, name,
                                                                     tmp_path):
    p, w, _ = _start_with_pipe(helpers, name, 1, tmp_path)
    try:
        assert p.wait(timeout=GONE_S) == 7
    finally:
        os.close(w)
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()


@needs_cc
@pytest.mark.parametrize("name", ["hftnoise", "hftirqcost"])
def test_a_lifeline_that_is_not_a_pipe_is_a_usage_error(helpers, name, tmp_path):
    cpu, sender = _cpus()
    args = (str(cpu), "1000000", "1000", "10") if name == "hftnoise" else \
        (str(cpu), str(sender), "3", "20000")
    argv, fds = helpers[name].command(*args, lifeline=False)
    r = subprocess.run([*argv, str(os.getpid()), "0"], pass_fds=fds, capture_output=True,
                       text=True, timeout=10, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "usage" in r.stderr


# The callers' own code in a child process, which the test then kills.
CALLERS = {
    "hftnoise": """
        from collectors.host import Host
        from agent.noise.scan import scan
        scan(Host(), [{cpu}], 2, 30.0, 1000)
        """,
    "hftirqcost": """
        from agent.trace.irqcost import measure
        print(measure({cpu}, {sender}, count=40000, spacing_ns=100000), flush=True)
        """,
    "hftsampler": """
        import time
        from agent.watch.sampling.native.feed import Feed
        f = Feed(10_000_000, capacity=1 << 16)
        f.start()
        time.sleep(60)
        """,
}


@needs_cc
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("name", sorted(CALLERS))
def test_a_helper_dies_with_the_process_that_started_it(helpers, cache, name, sig):
    cpu, sender = _cpus()
    env = dict(os.environ, HFTAGENT_CACHE=str(cache))
    child = _child(CALLERS[name].format(cpu=cpu, sender=sender), env)
    try:
        pid = _wait_for(lambda: _helper_of(child, name), child=child)
        time.sleep(0.1)
        assert not _gone(pid)
        child.send_signal(sig)
        if sig == signal.SIGINT:
            # Python unwinds a KeyboardInterrupt and finalises before it exits: on a busy
            # machine that alone can take seconds. The helper must go with the exit.
            child.wait(timeout=START_S)
        assert _gone_within(pid), f"{name} outlived its parent ({sig.name})"
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()


# -- tracefs: cpus and watch stopped by a signal ---------------------------------------------

def _umount(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(os.fsencode(str(path)), 0)


@pytest.fixture(scope="module")
def sysroot(tmp_path_factory):
    """A sysfs view of our own: tracefs mounted at SYSROOT/kernel/tracing, SYSROOT/devices
    the real devices tree. Skipped where tracefs cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("needs root (tracefs)")
    from agent.trace import tracefs as tfs
    root = tmp_path_factory.mktemp("sys")
    (root / "kernel" / "tracing").mkdir(parents=True)
    (root / "devices").symlink_to("/sys/devices")
    try:
        tfs._mount_tracefs(root / "kernel" / "tracing")
    except tfs._Refused as exc:
        pytest.skip(str(exc))
    try:
        yield root
    finally:
        _umount(root / "kernel" / "tracing")


def _instance(sysroot: Path, child: subprocess.Popen) -> Path:
    return sysroot / "kernel" / "tracing" / "instances" / f"hftagent-{child.pid}"


def _cleanup(inst: Path) -> None:
    """Remove an instance our child made and nothing removed (a failed test)."""
    if inst.is_dir():
        try:
            (inst / "tracing_on").write_text("0")
            os.rmdir(inst)
        except OSError:
            pass   # its guardian removed it meanwhile


CPUS_CHILD = """
    import sys
    from collectors.host import Host
    import agent.commands.cpus as c
    c.make_host = lambda *a, **k: Host(sysfs={sysroot!r})
    from agent.cli import main
    sys.argv = ["hftagent", "cpus", "--duration", "30", "--candidates", "{cpu}", "--trace",
                "on", "--no-history", "--json"]
    main()
    """


@needs_cc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_a_stopped_cpus_kills_its_recorder_and_removes_its_instance(helpers, cache, sysroot,
                                                                    sig, tmp_path):
    cpu, _ = _cpus()
    env = dict(os.environ, HFTAGENT_CACHE=str(cache),
               HFTAGENT_DB=str(tmp_path / "h.sqlite"))
    child = _child(CPUS_CHILD.format(sysroot=str(sysroot), cpu=cpu), env)
    inst = _instance(sysroot, child)
    try:
        rec = _wait_for(lambda: _helper_of(child, "hftnoise"), child=child)
        assert inst.is_dir()  # opened before the recorders start
        guard = _guardian_of(child)
        assert guard is not None  # started before the instance
        time.sleep(0.1)
        child.send_signal(sig)
        assert _gone_within(rec), f"the recorder outlived cpus ({sig.name})"
        out, err = child.communicate(timeout=30)
        assert _gone_within(guard), f"the guardian outlived cpus ({sig.name})"
        if sig == signal.SIGKILL:
            assert child.returncode == -signal.SIGKILL
            # kill -9 runs no clean-up of cpus's own: its guardian removed the instance
            assert _within(lambda: not inst.exists()), "instance left after kill -9"
            return
        assert child.returncode == 128 + sig, err
        assert err.splitlines()[-1] == f"hftagent: cpus stopped by {sig.name} during the " \
            "scan: recorders killed, nothing recorded", err
        assert "Traceback" not in err and out == ""
        assert not inst.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        _cleanup(inst)


@needs_cc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_a_stopped_watch_removes_its_instance_and_its_sampler(helpers, cache, sysroot, sig,
                                                              tmp_path):
    cpu, hk = _cpus()
    env = dict(os.environ, HFTAGENT_CACHE=str(cache),
               HFTAGENT_DB=str(tmp_path / "h.sqlite"))
    child = subprocess.Popen(
        [sys.executable, "-c", "from agent.cli import main; main()", "watch", "--sysfs",
         str(sysroot), "--probe", "numpy", "--trace", "on", "--sampler", "native",
         "--cpus", str(cpu), "--housekeeping", str(hk), "--rate", "100", "--duration",
         "120", "--no-live"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    inst = _instance(sysroot, child)
    try:
        smp = _wait_for(lambda: _helper_of(child, "hftsampler"), child=child)
        _wait_for(inst.is_dir, child=child)
        guard = _guardian_of(child)
        assert guard is not None  # started before the instance
        time.sleep(0.2)
        child.send_signal(sig)
        assert _gone_within(smp), f"the native sampler outlived watch ({sig.name})"
        out, err = child.communicate(timeout=60)
        assert _gone_within(guard), f"the guardian outlived watch ({sig.name})"
        if sig == signal.SIGKILL:
            # kill -9 runs no clean-up of watch's own: its guardian removed the instance
            assert _within(lambda: not inst.exists()), "instance left after kill -9"
            return
        assert child.returncode == 0, err  # a requested stop
        assert f"stopped by {sig.name}" in err
        assert not inst.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        _cleanup(inst)


def test_sigterm_without_a_handler_of_the_command_s_still_removes_the_instance(sysroot):
    """A process that opened an instance and handles no SIGTERM itself (a library user):
    the instance is removed, and the process still dies of SIGTERM."""
    cpu, _ = _cpus()
    child = _child(f"""
        import time
        from collectors.host import Host
        from agent.trace import EventSource
        src = EventSource.open(Host(sysfs={str(sysroot)!r}), [{cpu}], buffer_s=1)
        print(src.path if src else src.reason, flush=True)
        time.sleep(60)
        """)
    try:
        inst = Path(child.stdout.readline().strip())
        assert inst.name == f"hftagent-{child.pid}" and inst.is_dir(), inst
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=30)
        assert child.returncode == -signal.SIGTERM
        assert not inst.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        _cleanup(_instance(sysroot, child))
