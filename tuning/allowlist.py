"""The only targets tuning may ever write, as patterns on the path a user would type on the box.

Checked before every write in apply *and* rollback: a journal edited to name /etc/shadow is
refused as a whole (nothing restored), not half-replayed. ``*`` matches within one path
segment only. Non-file targets (service, NVML) are listed by their exact key form.
"""

from __future__ import annotations

from tuning.tunables.base import target_matches

WRITABLE: tuple[str, ...] = (
    "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_min_freq",
    "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/energy_performance_preference",
    "/sys/devices/system/cpu/cpu[0-9]*/power/energy_perf_bias",
    "/sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*/disable",
    "/sys/devices/system/cpu/intel_pstate/no_turbo",
    "/sys/devices/system/cpu/intel_pstate/min_perf_pct",
    "/sys/devices/system/cpu/cpufreq/boost",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/kernel/mm/ksm/run",
    "/proc/sys/vm/swappiness",
    "/proc/sys/vm/stat_interval",
    "/proc/sys/kernel/numa_balancing",
    "/proc/sys/kernel/timer_migration",
    "/proc/sys/kernel/nmi_watchdog",
    "/proc/sys/kernel/sched_rt_runtime_us",
    "/proc/sys/kernel/perf_event_paranoid",
    "/proc/irq/default_smp_affinity",
    "/proc/irq/[0-9]*/smp_affinity_list",
    "service:irqbalance",
    # pm_qos and runtime isolation (tuning/tunables/pmqos.py, isolate.py)
    "/sys/devices/system/cpu/cpu[0-9]*/power/pm_qos_resume_latency_us",
    "task:[0-9]*:[0-9]*",
    "/sys/devices/virtual/workqueue/cpumask",
    "/sys/devices/virtual/workqueue/writeback/cpumask",
    "/sys/devices/virtual/workqueue/blkcg_punt_bio/cpumask",
    "/sys/devices/virtual/workqueue/nvme-wq/cpumask",
    "/sys/devices/virtual/workqueue/nvme-reset-wq/cpumask",
    "/sys/devices/virtual/workqueue/nvme-delete-wq/cpumask",
    "/sys/devices/virtual/workqueue/raid5wq/cpumask",
    "/sys/devices/virtual/workqueue/ib-comp-unb-wq/cpumask",
    "/sys/fs/cgroup/cgroup.subtree_control",
    "/sys/fs/cgroup/unified/cgroup.subtree_control",
    "cgroup:/sys/fs/cgroup/hftagent-isolated",
    "cgroup:/sys/fs/cgroup/unified/hftagent-isolated",
    "cgroup:/sys/fs/cgroup/cpuset/hftagent-isolated",
    "cgroup:/sys/fs/cgroup/cpuset/hftagent-housekeeping",
    "/sys/fs/cgroup/hftagent-isolated/cpuset.cpus",
    "/sys/fs/cgroup/hftagent-isolated/cpuset.cpus.partition",
    "/sys/fs/cgroup/unified/hftagent-isolated/cpuset.cpus",
    "/sys/fs/cgroup/unified/hftagent-isolated/cpuset.cpus.partition",
    "/sys/fs/cgroup/cpuset/cpuset.sched_load_balance",
    "/sys/fs/cgroup/cpuset/hftagent-isolated/cpuset.mems",
    "/sys/fs/cgroup/cpuset/hftagent-isolated/cpuset.cpus",
    "/sys/fs/cgroup/cpuset/hftagent-isolated/cpuset.sched_load_balance",
    "/sys/fs/cgroup/cpuset/hftagent-housekeeping/cpuset.mems",
    "/sys/fs/cgroup/cpuset/hftagent-housekeeping/cpuset.cpus",
    "nvml:gpu[0-9]*:persistence_mode",
    "nvml:gpu[0-9]*:compute_mode",
)


def allowed(target: str) -> bool:
    """Whether ``target`` matches one of :data:`WRITABLE` (and has no ``..``)."""
    return any(target_matches(p, target) for p in WRITABLE)
