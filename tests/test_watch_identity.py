"""`watch --attach-name/--attach-unit/--attach-cgroup` (issue #38 Build 1): which processes
are the service (agent/watch/latency/procs.py, on fixture /proc and /sys trees), bad input as
one line, and a service killed and restarted while watch runs (agent/watch/latency/
identity.py): its calls after the restart are timed, and 20 restarts leave no uprobe event and
no extra file descriptor of watch behind.

The live tests need root and tracefs with uprobe events (skipped otherwise); every process
they attach to or kill is one they started (a loop calling a C function of a library the
tests build, its command line carrying a marker of this test run)."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from agent.client import FIELDS
from agent.watch.latency import procs
from agent.watch.latency.procs import Identity, IdentityError, Matcher
from collectors.host import Host
from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
F = {name: i for i, name in enumerate(FIELDS)}


# -- fixture trees ---------------------------------------------------------------------------
def _proc(root: Path, pid: int, comm: str, argv: list[str], ppid: int = 1,
          started_s: float = 0.0) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    ticks = int(started_s * os.sysconf("SC_CLK_TCK"))   # field 22: starttime
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 0 {' '.join(['0'] * 12)}"
                            f" {ticks} 0 0\n")


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "uptime").write_text("1000.00 1900.00\n")
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    # watch (999) run by sudo (998): both name the service on their command lines
    _proc(tmp_path, 998, "sudo", ["sudo", "hftagent", "watch", "--attach-name", "serve.py"])
    _proc(tmp_path, 999, "hftagent", ["hftagent", "watch", "--attach-name", "serve.py"], 998)
    return tmp_path


def test_a_name_matches_the_comm_or_a_regex_on_the_command_line(tmp_path):
    root = _tree(tmp_path)
    _proc(root, 100, "svc", ["/usr/bin/svc", "--port", "8080"])
    _proc(root, 101, "python3", ["python3", "serve.py", "--model", "m.tflite"])
    _proc(root, 102, "kworker/0:1", [])                   # a kernel thread: no cmdline
    _proc(root, 103, "python3", ["python3", "other.py"])
    host = Host(root=root)
    assert Matcher(host, procs.identity(host, "serve.py", None, None), own=999).poll() == {101}
    assert Matcher(host, procs.identity(host, "svc", None, None), own=999).poll() == {100}
    # comm is 15 bytes (TASK_COMM_LEN): a longer name matches its truncation
    _proc(root, 104, "inference-serve", ["/opt/bin/inference-server-x"])
    m = Matcher(host, Identity("name", "inference-server"), own=999)
    assert 104 in m.poll()
    # a regex on the whole command line, arguments joined by spaces
    assert Matcher(host, Identity("name", r"serve\.py --model \S+\.tflite"),
                   own=999).poll() == {101}
    # watch itself and its ancestors never match, though their command lines do
    assert not {998, 999} & Matcher(host, Identity("name", "hftagent"), own=999).poll()


def test_a_new_process_is_read_again_until_it_execs_and_a_gone_one_is_forgotten(tmp_path):
    root = _tree(tmp_path)
    host = Host(root=root)
    now = [0.0]
    m = Matcher(host, Identity("name", "serve"), own=999, clock=lambda: now[0])
    assert m.poll() == set()
    _proc(root, 200, "bash", ["bash", "run.sh"])         # forked, not yet exec'd
    now[0] = 0.2
    assert m.poll() == set()
    _proc(root, 200, "python3", ["python3", "serve.py"])  # exec'd: seen on the next poll
    now[0] = 0.4
    assert m.poll() == {200}
    _proc(root, 201, "bash", ["bash", "x.sh"])
    now[0] = 0.6
    assert m.poll() == {200}
    now[0] = 0.6 + procs.RECHECK_S + 0.1                   # no longer young: not read again
    m.poll()
    _proc(root, 201, "python3", ["python3", "serve.py"])
    now[0] += 0.2
    assert m.poll() == {200}
    import shutil
    shutil.rmtree(root / "proc" / "200")
    now[0] += 0.2
    assert m.poll() == set() and 200 not in m._verdict
    # at the first poll, a process started within RECHECK_S (by /proc/uptime) is young too
    _proc(root, 300, "bash", ["bash"], started_s=999.0)
    _proc(root, 301, "bash", ["bash"], started_s=10.0)
    m = Matcher(host, Identity("name", "serve"), own=999, clock=lambda: now[0])
    assert m.poll() == {201}
    _proc(root, 300, "python3", ["python3", "serve.py"])
    _proc(root, 301, "python3", ["python3", "serve.py"])
    now[0] += 0.2
    assert m.poll() == {201, 300}


def test_proc_is_listed_again_only_after_a_fork_and_young_pids_are_read_between(tmp_path):
    root = _tree(tmp_path)
    loadavg = root / "proc" / "loadavg"
    loadavg.write_text("0.00 0.00 0.00 1/100 500\n")  # the namespace's last pid: 500
    host = Host(root=root)
    listed = []
    pids = host.pids
    host.pids = lambda: listed.append(1) or pids()
    now = [0.0]
    m = Matcher(host, Identity("name", "serve"), own=999, clock=lambda: now[0])
    assert m.poll() == set() and len(listed) == 1
    now[0] = 0.2
    assert m.poll() == set() and len(listed) == 1          # no fork since: no listing
    _proc(root, 501, "bash", ["bash", "run.sh"])            # forked: the last pid moves
    loadavg.write_text("0.00 0.00 0.00 1/101 501\n")
    now[0] = 0.4
    assert m.poll() == set() and len(listed) == 2 and 501 in m._young
    _proc(root, 501, "python3", ["python3", "serve.py"])   # exec'd: no new pid, still read
    now[0] = 0.6
    assert m.poll() == {501} and len(listed) == 2
    read = []
    matches = m.matches
    m.matches = lambda pid: read.append(pid) or matches(pid)
    now[0] = 0.8
    assert m.poll() == {501} and read == [] and len(listed) == 2  # nothing new: nothing read
    m.matches = matches
    # where /proc/loadavg says nothing, every poll lists (the fixture trees above)
    loadavg.write_text("garbage\n")
    m.poll()
    m.poll()
    assert len(listed) == 4


def test_one_process_rows_take_its_pid_as_the_per_thread_lookup_does():
    from types import SimpleNamespace

    from agent.watch.latency.identity import ServiceReader
    rows = np.zeros((4, len(FIELDS)), dtype=np.int64)
    rows[:, F["tid"]] = [70, 71, 70, 72]
    rows[:, F["start_ns"]] = [1000, 2000, 3000, 4000]

    def reader(pids, leaving):
        return SimpleNamespace(pids=pids, leaving=leaving, pid=7, per_pid={7: 5},
                               first_ns={}, tid_pid={70: 7, 71: 7, 72: 7})
    fast, full = reader([7], set()), reader([7, 8], set())  # 8: a process with no call
    a, b = rows.copy(), rows.copy()
    ServiceReader._rows_made(fast, a)
    ServiceReader._rows_made(full, b)
    assert (a == b).all() and (a[:, F["pid"]] == 7).all()
    assert fast.per_pid == full.per_pid == {7: 9} and fast.first_ns == full.first_ns == {7: 1000}


def test_a_unit_without_systemd_is_its_cgroup_and_with_systemd_its_main_pid(tmp_path):
    root = _tree(tmp_path)
    cg = root / "sys" / "fs" / "cgroup" / "unified" / "system.slice" / "infer.service"
    cg.mkdir(parents=True)
    (cg / "cgroup.procs").write_text("300\n301\n")
    host = Host(root=root)
    ident = procs.identity(host, None, "infer", None)
    assert ident.unit == "infer.service" and ident.label == "infer.service"
    assert Matcher(host, ident, own=999).poll() == {300, 301}
    # systemd runs (sd_booted): the main pid, asked again only when cgroup.procs changes
    (root / "run" / "systemd" / "system").mkdir(parents=True)
    asked: list[str] = []

    def systemctl(unit: str) -> dict[str, str]:
        asked.append(unit)
        return {"LoadState": "loaded", "MainPID": "301"}
    ident = procs.identity(host, None, "infer.service", None, systemctl=systemctl)
    m = Matcher(host, ident, own=999, systemctl=systemctl)
    assert m.poll() == {301} and m.poll() == {301}
    assert len(asked) == 2                                  # identity() and the first poll
    (cg / "cgroup.procs").write_text("302\n")
    asked.clear()
    assert m.poll() == {301} and asked == ["infer.service"]
    with pytest.raises(IdentityError, match="no such unit"):
        procs.identity(host, None, "nosuch", None,
                       systemctl=lambda u: {"LoadState": "not-found", "MainPID": "0"})


def test_a_cgroup_is_its_processes_and_its_descendants_and_stays_under_the_root(tmp_path):
    root = _tree(tmp_path)
    base = root / "sys" / "fs" / "cgroup"
    (base / "svc" / "worker").mkdir(parents=True)
    (base / "svc" / "cgroup.procs").write_text("400\n")
    (base / "svc" / "worker" / "cgroup.procs").write_text("401\n402\n")
    (base / "link").symlink_to(base / "svc")
    host = Host(root=root)
    for given in ("/sys/fs/cgroup/svc", "svc", "/sys/fs/cgroup/svc/"):
        ident = procs.identity(host, None, None, given)
        assert ident.cgroup in ("svc", "svc/") or ident.cgroup.rstrip("/") == "svc"
        assert Matcher(host, ident, own=999).poll() == {400, 401, 402}
    for bad, said in (("/etc", "under /sys/fs/cgroup"), ("svc/../..", "'..' is refused"),
                      ("/sys/fs/cgroup/../../etc", "under /sys/fs/cgroup"),
                      ("link", "symbolic link"), ("nosuch", "no cgroup directory")):
        with pytest.raises(IdentityError, match=said):
            procs.identity(host, None, None, bad)


def test_bad_names_and_two_identities_are_refused(tmp_path):
    host = Host(root=_tree(tmp_path))
    for args, said in ((("", None, None), "--attach-name is empty"),
                       (("  ", None, None), "--attach-name is empty"),
                       (("(", None, None), "not a regular expression"),
                       ((None, "a b", None), "not a unit name"),
                       ((None, "-x", None), "not a unit name"),
                       ((None, "nosuch", None), "no such unit"),
                       (("x", "y", None), "name two services")):
        with pytest.raises(IdentityError, match=said):
            procs.identity(host, *args)


@pytest.mark.parametrize("args, said", [
    (["--attach-name", ""], "--attach-name is empty"),
    (["--attach-name", "(["], "not a regular expression"),
    (["--attach-unit", "hftagent-no-such-unit-38"], "no such unit"),
    (["--attach-cgroup", "/etc"], "must be under /sys/fs/cgroup"),
    (["--attach-name", "x", "--attach", "1"], "name two latency sources"),
    (["--attach-name", "x", "--unsafe-return"], "--unsafe-return is for --attach-symbol"),
])
def test_cli_bad_input_is_one_line(args, said):
    r = subprocess.run([*CLI, "watch", *args, "--duration", "1", "--no-history"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in r.stderr, r.stderr


# -- a live service, killed and restarted -----------------------------------------------------
LOOP = r"""
import ctypes, os, signal, sys, time
os.sched_setaffinity(0, {int(sys.argv[2])})
lib = ctypes.CDLL(sys.argv[1])
mapped = time.monotonic_ns()          # the runtime is mapped from here on
n = after = 0
def done(*_):
    print(f"{mapped} {n} {after}", flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
while True:
    late = time.monotonic_ns() - mapped >= 1_000_000_000
    lib.hft_infer(50000)
    n += 1
    after += late
    time.sleep(0.002)
"""



def _cpu() -> int:
    return max(os.sched_getaffinity(0))


def _start(lib: Path, marker: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(lib), str(_cpu()), marker],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _stop(p: subprocess.Popen) -> tuple[int, int, int]:
    """SIGTERM: the loop's own count — (mapped at ns, calls, calls after its first second)."""
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    mapped, n, after = map(int, out.split())
    return mapped, n, after


def _timed(run, pid: int) -> bool:
    p = getattr(run, "procs", {}).get(pid)
    return p is not None and p.state == "timed"


def _exited(run, pid: int) -> bool:
    return run.procs[pid].exited_at is not None


def _said(lines: list[str], *parts: str) -> str | None:
    return next((ln for ln in list(lines) if all(x in ln for x in parts)), None)


def _until(cond, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_a_restarted_service_is_timed_after_its_first_second(infer_lib, tmp_path):
    """Killed and started again twice while watch --attach-name runs: each process's calls
    after its first second (by its own count) are timed ≥ 90 %; each exit is said, the run
    goes on and ends with exit 0, its history kept."""
    needs_uprobes()
    from agent.watch.config import WatchConfig
    from agent.watch.latency.identity import Service
    from agent.watch.session import WatchSession
    marker = f"hftident-{secrets.token_hex(4)}"
    first = _start(infer_lib, marker)
    src = Service(ident=Identity("name", marker), symbol=f"{infer_lib.name}:hft_infer",
                  unsafe_return=True, found=(first.pid,))
    cfg = WatchConfig(source=src, probe_cpus=[_cpu()],
                      housekeeping_cpus=[c for c in os.sched_getaffinity(0) if c != _cpu()],
                      duration_s=60, trace="on", spike_log=str(tmp_path / "spikes.jsonl"))
    s = WatchSession(cfg, on_phase=lambda m: None)
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(s.run()))
    counts, pids = [], []
    try:
        t.start()
        cur = first
        for i in range(3):
            assert _until(partial(_timed, s.source, cur.pid)), (i, s.warnings)
            time.sleep(2.5)
            pids.append(cur.pid)
            counts.append(_stop(cur))
            assert _until(partial(_exited, s.source, cur.pid)), (i, s.warnings)
            if i < 2:
                cur = _start(infer_lib, marker)
        s.request_stop("test")
        t.join(30)
    finally:
        if t.is_alive():
            s.request_stop("test")
            t.join(30)
    assert rc == [0], s.warnings
    rows = s.lat.last(20000)
    for pid, (mapped, n, after) in zip(pids, counts):
        mine = rows[(rows[:, F["pid"]] == pid) &
                    (rows[:, F["start_ns"]] >= mapped + 1_000_000_000)]
        assert after > 300 and len(mine) >= 0.9 * after, (pid, len(mine), n, after)
    st = {p["pid"]: p for p in s.source.processes()}
    assert [st[p]["state"] for p in pids] == ["exited"] * 3
    summ = s.summary()
    assert summ["samples"] == sum(st[p]["calls"] for p in pids)
    assert any("not countable" in w for w in summ["warnings"]), summ["warnings"]
    assert "sched" not in s.unavailable, s.unavailable   # its task scans run without a pid
    assert not [ln for ln in (TRACEFS / "uprobe_events").read_text().splitlines()
                if f"hftagent_{os.getpid()}/" in ln]


def _fds(pid: int, looks: int = 5) -> int:
    """The fewest open descriptors of ``pid`` over a few looks 50 ms apart (a read in flight
    is not growth)."""
    n = []
    for _ in range(looks):
        n.append(len(os.listdir(f"/proc/{pid}/fd")))
        time.sleep(0.05)
    return min(n)


def test_20_restarts_leave_no_uprobe_and_no_descriptor_behind(infer_lib, tmp_path):
    """hftagent watch --attach-name as a person runs it, the service SIGKILLed and started
    again 20 times, every other time on another copy of its library (another inode: the
    probe set is removed and armed again): each start is timed and each exit said; watch's
    descriptors do not grow, and after Ctrl-C no uprobe event or instance of it is left."""
    needs_uprobes()
    import shutil
    marker = f"hftident-{secrets.token_hex(4)}"
    libs = [infer_lib, tmp_path / "libhftinfer2.so"]
    shutil.copyfile(infer_lib, libs[1])
    w = subprocess.Popen([*CLI, "watch", "--attach-name", marker, "--attach-symbol",
                          "libhftinfer:hft_infer", "--unsafe-return", "--duration", "300",
                          "--no-history", "--no-live", "--trace", "on"],
                         stderr=subprocess.PIPE, stdout=(tmp_path / "out").open("w"),
                         text=True, cwd=REPO)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(w.stderr.readline, "")),
                              daemon=True)
    reader.start()
    fds = []
    try:
        for i in range(20):
            p = _start(libs[i % 2], marker)
            assert _until(partial(_said, lines, f"timing pid {p.pid} ")), lines
            time.sleep(0.3)
            p.kill()
            p.wait()
            assert _until(partial(_said, lines, f"pid {p.pid} (", ") exited")), lines
            gone = _said(lines, f"pid {p.pid} (", ") exited")
            assert int(re.search(r"after (\d+) call", gone).group(1)) > 0, gone
            if i in (2, 19):  # none running: its thread's files go at a sampler round
                fds.append(_fds(w.pid, looks=60))  # (after its exit: 3 s of looks)
        w.send_signal(signal.SIGINT)
        assert w.wait(timeout=60) == 0, lines
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()
    reader.join(5)
    assert fds[1] <= fds[0], fds
    out = (tmp_path / "out").read_text()   # a set armed on each copy in turn
    assert "uprobe(s) in libhftinfer.so" in out and "uprobe(s) in libhftinfer2.so" in out
    assert "not removed" not in out, out
    assert not [ln for ln in (TRACEFS / "uprobe_events").read_text().splitlines()
                if f"hftagent_{w.pid}/" in ln]
    assert not any(n.startswith(f"hftagent-{w.pid}")
                   for n in os.listdir(TRACEFS / "instances"))


