"""Attach probes only the file it parsed (issue #34 items 1, 6 and 8).

A local user who owns the target may re-map the library's address range after root read its
symbols; before the fix root's uprobe then landed in whatever was mapped there at definition
time, at the user's offset: a root service's return value changed 0x11223344 -> 0x112233cc.
Here a target the throw-away user owns maps a crafted ``libtensorflowlite_c.so`` whose
``TfLiteInterpreterInvoke`` starts one byte into a root-owned library's ``movl
$0x11223344, %eax``, and swaps in that library (``MAP_FIXED``) after root's read; a root
"service" calls the root library the whole time. Also: the /proc/PID/root fallback refuses a
FIFO, a link and a root-only file fast, a library another user may write is refused without
``--attach-unsafe-library``, and what `attach` says for pid 1, a kernel thread, and a
process whose every candidate library is refused.

Root, cc, useradd and (for the uprobe tests) tracefs with uprobe events are needed; skipped
otherwise. Every process attached to is one the test started."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent.trace import attach, elf, uprobe
from collectors.host import Host
from tests.conftest import needs_uprobes

REPO = Path(__file__).resolve().parents[1]
TRACEFS = Path("/sys/kernel/tracing")
CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
VALUE = 0x11223344

# The root library: svc_value returns 0x11223344 (b8 44 33 22 11 c3).
SVC_ASM = (r'asm(".text\n.globl svc_value\n.type svc_value,@function\nsvc_value:\n'
           r'movl $0x11223344, %eax\nret\n.size svc_value, .-svc_value\n");' "\n")
# The crafted library: the same bytes, with a function symbol one byte in (on the immediate).
CRAFTED_ASM = (r'asm(".text\n.globl svc_value\n.type svc_value,@function\nsvc_value:\n'
               r'.byte 0xb8\n.globl TfLiteInterpreterInvoke\n'
               r'.type TfLiteInterpreterInvoke,@function\nTfLiteInterpreterInvoke:\n'
               r'.byte 0x44,0x33,0x22,0x11\nret\n");' "\n")

# The user's target: dlopen the crafted library, then, on a stdin line ("stdin") or on the
# first open of the crafted file by anyone ("inotify"), map the root library over the crafted
# one's executable range at the same file offset.
TARGET_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char line[4096], name[4000], perms[8];
    unsigned long lo = 0, hi = 0, off = 0, a, b, o;
    if (argc < 4 || !dlopen(argv[1], RTLD_NOW)) return 2;
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps)) {
        name[0] = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %3999s", &a, &b, perms, &o, name) >= 4
                && strchr(perms, 'x') && !strcmp(name, argv[1])) { lo = a; hi = b; off = o; }
    }
    if (!lo) return 3;
    int in = -1;
    if (!strcmp(argv[3], "inotify")) {
        in = inotify_init1(0);
        if (in < 0 || inotify_add_watch(in, argv[1], IN_OPEN) < 0) return 4;
    }
    printf("ready\n");
    fflush(stdout);
    if (in >= 0 ? read(in, line, sizeof line) <= 0 : !fgets(line, sizeof line, stdin)) return 0;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0 || mmap((void *)lo, hi - lo, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED,
                       fd, off) == MAP_FAILED) return 5;
    printf("swapped\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {}
    return 0;
}
"""

# The root service: calls svc_value every millisecond; says each changed value at once and
# how many calls it made when stopped.
SERVICE = r"""
import ctypes, signal, sys, time
f = ctypes.CDLL(sys.argv[1]).svc_value
f.restype = ctypes.c_uint32
n = 0
def done(*_):
    print(f"calls {n}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
print("ready", flush=True)
while True:
    v = f()
    n += 1
    if v != 0x11223344:
        print(f"changed {v:#x}", flush=True)
    time.sleep(0.001)
"""

LOOP = r"""
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
"""


def _user_python() -> str:
    """A Python the throw-away user may run (the venv's lies under root's home)."""
    py = shutil.which("python3", path="/usr/bin:/bin")
    if py is None:
        pytest.skip("no system python3 for the user's processes")
    return py


