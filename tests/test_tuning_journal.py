"""The journal: format (version 2, JSON Lines; version 1 still read), corrupt, hostile and
stale journals, linear cost, the state directory, and the kill-at-every-write crash test.

Crash test: apply runs in a forked child that dies with ``os._exit`` (no cleanup, no finally
blocks, like SIGKILL) at the k-th step — after the journal temp file is written but before its
rename (creation, rewrite of a version-1 journal), after each tunable's originals are appended
and fsynced, after each target write — for every k, starting from no journal, from a version-2
journal of an earlier apply and from a version-1 journal of an earlier release. A rollback in
the parent must then restore the tree byte for byte. The same for a rollback killed half-way,
and for an append torn at any byte.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from collectors.host import Host
from tests.treecopy import KernelSim, diff, make_synthetic, snapshot
from tuning.apply import apply_plan, build_context, make_plan, rollback, status
from tuning.journal import (
    FORMAT,
    FORMAT_V1,
    MAX_BYTES,
    MAX_RECORD_BYTES,
    VERSION,
    Journal,
    JournalError,
    StaleJournal,
    load,
    locked,
)
from tuning.profiles import load_profile

# In the crash tests one write changes the value and *then* fails (EIO after sysfs took the
# bytes), in apply and in rollback alike: that target must be journalled and restored too.
FLAKY = {"intel_pstate/min_perf_pct": errno.EIO}


def _ctx(root: Path, profile: str = "bench", flaky: bool = False, cpus: str = "1"):
    ctx = build_context(Host(root), load_profile(profile), cpus)
    ctx.writer = KernelSim(fail_after=FLAKY if flaky else None)
    return ctx


def _count_steps(root: Path, fn) -> list[str]:
    steps: list[str] = []
    fn(_ctx(root, flaky=True), steps.append)
    return steps


def _in_child_dying_at(k: int, root: Path, fn) -> int:
    """Run fn(ctx, checkpoint) in a forked child that os._exit()s at its k-th checkpoint."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            n = 0

            def cp(step: str) -> None:
                nonlocal n
                n += 1
                if n == k:
                    os._exit(137)

            fn(_ctx(root, flaky=True), cp)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - never return into pytest from the child
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)


def _apply(ctx, cp):
    apply_plan(ctx, make_plan(ctx), ctx.host.run_dir("hftagent"), checkpoint=cp)


def _rollback(ctx, cp):
    rollback(ctx, ctx.host.run_dir("hftagent"), checkpoint=cp)


def _replay(j: Path) -> tuple[dict, list[dict]]:
    """(header, entries) of a version-2 journal, replayed the way tuning.journal does."""
    lines = j.read_text().split("\n")
    assert lines[-1] == "", "a journal ends with a newline"
    head = json.loads(lines[0])
    entries: dict[str, dict] = {}
    for line in lines[1:-1]:
        rec = json.loads(line)
        if rec["op"] == "add":
            entries[rec["target"]] = {k: v for k, v in rec.items() if k != "op"}
        elif rec["op"] == "written":
            entries[rec["target"]].update(written=rec["written"], before=rec["before"])
        else:
            del entries[rec["target"]]
    return head, list(entries.values())


