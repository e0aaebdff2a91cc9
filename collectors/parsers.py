"""Pure parsers: text of a /proc or /sys file in, typed values out. No I/O here.

Each parser raises :class:`ParseError` (a ``ValueError``) on text it cannot make sense of, and
nothing else: truncated, empty, garbage, huge or negative input never escapes as an
IndexError, KeyError, OverflowError or MemoryError. The Host turns the error into a ``None``
reading with an ``error`` reason, so a malformed file never becomes a plausible 0.

Numbers are ASCII only: ``str.isdigit()`` and ``int()`` also take Unicode digits ("٣" is 3 to
``int``), which no kernel file holds and no user means as a CPU number.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The largest CONFIG_NR_CPUS Linux allows (x86_64 with MAXSMP, powerpc): a CPU id at or past it
# is an error, checked before a range is expanded.
MAX_CPUS = 8192


class ParseError(ValueError):
    """Text a parser cannot make sense of (a ValueError, so ``Reading.map`` reports it)."""


class NeedsCpuCount(ParseError):
    """A CPU list that says "N" or "all" parsed without the CPU count."""


def _show(text: str | bytes, limit: int = 40) -> str:
    """repr of input for an error message, cut short: a message never echoes a huge file."""
    r = repr(text)
    return r if len(r) <= limit else r[:limit] + "…"


def is_uint(tok: str | bytes) -> bool:
    """ASCII decimal digits only ("12"; not "+1", " 1", "1_0", "٣" or "²")."""
    return tok.isdigit() and tok.isascii()


def parse_uint(tok: str | bytes, what: str = "number", max_digits: int = 20) -> int:
    """An unsigned decimal (ASCII digits; at most ``max_digits``: 20 holds any u64)."""
    if not is_uint(tok) or len(tok) > max_digits:
        raise ParseError(f"bad {what} {_show(tok)}")
    return int(tok)


def parse_int(tok: str | bytes, what: str = "number", max_digits: int = 20) -> int:
    """A signed decimal: an optional "-" and ASCII digits."""
    neg = tok[:1] in ("-", b"-")
    n = parse_uint(tok[1:] if neg else tok, what, max_digits)
    return -n if neg else n


# ----------------------------------------------------------------------------------------------
# CPU lists and masks
# ----------------------------------------------------------------------------------------------

# Regions are separated by commas and whitespace (bitmap_find_region skips any run of them).
_REGION_SEP = re.compile(r"[,\s]+", re.ASCII)
_DECIMAL = re.compile(r"[0-9]{1,10}")  # more digits: the kernel's EOVERFLOW (an unsigned int)
# Every other CPU of 8192 listed one by one ("0,2,...,8190") is under 20 KiB.
_MAX_LIST_CHARS = 64 * 1024


def parse_cpulist(text: str, nr_cpus: int | None = None) -> list[int]:
    """Parse a kernel CPU list into sorted unique CPU ids, with the kernel's grammar
    (Documentation/admin-guide/kernel-parameters.rst "cpu lists", lib/bitmap-str.c):
    "0-3,8", "0-7:2/4" (from each group of 4 CPUs of 0-7 the first 2: 0,1,4,5), "1-N" and
    "all" where N is the last CPU.

    ``nr_cpus`` is the kernel's nr_cpu_ids (the highest possible CPU + 1): "N" and "all" need
    it, and every CPU must be below it (the kernel's ERANGE). Without it (a sysfs file, which
    never says N) the bound is :data:`MAX_CPUS`. Bounds are checked before a range is
    expanded. Empty text is the empty set (/sys/devices/system/cpu/isolated on a box without
    isolation). Raises :class:`ParseError` on "3-1", "x", "-1", "0-3:3/2", "٣".
    """
    if nr_cpus is not None and not 0 < nr_cpus <= MAX_CPUS:
        raise ParseError(f"bad CPU count {nr_cpus} (1-{MAX_CPUS})")
    limit = MAX_CPUS if nr_cpus is None else nr_cpus
    if len(text) > _MAX_LIST_CHARS:
        raise ParseError(f"CPU list of {len(text)} characters: longer than any for "
                         f"{MAX_CPUS} CPUs")
    mask = bytearray(limit)
    top = 0  # one past the highest CPU set: the result is read from mask[:top] only
    for tok in _REGION_SEP.split(text):
        if not tok:
            continue

        def num(s: str, tok: str = tok) -> int:
            if s == "N":  # the last CPU (Linux 5.12)
                if nr_cpus is None:
                    raise NeedsCpuCount(f"{_show(tok)}: N (the last CPU) needs the CPU count")
                return nr_cpus - 1
            if _DECIMAL.fullmatch(s) is None:
                raise ParseError(f"bad CPU list element {_show(tok)}")
            return int(s)

        # a region (lib/bitmap-str.c bitmap_parse_region): "A", "A-B", "A-B:used/group",
        # "all" or "all:used/group" ("all", any case, is 0-N: Linux 5.13)
        head, colon, pattern = tok.partition(":")
        if head.isascii() and head.lower() == "all":
            if nr_cpus is None:
                raise NeedsCpuCount(f"{_show(tok)}: 'all' needs the CPU count")
            start, end = 0, nr_cpus - 1
        else:
            lo, dash, hi = head.partition("-")
            if colon and not dash:
                raise ParseError(f"bad CPU list element {_show(tok)}: used/group needs a range")
            start = num(lo)
            end = num(hi) if dash else start
        used = group = end + 1
        if colon:
            used_s, slash, group_s = pattern.partition("/")
            if not slash:
                raise ParseError(f"bad CPU list element {_show(tok)}: expected A-B:used/group")
            used, group = num(used_s), num(group_s)
        if start > end:
            raise ParseError(f"CPU range {_show(tok)} runs backwards")
        if group == 0 or used > group:
            raise ParseError(f"bad group in CPU list element {_show(tok)} "
                             "(used/group needs 0 <= used <= group, group >= 1)")
        if end >= limit:
            raise ParseError(f"CPU {end} in {_show(tok)} is past the last CPU ({limit - 1})"
                             if nr_cpus is not None else
                             f"CPU {end} in {_show(tok)}: Linux has at most {MAX_CPUS} CPUs")
        top = max(top, end + 1)
        # set the bits with slice stores: at most min(used, groups) of them per region
        if used >= group:
            mask[start:end + 1] = b"\1" * (end + 1 - start)
        elif used * group <= end + 1 - start:  # few CPUs used per group: a stride each
            for k in range(start, start + used):
                n = len(range(k, end + 1, group))
                mask[k:end + 1:group] = b"\1" * n
        else:
            for base in range(start, end + 1, group):
                top = min(base + used, end + 1)
                mask[base:top] = b"\1" * (top - base)
    # (reading the whole MAX_CPUS-byte mask cost ~140 µs a call, for lists of a few CPUs)
    return list(itertools.compress(range(top), mask[:top]))


def _brief_cpulist(cpus: Iterable[int], limit: int = 48) -> str:
    """format_cpulist cut short for a message: "0,2,4,…(4096 CPUs)"."""
    ids = sorted(set(cpus))
    s = format_cpulist(ids)
    if len(s) <= limit:
        return s
    return s[:limit].rpartition(",")[0] + f",… ({len(ids)} CPUs)"


def parse_cpu_option(spec: str, online: Iterable[int], nr_cpus: int | None = None
                     ) -> list[int]:
    """A user's ``--cpus`` value checked against the online CPUs. Raises ValueError with a
    message fit for the user ("bad --cpus '3-1': CPU range '3-1' runs backwards").

    The kernel's list grammar (:func:`parse_cpulist`), N being the last possible CPU
    (``nr_cpus`` = nr_cpu_ids; without it the last online CPU). A CPU past it is refused
    before any range is expanded; messages never print a huge list. Stricter than the
    kernel in one way: an empty element ("0,,1", "1,") is refused, since in a user's option
    it is a typo rather than an intent (a boot argument's list keeps the kernel's grammar)."""
    online = set(online)
    if "," in spec and any(not part.strip() for part in spec.split(",")):
        raise ParseError(f"bad --cpus {_show(spec)}: empty element in the CPU list")
    try:
        try:
            cpus = parse_cpulist(spec, nr_cpus)
        except NeedsCpuCount:
            if nr_cpus is not None or not online:
                raise
            cpus = parse_cpulist(spec, min(max(online) + 1, MAX_CPUS))
    except ValueError as exc:
        raise ParseError(f"bad --cpus {_show(spec)}: {exc}") from None
    if not cpus:
        raise ParseError("--cpus is empty")
    offline = sorted(set(cpus) - online)
    if offline:
        raise ParseError(f"--cpus {_show(spec)}: CPU(s) {_brief_cpulist(offline)} not online "
                         f"(online: {_brief_cpulist(online)})")
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


_MASK_WORD = re.compile(r"[0-9a-fA-F]{1,8}")


def parse_cpumask(text: str) -> list[int]:
    """Parse a hex CPU mask as in /proc/irq/N/smp_affinity ("ff,00000001": comma-separated
    32-bit words, most significant first) into CPU ids. As the kernel's bitmap_parse: at most
    8 hex digits a word, no empty word, surrounding whitespace only; at most
    :data:`MAX_CPUS` bits."""
    words = text.strip().split(",")
    if len(words) > MAX_CPUS // 32:
        raise ParseError(f"CPU mask of {len(words)} words: Linux has at most {MAX_CPUS} CPUs")
    if any(_MASK_WORD.fullmatch(w) is None for w in words):
        raise ParseError(f"bad CPU mask {_show(text)}")
    cpus: list[int] = []
    for k, w in enumerate(reversed(words)):
        v = int(w, 16)
        cpus.extend(32 * k + i for i in range(v.bit_length()) if v >> i & 1)
    return cpus


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

_CMDLINE_SPACE = " \t\n\v\f\r"


def parse_cmdline(text: str) -> dict[str, str | None]:
    """Kernel command line to {param: value or None}, split as the kernel splits it
    (lib/cmdline.c next_arg): whitespace separates parameters except inside double quotes,
    ``param="a b"`` and ``"param=a b"`` give ``a b``; single quotes and backslashes are plain
    characters. The last occurrence wins, as in the kernel for most parameters. Parameters
    after a bare "--" belong to init and are dropped."""
    out: dict[str, str | None] = {}
    n, i = len(text), 0
    while True:
        while i < n and text[i] in _CMDLINE_SPACE:
            i += 1
        if i >= n:
            return out
        quoted = text[i] == '"'
        if quoted:
            i += 1
        start, in_quote, equals = i, quoted, -1
        while i < n:
            c = text[i]
            if c in _CMDLINE_SPACE and not in_quote:
                break
            if c == "=" and equals <= start:  # (next_arg: a "=" first is not the split)
                equals = i
            elif c == '"':
                in_quote = not in_quote
            i += 1
        end = i
        if quoted and end > start and text[end - 1] == '"':
            end -= 1  # "param=value": the closing quote
        if equals <= start:
            key, val = text[start:end], None
        else:
            key, val = text[start:equals], text[equals + 1:end]
            if val.startswith('"'):  # param="value"
                val = val[1:]
                if not quoted and val.endswith('"'):
                    val = val[:-1]
        if val is None and key == "--":
            return out
        out[key] = val
        i += 1


ISOLCPUS_FLAGS = ("nohz", "domain", "managed_irq")


def isolation_cpus(value: str | None, nr_cpus: int | None = None, *,
                   param: str = "isolcpus") -> list[int]:
    """The CPUs a ``param=value`` boot argument selects, read as the kernel reads it.

    ``param`` is one of:

    - ``isolcpus``: ``[flag-list,]<cpu-list>`` (kernel/sched/isolation.c
      housekeeping_isolcpus_setup): leading words are flags (nohz, domain, managed_irq;
      unknown ones of letters and "_" are skipped, anything else makes the kernel ignore the
      parameter). The flag loop also takes "all" and a leading "N" for flags, so
      ``isolcpus=all`` has no CPU list (the kernel then reads past the value): an error here.
    - ``nohz_full``: a CPU list; one the kernel cannot parse is ignored by it (an error here).
    - ``rcu_nocbs``: a CPU list; one the kernel cannot parse offloads every CPU
      (kernel/rcu/tree_nocb.h rcu_nocb_setup), and so does this.

    ``nr_cpus`` is nr_cpu_ids (the highest possible CPU + 1), needed for "N", "all" and
    rcu_nocbs' fallback. None or "" selects no CPU. Raises :class:`ParseError`.
    """
    if not value:
        return []
    if param == "isolcpus":
        s = value
        while s[:1].isascii() and s[:1].isalpha():
            flag, comma, rest = s.partition(",")
            if flag not in ISOLCPUS_FLAGS and re.fullmatch(r"[A-Za-z_]+", flag) is None:
                raise ParseError(f"isolcpus: invalid flag {_show(flag)}: the kernel ignores "
                                 "the parameter")
            if not comma:
                raise ParseError(f"isolcpus={_show(value)}: no CPU list (the kernel reads "
                                 f"{_show(flag)} as a flag); write the CPUs, e.g. 0-N")
            s = rest
        try:
            return parse_cpulist(s, nr_cpus)
        except NeedsCpuCount:
            raise
        except ParseError as exc:
            raise ParseError(f"isolcpus={_show(value)}: {exc} (the kernel ignores it)") from None
    try:
        return parse_cpulist(value, nr_cpus)
    except NeedsCpuCount:
        raise
    except ParseError as exc:
        if param == "rcu_nocbs":
            if nr_cpus is None:
                raise NeedsCpuCount(f"rcu_nocbs={_show(value)}: {exc}; the kernel then "
                                    "offloads every CPU, which needs the CPU count") from None
            return list(range(nr_cpus))  # "rcu_nocbs= bad CPU range, all CPUs set"
        ignored = " (the kernel ignores it)" if param == "nohz_full" else ""
        raise ParseError(f"{param}={_show(value)}: {exc}{ignored}") from None


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


_STAT_SCALARS = ("ctxt", "btime", "processes", "procs_running", "procs_blocked")


def parse_proc_stat(text: str) -> ProcStat:
    """/proc/stat [cat /proc/stat]. A cpu line has at least user, nice, system and idle (every
    kernel since 2.6 prints 7 to 10 fields); a shorter one is a truncated file."""
    cpus: dict[int, dict[str, int]] = {}
    scalars: dict[str, int] = {}
    softirq_total = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key.startswith("cpu"):
            ident = -1 if key == "cpu" else parse_uint(key[3:], "/proc/stat CPU line", 4)
            if ident >= MAX_CPUS or len(parts) < 5:
                raise ParseError(f"bad /proc/stat line {_show(line)}")
            cpus[ident] = {name: parse_uint(v, f"/proc/stat {key} {name}")
                           for name, v in zip(CPU_TIME_FIELDS, parts[1:])}
        elif key == "softirq" or key in _STAT_SCALARS:
            if len(parts) < 2:
                raise ParseError(f"truncated /proc/stat line {_show(line)}")
            n = parse_uint(parts[1], f"/proc/stat {key}")
            if key == "softirq":
                softirq_total = n
            else:
                scalars[key] = n
    if not cpus:
        raise ParseError("no cpu lines in /proc/stat")
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
        return is_uint(self.irq)

    @property
    def total(self) -> int:
        return sum(self.counts)


def _cpu_header(line: str, what: str) -> list[int]:
    """The "CPU0 CPU1 CPU4" header of /proc/interrupts and /proc/softirqs: the online CPUs."""
    header = line.split()
    if not header or len(header) > MAX_CPUS or \
            not all(h.startswith("CPU") and is_uint(h[3:]) and len(h) <= 7 for h in header):
        raise ParseError(f"bad {what} header {_show(line)}")
    cpus = [int(h[3:]) for h in header]
    if len(set(cpus)) != len(cpus) or max(cpus) >= MAX_CPUS:
        raise ParseError(f"bad {what} header {_show(line)}")
    return cpus


def parse_interrupts(text: str) -> tuple[list[int], list[IrqRow]]:
    """Parse /proc/interrupts into (CPU ids of the columns, rows).

    The header names the online CPUs ("CPU0 CPU1 CPU4" when 2-3 are offline). A numbered row
    has a count for every column (kernel/irq/proc.c show_interrupts); ERR and MIS rows have a
    single total column whatever the CPU count.
    """
    lines = text.splitlines()
    if not lines:
        raise ParseError("empty /proc/interrupts")
    cpus = _cpu_header(lines[0], "/proc/interrupts")
    rows: list[IrqRow] = []
    for line in lines[1:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        name = name.strip()
        fields = rest.split()
        counts: list[int] = []
        for f in fields[: len(cpus)]:
            if not is_uint(f):
                break
            # (parse_uint, its message built, only past its 20 digits: the common case is int)
            counts.append(int(f) if len(f) <= 20 else
                          parse_uint(f, f"count in /proc/interrupts row {_show(name)}"))
        if not counts or (is_uint(name) and len(counts) != len(cpus)):
            raise ParseError(f"/proc/interrupts row {_show(name)}: {len(counts)} counts for "
                             f"{len(cpus)} CPUs")
        rows.append(IrqRow(name, tuple(counts), " ".join(fields[len(counts):])))
    return cpus, rows


def parse_softirqs(text: str) -> tuple[list[int], dict[str, tuple[int, ...]]]:
    """Parse /proc/softirqs into (CPU ids, {softirq name: per-CPU counts}); every row has a
    count for every CPU column of the header."""
    lines = text.splitlines()
    if not lines:
        raise ParseError("empty /proc/softirqs")
    cpus = _cpu_header(lines[0], "/proc/softirqs")
    out: dict[str, tuple[int, ...]] = {}
    for line in lines[1:]:
        name, sep, rest = line.partition(":")
        if not sep:
            if line.strip():
                raise ParseError(f"bad /proc/softirqs line {_show(line)}")
            continue
        fields = rest.split()
        if len(fields) != len(cpus):
            raise ParseError(f"/proc/softirqs row {_show(name.strip())}: {len(fields)} counts "
                             f"for {len(cpus)} CPUs")
        out[name.strip()] = tuple(parse_uint(x, "/proc/softirqs count") for x in fields)
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
    """/proc/vmstat: "name value" lines [vmstat -s]. A line of another shape is an error."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ParseError(f"bad /proc/vmstat line {_show(line)}")
        out[parts[0]] = parse_int(parts[1], f"/proc/vmstat {parts[0]}")
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes (the file says kB, meaning KiB) [free -b]."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        k, sep, v = line.partition(":")
        parts = v.split()
        if not sep or not k.strip() or len(parts) not in (1, 2) or \
                (len(parts) == 2 and parts[1] != "kB"):
            raise ParseError(f"bad /proc/meminfo line {_show(line)}")
        n = parse_uint(parts[0], f"/proc/meminfo {k.strip()}")
        out[k.strip()] = n * 1024 if len(parts) == 2 else n
    return out


