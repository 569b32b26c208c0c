"""The var directory of the embedded default (SQLite database, filter file, the
demo's secret key): created readable by its owner only, and the demo's random
secret key kept in it. Imported by urlguard_service/settings.py, so it imports no Django."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

# A file here is made with O_NOFOLLOW: a symlink planted in its place is refused,
# never followed to create or overwrite its target.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def make_private_dir(path: Path) -> None:
    """Create `path` (and its parents) with mode 0700 if it does not exist. An
    existing directory keeps its mode (system check urlguard.W003 warns if others
    can read it): the operator may have chosen a shared one on purpose."""
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask


def make_private_file(path: Path) -> None:
    """Create an empty `path` with mode 0600 unless it exists (SQLite then opens
    the file it finds and gives its -wal and -shm files the same mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, _CREATE, 0o600))


def demo_secret_key(path: Path) -> str:
    """The embedded demo's SECRET_KEY: random, made on first run and kept in `path`
    (0600) so sessions and "continue anyway" links survive a restart. Two processes
    starting at once agree on one key: each writes its own file aside and links it
    into place, and the one that loses reads the winner's."""
    with contextlib.suppress(FileNotFoundError):
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_urlsafe(50)
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(aside, _CREATE, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        try:
            os.link(aside, path)
        except FileExistsError:
            return path.read_text().strip()
        return key
    finally:
        aside.unlink()
