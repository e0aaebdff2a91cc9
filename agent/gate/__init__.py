"""gate: runs compared over time — the CI regression gate's statistics and verdicts
(:mod:`.evaluate`), the SQLite run history (:mod:`.history`), the stressed scenario's load
(:mod:`.stress`) and the host fingerprint every run carries (:mod:`.fingerprint`).

May import: agent.stats, agent.outfile, agent.probe (results), collectors, tuning. Never
imports watch or the CLI."""
