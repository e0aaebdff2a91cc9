"""Does `tune rollback` undo what `audit --fix-script` changed, on a live box? (issue #39 item 1:
"after running the fix script on a live box and then `tune rollback`, a snapshot of every value
the script touched equals the one before").

Run as root on a disposable box (it applies the audit's runtime fixes, isolation included, then
rolls them back):

    sudo .venv/bin/python bench/fix_roundtrip.py [--cpus LIST] [--json OUT]

1. ``hftagent audit --fix-script`` writes the script (into a fresh private directory);
2. a snapshot: every sysctl under /proc/sys, every IRQ's affinity and the default one, each
   CPU's PM QoS resume latency, the workqueue cpumasks, the cpuset directories and their
   files, the guest halt-poll parameters, and the CPU affinity of every task;
3. the script's runtime part runs (``sh``, ``set -e`` as written; the boot-argument part,
   after its marker, is left out: it edits the boot loader and takes effect only at a reboot);
4. a snapshot (what the script changed), then ``hftagent tune rollback``, then a snapshot;
5. printed: how many values the script changed, and every value that differs between the
   first and the last snapshot. A difference the script marks "not undone by tune rollback"
   (a line it prints with the value to restore) is listed apart and restored by hand here
   from the mark. Values that move by themselves (counters: fs.*-nr, random, a task that
   exited or started) are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
BOOT_MARK = "# -- boot arguments"
# sysctls that change by themselves (counters, random state, time)
VOLATILE = re.compile(r"^/proc/sys/(fs/(dentry-state|inode-nr|inode-state|file-nr|"
                      r"aio-nr|quota/)|kernel/(random/|ns_last_pid|pty/nr|tainted|"
                      r"sched_domain/)|net/|dev/|user/)")


def _read(p: Path) -> str | None:
    try:
        return p.read_text(errors="replace").strip()
    except OSError:
        return None


def snapshot() -> dict[str, str | None]:
    """Every value the fix script's tunables can touch, keyed by path (tasks by tid)."""
    snap: dict[str, str | None] = {}
    for root in (Path("/proc/sys"),):
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                p = Path(dirpath) / f
                if os.access(p, os.R_OK) and not VOLATILE.match(str(p)):
                    snap[str(p)] = _read(p)
    for p in Path("/proc/irq").glob("*/smp_affinity_list"):
        snap[str(p)] = _read(p)
    snap["/proc/irq/default_smp_affinity"] = _read(Path("/proc/irq/default_smp_affinity"))
    for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/power/pm_qos_resume_latency_us"):
        snap[str(p)] = _read(p)
    for p in Path("/sys/devices/virtual/workqueue").glob("**/cpumask"):
        snap[str(p)] = _read(p)
    for p in Path("/sys/module/haltpoll/parameters").glob("*"):
        snap[str(p)] = _read(p)
    for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpuset")):
        for d in sorted(base.glob("hftagent-*")):
            snap[f"{d}/(exists)"] = "yes"
        for f in ("cpuset.cpus.partition", "cpuset.sched_load_balance"):
            if (base / f).exists():
                snap[str(base / f)] = _read(base / f)
    for t in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            snap[f"task {t.name} ({_read(t / 'comm')})"] = ",".join(
                map(str, sorted(os.sched_getaffinity(int(t.name)))))
        except OSError:
            pass
    return snap


def diff(a: dict, b: dict) -> tuple[dict[str, tuple], int]:
    """(key: (before, after)) for values in both that differ; plus how many keys were in only
    one (a task that exited or started, a file that came or went)."""
    common = a.keys() & b.keys()
    changed = {k: (a[k], b[k]) for k in sorted(common) if a[k] != b[k]}
    only = len((a.keys() | b.keys()) - common)
    # a cgroup directory that exists after but not before is a difference, not a come-and-go
    for k in sorted(b.keys() - a.keys()):
        if k.endswith("/(exists)"):
            changed[k] = (None, b[k])
            only -= 1
    return changed, only


def not_undone(script: str) -> dict[str, str]:
    """The runtime lines marked "not undone by tune rollback": {path: value to restore}."""
    marks = {}
    for line in script.splitlines():
        m = re.match(r"^echo (\S+) > (/\S+)\s+# not undone by tune rollback; it was: (.*)$",
                     line)
        if m:
            old = re.search(r"(-?\d+)", m.group(3))
            marks[m.group(2)] = old.group(1) if old else ""
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", help="the target CPUs (default: the audit's rule)")
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("fix_roundtrip: needs root (it applies and rolls back the audit's fixes)",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="fixrt-"))
    env = dict(os.environ)  # the script's tune apply and our rollback: the default state dir
    path = work / "fix.sh"
    cmd = [*CLI, "audit", "--fix-script", str(path)] + (["--cpus", a.cpus] if a.cpus else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if not path.exists():
        print(f"no fix script (rc {r.returncode}): {r.stderr.strip()}", file=sys.stderr)
        return 1
    script = path.read_text()
    runtime = script.split(BOOT_MARK)[0]
    (work / "runtime.sh").write_text(runtime)
    before = snapshot()
    ran = subprocess.run(["sh", str(work / "runtime.sh")], capture_output=True, text=True,
                         env=env)
    applied = snapshot()
    rb = subprocess.run([*CLI, "tune", "rollback"], capture_output=True, text=True, env=env)
    after = snapshot()
    changed, _ = diff(before, applied)
    left, came_went = diff(before, after)
    marks = not_undone(runtime)
    marked = {k: v for k, v in left.items() if k in marks}
    unmarked = {k: v for k, v in left.items() if k not in marks}
    for p, old in marks.items():  # restore what the script said tune would not
        if old:
            Path(p).write_text(old + "\n")
    print(f"script: {path} ({len(runtime.splitlines())} runtime lines), rc {ran.returncode}"
          + (f": {ran.stderr.strip()[-300:]}" if ran.returncode else ""))
    print(f"rollback rc {rb.returncode}" + (f": {rb.stderr.strip()[-300:]}"
                                             if rb.returncode else ""))
    print(f"values the script changed: {len(changed)}")
    for k, (x, y) in list(changed.items())[:12]:
        print(f"  {k}: {x} -> {y}")
    if len(changed) > 12:
        print(f"  ... and {len(changed) - 12} more")
    print(f"not restored by tune rollback and marked so by the script: {len(marked)} "
          "(restored here from the mark)")
    for k, (x, y) in marked.items():
        print(f"  {k}: was {x}, left {y}")
    print(f"not restored and NOT marked: {len(unmarked)}")
    for k, (x, y) in unmarked.items():
        print(f"  {k}: was {x}, left {y}")
    print(f"(keys that came or went between the snapshots, e.g. tasks: {came_went})")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "changed": len(changed), "marked": marked, "unmarked": unmarked,
            "script_rc": ran.returncode, "rollback_rc": rb.returncode}, indent=1,
            default=str) + "\n")
    # the script may stop at its tune apply (exit 2: a setting the kernel would not take, e.g.
    # a managed IRQ): what it wrote is journalled all the same, which is what is judged here
    return 0 if rb.returncode == 0 and not unmarked else 1


if __name__ == "__main__":
    sys.exit(main())
