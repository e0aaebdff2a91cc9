"""GPU family of the audit (`hftagent audit --profile hft-gpu`).

Ids: ``gpu.driver``, ``gpu.nvml``, then per GPU index N: ``gpu.N.persistence``,
``gpu.N.compute_mode``, ``gpu.N.foreign_processes``, ``gpu.N.clocks``, ``gpu.N.app_clocks``,
``gpu.N.pcie_link``, ``gpu.N.pcie_replay``, ``gpu.N.ecc``, ``gpu.N.retired_pages``,
``gpu.N.numa``, ``gpu.N.mig``; and ``gpu.tf_cuda`` (TF build vs driver).

Sources:
* /proc/driver/nvidia/version (through Host) decides whether there is a driver at all: without
  it, one ``unsupported`` finding (a host without a GPU or without libnvidia-ml).
* NVML (collectors.gpu.Nvml, cached on ``ctx.gpu``) for everything the driver knows. NVML always
  reads the live machine, so on a ``--root`` tree it is never called: the NVML checks are one
  ``unsupported`` finding, and only the sysfs-derived checks (PCIe link, NUMA locality of the
  NVIDIA PCI functions in the tree) run.
* sysfs /sys/bus/pci/devices/<bus>/{current,max}_link_{speed,width}, numa_node, local_cpulist
  (collectors.pcie), joined with NVML by the normalised bus id.
* Several GPUs (one per NUMA node, or one per strategy): every finding is one GPU's, its id
  names the index (NVML's, = PCI bus order, = ``nvidia-smi -i``), its evidence and ``data``
  the index and the bus id. ``--pid P``: every other compute process is foreign on every GPU
  (the finding says whether P has a context on that GPU); without it one process per GPU is
  assumed to be that GPU's inference process. NUMA: with ``--pid`` only the GPUs P has a
  context on are judged against the target CPUs; otherwise a GPU passes when the target CPUs
  are local to it, or when the ones that are not are local to another GPU (one GPU per
  node); a GPU to which no target CPU is local is ``warn`` while another GPU has local target
  CPUs (it may be unused, or driven across nodes: ``--pid`` tells), ``fail`` when no GPU has.
* TensorFlow's build_info.py, read as a file (find_spec + ast), never imported: importing TF
  costs seconds and the audit must stay under one second. It holds exactly the dict that
  ``tf.sysconfig.get_build_info()`` returns. Note: the TF this finds is the one of the Python
  running the audit (the agent's own venv carries tensorflow-cpu), so a CPU-only build there is
  reported as ``unsupported``, not as a fault of the inference environment.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from collectors.gpu import (
    CLOCK_EVENT_IDLE,
    CLOCK_SM,
    LOST,
    GpuProcess,
    Nvml,
    decode_clock_event_reasons,
    harmful_clock_event_reasons,
    nvidia_driver_version,
)
from collectors.host import ABSENT, Reading
from collectors.parsers import format_cpulist
from collectors.pcie import PciDevice, nvidia_gpus
from tuning.checks.base import AuditContext, in_tree, unsupported, why
from tuning.findings import Finding, Status

FAMILY = "gpu"
_find_spec = importlib.util.find_spec  # tests replace it
WHY_GPU = "GPU persistence, exclusivity and clocks decide GPU tail latency."
NOT_LIVE = "NVML reads the live machine; --root given"

_THROTTLE_FIX = {
    "SW power cap": "power limit reached: check `nvidia-smi -i {i} -q -d POWER`; raise it with "
                    "`nvidia-smi -i {i} -pl <watts>` if the board allows",
    "HW slowdown": "hardware slowdown (thermal or power brake): check cooling and power "
                   "delivery, `nvidia-smi -i {i} -q -d PERFORMANCE,TEMPERATURE` and the BMC log",
    "SW thermal slowdown": "GPU too hot: improve cooling/airflow "
                           "(`nvidia-smi -i {i} -q -d TEMPERATURE`)",
    "HW thermal slowdown": "GPU hit its hardware thermal limit: fix cooling now",
    "HW power brake": "external power brake asserted (PSU/chassis): check the BMC / power supply",
    "board limit": "board-level limit: check `nvidia-smi -i {i} -q -d PERFORMANCE`",
    "reliability": "reliability voltage limit: check `nvidia-smi -i {i} -q -d PERFORMANCE`",
}


def _smi(query: str, fn: str, i: int, bus: str | None) -> str:
    return f"nvidia-smi -i {i} --query-gpu={query} (NVML {fn}; GPU {i} = PCI {bus or '?'})"


@dataclass
class _Gpu:
    """What the NUMA and foreign-process checks need to know of every GPU before judging one:
    its index, bus id, sysfs PCI function, compute processes (live only) and local CPUs."""

    i: int
    bus: str | None
    dev: PciDevice | None
    procs: Reading | None = None  # Reading[list[GpuProcess]]; None on a --root tree
    local: list[int] | None = None
    local_evidence: str = ""
    lost: bool = False


@dataclass
class _Layout:
    """All GPUs of the box: local CPUs per GPU and the GPUs the target PID has a context on."""

    gpus: dict[int, _Gpu] = field(default_factory=dict)
    pid_gpus: set[int] = field(default_factory=set)

    def local_to_others(self, i: int) -> dict[int, set[int]]:
        return {j: set(g.local) for j, g in self.gpus.items() if j != i and g.local}


def _local_cpus(ctx: AuditContext, g: _Gpu, nv: Nvml | None) -> None:
    """GPU ``g``'s local CPUs: sysfs local_cpulist, else NVML's CPU affinity."""
    if g.dev is not None and g.dev.local_cpus is not None:
        g.local, g.local_evidence = g.dev.local_cpus, f"{g.dev.path}/local_cpulist"
    elif nv is not None and not g.lost:
        aff = nv.cpu_affinity(g.i, max(ctx.online or [0]) + 1)
        if aff.ok:
            g.local = aff.value
            g.local_evidence = ("nvidia-smi topo -m 'CPU Affinity' "
                                "(NVML nvmlDeviceGetCpuAffinity)")
        elif g.dev is not None:
            g.local_evidence = f"{g.dev.path}/local_cpulist"
    elif g.dev is not None:
        g.local_evidence = f"{g.dev.path}/local_cpulist"


def _nvidia_pci(host) -> list[PciDevice]:
    """NVIDIA GPUs in sysfs (collectors.pcie.nvidia_gpus, the rule `run --gpu N` uses too),
    in bus order = NVML's index order."""
    return nvidia_gpus(host)


