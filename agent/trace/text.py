"""The text fallback: events from the instance's ``trace`` file (kernel/trace/trace_output.c).

It is the reader where the binary layout of :mod:`.pages` is not the one known (another
word size or endianness, a future header), and the readable form the canned tests use.
Its timestamps have µs resolution only (``%5lu.%06lu``); binary ones have ns. Each line's
fields are read back from the event's print format and then given the same names and
derived fields as the binary reader's (:func:`agent.trace.event.normalize`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .event import BLOCK_EVENTS, CTX_EVENTS, Event, normalize

# The same from the text's flags column (trace_output.c trace_print_lat_fmt): its third
# character is 'Z' (NMI in a hard IRQ), 'z' (NMI), 'H' (hard IRQ in a softirq), 'h', 's', '.'.
_CTX_CHAR = {"Z": "nmi", "z": "nmi", "H": "hardirq", "h": "hardirq", "s": "softirq"}


# "          <idle>-0       [001] d.h1.   547.390127: irq_handler_entry: irq=36 name=virtio1"
# comm may hold spaces and dashes (the last "-<digits>" before the CPU column is the pid); the
# optional "(tgid)" column (option record-tgid) and the flags column (irq-info) may be absent.
_LINE_RE = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
    r"(?:(?P<flags>[\w.]{4,6})\s+)?(?P<sec>\d+)\.(?P<usec>\d{6}):\s+(?P<event>\w+):\s?(?P<rest>.*)$")
_LOST_RE = re.compile(r"CPU:(?P<cpu>\d+) \[LOST (?P<n>\d+) EVENTS\]")
_STARTED_RE = re.compile(r"#{5} CPU (?P<cpu>\d+) buffer started #{4}")

_SWITCH_RE = re.compile(
    r"prev_comm=(?P<prev_comm>.*) prev_pid=(?P<prev_pid>-?\d+) prev_prio=(?P<prev_prio>-?\d+) "
    r"prev_state=(?P<prev_state>\S+) ==> next_comm=(?P<next_comm>.*) "
    r"next_pid=(?P<next_pid>-?\d+) next_prio=(?P<next_prio>-?\d+)$")
_WAKE_RE = re.compile(r"comm=(?P<comm>.*) pid=(?P<pid>-?\d+) prio=(?P<prio>-?\d+)"
                      r"(?: target_cpu=(?P<target_cpu>\d+))?(?: success=\d+)?$")
_MIGRATE_RE = re.compile(r"comm=(?P<comm>.*) pid=(?P<pid>-?\d+) prio=(?P<prio>-?\d+) "
                         r"orig_cpu=(?P<orig_cpu>-?\d+) dest_cpu=(?P<dest_cpu>-?\d+)$")
_IRQ_ENTRY_RE = re.compile(r"irq=(?P<irq>-?\d+) name=(?P<name>.*)$")
_IRQ_EXIT_RE = re.compile(r"irq=(?P<irq>-?\d+) ret=(?P<ret>\w+)$")
_SOFTIRQ_RE = re.compile(r"vec=(?P<vec>\d+) \[action=(?P<action>\w+)\]$")
_WQ_RE = re.compile(r"work struct (?:0x)?(?P<work>[0-9a-fA-F]+): function (?P<function>\S+)")
_TLB_RE = re.compile(r"pages:(?P<pages>-?\d+) reason:(?P<reason_str>.*) \((?P<reason>-?\d+)\)$")
_SIGNAL_RE = re.compile(r"sig=(?P<sig>-?\d+) errno=(?P<errno>-?\d+) code=(?P<code>-?\d+) "
                        r"comm=(?P<comm>.*) pid=(?P<pid>-?\d+) grp=(?P<group>-?\d+) "
                        r"res=(?P<result>-?\d+)$")
# block_rq_issue / block_rq_complete: "8,0 R 4096 () 2048 + 8 none,0,0 [comm]" (the bytes
# column on issue only; the ioprio column since 6.5)
_BLOCK_RE = re.compile(r"^(?P<dev>\d+,\d+) (?P<rwbs>\S+) (?:\d+ )?\(.*?\) (?P<sector>\d+) "
                       r"\+ (?P<nr_sector>\d+)")
_KV_RE = re.compile(r"(\w+)=(\S*)")
_INT_KEYS = {"prev_pid", "prev_prio", "next_pid", "next_prio", "pid", "prio", "target_cpu",
             "orig_cpu", "dest_cpu", "irq", "vec", "pages", "reason", "vector", "cpu",
             "sig", "errno", "code", "group", "result", "sector", "nr_sector", "expires",
             "softexpires"}


def _int_or_str(key: str, v: str):
    if key in _INT_KEYS:
        try:
            return int(v, 10)
        except ValueError:
            return v
    return v


def _text_fields(name: str, rest: str) -> dict | None:
    """Fields of one event from its printed form; None when the text does not match the
    event's print format (a truncated or garbled line)."""
    if name == "sched_switch":
        m = _SWITCH_RE.match(rest)
    elif name in ("sched_waking", "sched_wakeup", "sched_wakeup_new"):
        m = _WAKE_RE.match(rest)
    elif name == "sched_migrate_task":
        m = _MIGRATE_RE.match(rest)
    elif name == "irq_handler_entry":
        m = _IRQ_ENTRY_RE.match(rest)
    elif name == "irq_handler_exit":
        m = _IRQ_EXIT_RE.match(rest)
        if m:  # printed as ret ? "handled" : "unhandled": the binary field is the int
            return {"irq": int(m.group("irq")), "ret": int(m.group("ret") == "handled")}
        return None
    elif name.startswith("softirq_"):
        m = _SOFTIRQ_RE.match(rest)
    elif name.startswith("workqueue_execute"):
        m = _WQ_RE.match(rest)
        if m:
            return {"function": m.group("function")}
        return None
    elif name == "tlb_flush":
        m = _TLB_RE.match(rest)
    elif name == "signal_generate":
        m = _SIGNAL_RE.match(rest)
    elif name in BLOCK_EVENTS:
        m = _BLOCK_RE.match(rest)
    elif name == "hrtimer_start":
        out = {k: _int_or_str(k, v) for k, v in _KV_RE.findall(rest)}
        if isinstance(out.get("function"), str):  # "%ps": "hrtimer_wakeup" (or +0x0/0x10)
            out["function"] = out["function"].split("+", 1)[0]
        for key in ("hrtimer", "mode", "was_armed"):
            out.pop(key, None)
        return out if "softexpires" in out else None
    elif name.startswith("ipi_send"):
        out = {k: _int_or_str(k, v) for k, v in _KV_RE.findall(rest)}
        for key in ("callsite", "callback"):  # "%pS": "func+0x0/0x10" -> "func"
            if isinstance(out.get(key), str):
                out[key] = out[key].split("+", 1)[0]
        return out if "callback" in out else None
    else:  # irq_vectors *_entry/_exit ("vector=236") and anything printed as key=value
        return {k: _int_or_str(k, v) for k, v in _KV_RE.findall(rest)}
    if not m:
        return None
    return {k: _int_or_str(k, v) for k, v in m.groupdict().items() if v is not None}


