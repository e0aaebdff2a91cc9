"""deploy/: rules, rule unit tests, scrape config, Alertmanager config, systemd units, dashboard,
checked with the real tools (promtool, amtool, systemd-analyze)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
PROM = DEPLOY / "prometheus"
RULES = PROM / "hftagent.rules.yml"
RULE_TESTS = PROM / "hftagent.rules.test.yml"
AM = DEPLOY / "alertmanager" / "alertmanager.yml"
DASHBOARD = DEPLOY / "grafana" / "hftagent-dashboard.json"
UNITS = DEPLOY / "systemd"

PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package 'prometheus'; `make apt-deps`)")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None,
    reason="amtool not installed (Debian package 'prometheus-alertmanager'; `make apt-deps`)")

ALERTS = ("HftTailJitterHigh", "HftP99OverBudget", "HftProbeDown", "HftProbeStale",
          "HftAuditDrift", "HftPcieLinkDegraded", "HftGpuThrottled", "HftSpikesOwnWaits",
          "HftProcessStopped", "HftWatchOverCpuBudget", "HftGpuShared")


def run(*cmd: str, cwd: Path | None = None, stdin: str | None = None):
    return subprocess.run(list(cmd), cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=60)


# ---- rules --------------------------------------------------------------------------------

@needs_promtool
def test_promtool_check_rules():
    r = run(PROMTOOL, "check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_promtool_test_rules():
    r = run(PROMTOOL, "test", "rules", RULE_TESTS.name, cwd=PROM)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_defined_and_tested_firing_and_not_firing():
    defined = set(re.findall(r"^\s*- alert: (\w+)", RULES.read_text(), re.M))
    assert defined == set(ALERTS)
    # alert_rule_test entries: "alertname: X" followed by "exp_alerts: []" or a list
    text = RULE_TESTS.read_text()
    fires: set[str] = set()
    silent: set[str] = set()
    for m in re.finditer(r"alertname: (\w+)\n\s+exp_alerts:(.*)\n", text):
        (silent if m.group(2).strip() == "[]" else fires).add(m.group(1))
    assert fires == set(ALERTS), f"no firing case for {set(ALERTS) - fires}"
    assert silent == set(ALERTS), f"no not-firing case for {set(ALERTS) - silent}"


def mutated_rule_test(tmp_path: Path, old: str, new: str) -> subprocess.CompletedProcess:
    text = RULES.read_text()
    assert old in text
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    return run(PROMTOOL, "test", "rules", RULE_TESTS.name, cwd=tmp_path)


@needs_promtool
@pytest.mark.parametrize("old,new,why", [
    ("(14.4 * 0.0005)", "(14.4 * 0.005)", "a 10x looser budget must stop the fast-burn page"),
    ('reason=~"hw_slowdown|', 'reason=~"gpu_idle|hw_slowdown|', "the idle bit must not alert"),
    ('status=~"fail|pending-reboot"', 'status=~"fail|pending-reboot|warn"',
     "warn is not drift"),
    ('{threshold_us="5000"} > (6 * 0.0005)', '{threshold_us="500"} > (6 * 0.0005)',
     "the slow burn looks at the 5 ms threshold"),
    ('cause=~"blocked|io_wait"', 'cause=~"blocked|io_wait|cpu_contention"',
     "the host's contention is not the service's own wait"),
    ("[30m])) >= 20", "[30m])) >= 0", "a handful of spikes must not ticket"),
    ("> on (job, instance) 1.5 * hftagent_watch_cpu_budget_ratio",
     "> on (job, instance) 1.0 * hftagent_watch_cpu_budget_ratio",
     "a storm's burst within 1.5 times watch's CPU budget must not ticket"),
])
def test_rule_tests_catch_a_broken_rule(tmp_path, old, new, why):
    """The rule unit tests can fail: each mutation of the rules makes them fail."""
    r = mutated_rule_test(tmp_path, old, new)
    assert r.returncode != 0, why


@needs_promtool
def test_promtool_check_config(tmp_path):
    shutil.copy(PROM / "prometheus.yml", tmp_path)
    shutil.copy(RULES, tmp_path)
    r = run(PROMTOOL, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout


# ---- Alertmanager ------------------------------------------------------------------------

@needs_amtool
def test_amtool_check_config():
    r = run(AMTOOL, "check-config", str(AM))
    assert r.returncode == 0, r.stdout + r.stderr


@needs_amtool
@pytest.mark.parametrize("labels,receiver", [
    (["alertname=HftTailJitterHigh", "severity=page"], "trading-infra-pager"),
    (["alertname=HftProbeDown", "severity=page"], "trading-infra-pager"),
    (["alertname=HftTailJitterHigh", "severity=ticket"], "trading-infra-queue"),
    (["alertname=HftAuditDrift", "severity=ticket", "check=cpu.governor"],
     "trading-infra-queue"),
])
def test_alertmanager_routes(labels, receiver):
    r = run(AMTOOL, "config", "routes", "test", f"--config.file={AM}", *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == receiver


@needs_amtool
def test_amtool_check_config_rejects_a_broken_config(tmp_path):
    bad = tmp_path / "am.yml"
    bad.write_text(AM.read_text().replace("receiver: trading-infra-pager",
                                          "receiver: no-such-receiver", 1))
    assert run(AMTOOL, "check-config", str(bad)).returncode != 0


# ---- systemd -----------------------------------------------------------------------------

def unit(name: str) -> dict[str, list[str]]:
    """key -> values (a key may repeat) of a unit file; sections flattened."""
    out: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[")):
            continue
        k, _, v = line.partition("=")
        out.setdefault(k, []).append(v)
    return out


def test_watch_unit_is_hardened_pinned_and_restarts():
    u = unit("hftagent-watch.service")
    assert u["Restart"] == ["on-failure"]
    assert u["NoNewPrivileges"] == ["yes"]
    assert u["ProtectSystem"] == ["strict"]
    assert u["CPUAffinity"], "pinned to housekeeping CPUs"
    assert u["KillSignal"] == ["SIGTERM"]
    assert "watch" in u["ExecStart"][0] and "--listen" in u["ExecStart"][0]
    assert "127.0.0.1:9877" in (UNITS / "hftagent.default").read_text()
    # the agent's own threads at nice -10 through watch (never the probe): no Nice= (it
    # would renice the probe worker too), and the capability that allows it
    argv = shlex.split(u["ExecStart"][0])
    assert argv[argv.index("--nice") + 1] == "-10"
    assert "Nice" not in u
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        assert "CAP_SYS_NICE" in u[key][0].split()


def test_tune_unit_is_oneshot_with_rollback():
    u = unit("hftagent-tune.service")
    assert u["Type"] == ["oneshot"] and u["RemainAfterExit"] == ["yes"]
    assert "tune apply" in u["ExecStart"][0]
    assert any("tune rollback" in v for v in u.get("ExecStop", []) + u.get("ExecStopPost", []))
    assert "hftagent-watch.service" in u["Before"][0]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
def test_systemd_analyze_verify(tmp_path):
    # The units name the installed path; point them at this checkout's entry point so verify
    # can also check that the executable exists.
    exe = str(Path(sys.executable).with_name("hftagent"))
    if not Path(exe).exists():
        pytest.skip(f"{exe} not installed (pip install -e .)")
    for name in ("hftagent-watch.service", "hftagent-tune.service",
                 "hftagent-attach@.service"):
        (tmp_path / name).write_text(
            (UNITS / name).read_text().replace("/opt/hftagent/.venv/bin/hftagent", exe))
    # the template through an instance of it (verify checks the template as well)
    (tmp_path / "hftagent-attach@litert.service").write_text(
        (tmp_path / "hftagent-attach@.service").read_text())
    r = run("systemd-analyze", "verify", "hftagent-watch.service", "hftagent-tune.service",
            "hftagent-attach@litert.service", cwd=tmp_path)
    noise = [ln for ln in r.stderr.splitlines()
             if "hftagent" in ln and ("Unknown" in ln or "ignoring" in ln or "rror" in ln)]
    assert r.returncode == 0 and not noise, r.stderr


def cli_params(path: list[str]):
    """Option names of the registered command at ``path`` (None: not registered yet)."""
    import typer.main

    from agent.cli import get_app
    cmd = typer.main.get_command(get_app())
    for part in path:
        sub = getattr(cmd, "commands", {}).get(part)
        if sub is None:
            return None
        cmd = sub
    return {o for p in cmd.params for o in getattr(p, "opts", [])}


@pytest.mark.parametrize("name,key", [("hftagent-watch.service", "ExecStart"),
                                      ("hftagent-tune.service", "ExecStart"),
                                      ("hftagent-tune.service", "ExecStopPost"),
                                      ("hftagent-attach@.service", "ExecStart")])
def test_unit_command_lines_match_the_cli(name, key):
    argv = shlex.split(unit(name)[key][0])[1:]
    words = [a for a in argv if not a.startswith(("-", "$", "%"))]
    path = words[:2] if words[:1] == ["tune"] else words[:1]
    opts = cli_params(path)
    if opts is None:
        pytest.skip(f"`hftagent {' '.join(path)}` is not registered in agent/cli.py yet")
    used = {a for a in argv if a.startswith("--")}
    if "--attach-unit" in used and "--attach-unit" not in opts:
        pytest.skip("watch --attach-unit is not registered yet (issue #38 item 1)")
    assert used <= opts, f"unknown options {used - opts} for hftagent {' '.join(path)}"


# ---- Grafana -----------------------------------------------------------------------------

def dashboard_queries() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def test_dashboard_shape():
    d = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in d["panels"])
    for want in ("percentiles", "jitter ratio", "Spikes by cause", "Audit",
                 "watch's own CPU", "charged to the attached service", "budget decision"):
        assert want.lower() in titles.lower(), want
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in d["panels"]:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
    exprs = dashboard_queries()
    assert any("0.0005" in e for e in exprs)  # the budget line
    # watch's own cost (issue #38): its CPU by part against its budget, the service's charge
    for name in ("hftagent_watch_cpu_seconds_total", "hftagent_watch_cpu_budget_ratio",
                 "hftagent_attach_charged_cpu_seconds_total",
                 "hftagent_watch_budget_spikes_total"):
        assert any(name in e for e in exprs), name
    # every metric the dashboard reads is one the exporter or the rules produce
    from agent.export.metrics import WatchMetrics
    from agent.export.server import make_registry, render
    exported = set(re.findall(r"^(hftagent_\w+?)(?:_bucket|_count|_sum)?[{ ]",
                              render(make_registry(WatchMetrics()))[0].decode(), re.M))
    exported |= set(re.findall(r"^# TYPE (hftagent_\w+) ",
                               render(make_registry(WatchMetrics()))[0].decode(), re.M))
    # hftagent cpus --textfile: the per-CPU noise series, through node_exporter
    from agent.export.textfile import render_families
    from agent.noise.export import families
    doc = {"cpus": [{"cpu": 1, "noise_us_per_s": 5.0, "gaps_per_s": 2.0, "p999_gap_ns": 3000,
                     "max_gap_ns": 4000, "error": None}], "recommended": [1]}
    exported |= set(re.findall(r"^# TYPE (hftagent_\w+) ",
                               render_families(families(doc, 0.0)).decode(), re.M))
    recorded = set(re.findall(r"record: (\S+)", RULES.read_text()))
    for e in exprs:
        for name in re.findall(r"\b((?:hftagent|job)[:_][\w:]+)", e):
            assert name in exported or name in recorded, f"{name} in {e!r}"


# ---- hftagent deploy --out: where the units may be written (issue #34 item 2) -------------
# The units are installed by root next (`install ... /etc/systemd/system/`): nobody else may
# be able to swap one before that. The other layouts (a parent of another user's, writable by
# others, sticky, root's link) are in tests/test_agent_outfile.py with every other output.

CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
WATCH_UNIT = Path("systemd") / "hftagent-watch.service"


def deploy(out: Path) -> subprocess.CompletedProcess:
    return run(*CLI, "deploy", "--out", str(out), cwd=Path(__file__).resolve().parents[1])


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("hftagent: error: --out ") and "Traceback" not in r.stderr
    return lines[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_deploy_refuses_a_directory_another_user_owns_or_links_to(tmp_path, user):
    _name, uid, gid = user
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, uid, gid)
    assert f"{theirs} belongs to uid {uid}, not to root or us: refused" in one_line(
        deploy(theirs))  # DIR itself theirs: they could swap the unit we write
    (theirs / "sub").mkdir()  # ours, below theirs: they can rename it away
    assert f"{theirs} belongs to uid {uid}" in one_line(deploy(theirs / "sub" / "d"))
    assert sorted(os.listdir(theirs)) == ["sub"] and os.listdir(theirs / "sub") == []
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    os.lchown(link, uid, gid)
    assert f"{link} is a symbolic link owned by uid {uid}: not followed" in one_line(
        deploy(link))
    assert f"{link} is a symbolic link owned by uid {uid}" in one_line(deploy(link / "d"))
    assert os.listdir(real) == []


def test_deploy_follows_our_own_link_to_a_directory_and_never_one_below_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "mine").symlink_to(real)  # ours (or root's): the operator's own
    r = deploy(tmp_path / "mine")
    assert r.returncode == 0, r.stderr
    assert (real / "prometheus" / "hftagent.rules.yml").read_bytes() == RULES.read_bytes()
    assert (real / WATCH_UNIT).is_file()
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (out / "systemd").symlink_to(victim)  # below DIR: the tree we write has no link at all
    assert "systemd is a symbolic link or not a directory: not followed" in one_line(
        deploy(out))
    assert os.listdir(victim) == [] and sorted(os.listdir(out)) == ["systemd"]


def test_deploy_refuses_a_directory_others_may_write_and_allows_a_sticky_one(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert f"{shared} is writable by group or others (mode 0777) and not sticky" in one_line(
        deploy(shared / "d"))
    assert os.listdir(shared) == []
    shared.chmod(0o1777)  # /tmp's mode: nobody else can rename or remove what we make
    r = deploy(shared / "d")
    assert r.returncode == 0 and (shared / "d" / WATCH_UNIT).is_file(), r.stderr
    assert stat.S_IMODE(os.stat(shared / "d").st_mode) & 0o022 == 0
    sub = tmp_path / "gw"
    sub.mkdir()
    (sub / "systemd").mkdir()
    (sub / "systemd").chmod(0o775)  # a directory of the tree that others may write
    assert "systemd is writable by group or others (mode 0775)" in one_line(deploy(sub))
    assert sorted(os.listdir(sub)) == ["systemd"] and os.listdir(sub / "systemd") == []


# ---- hftagent deploy --out: units that start this box's hftagent (issue #38 item 3) -------

INSTALLED = Path(sys.executable).with_name("hftagent")  # this checkout's entry point
SERVICES = ("hftagent-watch.service", "hftagent-tune.service", "hftagent-attach@.service")


def written_unit(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith(("#", "[")):
            k, _, v = line.strip().partition("=")
            out.setdefault(k, []).append(v)
    return out


def deploy_as(out: Path, *args: str) -> subprocess.CompletedProcess:
    return run(*CLI, "deploy", "--out", str(out), *args,
               cwd=Path(__file__).resolve().parents[1])


@pytest.mark.skipif(not INSTALLED.exists(), reason=f"{INSTALLED} not installed")
def test_deployed_units_start_the_hftagent_that_wrote_them(tmp_path):
    r = deploy_as(tmp_path / "d")
    assert r.returncode == 0, r.stderr
    assert f"units start {INSTALLED}" in r.stdout
    for name in SERVICES:
        u = written_unit(tmp_path / "d" / "systemd" / name)
        for key in ("ExecStart", "ExecStopPost", "ConditionPathExists"):
            for v in u.get(key, []):
                exe = shlex.split(v)[0]
                assert exe == str(INSTALLED), (name, key, v)
                assert os.path.isfile(exe) and os.access(exe, os.X_OK)
        assert "/opt/hftagent/.venv" not in (tmp_path / "d" / "systemd" / name).read_text()
    assert written_unit(tmp_path / "d" / "systemd" / "hftagent-tune.service")[
        "ConditionPathExists"] == [str(INSTALLED)]


@pytest.mark.parametrize("root,cpus,house", [
    ("vm-dev", "1", "0"),                       # 2 CPUs: never the shipped 2-3
    ("synthetic-tuned", "4-7", "0-3,8-15"),     # the isolated CPUs
])
def test_deployed_cpu_lists_follow_the_boxs_target_rule(tmp_path, root, cpus, house):
    r = deploy_as(tmp_path / "d", "--root", str(Path(__file__).parent / "fixtures" / root),
                  "--exec", str(INSTALLED))
    assert r.returncode == 0, r.stderr
    default = (tmp_path / "d" / "systemd" / "hftagent.default").read_text()
    assert re.findall(r"^HFTAGENT_PROBE_CPUS=(.*)$", default, re.M) == [cpus]
    for name in ("hftagent-watch.service", "hftagent-attach@.service"):
        u = written_unit(tmp_path / "d" / "systemd" / name)
        assert u["CPUAffinity"] == [house], name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
@pytest.mark.skipif(not INSTALLED.exists(), reason=f"{INSTALLED} not installed")
def test_systemd_analyze_verifies_the_written_units(tmp_path):
    r = deploy_as(tmp_path / "d")
    assert r.returncode == 0, r.stderr
    units = tmp_path / "d" / "systemd"
    (units / "hftagent-attach@litert.service").write_text(
        (units / "hftagent-attach@.service").read_text())
    r = run("systemd-analyze", "verify", "hftagent-watch.service", "hftagent-tune.service",
            "hftagent-attach@litert.service", cwd=units)
    noise = [ln for ln in r.stderr.splitlines()
             if "hftagent" in ln and ("Unknown" in ln or "ignoring" in ln or "rror" in ln
                                      or "not executable" in ln)]
    assert r.returncode == 0 and not noise, r.stderr
    # and verify would catch a unit naming an hftagent that is not there
    bad = units / "hftagent-watch.service"
    bad.write_text(bad.read_text().replace(str(INSTALLED), str(tmp_path / "gone")))
    assert run("systemd-analyze", "verify", bad.name, cwd=units).returncode != 0


def _exec_refused(tmp_path: Path, exe: str, why: str) -> None:
    r = deploy_as(tmp_path / "d", "--exec", exe)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("hftagent: error: --exec ") and why in lines[0], lines[0]
    assert not (tmp_path / "d").exists()  # nothing written


def test_deploy_exec_must_be_a_plain_executable_file_of_root_or_ours(tmp_path):
    script = tmp_path / "hft"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    _exec_refused(tmp_path, "hft", "give an absolute path")
    _exec_refused(tmp_path, str(tmp_path / "missing"), "No such file or directory")
    _exec_refused(tmp_path, str(tmp_path), "is not a regular file")
    (tmp_path / "link").symlink_to(script)
    _exec_refused(tmp_path, str(tmp_path / "link"), f"is a symbolic link: give the file it "
                  f"points to ({script})")
    odd = tmp_path / "a b"
    odd.write_text("#!/bin/sh\n")
    odd.chmod(0o755)
    _exec_refused(tmp_path, str(odd), "systemd would not read this path as it is")
    script.chmod(0o775)
    _exec_refused(tmp_path, str(script), "is writable by group or others (mode 0775)")
    script.chmod(0o644)
    _exec_refused(tmp_path, str(script), "is not executable")
    script.chmod(0o755)
    r = deploy_as(tmp_path / "d", "--exec", str(script))
    assert r.returncode == 0, r.stderr
    u = written_unit(tmp_path / "d" / "systemd" / "hftagent-watch.service")
    assert shlex.split(u["ExecStart"][0])[0] == str(script)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_deploy_exec_refuses_another_users_file(tmp_path, user):
    _name, uid, gid = user
    script = tmp_path / "hft"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    os.chown(script, uid, gid)
    _exec_refused(tmp_path, str(script), f"belongs to uid {uid}, not to root or you")
