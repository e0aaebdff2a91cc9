"""The watch sampler: reads the collectors' files at ``sample_hz`` into the signal rings.

python (the Python sampler: a thread pinned to a housekeeping CPU runs the collectors each
round), native/ (the native reader: a C helper reads the hot files, the Python side replays its
recorded rounds through the same collectors). :func:`open_sampler` picks one (``--sampler``).
Nothing heavy at import.
"""

from __future__ import annotations

from collections.abc import Callable


def open_sampler(kind: str, collectors: Callable[[], list], hz: float, cpus: list[int], *,
                 capacity_s: float = 30.0, on_result: Callable | None = None,
                 feed_factory: Callable | None = None) -> tuple[object, str | None]:
    """The sampler ``--sampler kind`` asks for, and why the Python one runs where auto fell
    back (None otherwise): ``(sampler, note)``, not started.

    ``auto`` and ``native`` build the native reader's feed first (``feed_factory(period_ns)``,
    default :class:`~agent.watch.sampling.native.feed.Feed`: compiles the helper, maps the
    shared memory), then ``collectors()`` (so the replay plans register their files before
    the helper's first round), then start the helper. Where it cannot run (no C compiler,
    no shared memory, a helper that does not start), ``auto`` falls back to
    :class:`~agent.watch.sampling.python.Sampler` and says why; ``native`` is an
    :class:`~agent.errors.AgentError`. ``python`` builds the Python sampler only. A stop or an
    error while starting leaves no helper and no shared file behind."""
    from agent.errors import AgentError
    from agent.watch.sampling.python import Sampler
    note = None
    feed = None
    kw = {"capacity_s": capacity_s, "on_result": on_result}
    if kind != "python":
        from agent.watch.sampling.native.feed import Feed, NativeUnavailable
        try:
            feed = (feed_factory or Feed)(int(1e9 / hz))
        except NativeUnavailable as exc:
            if kind == "native":
                raise AgentError(str(exc)) from None
            note = f"python (native sampler unavailable: {exc})"
    try:
        cols = collectors()
        if feed is not None:
            from agent.watch.sampling.native.sampler import NativeSampler
            sampler = NativeSampler(cols, feed, hz, cpus, **kw)
            try:
                feed.start(cpus)
                return sampler, None
            except NativeUnavailable as exc:
                feed.close()  # the collectors' files read live from here on
                feed = None
                if kind == "native":
                    raise AgentError(str(exc)) from None
                note = f"python (native sampler unavailable: {exc})"
    except BaseException:
        if feed is not None:
            feed.close()
        raise
    return Sampler(cols, hz, cpus, **kw), note
