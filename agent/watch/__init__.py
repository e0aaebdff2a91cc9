"""``hftagent watch``: continuous tail-latency attribution.

Modules: options (the command's options checked once into a request), runner (the run with the
exporter, the live view and the stop signals), session (the watch loop: start/step/stop),
config (the frozen WatchConfig; the CPU plan), latency/ (the latency sources: one module
each — the built-in probe, an external client's ring, an attached process — behind one
interface, chosen once), placement (watch's own CPUs: never the source's), wiring (the host
collectors), sampling/ (the collector thread on a housekeeping CPU, Python or native), detect
(spikes), schedule (when each is attributed), attribution/ (spike → ranked named causes +
unexplained residual; events.py: the kernel events' verdicts), records, output and flight
(spike log, flight records), metrics_feed, summary and report, view (live rich view), ring
(fixed-size signal and latency rings), probe_worker (the built-in open-loop probe's own pinned
process), priority (--nice); docs/design.md. Nothing heavy at import.
"""
