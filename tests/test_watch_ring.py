"""SignalRing.window: the binary search on rows in time order against the full pass."""


def test_window_by_binary_search_is_the_full_pass():  # issue #38
    import numpy as np

    from agent.watch.ring import SignalRing
    g = np.random.default_rng(5)
    for cap, rows in ((7, 5), (7, 7), (7, 23), (50, 333), (100, 333)):
        r = SignalRing("x", capacity=cap)
        t, last_b = 1000, 0
        for _ in range(rows):
            a = t + int(g.integers(0, 3))  # gaps, touching, equal and overlapping stamps
            b = last_b = max(last_b, a + int(g.integers(0, 20)))
            r.append(a, b, {"v": 1.0})
            t = b if g.random() < 0.5 else a
        for _ in range(300):
            lo = int(g.integers(900, t + 50))
            hi = lo + int(g.integers(-5, 60))
            idx = r._order()
            want = idx[(r.t1[idx] >= lo) & (r.t0[idx] <= hi)]
            got = r.window(lo, hi)
            assert r._in_order() and got.tolist() == want.tolist(), (cap, rows, lo, hi)
            first, count = r.span(lo, hi)  # the same rows as two ints
            assert [(first + k) % cap for k in range(count)] == want.tolist()
    r = SignalRing("y", capacity=8)
    for a, b in ((10, 20), (20, 30), (5, 40), (40, 50)):  # out of order: the full pass
        r.append(a, b, {"v": 1.0})
    assert not r._in_order() and r.span(6, 9) is None
    assert r.window(6, 9).tolist() == [2] and r.window(25, 45).tolist() == [1, 2, 3]
    for n in (10, 90):  # a row out of order among a few new rows, and among many
        r = SignalRing("z", capacity=200)
        for i in range(n):
            r.append(i * 10 - (25 if i == n - 3 else 0), i * 10 + 10, {"v": 1.0})
        assert not r._in_order()


def test_cols_at_is_a_slice_where_the_columns_are_contiguous_and_follows_new_columns():
    """RingView.hot's array pass reads a prefix's columns as a slice where they are
    contiguous (a CPU's interrupt rows, added together), else by index; a new column is
    seen at the next call."""
    import numpy as np

    from agent.watch.ring import SignalRing
    r = SignalRing("irq", capacity=8)
    r.append(0, 1, {"irq.1.a": 1.0, "irq.1.b": 2.0, "irq.2.a": 3.0})
    names, cols = r.cols_at("irq.1.")
    assert names == ["irq.1.a", "irq.1.b"] and cols == slice(0, 2)
    r.append(1, 2, {"irq.1.c": 4.0})
    names, cols = r.cols_at("irq.1.")
    assert names == ["irq.1.a", "irq.1.b", "irq.1.c"] and isinstance(cols, np.ndarray)
    assert cols.tolist() == [0, 1, 3] and r.cols_at("irq.3.")[0] == []


def _gone_for(r, n: int, t: int, values: dict) -> int:
    for _ in range(n):
        r.append(t, t + 1, values)
        t += 1
    return t


