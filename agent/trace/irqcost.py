"""What one interrupt costs a task running on a CPU, the parts no kernel event times included.

Kernel events time an interrupt handler from its entry event to its exit event. The rest of
what the interrupted task loses is invisible to them: the hardware's delivery, the kernel's
entry and exit code, and in a virtual machine the exit to the hypervisor and the entry back
(the guest cannot see those at all; it sees its task's run time grow). On bare metal that is
a few hundred ns; in a guest it is microseconds, and tens of them under nested
virtualisation. Under an interrupt storm (RPS steering packets to the CPU with an IPI each)
it is most of what the storm costs.

:func:`measure` runs agent/trace/hftirqcost.c (built on first use like the noise recorder):
a thread spins on the CPU reading the clock while another, on a housekeeping CPU, sends it
IPIs with ``membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`` (Linux 4.16+); the median gap an
IPI leaves in the spinning thread is the cost. 200 IPIs, 50 µs apart: ~25 ms of one CPU.

``hftagent watch`` measures it on each probe CPU before its own probe starts (never under an
external client, whose CPU the spinner would take; there ``--irq-cost US``), and the spike
breakdown charges each interrupt that entered while the probe ran with it
(agent/trace/timeline.py ``interrupt_overhead``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("hftirqcost.c")
COUNT = 200
SPACING_NS = 50_000
TIMEOUT_S = 10.0
_BUILD_FAILED: list[str] = []  # why the helper could not be built, once known
MIN_MATCHED = 0.2  # fewer matched IPIs (the CPU busy with other tasks most of the time): not used


@dataclass(frozen=True)
class IrqCost:
    """``cost_ns``: the median time one IPI took from a task spinning on ``cpu`` (the
    handler's own sub-µs included), None when it could not be measured (``note`` says why);
    ``p10_ns``/``p90_ns``: its spread; ``matched``/``sent``: IPIs seen / sent."""

    cpu: int
    cost_ns: int | None
    note: str
    p10_ns: int | None = None
    p90_ns: int | None = None
    matched: int = 0
    sent: int = 0

    def to_dict(self) -> dict:
        us = lambda ns: None if ns is None else round(ns / 1e3, 2)  # noqa: E731
        return {"cpu": self.cpu, "cost_us": us(self.cost_ns), "p10_us": us(self.p10_ns),
                "p90_us": us(self.p90_ns), "matched": self.matched, "sent": self.sent,
                "note": self.note}


def parse_output(cpu: int, text: str) -> IrqCost:
    """hftirqcost's stdout → IrqCost. Raises ValueError on output it did not write."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    if not line.startswith("hftirqcost=1 "):
        raise ValueError("no result line from the interrupt-cost helper")
    try:
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        sent, matched = int(kv["sent"]), int(kv["matched"])
        med, step = int(kv["median_ns"]), int(kv["step_ns"])
        p10, p90 = int(kv["p10_ns"]), int(kv["p90_ns"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"bad interrupt-cost helper output: {exc}") from None
    if sent <= 0 or matched < MIN_MATCHED * sent:
        seen = f" (median {max(0, med - step) / 1e3:.1f} µs)" if matched else ""
        return IrqCost(cpu, None, f"only {matched} of {sent} IPIs seen on CPU {cpu}{seen}: "
                       "not measured", matched=matched, sent=sent)
    cost = max(0, med - step)
    return IrqCost(cpu, cost, f"{cost / 1e3:.1f} µs per IPI on CPU {cpu} (median of "
                   f"{matched}, P10-P90 {p10 / 1e3:.1f}-{p90 / 1e3:.1f} µs)",
                   max(0, p10 - step), max(0, p90 - step), matched, sent)


def measure(cpu: int, sender_cpu: int, *, count: int = COUNT,
            spacing_ns: int = SPACING_NS) -> IrqCost:
    """Measure the interrupt cost on ``cpu``, IPIs sent from ``sender_cpu``; never raises:
    a helper that cannot be built or run gives ``cost_ns`` None and the reason."""
    from collectors.native import NativeUnavailable, build, command
    if cpu == sender_cpu:
        return IrqCost(cpu, None, "no other CPU to send IPIs from: not measured")
    if _BUILD_FAILED:  # (once per process, not once per CPU)
        return IrqCost(cpu, None, f"not measured: {_BUILD_FAILED[0]}")
    try:
        exe = build(SOURCE, "hftirqcost", "interrupt-cost helper")
    except NativeUnavailable as exc:
        _BUILD_FAILED.append(str(exc))
        return IrqCost(cpu, None, f"not measured: {exc}")
    # argv ends with PARENT_PID WATCH_FD: the helper dies with us (hftirqcost.c); an
    # exception here (a stop) kills it (subprocess.run)
    argv, fds = command(exe, str(cpu), str(sender_cpu), str(count), str(spacing_ns))
    try:
        with exe:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                               check=False, pass_fds=fds)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return IrqCost(cpu, None, f"not measured: {type(exc).__name__}: {exc}")
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return IrqCost(cpu, None, f"not measured: {why}")
    try:
        return parse_output(cpu, r.stdout)
    except ValueError as exc:
        return IrqCost(cpu, None, f"not measured: {exc}")
