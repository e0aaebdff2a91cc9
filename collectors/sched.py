"""Scheduler signals of one thread, and the task-scan records, read through a :class:`Host`.

Sources (per watched thread):
- /proc/<pid>/task/<tid>/schedstat  ns on CPU, ns waiting on a run queue, timeslices
                                    [perf sched latency; cat /proc/PID/task/TID/schedstat]
- /proc/<pid>/task/<tid>/stat       last CPU (field 39) ⇒ migrations; minor/major faults
- /proc/<pid>/task/<tid>/status     voluntary / nonvoluntary context switches
                                    [pidstat -w -t -p PID 1]

Signals (``sched.<tid>.*``; :func:`files`, :func:`parse`, :func:`layout`): ``run_ns``,
``rq_delay_ns``, ``slices``, ``minflt``, ``majflt``, ``nvcsw``, ``nivcsw`` (counters);
``cpu`` (gauge: the CPU the thread last ran on). The watch's sched source
(agent/watch/sampling/sources/sched.py) reads them for the probe's threads and scans every
task for the ones that ran on the probe CPUs (:class:`TaskRun`, :class:`Scan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collectors.host import Host
from collectors.layout import TokenLayout, parser_text
from collectors.parsers import ParseError, parse_schedstat

THREAD_SIGNALS = ("run_ns", "rq_delay_ns", "slices", "minflt", "majflt", "cpu", "nvcsw",
                  "nivcsw")


def signal_keys(tid: int) -> tuple[str, ...]:
    """``sched.<tid>.<signal>`` for :data:`THREAD_SIGNALS`, in that order."""
    return tuple(f"sched.{tid}.{k}" for k in THREAD_SIGNALS)


def files(host: Host, pid: int, tid: int) -> dict[str, Path]:
    """The files of one thread's signals: ``schedstat``, ``stat`` and ``status``."""
    d = host.proc(pid, "task", tid)
    return {"schedstat": d / "schedstat", "stat": d / "stat", "status": d / "status"}


def _stat_uint(tok: bytes, what: str) -> int:
    if not tok.isdigit() or len(tok) > 20:
        raise ParseError(f"bad {what} {tok[:24]!r} in stat")
    return int(tok)


def parse_stat_fields(data: bytes) -> tuple[str, str, int, int, int, int]:
    """/proc/<pid>/task/<tid>/stat bytes → (comm, state, minflt, majflt, utime+stime ticks,
    processor). comm may contain spaces and ')' — split at the last ')'. Pure; raises
    :class:`~collectors.parsers.ParseError` on a truncated or garbled file."""
    lp, r = data.find(b"("), data.rfind(b")")
    if lp < 0 or r < lp:
        raise ParseError("bad stat: no (comm)")
    comm = data[lp + 1:r].decode(errors="replace")
    rest = data[r + 2:].split()
    if len(rest) < 37 or len(rest[0]) != 1 or not rest[0].isalpha():
        raise ParseError("truncated stat")
    return (comm, rest[0].decode(), _stat_uint(rest[7], "minflt"),
            _stat_uint(rest[9], "majflt"),
            _stat_uint(rest[11], "utime") + _stat_uint(rest[12], "stime"),
            _stat_uint(rest[36], "processor"))


def parse_status_switches(data: bytes) -> tuple[int, int]:
    """/proc/<pid>/status bytes → (voluntary, nonvoluntary) context switches. Pure; raises
    :class:`~collectors.parsers.ParseError` when a line is missing or not a count."""

    def value(key: bytes) -> int:
        i = data.find(key)
        if i < 0:
            raise ParseError("no ctxt_switches lines in status")
        i += len(key)
        j = data.find(b"\n", i)
        v = data[i:] if j < 0 else data[i:j]  # the last line may lack its newline
        v = v.strip(b" \t")
        if not v.isdigit() or len(v) > 20:
            raise ParseError(f"bad {key.strip()!r} value {v[:24]!r} in status")
        return int(v)

    return value(b"\nvoluntary_ctxt_switches:"), value(b"\nnonvoluntary_ctxt_switches:")


# -- one file each: signals and token layouts --------------------------------------------------

