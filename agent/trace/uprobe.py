"""uprobe events of our own: defined in tracefs's ``uprobe_events``, enabled only in watch's
private calls instance (:mod:`.calls`), removed on every exit path.

Kernel interface (Documentation/trace/uprobetracer.rst, ``CONFIG_UPROBE_EVENTS``)::

    p:GROUP/NAME PATH:0xOFFSET          # entry
    r:GROUP/NAME PATH:0xOFFSET          # return (uretprobe)
    -:GROUP/NAME                        # remove (EBUSY while enabled anywhere: disable first)

``uprobe_events`` is global: it is only ever opened ``O_WRONLY|O_APPEND`` (a plain open for
writing truncates it, which removes *every* uprobe event on the box, other tools' too;
Python's ``open(..., "a")`` seeks and gets EINVAL). Our group is ``hftagent_<pid>`` (watch's
pid). Every exit path removes it:

- a normal exit, an exception, SIGINT and SIGTERM (watch's handlers end through a normal
  exit): :meth:`Uprobes.remove`, also from ``atexit`` (:class:`_AtExit`);
- SIGKILL, the OOM killer, a crash: the process's guardian (:mod:`.guardian`, started before
  the first definition), which disables and removes the group within a second;
- a guardian killed with its parent: the next start of watch or cpus
  (:func:`remove_stale`, through :meth:`agent.trace.EventSource.open`), which removes the
  groups whose creator is gone — dead, a zombie, or its pid now running another process —
  and only those (:func:`_alive`); an event of another tool is never touched.

:class:`Uprobes` defines and removes the events; :class:`UprobeEvents` (part of
:class:`agent.trace.tracefs.EventSource`) enables them in watch's calls instance and reads
their hits from its rings.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import time
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple

from collectors.host import Host

from .calls import KERNEL_DRAIN_S
from .event import Event, parse_format
from .guardian import guard, guardian_of
from .instance import PREFIX as INSTANCE_PREFIX
from .instance import _proc_is_dead_or_reused, _read
from .pages import id_hits, iter_page

PREFIX = "hftagent_"
MAX_FILTER_TIDS = 64    # beyond this many threads, record every hit and pair by tid set
_GROUP_RE = re.compile(r"^[pr]:(hftagent_(\d+))/(\S+)\s")


class UprobeHit(NamedTuple):
    """One uprobe hit as watch --attach pairs it: what an :class:`Event` of it would say
    that the pairing reads (its fields, the probed address, are never read)."""

    ts_ns: int
    cpu: int
    pid: int   # common_pid: the thread
    name: str  # call<i> or ret<i>


_TS = attrgetter("ts_ns")
_new = tuple.__new__
# the fields every uprobe event has (entry: the probed address; return: the function and
# the return address): nothing else to decode for the pairing
_PROBE_FIELDS = frozenset({"__probe_ip", "__probe_func", "__probe_ret_ip"})


class UprobeError(Exception):
    """The kernel refused a uprobe, or has none (message for the user)."""


def group_name(pid: int | None = None) -> str:
    return f"{PREFIX}{os.getpid() if pid is None else pid}"


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _kernel_says(tracefs: Path) -> str:
    """The last line of tracefs's error_log (Linux 5.4+): why the kernel refused a definition."""
    try:
        lines = (tracefs / "error_log").read_text().strip().splitlines()
    except OSError:
        return ""
    return lines[-2].strip() if len(lines) >= 2 else (lines[-1].strip() if lines else "")


def available(tracefs: Path) -> str | None:
    """None when uprobe events can be defined here, else ``unsupported: <reason>``."""
    p = tracefs / "uprobe_events"
    if not p.exists():
        return ("unsupported: this kernel has no uprobe events (CONFIG_UPROBE_EVENTS=n: "
                f"{p} is missing)")
    if not os.access(p, os.W_OK):
        return f"unsupported: cannot write {p} (needs root)"
    return None


