"""Profiles: data files (TOML) with the expected value, severity and rationale of each setting.

Shipped: ``hft-cpu``, ``hft-gpu``, ``bench`` (tuning/profiles/*.toml). ``--profile FILE`` loads a
user profile, which may set ``extends = "hft-cpu"`` and override only some settings. Audit and
tune read the same profile.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tuning.findings import Status

BUILTIN = ("hft-cpu", "hft-gpu", "bench")

# Every key a profile may set, with the type its "expected" value must have.
SETTING_TYPES: dict[str, tuple[type, ...]] = {
    "governor": (str,), "min_freq": (str,), "turbo": (str,), "epp": (str,),
    "cstate_max_exit_latency_us": (int,), "smt": (str,), "isolation": (bool,),
    "irq_affinity": (str,), "irqbalance": (str,), "thp_enabled": (str,), "thp_defrag": (str,),
    "ksm": (int,), "swap": (str,), "swappiness": (int,), "numa_balancing": (int,),
    "nmi_watchdog": (int,), "timer_migration": (int,), "stat_interval": (int,),
    "sched_rt_runtime_us": (int,), "clocksource": (str,), "perf_event_paranoid": (int,),
    "steal_max_pct": (float, int), "numa_single_node": (bool,), "pcie_link": (str,),
    "other_tuners": (str,), "tf_threads": (str,), "gpu_persistence": (str,),
    "gpu_compute_mode": (str,), "gpu_foreign_processes": (int,), "gpu_clocks": (str,),
    "gpu_pcie_link": (str,), "gpu_ecc": (int,), "gpu_mig": (str,),
    "runtime_isolation": (str,), "pm_qos_resume_latency_us": (int,),
    "cpu_dma_latency_us": (int,), "keep_awake": (str,),
}
# Values a string setting may take ("any" everywhere means: report, never fail).
CHOICES: dict[str, tuple[str, ...]] = {
    "turbo": ("on", "off", "any"), "smt": ("on", "off", "any"), "min_freq": ("max", "any"),
    "irq_affinity": ("off-target", "any"), "irqbalance": ("off", "banned", "any"),
    "thp_enabled": ("always", "madvise", "never", "any"),
    "thp_defrag": ("always", "defer", "defer+madvise", "madvise", "never", "any"),
    "swap": ("off", "any"), "pcie_link": ("max", "any"), "other_tuners": ("none", "any"),
    "tf_threads": ("pinned", "any"), "gpu_persistence": ("on", "off", "any"),
    "gpu_compute_mode": ("DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "any"),
    "gpu_clocks": ("unthrottled", "any"), "gpu_pcie_link": ("max", "any"),
    "gpu_mig": ("on", "off", "any"), "runtime_isolation": ("on", "any"),
    "keep_awake": ("on", "any"),
}


class ProfileError(Exception):
    """An unknown profile name or a malformed profile file."""


@dataclass(frozen=True)
class Setting:
    key: str
    expected: Any
    severity: Status
    why: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    settings: dict[str, Setting]
    source: str

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key)

    def expected(self, key: str, default: Any = None) -> Any:
        s = self.settings.get(key)
        return default if s is None else s.expected


# Profile strings reach terminals, JSON, the history DB and rich (whose highlighter is
# quadratic: a 100,000-character name took 81 s). The shipped ones: names 7, descriptions
# 153, whys 167 characters.
MAX_NAME_CHARS = 100
MAX_TEXT_CHARS = 1000


def _brief(v: Any, limit: int = 60) -> str:
    """``repr(v)``, cut to ``limit`` characters: an error line quotes a value, never a whole
    megabyte of it."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "…"


def _text(v: Any, where: str, source: str, limit: int) -> str:
    """A string field of the profile: a string, at most ``limit`` characters, one line
    without control characters (it is printed on one line, on a terminal)."""
    if not isinstance(v, str):
        raise ProfileError(f"{source}: {where} must be a string, not {_brief(v)}")
    if len(v) > limit:
        raise ProfileError(f"{source}: {where} is {len(v):,} characters long, more than "
                           f"{limit:,}")
    bad = next((c for c in v if ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0), None)
    if bad is not None:
        raise ProfileError(f"{source}: {where} contains a control character "
                           f"({_brief(bad)}): one line of plain text")
    return v