def _cc(src: Path, out: Path, *flags: str) -> None:
    r = subprocess.run(["cc", *flags, "-o", str(out), str(src)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cc failed: {r.stderr.strip()[:200]}")


def _needs_cc() -> None:
    if not shutil.which("cc"):
        pytest.skip("no C compiler")



def _dir(owner: tuple[int, int] | None = None, mode: int = 0o755) -> Path:
    """A fresh directory under /tmp (mkdtemp: unpredictable, 0700, ours), given to
    ``owner`` (uid, gid) and ``mode``; the user's processes must reach it."""
    d = Path(tempfile.mkdtemp(prefix="hftpin-", dir="/tmp"))
    if owner:
        os.chown(d, *owner)
    os.chmod(d, mode)
    return d


@pytest.fixture
def swap_kit(user) -> Iterator[dict]:
    """The root library (root-owned, in a root-owned directory), the user's crafted library
    (in the user's directory) and the target program; the crafted entry lies one byte into
    the root library's function, at the same file offset."""
    _needs_cc()
    if platform.machine() != "x86_64":
        pytest.skip("the crafted bytes are x86-64 code")
    _, uid, gid = user
    root, mine = _dir(), _dir((uid, gid))
    try:
        (root / "svc.c").write_text(SVC_ASM)
        (root / "crafted.c").write_text(CRAFTED_ASM)
        (root / "target.c").write_text(TARGET_C)
        _cc(root / "svc.c", root / "libhftsvc.so", "-shared", "-nostdlib")
        _cc(root / "crafted.c", mine / "libtensorflowlite_c.so", "-shared", "-nostdlib")
        _cc(root / "target.c", root / "target", "-O1")
        crafted = mine / "libtensorflowlite_c.so"
        os.chown(crafted, uid, gid)
        os.chmod(crafted, 0o755)
        _, svc = elf.resolve(str(root / "libhftsvc.so"), ["svc_value"])
        _, cr = elf.resolve(str(crafted), ["TfLiteInterpreterInvoke"])
        assert cr["TfLiteInterpreterInvoke"].offset == svc["svc_value"].offset + 1, \
            "the two libraries are laid out differently: the swap would not line up"
        yield {"svc": root / "libhftsvc.so", "crafted": crafted, "target": root / "target",
               "user": user}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)


def _start_target(kit: dict, mode: str) -> subprocess.Popen:
    _, uid, gid = kit["user"]
    p = subprocess.Popen([str(kit["target"]), str(kit["crafted"]), str(kit["svc"]), mode],
                         user=uid, group=gid, extra_groups=[], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        p.wait()
        pytest.fail(f"target did not start (rc {p.poll()}): {line!r}")
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


@contextmanager
def _service(lib: Path) -> Iterator[dict]:
    """The root service, running while the block runs; ``out["changed"]`` and
    ``out["calls"]`` after."""
    p = subprocess.Popen([sys.executable, "-c", SERVICE, str(lib)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    out: dict = {}
    try:
        yield out
    finally:
        p.send_signal(signal.SIGTERM)
        text, _ = p.communicate(timeout=30)
        out["changed"] = [x for x in text.splitlines() if x.startswith("changed")]
        calls = [x for x in text.splitlines() if x.startswith("calls ")]
        out["calls"] = int(calls[0].split()[1]) if calls else 0


def _swap(target: subprocess.Popen) -> None:
    target.stdin.write("swap\n")
    target.stdin.flush()
    assert target.stdout.readline().strip() == "swapped"


def _one_try(host: Host, kit: dict, inst: Path, after_read: bool, monkeypatch) -> str | None:
    """One attach on a fresh target that swaps its mapping after root's read
    (``after_read``) or after the plan, before the events are defined. The refusal's
    message, or None when it attached (then enabled for a while, as watch would)."""
    target = _start_target(kit, "stdin")
    real = elf.resolve

    def read_then_swap(*a, **kw):
        out = real(*a, **kw)
        _swap(target)
        return out

    try:
        if after_read:
            monkeypatch.setattr(attach.elf, "resolve", read_then_swap)
        try:
            p = attach.plan(host, target.pid)
        finally:
            monkeypatch.setattr(attach.elf, "resolve", real)
        if not after_read:
            _swap(target)
        u = uprobe.Uprobes(TRACEFS, p.targets)
        try:
            u.define()
        except uprobe.UprobeError as exc:
            return str(exc)
        try:
            u.enable(inst, [target.pid])
            time.sleep(0.05)            # ~50 service calls with the probes armed
        finally:
            u.remove()
        return None
    except attach.AttachError as exc:
        return str(exc)
    finally:
        _stop(target)


def test_a_mapping_swapped_after_the_read_changes_no_root_service_value(swap_kit,
                                                                        monkeypatch):
    needs_uprobes(cpus=1)
    host = Host()
    inst = TRACEFS / "instances" / f"hftpintest-{os.getpid()}"
    inst.mkdir()
    refusals: list[str | None] = []
    try:
        with _service(swap_kit["svc"]) as svc:
            for i in range(50):   # half swap right after the read, half before the definition
                refusals.append(_one_try(host, swap_kit, inst, i % 2 == 0, monkeypatch))
    finally:
        inst.rmdir()
    assert svc["changed"] == [], svc["changed"][:5]          # 0x11223344 on every call
    assert svc["calls"] >= 50
    assert all(r is not None for r in refusals), refusals   # every try refused ...
    assert all("no longer maps libtensorflowlite_c.so" in r and "\n" not in r
               for r in refusals), refusals[:3]               # ... in one line saying why
    assert f"hftagent_{os.getpid()}/" not in (TRACEFS / "uprobe_events").read_text()


def test_a_mapping_swapped_before_our_open_is_refused(swap_kit, monkeypatch):
    """The swap lands between root's read of /proc/PID/maps and its open of map_files: the
    file opened is the root library (which has a function of the asked name), not the one
    maps named; the maps line no longer matches what was read, so nothing is attached."""
    target = _start_target(swap_kit, "stdin")
    real = attach._open_map_file

    def swap_then_open(host, pid, m):
        _swap(target)
        return real(host, pid, m)

    monkeypatch.setattr(attach, "_open_map_file", swap_then_open)
    try:
        with pytest.raises(attach.AttachError, match="no longer maps libtensorflowlite_c.so"):
            attach.plan(Host(), target.pid, symbol="libtensorflowlite_c.so:svc_value")
    finally:
        _stop(target)


def test_events_are_defined_on_our_descriptor_and_the_descriptor_lives_with_them(infer_lib):
    """The definition names /proc/self/fd/N of the descriptor the symbols were read from; the
    probe fires in the target; remove() closes the descriptor."""
    needs_uprobes(cpus=1)
    child = subprocess.Popen([sys.executable, "-c", LOOP.replace(
        "sys.stdin.read()", "while True:\n    lib.hft_infer(100); time.sleep(0.002)"),
        str(infer_lib)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    inst = TRACEFS / "instances" / f"hftpintest-{os.getpid()}"
    try:
        assert child.stdout.readline().strip() == "ready"
        p = attach.plan(Host(), child.pid, symbol=f"{infer_lib.name}:hft_infer")
        pinned = p.targets[0].pin
        fd = pinned.fd
        assert os.fstat(fd).st_ino == os.stat(infer_lib).st_ino
        u = uprobe.Uprobes(TRACEFS, p.targets)
        u.define()
        inst.mkdir()
        try:
            line = [x for x in (TRACEFS / "uprobe_events").read_text().splitlines()
                    if f"{u.group}/call0" in x]
            assert line and f"/proc/self/fd/{fd}:0x" in line[0], line
            u.enable(inst, [child.pid])
            time.sleep(0.3)
            (inst / "tracing_on").write_text("0")
            assert sum(" call0:" in x for x in (inst / "trace").read_text().splitlines()) >= 5
        finally:
            assert u.remove() == []
            inst.rmdir()
        assert pinned.fd == -1
        try:
            now = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            now = None
        assert now != str(infer_lib)                     # closed with the events
    finally:
        _stop(child)


def test_watch_attach_refuses_a_target_that_swaps_on_our_open(swap_kit):
    """`hftagent watch --attach` as a person runs it, against a target that swaps its
    mapping as soon as anyone opens the crafted file (inotify IN_OPEN), run SCHED_FIFO so
    the swap comes before our parse is done: one line, exit 1, the service unchanged."""
    needs_uprobes(cpus=1)
    target = _start_target(swap_kit, "inotify")
    try:
        try:
            os.sched_setscheduler(target.pid, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            os.setpriority(os.PRIO_PROCESS, target.pid, -20)
        with _service(swap_kit["svc"]) as svc:
            r = subprocess.run([*CLI, "watch", "--attach", str(target.pid), "--duration", "2",
                                "--no-live", "--no-history", "--trace", "on"], cwd=REPO,
                               capture_output=True, text=True, timeout=120)
    finally:
        _stop(target)
    assert svc["changed"] == [] and svc["calls"] > 0
    assert r.returncode == 1, (r.stdout[-500:], r.stderr)
    assert "no longer maps libtensorflowlite_c.so" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# -- the /proc/PID/root fallback (no map_files: e.g. without CAP_SYS_ADMIN) ----------------

@pytest.fixture
def user_lib(user, infer_lib) -> Iterator[dict]:
    """The user's directory ``d`` with ``sub/libx.so`` (a copy of the test library, the
    user's), a target the user runs that maps it, and a root-only ELF file with a marker."""
    _, uid, gid = user
    d, secret_dir = _dir((uid, gid)), _dir(mode=0o700)
    try:
        (d / "sub").mkdir()
        os.chown(d / "sub", uid, gid)
        lib = d / "sub" / "libx.so"
        shutil.copy(infer_lib, lib)
        os.chown(lib, uid, gid)
        secret = secret_dir / "libx.so"
        shutil.copy(infer_lib, secret)
        with open(secret, "ab") as f:
            f.write(b"ROOT-ONLY-SECRET")
        os.chmod(secret, 0o600)
        child = subprocess.Popen([_user_python(), "-c", LOOP, str(lib)], user=uid, group=gid,
                                 extra_groups=[], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            yield {"dir": d, "lib": lib, "pid": child.pid, "secret": secret, "user": user}
        finally:
            _stop(child)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(secret_dir, ignore_errors=True)


def _as_user(user, code: str, *args: str) -> None:
    _, uid, gid = user
    subprocess.run([_user_python(), "-c", code, *args], user=uid, group=gid,
                   extra_groups=[], check=True, timeout=30)


@contextmanager
def _no_map_files(monkeypatch, meanwhile=None):
    """map_files refused (its range gone since maps was read, as when the target re-maps it,
    or no CAP_SYS_ADMIN): the /proc/PID/root fallback is taken; ``meanwhile()`` runs first,
    in the window between our read of maps and the open."""
    def refused(host, pid, m):
        if meanwhile is not None:
            meanwhile()
        raise FileNotFoundError(2, "No such file or directory")
    monkeypatch.setattr(attach, "_open_map_file", refused)
    yield


@contextmanager
def _deadline(seconds: int):
    """Fail, never hang: an open that blocks (a FIFO) is interrupted."""
    def late(*_):
        raise TimeoutError(f"took over {seconds} s")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_fallback_reads_the_mapped_file_when_nothing_was_swapped(user_lib, monkeypatch):
    with _no_map_files(monkeypatch):
        p = attach.plan(Host(), user_lib["pid"], symbol="libx.so:hft_infer")
    (t,) = p.targets
    assert t.map_files == f"/proc/{user_lib['pid']}/root{user_lib['lib']}"
    assert os.fstat(t.pin.fd).st_ino == os.stat(user_lib["lib"]).st_ino
    p.close()


SWAPS = {   # what the user puts at the mapped path; what the refusal says
    "fifo": ("import os, sys; os.unlink(sys.argv[1]); os.mkfifo(sys.argv[1])", "is a FIFO"),
    "link": ("import os, sys; os.unlink(sys.argv[1]); os.symlink(sys.argv[2], sys.argv[1])",
             "is a link"),
    "dir-link": ("import os, sys; d = os.path.dirname(sys.argv[1]); "
                 "os.rename(d, d + '.old'); os.symlink(os.path.dirname(sys.argv[2]), d)",
                 "cannot be opened: not a directory"),
    "root-only": ("import os, sys; os.rename(sys.argv[3], sys.argv[1])", "not the inode"),
}


@pytest.mark.parametrize("how", sorted(SWAPS))
def test_the_fallback_refuses_what_the_user_put_at_the_path_fast(user_lib, monkeypatch, how):
    """After root read maps, the user replaces the mapped path (a FIFO would block a plain
    open for good; a link or a root-only file would have root parse and print it)."""
    code, said = SWAPS[how]
    lib, secret = user_lib["lib"], user_lib["secret"]
    planted = user_lib["dir"] / "planted.so"   # a root-only file root left in the user's dir
    shutil.copy(secret, planted)
    os.chmod(planted, 0o600)

    def swap() -> None:
        _as_user(user_lib["user"], code, str(lib), str(secret), str(planted))

    t0 = time.monotonic()
    with _no_map_files(monkeypatch, swap), _deadline(20), \
            pytest.raises(attach.AttachError) as exc:
        attach.plan(Host(), user_lib["pid"], symbol="libx.so:hft_infer")
    assert time.monotonic() - t0 < 20
    msg = str(exc.value)
    assert said in msg and msg.endswith("refused") and "\n" not in msg, msg
    assert "SECRET" not in msg and "7f 45 4c 46" not in msg and "ELF" not in msg


def test_a_root_only_file_is_refused_even_with_the_mapped_inode(user_lib, monkeypatch):
    """The mapped file itself, made root-only since the process mapped it: through the
    root path, what the process's owner may not read is not read."""
    os.chown(user_lib["lib"], 0, 0)
    os.chmod(user_lib["lib"], 0o600)
    with _no_map_files(monkeypatch), pytest.raises(attach.AttachError,
                                                   match="not readable by the process"):
        attach.plan(Host(), user_lib["pid"], symbol="libx.so:hft_infer")


# -- who may write the library ------------------------------------------------------------

@pytest.fixture
def root_target(infer_lib) -> Iterator[tuple[int, Path]]:
    """A root process mapping its own copy of the test library (in a root directory)."""
    d = _dir()
    lib = d / "libw.so"
    shutil.copy(infer_lib, lib)
    os.chmod(lib, 0o755)
    child = subprocess.Popen([sys.executable, "-c", LOOP, str(lib)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        yield child.pid, lib
    finally:
        _stop(child)
        shutil.rmtree(d, ignore_errors=True)


def test_a_library_another_user_may_write_is_refused_without_the_override(root_target,
                                                                         user):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    pid, lib = root_target
    host = Host()
    for mode, owner, said in ((0o757, (0, 0), "writable by every user"),
                              (0o775, (0, user[2]), f"writable by group {user[2]}"),
                              (0o755, (user[1], 0), f"owned by uid {user[1]}")):
        os.chown(lib, *owner)
        os.chmod(lib, mode)
        with pytest.raises(attach.AttachError, match="--attach-unsafe-library") as exc:
            attach.plan(host, pid, symbol="libw.so:hft_infer")
        assert said in str(exc.value), str(exc.value)
        p = attach.plan(host, pid, symbol="libw.so:hft_infer", unsafe_library=True)
        assert p.targets[0].symbol == "hft_infer"
        p.close()
    os.chown(lib, 0, 0)
    os.chmod(lib, 0o755)
    attach.plan(host, pid, symbol="libw.so:hft_infer").close()


def test_a_library_on_fuse_is_refused_before_anything_is_opened(tmp_path):
    """A FUSE server answers (or never answers) every open and read of its files: the
    filesystem is told from the maps line's device and the target's mountinfo, before any
    open (the fake /proc here has no map_files: an open would fail another way)."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc" / "123").mkdir(parents=True)
    (tmp_path / "proc" / "123" / "mountinfo").write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "41 27 0:42 / /home/u/mnt rw,nosuid,nodev shared:9 - fuse.sshfs u@h:/ rw,user_id=1000\n")
    host = Host(tmp_path, procfs=tmp_path / "proc", sysfs=tmp_path / "sys")
    owner = attach.Owner(frozenset({1000}), frozenset({1000}), frozenset())
    m = attach.Mapping(0x1000, 0x2000, "/home/u/mnt/libtensorflowlite_c.so", 7, "00:2a")
    assert attach._fuse(host, 123, m) == "fuse.sshfs"
    with pytest.raises(attach.AttachError, match=r"FUSE filesystem \(fuse.sshfs\).*overrides"):
        attach.pin(host, 123, m, owner)
    with pytest.raises(attach.AttachError, match="cannot be opened"):   # overridden: opened
        attach.pin(host, 123, m, owner, unsafe_library=True)
    other = attach.Mapping(0x1000, 0x2000, "/usr/lib/libc.so.6", 7, "00:15")
    assert attach._fuse(host, 123, other) is None


def test_attach_check_says_the_override_in_one_line(root_target):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    pid, lib = root_target
    os.chmod(lib, 0o777)
    base = [*CLI, "attach", str(pid), "--check", "--attach-symbol", "libw.so:hft_infer"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1 and "writable by every user" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = subprocess.run([*base, "--attach-unsafe-library"], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 0 and "hft_infer" in r.stdout, r.stderr


# -- what attach says when it cannot ------------------------------------------------------

def test_attach_1_as_root_says_what_failed_not_that_it_needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    r = subprocess.run([*CLI, "attach", "1", "--check"], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode in (0, 1), r.stderr
    assert "needs root" not in r.stderr and "Traceback" not in r.stderr
    if r.returncode == 1:
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def _kernel_thread() -> int | None:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                st = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(st[st.rindex(")") + 2:].split()[6]) & attach.PF_KTHREAD:
                return int(name)
    return None


def test_a_kernel_thread_is_named_as_one():
    pid = _kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread visible in this PID namespace")
    with pytest.raises(attach.AttachError, match="is a kernel thread"):
        attach.plan(Host(), pid)


def test_denied_maps_as_root_say_why(monkeypatch):
    host = Host()
    monkeypatch.setattr(attach.os, "geteuid", lambda: 0)
    monkeypatch.setattr(attach, "_caps", lambda h, pid, f: (1 << 19) if pid == "self" else 0)
    msg = attach._maps_denied(host, 1, "permission")
    assert "needs root" not in msg and "security module" in msg and "permission denied" in msg
    monkeypatch.setattr(attach, "_caps", lambda h, pid, f: 0x1 if pid == "self" else 0x3)
    msg = attach._maps_denied(host, 1, "permission")
    assert "lacks CAP_SYS_PTRACE" in msg and "mask 0x2" in msg
    monkeypatch.setattr(attach.os, "geteuid", lambda: 1000)
    assert "attach needs root" in attach._maps_denied(host, 1, "permission")


NOT_A_FUNCTION_C = r"""
int TfLiteInterpreterInvoke = 7;            /* a variable of the runtime's name */
int hft_nothing(void) { return 0; }
"""


def test_every_candidate_librarys_reason_reaches_the_line(tmp_path):
    """Two runtime libraries, neither with its function (one holds a variable of that name):
    both reasons are on the "maps no function" line, not the last one's only."""
    _needs_cc()
    (tmp_path / "a.c").write_text(NOT_A_FUNCTION_C)
    (tmp_path / "b.c").write_text("int hft_nothing(void) { return 1; }\n")
    _cc(tmp_path / "a.c", tmp_path / "libtensorflowlite_c.so", "-shared", "-fPIC")
    _cc(tmp_path / "b.c", tmp_path / "libLiteRt.so", "-shared", "-fPIC")
    code = ("import ctypes, sys\nfor p in sys.argv[1:]: ctypes.CDLL(p)\n"
            "print('ready', flush=True)\nsys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "libLiteRt.so"),
                              str(tmp_path / "libtensorflowlite_c.so")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(attach.AttachError) as exc:
            attach.plan(Host(), child.pid)
    finally:
        _stop(child)
    msg = str(exc.value)
    assert "libLiteRt.so has none of LiteRtRunCompiledModel" in msg, msg
    assert "libtensorflowlite_c.so has none of TfLiteInterpreterInvoke" in msg, msg
    assert "not a function" in msg, msg        # the ELF reader's reason for the variable
