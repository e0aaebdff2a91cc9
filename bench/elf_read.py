"""What reading a library's symbols costs (agent/trace/elf.py, issue #34): wall time and the
peak resident set of one ``elf.resolve()``, each case in a fresh process.

    .venv/bin/python bench/elf_read.py [--runs 3] [--lib PATH] [--dir DIR] [--json OUT]

Cases (interleaved, ``--runs`` rounds):

- ``tf``: the biggest real library we attach to (``libtensorflow_cc.so.2`` from the venv, or
  ``--lib``), ``TF_SessionRun`` and a name it lacks (so both tables are walked to the end);
- ``sparse-within-cap``: a 10 GiB sparse file whose 500 MiB of symbol and string tables are
  holes but for 65,536 defined names a page apart (each visit a new page);
- ``sparse-claims``: a 10 GiB sparse file whose tables claim 9 GiB (refused by the cap);
- ``sparse-zeros``: a plain 10 GiB sparse file (refused: not an ELF);
- ``repeated-name``: 400,000 symbols each naming its own copy of ``hft_infer`` (14 MB; the
  old reader's K × N lookup ran past 90 s on a 12 MB one).

Per case: the median and worst wall time of the call, and the worst peak RSS of the process
(``VmHWM``) beside its RSS before the call (Python + numpy). Targets: 10 GiB sparse and the
repeated name under 5 s and 200 MB RSS. The crafted files come from tests/elfcraft.py and are
removed after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's high-water mark (exec
# keeps it), so it would measure this script.
CHILD = r"""
import sys, time
from agent.trace import elf
def hwm():
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
before = hwm()
t0 = time.perf_counter()
try:
    _info, found = elf.resolve(sys.argv[1], sys.argv[2:])
    what = ",".join(f"{n}={'0x%x' % s.offset if s else None}" for n, s in found.items())
except elf.ElfError as exc:
    what = f"ElfError: {exc}"
dt = time.perf_counter() - t0
print(dt, before, hwm(), what, sep="\t")
"""


def _tf_lib() -> Path | None:
    found = sorted(REPO.glob(".venv/lib/python3*/site-packages/tensorflow/libtensorflow_cc.so*"))
    return found[0] if found else None


def make_cases(d: Path, lib: Path | None) -> dict[str, tuple[Path, list[str]]]:
    from tests import elfcraft as ec
    from tests.test_trace_elf import repeated_names
    cases: dict[str, tuple[Path, list[str]]] = {}
    if lib is not None:
        cases["tf"] = (lib, ["TF_SessionRun", "hft_no_such_function"])
    ec.sparse_giant(d / "within.so", 10 << 30, 300 << 20, 200 << 20, live_symbols=65536)
    cases["sparse-within-cap"] = (d / "within.so", ["hft_infer"])
    ec.sparse_giant(d / "claims.so", 10 << 30, 6 << 30, 3 << 30)
    cases["sparse-claims"] = (d / "claims.so", ["hft_infer"])
    with open(d / "zeros.so", "wb") as f:
        f.truncate(10 << 30)
    cases["sparse-zeros"] = (d / "zeros.so", ["hft_infer"])
    (d / "repeated.so").write_bytes(repeated_names(400_000))
    cases["repeated-name"] = (d / "repeated.so", ["hft_infer", "hft_*"])
    return cases


def run_one(path: Path, names: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), *names], cwd=REPO,
                       capture_output=True, text=True, timeout=600, check=True)
    dt, before, peak, what = r.stdout.rstrip("\n").split("\t", 3)
    return {"s": float(dt), "rss_before_mb": int(before) / 1024, "rss_peak_mb": int(peak) / 1024,
            "result": what}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lib", type=Path, default=None, help="the real library (default: TF's)")
    ap.add_argument("--dir", type=Path, default=None, help="where the crafted files go")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="elf-read-") as tmp:
        cases = make_cases(Path(tmp), a.lib or _tf_lib())
        runs: dict[str, list[dict]] = {k: [] for k in cases}
        for _ in range(a.runs):
            for name, (path, names) in cases.items():
                runs[name].append(run_one(path, names))
    print(f"{'case':18} {'median s':>9} {'max s':>7} {'RSS before':>11} {'peak RSS':>9}  result")
    for name, rs in runs.items():
        ts = [r["s"] for r in rs]
        print(f"{name:18} {statistics.median(ts):9.3f} {max(ts):7.3f} "
              f"{max(r['rss_before_mb'] for r in rs):8.0f} MB "
              f"{max(r['rss_peak_mb'] for r in rs):6.0f} MB  {rs[-1]['result'][:90]}")
    if a.json:
        a.json.write_text(json.dumps({"python": sys.version.split()[0], "runs": runs},
                                     indent=2))


if __name__ == "__main__":
    main()
