"""Turn ``hftagent watch``'s option values into one checked request (:class:`WatchRequest`:
a :class:`~agent.watch.config.WatchConfig` and what the exporter needs), before anything runs.

Every option that is given is used or refused here, once, with one line (AgentError): an
empty value; one that applies only with another that is missing (--model without --probe tf,
--profile or --p99-budget-us without --listen, --flight-dir without --flight-us,
--attach-runtime without --attach); numbers out of range (NaN and infinities included); CPU
lists by the one target rule (:func:`agent.watch.config.plan`). The latency source is chosen
here, once (:func:`agent.watch.latency.choose`: a --pid or --attach PID that is not a running
process, an --attach-name that is not a regular expression, an --attach-unit that does not
exist, an --attach-cgroup out of /sys/fs/cgroup, a --ring that is not a latency ring, an
option of another source); then a bad --listen, web config or profile. The spike log and flight directory are opened by the session right after
(``WatchSession.open_outputs``), still before anything runs.

Units at the edge: ``--threshold-us`` and ``--flight-us`` become whole ns here
(``threshold_ns``, ``flight_ns``) and nothing downstream converts them again; the messages
keep the options' own spelling and unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.defaults import MAX_THRESHOLD_US
from agent.errors import AgentError
from agent.watch import latency
from agent.watch.config import WatchConfig, plan
from collectors.host import Host

MIN_SAMPLE_HZ, MAX_SAMPLE_HZ = 1.0, 1000.0  # a round costs ~100 µs: 1 kHz is 10 % of a CPU
MAX_RATE_HZ = 100_000.0  # a probe call takes ≥ 10 µs: more starts than this only queue
SAMPLERS = ("auto", "native", "python")
TRACE_MODES = ("auto", "on", "off", "mount")


@dataclass
class WatchRequest:
    """One checked ``hftagent watch`` run: the session's config, and for ``--listen`` the
    address, the loaded web config and profile and the P99 budget; how to show it."""

    cfg: WatchConfig
    listen: str | None = None
    web_config: Any = None          # agent.export.webconfig's loaded config, or None
    profile: Any = None             # the loaded audit profile (--listen only)
    p99_budget_us: int | None = None
    live: bool | None = None        # None: when stdout is a terminal
    json_out: bool = False


def build(host: Host, *, probe: str | None = None, model: str | None = None,
          variant: str | None = None, rate: str = "auto", cpus: str | None = None,
          housekeeping: str | None = None, pid: int | None = None, ring: str | None = None,
          attach: int | None = None, attach_runtime: str | None = None,
          attach_symbol: str | None = None, unsafe_return: bool = False,
          attach_unsafe_library: bool = False, attach_name: str | None = None,
          attach_unit: str | None = None, attach_cgroup: str | None = None,
          gpu_probes: str | None = None, sample_hz: float = 100.0,
          sampler: str = "auto", trace: str = "auto", pmu: str = "auto",
          irq_cost: str = "auto", nice: str = "0", threshold_us: float | None = None,
          k: float = 3.0, flight_us: float | None = None, flight_dir: str | None = None,
          spike_log: str | None = None, duration: float | None = None, perf: bool = False,
          listen: str | None = None, web_config_file: str | None = None,
          live: bool | None = None, json_out: bool = False, p99_budget_us: int | None = None,
          profile: str | None = None, cpu_budget: float | None = None) -> WatchRequest:
    """The request of these option values (the CLI's names); AgentError with one line."""
    for name, v in (("--ring", ring), ("--spike-log", spike_log), ("--flight-dir", flight_dir),
                    ("--listen", listen), ("--profile", profile), ("--model", model),
                    ("--variant", variant), ("--attach-symbol", attach_symbol)):
        if v is not None and not v.strip():
            raise AgentError(f"{name} is empty")
    rate_hz = parse_rate(rate)
    source = latency.choose(host, latency.Given(
        probe=probe, model=model, variant=variant, rate_hz=rate_hz, pid=pid, ring=ring,
        attach=attach, attach_runtime=attach_runtime, attach_symbol=attach_symbol,
        unsafe_return=unsafe_return, attach_unsafe_library=attach_unsafe_library,
        attach_name=attach_name, attach_unit=attach_unit, attach_cgroup=attach_cgroup,
        gpu_probes=gpu_probes))
    _choice("--sampler", sampler, SAMPLERS)
    _choice("--trace", trace, TRACE_MODES)
    from agent.watch.attribution.pmu import check_mode
    check_mode(pmu)   # (--pmu on for a source other than --attach: refused as it starts)
    from agent.watch.attribution.events import parse_irq_cost
    from agent.watch.priority import parse_nice
    parse_irq_cost(irq_cost)
    nice_n = parse_nice(nice)
    from agent.watch.budget import parse_pct
    budget = parse_pct(cpu_budget)  # (None: the default 1 %)
    _needs("--listen", listen, ("--profile", profile), ("--p99-budget-us", p99_budget_us),
           ("--web.config.file", web_config_file))
    _needs("--flight-us", flight_us, ("--flight-dir", flight_dir))
    for name, v in (("--sample-hz", sample_hz), ("--duration", duration)):
        _positive(name, v)
    threshold_ns, flight_ns = to_ns("--threshold-us", threshold_us), \
        to_ns("--flight-us", flight_us)
    if not MIN_SAMPLE_HZ <= sample_hz <= MAX_SAMPLE_HZ:
        # the rings hold capacity_s × sample_hz rows per collector: 1e9 Hz is a MemoryError
        raise AgentError(f"--sample-hz must be in {MIN_SAMPLE_HZ:g}..{MAX_SAMPLE_HZ:g} rounds "
                         f"a second, not {sample_hz:g}")
    _positive("--k", k, 1.0)
    if p99_budget_us is not None and p99_budget_us <= 0:
        raise AgentError("--p99-budget-us must be > 0")
    cpu = plan(host, source, cpus, housekeeping)
    cfg = WatchConfig(source=source, probe_cpus=cpu.probe, housekeeping_cpus=cpu.housekeeping,
                      notes=tuple(cpu.notes), sample_hz=sample_hz,
                      threshold_ns=threshold_ns, k_p50=k, flight_ns=flight_ns,
                      flight_dir=flight_dir or "hftagent-flight", spike_log=spike_log,
                      duration_s=duration, perf=perf, sampler=sampler, trace=trace,
                      irq_cost=irq_cost, nice=nice_n, cpu_budget=budget, pmu=pmu)
    req = WatchRequest(cfg, listen=listen, p99_budget_us=p99_budget_us, live=live,
                       json_out=json_out)
    if listen is not None:
        _exporter_inputs(req, web_config_file, profile)
    return req


def parse_rate(rate: str) -> float:
    """``--rate``: starts a second, or ``auto`` (0.0: the worker picks it after its
    warm-up)."""
    if rate == "auto":
        return 0.0
    try:
        if not rate.isascii():  # float() takes "٣" (any Unicode digit) as 3
            raise ValueError(rate)
        rate_hz = float(rate)
    except ValueError:
        raise AgentError(f"--rate must be a number or auto, not {rate!r}") from None
    _positive("--rate", rate_hz)
    if rate_hz > MAX_RATE_HZ:
        raise AgentError(f"--rate must be at most {MAX_RATE_HZ:g} starts a second, not {rate}")
    return rate_hz


def to_ns(name: str, us: float | None) -> int | None:
    """A duration option given in µs (``--threshold-us``, ``--flight-us``) as whole ns: the
    one conversion; finite, at least 1 ns and at most 1e9 µs (the exporter counts samples
    over a threshold as integer ns)."""
    if us is None:
        return None
    _positive(name, us)
    if us > MAX_THRESHOLD_US:
        raise AgentError(f"{name} must be at most {MAX_THRESHOLD_US:g} µs, not {us:g}")
    ns = round(us * 1000)
    if ns < 1:
        raise AgentError(f"{name} must be at least 0.001 µs (1 ns), not {us:g}")
    return ns


def _exporter_inputs(req: WatchRequest, web_config_file: str | None,
                     profile: str | None) -> None:
    """--listen's address, web config and profile, loaded now: a bad one is one line before
    anything starts."""
    from agent.export.server import parse_listen
    from tuning.profiles import load_profile
    parse_listen(req.listen)
    if web_config_file is not None:
        from agent.export.webconfig import load_web_config
        req.web_config = load_web_config(web_config_file)
    req.profile = load_profile(profile or "hft-cpu")


def _choice(name: str, value: str, allowed: tuple[str, ...], said: str | None = None) -> None:
    if value not in allowed:
        said = said or (", ".join(allowed[:-1]) + " or " + allowed[-1])
        raise AgentError(f"{name} must be {said}, not {value!r}")


def _needs(needed: str, value: object, *given: tuple[str, object]) -> None:
    """Options that apply only with ``needed``: refused when it is missing."""
    if value is not None:
        return
    for name, v in given:
        if v is not None:
            what = {"--listen": "is for the metrics of --listen: give --listen too",
                    "--flight-us": "is where --flight-us records go: give --flight-us too"}
            raise AgentError(f"{name} {what[needed]}")


def _positive(name: str, v: float | None, above: float = 0.0) -> None:
    # "not v > x" (not "v <= x") so that NaN is refused too; isfinite refuses inf
    if v is not None and not (v > above and math.isfinite(v)):
        raise AgentError(f"{name} must be a finite number > {above:g}, not {v}")
