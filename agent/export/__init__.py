"""export: what leaves a watch run for a fleet — the Prometheus families (:mod:`.metrics`),
the /metrics HTTP server with TLS and basic auth (:mod:`.server`), its exporter-toolkit web
config (:mod:`.webconfig`) and node_exporter textfile output (:mod:`.textfile`).

May import: agent.causes, agent.stats, collectors. Never imports watch, probe or the CLI:
watch feeds it through :class:`.metrics.WatchMetrics` (agent/watch/metrics_feed.py)."""
