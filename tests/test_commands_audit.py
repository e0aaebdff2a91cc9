"""`hftagent audit`: golden JSON per fixture tree, exit codes, bad input, partial hosts."""

from __future__ import annotations

import json
import os
import shlex
import shutil

import pytest
from typer.testing import CliRunner

from agent.cli import get_app
from tests.conftest import FIXTURES, GOLDEN, TREES

runner = CliRunner()
# the bare-metal-shaped trees (policy links, bridges, nodes from 1, hybrid maxima)
GOLDEN_TREES = (*TREES, "synthetic-baremetal", "synthetic-hybrid")


def audit(*args: str):
    return runner.invoke(get_app(), ["audit", *args])


@pytest.mark.parametrize("tree", GOLDEN_TREES)
def test_golden(tree):
    res = audit("--root", str(FIXTURES / tree), "--json")
    assert res.exit_code in (0, 2), res.output
    got = json.loads(res.stdout)
    path = GOLDEN / f"audit-{tree}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text()), \
        f"audit of {tree} changed; if intended: UPDATE_GOLDEN=1 pytest tests/test_commands_audit.py"


def by_id(res) -> dict:
    return {f["id"]: f for f in json.loads(res.stdout)["findings"]}


def test_bad_box_is_caught_everywhere():
    res = audit("--root", str(FIXTURES / "synthetic-2socket"), "--json")
    assert res.exit_code == 2
    f = by_id(res)
    assert f["cpu.governor"]["status"] == "fail" and "4-7=powersave" in f["cpu.governor"]["current"]
    assert "cpupower -c 4-7 frequency-set -g performance" == f["cpu.governor"]["fix"]
    assert f["cpu.cstates"]["status"] == "fail" and "C6 (133 µs)" in f["cpu.cstates"]["current"]
    assert f["cpu.cstates"]["fix"] == "cpupower -c 2-7 idle-set -D 10"
    assert f["isolation.isolcpus"]["status"] == "ok"
    assert f["isolation.nohz_full"]["status"] == "pending-reboot"
    assert "nohz_full=2-7" in f["isolation.nohz_full"]["fix"]
    assert f["irq.affinity"]["status"] == "fail"
    assert any("mlx5_comp" in i for i in f["irq.affinity"]["data"]["irqs"])
    assert f["irq.irqbalance"]["status"] == "warn"
    assert f["kernel.thp_enabled"]["current"] == "always"
    assert f["kernel.swap"]["status"] == "warn"
    assert f["kernel.numa_balancing"]["status"] == "fail"
    assert f["numa.target_nodes"]["status"] == "fail"
    assert f["pcie.links"]["status"] == "fail" and "gen3 x8 (max gen5 x16)" in f["pcie.links"]["current"]
    assert "tuned" in f["tuners.others"]["current"]


def test_tuned_box_passes_and_fail_on_warn_tightens():
    assert audit("--root", str(FIXTURES / "synthetic-tuned")).exit_code == 0
    assert audit("--root", str(FIXTURES / "synthetic-tuned"), "--fail-on", "warn").exit_code == 2


def test_cpus_option_changes_target():
    res = audit("--root", str(FIXTURES / "synthetic-2socket"), "--cpus", "0-1", "--json")
    f = by_id(res)
    assert json.loads(res.stdout)["target_cpus"] == "0-1"
    assert f["cpu.governor"]["status"] == "ok"  # 0-3 run performance


def test_bench_profile_wants_turbo_off():
    res = audit("--root", str(FIXTURES / "synthetic-tuned"), "--profile", "bench", "--json")
    assert by_id(res)["cpu.turbo"]["status"] == "fail"
    assert res.exit_code == 2


@pytest.mark.parametrize("args,msg", [
    (["--cpus", "3-1"], "runs backwards"),
    (["--cpus", "x"], "bad CPU list element 'x'"),
    (["--cpus", "99"], "past the last CPU"),
    (["--pid", "99999999"], "no such process"),
    (["--profile", "nope"], "unknown profile"),
    (["--fail-on", "info"], "--fail-on"),
])
def test_bad_input_one_line_exit_1(args, msg):
    res = audit("--root", str(FIXTURES / "synthetic-2socket"), *args)
    assert res.exit_code == 1
    assert msg in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_nonexistent_root():
    res = audit("--root", "/nonexistent-root-xyz")
    assert res.exit_code == 1 and "not a directory" in res.output


