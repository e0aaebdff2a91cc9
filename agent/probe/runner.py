"""Run probe configurations in worker processes and assemble the ProbeResult.

Each thread configuration gets its own ``python -m agent.probe.worker`` process (TF reads its
thread settings once, at initialisation). Results come back as JSON + .npy files in a temp dir.
A worker that crashes (TF's INT8 calibrator segfaults on an LSTM in TF 2.21) loses only the
task it was running: that task is marked failed with the signal and the log tail, and a fresh
worker runs the remaining tasks.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.errors import AgentError
from agent.probe.config import CALLER_THREAD, ProbeSettings, ThreadConfig
from agent.probe.harness import Samples
from agent.probe.result import ProbeResult, RunResult

MAX_RESTARTS = 4

# on_event(config_index, n_configs, event_dict): progress hook for the CLI.
EventHook = Callable[[int, int, dict], None]


@dataclass
class RunArrays:
    """Raw per-sample columns of one run (key: index into ProbeResult.runs)."""

    run: RunResult
    samples: Samples


def run_probe(settings: ProbeSettings, configs: list[ThreadConfig] | None = None,
              on_event: EventHook | None = None, keep_dir: str | None = None
              ) -> tuple[ProbeResult, list[Samples | None]]:
    """Run every (variant, batch) of ``settings`` under each thread configuration.

    Returns the summary and, parallel to ``result.runs``, the raw Samples (None where the run
    did not get to the timed loop). Raises AgentError when the model or inputs are unusable.
    """
    settings.validate()  # callers in range, and not with --rate/--idle-gaps
    configs = configs or [ThreadConfig()]
    runs: list[RunResult] = []
    arrays: list[Samples | None] = []
    model_info: dict | None = None
    warnings: list[str] = []
    for ci, cfg in enumerate(configs):
        with tempfile.TemporaryDirectory(prefix="hftagent-probe-", dir=keep_dir) as td:
            info, rs, arrs = _run_worker(settings, cfg, Path(td),
                                         lambda ev, ci=ci: on_event and on_event(ci, len(configs), ev))
        if info is not None and model_info is None:
            model_info, warnings = info["model"], list(info["warnings"])
        runs.extend(rs)
        arrays.extend(arrs)
    result = ProbeResult(host=host_info(), model=model_info or {}, settings=settings.to_dict(),
                         runs=runs, created_utc=_now(), warnings=warnings)
    finish(result)
    return result, arrays


def run_config(settings: ProbeSettings, config: ThreadConfig | None = None
               ) -> tuple[ProbeResult, list[dict[str, np.ndarray] | None]]:
    """One configuration; the raw arrays as {column: int64 array} per run (for gate/watch)."""
    result, arrays = run_probe(settings, [config or ThreadConfig()])
    return result, [a.as_dict() if a is not None else None for a in arrays]


def _run_worker(settings: ProbeSettings, cfg: ThreadConfig, d: Path,
                on_event: Callable[[dict], None]
                ) -> tuple[dict | None, list[RunResult], list[Samples | None]]:
    (d / "config.json").write_text(json.dumps({"settings": settings.to_dict(),
                                               "threads": cfg.to_dict()}))
    tasks = settings.tasks()
    env = worker_env(settings)
    env["PYTHONUNBUFFERED"] = "1"
    crashed: dict[int, str] = {}
    for attempt in range(MAX_RESTARTS + 1):
        log = d / f"worker-{attempt}.log"
        current: dict | None = None
        with open(log, "wb") as logf:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "agent.probe.worker", str(d)],
                                    stdout=subprocess.PIPE, stderr=logf, env=env)
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "task":
                    current = ev
                on_event(ev)
            rc = proc.wait()
        if (d / "fatal.json").exists():
            raise AgentError(json.loads((d / "fatal.json").read_text())["error"])
        for i in range(len(tasks)):
            marker = d / f"crashed-{i}"
            if marker.exists() and i not in crashed:
                phase = current.get("phase") if current and current.get("idx") == i else "?"
                crashed[i] = (f"worker crashed ({_rc_name(rc)}) during {phase}"
                              f"{_log_tail(log)}")
        done = {i for i in range(len(tasks)) if (d / f"run-{i}.json").exists()}
        if rc == 0 or len(done) + len(crashed) >= len(tasks):
            break
        if not (d / "model.json").exists() and not crashed:
            raise AgentError(f"probe worker failed ({_rc_name(rc)}) before loading the model"
                             f"{_log_tail(log)}")
    info = json.loads((d / "model.json").read_text()) if (d / "model.json").exists() else None
    runs: list[RunResult] = []
    arrays: list[Samples | None] = []
    for i, (variant, batch) in enumerate(tasks):
        f = d / f"run-{i}.json"
        if f.exists():
            r = RunResult.from_dict(json.loads(f.read_text()))
        else:
            r = RunResult(variant=variant, batch=batch, config=cfg.to_dict(), status="failed",
                          reason=crashed.get(i, "not run: the worker stopped early"),
                          callers=settings.callers)
        s = None
        npy = d / f"samples-{i}.npy"
        if npy.exists():
            s = Samples(np.load(npy), open_loop=r.mode == "open", rate_hz=r.rate_hz)
        runs.append(r)
        arrays.append(s)
    return info, runs, arrays


# BLAS pools read these once, when numpy loads: before the worker pins itself.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def worker_env(settings: ProbeSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a probe worker process. For the numpy model the BLAS threads are 1:
    numpy loads (and OpenBLAS starts its pool) before the worker pins itself, so pool threads
    would keep the parent's affinity (after ``tune apply --isolate``, the housekeeping CPUs)
    and an sgemv split across them would run off the target CPUs. One thread computes the
    whole call on the pinned thread, as the LSTM at batch 1 with --intra 1 does."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if settings.model.is_numpy:
        for var in BLAS_THREAD_VARS:
            env[var] = "1"
    return env


def _rc_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


def _log_tail(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines()
                 if ln.strip() and not ln.startswith(("I0000", "W0000", "WARNING: All log", "INFO:"))]
    except OSError:
        return ""
    return f": {lines[-1].strip()[:200]}" if lines else ""


def host_info() -> dict:
    import importlib.metadata as md

    def ver(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None
    return {"hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
            "cpus_allowed": sorted(os.sched_getaffinity(0)), "python": platform.python_version(),
            "platform": platform.platform(),
            "tensorflow": ver("tensorflow-cpu") or ver("tensorflow"),
            "litert": ver("ai-edge-litert"), "numpy": np.__version__}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def eligible(r: RunResult) -> tuple[bool, str]:
    """Can this run be recommended? ok, P99 supported by its samples, agreement passes."""
    h = r.headline
    if not r.ok or not h or h.get("p99_ns") is None:
        return False, "did not run"
    if r.agreement is not None and not r.agreement["passes"]:
        return False, f"not recommended: agreement fails ({r.agreement['rule']})"
    if not h["sufficient"]["p99"]:
        return False, (f"insufficient samples for P99 ({h['count']} < "
                       f"{h['required']['p99']})")
    if r.warmup is not None and not r.warmup.get("stable", True):
        return False, f"not recommended: {r.warmup.get('reason', 'warm-up unstable')}"
    if r.unserved:
        return False, (f"not recommended: saturated at {r.rate_hz:g}/s ({r.unserved} "
                       "requests never started)")
    return True, ""


def recommend(runs: list[RunResult]) -> dict | None:
    """The fastest run by P99 among those eligible (see :func:`eligible`); batch 1 only."""
    cands = [r for r in runs if r.batch == 1 and eligible(r)[0]]
    if not cands:
        return None
    best = min(cands, key=lambda r: r.headline["p99_ns"])  # type: ignore[index]
    return {"variant": best.variant, "batch": best.batch, "config": best.config,
            "p99_ns": best.headline["p99_ns"],  # type: ignore[index]
            "reason": f"lowest P99 of {len(cands)} passing run(s)",
            "command": None}


def finish(result: ProbeResult) -> None:
    """Mark recommendations (variant; and thread configuration when sweeping)."""
    for r in result.runs:
        ok, why = eligible(r)
        if r.ok and not ok and why.startswith("not recommended") and why not in r.notes:
            r.notes.append(why)
    configs = {r.config["id"] for r in result.runs}
    rec = recommend(result.runs)
    if rec is None:
        result.recommendation = None
        return
    for r in result.runs:
        r.recommended = (r.variant == rec["variant"] and r.batch == 1
                         and r.config["id"] == rec["config"]["id"])
    if len(configs) > 1:
        result.sweep_recommendation = _sweep_pick(result.runs, rec)
        # The variant recommendation is reported for the winning configuration.
    result.recommendation = rec


def _sweep_pick(runs: list[RunResult], rec: dict) -> dict:
    """The sweep's answer: the fastest configuration that `hftagent run` can reproduce.

    TF defaults and caller-thread inter-op (-1) cannot be set from outside the process (run
    always sets the thread counts; TF reads TF_NUM_INTEROP_THREADS <= 0 as "default"): when
    one of those wins, the best reproducible one is recommended and the winner is named."""
    cmd = run_command(rec["config"], rec["variant"])
    if cmd is not None:
        return dict(rec, command=cmd)
    cands = [r for r in runs if r.batch == 1 and eligible(r)[0]
             and run_command(r.config, r.variant) is not None]
    note = (f"fastest was {rec['config']['id']} ({rec['p99_ns'] / 1e3:,.1f} µs P99), which "
            "hftagent run cannot reproduce: set TF's threads inside the program "
            "(tf.config.threading.set_inter_op_parallelism_threads)")
    if not cands:
        return dict(rec, command=None, note=note)
    best = min(cands, key=lambda r: r.headline["p99_ns"])  # type: ignore[index]
    return {"variant": best.variant, "batch": best.batch, "config": best.config,
            "p99_ns": best.headline["p99_ns"],  # type: ignore[index]
            "reason": "lowest P99 among configurations hftagent run reproduces",
            "command": run_command(best.config, best.variant), "note": note}


def run_command(config: dict, variant: str) -> str | None:
    """The `hftagent run` line that reproduces a configuration, or None when it cannot (TF
    defaults, caller-thread inter-op)."""
    from tuning.launcher import LaunchError, command_line
    if config.get("intra") is None or config.get("inter") is None:
        return None
    try:
        line = command_line(["<your inference command>"], cpus=config.get("cpus"),
                            intra=config["intra"], inter=config["inter"])
    except LaunchError:
        return None
    return f"{line}  # variant: {variant}"


def sweep_configs(cpus: list[int] | None = None) -> list[ThreadConfig]:
    """The threads grid: TF defaults; intra ∈ {1, n}; inter ∈ {1, caller thread}; affinity
    over all allowed CPUs and pinned to the last one (n = CPUs in the set)."""
    allowed = sorted(cpus or os.sched_getaffinity(0))
    sets = [allowed] + ([[allowed[-1]]] if len(allowed) > 1 else [])
    out = [ThreadConfig()]
    for s in sets:
        intras = sorted({1, len(s)})
        for intra in intras:
            for inter in (1, CALLER_THREAD):
                out.append(ThreadConfig(intra, inter, list(s)))
    return out
