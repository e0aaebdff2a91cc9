"""agent: orchestration, one folder per capability.

- ``cli.py`` and ``commands/``: the typer CLI, one thin module per command;
- ``probe/``: the warmed, fixed-shape TF/LiteRT inference probe (``hftagent probe``);
- ``watch/``: continuous attribution (session, detection, sampling, ``attribution/`` which
  owns every verdict, the kernel-event verdicts included);
- ``trace/``: tracefs, the event model and timeline walk, interrupt cost, uprobe attach
  (shared by watch, cpus and attach);
- ``noise/``: ``hftagent cpus`` (noise-ranked CPUs);
- ``export/``: Prometheus metrics, the /metrics server, web config, textfile;
- ``gate/``: the CI gate, run history, stress load, host fingerprint;
- leaves every room may use: ``causes.py`` (the cause list), ``stats.py``, ``client.py`` (the
  public latency client), ``outfile.py`` (the one output opener), ``fixscript.py``,
  ``render.py``, ``plot.py``, ``errors.py``, ``defaults.py``.

Imports run one way: commands → watch/probe/noise/gate → trace/export → leaves →
tuning → collectors. No loops between the rooms (tests/test_layers.py checks it).
"""
