"""trial: ``hftagent tune try``: which wake-up lever helps on this box, measured.

Wake-up levers help or hurt depending on the box (a PM QoS request, a keep-awake spinner with
a ``pause`` or a busy loop, guest halt-polling): the same lever that halves P99.9 on one host
lengthens it on another. This room measures them instead of recommending one from a rule.

- :mod:`.arms` — the candidate arms (none, isolation, isolation + each lever), which the guest
  supports, the interleaved schedule (every arm once per round, the order shuffled per round
  with a printed seed) and its time estimate;
- :mod:`.levers` — each lever as a context that undoes itself on every way out: isolation
  through tune's own apply/rollback (a journal of its own), halt-polling written back to the
  value it had, PM QoS and keep-awake held by ``hftagent run`` for the probe child only (the
  kernel drops them with it);
- :mod:`.worker` — the probe child: watch's numpy LSTM-shaped probe (or the bundled .tflite
  on LiteRT), open loop at a fixed rate, so idle gaps exist between calls;
- :mod:`.runner` — runs the blocks, levers entered and undone around each, SIGTERM/SIGINT
  turned into an unwinding that undoes what is held;
- :mod:`.table` — each arm's n and P50/P99/P99.9 with distribution-free intervals
  (:func:`agent.stats.quantile_interval`) and the winner rule (lowest P99.9 upper bound; a
  lever not better than isolation alone is never the winner);
- :mod:`.record` — the result into history and into the state file the audit reads
  (tuning/trial_state.py: tuning never imports agent/).

May import: agent.stats, agent.errors, agent.textout, agent.history, agent.watch.probe_worker
(the probe itself), agent.probe (its loop), collectors, tuning. Never the CLI.
"""
