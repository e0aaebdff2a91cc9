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
