"""`hftagent gate`: regression gate for CI on the probe's tail latency."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agent.commands.common import (
    CpusOpt,
    DbOpt,
    InterOpt,
    IntraOpt,
    JsonOpt,
    ModelOpt,
    fail,
    register_command,
)
from agent.defaults import JITTER_THRESHOLD_US
from agent.errors import AgentError

if TYPE_CHECKING:  # numpy is imported where samples are handled
    import numpy as np

HELP = """Gate a run against its baseline: P99 change with a bootstrap 95 % interval, tail-jitter
rate with an exact binomial test, absolute budgets. Fails only when the interval's lower bound
exceeds --max-p99-regression.

The current run is --run ID (or 'latest') from history, else the probe runs now (one variant;
with --scenarios cold,warm,concurrent16 each scenario runs and is gated) and is recorded. The
baseline is --baseline RUN | FILE (history export or probe --json) | last-pass (default: the
newest earlier passing run of the same model, variant and scenario). With fewer than 3 earlier
runs (or --baseline RUN) a probe run also times a control of the same build in interleaved
blocks (twice the samples): the run is compared with its control, and the control with the
baseline (host-drift, up to 1.5×); the output says which comparison decided. Exit status: 0 pass,
1 fail or bad input, 2 not comparable (host fingerprints differ; --allow-mismatch), 3 too few
samples (< 662 for P99).

