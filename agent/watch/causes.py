"""The causes the attribution engine (:mod:`agent.watch.attribution`) names, with their
labels: the one list.

The exporter's bounded ``cause`` label set is this list plus "other" (:data:`agent.metrics.
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
    "unexplained": "unexplained",
}
