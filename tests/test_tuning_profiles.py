from __future__ import annotations

import pytest

from tuning.findings import Status
from tuning.profiles import BUILTIN, ProfileError, load_profile


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_profiles_load_and_explain_every_setting(name):
    p = load_profile(name)
    assert p.name == name and p.settings
    assert all(s.why for s in p.settings.values())


def test_bench_differs_where_it_should():
    assert load_profile("bench").expected("turbo") == "off"
    assert load_profile("hft-gpu").expected("gpu_compute_mode") == "EXCLUSIVE_PROCESS"


def test_user_profile_extends(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('extends = "hft-cpu"\nname = "mine"\n[settings.swappiness]\nexpected = 10\n')
    p = load_profile(str(f))
    assert p.name == "mine" and p.expected("swappiness") == 10
    assert p.get("swappiness").severity == Status.WARN  # inherited
    assert p.expected("governor") == "performance"


@pytest.mark.parametrize("body,msg", [
    ("[settings.nope]\nexpected = 1\n", "unknown setting"),
    ("[settings.swappiness]\nexpected = 'high'\n", "must be int"),
    ("[settings.swappiness]\nexpected = true\n", "must be int"),
    ("[settings.turbo]\nexpected = 'maybe'\n", "not one of"),
    ("[settings.swappiness]\nexpected = 1\nseverity = 'meh'\n", "severity"),
    ("[settings.swappiness]\nwhy = 'x'\n", "needs an 'expected'"),
    ("this is = = not toml", "not valid TOML"),
    ('extends = "nope"\n', "not a built-in"),
    ("bogus = 1\n", "unknown top-level"),
])
def test_malformed_profiles(tmp_path, body, msg):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ProfileError, match=msg):
        load_profile(str(f))


def test_unknown_and_missing():
    with pytest.raises(ProfileError, match="unknown profile"):
        load_profile("hft-fpga")
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile("/nonexistent/x.toml")


@pytest.mark.adversarial
@pytest.mark.parametrize("what,msg", [
    ("/dev/zero", "not a regular file"),    # read without bound before
    ("fifo", "not a regular file"),         # blocked in open() before
    ("dir", "not a regular file"),
    ("huge", "a profile is at most|more than"),
    ("nested", "nested too deeply|not valid TOML"),
    ("not-utf8", "not UTF-8"),
    ("long-name", "File name too long"),
    ("", "not a profile name"),
    ("nul", "not a profile name"),
])
def test_profile_files_are_read_bounded_regular_files_only(tmp_path, what, msg):
    import os
    import time

    p = str(tmp_path / "p.toml")
    if what == "/dev/zero":
        p = what
    elif what == "fifo":
        os.mkfifo(p)
    elif what == "dir":
        os.mkdir(p)
    elif what == "huge":
        with open(p, "wb") as fh:
            fh.truncate(2 << 20)
    elif what == "nested":
        with open(p, "w") as fh:
            fh.write("x = " + "[" * 50000 + "]" * 50000 + "\n")
    elif what == "not-utf8":
        with open(p, "wb") as fh:
            fh.write(b"name = '\xff'\n")
    elif what == "long-name":
        p = str(tmp_path / ("a" * 5000 + ".toml"))
    elif what == "":
        p = ""
    else:
        p = "x\x00.toml"
    t0 = time.monotonic()
    with pytest.raises(ProfileError, match=msg) as ei:
        load_profile(p)
    assert time.monotonic() - t0 < 5
    assert len(str(ei.value)) < 400