def check(ctx: AuditContext) -> list[Finding]:
    host = ctx.host
    version = nvidia_driver_version(host)
    if not version.ok:
        if version.reason == ABSENT and not in_tree(host, version.path):
            return [unsupported("gpu.driver", FAMILY, "NVIDIA GPU", "no NVIDIA driver loaded",
                                evidence=version.path, why=WHY_GPU)]
        text = f"{version.path} {why(host, version.reason, version.path)}"
        if version.reason == ABSENT:  # a tree: the box or the capture may lack it
            return [unsupported("gpu.driver", FAMILY, "NVIDIA GPU", text,
                                evidence=version.path, why=WHY_GPU)]
        return [Finding(id="gpu.driver", family=FAMILY, title="NVIDIA GPU", status=Status.ERROR,
                        current=f"unreadable: {text}", evidence=version.path, why=WHY_GPU)]
    if not host.live:
        out = [unsupported("gpu.nvml", FAMILY, "NVIDIA GPU (NVML)", NOT_LIVE,
                           evidence=version.path, why=WHY_GPU)]
        # NVML numbers GPUs in PCI bus order, as this list is.
        layout = _Layout({i: _Gpu(i, dev.address, dev) for i, dev in
                          enumerate(_nvidia_pci(host))})
        for g in layout.gpus.values():
            _local_cpus(ctx, g, None)
        for i, g in layout.gpus.items():
            out.append(_pcie_link(ctx, i, f"GPU {i}", None, g.dev, idle=None))
            out.append(_numa(ctx, g, f"GPU {i}", None, layout))
        return out

    if ctx.gpu is None:
        ctx.gpu = Nvml()
    nv: Nvml = ctx.gpu
    init = nv.init()
    if not init.ok:
        return [unsupported("gpu.nvml", FAMILY, "NVIDIA GPU (NVML)", init.reason or "NVML failed",
                            evidence=init.path, why=WHY_GPU)]
    count = nv.device_count()
    if not count.ok or not count.value:
        return [unsupported("gpu.nvml", FAMILY, "NVIDIA GPU (NVML)",
                            count.reason or "NVML sees no GPU", evidence=count.path, why=WHY_GPU)]
    drv, cuda = nv.driver_version(), nv.cuda_driver_version()
    out = [Finding(id="gpu.driver", family=FAMILY, title="NVIDIA driver", status=Status.OK,
                   current=f"{drv.value or '?'}, CUDA {_ver(cuda.value)}, {count.value} GPU(s)",
                   evidence=f"{version.path}; nvidia-smi (NVML nvmlSystemGetDriverVersion)",
                   why=WHY_GPU)]
    pci = {d.address: d for d in _nvidia_pci(host)}
    layout = _Layout()
    failed: dict[int, Exception] = {}
    for i in range(count.value):
        try:
            layout.gpus[i] = _inventory(ctx, nv, i, pci)
        except Exception as exc:  # noqa: BLE001 - one GPU's bug must not hide the others
            failed[i] = exc
    if ctx.pid is not None:
        layout.pid_gpus = {i for i, g in layout.gpus.items() if g.procs is not None
                           and g.procs.ok and any(p.pid == ctx.pid for p in g.procs.value)}
    for i in range(count.value):
        try:
            if i in failed:
                raise failed[i]
            out.extend(_device(ctx, nv, layout.gpus[i], layout))
        except Exception as exc:  # noqa: BLE001 - one GPU's bug must not hide the others
            out.append(Finding(id=f"gpu.{i}", family=FAMILY, title=f"GPU {i}",
                               status=Status.ERROR, current=f"error: {type(exc).__name__}: {exc}",
                               data={"gpu": i}))
    out.extend(_tf_build(cuda))
    return out


