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