def parse_bracketed(text: str) -> tuple[str, list[str]]:
    """"always [madvise] never" -> ("madvise", ["always", "madvise", "never"])."""
    options = [w.strip("[]") for w in text.split()]
    chosen = re.search(r"\[([^\]]+)\]", text)
    if not chosen:
        raise ParseError(f"no [selected] value in {_show(text)}")
    return chosen.group(1), options


@dataclass(frozen=True)
class SwapDevice:
    name: str
    kind: str
    size_bytes: int
    used_bytes: int
    priority: int


def parse_swaps(text: str) -> list[SwapDevice]:
    """/proc/swaps [swapon --show]: a "Filename Type Size Used Priority" header, then one line
    per device (sizes in KiB; names with spaces come escaped as \\040, so 5 fields)."""
    lines = text.splitlines()
    if not lines:
        return []
    if not lines[0].startswith("Filename"):
        raise ParseError(f"bad /proc/swaps header {_show(lines[0])}")
    out = []
    for line in lines[1:]:
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            raise ParseError(f"bad /proc/swaps line {_show(line)}")
        out.append(SwapDevice(parts[0], parts[1], parse_uint(parts[2], "swap size") * 1024,
                              parse_uint(parts[3], "swap used") * 1024,
                              parse_int(parts[4], "swap priority")))
    return out