def test_the_exporter_labels_the_service_by_its_name_never_a_pid(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from agent.export.metrics import MAX_SERVICE_LABEL, WatchMetrics
    from agent.export.server import make_registry, render
    from agent.watch.latency.identity import Service
    from agent.watch.latency.probe import BuiltinProbe
    src = Service(ident=Identity("unit", "infer", unit="infer.service"), found=(4242,))
    assert src.exporter_service == "infer.service" and BuiltinProbe("tf").exporter_service == ""

    def info(m: WatchMetrics) -> dict:
        body, _ = render(make_registry(m))
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        return fams["hftagent_probe_info"].samples[0].labels
    assert info(WatchMetrics(source="attach", service=src.exporter_service)) == \
        {"source": "attach", "variant": "", "service": "infer.service"}
    assert info(WatchMetrics(source="probe", variant="xla")) == \
        {"source": "probe", "variant": "xla"}                 # no service: no label
    odd = WatchMetrics(source="attach", service="serve\\.py\n" + "x" * 500)
    assert odd.service.startswith("serve\\.py?") and len(odd.service) == MAX_SERVICE_LABEL
    assert info(odd)["service"] == odd.service


def test_options_choose_the_service_and_hand_it_the_attach_options(tmp_path):
    from agent.watch import latency
    from agent.watch.latency.base import Given
    from agent.watch.latency.identity import Service
    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                           f"hftident-{secrets.token_hex(4)}"])
    assert _until(lambda: me.args[-1].encode() in Path(f"/proc/{me.pid}/cmdline").read_bytes())
    try:
        src = latency.choose(Host(), Given(attach_name=me.args[-1],
                                           attach_symbol="libc.so.6:nanosleep",
                                           unsafe_return=True))
    finally:
        me.kill()
        me.wait()
    assert isinstance(src, Service) and src.found == (me.pid,)
    assert (src.symbol, src.runtime, src.unsafe_return, src.said) == \
        ("libc.so.6:nanosleep", "auto", True, f"--attach-name {me.args[-1]}")


