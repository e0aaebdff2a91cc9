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
    # the kernel events only: wall time on the CPU that the scheduler did not count as the
    # thread's runtime (sched_stat_runtime): the vCPU preempted by the hypervisor, an SMI/NMI
    "hidden": "time hidden from the thread on its CPU (hypervisor, SMI/NMI)",
    # the kernel events only: another task ran on the SMT sibling of the call's CPU while
    # the call ran there without leaving it (sched_switch of the sibling)
    "smt_sibling": "another task on the SMT sibling of the call's CPU",
    # the kernel events (agent/watch/attribution/pmu.py): the call kept its CPU and its own
    # code took longer — from an attached call's CPU counters, more instructions, a lower
    # IPC (cache/memory) or a lower clock than its calls' median (the sub-kind in the
    # detail); without counters, its runtime counted the whole excess (sub-kind unknown)
    "slow_code": "the call's own code ran longer on its CPU (CPU counters, or its runtime "
                 "counting the whole excess)",
    "migration": "migration to another CPU",
    "page_faults": "page faults / reclaim / compaction",
    "numa_remote": "NUMA remote memory",
    "gpu_throttle": "GPU clock throttle",
    "gpu_foreign_process": "foreign GPU process",
    # an attached GPU call's split (agent/watch/attribution/gpu_verdict.py): its GPU wait
    # grew with no other process on the GPU and no throttle (longer kernels, bigger input)
    "gpu_kernel": "GPU work took longer (the caller's GPU wait)",
    "gpu_copy": "slow or large host-device copy",
    "pcie_errors": "PCIe errors / degraded link",
    # the kernel events only: the probe CPU idle, the probe's wake-up late (timer slack, a
    # C-state's exit, in a VM the halted vCPU's wake-up): the cure is keep-awake / PM QoS.
    # Only the delay from the waking to the run (and a pacing sleep that overshot the call's
    # start on its timer), never the time the thread was not runnable
    "wakeup_latency": "late wake-up of the idle probe CPU",
    # the kernel events only: the call's thread was not runnable (sched_switch prev_state),
    # its waker named (sched_waking's task) — the process's own waits, not the host's doing
    "blocked": "blocked (sleeping: a lock, a queue, a pipe, a sleep)",
    "io_wait": "waiting for I/O (uninterruptible, ended by a device)",
    "stopped": "stopped by a signal (SIGSTOP, a debugger, job control)",
    "unexplained": "unexplained",
}

# What the kernel-event breakdown names (agent/trace/timeline.py): the kinds of what
# used the probe's CPU, the kinds of the time its thread was not runnable (blocked, io_wait,
# stopped: their culprit is the waker or the signal's sender), then its two residuals. The exporter's
# hftagent_spike_cause_seconds_total cause label set is these, less "probe" (never a cause of
# its own delay), plus "other" (:data:`agent.export.metrics.EVENT_CAUSES`).
EVENT_KINDS: tuple[str, ...] = ("probe", "task", "idle", "irq", "softirq", "timer", "ipi",
                                "vector", "workqueue", "unknown", "blocked", "io_wait",
                                "stopped")
EVENT_RESIDUALS: tuple[str, ...] = ("hw_or_hypervisor", "unexplained")
