"""Build a small C helper on first use, with the system's C compiler, into a per-user cache.

Shared by the native sampler (agent/watch/sampling/native/hftsampler.c, started by its
feed.py), the noise recorder (agent/noise/hftnoise.c) and the keep-awake spinner
(tuning/keepawake.c, started by ``hftagent run --keep-awake``). They often run as root and execute the cached binary, so the cache directory and the binary must
be ours (or root's), not symlinks, and writable only by their owner; a binary is keyed by the
hash of its source and the machine, and is renamed into place whole (a concurrent build never
leaves a half-written file).

Cache: ``$HFTAGENT_CACHE``, else ``$XDG_CACHE_HOME/hftagent``, else ``~/.cache/hftagent``.
Compiler: ``$CC`` (checked like the cache when we are root), else cc, gcc or clang on PATH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path


class NativeUnavailable(RuntimeError):
    """A helper cannot be built or run here; the message says why."""


def cache_dir() -> Path:
    env = os.environ.get("HFTAGENT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hftagent"


def trusted(path: Path, what: str, *, directory: bool) -> None:
    """Refuse a cache directory or binary that someone else could have written: not a
    symlink, owned by us (or root), not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise NativeUnavailable(f"{what} {path}: {exc.strerror}") from None
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok or st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        raise NativeUnavailable(f"{what} {path} is not a {'directory' if directory else 'file'}"
                                " owned by you and writable only by you: not used")


def compiler(what: str) -> str:
    """The C compiler: $CC (a trusted file when we are root) or cc/gcc/clang on PATH."""
    want = os.environ.get("CC")
    if want:
        cc = shutil.which(want)
        if cc is None:
            raise NativeUnavailable(f"building the {what} failed: CC={want} not found")
        if os.geteuid() == 0:
            trusted(Path(os.path.realpath(cc)), "CC", directory=False)
        return cc
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise NativeUnavailable(f"no C compiler (cc) to build the {what}")
    return cc


def build(source: Path, name: str, what: str, out_dir: Path | None = None,
          machines: tuple[str, ...] | None = None, machines_why: str = "") -> Path:
    """Path of the compiled ``source`` (``<cache>/<name>-<hash>``); compiled (~0.3 s) when not
    cached. ``what`` names the helper in messages ("native sampler"). ``machines``: the
    ``uname -m`` values it may be built for (None: any), ``machines_why`` says why.
    Raises :class:`NativeUnavailable` (wrong machine, no compiler, failed build, a cache
    directory or cached binary that someone else could have written)."""
    machine = os.uname().machine
    if machines is not None and machine not in machines:
        raise NativeUnavailable(f"the {what} needs {machines_why or '/'.join(machines)} "
                                f"(this is {machine})")
    try:
        src = source.read_bytes()
    except OSError as exc:
        raise NativeUnavailable(f"{what} source missing: {exc.strerror}") from None
    key = hashlib.sha256(src + machine.encode()).hexdigest()[:16]
    d = out_dir or cache_dir()
    exe = d / f"{name}-{key}"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise NativeUnavailable(f"cannot create {d}: {exc.strerror}") from None
    trusted(d, "cache directory", directory=True)
    if os.path.lexists(exe):
        trusted(exe, f"cached {what}", directory=False)
        if os.access(exe, os.X_OK):
            return exe
    cc = compiler(what)
    tmp = d / f".{exe.name}.{os.getpid()}.tmp"
    try:
        r = subprocess.run([cc, "-O2", "-std=gnu11", "-Wall", "-o", str(tmp), str(source)],
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeUnavailable(f"building the {what} failed: {exc}") from None
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = r.stderr.strip().splitlines() or ["no output"]
        first = next((ln for ln in lines if "error" in ln), lines[0])
        raise NativeUnavailable(f"building the {what} failed: {first}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, exe)  # atomic: a concurrent build never leaves a half-written binary
    return exe