def _service(tmp_path: Path, marker: str, n: int) -> subprocess.Popen:
    """bench/service.py: a LiteRT loop (dense-16.tflite) at 300 calls/s for 3 s that records
    every call in its agent.client ring (its own count; the ring's path carries the marker)."""
    p = subprocess.Popen([sys.executable, str(REPO / "bench" / "service.py"), "--cpu",
                          str(_cpu()), "--rate", "300", "--seconds", "3", "--warmup", "1",
                          "--model", str(REPO / "bench" / "models" / "dense-16.tflite"),
                          "--ring", str(tmp_path / f"{marker}-{n}.ring")],
                         stdout=subprocess.PIPE, text=True, cwd=REPO)
    return p


def test_a_litert_service_restarted_is_timed_and_its_missed_calls_counted(tmp_path):
    """A LiteRT loop that keeps its own count (an agent.client ring) ends and starts again
    while watch --attach-name runs: the new process is timed from within its first second
    (≥ 90 % of its calls after it), and the calls it made before are counted by its ring."""
    needs_uprobes()
    pytest.importorskip("ai_edge_litert")
    import json

    from agent.watch.config import WatchConfig
    from agent.watch.latency.identity import Service
    from agent.watch.session import WatchSession
    marker = f"hftident-{secrets.token_hex(4)}"
    src = Service(ident=Identity("name", marker))
    cfg = WatchConfig(source=src, probe_cpus=[_cpu()],
                      housekeeping_cpus=[c for c in os.sched_getaffinity(0) if c != _cpu()],
                      duration_s=60, trace="on")
    s = WatchSession(cfg, on_phase=lambda m: None)
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(s.run()))
    done = []
    try:
        t.start()
        assert _until(lambda: s.started_ns > 0)
        for n in range(2):
            p = _service(tmp_path, marker, n)
            out, _ = p.communicate(timeout=120)
            done.append((p.pid, json.loads(out.strip().splitlines()[-1])))
        assert _until(partial(_exited, s.source, done[-1][0]))
    finally:
        s.request_stop("test")
        t.join(30)
    assert rc == [0], s.warnings
    st = {d["pid"]: d for d in s.source.processes()}
    for pid, end in done:
        d = st[pid]
        assert d["own_calls"] == end["calls"], d
        assert isinstance(d["missed"], int) and 0 <= d["missed"] <= 300, d   # ≤ 1 s of calls
        # every recorded call after the first second is timed (≥ 90 %; the runtime's calls
        # it does not record, its warm-up, are timed too)
        assert d["calls"] >= 0.9 * (end["calls"] - 300), d
    assert any("calls missed between a start and its timing" in w for w in s.summary()["warnings"])