def test_partly_unreadable_host_still_reports(tree_copy):
    root = tree_copy("synthetic-2socket")
    (root / "proc/interrupts").unlink()
    shutil.rmtree(root / "proc/irq")
    (root / "proc/swaps").unlink()
    (root / "sys/kernel/mm/transparent_hugepage/enabled").write_text("garbage\n")
    res = audit("--root", str(root), "--json")
    assert res.exit_code == 2
    f = by_id(res)
    # missing from the tree: unsupported, and said so (the kernel or the capture lacks it)
    assert f["irq.affinity"]["status"] == "unsupported"
    assert f["irq.affinity"]["current"] == "unsupported: /proc/irq absent from this tree"
    assert f["kernel.swap"]["status"] == "unsupported"
    assert "/proc/swaps absent from this tree" in f["kernel.swap"]["current"]
    # a file that does not parse is unreadable (error), not "kernel without THP"
    assert f["kernel.thp_enabled"]["status"] == "error"
    assert "cannot parse" in f["kernel.thp_enabled"]["current"]
    assert f["cpu.governor"]["status"] == "fail"  # the rest still reports


def test_no_online_file_derives_the_cpus_and_says_so(tree_copy):
    """A missing cpu/online (seen in real captures) no longer stops the audit: the CPUs come
    from present and the cpuN directories, and the cpu.online finding says so (error: the
    kernel's own list could not be read). tests/test_baremetal.py has the other cases."""
    root = tree_copy("synthetic-tuned")
    (root / "sys/devices/system/cpu/online").unlink()
    res = audit("--root", str(root), "--json")
    assert res.exit_code == 1
    f = by_id(res)
    assert f["cpu.online"]["status"] == "error"
    assert "derived 0-15" in f["cpu.online"]["current"]
    assert json.loads(res.stdout)["target_cpus"] == "4-7"
    assert {x["status"] for x in f.values()} <= {"ok", "warn", "unsupported", "error"}


def test_pid_checks_on_fixture_process(tree_copy):
    root = tree_copy("synthetic-tuned")
    (root / "proc/812/environ").write_bytes(b"TF_NUM_INTRAOP_THREADS=16\0PATH=/bin\0")
    res = audit("--root", str(root), "--pid", "812", "--json")
    f = by_id(res)
    assert f["process.affinity"]["status"] == "fail"  # 0-15 allowed, target 4-7
    assert "intra-op 16 > 16" not in f["process.tf_threads"]["current"]
    assert "TF_NUM_INTEROP_THREADS unset" in f["process.tf_threads"]["current"]
    assert f["process.membind"]["status"] == "fail"


def test_human_report_groups_and_ranges():
    res = audit("--root", str(FIXTURES / "synthetic-2socket"))
    out = res.output
    assert "2-3=performance; 4-7=powersave" in out.replace("\n", " ").replace("│", " ") or \
        "4-7=powersave" in out
    assert "all boot arguments at once" in out
    assert "summary:" in out


def test_textfile_written_atomically_for_node_exporter(tmp_path):
    res = audit("--root", str(FIXTURES / "synthetic-2socket"), "--textfile", str(tmp_path))
    assert res.exit_code == 2
    text = (tmp_path / "hftagent_audit.prom").read_text()
    assert 'hftagent_audit_check_status{check="cpu.governor",status="fail"} 1' in text
    assert not [p for p in tmp_path.iterdir() if p.name != "hftagent_audit.prom"]  # no temp left
    res = audit("--root", str(FIXTURES / "synthetic-2socket"), "--textfile", str(tmp_path / "nope"))
    assert res.exit_code == 1 and "not a directory" in res.output


