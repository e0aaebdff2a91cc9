"""Token layouts against the parsers they stand in for: a differential test.

Each collector module pairs a parser (built on collectors/parsers.py, the audit's) with a
layout builder (collectors/<source>.py ``*_layout``); watch's samplers take a read's values
from the layout while the read has its shape, and the C reader applies the same layout. The two
paths must give the same rows on the fixtures (real captures and synthetic trees, every CPU
filter) and refuse the same garbage: a value the parsers refuse ("nan", "-5", "+7", "1e9", "٣",
21 digits, ...) in any token the layout reads is refused by both, a changed name or token count
sends the layout back to the parser, and on the parser fuzzing corpus
(tests/test_parser_mutation.py) a layout's values, when it gives any, are the parser's.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors import cpu, irq, memory, numa, sched, softirq
from collectors.layout import TokenLayout
from collectors.parsers import ParseError
from tests.test_parser_mutation import STAT_LINE, STATUS, _mutations, _spliced

FIX = Path(__file__).parent / "fixtures"
TREES = sorted(d for d in FIX.iterdir() if (d / "proc").is_dir())


@dataclass(frozen=True)
class Source:
    """A file kind: its parser and layout builder (``want``: the CPU filter, or None), where
    to find samples, and ``strict``: the layout reads every token the parser validates, so
    a parser refusal is a layout refusal too (else only: where both give a row, the same)."""

    rel: str | None
    parse: Callable[[bytes, frozenset[int] | None], dict]
    build: Callable[[bytes, frozenset[int] | None], TokenLayout | None]
    strict: bool
    per_cpu: bool = False
    seeds: tuple[bytes, ...] = ()


def _live_task_files() -> dict[str, bytes]:
    """This thread's schedstat, stat and status from the live /proc (read only)."""
    out = {}
    d = Path(f"/proc/self/task/{threading.get_native_id()}")
    for name in ("schedstat", "stat", "status"):
        try:
            out[name] = (d / name).read_bytes()
        except OSError:
            pass
    return out


LIVE = _live_task_files()

