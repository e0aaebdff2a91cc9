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

from agent.defaults import BLAS_THREAD_VARS
from agent.errors import AgentError
from agent.probe.config import CALLER_THREAD, ProbeSettings, ThreadConfig
from agent.probe.harness import Samples
from agent.probe.result import ProbeResult, RunResult

MAX_RESTARTS = 4
# The worker dies with the process that started it (agent/probe/worker.py reads this).
PARENT_ENV = "HFTAGENT_PROBE_PARENT"

# on_event(config_index, n_configs, event_dict): progress hook for the CLI.
EventHook = Callable[[int, int, dict], None]


@dataclass
class RunArrays:
    """Raw per-sample columns of one run (key: index into ProbeResult.runs)."""

    run: RunResult
    samples: Samples


class ProbeInterrupted(KeyboardInterrupt):
    """The probe was stopped (Ctrl-C, or SIGTERM turned into an exception by the caller)
    before every run finished: ``result``/``arrays`` hold the runs that finished (the others
    are marked ``failed`` with "not run: stopped"), the workers are dead. A KeyboardInterrupt,
    so a caller that does not expect it exits as on Ctrl-C; ``cause`` is what stopped it."""

    def __init__(self, result: ProbeResult, arrays: list[Samples | None],
                 cause: BaseException) -> None:
        super().__init__(str(cause))
        self.result = result
        self.arrays = arrays
        self.cause = cause


STOPPED = "not run: stopped before it finished"


def run_probe(settings: ProbeSettings, configs: list[ThreadConfig] | None = None,
              on_event: EventHook | None = None, keep_dir: str | None = None
              ) -> tuple[ProbeResult, list[Samples | None]]:
    """Run every (variant, batch) of ``settings`` under each thread configuration.

    Returns the summary and, parallel to ``result.runs``, the raw Samples (None where the run
    did not get to the timed loop). Raises AgentError when the model or inputs are unusable,
    :class:`ProbeInterrupted` (with what finished) when stopped by an exception that is not
    an error (KeyboardInterrupt, a signal's exception): the worker is killed at once.
    """
    settings.validate()  # callers in range, and not with --rate/--idle-gaps
    configs = configs or [ThreadConfig()]
    runs: list[RunResult] = []
    arrays: list[Samples | None] = []
    model_info: dict | None = None
    warnings: list[str] = []

    def result() -> ProbeResult:
        r = ProbeResult(host=host_info(), model=model_info or {}, settings=settings.to_dict(),
                        runs=runs, created_utc=_now(), warnings=warnings)
        finish(r)
        return r

    for ci, cfg in enumerate(configs):
        def hook(ev: dict, ci: int = ci) -> None:
            if on_event is not None:
                on_event(ci, len(configs), ev)
        try:
            with tempfile.TemporaryDirectory(prefix="hftagent-probe-", dir=keep_dir) as td:
                info, rs, arrs = _run_worker(settings, cfg, Path(td), hook)
        except _Stopped as stop:
            info, rs, arrs = stop.info, stop.runs, stop.arrays
            for later in configs[ci + 1:]:
                for variant, batch in settings.tasks():
                    rs.append(_not_run(variant, batch, later, settings, STOPPED))
                    arrs.append(None)
            if info is not None and model_info is None:
                model_info, warnings = info["model"], list(info["warnings"])
            runs.extend(rs)
            arrays.extend(arrs)
            raise ProbeInterrupted(result(), arrays, stop.cause) from None
        if info is not None and model_info is None:
            model_info, warnings = info["model"], list(info["warnings"])
        runs.extend(rs)
        arrays.extend(arrs)
    return result(), arrays


def run_config(settings: ProbeSettings, config: ThreadConfig | None = None
               ) -> tuple[ProbeResult, list[dict[str, np.ndarray] | None]]:
    """One configuration; the raw arrays as {column: int64 array} per run (for gate/watch)."""
    result, arrays = run_probe(settings, [config or ThreadConfig()])
    return result, [a.as_dict() if a is not None else None for a in arrays]


