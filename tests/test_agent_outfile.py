"""Every output option through the one opener (issue #30 item 2, agent/outfile.py).

The sweep found ``cpus --plot``, ``history plot --out``, ``history export --out``, ``probe
--csv`` and ``--db``/``$HFTAGENT_DB`` writing through a symlink another user planted (as root,
where ``fs.protected_symlinks`` is 0): root-only files overwritten, an SQLite file created
where the planter chose. Here every output option meets, at its path, a planted symlink to a
root-only file, a FIFO, a directory and (as root) a file of another user (uid 65534), and a
symlink of that user as a directory on the way. Each must be refused with one line and a
non-zero exit before any work starts, and leave the target and its directory exactly as they
were. Heavy work (the probe runner, the noise scan, ncu) is fenced as in the bad-input corpus,
so a refusal that came too late shows as a failure, not as a slow run.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FIXTURES
from tests.test_bad_input_corpus import _fence, _run_inprocess

ROOT = os.geteuid() == 0
NOBODY = 65534
needs_root = pytest.mark.skipif(not ROOT, reason="chown to another uid needs root")

FP = {"version": 1, "hostname": "h", "kernel": "6.1", "cpu_model": "X", "online_cpus": "0-1",
      "governors": "0-1=performance", "turbo": False, "isolated_cpus": "", "nohz_full_cpus": "",
      "smt_active": 0, "virtualization": "none", "gpu_models": None, "gpu_driver": None,
      "audit": None}


def make_db(path: Path, runs: int = 2) -> Path:
    from agent.history import History, record_run
    rng = np.random.default_rng(0)
    for _ in range(runs):
        record_run("probe", {}, rng.integers(100_000, 300_000, 500), command="probe",
                   builtin="lstm", variant="tflite", fingerprint=FP, db=path)
    if not runs:
        History(path).close()
    return path


# (option, argv with {P} for the path, whether the path is a history database)
OPTIONS = [
    ("cpus --plot", ["cpus", "--no-history", "--duration", "1", "--plot", "{P}"], False),
    ("probe --plot", ["probe", "--no-history", "--model", "numpy", "--idle-gaps", "0,1ms",
                      "--plot", "{P}"], False),
    ("probe --csv", ["probe", "--no-history", "--model", "numpy", "--csv", "{P}"], False),
    ("profile --keep-csv", ["profile", "--nsight", "--keep-csv", "{P}", "--", "true"], False),
    ("history export --out", ["history", "--db", "{DB}", "export", "--out", "{P}"], False),
    ("history plot --out", ["history", "--db", "{DB}", "plot", "--out", "{P}"], False),
    ("capture --out", ["capture", "--root", str(FIXTURES / "vm-dev"), "--out", "{P}"], False),
    ("probe --db", ["probe", "--model", "numpy", "--db", "{P}"], True),
    ("cpus --db", ["cpus", "--duration", "1", "--db", "{P}"], True),
    ("gate --db", ["gate", "--db", "{P}", "--run", "1"], True),
    ("history --db", ["history", "--db", "{P}"], True),
    ("history show --db", ["history", "--db", "{P}", "show", "1"], True),
    ("$HFTAGENT_DB (history)", ["history"], True),
]
KINDS = ["link", "fifo", "dir", "other", "dirlink"]


def _snapshot(p: Path):
    """What is at ``p`` (not followed), in enough detail to see any change."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    m = st.st_mode
    if stat.S_ISLNK(m):
        return ("link", os.readlink(p), st.st_uid)
    if stat.S_ISDIR(m):
        return ("dir", sorted(os.listdir(p)), stat.S_IMODE(m), st.st_uid)
    if stat.S_ISREG(m):
        return ("file", p.read_bytes(), stat.S_IMODE(m), st.st_uid, st.st_ino, st.st_mtime_ns)
    return ("special", stat.S_IFMT(m), st.st_ino)


def _plant(kind: str, where: Path, secret: Path, db: Path | None) -> Path:
    """Put ``kind`` at an output path under ``where``; returns the path to give."""
    p = where / "out.png"
    if kind == "link":  # planted by another user where the file is to be
        os.symlink(secret, p)
        if ROOT:
            os.lchown(p, NOBODY, NOBODY)
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "other":
        if db is not None:
            p.write_bytes(db.read_bytes())  # a real database, only not ours
        else:
            p.write_text("someone else's file\n")
        os.chown(p, NOBODY, NOBODY)
    elif kind == "dirlink":  # another user's symlink as a directory on the way
        real = where / "real-dir"
        real.mkdir()
        (real / "out.png").write_text("root only\n")
        (real / "out.png").chmod(0o600)
        os.symlink(real, where / "evil")
        os.lchown(where / "evil", NOBODY, NOBODY)
        p = where / "evil" / "out.png"
    return p


