"""Checks for bench/device/multi_gpu.sh (issue #19): the two-GPU audit against nvidia-smi, the
two watch phases, and `hftagent run`'s default CPUs for a process bound to GPU 1.

Subcommands (all read files the script wrote; ``layout`` also reads nvidia-smi and sysfs):
  layout                       one line per GPU: index, bus id, NUMA node, local CPUs
  audit AUDIT.json SMI.csv APPS.csv --pid W --foreign F --foreign-gpu 1
                               every per-GPU audit value vs nvidia-smi --query-gpu /
                               --query-compute-apps of both GPUs; the foreign process fails its
                               GPU only
  watch SPIKES.jsonl PHASES    per phase (foreign on GPU 1, then on GPU 0): spikes, attributed,
                               blamed on "GPU shared", the share naming the foreign PID
  run DRYRUN.json LOCAL        run --dry-run's default CPUs vs the GPU's local CPUs (less the
                               housekeeping core)
Each check prints MATCH/MISMATCH (or PASS/FAIL) lines and a tally; exit status 0 either way
(the report is the result), 2 for unusable input.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

SMI_FIELDS = ("index,pci.bus_id,persistence_mode,compute_mode,clocks.sm,clocks.max.sm,"
              "clocks_event_reasons.active,clocks.applications.graphics,"
              "clocks.default_applications.graphics,pcie.link.gen.current,pcie.link.gen.max,"
              "pcie.link.width.current,pcie.link.width.max,"
              "ecc.errors.uncorrected.volatile.total,ecc.mode.current,mig.mode.current")
APPS_FIELDS = "gpu_bus_id,pid,process_name,used_memory"


def norm_bus(b: str) -> str:
    from collectors.pcie import normalize_bus_id
    return normalize_bus_id(b)


def smi_rows(path: str) -> dict[int, dict[str, str]]:
    """nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits, by index."""
    keys = SMI_FIELDS.split(",")
    out = {}
    for row in csv.reader(open(path)):
        if len(row) != len(keys):
            continue
        d = {k: v.strip() for k, v in zip(keys, row)}
        out[int(d["index"])] = d
    return out


def apps_by_bus(path: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = collections.defaultdict(set)
    for row in csv.reader(open(path)):
        if len(row) >= 2 and row[1].strip().isdigit():
            out[norm_bus(row[0])].add(int(row[1]))
    return out


class Tally:
    def __init__(self) -> None:
        self.n = collections.Counter()

    def check(self, what: str, ok: bool | None, got, want) -> None:
        word = {True: "MATCH", False: "MISMATCH", None: "LIVE"}[ok]
        self.n[word] += 1
        print(f"  {word:8s} {what}: audit {got!r} / nvidia-smi {want!r}")

    def verdict(self, what: str, ok: bool, detail: str) -> None:
        self.n["PASS" if ok else "FAIL"] += 1
        print(f"  {'PASS' if ok else 'FAIL':8s} {what}: {detail}")

    def summary(self) -> None:
        print("  tally:", dict(self.n))


def _num(s: str) -> int | None:
    s = s.strip()
    if s.lower().startswith("0x"):
        return int(s, 16)
    return int(s) if s.isdigit() else None


def cmd_layout(_a) -> int:
    from collectors.host import Host
    from collectors.parsers import format_cpulist
    from collectors.pcie import pci_devices
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"  nvidia-smi: {exc}")
        return 2
    devs = {d.address: d for d in pci_devices(Host())}
    for line in r.stdout.splitlines():
        idx, bus = (x.strip() for x in line.split(","))
        d = devs.get(norm_bus(bus))
        node = "-1" if d is None or d.numa_node is None else str(d.numa_node)
        local = format_cpulist(d.local_cpus) if d is not None and d.local_cpus else "?"
        print(idx, norm_bus(bus), node, local)
    return 0


def cmd_audit(a) -> int:
    doc = json.load(open(a.audit))
    fs = {f["id"]: f for f in doc["findings"]}
    smi, apps = smi_rows(a.smi), apps_by_bus(a.apps)
    if len(smi) < 2:
        print(f"  nvidia-smi rows for {len(smi)} GPU(s) in {a.smi}: need 2")
        return 2
    t = Tally()
    print(f"target CPUs {doc.get('target_cpus')}; --pid {a.pid}; foreign {a.foreign} on GPU "
          f"{a.foreign_gpu}")
    for i, s in sorted(smi.items()):
        print(f"GPU {i} ({norm_bus(s['pci.bus_id'])}):")
        mine = {k: f for k, f in fs.items() if k.startswith(f"gpu.{i}.")}
        if not mine:
            t.verdict(f"gpu.{i}.* findings", False, "none in the audit")
            continue
        for f in mine.values():
            print(f"    {f['status']:12s} {f['id']:26s} {f['current']}")
        bus = {f.get("data", {}).get("bus_id") for f in mine.values()}
        t.check("bus id (data.bus_id of every finding)", bus == {norm_bus(s["pci.bus_id"])},
                sorted(map(str, bus)), norm_bus(s["pci.bus_id"]))
        cur = {k.split(".", 2)[2]: f["current"] for k, f in mine.items()}
        if "persistence" in cur:
            want = {"Enabled": "on", "Disabled": "off"}.get(s["persistence_mode"])
            t.check("persistence", cur["persistence"] == want, cur["persistence"],
                    s["persistence_mode"])
        if "compute_mode" in cur:
            t.check("compute mode", cur["compute_mode"] == s["compute_mode"].upper(),
                    cur["compute_mode"], s["compute_mode"])
        m = re.match(r"SM (\S+) of (\S+) MHz; reasons (0x[0-9a-f]+)", cur.get("clocks", ""))
        if m:
            t.check("max SM clock", _num(m.group(2)) == _num(s["clocks.max.sm"]), m.group(2),
                    s["clocks.max.sm"])
            # live values: read a few ms apart, they may differ without being wrong
            t.check("SM clock", None, m.group(1), s["clocks.sm"])
            t.check("clock event reasons", _num(m.group(3)) == _num(
                s["clocks_event_reasons.active"]) or None, m.group(3),
                s["clocks_event_reasons.active"])
        m = re.match(r"SM applications clock (\d+) MHz \(default (\S+)\)", cur.get("app_clocks", ""))
        if m:
            t.check("applications clock", m.group(1) == s["clocks.applications.graphics"],
                    m.group(1), s["clocks.applications.graphics"])
            t.check("default applications clock",
                    m.group(2) == s["clocks.default_applications.graphics"], m.group(2),
                    s["clocks.default_applications.graphics"])
        m = re.match(r"gen(\S+) x(\S+) \(max gen(\S+) x(\S+)\)", cur.get("pcie_link", ""))
        if m:
            t.check("PCIe max gen/width", (m.group(3), m.group(4)) == (
                s["pcie.link.gen.max"], s["pcie.link.width.max"]), m.group(3, 4),
                (s["pcie.link.gen.max"], s["pcie.link.width.max"]))
            # the current gen drops at idle (link power saving): a live value
            same = (m.group(1), m.group(2)) == (s["pcie.link.gen.current"],
                                                s["pcie.link.width.current"])
            t.check("PCIe current gen/width", same or None, m.group(1, 2),
                    (s["pcie.link.gen.current"], s["pcie.link.width.current"]))
        m = re.match(r"(\d+) uncorrected since driver load; ECC (\S+)", cur.get("ecc", ""))
        if m:
            t.check("volatile uncorrected ECC", m.group(1) ==
                    s["ecc.errors.uncorrected.volatile.total"], m.group(1),
                    s["ecc.errors.uncorrected.volatile.total"])
            t.check("ECC mode", {"on": "Enabled", "off": "Disabled"}.get(m.group(2)) ==
                    s["ecc.mode.current"], m.group(2), s["ecc.mode.current"])
        if "mig" in cur and s["mig.mode.current"] in ("Enabled", "Disabled"):
            t.check("MIG mode", cur["mig"].startswith(
                "on" if s["mig.mode.current"] == "Enabled" else "off"), cur["mig"],
                s["mig.mode.current"])
        fp = mine.get(f"gpu.{i}.foreign_processes")
        if fp is not None:
            pids = {p["pid"] for p in fp.get("data", {}).get("processes", [])}
            t.check("compute processes", pids == apps.get(norm_bus(s["pci.bus_id"]), set()),
                    sorted(pids), sorted(apps.get(norm_bus(s["pci.bus_id"]), set())))
            foreign = fp.get("data", {}).get("foreign", [])
            if i == a.foreign_gpu:
                t.verdict(f"GPU {i} has the foreign process", fp["status"] != "ok"
                          and a.foreign in foreign, f"{fp['status']}, foreign {foreign}")
            else:
                t.verdict(f"GPU {i} has none", fp["status"] == "ok" and not foreign,
                          f"{fp['status']}, foreign {foreign}")
    pcie = fs.get("pcie.numa_locality")
    if pcie:
        print(f"pcie.numa_locality ({pcie['status']}): {pcie['current']}")
    t.summary()
    return 0


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def cmd_watch(a) -> int:
    phases = []
    for line in open(a.phases):
        p = line.split()
        if len(p) == 4:
            phases.append((p[0], float(p[1]), float(p[2]), int(p[3])))
    if len(phases) != 2:
        print(f"  {a.phases}: need two phases (foreign on GPU 1, then on GPU 0)")
        return 2
    recs = [json.loads(x) for x in open(a.spikes) if x.strip()]
    recs = [r for r in recs if "latency_us" in r]
    t = Tally()
    print(f"spike records: {len(recs)}")
    for name, t0, t1, pid in phases:
        inside = [r for r in recs if t0 <= _ts(r["time"]) <= t1]
        attributed = [r for r in inside if r.get("cause")]
        shared = [r for r in attributed if any("GPU shared" in (c.get("detail") or "")
                                               for c in r.get("causes", []))]
        named = [r for r in attributed if r["cause"] == "gpu_foreign_process"
                 and f"GPU shared with PID {pid} " in (r["causes"][0].get("detail") or "")]
        other = [r for r in shared if r not in named]
        causes = collections.Counter(r["cause"] for r in inside)
        share = len(named) / len(attributed) if attributed else 0.0
        print(f"phase {name} (foreign pid {pid}, {t1 - t0:.1f} s): {len(inside)} spikes, "
              f"{len(attributed)} attributed; blamed on 'GPU shared': {len(shared)}; naming "
              f"PID {pid}: {len(named)} = {100 * share:.1f} % of attributed; causes "
              f"{dict(causes)}")
        for r in (named or attributed)[:2]:
            c = r["causes"][0] if r.get("causes") else {}
            print(f"    e.g. {r['time']} {r['latency_us']} us -> {r['cause']}: "
                  f"{c.get('detail')} {json.dumps(c.get('evidence'), default=str)[:240]}")
        if name == "gpu1":
            t.verdict("GPU-1 phase: no spike blamed on 'GPU shared'", not shared,
                      f"{len(shared)} of {len(attributed)} attributed")
        else:
            t.verdict("GPU-0 phase: the foreign PID is named", bool(named) and not other,
                      f"{len(named)} of {len(attributed)} attributed ({100 * share:.1f} %), "
                      f"{len(other)} blaming another PID")
    outside = [r for r in recs if not any(t0 <= _ts(r["time"]) <= t1 for _, t0, t1, _ in phases)]
    print(f"outside both phases: {len(outside)} spikes, causes "
          f"{dict(collections.Counter(r.get('cause') for r in outside))}")
    t.summary()
    return 0


def cmd_run(a) -> int:
    """The default --cpus of `run --dry-run` vs the GPU's local CPUs; the housekeeping core
    (the lowest online CPU and its SMT siblings, tuning/targets.py) may be left out."""
    from collectors.host import Host
    from collectors.parsers import format_cpulist, parse_cpulist
    d = json.load(open(a.dry_run))
    t = Tally()
    local = set(parse_cpulist(a.local))
    try:
        from collectors.system import online_cpus
        from tuning.targets import housekeeping_core
        online = online_cpus(Host()).value.cpus
        house = set(housekeeping_core(Host(), online))
    except Exception as exc:  # noqa: BLE001 - an older tree: CPU 0 stands for the core
        print(f"  (housekeeping core not known here: {type(exc).__name__}: {exc}; CPU 0)")
        house = {0}
    got = set(parse_cpulist(d["cpus"]))
    print(f"{a.label}: cpus {d['cpus']} ({d['cpus_source']}); GPU {a.gpu}'s local CPUs "
          f"{format_cpulist(local)}, housekeeping core {format_cpulist(house)}")
    t.verdict(f"{a.label}: default --cpus = GPU {a.gpu}'s local CPUs (less the housekeeping "
              "core)", got <= local and local - got <= house,
              f"{d['cpus']} vs {format_cpulist(local)}")
    t.summary()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("layout")
    p = sub.add_parser("audit")
    p.add_argument("audit")
    p.add_argument("smi")
    p.add_argument("apps")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--foreign", type=int, required=True)
    p.add_argument("--foreign-gpu", type=int, default=1)
    p = sub.add_parser("watch")
    p.add_argument("spikes")
    p.add_argument("phases")
    p = sub.add_parser("run")
    p.add_argument("dry_run")
    p.add_argument("local")
    p.add_argument("--gpu", type=int, default=1)
    p.add_argument("--label", default="hftagent run --dry-run")
    a = ap.parse_args()
    for f in ("audit", "smi", "apps", "spikes", "phases", "dry_run"):
        if getattr(a, f, None) and not Path(getattr(a, f)).is_file():
            print(f"  {getattr(a, f)}: missing")
            return 2
    try:
        return {"layout": cmd_layout, "audit": cmd_audit, "watch": cmd_watch,
                "run": cmd_run}[a.cmd](a)
    except (ValueError, KeyError, OSError) as exc:  # an empty or cut file from a failed step
        print(f"  {a.cmd}: unusable input ({type(exc).__name__}: {exc})")
        return 2


if __name__ == "__main__":
    sys.exit(main())
