"""Shared test helpers: fixture trees are copied before anything could write to them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
GOLDEN = Path(__file__).resolve().parent / "golden"
TREES = ("vm-dev", "gpu-h200", "synthetic-2socket", "synthetic-tuned")


@pytest.fixture
def tree_copy(tmp_path):
    """Writable copy of a fixture tree: ``tree_copy("synthetic-2socket") -> Path``."""

    def make(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst, symlinks=True)
        return dst

    return make


@pytest.fixture(autouse=True)
def _private_history_db(tmp_path, monkeypatch):
    """Commands record runs in a history DB by default: keep tests out of the user's one."""
    monkeypatch.setenv("HFTAGENT_DB", str(tmp_path / "history.sqlite"))


_AFFINITY = __import__("os").sched_getaffinity(0)  # pytest's own, as it started


@pytest.fixture(autouse=True)
def _restore_affinity():
    """A WatchSession run in-process pins its process (pytest here) to the housekeeping CPUs:
    every test starts and ends with pytest's own affinity, so a later test still sees both
    CPUs of the machine."""
    import os
    if os.sched_getaffinity(0) != _AFFINITY:
        os.sched_setaffinity(0, _AFFINITY)
    yield
    if os.sched_getaffinity(0) != _AFFINITY:
        os.sched_setaffinity(0, _AFFINITY)
