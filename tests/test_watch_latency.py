"""agent/watch/latency/ (issue #37 item 1): one module per latency source behind one
interface, chosen once when the options are built, the config frozen after; a process's CPUs
by one rule; adding a source is adding a file. (tests/test_layers.py: nothing outside the room
compares a source's kind.)"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.watch import latency, options
from agent.watch.config import plan
from agent.watch.latency import Given
from agent.watch.latency.attached import Attached
from agent.watch.latency.probe import BuiltinProbe
from agent.watch.latency.ring import ClientRing
from collectors.host import Host

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def pinned():
    """A child of the test pinned to its last CPU, with a second thread (the process's CPUs
    are its threads')."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    code = ("import os, sys, threading, time\n"
            f"os.sched_setaffinity(0, {{{cpu}}})\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p.pid, cpu
    p.kill()
    p.wait()


def test_each_source_is_chosen_by_its_own_options():
    host = Host()
    me = os.getpid()
    assert latency.choose(host, Given()) == BuiltinProbe("tf", rate_hz=0.0)
    assert latency.choose(host, Given(probe="numpy", rate_hz=200.0)) == \
        BuiltinProbe("numpy", rate_hz=200.0)
    assert latency.choose(host, Given(pid=me)) == ClientRing(me)
    # --pid with --probe tf is the process's ring, as before the room
    assert latency.choose(host, Given(probe="tf", pid=me)) == ClientRing(me)
    src = latency.choose(host, Given(attach=me, attach_symbol="libc.so.6:nanosleep",
                                     unsafe_return=True))
    assert isinstance(src, Attached) and (src.pid, src.symbol, src.runtime) == \
        (me, "libc.so.6:nanosleep", "auto")
    assert [c.__name__ for c in latency.sources()] == ["Service", "Attached", "ClientRing",
                                                      "BuiltinProbe"]


@pytest.mark.parametrize("given,needle", [
    (Given(probe="gpu"), "--probe must be tf, numpy or external, not 'gpu'"),
    (Given(probe="external"), "--probe external needs --pid or --ring"),
    (Given(probe="numpy", model="lstm"), "--model is for --probe tf, not --probe numpy"),
    (Given(pid=os.getpid(), variant="xla"), "--variant is for --probe tf, not --probe external"),
    (Given(attach_symbol="a:b"), "--attach-symbol is for --attach"),
    (Given(attach=os.getpid(), ring="/tmp/r"), "--attach and --ring name two latency sources"),
    (Given(attach=-3), "--attach -3: a PID is a positive number"),
])
def test_a_source_checks_its_options_and_the_others_refuse_theirs(given, needle):
    with pytest.raises(AgentError, match=needle.replace("(", r"\(")):
        latency.choose(Host(), given)


def test_the_config_is_frozen_and_a_run_keeps_what_it_learns():
    """The source wrote the worker's pid, the chosen rate and the process's CPUs into the
    "checked once" config; now they are the running source's."""
    req = options.build(Host(), probe="numpy")
    cfg = req.cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.probe_cpus = [0]  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.source.rate_hz = 100.0  # type: ignore[misc]
    run = cfg.source.open(Host(), cfg.probe_cpus, [])
    run.pid, run.rate_hz = 4242, 113.0  # what a started worker reports
    assert cfg.source.pid is None and cfg.source.rate_hz == 0.0
    assert run.summary(_EmptyLat())["rate_hz"] == 113.0


class _EmptyLat:
    capacity = 1

    def last(self, n):
        import numpy as np

        from agent.client import FIELDS
        return np.zeros((0, len(FIELDS)), dtype=np.int64)


def test_a_process_s_cpus_are_decided_by_one_rule(pinned):
    """--attach and --pid: the CPUs the process's threads may run on (before: the main
    thread's affinity when the options were checked, then the threads' union again at start,
    with the housekeeping CPUs recomputed from os.cpu_count())."""
    pid, cpu = pinned
    host = Host()
    for src in (latency.choose(host, Given(attach=pid)), ClientRing(pid)):
        p = plan(host, src)
        assert p.probe == [cpu] and cpu not in p.housekeeping, (src, p)
    others = [c for c in sorted(os.sched_getaffinity(0)) if c != cpu]
    if others:
        p = plan(host, latency.choose(host, Given(attach=pid)), str(others[0]))
        assert p.probe == [cpu]  # traced where it runs, and said
        assert p.notes == [f"--attach: pid {pid} ({_comm(pid)}) may run on CPUs {cpu}: those "
                           "are traced"]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_sources_without_a_rate_of_their_own_say_none():
    from agent.watch.report import headline
    run = ClientRing(os.getpid()).open(Host(), [0], [])
    s = run.summary(_EmptyLat())
    assert (s["rate_hz"], s["rate_auto"], s["source_kind"]) == (None, False, "external")
    summ = {**s, "probe_cpus": [0], "duration_s": 1.0, "samples": 0}
    assert headline(summ)[0] == f"watched the process (pid {os.getpid()}) on CPU 0 for 1.0 s: " \
        "0 samples"


SOURCE_FILE = '''
from dataclasses import dataclass

from agent.watch.latency.base import Given, Running, Source


@dataclass(frozen=True)
class Blinker(Source):
    RANK = 30
    NAMES = ("blink",)
    kind = property(lambda self: "blink")
    said = property(lambda self: "--probe blink")

    @classmethod
    def named(cls, given):
        return given.probe in cls.NAMES

    @classmethod
    def build(cls, host, given):
        return cls()

    def cpus(self, host, rule, given, keep_one_free):
        return given or [rule.online[0]]

    def open(self, host, cpus, warnings):
        raise NotImplementedError


SOURCE = Blinker
'''


def test_adding_a_source_is_adding_a_file(tmp_path, monkeypatch):
    (tmp_path / "blink.py").write_text(SOURCE_FILE)
    monkeypatch.setattr(latency, "__path__", [*latency.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "agent.watch.latency.blink", raising=False)
    host = Host(FIXTURES / "vm-dev")
    req = options.build(host, probe="blink")
    assert type(req.cfg.source).__name__ == "Blinker" and req.cfg.probe_cpus == [0]
    assert req.cfg.source.history() == {"probe": "blink", "model": None, "variant": None}
    with pytest.raises(AgentError, match="--model is for --probe tf, not --probe blink"):
        options.build(host, probe="blink", model="lstm")