def parse_schedstat_signals(data: bytes, tid: int) -> dict[str, float]:
    """schedstat bytes → ``run_ns``, ``rq_delay_ns``, ``slices`` (collectors.parsers
    parse_schedstat). Pure."""
    run, wait, slices = parse_schedstat(parser_text(data, "schedstat"))
    p = f"sched.{tid}."
    return {p + "run_ns": float(run), p + "rq_delay_ns": float(wait), p + "slices": float(slices)}


def parse_stat_signals(data: bytes, tid: int) -> dict[str, float]:
    """task stat bytes → ``minflt``, ``majflt``, ``cpu`` (:func:`parse_stat_fields`). Pure."""
    _, _, minflt, majflt, _, cpu = parse_stat_fields(data)
    p = f"sched.{tid}."
    return {p + "minflt": float(minflt), p + "majflt": float(majflt), p + "cpu": float(cpu)}


def parse_status_signals(data: bytes, tid: int) -> dict[str, float]:
    """status bytes → ``nvcsw``, ``nivcsw`` (:func:`parse_status_switches`). Pure."""
    v, n = parse_status_switches(data)
    return {f"sched.{tid}.nvcsw": float(v), f"sched.{tid}.nivcsw": float(n)}


def schedstat_layout(data: bytes, tid: int) -> TokenLayout | None:
    """The layout of a schedstat read: its first three tokens. Pure."""
    n = len(data.split())
    return TokenLayout.of(data, (), (), (0, 1, 2), signal_keys(tid)[0:3]) if n >= 3 else None


def stat_layout(data: bytes, tid: int) -> TokenLayout | None:
    """The layout of a task stat read: pid and comm are names (a renamed thread is another
    layout), minflt, majflt and processor the values. None when the bytes after ')' are not
    the tokens :func:`parse_stat_fields` reads (no space after it). Pure."""
    r = data.rfind(b")")
    if r < 0 or data[r + 1:r + 2] not in (b" ", b"\t", b"\n"):
        return None
    head = data[:r + 1].split()
    nh, rest = len(head), data[r + 2:].split()
    if len(rest) < 37:
        return None
    return TokenLayout.of(data, range(nh), head, (nh + 7, nh + 9, nh + 36),
                          signal_keys(tid)[3:6])


def status_layout(data: bytes, tid: int) -> TokenLayout | None:
    """The layout of a status read: the two ctxt_switches lines' names and values. Pure."""
    tok = data.split()
    try:
        i, j = tok.index(b"voluntary_ctxt_switches:"), tok.index(b"nonvoluntary_ctxt_switches:")
    except ValueError:
        return None
    if max(i, j) + 1 >= len(tok):
        return None
    return TokenLayout.of(data, (i, j), (tok[i], tok[j]), (i + 1, j + 1), signal_keys(tid)[6:8])


_PARSE = {"schedstat": parse_schedstat_signals, "stat": parse_stat_signals,
          "status": parse_status_signals}
_LAYOUT = {"schedstat": schedstat_layout, "stat": stat_layout, "status": status_layout}


def parse_file(key: str, data: bytes, tid: int) -> dict[str, float]:
    """The signals of one of :func:`files`' (``key``: schedstat, stat or status). Pure."""
    return _PARSE[key](data, tid)


def parse(reads: dict[str, bytes], tid: int) -> dict[str, float]:
    """One thread's signals from a read of :func:`files` (any of the three). Pure."""
    out: dict[str, float] = {}
    for key, data in reads.items():
        out.update(_PARSE[key](data, tid))
    return out


def layout(key: str, data: bytes, tid: int) -> TokenLayout | None:
    """The token layout of one of :func:`files`' reads. Pure."""
    return _LAYOUT[key](data, tid)


# -- the task scan's records -------------------------------------------------------------------

@dataclass(frozen=True)
class TaskRun:
    """A task that consumed CPU on a watched CPU between two scans."""

    tid: int
    pid: int
    comm: str
    cpu: int
    run_ns: int
    state: str


@dataclass
class Scan:
    t_ns: int  # CLOCK_MONOTONIC at the end of the scan
    prev_t_ns: int
    runs: list[TaskRun]