def test_live_audit_is_recorded_in_history_but_a_captured_tree_is_not(tmp_path):
    from agent.history import History

    db = tmp_path / "h.sqlite"
    assert audit("--root", str(FIXTURES / "synthetic-tuned"), "--db", str(db)).exit_code == 0
    assert not db.exists()
    res = audit("--json", "--db", str(db), "--steal-window", "0")
    assert res.exit_code in (0, 2)
    with History(str(db)) as h:
        runs = h.runs()
    assert [r.kind for r in runs] == ["audit"]
    assert audit("--db", str(db), "--no-history", "--steal-window", "0").exit_code in (0, 2)


def test_error_findings_exit_1_and_unreadable_cpuinfo_is_not_bare_metal(tmp_path):
    (tmp_path / "proc/cpuinfo").mkdir(parents=True)  # else empty: cpuinfo there, unreadable
    res = audit("--root", str(FIXTURES / "synthetic-tuned"), "--procfs", str(tmp_path / "proc"),
                "--json")
    f = by_id(res)
    # the CPUID test cannot be made, and the tree's DMI alone is not enough
    v = f["virt.hypervisor"]
    assert v["status"] == "error" and "CPUID test cannot be made" in v["current"]
    assert res.exit_code in (1, 2)
    statuses = {x["status"] for x in f.values()}
    assert "error" in statuses
    assert res.exit_code == (2 if statuses & {"fail", "pending-reboot"} else 1)


def test_exit_code_precedence():
    from tuning.findings import Finding, Status, exit_code

    def fs(*sts):
        return [Finding(f"x.{i}", "x", "x", s) for i, s in enumerate(sts)]
    assert exit_code(fs(Status.OK, Status.UNSUPPORTED)) == 0
    assert exit_code(fs(Status.OK, Status.ERROR)) == 1
    assert exit_code(fs(Status.ERROR, Status.FAIL)) == 2
    assert exit_code(fs(Status.WARN)) == 0
    assert exit_code(fs(Status.WARN), Status.WARN) == 2
    assert exit_code(fs(Status.PENDING_REBOOT)) == 2


def test_audit_process_imports_nothing_heavy(tmp_path):
    """audit must stay well under a second: no numpy, TensorFlow, NVML or py-cpuinfo (even
    while it records the run in history), no journal machinery, no rich for --json, and no
    other command's module (agent/cli.py loads the one command it runs, issue #28)."""
    import subprocess
    import sys
    code = ("import sys; sys.argv = ['hftagent', 'audit', '--json', '--steal-window', '0']\n"
            "from agent.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('numpy', 'tensorflow', 'pynvml', 'cpuinfo', 'tuning.journal',"
            " 'rich') if m in sys.modules]\n"
            "heavy += [m for m in sys.modules if m.startswith('agent.commands.')"
            " and m not in ('agent.commands.audit', 'agent.commands.common')]\n"
            "print('HEAVY', heavy, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "HFTAGENT_DB": str(tmp_path / "h.db")})
    assert "HEAVY []" in r.stderr, r.stderr[-500:]
    assert (tmp_path / "h.db").exists()  # and the run was recorded


REPO = FIXTURES.parents[1]


@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_a_reader_closing_the_pipe_keeps_the_exit_status(fmt):
    """`hftagent audit | head -1` exits 2 as the audit does (issue #39): a reader that closed
    the pipe ends the output, not the audit. Two real pipes: one whose reader is gone before
    a byte is written (every write fails with EPIPE), and a shell pipeline into head."""
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "agent.cli", "audit", "--root",
           str(FIXTURES / "synthetic-2socket"), "--steal-window", "0", *fmt]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 2 and err == b"", err
    shell = " ".join(map(shlex.quote, cmd)) + ' | head -1; echo "rc=${PIPESTATUS[0]}"'
    res = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert res.stdout.splitlines()[-1] == "rc=2" and res.stderr == "", res


def test_the_irq_fix_offers_the_narrow_command():
    """The alternative to moving the IRQs by hand is tune's IRQ step alone, never the whole
    profile plus isolation (issue #39)."""
    f = by_id(audit("--root", str(FIXTURES / "vm-dev"), "--json"))["irq.affinity"]
    assert f["fix"].endswith("(or: hftagent tune apply --only irq.affinity --cpus 1)")