class Uprobes:
    """The events of one attach: ``call<i>`` (entry) and ``ret<i>`` (return) per target, in
    group ``hftagent_<our pid>``. Use :meth:`define`, :meth:`enable` in an instance,
    :meth:`remove` (also at exit)."""

    def __init__(self, tracefs: Path, targets) -> None:
        self.tracefs = tracefs
        self.group = group_name()
        self.targets = list(targets)
        self.names: list[str] = []          # defined, in order
        self.instances: list[Path] = []     # where enabled
        self.returns: set[str] = set()      # names of return events
        self.dropped: set[str] = set()      # defined, disabled by drop()
        self._removed = False
        # the targets' pinned libraries (agent.trace.attach.Pinned), each once: ours from
        # here on, kept open while the events live, closed by remove()
        self._pins = list({id(t.pin): t.pin for t in self.targets
                           if getattr(t, "pin", None) is not None}.values())

    def define(self) -> None:
        """Define every target's events on its pinned library (``/proc/self/fd/N`` of our
        descriptor: the kernel follows it to the very file whose symbols were read, not to
        whatever the target maps at that path now), then check that the target still maps
        that file; on any refusal or change remove what was defined and raise
        :class:`UprobeError` with the reason."""
        why = available(self.tracefs)
        if why:
            raise UprobeError(why)
        _AT_EXIT.add(self)
        guard(self.tracefs)   # before the group: a SIGKILL removes it too, and it is our witness
        try:
            for i, t in enumerate(self.targets):
                self._define_one(i, t)
            for pinned in self._pins:
                moved = pinned.moved()
                if moved:
                    raise UprobeError(moved)
        except BaseException:
            self.remove()
            raise

    # the events' names (entry, return) + the target's index; a subclass names its own
    ENTRY, RETURN = "call", "ret"

    def _fetch(self, t) -> str:
        """The entry event's fetch arguments (" name=%reg:type ..."), none here."""
        return ""

    def _where(self, t) -> str:
        return f"uprobe on {t.library}:0x{t.offset:x}"

    def _define_one(self, i: int, t) -> None:
        if getattr(t, "pin", None) is None or t.pin.fd < 0:
            raise UprobeError(f"{t.library}: no open descriptor of the library (attach.plan "
                              "pins it): refused")
        for kind, name in (("p", f"{self.ENTRY}{i}"), ("r", f"{self.RETURN}{i}")):
            if kind == "r" and not t.returns:
                continue
            args = self._fetch(t) if kind == "p" else ""
            try:
                _append(self.tracefs / "uprobe_events",
                        f"{kind}:{self.group}/{name} {t.pin.probe_path}:0x{t.offset:x}{args}")
            except OSError as exc:
                said = _kernel_says(self.tracefs)
                raise UprobeError(
                    f"the kernel refused the {self._where(t)}: "
                    f"{exc.strerror or exc}" + (f" ({said})" if said else "")) from None
            self.names.append(name)
            if kind == "r":
                self.returns.add(name)

    def enable(self, instance: Path, tids: list[int] | None) -> None:
        """Enable every event in tracefs instance ``instance``, filtered to ``tids``."""
        self.instances.append(instance)
        self.set_filter(instance, tids)
        for name in self.names:
            (instance / "events" / self.group / name / "enable").write_text("1")

    def set_filter(self, instance: Path, tids: list[int] | None) -> None:
        """The events' filter: ``common_pid == a || ...`` for up to :data:`MAX_FILTER_TIDS`
        threads (refreshed as threads come and go); beyond that, none (the pairing keeps
        only the process's threads)."""
        expr = "0"   # writing 0 to an event's filter file clears the filter
        if tids and len(tids) <= MAX_FILTER_TIDS:
            expr = " || ".join(f"common_pid == {t}" for t in sorted(set(tids)))
        for name in self.names:
            (instance / "events" / self.group / name / "filter").write_text(expr)

    def drop(self, indices: set[int]) -> list[str]:
        """Disable the events of targets ``indices`` in every instance (a trial's losers:
        watch --attach keeps the runtime whose calls arrive): a uprobe is registered only
        while its event is enabled somewhere, so their breakpoints go at once and their
        functions cost nothing more. Their definitions (and pinned libraries) stay until
        :meth:`remove`: removing a definition while the run goes on empties every ring
        buffer (measured on 6.18: ~160 ms of calls and kernel events lost at once). Returns
        the event names disabled."""
        gone = [n for n in self.names if n not in self.dropped
                and int(n.removeprefix("call").removeprefix("ret")) in indices]
        for inst in self.instances:
            for name in gone:
                (inst / "events" / self.group / name / "enable").write_text("0")
        self.dropped.update(gone)
        return gone

    def _remove_names(self, names: list[str]) -> list[str]:
        for inst in self.instances:
            for name in names:
                try:
                    (inst / "events" / self.group / name / "enable").write_text("0")
                except OSError:
                    pass   # the instance is already gone: nothing is enabled there
        left: list[str] = []
        for name in reversed(names):
            try:
                _append(self.tracefs / "uprobe_events", f"-:{self.group}/{name}")
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    left.append(f"{self.group}/{name}: {exc.strerror or exc}")
        return left

    def remove(self) -> list[str]:
        """Disable the events in every instance and remove their definitions; returns what
        could not be removed (empty when all went). Safe to call twice."""
        if self._removed:
            self._close_pins()
            return []
        left = self._remove_names(self.names)
        self._removed = not left
        _AT_EXIT.discard(self)
        self._close_pins()   # a definition left behind holds the kernel's own reference
        return left

    def _close_pins(self) -> None:
        for pinned in self._pins:
            pinned.close()


