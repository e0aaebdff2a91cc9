"""Which of several armed runtimes an attached process really calls: the trial.

A process often maps more than one runtime of the catalogue (agent/trace/attach.py): every
TF2 Python process maps ``libtensorflow_cc.so.2``, whose ``TF_SessionRun`` only a TF1 session
calls; a TF1 session's ``TF_SessionRun`` calls ``tensorflow::DirectSession::Run`` inside it.
Which one times "one inference" is only known from what fires. So watch arms every candidate
at once (entry and return: every catalogue function returns a status), and :class:`Trial`
watches their hits, per thread:

- an entry on a thread with no open call is an **outermost** call of its runtime;
- an entry while another runtime's call is open on the same thread is **inside** that one
  (nesting in time on one thread: TF_SessionRun → DirectSession::Run, a tf.function →
  its eager ops);
- an entry of a function whose last entry on that thread never returned means the return
  was lost: the thread's open calls are forgotten and the entry starts afresh (as the
  pairing in agent/watch/latency/attached.py does).

The choice (:meth:`Trial.winner`) is the runtime with the most outermost calls, the
catalogue's order breaking a tie; it is made (:meth:`Trial.decided`) once the leader has
:data:`DECIDE_CALLS` outermost calls, or :data:`TRIAL_S` after the first call arrived,
whichever comes first. Until a first call arrives nothing is decided: a candidate that is
never called costs nothing (a uprobe traps only when its instruction runs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

DECIDE_CALLS = 20       # outermost calls of the leader that settle the choice
TRIAL_S = 2.0           # or this long after the first call, whatever the counts


@dataclass
class Tally:
    """One runtime's hits in the trial."""
    entries: int = 0
    outermost: int = 0
    inside: dict[str, int] = field(default_factory=dict)   # outer runtime -> entries


class Trial:
    """Counts per candidate runtime from the armed events' hits. ``runtime_of``: event name
    (``call<i>``/``ret<i>``, agent/trace/uprobe.py) → runtime; ``order``: the candidates,
    catalogue order; ``is_return(name)``: whether an event name is a return."""

    def __init__(self, runtime_of: dict[str, str], order: list[str],
                 is_return: Callable[[str], bool], calls: int = DECIDE_CALLS,
                 seconds: float = TRIAL_S) -> None:
        self.runtime_of = runtime_of
        self.order = list(order)
        self.is_return = is_return
        self.calls, self.seconds = calls, seconds
        self.tally = {r: Tally() for r in self.order}
        self.first_ns: int | None = None     # the first entry's timestamp (CLOCK_MONOTONIC)
        self._open: dict[int, list[str]] = {}  # tid -> open entries' names, outermost first

    def feed(self, tid: int, name: str, ts_ns: int) -> None:
        """One hit of an armed event on thread ``tid``."""
        rt = self.runtime_of.get(name)
        if rt is None:
            return
        stack = self._open.setdefault(tid, [])
        if self.is_return(name):
            entry = "call" + name[3:]
            if entry in stack:  # (inner calls still open lost their returns)
                del stack[stack.index(entry):]
            return
        if name in stack:  # its last entry never returned: a lost return
            stack.clear()
        t = self.tally[rt]
        t.entries += 1
        if not stack:
            t.outermost += 1
            if self.first_ns is None:
                self.first_ns = ts_ns
        else:
            outer = self.runtime_of[stack[0]]
            if outer != rt:
                t.inside[outer] = t.inside.get(outer, 0) + 1
        stack.append(name)

    def winner(self) -> str | None:
        """The runtime with the most outermost calls (catalogue order on a tie), or None
        while no call has arrived."""
        best = max(self.order, key=lambda r: (self.tally[r].outermost,
                                              -self.order.index(r)))
        return best if self.tally[best].outermost else None

    def decided(self, now_ns: int) -> bool:
        """Whether the choice is made at ``now_ns`` (CLOCK_MONOTONIC, the events' clock)."""
        w = self.winner()
        if w is None or self.first_ns is None:
            return False
        return self.tally[w].outermost >= self.calls or now_ns - self.first_ns >= \
            self.seconds * 1e9

    def counts(self) -> str:
        """Each candidate's count, for the line that says why: ``tf-python 20 outermost;
        tf-c 0; tf-session 20 (inside tf-c)``."""
        out = []
        for r in self.order:
            t = self.tally[r]
            part = f"{r} {t.outermost} outermost" if t.outermost else f"{r} {t.entries}"
            if t.inside:
                part += " (" + ", ".join(f"{n} inside {o}" for o, n in t.inside.items()) + ")"
            out.append(part)
        return "; ".join(out)

    def to_dict(self) -> dict:
        return {r: {"entries": t.entries, "outermost": t.outermost, "inside": dict(t.inside)}
                for r, t in self.tally.items()}
