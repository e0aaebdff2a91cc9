"""``hftagent watch``: continuous tail-latency attribution.

Modules: session (the watch loop: start/step/stop), config, source (probe worker or external
ring), wiring (the host collectors), sampling/ (the collector thread on a housekeeping CPU,
Python or native), detect (spikes), schedule (when each is attributed), attribution/ (spike →
ranked named causes + unexplained residual; events.py: the kernel events' verdicts), output and flight (spike
log, flight records), metrics_feed, summary, view (live rich view), ring (fixed-size signal
and latency rings), probe_worker (the built-in open-loop probe in its own pinned process);
docs/design.md. Nothing heavy at import.
"""