def test_two_processes_of_one_service_share_one_probe_set(infer_lib, tmp_path):
    """Two processes of the service at once, mapping the same library: one set of uprobe
    events (uprobes are per inode), both timed, each call given to its own process."""
    needs_uprobes()
    from agent.watch.config import WatchConfig
    from agent.watch.latency.identity import Service
    from agent.watch.session import WatchSession
    marker = f"hftident-{secrets.token_hex(4)}"
    loops = [_start(infer_lib, marker), _start(infer_lib, marker)]
    try:
        src = Service(ident=Identity("name", marker), symbol=f"{infer_lib.name}:hft_infer",
                      unsafe_return=True, found=tuple(p.pid for p in loops))
        cfg = WatchConfig(source=src, probe_cpus=[_cpu()],
                          housekeeping_cpus=[c for c in os.sched_getaffinity(0)
                                             if c != _cpu()], duration_s=3, trace="on")
        s = WatchSession(cfg, on_phase=lambda m: None)
        assert s.run() == 0, s.warnings
        rows = s.lat.last(20000)
    finally:
        counts = [_stop(p) for p in loops]
    st = {d["pid"]: d for d in s.source.processes()}
    for p, (_, n, _) in zip(loops, counts):
        mine = int((rows[:, F["pid"]] == p.pid).sum())
        assert st[p.pid]["state"] == "timed" and mine == st[p.pid]["calls"] > 100, st
        assert mine <= n
    assert sum(1 for w in s.warnings if w.startswith("attached: ")) == 1, s.warnings


