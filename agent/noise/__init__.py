"""``hftagent cpus``: choose the inference CPUs from measured noise.

- :mod:`agent.noise.scan`: runs the pinned clock-gap recorder (hftnoise.c, built on first use)
  on a few candidate CPUs at a time, and reads /proc deltas per CPU around each scan;
- :mod:`agent.noise.events`: with ``--trace``, each CPU's lost time attributed exactly from
  kernel events (agent.trace), and the gaps no event explains as ``hw_or_hypervisor``;
- :mod:`agent.noise.rank`: pure: per-CPU figures, the noise verdict, and the ranking that
  honours SMT siblings, the GPU's and NIC's NUMA node and what is already pinned there.
- :mod:`agent.noise.survey`: the whole survey ``cpus`` asks for: every candidate scanned in
  batches, judged and ranked against this host's layout, and the run's document.
"""
