"""`hftagent run` levers: --keep-awake spinners live exactly as long as the command (normal
exit, SIGKILL, failed exec), --pm-qos holds /dev/cpu_dma_latency through an inherited
descriptor, --sched rr:N. Real runs of commands this test starts; the PM QoS requests are
held for a second at most. Nothing here writes /proc or /sys."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors.host import Host
from collectors.native import command
from collectors.wakeup import keepawake_spinners
from tuning.launcher import (
    LaunchError,
    build_launch,
    command_line,
    hold_pm_qos,
    start_spinners,
    stop_spinners,
)

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
runner = CliRunner()
SPIN_RE = re.compile(r"keep-awake spinner pid (\d+) on CPU (\d+)")


def _need(root: bool = False) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    if root and (os.geteuid() != 0 or not os.path.exists("/dev/cpu_dma_latency")):
        pytest.skip("needs root and /dev/cpu_dma_latency")
    return cpus[-1]


def _launch(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(CLI + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has exited)."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return st[st.rfind(")") + 2] not in "ZX"


# The spinner exits within a millisecond of its command on an idle CPU, but it is SCHED_IDLE:
# with a busy task on its CPU (a loaded test machine) it runs, and so exits, only when that
# task lets it. Generous, so the tests hold under load; the exit itself is what they check.
GONE_S = 10.0


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.01)
    return False


def _spin(exe, *args: str, fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run the built spinner (through its cache directory, collectors/native.py) with args."""
    argv, helper_fds = command(exe, *args, lifeline=False)
    return subprocess.run(argv, pass_fds=(*fds, *helper_fds), capture_output=True, text=True,
                          timeout=10)


def _effective_latency() -> int:
    fd = os.open("/dev/cpu_dma_latency", os.O_RDONLY)
    try:
        return struct.unpack("=i", os.read(fd, 4))[0]
    finally:
        os.close(fd)