def test_a_unit_is_asked_about_only_when_its_cgroup_changes(tmp_path):
    """systemd runs: a unit in another slice is found by the ControlGroup systemd names; a
    stopped unit (no cgroup) costs no systemctl call until its cgroup reappears; a unit
    whose cgroup was never found is asked about once a second."""
    root = _tree(tmp_path)
    (root / "run" / "systemd" / "system").mkdir(parents=True)
    cg = root / "sys" / "fs" / "cgroup" / "app.slice" / "infer.service"
    state = {"LoadState": "loaded", "MainPID": "0", "ControlGroup": ""}
    asked: list[float] = []
    now = [0.0]

    def systemctl(unit: str) -> dict[str, str]:
        asked.append(now[0])
        return dict(state)
    host = Host(root=root)
    m = Matcher(host, procs.identity(host, None, "infer", None, systemctl=systemctl),
                own=999, systemctl=systemctl, clock=lambda: now[0])
    asked.clear()
    for _ in range(5):                     # never seen a cgroup: once a second
        now[0] += 0.2
        assert m.poll() == set()
    assert len(asked) == 1
    cg.mkdir(parents=True)
    (cg / "cgroup.procs").write_text("500\n")
    state.update(MainPID="500", ControlGroup="/app.slice/infer.service")
    now[0] += 1.0
    assert m.poll() == {500}
    asked.clear()
    for _ in range(10):                     # unchanged: not asked
        now[0] += 0.2
        assert m.poll() == {500}
    (cg / "cgroup.procs").unlink()
    cg.rmdir()                              # stopped
    state.update(MainPID="0", ControlGroup="")
    for _ in range(10):
        now[0] += 0.2
        m.poll()
    assert len(asked) == 1 and m.poll() == set()   # the change to no cgroup, then quiet
    cg.mkdir()
    (cg / "cgroup.procs").write_text("501\n")
    state.update(MainPID="501", ControlGroup="/app.slice/infer.service")
    now[0] += 0.2
    assert m.poll() == {501} and len(asked) == 2


