"""The built-in probe (``--probe tf``, the default, or ``--probe numpy``): the worker process
(:mod:`agent.watch.probe_worker`) pinned to the probe CPU, timing its model open loop at
``--rate`` and writing every call into its ring.

Watch's own probe ring is ``hftagent-watch-<pid>-<random>.ring`` in
:func:`agent.client.ring_dir` (``ring_dir`` overrides it; the random part means no other user
can block the name beforehand), created by the worker as :class:`agent.client.LatencyRing`
does and read only when it is ours (our euid, created by the worker); what a killed watch left
there is swept first (:func:`agent.client.sweep_stale_rings`).

Its own summary lines: the rate (``--rate auto``: the worker's choice after its warm-up), the
share of the probe CPUs its calls used (:func:`calls_busy`) and, over half busy, the load
warning with the advice that fits (:func:`load_warning`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.client import FIELDS, RingError, RingReader, ring_dir, ring_name, sweep_stale_rings
from agent.errors import AgentError
from agent.watch.latency.base import Given, Phase, Running, Source
from collectors.host import Host

F = {name: i for i, name in enumerate(FIELDS)}


@dataclass(frozen=True)
class BuiltinProbe(Source):
    """``--probe tf|numpy``: the model (tf: a built-in name or a path) and variant, the rate
    (0.0: auto), the warm-up calls, where the ring goes (None: agent.client.ring_dir)."""

    probe: str = "tf"
    model: str = "lstm"
    variant: str = "xla"
    rate_hz: float = 500.0  # 0.0: auto (the options' default)
    warmup: int = 200
    ring_dir: str | None = None

    RANK = 90
    DEFAULT = True
    NAMES = ("tf", "numpy")
    queueing = True          # open loop: a call starts late behind a slow one
    idle_until_start = True  # watch starts it: nothing of it runs on the CPUs before

    kind = property(lambda self: self.probe)
    said = property(lambda self: f"--probe {self.probe}")
    exporter_variant = property(lambda self: self.variant if self.probe == "tf" else "")

    def history(self) -> dict[str, Any]:
        return {"probe": self.probe, "model": self.model, "variant": self.variant}

    @classmethod
    def named(cls, given: Given) -> bool:
        return given.probe in cls.NAMES

    @classmethod
    def build(cls, host: Host, given: Given) -> BuiltinProbe:
        probe = given.probe or "tf"
        if probe == "tf":
            check_tf_options(given.model, given.variant)
        else:
            cls.refuse(given, f"--probe {probe}")
        return cls(probe=probe, model=given.model or "lstm", variant=given.variant or "xla",
                   rate_hz=given.rate_hz)

    @classmethod
    def refuse(cls, given: Given, chosen: str) -> None:
        for name, v in (("--model", given.model), ("--variant", given.variant)):
            if v is not None:
                raise AgentError(f"{name} is for --probe tf, not {chosen}")

    def cpus(self, host: Host, rule: Any, given: list[int] | None,
             keep_one_free: bool) -> list[int]:
        return given or [rule.cpus[-1]]

    def open(self, host: Host, cpus: list[int], warnings: list[str]) -> ProbeRun:
        return ProbeRun(self, host, cpus, warnings)


def check_tf_options(model: str | None, variant: str | None) -> None:
    """--model and --variant name something the TF probe can build (checked here, not after
    the worker's TF import)."""
    from agent.probe.models import BUILTINS
    from agent.probe.variants import VARIANTS
    if variant is not None and variant not in VARIANTS:
        raise AgentError(f"--variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
    if model is not None and model not in BUILTINS and not os.path.exists(model):
        raise AgentError(f"--model {model!r}: neither a built-in model ({', '.join(BUILTINS)}) "
                         "nor an existing path")


class ProbeRun(Running):
    """The worker of one run: ``proc``, its ring's ``reader``, ``pid`` and ``rate_hz`` once it
    is ready."""

    source: BuiltinProbe

    def __init__(self, source: BuiltinProbe, host: Host, cpus: list[int],
                 warnings: list[str]) -> None:
        super().__init__(source, host, cpus, warnings)
        self.rate_hz = source.rate_hz
        self.unstarted = f"the {source.probe} probe"
        self._own_ring: str | None = None

    def start(self, events: Any = None, phase: Phase | None = None) -> None:
        """Start the worker and wait for its "ready" line (TF import and warm-up: seconds),
        telling ``phase`` each phase the worker reports; an error is :class:`AgentError`
        with the worker's own line."""
        from agent.watch.probe_worker import await_ready
        src = self.source
        if phase is not None:
            phase(f"starting the {src.probe} probe on CPU {','.join(map(str, self.cpus))}")
        d = Path(src.ring_dir) if src.ring_dir else ring_dir()
        swept = sweep_stale_rings(d)  # what a killed watch (SIGKILL) left behind
        if swept:
            self.warnings.append(f"removed {len(swept)} ring file(s) left in {d} by a watch "
                                 "that is gone: " + ", ".join(sorted(swept)[:4]))
        path = str(d / ring_name("hftagent-watch"))
        self._own_ring = path  # the worker creates it; we remove it when we stop the worker
        cmd = [sys.executable, "-m", "agent.watch.probe_worker", "--ring", path,
               "--rate", str(src.rate_hz), "--cpus", ",".join(map(str, self.cpus)),
               "--probe", src.probe, "--model", src.model, "--variant", src.variant,
               "--warmup", str(src.warmup)]
        # Own session: a terminal's Ctrl-C (SIGINT to the foreground group) reaches only
        # watch, which then stops the worker itself after the final drain; otherwise the
        # worker could exit first and the stop would look like a dead probe (exit 3).
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        msg = await_ready(self.proc.stdout, phase)  # phase lines, then "ready"
        if not msg.get("ready"):
            err = msg.get("error")
            if not err:
                self.proc.wait(timeout=5)
                tail = (self.proc.stderr.read() or "").strip().splitlines()[-3:]
                err = f"probe worker exited ({self.proc.returncode}): {' | '.join(tail)}"
            self.stop()
            raise AgentError(err)
        self.info = msg
        self.pid = int(msg["pid"])
        self.rate_hz = float(msg.get("rate_hz") or self.rate_hz)  # --rate auto: chosen
        try:
            self.reader = RingReader(path, expect_uid=os.geteuid(), expect_pid=self.pid)
        except RingError as exc:
            self.stop()
            raise AgentError(str(exc)) from None

    def check(self) -> str | None:
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        tail = ""
        try:
            tail = " | ".join((self.proc.stderr.read() or "").strip().splitlines()[-2:])
        except (OSError, ValueError):
            pass
        return f"probe worker (pid {self.proc.pid}) exited with code {rc}" + \
            (f": {tail}" if tail else "")

    def stop(self) -> None:
        """Stop the worker (SIGTERM; SIGKILL when it does not end in time) and remove its
        ring."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                # a worker in its loop ends its call and closes the ring; one still in its
                # TF import or warm-up may not look at the signal for seconds: killed
                self.proc.wait(timeout=5 if self.info else 1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        path = self._own_ring or (self.reader.path if self.reader is not None else None)
        if path is None:
            return
        try:
            os.unlink(path)
        except OSError:
            pass

    def summary(self, lat: Any) -> dict[str, Any]:
        busy = calls_busy(lat, self.cpus)
        return {**super().summary(lat), "rate_hz": self.rate_hz,
                "rate_auto": self.source.rate_hz == 0.0,
                "probe_calls_busy": busy[0] if busy else None}

    def end_warnings(self, lat: Any, hist: Any, cpu_busy: float | None) -> list[str]:
        return load_warning(hist, lat, self.cpus, self.rate_hz, self.source.rate_hz == 0.0,
                            calls_busy(lat, self.cpus), cpu_busy)


def calls_busy(lat: Any, cpus: list[int]) -> tuple[float, int] | None:
    """(busy share, mean CPU ns a call) of the probe CPUs ``cpus`` over the probe's latest
    calls (``lat``: a :class:`~agent.watch.ring.LatencyRing`, at most its 20,000): the CPU
    time its calls used (each record's ``cpu_ns``) over the wall time they span, per probe
    CPU — a measured share, at most 1 (a response-time P50 × the rate is not: a probe that
    queues behind itself has response times far over its calls' own time). None before two
    calls."""
    recs = lat.last(lat.capacity)
    cpu = recs[:, F["cpu_ns"]]
    cpu = cpu[cpu >= 0]  # (-1: not measured)
    if len(recs) < 2 or not len(cpu):
        return None
    span = int(recs[:, F["end_ns"]].max() - recs[:, F["start_ns"]].min())
    if span <= 0:
        return None
    share = float(cpu.sum()) / span / max(1, len(cpus))
    return min(1.0, share), int(cpu.mean())


def load_warning(hist: Any, lat: Any, cpus: list[int], rate_hz: float, rate_auto: bool,
                 busy: tuple[float, int] | None = None,
                 cpu_busy: float | None = None) -> list[str]:
    """A built-in probe on a CPU more than half busy measures the queue its calls wait in
    more than the host: said with the measured busy share (``cpu_busy``: /proc/stat, else
    the calls' own CPU time, :func:`calls_busy`) — never a response-time P50 × the rate,
    which exceeds 100 % once calls queue. The advice fits the cause: a lower rate when the
    probe's own calls are most of the load (``--rate auto`` named only to a user who did not
    choose it), else a quieter CPU."""
    busy = busy if busy is not None else calls_busy(lat, cpus)
    own = busy[0] if busy is not None else None
    load = cpu_busy if cpu_busy is not None else own
    p50 = hist.quantile(0.5)
    if load is None or load <= 0.5 or not p50:
        return []
    text = (f"CPU {','.join(map(str, cpus))} was {100 * load:.0f} % busy"
            + (f" ({100 * own:.0f} % the probe's own calls)" if cpu_busy is not None and
               own is not None else "")
            + f" at {rate_hz:g} probe calls/s (P50 {p50 / 1e3:.0f} µs from the intended "
            "start): any disturbance queues the next calls")
    if own is None or busy is None:
        return [text]
    if own < load / 2:
        return [text + "; most of it is other work on that CPU (the spikes' causes name it): "
                "a quieter CPU for the probe (--cpus; hftagent cpus ranks them) leaves it "
                "headroom"]
    from agent.watch.probe_worker import auto_rate
    lower = auto_rate(max(busy[1], 1))  # a quarter busy at the calls' measured CPU time
    if lower < rate_hz and rate_auto:
        text += (f"; --rate auto chose {rate_hz:g}/s at the warm-up's P50 and the calls took "
                 f"longer since: a --rate of {lower:g} or less leaves it headroom")
    elif lower < rate_hz:
        text += f"; a --rate of {lower:g} or less (or --rate auto) leaves it headroom"
    return [text]


SOURCE = BuiltinProbe