def _as_v1(j: Path) -> None:
    """Rewrite a journal file the way releases before version 2 wrote it."""
    head, entries = _replay(j)
    data = {"format": FORMAT_V1, "boot_id": head["boot_id"], "created": head["created"],
            "updated": head["created"], "profile": head["profile"], "cpus": head["cpus"],
            "procfs": head["procfs"], "sysfs": head["sysfs"], "entries": entries}
    j.write_text(json.dumps(data, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------
# Crash safety
# ----------------------------------------------------------------------------------------------


def _kill_everywhere(tmp_path, prepare=None) -> int:
    """Apply (bench) killed at every step k, after ``prepare(root)`` (an earlier journal);
    then rollback must restore the pristine tree byte for byte. Returns the step count."""
    pristine = snapshot(make_synthetic(tmp_path / "proto", ncpus=2))

    def tree(name: str) -> Path:
        root = make_synthetic(tmp_path / name, ncpus=2)
        if prepare:
            prepare(root)
        return root

    steps = _count_steps(tree("count"), _apply)
    for k in range(1, len(steps) + 1):
        root = tree(f"k{k}")
        assert _in_child_dying_at(k, root, _apply) == 137
        ctx = _ctx(root, flaky=True)
        rb = rollback(ctx, ctx.host.run_dir("hftagent"))
        assert rb.remaining == 0, (k, steps[k - 1], [i.to_dict() for i in rb.items])
        assert diff(pristine, snapshot(root)) == [], f"killed at step {k} ({steps[k - 1]})"
        # the dead child's temp file (killed between write and rename) is cleaned up too
        leftovers = [p.name for p in ctx.host.run_dir("hftagent").iterdir()
                     if p.name not in ("lock",)]
        assert leftovers == [], k
    return len(steps)


def test_kill_at_every_apply_step_then_rollback_restores_everything(tmp_path):
    steps = _count_steps(make_synthetic(tmp_path / "c", ncpus=2), _apply)
    # one append+fsync per tunable (not per target), one checkpoint per target write
    assert steps.count("written") >= 20
    assert 5 <= steps.count("journaled") < steps.count("written")
    assert steps[0] == "journal-temp-written"  # the journal is created whole, atomically
    _kill_everywhere(tmp_path)


def test_kill_at_every_step_of_an_apply_over_an_earlier_journal(tmp_path):
    """The second apply appends to the first one's journal (new targets, new ``written``
    values over the first originals)."""
    def earlier(root: Path) -> None:
        prof = root.parent / f"{root.name}.toml"
        prof.write_text('extends = "hft-cpu"\n[settings.swappiness]\nexpected = 5\n')
        ctx = build_context(Host(root), load_profile(str(prof)), "1")
        ctx.writer = KernelSim()
        apply_plan(ctx, make_plan(ctx, only=["memory", "cpu.governor"]),
                   ctx.host.run_dir("hftagent"))
        assert (root / "run/hftagent/journal.json").exists()

    assert _kill_everywhere(tmp_path, earlier) > 20


def test_kill_at_every_step_of_an_apply_over_a_version1_journal(tmp_path):
    """A journal left by the previous release (version 1) on a running box: the next apply
    rewrites it as version 2 atomically, keeping its originals, wherever it is killed."""
    def earlier_v1(root: Path) -> None:
        ctx = _ctx(root, "hft-cpu")
        apply_plan(ctx, make_plan(ctx, only=["memory"]), ctx.host.run_dir("hftagent"))
        _as_v1(root / "run/hftagent/journal.json")

    assert _kill_everywhere(tmp_path, earlier_v1) > 20


def test_kill_at_every_rollback_step_then_rollback_again(tmp_path):
    proto = make_synthetic(tmp_path / "proto", ncpus=2)
    pristine = snapshot(proto)

    def applied(name: str) -> Path:
        root = make_synthetic(tmp_path / name, ncpus=2)
        ctx = _ctx(root, flaky=True)
        apply_plan(ctx, make_plan(ctx), ctx.host.run_dir("hftagent"))
        return root

    total = len(_count_steps(applied("count"), _rollback))
    assert total > 20
    for k in range(1, total + 1):
        root = applied(f"k{k}")
        assert _in_child_dying_at(k, root, _rollback) == 137
        ctx = _ctx(root, flaky=True)
        assert rollback(ctx, ctx.host.run_dir("hftagent")).remaining == 0
        assert diff(pristine, snapshot(root)) == [], f"rollback killed at step {k}"
        assert not (root / "run/hftagent/journal.json").exists()


def test_torn_append_at_any_byte_is_reported_and_rollback_keeps_the_file(tmp_path):
    """A kill in the middle of an append leaves a partial last line. Its targets were not
    written (writes wait for the fsync), but a file cut short by something else looks the
    same, so a torn file is never taken as whole: status says so, rollback restores every
    complete record's target and keeps the file byte for byte (exit non-zero), apply refuses
    to build on it. A cut at a line end is an earlier, whole journal: rolled back as such."""
    pristine = snapshot(make_synthetic(tmp_path / "proto", ncpus=2))
    steps = _count_steps(make_synthetic(tmp_path / "count", ncpus=2), _apply)
    at = [i for i, s in enumerate(steps, 1) if s == "journaled"][3]
    root = make_synthetic(tmp_path / "killed", ncpus=2)
    j = root / "run/hftagent/journal.json"
    side = tmp_path / "prefix.bin"
    # killed right after the 4th tunable's originals were appended and fsynced: the last
    # lines of the file are that append, and none of its targets has been written. One step
    # earlier the child keeps a copy of the file as it was before that append.
    pid = os.fork()
    if pid == 0:
        try:
            n = 0

            def cp(step: str) -> None:
                nonlocal n
                n += 1
                if n == at - 1:
                    side.write_bytes(j.read_bytes())
                if n == at:
                    os._exit(137)

            _apply(_ctx(root, flaky=True), cp)
        finally:
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 137
    data, prefix = j.read_bytes(), side.read_bytes()
    assert data.startswith(prefix) and len(data) > len(prefix) + 100  # an append
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    last = [e for e in ends if e > len(prefix)]
    assert len(last) >= 2  # several records in that append
    cuts = sorted({c for e in [len(prefix), *last] for c in (e - 30, e - 1, e, e + 1)
                   if len(prefix) <= c <= len(data)})
    torn_cuts = 0
    for cut in cuts:
        t = tmp_path / f"cut{cut}"
        shutil.copytree(root, t, symlinks=True)
        # the copy's journal names the copy's mounts (the header line), then the cut records
        head = data[:ends[0]].replace(str(root.resolve()).encode(), str(t.resolve()).encode())
        jt = t / "run/hftagent/journal.json"
        jt.write_bytes(head + data[ends[0]:cut])
        ctx = _ctx(t, flaky=True)
        sd = ctx.host.run_dir("hftagent")
        loaded = load(sd)
        assert loaded is not None
        st = status(ctx, sd)
        assert st.exists and not st.stale
        if cut in ends:  # a whole (earlier) journal: apply on top appends, rollback as ever
            assert not loaded.torn and not st.torn
            apply_plan(ctx, make_plan(ctx), sd)
            _replay(sd / "journal.json")
            assert rollback(ctx, sd).remaining == 0
            assert diff(pristine, snapshot(t)) == [], f"cut at byte {cut} of {len(data)}"
            continue
        torn_cuts += 1
        assert loaded.torn and st.torn and not st.all_hold and "torn record" in st.torn
        kept = jt.read_bytes()
        with pytest.raises(JournalError, match="torn record.*apply refuses"):
            apply_plan(ctx, make_plan(ctx), sd)
        rb = rollback(ctx, sd)
        assert rb.torn and not rb.ok and rb.remaining >= 1 and "kept as it was" in rb.note
        assert jt.read_bytes() == kept, f"cut at byte {cut}: the torn journal was rewritten"
        # a real tear: every target written is in a complete record, so all is restored
        assert diff(pristine, snapshot(t)) == [], f"cut at byte {cut} of {len(data)}"
        jt.unlink()  # the person looked: apply works again
        apply_plan(ctx, make_plan(ctx), sd)
        assert rollback(ctx, sd).remaining == 0
        assert diff(pristine, snapshot(t)) == []
    assert torn_cuts >= 6


def test_truncated_journal_is_not_taken_as_whole(tmp_path):
    """Issue #30: a journal cut in half was read as a torn append without a word; rollback
    restored the half it could read, said "0 journal entries left", exited 0 and deleted the
    journal while the targets listed in the lost half stayed modified."""
    root, sd, _ = _applied(tmp_path)
    jf = sd / "journal.json"
    text = jf.read_text()
    named = len(load(sd).entries)
    cut = len(text) // 2
    if text[cut - 1] == "\n":
        cut += 5  # mid-line, as `truncate -s 50%` mostly leaves it
    jf.write_text(text[:cut])
    cut_bytes = jf.read_bytes()
    j = load(sd)
    assert j.torn and len(j.entries) < named
    assert f"at byte {text.rfind(chr(10), 0, cut) + 1:,}" in j.torn_note()
    ctx = _ctx(root, "hft-cpu")
    st = status(ctx, sd)
    assert not st.all_hold and "cut short" in st.torn
    rb = rollback(ctx, sd)
    assert not rb.ok and rb.torn and rb.remaining >= 1
    assert jf.read_bytes() == cut_bytes  # kept, byte for byte
    assert "0 journal" not in rb.note
    # again: nothing left to restore, still not whole, still kept
    rb = rollback(ctx, sd)
    assert not rb.ok and jf.read_bytes() == cut_bytes


def test_a_torn_record_that_shows_its_target_is_named(tmp_path):
    root, sd, _ = _applied(tmp_path)
    jf = sd / "journal.json"
    lines = jf.read_text().split("\n")
    rec = json.loads(lines[-2])
    jf.write_text("\n".join(lines[:-2]) + "\n" + lines[-2][: lines[-2].index('"original"')])
    j = load(sd)
    assert j.torn_target == rec["target"] and f"naming {rec['target']!r}" in j.torn_note()
    jf.write_text("\n".join(lines[:-2]) + "\n" + '{"op":"ad')
    j = load(sd)
    assert j.torn == '{"op":"ad' and j.torn_target is None
    assert "too short to name its target" in j.torn_note()
    jf.write_text("\n".join(lines[:-2]) + "\n" + "{")  # one byte of a record
    assert load(sd).torn == "{"


def test_bytes_that_are_not_one_torn_record_are_corrupt_and_say_what_was_read(tmp_path):
    root, sd, _ = _applied(tmp_path)
    jf = sd / "journal.json"
    text = jf.read_text()
    records = len(text.split("\n")) - 2
    jf.write_text(text + text.split("\n")[1] + text.split("\n")[2])  # two records, no newline
    before = snapshot(root, exclude=())
    with pytest.raises(JournalError) as ei:
        load(sd)
    msg = str(ei.value)
    assert f"read the header and {records:,} complete record(s)" in msg
    assert f"bytes {len(text):,}-" in msg and "more than one record" in msg
    assert "file is kept" in msg and "\n" not in msg
    with pytest.raises(JournalError, match="not one torn record"):
        rollback(_ctx(root, "hft-cpu"), sd)
    assert snapshot(root, exclude=()) == before


# ----------------------------------------------------------------------------------------------
# Format
# ----------------------------------------------------------------------------------------------


def test_journal_file_format_and_atomic_save(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx, only=["memory"]), sd, profile="hft-cpu")
    text = (sd / "journal.json").read_text()
    assert text.isascii() and all(line.startswith("{") for line in text.splitlines())
    head, entries = _replay(sd / "journal.json")
    assert (head["format"], head["version"]) == (FORMAT, VERSION) == ("hftagent-journal", 2)
    assert head["boot_id"] == "synthetic-boot-1"
    assert head["profile"] == "hft-cpu" and head["cpus"] == "1"
    sw = [e for e in entries if e["target"] == "/proc/sys/vm/swappiness"][0]
    assert (sw["original"], sw["written"], sw["tunable"]) == ("60", "1", "memory.swappiness")
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)
    assert not [p for p in sd.iterdir() if p.name.endswith(".tmp")]
    assert oct(os.stat(sd / "journal.json").st_mode & 0o777) == "0o600"
    assert oct(os.stat(sd).st_mode & 0o777) == "0o700"