def test_a_full_ring_gives_a_gone_signals_column_to_a_new_one():
    """An exited thread's sched.<tid>.* columns: once no held row has a value in one, a new
    signal takes it (a service restarted for days keeps rows for its new threads); until
    then a new signal is refused, as before, and a column holding data is never taken."""
    import numpy as np

    from agent.watch.ring import SignalRing
    r = SignalRing("sched", capacity=10, max_signals=4)
    t = _gone_for(r, 3, 0, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0})
    layout = r.layout
    t = _gone_for(r, 10, t, {"b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0})  # a's in the ring
    assert "e" not in r.cols and r.dropped_signals == 10 and r.layout == layout
    ia = r.cols["a"]
    t = _gone_for(r, 1, t, {"b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0})  # a's rows all gone
    assert "a" not in r.cols and r.cols["e"] == ia and r.reused_signals == 1
    assert r.layout == layout + 1 and r.dropped_signals == 10
    col = r.data[r._order(), ia]
    assert col[-1] == 5.0 and np.isnan(col[:-1]).all()  # a's old values none of e's
    idx = r.window(0, t)
    assert r.column("a", idx).tolist() == [] or np.isnan(r.column("a", idx)).all()
    assert [n for n, _ in r.cols_like("")] == ["e", "b", "c", "d"]  # in column order
    for k in ("b", "c", "d"):  # the live signals kept their columns and values
        assert (r.column(k, idx) == {"b": 2.0, "c": 3.0, "d": 4.0}[k]).all()


def test_a_column_is_not_given_away_under_the_row_that_writes_its_signal():
    """The gone signal comes back in the very row that brings a new one: it keeps its
    column (the new one is refused this row), and neither value lands in the other's."""
    from agent.watch.ring import SignalRing
    r = SignalRing("sched", capacity=6, max_signals=2)
    t = _gone_for(r, 1, 0, {"a": 1.0, "b": 2.0})
    t = _gone_for(r, 6, t, {"b": 2.0})
    r.append(t, t + 1, {"a": 7.0, "e": 9.0})
    assert set(r.cols) == {"a", "b"} and r.dropped_signals == 1
    assert r.data[(r.rows - 1) % r.capacity, r.cols["a"]] == 7.0


def test_the_fast_row_path_forgets_a_given_away_column():
    """append_seqs keeps each key tuple's columns across batches: a column given to
    another signal since is not written with the old key's values."""
    import numpy as np

    from agent.watch.ring import DeltaTracker, SignalRing
    r = SignalRing("sched", capacity=4, max_signals=3)
    tr = DeltaTracker(lambda n: True)
    keys = ("x", "y")
    for b in range(2):  # (the first batch makes the columns, the second keeps them)
        r.append_seqs([(i, i + 1, (10.0 * i, 20.0 * i)) for i in range(2 * b, 2 * b + 2)],
                      keys, tr)
    assert r._seqs  # the fast path's columns kept
    t = _gone_for(r, 4, 10, {"w": 1.0})
    r.append(t, t + 1, {"w": 1.0, "z": 5.0})  # x's or y's column now z's
    gave = {"x", "y"} - set(r.cols)
    assert len(gave) == 1 and r.reused_signals == 1
    r.append_seqs([(t + i, t + 1 + i, (10.0 * i, 20.0 * i)) for i in (4, 5)], keys, tr)
    r.append(t + 9, t + 10, {"w": 1.0, "z": 6.0})
    z = r.column("z", r._order())
    assert z[~np.isnan(z)].tolist() == [5.0, 6.0]  # z's own values only


def test_a_signal_silent_for_stale_s_gives_its_column_and_its_held_values_go():
    """A restart by name: the old thread's last rows are still held when the new thread's
    first row comes after a gap with no rows (its row spans the gap). Its columns go to
    the new thread once it had no value for stale_s (5 s), its held values with them;
    a signal with a value inside the 5 s keeps its column."""
    import numpy as np

    from agent.watch.ring import SignalRing
    ms = 1_000_000
    r = SignalRing("sched", capacity=1000, max_signals=3)
    for k in range(100):  # 1 s of rows, 10 ms each
        r.append(k * 10 * ms, (k + 1) * 10 * ms, {"old": 1.0, "b": 2.0, "c": 3.0})
    t = 1000 * ms
    r.append(t, t + 4000 * ms, {"b": 2.0, "new": 5.0})  # 4 s on: "old" had a value lately
    assert "new" not in r.cols and r.dropped_signals == 1
    for k in range(50):  # (the look for a silent column: once in capacity // 30 rows)
        t += 4500 * ms if not k else 10 * ms
        r.append(t, t + 10 * ms, {"b": 2.0})
    t += 10 * ms
    r.append(t, t + 10 * ms, {"b": 2.0, "new": 5.0})  # 5.01 s on: c, old silent
    assert r.reused_signals == 1 and "new" in r.cols and len(r.cols) == 3
    gone = ({"old", "c"} - set(r.cols)).pop()
    col = r.column("new", r._order())
    assert col[-1] == 5.0 and np.isnan(col[:-1]).all()  # the gone signal's values dropped
    assert r.column(gone, r._order()).size == 0 or np.isnan(r.column(gone, r._order())).all()
    assert (r.column("b", r._order()) == 2.0).all()


def test_a_retired_signal_gives_its_column_stale_s_later_before_the_ring_grows():
    """Not full: a signal merely silent (a GPU's clocks, read every 10 s while the probe is
    on no GPU) keeps its column and the ring grows; one its collector retired (an exited
    thread's) gives its column to a new signal 5 s after, not before, and not if it had a
    value since."""
    from agent.watch.ring import SignalRing
    s = 1_000_000_000
    r = SignalRing("sched", capacity=64, max_signals=64)
    names = [f"s{k}" for k in range(8)]  # the ring's first width
    r.append(0, s, dict.fromkeys(names, 1.0))
    r.append(s, 7 * s, {"s1": 1.0})  # the others silent 6 s
    r.append(7 * s, 8 * s, {"s1": 1.0, "new": 2.0})
    assert r.width == 16 and r.cols["new"] == 8 and not r.reused_signals
    r.retire(["s2", "s3", "s4"], 8 * s)
    r.append(9 * s, 10 * s, {"s3": 1.0})  # (s3: a value after all)
    for k in range(7):  # fill the width
        r.append(10 * s, 11 * s, {f"fill{k}": 1.0})
    r.append(11 * s, 12 * s, {"early": 1.0})  # 4 s after: the ring grows
    assert r.width == 32 and r.cols["early"] == 16 and not r.reused_signals
    for k in range(15):  # fill the width again
        r.append(12 * s, 13 * s, {f"fill{k + 7}": 1.0})
    r.append(13 * s, 14 * s, {f"late{k}": 1.0 for k in range(3)})  # 5 s after: s2's and
    assert r.reused_signals == 2 and r.width == 64  # s4's columns, then the ring grows
    assert "s2" not in r.cols and "s4" not in r.cols and "s3" in r.cols
    assert [r.cols[f"late{k}"] for k in range(3)] == [2, 4, 32]
    assert (r.column("late0", r._order()) == 1.0).sum() == 1  # s2's values dropped
