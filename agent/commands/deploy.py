"""`hftagent deploy --out DIR`: write the deployment files shipped in the package.

The systemd units, the Prometheus scrape config, alert rules and their tests, the Alertmanager
example, the Grafana dashboard and the web config example live in the repository's top-level
deploy/ and ship in the package as ``agent/deploy`` (a link to it in the source tree), so an
installed hftagent (pip/pipx, no clone) can write them out.

The units are written for this box and this installation (:func:`for_this_box`): every
``ExecStart`` (and the tune unit's ``ConditionPathExists``) names the absolute path of the
hftagent that runs the command — the ``hftagent`` script next to its Python, as pip and pipx
install it — or ``--exec PATH`` (:func:`check_exec`: absolute, an existing executable regular
file, owned by root or the caller and writable by nobody else, a path systemd reads as it
is); the CPU lists come from this box's target rule (:func:`tuning.targets.resolve`, as
``audit``, ``tune`` and ``watch`` choose them): the target CPUs in ``HFTAGENT_PROBE_CPUS``,
the housekeeping CPUs in the units' ``CPUAffinity=``. The shipped files hold the defaults
these replace (:data:`SHIPPED_EXEC`, ``HFTAGENT_PROBE_CPUS=2-3``, ``CPUAffinity=0``).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from importlib import resources
from typing import Annotated, NamedTuple

import typer

from agent.commands.common import ProcfsOpt, RootOpt, SysfsOpt, fail, make_host, register_command
from agent.errors import AgentError
from collectors.host import Host

HELP = """Write the deployment files (systemd units, Prometheus config and alert rules,
Alertmanager example, Grafana dashboard, web config example) into DIR.

DIR is created if it does not exist (its parent must). Every directory from / down to DIR must
belong to root or to you and be writable by nobody else (a sticky one like /tmp excepted), and
no other user's symlink is followed: root installs these units, so nobody else may be able to
swap them. A file that already exists there is never overwritten: the command refuses before
it writes anything. docs/fleet.md says what each file is for.

The systemd units start the hftagent that runs this command (the hftagent script next to its
Python; --exec PATH names another: an absolute, executable regular file owned by root or you
and writable by nobody else), with this box's CPUs from the target rule (isolated, else
nohz_full, else all but the housekeeping core): HFTAGENT_PROBE_CPUS the target CPUs,
CPUAffinity= the housekeeping CPUs. hftagent-attach@.service is a template: enable
hftagent-attach@NAME to watch the service NAME.service (watch --attach-unit NAME)."""

SHIPPED_EXEC = "/opt/hftagent/.venv/bin/hftagent"  # the shipped units' path, replaced
SHIPPED_CPUS = "HFTAGENT_PROBE_CPUS=2-3"
SHIPPED_AFFINITY = "CPUAffinity=0"
# a path systemd's command lines take as it is: no spaces, quotes, backslashes, specifiers
# (%) or variables ($)
PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_.@+/-]+$")


class Box(NamedTuple):
    """What the units say for this box: the hftagent to start, the target and housekeeping
    CPUs (compact lists) and where the target came from (the rule's step)."""

    exec_path: str
    cpus: str
    housekeeping: str
    source: str


def running_hftagent() -> str:
    """The hftagent script of the installation running now: next to its Python (a venv's
    or pipx's bin/, never resolved: that is where pip put the script), else this process's
    own script. AgentError with one line when there is none."""
    here = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "hftagent")
    if os.path.lexists(here):
        return here
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "hftagent" and os.path.isabs(argv0):
        return argv0
    raise AgentError(f"cannot tell which hftagent runs this (none next to {sys.executable}): "
                     "give --exec PATH")


def check_exec(path: str, said: str = "--exec") -> str:
    """``path`` when root may start it at boot: absolute and plain (:data:`PLAIN_PATH`), an
    existing regular file (a link is refused: systemd would start whatever it points to
    then), executable, owned by root or the caller and writable by nobody else. AgentError
    with one line otherwise."""
    if not os.path.isabs(path):
        raise AgentError(f"{said} {path}: give an absolute path")
    if not PLAIN_PATH.match(path):
        raise AgentError(f"{said} {path!r}: systemd would not read this path as it is "
                         "(spaces, quotes, backslashes, % or $): install hftagent under a "
                         "plain path")
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise AgentError(f"{said} {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise AgentError(f"{said} {path} is a symbolic link: give the file it points to "
                         f"({os.path.realpath(path)})")
    if not stat.S_ISREG(st.st_mode):
        raise AgentError(f"{said} {path} is not a regular file")
    if st.st_uid not in (0, os.geteuid()):
        raise AgentError(f"{said} {path} belongs to uid {st.st_uid}, not to root or you: "
                         "refused (root starts it at boot)")
    if st.st_mode & 0o022:
        raise AgentError(f"{said} {path} is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):04o}): refused (root starts it at boot)")
    if not st.st_mode & 0o111:
        raise AgentError(f"{said} {path} is not executable")
    return path


