"""Orchestration: plan → journal → write → read back → verify; rollback; status.

Safety model (docs/tuning.md has the long form):
- the whole plan is computed, validated against what the kernel offers and checked against the
  allowlist *before* the first write: bad input changes nothing;
- every file target is resolved below its mount and refused when its real path would leave
  it (tuning.tunables.base.contained), at plan time and again for each write;
- each target's original value is durable in the journal before the write to it: the targets
  of one tunable are re-read right before its writes (so the journal holds what the kernel had
  then, not at plan time: a governor change may already have moved EPP), journalled in one
  append and one fsync, then written;
- an IRQ the kernel refuses to move (EIO/EPERM) is "unchangeable", not a failure;
- rollback restores the journal's originals (never defaults) in reverse order, dropping each
  entry once restored; drift (a value changed since we wrote it) is reported and left unless
  ``force``; entries that fail (e.g. EBUSY from ordering) get one more try at the end. The
  whole journal — format, allowlist, owners, values, containment — is validated before the
  first rollback write;
- a journal that ends in a torn record (tuning/journal.py) may have lost entries: rollback
  restores what it lists but keeps the file as it was and is not ok, status says so, apply
  refuses to build on it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collectors.host import Host
from tuning.allowlist import allowed
from tuning.findings import Finding
from tuning.journal import (
    Checkpoint,
    Journal,
    JournalError,
    StaleJournal,
    journal_path,
    load,
    locked,
    stale,
    state_exists,
)
from tuning.safepath import UnsafePath
from tuning.tunables import (
    MANUAL,
    PENDING_REBOOT,
    WRITE,
    Change,
    Tunable,
    TuneContext,
    TuneError,
    all_tunables,
    by_id,
)
from tuning.tunables.base import KEEP, contained, is_file_target

# Plan item states
PLANNED, IN_PLACE, NOT_ASKED, UNAVAILABLE, SKIPPED = (
    "planned", "in-place", "not-asked", "unavailable", "skipped")


@dataclass
class PlanItem:
    tunable: Tunable
    state: str
    reason: str = ""
    desired: dict[str, str] = field(default_factory=dict)
    current: dict[str, str | None] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    # what the plan does in words, when the tunable says more than its changes (isolate.tasks:
    # how many tasks move, which pinned ones stay)
    note: str = ""

    def to_dict(self) -> dict:
        return {"id": self.tunable.id, "title": self.tunable.title, "state": self.state,
                "reason": self.reason, "note": self.note,
                "changes": [c.to_dict() for c in self.changes]}


@dataclass
class Plan:
    items: list[PlanItem]

    @property
    def changes(self) -> list[Change]:
        return [c for it in self.items for c in it.changes]

    @property
    def writes(self) -> list[Change]:
        return [c for c in self.changes if c.kind == WRITE]


def selected(tid: str, only: list[str] | None, skip: list[str] | None) -> bool:
    """``--only``/``--skip`` match a tunable id or its family prefix ("gpu" → "gpu.*")."""
    def hit(pats: list[str]) -> bool:
        return any(tid == p or tid.startswith(p.rstrip(".") + ".") for p in pats)
    if only and not hit(only):
        return False
    return not (skip and hit(skip))


def check_selection(only: list[str] | None, skip: list[str] | None) -> None:
    """Refuse an ``--only``/``--skip`` value that names no tunable id or family: a typo in
    ``--skip gpus`` must not silently tune the GPU."""
    ids = [t.id for t in all_tunables()]
    for opt, values in (("--only", only), ("--skip", skip)):
        for v in values or []:
            if not any(selected(tid, [v], None) for tid in ids):
                families = sorted({tid.split(".")[0] for tid in ids})
                raise TuneError(f"{opt} {v!r} matches no tunable (families: "
                                f"{', '.join(families)}; ids: {', '.join(ids)})")


def make_plan(ctx: TuneContext, only: list[str] | None = None,
              skip: list[str] | None = None) -> Plan:
    """Read the host and diff current → desired for every tunable. Writes nothing.
    Raises TuneError on values the kernel does not offer, bad CPU lists or an ``only``/``skip``
    value that names nothing."""
    check_selection(only, skip)
    items = []
    for t in all_tunables():
        if not selected(t.id, only, skip):
            items.append(PlanItem(t, SKIPPED, "skipped (--only/--skip)"))
            continue
        if t.wanted(ctx) is None:
            items.append(PlanItem(t, NOT_ASKED, f"profile does not ask ({t.key})"))
            continue
        try:
            reason = t.available(ctx)
        except (ValueError, IndexError, KeyError) as exc:
            raise _malformed(t, exc) from None
        if reason:
            items.append(PlanItem(t, UNAVAILABLE, reason))
            continue
        it = PlanItem(t, IN_PLACE)
        _diff(ctx, it)
        items.append(it)
    return Plan(items)


def _malformed(t: Tunable, exc: Exception) -> TuneError:
    """A host file a tunable parses holds something no kernel writes (an empty selector file
    in a tree copy, a truncated list): one clear error, nothing written."""
    return TuneError(f"{t.id}: unexpected content in the host's files ({exc}); nothing was "
                     "written")


def check_contained(ctx: TuneContext, targets) -> None:
    """Refuse (TuneError) any file target whose real path leaves its mount (a symlink in a
    --root tree pointing out of it). A target that is not there is left to the write, which
    reports it."""
    for target in targets:
        if not is_file_target(target):
            continue
        try:
            contained(ctx.host, target)
        except UnsafePath as exc:
            raise TuneError(f"refusing {target}: {exc}; nothing was written") from None
        except OSError:
            continue


def _diff(ctx: TuneContext, it: PlanItem) -> None:
    """(Re)compute ``it``'s desired values, current values and changes from the host as it is
    now. Raises TuneError."""
    t = it.tunable
    try:
        desired = t.desired(ctx)
        check_contained(ctx, desired)
        current = t.read(ctx, desired)
        changes = t.plan(desired, current)
        changes = [c if c.detail else _with_detail(t, ctx, c) for c in changes]
    except (ValueError, IndexError, KeyError) as exc:
        raise _malformed(t, exc) from None
    for c in changes:
        if c.kind in (WRITE, KEEP) and not allowed(c.target):
            raise TuneError(f"internal: {c.target} is not on the allowlist (bug; nothing "
                            "was written)")
    it.desired, it.current, it.changes = desired, current, changes
    it.state = PLANNED if changes else IN_PLACE
    note = getattr(t, "plan_note", None)  # only some tunables have one (isolate.tasks)
    it.note = note(ctx) if callable(note) else ""


def _with_detail(t: Tunable, ctx: TuneContext, c: Change) -> Change:
    d = t.detail(ctx, c.target)
    if not d:
        return c
    return Change(c.tunable, c.target, c.current, c.desired, c.kind, c.scope, c.index, d)


# ----------------------------------------------------------------------------------------------
# Privilege
# ----------------------------------------------------------------------------------------------


def require_privilege(host: Host, euid: int | None = None) -> None:
    """Refuse, with one message, to change the running kernel without root.

    On a tree copy (``--root DIR`` with neither mount the real one) the file system's own
    permissions decide: the copy belongs to whoever made it, and no kernel state is at stake.
    """
    if not host.touches_live:
        return
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        raise TuneError("changing kernel settings needs root (CAP_SYS_ADMIN and write access "
                        "to /proc/sys, /sys and /proc/irq): retry with sudo")


# ----------------------------------------------------------------------------------------------
# Apply
# ----------------------------------------------------------------------------------------------

APPLIED, ALREADY, UNCHANGEABLE, FAILED, NOT_HELD, DRY_RUN = (
    "applied", "already", "unchangeable", "failed", "not-held", "dry-run")


@dataclass
class Outcome:
    change: Change
    result: str
    message: str = ""
    readback: str | None = None

    def to_dict(self) -> dict:
        return {**self.change.to_dict(), "result": self.result, "message": self.message,
                "readback": self.readback}


@dataclass
class ApplyReport:
    outcomes: list[Outcome]
    findings: list[Finding]
    journal: str

    @property
    def ok(self) -> bool:
        return not any(o.result in (FAILED, NOT_HELD) for o in self.outcomes)


def _boot_id(host: Host) -> str | None:
    return host.boot_id()


def _check_known(j: Journal) -> None:
    """Refuse the whole journal before anything is written unless every entry names a known
    tunable, a target of *that* tunable and an original it could write back (a journal that
    fails half-way through a rollback would leave the host half-restored)."""
    tunables = by_id()
    unknown = sorted({e.tunable for e in j.entries} - set(tunables))
    if unknown:
        raise JournalError(f"journal {j.path} names unknown tunable(s) {', '.join(unknown)} "
                           "(written by another version?); nothing was changed")
    checked: set[tuple[str, str]] = set()  # most originals repeat ("0-127" for every IRQ)
    for e in j.entries:
        t = tunables[e.tunable]
        if not t.owns(e.target):
            raise JournalError(f"journal {j.path}: entry {e.seq} names {e.target!r}, which is "
                               f"not a target of {e.tunable}; nothing was changed")
        if (e.tunable, e.original) in checked:
            continue
        checked.add((e.tunable, e.original))
        if not t.valid(e.original):
            raise JournalError(f"journal {j.path}: entry {e.seq} ({e.target}) has original "
                               f"{e.original[:80]!r}, which is not a valid {e.tunable} value; "
                               "nothing was changed")


def _check_contained(j: Journal, host: Host) -> None:
    """Refuse the whole journal before anything is written when one of its file targets
    resolves outside its mount on this host (a symlink planted in the tree since apply)."""
    for e in j.entries:
        if not is_file_target(e.target):
            continue
        try:
            contained(host, e.target)
        except UnsafePath as exc:
            raise JournalError(f"journal {j.path}: entry {e.seq} ({e.target}) is refused: "
                               f"{exc}; nothing was changed") from None
        except OSError:
            continue  # not there: rollback reports it unreadable and keeps it


def state_beneath(host: Host, state_dir: Path) -> Path | None:
    """The --root tree a state directory inside it must not lead out of (the default
    ROOT/run/hftagent); None on the live host or for a --state-dir elsewhere."""
    root = Path(os.path.abspath(host.root))
    if root == Path("/"):
        return None
    return root if Path(os.path.abspath(state_dir)).is_relative_to(root) else None


def _mounts(host: Host) -> tuple[str, str]:
    return str(host.procfs.resolve()), str(host.sysfs.resolve())


def _check_tree(j: Journal, host: Host) -> None:
    """Refuse a journal written against other mounts: its entries describe another tree (a
    copy's journal must never be checked against, or replayed onto, the live kernel)."""
    procfs, sysfs = _mounts(host)
    if (j.procfs, j.sysfs) != (procfs, sysfs):
        raise JournalError(f"journal {j.path} was written against procfs {j.procfs} and sysfs "
                           f"{j.sysfs}, not this host's ({procfs}, {sysfs}); nothing was "
                           "changed. Pass the --root (or --procfs/--sysfs) it was written with")


def _refuse_torn(j: Journal) -> None:
    """apply never builds on a torn journal: rewriting it would drop the torn record, and with
    it the only sign that the file may have lost entries (tuning/journal.py)."""
    if j.torn:
        raise JournalError(f"{j.torn_note()}. apply refuses to build on it: run `hftagent tune "
                           "rollback` (it restores what the journal lists and keeps the file), "
                           "check the target(s), then delete the file; nothing was changed")


def _open_journal(ctx: TuneContext, state_dir: Path, profile: str, dfd: int) -> Journal:
    j = load(state_dir, dir_fd=dfd)
    if j is not None:
        _refuse_torn(j)
        _check_tree(j, ctx.host)
        _check_known(j)
        _check_contained(j, ctx.host)
    boot = _boot_id(ctx.host)
    if j is not None and stale(j, boot):
        raise StaleJournal(
            f"journal {j.path} is from an earlier boot (boot id {j.boot_id}, now {boot}); its "
            "originals describe a kernel that no longer runs, so it is not replayed. Remove it "
            "with `hftagent tune rollback --discard-stale`")
    if j is None:
        from collectors.parsers import format_cpulist
        procfs, sysfs = _mounts(ctx.host)
        j = Journal(journal_path(state_dir), boot, profile=profile,
                    cpus=format_cpulist(ctx.cpus), procfs=procfs, sysfs=sysfs, dir_fd=dfd)
    return j


def _check_state_read_only(ctx: TuneContext, state_dir: Path) -> None:
    """What apply would refuse about its state directory and journal, found without writing
    anything (``--dry-run``): a path that is not a directory or cannot be created, a symlink
    out of the root, a journal that is corrupt, of another tree or boot. Raises JournalError."""
    beneath = state_beneath(ctx.host, state_dir)
    j = load(state_dir, beneath=beneath)
    if j is None:
        absolute = Path(os.path.abspath(state_dir))
        probe = absolute
        while not os.path.lexists(probe) and probe != probe.parent:
            probe = probe.parent
        if probe != absolute and not (os.path.isdir(probe) and
                                      os.access(probe, os.W_OK | os.X_OK)):
            raise JournalError(f"state directory {state_dir} cannot be created ({probe} is "
                               "not a writable directory)")
        return
    _refuse_torn(j)
    _check_tree(j, ctx.host)
    _check_known(j)
    _check_contained(j, ctx.host)
    boot = _boot_id(ctx.host)
    if stale(j, boot):
        raise StaleJournal(
            f"journal {j.path} is from an earlier boot (boot id {j.boot_id}, now {boot}); "
            "apply would refuse it. Remove it with `hftagent tune rollback --discard-stale`")


def apply_plan(ctx: TuneContext, plan: Plan, state_dir: Path, *, profile: str = "",
               dry_run: bool = False, checkpoint: Checkpoint | None = None) -> ApplyReport:
    """Journal, write, read back, verify every change of ``plan``.

    Each tunable's desired values are computed again, in ORDER, right before its writes: some
    depend on an earlier write (``min_freq = "max"`` copies scaling_max_freq, which turning
    turbo off has just lowered; the kernel would clamp a floor above it). ``plan`` is updated
    to what was actually applied, and verify compares against that."""
    cp = checkpoint or (lambda _step: None)
    outcomes: list[Outcome] = []
    unchangeable: dict[str, set[str]] = {}
    if dry_run:
        _check_state_read_only(ctx, state_dir)
        outcomes = [Outcome(c, DRY_RUN if c.kind == WRITE else c.kind) for c in plan.changes]
        return ApplyReport(outcomes, [], str(journal_path(state_dir)))
    with locked(state_dir, beneath=state_beneath(ctx.host, state_dir)) as dfd:
        j = _open_journal(ctx, state_dir, profile, dfd)
        for it in plan.items:
            if it.state in (PLANNED, IN_PLACE):
                try:
                    _diff(ctx, it)
                except TuneError as exc:  # the host changed under us since planning
                    outcomes += [Outcome(c, FAILED, str(exc)) for c in it.changes]
                    continue
            _apply_item(ctx, it, j, cp, outcomes, unchangeable)
        j.save(cp)  # the drops still queued (writes that did not happen); deletes an empty one
    findings = verify_plan(ctx, plan, unchangeable)
    return ApplyReport(outcomes, findings, str(journal_path(state_dir)))


def _apply_item(ctx: TuneContext, it: PlanItem, j: Journal, cp: Callable[[str], None],
                outcomes: list[Outcome], unchangeable: dict[str, set[str]]) -> None:
    """Journal, write and read back every change of one tunable.

    ``it`` was diffed against the host right before this call (``_diff``, after every earlier
    tunable's writes), so each change's ``current`` is the value the kernel has now; the
    originals of all those that need a write are journalled in one append and one fsync
    (``j.save``) before the first write. After a
    write that failed, what the journal says is corrected: a value that changed anyway stays
    journalled (fsynced at once), a write that did not happen is taken back out (queued: a
    lost drop only makes rollback find the original in place)."""
    t = it.tunable
    batch: list[tuple[Change, str, str | None]] = []
    kept = False
    for ch in it.changes:
        if ch.kind in (PENDING_REBOOT, MANUAL):
            outcomes.append(Outcome(ch, ch.kind, ch.detail))
            continue
        cur = ch.current
        if ch.kind == KEEP:
            if cur is not None and j.get(ch.target) is None:
                j.record(ch.tunable, ch.target, cur, cur, ch.detail)
                kept = True
            outcomes.append(Outcome(ch, ALREADY, "journalled at its value (rollback restores "
                                    "it)", cur))
            continue
        if cur == ch.desired:
            outcomes.append(Outcome(ch, ALREADY, "already in place", cur))
            continue
        if cur is None:
            if t.gone(ctx, ch.target):  # a task that exited since the survey: nothing to move
                outcomes.append(Outcome(ch, GONE, "exited before its original could be read: "
                                        "nothing to move"))
                continue
            outcomes.append(Outcome(ch, FAILED, "unreadable: original cannot be saved, so "
                                    "it is not written"))
            continue
        prev = j.get(ch.target)
        batch.append((ch, cur, prev.written if prev else None))
        j.record(ch.tunable, ch.target, cur, ch.desired, ch.detail)
    if not batch:
        if kept:
            j.save(cp)
        return
    j.save(cp)
    cp("journaled")
    for ch, cur, prev_written in batch:
        try:
            t.write(ctx, ch.target, ch.desired)
        except OSError as exc:
            msg = _why(exc)
            if t.gone(ctx, ch.target):  # a task that exited in between: nothing to move
                if prev_written is None:
                    j.drop(ch.target)
                outcomes.append(Outcome(ch, GONE, "exited before it could be changed"))
                continue
            # A failed write may still have changed the value (sysfs took the bytes and a
            # short write was reported as EIO; `systemctl stop` exited non-zero although
            # the unit stopped). Only a value still equal to the original proves nothing
            # happened; anything else stays journalled so rollback can restore it. A write
            # refused before the open (UnsafePath) never happened.
            after = cur if isinstance(exc, UnsafePath) else t.read_target(ctx, ch.target)
            if after != cur:
                j.record(ch.tunable, ch.target, cur, after if after is not None
                         else ch.desired, ch.detail)
                j.save(cp)
                now = "unreadable" if after is None else repr(after)
                outcomes.append(Outcome(ch, FAILED, f"{msg}; the value changed anyway "
                                        f"(now {now}): kept in the journal, `tune "
                                        "rollback` restores it", after))
                continue
            # The write did not happen: take the entry back out (or restore its previous
            # "written"), so the journal only lists targets we changed.
            if prev_written is None:
                j.drop(ch.target)
            else:
                j.record(ch.tunable, ch.target, cur, prev_written, ch.detail)
                j.save(cp)
            if t.unchangeable(exc):
                unchangeable.setdefault(t.id, set()).add(ch.target)
                outcomes.append(Outcome(ch, UNCHANGEABLE, f"kernel refuses to move it "
                                        f"({msg})", cur))
            else:
                outcomes.append(Outcome(ch, FAILED, msg, cur))
            continue
        cp("written")
        back = t.read_target(ctx, ch.target)
        if back == ch.desired:
            outcomes.append(Outcome(ch, APPLIED, "", back))
        else:
            outcomes.append(Outcome(ch, NOT_HELD, f"read back {back!r}", back))
            if back is not None and back != cur:
                # remember what the kernel made of our write, so rollback does not call
                # its own normalisation "drift"
                j.record(ch.tunable, ch.target, cur, back, ch.detail)
                j.save(cp)


def _why(exc: OSError) -> str:
    """The error's own text (systemctl's stderr, NVML's reason, "short write ...") with the
    errno's name in front when the text does not already say it."""
    text = exc.strerror or str(exc)
    std = os.strerror(exc.errno) if exc.errno else ""
    return text if not std or std in text else f"{std}: {text}"


def verify_plan(ctx: TuneContext, plan: Plan,
                unchangeable: dict[str, set[str]] | None = None) -> list[Finding]:
    """Read back every planned tunable and compare with the profile (unchangeable IRQs
    excluded and listed)."""
    out = []
    for it in plan.items:
        if it.state not in (PLANNED, IN_PLACE):
            continue
        skip = (unchangeable or {}).get(it.tunable.id, set())
        desired = {t: v for t, v in it.desired.items() if t not in skip}
        f = it.tunable.verify(ctx, desired)
        if skip:
            f.data["unchangeable"] = sorted(skip)
        out.append(f)
    return out


# ----------------------------------------------------------------------------------------------
# Rollback
# ----------------------------------------------------------------------------------------------

RESTORED, WAS_ORIGINAL, DRIFT, UNREADABLE, DISCARDED, GONE = (
    "restored", "was-original", "drift", "unreadable", "discarded", "gone")


@dataclass
class RollbackItem:
    tunable: str
    target: str
    original: str
    written: str
    current: str | None
    result: str
    message: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class RollbackReport:
    items: list[RollbackItem]
    journal: str
    remaining: int          # entries the journal still names (a torn record counts as one)
    note: str = ""
    torn: bool = False      # the journal ends in a torn record: kept as it was, never deleted

    @property
    def ok(self) -> bool:
        return self.remaining == 0 and not self.torn


def rollback(ctx: TuneContext, state_dir: Path, *, force: bool = False,
             discard_stale: bool = False, checkpoint: Checkpoint | None = None) -> RollbackReport:
    """Restore every journalled original in reverse order. Idempotent.

    The whole journal is validated first (format, allowlist, tunables, values, the tree it
    belongs to, containment of every target): a bad entry anywhere stops it before the first
    write. Entries restored are dropped from the journal in one append at the end (or the file
    is deleted): a rollback killed half-way leaves them listed, and the next one finds them
    at their original value.

    A journal that ends in a torn record (tuning/journal.py) named one entry more than can be
    read, so this rollback restored fewer than it names: whatever it restores, the file is
    kept exactly as it was (never rewritten, never deleted) and the report is not ``ok``."""
    cp = checkpoint or (lambda _step: None)
    jpath = journal_path(state_dir)
    beneath = state_beneath(ctx.host, state_dir)
    if not state_exists(state_dir, beneath=beneath):  # do not create it to find nothing
        return RollbackReport([], str(jpath), 0, "no journal: nothing to roll back")
    with locked(state_dir, beneath=beneath) as dfd:  # also removes temp files of a dead apply
        j = load(state_dir, dir_fd=dfd)
        if j is None:
            return RollbackReport([], str(jpath), 0, "no journal: nothing to roll back")
        _check_tree(j, ctx.host)
        boot = _boot_id(ctx.host)
        if stale(j, boot):
            if discard_stale:
                n = len(j.entries)
                old = j.boot_id
                j.clear()
                j.save()
                return RollbackReport([], str(jpath), 0, f"discarded a journal of {n} entries "
                                      f"from an earlier boot ({old})")
            raise StaleJournal(
                f"journal {jpath} is from an earlier boot (boot id {j.boot_id}, now {boot}): "
                "the reboot already reset those settings, so it is not replayed. Remove it "
                "with `hftagent tune rollback --discard-stale`")
        tunables = by_id()
        _check_known(j)
        _check_contained(j, ctx.host)
        items: list[RollbackItem] = []
        retry = []
        for e in sorted(j.entries, key=lambda x: x.seq, reverse=True):
            t = tunables[e.tunable]
            cur = t.read_target(ctx, e.target)
            if cur is None and t.gone(ctx, e.target):
                j.drop(e.target)
                items.append(RollbackItem(e.tunable, e.target, e.original, e.written, cur, GONE,
                                          "no longer exists (a task that exited): nothing "
                                          "to restore"))
                continue
            if cur is None:
                items.append(RollbackItem(e.tunable, e.target, e.original, e.written, cur,
                                          UNREADABLE, "cannot read current value; kept"))
                continue
            if cur == e.original:
                j.drop(e.target)
                items.append(RollbackItem(e.tunable, e.target, e.original, e.written, cur,
                                          WAS_ORIGINAL))
                continue
            # an entry journalled at its own value (a KEEP change: apply never writes it, a side
            # effect of apply may change it, e.g. an IRQ thread's affinity under a cpuset
            # partition change) is restored whatever it reads now
            keep = e.original == e.written
            if cur not in (e.written, e.before) and not force and not keep:
                items.append(RollbackItem(e.tunable, e.target, e.original, e.written, cur, DRIFT,
                                          f"changed since we wrote {e.written!r}: left as is "
                                          "(--force restores the original anyway)"))
                continue
            item = _restore(ctx, t, j, e, cur, cp)
            if item.result == FAILED:
                retry.append((t, e, cur))
            else:
                items.append(item)
        # Second pass: a restore can depend on another made later in the loop (intel_pstate
        # refuses a non-performance EPP with EBUSY until the governor is back).
        for t, e, cur in retry:
            items.append(_restore(ctx, t, j, e, cur, cp))
        if j.torn:  # keep the file as it is: the torn record is the only trace of what it lost
            return RollbackReport(items, str(jpath), len(j.entries) + 1,
                                  f"{j.torn_note()}. The file is kept as it was: check, then "
                                  "delete it", torn=True)
        j.save(cp)
    return RollbackReport(items, str(jpath), len(j.entries))


def _restore(ctx: TuneContext, t: Tunable, j: Journal, e, cur: str, cp: Callable) -> RollbackItem:
    error = ""
    try:
        t.write(ctx, e.target, e.original)
    except OSError as exc:
        error = _why(exc)
        # the write may have taken effect although it reported an error: look before retrying
        back = t.read_target(ctx, e.target)
        if back != e.original:
            return RollbackItem(e.tunable, e.target, e.original, e.written, back, FAILED, error)
    cp("restored")
    back = t.read_target(ctx, e.target)
    if back != e.original:
        return RollbackItem(e.tunable, e.target, e.original, e.written, back, FAILED,
                            f"read back {back!r}; kept in the journal")
    j.drop(e.target)
    return RollbackItem(e.tunable, e.target, e.original, e.written, back, RESTORED,
                        f"restored, although the write reported: {error}" if error else "")


# ----------------------------------------------------------------------------------------------
# Status
# ----------------------------------------------------------------------------------------------

HOLDS = "holds"


@dataclass
class StatusReport:
    items: list[RollbackItem]
    journal: str
    exists: bool
    stale: bool = False
    boot_id: str | None = None
    profile: str = ""
    cpus: str = ""
    torn: str = ""  # the journal's torn-record note ("" when the file is whole)

    @property
    def all_hold(self) -> bool:
        return not self.torn and all(i.result in (HOLDS, GONE) for i in self.items)


def status(ctx: TuneContext, state_dir: Path) -> StatusReport:
    """What the journal says is applied, and whether each value still holds. Read-only."""
    jpath = journal_path(state_dir)
    j = load(state_dir, beneath=state_beneath(ctx.host, state_dir))
    if j is None:
        return StatusReport([], str(jpath), False)
    _check_tree(j, ctx.host)
    if stale(j, _boot_id(ctx.host)):
        return StatusReport([], str(jpath), True, True, j.boot_id, j.profile, j.cpus)
    _check_known(j)
    _check_contained(j, ctx.host)
    tunables = by_id()
    items = []
    for e in j.entries:
        t = tunables.get(e.tunable)
        cur = t.read_target(ctx, e.target) if t else None
        if cur is None and t is not None and t.gone(ctx, e.target):
            res = GONE
        elif cur is None:
            res = UNREADABLE
        elif cur == e.written:
            res = HOLDS
        elif cur == e.original:
            res = WAS_ORIGINAL
        else:
            res = DRIFT
        items.append(RollbackItem(e.tunable, e.target, e.original, e.written, cur, res))
    return StatusReport(items, str(jpath), True, False, j.boot_id, j.profile, j.cpus,
                        j.torn_note())


# ----------------------------------------------------------------------------------------------
# Context (composition: the CLI calls this once)
# ----------------------------------------------------------------------------------------------


def resolve_target_cpus(host: Host, spec: str | None) -> tuple[list[int], list[int]]:
    """(target CPUs, online CPUs) by the one rule of tuning/targets.py (isolated, else
    nohz_full, else all online but the housekeeping core). Raises TuneError."""
    from tuning.targets import TargetError, resolve
    try:
        plan = resolve(host, spec)
    except TargetError as exc:
        raise TuneError(str(exc)) from None
    return plan.cpus, plan.online


def build_context(host: Host, profile, cpus: str | None, *, want_gpu: bool = False,
                  gpu=None, services=None) -> TuneContext:
    """Wire a TuneContext. Services and NVML are only attached on the live host (a tree copy
    has neither a service manager nor GPUs behind it); tests pass fakes explicitly."""
    target, online = resolve_target_cpus(host, cpus)
    ctx = TuneContext(host, profile, target, online)
    live = host.touches_live
    if services is not None:
        ctx.services = services
    elif live:
        from tuning.tunables.irq import SystemctlServices
        ctx.services = SystemctlServices()
    else:
        ctx.services_reason = "service control only on the live host (--root given)"
    if gpu is not None:
        ctx.gpu = gpu
    elif want_gpu and live:
        try:
            from collectors.gpu import Nvml
        except ImportError as exc:  # the GPU module is optional at this layer
            ctx.gpu_reason = f"unsupported: NVML adapter unavailable ({exc})"
        else:
            from tuning.tunables.gpu import NvmlControl
            ctx.gpu = NvmlControl(Nvml())
    elif not live:
        ctx.gpu_reason = "GPU settings only on the live host (--root given)"
    return ctx


def wants_gpu(profile, only: list[str] | None, skip: list[str] | None) -> bool:
    """Whether any GPU tunable is asked for (so NVML is not even initialised otherwise)."""
    for key, tid in (("gpu_persistence", "gpu.persistence"),
                     ("gpu_compute_mode", "gpu.compute_mode")):
        if profile.expected(key) not in (None, "any") and selected(tid, only, skip):
            return True
    return False
