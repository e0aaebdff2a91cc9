"""Mutation test: every parser of a foreign file gets truncated, empty, non-UTF-8, huge,
negative and Unicode-digit inputs, and may only answer with a value or a ParseError.

Host.Reading.map turns a ValueError into an ``error`` reading, so a parser that raises
IndexError, KeyError, OverflowError, RecursionError or MemoryError on a bad file crashes a
whole check family (or watch) instead of reporting one unreadable value. The inputs start from
real files (the fixture trees, captured from real machines) and canned kernel output, and are
mutated deterministically: fixed mutations of every seed, then hypothesis with
``derandomize=True`` (the same examples on every run).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors import cpu, irq, memory, numa, parsers, sched, softirq
from collectors.parsers import MAX_CPUS, ParseError

FIX = Path(__file__).parent / "fixtures"


def _fixture(rel: str) -> bytes:
    for tree in ("vm-dev", "gpu-h200", "synthetic-2socket"):
        p = FIX / tree / rel
        if p.is_file():
            return p.read_bytes()
    raise FileNotFoundError(rel)


def _first_pid_file(name: str) -> bytes:
    proc = FIX / "vm-dev" / "proc"
    for d in sorted(proc.iterdir()):
        if d.name.isdigit() and (d / name).is_file():
            return (d / name).read_bytes()
    raise FileNotFoundError(name)


STAT_LINE = (b"1234 (my (odd) proc) R 1 1 1 0 -1 4194560 50 0 3 0 7 8 0 0 20 0 9 0 100 1000 "
             b"10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 5 0 0 0 0 0")
STATUS = (b"Name:\tpython\nState:\tR (running)\nvoluntary_ctxt_switches:\t12\n"
          b"nonvoluntary_ctxt_switches:\t3\n")
PSI = (b"some avg10=0.00 avg60=0.00 avg300=0.00 total=123\n"
       b"full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")

# Seeds: the real file each parser reads (or the kernel's output format for it).
SEEDS: dict[str, bytes] = {
    "cpulist": b"0-3,8,10-11,1-7:2/4,1-N,all\n",
    "cpumask": b"ffffffff,00000001\n",
    "cmdline": _fixture("proc/cmdline") + b' isolcpus=managed_irq,domain,2-N foo="a b"',
    "isolcpus": b"nohz,domain,managed_irq,1-7:2/4",
    "stat": _fixture("proc/stat"),
    "interrupts": _fixture("proc/interrupts"),
    "softirqs": _fixture("proc/softirqs"),
    "vmstat": _fixture("proc/vmstat"),
    "numastat": _fixture("sys/devices/system/node/node0/numastat"),
    "meminfo": _fixture("proc/meminfo"),
    "swaps": b"Filename\tType\tSize\tUsed\tPriority\n/dev/sda2 partition 8388604 0 -2\n",
    "bracketed": b"always [madvise] never\n",
    "environ": b"PATH=/usr/bin\0HOME=/root\0LANG=C.UTF-8\0",
    "schedstat": b"123456 7890 12\n",
    "task_stat": STAT_LINE,
    "status": STATUS,
    "psi": _fixture("proc/pressure/memory") if (FIX / "vm-dev/proc/pressure/memory").is_file()
    else PSI,
    "pci_speed": b"16.0 GT/s PCIe\n",
    "pci_width": b"16\n",
    "pci_class": b"0x030200\n",
    "aer": b"RxErr 0\nBadTLP 1\nBadDLLP 0\nTOTAL_ERR_COR 1\n",
    "number": b"18446744073709551615",
}
try:
    SEEDS["task_stat_real"] = _first_pid_file("stat")
    SEEDS["status_real"] = _first_pid_file("status")
except FileNotFoundError:
    pass


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")  # as Host.read decodes


# name -> (seed key, parser taking the raw bytes). Every public parser of collectors/parsers.py
# and the watch parse functions of collectors/cpu.py, irq.py, softirq.py, memory.py, numa.py
# and sched.py (their layouts: tests/test_collectors_layout.py).
PARSERS: dict[str, tuple[str, Callable[[bytes], object]]] = {
    "parse_cpulist": ("cpulist", lambda b: parsers.parse_cpulist(_text(b))),
    "parse_cpulist(nr_cpus)": ("cpulist", lambda b: parsers.parse_cpulist(_text(b), 64)),
    "parse_cpulist(MAX_CPUS)": ("cpulist", lambda b: parsers.parse_cpulist(_text(b), MAX_CPUS)),
    "parse_cpu_option": ("cpulist", lambda b: parsers.parse_cpu_option(_text(b), range(16))),
    "parse_cpu_option(nr_cpus)": ("cpulist",
                                  lambda b: parsers.parse_cpu_option(_text(b), [0, 2], 4)),
    "parse_cpumask": ("cpumask", lambda b: parsers.parse_cpumask(_text(b))),
    "parse_cmdline": ("cmdline", lambda b: parsers.parse_cmdline(_text(b))),
    "isolation_cpus(isolcpus)": ("isolcpus", lambda b: parsers.isolation_cpus(_text(b), 16)),
    "isolation_cpus(nohz_full)": ("cpulist", lambda b: parsers.isolation_cpus(
        _text(b), 16, param="nohz_full")),
    "isolation_cpus(rcu_nocbs)": ("cpulist", lambda b: parsers.isolation_cpus(
        _text(b), 16, param="rcu_nocbs")),
    "isolation_cpus(no count)": ("isolcpus", lambda b: parsers.isolation_cpus(_text(b))),
    "parse_proc_stat": ("stat", lambda b: parsers.parse_proc_stat(_text(b))),
    "parse_interrupts": ("interrupts", lambda b: parsers.parse_interrupts(_text(b))),
    "parse_softirqs": ("softirqs", lambda b: parsers.parse_softirqs(_text(b))),
    "parse_kv": ("meminfo", lambda b: parsers.parse_kv(_text(b), ":")),
    "parse_kv(space)": ("vmstat", lambda b: parsers.parse_kv(_text(b))),
    "parse_vmstat": ("vmstat", lambda b: parsers.parse_vmstat(_text(b))),
    "parse_meminfo": ("meminfo", lambda b: parsers.parse_meminfo(_text(b))),
    "parse_bracketed": ("bracketed", lambda b: parsers.parse_bracketed(_text(b))),
    "parse_swaps": ("swaps", lambda b: parsers.parse_swaps(_text(b))),
    "parse_environ": ("environ", parsers.parse_environ),
    "parse_environ(str)": ("environ", lambda b: parsers.parse_environ(
        b.decode("utf-8", errors="surrogateescape"))),
    "parse_schedstat": ("schedstat", lambda b: parsers.parse_schedstat(_text(b))),
    "parse_task_stat": ("task_stat", lambda b: parsers.parse_task_stat(_text(b))),
    "parse_pci_speed": ("pci_speed", lambda b: parsers.parse_pci_speed(_text(b))),
    "parse_pci_width": ("pci_width", lambda b: parsers.parse_pci_width(_text(b))),
    "pci_class_name": ("pci_class", lambda b: parsers.pci_class_name(_text(b))),
    "parse_aer": ("aer", lambda b: parsers.parse_aer(_text(b))),
    "parse_uint": ("number", lambda b: parsers.parse_uint(_text(b))),
    "parse_uint(bytes)": ("number", lambda b: parsers.parse_uint(b)),
    "parse_int": ("number", lambda b: parsers.parse_int(_text(b))),
    "cpu.parse_stat": ("stat", lambda b: cpu.parse_stat(b, None)),
    "cpu.parse_stat(want)": ("stat", lambda b: cpu.parse_stat(b, frozenset([1]))),
    "cpu.parse_freq": ("number", lambda b: cpu.parse_freq(b, "cpu.0.freq_hz")),
    "cpu.parse_count": ("number", lambda b: cpu.parse_count(b, "cpu.0.core_throttle_total")),
    "irq.parse_interrupt_counts": ("interrupts", lambda b: irq.parse_interrupt_counts(b, None)),
    "irq.parse_interrupt_counts(want)": (
        "interrupts", lambda b: irq.parse_interrupt_counts(b, frozenset([1]))),
    "softirq.parse_softirq_counts": ("softirqs", lambda b: softirq.parse_softirq_counts(b)),
    "irq.action_names": ("interrupts", lambda b: [irq.action_names(line)
                                                  for line in _text(b).splitlines()[:50]]),
    "memory.parse_vmstat_counters": ("vmstat", memory.parse_vmstat_counters),
    "memory.parse_psi": ("psi", lambda b: memory.parse_psi(b, "memory")),
    "numa.parse_numastat": ("numastat", lambda b: numa.parse_numastat(b, 0)),
    "sched.parse_schedstat_signals": ("schedstat",
                                      lambda b: sched.parse_schedstat_signals(b, 1)),
    "sched.parse_stat_fields": ("task_stat", sched.parse_stat_fields),
    "sched.parse_status_switches": ("status", sched.parse_status_switches),
}
if "task_stat_real" in SEEDS:
    PARSERS["parse_task_stat(real)"] = ("task_stat_real",
                                        lambda b: parsers.parse_task_stat(_text(b)))
    PARSERS["sched.parse_stat_fields(real)"] = ("task_stat_real", sched.parse_stat_fields)
    PARSERS["sched.parse_status_switches(real)"] = ("status_real",
                                                    sched.parse_status_switches)


def test_every_public_parser_is_fuzzed():
    """A parser added to collectors/parsers.py must be added here too."""
    public = {n for n in dir(parsers) if n.startswith(("parse_", "pci_class"))
              or n == "isolation_cpus"}
    covered = {n.partition("(")[0] for n in PARSERS}
    assert public <= covered, public - covered


def _check_value(v: object, depth: int = 0) -> None:
    """Whatever a parser returns holds no nan/inf float and no absurd CPU id."""
    assert depth < 20
    if isinstance(v, float):
        assert math.isfinite(v), v
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_value(k, depth + 1)
            _check_value(x, depth + 1)
    elif isinstance(v, list | tuple):
        for x in v:
            _check_value(x, depth + 1)
    elif hasattr(v, "__dataclass_fields__"):
        for name in v.__dataclass_fields__:
            _check_value(getattr(v, name), depth + 1)


def _run(name: str, data: bytes) -> None:
    fn = PARSERS[name][1]
    t0 = time.perf_counter()
    try:
        v = fn(data)
    except ParseError:
        pass
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may come out
        raise AssertionError(f"{name} raised {type(exc).__name__}: {exc!s:.200} "
                             f"on {data[:80]!r}… ({len(data)} bytes)") from exc
    else:
        _check_value(v)
        if name.startswith(("parse_cpulist", "parse_cpu_option", "isolation_cpus")):
            assert all(0 <= c < MAX_CPUS for c in v), name  # type: ignore[union-attr]
    took = time.perf_counter() - t0
    assert took < 2.0, f"{name} took {took:.1f} s on {len(data)} bytes"


def _mutations(seed: bytes) -> list[bytes]:
    """Fixed mutations of a seed: truncated, empty, non-UTF-8, huge, negative, Unicode."""
    out = [b"", b"\n", b" ", b"\0", b"\xff\xfe", seed.strip()]
    step = max(1, len(seed) // 24)
    out += [seed[:i] for i in range(1, len(seed), step)]  # truncated anywhere
    out += [seed[i:] for i in range(1, len(seed), step * 3)]  # head cut off
    out += [seed.replace(b"\n", b"", 1), seed.rstrip(b"\n")]  # lines joined, no final \n
    lines = seed.split(b"\n")
    out += [b"\n".join(ln.split(b" ")[0] for ln in lines),  # every line cut to a word
            b"\n".join(ln[:len(ln) // 2] for ln in lines),  # every line cut in half
            b"\n".join(b" ".join(ln.split()[:-1]) for ln in lines),  # last field dropped
            re.sub(rb"[0-9]+", b"nan", seed), re.sub(rb"[0-9]+", b"-inf", seed),
            re.sub(rb"[0-9]+", b"-1", seed), re.sub(rb"[0-9]+", b"4294967295", seed),
            seed.replace(b"3", b"4294967295", 1), seed.replace(b"1", b"18446744073709551616")]
    out += [seed[:len(seed) // 2] + b"\xff\xc3\x28" + seed[len(seed) // 2:],  # bad UTF-8
            seed.replace(b"0", b"\xd9\xa3"),  # Arabic-Indic digit three, in UTF-8
            seed.replace(b"1", "\u00b9".encode()),  # superscript one: isdigit() is True
            seed.replace(b" ", b" -", 3), seed.replace(b"1", b"-1"),  # negative numbers
            seed.replace(b"0", b"nan", 2), seed.replace(b"1", b"inf", 2),
            seed.replace(b"2", b"1e999", 2), seed.replace(b"3", b"1_0", 2),
            seed.replace(b"1", b"9" * 5000, 1),  # a huge number
            seed.replace(b"\n", b"\n\n"), seed.replace(b" ", b"\t"),
            seed.replace(b":", b""), seed.replace(b"=", b""), seed.replace(b"(", b""),
            seed.replace(b")", b""), seed.replace(b",", b",,"), seed.replace(b"-", b"--"),
            seed * 2, seed.upper(), seed.lower()]
    reps = max(1, 200_000 // max(len(seed), 1))
    out += [seed * reps,  # huge file
            seed.rstrip(b"\n") + b" " + b"7" * 200_000,  # a huge last line
            b"9" * 300_000, b"(" * 100_000 + b")" * 100_000, b"," * 200_000,
            b"0-" * 50_000 + b"1", b"\n".join([b"CPU0 CPU1"] + [b"1: 2"] * 50_000)]
    return out


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_fixed_mutations_give_a_value_or_a_parse_error(name):
    seed = SEEDS[PARSERS[name][0]]
    _run(name, seed)
    for data in _mutations(seed):
        _run(name, data)


# Random splices of a seed: bytes inserted, deleted or replaced at a few places.
_NASTY = st.sampled_from([b"", b"-", b"-1", b"\xd9\xa3", b"\xff", b"nan", b"N", b"all",
                          b":", b"/", b",", b"=", b"(", b")", b" ", b"\n", b"\t", b"\0",
                          b"4294967296", b"18446744073709551616", b"x", b"CPU", b"total="])


@st.composite
def _spliced(draw, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        j = draw(st.integers(i, min(len(data), i + 8)))
        data[i:j] = draw(_NASTY | st.binary(max_size=6))
    return bytes(data)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(derandomize=True, max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_splices_give_a_value_or_a_parse_error(name, data):
    seed = SEEDS[PARSERS[name][0]]
    _run(name, data.draw(_spliced(seed[:4000]) | st.binary(max_size=64)))