def _inventory(ctx: AuditContext, nv: Nvml, i: int, pci: dict[str, PciDevice]) -> _Gpu:
    lost = nv.is_lost(i) or (nv.name(i).reason or "").startswith(LOST)
    bus = None if lost else nv.pci_bus_id(i).value
    g = _Gpu(i, bus, pci.get(bus) if bus else None, lost=lost)
    if not lost:
        g.procs = nv.compute_processes(i)
    _local_cpus(ctx, g, nv)
    return g


def _ver(v: tuple[int, int] | None) -> str:
    return "?" if v is None else f"{v[0]}.{v[1]}"


def _short(reason: str | None) -> str:
    """The NVML error name of a reason ("NotSupported"), or the reason itself."""
    r = reason or "unreadable"
    return r[r.rfind("(") + 1:-1] if r.endswith(")") and "(" in r else r


def _unsup(id: str, title: str, r: Reading, why: str = "") -> Finding:
    return unsupported(id, FAMILY, title, (r.reason or "unreadable").removeprefix("unsupported: "),
                       evidence=r.path, why=why)


def _device(ctx: AuditContext, nv: Nvml, g: _Gpu, layout: _Layout) -> list[Finding]:
    i, bus = g.i, g.bus
    name = nv.name(i)
    if g.lost or nv.is_lost(i):
        out = [Finding(id=f"gpu.{i}.lost", family=FAMILY, title=f"GPU {i}", status=Status.FAIL,
                       current=name.reason or "lost", expected="GPU answering",
                       evidence=name.path,
                       fix="check `dmesg | grep -i xid` (Xid 79: fell off the bus); drain the "
                           f"box, then `nvidia-smi -i {i} -r` or reboot",
                       why="A lost GPU fails every inference scheduled on it.")]
    else:
        title = f"GPU {i} ({name.value or '?'}, {bus or 'bus id unreadable'})"
        reasons = nv.clock_event_reasons(i)
        util = nv.utilization(i)
        idle = None
        if reasons.ok:
            idle = bool(reasons.value & CLOCK_EVENT_IDLE)
        elif util.ok:
            idle = util.value[0] == 0
        out = [
            _persistence(ctx, nv, i, bus, title), _compute_mode(ctx, nv, i, bus, title),
            _foreign(ctx, g, title, layout), _clocks(ctx, nv, i, bus, title, reasons),
            _app_clocks(ctx, nv, i, bus, title, reasons),
            _pcie_link(ctx, i, title, nv, g.dev, idle), _replay(ctx, nv, i, title),
            _ecc(ctx, nv, i, bus, title), _retired(ctx, nv, i, title),
            _numa(ctx, g, title, nv, layout), _mig(ctx, nv, i, bus, title),
        ]
    # JSON consumers key per-GPU findings by these, not by parsing ids or titles.
    for f in out:
        f.data = {"gpu": i, "bus_id": bus, **f.data}
    return out


