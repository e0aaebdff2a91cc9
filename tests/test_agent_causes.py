"""The watch's cause names are written once (agent/causes.py): the exporter's bounded
label sets and the kernel-event timeline's kinds come from there."""

from __future__ import annotations

import importlib

from agent import causes
from agent.export import metrics


def test_exporter_label_sets_are_the_cause_lists_plus_other():
    assert metrics.CAUSES == (*causes.CAUSES, "other")
    assert metrics.EVENT_CAUSES == ("task", "idle", "irq", "softirq", "timer", "ipi", "vector",
                                    "workqueue", "unknown", "blocked", "io_wait", "stopped",
                                    "hw_or_hypervisor", "unexplained", "other")


def test_timeline_kinds_and_residuals_are_the_event_list():
    tl = importlib.import_module("agent.trace.timeline")
    kinds = (tl.PROBE, tl.TASK, tl.IDLE, tl.IRQ, tl.SOFTIRQ, tl.TIMER, tl.IPI, tl.VECTOR,
             tl.WORK, tl.UNKNOWN, tl.BLOCKED, tl.IO_WAIT, tl.STOPPED)
    assert kinds == causes.EVENT_KINDS
    assert (tl.HW, tl.UNEXPLAINED) == causes.EVENT_RESIDUALS == ("hw_or_hypervisor",
                                                                  "unexplained")
    # every cause a breakdown can name has its own exporter label (the probe is never one)
    for k in (*kinds, tl.HW, tl.UNEXPLAINED):
        assert (k in metrics.EVENT_CAUSES) == (k != tl.PROBE), k