SOURCES = {
    "stat": Source("proc/stat", cpu.parse_stat, cpu.stat_layout, strict=False, per_cpu=True),
    "interrupts": Source("proc/interrupts", lambda d, w: irq.parse_interrupt_counts(d, w)[0],
                         irq.interrupts_layout, strict=True, per_cpu=True),
    "softirqs": Source("proc/softirqs", softirq.parse_softirq_counts, softirq.softirqs_layout,
                       strict=True, per_cpu=True),
    "vmstat": Source("proc/vmstat", lambda d, w: memory.parse_vmstat_counters(d),
                     lambda d, w: memory.vmstat_layout(d), strict=False),
    "psi": Source("proc/pressure/memory", lambda d, w: memory.parse_psi(d, "memory"),
                  lambda d, w: memory.psi_layout(d, "memory"), strict=False,
                  seeds=(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=123\n",)),
    "numastat": Source("sys/devices/system/node/node0/numastat",
                       lambda d, w: numa.parse_numastat(d, 0),
                       lambda d, w: numa.numastat_layout(d, 0), strict=True),
    "schedstat": Source(None, lambda d, w: sched.parse_schedstat_signals(d, 7),
                        lambda d, w: sched.schedstat_layout(d, 7), strict=True,
                        seeds=(b"123456 7890 12\n", *[LIVE[k] for k in ("schedstat",)
                                                       if k in LIVE])),
    "task stat": Source(None, lambda d, w: sched.parse_stat_signals(d, 7),
                        lambda d, w: sched.stat_layout(d, 7), strict=False,
                        seeds=(STAT_LINE, *[LIVE[k] for k in ("stat",) if k in LIVE])),
    "status": Source(None, lambda d, w: sched.parse_status_signals(d, 7),
                     lambda d, w: sched.status_layout(d, 7), strict=False,
                     seeds=(STATUS, *[LIVE[k] for k in ("status",) if k in LIVE])),
}


def _samples(src: Source) -> list[tuple[str, bytes]]:
    out = [(f"seed{i}", s) for i, s in enumerate(src.seeds)]
    if src.rel is not None:
        out += [(t.name, (t / src.rel).read_bytes()) for t in TREES if (t / src.rel).is_file()]
    return out


CASES = [(name, label) for name, src in SOURCES.items() for label, _ in _samples(src)]
WANTS = (None, frozenset([1]), frozenset([0, 3]))


def _sample(name: str, label: str) -> bytes:
    return dict(_samples(SOURCES[name]))[label]


def _agree(src: Source, lay: TokenLayout, data: bytes, want) -> None:
    """Where the layout gives values, the parser gives the same row."""
    lv = lay.values(data)
    try:
        pv = src.parse(data, want)
    except ParseError:
        assert lv is None or not src.strict, f"the layout took what the parser refuses: {lv}"
        return
    assert lv is None or lv == pv


def test_every_source_has_samples_from_the_fixtures():
    for name, src in SOURCES.items():
        assert _samples(src), name
    assert len([c for c in CASES if c[0] == "stat"]) >= 6  # every tree


@pytest.mark.parametrize(("name", "label"), CASES)
def test_layout_rows_are_the_parsers_rows(name, label):
    src, data = SOURCES[name], _sample(name, label)
    for want in WANTS if src.per_cpu else (None,):
        lay = src.build(data, want)
        assert lay is not None, (name, label, want)
        row = src.parse(data, want)
        assert row and lay.values(data) == row, (name, label, want)
        assert set(lay.keys) == set(row)


GARBAGE = (b"nan", b"-5", b"+7", b"1e9", b"inf", b"12x", b"1_0", b"0x10", "٣".encode(),
           "¹".encode(), b"9" * 21, b"-", b"1.5")
_TOKEN = re.compile(rb"\S+")


def _with_token(data: bytes, pos: int, new: bytes) -> bytes:
    """``data`` with its ``pos``-th whitespace-separated token replaced by ``new``."""
    for i, m in enumerate(_TOKEN.finditer(data)):
        if i == pos:
            return data[:m.start()] + new + data[m.end():]
    raise IndexError(pos)


def _positions(lay: TokenLayout, limit: int = 40) -> list[int]:
    """Value positions to mutate: all of them, or ``limit`` spread over the file."""
    pos = list(lay.val_pos)
    step = max(1, len(pos) // limit)
    return pos[::step]


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_garbage_in_a_value_the_layout_reads_is_refused_by_both(name):
    src = SOURCES[name]
    _, data = _samples(src)[0]
    lay = src.build(data, None)
    for pos in _positions(lay):
        i = lay.val_pos.index(pos)
        prefix = lay.prefixes[i]
        for g in GARBAGE:
            if lay.signed and re.fullmatch(rb"-[0-9]{1,20}", g):
                continue  # a number in a signed file (below)
            bad = _with_token(data, pos, prefix + g)
            assert lay.values(bad) is None, (name, pos, g)
            if name == "interrupts" and not lay.keys[i].split(".")[2].isdigit():
                # parse_interrupts reads a named row's counts up to the first non-count: LOC
                # with garbage in CPU1's column is a one-column row (as ERR is), not an
                # error. The watch then follows the parser, layout and all.
                try:
                    row = src.parse(bad, None)
                except ParseError:
                    continue
                assert src.build(bad, None).values(bad) == row
                continue
            with pytest.raises(ParseError):
                src.parse(bad, None)
        # a name where a value was: refused; a value out of range for a u64 string: refused
        assert lay.values(_with_token(data, pos, prefix + b"9" * 21)) is None
    if lay.signed:  # /proc/vmstat: parse_vmstat reads values with parse_int
        pos = lay.val_pos[0]
        ok = _with_token(data, pos, b"-5")
        assert lay.values(ok) == src.parse(ok, None)
        assert lay.values(ok)[lay.keys[0]] == -5.0


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_a_changed_name_or_token_count_sends_the_layout_back_to_the_parser(name):
    src = SOURCES[name]
    _, data = _samples(src)[0]
    lay = src.build(data, None)
    for pos in lay.name_pos[::max(1, len(lay.name_pos) // 20)]:
        renamed = _with_token(data, pos, b"x" + data.split()[pos])
        assert lay.values(renamed) is None, (name, pos)
        _agree(src, lay, renamed, None)
    longer = data.rstrip(b"\n") + b" 1\n"
    assert lay.values(longer) is None
    _agree(src, lay, longer, None)


def test_the_reported_cases_are_refused_by_both():
    """What float() and the short-row handling let through before: PSI total=nan, -5 and
    1e9; a softirq row with fewer counts than CPUs; a short numbered /proc/interrupts row
    starting with a digit (it became an irq.all.<n> total); a /proc/stat field "nan" or
    "-5"; a schedstat "nan"."""
    psi = SOURCES["psi"]
    good = b"some avg10=0.00 avg60=0.00 avg300=0.00 total=123\n"
    lay = psi.build(good, None)
    for total in (b"nan", b"-5", b"1e9"):
        bad = good.replace(b"total=123", b"total=" + total)
        assert lay.values(bad) is None
        with pytest.raises(ParseError):
            psi.parse(bad, None)
    soft = b"   CPU0   CPU1\n  HI: 1 2\nNET_RX: 5 6\n"
    lay = softirq.softirqs_layout(soft)
    short = soft.replace(b"5 6", b"5 ")
    assert lay.values(short) is None and softirq.softirqs_layout(short) is None
    with pytest.raises(ParseError, match="1 counts for 2 CPUs"):
        softirq.parse_softirq_counts(short)
    ints = b"CPU0 CPU1\n 5: 3 4 IO-APIC x\n 6: 7 8\nERR: 1\n"
    lay = irq.interrupts_layout(ints)
    for short in (b"CPU0 CPU1\n 5: 3 IO-APIC x 9\n 6: 7 8\nERR: 1\n",  # same token count
                  b"CPU0 CPU1\n 5: 3\n 6: 7 8\nERR: 1\n"):
        assert lay.values(short) is None
        with pytest.raises(ParseError, match="row '5'"):
            irq.parse_interrupt_counts(short)
    stat = _sample("stat", "vm-dev")
    lay = cpu.stat_layout(stat, frozenset([1]))
    line = next(ln for ln in stat.split(b"\n") if ln.startswith(b"cpu1 "))
    for g in (b"nan", b"-5"):
        f = line.split()
        bad = stat.replace(line, b" ".join([f[0], g, *f[2:]]))
        assert lay.values(bad) is None
        with pytest.raises(ParseError):
            cpu.parse_stat(bad, frozenset([1]))
    lay = sched.schedstat_layout(b"1 2 3\n", 7)
    assert lay.values(b"nan 2 3\n") is None
    with pytest.raises(ParseError):
        sched.parse_schedstat_signals(b"nan 2 3\n", 7)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_on_the_fuzzing_corpus_a_layout_gives_the_parsers_row_or_nothing(name):
    src = SOURCES[name]
    for _, data in _samples(src)[:2]:
        lay = src.build(data, None)
        for bad in _mutations(data[:20000]):
            _agree(src, lay, bad, None)
        if src.per_cpu:
            lay1 = src.build(data, frozenset([1]))
            for bad in _mutations(data[:20000])[:40]:
                if lay1.values(bad) is not None:
                    assert lay1.values(bad) == src.parse(bad, frozenset([1]))


STRICT = sorted(n for n, s in SOURCES.items() if s.strict)


@pytest.mark.parametrize("name", STRICT)
@settings(derandomize=True, max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_splices_give_the_parsers_row_or_nothing(name, data):
    """For the files whose every validated token a layout reads, a splice the layout takes is
    one the parser takes, with the same row; one the parser refuses, the layout refuses."""
    src = SOURCES[name]
    seed = _samples(src)[0][1]
    seed = seed[:seed.rfind(b"\n", 0, 4000) + 1] or seed  # whole lines: a file it parses
    lay = src.build(seed, None)
    _agree(src, lay, data.draw(_spliced(seed)), None)


def test_non_ascii_spaces_and_control_characters_are_parse_errors():
    """str.split() and splitlines() (the parsers) break at characters bytes.split() (the
    layouts) does not: such a read is refused rather than tokenised two ways."""
    data = _sample("softirqs", "vm-dev")
    for ch in ("\u00a0", "\u2028", "\x1c", "\r", "\x0b"):
        bad = data.replace(b" ", ch.encode(), 1)
        with pytest.raises(ParseError):
            softirq.parse_softirq_counts(bad)


def test_a_cpu_filter_that_matches_no_column_is_an_empty_row_not_a_parse_each_time():
    """A layout that keeps no value (the probe CPU is not in this file's header) gives an
    empty row, as the parser does, not None (which would send every read to the parser)."""
    data = _sample("softirqs", "vm-dev")
    lay = softirq.softirqs_layout(data, frozenset([7]))
    assert lay.values(data) == {} == softirq.parse_softirq_counts(data, frozenset([7]))
