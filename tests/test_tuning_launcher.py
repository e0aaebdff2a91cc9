"""`hftagent run`: the launched child is checked through its own /proc/<pid>/status and environ
(reading the real /proc of a process we started; nothing is written to the host)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.host import Host
from tests.treecopy import copy_fixture, make_synthetic
from tuning.launcher import LaunchError, build_launch, command_line, parse_sched

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]


def _launch(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(CLI + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_exec(pid: int, comm: str, timeout: float = 20.0) -> dict[str, str]:
    """Wait until the launcher has exec'd into ``comm`` and its new environment is readable;
    return its /proc status fields. (The name changes first: execve sets it in
    begin_new_exec, and the new stack's environment bounds only later, in the ELF loader's
    create_elf_tables — /proc/PID/environ reads empty in between, which a busy CPU made
    visible: fs/exec.c, fs/binfmt_elf.c, Linux 6.x.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except FileNotFoundError:
            break
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("Name", "").strip() == comm and env:
            return {k: v.strip() for k, v in fields.items()}
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never became {comm}")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in raw.decode().split("\0") if "=" in e)


def test_child_is_pinned_with_thread_env():
    cpu = max(os.sched_getaffinity(0))
    p = _launch(["run", "--cpus", str(cpu), "--intra", "3", "--", "sleep", "30"])
    try:
        st = _wait_exec(p.pid, "sleep")
        assert st["Cpus_allowed_list"] == str(cpu)
        env = _environ(p.pid)
        assert env["TF_NUM_INTRAOP_THREADS"] == "3"
        assert env["TF_NUM_INTEROP_THREADS"] == "1"
        assert env["OMP_NUM_THREADS"] == "3"
    finally:
        p.kill()
        p.wait()


def test_default_threads_follow_cpu_count():
    cpus = sorted(os.sched_getaffinity(0))
    spec = f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
    p = _launch(["run", "--cpus", spec, "--", "sleep", "30"])
    try:
        st = _wait_exec(p.pid, "sleep")
        assert st["Cpus_allowed_list"] == spec
        assert _environ(p.pid)["TF_NUM_INTRAOP_THREADS"] == str(len(cpus))
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root or CAP_SYS_NICE")
def test_sched_fifo_is_set_before_exec():
    p = _launch(["run", "--cpus", str(max(os.sched_getaffinity(0))), "--sched", "fifo:3", "--",
                 "sleep", "30"])
    try:
        _wait_exec(p.pid, "sleep")
        assert os.sched_getscheduler(p.pid) == os.SCHED_FIFO
        assert os.sched_getparam(p.pid).sched_priority == 3
    finally:
        p.kill()
        p.wait()


def test_arguments_after_dashdash_reach_the_command_untouched():
    p = _launch(["run", "--cpus", "0", "--", sys.executable, "-c",
                 "import sys; print(sys.argv[1:])", "--cpus", "x; rm -rf /", "$HOME"])
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert out.decode().strip() == "['--cpus', 'x; rm -rf /', '$HOME']"


@pytest.mark.parametrize("args,msg", [
    (["--cpus", "99", "--", "true"], "past the last CPU"),
    (["--mem-node", "0", "--", "true"], "numactl"),
    (["--sched", "fifo:0", "--", "true"], "priority must be"),
    (["--sched", "idle", "--", "true"], "expected fifo:PRIO"),
    (["--cpus", "0", "--", "no-such-command-hft"], "command not found"),
    (["--cpus", "0"], "no command given"),
    (["--cpus", "0", "--inter", "-1", "--", "true"], "set_inter_op_parallelism_threads"),
    (["--cpus", "0", "--inter", "0", "--", "true"], "--inter must be between 1 and"),
])
def test_bad_input_one_line_exit_1(args, msg):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    if "--mem-node" in args:
        env["PATH"] = "/nonexistent"  # numactl absent
        args = [args[0], args[1], args[2], "/bin/true"]
    r = subprocess.run(CLI + ["run", *args], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], r.stderr
    assert lines[0].startswith("hftagent: error: ")


def test_run_on_a_tree_needs_dry_run(tmp_path):
    """The tree's CPUs say nothing about this host: a real run with --root is refused."""
    root = make_synthetic(tmp_path / "syn")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for opts in (["--root", str(root)], ["--sysfs", str(root / "sys")]):
        r = subprocess.run(CLI + ["run", *opts, "--cpus", "1", "--", "true"], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "use them with --dry-run" in lines[0], r.stderr
    r = subprocess.run(CLI + ["run", "--root", str(root), "--cpus", "2-3", "--dry-run", "--",
                              "python3", "serve.py", "a b"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "cpus 2-3 (--cpus)" in r.stdout and "TF_NUM_INTEROP_THREADS=1" in r.stdout
    assert "exec: python3 serve.py 'a b'" in r.stdout
    assert "same as: hftagent run --cpus 2-3 --intra 2 --inter 1 -- python3 serve.py 'a b'" \
        in r.stdout


def test_numactl_argv_when_mem_node(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    (root / "sys/devices/system/node/node0").mkdir(parents=True)
    (root / "sys/devices/system/node/node0/cpulist").write_text("0-3\n")
    launch = build_launch(Host(root), ["python3", "serve.py"], cpus="2-3", mem_node=0,
                          which=lambda n: f"/usr/bin/{n}")
    assert launch.argv == ["/usr/bin/numactl", "--physcpubind=2-3", "--membind=0", "--",
                           "python3", "serve.py"]
    with pytest.raises(LaunchError, match="no such NUMA node"):
        build_launch(Host(root), ["x"], cpus="2", mem_node=3, which=lambda n: f"/usr/bin/{n}")
    assert launch.command_line(["python3", "serve.py"]) == (
        "hftagent run --cpus 2-3 --intra 2 --inter 1 --mem-node 0 -- python3 serve.py")


def test_command_line_is_quoted_and_refuses_caller_thread():
    assert command_line(["python3", "-c", "print('x y')"], cpus=[3, 1, 2], intra=3, inter=2,
                        sched="fifo:5") == ("hftagent run --cpus 1-3 --intra 3 --inter 2 "
                                            "--sched fifo:5 -- python3 -c 'print('\"'\"'x y'"
                                            "\"'\"')'")
    assert command_line(["x"]) == "hftagent run -- x"
    for bad in (-1, 0):
        with pytest.raises(LaunchError, match="tf.config.threading"):
            command_line(["x"], cpus=[1], intra=1, inter=bad)


def _plan(host, **kw):
    return build_launch(host, ["true"], which=lambda _: "/bin/true", **kw)


def test_default_cpus_follow_the_one_rule(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    host = Host(root)
    d = _plan(host)
    assert d.cpus == [1, 2, 3] and d.cpus_source.startswith("default: all online CPUs but")
    (root / "sys/devices/system/cpu/isolated").write_text("2-3\n")
    assert _plan(host).cpus == [2, 3] and _plan(host).cpus_source == "isolated CPUs"


def test_a_process_bound_to_a_gpu_defaults_to_its_local_cpus(tmp_path):
    root = copy_fixture("gpu-h200", tmp_path / "h200")
    host = Host(root)
    assert _plan(host, gpu=0).cpus == list(range(1, 16))
    assert "GPU 0" in _plan(host, gpu=0).cpus_source
    env = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PATH": "/bin"}
    assert "GPU 0" in _plan(host, env=env).cpus_source
    env.pop("CUDA_DEVICE_ORDER")      # CUDA's own order need not be nvidia-smi's: not used
    assert "GPU" not in _plan(host, env=env).cpus_source
    with pytest.raises(LaunchError, match="--gpu 1"):
        _plan(host, gpu=1)


def test_keep_awake_on_cpus_others_may_use_is_warned(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    host = Host(root)
    spin = tmp_path / "spin"
    d = build_launch(host, ["true"], cpus="3", keep_awake=True, which=lambda _: "/bin/true",
                     build_spinner=lambda: spin)
    assert any("isolate the CPUs first" in n for n in d.notes)
    (root / "sys/devices/system/cpu/isolated").write_text("3\n")
    d = build_launch(host, ["true"], cpus="3", keep_awake=True, which=lambda _: "/bin/true",
                     build_spinner=lambda: spin)
    assert not any("isolate the CPUs first" in n for n in d.notes)


def test_parse_sched():
    assert parse_sched("fifo:10") == (os.SCHED_FIFO, 10)
    assert parse_sched("rr:1") == (os.SCHED_RR, 1)
    with pytest.raises(LaunchError):
        parse_sched("fifo:100")
