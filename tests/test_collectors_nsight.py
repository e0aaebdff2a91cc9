"""ncu CSV parsing (real captures from the lent H200), the summary, the runner and the
`hftagent profile --nsight` command (with a stand-in ncu executable: CI has no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from collectors.nsight import (
    KernelLaunch,
    NsightError,
    ncu_command,
    parse_ncu_csv,
    profile,
    summarize,
)

DATA = Path(__file__).resolve().parent / "fakes" / "ncu"
RAW = DATA / "h200-torch-lstm-raw.csv"
DETAILS = DATA / "h200-torch-lstm-details.csv"


def test_raw_page_from_the_h200():
    ks = parse_ncu_csv(RAW.read_text())
    assert len(ks) == 30 and [k.id for k in ks] == list(range(30))
    assert ks[0].pid == 536 and ks[0].duration_ns == 2848.0  # "2,848" with units row "ns"
    assert any(k.name.startswith("void RNN_blockPersist_fp_LSTM") for k in ks)


def test_details_page_from_the_h200():
    ks = parse_ncu_csv(DETAILS.read_text())
    assert [k.duration_ns for k in ks] == [2848.0, 1984.0, 1952.0]


def _details(unit: str, value: str) -> str:
    return ('"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit",'
            '"Metric Value"\n'
            f'"0","1","k","GPU Speed Of Light Throughput","Duration","{unit}","{value}"\n'
            '"0","1","k","GPU Speed Of Light Throughput","SM Frequency","hz","1,000"\n')


@pytest.mark.parametrize("unit,value,ns", [("usecond", "1.50", 1500.0), ("msecond", "2", 2e6),
                                           ("ns", "1,024", 1024.0)])
def test_duration_units(unit, value, ns):
    assert parse_ncu_csv(_details(unit, value))[0].duration_ns == ns


def test_garbage_is_an_error():
    with pytest.raises(ValueError):
        parse_ncu_csv("==PROF== Connected to process 1\n==ERROR== no kernels were profiled\n")
    with pytest.raises(ValueError):
        parse_ncu_csv(_details("furlongs", "1"))


def test_summary_verdicts():
    ks = [KernelLaunch(i, 1, "a" if i % 3 else "b", 100.0) for i in range(30)]
    launch = summarize(ks, inferences=10, wall_ns_per_inference=1000.0)
    assert launch.kernels_per_inference == 3 and launch.kernel_ns_per_inference == 300
    assert launch.verdict == "launch-bound" and launch.gpu_busy_ratio == pytest.approx(0.3)
    assert [s.name for s in launch.top] == ["a", "b"] and launch.top[0].count == 20
    assert summarize(ks, 10, 400.0).verdict == "compute-bound"
    assert summarize(ks).verdict.startswith("unknown")


def test_ncu_never_locks_clocks():
    argv = ncu_command(["python3", "x.py"], "/tmp/l.csv", launch_skip=5, launch_count=9)
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[-2:] == ["python3", "x.py"]
    assert argv[argv.index("--launch-skip") + 1] == "5"


@pytest.fixture
def fake_ncu(tmp_path) -> Path:
    """An 'ncu' that copies the real H200 capture to --log-file and runs the command."""
    exe = tmp_path / "ncu"
    exe.write_text(f"""#!{sys.executable}
import shutil, subprocess, sys
a = sys.argv[1:]
log = a[a.index("--log-file") + 1]
cmd = a[a.index("--log-file") + 2:]
while cmd and cmd[0].startswith("--"):
    cmd = cmd[2:]
shutil.copy({str(RAW)!r}, log)
sys.exit(subprocess.call(cmd))
""")
    exe.chmod(0o755)
    return exe


def test_profile_runs_the_command_under_ncu(fake_ncu, tmp_path):
    marker = tmp_path / "ran"
    rep = profile([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], inferences=30,
                  wall_ns_per_inference=296e3, ncu=str(fake_ncu))
    assert marker.exists() and rep.returncode == 0
    assert rep.kernels == 30 and rep.verdict == "launch-bound"
    assert rep.top[0].name.startswith("void RNN_blockPersist_fp_LSTM")


def test_profile_errors(tmp_path):
    with pytest.raises(NsightError, match="not found"):
        profile(["true"], ncu=str(tmp_path / "no-ncu"))
    silent = tmp_path / "ncu"
    silent.write_text("#!/bin/sh\nexit 3\n")
    silent.chmod(0o755)
    with pytest.raises(NsightError, match="no log"):
        profile(["true"], ncu=str(silent))
    with pytest.raises(NsightError, match="no command"):
        profile([], ncu=str(silent))


def test_cli_profile_nsight(fake_ncu):
    r = CliRunner().invoke(get_app(), ["profile", "--nsight", "--ncu", str(fake_ncu),
                                       "--inferences", "30", "--wall-us", "296", "--",
                                       sys.executable, "-c", "pass"])
    assert r.exit_code == 0, r.output
    assert "GPU busy 15% of wall time -> launch-bound" in r.output
    r = CliRunner().invoke(get_app(), ["profile", "--", "true"])
    assert r.exit_code == 1
