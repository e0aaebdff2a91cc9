"""agent.trace.symbols: kernel text addresses to names through a kallsyms table."""

from __future__ import annotations

from agent.trace.symbols import SymbolResolver
from tests.eventpages import load_formats

FMTS = load_formats()
BY_ID = {f.id: f for f in FMTS.values()}


def test_symbol_resolver_nearest_symbol_hex_fallback_and_restricted_addresses():
    text = (b"ffffffff81000000 T _stext\nffffffff815d6170 t vmstat_update\n"
            b"0000000000000000 t hidden_by_kptr_restrict\nffffffffc0000000 d some_data\n")
    res = SymbolResolver(lambda: text)
    assert res(0xFFFFFFFF815D6170) == "vmstat_update"
    assert res(0xFFFFFFFF815D6180) == "vmstat_update"  # inside it
    assert res(0x1234) == "0x1234"  # below every symbol
    assert res(0xFFFFFFFFC0000000) == "0xffffffffc0000000"  # data, not text: not resolved
    empty = SymbolResolver(lambda: None)
    assert empty(0xFFFFFFFF815D6170) == "0xffffffff815d6170"


def test_symbol_resolver_loads_in_the_background():
    res = SymbolResolver(lambda: b"ffffffff815d6170 t vmstat_update\n")
    res.load_async()
    assert res(0xFFFFFFFF815D6170) == "vmstat_update"


TABLE = (b"ffffffff81000000 T _stext\n"
         b"ffffffff81000000 T startup_64\n"          # an alias: the first listed names it
         b"ffffffff815d6170 t vmstat_update\n"
         b"0000000000000000 t hidden_by_kptr_restrict\n"
         b"ffffffff82000000 D some_data\n"
         b"ffffffff814204b0 W hrtimer_wakeup\n"     # out of order: sorted on load
         b"ffffffffc0a01000 t nf_hook\t[nf_tables]\n"
         b"FFFFFFFFC0A02000 t UPPER_hex\t[mod]\n"
         b"ffffffff815d6170 t vmstat_update\n"      # a name listed twice
         b"ffffffffc0a03000 t no_newline_at_the_end")


def test_the_array_parse_equals_the_line_parse():
    from agent.trace.symbols import _parse_lines, parse_kallsyms
    for table in (TABLE, TABLE + b"\n", b"", b"ffffffff81000000 d data_only\n"):
        a, b = parse_kallsyms(table), _parse_lines(table)
        assert list(a[0]) == list(b[0])
        # (the blobs differ in layout, not in the names at their offsets)
        assert [a[2][o:a[2].index(b"\0", o)] for o in a[1]] == \
            [b[2][o:b[2].index(b"\0", o)] for o in b[1]]


def test_the_array_parse_equals_the_line_parse_on_this_kernels_table():
    import pytest

    from agent.trace.symbols import _parse_lines, parse_kallsyms
    try:
        with open("/proc/kallsyms", "rb") as f:
            table = f.read()
    except OSError:
        pytest.skip("no /proc/kallsyms")
    a, b = parse_kallsyms(table), _parse_lines(table)
    assert list(a[0]) == list(b[0])
    assert [a[2][o:a[2].index(b"\0", o)] for o in a[1]] == \
        [b[2][o:b[2].index(b"\0", o)] for o in b[1]]


def test_a_table_of_another_shape_goes_line_by_line():
    # 32-bit addresses after a 64-bit line, and a non-hex address: no array parse of them
    table = b"ffffffff81000000 T _stext\nc1000000 T thirty_two\nzzzzzzzzzzzzzzzz T bad\n"
    res = SymbolResolver(lambda: table)
    assert res(0xC1000010) == "thirty_two"
    assert res(0xFFFFFFFF81000004) == "_stext"


def test_aliases_name_the_first_listed_and_every_name_has_its_address():
    res = SymbolResolver(lambda: TABLE)
    assert res(0xFFFFFFFF81000010) == "_stext"          # not startup_64, listed after it
    assert res(0xFFFFFFFF815D6171) == "vmstat_update"
    assert res(0xFFFFFFFFC0A01008) == "nf_hook"          # the module's tab ends the name
    assert res(0xFFFFFFFFC0A02000) == "UPPER_hex"
    assert res(0xFFFFFFFFC0A03001) == "no_newline_at_the_end"
    assert res(0xFFFFFFFF82000000) == "0xffffffff82000000"  # data, >1 MiB past any text
    res.load_async()
    assert res.address("startup_64") == 0xFFFFFFFF81000000
    assert res.address("hrtimer_wakeup") == 0xFFFFFFFF814204B0
    assert res.address("nf_hook") == 0xFFFFFFFFC0A01000
    assert res.address("vmstat_update") == 0xFFFFFFFF815D6170
    for absent in ("hidden_by_kptr_restrict", "some_data", "vmstat", "update", "nf_tables",
                   "T startup_64"):
        assert res.address(absent) is None


def test_wait_returns_once_the_table_is_loaded_and_at_once_when_none_was_started():
    import threading
    go = threading.Event()

    def slow():
        go.wait(5)
        return b"ffffffff814204b0 t hrtimer_wakeup\n"
    res = SymbolResolver(slow)
    assert res.wait(0)                 # nothing started: nothing to wait for
    res.load_async()
    assert not res.wait(0.01) and not res.ready
    go.set()
    assert res.wait(5) and res.address("hrtimer_wakeup") == 0xFFFFFFFF814204B0


def test_watch_zeroes_its_costs_after_the_symbol_tables_load(monkeypatch, tmp_path):
    """The kernel symbol table's load (a thread from the events' opening) is start-up: the
    session waits for it before the own-cost clocks' zero, so a short run's own CPU is not
    the load's."""
    import os
    from pathlib import Path

    import pytest
    if os.geteuid() != 0 or not Path("/sys/kernel/tracing/instances").is_dir():
        pytest.skip("needs root and tracefs at /sys/kernel/tracing")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    import time

    from typer.testing import CliRunner

    from agent.cli import get_app
    from agent.watch import session
    seen: list[bool] = []
    load = SymbolResolver._load

    def slow_load(self):
        time.sleep(0.4)  # (a table that takes long to read, in its own thread)
        load(self)
    begin = session.WatchSession.begin_costs

    def begin_costs(self):
        seen.append(self.trace.source._symbols.ready)
        begin(self)
    monkeypatch.setattr(SymbolResolver, "_load", slow_load)
    monkeypatch.setattr(session.WatchSession, "begin_costs", begin_costs)
    cpus = sorted(os.sched_getaffinity(0))
    r = CliRunner().invoke(get_app(), [
        "watch", "--probe", "numpy", "--duration", "1", "--trace", "on", "--cpus",
        str(cpus[-1]), "--housekeeping", str(cpus[0]), "--no-history", "--json",
        "--no-live"])
    assert r.exit_code == 0, r.output
    assert seen == [True]
