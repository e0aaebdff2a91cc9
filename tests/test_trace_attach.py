"""agent/trace/elf.py, attach.py and uprobe.py: a function's file offset from a library the
test builds, what `attach` finds in a process the test starts, and real uprobe events on
that process (defined, hit, removed; a killed run's group removed by the next, another tool's
never)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.trace import attach, elf, uprobe
from collectors.host import Host

LOOP = r"""
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    lib.hft_infer(1000)
    time.sleep(0.002)
"""


@pytest.fixture(scope="module")
def lib(infer_lib) -> Path:
    return infer_lib  # tests/conftest.py builds it


def test_offset_points_at_the_functions_own_bytes(lib):
    info, found = elf.resolve(str(lib), ["hft_infer", "hft_other", "nope", "hft_*"])
    assert info.machine in elf.MACHINES.values() and ".dynsym" in info.tables
    assert found["nope"] is None
    s = found["hft_infer"]
    assert s.table == ".dynsym" and s.binding == "GLOBAL" and s.size > 0
    assert found["hft_*"].name in ("hft_infer", "hft_other")   # a prefix
    # the bytes at the file offset are the bytes the loaded function starts with
    dl = ctypes.CDLL(str(lib))
    addr = ctypes.cast(dl.hft_infer, ctypes.c_void_p).value
    live = ctypes.string_at(addr, 8)
    with open(lib, "rb") as f:
        f.seek(s.offset)
        assert f.read(8) == live == s.first_bytes[:8]


def test_not_an_elf_and_truncated_files_are_one_line_errors(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"not an elf at all, but long enough to have a header" * 2)
    with pytest.raises(elf.ElfError, match="not an ELF"):
        elf.resolve(str(p), ["f"])
    import struct
    hdr = bytearray(b"\x7fELF\x02\x01" + b"\0" * 58)
    struct.pack_into("<Q", hdr, 40, 10**6)          # section headers past the end
    struct.pack_into("<HH", hdr, 58, 64, 3)
    p.write_bytes(bytes(hdr))
    with pytest.raises(elf.ElfError, match="truncated"):
        elf.resolve(str(p), ["f"])
    p.write_bytes(b"\x7fELF\x01\x01" + b"\0" * 58)   # 32-bit
    with pytest.raises(elf.ElfError, match="64-bit"):
        elf.resolve(str(p), ["f"])
    with pytest.raises(elf.ElfError):
        elf.resolve(str(tmp_path / "missing.so"), ["f"])


def test_entry_instruction_words():
    assert "emulated" in elf.describe_entry(b"\x55\x48\x89\xe5", "x86_64")
    assert elf.describe_entry(b"\xf3\x0f\x1e\xfa\x55", "x86_64").startswith("endbr64; push")
    assert "single-stepped" in elf.describe_entry(b"\x48\x8d\x05\x00\x00\x00", "x86_64")


@pytest.fixture
def child(lib):
    p = subprocess.Popen([sys.executable, "-c", LOOP, str(lib), "60"], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p
    p.kill()
    p.wait()


def test_plan_finds_a_named_symbol_and_explains_what_it_cannot(child, lib):
    host = Host()
    p = attach.plan(host, child.pid, symbol=f"{lib.name}:hft_infer")
    (t,) = p.targets
    assert t.symbol == "hft_infer" and not t.returns        # any symbol: entry only
    assert t.map_files.startswith(str(host.proc(child.pid, "map_files")))
    assert attach.plan(host, child.pid, symbol=f"{lib.name}:hft_infer",
                       unsafe_return=True).targets[0].returns
    with pytest.raises(attach.AttachError, match="no known inference runtime|maps no function"):
        attach.plan(host, child.pid)
    with pytest.raises(attach.AttachError, match="has none of"):
        attach.plan(host, child.pid, symbol=f"{lib.name}:missing_fn")
    with pytest.raises(attach.AttachError, match="LIB:SYMBOL"):
        attach.plan(host, child.pid, symbol="nocolon")
    with pytest.raises(attach.AttachError, match="no such process"):
        attach.plan(host, 2**22 + 12345)
    with pytest.raises(attach.AttachError, match="must be one of"):
        attach.plan(host, child.pid, runtime="onnx")


def _tracefs() -> Path:
    t = Path("/sys/kernel/tracing")
    if os.geteuid() != 0 or not (t / "instances").is_dir():
        pytest.skip("needs root and tracefs mounted at /sys/kernel/tracing")
    why = uprobe.available(t)
    if why:
        pytest.skip(why)
    return t


def test_uprobes_fire_for_the_childs_calls_and_are_removed(child, lib):
    tf = _tracefs()
    host = Host()
    plan = attach.plan(host, child.pid, symbol=f"{lib.name}:hft_infer")
    plan.targets[0].returns = True     # a C function that cannot throw
    u = uprobe.Uprobes(tf, plan.targets)
    u.define()
    inst = tf / "instances" / f"hfttest-{os.getpid()}"
    inst.mkdir()
    try:
        u.enable(inst, [int(t) for t in os.listdir(f"/proc/{child.pid}/task")])
        time.sleep(0.3)
        (inst / "tracing_on").write_text("0")
        lines = (inst / "trace").read_text().splitlines()
        calls = [x for x in lines if f"{u.group}" in x or " call0:" in x]
        assert sum(" call0:" in x for x in lines) >= 10, lines[-5:]
        assert sum(" ret0:" in x for x in lines) >= 10
        assert calls
    finally:
        assert u.remove() == []
        inst.rmdir()
    assert u.group not in (tf / "uprobe_events").read_text()


def test_a_killed_runs_group_is_removed_and_another_tools_is_not(child, lib):
    tf = _tracefs()
    host = Host()
    plan = attach.plan(host, child.pid, symbol=f"{lib.name}:hft_infer")
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = f"{plan.targets[0].map_files}:0x{plan.targets[0].offset:x}"
    ev = tf / "uprobe_events"
    uprobe._append(ev, f"p:hftagent_{dead.pid}/call0 {path}")
    uprobe._append(ev, f"p:othertool_{dead.pid}/call0 {path}")
    try:
        notes = uprobe.remove_stale(host, tf)
        text = ev.read_text()
        assert f"hftagent_{dead.pid}/" not in text and any("stale" in n for n in notes)
        assert f"othertool_{dead.pid}/call0" in text
    finally:
        uprobe._append(ev, f"-:othertool_{dead.pid}/call0")


def test_attach_check_command(child, lib):
    cli = [sys.executable, "-c", "from agent.cli import main; main()"]
    r = subprocess.run([*cli, "attach", str(child.pid), "--check", "--attach-symbol",
                        f"{lib.name}:hft_infer"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "hft_infer" in r.stdout and "offset    0x" in r.stdout and "entry only" in r.stdout
    r = subprocess.run([*cli, "attach", str(child.pid), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "known inference runtime" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
