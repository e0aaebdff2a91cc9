"""Nsight Compute (ncu): run a command under ncu, parse per-kernel durations, summarise.

What it answers for an inference workload: how many kernels one inference launches, how much
GPU time they take, and how that compares with the wall time of one inference. A GPU busy for
only a small share of the wall time is *launch-bound* (host-side launch overhead, syncs and
copies dominate: fuse ops, XLA, CUDA graphs, TF-TRT); a GPU busy most of the time is
*compute-bound* (make the kernels faster or smaller).

ncu serialises kernels and adds per-kernel overhead, so wall time measured *under* ncu means
nothing: the per-inference wall time must come from an uninstrumented run (the probe's P50, or
``--wall-us``). Kernel durations (``gpu__time_duration.sum``) are accurate under ncu.

Two CSV layouts are parsed (both captured from ncu 2025.3 on a Hopper GPU, kept as test data
in tests/fakes/ncu/):
* ``--page raw --metrics gpu__time_duration.sum``: one row per kernel, a units row after the
  header ("ns"), numbers with thousands separators ("2,848").
* the default ``details`` page (``--section SpeedOfLight``): one row per kernel and metric,
  with "Metric Name" = "Duration" and "Metric Unit" (ns, us/usecond, ms/msecond, s/second).
Lines starting with "==PROF==" / "==WARNING==" are ncu's own log lines and are skipped.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

DURATION_METRIC = "gpu__time_duration.sum"
# Below this share of the wall time spent in kernels, the GPU mostly waits on the host.
LAUNCH_BOUND_BELOW = 0.5

_UNIT_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "msecond": 1e6, "ms": 1e6,
            "s": 1e9, "second": 1e9}


class NsightError(Exception):
    """ncu missing, failed, or produced nothing parseable. The message is for the user."""


@dataclass(frozen=True)
class KernelLaunch:
    """One profiled kernel launch: ncu's ID, process, demangled name, GPU duration in ns."""

    id: int
    pid: int | None
    name: str
    duration_ns: float


def _num(s: str) -> float:
    return float(s.replace(",", "").strip())


def _unit(u: str) -> float:
    u = u.strip().lower()
    if u not in _UNIT_NS:
        raise ValueError(f"unknown duration unit {u!r}")
    return _UNIT_NS[u]