def _persistence(ctx, nv: Nvml, i: int, bus: str | None, title: str) -> Finding:
    fid, r = f"gpu.{i}.persistence", nv.persistence_mode(i)
    if not r.ok:
        return _unsup(fid, f"{title} persistence mode", r)
    cur = "on" if r.value else "off"
    exp = ctx.profile.expected("gpu_persistence", "on")
    return ctx.finding("gpu_persistence", fid, FAMILY, f"{title} persistence mode",
                       exp == "any" or cur == exp, current=cur,
                       evidence=_smi("persistence_mode", "nvmlDeviceGetPersistenceMode", i, bus),
                       fix=f"nvidia-smi -i {i} -pm {1 if exp == 'on' else 0} "
                           "(or enable nvidia-persistenced.service)")


def _compute_mode(ctx, nv: Nvml, i: int, bus: str | None, title: str) -> Finding:
    fid, r = f"gpu.{i}.compute_mode", nv.compute_mode(i)
    if not r.ok:
        return _unsup(fid, f"{title} compute mode", r)
    exp = ctx.profile.expected("gpu_compute_mode", "EXCLUSIVE_PROCESS")
    return ctx.finding("gpu_compute_mode", fid, FAMILY, f"{title} compute mode",
                       exp == "any" or r.value == exp, current=r.value,
                       evidence=_smi("compute_mode", "nvmlDeviceGetComputeMode", i, bus),
                       fix=f"nvidia-smi -i {i} -c {exp}")


def _foreign(ctx, g: _Gpu, title: str, layout: _Layout) -> Finding:
    i, r = g.i, g.procs
    fid = f"gpu.{i}.foreign_processes"
    t = f"{title} foreign compute processes"
    if r is None or not r.ok:
        return _unsup(fid, t, r or Reading(None, "", "unreadable"))
    procs: list[GpuProcess] = r.value
    allowed = ctx.profile.expected("gpu_foreign_processes", 0)

    def fmt(ps):
        return ", ".join(f"{p.pid} ({p.name or '?'})" for p in ps) or "none"
    if ctx.pid is not None:
        # --pid names the inference process: any other compute process is foreign, on every
        # GPU; whether the target uses this GPU is said, so a box that runs one strategy per
        # GPU reads as such.
        foreign = [p for p in procs if p.pid != ctx.pid]
        uses = "has a context on this GPU" if i in layout.pid_gpus else \
            "has no context on this GPU"
        note = f"target pid {ctx.pid} {uses}"
    else:
        # Without --pid we cannot tell which process is the inference one: one process per
        # GPU is assumed to be it, every further one on that GPU is foreign.
        foreign = procs[1:]
        note = "no --pid: one process assumed to be the inference one"
    cur = f"{len(foreign)} foreign ({fmt(foreign)}); all: {fmt(procs)}; {note}"
    return ctx.finding("gpu_foreign_processes", fid, FAMILY, t, len(foreign) <= allowed,
                       current=cur, expected=f"<= {allowed} foreign",
                       evidence=f"nvidia-smi -i {i} --query-compute-apps=pid,process_name,"
                                f"used_memory (NVML nvmlDeviceGetComputeRunningProcesses; GPU "
                                f"{i} = PCI {g.bus or '?'})",
                       fix=f"move PID(s) {', '.join(str(p.pid) for p in foreign)} off GPU {i} "
                           "(CUDA_VISIBLE_DEVICES) and set compute mode EXCLUSIVE_PROCESS",
                       data={"processes": [p.__dict__ for p in procs],
                             "foreign": [p.pid for p in foreign]})