def test_a_second_apply_appends_and_keeps_the_first_originals(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx, only=["memory"]), sd)
    first = (sd / "journal.json").read_bytes()
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "hft-cpu"\n[settings.swappiness]\nexpected = 5\n')
    ctx2 = _ctx(root, str(prof))
    apply_plan(ctx2, make_plan(ctx2, only=["memory", "kernel"]), sd)
    now = (sd / "journal.json").read_bytes()
    assert now.startswith(first)  # appended, not rewritten
    added = [json.loads(x) for x in now[len(first):].decode().splitlines()]
    # "before": the value a crash before this write would leave (ours, not drift)
    assert {"op": "written", "target": "/proc/sys/vm/swappiness", "written": "5",
            "before": "1"} in added
    assert {r["op"] for r in added} == {"add", "written"}
    _, entries = _replay(sd / "journal.json")
    sw = [e for e in entries if e["target"] == "/proc/sys/vm/swappiness"][0]
    assert (sw["original"], sw["written"]) == ("60", "5")


def test_journal_lives_under_the_root_tree(tmp_path):
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    assert ctx.host.run_dir("hftagent") == root / "run/hftagent"


def _applied(tmp_path) -> tuple[Path, Path, dict]:
    root = make_synthetic(tmp_path / "syn")
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    apply_plan(ctx, make_plan(ctx), sd)
    return root, sd, snapshot(root, exclude=())


