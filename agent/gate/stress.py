"""A standard load on the housekeeping CPUs, for the gate's ``stressed`` scenario.

rteval and OpenShift's cnf-tests accept a box only under load on its housekeeping CPUs: that is
when IRQs, kworkers and cache pressure reach the inference CPUs. The load here has four parts,
each a child process pinned to the housekeeping CPUs, each counting what it achieved so that
a run whose load did not happen is never taken for a pass:

==========  ==================================================================  ============
part        what it does                                                        rate unit
==========  ==================================================================  ============
cpu_cache   walks a 64 MiB buffer (bigger than most LLCs) with a 64-byte stride  MiB/s
            and writes back: a CPU and last-level-cache hog
net         a UDP flood over loopback (sender and receiver in one process):      packets/s
            softirq (NET_RX/NET_TX) work on the housekeeping CPUs
disk        4 KiB writes, each followed by fsync, into a temp file (O_EXCL,      fsyncs/s
            unpredictable name, removed on exit): block IRQs and kworkers
alloc       allocates and frees 1-16 MiB blocks, touching every page: page       MiB/s
            faults, zone lock and TLB shootdowns
==========  ==================================================================  ============

``stress-ng`` (Debian package ``stress-ng``) is used instead where it is installed, with the
matching stressors (``--cache --sock/--udp --hdd --vm``) pinned with ``--taskset``; its
``--metrics-brief`` bogo-op rates are recorded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

PARTS = ("cpu_cache", "net", "disk", "alloc")
UNITS = {"cpu_cache": "MiB/s", "net": "packets/s", "disk": "fsyncs/s", "alloc": "MiB/s"}
# Below these the part is taken as not having run (a stuck or starved load is no load).
MIN_RATES = {"cpu_cache": 50.0, "net": 1000.0, "disk": 5.0, "alloc": 50.0}


@dataclass
class LoadReport:
    """What the load achieved: {part: rate per second}, and the parts that fell short."""

    cpus: list[int]
    tool: str
    rates: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def short(self) -> dict[str, str]:
        out = dict(self.errors)
        for part in PARTS:
            if part in out:
                continue
            r = self.rates.get(part)
            floor = MIN_RATES[part] if self.tool == "builtin" else 1.0  # bogo ops/s
            if r is None or r < floor:
                unit = UNITS[part] if self.tool == "builtin" else "bogo ops/s"
                out[part] = f"achieved {r or 0:.1f} {unit} (< {floor:g})"
        return out

    def to_dict(self) -> dict:
        return {"cpus": self.cpus, "tool": self.tool, "rates": self.rates,
                "units": UNITS, "short": self.short}


def _worker(part: str, cpus: list[int], seconds: float) -> None:
    """Child process body: run ``part`` until killed or ``seconds`` pass; print its rate."""
    os.sched_setaffinity(0, cpus)
    stop = time.monotonic() + seconds
    done = 0.0
    t0 = time.monotonic()
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    try:
        if part == "cpu_cache":
            import numpy as np
            buf = np.ones(64 << 20, dtype=np.uint8)
            view = buf[::64]
            while running[0] and time.monotonic() < stop:
                view += 1
                done += 64
        elif part == "net":
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rx.bind(("127.0.0.1", 0))
            rx.setblocking(False)
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            addr, msg = rx.getsockname(), b"x" * 512
            while running[0] and time.monotonic() < stop:
                for _ in range(64):
                    tx.sendto(msg, addr)
                with contextlib.suppress(BlockingIOError):
                    while True:
                        rx.recv(2048)
                        done += 1
        elif part == "disk":
            fd, path = tempfile.mkstemp(prefix=".hftagent-stress-", dir=os.environ.get(
                "HFTAGENT_STRESS_DIR") or None)
            try:
                block = b"\0" * 4096
                while running[0] and time.monotonic() < stop:
                    os.pwrite(fd, block, int(done % 256) * 4096)
                    os.fsync(fd)
                    done += 1
            finally:
                os.close(fd)
                os.unlink(path)
        elif part == "alloc":
            import numpy as np
            sizes = [1 << 20, 4 << 20, 16 << 20]
            i = 0
            while running[0] and time.monotonic() < stop:
                a = np.empty(sizes[i % 3], dtype=np.uint8)
                a[::4096] = 1
                done += sizes[i % 3] / (1 << 20)
                del a
                i += 1
    finally:
        dt = max(time.monotonic() - t0, 1e-9)
        print(f"{part} {done / dt:.3f}", flush=True)


# stress-ng stressors standing for each part (bogo-op rates are then the unit)
STRESS_NG = {"cpu_cache": ("--cache", "1"), "net": ("--udp", "1"),
             "disk": ("--hdd", "1", "--hdd-opts", "fsync", "--hdd-bytes", "16M"),
             "alloc": ("--vm", "1", "--vm-bytes", "64M")}
_NG_NAME = {"cpu_cache": "cache", "net": "udp", "disk": "hdd", "alloc": "vm"}


def parse_stress_ng_metrics(text: str) -> dict[str, float]:
    """{part: bogo ops/s (real time)} from ``stress-ng --metrics-brief`` output, whose rows
    read "stress-ng: metrc: [PID] cache  1234  10.00  9.90  0.01  123.40  124.52" (older
    releases say "info:" instead of "metrc:")."""
    out = {}
    by_name = {v: k for k, v in _NG_NAME.items()}
    for line in text.splitlines():
        words = line.split()
        for i, w in enumerate(words):
            if w in by_name and len(words) >= i + 6:
                try:
                    out[by_name[w]] = round(float(words[i + 5]), 1)
                except ValueError:
                    pass
                break
    return out


@contextlib.contextmanager
def housekeeping_load(cpus: list[int], seconds: float = 3600.0,
                      parts: tuple[str, ...] = PARTS, *,
                      use_stress_ng: bool = True) -> Iterator[LoadReport]:
    """Run the load on ``cpus`` for the body of the ``with``; the report's rates are filled
    in on exit. Children are ours, stopped by pid, never by name."""
    if not cpus:
        raise ValueError("the housekeeping load needs at least one housekeeping CPU")
    ng = stress_ng() if use_stress_ng else None
    if ng:
        with _stress_ng_load(ng, sorted(cpus), seconds, parts) as report:
            yield report
        return
    report = LoadReport(sorted(cpus), "builtin")
    procs: dict[str, subprocess.Popen] = {}
    try:
        for part in parts:
            procs[part] = subprocess.Popen(
                [sys.executable, "-c", "import sys; from agent.gate.stress import _worker; "
                 "_worker(sys.argv[1], [int(c) for c in sys.argv[2].split(',')], "
                 "float(sys.argv[3]))", part, ",".join(map(str, cpus)), str(seconds)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                text=True, cwd=_package_root())
        time.sleep(0.3)  # let every part start before the measured work begins
        yield report
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for part, p in procs.items():
            try:
                out, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            words = out.split()
            if len(words) >= 2 and words[0] == part:
                report.rates[part] = round(float(words[1]), 1)
            else:
                tail = (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]
                report.errors[part] = tail


@contextlib.contextmanager
def _stress_ng_load(exe: str, cpus: list[int], seconds: float,
                    parts: tuple[str, ...]) -> Iterator[LoadReport]:
    report = LoadReport(cpus, "stress-ng")
    argv = [exe, "--taskset", ",".join(map(str, cpus)), "--timeout", f"{int(seconds)}s",
            "--metrics-brief", "--temp-path", tempfile.gettempdir()]
    for part in parts:
        argv += STRESS_NG[part]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, text=True)
    try:
        time.sleep(0.5)
        yield report
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)  # stress-ng prints its metrics on SIGINT
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        report.rates = parse_stress_ng_metrics(out)
        for part in parts:
            if part not in report.rates:
                report.errors[part] = "stress-ng reported no metrics for it"


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stress_ng() -> str | None:
    """Path of stress-ng when installed (its load is preferred where present)."""
    return shutil.which("stress-ng")