def _clocks(ctx, nv: Nvml, i: int, bus: str | None, title: str, reasons: Reading) -> Finding:
    fid, t = f"gpu.{i}.clocks", f"{title} SM clock and clock-event reasons"
    if not reasons.ok:
        return _unsup(fid, t, reasons)
    sm, mx = nv.clock_mhz(i, CLOCK_SM).value, nv.max_clock_mhz(i, CLOCK_SM).value
    mask = reasons.value
    harmful = harmful_clock_event_reasons(mask)
    cur = (f"SM {sm if sm is not None else '?'} of {mx if mx is not None else '?'} MHz; "
           f"reasons 0x{mask:x} ({', '.join(decode_clock_event_reasons(mask))})")
    if not harmful and mask & CLOCK_EVENT_IDLE and sm is not None and mx and sm < mx:
        cur += "; idle downclock (harmless)"
    exp = ctx.profile.expected("gpu_clocks", "unthrottled")
    fix = "; ".join(_THROTTLE_FIX[h].format(i=i) for h in harmful if h in _THROTTLE_FIX)
    return ctx.finding("gpu_clocks", fid, FAMILY, t, exp == "any" or not harmful, current=cur,
                       expected="no throttling reason (idle 0x1 is fine)",
                       evidence=_smi("clocks.sm,clocks.max.sm,clocks_event_reasons.active",
                                     "nvmlDeviceGetCurrentClocksEventReasons", i, bus),
                       fix=fix, data={"reasons": mask, "harmful": harmful})


def _app_clocks(ctx, nv: Nvml, i: int, bus: str | None, title: str,
                reasons: Reading) -> Finding:
    fid, t = f"gpu.{i}.app_clocks", f"{title} applications clocks"
    app, dflt = nv.applications_clock_mhz(i), nv.default_applications_clock_mhz(i)
    if not app.ok:
        return _unsup(fid, t, app)
    cur = f"SM applications clock {app.value} MHz (default {dflt.value if dflt.ok else '?'})"
    lowered = dflt.ok and app.value < dflt.value
    # NVML has no getter for locked clocks (nvidia-smi -lgc); under load they show as an SM
    # clock capped below max with no throttling reason, which the clocks check reports.
    if reasons.ok and reasons.value & 0x2:
        cur += "; clocks held by the applications-clocks setting (0x2)"
    return ctx.finding("gpu_clocks", fid, FAMILY, t, not lowered, current=cur,
                       expected="applications clock = default (not lowered)",
                       evidence=_smi("clocks.applications.graphics,"
                                     "clocks.default_applications.graphics",
                                     "nvmlDeviceGetApplicationsClock", i, bus),
                       fix=f"nvidia-smi -i {i} -rac  (reset applications clocks)")


def _pcie_link(ctx, i: int, title: str, nv: Nvml | None, dev: PciDevice | None,
               idle: bool | None) -> Finding:
    fid, t = f"gpu.{i}.pcie_link", f"{title} PCIe link"
    exp = ctx.profile.expected("gpu_pcie_link", "max")
    if nv is not None:
        link = nv.pcie_link(i)
        cg, mg, cw, mw = link.cur_gen, link.max_gen, link.cur_width, link.max_width
        cur = str(link)
        evidence = _smi("pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
                        "pcie.link.width.max", "nvmlDeviceGetCurrPcieLinkGeneration", i,
                        dev.address if dev is not None else nv.pci_bus_id(i).value)
        if dev is not None and dev.has_link:
            cur += f"; sysfs {dev.link_str()}"
            evidence += f"; {dev.path}/current_link_speed"
    elif dev is not None and dev.has_link:
        cg, mg, cw, mw = dev.cur_gen, dev.max_gen, dev.cur_width, dev.max_width
        cur, evidence = f"sysfs {dev.link_str()}", f"{dev.path}/current_link_speed"
    else:
        return unsupported(fid, FAMILY, t, "link speed/width not readable",
                           evidence=dev.path if dev else "")
    if None in (cg, mg, cw, mw):
        return unsupported(fid, FAMILY, t, f"link partly unreadable: {cur}", evidence=evidence)
    width_drop, gen_drop = cw < mw, cg < mg
    ok = exp == "any" or not (width_drop or (gen_drop and not idle))
    if gen_drop and not width_drop and idle:
        # Dynamic link speed: an idle GPU drops to gen1 to save power and retrains on load.
        cur += "; gen below max at idle (link power saving: re-check under load)"
    at = dev.address if dev is not None else "<bus>"
    fix = (f"width below max: reseat GPU {i}'s card / check the riser and slot "
           f"(`lspci -vv -s {at}`: LnkSta vs LnkCap)" if width_drop else
           f"gen below max under load: check BIOS PCIe speed settings, the riser, and "
           f"`lspci -vv -s {at}` LnkSta; `nvidia-smi -i {i} -q -d PCIE`")
    return ctx.finding("gpu_pcie_link", fid, FAMILY, t, ok, current=cur,
                       expected="gen and width = max (a gen drop at idle is power saving)",
                       evidence=evidence, fix=fix)