def test_the_summary_keeps_the_latest_processes_and_sums_the_others():
    from agent.watch.latency.identity import MAX_LINES, Proc, Service, ServiceRun
    run = ServiceRun(Service(ident=Identity("name", "svc")), Host(), [0], [])
    for i in range(MAX_LINES + 5):
        p = run.procs[100 + i] = Proc(100 + i, "svc", 0.0, armed_at=0.1, exited_at=1.0,
                                      state="exited", started_in_run=i > 0)
        run.calls_before[p.pid] = 10
        if i % 2:
            p.own_calls, p.missed = 12, 2
    lines = run.end_warnings(None, None, None)
    assert lines[0] == ("--attach-name svc: 5 earlier process(es): 50 call(s) timed; missed "
                        "before their timing: 4 counted, 2 process(es) not countable")
    assert len([x for x in lines if ": pid " in x and "call(s) timed" in x]) == MAX_LINES
    assert "pid 113: 2 (of its own count 12)" in lines[-1]
    assert "pid 114: not countable (the process keeps no count" in lines[-1]


def test_the_run_is_arming_while_no_process_is_timed_or_a_new_one_waits():
    """Issue #38: past watch's CPU budget the loop's steps follow the sampler's slowed rounds
    (≤ 0.45 s apart) except while the service's run is arming: none of its processes
    timed (it is down, or starting), or one seen within SLOW_AFTER_S waiting for its
    runtime (a restart) — not one that waits longer, nor one that cannot be timed —, or one
    timed whose own ring is still looked for (its missed calls' count)."""
    from agent.watch.latency.identity import (
        RING_TRIES,
        SLOW_AFTER_S,
        Proc,
        Service,
        ServiceRun,
    )
    now = [100.0]
    run = ServiceRun(Service(ident=Identity("name", "svc")), Host(), [0], [],
                     clock=lambda: now[0])
    assert run.arming()  # nothing seen yet
    run.procs[1] = Proc(1, "svc", 10.0, armed_at=11.0, state="timed")
    assert not run.arming()
    run.procs[2] = Proc(2, "svc", 99.0)  # a restart's new process, not armed yet
    assert run.arming()
    now[0] = 99.0 + SLOW_AFTER_S + 1  # waiting this long: not a restart to hurry
    assert not run.arming()
    run.procs[3] = Proc(3, "svc", now[0] - 1, state="not timed: no runtime mapped")
    assert not run.arming()
    run.procs[4] = Proc(4, "svc", now[0], armed_at=now[0], state="timed",
                        started_in_run=True)  # timed: its own ring not looked for yet
    assert run.arming()
    run.procs[4].ring_tries = RING_TRIES  # looked for as often as it is: none
    assert not run.arming()
    run.procs[4].ring_tries, run.procs[4].ring = 1, object()  # found
    assert not run.arming()
    for pid in (1, 4):  # none timed now
        run.procs[pid].exited_at, run.procs[pid].state = now[0], "exited"
    assert run.arming()
    from agent.watch.latency.probe import BuiltinProbe
    assert BuiltinProbe("numpy").open(Host(), [0], []).arming() is False  # (the default)


