"""The arms of ``tune try``: what each changes, which the guest supports, and the interleaved
schedule they run in.

Every lever arm is on top of isolation (``tune apply --isolate --only isolate``): on a CPU other
tasks may use, a call waits behind them whatever keeps the CPU awake, and since Linux 5.4
(sched_idle_cpu) the kernel counts a CPU running only the SCHED_IDLE keep-awake spinner as idle
when it places waking tasks. Isolation alone is the reference the winner rule compares levers
with; ``none`` shows what isolation itself buys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agent.errors import AgentError
from collectors.host import Host

HALT_POLL_NS = 200_000  # what the audit's wakeup.guest_halt_poll fix writes


@dataclass(frozen=True)
class Arm:
    """One candidate: ``run_flags`` go to ``hftagent run`` for the probe child (held while it
    runs), ``halt_poll_ns`` is written for the block and written back after."""

    name: str
    label: str
    isolate: bool = False
    run_flags: tuple[str, ...] = ()
    halt_poll_ns: int | None = None

    @property
    def lever(self) -> bool:
        """A wake-up lever on top of isolation (not ``none`` or ``isolate``)."""
        return bool(self.run_flags) or self.halt_poll_ns is not None


ARMS: tuple[Arm, ...] = (
    Arm("none", "none"),
    Arm("isolate", "isolation alone", isolate=True),
    Arm("pm-qos", "isolation + PM QoS 0", isolate=True, run_flags=("--pm-qos", "0")),
    Arm("keep-awake", "isolation + keep-awake (pause loop)", isolate=True,
        run_flags=("--keep-awake",)),
    Arm("keep-awake-busy", "isolation + keep-awake (busy loop)", isolate=True,
        run_flags=("--keep-awake", "--keep-awake-loop", "busy")),
    Arm("halt-poll", f"isolation + guest halt-polling {HALT_POLL_NS // 1000} µs", isolate=True,
        halt_poll_ns=HALT_POLL_NS),
)
REFERENCE = ("none", "isolate")  # always run: the winner rule compares with isolation alone
LEVERS = tuple(a.name for a in ARMS if a.name not in REFERENCE)


class TrialError(AgentError):
    """Bad input for ``tune try``, or a lever that cannot be set or undone; the message is for
    the user (one line, exit 1)."""


def parse_levers(spec: str | None) -> list[str]:
    """``--levers LIST`` (comma-separated names of :data:`LEVERS`; None: all of them)."""
    if spec is None:
        return list(LEVERS)
    want = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in want if x not in LEVERS]
    if bad or not want:
        shown = ", ".join(bad) if bad else repr(spec)
        raise TrialError(f"--levers {shown}: expected a comma-separated list of "
                         f"{', '.join(LEVERS)} (none and isolate always run)")
    return list(dict.fromkeys(want))


def halt_poll_unsupported(host: Host) -> str | None:
    """Why the halt-poll arm cannot run here, or None: the haltpoll cpuidle driver must be in
    use (its guest_halt_poll_ns does nothing otherwise) and the parameter readable."""
    from collectors import wakeup as wk
    path = wk.halt_poll_ns_path(host)
    if not host.exists(path):
        return f"no {host.display(path)} (the guest has no haltpoll cpuidle driver)"
    drv = host.read(wk.cpuidle_dir(host) / "current_driver")
    name = (drv.value or "").strip() or "none"
    if name != "haltpoll":
        return f"cpuidle driver {name}, not haltpoll: guest_halt_poll_ns would do nothing"
    if not wk.halt_poll_ns(host).ok:
        return f"{host.display(path)} is not readable"
    return None


@dataclass
class TrialPlan:
    """What one ``tune try`` runs: the arms, the rounds of shuffled blocks, the settings."""

    cpus: list[int]
    arms: list[Arm]
    unsupported: dict[str, str]
    rounds: int
    block_s: float
    rate: float
    seed: int
    workload: str
    order: list[list[str]] = field(default_factory=list)  # arm names, one list per round

    def blocks(self) -> int:
        return len(self.arms) * self.rounds

    def estimate_s(self, start_s: float = 0.8, isolate_s: float = 0.5) -> float:
        """Seconds the run should take: every block plus its probe's start-up, and one
        isolation apply and rollback per isolated block (each as measured on a 2-vCPU guest
        with two busy loops, plus a margin)."""
        iso = sum(1 for a in self.arms if a.isolate) * self.rounds
        return self.blocks() * (self.block_s + start_s) + iso * isolate_s

    def samples_per_arm(self) -> int:
        """Calls each arm gets: a block of s seconds at r calls/s serves about s·r − 1."""
        return max(0, int(self.block_s * self.rate) - 1) * self.rounds

    def to_dict(self) -> dict:
        return {"cpus": self.cpus, "arms": [a.name for a in self.arms],
                "unsupported": self.unsupported, "rounds": self.rounds,
                "block_s": self.block_s, "rate": self.rate, "seed": self.seed,
                "workload": self.workload, "order": self.order}


def schedule(names: list[str], rounds: int, seed: int) -> list[list[str]]:
    """Every arm once per round, the order shuffled per round by ``seed`` (the host's drift is
    then shared by all arms instead of landing on whichever ran last)."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        out.append(order)
    return out


def make_plan(host: Host, cpus: list[int], levers: list[str], *, rounds: int, block_s: float,
              rate: float, seed: int, workload: str) -> TrialPlan:
    """The arms to run (none, isolation and the ``levers`` this guest supports), the others
    listed with why, and the schedule. TrialError for settings that cannot run."""
    checks = [(rounds >= 1, f"--rounds {rounds}: must be at least 1"),
              (block_s > 0, f"--block-s {block_s:g}: must be > 0"),
              (0 < rate <= 10_000, f"--rate {rate:g}: calls per second in (0, 10000]"),
              (block_s * rate >= 2, f"--block-s {block_s:g} at --rate {rate:g} is less than "
               "two calls a block")]
    for ok, msg in checks:
        if not ok:
            raise TrialError(msg)
    unsupported: dict[str, str] = {}
    hp = halt_poll_unsupported(host) if "halt-poll" in levers else None
    if hp is not None:
        unsupported["halt-poll"] = hp
    arms = [a for a in ARMS if (a.name in REFERENCE or a.name in levers)
            and a.name not in unsupported]
    plan = TrialPlan(cpus, arms, unsupported, rounds, block_s, rate, seed, workload)
    plan.order = schedule([a.name for a in arms], rounds, seed)
    return plan
