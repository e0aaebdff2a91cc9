"""Pure parsers: text of a /proc or /sys file in, typed values out. No I/O here.

Each parser raises ``ValueError`` on text it cannot make sense of; the Host turns that into a
``None`` reading with an ``error`` reason, so a malformed file never becomes a plausible 0.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------------
# CPU lists and masks
# ----------------------------------------------------------------------------------------------


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel CPU list ("0-3,8,10-11", "0-15:2" strides) into sorted unique CPU ids.

    Empty text is the empty set (e.g. /sys/devices/system/cpu/isolated on a box without
    isolation). Raises ValueError on "3-1", "x", negative numbers.
    """
    text = text.strip()
    if not text:
        return []
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty element in CPU list {text!r}")
        stride = 1
        if ":" in part:  # "0-15:2" (also "0-15:2/4" in newer kernels' group form: not accepted)
            part, _, stride_s = part.partition(":")
            if not stride_s.isdigit() or int(stride_s) < 1:
                raise ValueError(f"bad stride in CPU list element {part!r}")
            stride = int(stride_s)
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            if not (lo_s.isdigit() and hi_s.isdigit()):
                raise ValueError(f"bad CPU range {part!r}")
            lo, hi = int(lo_s), int(hi_s)
            if lo > hi:
                raise ValueError(f"CPU range {part!r} runs backwards")
            cpus.update(range(lo, hi + 1, stride))
        else:
            if not part.isdigit():
                raise ValueError(f"bad CPU number {part!r}")
            cpus.add(int(part))
    return sorted(cpus)


def parse_cpu_option(spec: str, online: Iterable[int]) -> list[int]:
    """A user's ``--cpus`` value checked against the online CPUs. Raises ValueError with a
    message fit for the user ("bad --cpus '3-1': CPU range '3-1' runs backwards")."""
    try:
        cpus = parse_cpulist(spec)
    except ValueError as exc:
        raise ValueError(f"bad --cpus {spec!r}: {exc}") from None
    if not cpus:
        raise ValueError("--cpus is empty")
    online = set(online)
    offline = sorted(set(cpus) - online)
    if offline:
        raise ValueError(f"--cpus {spec!r}: CPU(s) {format_cpulist(offline)} not online "
                         f"(online: {format_cpulist(online)})")
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """Compact range form of a CPU set: [0,1,2,3,8] -> "0-3,8"; empty -> ""."""
    ids = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpumask(text: str) -> list[int]:
    """Parse a hex CPU mask as in /proc/irq/N/smp_affinity ("ff,00000001": comma-separated
    32-bit words, most significant first) into CPU ids."""
    words = text.strip().replace(" ", "").split(",")
    if not words or any(not w or not re.fullmatch(r"[0-9a-fA-F]+", w) for w in words):
        raise ValueError(f"bad CPU mask {text!r}")
    value = 0
    for w in words:
        value = (value << 32) | int(w, 16)
    return [i for i in range(value.bit_length()) if value >> i & 1]


def format_cpumask(cpus: Iterable[int]) -> str:
    """CPU ids to the kernel's comma-separated 32-bit hex word form."""
    value = 0
    for c in cpus:
        value |= 1 << c
    words = []
    while True:
        words.append(f"{value & 0xFFFFFFFF:08x}")
        value >>= 32
        if not value:
            break
    return ",".join(reversed(words))


def group_by_value(per_cpu: Mapping[int, object]) -> str:
    """Render per-CPU values grouped as compact ranges: "0-7=performance; 8-15=powersave".

    A single shared value renders as "0-15=performance" too, so the CPU set is always visible.
    """
    groups: dict[str, list[int]] = {}
    for cpu, val in per_cpu.items():
        groups.setdefault("unreadable" if val is None else str(val), []).append(cpu)
    parts = sorted(groups.items(), key=lambda kv: min(kv[1]))
    return "; ".join(f"{format_cpulist(cpus)}={val}" for val, cpus in parts)


# ----------------------------------------------------------------------------------------------
# /proc/cmdline
# ----------------------------------------------------------------------------------------------


def parse_cmdline(text: str) -> dict[str, str | None]:
    """Kernel command line to {param: value or None}. The last occurrence wins, as in the
    kernel for most parameters. Parameters after a bare "--" belong to init and are dropped."""
    out: dict[str, str | None] = {}
    try:
        tokens = shlex.split(text)
    except ValueError:  # unbalanced quote: fall back to whitespace split
        tokens = text.split()
    for tok in tokens:
        if tok == "--":
            break
        key, sep, val = tok.partition("=")
        out[key] = val if sep else None
    return out