def test_past_max_kept_the_oldest_exited_processes_are_summed_not_kept(monkeypatch):
    """An always-on run whose service crash-loops: beyond MAX_KEPT processes the oldest that
    exited are summed (calls, missed, not countable) and forgotten, per pid figures too; the
    run's calls and the summary's lines still count them."""
    from agent.watch.latency import identity
    from agent.watch.latency.identity import Proc, Service, ServiceRun
    monkeypatch.setattr(identity, "MAX_KEPT", 4)
    said: list[str] = []
    run = ServiceRun(Service(ident=Identity("name", "svc")), Host(), [0], [],
                     say=said.append)
    for i in range(7):
        p = run.procs[100 + i] = Proc(100 + i, "svc", 0.0, armed_at=0.1, exited_at=1.0,
                                      state="exited", started_in_run=True)
        run.calls_before[p.pid], run.first_ns[p.pid] = 10, 5
        if i % 2:
            p.own_calls, p.missed = 12, 2
    run.procs[106].exited_at = None            # (still leaving: said at this settle)
    run._exited(run.procs[106], 2.0)
    run.settle()
    assert said == ["hftagent: --attach-name svc: pid 106 (svc) exited after 10 call(s) timed; "
                    "watching for the next"]
    assert sorted(run.procs) == [103, 104, 105, 106]
    assert run.folded == {"processes": 3, "calls": 30, "missed": 2, "not_countable": 2}
    assert set(run.calls_before) == set(run.first_ns) == {103, 104, 105, 106}
    assert run.calls == 70
    lines = run.end_warnings(None, None, None)
    assert lines[0] == ("--attach-name svc: 3 earlier process(es): 30 call(s) timed; missed "
                        "before their timing: 2 counted, 2 process(es) not countable")
    assert run.summary(None)["processes_earlier"] == run.folded
    assert [d["pid"] for d in run.summary(None)["processes"]] == [103, 104, 105, 106]


def test_an_exit_is_said_once_the_calls_it_made_before_are_read(tmp_path):
    """A process that exits between two reads: the calls it made after the last read, still
    in the trace buffers when the poll sees it gone, are read and given to it (its threads
    stay in the reader's set until then), and its exit line counts them (before, the exit
    took its threads out of the set first and those calls were dropped)."""
    from agent.trace.event import Event
    from agent.watch.latency.identity import Proc, Service, ServiceReader, ServiceRun, _Feed
    root = _tree(tmp_path)
    # two live pids (kill(pid, 0) answers; nothing is sent), their fixture /proc: A exits
    a, b = os.getppid(), os.getpid()
    for pid in (a, b):
        _proc(root, pid, "svc", ["svc"])
        (root / "proc" / str(pid) / "task" / str(pid)).mkdir(parents=True)

    class Src:
        evs: list = []

        def calls_lost(self):
            return 0

        def uprobe_events(self):
            out, self.evs = self.evs, []
            return out

        def is_return(self, ev):
            return ev.name.startswith("ret")

        def is_return_name(self, name):
            return name.startswith("ret")

        hits_are_tuples = False  # (Events: the general pairing)

    class U:
        group, instances, names, targets = "g", [], [], []

    class Armed:
        def __init__(self, reader):
            self.reader = reader

    class Pids:
        now = {a, b}

        def poll(self):
            return set(self.now)

    host, said, clock = Host(root=root), [], [100.0]
    run = ServiceRun(Service(ident=Identity("name", "svc")), host, [1], [], say=said.append,
                     matcher=Pids(), clock=lambda: clock[0])
    run._polls = 1   # (both started during the run)
    reader = ServiceReader(host, [a, b], Src(), U(), False, "svc")
    run.armed, run.key = Armed(reader), frozenset({(1, 2, "/lib/libx.so")})
    for pid in (a, b):
        run.procs[pid] = Proc(pid, "svc", 99.0, armed_at=99.5, state="timed",
                              started_in_run=True)
    feed = _Feed(run)
    ev = lambda t, n, tid: Event(t, 1, n, tid, {})  # noqa: E731
    reader.events.evs = [ev(10, "call0", a), ev(20, "ret0", a), ev(15, "call0", b),
                         ev(25, "ret0", b)]
    assert len(feed.read()) == 2 and run.calls == 2
    # A makes two more calls and exits; the poll sees it gone before they are read
    reader.events.evs = [ev(30, "call0", a), ev(40, "ret0", a), ev(50, "call0", a),
                         ev(60, "ret0", a)]
    import shutil
    shutil.rmtree(root / "proc" / str(a))
    Pids.now, clock[0] = {b}, 101.0
    rows = feed.read()
    assert sorted(int(r[F["pid"]]) for r in rows) == [a, a]
    assert run.calls_of(a) == 3 and run.procs[a].state == "exited"
    assert said == [f"hftagent: --attach-name svc: pid {a} (svc) exited after 3 call(s) "
                    "timed; watching for the next"]
    assert reader.pids == [b] and a not in reader.tid_pid.values()
    reader.events.evs = [ev(70, "call0", a), ev(80, "ret0", a)]   # (a reused tid)
    assert not len(feed.read()) and run.calls_of(a) == 3