With --run the run was measured already: the probe options (--scenarios, --model, --builtin,
--variant, --samples, --duration, --warmup, --cpus, --intra, --inter, --cold-processes) are
then an error, never ignored. Every option is checked before the probe starts or the
database is touched."""

# Options that only shape a probe the gate runs now (parameter names).
PROBE_OPTIONS = ("scenarios", "cold_processes", "model", "builtin", "variant", "samples",
                 "duration", "warmup", "cpus", "intra", "inter")
# A baseline file larger than this is not one (a history export of 1e6 samples is ~20 MB).
MAX_BASELINE_BYTES = 256 << 20


RunOpt = Annotated[str | None, typer.Option("--run", metavar="ID", help="Gate this history "
                                            "run (an id or 'latest') instead of probing now.")]
BaselineOpt = Annotated[str, typer.Option("--baseline", metavar="BASELINE",
                                          help="ID | FILE | last-pass: the run to compare "
                                          "with: a history run id, a "
                                          "history export or probe --json file, or the newest "
                                          "earlier passing run of the same model, variant and "
                                          "scenario.")]
RegressionOpt = Annotated[str, typer.Option("--max-p99-regression", metavar="RATIO",
                                            help="Allowed P99 increase, e.g. 10%.")]
P99UsOpt = Annotated[float | None, typer.Option("--max-p99-us", metavar="US",
                                                help="Absolute P99 budget in µs.")]
ColdUsOpt = Annotated[float | None, typer.Option(
    "--max-cold-start-us", metavar="US", help="Cold-start budget in µs (first call; P99 over "
    "fresh processes for 'cold').")]
JitterRateOpt = Annotated[str, typer.Option(
    "--max-jitter-rate", metavar="RATIO", help="Allowed share of samples over "
    "--jitter-threshold-us (0.0005 or 0.05%; 'off').")]
JitterUsOpt = Annotated[float, typer.Option("--jitter-threshold-us", metavar="US",
                                            help="Tail-jitter threshold in µs.")]
MismatchOpt = Annotated[bool, typer.Option("--allow-mismatch", help="Compare even when the "
                                           "host fingerprints differ.")]
ScenariosOpt = Annotated[str, typer.Option(
    "--scenarios", metavar="LIST", help="Comma list of cold, warm, stressed (warm under a "
    "standard load on the housekeeping CPUs: P99.9 ≤ 1.5× quiet), concurrent16 (probing "
    "only).")]
ColdProcOpt = Annotated[int, typer.Option("--cold-processes", metavar="N",
                                          help="Fresh processes for the cold scenario.")]
GateBuiltinOpt = Annotated[str, typer.Option("--builtin", metavar="NAME",
                                             help="Built-in model.")]
VariantOpt = Annotated[str | None, typer.Option(
    "--variant", metavar="NAME", help="One probe variant (default tflite; numpy for --model "
    "numpy, the TF-free numpy stand-in).")]
SamplesOpt = Annotated[int | None, typer.Option("--samples", metavar="N",
                                                help="Timed samples (default 6636).")]
DurationOpt = Annotated[float | None, typer.Option("--duration", metavar="SECONDS",
                                                   help="Time budget per run.")]
WarmupOpt = Annotated[int, typer.Option("--warmup", metavar="N",
                                        help="Minimum warm-up calls.")]
ResamplesOpt = Annotated[int, typer.Option("--resamples", metavar="N",
                                           help="Bootstrap resamples.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", metavar="N", help="Bootstrap seed "
                                             "(reproducible intervals).")]


@dataclass
class GateRequest:
    """A gate, checked before the probe starts or the database is touched: the limits, the
    scenarios, the run to gate (an id, the latest, or a probe now with its settings) and the
    baseline (a run id, a file's document, or last-pass)."""

    limits: object
    scenarios: list[str]
    run: str | None
    run_id: int | None
    baseline: str
    base_run: int | None
    base_file: dict | None
    settings: object
    configs: list | None
    cold_processes: int
    allow_mismatch: bool
    db: str | None
    json: bool


def parse(ctx: typer.Context, *, run, baseline, max_p99_regression, max_p99_us,
          max_cold_start_us, max_jitter_rate, jitter_threshold_us, allow_mismatch, scenarios,
          cold_processes, model, builtin, variant, samples, duration, warmup, cpus, intra,
          inter, resamples, seed, db, json_out) -> GateRequest:
    import re

    from agent.gate import evaluate as g
    from agent.history import parse_run_id

    limits = g.Limits(
        max_p99_regression=g.parse_ratio(max_p99_regression, "--max-p99-regression"),
        max_p99_ns=g.budget_ns(max_p99_us, "--max-p99-us"),
        max_cold_start_ns=g.budget_ns(max_cold_start_us, "--max-cold-start-us"),
        max_jitter_rate=None if max_jitter_rate.strip().lower() == "off" else
        g.parse_ratio(max_jitter_rate, "--max-jitter-rate"),
        jitter_threshold_ns=g.budget_ns(jitter_threshold_us, "--jitter-threshold-us"),
        resamples=resamples, seed=seed)
    limits.validate()
    if not 1 <= cold_processes <= 100:
        raise fail("--cold-processes must be between 1 and 100")
    names = g.parse_scenarios(scenarios)
    run_id = None
    if run is not None:
        given = [p for p in ctx.command.params if p.name in PROBE_OPTIONS and
                 ctx.get_parameter_source(p.name).name != "DEFAULT"]
        if given:
            raise fail(f"{given[0].opts[0]} shapes the probe the gate runs now; with --run the "
                       "run was measured already (drop one of them)")
        if run != "latest":
            run_id = parse_run_id(run, "--run")
    if len(names) > 1 and baseline != "last-pass":
        raise fail("with several --scenarios the baseline must be last-pass (one per scenario)")
    base_file = base_run = None
    if baseline != "last-pass":
        if re.fullmatch(r"[0-9]+", baseline):
            base_run = parse_run_id(baseline, "--baseline")
        else:
            base_file = load_baseline_file(baseline)
    settings = configs = None
    if run is None:  # every probe option is checked before the database is created
        settings, configs = _probe_settings(limits, model=model, builtin=builtin,
                                            variant=variant, samples=samples,
                                            duration=duration, warmup=warmup, cpus=cpus,
                                            intra=intra, inter=inter)
    return GateRequest(limits, names, run, run_id, baseline, base_run, base_file, settings,
                       configs, cold_processes, allow_mismatch, db, json_out)


@dataclass
class Current:
    """One scenario's run being gated: its history id, the samples of the control
    interleaved with it in this session (None when none ran) and why one ran or not
    (agent.gate.evaluate.compare says it beside the verdict)."""

    scenario: str
    run_id: int
    control_ns: np.ndarray | None = None
    why: str | None = None


def execute(req: GateRequest) -> list:
    """Probe now (or take the run), gate each scenario against its baseline, record each
    verdict; the verdicts."""
    from agent.history import History
    with History(req.db, create=req.run is None) as h:
        if req.run is not None:
            rid = h.latest_id() if req.run_id is None else req.run_id
            current = [Current(h.get(rid).scenario or "warm", rid,
                               why="--run: measured already, no control beside it")]
        else:
            current = _probe_now(h, req)
        ids = [(c.scenario, c.run_id) for c in current]
        return [_verdict(h, req, c, ids) for c in current]


def _baseline(h, req: GateRequest, cur_run):
    """The baseline of ``cur_run`` as a GateInput and its history id (None for a file, or
    when last-pass finds none: (None, None)); a last-pass baseline carries its family's
    P99s (the run-to-run spread)."""
    if req.base_file is not None:
        return _input_from_file(req.base_file, cur_run.variant, req.baseline), None
    if req.base_run is not None:
        b = h.get(req.base_run)
        if b.id == cur_run.id:
            raise fail(f"--baseline {b.id} is the run being gated")
        return _input_from_run(h, b), b.id
    b = h.last_pass(model_key_=cur_run.model_key, variant=cur_run.variant,
                    scenario=cur_run.scenario, before=cur_run.id)
    if b is None:
        return None, None
    base = _input_from_run(h, b)
    fam = h.baseline_family(model_key_=cur_run.model_key, variant=cur_run.variant,
                            scenario=cur_run.scenario, before=cur_run.id, limit=FAMILY_RUNS)
    base.family_p99_ns = [r.p99_ns for r in fam]
    return base, b.id


def _verdict(h, req: GateRequest, c: Current, current_ids):
    from agent.gate import evaluate as g
    from agent.gate.fingerprint import differences
    cur_run = h.get(c.run_id)
    cur = _input_from_run(h, cur_run)
    base, base_id = _baseline(h, req, cur_run)
    control = None if c.control_ns is None else g.GateInput(
        f"the control of run {cur_run.id}", c.control_ns, fingerprint=cur.fingerprint)
    mism = differences(base.fingerprint, cur.fingerprint) if base is not None else []
    v = g.evaluate(cur, base, req.limits, scenario=c.scenario, mismatches=mism,
                   allow_mismatch=req.allow_mismatch, relative=c.scenario != "cold",
                   control=control, why=c.why)
    if c.scenario == "stressed":
        v.checks.extend(_stressed_checks(h, cur, cur_run, current_ids))
    if base is not None and cur_run.model_hash and base_id is not None:
        bm = h.get(base_id)
        if bm.model_hash and bm.model_hash != cur_run.model_hash:
            v.notes.append("model content changed since the baseline")
        if bm.variant != cur_run.variant:
            v.notes.append(f"variant changed: {bm.variant} → {cur_run.variant}")
    h.add_gate_result(cur_run.id, base_id, c.scenario, v.status, v.to_dict())
    return v


def show(req: GateRequest, verdicts: list) -> None:
    from agent.gate import evaluate as g
    code = g.exit_code(verdicts)
    if req.json:
        print(json.dumps({"schema": "hftagent.gate.evaluate", "schema_version": 1,
                          "exit_code": code, "verdicts": [v.to_dict() for v in verdicts]},
                         indent=2, default=_default))
    else:
        render(verdicts, code)
    raise typer.Exit(code)


def gate(ctx: typer.Context, run: RunOpt = None, baseline: BaselineOpt = "last-pass",
         max_p99_regression: RegressionOpt = "10%", max_p99_us: P99UsOpt = None,
         max_cold_start_us: ColdUsOpt = None, max_jitter_rate: JitterRateOpt = "0.0005",
         jitter_threshold_us: JitterUsOpt = JITTER_THRESHOLD_US,
         allow_mismatch: MismatchOpt = False, scenarios: ScenariosOpt = "warm",
         cold_processes: ColdProcOpt = 5, model: ModelOpt = None,
         builtin: GateBuiltinOpt = "lstm", variant: VariantOpt = None,
         samples: SamplesOpt = None, duration: DurationOpt = None, warmup: WarmupOpt = 200,
         cpus: CpusOpt = None, intra: IntraOpt = None, inter: InterOpt = None,
         resamples: ResamplesOpt = 2000, seed: SeedOpt = None, db: DbOpt = None,
         json_out: JsonOpt = False) -> None:
    args = dict(locals())
    del args["ctx"]
    req = parse(ctx, **args)
    show(req, execute(req))


def _stressed_checks(h, cur, cur_run, current_ids) -> list:
    """The stressed run against the same box's quiet run: the warm run of this gate when it
    ran one, else the newest earlier passing warm run of the model and variant."""
    from agent.gate import evaluate as g
    warm = [rid for scen, rid in current_ids if scen == "warm"]
    q = h.get(warm[0]) if warm else h.last_pass(
        model_key_=cur_run.model_key, variant=cur_run.variant, scenario="warm",
        before=cur_run.id)
    quiet = _input_from_run(h, q) if q is not None else None
    return g.stressed_checks(cur, (cur_run.summary or {}).get("load"), quiet,
                             f"#{q.id}" if q is not None else None)


def _default(o: Any) -> Any:
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(type(o).__name__)


def _probe_settings(limits, *, model, builtin, variant, samples, duration, warmup, cpus, intra,
                    inter):
    """The probe's settings and thread configuration, every option validated (no TF)."""
    from agent.probe import options
    from agent.probe.variants import parse_variants
    if variant is None:
        variant = "numpy" if options.is_numpy_model(model, builtin) else "tflite"
    try:
        one = parse_variants(variant) if variant.strip() != "all" else None
    except ValueError as exc:
        raise AgentError(f"--variant: {exc}") from None
    if one is None or len(one) != 1:
        raise fail(f"--variant {variant!r}: the gate measures one variant")
    return options.build(
        model=model, builtin=builtin, signature=None, shape=None,
        input_data="random", variant=variant, samples=samples, duration=duration,
        warmup=warmup, rate=None, threshold_us=limits.jitter_threshold_ns / 1000, calib=None,
        intra=intra, inter=inter, cpus=cpus, sweep=None, batch="1")


def _probe_now(h, req: GateRequest) -> list[Current]:
    """Each scenario probed now and recorded; with short history its run holds a control
    interleaved in the same session (:func:`_control_plan`)."""
    from agent.gate import evaluate as g
    from agent.gate.fingerprint import collect
    from agent.history import model_identity
    fp = collect()
    spec, variant = req.settings.model, req.settings.variants[0]
    key, hsh = model_identity(spec.path, spec.builtin)
    out = []
    for name in req.scenarios:
        control, why = _control_plan(h, req, name, (key, hsh, variant))
        # one line per scenario on stderr, terminal or not: a gate runs for seconds to minutes
        print(f"hftagent gate: running scenario {name} ({variant})"
              + (", twice the samples: half are an interleaved control" if control else "")
              + "...", file=sys.stderr, flush=True)
        sr = g.run_scenario(name, req.settings, req.configs[0],
                            cold_processes=req.cold_processes, control=control)
        rid = h.add_run(kind="probe", command="gate", summary=sr.summary,
                        samples_ns=sr.latency_ns, scenario=name, model_path=spec.path,
                        model_key_=key, model_hash_=hsh,
                        variant=sr.variant, tf_version=(sr.summary.get("host") or {}
                                                        ).get("tensorflow"),
                        fingerprint=fp, cold_start_ns=sr.cold_start_ns[0]
                        if name != "cold" else max(sr.cold_start_ns))
        out.append(Current(name, rid, sr.control_ns, why))
    return out


def _control_plan(h, req: GateRequest, name: str, build: tuple) -> tuple[bool, str | None]:
    """Whether scenario ``name``'s run holds a control interleaved in this session, and why
    (or why not; None when history decides with its run-to-run spread, or there is no
    baseline). A control is run when the comparison would otherwise have within-run noise
    only (fewer than 3 earlier runs, or an explicit --baseline run) and the baseline measured
    this same build: model key and content, variant, TensorFlow and thread configuration
    (a control of this build cannot stand in for another one)."""
    from agent.gate import evaluate as g
    from agent.history.schema import MAX_RUN_ID
    if name not in g.CONTROL_SCENARIOS:
        return False, f"the {name} scenario holds no interleaved control"
    if req.base_file is not None:
        return False, "the baseline is a file: its build cannot run beside this one"
    key, hsh, variant = build
    if req.base_run is not None:
        b, why = h.get(req.base_run), f"--baseline {req.base_run} gives no run-to-run spread"
    else:
        b = h.last_pass(model_key_=key, variant=variant, scenario=name, before=MAX_RUN_ID)
        if b is None:
            return False, None
        fam = h.baseline_family(model_key_=key, variant=variant, scenario=name,
                                before=MAX_RUN_ID, limit=FAMILY_RUNS)
        if g.run_to_run_sd([r.p99_ns for r in fam]) is not None:
            return False, None
        why = (f"history holds {len(fam)} earlier run(s) of this model, variant and "
               "scenario, fewer than 3 to know the run-to-run spread")
    if not _same_build(b, req, build):
        return False, (f"run {b.id} measured another build (model, variant, TensorFlow or "
                       "threads): a control of this one cannot stand in for it")
    return True, why


def _same_build(b, req: GateRequest, build: tuple) -> bool:
    """Whether run ``b`` measured the build the gate runs now (a built-in without a cached
    file has no hash: its key names it)."""
    from agent.probe.runner import host_info
    key, hsh, variant = build
    conf = (b.summary.get("run") or {}).get("config") if isinstance(b.summary, dict) else None
    return (b.model_key == key and b.variant == variant and b.model_hash == hsh
            and (hsh is not None or key.startswith("builtin:"))
            and b.tf_version == host_info()["tensorflow"]
            and (conf is None or conf == req.configs[0].to_dict()))


# How many earlier runs measure the run-to-run spread of P99 (with last-pass baselines).
FAMILY_RUNS = 8


def _input_from_run(h, r):
    from agent.gate.evaluate import GateInput
    lat = h.samples(r.id)
    if r.scenario == "cold":
        colds = [] if lat is None else [int(v) for v in lat]
        return GateInput(f"run {r.id}", None, None, len(colds), colds, r.fingerprint)
    colds = [r.cold_start_ns] if r.cold_start_ns is not None else []
    if lat is None:
        return GateInput(f"run {r.id}", None, r.p99_ns, r.sample_count or 0, colds,
                         r.fingerprint)
    return GateInput(f"run {r.id}", lat, cold_start_ns=colds, fingerprint=r.fingerprint)


def load_baseline_file(path: str) -> dict:
    """A baseline file: an ``hftagent.run`` export (history show/export --json) or an
    ``hftagent.probe`` document (probe --json). Anything else is one clear error: a FIFO or a
    device (never opened: /dev/zero would be read without end), a file over
    MAX_BASELINE_BYTES, JSON nested deeper than the parser's recursion limit."""
    if not os.path.isfile(path):
        raise AgentError(f"--baseline {path!r}: not a run id, 'last-pass' or an existing file")
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise AgentError(f"--baseline {path}: {exc.strerror or exc}") from None
    if size > MAX_BASELINE_BYTES:
        raise AgentError(f"--baseline {path}: {size} bytes, more than any history export or "
                         f"probe document ({MAX_BASELINE_BYTES >> 20} MiB at most)")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except RecursionError:
        raise AgentError(f"--baseline {path}: JSON nested too deeply to be an hftagent "
                         "document") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AgentError(f"--baseline {path}: not JSON ({type(exc).__name__}); expected an "
                         "hftagent history export or probe --json document") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == "hftagent.runs" and len(doc.get("runs") or []) == 1:
        doc = doc["runs"][0]
        schema = doc.get("schema")
    if schema == "hftagent.run" and doc.get("schema_version") == 1 and \
            isinstance(doc.get("run"), dict):
        return doc
    if schema == "hftagent.probe" and doc.get("schema_version") == 1 and \
            isinstance(doc.get("runs"), list):
        return doc
    raise AgentError(f"--baseline {path}: wrong format (schema {schema!r}); expected an "
                     "hftagent.run v1 export (hftagent history show ID --json) or an "
                     "hftagent.probe v1 document (hftagent probe --json)")


def _input_from_file(doc: dict, variant: str | None, path: str):
    import numpy as np

    from agent.gate.evaluate import GateInput
    label = f"file {os.path.basename(path)}"
    if doc["schema"] == "hftagent.run":
        r = doc["run"]
        lat = doc.get("latency_ns")
        try:
            arr = None if lat is None else np.asarray(lat, dtype=np.int64)
        except (TypeError, ValueError):
            raise AgentError(f"--baseline {path}: latency_ns is not a list of integers") from None
        colds = [r["cold_start_ns"]] if r.get("cold_start_ns") is not None else []
        if arr is None:
            return GateInput(label, None, r.get("p99_ns"), r.get("sample_count") or 0, colds,
                             r.get("fingerprint"))
        return GateInput(label, arr, cold_start_ns=colds, fingerprint=r.get("fingerprint"))
    runs = [r for r in doc["runs"] if isinstance(r, dict) and r.get("status") == "ok"
            and (r.get("latency") or {}).get("p99_ns") is not None]
    pick = [r for r in runs if r.get("variant") == variant] or (runs if len(runs) == 1 else [])
    if not pick:
        raise AgentError(f"--baseline {path}: no ok run of variant {variant!r} in the probe "
                         "document")
    r = pick[0]
    colds = [r["cold_start_ns"]] if r.get("cold_start_ns") is not None else []
    return GateInput(label, None, r["latency"]["p99_ns"], r["latency"]["count"], colds, None)


STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim",
                "insufficient": "magenta", "not-comparable": "bold yellow"}
