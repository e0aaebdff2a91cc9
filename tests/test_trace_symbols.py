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
