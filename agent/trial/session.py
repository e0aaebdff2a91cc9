"""``tune try`` from options to result: the checks before anything changes (:func:`prepare`),
the measured run (:func:`execute`) and the plan as ``--dry-run`` prints it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host
from collectors.parsers import format_cpulist

from .arms import TrialError, TrialPlan, make_plan, parse_levers
from .runner import Hooks, TrialRun, run_trial
from .table import ArmFigures, Verdict, figures, pick


@dataclass
class TrialResult:
    plan: TrialPlan
    run: TrialRun
    arms: list[ArmFigures]
    verdict: Verdict


def prepare(host: Host, *, cpus: str | None, levers: str | None, rounds: int, block_s: float,
            rate: float, seed: int, workload: str) -> TrialPlan:
    """The plan, every input checked (TrialError, one line): the target CPUs by the one rule
    (tuning/targets.py), a housekeeping CPU left for isolation, the levers, the workload."""
    from tuning.targets import TargetError, resolve

    try:
        tp = resolve(host, cpus)
        tp.require_housekeeping("tune try's isolation")
    except TargetError as exc:
        raise TrialError(str(exc)) from None
    if workload not in ("numpy", "tflite"):
        raise TrialError(f"--workload {workload!r}: expected numpy or tflite")
    if workload == "tflite":
        from .worker import TFLITE_MODEL
        if not TFLITE_MODEL.is_file():
            raise TrialError(f"--workload tflite: the bundled model {TFLITE_MODEL} is not in "
                             "this install (use --workload numpy)")
    return make_plan(host, tp.cpus, parse_levers(levers), rounds=rounds, block_s=block_s,
                     rate=rate, seed=seed, workload=workload)


def check_host(host: Host, trial_dir: Path | None, note: Callable[[str], None]) -> None:
    """Before the first block: root on the live host; then (``trial_dir`` given, under the
    trial's lock) a journal a killed ``tune try`` left rolled back, and the CPUs not isolated
    already (the ``none`` arm would not be none)."""
    from tuning.apply import require_privilege
    from tuning.journal import JournalError, load
    from tuning.tunables.base import TuneError
    from tuning.tunables.isolate import isolated_cpuset

    from .levers import restore_halt_polling, roll_back

    if not host.live:
        raise TrialError("--root/--procfs/--sysfs describe a captured tree: tune try measures "
                         "this host (use --dry-run to see the plan)")
    try:
        require_privilege(host)
    except TuneError as exc:
        raise TrialError(f"tune try sets levers: {exc}") from None
    if trial_dir is None:
        return
    try:
        left = load(trial_dir)
    except JournalError as exc:
        raise TrialError(f"{trial_dir}: {exc}") from None
    if left is not None and left.entries:
        note(f"rolling back the isolation a stopped tune try left ({len(left.entries)} "
             f"entries in {trial_dir})")
        roll_back(host, trial_dir)
    hp = restore_halt_polling(host, trial_dir)
    if hp is not None:
        note(f"guest_halt_poll_ns written back to {hp} (a stopped tune try left it set)")
    iso = isolated_cpuset(host)
    if iso is not None:
        raise TrialError(f"CPU {format_cpulist(iso.cpus)} already isolated ({iso.path}): the "
                         "arms without isolation would not be without it; hftagent tune "
                         "rollback first")


def execute(host: Host, plan: TrialPlan, trial_dir: Path,
            progress: Callable[[str], None]) -> TrialResult:
    """Run every block (levers undone after each and on every way out) and judge."""
    from . import levers

    hooks = Hooks(isolate=lambda: levers.isolation(host, plan.cpus, trial_dir),
                  halt_poll=lambda ns: levers.halt_polling(host, ns, trial_dir),
                  block=lambda arm: levers.run_block(arm, plan.cpus, plan.block_s, plan.rate,
                                                     plan.workload))
    run = run_trial(plan, hooks, progress)
    arms = [figures(a, run.samples.get(a.name, [])) for a in plan.arms]
    return TrialResult(plan, run, arms, pick(arms))


def describe(plan: TrialPlan) -> list[str]:
    """The plan in lines (``--dry-run``, and the header of a real run)."""
    out = [f"CPU {format_cpulist(plan.cpus)}: {len(plan.arms)} arms x {plan.rounds} rounds "
           f"of {plan.block_s:g} s blocks at {plan.rate:g} calls/s ({plan.workload} probe), "
           f"~{plan.samples_per_arm():,} calls per arm, about {plan.estimate_s():.0f} s; "
           f"order seed {plan.seed}"]
    out += [f"  {a.name}: {a.label}" for a in plan.arms]
    out += [f"  {k}: unsupported: {v}" for k, v in plan.unsupported.items()]
    out += [f"  round {i}: {', '.join(o)}" for i, o in enumerate(plan.order, 1)]
    return out
