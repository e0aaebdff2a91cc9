"""A killed watch leaves no armed probe (issue #34, Build 4 and item 8): agent/trace/guardian.py
and the stale rule of agent/trace/uprobe.py.

- The guardian alone, on a tracefs-shaped directory of the test's (no root): its arguments
  are checked (only ``hftagent_<parent pid>`` and ``hftagent-<parent pid>[-wake|-calls]``); when its
  lifeline reads EOF it removes its parent's group (appending ``-:`` lines: the global file
  is never truncated) and instances, nothing else, and exits; it keeps none of its
  starter's descriptors and dies with it.
- On this kernel (root, tracefs at /sys/kernel/tracing, uprobe events; skipped otherwise):
  ``watch --attach`` SIGKILLed leaves no ``hftagent_<pid>`` uprobe nor instance (the time
  seen is printed); a process holding an instance killed with its guardian leaves them for
  the next ``cpus`` start, which removes them; a group whose pid now runs another process
  (pid reuse) is removed; a live hftagent's group (its instance or its guardian as witness)
  and another tool's group never are.

Every uprobe the tests define is on a copy of the test library that no process maps (its
own inode: never hit), except watch's own on the test's loop process; each is removed in
``finally`` whatever failed.
"""

from __future__ import annotations

import json
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

from agent.trace import guardian, uprobe
from collectors.host import Host

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
GONE_S = 10.0       # the poll's bound; the figure (2 s) is what the test prints
START_S = 60.0      # for a child to reach its state (imports on a busy 2-core machine)


