"""Attribution: give every slow sample a named cause, a score and the evidence.

For one spike (a latency sample over the threshold), in this order:

1. **In-process evidence** of the sample itself, measured by the probe around the call (or by
   a client that records it): involuntary context switches, run-queue delay
   (/proc/thread-self/schedstat), minor/major faults (getrusage), CPU time vs wall time, the
   CPU at start and end. Cheap and strong: a sample that waited 3 ms on a run queue was
   preempted, whatever the host counters say.
2. **Host signals in the spike's window** (the collector rows overlapping
   [start, end]) against their own recent baseline — the rows of the preceding
   ``baseline_s`` seconds, excluding the last ``exclude_s`` — as median/MAD z-scores and
   excess counts (:mod:`.window`): run-queue delay and switches of the thread (sched), IRQ
   and softirq counts on the probe CPUs (irq, softirq), steal and frequency (cpu),
   faults/reclaim/compaction and PSI (memory), NUMA misses (numa), GPU clock-event reasons
   and foreign processes on the probe's GPU (gpu), AER errors (pcie), perf software events
   (perf).

Each cause family (one module: :mod:`.cpu`, :mod:`.irq`, :mod:`.steal`, :mod:`.freq`,
:mod:`.migration`, :mod:`.memory`, :mod:`.numa`, :mod:`.gpu`, :mod:`.pcie`) gives its cause a
strength s ∈ [0, 1] from its evidence, with its scores as named constants at its top; the
rules between causes (:mod:`.rules`) relabel, discount and merge them, and rank them with the
residual "unexplained" = Π(1 − s): scores are the strengths and the residual normalised to
sum 1. The primary cause is the top one when its strength is at least
:data:`~.rules.MIN_STRENGTH`, otherwise "unexplained". Who/what is named when the evidence
allows it: the task that ran on the probe CPU (from the sched task scan), the IRQ or softirq
and its device. :mod:`.engine` (:class:`Attributor`) orchestrates; :mod:`agent.causes`
is the one list of causes.
"""

from agent.causes import CAUSES
from agent.watch.attribution.engine import FAMILIES, Attributor
from agent.watch.attribution.rules import MIN_STRENGTH
from agent.watch.attribution.spike import Attribution, CauseScore, Context, Spike
from agent.watch.attribution.window import BaselineStats, RingView, SignalWindow, col_median

__all__ = ["CAUSES", "FAMILIES", "MIN_STRENGTH", "Attribution", "Attributor", "BaselineStats",
           "CauseScore", "Context", "RingView", "SignalWindow", "Spike", "col_median"]
