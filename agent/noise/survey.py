"""The whole survey behind ``hftagent cpus``: every candidate scanned a batch at a time, the
verdicts, the ranking against this host's layout, and the run's document.

The command (agent/commands/cpus.py) checks the options, catches a stop and shows; the work
is here:

- :func:`scan_candidates` — the recorder built once (:func:`agent.noise.scan.build`), the
  candidates scanned in batches (:func:`agent.noise.scan.batches`, :func:`agent.noise.scan.scan`)
  into a list the caller holds, so that a stop (SIGTERM/SIGINT raised in a handler) keeps
  the batches that finished;
- :func:`recommend` — the verdicts (:func:`agent.noise.rank.judge`) and the ranking
  (:func:`agent.noise.rank.rank`) with what it needs from the host: SMT siblings, NUMA nodes,
  the GPUs' and NICs' nodes (:func:`device_nodes`), the processes pinned to the candidates;
- :func:`document` — the run's document (``--json``, history, the textfile), with the
  commands that apply the recommendation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.noise import scan as sc
from agent.noise.rank import Choice, CpuNoise
from collectors.host import Host

if TYPE_CHECKING:
    from agent.noise.events import Tracer


def scan_candidates(host: Host, candidates: list[int], n_online: int, duration_s: float,
                    threshold_us: float, *, into: list[CpuNoise], tracer: Tracer | None = None,
                    irq_sender: int | None = None,
                    built: Callable[[], None] | None = None,
                    progress: Callable[[list[int]], None] | None = None) -> None:
    """Scan ``candidates`` a batch at a time into ``into`` (unsorted). ``built`` is called
    once the recorder is built (a first build compiles it; a cache refused is one line,
    alone), ``progress`` before each batch. The recorder is closed on every way out."""
    exe = sc.build()
    try:
        if built is not None:
            built()
        for group in sc.batches(candidates, n_online):
            into.extend(sc.scan(host, group, n_online, duration_s, int(threshold_us * 1000),
                                exe=exe, progress=progress, tracer=tracer,
                                irq_sender=irq_sender))
    finally:
        exe.close()


def device_nodes(host: Host) -> list[int]:
    """NUMA nodes of the GPUs and NICs (PCI class display/3D or network), when known."""
    from collectors.pcie import is_gpu, is_nic, pci_devices
    return sorted({d.numa_node for d in pci_devices(host)
                   if d.numa_node is not None and d.numa_node >= 0 and (is_gpu(d) or is_nic(d))})


def recommend(host: Host, results: list[CpuNoise], candidates: list[int], *,
              count: int | None, allow_siblings: bool) -> Choice:
    """Judge ``results`` (each gets its verdict and basis) and rank them: one CPU per
    physical core unless ``allow_siblings``, on the GPUs' / NICs' node when known, avoiding
    CPUs other processes are pinned to; at most ``count``."""
    from agent.noise import rank as rk
    from collectors import cpu as cpuc
    from collectors.system import numa_nodes

    rk.judge(results)
    nodes = numa_nodes(host)
    return rk.rank(results, siblings=cpuc.smt(host, candidates).siblings,
                   cpu_node={c: n for n, cs in nodes.items() for c in cs},
                   device_nodes=device_nodes(host),
                   pinned=sc.pinned_processes(host, candidates), count=count,
                   allow_siblings=allow_siblings)


def document(results: list[CpuNoise], choice: Choice, trace: dict, *, duration_s: float,
             threshold_us: float, online: list[int], housekeeping: list[int],
             candidates: list[int], complete: bool) -> dict:
    """The run's document; the recommendation and its commands only from a ``complete``
    scan (a stopped one recommends nothing)."""
    from collectors.parsers import format_cpulist

    rec = format_cpulist(choice.recommended) if choice.recommended and complete else None
    commands = ([f"hftagent tune plan --cpus {rec}", f"hftagent tune apply --cpus {rec}",
                 f"hftagent run --cpus {rec} -- CMD"] if rec else [])
    return {"duration_s": duration_s, "threshold_us": threshold_us, "online": online,
            "housekeeping": housekeeping, "candidates": candidates,
            "cpus": [r.to_dict() for r in results], "ranked": choice.ranked,
            "recommended": choice.recommended if rec else [], "left_out": choice.left_out,
            "device_nodes": choice.device_nodes, "commands": commands, "trace": trace}