VERDICT_WORDS = {0: "pass", 1: "FAIL", 2: "NOT COMPARABLE (--allow-mismatch to compare anyway)",
                 3: "INSUFFICIENT SAMPLES"}


def render(verdicts, code: int, con=None) -> None:
    """Each scenario's checks (a table on a wide terminal, a list otherwise: agent/textout.py),
    host differences and notes as text (never markup), then the verdict and exit status."""
    from rich.text import Text

    from agent import textout
    con = con or textout.console()
    cols = [textout.Column("check"), textout.Column("status"), textout.Column("value"),
            textout.Column("limit"), textout.Column("detail")]
    for v in verdicts:
        title = Text(f"gate [{v.scenario}] {v.current} vs {v.baseline or 'no baseline'}: ",
                     style="bold")
        title.append(v.status, style=STATUS_STYLE.get(v.status, ""))
        rows = [textout.Row({"check": Text(c.name), "value": Text(c.value),
                             "limit": Text(c.limit), "detail": Text(c.detail)},
                            tag=c.status, tag_style=STATUS_STYLE.get(c.status, ""))
                for c in v.checks]
        textout.show(con, title, cols, rows, head=("check",), tag_column="status")
        for m in v.mismatches:
            textout.line(con, f"  host differs: {m}", style="yellow")
        if v.decision:
            textout.line(con, f"  {v.decision}")
        for n in v.notes:
            textout.line(con, f"  note: {n}", style="dim")
    textout.line(con, f"gate: {VERDICT_WORDS[code]} (exit {code})")


def register(app: typer.Typer) -> None:
    register_command(app, "gate", gate, HELP)
