"""Recording: the hooks the commands call to store a run (probe, watch, audit, cpus, gate),
and what "the same model" means across runs (its key and content hash).

Each hook takes the host fingerprint now unless given, lets the latest audit's status counts
ride along when it ran on the same host configuration, and with ``warn=True`` turns a history
failure into one warning line on stderr (a command whose own result is already out must not
fail because its history could not be written).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where samples are handled: audit runs carry none
    import numpy as np

from .location import HistoryError
from .queries import History


def model_key(model_path: str | None, builtin: str | None = None) -> str:
    """What 'the same model' means across runs: its path (resolved), or builtin:NAME."""
    if model_path:
        return os.path.realpath(model_path)
    return f"builtin:{builtin or 'lstm'}"


def model_hash(model_path: str | None) -> str | None:
    """SHA-256 over a model file, or over a SavedModel directory's files (relative names and
    contents, in sorted order). None when the path cannot be read."""
    if not model_path:
        return None
    p = Path(model_path)
    if not p.exists():
        return None
    h = hashlib.sha256()
    try:
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            h.update(str(f.relative_to(p) if f != p else f.name).encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def model_identity(model_path: str | None, builtin: str | None = None
                   ) -> tuple[str, str | None]:
    """A run's model key and content hash: a model file's or directory's, else the cached
    built-in's (None when it cannot be read or was never built)."""
    return (model_key(model_path, builtin),
            model_hash(model_path) if model_path else builtin_hash(builtin))


def record_run(kind: str, summary: dict, samples_ns: np.ndarray | None, *, command: str,
               model_path: str | None = None, builtin: str | None = None,
               variant: str | None = None, tf_version: str | None = None,
               scenario: str | None = None, cold_start_ns: int | None = None,
               fingerprint: dict | None = None, db: str | os.PathLike | None = None,
               warn: bool = False) -> int | None:
    """Store one run and return its id.

    ``summary``: any JSON-able dict (a probe RunResult dict puts its ``latency`` summary in the
    indexed columns). ``samples_ns``: raw per-sample latencies (int ns) or None. The host
    fingerprint is taken now unless given; the latest audit run's status counts ride along.
    Raises HistoryError (an AgentError) when the database cannot be used; with ``warn=True``
    prints one warning line on stderr instead and returns None (a command whose own result
    is already out must not fail because its history could not be written).
    """
    if warn:
        try:
            return record_run(kind, summary, samples_ns, command=command,
                              model_path=model_path, builtin=builtin, variant=variant,
                              tf_version=tf_version, scenario=scenario,
                              cold_start_ns=cold_start_ns, fingerprint=fingerprint, db=db)
        except HistoryError as exc:
            _warn(exc)
            return None
    from agent.gate import fingerprint as fpm
    if fingerprint is None:
        fingerprint = fpm.collect()
    with History(db) as h:
        if fingerprint.get("audit") is None and kind != "audit":
            a = h.latest_audit()
            if a is not None and a.host_digest == fpm.digest(fingerprint):
                fingerprint = dict(fingerprint, audit={"run_id": a.id,
                                                       **audit_counts(a.summary)})
        if kind == "audit":
            fingerprint = dict(fingerprint, audit=audit_counts(summary))
        key, hsh = model_identity(model_path, builtin) if (model_path or builtin or variant) \
            else (None, None)
        return h.add_run(kind=kind, command=command, summary=summary, samples_ns=samples_ns,
                         scenario=scenario if scenario is not None else
                         ("warm" if kind == "probe" else None),
                         model_path=model_path, model_key_=key, model_hash_=hsh,
                         variant=variant, tf_version=tf_version, fingerprint=fingerprint,
                         cold_start_ns=cold_start_ns)


def _warn(exc: Exception) -> None:
    print(f"hftagent: warning: run not recorded in history: {exc}", file=sys.stderr)


def audit_counts(summary: dict) -> dict:
    """{status: count} over an audit report's findings (AuditReport.to_dict())."""
    out: dict[str, int] = {}
    for f in summary.get("findings", []) or []:
        s = f.get("status") if isinstance(f, dict) else None
        if s:
            out[s] = out.get(s, 0) + 1
    return out


def builtin_hash(name: str | None) -> str | None:
    """Hash of a cached built-in's .keras file (None if it was never built). Globs the cache
    instead of calling builtin_dir(), which imports keras (and TensorFlow: 1.5 s)."""
    from agent.probe.models import CACHE_FORMAT, SEED, cache_dir
    pattern = f"{name or 'lstm'}-f{CACHE_FORMAT}-seed{SEED}-keras*/model.keras"
    found = sorted(cache_dir().joinpath("models").glob(pattern),
                   key=lambda p: p.stat().st_mtime)
    return model_hash(str(found[-1])) if found else None


