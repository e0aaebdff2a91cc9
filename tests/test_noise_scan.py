"""hftagent cpus: the recorder's output parser, /proc attribution, ranking rules, the CLI's
bad input, and one real short scan on this machine."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from agent.noise import rank as rk
from agent.noise import scan as sc
from collectors.host import Host
from tests.treecopy import make_synthetic


def noise(cpu: int, us_per_s: float, gaps: int = 100, p999_ns: int = 10_000,
          error: str | None = None) -> rk.CpuNoise:
    lengths = np.full(max(gaps, 1), 2_000, dtype=np.int64)
    lengths[-1] = p999_ns
    return rk.CpuNoise(cpu=cpu, duration_s=1.0, gaps=gaps, sum_gap_ns=int(us_per_s * 1000),
                       max_gap_ns=p999_ns, gap_ns=lengths, error=error)


def test_parse_output_and_bounded_gaps():
    text = ("hftnoise=1 cpu=3 ran_on=3 t0_ns=1000 t1_ns=2000001000 loops=9 min_gap_ns=20 "
            "threshold_ns=1000 gaps=5 kept=2 sum_gap_ns=70000 max_gap_ns=40000\n"
            "1500 30000\n2500 40000\n")
    r = sc.parse_output(3, text)
    assert r.duration_s == 2.0 and r.gaps == 5 and r.dropped == 3
    assert r.gap_ns.tolist() == [30000, 40000]
    assert r.noise_us_per_s == 35.0 and r.gaps_per_s == 2.5


@pytest.mark.parametrize("bad", ["", "garbage\n", "hftnoise=1 cpu=1\n",
                                 "hftnoise=1 t0_ns=0 t1_ns=1 gaps=1 kept=2 sum_gap_ns=1 "
                                 "max_gap_ns=1 threshold_ns=1 min_gap_ns=1\n1 1\n"])
def test_parse_output_rejects_what_the_recorder_did_not_write(bad):
    with pytest.raises(ValueError):
        sc.parse_output(1, bad)


def test_judge_marks_the_loaded_cpu_noisy():
    rs = [noise(1, 300), noise(2, 350), noise(3, 40_000)]
    rk.judge(rs)
    assert [r.verdict for r in rs] == ["quiet", "quiet", "noisy"]


def test_judge_floor_keeps_uniformly_quiet_cpus_quiet():
    rs = [noise(1, 5), noise(2, 60)]   # 12x apart, but both far below the floor
    rk.judge(rs)
    assert {r.verdict for r in rs} == {"quiet"}


def test_rank_never_picks_noisy_or_both_siblings_and_prefers_the_device_node():
    rs = [noise(1, 300), noise(2, 310), noise(3, 320), noise(4, 90_000), noise(5, 330)]
    rk.judge(rs)
    siblings = {1: [1, 3], 3: [1, 3], 2: [2, 5], 5: [2, 5], 4: [4]}
    node = {1: 0, 2: 1, 3: 0, 4: 1, 5: 1}
    ch = rk.rank(rs, siblings=siblings, cpu_node=node, device_nodes=[1])
    assert 4 not in ch.recommended and "noisy" in ch.left_out[4]
    assert ch.recommended == [2]             # node 1, and 5 is 2's sibling
    assert "SMT sibling of CPU 2" in ch.left_out[5]
    assert ch.ranked[0] == 2
    both = rk.rank(rs, siblings=siblings, cpu_node=node, allow_siblings=True)
    assert both.recommended == [1, 2, 3, 5]


def test_rank_count_and_pinned_and_failed():
    rs = [noise(1, 300), noise(2, 300), noise(3, 300, error="cannot pin to CPU 3")]
    rk.judge(rs)
    ch = rk.rank(rs, siblings={}, cpu_node={}, pinned={1: ["trader"]}, count=1)
    assert ch.recommended == [2] and ch.left_out[1] == "enough CPUs chosen"
    assert "cannot pin" in ch.left_out[3]


def test_batches_keep_a_quarter_busy():
    assert sc.batches(list(range(1, 16)), 16) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12],
                                                  [13, 14, 15]]
    assert sc.batches([1], 2) == [[1]]


def test_attribute_from_proc_deltas(tmp_path):
    host = Host(make_synthetic(tmp_path / "t", ncpus=2))
    before = sc.read_counters(host)
    assert before.by_cpu[0]["irq:eth0-TxRx-0"] == 0
    after = sc.Counters({c: dict(v) for c, v in before.by_cpu.items()})
    after.by_cpu[1]["irq:eth0-TxRx-0"] = 500
    after.by_cpu[1]["tick"] = after.by_cpu[1].get("tick", 0) + 250
    got = sc.attribute(before, after, 1, 1.0, gaps_per_s=760)
    assert got["irq:eth0-TxRx-0"] == 500 and got["tick"] == 250
    assert "hw_or_hypervisor" not in got            # 750 of 760 gaps explained
    got = sc.attribute(before, after, 1, 1.0, gaps_per_s=5000)
    assert got["hw_or_hypervisor"] == 4250


def test_scan_rejects_bad_duration(tmp_path):
    with pytest.raises(Exception, match="--duration"):
        sc.scan(Host(make_synthetic(tmp_path / "t", 2)), [1], 2, 0, 1000, exe=tmp_path / "x")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the recorder")
def test_real_scan_of_one_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTAGENT_CACHE", str(tmp_path / "cache"))
    import os
    cpu = sorted(os.sched_getaffinity(0))[-1]
    (r,) = sc.scan(Host(), [cpu], os.cpu_count() or 1, 0.2, 1000)
    assert r.error is None and r.cpu == cpu
    assert 0.19 < r.duration_s < 0.5
    assert r.gaps >= 1 and r.sum_gap_ns > 0 and r.max_gap_ns >= r.gap_ns.max()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the recorder")
def test_scan_measures_each_cpu_s_interrupt_cost_from_the_sender(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTAGENT_CACHE", str(tmp_path / "cache"))
    import os

    from agent.trace.irqcost import IrqCost
    cpu = sorted(os.sched_getaffinity(0))[-1]
    calls = []

    def coster(c, sender):
        calls.append((c, sender))
        return IrqCost(c, 6200, "6.2 µs per IPI", 6000, 7000, 200, 200)

    (r,) = sc.scan(Host(), [cpu], os.cpu_count() or 1, 0.05, 1000, irq_sender=0,
                   irq_coster=coster)
    assert calls == [(cpu, 0)]
    assert r.to_dict()["irq_cost"]["cost_us"] == 6.2
    (r,) = sc.scan(Host(), [cpu], os.cpu_count() or 1, 0.05, 1000)
    assert r.irq_cost is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the recorder")
def test_recorder_that_cannot_pin_is_reported_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTAGENT_CACHE", str(tmp_path / "cache"))
    (r,) = sc.scan(Host(), [1000], 2, 0.05, 1000)
    assert r.error and "cannot pin to CPU 1000" in r.error


@pytest.mark.parametrize("args,msg", [
    (["--duration", "0"], "--duration"), (["--duration", "-1"], "--duration"),
    (["--duration", "61"], "--duration"), (["--threshold-us", "0"], "--threshold-us"),
    (["--count", "0"], "--count"), (["--candidates", ""], "--candidates"),
    (["--candidates", "0"], "housekeeping"), (["--candidates", "99"], "not online"),
    (["--candidates", "٣"], "--candidates"),
])
def test_cli_bad_input_is_one_line(args, msg, capsys):
    from agent.cli import main
    with pytest.raises(SystemExit) as e:
        import sys
        sys.argv = ["hftagent", "cpus", *args]
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and msg in err[0], err


def test_textfile_series_are_valid_and_bounded(tmp_path):
    import subprocess

    from agent.export.textfile import render_families, write_prom
    from agent.noise.export import TEXTFILE_NAME, families
    rs = [noise(1, 300), noise(2, 90_000)]
    rk.judge(rs)
    doc = {"cpus": [r.to_dict() for r in rs], "recommended": [1]}
    path = write_prom(render_families(families(doc, 1.7e9)), tmp_path, TEXTFILE_NAME)
    text = path.read_text()
    assert 'hftagent_cpu_noise_ratio{cpu="2"} 0.09' in text
    assert 'hftagent_cpu_noise_recommended{cpu="1"} 1.0' in text
    assert 'hftagent_cpu_noise_recommended{cpu="2"} 0.0' in text
    import re
    assert set(re.findall(r"\{(\w+)=", text)) == {"cpu"}     # the only label
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                           capture_output=True)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the recorder")
def test_scan_is_recorded_in_history_and_its_recommendation_is_accepted(tmp_path, monkeypatch,
                                                                          capsys):
    import json
    import sys

    from agent.cli import main
    from agent.history import History
    monkeypatch.setenv("HFTAGENT_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "h.sqlite"
    monkeypatch.setattr(sys, "argv", ["hftagent", "cpus", "--duration", "0.1", "--json",
                                      "--db", str(db)])
    with pytest.raises(SystemExit) as e:
        main()
    doc = json.loads(capsys.readouterr().out)
    assert e.value.code in (0, 2)
    with History(db) as h:
        (run,) = h.runs(limit=None)
        assert run.kind == "cpus" and run.summary["cpus"][0]["cpu"] == doc["cpus"][0]["cpu"]
    if doc["recommended"]:                  # the printed command is accepted (read-only plan)
        cpus = doc["commands"][0].split("--cpus ")[1]
        monkeypatch.setattr(sys, "argv", ["hftagent", "tune", "plan", "--cpus", cpus])
        with pytest.raises(SystemExit) as e:
            main()
        assert e.value.code in (0, 2)


def test_a_cpu_losing_over_the_ceiling_is_noisy_even_alone():
    rs = [noise(1, 120_000)]
    rk.judge(rs)
    assert rs[0].verdict == "noisy"
    rs = [noise(1, 60_000), noise(2, 61_000)]   # loaded alike: both noisy
    rk.judge(rs)
    assert {r.verdict for r in rs} == {"noisy"}


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the recorder")
def test_audit_noise_section(tmp_path, monkeypatch, capsys):
    import json
    import sys

    from agent.cli import main
    monkeypatch.setenv("HFTAGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["hftagent", "audit", "--noise", "0.1", "--json",
                                      "--no-history"])
    with pytest.raises(SystemExit):
        main()
    doc = json.loads(capsys.readouterr().out)
    (f,) = [f for f in doc["findings"] if f["id"] == "noise.targets"]
    assert f["status"] in ("ok", "warn", "unsupported")
    if f["status"] != "unsupported":
        assert {c["cpu"] for c in f["data"]["cpus"]} <= set(range(1, 4096))