@dataclass
class TextStats:
    """What a text parse met besides events: lost-event markers (per CPU), CPUs whose
    buffer starts later than the others (the older part overwritten), lines it could not
    read, events it does not know, and timestamps that went backwards on one CPU."""

    lost: dict[int, int] = field(default_factory=dict)
    started: dict[int, int] = field(default_factory=dict)  # cpu -> ts of its first event
    bad_lines: int = 0
    unknown: int = 0
    backwards: int = 0


def parse_text(lines: Iterable[str], known: set[str] | None = None, *, t_from: int = 0,
               t_to: int = 1 << 63, stats: TextStats | None = None) -> list[Event]:
    """Events of ``trace`` text (header comments skipped), in ``[t_from, t_to]`` ns.

    ``known``: the event names to keep (others are counted in ``stats.unknown``); None keeps
    every event whose text parses. A line that does not parse is counted in
    ``stats.bad_lines``, never raised. A timestamp below the previous one on the same CPU
    (a clock that wrapped or was reset under the reader) is counted in ``stats.backwards``
    and that event dropped: durations never go negative."""
    st = stats if stats is not None else TextStats()
    out: list[Event] = []
    last: dict[int, int] = {}
    pending_start: set[int] = set()
    for line in lines:
        if not line or line.startswith("#"):
            m = _STARTED_RE.search(line) if line else None
            if m:
                pending_start.add(int(m.group("cpu")))
            continue
        m = _LOST_RE.search(line)
        if m:
            c = int(m.group("cpu"))
            st.lost[c] = st.lost.get(c, 0) + int(m.group("n"))
            continue
        m = _LINE_RE.match(line)
        if not m:
            st.bad_lines += 1
            continue
        name = m.group("event")
        if known is not None and name not in known:
            st.unknown += 1
            continue
        ts = int(m.group("sec")) * 1_000_000_000 + int(m.group("usec")) * 1000
        cpu = int(m.group("cpu"))
        if ts < last.get(cpu, -1):
            st.backwards += 1
            continue
        last[cpu] = ts
        if cpu in pending_start:
            pending_start.discard(cpu)
            st.started[cpu] = ts
        if ts < t_from or ts > t_to:
            continue
        fields = _text_fields(name, m.group("rest"))
        if fields is None:
            st.bad_lines += 1
            continue
        if name in CTX_EVENTS and m.group("flags") and len(m.group("flags")) >= 3:
            fields["irq_ctx"] = _CTX_CHAR.get(m.group("flags")[2], "")
        out.append(Event(ts, cpu, name, int(m.group("pid")), normalize(name, fields)))
    return out
