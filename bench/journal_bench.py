"""Benchmark: `tune apply` and `tune rollback` of a big box, journal included.

    .venv/bin/python bench/journal_bench.py [--cpus 128] [--irqs 1000] [--runs 3]
                                            [--writer sim|file] [--keep DIR]
    .venv/bin/python bench/journal_bench.py --load-entries 200000

Builds a SYNTHETIC tree (tests/treecopy.py's bare-metal tree with ``--cpus`` CPUs, plus
``--irqs`` IRQs on every CPU), then times, in-process and in this order: the plan, the apply
(journal → write → read back → verify) and the rollback of the built-in hft-cpu profile with
the upper half of the CPUs as targets, on a fresh copy per run. Every run checks the round
trip: after rollback every file of the tree is byte for byte what it was, and the journal is
gone. Figures are per run, then the median.

``--writer sim`` (default) writes through the tests' kernel simulation (tests/treecopy.py
KernelSim: bracketed selectors, smp_affinity kept in step), so every target round-trips.
``--writer file`` uses the production FileWriter (the O_NOFOLLOW walk of every path
component); THP is skipped then, because a plain file does not rewrite "[always] madvise
never" into a selector as sysfs does.

The journal lives in the tree (ROOT/run/hftagent), so its fsyncs hit the file system the
tree is on (``--keep DIR`` puts the trees there, e.g. on a tmpfs to compare).

``--load-entries N`` times only reading and validating a journal of N IRQ entries (what
rollback and status do before their first write), without a tree.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.host import Host  # noqa: E402
from collectors.parsers import format_cpulist, format_cpumask  # noqa: E402
from tests.treecopy import KernelSim, diff, make_synthetic, snapshot  # noqa: E402
from tuning.apply import apply_plan, build_context, make_plan, rollback  # noqa: E402
from tuning.profiles import load_profile  # noqa: E402
from tuning.tunables.base import FileWriter  # noqa: E402

FIRST_IRQ = 24


def build_tree(dst: Path, ncpus: int, nirqs: int) -> Path:
    """make_synthetic's tree with ``nirqs`` IRQs (24, 25, ...) allowed on every CPU."""
    make_synthetic(dst, ncpus=ncpus)
    irq_dir = dst / "proc/irq"
    for d in irq_dir.iterdir():
        if d.is_dir():
            shutil.rmtree(d)
    allc = format_cpulist(range(ncpus))
    mask = format_cpumask(range(ncpus))
    header = "".join(f"{'CPU' + str(c):>11}" for c in range(ncpus))
    zeros = "".join(f"{0:>11}" for _ in range(ncpus))
    rows = []
    for irq in range(FIRST_IRQ, FIRST_IRQ + nirqs):
        d = irq_dir / str(irq)
        d.mkdir()
        (d / "smp_affinity_list").write_text(allc + "\n")
        (d / "smp_affinity").write_text(mask + "\n")
        (d / "effective_affinity_list").write_text("0\n")
        rows.append(f"{irq:>4}:{zeros}  PCI-MSI  dev{irq}-q0")
    (dst / "proc/interrupts").write_text(header + "\n" + "\n".join(rows) + "\n")
    return dst


def one_run(root: Path, ncpus: int, writer: str) -> dict:
    before = snapshot(root)
    host = Host(root)
    targets = format_cpulist(range(ncpus // 2, ncpus))
    ctx = build_context(host, load_profile("hft-cpu"), targets)
    ctx.writer = KernelSim() if writer == "sim" else FileWriter()
    skip = ["memory.thp_enabled", "memory.thp_defrag"] if writer == "file" else None
    sd = host.run_dir("hftagent")
    t0 = time.perf_counter()
    plan = make_plan(ctx, skip=skip)
    t1 = time.perf_counter()
    rep = apply_plan(ctx, plan, sd, profile="hft-cpu")
    t2 = time.perf_counter()
    journal = sd / "journal.json"
    jbytes = journal.stat().st_size
    rb = rollback(ctx, sd)
    t3 = time.perf_counter()
    applied = sum(1 for o in rep.outcomes if o.result == "applied")
    failed = [o.to_dict() for o in rep.outcomes if o.result in ("failed", "not-held")]
    if failed or rb.remaining:
        raise SystemExit(f"round trip failed: {failed[:3]} remaining={rb.remaining}")
    changed = diff(before, snapshot(root))
    if changed or journal.exists():
        raise SystemExit(f"rollback did not restore the tree: {changed[:5]}")
    return {"targets": len(plan.writes), "applied": applied, "journal_bytes": jbytes,
            "plan_s": t1 - t0, "apply_s": t2 - t1, "rollback_s": t3 - t2}


def load_only(n: int) -> None:
    """Write a version-2 journal of ``n`` IRQ entries, then time load() and the checks that
    rollback runs on it before writing anything."""
    import json

    from tuning.apply import _check_known
    from tuning.journal import FORMAT, VERSION, load

    d = Path(tempfile.mkdtemp(prefix="journal-load-"))
    try:
        head = {"format": FORMAT, "version": VERSION, "boot_id": "b", "created": "",
                "profile": "hft-cpu", "cpus": "64-127", "procfs": "/t/proc", "sysfs": "/t/sys"}
        with open(d / "journal.json", "w") as fh:
            fh.write(json.dumps(head) + "\n")
            for i in range(n):
                fh.write(json.dumps({"op": "add", "seq": i + 1, "tunable": "irq.affinity",
                                     "target": f"/proc/irq/{i}/smp_affinity_list",
                                     "original": "0-127", "written": "0-63", "time": "",
                                     "detail": "", "before": None}, separators=(",", ":"))
                         + "\n")
        size = (d / "journal.json").stat().st_size
        t0 = time.perf_counter()
        j = load(d)
        t1 = time.perf_counter()
        _check_known(j)
        t2 = time.perf_counter()
        print(f"{n:,} entries ({size:,} B): load {t1 - t0:.2f} s, tunable/target/value checks "
              f"{t2 - t1:.2f} s")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=int, default=128)
    ap.add_argument("--irqs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--writer", choices=("sim", "file"), default="sim")
    ap.add_argument("--keep", help="directory for the trees (default: a temp dir, removed)")
    ap.add_argument("--load-entries", type=int, metavar="N",
                    help="only time loading and validating an N-entry journal")
    args = ap.parse_args()
    if args.load_entries:
        load_only(args.load_entries)
        return
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="journal-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    proto = build_tree(base / "proto", args.cpus, args.irqs)
    runs = []
    try:
        for i in range(args.runs):
            root = base / f"run{i}"
            shutil.copytree(proto, root, symlinks=True)
            r = one_run(root, args.cpus, args.writer)
            runs.append(r)
            print(f"run {i + 1}: {r['targets']} targets ({r['applied']} applied), journal "
                  f"{r['journal_bytes']:,} B: plan {r['plan_s']:.2f} s, apply "
                  f"{r['apply_s']:.2f} s, rollback {r['rollback_s']:.2f} s", flush=True)
            shutil.rmtree(root)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in runs) for k in ("plan_s", "apply_s", "rollback_s")}
    print(f"median of {len(runs)} ({args.cpus} CPUs, {args.irqs} IRQs, writer {args.writer}): "
          f"plan {med['plan_s']:.2f} s, apply {med['apply_s']:.2f} s, rollback "
          f"{med['rollback_s']:.2f} s")


if __name__ == "__main__":
    main()
