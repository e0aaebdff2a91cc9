"""`hftagent deploy --out DIR`: write the deployment files shipped in the package.

The systemd units, the Prometheus scrape config, alert rules and their tests, the Alertmanager
example, the Grafana dashboard and the web config example live in the repository's top-level
deploy/ and ship in the package as ``agent/deploy`` (a link to it in the source tree), so an
installed hftagent (pip/pipx, no clone) can write them out.
"""

from __future__ import annotations

import errno
import os
from importlib import resources
from typing import Annotated

import typer

from agent.commands.common import cli_errors, fail

HELP = """Write the deployment files (systemd units, Prometheus config and alert rules,
Alertmanager example, Grafana dashboard, web config example) into DIR.

DIR is created if it does not exist (its parent must); a file that already exists there is
never overwritten: the command refuses before it writes anything. docs/fleet.md says what
each file is for."""


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


def _open_dir(path: str, *, dir_fd: int | None = None, create: bool = False) -> int:
    """An fd of directory ``path`` (relative to ``dir_fd``), never through a symlink;
    created 0755 first when ``create`` and missing."""
    if create:
        try:
            os.mkdir(path, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            pass
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=dir_fd)


def write_tree(out: str, files: list[tuple[str, bytes]]) -> None:
    """Write ``files`` under ``out``: every directory opened without following a link, every
    file created exclusively (O_EXCL|O_NOFOLLOW). Refuses (OSError) before writing anything
    when a target exists."""
    for rel, _ in files:
        target = os.path.join(out, rel)
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "already exists; nothing was written", target)
    top = _open_dir(out, create=True)
    try:
        for rel, data in files:
            *dirs, name = rel.split("/")
            fds = [top]
            try:
                for d in dirs:
                    fds.append(_open_dir(d, dir_fd=fds[-1], create=True))
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=fds[-1])
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            finally:
                for d in fds[1:]:
                    os.close(d)
    finally:
        os.close(top)


def deploy(out: Annotated[str, typer.Option("--out", help="Directory to write into (created "
                                            "if missing; existing files are never "
                                            "overwritten).")]) -> None:
    files = shipped()
    if not files:
        raise fail("no deployment files in this installation (agent/deploy is missing)")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise fail(f"--out {out!r}: its parent directory does not exist")
    if os.path.islink(out) or (os.path.lexists(out) and not os.path.isdir(out)):
        raise fail(f"--out {out!r} exists and is not a directory")
    try:
        write_tree(out, files)
    except OSError as exc:
        where = exc.filename or out
        raise fail(f"--out {out!r}: {where}: {exc.strerror or exc}") from None
    print(f"wrote {len(files)} files into {out}:")
    for rel, _ in files:
        print(f"  {rel}")


def register(app: typer.Typer) -> None:
    app.command("deploy", help=HELP)(cli_errors(deploy))
