"""bench/attribution.py's scoring, on synthetic spike records: which spikes are the box's
own tasks or the host's (counted apart), right/wrong over the rest, culprit naming over the
fault's own right spikes, and --rescore from a run's JSON and logs (nothing is run, nothing
is written outside tmp)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.attribution import background, score

BENCH = Path(__file__).resolve().parents[1] / "bench" / "attribution.py"
KIT = [101, 102]


def rec(seq, cause, excess=1000.0, tasks=(), breakdown=(), inherited=None, p50=400.0):
    r = {"seq": seq, "cause": cause, "latency_us": p50 + excess, "p50_us": p50,
         "attributed_after_ms": 50.0}
    if inherited is not None:
        r["inherited_from"] = inherited
        return r
    ents = [{"label": "probe python[9]", "kind": "probe", "us": p50}]
    ents += [{"label": label, "kind": "task", "us": us} for label, us in tasks]
    bd = [{"what": label, "us": us} for label, us in tasks] + \
        [{"what": w, "us": us} for w, us in breakdown]
    r["events"] = {"timeline": {"entities": ents}, "breakdown": bd}
    return r


def test_box_task_in_a_cpu_fault_is_counted_apart():
    recs = [rec(1, "cpu_contention", tasks=[("kdamond.0[78]", 900.0)]),
            rec(2, "cpu_contention", tasks=[("python[101]", 950.0)]),
            # both ran: the kit's hog longer, so the spike is the fault's
            rec(3, "cpu_contention", tasks=[("python[102]", 600.0), ("kdamond.0[78]", 550.0)]),
            # the box's task ran, but for less than half the excess
            rec(4, "cpu_contention", tasks=[("kdamond.0[78]", 300.0)]),
            rec(5, "cpu_contention", inherited=1),
            rec(6, "cpu_contention")]
    # a kworker's work item (the entity kind "workqueue") is the box's too
    recs[5]["events"]["timeline"]["entities"].append(
        {"label": "kworker/1:2 (gc_worker)", "kind": "workqueue", "us": 900.0})
    assert background(recs, "cpu_contention", KIT) == {1: "kdamond.0[78]",
                                                       5: "kdamond.0[78]",
                                                       6: "kworker/1:2 (gc_worker)"}


def test_host_time_is_counted_apart_unless_it_is_the_expected_cause():
    recs = [rec(1, "steal", breakdown=[("hw_or_hypervisor", 800.0)]),
            rec(2, "wakeup_latency", breakdown=[("idle before the probe woke", 700.0)]),
            rec(3, "softirq", breakdown=[("softirq NET_RX", 500.0),
                                         ("hw_or_hypervisor", 600.0)]),
            rec(4, "steal", breakdown=[("hw_or_hypervisor", 200.0)]),  # under half
            rec(5, "unexplained", breakdown=[("hw_or_hypervisor", 500.0)])]
    bg = background(recs, "softirq", KIT)
    # spike 3: the verdict is the fault's, but the host hid most of its excess
    assert bg == {1: "host: hidden time (steal)", 2: "host: late wake-up",
                  3: "host: hidden time (steal)", 5: "host: hidden time (steal)"}
    # where the fault injects the host's cause, a host spike is the fault's
    assert 1 not in background(recs, "steal", KIT)
    assert 2 not in background(recs, "wakeup_latency", KIT)


def test_score_over_the_rest_and_culprit_named_over_the_faults_own():
    recs = [rec(1, "cpu_contention", tasks=[("kdamond.0[78]", 900.0)]),
            rec(2, "cpu_contention", tasks=[("python[101]", 950.0)]),
            rec(3, "cpu_contention", tasks=[("python[102]", 900.0)]),
            rec(4, "steal", breakdown=[("hw_or_hypervisor", 900.0)]),
            rec(5, "irq", breakdown=[("irq virtio0", 900.0)]),
            {"seq": 6, "cause": None}]
    s = score("oversubscription", recs, {"pids": KIT})
    assert (s["spikes"], s["right"], s["wrong"], s["not_attributed"]) == (5, 3, 2, 1)
    assert s["background"] == 2
    # over the rest: 2 right of the kit's hogs, 1 wrong (the irq), none of the box's
    assert s["right_share_of_fault"] == round(2 / 3, 3)
    assert s["wrong_share_of_fault"] == round(1 / 3, 3)
    ev = s["events"]
    assert ev["right_timed"] == 2 and ev["culprit_named_share"] == 1.0
    # the raw shares stay
    assert s["right_share"] == 0.6 and s["wrong_share"] == 0.4


def test_rescore_reads_a_runs_json_and_logs(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    recs = [rec(1, "cpu_contention", tasks=[("python[101]", 950.0)]),
            rec(2, "cpu_contention", tasks=[("kdamond.0[78]", 900.0)])]
    (logs / "cpu_hog.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = {"results": [{"fault": "cpu_hog", "samples": 100, "p50_us": 400.0, "p99_us": 900.0,
                        "fault_params": {"pids": [101]}}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = tmp_path / "again.json"
    p = subprocess.run([sys.executable, str(BENCH), "--rescore", str(tmp_path / "run.json"),
                        "--log-dir", str(logs), "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())["results"][0]
    assert res["background"] == 1 and res["right_share_of_fault"] == 1.0
    assert "cpu_hog" in p.stdout


def test_rescore_without_its_log_is_one_line(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"results": [{"fault": "cpu_hog"}]}))
    p = subprocess.run([sys.executable, str(BENCH), "--rescore", str(tmp_path / "run.json"),
                        "--log-dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("attribution: cannot rescore:") and p.stderr.count("\n") == 1