def test_version1_journal_of_the_previous_release_rolls_back(tmp_path):
    pristine = snapshot(make_synthetic(tmp_path / "proto"))
    root, sd, _ = _applied(tmp_path)
    _as_v1(sd / "journal.json")
    assert (sd / "journal.json").read_text().startswith('{\n  "format": "hftagent-journal/1"')
    ctx = _ctx(root, "hft-cpu")
    j = load(sd)
    assert j is not None and j.version == 1 and len(j.entries) > 10
    st = status(ctx, sd)
    assert st.all_hold and len(st.items) == len(j.entries)
    assert rollback(ctx, sd).remaining == 0
    assert diff(pristine, snapshot(root)) == []
    assert not (sd / "journal.json").exists()


def test_apply_over_a_version1_journal_rewrites_it_as_version2(tmp_path):
    root, sd, _ = _applied(tmp_path)
    _as_v1(sd / "journal.json")
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "hft-cpu"\n[settings.swappiness]\nexpected = 5\n')
    ctx = _ctx(root, str(prof))
    apply_plan(ctx, make_plan(ctx), sd)
    head, entries = _replay(sd / "journal.json")
    assert head["version"] == 2
    sw = [e for e in entries if e["target"] == "/proc/sys/vm/swappiness"][0]
    assert (sw["original"], sw["written"]) == ("60", "5")  # the v1 original kept


def _many_irqs(root: Path, n: int, ncpus: int) -> None:
    from collectors.parsers import format_cpulist, format_cpumask
    for irq in range(100, 100 + n):
        d = root / f"proc/irq/{irq}"
        d.mkdir(parents=True)
        (d / "smp_affinity_list").write_text(format_cpulist(range(ncpus)) + "\n")
        (d / "smp_affinity").write_text(format_cpumask(range(ncpus)) + "\n")


def test_journal_cost_is_linear_in_the_targets(tmp_path, monkeypatch):
    """One fsync per tunable and each record written once: 300 IRQs cost no more fsyncs than
    3. (Each target used to rewrite and fsync the whole journal twice: quadratic.)"""
    import tuning.journal as jmod

    real_fsync, real_write = jmod.os.fsync, jmod._write_all
    counts = {}
    for n in (3, 300):
        root = make_synthetic(tmp_path / f"n{n}")
        _many_irqs(root, n, 4)
        ctx = _ctx(root, "hft-cpu", cpus="2-3")
        fsyncs, written = [0], [0]

        def fsync(fd, fsyncs=fsyncs):
            fsyncs[0] += 1
            real_fsync(fd)

        def write_all(fd, data, written=written):
            written[0] += len(data)
            real_write(fd, data)

        monkeypatch.setattr(jmod.os, "fsync", fsync)
        monkeypatch.setattr(jmod, "_write_all", write_all)
        sd = ctx.host.run_dir("hftagent")
        plan = make_plan(ctx)
        apply_plan(ctx, plan, sd)
        size = (sd / "journal.json").stat().st_size
        applied = fsyncs[0]
        assert rollback(ctx, sd).remaining == 0
        counts[n] = (len(plan.writes), applied, fsyncs[0] - applied, written[0], size)
        monkeypatch.undo()
    (w3, a3, r3, _, _), (w300, a300, r300, bytes300, size300) = counts[3], counts[300]
    assert w300 >= w3 + 290
    assert a300 == a3 <= 2 * 20          # per tunable (file + directory at creation)
    assert r300 == r3 <= 2               # rollback: one delete (+ directory fsync)
    assert bytes300 <= 1.1 * size300     # each record written once