@pytest.fixture
def fenced(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HFTAGENT_DEBUG", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    _fence(monkeypatch)
    return monkeypatch


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("opt,argv,is_db", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_every_output_refuses_what_another_user_planted(opt, argv, is_db, kind, tmp_path,
                                                         fenced):
    if kind in ("other", "dirlink") and not ROOT:
        pytest.skip("another user's file or link needs root (chown)")
    secret = tmp_path / "secret"
    # a database path is sent to an empty root-only file: SQLite took it as a new database
    secret.write_text("" if is_db else "root only\n")
    secret.chmod(0o600)
    db = make_db(tmp_path / "runs.sqlite")
    where = tmp_path / "shared"
    where.mkdir()
    p = _plant(kind, where, secret, db if is_db else None)
    if opt.startswith("$HFTAGENT_DB"):
        fenced.setenv("HFTAGENT_DB", str(p))
    else:
        fenced.setenv("HFTAGENT_DB", str(tmp_path / "default.sqlite"))
    before = {q: _snapshot(q) for q in (secret, where, p, where / "real-dir",
                                        where / "real-dir" / "out.png")}
    rc, out, err, _s = _run_inprocess([a.replace("{P}", str(p)).replace("{DB}", str(db))
                                       for a in argv], 10.0)
    shown = f"rc={rc!r} stderr={err!r} stdout={out[-300:]!r}"
    assert isinstance(rc, int) and rc != 0, shown
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("hftagent: error: "), shown
    assert "internal error" not in err and "Traceback" not in err, shown
    names = ("database",) if is_db else (opt.split()[-1],)
    assert any(n in lines[0] for n in names) and str(p) in lines[0], shown
    after = {q: _snapshot(q) for q in before}
    assert after == before, "the target or its directory changed"
    assert not list(tmp_path.glob("default.sqlite*"))  # nothing recorded anywhere


# ---- --db checked before any work (issue #28 item 4) ----------------------------------------

@pytest.mark.parametrize("argv", [
    ["probe", "--model", "numpy", "--db", "{D}/h.sqlite"],
    ["cpus", "--duration", "1", "--db", "{D}/h.sqlite"],
    ["gate", "--db", "{D}/h.sqlite", "--builtin", "numpy"],
], ids=["probe", "cpus", "gate"])
def test_db_in_a_missing_directory_is_refused_before_work_and_never_created(argv, tmp_path,
                                                                            fenced):
    d = tmp_path / "no" / "such" / "dir"
    rc, _out, err, _s = _run_inprocess([a.replace("{D}", str(d)) for a in argv], 10.0)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1, (rc, err)
    assert "does not exist" in lines[0] and "HEAVY" not in str(rc)
    assert not (tmp_path / "no").exists()


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory we cannot create files in: immutable (chattr +i) as root, whom no mode
    bit stops and who passes every access() check; mode 0555 otherwise."""
    d = tmp_path / "ro"
    d.mkdir()
    if ROOT:
        r = subprocess.run(["chattr", "+i", str(d)], capture_output=True)
        if r.returncode:
            pytest.skip(f"no immutable directories here: {r.stderr.decode().strip()}")
        yield d
        subprocess.run(["chattr", "-i", str(d)], check=True)
    else:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)


@pytest.mark.parametrize("argv", [
    ["probe", "--model", "numpy", "--db", "{D}/h.sqlite"],
    ["cpus", "--duration", "1", "--db", "{D}/h.sqlite"],
], ids=["probe", "cpus"])
def test_db_in_a_directory_we_cannot_write_is_refused_before_work(argv, unwritable_dir,
                                                                  fenced):
    rc, out, err, _s = _run_inprocess([a.replace("{D}", str(unwritable_dir)) for a in argv],
                                      10.0)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1, (rc, err)
    assert "not a writable directory" in lines[0] and out == ""
    assert os.listdir(unwritable_dir) == []


# ---- the opener itself ------------------------------------------------------------------------

def test_a_new_file_appears_whole_and_only_when_closed(tmp_path):
    from agent.outfile import open_output
    p = tmp_path / "out.csv"
    with open_output(p, "--csv") as f:
        f.write("a,b\n")
        assert not p.exists()  # written beside it under a random name
        assert [q.name.startswith(".hftagent-") for q in tmp_path.iterdir()] == [True]
    assert p.read_text() == "a,b\n" and os.listdir(tmp_path) == ["out.csv"]
    assert stat.S_IMODE(p.stat().st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_our_file_is_replaced_keeping_its_mode_and_a_failed_write_leaves_it(tmp_path):
    from agent.outfile import open_output
    p = tmp_path / "out.csv"
    p.write_text("old\n")
    p.chmod(0o600)
    with pytest.raises(RuntimeError), open_output(p, "--csv") as f:
        f.write("half")
        raise RuntimeError("the run failed")
    assert p.read_text() == "old\n" and os.listdir(tmp_path) == ["out.csv"]
    with open_output(p, "--csv") as f:
        f.write("new\n")
    assert p.read_text() == "new\n" and stat.S_IMODE(p.stat().st_mode) == 0o600


def test_a_link_planted_while_writing_is_not_written_through(tmp_path):
    """Checked before the work, planted during it: the rename refuses it (and would only
    have replaced the link itself)."""
    from agent.outfile import OutputError, check_output, open_output
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    p = tmp_path / "plot.png"
    check_output(p, "--plot")
    f = open_output(p, "--plot", binary=True)
    f.write(b"PNG")
    os.symlink(secret, p)
    with pytest.raises(OutputError, match="--plot .*plot.png is a symbolic link: not followed"):
        f.close()
    assert secret.read_text() == "root only\n" and os.readlink(p) == str(secret)
    assert sorted(os.listdir(tmp_path)) == ["plot.png", "secret"]  # the temporary file is gone


def test_exclusive_creates_the_file_itself_and_never_an_existing_one(tmp_path):
    from agent.outfile import OutputError, open_output
    p = tmp_path / "fix.sh"
    with open_output(p, "--fix-script", mode=0o700, exclusive=True) as f:
        f.write("#!/bin/sh\n")
    assert p.read_text() == "#!/bin/sh\n" and stat.S_IMODE(p.stat().st_mode) == 0o700 & ~_umask()
    with pytest.raises(OutputError, match="already exists"):
        open_output(p, "--fix-script", mode=0o700, exclusive=True)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could swap the script before root runs it
    with pytest.raises(OutputError, match="writable by group or others .* not sticky"):
        open_output(shared / "fix.sh", "--fix-script", exclusive=True)
    shared.chmod(0o1777)  # sticky (/tmp): nobody else can rename or remove our file
    with open_output(shared / "fix.sh", "--fix-script", mode=0o700, exclusive=True) as f:
        f.write("x")
    assert (shared / "fix.sh").read_text() == "x"


def test_missing_directories_are_never_created(tmp_path):
    from agent.outfile import OutputError, check_output, open_output
    for fn in (check_output, open_output):
        with pytest.raises(OutputError, match="--out .*: directory .*/a/b does not exist"):
            fn(tmp_path / "a" / "b" / "x.csv", "--out")
    assert os.listdir(tmp_path) == []
    with pytest.raises(OutputError, match="--out is empty"):
        check_output(" ", "--out")
    with pytest.raises(OutputError, match="names a directory"):
        check_output(f"{tmp_path}/", "--out")


def test_a_name_with_a_newline_stays_one_line(tmp_path):
    from agent.outfile import OutputError, check_output
    p = tmp_path / "a\nb"
    p.mkdir()
    with pytest.raises(OutputError) as e:
        check_output(p, "--out")
    assert "\n" not in str(e.value) and "is a directory" in str(e.value)


@needs_root
def test_root_and_our_own_directory_links_are_followed(tmp_path):
    """A link made by root or by us (``/var/run`` -> ``/run``) is no plant: followed."""
    from agent.outfile import open_output
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "mine")
    with open_output(tmp_path / "mine" / "x.csv", "--csv") as f:
        f.write("ok\n")
    assert (real / "x.csv").read_text() == "ok\n"


def test_probe_csv_is_written_whole(tmp_path, monkeypatch):
    """The real probe (numpy model, a few samples): the CSV is complete, nothing left over."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    out = tmp_path / "s.csv"
    out.write_text("old\n")
    rc, _o, err, _s = _run_inprocess(["probe", "--no-history", "--model", "numpy",
                                      "--samples", "30", "--warmup", "5", "--duration", "5",
                                      "--json", "--csv", str(out)], 120.0)
    assert rc == 0, err
    rows = out.read_text().splitlines()
    assert rows[0].startswith("config,") and len(rows) == 31
    assert sorted(os.listdir(tmp_path)) == ["s.csv"]


@needs_root
def test_capture_never_follows_another_users_link_on_the_way(tmp_path, fenced):
    secret = tmp_path / "secret-dir"
    secret.mkdir()
    os.symlink(secret, tmp_path / "evil")
    os.lchown(tmp_path / "evil", NOBODY, NOBODY)
    rc, _o, err, _s = _run_inprocess(["capture", "--root", str(FIXTURES / "vm-dev"), "--out",
                                      str(tmp_path / "evil" / "cap")], 10.0)
    assert rc == 1 and "owned by uid 65534" in err and os.listdir(secret) == []


def test_capture_never_creates_missing_parents(tmp_path, fenced):
    """issue #39: capture made missing parents (mkdir -p) unlike every other output."""
    rc, _o, err, _s = _run_inprocess(["capture", "--root", str(FIXTURES / "vm-dev"), "--out",
                                      str(tmp_path / "new" / "cap")], 10.0)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1, err
    assert f"directory {tmp_path / 'new'} does not exist (create it first)" in lines[0]
    assert not (tmp_path / "new").exists()
    (tmp_path / "new").mkdir()
    rc, _o, err, _s = _run_inprocess(["capture", "--root", str(FIXTURES / "vm-dev"), "--out",
                                      str(tmp_path / "new" / "cap")], 60.0)
    assert rc == 0, err
    assert (tmp_path / "new" / "cap" / "CAPTURE-SKIPPED").is_file()


# ---- one rule for every directory on the way (issue #34 items 2 and 3) -----------------------
#
# Every directory from / down to an output must be root's or ours and writable by nobody else
# (a root-owned sticky one like /tmp excepted), and no other user's link is followed. The
# layouts below put an output below each kind of directory, with a throw-away user (the
# ``user`` fixture) as the other user; a refusal is one line naming the component and why,
# and nothing changes anywhere under the layout.

CLI = [sys.executable, "-c", "from agent.cli import main; main()"]
WATCH = ["watch", "--probe", "numpy", "--duration", "1", "--no-live", "--sampler", "python",
         "--trace", "off", "--irq-cost", "off", "--json"]
AUDIT = ["audit", "--root", str(FIXTURES / "vm-dev"), "--no-history", "--steal-window", "0"]
# option -> (argv with {P} for the output path, the output's name, file or dir, good exits)
REAL = {
    "deploy --out": (["deploy", "--out", "{P}"], "deploy", "dir", (0,)),
    "capture --out": (["capture", "--root", str(FIXTURES / "vm-dev"), "--out", "{P}"], "cap",
                      "dir", (0,)),
    "--spike-log": ([*WATCH, "--spike-log", "{P}"], "spikes.jsonl", "file", (0,)),
    "--flight-dir": ([*WATCH, "--flight-us", "1000000", "--flight-dir", "{P}"], "flight",
                     "dir", (0,)),
    "--fix-script": ([*AUDIT, "--fix-script", "{P}"], "fix.sh", "file", (0, 2)),
}
REFUSED = ["user-dir", "user-dir-above", "user-link", "group-writable", "world-writable"]
ALLOWED = ["sticky", "root-link"]


def _layout(top: Path, kind: str, uid: int, gid: int) -> tuple[Path, Path, tuple | None]:
    """Make ``kind`` under ``top``: (the directory to give, the real directory the output
    lands in, (the component a refusal names, why) or None where the rule allows it)."""
    top.mkdir()
    real = top / "real"
    real.mkdir()
    d = top / "d"
    if kind in ("user-link", "root-link"):
        os.symlink(real, d)
        if kind == "user-link":
            os.lchown(d, uid, gid)
            return d, real, (d, f"is a symbolic link owned by uid {uid}: not followed")
        return d, real, None  # root's own link: followed (as /var/run -> /run)
    d.mkdir()
    if kind == "user-dir":  # theirs: they could rename what we write for their own
        os.chown(d, uid, gid)
        return d, d, (d, f"belongs to uid {uid}, not to root or us")
    if kind == "user-dir-above":  # ours, but below theirs: they can rename ours away
        (d / "ours").mkdir()
        os.chown(d, uid, gid)
        return d / "ours", d / "ours", (d, f"belongs to uid {uid}, not to root or us")
    if kind == "group-writable":
        os.chown(d, 0, gid)
        d.chmod(0o775)
        return d, d, (d, "is writable by group or others (mode 0775) and not sticky")
    if kind == "world-writable":
        d.chmod(0o777)
        return d, d, (d, "is writable by group or others (mode 0777) and not sticky")
    assert kind == "sticky"
    d.chmod(0o1777)  # root's, like /tmp: nobody else can rename or remove what we make
    return d, d, None


def _tree(top: Path) -> dict:
    """Everything under ``top`` (never followed): type, owner, mode, link text, content."""
    out = {}
    for dirpath, dirs, files in os.walk(top):
        for n in dirs + files:
            p = Path(dirpath) / n
            st = os.lstat(p)
            out[str(p.relative_to(top))] = (
                stat.S_IFMT(st.st_mode), st.st_uid, stat.S_IMODE(st.st_mode),
                os.readlink(p) if stat.S_ISLNK(st.st_mode) else
                p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


def _check_refused(opt: str, r: subprocess.CompletedProcess, named: tuple) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    shown = f"rc={r.returncode} stderr={r.stderr!r}"
    assert r.returncode == 1 and len(lines) == 1, shown
    assert lines[0].startswith("hftagent: error: ") and opt.split()[-1] in lines[0], shown
    component, why = named
    assert f"{component} {why}" in lines[0], shown


@needs_root
@pytest.mark.parametrize("opt", list(REAL))
def test_every_directory_on_the_way_is_roots_or_ours_real_cli(opt, tmp_path, user):
    """deploy --out (issue #34 item 2: units in another user's directory, swapped before
    root installs them), capture --out, --spike-log and --flight-dir (item 3: another user's
    link in a parent followed), --fix-script: the real CLI, every layout at once."""
    _name, uid, gid = user
    argv, name, what, good = REAL[opt]
    runs = {}
    for kind in REFUSED + ALLOWED:
        give, land, named = _layout(tmp_path / kind, kind, uid, gid)
        before = _tree(tmp_path / kind)
        args = [a.replace("{P}", str(give / name)) for a in argv]
        p = subprocess.Popen([*CLI, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, OPENBLAS_NUM_THREADS="1", COLUMNS="100"))
        runs[kind] = (p, land, named, before)
    failures = []
    for kind, (p, land, named, before) in runs.items():
        out, err = p.communicate(timeout=180)
        r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        try:
            if named is None:
                assert r.returncode in good, f"rc={r.returncode} stderr={err!r}"
                made = land / name
                assert made.is_dir() if what == "dir" else made.is_file(), made
                assert os.lstat(made).st_uid == 0
            else:
                _check_refused(opt, r, named)
                assert _tree(tmp_path / kind) == before, "something was created or changed"
        except AssertionError as exc:
            failures.append(f"{kind}: {exc}")
    assert not failures, "\n".join(failures)


# options checked in-process (their heavy work fenced): (option, argv, {P} a file or a dir)
INPROC = [
    ("probe --csv", ["probe", "--no-history", "--model", "numpy", "--csv", "{P}"], "s.csv"),
    ("cpus --plot", ["cpus", "--no-history", "--duration", "1", "--plot", "{P}"], "p.png"),
    ("profile --keep-csv", ["profile", "--nsight", "--keep-csv", "{P}", "--", "true"], "k.csv"),
    ("history export --out", ["history", "--db", "{DB}", "export", "--out", "{P}"], "h.csv"),
    ("history plot --out", ["history", "--db", "{DB}", "plot", "--out", "{P}"], "h.png"),
    ("probe --db", ["probe", "--model", "numpy", "--db", "{P}"], "runs.sqlite"),
    ("audit --textfile", [*AUDIT, "--textfile", "{P}"], ""),
    ("cpus --textfile", ["cpus", "--no-history", "--duration", "1", "--textfile", "{P}"], ""),
]


@needs_root
@pytest.mark.parametrize("kind", REFUSED)
@pytest.mark.parametrize("opt,argv,name", INPROC, ids=[o[0] for o in INPROC])
def test_every_other_output_follows_the_same_rule(opt, argv, name, kind, tmp_path, user,
                                                  fenced):
    _name, uid, gid = user
    db = make_db(tmp_path / "runs.sqlite")
    give, _land, (component, why) = _layout(tmp_path / kind, kind, uid, gid)
    before = _tree(tmp_path / kind)
    rc, out, err, _s = _run_inprocess([a.replace("{P}", str(give / name) if name else
                                                 str(give)).replace("{DB}", str(db))
                                       for a in argv], 10.0)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    shown = f"rc={rc!r} stderr={err!r} stdout={out[-300:]!r}"
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("hftagent: error: "), shown
    assert f"{component} {why}" in lines[0], shown
    assert _tree(tmp_path / kind) == before


@needs_root
@pytest.mark.parametrize("kind", ALLOWED)
def test_a_sticky_root_directory_and_roots_own_link_are_allowed(kind, tmp_path, user,
                                                                fenced):
    _name, uid, gid = user
    db = make_db(tmp_path / "runs.sqlite")
    give, land, named = _layout(tmp_path / kind, kind, uid, gid)
    assert named is None
    rc, _o, err, _s = _run_inprocess(["history", "--db", str(db), "export", "--out",
                                      str(give / "h.csv")], 30.0)
    assert rc == 0 and (land / "h.csv").is_file(), err
    rc, _o, err, _s = _run_inprocess([*AUDIT, "--textfile", str(give)], 30.0)
    assert rc in (0, 2) and (land / "hftagent_audit.prom").is_file(), err


def test_the_walk_follows_our_links_by_their_text_and_checks_where_they_lead(tmp_path):
    """A link of ours is walked by its text (relative, absolute, with ..) under the same
    rule: one that leads into a directory others may write is refused there."""
    from agent.outfile import OutputError, open_dir
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink("a/b", tmp_path / "rel")
    os.symlink(tmp_path / "a", tmp_path / "abs")
    os.symlink("../a/b/..", tmp_path / "a" / "up")
    for p, real in ((tmp_path / "rel" / "x", tmp_path / "a" / "b" / "x"),
                    (tmp_path / "abs" / "b" / "y", tmp_path / "a" / "b" / "y"),
                    (tmp_path / "a" / "up" / "z", tmp_path / "a" / "z")):
        os.close(open_dir(p, "--flight-dir", create=True))
        assert real.is_dir(), p
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    os.symlink(shared, tmp_path / "to-shared")
    with pytest.raises(OutputError, match=f"{shared} is writable by group or others"):
        open_dir(tmp_path / "to-shared" / "fl", "--flight-dir", create=True)
    assert os.listdir(shared) == []
    os.symlink("loop", tmp_path / "loop")
    with pytest.raises(OutputError, match="too many levels of symbolic links"):
        open_dir(tmp_path / "loop" / "fl", "--flight-dir", create=True)


def test_a_directory_swapped_after_the_walk_is_not_written_into(tmp_path):
    """The file is created relative to the walked descriptor: a rename of the directory
    after the check (here by us, as another user could in a directory the rule refuses)
    moves nothing of ours to where the path now leads."""
    from agent.outfile import open_output
    d = tmp_path / "d"
    d.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = open_output(d / "x.csv", "--csv")
    d.rename(tmp_path / "moved")
    os.symlink(elsewhere, d)
    out.write("a\n")
    out.close()
    assert (tmp_path / "moved" / "x.csv").read_text() == "a\n"
    assert os.listdir(elsewhere) == []


def test_the_spike_log_follows_our_own_descriptor_links(tmp_path):
    """/dev/stdout -> /proc/self/fd/1 (root's link, then our process's descriptor link):
    the kernel opens our own stdout, a pipe here."""
    code = ("from agent.outfile import open_append; import os; "
            "fd = open_append('/dev/stdout', '--spike-log'); os.write(fd, b'logged\\n')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and r.stdout == "logged\n", r.stderr


@needs_root
def test_the_spike_log_refuses_another_users_file_and_a_hard_link(tmp_path, user):
    from agent.outfile import OutputError, open_append
    _name, uid, gid = user
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text("")
    os.chown(theirs, uid, gid)
    with pytest.raises(OutputError, match=f"belongs to uid {uid}, not to root or us"):
        open_append(theirs, "--spike-log")
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    os.link(secret, tmp_path / "spikes.jsonl")  # as in a sticky /tmp without protected_hardlinks
    with pytest.raises(OutputError, match="has 2 hard links: not written"):
        open_append(tmp_path / "spikes.jsonl", "--spike-log")
    assert secret.read_text() == "root only\n"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    fifo = shared / "spikes"
    os.mkfifo(fifo)  # another user's, read by them: they would get what watch logs
    os.chown(fifo, uid, gid)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OutputError, match=f"belongs to uid {uid} in the shared directory "
                                              f"{shared}, not to root or us"):
            open_append(fifo, "--spike-log")
        os.chown(fifo, 0, 0)  # root's own FIFO with a reader: a place for the log
        os.close(open_append(fifo, "--spike-log"))
    finally:
        os.close(reader)
