"""gate: runs compared over time — the CI regression gate's statistics and verdicts
(:mod:`.evaluate`), the stressed scenario's load (:mod:`.stress`) and the host fingerprint
every run carries (:mod:`.fingerprint`). The runs themselves are kept by agent/history/.

May import: agent.stats, agent.outfile, agent.probe (results), collectors, tuning. Never
imports watch, history or the CLI (history imports the fingerprint; the gate command joins
the two)."""
