"""Probe settings and thread configurations (JSON-serialisable: they travel to workers)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from agent.defaults import JITTER_THRESHOLD_US as DEFAULT_THRESHOLD_US  # (5 ms)
from agent.defaults import MAX_THRESHOLD_US as MAX_THRESHOLD_US  # (1000 s)
from agent.errors import AgentError
from agent.probe.models import ModelSpec
from agent.stats import P999_MIN_SAMPLES

DEFAULT_SAMPLES = P999_MIN_SAMPLES  # 6,636: enough to claim P99.9 (agent.stats.REQUIRED_SAMPLES)
DEFAULT_DURATION_S = 6.0      # per-run time budget: slow variants stop here, marked insufficient
DEFAULT_WARMUP = 200
DEFAULT_WARMUP_BUDGET_S = 5.0
CALLER_THREAD = -1             # inter_op_parallelism_threads < 0: ops run in the caller thread
DEFAULT_SIGNATURE = "serving_default"

# Upper bounds of the options (options.build refuses anything beyond, before a worker starts).
MAX_SAMPLES = 5_000_000       # the worker's timed buffer: 8 int64 columns, 320 MB at this size
MAX_WARMUP = 1_000_000        # warm_up allocates up to 10x this many int64 latencies
MAX_DURATION_S = 86_400.0     # a day per run
MAX_RATE_HZ = 1_000_000.0     # 1 µs apart: beyond what any open loop can schedule
# MAX_THRESHOLD_US (1000 s) comes from agent/defaults.py: watch takes the same bound
MAX_THREADS = 4096            # TF thread pools; far above any machine's CPU count
MAX_BATCH = 65_536
MAX_INPUT_ELEMENTS = 1 << 26  # per input: 256 MB of float32
MAX_NPY_BYTES = 1 << 30       # --input-data / --calib files
MAX_CALLERS = 256             # caller threads sharing one callable (gate's concurrentN)


@dataclass
class ThreadConfig:
    """TF/LiteRT threading and CPU affinity of one worker process (None: TF's default)."""

    intra: int | None = None
    inter: int | None = None
    cpus: list[int] | None = None

    @property
    def id(self) -> str:
        from collectors.parsers import format_cpulist
        intra = "default" if self.intra is None else str(self.intra)
        inter = ("default" if self.inter is None else
                 "caller" if self.inter < 0 else str(self.inter))
        cpus = "all" if not self.cpus else format_cpulist(self.cpus)
        return f"intra={intra} inter={inter} cpus={cpus}"

    def to_dict(self) -> dict:
        return {"id": self.id, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> ThreadConfig:
        return cls(d.get("intra"), d.get("inter"), d.get("cpus"))


@dataclass
class ProbeSettings:
    """Everything a worker needs besides its ThreadConfig."""

    model: ModelSpec = field(default_factory=ModelSpec)
    variants: list[str] = field(default_factory=lambda: ["graph", "xla", "tflite"])
    shape: list[int] | None = None
    samples: int | None = DEFAULT_SAMPLES
    duration_s: float | None = DEFAULT_DURATION_S
    warmup: int = DEFAULT_WARMUP
    warmup_budget_s: float = DEFAULT_WARMUP_BUDGET_S
    rate_hz: float | None = None
    threshold_us: float = DEFAULT_THRESHOLD_US
    input_data: str = "random"
    calib: str | None = None
    batch: list[int] = field(default_factory=lambda: [1])
    agree_n: int = 64
    sweep: str | None = None
    idle_gaps_ns: list[int] | None = None  # --idle-gaps: the gap loop instead of the timed loop
    # Caller threads sharing the one bound callable in the timed loop (closed loop; gate's
    # concurrentN): 1 is the plain probe.
    callers: int = 1

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse a ``callers`` outside 1..MAX_CALLERS, or several callers with a schedule of
        its own (--rate, --idle-gaps): the callers run back to back."""
        c = self.callers
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CALLERS:
            raise AgentError(f"callers must be an integer in 1..{MAX_CALLERS}, got {c!r}")
        if c > 1 and self.rate_hz:
            raise AgentError("several callers run a closed loop: not with a --rate schedule")
        if c > 1 and self.idle_gaps_ns:
            raise AgentError("several callers run a closed loop: not with --idle-gaps")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ProbeSettings:
        d = dict(d)
        d["model"] = ModelSpec(**d["model"])
        return cls(**d)

    def tasks(self) -> list[tuple[str, int]]:
        """(variant, batch) in run order. tflite-int8 last: TF's INT8 calibrator has crashed
        the process on an LSTM (SIGSEGV in TF 2.21), so it runs after the others."""
        order = sorted(self.variants, key=lambda v: v == "tflite-int8")
        return [(v, b) for v in order for b in self.batch]
