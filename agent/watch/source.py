"""Where a watch run's latency records come from (:class:`LatencySource`): the built-in probe
worker (:mod:`agent.watch.probe_worker`, its own process on the probe CPUs) or an external
process that records its own calls through :mod:`agent.client`.

Watch's own probe ring is ``hftagent-watch-<pid>.ring`` in :func:`agent.client.ring_dir`
(``WatchConfig.ring_dir`` overrides it), created by the worker as
:class:`agent.client.LatencyRing` does and read only when it is ours (our euid, created by the
worker); what a killed watch left there is swept first (:func:`agent.client.sweep_stale_rings`).
An external ring (``--pid``'s default, or ``--ring``) is waited for up to
:data:`EXTERNAL_WAIT_S` when it is not there yet; one that is there but wrong is refused at
once. A source that dies is reported by :meth:`LatencySource.check` (the session ends the run
with exit code 3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agent.client import (
    RingError,
    RingMissing,
    RingReader,
    default_ring_path,
    ring_dir,
    sweep_stale_rings,
)
from agent.errors import AgentError
from agent.watch.config import WatchConfig
from collectors.host import Host

EXTERNAL_WAIT_S = 5.0  # an external ring not created yet is waited for this long


class LatencySource:
    """The probe worker or the external process, and the :class:`RingReader` of its ring.
    ``warnings``: the session's list. Starting sets ``cfg.pid`` (the worker's, or the ring's
    creator), ``cfg.rate_hz`` (``--rate auto``: the worker's choice) and, for an external
    process given without ``--cpus``, ``cfg.probe_cpus`` (its affinity)."""

    def __init__(self, cfg: WatchConfig, host: Host, warnings: list[str]) -> None:
        self.cfg = cfg
        self.host = host
        self.warnings = warnings
        self.proc: subprocess.Popen | None = None
        self.reader: RingReader | None = None
        self.info: dict = {}  # the worker's "ready" line, or what the external process is
        self._own_ring: str | None = None

    def start_probe(self) -> None:
        """Start the built-in probe worker and wait for its "ready" line (TF import and
        warm-up: seconds); an error is :class:`AgentError` with the worker's own line."""
        cfg = self.cfg
        d = Path(cfg.ring_dir) if cfg.ring_dir else ring_dir()
        swept = sweep_stale_rings(d)  # what a killed watch (SIGKILL) left behind
        if swept:
            self.warnings.append(f"removed {len(swept)} ring file(s) left in {d} by a watch "
                                 "that is gone: " + ", ".join(sorted(swept)[:4]))
        path = str(d / f"hftagent-watch-{os.getpid()}.ring")
        self._own_ring = path  # the worker creates it; we remove it when we stop the worker
        cmd = [sys.executable, "-m", "agent.watch.probe_worker", "--ring", path,
               "--rate", str(cfg.rate_hz), "--cpus", ",".join(map(str, cfg.probe_cpus)),
               "--probe", cfg.probe, "--model", cfg.model, "--variant", cfg.variant,
               "--warmup", str(cfg.warmup)]
        # Own session: a terminal's Ctrl-C (SIGINT to the foreground group) reaches only
        # watch, which then stops the worker itself after the final drain; otherwise the
        # worker could exit first and the stop would look like a dead probe (exit 3).
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = self.proc.stdout.readline()  # blocks through TF import + warm-up
        try:
            msg = json.loads(line) if line else {}
        except json.JSONDecodeError:
            msg = {}
        if not msg.get("ready"):
            err = msg.get("error")
            if not err:
                self.proc.wait(timeout=5)
                tail = (self.proc.stderr.read() or "").strip().splitlines()[-3:]
                err = f"probe worker exited ({self.proc.returncode}): {' | '.join(tail)}"
            self.stop()
            raise AgentError(err)
        self.info = msg
        cfg.pid = int(msg["pid"])
        cfg.rate_hz = float(msg.get("rate_hz") or cfg.rate_hz)  # --rate auto: chosen
        try:
            self.reader = RingReader(path, expect_uid=os.geteuid(), expect_pid=cfg.pid)
        except RingError as exc:
            self.stop()
            raise AgentError(str(exc)) from None

    def attach_external(self) -> None:
        """Open an external process's ring (``--ring``, or ``--pid``'s default ring)."""
        cfg = self.cfg
        path = Path(cfg.ring_path) if cfg.ring_path else default_ring_path(cfg.pid)
        # --pid's default ring must be that process's (a stale ring of a dead process that
        # had the pid, or one planted under its name, is refused); --ring names its own.
        expect_pid = cfg.pid if not cfg.ring_path else None
        deadline = time.monotonic() + EXTERNAL_WAIT_S
        while True:
            try:
                self.reader = RingReader(path, expect_pid=expect_pid)
                break
            except RingMissing as exc:  # not created yet: wait a little for it
                if time.monotonic() > deadline:
                    raise AgentError(f"{exc} (is the process using agent.client, and is "
                                     "HFTAGENT_RING the same path?)") from None
                time.sleep(0.1)
            except RingError as exc:  # a ring that is there but wrong: at once
                raise AgentError(str(exc)) from None
        if cfg.pid is None:
            cfg.pid = self.reader.creator_pid
        self.info = {"pid": cfg.pid, "probe": f"external process {cfg.pid} ({path})"}
        if not cfg.probe_cpus:
            try:
                cfg.probe_cpus = sorted(os.sched_getaffinity(cfg.pid))
            except OSError:
                pass

    def check(self) -> str | None:
        """Why the source is gone (the worker exited, the external process exited or is a
        zombie), or None while it lives."""
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                tail = ""
                try:
                    tail = " | ".join((self.proc.stderr.read() or "").strip().splitlines()[-2:])
                except (OSError, ValueError):
                    pass
                return f"probe worker (pid {self.proc.pid}) exited with code {rc}" + \
                    (f": {tail}" if tail else "")
        elif self.cfg.pid is not None:
            try:
                os.kill(self.cfg.pid, 0)
            except ProcessLookupError:
                return f"external process {self.cfg.pid} exited"
            except PermissionError:
                pass
            # A zombie still answers kill(0): look at its state.
            st = self.host.read(self.host.proc(self.cfg.pid, "stat")).value
            if st and st[st.rfind(")") + 2:st.rfind(")") + 3] in ("Z", "X"):
                return f"external process {self.cfg.pid} exited"
        return None

    def stop(self) -> None:
        """Stop the probe worker (SIGTERM; SIGKILL when it does not end in time) and remove
        its ring; nothing for an external process."""
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

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