class _Stopped(Exception):
    """Internal: a worker stopped part-way, with what it had finished."""

    def __init__(self, info: dict | None, runs: list[RunResult],
                 arrays: list[Samples | None], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.info, self.runs, self.arrays, self.cause = info, runs, arrays, cause


def _not_run(variant: str, batch: int, cfg: ThreadConfig, settings: ProbeSettings,
             why: str) -> RunResult:
    return RunResult(variant=variant, batch=batch, config=cfg.to_dict(), status="failed",
                     reason=why, callers=settings.callers)


def _kill(proc: subprocess.Popen) -> None:
    """Stop a worker now (SIGKILL: TF's interpreter takes seconds to unwind a SIGINT) and
    reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _run_worker(settings: ProbeSettings, cfg: ThreadConfig, d: Path,
                on_event: Callable[[dict], None]
                ) -> tuple[dict | None, list[RunResult], list[Samples | None]]:
    (d / "config.json").write_text(json.dumps({"settings": settings.to_dict(),
                                               "threads": cfg.to_dict()}))
    tasks = settings.tasks()
    env = worker_env(settings)
    env["PYTHONUNBUFFERED"] = "1"
    env[PARENT_ENV] = str(os.getpid())
    crashed: dict[int, str] = {}
    on_event({"event": "worker", "phase": "load"})
    for attempt in range(MAX_RESTARTS + 1):
        log = d / f"worker-{attempt}.log"
        current: dict | None = None
        with open(log, "wb") as logf:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "agent.probe.worker", str(d)],
                                    stdout=subprocess.PIPE, stderr=logf, env=env)
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "task":
                        current = ev
                    on_event(ev)
                rc = proc.wait()
            except BaseException as exc:
                _kill(proc)
                proc.stdout.close()
                if isinstance(exc, Exception | SystemExit):
                    raise  # an error (or an exit) is not a stop: nothing partial to show
                info, runs, arrays = _collect(d, tasks, cfg, settings, crashed,
                                              missing=STOPPED)
                raise _Stopped(info, runs, arrays, exc) from None
            proc.stdout.close()
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
    return _collect(d, tasks, cfg, settings, crashed)


def _collect(d: Path, tasks: list[tuple[str, int]], cfg: ThreadConfig,
             settings: ProbeSettings, crashed: dict[int, str],
             missing: str = "not run: the worker stopped early"
             ) -> tuple[dict | None, list[RunResult], list[Samples | None]]:
    """The runs the worker finished (their result files), the others failed with why."""
    info = json.loads((d / "model.json").read_text()) if (d / "model.json").exists() else None
    runs: list[RunResult] = []
    arrays: list[Samples | None] = []
    for i, (variant, batch) in enumerate(tasks):
        f = d / f"run-{i}.json"
        if f.exists():
            r = RunResult.from_dict(json.loads(f.read_text()))
        else:
            r = _not_run(variant, batch, cfg, settings, crashed.get(i, missing))
        s = None
        npy = d / f"samples-{i}.npy"
        if f.exists() and npy.exists():
            s = Samples(np.load(npy), open_loop=r.mode == "open", rate_hz=r.rate_hz)
            if s.open_loop:
                r.saturation = saturation(s, r.unserved)
                if r.saturation["saturated"] and not r.unserved:
                    r.notes.append(saturation_note(r))
        runs.append(r)
        arrays.append(s)
    return info, runs, arrays


def saturation(s: Samples, unserved: int = 0) -> dict:
    """Whether an open loop kept its schedule, with or without a deadline.

    The offered load is the rate times what one request costs the loop: its mean service
    time plus the loop's own work between calls (getrusage, the clock, the stores), measured
    as the median gap from one call's end to the next call's start where the next was due
    before the call ended (nothing to wait for: back to back; a start that is late because a
    sleep overshot is not the loop's work). At or over 1 the queue grows without end: the
    loop falls behind its schedule, and the response percentiles measure that queue, not the
    model (a stall of the host raises the mean a little, it does not make a run saturated).
    ``behind_ns``: how late the last request started."""
    start, end, intended = s.column("start_ns"), s.column("end_ns"), s.column("intended_ns")
    period_ns = 1e9 / s.rate_hz if s.rate_hz else 0.0
    if s.count == 0 or not period_ns:
        return {"utilisation": None, "behind_ns": 0, "saturated": bool(unserved)}
    service = float((end - start).mean())
    busy = end[:-1] > intended[1:]  # the next request was due while this call ran
    own = float(np.median(start[1:][busy] - end[:-1][busy])) if busy.any() else 0.0
    load = (service + max(own, 0.0)) / period_ns
    behind = int(max(int(start[-1] - intended[-1]), 0))
    return {"utilisation": round(load, 3), "behind_ns": behind,
            "saturated": bool(unserved) or load >= 1.0}


def saturation_note(r: RunResult) -> str:
    sat = r.saturation or {}
    return (f"saturated: {r.rate_hz:g} calls/s offered is {sat.get('utilisation', 0):.2f}x "
            f"what one caller serves; the last request started {_ms(sat.get('behind_ns'))} "
            "late: response percentiles measure the queue, not the model (lower --rate)")


def _ms(ns: int | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.1f} ms"


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
                 if ln.strip() and not ln.startswith(("I0000", "W0000", "WARNING: All log",
                                                      "INFO:"))]
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
    """Can this run be recommended? ok, P99 supported by its samples, agreement passes (where
    it was measured), the open loop kept its schedule, warm-up stable. The reason is the
    first that applies, in those words (the report says it as it is)."""
    h = r.headline
    if not r.ok or not h or h.get("p99_ns") is None:
        return False, "did not run" + (f": {r.reason}" if r.reason else "")
    if r.agreement is not None and not r.agreement["passes"]:
        return False, f"not recommended: agreement fails ({r.agreement['rule']})"
    if r.unserved:
        return False, (f"not recommended: saturated at {r.rate_hz:g}/s ({r.unserved} "
                       "requests never started)")
    if r.saturated:
        load = (r.saturation or {}).get("utilisation")
        return False, (f"not recommended: saturated at {r.rate_hz:g}/s (offered load "
                       f"{load:.2f}x what one caller serves)")
    if not h["sufficient"]["p99"]:
        budget = " (the time budget ended the run: --duration gives it more)" \
            if r.timed_budget_hit else ""
        return False, (f"insufficient samples for P99 ({h['count']} < "
                       f"{h['required']['p99']}){budget}")
    if r.warmup is not None and not r.warmup.get("stable", True):
        return False, f"not recommended: {r.warmup.get('reason', 'warm-up unstable')}"
    return True, ""


def not_recommended(runs: list[RunResult]) -> list[tuple[str, str]]:
    """(run, reason) for each batch-1 run that could not be recommended: what the report
    says when there is no recommendation (the true reason of each, never a generic one)."""
    out = []
    several = len({r.config.get("id") for r in runs}) > 1
    for r in runs:
        if r.batch != 1:
            continue
        ok, why = eligible(r)
        if not ok:
            name = r.variant + (f" [{r.config.get('id')}]" if several else "")
            out.append((name, why.removeprefix("not recommended: ")))
    if not out and not any(r.batch == 1 for r in runs):
        out.append(("every run", "recommendations are made at batch 1 (add 1 to --batch)"))
    return out


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
