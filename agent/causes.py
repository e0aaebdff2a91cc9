"""The causes the attribution engine (:mod:`agent.watch.attribution`) names, with their
labels: the one list.

The exporter's bounded ``cause`` label set is this list plus "other" (:data:`agent.export.metrics.
CAUSES`), in this order; the summary labels each cause from here. A leaf module (no imports):
the exporter reads it without loading the engine.
"""

from __future__ import annotations

CAUSES: dict[str, str] = {
    "cpu_contention": "CPU contention on the probe CPU",
    "irq": "hardware IRQ on the probe CPU",
    "softirq": "softirq on the probe CPU",
    "freq_drop": "CPU frequency drop / thermal throttle",
    "steal": "hypervisor steal",
    "migration": "migration to another CPU",
    "page_faults": "page faults / reclaim / compaction",
    "numa_remote": "NUMA remote memory",
    "gpu_throttle": "GPU clock throttle",
    "gpu_foreign_process": "foreign GPU process",
    "pcie_errors": "PCIe errors / degraded link",
    # the kernel events only: the probe CPU idle, the probe's wake-up late (timer slack, a
    # C-state's exit, in a VM the halted vCPU's wake-up): the cure is keep-awake / PM QoS
    "wakeup_latency": "late wake-up of the idle probe CPU",
    "unexplained": "unexplained",
}

# What the kernel-event breakdown names (agent/trace/timeline.py): the kinds of what
# used the probe's CPU, then its two residuals. The exporter's
# hftagent_spike_cause_seconds_total cause label set is these, less "probe" (never a cause of
# its own delay), plus "other" (:data:`agent.export.metrics.EVENT_CAUSES`).
EVENT_KINDS: tuple[str, ...] = ("probe", "task", "idle", "irq", "softirq", "timer", "ipi",
                                "vector", "workqueue", "unknown")
EVENT_RESIDUALS: tuple[str, ...] = ("hw_or_hypervisor", "unexplained")