def _replay(ctx, nv: Nvml, i: int, title: str) -> Finding:
    fid, t = f"gpu.{i}.pcie_replay", f"{title} PCIe replay counter"
    r = nv.pcie_replay_counter(i)
    if not r.ok:
        return _unsup(fid, t, r)
    return ctx.finding("gpu_pcie_link", fid, FAMILY, t, r.value == 0,
                       current=f"{r.value} replays since reset", expected="0",
                       status=None if r.value == 0 else Status.WARN,
                       evidence=f"nvidia-smi -i {i} -q -d PCIE 'Replays Since Reset' "
                                "(NVML nvmlDeviceGetPcieReplayCounter)",
                       fix="link-level retransmissions: check the slot/riser/cable; watch "
                           "whether the counter keeps growing (hftagent watch: pcie_replay_total)")


def _ecc(ctx, nv: Nvml, i: int, bus: str | None, title: str) -> Finding:
    fid, t = f"gpu.{i}.ecc", f"{title} volatile uncorrected ECC errors"
    r = nv.ecc_volatile_uncorrected(i)
    if not r.ok:
        return _unsup(fid, t, r)
    mode = nv.ecc_mode(i)
    allowed = ctx.profile.expected("gpu_ecc", 0)
    cur = f"{r.value} uncorrected since driver load; ECC {'on' if mode.value else 'off' if mode.ok else '?'}"
    return ctx.finding("gpu_ecc", fid, FAMILY, t, r.value <= allowed, current=cur,
                       expected=f"<= {allowed}",
                       evidence=_smi("ecc.errors.uncorrected.volatile.total,ecc.mode.current",
                                     "nvmlDeviceGetTotalEccErrors", i, bus),
                       fix=f"drain GPU {i}; check `nvidia-smi -i {i} -q -d ECC,PAGE_RETIREMENT,"
                           "ROW_REMAPPER` and dmesg for Xid 48/63/94/95; reset or RMA")


def _retired(ctx, nv: Nvml, i: int, title: str) -> Finding:
    fid, t = f"gpu.{i}.retired_pages", f"{title} retired pages / remapped rows"
    rows, pages = nv.remapped_rows(i), nv.retired_pages(i)
    if not rows.ok and not pages.ok:
        return _unsup(fid, t, rows)
    parts, bad, pending = [], False, False
    if rows.ok:
        corr, unc, rpend, fail = rows.value
        parts.append(f"remapped rows: {corr} correctable, {unc} uncorrectable, "
                     f"pending {'yes' if rpend else 'no'}, failure {'yes' if fail else 'no'}")
        bad |= fail or unc > 0
        pending |= rpend
    else:
        parts.append(f"remapped rows: {rows.reason}")
    if pages.ok:
        sbe, dbe, ppend = pages.value
        parts.append(f"retired pages: {sbe} single-bit, {dbe} double-bit, "
                     f"pending {'yes' if ppend else 'no'}")
        bad |= dbe > 0
        pending |= ppend
    else:
        parts.append(f"retired pages: {(pages.reason or '').removeprefix('unsupported: ')}")
    status = (Status.PENDING_REBOOT if pending and not bad else None)
    return ctx.finding("gpu_ecc", fid, FAMILY, t, not (bad or pending), current="; ".join(parts),
                       expected="no uncorrectable remaps, nothing pending", status=status,
                       evidence=f"nvidia-smi -i {i} --query-remapped-rows=... / "
                                "--query-retired-pages=... "
                                "(NVML nvmlDeviceGetRemappedRows, nvmlDeviceGetRetiredPages)",
                       fix=f"a pending remap/retirement needs a GPU reset: drain, then "
                           f"`nvidia-smi -i {i} -r`; a remap failure means RMA")


