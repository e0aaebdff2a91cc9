"""perf counters of the probe process, streamed from ``perf stat -I <ms> -x,``.

Runs ``perf stat -I <interval_ms> -x, -e <events> -p <pid>`` as a child process; a reader
thread parses its CSV interval lines (``time,count,unit,event,run,pct,...`` on stderr) and
keeps cumulative totals. Signals: ``perf.<pid>.<event>_total`` (counters; event names with
'-' turned into '_': ``context_switches``, ``cpu_migrations``, ``page_faults``, ``cycles``,
``instructions``, ``cache_misses``). Events perf reports as ``<not supported>``
(hardware events in a VM without a PMU, as here) are listed in
:attr:`unsupported` and absent from samples, never 0. Without a ``perf`` binary, or when the
kernel refuses (perf_event_paranoid, no permission), the collector is unavailable with the
reason perf printed. ``<not counted>`` (the task did not run in that interval) adds 0.
[perf stat -I 100 -e context-switches,... -p PID]
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time

from collectors.base import Availability

SOFTWARE_EVENTS = ("context-switches", "cpu-migrations", "page-faults")
HARDWARE_EVENTS = ("cycles", "instructions", "cache-misses")


def parse_perf_line(line: str) -> tuple[str, float | None, str] | None:
    """One ``perf stat -x,`` interval line → (event, count or None, raw count text); None for
    lines that are not counts (comments, blank). Pure."""
    parts = line.strip().split(",")
    if len(parts) < 4 or line.startswith("#"):
        return None
    try:
        float(parts[0])
    except ValueError:
        return None
    count, event = parts[1], parts[3]
    event = event.split(":")[0]
    if not event:
        return None
    if count == "<not counted>":
        # The task did not run during the interval (perf could not schedule the counter):
        # nothing happened to count, so the interval adds 0.
        return event, 0.0, count
    try:
        return event, float(count), count
    except ValueError:
        return event, None, count  # "<not supported>": no such counter here


class PerfCollector:
    """See module docstring."""

    name = "perf"
    period_s = 0.0  # sample() only copies the totals the reader thread keeps

    def __init__(self, pid: int, interval_ms: int = 100,
                 events: tuple[str, ...] = SOFTWARE_EVENTS + HARDWARE_EVENTS,
                 perf_bin: str | None = None) -> None:
        self.pid = pid
        self.interval_ms = interval_ms
        self.events = events
        self.perf_bin = perf_bin or shutil.which("perf")
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._totals: dict[str, float] = {}
        self._lock = threading.Lock()
        self.unsupported: dict[str, str] = {}
        self.lines = 0
        self.last_error: str | None = None

    def available(self) -> Availability:
        if not self.perf_bin:
            return Availability.no("unsupported: no perf binary")
        if self._proc is None:
            self._start()
        # perf prints its refusal (paranoid level, unknown pid) and exits quickly.
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end and self._proc.poll() is None and self.lines == 0:
            time.sleep(0.02)
        if self._proc.poll() is not None:
            return Availability.no(f"perf stat exited: {self.last_error or 'no output'}")
        return Availability.yes()

    def _start(self) -> None:
        cmd = [self.perf_bin, "stat", "-I", str(self.interval_ms), "-x", ",",
               "-e", ",".join(self.events), "-p", str(self.pid)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, bufsize=1)
        self._thread = threading.Thread(target=self._read, name="hftagent-perf", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            parsed = parse_perf_line(line)
            if parsed is None:
                if line.strip():
                    self.last_error = line.strip()[:200]
                continue
            event, count, raw = parsed
            key = f"perf.{self.pid}.{event.replace('-', '_')}_total"
            self.lines += 1
            if count is None:
                self.unsupported[key] = f"unsupported: perf says {raw}"
                continue
            with self._lock:
                self._totals[key] = self._totals.get(key, 0.0) + count

    def is_counter(self, name: str) -> bool:
        return True

    def sample(self) -> dict[str, float | None]:
        if self._proc is None:
            self._start()
        if self._proc.poll() is not None and not self._totals:
            raise RuntimeError(f"perf stat exited: {self.last_error or 'no output'}")
        with self._lock:
            return dict(self._totals)

    def totals(self) -> dict[str, float]:
        """The cumulative counts so far (also after :meth:`close`; never starts perf)."""
        with self._lock:
            return dict(self._totals)

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._proc = None