def _wait_line(p: subprocess.Popen, pattern: re.Pattern, timeout: float = 30.0):
    """Read stderr lines until one matches."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen.append(line)
        m = pattern.search(line)
        if m:
            return m
    raise AssertionError(f"no {pattern.pattern!r} in {seen}")


def test_keep_awake_and_pm_qos_live_exactly_as_long_as_the_command():
    cpu = _need(root=True)
    before = _effective_latency()
    p = _launch(["run", "--keep-awake", "--pm-qos", "0", "--cpus", str(cpu), "--",
                 "sh", "-c", "ls -l /proc/$$/fd; sleep 1"])
    try:
        m = _wait_line(p, SPIN_RE)
        spinner = int(m.group(1))
        assert int(m.group(2)) == cpu
        _wait_line(p, re.compile(r"PM QoS 0 µs held"))
        assert os.sched_getscheduler(spinner) == os.SCHED_IDLE
        assert os.sched_getaffinity(spinner) == {cpu}
        assert keepawake_spinners(Host()).get(cpu) == [spinner]
        # not the command's child: a `wait` in the command never waits for it
        ppid = int(Path(f"/proc/{spinner}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid != p.pid
        time.sleep(0.3)
        assert _effective_latency() == 0  # held while the command runs
        out, _err = p.communicate(timeout=30)
        assert p.returncode == 0
        assert "/dev/cpu_dma_latency" in out  # the descriptor crossed exec
        assert _gone_within(spinner, GONE_S)
        assert _effective_latency() == before  # the request ended with the command
    finally:
        p.kill()
        p.wait()


def test_spinner_dies_when_the_command_is_killed():
    cpu = _need()
    p = _launch(["run", "--keep-awake", "--cpus", str(cpu), "--", "sleep", "30"])
    try:
        spinner = int(_wait_line(p, SPIN_RE).group(1))
        time.sleep(0.2)
        assert _alive(spinner)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        assert _gone_within(spinner, GONE_S)
    finally:
        p.kill()
        p.wait()


def test_a_failed_exec_kills_the_spinners_and_says_so_in_one_line(tmp_path):
    cpu = _need()
    bad = tmp_path / "notabinary"
    bad.write_bytes(b"\x00\x01\x02")
    bad.chmod(0o755)
    p = _launch(["run", "--keep-awake", "--cpus", str(cpu), "--", str(bad)])
    _out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    spinner = int(SPIN_RE.search(err).group(1))
    errors = [ln for ln in err.splitlines() if ln.startswith("hftagent: error:")]
    assert errors == [f"hftagent: error: cannot start {str(bad)!r}: Exec format error"]
    assert _gone_within(spinner, GONE_S)


def test_the_spinner_watches_its_pidfd_not_a_pid():
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    child = subprocess.Popen(["sleep", "30"])
    fd = os.pidfd_open(child.pid)
    try:
        r = _spin(exe, str(cpu), str(fd), fds=(fd,))
        assert r.returncode == 0, r.stderr
        spinner = int(r.stdout)
        assert _alive(spinner)
        child.kill()
        child.wait()
        assert _gone_within(spinner, GONE_S)
    finally:
        os.close(fd)
        child.kill()
        child.wait()


def test_spinner_refuses_a_dead_process_and_bad_arguments():
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    child = subprocess.Popen(["true"])
    fd = os.pidfd_open(child.pid)
    child.wait()
    try:
        r = _spin(exe, str(cpu), str(fd), fds=(fd,))
        assert r.returncode == 1 and "watched process" in r.stderr
    finally:
        os.close(fd)
    r = _spin(exe, "x", "3")
    assert r.returncode == 2 and "usage" in r.stderr
    r = _spin(exe, "1000", "0")
    assert r.returncode == 1 and "sched_setaffinity" in r.stderr


def test_start_and_stop_spinners_from_python():
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    sp = start_spinners(exe, [cpu])
    try:
        assert len(sp) == 1 and _alive(sp[0].pid)
    finally:
        stop_spinners(sp)
    assert _gone_within(sp[0].pid, GONE_S)
    with pytest.raises(LaunchError, match="did not start"):
        start_spinners(exe, [1000])


def test_pm_qos_refuses_what_is_not_the_device(tmp_path):
    f = tmp_path / "plain"
    f.write_text("")
    with pytest.raises(LaunchError, match="not a character device"):
        hold_pm_qos(f, 0)
    with pytest.raises(LaunchError, match="no .* \\(a kernel without CPU latency PM QoS\\)"):
        hold_pm_qos(tmp_path / "absent", 0)
    link = tmp_path / "link"
    link.symlink_to("/dev/null")
    with pytest.raises(LaunchError, match="cannot open"):
        hold_pm_qos(link, 0)


@pytest.mark.parametrize("args,msg", [
    (["--pm-qos", "-1"], "bad --pm-qos -1: expected 0..2147483647 µs"),
    (["--pm-qos", str(2**31)], "bad --pm-qos 2147483648"),
    (["--sched", "idle:1"], "expected fifo:PRIO or rr:PRIO"),
])
def test_bad_lever_input_is_one_line(args, msg):
    res = runner.invoke(get_app(), ["run", *args, "--dry-run", "--", "true"])
    assert res.exit_code == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hftagent: error: ") and msg in lines[0]


def test_sched_rr_is_applied():
    cpu = _need()
    if os.geteuid() != 0:
        pytest.skip("SCHED_RR needs root")
    p = _launch(["run", "--sched", "rr:3", "--cpus", str(cpu), "--", "sleep", "5"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep":
                break
            time.sleep(0.02)
        assert os.sched_getscheduler(p.pid) == os.SCHED_RR
        assert os.sched_getparam(p.pid).sched_priority == 3
    finally:
        p.kill()
        p.wait()


def test_dry_run_reports_the_levers_and_the_same_line():
    cpu = _need()
    res = runner.invoke(get_app(), ["run", "--keep-awake", "--pm-qos", "5", "--sched", "rr:2",
                                    "--cpus", str(cpu), "--dry-run", "--json", "--", "true", "y"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["keep_awake"] == str(cpu) and d["pm_qos_us"] == 5
    assert d["sched"] == {"policy": "rr", "priority": 2}
    assert d["command"] == command_line(["true", "y"], cpus=[cpu], intra=1, inter=1,
                                        sched="rr:2", keep_awake=True, pm_qos=5)
    assert "--keep-awake --pm-qos 5" in d["command"]


def test_help_documents_rr_and_the_levers():
    res = runner.invoke(get_app(), ["run", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for word in ("rr:PRIO", "--keep-awake", "--pm-qos", "SCHED_IDLE", "isolated cpuset"):
        assert word in res.stdout, word


def test_the_busy_loop_spins_without_pause_and_is_named_in_the_report():
    """--keep-awake-loop busy: the spinner runs its no-pause loop (argv), and run says so."""
    cpu = _need()
    p = _launch(["run", "--keep-awake", "--keep-awake-loop", "busy", "--cpus", str(cpu), "--",
                 "sleep", "30"])
    try:
        m = _wait_line(p, SPIN_RE)
        spinner = int(m.group(1))
        argv = Path(f"/proc/{spinner}/cmdline").read_bytes().split(b"\0")
        assert argv[-2:] == [b"busy", b""], argv
        assert "busy loop" in m.string, m.string
        assert os.sched_getscheduler(spinner) == os.SCHED_IDLE
    finally:
        p.kill()
        p.wait()
    assert _gone_within(spinner, GONE_S)


def test_keep_awake_loop_is_checked_in_one_line():
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    r = _spin(exe, str(cpu), "0", "spin")
    assert r.returncode == 2 and "usage" in r.stderr
    with pytest.raises(LaunchError, match="expected pause or busy"):
        build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True, keep_awake_loop="spin")
    with pytest.raises(LaunchError, match="needs --keep-awake"):
        build_launch(Host(), ["true"], cpus=str(cpu), keep_awake_loop="busy")
    assert command_line(["x"], cpus=[cpu], keep_awake=True, keep_awake_loop="busy").endswith(
        "--keep-awake --keep-awake-loop busy -- x")
    assert "--keep-awake-loop" not in command_line(["x"], cpus=[cpu], keep_awake=True)
    r = subprocess.run(CLI + ["run", "--keep-awake-loop", "spin", "--keep-awake", "--cpus",
                              str(cpu), "--", "true"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 1
    assert r.stderr.strip() == "hftagent: error: bad --keep-awake-loop 'spin': expected pause or busy"


# -- the guard: a spinner that the kernel does not treat as idle stops itself (keepawake.c) ------
def _stat_line(pid: int, comm: str, state: str, ppid: int, cpu: int) -> str:
    """A /proc/PID/stat line with the fields the guard reads: state (3), ppid (4), processor
    (39)."""
    fields = [state, str(ppid)] + ["0"] * 34 + [str(cpu)] + ["0"] * 13
    return f"{pid} ({comm}) {' '.join(fields)}\n"


def _fake_proc(tmp_path: Path, cpu: int, state: str) -> tuple[Path, Path]:
    """A procfs tree with a command (pid 4242, one thread) and its child (pid 4243, whose
    thread 4244 is in ``state`` on ``cpu``); the command's fd/2 is a plain file."""
    proc = tmp_path / "proc"
    for pid, ppid, tids in ((4242, 1, {4242: "S"}), (4243, 4242, {4243: "S", 4244: state}),
                            (77, 1, {77: "R"})):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(_stat_line(pid, "x", "S", ppid, cpu))
        for tid, st in tids.items():
            (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
            (proc / str(pid) / "task" / str(tid) / "stat").write_text(
                _stat_line(tid, "worker" if tid == 4244 else "x", st, ppid, cpu))
    (proc / "4242" / "fd").mkdir()
    err = proc / "4242" / "fd" / "2"
    err.write_text("")
    return proc, err


def _guarded_spinner(exe: Path, proc: Path, cpu: int, window: int, err: Path):
    """A spinner guarding pid 4242 of the tree ``proc`` and watching a real ``sleep`` (its
    stderr ``err``) through a pidfd."""
    with err.open("w") as f:
        child = subprocess.Popen(["sleep", "60"], stderr=f)
    fd = os.pidfd_open(child.pid)
    r = _spin(exe, "-p", str(proc), "-w", "4242", "-n", str(window), str(cpu), str(fd),
              fds=(fd,))
    assert r.returncode == 0, r.stderr
    return child, fd, int(r.stdout)


def _reported(*files: Path) -> list[str]:
    """The line goes to the command's own stderr where the kernel lends its descriptor
    (pidfd_getfd: a regular file), else to the tree's fd/2, opened anew."""
    return [ln for f in files for ln in f.read_text().splitlines()]


def test_the_guard_stops_a_spinner_the_command_waits_behind(tmp_path):
    """A descendant's thread runnable on the spinner's CPU in every sample: the spinner says so
    in one line on the command's stderr and exits while the command still runs."""
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    proc, err = _fake_proc(tmp_path, cpu, "R")
    own = tmp_path / "stderr"
    child, fd, spinner = _guarded_spinner(exe, proc, cpu, 5, own)
    try:
        assert _gone_within(spinner, 30.0)
        assert child.poll() is None
        lines = _reported(err, own)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"hftagent run: keep-awake spinner on CPU {cpu} stopped: "
                                   f"thread 4244 (worker) of the command was waiting for CPU "
                                   f"{cpu} in 5 of 5 samples"), lines[0]
    finally:
        os.close(fd)
        child.kill()
        child.wait()


