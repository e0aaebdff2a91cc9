"""audit's ``virt.steal`` and watch's steal cause on synthetic /proc/stat pairs (issue #35
item 3): /proc/stat prints the kernel's ns steal truncated to whole USER_HZ ticks, so one
tick in a 0.2 s window (5 % as read) may be none, and never flips the audit."""

from __future__ import annotations

import itertools

import pytest

import collectors.system as system
from collectors.host import Host
from collectors.system import StealWindow, steal_between
from tuning.checks.base import AuditContext
from tuning.checks.platform import check_virt
from tuning.findings import Status, exit_code
from tuning.profiles import load_profile

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest",
          "guest_nice")


def stat_text(cpus: dict[int, dict[str, int]]) -> str:
    total = {k: sum(v.get(k, 0) for v in cpus.values()) for k in FIELDS}
    lines = ["cpu  " + " ".join(str(total[k]) for k in FIELDS)]
    lines += [f"cpu{c} " + " ".join(str(v.get(k, 0)) for k in FIELDS)
              for c, v in sorted(cpus.items())]
    return "\n".join([*lines, "intr 0", "ctxt 0", "btime 0", "processes 1"]) + "\n"


def idle_cpu(idle: int, steal: int = 0, user: int = 1000) -> dict[str, int]:
    return {"user": user, "system": 500, "idle": idle, "steal": steal}


def test_the_bounds_of_a_windows_ticks():
    assert (StealWindow(0, 20).min_share, StealWindow(0, 20).max_share) == (0.0, 0.05)
    one = StealWindow(1, 20)
    assert (one.min_share, one.share, one.max_share) == (0.0, 0.05, 0.1)
    assert StealWindow(3, 20).min_share == 0.1
    assert StealWindow(0, 0).share == 0.0 and StealWindow(0, 0).max_share == 1.0
    # guest time is in user already; a counter that went back reads as none
    w = steal_between({"user": 10, "guest": 5, "steal": 4}, {"user": 30, "guest": 25,
                                                            "steal": 3})
    assert (w.steal_ticks, w.ticks) == (0, 19)


def audit_pair(tmp_path, monkeypatch, before: dict, after: dict,
               window_s: float = 0.2) -> tuple:
    """virt.steal over a 0.2 s window whose second read is ``after`` (written while the
    window "sleeps"), on a tree of its own that the check takes for the live host."""
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "sys").mkdir(exist_ok=True)
    stat = tmp_path / "proc" / "stat"
    stat.write_text(stat_text(before))
    host = Host(tmp_path)
    host.live = True  # (the tree stands for the running kernel: two reads, a window)
    start = system.stat_snapshot(host)
    monkeypatch.setattr(system.time, "sleep", lambda s: stat.write_text(stat_text(after)))
    ctx = AuditContext(host, load_profile("hft-cpu"), cpus=sorted(before), online=sorted(before),
                       steal_window_s=window_s, cache={"steal_start": start})
    f = next(x for x in check_virt(ctx) if x.id == "virt.steal")
    return f, exit_code([f], Status.FAIL)


@pytest.mark.parametrize("ticks", list(itertools.product((0, 1), repeat=2)))
def test_zero_or_one_tick_of_steal_never_flips_the_audit(tmp_path, monkeypatch, ticks):
    """An idle 2-CPU box, 20 ticks per CPU in the window, 0 or 1 of them steal."""
    before = {0: idle_cpu(5000, 7), 1: idle_cpu(6000, 9)}
    after = {c: idle_cpu(before[c]["idle"] + 20 - t, before[c]["steal"] + t)
             for c, t in zip((0, 1), ticks)}
    f, code = audit_pair(tmp_path, monkeypatch, before, after)
    assert f.status == Status.OK and code == 0, f.current
    assert f.data["steal_ticks"] == {0: ticks[0], 1: ticks[1]}
    if any(ticks):  # read as 5 %, said so, and why it is not a finding
        assert "max 5.00% over 0.2 s" in f.current
        assert "can be 0.0-10.0% (whole USER_HZ ticks): not shown over the limit" in f.current


@pytest.mark.parametrize("steal,status", [(2, Status.FAIL), (3, Status.FAIL), (6, Status.FAIL)])
def test_steal_the_ticks_prove_over_the_limit_fails(tmp_path, monkeypatch, steal, status):
    before = {0: idle_cpu(5000), 1: idle_cpu(6000)}
    after = {0: idle_cpu(5020 - steal, steal), 1: idle_cpu(6020)}
    f, code = audit_pair(tmp_path, monkeypatch, before, after)
    assert f.status == status and code == 2
    assert f.data["steal_pct_min"][0] == round(100 * (steal - 1) / 20, 2)
    assert "not shown over the limit" not in f.current


def test_a_long_window_resolves_a_small_steal(tmp_path, monkeypatch):
    """A 10 s window has 1,000 ticks per CPU: 15 ticks prove more than 1 %."""
    before = {0: idle_cpu(5000)}
    f, _ = audit_pair(tmp_path, monkeypatch, before, {0: idle_cpu(5985, 15)}, 10.0)
    assert f.status != Status.OK and f.data["steal_pct_min"][0] == 1.4
    assert "over 10.0 s" in f.current
    f, _ = audit_pair(tmp_path, monkeypatch, before, {0: idle_cpu(5989, 11)}, 10.0)
    assert f.status == Status.OK  # 1.1 % as read, 1.0 % proven: not over 1 %