def isolation_cpus(value: str | None) -> list[int]:
    """CPU list out of isolcpus=/nohz_full=/rcu_nocbs= values, which may carry flags first
    ("isolcpus=managed_irq,domain,2-5"). Returns [] when there is no CPU list."""
    if not value:
        return []
    parts = [p for p in value.split(",") if p and not p.isalpha() and p != "nohz"]
    # flags are alphabetic words (nohz, domain, managed_irq); the rest is the CPU list
    parts = [p for p in parts if not re.fullmatch(r"[a-z_]+", p)]
    return parse_cpulist(",".join(parts)) if parts else []


# ----------------------------------------------------------------------------------------------
# /proc/stat
# ----------------------------------------------------------------------------------------------

CPU_TIME_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
                   "guest", "guest_nice")


@dataclass(frozen=True)
class ProcStat:
    """/proc/stat. ``cpus`` maps CPU id (or -1 for the aggregate "cpu" line) to its times in
    USER_HZ ticks, by field name; fields a kernel does not print are absent, not 0."""

    cpus: dict[int, dict[str, int]]
    ctxt: int | None = None
    btime: int | None = None
    processes: int | None = None
    procs_running: int | None = None
    procs_blocked: int | None = None
    softirq_total: int | None = None


def parse_proc_stat(text: str) -> ProcStat:
    cpus: dict[int, dict[str, int]] = {}
    scalars: dict[str, int] = {}
    softirq_total = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key.startswith("cpu"):
            ident = -1 if key == "cpu" else int(key[3:])
            cpus[ident] = {name: int(v) for name, v in zip(CPU_TIME_FIELDS, parts[1:])}
        elif key == "softirq" and len(parts) > 1:
            softirq_total = int(parts[1])
        elif key in ("ctxt", "btime", "processes", "procs_running", "procs_blocked"):
            scalars[key] = int(parts[1])
    if not cpus:
        raise ValueError("no cpu lines in /proc/stat")
    return ProcStat(cpus=cpus, softirq_total=softirq_total, **scalars)


# ----------------------------------------------------------------------------------------------
# /proc/interrupts and /proc/softirqs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IrqRow:
    """One row of /proc/interrupts. ``irq`` is the number as a string ("24") or the name of a
    per-CPU/architecture row ("LOC", "NMI", "ERR", "MIS"); ``counts`` has one entry per CPU
    column, or a single entry for the single-column rows ERR and MIS; ``desc`` is the rest
    (chip, hwirq, trigger, device names)."""

    irq: str
    counts: tuple[int, ...]
    desc: str = ""

    @property
    def numeric(self) -> bool:
        return self.irq.isdigit()

    @property
    def total(self) -> int:
        return sum(self.counts)