def _parse(data: dict, source: str, base: Profile | None) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: not a table")
    unknown_top = set(data) - {"name", "description", "extends", "settings"}
    if unknown_top:
        raise ProfileError(f"{source}: unknown top-level key(s) "
                           f"{_brief(sorted(unknown_top), 200)}")
    settings = dict(base.settings) if base else {}
    raw = data.get("settings", {})
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: [settings] must be a table")
    for key, entry in raw.items():
        if key not in SETTING_TYPES:
            raise ProfileError(f"{source}: unknown setting {_brief(key)}")
        if not isinstance(entry, dict) or "expected" not in entry:
            raise ProfileError(f"{source}: settings.{key} needs an 'expected' value")
        exp = entry["expected"]
        types = SETTING_TYPES[key]
        # bool is an int subclass in Python: keep "expected = true" out of integer settings
        if not isinstance(exp, types) or (isinstance(exp, bool) and bool not in types):
            names = "/".join(t.__name__ for t in types)
            raise ProfileError(f"{source}: settings.{key}.expected must be {names}, got "
                               f"{_brief(exp)}")
        if key in CHOICES and exp not in CHOICES[key]:
            raise ProfileError(f"{source}: settings.{key}.expected {_brief(exp)} is not one of "
                               f"{', '.join(CHOICES[key])}")
        sev_s = entry.get("severity", base.settings[key].severity.value
                          if base and key in base.settings else "warn")
        if sev_s not in ("fail", "warn"):
            raise ProfileError(f"{source}: settings.{key}.severity must be 'fail' or 'warn'")
        if "why" in entry:
            why = _text(entry["why"], f"settings.{key}.why", source, MAX_TEXT_CHARS)
        else:
            why = base.settings[key].why if base and key in base.settings else ""
        settings[key] = Setting(key, exp, Status(sev_s), why)
    name = _text(data.get("name", ""), "name", source, MAX_NAME_CHARS)
    if not name:  # the file's stem: a file name, at most 255 bytes (NAME_MAX) and no "/"
        name = _text(Path(source).stem, "the file name (the name of a profile without one)",
                     source, 255) if source else "custom"
    description = _text(data.get("description", ""), "description", source, MAX_TEXT_CHARS)
    return Profile(name, description, settings, source)


MAX_PROFILE_BYTES = 1 << 20  # the built-in profiles are ~4 KB


def _shown(name: str) -> str:
    return repr(name if len(name) <= 200 else name[:200] + "…")


def _read_profile(path: Path, name: str) -> str:
    """A profile file's text: a regular file only (``--profile /dev/zero`` or a FIFO would
    read, or block, forever), at most MAX_PROFILE_BYTES. Raises ProfileError."""
    from tuning.safepath import UnsafePath, read_regular

    try:
        return read_regular(path, MAX_PROFILE_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ProfileError(f"profile file {_shown(name)} does not exist") from None
    except UnsafePath as exc:
        raise ProfileError(f"profile {_shown(name)}: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"cannot read profile {_shown(name)}: "
                           f"{exc.strerror or exc}") from None


def load_profile(name_or_path: str) -> Profile:
    """Load a built-in profile by name or a user profile from a TOML file."""
    if name_or_path in BUILTIN:
        text = resources.files("tuning").joinpath("profiles", f"{name_or_path}.toml").read_text()
        return _parse(tomllib.loads(text), f"builtin:{name_or_path}", None)
    if not name_or_path or "\x00" in name_or_path:
        raise ProfileError(f"--profile {_shown(name_or_path)}: not a profile name or file")
    path = Path(name_or_path)
    try:
        missing = not path.exists()
    except OSError as exc:  # ENAMETOOLONG, ...: lexists does not swallow those
        raise ProfileError(f"cannot read profile {_shown(name_or_path)}: "
                           f"{exc.strerror or exc}") from None
    if not path.suffix and missing:
        raise ProfileError(f"unknown profile {_shown(name_or_path)} (built-in: "
                           f"{', '.join(BUILTIN)}; or a path to a .toml file)")
    try:
        data = tomllib.loads(_read_profile(path, name_or_path))
    except UnicodeDecodeError:
        raise ProfileError(f"cannot read profile {_shown(name_or_path)}: not UTF-8 "
                           "text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {_shown(name_or_path)} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ProfileError(f"profile {_shown(name_or_path)} is nested too deeply") from None
    base = None
    if "extends" in data:
        if data["extends"] not in BUILTIN:
            raise ProfileError(f"{_shown(name_or_path)}: extends {_brief(data['extends'])} is "
                               "not a built-in profile")
        base = load_profile(data["extends"])
    return _parse(data, str(path), base)
