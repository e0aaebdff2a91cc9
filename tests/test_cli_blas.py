"""hftagent's own numpy starts no BLAS thread pool (agent/cli.py one_blas_thread): OpenBLAS
would start a worker per CPU, each spinning ~0.1 s, on every CPU the process may use; the
variables are put back once numpy has loaded (what hftagent starts inherits the caller's),
and a value the caller set is kept. Each case is a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

CHILD = textwrap.dedent("""
    import os, sys
    import agent.cli, agent.defaults
    if sys.argv[1] == "fix":
        agent.cli.one_blas_thread()
    import numpy as np
    a = np.ones((256, 256)); (a @ a).sum()  # (a BLAS call)
    print(len(os.listdir("/proc/self/task")),
          ",".join(os.environ.get(v, "-") for v in agent.defaults.BLAS_THREAD_VARS))
""")


def _run(mode: str, **env) -> tuple[int, str]:
    e = {k: v for k, v in os.environ.items() if k not in VARS}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=REPO, env=e,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    threads, seen = out.split()
    return int(threads), seen


def test_numpy_loads_without_a_blas_pool_and_the_environment_is_put_back():
    threads, seen = _run("fix")
    assert threads == 1 and seen == "-,-,-"


def test_without_the_finder_openblas_starts_its_pool():
    """What the finder prevents (where numpy's BLAS starts workers: ≥ 2 CPUs, OpenBLAS)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: OpenBLAS starts no worker")
    threads, _ = _run("plain")
    if threads == 1:
        pytest.skip("this numpy's BLAS starts no pool")
    assert threads > 1


def test_a_value_the_caller_set_is_kept():
    threads, seen = _run("fix", OPENBLAS_NUM_THREADS="2")
    assert seen.startswith("2,-,-")
    if len(os.sched_getaffinity(0)) >= 2 and _run("plain")[0] > 1:
        assert threads == 2
