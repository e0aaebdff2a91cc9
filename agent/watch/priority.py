"""watch's own scheduling priority (``hftagent watch --nice N``).

watch runs on the housekeeping CPUs, which on a production box also run the other work moved
off the inference CPUs. When they are oversubscribed, watch's loop, its sampler's drain thread
and its helper wait for their CPU like everything else: on a 16-vCPU guest, with the fault
kit's 32 busy threads on 16 CPUs (docs/benchmarks.md), records that only inherit a cause came
250 ms late. ``--nice -10`` lets them through first. It is applied to watch's own threads
(those of this process when it is called: the loop and the sampler's thread) and to the
sampler's helper process, by thread id (Linux keeps a nice value per thread), never to the
probe or to anything watch started before: the probe's priority is the measurement's, not
watch's. Threads and processes started later from these threads inherit it. A negative value
needs CAP_SYS_NICE: without it, one warning and watch runs as it was.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from agent.errors import AgentError
from collectors.host import Host

NICE_MIN, NICE_MAX = -20, 19


def parse_nice(value) -> int:
    """``--nice``: an integer in [-20, 19] (0 leaves the priority as it is)."""
    text = str(value).strip()
    # ASCII digits only: int() also takes "٣" and "1_0"
    n = int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None
    if n is None or not NICE_MIN <= n <= NICE_MAX:
        raise AgentError(f"--nice must be an integer from {NICE_MIN} to {NICE_MAX}, not "
                         f"{value!r}")
    return n


def own_threads(host: Host) -> list[int]:
    """The thread ids of this process (``host``'s /proc/self/task)."""
    return sorted(int(t) for t in host.listdir(host.proc("self", "task")) if t.isdigit())


def renice(nice: int, threads: Iterable[int], processes: Iterable[int] = (), *,
           setpriority: Callable[[int, int, int], None] = os.setpriority) -> str | None:
    """Give ``threads`` (thread ids) and ``processes`` (pids: every thread of each, as the
    kernel applies PRIO_PROCESS to the one id given — the helper is single-threaded) the
    nice value ``nice``. Returns a warning line, None when all were set (or ``nice`` is 0:
    nothing is changed)."""
    if nice == 0:
        return None
    failed: list[str] = []
    for tid in [*threads, *processes]:
        try:
            setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue  # gone (a thread that ended)
        except PermissionError:
            return (f"--nice {nice}: not permitted (a negative value needs CAP_SYS_NICE): "
                    "watch runs at its own priority")
        except OSError as exc:
            failed.append(f"{tid}: {exc.strerror or exc}")
    if failed:
        return f"--nice {nice}: not set for {', '.join(failed[:3])}"
    return None