# ----------------------------------------------------------------------------------------------
# Corrupt and hostile journals: one clear error, nothing changed
# ----------------------------------------------------------------------------------------------


def _edit_lines(fn):
    """A corruption of a version-2 journal given as a function of its lines."""
    def edit(text: str) -> str:
        return "\n".join(fn(text.split("\n")[:-1])) + "\n"
    return edit


def _edit_record(i: int, fn):
    def change(lines):
        lines[i] = json.dumps(fn(json.loads(lines[i])))
        return lines
    return _edit_lines(change)


def _v1(fn):
    """A corruption of the same journal in version-1 form."""
    def edit(text: str, path: Path) -> str:
        path.write_text(text)
        _as_v1(path)
        return fn(path.read_text())
    return edit


DEEP = "[" * 100_000 + "]" * 100_000

CORRUPT = {
    "garbage": lambda t: "\x00\x13garbage{{{",
    "empty": lambda t: "",
    "not-utf8": None,
    "only-newlines": lambda t: "\n\n\n",
    "header-not-json": _edit_lines(lambda ls: ["{bad}"] + ls[1:]),
    "header-not-object": _edit_lines(lambda ls: ["[1, 2]"] + ls[1:]),
    "wrong-format": _edit_record(0, lambda r: {**r, "format": "something"}),
    "unknown-version": _edit_record(0, lambda r: {**r, "version": 3}),
    "no-mounts": _edit_record(0, lambda r: {k: v for k, v in r.items() if k != "sysfs"}),
    "record-not-json": _edit_lines(lambda ls: ls[:1] + ['{"op": "add"'] + ls[1:]),
    "record-not-object": _edit_lines(lambda ls: ls + ["7"]),
    "blank-line": _edit_lines(lambda ls: ls[:2] + [""] + ls[2:]),
    "unknown-op": _edit_record(1, lambda r: {**r, "op": "rm -rf"}),
    "entry-missing-original": _edit_record(1, lambda r: {k: v for k, v in r.items()
                                                         if k != "original"}),
    "seq-not-int": _edit_record(1, lambda r: {**r, "seq": True}),
    "original-not-str": _edit_record(1, lambda r: {**r, "original": 60}),
    "target-off-allowlist": lambda t: t.replace("/proc/sys/vm/swappiness", "/etc/shadow"),
    "unknown-tunable": lambda t: t.replace('"memory.swappiness"', '"memory.bogus"'),
    "duplicate-target": _edit_lines(lambda ls: ls + [ls[1]]),
    "drop-unlisted": _edit_lines(lambda ls: ls + ['{"op":"drop","target":"/proc/sys/vm/nope"}']),
    "nested-record": _edit_lines(lambda ls: ls + [DEEP]),
    "nested-header": _edit_lines(lambda ls: ['{"a":' * 100_000 + "1" + "}" * 100_000]
                                 + ls[1:]),
    "v1-truncated": _v1(lambda t: t[: len(t) // 2]),
    # bytes after the last newline that cannot be the start of one record (issue #30)
    "tail-two-records": lambda t: t + t.split("\n")[1] + t.split("\n")[1],
    "tail-not-a-record": lambda t: t + "rm -rf / #",
    "tail-nul-padding": lambda t: t + '{"op":"add"' + "\x00" * 4096,
    "tail-too-long": lambda t: t + '{"op":"add","detail":"' + "x" * MAX_RECORD_BYTES,
    "v1-entries-not-list": _v1(lambda t: json.dumps({**json.loads(t), "entries": {}})),
    "v1-off-allowlist": _v1(lambda t: t.replace("/proc/sys/vm/swappiness", "/etc/shadow")),
    "v1-nested": _v1(lambda t: t.rstrip()[:-1] + ', "y": ' + DEEP + "}\n"),
}


@pytest.mark.adversarial
@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_journal_clear_error_nothing_changed(tmp_path, case):
    root, sd, _ = _applied(tmp_path)
    j = sd / "journal.json"
    edit = CORRUPT[case]
    if edit is None:
        j.write_bytes(b"\xff\xfe\x00bad")
    elif case.startswith("v1-"):
        j.write_text(edit(j.read_text(), j))
    else:
        j.write_text(edit(j.read_text()))
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(JournalError, match="journal .*(corrupt|not a|malformed|not a target|"
                                           "entry list|unknown tunable|does not say which|"
                                           "appears twice|format version 3)") as ei:
        rollback(ctx, sd)
    assert "\n" not in str(ei.value) and len(str(ei.value)) < 600
    with pytest.raises(JournalError):
        apply_plan(ctx, make_plan(ctx), sd)
    with pytest.raises(JournalError):
        status(ctx, sd)
    assert snapshot(root, exclude=()) == before


def _with_entries(j: Path, *entries: dict) -> None:
    """Replace the journal's entries (seq 1, 2, ... in this order), keeping its header."""
    head = j.read_text().split("\n")[0]
    base = {"time": "", "detail": ""}
    recs = [json.dumps({"op": "add", **base, **e, "seq": i}) for i, e in enumerate(entries, 1)]
    j.write_text("\n".join([head, *recs]) + "\n")


@pytest.mark.parametrize("bad,match", [
    ({"tunable": "memory.swappiness", "target": "service:irqbalance", "original": "active",
      "written": "inactive"}, "not a target of memory.swappiness"),
    ({"tunable": "kernel.timer_migration", "target": "/proc/sys/kernel/timer_migration",
      "original": "7", "written": "0"}, "not a valid kernel.timer_migration value"),
    ({"tunable": "cpu.governor", "target": "/sys/devices/system/cpu/cpu0/cpufreq/"
      "scaling_governor", "original": "../../x", "written": "performance"}, "not a valid"),
])
def test_journal_is_validated_as_a_whole_before_the_first_write(tmp_path, bad, match):
    """Rollback runs in reverse: a bad first entry used to be found only after the valid later
    ones had been written back."""
    root, sd, _ = _applied(tmp_path)
    ok = {"tunable": "memory.swappiness", "target": "/proc/sys/vm/swappiness", "original": "77",
          "written": "1"}
    _with_entries(sd / "journal.json", bad, ok)
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(JournalError, match=match):
        rollback(ctx, sd, force=True)
    with pytest.raises(JournalError, match=match):
        status(ctx, sd)
    assert snapshot(root, exclude=()) == before


BAD_TARGETS = [
    "/proc/irq/2x/smp_affinity_list",           # a non-digit in irq/N
    "/proc/irq/24\x00/smp_affinity_list",        # a NUL after the digits
    "/proc/irq/\u0663/smp_affinity_list",        # ARABIC-INDIC DIGIT THREE
    "/proc/irq/024/smp_affinity_list",          # not how the kernel names IRQ 24
    "/proc/irq/-1/smp_affinity_list",
    "/proc/irq/ 24/smp_affinity_list",
    "/proc/irq//smp_affinity_list",
    "/sys/devices/system/cpu/cpu1\x00/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/cpu1x/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/cpu0/cpuidle/state1/../state2/disable",
    "/proc/sys/vm/swappiness\x00",
    "/proc/sys/vm/swappiness/",
    "nvml:gpu0x:persistence_mode",
]


@pytest.mark.adversarial
@pytest.mark.parametrize("target", BAD_TARGETS)
def test_allowlist_refuses_odd_targets(target):
    from tuning.allowlist import allowed
    from tuning.tunables import all_tunables

    assert not allowed(target)
    assert not any(t.owns(target) for t in all_tunables())


def test_allowlist_accepts_the_real_targets():
    from tuning.allowlist import allowed

    for t in ("/proc/irq/0/smp_affinity_list", "/proc/irq/1023/smp_affinity_list",
              "/sys/devices/system/cpu/cpu127/cpuidle/state10/disable",
              "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
              "nvml:gpu7:compute_mode", "service:irqbalance", "/proc/sys/vm/swappiness"):
        assert allowed(t), t


@pytest.mark.adversarial
@pytest.mark.parametrize("target", BAD_TARGETS[:9])
def test_odd_target_refuses_the_whole_journal_before_any_write(tmp_path, target):
    """The odd entry is the first one (restored last, in reverse order): rollback used to
    write the valid later entries before it failed on this one."""
    root, sd, _ = _applied(tmp_path)
    irq = "/irq/" in target
    bad = {"tunable": "irq.affinity" if irq else "cpu.governor", "target": target,
           "original": "0-3" if irq else "powersave", "written": "0-1"}
    ok = {"tunable": "memory.swappiness", "target": "/proc/sys/vm/swappiness",
          "original": "77", "written": "1"}
    _with_entries(sd / "journal.json", bad, ok)
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(JournalError, match="not a target tuning may write; nothing was"):
        rollback(ctx, sd, force=True)
    assert snapshot(root, exclude=()) == before


@pytest.mark.adversarial
def test_huge_original_is_refused_at_once(tmp_path):
    """A 10 MB original took more than a minute before anything was refused."""
    root, sd, _ = _applied(tmp_path)
    ok = {"tunable": "memory.swappiness", "target": "/proc/sys/vm/swappiness",
          "original": "7" * 10_000_000, "written": "1"}
    _with_entries(sd / "journal.json", ok)
    before = snapshot(root, exclude=())
    t0 = time.monotonic()
    with pytest.raises(JournalError, match="'original' of 10,000,000 characters"):
        rollback(_ctx(root, "hft-cpu"), sd)
    assert time.monotonic() - t0 < 5
    assert snapshot(root, exclude=()) == before


class _Blocked(Exception):
    pass


@pytest.fixture
def no_hang():
    """Fail (instead of hanging the suite) when a call blocks for more than 10 s."""
    def ring(*_a):
        raise _Blocked("blocked for 10 s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.adversarial
@pytest.mark.parametrize("kind", ["fifo", "symlink", "hardlink", "directory", "huge"])
def test_journal_that_is_not_a_plain_file_is_refused(tmp_path, kind, no_hang):
    root, sd, _ = _applied(tmp_path)
    j = sd / "journal.json"
    other = tmp_path / "elsewhere.json"
    shutil.copyfile(j, other)
    j.unlink()
    if kind == "fifo":
        os.mkfifo(j, 0o600)   # a plain open() blocked here forever
    elif kind == "symlink":
        j.symlink_to(other)
    elif kind == "hardlink":
        os.link(other, j)
    elif kind == "directory":
        j.mkdir()
    else:
        with open(j, "wb") as fh:  # sparse: a size no journal has
            fh.truncate(MAX_BYTES + 1)
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    match = {"fifo": "not a regular file", "symlink": "is a symlink", "hardlink": "hard links",
             "directory": "not a regular file", "huge": "more than a journal"}[kind]
    for call in (lambda: rollback(ctx, sd), lambda: status(ctx, sd),
                 lambda: apply_plan(ctx, make_plan(ctx), sd)):
        with pytest.raises(JournalError, match=match):
            call()
    assert snapshot(root, exclude=()) == before
    assert other.read_bytes().startswith(b'{"format":"hftagent-journal"')


def test_every_tunable_owns_only_allowlisted_targets():
    from tuning.allowlist import WRITABLE
    from tuning.tunables import all_tunables
    from tuning.tunables.memory import Sysctl

    owned = [p for t in all_tunables() for p in t.patterns]
    owned += ["/proc/sys/" + t.name.replace(".", "/") for t in all_tunables()
              if isinstance(t, Sysctl)]
    assert sorted(owned) == sorted(WRITABLE)  # each allowlisted target has exactly one owner


def test_journal_from_an_earlier_boot_is_reported_not_replayed(tmp_path):
    root, sd, _ = _applied(tmp_path)
    (root / "proc/sys/kernel/random/boot_id").write_text("synthetic-boot-2\n")  # "rebooted"
    before = snapshot(root, exclude=())
    ctx = _ctx(root, "hft-cpu")
    with pytest.raises(StaleJournal, match="earlier boot.*synthetic-boot-1.*synthetic-boot-2"):
        rollback(ctx, sd)
    with pytest.raises(StaleJournal):
        apply_plan(ctx, make_plan(ctx), sd)
    st = status(ctx, sd)
    assert st.stale and st.items == []
    assert snapshot(root, exclude=()) == before
    rb = rollback(ctx, sd, discard_stale=True)
    assert "discarded" in rb.note and "synthetic-boot-1" in rb.note
    assert not (sd / "journal.json").exists()
    # only the journal went: the (post-"reboot") kernel values were not touched
    assert diff(before, snapshot(root, exclude=())) == ["run/hftagent/journal.json"]


def test_journal_of_another_tree_is_refused(tmp_path):
    """A journal written against tree A (say with --state-dir) is never checked against, or
    replayed onto, tree B — B standing in for the live kernel."""
    root, sd, _ = _applied(tmp_path)
    head, _ = _replay(sd / "journal.json")
    assert (head["procfs"], head["sysfs"]) == (str(root.resolve() / "proc"),
                                               str(root.resolve() / "sys"))
    other = make_synthetic(tmp_path / "other")
    before = snapshot(other, exclude=())
    ctx = _ctx(other, "hft-cpu")
    for call in (lambda: rollback(ctx, sd, force=True), lambda: status(ctx, sd),
                 lambda: apply_plan(ctx, make_plan(ctx), sd)):
        with pytest.raises(JournalError, match="written against procfs .*not this host"):
            call()
    assert snapshot(other, exclude=()) == before
    assert rollback(_ctx(root, "hft-cpu"), sd).remaining == 0  # its own tree: fine


def test_record_keeps_first_original(tmp_path):
    j = Journal(tmp_path / "journal.json", "b", procfs="/t/proc", sysfs="/t/sys")
    j.record("memory.swappiness", "/proc/sys/vm/swappiness", "60", "1")
    j.record("memory.swappiness", "/proc/sys/vm/swappiness", "1", "5")
    assert [(e.original, e.written) for e in j.entries] == [("60", "5")]
    j.save()
    assert load(tmp_path).entries[0].original == "60"
    j.drop("/proc/sys/vm/swappiness")
    j.save()
    assert not (tmp_path / "journal.json").exists() and load(tmp_path) is None


# ----------------------------------------------------------------------------------------------
# The state directory and its files
# ----------------------------------------------------------------------------------------------


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    dead, alive = tmp_path / f".journal.json.{_dead_pid()}.tmp", tmp_path / ".journal.json.1.tmp"
    for p in (dead, alive):
        p.write_text("{half")
    other = tmp_path / "notes.tmp"
    other.write_text("x")
    with locked(tmp_path):
        pass
    assert not dead.exists() and alive.exists() and other.exists()


def test_save_never_writes_through_a_planted_temp_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    sd = tmp_path / "state"
    sd.mkdir()
    (sd / f".journal.json.{os.getpid()}.tmp").symlink_to(victim)
    j = Journal(sd / "journal.json", "b", procfs="/t/proc", sysfs="/t/sys")
    j.record("memory.swappiness", "/proc/sys/vm/swappiness", "60", "1")
    j.save()
    assert victim.read_text() == "precious\n"
    assert load(sd).entries[0].original == "60"
    assert oct(os.stat(sd / "journal.json").st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
def test_journal_save_error_is_a_journal_error_and_nothing_is_written(tmp_path, monkeypatch,
                                                                       err):
    import tuning.journal as jmod

    root = make_synthetic(tmp_path / "syn")
    before = snapshot(root)
    ctx = _ctx(root, "hft-cpu")

    def fsync(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(jmod.os, "fsync", fsync)
    with pytest.raises(JournalError, match=f"cannot save journal .*{os.strerror(err)}"):
        apply_plan(ctx, make_plan(ctx, only=["memory"]), ctx.host.run_dir("hftagent"))
    assert diff(before, snapshot(root)) == []  # the write the entry covered never happened
    assert not [p for p in ctx.host.run_dir("hftagent").iterdir() if p.name != "lock"]


def test_append_error_stops_before_the_next_write(tmp_path, monkeypatch):
    """The second tunable's append fails (ENOSPC): none of its targets is written, and what
    the first one changed is still listed and rolled back."""
    import tuning.journal as jmod

    root = make_synthetic(tmp_path / "syn")
    pristine = snapshot(root)
    ctx = _ctx(root, "hft-cpu")
    sd = ctx.host.run_dir("hftagent")
    real = jmod._write_all
    calls = [0]

    def write_all(fd, data):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    monkeypatch.setattr(jmod, "_write_all", write_all)
    with pytest.raises(JournalError, match="No space left"):
        apply_plan(ctx, make_plan(ctx, only=["memory"]), sd)
    monkeypatch.undo()
    changed = diff(pristine, snapshot(root))
    assert changed == ["sys/kernel/mm/transparent_hugepage/enabled"]  # the first tunable only
    assert rollback(ctx, sd).remaining == 0
    assert diff(pristine, snapshot(root)) == []


def test_lock_file_error_is_a_journal_error(tmp_path, monkeypatch):
    import tuning.journal as jmod

    real_open = os.open

    def ro_open(path, flags, *a, **kw):
        if str(path) == "lock" or str(path).endswith("/lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(jmod.os, "open", ro_open)
    with pytest.raises(JournalError, match="cannot use state directory .*Read-only file system"):
        with locked(tmp_path / "sd"):
            pass


def test_lock_refuses_a_second_writer(tmp_path):
    with locked(tmp_path), pytest.raises(JournalError, match="holds"):
        pid = os.fork()
        if pid == 0:
            try:
                with locked(tmp_path):
                    os._exit(0)
            except JournalError:
                os._exit(7)
            os._exit(1)
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 7
        raise JournalError("another hftagent tune apply/rollback holds it")


@pytest.mark.adversarial
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_planted_lock_is_refused(tmp_path, kind, no_hang):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    sd = tmp_path / "state"
    sd.mkdir(mode=0o700)
    if kind == "symlink":
        (sd / "lock").symlink_to(victim)
    else:
        os.mkfifo(sd / "lock", 0o600)
    with pytest.raises(JournalError, match="lock is (a symlink|not a regular file)"):
        with locked(sd):
            pass
    assert victim.read_text() == "precious\n"


@pytest.mark.adversarial
def test_state_dir_writable_by_others_is_refused(tmp_path):
    sd = tmp_path / "state"
    sd.mkdir()
    os.chmod(sd, 0o777)
    with pytest.raises(JournalError, match="writable by group or others"):
        with locked(sd):
            pass
    assert list(sd.iterdir()) == []


@pytest.mark.adversarial
def test_state_dir_through_our_own_symlink_is_fine(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with locked(tmp_path / "link" / "sd"):
        pass
    assert (real / "sd" / "lock").exists()


@pytest.mark.adversarial
@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs root")
def test_state_dir_owned_or_redirected_by_another_user_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    with pytest.raises(JournalError, match="belongs to uid 4242"):
        with locked(theirs):
            pass
    link = tmp_path / "link"
    link.symlink_to(victim)
    os.lchown(link, 4242, 4242)  # a symlink another user planted (in /tmp, say)
    with pytest.raises(JournalError, match="symbolic link owned by uid 4242"):
        with locked(link / "sd"):
            pass
    assert list(victim.iterdir()) == [] and list(theirs.iterdir()) == []