def parse_environ(data: bytes | str) -> dict[str, str]:
    """/proc/<pid>/environ (NUL-separated KEY=VALUE) to a dict."""
    if isinstance(data, str):
        data = data.encode(errors="surrogateescape")
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
        raise ParseError(f"bad schedstat {_show(text)}")
    return (parse_uint(parts[0], "schedstat run time"), parse_uint(parts[1], "schedstat wait"),
            parse_uint(parts[2], "schedstat timeslices"))


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
    """/proc/<pid>/stat (proc(5)). The comm field may hold spaces and parentheses: split on
    the last ')'. Fields up to 41 (policy, Linux 2.5.19) must be there."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        raise ParseError(f"bad /proc/<pid>/stat {_show(text)}")
    rest = text[rpar + 2:].split()
    # rest[0] is field 3 (state); field N is rest[N-3]
    if len(rest) < 39 or len(rest[0]) != 1:
        raise ParseError(f"truncated /proc/<pid>/stat {_show(text)}")

    def field(n: int, name: str) -> int:
        return parse_uint(rest[n - 3], f"/proc/<pid>/stat {name}")

    return TaskStat(
        pid=parse_uint(text[:lpar].strip(), "/proc/<pid>/stat pid", 10),
        comm=text[lpar + 1:rpar], state=rest[0],
        minflt=field(10, "minflt"), majflt=field(12, "majflt"), utime=field(14, "utime"),
        stime=field(15, "stime"), num_threads=field(20, "num_threads"),
        processor=field(39, "processor"), policy=field(41, "policy"),
    )


# ----------------------------------------------------------------------------------------------
# PCI
# ----------------------------------------------------------------------------------------------

# drivers/pci/pci-sysfs.c prints pci_speed_string(): "16.0 GT/s PCIe" (Linux 4.17+), "8 GT/s"
# (older), "Unknown" or "Unknown speed" (older) for a link that is down or a bridge without one.
_SPEED_RE = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,2})?) GT/s(?: PCIe)?")


def parse_pci_speed(text: str) -> float | None:
    """current_link_speed / max_link_speed ("16.0 GT/s PCIe", "8 GT/s", "Unknown") -> GT/s.

    "Unknown" (a link that is down, or a bridge without a link) is None, not 0; any other text
    raises :class:`ParseError`."""
    t = text.strip()
    m = _SPEED_RE.fullmatch(t)
    if m:
        return float(m.group(1))
    if t in ("Unknown", "Unknown speed"):
        return None
    raise ParseError(f"bad PCI link speed {_show(text)}")


PCIE_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_generation(gts: float | None) -> int | None:
    return None if gts is None else PCIE_GEN_BY_GTS.get(round(gts, 1))


def parse_pci_width(text: str) -> int | None:
    """current_link_width ("16", "x16") -> lanes; 0 or 255 (no link / unknown) -> None.
    A PCIe link has at most 32 lanes: another number raises :class:`ParseError`."""
    t = text.strip()
    t = t[1:] if t[:1] in ("x", "X") else t
    n = parse_uint(t, "PCI link width", 3)
    if n in (0, 255):
        return None
    if n > 32:
        raise ParseError(f"bad PCI link width {_show(text)}")
    return n


# PCI class codes (upper 16 bits of the 24-bit class) the agent names.
PCI_CLASSES = {
    0x0100: "storage-scsi", 0x0106: "storage-sata", 0x0108: "storage-nvme",
    0x0200: "network", 0x0207: "network-infiniband", 0x0280: "network",
    0x0300: "display-vga", 0x0302: "gpu-3d", 0x0380: "display",
    0x0604: "bridge-pci", 0x0c03: "usb", 0x1200: "accelerator",
}

_CLASS_RE = re.compile(r"(?:0[xX])?([0-9a-fA-F]{1,6})")


def pci_class_name(class_hex: str) -> str:
    """The ``class`` attribute ("0x030200": class, subclass, prog-if) -> a name ("gpu-3d",
    "class-0b40" for one not named here). Raises :class:`ParseError` on anything else."""
    m = _CLASS_RE.fullmatch(class_hex.strip())
    if m is None:
        raise ParseError(f"bad PCI class {_show(class_hex)}")
    code = int(m.group(1), 16) >> 8
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
    """aer_dev_* ("RxErr 0" lines, drivers/pci/pcie/aer.c): {name: count}. A line of another
    shape raises :class:`ParseError`, so a garbage file is not "no errors"."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ParseError(f"bad AER counter line {_show(line)}")
        out[parts[0]] = parse_uint(parts[1], f"AER counter {_show(parts[0])}")
    if not out:
        raise ParseError("empty AER counter file")
    return out