def remove_stale(host: Host, tracefs: Path, alive: Callable[[int], bool] | None = None
                 ) -> list[str]:
    """Remove the uprobe groups ``hftagent_<pid>`` whose creator is gone (a watch killed
    with its guardian); never another tool's event, never a live watch's, never one this
    process holds. ``alive(pid) -> bool`` decides (default :func:`_alive`: a live process
    that is the group's creator, not a later process given the same pid). A group named
    after this process that it does not hold is a dead one's whose pid we were given.
    Returns a note per group for the user."""
    p = tracefs / "uprobe_events"
    text = host.read(p).value
    if not text:
        return []
    alive = alive or (lambda pid: _alive(host, tracefs, pid))
    held = {u.group for u in _AT_EXIT.held}
    groups: dict[tuple[str, int], list[str]] = {}
    for line in text.splitlines():
        m = _GROUP_RE.match(line + " ")
        if m and m.group(1) not in held:
            groups.setdefault((m.group(1), int(m.group(2))), []).append(m.group(3))
    return [_remove_group(host, tracefs, group, names)
            for (group, pid), names in groups.items()
            if pid == os.getpid() or not alive(pid)]


def _remove_group(host: Host, tracefs: Path, group: str, names: list[str]) -> str:
    """Disable ``group`` wherever it is enabled (an instance a killed watch left: the
    kernel refuses to remove an enabled event), then remove its events; the note."""
    inst_root = tracefs / "instances"
    for inst in [tracefs, *(inst_root / n for n in host.listdir(inst_root))]:
        en = inst / "events" / group / "enable"
        try:
            fd = os.open(en, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue   # the group is not in this instance
        try:
            os.write(fd, b"0")
        except OSError:
            pass
        finally:
            os.close(fd)
    failed = []
    for name in names:
        try:
            _append(tracefs / "uprobe_events", f"-:{group}/{name}")
        except OSError as exc:
            if exc.errno != errno.ENOENT:   # ENOENT: its guardian was faster
                failed.append(f"{name}: {exc.strerror or exc}")
    return (f"removed stale uprobe events {group} ({len(names) - len(failed)} of "
            f"{len(names)}: its process is gone)"
            + (f"; left: {', '.join(failed)}" if failed else ""))


def _alive(host: Host, tracefs: Path, pid: int) -> bool:
    """Whether ``pid`` is the live creator of group ``hftagent_<pid>``. Not when it is gone
    or a zombie; when it runs, only with a witness that it is the same process, since
    ``uprobe_events`` records no creation time (and an event directory's times are those of
    its inode, made again on each lookup): its instance ``hftagent-<pid>`` (watch makes it
    before defining the group) created after it started
    (:func:`agent.trace.instance._proc_is_dead_or_reused`), or a guardian of its own
    (:func:`agent.trace.guardian.guardian_of`, started before any definition). A pid reused
    by another process has neither."""
    st = host.read(host.proc(pid, "stat"))
    if not st.ok:
        return False
    try:
        if st.value[st.value.rindex(")") + 2] in "ZX":
            return False
    except (ValueError, IndexError):
        return True   # unreadable: leave it alone
    try:
        created = (tracefs / "instances" / f"{INSTANCE_PREFIX}{pid}").lstat().st_mtime
    except OSError:
        return guardian_of(host, pid)
    return not _proc_is_dead_or_reused(host, pid, created) or guardian_of(host, pid)


class _AtExit:
    """The Uprobes this process holds: removed at interpreter exit (watch's SIGTERM and
    SIGINT handlers end through a normal exit), and never taken for a dead process's by
    :func:`remove_stale` (the pid in their group is ours)."""

    def __init__(self) -> None:
        self.held: set[Uprobes] = set()
        self.registered = False

    def add(self, u: Uprobes) -> None:
        if not self.registered:
            atexit.register(self.run)
            self.registered = True
        self.held.add(u)

    def discard(self, u: Uprobes) -> None:
        self.held.discard(u)

    def run(self) -> None:
        for u in list(self.held):
            u.remove()


_AT_EXIT = _AtExit()


class UprobeEvents:
    """The uprobe events of :class:`agent.trace.tracefs.EventSource` (watch --attach; this
    module defines them): enabled in the source's calls instance (:mod:`.calls`: only they
    are recorded there), their hits read from its rings at each step. Uses, from the source
    it is mixed into: ``events``, ``reader``, ``_closed``, the reader's ``_formats``,
    ``_names``, ``_layout``, :meth:`drain` and ``drained_ns``, and the calls instance's
    :meth:`_open_calls` and :meth:`_calls_pages`."""

    def __init__(self) -> None:
        super().__init__()
        self._uprobe_ids: dict[int, bool] = {}    # event id -> a return probe
        self._uprobe_names: dict[str, bool] = {}
        # (ids, id -> name, ids decoded whole, common_pid at byte 4): made at the first read
        # after the events change
        self._hit_plan: tuple | None = None

    def add_uprobes(self, uprobes, tids: list[int]) -> None:
        """Enable ``uprobes`` (an :class:`Uprobes`, defined) in the calls instance (made
        now if it is not yet), filtered to ``tids``, and learn their formats;
        :meth:`uprobe_events` then returns their hits. Raises OSError or FormatError when
        the kernel refuses."""
        path = self._open_calls()
        uprobes.enable(path, tids)
        ev_dir = path / "events" / uprobes.group
        for name in uprobes.names:
            fmt = parse_format(_read(ev_dir / name / "format"), uprobes.group)
            self._formats[fmt.id] = fmt
            self._uprobe_ids[fmt.id] = name in uprobes.returns
            self._uprobe_names[fmt.name] = name in uprobes.returns
            self._names.add(fmt.name)
        self._hit_plan = None
        self.events += [f"{uprobes.group}:{n}" for n in uprobes.names]

    def uprobe_events(self) -> list[UprobeHit | Event]:
        """The uprobe hits recorded since the last call, in time order: the calls rings
        drained (their pages read once, not kept: no spike window needs them), each page
        walked for the uprobe ids by :func:`agent.trace.pages.id_hits` (no event made per
        record: a hit is its time, CPU, thread and event name; an event with arguments of
        its own beyond the probed addresses is a whole :class:`Event`). The kernel-event
        rings are drained too when :data:`~agent.trace.calls.KERNEL_DRAIN_S` has passed
        since their last drain (moved into the kept pages, not walked)."""
        pages = self.uprobe_pages()
        if not pages:
            return []
        only, names, full, fast = self._plan()
        fmts = self._formats
        out: list[UprobeHit | Event] = []
        cpus = set()
        for cpu, buf in pages:
            cpus.add(cpu)
            if not fast:  # (a common header of another shape: the events' own decoding)
                out += iter_page(buf, cpu, fmts, layout=self._layout, only=only)
            elif not full:  # (each hit made as a tuple: UprobeHit(...) is a Python call)
                out += [_new(UprobeHit, (ts, cpu, pid, names[ev]))
                        for ts, ev, pid, _start, _len in id_hits(buf, only, self._layout)]
            else:
                for ts, ev, pid, start, length in id_hits(buf, only, self._layout):
                    out.append(fmts[ev].make_event(buf, start, length, ts, cpu) if ev in full
                               else _new(UprobeHit, (ts, cpu, pid, names[ev])))
        if len(cpus) > 1:
            out.sort(key=_TS)  # (the CPUs' hits merged; one CPU's are in order already)
        return out

    def uprobe_pages(self) -> list[tuple[int, bytes]]:
        """``(cpu, page)`` of the calls rings' pages recorded since the last call, undecoded
        (:meth:`uprobe_events` decodes them; watch --attach's native pairing,
        agent/watch/latency/native_pair.py, takes them whole); the kernel-event rings are
        drained as :meth:`uprobe_events` says."""
        if self._closed or not self._uprobe_ids or self.reader != "raw":
            return []
        if time.monotonic_ns() - getattr(self, "drained_ns", 0) >= KERNEL_DRAIN_S * 1e9:
            self.drain()
        return self._calls_pages()

    def _plan(self) -> tuple:
        """(ids, id -> event name, ids decoded whole, common header of every kernel)."""
        if self._hit_plan is None:
            only = frozenset(self._uprobe_ids)
            fmts = self._formats
            # an event with arguments of its own (a GPU copy's size) is decoded whole
            self._hit_plan = (only, {i: fmts[i].name for i in only},
                              {i for i in only if any(f.name not in _PROBE_FIELDS
                                                      for f in fmts[i].fields)},
                              all(fmts[i].pid_offset == 4 for i in only))
        return self._hit_plan

    def hit_names(self) -> dict[int, str] | None:
        """Event id -> uprobe event name of every hit, where each hit is just its time, CPU,
        thread and name (:attr:`hits_are_tuples`); else None."""
        if not self._uprobe_ids:
            return None
        _only, names, full, fast = self._plan()
        return names if fast and not full else None

    @property
    def page_layout(self):
        """The calls rings' page layout (agent.trace.pages.PageLayout)."""
        return self._layout

    def is_return(self, ev: UprobeHit | Event) -> bool:
        """Whether ``ev`` is a return probe's hit (else an entry)."""
        return bool(self._uprobe_names.get(ev.name))

    def is_return_name(self, name: str) -> bool:
        """Whether the uprobe event ``name`` is a return probe's."""
        return bool(self._uprobe_names.get(name))

    @property
    def hits_are_tuples(self) -> bool:
        """Whether the last :meth:`uprobe_events` gave every hit as an :class:`UprobeHit`,
        which a reader may unpack as ``(ts_ns, cpu, pid, name)``: no event of the calls
        instance is decoded whole (only a GPU copy probe's is, for its byte count) and the
        common header is every kernel's."""
        if self._hit_plan is None:
            return False
        _only, _names, full, fast = self._hit_plan
        return fast and not full

    def drop_uprobes(self, uprobes) -> list[str]:
        """Disable and remove ``uprobes`` (:meth:`Uprobes.remove`) and forget their formats;
        returns what could not be removed."""
        left = uprobes.remove()
        for i in [i for i, f in self._formats.items() if f.system == uprobes.group]:
            del self._formats[i]
            self._uprobe_ids.pop(i, None)
        for n in uprobes.names:
            self._uprobe_names.pop(n, None)
        self._hit_plan = None
        self.events = [e for e in self.events if not e.startswith(uprobes.group + ":")]
        return left