def test_the_guard_leaves_a_spinner_alone_when_the_command_never_waits(tmp_path):
    """The same tree with the thread asleep (and an unrelated runnable task): it spins on."""
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    proc, err = _fake_proc(tmp_path, cpu, "S")
    own = tmp_path / "stderr"
    child, fd, spinner = _guarded_spinner(exe, proc, cpu, 2, own)
    try:
        time.sleep(1.0)
        assert _alive(spinner)
        assert _reported(err, own) == []
        child.kill()
        child.wait()
        assert _gone_within(spinner, GONE_S)
    finally:
        os.close(fd)
        child.kill()
        child.wait()


def test_the_guard_needs_both_its_options():
    cpu = _need()
    exe = build_launch(Host(), ["true"], cpus=str(cpu), keep_awake=True).spinner
    for bad in (["-p", "/nonexistent-proc"], ["-w", "5"], ["-n", "0", "-p", "x", "-w", "5"]):
        r = _spin(exe, *bad, str(cpu), "0")
        assert r.returncode == 2 and r.stderr.startswith("usage:"), (bad, r.stderr)


def test_the_spinner_shares_the_command_s_session_and_ignores_its_terminal_signals():
    """No setsid: with autogroups a new session is a new task group, against which SCHED_IDLE
    means nothing (keepawake.c). SIGINT from the terminal goes to the command, which decides."""
    cpu = _need()
    p = _launch(["run", "--keep-awake", "--cpus", str(cpu), "--", "sleep", "30"])
    try:
        spinner = int(_wait_line(p, SPIN_RE).group(1))
        assert os.getsid(spinner) == os.getsid(p.pid)
        os.kill(spinner, signal.SIGINT)
        time.sleep(0.3)
        assert _alive(spinner)
    finally:
        p.kill()
        p.wait()
    assert _gone_within(spinner, GONE_S)
