"""``hftagent watch``: continuous tail-latency attribution.

Modules: ring (fixed-size signal and latency rings), sampler (collector thread pinned to a
housekeeping CPU), attribution (spike → ranked named causes + unexplained residual),
probe_worker (built-in open-loop probe in its own pinned process), session (the watch loop,
JSONL spike log, flight recorder, summary), view (live rich view). Nothing heavy at import.
"""