def _numa(ctx, g: _Gpu, title: str, nv: Nvml | None, layout: _Layout) -> Finding:
    """GPU ``g``'s local CPUs vs the target CPUs, knowing every other GPU's (module docstring:
    with --pid only the target's GPUs are judged; otherwise one GPU per node passes)."""
    i, dev, local, evidence = g.i, g.dev, g.local, g.local_evidence
    fid, t = f"gpu.{i}.numa", f"{title} NUMA locality vs target CPUs"
    node = dev.numa_node if dev else None
    nvnode = ""
    if nv is not None:
        n = nv.numa_node(i)
        nvnode = f"; NVML NUMA node {n.value if n.ok else _short(n.reason)}"
    if not local:
        return unsupported(fid, FAMILY, t, "GPU local CPUs not readable", evidence=evidence)
    target = sorted(ctx.cpus)
    off = sorted(set(target) - set(local))
    where = (node if node is not None else "none (-1: single node)" if dev is not None
             else "unknown (PCI function not in sysfs)")
    cur = (f"GPU local CPUs {format_cpulist(local)}, NUMA node {where}{nvnode}; target CPUs "
           f"{format_cpulist(target)}")
    bind = f" / numactl --cpunodebind={node} --membind={node}" if node is not None else ""
    fix = (f"pin the inference that uses GPU {i} to CPUs {format_cpulist(local)} "
           f"(taskset -c {format_cpulist(local)}{bind})")
    expected = "target CPUs within the GPU's local CPUs"
    status = None
    if layout.pid_gpus:
        if i not in layout.pid_gpus:
            cur += (f"; not judged: target pid {ctx.pid} has no context on this GPU (its "
                    f"GPU(s): {', '.join(map(str, sorted(layout.pid_gpus)))})")
            off = []
        elif off:
            cur += f"; not local: {format_cpulist(off)} (target pid {ctx.pid} uses this GPU)"
    elif off:
        others = layout.local_to_others(i)
        elsewhere = {j: sorted(set(off) & cpus) for j, cpus in others.items() if set(off) & cpus}
        covered = set().union(*map(set, elsewhere.values())) if elsewhere else set()
        if len(off) == len(target) and elsewhere:
            # No target CPU is local to this GPU, but some are local to another: the box
            # has a GPU per node and this one is either unused or driven across nodes.
            cur += ("; no target CPU is local to this GPU (target CPUs local to GPU "
                    + ", GPU ".join(f"{j}: {format_cpulist(c)}" for j, c in elsewhere.items())
                    + "): unused, or driven across nodes (--pid tells)")
            status = Status.WARN
        elif set(off) <= covered:
            # Target CPUs spread over the nodes, each part local to its own GPU.
            cur += ("; the other target CPUs are local to GPU "
                    + ", GPU ".join(f"{j} ({format_cpulist(c)})" for j, c in elsewhere.items()))
            expected = "each target CPU local to a GPU (one GPU per node)"
            off = []
        else:
            cur += f"; not local: {format_cpulist(off)}"
            if covered:
                cur += (f" ({format_cpulist(covered)} local to GPU "
                        + ", ".join(map(str, sorted(elsewhere))) + ")")
    return ctx.finding("numa_single_node", fid, FAMILY, t, not off, current=cur,
                       expected=expected, evidence=evidence, fix=fix, status=status)


def _mig(ctx, nv: Nvml, i: int, bus: str | None, title: str) -> Finding:
    fid, t = f"gpu.{i}.mig", f"{title} MIG mode"
    r = nv.mig_mode(i)
    exp = ctx.profile.expected("gpu_mig", "off")
    ev = _smi("mig.mode.current,mig.mode.pending", "nvmlDeviceGetMigMode", i, bus)
    if not r.ok:
        if "NotSupported" in (r.reason or "") and exp in ("off", "any"):
            return ctx.finding("gpu_mig", fid, FAMILY, t, True,
                               current="off (GPU without MIG support)", evidence=ev)
        return _unsup(fid, t, r)
    cur_on, pend_on = r.value
    cur = f"{'on' if cur_on else 'off'} (pending {'on' if pend_on else 'off'})"
    want_on = exp == "on"
    if exp != "any" and cur_on != pend_on and pend_on == want_on:
        return ctx.finding("gpu_mig", fid, FAMILY, t, False, current=cur,
                           status=Status.PENDING_REBOOT, evidence=ev,
                           fix=f"reset GPU {i} (`nvidia-smi -i {i} -r`) to apply the pending mode")
    # A pending mode other than the wanted one takes effect at the next GPU reset.
    ok = exp == "any" or (cur_on == want_on and pend_on == want_on)
    return ctx.finding("gpu_mig", fid, FAMILY, t, ok, current=cur,
                       evidence=ev, fix=f"nvidia-smi -i {i} -mig {1 if want_on else 0} "
                                        "(then reset the GPU)")


