"""Real round trip of runtime isolation on this host: tune plan/apply --isolate --only isolate,
status, rollback.

    sudo .venv/bin/python bench/isolate_roundtrip.py --cpus 1 --state-dir /tmp/iso-rt [--json OUT]

Changes the live kernel for a few seconds (every movable task and kernel thread off --cpus,
the unbound workqueue masks, a cpuset), then rolls back. Before the apply it records every
task's affinity (by TID and starttime) and every file isolation may write; after the apply it
counts the movable tasks still allowed on --cpus and lists what stays there (by name); after
the rollback it checks every task that still exists has its affinity back and every file its
value. Prints one summary; exit 0 when everything was restored, 1 otherwise.

Tasks started while the isolation is in place inherit their parent's housekeeping affinity and
keep it (only tasks that existed at apply time are journalled): the script counts them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from collectors.host import Host  # noqa: E402
from collectors.parsers import format_cpulist, parse_cpulist  # noqa: E402
from collectors.tasks import tasks  # noqa: E402
from tuning.tunables.isolate import (  # noqa: E402
    DIR_PREFIX,
    IsolateCgroup,
    IsolateCpuset,
    IsolateWorkqueue,
    survey_tasks,
)


def cli(*args: str) -> tuple[int, dict, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", "from agent.cli import main; main()", *args,
                        "--json"], capture_output=True, text=True, cwd=REPO, check=False)
    dt = time.perf_counter() - t0
    try:
        out = json.loads(r.stdout)
    except ValueError:
        out = {"stdout": r.stdout[-2000:], "stderr": r.stderr[-2000:]}
    return r.returncode, out, dt


def affinities(host: Host) -> dict[tuple[int, int], str]:
    return {(t.tid, t.starttime): format_cpulist(t.affinity or []) for t in tasks(host)}


def files(host: Host) -> dict[str, str | None]:
    """Every file (and cgroup directory) the isolate tunables may write, with its value."""
    from tuning.apply import build_context
    from tuning.profiles import load_profile

    ctx = build_context(host, load_profile("hft-cpu"), None)
    out: dict[str, str | None] = {}
    wq = IsolateWorkqueue()
    for p in wq.patterns:
        if host.exists(host.sys(p[len("/sys/"):])):
            out[p] = wq.read_target(ctx, p)
    for t in (IsolateCgroup(), IsolateCpuset()):
        for p in t.patterns:
            path = p[len(DIR_PREFIX):] if p.startswith(DIR_PREFIX) else p
            parent = path.rsplit("/", 1)[0]
            if host.exists(host.sys(parent[len("/sys/"):])):
                out[p] = t.read_target(ctx, p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    host = Host()
    cpus = parse_cpulist(a.cpus)
    online = parse_cpulist(host.read(host.sys("devices/system/cpu/online")).value or "")
    house = sorted(set(online) - set(cpus))
    res: dict = {"cpus": a.cpus, "kernel": host.read(host.proc("sys/kernel/osrelease")).value}

    rc, plan, dt = cli("tune", "plan", "--isolate", "--only", "isolate", "--cpus", a.cpus)
    res["plan"] = {"rc": rc, "s": round(dt, 2), "changes": sum(
        len(i["changes"]) for i in plan.get("items", [])),
        "unavailable": {i["id"]: i["reason"] for i in plan.get("items", [])
                        if i["state"] == "unavailable"}}
    aff0, files0 = affinities(host), files(host)
    before = survey_tasks(host, cpus, house)
    rc, applied, dt = cli("tune", "apply", "--isolate", "--only", "isolate", "--cpus", a.cpus,
                          "--state-dir", a.state_dir)
    after = survey_tasks(host, cpus, house)
    files1 = files(host)
    res["apply"] = {"rc": rc, "s": round(dt, 2), "results": {}}
    for o in applied.get("outcomes", []):
        k = f"{o['tunable']}:{o['result']}"
        res["apply"]["results"][k] = res["apply"]["results"].get(k, 0) + 1
    res["apply"]["findings"] = {f["id"]: [f["status"], f["current"]]
                                for f in applied.get("findings", [])}
    res["movable_on_targets"] = {"before": len(before.moves), "after": len(after.moves),
                                 "after_names": [t.name for t, _ in after.moves]}
    res["staying"] = {k: v for k, v in after.summary().items() if isinstance(v, list)}
    res["files_while_applied"] = {k: [files0.get(k), v] for k, v in files1.items()
                                  if files0.get(k) != v}
    rc, st, dt = cli("tune", "status", "--state-dir", a.state_dir)
    res["status"] = {"rc": rc, "all_hold": st.get("all_hold"),
                     "not_holding": [(i["target"], i["result"]) for i in st.get("items", [])
                                     if i["result"] != "holds"][:20]}
    rc, rb, dt = cli("tune", "rollback", "--state-dir", a.state_dir)
    res["rollback"] = {"rc": rc, "s": round(dt, 2), "remaining": rb.get("remaining"),
                       "results": {}}
    for i in rb.get("items", []):
        res["rollback"]["results"][i["result"]] = res["rollback"]["results"].get(
            i["result"], 0) + 1
    res["rollback"]["left"] = [(i["target"], i["result"], i["message"])
                               for i in rb.get("items", []) if i["result"] not in
                               ("restored", "was-original")][:20]
    aff2, files2 = affinities(host), files(host)
    existing = [k for k in aff0 if k in aff2]
    names = {(t.tid, t.starttime): t.name for t in tasks(host)}
    journalled = {i["target"] for i in rb.get("items", [])}
    wrong = {f"{k[0]}:{k[1]}": [aff0[k], aff2[k], names.get(k, "?"),
                                "journalled" if f"task:{k[0]}:{k[1]}" in journalled
                                else "not journalled"]
             for k in existing if aff0[k] != aff2[k]}
    new = [k for k in aff2 if k not in aff0]
    res["restored"] = {"tasks_before": len(aff0), "still_there": len(existing),
                       "exited": len(aff0) - len(existing), "affinity_differs": wrong,
                       "started_during": len(new),
                       "started_during_on_housekeeping_only": sum(
                           1 for k in new if aff2[k] == format_cpulist(house)),
                       "files_differ": {k: [files0.get(k), v] for k, v in files2.items()
                                        if files0.get(k) != v}}
    ok = not wrong and not res["restored"]["files_differ"]
    res["ok"] = ok
    text = json.dumps(res, indent=2)
    print(text)
    if a.json_out:
        Path(a.json_out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("bench/isolate_roundtrip.py: changes the live kernel: run as root")
    sys.exit(main())
