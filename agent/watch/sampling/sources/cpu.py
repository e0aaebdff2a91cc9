"""CpuCollector: the watch's CPU signals (collectors/cpu.py: files, parse, layout).

Per-CPU time split and steal, current frequency, thermal throttle counts: /proc/stat
(``cpu.N.{user,...,steal}_ticks``, ``cpu.all.ctxt``, ``cpu.all.procs_running``)
[mpstat -P ALL 1]; cpuN/cpufreq/scaling_cur_freq (``cpu.N.freq_hz``) [cpupower monitor];
cpuN/thermal_throttle/{core,package}_throttle_count (``cpu.N.*_throttle_total``). No cpufreq
driver (VMs) or no thermal_throttle directory: those signals are absent and listed in
``unsupported``, never 0.
"""

from __future__ import annotations

from functools import partial

from agent.watch.sampling.sources.base import HotSource
from collectors import cpu as cpumod
from collectors.host import Host


def drop_intr(data: bytes) -> bytes:
    """/proc/stat without its "intr" line (one count per IRQ number: ~500 tokens on a small
    VM, thousands on a big box, none kept — /proc/interrupts is the per-CPU source)."""
    i = data.find(b"\nintr ")
    if i < 0:
        return data
    j = data.find(b"\n", i + 1)
    return data[:i] + data[j:] if j >= 0 else data[:i]


class CpuCollector(HotSource):
    """The CPU signals of ``cpus`` (default: every online CPU; see the module docstring)."""

    name = "cpu"
    what = "/proc/stat"
    # 20 Hz: the kernel generates all of /proc/stat (every CPU and the per-IRQ "intr" line)
    # on each read, and its time fields move in USER_HZ (10 ms) ticks anyway.
    period_s = 0.05

    def __init__(self, host: Host, cpus: list[int] | None = None) -> None:
        super().__init__(host)
        r = cpumod.online_cpus(host)
        self.cpus = sorted(cpus) if cpus else (r.value or [])
        self._want = frozenset(self.cpus) if cpus else None

    def _open_tracks(self) -> None:
        want = self._want
        for key, path in cpumod.files(self.host, self.cpus).items():
            if key == "stat":
                # the Python path drops "intr" before splitting; the native reader's layout
                # is of the whole file (built from it, the same function)
                self._add(key, path, partial(cpumod.parse_stat, cpus=want),
                          partial(cpumod.stat_layout, cpus=want), pre=drop_intr)
            elif not self.host.exists(path):  # checked first: a failed open leaves nothing
                self.unsupported[key] = cpumod.missing_reason(key)
            elif key.endswith(".freq_hz"):
                self._add(key, path, partial(cpumod.parse_freq, key=key), None)
            else:
                self._add(key, path, partial(cpumod.parse_count, key=key),
                          partial(cpumod.count_layout, key=key))

    def is_counter(self, name: str) -> bool:
        return name.endswith(("_ticks", "_total", ".ctxt"))