def _wait(cond, timeout: float, child: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if child is not None and child.poll() is not None:
            pytest.fail(f"the child ended first ({child.returncode}): "
                        f"{child.stderr.read() if child.stderr else ''}")
        time.sleep(0.02)
    return cond()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _guardian_of(pid: int) -> int | None:
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return None
    for k in kids:
        try:
            if guardian.SCRIPT in k.cmdline():
                return k.pid
        except psutil.NoSuchProcess:
            continue
    return None


# -- the guardian alone, on a directory of the test's -----------------------------------------

def _fake_tracefs(tmp_path: Path, ppid: int) -> Path:
    t = tmp_path / "tracing"
    (t / "instances").mkdir(parents=True)
    (t / "uprobe_events").write_text(
        f"p:hftagent_{ppid}/call0 /lib/x.so:0x10\nr:hftagent_{ppid}/ret0 /lib/x.so:0x10\n"
        f"p:othertool/x /lib/x.so:0x20\np:hftagent_{ppid + 1}/call0 /lib/x.so:0x10\n")
    for inst in (f"hftagent-{ppid}", f"hftagent-{ppid}-wake", f"hftagent-{ppid}-calls",
                 f"hftagent-{ppid + 1}", "other"):
        (t / "instances" / inst / "events" / f"hftagent_{ppid}").mkdir(parents=True)
        (t / "instances" / inst / "events" / f"hftagent_{ppid}" / "enable").write_text("1")
        (t / "instances" / inst / "tracing_on").write_text("1")
    return t


def _argv(ppid: int, fd: int, tracefs: Path, *names: str) -> list[str]:
    return [sys.executable, "-I", "-S", guardian.SCRIPT, str(ppid), str(fd), str(tracefs),
            *names]


def test_on_eof_it_removes_its_parent_s_group_and_instances_and_nothing_else(tmp_path):
    me = os.getpid()
    t = _fake_tracefs(tmp_path, me)
    before = (t / "uprobe_events").read_text()
    r, w = os.pipe()
    g = subprocess.Popen(_argv(me, r, t, "--group", f"hftagent_{me}", "--instance",
                               f"hftagent-{me}", "--instance", f"hftagent-{me}-wake",
                               "--instance", f"hftagent-{me}-calls"),
                         pass_fds=(r,), stderr=subprocess.PIPE, text=True)
    os.close(r)
    try:
        time.sleep(0.2)
        assert g.poll() is None            # waits while the lifeline holds
        os.close(w)                        # as the parent's death does
        g.wait(timeout=30)
    finally:
        if g.poll() is None:
            g.kill()
            g.wait()
    # a plain directory, not tracefs: rmdir of a non-empty directory fails, and says so
    assert g.returncode == 1 and "left: hftagent-" in g.stderr.read()
    text = (t / "uprobe_events").read_text()
    assert text.startswith(before)         # appended to, never truncated
    # (a plain file keeps the definitions: each retry appends the two lines again)
    assert set(text[len(before):].splitlines()) == {f"-:hftagent_{me}/call0",
                                                    f"-:hftagent_{me}/ret0"}
    inst = t / "instances"
    # its parent's instances stopped, no other instance; its parent's group disabled
    # wherever it was enabled
    assert {n: (inst / n / "tracing_on").read_text() for n in os.listdir(inst)} == {
        f"hftagent-{me}": "0", f"hftagent-{me}-wake": "0", f"hftagent-{me}-calls": "0",
        f"hftagent-{me + 1}": "1", "other": "1"}
    for name in os.listdir(inst):
        assert (inst / name / "events" / f"hftagent_{me}" / "enable").read_text() == "0"


@pytest.mark.parametrize("parent", ["ours", "dead before the check"])
def test_an_empty_instance_is_removed(tmp_path, parent):
    """Its parent's instance goes, another's stays; a parent that died before the guardian
    checked it (the guardian named a process that is not its parent, the lifeline at EOF)
    is gone all the same."""
    if parent == "ours":
        pid = os.getpid()
    else:
        dead = subprocess.Popen(["true"])
        dead.wait()
        pid = dead.pid
    t = tmp_path / "tracing"
    (t / "instances" / f"hftagent-{pid}").mkdir(parents=True)
    (t / "instances" / f"hftagent-{pid + 1}").mkdir()
    r, w = os.pipe()
    os.close(w)
    g = subprocess.run(_argv(pid, r, t, "--instance", f"hftagent-{pid}"), pass_fds=(r,),
                       capture_output=True, text=True, timeout=30)
    assert g.returncode == 0, g.stderr
    assert sorted(os.listdir(t / "instances")) == [f"hftagent-{pid + 1}"]


@pytest.mark.parametrize("names, why", [
    (["--group", "hftagent_1"], "not one of the parent's"),
    (["--group", "othertool"], "not one of the parent's"),
    (["--instance", "hftagent-{me}-x"], "not one of the parent's"),
    (["--instance", "../../x"], "not one of the parent's"),
    (["--bogus", "hftagent_{me}"], "not one of the parent's"),
    (["--group"], "wrong number"),
])
def test_what_it_may_remove_is_checked_first(tmp_path, names, why):
    me = os.getpid()
    t = _fake_tracefs(tmp_path, me)
    before = (t / "uprobe_events").read_text()
    r, w = os.pipe()
    os.close(w)
    g = subprocess.run(_argv(me, r, t, *[n.format(me=me) for n in names]), pass_fds=(r,),
                       capture_output=True, text=True, timeout=30)
    assert g.returncode == 2 and why in g.stderr and "usage:" in g.stderr, g.stderr
    assert "Traceback" not in g.stderr
    assert (t / "uprobe_events").read_text() == before
    assert len(os.listdir(t / "instances")) == 5


@pytest.mark.parametrize("bad", ["relative", "dotdot", "no_instances", "link", "fd"])
def test_a_bad_tracefs_or_lifeline_is_a_usage_error(tmp_path, bad):
    me = os.getpid()
    t = _fake_tracefs(tmp_path, me)
    r, w = os.pipe()
    os.close(w)
    fd = r
    path = str(t)
    if bad == "relative":
        path = os.path.relpath(t)
    elif bad == "dotdot":
        path = f"{t}/../tracing"
    elif bad == "no_instances":
        path = str(tmp_path)
    elif bad == "link":
        (tmp_path / "ln").symlink_to(t)
        path = str(tmp_path / "ln")
    else:
        fd = os.open(t / "uprobe_events", os.O_RDONLY)
    try:
        g = subprocess.run(_argv(me, fd, Path(path), "--group", f"hftagent_{me}"),
                           pass_fds=(fd,), capture_output=True, text=True, timeout=30)
    finally:
        if fd != r:
            os.close(fd)
    assert g.returncode == 2 and len(g.stderr.splitlines()) == 2, g.stderr
    assert "-:" not in (t / "uprobe_events").read_text()


def test_a_named_parent_that_is_not_its_parent_is_refused(tmp_path):
    """A live process named as the parent that is not: nothing of its is touched."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        t = _fake_tracefs(tmp_path, other.pid)
        r, w = os.pipe()
        g = subprocess.run(_argv(other.pid, r, t, "--group", f"hftagent_{other.pid}"),
                           pass_fds=(r,), capture_output=True, text=True, timeout=30)
        os.close(w)
        os.close(r)
    finally:
        other.kill()
        other.wait()
    assert g.returncode == 2 and "not our parent" in g.stderr
    assert "-:" not in (t / "uprobe_events").read_text()


GUARDED = """
    import os, sys, time
    from pathlib import Path
    from agent.trace import guardian
    keep = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]   # not for the guardian
    assert guardian.guard(Path(sys.argv[1])) is None
    assert guardian.guard(Path(sys.argv[1])) is None   # once per process and tracefs
    print("ready", flush=True)
    time.sleep(120)
    """


def test_it_keeps_no_descriptor_of_its_starter_and_dies_with_it(tmp_path):
    t = _fake_tracefs(tmp_path, 0)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(GUARDED), str(t)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        kids = psutil.Process(child.pid).children()
        assert len(kids) == 1 and guardian.SCRIPT in kids[0].cmdline()
        g = kids[0]

        def fds_of() -> dict[int, str]:
            return {int(f): os.readlink(f"/proc/{g.pid}/fd/{f}")
                    for f in os.listdir(f"/proc/{g.pid}/fd")}

        def settled() -> dict[int, str] | None:  # once its start-up closed what it opened
            try:
                fds = fds_of()
            except FileNotFoundError:  # one closed between the listing and its link
                return None
            return fds if len(fds) == 4 else None
        fds = _wait(settled, START_S) or fds_of()  # (else: what it holds, in the failure)
        assert [fds[i] for i in (0, 1, 2)] == ["/dev/null"] * 3
        others = [v for k, v in fds.items() if k > 2]
        assert len(others) == 1 and others[0].startswith("pipe:"), fds  # the lifeline only
        assert g.cwd() == "/" and os.getsid(g.pid) == g.pid             # its own session
        assert g.cpu_times().user + g.cpu_times().system < 1.0
        time.sleep(0.5)
        cpu0 = sum(g.cpu_times()[:2])
        time.sleep(1.0)
        assert sum(g.cpu_times()[:2]) - cpu0 < 0.01                      # idle: blocked
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert _wait(lambda: _gone(g.pid), GONE_S), "the guardian outlived its job"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# -- on this kernel -------------------------------------------------------------------------

def _needs_uprobes() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not (TRACEFS / "instances").is_dir():
        pytest.skip("tracefs not mounted at /sys/kernel/tracing")
    why = uprobe.available(TRACEFS)
    if why:
        pytest.skip(why)


def _events() -> str:
    return (TRACEFS / "uprobe_events").read_text()


def _has_group(group: str) -> bool:
    return f":{group}/" in _events()


@pytest.fixture
def unmapped_lib(infer_lib, tmp_path) -> Path:
    """A copy of the test library no process maps: a probe on it is never hit."""
    p = tmp_path / "libunmapped.so"
    shutil.copyfile(infer_lib, p)
    return p


@pytest.fixture
def defined():
    """define(group, lib) -> the event, as a dead hftagent (or another tool) left it;
    removed after the test whatever happened."""
    made: list[str] = []

    def define(group: str, lib: Path) -> str:
        uprobe._append(TRACEFS / "uprobe_events", f"p:{group}/x {lib}:0x1000")
        made.append(group)
        return f"{group}/x"

    yield define
    for group in made:
        for inst in [TRACEFS, *(TRACEFS / "instances").iterdir()]:
            try:
                (inst / "events" / group / "enable").write_text("0")
            except OSError:
                pass
        if _has_group(group):
            try:   # a killed child's guardian may remove it between the check and this
                uprobe._append(TRACEFS / "uprobe_events", f"-:{group}/x")
            except FileNotFoundError:
                pass
    # (asked after every group was tried: one failure must not leave the others behind)
    assert not [g for g in made if _has_group(g)], _events()


def _remove_instance(name: str) -> None:
    """An instance a test's child made, if its guardian (killed with it, or removing it
    right now) did not."""
    p = TRACEFS / "instances" / name
    if not _wait(lambda: not p.exists(), 3.0):
        try:
            os.rmdir(p)
        except OSError:   # gone meanwhile (ENOENT, ENODEV)
            pass


HOLDER = """
    import sys, time
    from collectors.host import Host
    from agent.trace import EventSource
    src = EventSource.open(Host(), [int(sys.argv[1])], buffer_s=1)
    print(src.path if src else src.reason, flush=True)
    time.sleep(120)
    """


def _holder() -> tuple[subprocess.Popen, Path]:
    """A process that holds an instance through EventSource (so, a guardian of its own)."""
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), str(cpu)],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    line = child.stdout.readline().strip()
    inst = Path(line)
    if inst.name != f"hftagent-{child.pid}":
        child.kill()
        pytest.fail(f"no instance: {line} {child.communicate()[1]}")
    return child, inst


def test_a_killed_holder_s_guardian_removes_its_armed_group_and_instance(unmapped_lib,
                                                                         defined):
    _needs_uprobes()
    child, inst = _holder()
    group = f"hftagent_{child.pid}"
    try:
        defined(group, unmapped_lib)
        (inst / "events" / group / "enable").write_text("1")   # armed, as watch arms it
        g = _guardian_of(child.pid)
        assert g is not None
        t0 = time.monotonic()
        child.send_signal(signal.SIGKILL)
        child.wait()
        gone = _wait(lambda: not _has_group(group) and not inst.exists(), GONE_S)
        print(f"group and instance gone {time.monotonic() - t0:.3f} s after SIGKILL")
        assert gone, _events()
        assert _wait(lambda: _gone(g), GONE_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        _remove_instance(inst.name)


def test_watch_attach_killed_leaves_no_uprobe(infer_lib, tmp_path):
    """The issue's case: ``watch --attach`` SIGKILLed; its events are gone at once, not at
    the next start."""
    _needs_uprobes()
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    cpu = max(os.sched_getaffinity(0))
    loop = subprocess.Popen(
        [sys.executable, "-c", "import ctypes, os, sys, time\n"
         f"os.sched_setaffinity(0, {{{cpu}}})\nlib = ctypes.CDLL(sys.argv[1])\n"
         "print('ready', flush=True)\nend = time.monotonic() + 120\n"
         "while time.monotonic() < end:\n    lib.hft_infer(20000); time.sleep(0.002)\n",
         str(infer_lib)], stdout=subprocess.PIPE, text=True)
    assert loop.stdout.readline().strip() == "ready"
    w = subprocess.Popen(
        [sys.executable, "-c", "from agent.cli import main; main()", "watch", "--attach",
         str(loop.pid), "--attach-symbol", f"{infer_lib.name}:hft_infer", "--unsafe-return",
         "--duration", "120", "--no-live", "--json", "--no-history", "--trace", "on"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    group, inst = f"hftagent_{w.pid}", TRACEFS / "instances" / f"hftagent-{w.pid}"
    calls = inst.with_name(inst.name + "-calls")   # its uprobe events' own instance
    try:
        assert _wait(lambda: _has_group(group) and inst.is_dir() and calls.is_dir(), START_S,
                     child=w)
        time.sleep(0.3)
        g = _guardian_of(w.pid)
        assert g is not None
        t0 = time.monotonic()
        w.send_signal(signal.SIGKILL)
        w.wait()
        gone = _wait(lambda: not _has_group(group) and not inst.exists() and
                     not calls.exists(), GONE_S)
        print(f"watch --attach: uprobes and instance gone {time.monotonic() - t0:.3f} s "
              "after SIGKILL")
        assert gone, _events()
        assert _wait(lambda: _gone(g), GONE_S), "the guardian outlived its job"
    finally:
        for p in (w, loop):
            if p.poll() is None:
                p.kill()
                p.wait()
        for ln in _events().splitlines():
            if ln[2:].startswith(group + "/"):
                try:   # its guardian may remove it meanwhile
                    uprobe._append(TRACEFS / "uprobe_events", "-:" + ln.split()[0][2:])
                except FileNotFoundError:
                    pass
        _remove_instance(calls.name)
        _remove_instance(inst.name)


ATTEMPTS = 3   # another start on this shared box may remove a dead run's state first


def _start_after_a_killed_run(lib: Path, define, tmp_path: Path, argv: list[str],
                              notes_of, codes: tuple[int, ...] = (0,)) -> bool:
    """A run with an armed group killed with its guardian, then a start of ``hftagent
    ARGV``: True when that start removed the group and the instance and said so
    (``notes_of(completed) -> [note]``), False when another start (a concurrent test's)
    removed them first. Either way they are gone."""
    child, inst = _holder()
    group = f"hftagent_{child.pid}"
    try:
        define(group, lib)
        (inst / "events" / group / "enable").write_text("1")
        g = _guardian_of(child.pid)
        os.kill(g, signal.SIGKILL)                # killed with it (the OOM killer, kill -9 -1)
        assert _wait(lambda: _gone(g), GONE_S)
        child.send_signal(signal.SIGKILL)
        child.wait()
        time.sleep(0.5)
        left = _has_group(group) and inst.is_dir()   # nothing of ours removed them
        env = dict(os.environ, HFTAGENT_CACHE=str(tmp_path / "cache"))
        r = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", *argv],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode in codes, r.stderr
        assert not _has_group(group) and not inst.exists()
        notes = notes_of(r)
        return left and any(n.startswith(f"removed stale uprobe events {group}")
                            for n in notes) and \
            any(n.startswith(f"removed stale tracefs instance {inst.name}") for n in notes)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        _remove_instance(inst.name)


def test_a_cpus_start_removes_what_a_run_killed_with_its_guardian_left(unmapped_lib, defined,
                                                                      tmp_path):
    _needs_uprobes()
    if shutil.which("cc") is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a C compiler and two CPUs")
    argv = ["cpus", "--duration", "0.2", "--candidates", str(max(os.sched_getaffinity(0))),
            "--trace", "off", "--no-history", "--json"]
    assert any(_start_after_a_killed_run(
        unmapped_lib, defined, tmp_path, argv, codes=(0, 2),
        notes_of=lambda r: json.loads(r.stdout)["trace"].get("notes", []))
        for _ in range(ATTEMPTS)), "no cpus start removed the state (each time another " \
        "start did first?)"


def test_a_watch_start_without_events_removes_what_a_killed_run_left(unmapped_lib, defined,
                                                                      tmp_path):
    """``watch --trace off`` never opens tracefs, yet its start removes a dead hftagent's
    group and instance (issue #34 Build 4) and says so among its warnings."""
    _needs_uprobes()
    argv = ["watch", "--probe", "numpy", "--duration", "1", "--trace", "off", "--no-history",
            "--no-live"]

    def warnings(r) -> list[str]:
        return [ln.split("warning: ", 1)[1] for ln in (r.stdout + r.stderr).splitlines()
                if "warning: " in ln]
    assert any(_start_after_a_killed_run(unmapped_lib, defined, tmp_path, argv,
                                         notes_of=warnings)
               for _ in range(ATTEMPTS)), "no watch start removed the state (each time " \
        "another start did first?)"


def test_attach_check_removes_what_a_killed_run_left(unmapped_lib, defined, tmp_path):
    """``attach --check`` (as root) removes our own dead state: a line each on stderr,
    ``removed_stale`` in --json (read-only about the process: tests/test_trace_attach.py)."""
    _needs_uprobes()
    sleeper = subprocess.Popen(["sleep", "120"])
    argv = ["attach", str(sleeper.pid), "--check", "--attach-symbol", "libc.so.6:nanosleep",
            "--json"]
    said: list[list[str]] = []

    def notes(r) -> list[str]:
        doc = json.loads(r.stdout)
        lines = [ln.removeprefix("attach: ") for ln in r.stderr.splitlines()
                 if ln.startswith("attach: removed stale ")]
        said.append(doc["removed_stale"])
        assert lines == doc["removed_stale"], (lines, doc["removed_stale"])
        return doc["removed_stale"]
    try:
        assert any(_start_after_a_killed_run(unmapped_lib, defined, tmp_path, argv,
                                             notes_of=notes)
                   for _ in range(ATTEMPTS)), said
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_reused_pid_s_group_goes_a_live_hftagent_s_and_another_tool_s_stay(unmapped_lib,
                                                                             defined):
    """The stale rule, on the kernel: ``hftagent_<pid>`` of a live process that is not its
    creator (a ``sleep`` given the pid) is removed; of a live hftagent (its instance, or only
    its guardian, as witness) it stays; another tool's group stays whatever its name."""
    _needs_uprobes()
    sleeper = subprocess.Popen(["sleep", "120"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder, inst = _holder()
    guarded = subprocess.Popen([sys.executable, "-c", textwrap.dedent(GUARDED), str(TRACEFS)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert guarded.stdout.readline().strip() == "ready", guarded.stderr.read()
        reused, gone = f"hftagent_{sleeper.pid}", f"hftagent_{dead.pid}"
        live_inst, live_guard = f"hftagent_{holder.pid}", f"hftagent_{guarded.pid}"
        other, lookalike = f"othertool_{os.getpid()}", f"hftagentx_{dead.pid}"
        for group in (live_inst, live_guard, other, lookalike):
            defined(group, unmapped_lib)
        removed_by_us = []
        for _ in range(ATTEMPTS):   # (another start may remove the stale ones first)
            for group in (reused, gone):
                defined(group, unmapped_lib)
            notes = guardian.clean_stale(Host())
            assert not _has_group(reused) and not _has_group(gone), _events()
            for group in (live_inst, live_guard, other, lookalike):
                assert _has_group(group), (group, notes)
            assert not any(live_inst in n or live_guard in n or other in n for n in notes)
            removed_by_us.append(any(n.startswith(f"removed stale uprobe events {reused} ")
                                     for n in notes))
            if removed_by_us[-1]:
                break
        assert any(removed_by_us), notes
    finally:
        for p in (sleeper, holder, guarded):
            p.kill()
            p.wait()
        _remove_instance(inst.name)
