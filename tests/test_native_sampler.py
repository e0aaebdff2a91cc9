"""The native reader (agent/watch/sampling/native/: hftsampler.c, feed.py, plans.py) and
NativeSampler: the helper builds, records every round's bytes in order across ring wraps,
reports a file's read error as the same OSError, survives an overrun, dies with its parent, and
lays its structs out where feed.py reads them; NativeSampler fills the same rings as the Python
sampler (same signals and values on a fixture tree), at the helper's round times, and falls back
to Python rounds when the helper is killed. A clear NativeUnavailable (no compiler, a broken
build) is what `watch --sampler auto` falls back on.

Runs against writable copies of the vm-dev fixture and temp files; never writes /proc or /sys.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from agent.watch.sampling.native.feed import Feed, NativeUnavailable, build_helper
from agent.watch.sampling.native.sampler import NativeSampler
from agent.watch.sampling.python import Sampler
from agent.watch.sampling.sources.base import HotSource
from agent.watch.sampling.sources.cpu import CpuCollector
from agent.watch.sampling.sources.irq import IrqCollector
from agent.watch.sampling.sources.memory import MemoryCollector
from agent.watch.sampling.sources.softirq import SoftirqCollector
from collectors.host import Host
from tests.conftest import parked_thread

REPO = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "vm-dev"


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    try:
        return build_helper(out_dir=tmp_path_factory.mktemp("hftcache"))
    except NativeUnavailable as exc:
        pytest.skip(f"native sampler cannot be built here: {exc}")


def _until(cond, timeout_s: float = 30.0) -> None:
    """Wait for ``cond()`` (polled); fail after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.02)


def _rounds_until(feed: Feed, n: int, timeout: float = 5.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        time.sleep(0.02)
        buf, rounds = feed.read_rounds()
        out.extend((buf, r) for r in rounds)
    return out


def _bytes_of(feed: Feed, buf: bytes, files: dict, slot) -> bytes:
    got = feed.read(slot, files, buf)
    if isinstance(got, OSError):
        raise got
    assert got is not None, "not in this round"
    return got


def test_build_is_cached_and_a_missing_compiler_or_broken_source_is_one_reason(tmp_path,
                                                                                monkeypatch):
    d = tmp_path / "cache"
    exe = build_helper(out_dir=d) if shutil.which("cc") or shutil.which("gcc") else None
    if exe is None:
        pytest.skip("no C compiler")
    assert os.access(exe.path, os.X_OK) and exe.path.parent == d
    mtime = exe.path.stat().st_mtime_ns
    again = build_helper(out_dir=d)
    assert again.path == exe.path and exe.path.stat().st_mtime_ns == mtime  # cached
    bad = tmp_path / "bad.c"
    bad.write_text("int main(void) { return oops; }\n")
    with pytest.raises(NativeUnavailable, match="building the native sampler failed: .*oops"):
        build_helper(bad, out_dir=d)
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]  # nothing half-written
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(NativeUnavailable, match="building the native sampler failed"):
        build_helper(bad, out_dir=tmp_path / "other")


def test_rounds_carry_each_files_bytes_in_order_across_ring_wraps(helper, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 9000)  # 256 KiB ring: wraps every ~28 rounds (0.28 s of headroom)
    b.write_bytes(b"00000000\n")  # rewritten in place below (a truncating write could be
    # read half-done, by the helper as by any reader)
    feed = Feed(10_000_000, capacity=1 << 18, helper=helper, shm_dir=str(tmp_path))
    try:
        fa, fb = feed.register(a), feed.register(b, div=2)  # b: every other round
        feed.start()
        seen, last_round, last_t = 0, None, 0
        deadline = time.monotonic() + 3
        value = 0
        wfd = os.open(b, os.O_WRONLY)
        while seen < 120 and time.monotonic() < deadline:
            value += 1
            os.pwrite(wfd, f"{value:08d}\n".encode(), 0)
            time.sleep(0.02)
            buf, rounds = feed.read_rounds()
            for rnd, t, files in rounds:
                if last_round is not None:
                    assert rnd == last_round + 1  # no round lost or repeated
                    assert t > last_t
                last_round, last_t = rnd, t
                assert _bytes_of(feed, buf, files, fa) == b"x" * 9000
                assert (fb.index in files) == (rnd % 2 == 0)
                if fb.index in files:
                    got = int(_bytes_of(feed, buf, files, fb))
                    assert 0 <= got <= value
                seen += 1
        os.close(wfd)
        assert seen >= 120 and feed.overruns == 0
        assert feed.stats()["rounds"] >= seen
    finally:
        feed.close()
    assert not os.path.exists(feed.path)  # the shared file is removed


def test_a_read_error_is_the_same_oserror_and_an_overrun_loses_rounds_not_order(helper,
                                                                                 tmp_path):
    child = subprocess.Popen(["sleep", "30"])
    feed = Feed(10_000_000, capacity=1 << 18, helper=helper, shm_dir=str(tmp_path))
    try:
        f = feed.register(f"/proc/{child.pid}/stat")
        big = tmp_path / "big"
        big.write_bytes(b"y" * 12000)  # 12 KB a round: the 256 KiB ring holds ~0.2 s
        fb = feed.register(big)
        feed.start()
        assert _rounds_until(feed, 3)
        child.kill()
        child.wait()
        err = None
        deadline = time.monotonic() + 2
        while err is None and time.monotonic() < deadline:
            time.sleep(0.02)
            buf, rounds = feed.read_rounds()
            for _, _, files in rounds:
                try:
                    _bytes_of(feed, buf, files, f)
                except OSError as exc:
                    err = exc
        assert err is not None and err.errno == errno.ESRCH  # as a live pread of a dead task
        time.sleep(0.8)  # ~80 rounds × 12 KB: several times the ring
        buf, rounds = feed.read_rounds()
        assert rounds == [] and feed.overruns >= 1
        later = _rounds_until(feed, 3)
        first = later[0][1][0]
        assert [r[0] for _, r in later] == list(range(first, first + len(later)))
        assert _bytes_of(feed, later[0][0], later[0][1][2], fb) == b"y" * 12000
    finally:
        feed.close()
        if child.poll() is None:
            child.kill()


def test_helper_exits_with_its_parent(helper, tmp_path):
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
            "from pathlib import Path\n"
            "from agent.watch.sampling.native.feed import Feed\n"
            f"f = Feed(10_000_000, helper=Path({str(helper.path)!r}), "
            f"shm_dir={str(tmp_path)!r})\n"
            "f.start(); print(f.proc.pid, flush=True)\n"
            "import os; os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        # a zombie until init reaps it counts as gone
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the helper outlived its parent")