def parse_ncu_csv(text: str) -> list[KernelLaunch]:
    """Kernel launches from ncu CSV output (raw or details page), in ncu's ID order.

    Raises ValueError when the text holds no ncu CSV header or no duration column."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(lines))
    if not rows or "Kernel Name" not in rows[0] or "ID" not in rows[0]:
        raise ValueError("no ncu CSV header (expected columns ID, Kernel Name)")
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    i_id, i_name, i_pid = col["ID"], col["Kernel Name"], col.get("Process ID")
    out: list[KernelLaunch] = []

    def pid_of(r):
        if i_pid is None or not r[i_pid].strip():
            return None
        return int(_num(r[i_pid]))

    if "Metric Name" in col:  # details page: one row per (kernel, metric)
        i_mn, i_mu, i_mv = col["Metric Name"], col["Metric Unit"], col["Metric Value"]
        for r in rows[1:]:
            if len(r) <= i_mv or r[i_mn] != "Duration":
                continue
            out.append(KernelLaunch(int(_num(r[i_id])), pid_of(r), r[i_name],
                                    _num(r[i_mv]) * _unit(r[i_mu])))
        if not out:
            raise ValueError("details page without a Duration metric (add --section "
                             "SpeedOfLight or use --page raw --metrics gpu__time_duration.sum)")
        return sorted(out, key=lambda k: k.id)
    if DURATION_METRIC not in col:
        raise ValueError(f"raw page without {DURATION_METRIC}")
    i_d = col[DURATION_METRIC]
    scale = 1.0
    body = rows[1:]
    if body and not body[0][i_id].strip():  # units row: "", "", ..., "ns"
        scale = _unit(body[0][i_d])
        body = body[1:]
    for r in body:
        if len(r) <= i_d or not r[i_d].strip():
            continue
        out.append(KernelLaunch(int(_num(r[i_id])), pid_of(r), r[i_name], _num(r[i_d]) * scale))
    return sorted(out, key=lambda k: k.id)


@dataclass
class KernelStat:
    name: str
    count: int
    total_ns: float
    mean_ns: float
    share: float  # of all kernel time


@dataclass
class NsightReport:
    """Per-inference kernel figures. ``verdict`` is launch-bound / compute-bound when the wall
    time per inference is known, else "unknown (no wall time)"."""

    kernels: int
    kernel_time_ns: float
    inferences: int | None
    kernels_per_inference: float | None
    kernel_ns_per_inference: float | None
    wall_ns_per_inference: float | None
    gpu_busy_ratio: float | None
    verdict: str
    top: list[KernelStat] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    returncode: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        def us(ns):
            return "?" if ns is None else f"{ns / 1e3:.1f} µs"
        lines = [f"kernels profiled: {self.kernels}, total kernel time {us(self.kernel_time_ns)}"]
        if self.inferences:
            lines.append(f"per inference ({self.inferences}): {self.kernels_per_inference:.1f} "
                         f"kernels, {us(self.kernel_ns_per_inference)} kernel time, wall "
                         f"{us(self.wall_ns_per_inference)}")
        if self.gpu_busy_ratio is not None:
            lines.append(f"GPU busy {self.gpu_busy_ratio:.0%} of wall time -> {self.verdict}")
        else:
            lines.append(f"verdict: {self.verdict}")
        lines.append("top kernels by total time:")
        for k in self.top:
            lines.append(f"  {k.share:6.1%}  {k.count:5d} x {us(k.mean_ns):>10}  "
                         f"{k.name[:100]}")
        return "\n".join(lines)


def summarize(launches: Sequence[KernelLaunch], inferences: int | None = None,
              wall_ns_per_inference: float | None = None, top: int = 10) -> NsightReport:
    """Aggregate launches: kernel count/time per inference, busy ratio, verdict, top kernels."""
    total = sum(k.duration_ns for k in launches)
    by_name: dict[str, list[float]] = {}
    for k in launches:
        by_name.setdefault(k.name, []).append(k.duration_ns)
    stats = sorted((KernelStat(n, len(d), sum(d), sum(d) / len(d), sum(d) / total if total else 0)
                    for n, d in by_name.items()), key=lambda s: -s.total_ns)
    kpi = len(launches) / inferences if inferences else None
    kns = total / inferences if inferences else None
    ratio = verdict = None
    if kns is not None and wall_ns_per_inference:
        ratio = kns / wall_ns_per_inference
        verdict = "launch-bound" if ratio < LAUNCH_BOUND_BELOW else "compute-bound"
    return NsightReport(len(launches), total, inferences, kpi, kns, wall_ns_per_inference, ratio,
                        verdict or "unknown (give --inferences and --wall-us)", stats[:top])


def ncu_command(cmd: Sequence[str], log_file: str, *, ncu: str = "ncu", launch_skip: int = 0,
                launch_count: int | None = None) -> list[str]:
    """The ncu invocation: raw CSV with only the kernel duration metric (one replay pass, the
    cheapest collection), into ``log_file`` so the workload's own stdout stays separate.

    ``--clock-control none``: ncu's default (``base``) locks the GPU clocks to base while it
    profiles. That is a change of GPU settings (forbidden on a shared or production box) and
    it also makes kernels slower than the hot loop sees them. ``--cache-control none``: no
    cache flush between kernels, as in a hot inference loop."""
    argv = [ncu, "--csv", "--page", "raw", "--metrics", DURATION_METRIC,
            "--clock-control", "none", "--cache-control", "none",
            "--target-processes", "all", "--log-file", log_file]
    if launch_skip:
        argv += ["--launch-skip", str(launch_skip)]
    if launch_count:
        argv += ["--launch-count", str(launch_count)]
    return argv + list(cmd)


def profile(cmd: Sequence[str], *, inferences: int | None = None,
            wall_ns_per_inference: float | None = None, ncu: str = "ncu", launch_skip: int = 0,
            launch_count: int | None = None, top: int = 10, timeout_s: float = 600,
            keep_csv: str | None = None) -> NsightReport:
    """Run ``cmd`` under ncu and summarise its kernels. Raises NsightError."""
    if not cmd:
        raise NsightError("no command to profile (hftagent profile --nsight -- CMD ...)")
    exe = shutil.which(ncu)
    if exe is None:
        raise NsightError(f"{ncu!r} not found: install Nsight Compute (ncu) or pass --ncu PATH")
    with tempfile.TemporaryDirectory(prefix="hftagent-ncu-") as tmp:
        log = keep_csv or os.path.join(tmp, "ncu.csv")
        argv = ncu_command(cmd, log, ncu=exe, launch_skip=launch_skip, launch_count=launch_count)
        try:
            proc = subprocess.run(argv, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise NsightError(f"ncu run exceeded {timeout_s:.0f} s") from None
        try:
            with open(log, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            raise NsightError(f"ncu wrote no log ({exc.strerror}); exit code "
                              f"{proc.returncode}") from None
    try:
        launches = parse_ncu_csv(text)
    except ValueError as exc:
        tail = " | ".join([ln for ln in text.splitlines() if ln.startswith("==")][-3:])
        raise NsightError(f"no kernels profiled ({exc}); ncu said: {tail or 'nothing'}; "
                          f"exit code {proc.returncode}") from None
    rep = summarize(launches, inferences, wall_ns_per_inference, top)
    rep.command, rep.returncode = list(cmd), proc.returncode
    return rep
