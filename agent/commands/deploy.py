"""`hftagent deploy --out DIR`: write the deployment files shipped in the package.

The systemd units, the Prometheus scrape config, alert rules and their tests, the Alertmanager
example, the Grafana dashboard and the web config example live in the repository's top-level
deploy/ and ship in the package as ``agent/deploy`` (a link to it in the source tree), so an
installed hftagent (pip/pipx, no clone) can write them out.
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Annotated

import typer

from agent.commands.common import fail, register_command

HELP = """Write the deployment files (systemd units, Prometheus config and alert rules,
Alertmanager example, Grafana dashboard, web config example) into DIR.

DIR is created if it does not exist (its parent must). Every directory from / down to DIR must
belong to root or to you and be writable by nobody else (a sticky one like /tmp excepted), and
no other user's symlink is followed: root installs these units, so nobody else may be able to
swap them. A file that already exists there is never overwritten: the command refuses before
it writes anything. docs/fleet.md says what each file is for."""


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


def deploy(out: Annotated[str, typer.Option("--out", help="Directory to write into (created "
                                            "if missing, its parent must exist; every "
                                            "directory on the way owned by root or you and "
                                            "not writable by others; existing files are "
                                            "never overwritten).")]) -> None:
    files = shipped()
    if not files:
        raise fail("no deployment files in this installation (agent/deploy is missing)")
    write_tree(out, files)
    print(f"wrote {len(files)} files into {out}:")
    for rel, _ in files:
        print(f"  {rel}")


def register(app: typer.Typer) -> None:
    register_command(app, "deploy", deploy, HELP)  # help as paragraphs (80 columns)
