"""Shared test helpers: fixture trees are copied before anything could write to them."""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import secrets
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = Path(__file__).resolve().parent / "golden"
TREES = ("vm-dev", "gpu-h200", "synthetic-2socket", "synthetic-tuned")


@pytest.fixture
def tree_copy(tmp_path):
    """Writable copy of a fixture tree: ``tree_copy("synthetic-2socket") -> Path``."""

    def make(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return make


@pytest.fixture(autouse=True)
def _private_history_db(tmp_path, monkeypatch):
    """Commands record runs in a history DB by default: keep tests out of the user's one."""
    monkeypatch.setenv("HFTAGENT_DB", str(tmp_path / "history.sqlite"))


_AFFINITY = __import__("os").sched_getaffinity(0)  # pytest's own, as it started


@pytest.fixture(autouse=True)
def _restore_affinity():
    """A WatchSession run in-process pins its process (pytest here) to the housekeeping CPUs:
    every test starts and ends with pytest's own affinity, so a later test still sees both
    CPUs of the machine."""
    import os
    if os.sched_getaffinity(0) != _AFFINITY:
        os.sched_setaffinity(0, _AFFINITY)
    yield
    if os.sched_getaffinity(0) != _AFFINITY:
        os.sched_setaffinity(0, _AFFINITY)


INFER_C = r"""
int hft_infer(int n) { volatile int s = 0; for (int i = 0; i < n; i++) s += i; return s; }
int hft_other(int n) { return n * 3; }
"""


@pytest.fixture(scope="session")
def infer_lib(tmp_path_factory) -> Path:
    """A shared library the tests build, with two plain C functions (no C++, nothing that
    throws): what tests attach uprobes to and read ELF symbols from."""
    import subprocess
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("inferlib")
    (d / "infer.c").write_text(INFER_C)
    so = d / "libhftinfer.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(so), str(d / "infer.c")],
                   check=True)
    return so


@pytest.fixture
def user():
    """A throw-away system user (no home, no shell): (name, uid, gid); removed after. Tests of
    what a local user can do to a root run use it (needs root and useradd; skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (useradd)")
    if not shutil.which("useradd") or not shutil.which("userdel"):
        pytest.skip("no useradd/userdel")
    name = f"hftt{secrets.token_hex(4)}"
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell",
                        "/usr/sbin/nologin", name], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"useradd failed: {r.stderr.strip()}")
    pw = pwd.getpwnam(name)
    try:
        yield name, pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        if shutil.which("groupdel"):
            subprocess.run(["groupdel", name], capture_output=True)  # where userdel left it


def needs_uprobes(cpus: int = 2) -> None:
    """Skip unless this run can define uprobe events: root, tracefs at /sys/kernel/tracing
    with instances, CONFIG_UPROBE_EVENTS, and at least ``cpus`` CPUs to pin the target and
    watch apart. The tests that attach to their own processes call it first."""
    from agent.trace import uprobe
    tracefs = Path("/sys/kernel/tracing")
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if not (tracefs / "instances").is_dir():
        pytest.skip("tracefs not mounted at /sys/kernel/tracing")
    why = uprobe.available(tracefs)
    if why:
        pytest.skip(why)
    if len(os.sched_getaffinity(0)) < cpus:
        pytest.skip(f"needs {cpus} CPUs")


@contextlib.contextmanager
def parked_thread():
    """A thread of this process that waits until the block ends (then exits and is
    joined); yields its kernel tid (the sched collector's thread tests)."""
    done, tid = threading.Event(), queue.SimpleQueue()
    th = threading.Thread(target=lambda: (tid.put(threading.get_native_id()), done.wait(60)),
                          daemon=True)
    th.start()
    try:
        yield tid.get(timeout=10)
    finally:
        done.set()
        th.join(10)