def parse_interrupts(text: str) -> tuple[list[int], list[IrqRow]]:
    """Parse /proc/interrupts into (CPU ids of the columns, rows).

    The header names the online CPUs ("CPU0 CPU1 CPU4" when 2-3 are offline). ERR and MIS rows
    have a single total column whatever the CPU count.
    """
    lines = text.splitlines()
    if not lines:
        raise ValueError("empty /proc/interrupts")
    header = lines[0].split()
    if not header or not all(h.startswith("CPU") and h[3:].isdigit() for h in header):
        raise ValueError(f"bad /proc/interrupts header {lines[0]!r}")
    cpus = [int(h[3:]) for h in header]
    rows: list[IrqRow] = []
    for line in lines[1:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        name = name.strip()
        fields = rest.split()
        counts: list[int] = []
        for f in fields[: len(cpus)]:
            if not f.isdigit():
                break
            counts.append(int(f))
        desc = " ".join(fields[len(counts):])
        if not counts:
            raise ValueError(f"no counts in /proc/interrupts row {name!r}")
        rows.append(IrqRow(name, tuple(counts), desc))
    return cpus, rows


def parse_softirqs(text: str) -> tuple[list[int], dict[str, tuple[int, ...]]]:
    """Parse /proc/softirqs into (CPU ids, {softirq name: per-CPU counts})."""
    lines = text.splitlines()
    if not lines:
        raise ValueError("empty /proc/softirqs")
    cpus = [int(h[3:]) for h in lines[0].split() if h.startswith("CPU")]
    out: dict[str, tuple[int, ...]] = {}
    for line in lines[1:]:
        name, sep, rest = line.partition(":")
        if sep:
            out[name.strip()] = tuple(int(x) for x in rest.split())
    return cpus, out


# ----------------------------------------------------------------------------------------------
# key/value files
# ----------------------------------------------------------------------------------------------


def parse_kv(text: str, sep: str | None = None) -> dict[str, str]:
    """Lines of "key value" (vmstat) or "key: value" (meminfo, status) into a dict of strings."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if sep is None:
            key, _, val = line.partition(" ")
            if ":" in key:
                key, _, rest = line.partition(":")
                val = rest
        else:
            key, _, val = line.partition(sep)
        key = key.strip()
        if key:
            out[key] = val.strip()
    return out


def parse_vmstat(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in parse_kv(text).items() if v.lstrip("-").isdigit()}


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes (the file says kB, meaning KiB)."""
    out: dict[str, int] = {}
    for k, v in parse_kv(text, ":").items():
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def parse_bracketed(text: str) -> tuple[str, list[str]]:
    """"always [madvise] never" -> ("madvise", ["always", "madvise", "never"])."""
    options = [w.strip("[]") for w in text.split()]
    chosen = re.search(r"\[([^\]]+)\]", text)
    if not chosen:
        raise ValueError(f"no [selected] value in {text!r}")
    return chosen.group(1), options


@dataclass(frozen=True)
class SwapDevice:
    name: str
    kind: str
    size_bytes: int
    used_bytes: int
    priority: int


def parse_swaps(text: str) -> list[SwapDevice]:
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 5:
            out.append(SwapDevice(parts[0], parts[1], int(parts[2]) * 1024, int(parts[3]) * 1024,
                                  int(parts[4])))
    return out


def parse_environ(data: bytes | str) -> dict[str, str]:
    """/proc/<pid>/environ (NUL-separated KEY=VALUE) to a dict."""
    if isinstance(data, str):
        data = data.encode()
    out: dict[str, str] = {}
    for item in data.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def parse_schedstat(text: str) -> tuple[int, int, int]:
    """/proc/<pid>/schedstat: (ns on CPU, ns waiting on a run queue, timeslices)."""
    parts = text.split()
    if len(parts) < 3:
        raise ValueError(f"bad schedstat {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


@dataclass(frozen=True)
class TaskStat:
    """The fields of /proc/<pid>/stat the agent uses."""

    pid: int
    comm: str
    state: str
    minflt: int
    majflt: int
    utime: int
    stime: int
    num_threads: int
    processor: int
    policy: int


def parse_task_stat(text: str) -> TaskStat:
    """/proc/<pid>/stat. The comm field may hold spaces and parentheses: split on the last ')'."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        raise ValueError("bad /proc/<pid>/stat")
    rest = text[rpar + 2:].split()
    # rest[0] is field 3 (state); field N is rest[N-3]
    return TaskStat(
        pid=int(text[:lpar]), comm=text[lpar + 1:rpar], state=rest[0],
        minflt=int(rest[7]), majflt=int(rest[9]), utime=int(rest[11]), stime=int(rest[12]),
        num_threads=int(rest[17]), processor=int(rest[36]), policy=int(rest[38]),
    )


# ----------------------------------------------------------------------------------------------
# PCI
# ----------------------------------------------------------------------------------------------

_SPEED_RE = re.compile(r"([0-9.]+)\s*GT/s")


def parse_pci_speed(text: str) -> float | None:
    """current_link_speed / max_link_speed ("16.0 GT/s PCIe", "8 GT/s", "Unknown") -> GT/s.

    "Unknown" (a link that is down, or a bridge without a link) is None, not 0."""
    m = _SPEED_RE.search(text)
    if m:
        return float(m.group(1))
    if text.strip().lower().startswith("unknown"):
        return None
    raise ValueError(f"bad PCI link speed {text!r}")


PCIE_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_generation(gts: float | None) -> int | None:
    return None if gts is None else PCIE_GEN_BY_GTS.get(round(gts, 1))


def parse_pci_width(text: str) -> int | None:
    """current_link_width ("16", "x16") -> lanes; 0 or 255 (no link / unknown) -> None."""
    t = text.strip().lstrip("xX")
    if not t.isdigit():
        raise ValueError(f"bad PCI link width {text!r}")
    n = int(t)
    return None if n in (0, 255) else n


# PCI class codes (upper 16 bits of the 24-bit class) the agent names.
PCI_CLASSES = {
    0x0100: "storage-scsi", 0x0106: "storage-sata", 0x0108: "storage-nvme",
    0x0200: "network", 0x0207: "network-infiniband", 0x0280: "network",
    0x0300: "display-vga", 0x0302: "gpu-3d", 0x0380: "display",
    0x0604: "bridge-pci", 0x0c03: "usb", 0x1200: "accelerator",
}


def pci_class_name(class_hex: str) -> str:
    code = int(class_hex, 16) >> 8
    return PCI_CLASSES.get(code, f"class-{code:04x}")


@dataclass
class AerCounters:
    """/sys/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}: "NAME count" lines."""

    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.counts.get("TOTAL_ERR_COR", 0) + self.counts.get("TOTAL_ERR_NONFATAL", 0) + \
            self.counts.get("TOTAL_ERR_FATAL", 0)


def parse_aer(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out