def latencies_of(arrays: Any, open_loop: bool = False) -> np.ndarray | None:
    """The headline latencies of a probe run's arrays (a harness Samples or the {column:
    array} dict of run_config): response time from the intended start in open loop, service
    time in closed loop — the figures the probe itself reports."""
    if arrays is None:
        return None
    import numpy as np
    start = "intended_ns" if open_loop else "start_ns"
    if isinstance(arrays, dict):
        return np.asarray(arrays["end_ns"]) - np.asarray(arrays[start])
    return np.asarray(arrays.response_ns if open_loop else arrays.latency_ns)


def record_probe(result: Any, arrays: list, *, command: str = "probe",
                 scenario: str = "warm", db: str | os.PathLike | None = None,
                 fingerprint: dict | None = None, warn: bool = False) -> list[int]:
    """Store every run of a ProbeResult that got samples (one history run each); returns the
    ids in order. ``arrays`` is parallel to ``result.runs`` (run_probe or run_config output).
    ``warn=True``: a history failure is one warning line on stderr, never an exception."""
    if warn:
        try:
            return record_probe(result, arrays, command=command, scenario=scenario, db=db,
                                fingerprint=fingerprint)
        except HistoryError as exc:
            _warn(exc)
            return []
    from agent.gate import fingerprint as fpm
    d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    fingerprint = fingerprint or fpm.collect()
    model = d.get("model") or {}
    settings = d.get("settings") or {}
    spec = settings.get("model") or {}
    ids = []
    for r, a in zip(d.get("runs", []), arrays, strict=True):
        open_loop = r.get("mode") == "open"
        lat = latencies_of(a, open_loop)
        if lat is None:
            continue
        summary = {"run": r, "model": model, "settings": settings, "host": d.get("host"),
                   "created_utc": d.get("created_utc"), "schema": d.get("schema"),
                   "schema_version": d.get("schema_version")}
        summary["latency"] = r.get("response") if open_loop and r.get("response") else \
            r.get("latency")
        ids.append(record_run(
            "probe", summary, lat, command=command, model_path=spec.get("path"),
            builtin=spec.get("builtin"), variant=r.get("variant"),
            tf_version=(d.get("host") or {}).get("tensorflow"), scenario=scenario,
            cold_start_ns=r.get("cold_start_ns"), fingerprint=fingerprint, db=db))
    return ids


# What a watch summary (agent/watch/summary.py build) carries only for the live run: the
# collectors' and sampler's health, the kernel events' counters, the flight record paths.
WATCH_LIVE_ONLY = ("collectors", "sampler", "events", "flight_records")


def watch_record(summary: dict) -> dict:
    """The history summary of a ``hftagent watch`` run (kind "watch"): its summary less
    :data:`WATCH_LIVE_ONLY`, with ``causes`` as {cause: spikes} (``history show`` renders
    them; the examples move to ``cause_examples``), ``samples``, ``spikes``, ``p50_us`` and
    ``p99_us`` as watch printed them, and ``latency`` ({p50,p99,p999}_ns, count) for the
    indexed columns."""
    out = {k: v for k, v in summary.items() if k not in WATCH_LIVE_ONLY}
    causes = summary.get("causes") or {}
    out["causes"] = {c: d["count"] if isinstance(d, dict) else d for c, d in causes.items()}
    out["cause_examples"] = {c: d.get("top", []) for c, d in causes.items()
                             if isinstance(d, dict) and d.get("top")}

    def ns(us: Any) -> int | None:
        return None if not isinstance(us, int | float) else int(round(us * 1000))
    out["latency"] = {"p50_ns": ns(summary.get("p50_us")), "p99_ns": ns(summary.get("p99_us")),
                      "p999_ns": ns(summary.get("p999_us")), "count": summary.get("samples")}
    return out


def record_watch(summary: dict, *, probe: str | None = None, model: str | None = None,
                 variant: str | None = None, command: str = "watch",
                 db: str | os.PathLike | None = None, fingerprint: dict | None = None,
                 warn: bool = False) -> int | None:
    """Store one watch run (kind "watch", :func:`watch_record` of its summary, the host
    fingerprint taken now unless given) and return its id. ``probe``, ``model``, ``variant``:
    the run's WatchConfig values; the built-in probes (tf: the model and variant; numpy: the
    numpy stand-in) give the run its model key, an external or attached process none. No
    per-sample latencies: watch keeps a histogram, not the samples. ``warn=True``: a history
    failure is one warning line on stderr and None, as for a probe."""
    builtin = path = None
    if probe == "tf":
        path, builtin = (model, None) if model and os.path.exists(model) else \
            (None, model or "lstm")
    elif probe == "numpy":
        builtin, variant = "numpy", "numpy"
    else:
        variant = None
    return record_run("watch", watch_record(summary), None, command=command, model_path=path,
                      builtin=builtin, variant=variant, fingerprint=fingerprint, db=db,
                      warn=warn)
