"""The probe's result: a documented, JSON-serialisable summary (schema below).

``hftagent gate`` / ``history`` store it and ``hftagent watch`` builds on it, so the layout is
versioned: bump ``SCHEMA_VERSION`` on any incompatible change.

Schema ``hftagent.probe`` version 1 (all durations int nanoseconds unless named ``_s``)::

    {
      "schema": "hftagent.probe", "schema_version": 1,
      "created_utc": "2025-01-01T00:00:00Z",
      "host": {"hostname", "cpu_count", "python", "tensorflow", "litert", "platform"},
      "model": {"name", "kind": builtin|keras|savedmodel|tflite, "path", "signature",
                "input_name", "input_shape": [int|null], "input_dtype", "output_name",
                "probe_shape": [int]},
      "settings": {"variants": [...], "samples", "duration_s", "warmup", "rate_hz",
                   "threshold_us", "input_data", "calib", "batch": [int], "sweep"},
      "runs": [RunResult...],        # one per variant x batch x thread configuration
      "recommendation": Recommendation | null,       # fastest passing variant by P99
      "sweep_recommendation": Recommendation | null, # best thread configuration (--sweep)
      "warnings": [str]
    }

    RunResult = {
      "variant", "batch", "config": {"id", "intra", "inter", "cpus": [int] | null},
      "status": "ok" | "unavailable" | "failed", "reason": str | null,
      "build_s", "cold_start_ns",
      "warmup": {"calls", "window", "window_p50_ns": [int], "stable", "reason"},
      "mode": "closed" | "open", "rate_hz",
      "latency": Summary,            # service time (end - start)
      "response": Summary | null,    # open loop: end - intended start (CO-free)
      "jitter": {"threshold_ns", "count", "samples", "rate", "wilson95_low", "wilson95_high"},
      "attribution": {"slow_threshold_ns", "slow_count", "slow_share_ivcsw",
                      "slow_share_fault", "slow_share_either", "all_share_*"},
      "agreement": {"n", "classifier_like", "argmax_share", "max_abs_err", "max_rel_err",
                    "finite", "passes", "rule"} | null,
      "throughput_per_s": float | null,   # batch / mean latency
      "timed_budget_hit": bool, "recommended": bool, "notes": [str],
      "unserved": int   # open loop: requests scheduled before the deadline but never started
                        # (offered rate above capacity): response percentiles are lower bounds
      "callers": int    # caller threads sharing the callable in the closed timed loop (1;
                        # gate's concurrentN: N, their samples concatenated caller by caller)
      "saturation": {   # open loop only (null in closed loop): did the loop keep its schedule?
        "utilisation": float,  # offered load: (mean service time + the loop's own cost per
                               # call) x rate; >= 1 means the loop falls behind its schedule
        "behind_ns": int,      # how late the last request started (its queue at the end)
        "saturated": bool      # utilisation >= 1 or requests never started (unserved)
      } | null
    }

    The headline figures of a run (table, recommendation, gate) are its ``response`` summary
    in open loop — what a caller on that schedule waits, coordinated-omission free — and its
    ``latency`` (service time) in closed loop: :meth:`RunResult.headline`.

    Summary = {"count", "mean_ns", "stdev_ns", "min_ns", "p50_ns", "p90_ns", "p99_ns",
               "p999_ns", "max_ns", "sufficient": {"p50": bool, ...},
               "required": {"p50": int, ...}}     (percentiles: nearest rank)

    Recommendation = {"variant", "batch", "config", "p99_ns", "reason", "command"}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "hftagent.probe"
SCHEMA_VERSION = 1


@dataclass
class RunResult:
    variant: str
    batch: int
    config: dict
    status: str = "ok"
    reason: str | None = None
    build_s: float | None = None
    cold_start_ns: int | None = None
    warmup: dict | None = None
    mode: str = "closed"
    rate_hz: float | None = None
    latency: dict | None = None
    response: dict | None = None
    jitter: dict | None = None
    attribution: dict | None = None
    agreement: dict | None = None
    throughput_per_s: float | None = None
    timed_budget_hit: bool = False
    recommended: bool = False
    notes: list[str] = field(default_factory=list)
    unserved: int = 0
    idle_gaps: list[dict] | None = None  # probe --idle-gaps: one row per gap (agent.probe.idle)
    callers: int = 1  # caller threads sharing the callable in the timed loop (gate concurrentN)
    saturation: dict | None = None  # open loop: agent.probe.runner.saturation()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunResult:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def headline(self) -> dict | None:
        """Response time in open loop, service time in closed loop."""
        return self.response if self.mode == "open" and self.response else self.latency

    @property
    def saturated(self) -> bool:
        """An open loop that could not keep its schedule: requests never started, or an
        offered load at or over what the caller serves (agent.probe.runner.saturation)."""
        return bool(self.unserved) or bool((self.saturation or {}).get("saturated"))

    def p99_ns(self) -> int | None:
        return (self.headline or {}).get("p99_ns")


@dataclass
class ProbeResult:
    host: dict
    model: dict
    settings: dict
    runs: list[RunResult]
    created_utc: str
    recommendation: dict | None = None
    sweep_recommendation: dict | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                "created_utc": self.created_utc, "host": self.host, "model": self.model,
                "settings": self.settings, "runs": [r.to_dict() for r in self.runs],
                "recommendation": self.recommendation,
                "sweep_recommendation": self.sweep_recommendation,
                "warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, d: dict) -> ProbeResult:
        if d.get("schema") != SCHEMA or d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"not a {SCHEMA} v{SCHEMA_VERSION} document")
        return cls(host=d["host"], model=d["model"], settings=d["settings"],
                   runs=[RunResult.from_dict(r) for r in d["runs"]],
                   created_utc=d["created_utc"], recommendation=d.get("recommendation"),
                   sweep_recommendation=d.get("sweep_recommendation"),
                   warnings=list(d.get("warnings", [])))

    @property
    def any_ran(self) -> bool:
        return any(r.ok for r in self.runs)