def for_this_box(host: Host, exec_path: str | None) -> Box:
    """The hftagent to start (``exec_path``, else :func:`running_hftagent`), checked, and
    this box's CPUs by the target rule. AgentError with one line."""
    from tuning.targets import TargetError, resolve
    path = check_exec(exec_path) if exec_path is not None else \
        check_exec(running_hftagent(), "the running hftagent")
    try:
        rule = resolve(host)
    except TargetError as exc:
        raise AgentError(str(exc)) from None
    from collectors.parsers import format_cpulist
    house = rule.housekeeping or rule.online  # one CPU: the units share it
    return Box(path, rule.cpus_s, format_cpulist(house), rule.source)


def render(files: list[tuple[str, bytes]], box: Box) -> list[tuple[str, bytes]]:
    """``files`` with the units' path and CPUs set for ``box`` (the module docstring); a
    shipped unit without the line it should have is an AgentError (a broken package)."""
    out = []
    for rel, data in files:
        if rel.startswith("systemd/"):
            text = data.decode()
            if rel.endswith(".service"):
                text = _set(rel, text, SHIPPED_EXEC, box.exec_path)
                if SHIPPED_AFFINITY + "\n" in text:
                    text = text.replace(SHIPPED_AFFINITY + "\n",
                                        f"CPUAffinity={box.housekeeping}\n")
            elif rel == "systemd/hftagent.default":
                text = _set(rel, text, SHIPPED_CPUS + "\n",
                            f"# (hftagent deploy: {box.source} on this box)\n"
                            f"HFTAGENT_PROBE_CPUS={box.cpus}\n")
            data = text.encode()
        out.append((rel, data))
    return out


def _set(rel: str, text: str, old: str, new: str) -> str:
    if old not in text:
        raise AgentError(f"the shipped {rel} has no {old.strip()!r} to set: a broken "
                         "installation (reinstall hftagent)")
    return text.replace(old, new)


def shipped() -> list[tuple[str, bytes]]:
    """(relative path, content) of every deployment file in the installed package."""
    base = resources.files("agent") / "deploy"
    out: list[tuple[str, bytes]] = []

    def walk(node, rel: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            name = f"{rel}/{child.name}" if rel else child.name
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, name)
            elif child.is_file():
                out.append((name, child.read_bytes()))

    if base.is_dir():
        walk(base, "")
    return out


def _existing(top: int, out: str, files: list[tuple[str, bytes]]) -> str | None:
    """The first of ``files`` already under the checked directory ``top`` (its relative
    path), looked up without following anything; None when none is."""
    from agent.outfile import open_below, show
    for rel, _ in files:
        *dirs, name = rel.split("/")
        fds = [top]
        try:
            for d in dirs:
                try:
                    os.stat(d, dir_fd=fds[-1], follow_symlinks=False)
                except FileNotFoundError:
                    break
                fds.append(open_below(fds[-1], d, "--out", show(out)))
            else:
                try:
                    os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
                    return rel
                except FileNotFoundError:
                    pass
        finally:
            for d in fds[1:]:
                os.close(d)
    return None


def write_tree(out: str, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` under ``out`` (agent/outfile.py's rule: every directory from / down
    root's or ours and not writable by others, no other user's link followed; ``out`` made
    when missing, its parent must exist), every directory below it a real one (never a
    link), every file created exclusively (O_EXCL|O_NOFOLLOW). Refuses (OutputError) before
    writing anything when a target exists."""
    from agent.outfile import OutputError, open_below, open_dir, show
    top = open_dir(out, "--out", create=True)
    try:
        there = _existing(top, out, files)
        if there is not None:
            raise OutputError(f"--out {show(out)}: {show(there)} already exists; nothing was "
                              "written")
        for rel, data in files:
            *dirs, name = rel.split("/")
            fds = [top]
            try:
                for d in dirs:
                    fds.append(open_below(fds[-1], d, "--out", show(out), create=True))
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=fds[-1])
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as exc:
                raise OutputError(f"--out {show(out)}: {show(rel)}: {exc.strerror or exc}"
                                  ) from None
            finally:
                for d in fds[1:]:
                    os.close(d)
    finally:
        os.close(top)


OutOpt = Annotated[str, typer.Option(
    "--out", help="Directory to write into (created if missing, its parent must exist; every "
    "directory on the way owned by root or you and not writable by others; existing files "
    "are never overwritten).")]
ExecOpt = Annotated[str | None, typer.Option(
    "--exec", metavar="PATH", help="The hftagent the systemd units start (default: the one "
    "running this command): an absolute path to an executable regular file owned by root or "
    "you and writable by nobody else.")]


def deploy(out: OutOpt, exec_path: ExecOpt = None, root: RootOpt = "/",
           procfs: ProcfsOpt = None, sysfs: SysfsOpt = None) -> None:
    files = shipped()
    if not files:
        raise fail("no deployment files in this installation (agent/deploy is missing)")
    box = for_this_box(make_host(root, procfs, sysfs), exec_path)
    files = render(files, box)
    write_tree(out, files)
    print(f"wrote {len(files)} files into {out}:")
    for rel, _ in files:
        print(f"  {rel}")
    print(f"units start {box.exec_path}; target CPUs {box.cpus} ({box.source}), "
          f"housekeeping {box.housekeeping}")


def register(app: typer.Typer) -> None:
    register_command(app, "deploy", deploy, HELP)  # help as paragraphs (80 columns)
