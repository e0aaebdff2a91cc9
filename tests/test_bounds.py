"""Bounds on what others can hand us (issue #30 item 8): files in a --root tree, profile
strings, web config nesting, a basic-auth flood. Each test reproduces a reported hang,
blow-up or starvation and checks the one clear line that replaces it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectors import system
from collectors.host import LARGE_READ_LIMIT, READ_LIMIT, Host, HotFile, read_bounded

HFTAGENT = Path(sys.executable).with_name("hftagent")


def hftagent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(HFTAGENT), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200",
                                                "HFTAGENT_DB": os.devnull})


# ---- --root file reads ----------------------------------------------------------------------

def test_sparse_cmdline_is_refused_before_a_byte_is_read(tree_copy):
    root = tree_copy("vm-dev")
    with open(root / "proc/cmdline", "r+b") as fh:
        fh.truncate(2 << 30)  # sparse: no disk, but 2 GiB to read whole (was > 300 s)
    r = Host(root).read(Host(root).proc("cmdline"))
    assert r.value is None and r.path == "/proc/cmdline"
    assert r.reason == f"error: too large (2,147,483,648 bytes > {READ_LIMIT:,})"


def test_read_at_the_limit_and_one_over(tree_copy, tmp_path):
    h = Host(tree_copy("vm-dev"))
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert h.read(p, limit=100).value == "x" * 100
    r = h.read(p, limit=99)
    assert r.value is None and r.reason == "error: too large (100 bytes > 99)"


def test_read_bounded_stops_at_the_limit_when_the_size_is_unknown():
    # a pipe has no size, as a /proc seq_file says 0: the bound comes from reading
    r, w = os.pipe()
    try:
        os.write(w, b"y" * 300)
        os.close(w)
        w = -1
        assert read_bounded(r, 299) is None
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    r, w = os.pipe()
    os.write(w, b"z" * 300)
    os.close(w)
    assert read_bounded(r, 300) == b"z" * 300
    os.close(r)


def test_files_that_grow_with_cpus_and_irqs_get_the_large_bound(tree_copy):
    root = tree_copy("synthetic-2socket")
    h = Host(root)
    for rel in ("interrupts", "cpuinfo", "stat", "softirqs", "640/environ"):
        assert h.limit_for(h.proc(rel)) == LARGE_READ_LIMIT, rel
    for p in (h.proc("cmdline"), h.proc("640/status"), h.sys("devices/system/cpu/online"),
              h.proc("sys/kernel/osrelease"), h.etc("os-release")):
        assert h.limit_for(p) == READ_LIMIT, p
    # a real 256-CPU, 1,000-IRQ /proc/interrupts (~2.8 MB) is read whole
    head = "     " + "".join(f"CPU{c:<7}" for c in range(256)) + "\n"
    line = "".join(f"{'0':>11}" for _ in range(256))
    text = head + "".join(f"{i:>4}:{line}  IR-PCI-MSI  eth0-{i}\n" for i in range(1000))
    assert len(text) > 2_500_000
    (root / "proc/interrupts").write_text(text)
    assert h.read(h.proc("interrupts")).value == text.rstrip("\n")


def test_process_environ_in_a_tree_is_bounded(tree_copy):
    root = tree_copy("synthetic-2socket")
    with open(root / "proc/640/environ", "wb") as fh:
        fh.truncate(LARGE_READ_LIMIT + 1)
    info = system.process_info(Host(root), 640)
    assert info is not None and info.environ is None
    assert info.environ_reason.startswith("unreadable: error: too large (")


def test_hot_file_is_bounded_and_never_blocks_on_a_fifo(tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"1 " * 10_000)
    hf = HotFile(str(p), size=4096, limit=8192)
    with pytest.raises(OSError) as ei:
        hf.read()
    assert ei.value.errno == errno.EFBIG and "too large" in str(ei.value)
    hf.close()
    small = HotFile(str(p), limit=20_000)
    assert small.read() == b"1 " * 10_000
    small.close()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    hf = HotFile(str(fifo))  # O_NONBLOCK: the open returns although no writer exists
    with pytest.raises(OSError):
        hf.read()
    hf.close()


def test_audit_of_a_tree_with_a_huge_cmdline_is_one_error_finding(tree_copy):
    root = tree_copy("vm-dev")
    with open(root / "proc/cmdline", "r+b") as fh:
        fh.truncate(2 << 30)
    p = hftagent("audit", "--root", str(root), "--json")
    assert p.returncode in (1, 2), p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr
    import json
    f = {x["id"]: x for x in json.loads(p.stdout)["findings"]}["isolation.cmdline"]
    assert f["status"] == "error" and "too large (2,147,483,648 bytes" in f["current"]
    assert f["evidence"] == "/proc/cmdline"


# ---- web config ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "[" * 10_000 + "]" * 10_000,                                   # flow sequences
    "basic_auth_users: " + "{a: " * 10_000 + "1" + "}" * 10_000,   # flow mappings
    "".join(" " * i + f"k{i}:\n" for i in range(300)),             # block mappings
])
def test_web_config_nesting_is_bounded(tmp_path, text):
    from agent.errors import AgentError
    from agent.webconfig import MAX_DEPTH, load_web_config

    p = tmp_path / "deep.yml"
    p.write_text(text)
    with pytest.raises(AgentError) as ei:  # was: internal error: RecursionError
        load_web_config(str(p))
    assert f"nested more than {MAX_DEPTH} levels deep" in str(ei.value)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_web_config_depth_limit_admits_the_real_format(tmp_path):
    from agent.webconfig import MAX_DEPTH, _parse_yaml

    ok = "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)  # the mapping is level 1
    v = _parse_yaml(ok.encode(), "x")["a"]
    for _ in range(MAX_DEPTH - 2):
        assert isinstance(v, list) and len(v) == 1
        v = v[0]
    assert v == []


def test_web_config_size_is_bounded_before_parsing(tmp_path):
    from agent.errors import AgentError
    from agent.webconfig import MAX_CONFIG_BYTES, load_web_config

    p = tmp_path / "big.yml"
    p.write_text("a: [" + "1," * MAX_CONFIG_BYTES + "1]\n")  # 1 MiB of this took 15 s, 400 MB
    with pytest.raises(AgentError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_web_config(str(p))


def test_watch_with_a_deep_web_config_is_one_line(tmp_path):
    p = tmp_path / "deep.yml"
    p.write_text("[" * 10_000 + "]" * 10_000)
    r = hftagent("watch", "--listen", "127.0.0.1:0", "--web.config.file", str(p),
                 "--duration", "1")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hftagent: error: --web.config.file ")
    assert "nested more than" in lines[0]


# ---- profile strings ------------------------------------------------------------------------

@pytest.mark.parametrize("body,msg", [
    ('name = "{A}"\n', "name is 1,000,000 characters long, more than 100"),
    ('description = "{A}"\n', "description is 1,000,000 characters long, more than 1,000"),
    ('[settings.swappiness]\nexpected = 1\nwhy = "{A}"\n',
     "settings.swappiness.why is 1,000,000 characters long, more than 1,000"),
    ('name = "a\\u001b[2Jb"\n', "name contains a control character"),
    ('name = "two\\nlines"\n', "name contains a control character"),
    ('[settings.swappiness]\nexpected = 1\nwhy = "x\\u0085"\n', "why contains a control"),
    ('name = 5\n', "name must be a string"),
    ('[settings.swappiness]\nexpected = 1\nwhy = ["x"]\n', "why must be a string"),
    ('extends = "{A}"\n', "is not a built-in profile"),
    ('[settings.{A}]\nexpected = 1\n', "unknown setting"),
    ('[settings.turbo]\nexpected = "{A}"\n', "is not one of"),
    ('{A} = 1\n', "unknown top-level key"),
])
def test_profile_strings_are_bounded_one_line_errors(tmp_path, body, msg):
    from tuning.profiles import ProfileError, load_profile

    p = tmp_path / "p.toml"
    p.write_text(body.replace("{A}", "a" * 1_000_000))
    with pytest.raises(ProfileError, match=msg) as ei:
        load_profile(str(p))
    assert len(str(ei.value)) < 400 and "\n" not in str(ei.value)


def test_profile_strings_at_their_limits_load(tmp_path):
    from tuning.profiles import MAX_NAME_CHARS, MAX_TEXT_CHARS, load_profile

    p = tmp_path / "p.toml"
    p.write_text(f'extends = "hft-cpu"\nname = "{"n" * MAX_NAME_CHARS}"\n'
                 f'description = "Ünïcode — fine"\n[settings.swappiness]\nexpected = 1\n'
                 f'why = "{"w" * MAX_TEXT_CHARS}"\n')
    prof = load_profile(str(p))
    assert prof.name == "n" * MAX_NAME_CHARS and prof.description == "Ünïcode — fine"
    assert prof.get("swappiness").why == "w" * MAX_TEXT_CHARS
    q = tmp_path / "no-name.toml"
    q.write_text('extends = "hft-cpu"\n')
    assert load_profile(str(q)).name == "no-name"
    r = tmp_path / "bad\x1bname.toml"
    r.write_text('extends = "hft-cpu"\n')
    with pytest.raises(Exception, match="file name .* contains a control character"):
        load_profile(str(r))


def test_audit_with_a_million_character_profile_name_is_one_line(tree_copy, tmp_path):
    p = tmp_path / "long.toml"
    p.write_text('extends = "hft-cpu"\nname = "' + "a." * 500_000 + '"\n')
    r = hftagent("audit", "--root", str(tree_copy("vm-dev")), "--profile", str(p))
    assert r.returncode == 1  # was: a hang in rich's highlighter (100 k characters: 81 s)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hftagent: error: ")
    assert "name is 1,000,000 characters long" in lines[0]