# -- TensorFlow build vs driver ---------------------------------------------------------------
def tf_build_info() -> Reading[dict]:
    """TensorFlow's build info without importing TF (which costs seconds).

    ``importlib.util.find_spec("tensorflow")`` locates the package without executing it; its
    generated ``python/platform/build_info.py`` holds ``build_info = OrderedDict([...])``, the
    dict ``tf.sysconfig.get_build_info()`` returns (cuda_version, cudnn_version,
    is_cuda_build). Parsed with ast, never executed."""
    try:
        spec = _find_spec("tensorflow")
    except (ImportError, ValueError) as exc:
        return Reading(None, "tensorflow", f"absent: {exc}")
    if spec is None or not spec.submodule_search_locations:
        return Reading(None, "tensorflow", "absent: TensorFlow not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "python/platform/build_info.py"
    try:
        tree = ast.parse(path.read_text())
    except OSError as exc:
        return Reading(None, str(path), f"absent: {exc.strerror}")
    except SyntaxError as exc:
        return Reading(None, str(path), f"error: cannot parse: {exc}")
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "build_info"
                                                 for t in node.targets)):
            v = node.value
            try:
                if isinstance(v, ast.Call) and v.args:  # collections.OrderedDict([...])
                    return Reading(dict(ast.literal_eval(v.args[0])), str(path))
                return Reading(dict(ast.literal_eval(v)), str(path))
            except (ValueError, TypeError, SyntaxError) as exc:
                return Reading(None, str(path), f"error: cannot parse build_info: {exc}")
    return Reading(None, str(path), "error: no build_info in the file")


def _parse_ver(s: str) -> tuple[int, int] | None:
    parts = str(s).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _tf_build(cuda: Reading) -> list[Finding]:
    t = "TensorFlow CUDA/cuDNN build vs driver"
    why = ("A TF built for a newer CUDA than the driver supports cannot use the GPU or misses "
           "XLA kernels.")
    info = tf_build_info()
    if not info.ok:
        return [unsupported("gpu.tf_cuda", FAMILY, t, info.reason or "", evidence=info.path,
                            why=why)]
    b = info.value
    if not b.get("is_cuda_build"):
        return [unsupported("gpu.tf_cuda", FAMILY, t,
                            "TensorFlow in this environment is a CPU-only build "
                            "(is_cuda_build False)", evidence=info.path, why=why)]
    tf_cuda, cudnn = _parse_ver(b.get("cuda_version", "")), b.get("cudnn_version", "?")
    cur = (f"TF built for CUDA {b.get('cuda_version', '?')}, cuDNN {cudnn}; driver supports "
           f"CUDA {_ver(cuda.value)}")
    if tf_cuda is None or not cuda.ok:
        return [unsupported("gpu.tf_cuda", FAMILY, t, f"cannot compare: {cur}",
                            evidence=info.path, why=why)]
    drv = cuda.value
    if tf_cuda[0] > drv[0]:
        status, fix = Status.FAIL, (f"upgrade the NVIDIA driver to one supporting CUDA "
                                    f"{tf_cuda[0]}.{tf_cuda[1]}, or install a TF built for "
                                    f"CUDA {drv[0]}")
    elif tf_cuda > drv:
        # Same major: CUDA minor-version compatibility runs it, but PTX newer than the driver
        # cannot be JIT-compiled (missing XLA/custom kernels).
        status, fix = Status.WARN, "upgrade the driver to the CUDA minor version TF was built for"
    else:
        status, fix = Status.OK, ""
    return [Finding(id="gpu.tf_cuda", family=FAMILY, title=t, status=status, current=cur,
                    expected="TF CUDA version <= driver CUDA version",
                    evidence=f"{info.path} (= tf.sysconfig.get_build_info()); NVML "
                             "nvmlSystemGetCudaDriverVersion", fix=fix, why=why)]
