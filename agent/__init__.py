"""agent: orchestration — the CLI, probe, watch loop, attribution, exporter, history, gate."""
