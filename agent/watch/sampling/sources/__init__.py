"""The hot sources: the collectors whose signals are /proc and /sys files read every round
(cpu, irq, softirq, memory, numa, sched), built on their collector module's ``files()``,
``parse()`` and ``layout()`` (collectors/<source>.py). base.py holds the common part."""