def test_a_pid_taken_again_by_the_service_is_a_new_process_not_its_zombie(tmp_path):
    """An always-on run outlives pid_max: a new process of the service may get the pid of one
    that exited. Another start time (/proc/PID/stat) makes it a new process, waited for and
    timed as any; the old one's line and calls are kept. The same start time (its zombie,
    still in /proc until reaped) is not a new process."""
    from agent.watch.latency.identity import Service, ServiceRun, _Feed
    root = _tree(tmp_path)
    me = os.getpid()   # (a live pid: kill(pid, 0) answers; nothing is sent)
    _proc(root, me, "svc", ["svc"], started_s=10.0)

    class Pids:
        now = {me}

        def poll(self):
            return set(self.now)

    said, clock = [], [100.0]
    run = ServiceRun(Service(ident=Identity("name", "svc")), Host(root=root), [1], [],
                     say=said.append, matcher=Pids(), clock=lambda: clock[0])
    feed = _Feed(run)

    def step(pids: set[int]) -> None:
        Pids.now = pids
        clock[0] += 1.0
        feed.read()
    step({me})
    first = run.procs[me]
    run.calls_before[me] = 7
    step(set())                                  # it exits
    assert first.state == "exited" and "exited after 7 call(s)" in said[-1]
    step({me})                                   # its zombie: the same start time
    assert run.procs[me] is first
    _proc(root, me, "svc", ["svc"], started_s=20.0)
    step({me})                                   # a new process with its pid
    new = run.procs[me]
    assert new is not first and new.state == "waiting for its runtime" and new.started_in_run
    assert run.calls_of(me) == 0 and run.calls == 7
    got = run.processes()
    assert [(d["pid"], d["state"], d["calls"]) for d in got] == \
        [(me, "exited", 7), (me, "waiting for its runtime", 0)]


def test_a_process_running_before_the_run_is_armed_in_start_up_a_young_one_at_a_poll(
        tmp_path, monkeypatch):
    """Issue #38: the arming of a process that ran before watch started (the plan, the
    probes: ~30-50 ms of CPU) is start-up's, as --attach PID's is: its runtime files' second
    look, which settles them, is taken in start(), not one poll later in the run, where it
    counted as watch's running cost. One that started under SETTLED_AFTER_S before may still
    be loading: it is armed at a poll, once two looks agree."""
    from agent.watch.latency import identity
    from agent.watch.latency.identity import Service, ServiceRun
    root = _tree(tmp_path)   # uptime 1000 s
    old, young = os.getpid(), os.getppid()   # (live pids: their pidfds open; nothing is sent)
    _proc(root, old, "svc", ["svc"], started_s=900.0)
    _proc(root, young, "svc", ["svc"], started_s=1000.0 - identity.SETTLED_AFTER_S + 0.5)
    looks: list[int] = []

    def files(host, pid, src):
        looks.append(pid)
        return frozenset({(1, 2, "/lib/libx.so")})
    armed: list[int] = []

    def new_set(self, p, key):
        armed.append(p.pid)
        self.armed, self.key = object(), key
    monkeypatch.setattr(identity, "_runtime_files", files)
    monkeypatch.setattr(ServiceRun, "_new_set", new_set)

    class Pids:
        now = {old}

        def poll(self):
            return set(self.now)

    class Events:
        active = True

    clock = [100.0]
    run = ServiceRun(Service(ident=Identity("name", "svc")), Host(root=root), [1], [],
                     say=lambda _: None, matcher=Pids(), clock=lambda: clock[0])
    run.start(Events())
    assert armed == [old] and run.procs[old].state == "timed" and looks == [old, old]
    # a second run, whose process started just under SETTLED_AFTER_S before: not in start-up
    armed.clear()
    Pids.now = {young}
    run = ServiceRun(Service(ident=Identity("name", "svc")), Host(root=root), [1], [],
                     say=lambda _: None, matcher=Pids(), clock=lambda: clock[0])
    run.start(Events())
    assert armed == [] and run.procs[young].state == "waiting for its runtime"
    clock[0] += identity.POLL_S
    run.poll()
    assert armed == [young] and run.procs[young].state == "timed"