def _copy_proc(tmp_path: Path) -> Host:
    root = tmp_path / "vm"
    shutil.copytree(FIX / "proc", root / "proc", ignore=shutil.ignore_patterns("[0-9]*"))
    shutil.copytree(FIX / "sys", root / "sys", symlinks=True, ignore_dangling_symlinks=True)
    return Host(root)


def _collectors(h: Host) -> list:
    cs = [CpuCollector(h, [1]), IrqCollector(h, [1]), SoftirqCollector(h, [1]),
          MemoryCollector(h)]
    assert all(c.available().ok for c in cs)
    return cs


def test_native_sampler_fills_the_same_rings_as_the_python_sampler(helper, tmp_path):
    h = _copy_proc(tmp_path)
    py = Sampler(_collectors(h), hz=100)
    for i in range(12):
        py.round(now_ns=10**9 + i * 10_000_000)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler(_collectors(h), feed, hz=100, cpus=None, drain_hz=20)
    nat.start()
    time.sleep(0.6)
    soft = h.procfs / "softirqs"  # a counter moves: the next rows carry the delta
    data = soft.read_bytes()
    line = next(x for x in data.split(b"\n") if x.strip().startswith(b"NET_RX:"))
    f = line.split()
    bumped = b" ".join([f[0], f[1], str(int(f[2]) + 500).encode(), *f[3:]])
    soft.write_bytes(data.replace(line, bumped))
    time.sleep(0.4)
    nat.stop()
    assert nat.mode == "native" and nat.native_error is None
    for name in ("cpu", "irq", "softirq", "memory"):
        pr, nr = py.ring(name), nat.ring(name)
        assert set(nr.cols) == set(pr.cols), name
        st = nat.stats.per_collector[name]
        # the files were registered before the helper started: every round has them
        assert st.state == "ok" and st.dropped_rows == 0 and st.layout_rows > 0
        assert nr.rows >= 5
        idx = nr.window(0, 2**62)
        t1 = nr.t1[idx]
        div = 1 if name == "softirq" else 5
        gaps = (t1[1:] - t1[:-1]) / 1e6
        # rows at the helper's rounds: div × 10 ms apart (the helper sleeps to absolute times)
        assert abs(float(sorted(gaps)[len(gaps) // 2]) - 10 * div) < 3, (name, gaps)
        for col in pr.cols:  # a static tree: the same gauges, zero deltas
            a = pr.column(col, pr.window(0, 2**62))[-1]
            b = nr.column(col, idx)[-2]
            assert (a == b) or (a != a and b != b), (name, col, a, b)
    col = nat.ring("softirq").column("softirq.1.NET_RX", nat.ring("softirq").window(0, 2**62))
    assert 500.0 in col.tolist()
    assert nat.stats.cpu_ns > 0 and nat.helper_cpu_ns() > 0


def test_a_killed_helper_hands_over_to_python_rounds(helper, tmp_path):
    h = _copy_proc(tmp_path)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler(_collectors(h), feed, hz=100, drain_hz=20)
    nat.start()
    time.sleep(0.3)
    os.kill(feed.proc.pid, signal.SIGKILL)
    time.sleep(0.4)
    before = nat.ring("softirq").rows
    time.sleep(0.4)
    after = nat.ring("softirq").rows
    nat.stop()
    assert nat.native_error and "killed by signal 9" in nat.native_error
    assert nat.mode.startswith("python")
    assert after - before >= 20  # Python rounds at 100 Hz go on


def test_watch_sampler_option_and_auto_fallback(tmp_path):
    def run(*args, env=None):
        return subprocess.run([sys.executable, "-c", "from agent.cli import main; main()",
                               "watch", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=env)
    r = run("--sampler", "fast", "--probe", "numpy", "--duration", "1")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--sampler must be" in r.stderr
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs a probe CPU and a housekeeping CPU")
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), HFTAGENT_CACHE=str(tmp_path / "c"))
    r = run("--probe", "numpy", "--rate", "100", "--duration", "2", "--json", "--no-live",
            env=env)
    assert r.returncode == 0, r.stderr
    import json
    smp = json.loads(r.stdout)["sampler"]
    assert smp["mode"] == "python" and "native sampler unavailable" in smp["note"]
    r = run("--sampler", "native", "--probe", "numpy", "--duration", "2", env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    # one error line; a start-up phase line ("... ...") comes first when the probe took
    # over 1 s to start (agent/commands/watch.py _Phases: a busy box)
    lines = [x for x in r.stderr.splitlines() if not x.endswith(" ...")]
    assert len(lines) == 1 and "native sampler" in lines[0]


def test_the_task_scan_lands_in_the_newest_replayed_row(helper, tmp_path):
    """sched's task scan reads live: under replay it runs after the batch and joins the
    newest row (≤ one sched period before the scan), never a round up to a batch old."""
    from agent.watch.sampling.sources.sched import SchedCollector
    cpu = sorted(os.sched_getaffinity(0))[-1]
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    sched = SchedCollector(Host(), [os.getpid()], [cpu], scan_period_s=0.3, period_s=0.05)
    assert sched.available().ok
    nat = NativeSampler([sched], feed, hz=100, drain_hz=5)
    nat.start()
    time.sleep(2.0)
    nat.stop()
    ring = nat.ring("sched")
    idx = ring.window(0, 2**62)
    col = ring.column(f"sched.cpu{cpu}.runnable", idx)
    rows_t = ring.t1[idx][col == col]  # rows that carry a scan
    scans = [s.t_ns for s in sched.scans]
    assert len(scans) >= 3 and len(rows_t) >= len(scans)
    for t in scans:
        before = [t - r for r in rows_t.tolist() if r <= t]
        assert before and min(before) < 120_000_000, (t, before[-3:])  # 50 ms period + slack


def test_a_record_overwritten_while_it_is_copied_is_an_overrun_not_data(tmp_path):
    """The writer publishes reserve_pos before it copies a record; a reader whose copy
    overlapped that record (its oldest bytes a ring behind) drops the batch, counted."""
    import struct

    from agent.watch.sampling.native import feed as F
    feed = Feed(10_000_000, capacity=1 << 16, helper=Path("/bin/true"), shm_dir=str(tmp_path))
    cap, base = feed.capacity, feed._base
    wpos = 0

    def rec(rnd: int) -> bytes:
        payload = bytes([65 + rnd]) * 12000
        return struct.pack("<IIQQII", F.REC_MAGIC, 32 + 16 + 12000, rnd, 1000 + rnd, 1, 0) + \
            struct.pack("<HHiII", 0, 0, 12000, 0, 0) + payload

    def write(r: bytes, publish: bool = True) -> None:
        nonlocal wpos
        off = wpos % cap
        pad = cap - off if off + len(r) > cap else 0
        struct.pack_into("<Q", feed.mm, F._H_RESERVE, wpos + pad + len(r))
        if pad:
            feed.mm[base + off:base + off + 8] = struct.pack("<II", F.PAD_MAGIC, pad)
            wpos, off = wpos + pad, 0
        feed.mm[base + off:base + off + len(r)] = r
        if publish:
            wpos += len(r)
            struct.pack_into("<Q", feed.mm, F._H_WPOS, wpos)
    try:
        for i in range(5):
            write(rec(i))
        buf, rounds = feed.read_rounds()
        assert [r[0] for r in rounds] == [0, 1, 2, 3, 4] and feed.overruns == 0
        for i in range(5, 10):
            write(rec(i))
        write(rec(10), publish=False)  # mid-copy over the oldest unread bytes
        buf, rounds = feed.read_rounds()
        assert rounds == [] and feed.overruns == 1
        write(rec(11))
        buf, rounds = feed.read_rounds()
        assert [r[0] for r in rounds] == [11]
        assert buf[rounds[0][2][0][1]:][:3] == b"LLL"  # its own bytes (65 + 11)
    finally:
        feed.close()


def test_multi_page_proc_files_are_read_whole(helper, tmp_path):
    """/proc seq_files with many records hand out about a page per read: HotFile and the
    helper read on until the end (a big box's /proc/interrupts was cut at ~4 KiB)."""
    from collectors.host import HotFile
    child = subprocess.Popen([sys.executable, "-c", "import numpy, time; time.sleep(30)"])
    try:
        path = f"/proc/{child.pid}/maps"
        whole, end = b"", time.monotonic() + 30
        while time.monotonic() < end:  # imported: its maps no longer change (a busy box)
            time.sleep(0.5)
            now = Path(path).read_bytes()
            if now == whole:
                break
            whole = now
        assert len(whole) > 8192
        assert HotFile(path).read() == whole
        feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
        try:
            f = feed.register(path)
            feed.start()
            (buf, (_, _, files)), *_ = _rounds_until(feed, 2)[-1:]
            assert _bytes_of(feed, buf, files, f) == whole
        finally:
            feed.close()
    finally:
        child.kill()
        child.wait()


def test_a_stalled_helper_hands_over_and_the_scans_come_back(helper, tmp_path):
    from agent.watch.sampling.sources.sched import SchedCollector
    cpu = sorted(os.sched_getaffinity(0))[-1]
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    h = Host()
    sched = SchedCollector(h, [os.getpid()], [cpu], scan_period_s=0.3, period_s=0.05)
    nat = NativeSampler([sched, SoftirqCollector(h, [cpu])], feed, hz=100, drain_hz=10)
    nat.STALL_NS = 500_000_000
    nat.start()
    try:
        assert os.getpgid(feed.proc.pid) != os.getpgid(0)  # Ctrl-C does not reach it
        time.sleep(0.4)
        os.kill(feed.proc.pid, signal.SIGSTOP)  # stuck: alive, no rounds
        deadline = time.monotonic() + 5
        while nat.native_error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nat.native_error and "stalled" in nat.native_error
        scans = len(sched.scans)
        rows = nat.ring("softirq").rows
        time.sleep(0.8)
        assert len(sched.scans) > scans  # scans in sample() again
        assert nat.ring("softirq").rows - rows >= 40  # Python rounds at 100 Hz
    finally:
        nat.stop()
    assert feed.proc.poll() is not None  # killed, not left stopped


def test_the_helper_exits_at_once_when_its_named_parent_is_not_its_parent(helper, tmp_path):
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    try:
        r = subprocess.run([str(helper.path), feed.path, "-", "1"], timeout=10)
        assert r.returncode == 0 and feed.state() == 0  # never ran a round
    finally:
        feed.close()


def test_an_untrusted_cache_directory_or_binary_is_not_run(tmp_path):
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    d = tmp_path / "open"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o777)  # anyone could plant a binary here
    with pytest.raises(NativeUnavailable, match="writable by group or others"):
        build_helper(out_dir=d)
    good = tmp_path / "good"
    exe = build_helper(out_dir=good).path
    os.chmod(exe, 0o777)  # the cached binary itself made writable by others
    with pytest.raises(NativeUnavailable, match="writable only by you"):
        build_helper(out_dir=good)
    os.chmod(exe, 0o755)
    link = tmp_path / "link"
    link.symlink_to(good)
    assert build_helper(out_dir=link).path == exe  # our own link is followed
    if os.geteuid() == 0:
        os.lchown(link, 65534, 65534)  # another user's link is not
        with pytest.raises(NativeUnavailable, match="symlink owned by uid 65534"):
            build_helper(out_dir=link)


def _c_compiler() -> str | None:
    want = os.environ.get("CC")
    return shutil.which(want) if want else \
        (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"))


def test_the_c_structs_are_where_feed_py_reads_them(tmp_path):
    """feed.py mirrors hftsampler.c's shared structs by hand (HEADER, SLOT, REC, FREC, LHEAD,
    LREF and the constants): a C program that includes the helper's source with
    -DHFTSAMPLER_LAYOUT_ONLY prints every field's offsetof and size, each struct's size and
    each constant, and they must be feed.py's."""
    from agent.watch.sampling.native import feed as F
    cc = _c_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    lines = ["#define HFTSAMPLER_LAYOUT_ONLY", f'#include "{F.SOURCE}"', "#include <stddef.h>",
             "int main(void) {"]
    for cs in F.C_STRUCTS:
        lines.append(f'printf("{cs.cname} %zu\\n", sizeof(struct {cs.cname}));')
        for name, _ in cs.fields:
            lines.append(f'printf("{cs.cname}.{name} %zu %zu\\n", offsetof(struct {cs.cname}, '
                         f'{name}), sizeof(((struct {cs.cname} *)0)->{name}));')
    for name in F.C_CONSTANTS:
        lines.append(f'printf("{name} %llu\\n", (unsigned long long)({name}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror", "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = dict(line.split(" ", 1) for line in
               subprocess.run([str(exe)], capture_output=True, text=True,
                              check=True).stdout.splitlines())
    want = {}
    for cs in F.C_STRUCTS:
        want[cs.cname] = str(cs.size)
        for name, fmt in cs.fields:
            want[f"{cs.cname}.{name}"] = f"{cs.off[name]} {struct.calcsize('<' + fmt)}"
    want |= {name: str(v) for name, v in F.C_CONSTANTS.items()}
    assert got == want
    assert F.SLOT.size == F.SLOT_BYTES and F.HEADER.size <= F.HEADER_BYTES
    # the offsets feed.py reads and writes with are these
    assert (F._H_PERIOD, F._H_TABLE_GEN, F._H_STOP, F._H_CAP, F._H_WPOS, F._H_ROUNDS,
            F._H_LATE, F._H_CPU, F._H_PID, F._H_STATE, F._H_ERROR, F._H_RESERVE,
            F._H_DROPPED) == tuple(F.HEADER.off[n] for n in (
                "period_ns", "table_gen", "stop", "capacity", "write_pos", "rounds",
                "late_rounds", "cpu_ns", "pid", "state", "error", "reserve_pos",
                "dropped_rounds"))


def test_the_struct_check_fails_on_a_moved_field(tmp_path, monkeypatch):
    """The check above is not vacuous: a feed.py whose header puts a field elsewhere than
    the C struct does is caught."""
    from agent.watch.sampling.native import feed as F
    if _c_compiler() is None:
        pytest.skip("no C compiler")
    fields = list(F.HEADER.fields)
    i = [n for n, _ in fields].index("reserve_pos")
    fields[i], fields[i + 1] = fields[i + 1], fields[i]  # dropped_rounds before reserve_pos
    monkeypatch.setattr(F, "HEADER", F.CStruct("header", tuple(fields)))
    monkeypatch.setattr(F, "C_STRUCTS", (F.HEADER, *F.C_STRUCTS[1:]))
    with pytest.raises(AssertionError, match="header.reserve_pos"):
        test_the_c_structs_are_where_feed_py_reads_them(tmp_path)


def test_layout_values_are_what_the_parsers_accept_and_anything_else_is_bytes(helper,
                                                                              tmp_path):
    """The helper's token-layout extraction: names checked, prefixes stripped, a value is
    what collectors/parsers.py accepts (parse_uint: 1-20 ASCII digits; a signed layout:
    parse_int's one "-"), as Python's float(int(token)); a token that is anything else
    ("+7", "nan", "1e9", 21 digits, "٣"), a changed name or token count: no values, the raw
    bytes only (the collector parses them and says why)."""
    import math

    from collectors.layout import TokenLayout
    p = tmp_path / "f"
    good = b"a 5 7 12345678901234567890 total=42 x\n"
    p.write_bytes(good)
    lay = TokenLayout.of(good, (0, 5), (b"a", b"x"), (1, 2, 3, 4), ("m", "p", "big", "t"),
                         prefixes=(b"", b"", b"", b"total="))
    assert lay.lines == 1
    want = lay.values(good)
    assert want == {"m": 5.0, "p": 7.0, "big": float(12345678901234567890), "t": 42.0}
    q = tmp_path / "g"
    q.write_bytes(b"-5 -0 -18446744073709551615 7\n")
    slay = TokenLayout(4, (), (), (0, 1, 2, 3), ("a", "b", "c", "d"), signed=True)
    swant = slay.values(q.read_bytes())
    assert swant == {"a": -5.0, "b": 0.0, "c": -18446744073709551615.0, "d": 7.0}
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    try:
        f, g = feed.register(p), feed.register(q)
        assert feed.set_layout(f, lay) and feed.set_layout(g, slay)
        feed.start()
        plan, splan = (f, lay), (g, slay)

        def values_now(pl=plan) -> list:
            feed.read_rounds()  # skip what is recorded, then read fresh rounds
            return [feed.values(*pl, files, buf) for buf, (_, _, files) in _rounds_until(feed, 3)]

        assert values_now()[-1] == tuple(want.values())
        sv = values_now(splan)[-1]
        assert sv == tuple(swant.values()) and math.copysign(1, sv[1]) == 1  # not -0.0
        wfd = os.open(p, os.O_WRONLY)
        for bad in (b"a 5 +7 1 total=42 x\n", b"a -5 7 1 total=42 x\n",  # a sign
                    b"a 5 7 nan total=42 x\n", b"a 5 7 1e9 total=42 x\n",
                    b"a 5 7 123456789012345678901 total=42 x\n",  # 21 digits
                    "a 5 7 ٣ total=42 x\n".encode(),  # an Arabic-Indic digit
                    b"a 5 7 12x total=42 x\n",  # not an integer
                    b"a 5 7 1 total= x\n", b"a 5 7 1 total=-1 x\n",
                    b"a 5 7 1 total:42 x\n",  # the prefix is not there
                    b"b 5 7 1 total=42 x\n",  # another name
                    b"a 5 7 1 total=42 x y\n",  # another token count
                    b"a 5 7 1\ntotal=42 x\n"):  # another line count
            assert lay.values(bad) is None, bad  # the Python side agrees
            os.ftruncate(wfd, 0)
            os.pwrite(wfd, bad, 0)
            time.sleep(0.05)
            assert values_now()[-1] is None, bad
            b2, (_, _, files) = _rounds_until(feed, 1)[-1]
            assert _bytes_of(feed, b2, files, f) == bad  # the bytes are still there
        os.ftruncate(wfd, 0)
        os.pwrite(wfd, good, 0)
        os.close(wfd)
        wfd = os.open(q, os.O_WRONLY)
        for bad in (b"+5 -0 1 7\n", b"--5 -0 1 7\n", b"- -0 1 7\n",
                    b"-5 -0 -123456789012345678901 7\n"):
            assert slay.values(bad) is None, bad
            os.ftruncate(wfd, 0)
            os.pwrite(wfd, bad, 0)
            time.sleep(0.05)
            assert values_now(splan)[-1] is None, bad
        os.close(wfd)
        time.sleep(0.05)
        assert values_now()[-1] == tuple(want.values())
        # another layout for the same file: once handed over, its values come
        lay2 = TokenLayout(6, (0,), (b"a",), (1,), ("m",))
        buf, (_, _, files) = _rounds_until(feed, 1)[-1]
        assert feed.values(f, lay2, files, buf) is None
        assert feed.set_layout(f, lay2) and feed.layout_of(f) == (lay2, True)
        time.sleep(0.05)
        feed.read_rounds()
        buf, (_, _, files) = _rounds_until(feed, 2)[-1]
        assert feed.values(f, lay2, files, buf) == (5.0,)
        assert feed.values(*plan, files, buf) is None  # the old layout is gone from the helper
    finally:
        feed.close()


def test_layout_rows_follow_a_changed_file_and_equal_the_parsed_ones(helper, tmp_path):
    """The hot sources' rows (cpu, irq, softirq, memory, numa) are appended from the helper's
    values; a softirq line that appears changes the layout: those rows are parsed from the
    bytes, the new layout is handed over, and the values rows resume with the new key."""
    from agent.watch.sampling.sources.numa import NumaCollector
    h = _copy_proc(tmp_path)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    cs = _collectors(h) + [NumaCollector(h, [1])]
    assert cs[-1].available().ok
    nat = NativeSampler(cs, feed, hz=100, cpus=None, drain_hz=20)
    nat.start()
    per = nat.stats.per_collector
    r = nat.ring("softirq")

    def newsoft() -> list[float]:
        with nat.lock:
            return r.column("softirq.1.NEWSOFT", r.window(0, 2**62)).tolist()

    # conditions, not sleeps: on a busy 2-CPU box the helper and the drain run late
    _until(lambda: all(per[n].layout_rows > 0
                       for n in ("cpu", "irq", "softirq", "memory", "numa")))
    soft = h.procfs / "softirqs"
    data = soft.read_bytes()
    soft.write_bytes(data + b"  NEWSOFT:          3          4\n")
    _until(lambda: any(v == v for v in newsoft()))  # the new line has rows (its deltas)
    before = per["softirq"].layout_rows
    soft.write_bytes(data + b"  NEWSOFT:          3         11\n")
    _until(lambda: 7.0 in newsoft() and per["softirq"].layout_rows > before + 5)
    nat.stop()
    assert nat.native_error is None and per["softirq"].layout_rows > before + 5
    col = r.column("softirq.1.NEWSOFT", r.window(0, 2**62)).tolist()
    assert 7.0 in col and all(v == 0.0 or v == 7.0 for v in col if v == v)
    net = r.column("softirq.1.NET_RX", r.window(0, 2**62)).tolist()
    assert all(v == 0.0 for v in net if v == v)  # a static file: zero deltas, whatever path


def _sched_tree(tmp_path: Path, comm: bytes = b"probe worker", run: int = 5000,
                nvcsw: int = 7, minflt: int = 11) -> Host:
    """A /proc with one watched process (pid 4242, one thread) written in place."""
    root = tmp_path / "sched"
    t = root / "proc" / "4242" / "task" / "4242"
    t.mkdir(parents=True, exist_ok=True)
    (root / "sys").mkdir(exist_ok=True)
    rest = ["S"] + [str(i) for i in range(1, 51)]
    rest[7], rest[9], rest[36] = str(minflt), "2", "1"  # minflt, majflt, processor
    (root / "proc" / "4242" / "schedstat").write_bytes(f"{run} 300 9\n".encode())
    (t / "schedstat").write_bytes(f"{run} 300 9\n".encode())
    (t / "stat").write_bytes(b"4242 (" + comm + b") " + " ".join(rest).encode() + b"\n")
    (t / "status").write_bytes(
        b"Name:\tprobe\nState:\tS (sleeping)\nThreads:\t1\n"
        + f"voluntary_ctxt_switches:\t{nvcsw}\nnonvoluntary_ctxt_switches:\t4\n".encode())
    return Host(root)


def test_sched_rows_from_layouts_equal_the_parsed_ones(helper, tmp_path):
    """sched's per-thread files as layouts (stat's pid and comm are names): the values rows
    carry the same signals as sample() and the counters' deltas; a renamed thread (comm
    with a space more) no longer matches, is parsed, and its new layouts are used."""
    from agent.watch.sampling.sources.sched import SchedCollector
    h = _sched_tree(tmp_path)
    py = Sampler([SchedCollector(h, [4242], [1], period_s=0.05)], hz=100)
    for i in range(3):
        py.round(now_ns=10**9 + i * 50_000_000)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    sc = SchedCollector(h, [4242], [1], period_s=0.05)
    nat = NativeSampler([sc], feed, hz=100, cpus=None, drain_hz=20)
    nat.start()
    time.sleep(0.6)
    st = nat.stats.per_collector["sched"]
    assert nat.native_error is None and st.layout_rows > 3, st
    _sched_tree(tmp_path, run=6000, nvcsw=10, minflt=15)
    time.sleep(0.3)
    rows = st.layout_rows
    _sched_tree(tmp_path, comm=b"probe  worker x", run=6500, nvcsw=10, minflt=15)
    time.sleep(0.5)
    nat.stop()
    assert nat.native_error is None and st.layout_rows > rows + 3  # resumed after the rename
    pr, nr = py.ring("sched"), nat.ring("sched")
    assert set(pr.cols) <= set(nr.cols)
    idx = nr.window(0, 2**62)
    run = nr.column("sched.4242.run_ns", idx).tolist()
    assert 1000.0 in run and 500.0 in run and all(v in (0.0, 500.0, 1000.0) for v in run if v == v)
    assert 3.0 in nr.column("sched.4242.nvcsw", idx).tolist()
    assert 4.0 in nr.column("sched.4242.minflt", idx).tolist()
    assert {v for v in nr.column("sched.4242.majflt", idx).tolist() if v == v} == {0.0}
    assert {v for v in nr.column("sched.4242.cpu", idx).tolist() if v == v} == {1.0}  # gauge
    for col in pr.cols:  # the parsed rows and the values rows: the same static signals
        a = pr.column(col, pr.window(0, 2**62))[-1]
        b = nr.column(col, idx)[-1]
        assert (a == b) or (a != a and b != b) or col.startswith("sched.cpu"), (col, a, b)


def _rows_of(ring, name: str) -> bool:
    """Whether ``name`` has a column with values in two of the ring's last four rows."""
    import numpy as np
    return name in ring.cols and (~np.isnan(ring.column(name, ring._order()[-4:]))).sum() >= 2


def test_native_rows_of_a_new_thread_take_a_gone_threads_columns(helper, tmp_path):
    """The native replay's fast rows (append_seqs keeps each key tuple's columns): threads
    of this process one after another, on a ring of 32 columns (3 threads' worth): each
    thread's run-queue columns have values while it runs, the later ones in columns a gone
    thread had, and no value lands in another thread's column."""
    import numpy as np

    from agent.watch.sampling.sources.sched import SchedCollector
    cpu = sorted(os.sched_getaffinity(0))[-1]
    me = os.getpid()
    sc = SchedCollector(Host(), [], [cpu], scan_period_s=1e9, status_every=1)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([sc], feed, hz=100, cpus=None, drain_hz=20)
    ring = nat.ring("sched")
    ring.max_signals = 32
    ring.stale_s = 0.3  # (5 s in a real run)
    nat.start()
    seen: dict[int, int] = {}  # tid → its run_ns column
    try:
        for k in range(10):
            with parked_thread() as tid:
                name = f"sched.{tid}.run_ns"
                with nat.lock:
                    start = ring.rows
                sc.watch_tids([tid], pids={tid: me})
                _until(partial(_rows_of, ring, name))
                with nat.lock:
                    seen[tid] = ring.cols[name]
                    held = ring.column(name, ring._order())
                    before = len(held) - (ring.rows - start)  # (rows from before its watch)
                # (its values only: a gone thread's were dropped with its column)
                assert before <= 0 or np.isnan(held[:before]).all(), k
            _until(lambda: tid in sc.dropped)  # noqa: B023 - (called here, in its loop)
            time.sleep(0.4)
    finally:
        nat.stop()
    assert nat.native_error is None and ring.reused_signals >= 8
    assert len(set(seen.values())) < len(seen)  # later threads in gone threads' columns


def test_replays_come_at_drain_hz_and_a_poke_brings_the_next_one_forward(helper, tmp_path):
    """Quiet: one replay per 1/drain_hz. A poke (a spike waits for rows) replays at once,
    but not sooner than POKE_GAP_NS after the previous replay, and stop() does not wait for
    the next one."""
    h = _copy_proc(tmp_path)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([SoftirqCollector(h, [1])], feed, hz=100,
                        cpus=None, drain_hz=0.25)  # every 4 s unless poked
    nat.POKE_GAP_NS = 300_000_000  # (20 ms by default: long enough to see here)
    nat.start()
    try:
        time.sleep(0.6)
        assert nat.stats.rounds == 0  # nobody asked: no replay yet
        t = time.monotonic()
        nat.poke()
        while nat.stats.rounds == 0 and time.monotonic() - t < 2:
            time.sleep(0.01)
        first = nat.stats.rounds
        assert 40 <= first and time.monotonic() - t < 0.5
        nat.poke()  # again at once: not before the gap
        time.sleep(0.1)
        assert nat.stats.rounds == first
        time.sleep(0.3)
        assert nat.stats.rounds > first
    finally:
        t = time.monotonic()
        nat.stop()
        assert time.monotonic() - t < 1.0


def test_wait_replay_returns_once_the_poked_replay_is_done(helper, tmp_path):
    """watch pokes, then waits for that replay (NativeSampler.wait_replay) so the rows it
    brings are attributed in the same loop step: True once a replay after the one seen came;
    False at once on a sampler whose drain thread does not run."""
    h = _copy_proc(tmp_path)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([SoftirqCollector(h, [1])], feed, hz=100, cpus=None, drain_hz=0.25)
    t = time.monotonic()
    assert nat.wait_replay(nat.replays, 5.0) is False and time.monotonic() - t < 0.5
    nat.start()
    try:
        time.sleep(0.3)
        seen = nat.replays
        assert seen == 0  # nobody asked (drain every 4 s)
        nat.poke()
        assert nat.wait_replay(seen, 5.0) is True
        assert nat.replays > seen and nat.stats.rounds > 0 and nat.latest_ns() > 0
    finally:
        nat.stop()
    t = time.monotonic()
    assert nat.wait_replay(nat.replays, 5.0) is False and time.monotonic() - t < 0.5


def test_an_external_sources_stat_and_status_are_read_on_one_round_in_five(helper, tmp_path):
    """External source (sched every round, stat/status every status_every-th): the helper
    reads stat and status only on those rounds (the tracks' ``every``), and the rows say so — the
    switch counts on one row in five, the run-queue counters on every row, nearly all rows
    from the helper's values (the short and the full plan)."""
    from agent.watch.sampling.sources.sched import SchedCollector
    h = _sched_tree(tmp_path)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    sc = SchedCollector(h, [4242], [1], period_s=0.0)
    assert sc.status_every == 5
    nat = NativeSampler([sc], feed, hz=100, cpus=None, drain_hz=10)
    nat.start()
    time.sleep(1.0)
    costs = feed.slot_costs()
    reads = {f.path.rsplit("/", 1)[1]: f.reads(feed) for f in feed.registered()}
    nat.stop()
    assert costs and nat.native_error is None
    assert reads["schedstat"] > 60 and 4 <= reads["schedstat"] / reads["status"] <= 6, reads
    assert reads["stat"] == reads["status"]
    st = nat.stats.per_collector["sched"]
    assert st.layout_rows > 0.8 * st.runs, st
    r = nat.ring("sched")
    idx = r.window(0, 2**62)
    run = r.column("sched.4242.run_ns", idx)
    sw = r.column("sched.4242.nvcsw", idx)
    assert (run == run).sum() >= len(idx) - 2
    assert 0.1 < (sw == sw).sum() / len(idx) < 0.3


def test_a_busy_ring_is_replayed_sooner_and_an_overrun_is_not_a_stall(helper, tmp_path):
    """A big box writes megabytes a second into the ring: after a replay shows the rate, the
    next ones come often enough that a quarter of the ring holds them; a lost ring's worth
    is an overrun (counted), never the helper handed over as stalled."""
    big = tmp_path / "big"
    big.write_bytes(b"x" * 9000)  # 100 Hz × 9 kB ≈ 0.9 MB/s into a 256 KiB ring
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()

    class Big(HotSource):
        name, what = "big", "big"

        def _open_tracks(self) -> None:
            self._add("big", big, lambda data: {"bytes": float(len(data))}, None)

    feed = Feed(10_000_000, capacity=1 << 18, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([Big(Host(tmp_path))], feed, hz=100,
                        cpus=None, drain_hz=0.5)  # every 2 s unless the ring fills
    nat.start()
    time.sleep(4.0)  # the first replay, 2 s in, finds the ring overrun: then every ~70 ms
    rows = nat.ring("big").rows
    nat.stop()
    assert nat.native_error is None and nat.mode == "native"  # an overrun is not a stall
    assert feed.overruns == 1
    assert rows > 100  # the ~1.5 s since the overrun at 100 Hz, none lost


def test_a_layout_the_helper_cannot_take_is_not_built_nor_packed_again(helper, tmp_path):
    """A layout over LAYOUT_BYTES (a big box's /proc/interrupts): the helper cannot take it,
    and the plan replays the file from its bytes without building (or packing) a layout on
    every row — until the source's own layout of the file changes."""
    from collectors.layout import TokenLayout
    (tmp_path / "proc").mkdir()
    (tmp_path / "sys").mkdir()
    p = tmp_path / "f"
    n = 2000  # 2000 names × 8-byte refs: over LAYOUT_BYTES
    p.write_bytes(b"a " * n + b"1\n")
    builds = []

    def build(data: bytes) -> TokenLayout:
        builds.append(1)
        tok = data.split()
        return TokenLayout(len(tok), range(len(tok) - 1), tok[:-1], (len(tok) - 1,), ("v",))

    class Wide(HotSource):
        name, what = "wide", "f"

        def _open_tracks(self) -> None:
            self._add("f", p, lambda data: {"v": float(data.split()[-1])}, build)

    src = Wide(Host(tmp_path))
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([src], feed, hz=100, cpus=None, drain_hz=10)
    nat.start()
    try:
        time.sleep(0.5)
        (slot,) = feed.registered()
        lay, taken = feed.layout_of(slot)
        assert not taken and lay.n == n + 1
        # the Python side's layout, then the plan's (refused): none since, row after row
        assert len(builds) == 2 and src.rows > 20
        gen = feed._table_gen
        time.sleep(0.3)
        assert len(builds) == 2 and feed._table_gen == gen  # nothing packed again
        p.write_bytes(b"a " * (n + 1) + b"2\n")  # another shape: both sides build once more
        time.sleep(0.4)
        assert len(builds) == 4
    finally:
        nat.stop()
    st = nat.stats.per_collector["wide"]
    assert st.state == "ok" and st.layout_rows == 0 and nat.native_error is None
    assert 1.0 in nat.ring("wide").column("v", nat.ring("wide").window(0, 2**62)).tolist()  # 1→2


def test_irq_device_names_are_refreshed_every_desc_every_rows_under_values_rows(helper,
                                                                              tmp_path):
    """irq parses the whole file on one row in desc_every (a driver rebound to the same IRQ
    number renames it): rows from the helper's values count towards it, so the names follow
    within desc_every rows under the native replay too."""
    h = _copy_proc(tmp_path)
    irq = IrqCollector(h, [1])
    irq.desc_every = 5  # one row in 5: 0.25 s at 20 Hz
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([irq], feed, hz=100, cpus=None, drain_hz=20)
    nat.start()
    try:
        time.sleep(0.5)
        assert irq.descriptions["26"].endswith("ttyS0")
        path = h.procfs / "interrupts"
        path.write_bytes(path.read_bytes().replace(b"ttyS0", b"ttyS1", 1))  # same tokens
        time.sleep(0.6)
        assert irq.descriptions["26"].endswith("ttyS1")
    finally:
        nat.stop()
    st = nat.stats.per_collector["irq"]
    assert nat.native_error is None and st.layout_rows >= st.runs / 2, st


def test_cpu_values_rows_resume_after_the_intr_line_grows(helper, tmp_path):
    """/proc/stat's "intr" line (one count per IRQ number; the Python path drops it) grows
    when the kernel allocates IRQ numbers: the whole-file layout the reader uses no longer
    fits while the source's own still does — the plan rebuilds its layout from the bytes,
    values rows come back."""
    h = _copy_proc(tmp_path)
    feed = Feed(10_000_000, helper=helper, shm_dir=str(tmp_path))
    cpu = CpuCollector(h, [1])
    assert cpu.available().ok
    nat = NativeSampler([cpu], feed, hz=100, cpus=None, drain_hz=20)
    nat.start()
    time.sleep(0.5)
    st = nat.stats.per_collector["cpu"]
    before = st.layout_rows
    stat = h.procfs / "stat"
    data = stat.read_bytes()
    i = data.index(b"\nintr ")
    j = data.index(b"\n", i + 1)
    stat.write_bytes(data[:j] + b" 0 0 0" + data[j:])  # three IRQ numbers more
    time.sleep(0.3)
    mid = st.layout_rows
    time.sleep(0.4)
    nat.stop()
    assert nat.native_error is None and before > 3
    assert st.layout_rows > mid + 3, (before, mid, st.layout_rows)


def test_open_sampler_picks_native_python_or_falls_back_and_leaves_no_feed_open():
    """agent.watch.sampling.open_sampler (--sampler): auto falls back to the Python sampler
    with the reason where the feed cannot be built or its helper cannot start; native is an
    AgentError there; python never builds a feed; an error while the collectors are built
    closes the feed."""
    from agent.errors import AgentError
    from agent.watch.sampling import open_sampler
    from agent.watch.sampling.native.feed import NativeUnavailable
    from agent.watch.sampling.python import Sampler as PySampler

    class FakeFeed:
        made: list = []

        def __init__(self, period_ns, start_fails=False):
            self.period_ns, self.start_fails, self.closed, self.proc = period_ns, start_fails, 0, None
            FakeFeed.made.append(self)

        def start(self, cpus):
            if self.start_fails:
                raise NativeUnavailable("no helper here")

        def close(self):
            self.closed += 1

    def no_feed(period_ns):
        raise NativeUnavailable("no C compiler")

    cols = lambda: []  # noqa: E731
    s, note = open_sampler("auto", cols, 100, [0], feed_factory=no_feed)
    assert type(s) is PySampler and note == "python (native sampler unavailable: no C compiler)"
    with pytest.raises(AgentError, match="no C compiler"):
        open_sampler("native", cols, 100, [0], feed_factory=no_feed)
    s, note = open_sampler("python", cols, 100, [0], feed_factory=no_feed)
    assert type(s) is PySampler and note is None
    s, note = open_sampler("auto", cols, 100, [0],
                           feed_factory=lambda p: FakeFeed(p, start_fails=True))
    assert type(s) is PySampler and note == "python (native sampler unavailable: no helper here)"
    assert FakeFeed.made[-1].closed == 1 and FakeFeed.made[-1].period_ns == 10_000_000
    with pytest.raises(AgentError, match="no helper here"):
        open_sampler("native", cols, 100, [0], feed_factory=lambda p: FakeFeed(p, True))
    assert FakeFeed.made[-1].closed == 1

    def boom():
        raise KeyboardInterrupt  # a stop while the collectors are built
    with pytest.raises(KeyboardInterrupt):
        open_sampler("auto", boom, 100, [0], feed_factory=FakeFeed)
    assert FakeFeed.made[-1].closed == 1
    s, note = open_sampler("auto", cols, 100, [0], feed_factory=FakeFeed)
    assert s.mode == "native" and note is None and s.feed is FakeFeed.made[-1]
    assert FakeFeed.made[-1].closed == 0


def test_the_helpers_rounds_are_as_far_apart_as_the_hot_sources_allow(helper, tmp_path):
    """issue #38: with every hot source at 20 Hz or slower (the kernel events on), the
    helper makes 20 rounds a second, not 100, and each file is read on the same rounds'
    times as before; one source at the sampler's rate keeps it at 100; never more than
    MAX_ROUND_NS (200 ms) apart (a spike's rows; one asked for comes sooner)."""
    h = _copy_proc(tmp_path)

    def sampler(periods: list[float]) -> NativeSampler:
        cs = _collectors(h)
        for c, p in zip(cs, periods):
            c.period_s = p
        return NativeSampler(cs, Feed(10_000_000, helper=helper, shm_dir=str(tmp_path)),
                             hz=100, cpus=None, drain_hz=20)

    nat = sampler([0.05, 0.2, 0.05, 0.1])
    try:
        assert nat.period_ns == nat.feed.period_ns() == 50_000_000
        assert [e.div for e in nat.entries] == [1, 4, 1, 2]
        nat.start()
        _until(lambda: nat.stats.rounds >= 10)
        t0, n0 = time.monotonic(), nat.stats.rounds
        time.sleep(1.0)
        _until(lambda: nat.stats.rounds > n0)
        rate = (nat.stats.rounds - n0) / (time.monotonic() - t0)
        assert rate < 40, rate  # 20 a second (100 before)
        softirq = nat.ring("softirq")
        assert softirq is not None and softirq.rows >= 10
    finally:
        nat.stop()
    for periods, want in (([0.0, 0.2, 0.05, 0.1], 10_000_000),    # one at 100 Hz
                          ([0.1, 0.2, 0.1, 0.1], 100_000_000),    # 10 Hz
                          ([0.2, 0.2, 0.2, 0.4], 200_000_000),    # the events' 5 Hz
                          ([1.0, 1.0, 1.0, 1.0], 200_000_000),    # capped
                          ([0.05, 0.03, 0.05, 0.05], 10_000_000)):  # 50 and 30 ms: 10
        nat = sampler(periods)
        try:
            assert nat.period_ns == nat.feed.period_ns() == want, periods
        finally:
            nat.feed.close()


def test_a_round_asked_for_comes_at_once_and_the_next_a_period_after_it(helper, tmp_path):
    """With the events on the helper makes 5 rounds a second (issue #38); a spike whose
    round after it has not come asks for one (SIGUSR1, NativeSampler.ask_round): it comes
    within milliseconds, the replay that the poke brings waits for it, the next regular
    round comes a period after it, and asks closer than ASK_GAP_NS, for a time not yet
    passed or already covered are not made."""
    h = _copy_proc(tmp_path)
    feed = Feed(1_000_000_000, helper=helper, shm_dir=str(tmp_path))  # a round a second
    nat = NativeSampler([SoftirqCollector(h, [1])], feed, hz=1, cpus=None, drain_hz=0.25)
    assert feed.ask_round() is False  # not started
    nat.start()
    try:
        _until(lambda: feed.rounds() >= 1)
        time.sleep(0.05)
        n, t = feed.rounds(), time.monotonic_ns()
        assert nat.ask_round(t + 10**9) is False  # its time has not come
        assert nat.ask_round(t) is True and nat.asked_rounds == 1
        _until(lambda: feed.rounds() > n, 0.5)
        assert (time.monotonic_ns() - t) / 1e6 < 300  # not the regular round, 1 s later
        seen = nat.replays
        nat.poke()
        assert nat.wait_replay(seen, 5.0) and nat.latest_ns() >= t  # the asked round replayed
        asked_at = nat.latest_ns()  # the asked round's own time
        time.sleep(nat.ASK_GAP_NS / 1e9 + 0.05)
        assert nat.ask_round(t) is False  # covered already (past the gap)
        assert feed.rounds() == n + 1  # the next regular one is a period after the asked one
        _until(lambda: feed.rounds() >= n + 2, 2.0)
        assert (time.monotonic_ns() - asked_at) / 1e6 > 800
        assert feed.alive()  # the signal is the helper's to take, never its end
    finally:
        nat.stop()
        feed.close()


def test_unread_says_whether_rounds_wait_and_cpu_ns_is_the_stats_figure(helper, tmp_path):
    """Issue #38: past watch's CPU budget a replay is poked only for rounds the helper wrote
    since the last read (Feed.unread), and the budget's refills read the helper's CPU time
    from the header alone (Feed.cpu_ns: the same figure as stats(), kept after close)."""
    a = tmp_path / "a"
    a.write_bytes(b"1\n")
    feed = Feed(10_000_000, capacity=1 << 16, helper=helper, shm_dir=str(tmp_path))
    try:
        feed.register(a)
        assert not feed.unread()  # nothing written yet
        feed.start()
        deadline = time.monotonic() + 3
        while not feed.unread() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert feed.unread()
        feed.read_rounds()
        assert feed.cpu_ns() == feed.stats()["cpu_ns"]
        feed.stop()  # no more rounds: once what it wrote is read, nothing is unread
        feed.read_rounds()
        assert not feed.unread()
        last = feed.cpu_ns()
    finally:
        feed.close()
    assert not feed.unread() and feed.cpu_ns() == last


def test_slow_spaces_the_helpers_rounds_while_on_and_restores_them_after(helper, tmp_path):
    """Issue #38: past watch's CPU budget the helper's rounds come SLOW_FACTOR times further
    apart (NativeSampler.slow: the header's period, which the helper reads after every
    round), and at the regular period again after; slow_s counts the slowed time. (Counts
    are upper bounds where the rounds are slow: a busy machine only makes them later.)"""
    h = _copy_proc(tmp_path)
    feed = Feed(20_000_000, helper=helper, shm_dir=str(tmp_path))
    nat = NativeSampler([SoftirqCollector(h, [1])], feed, hz=50, cpus=None, drain_hz=5)
    nat.SLOW_FACTOR = 50  # 1 s rounds: far enough apart to count
    nat.slow(False)
    assert nat.slow_s() == 0 and feed.period_ns() == 20_000_000
    assert nat.next_round_s() is None  # (no round replayed yet)
    nat._latest = 5_000_000_000  # a round replayed at 5 s: the next due a period after
    assert nat.next_round_s() == pytest.approx(5.02)
    nat.slow(True)
    assert nat.next_round_s() == pytest.approx(6.0)  # (its period now)
    nat.slow(False)
    nat._latest, nat.slow_ns = 0, 0
    nat.start()
    try:
        _until(lambda: feed.rounds() >= 5)
        nat.slow(True)
        assert feed.period_ns() == 1_000_000_000 and nat.period_ns == 20_000_000
        time.sleep(0.1)  # (the round then waiting ends at the old period)
        n = feed.rounds()
        time.sleep(1.5)
        assert feed.rounds() - n <= 2  # ≤ 1 a second (75 at the regular period)
        assert nat.slow_s() >= 1.5
        nat.slow(False)
        held = nat.slow_s()
        assert feed.period_ns() == 20_000_000 and held >= 1.6
        n = feed.rounds()
        _until(lambda: feed.rounds() >= n + 10, 10.0)  # regular again after the 1 s wait
        assert feed.rounds() >= n + 10 and nat.slow_s() == held
        nat.slow(True)
    finally:
        nat.stop()  # ends the slowed stretch
        feed.close()
    assert nat.slow_s() == nat.slow_ns / 1e9 > held
