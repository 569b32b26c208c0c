"""The writer lock of a filter file: an ``fcntl.flock`` on the sidecar
``<path>.lock``, so that one process at a time writes a file while any number of
others read it. The lock file is never followed through a symbolic link: a link
planted there would otherwise make the writer create or open its target."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time

from .errors import FilterFileError, FilterLockedError

__all__ = [
    "acquire_lock",
    "acquire_writer_lock",
    "release_lock",
    "release_writer_lock",
    "writer_active",
    "writer_lock_path",
]

#: Owner-only: the lock file and the filter files say nothing others need to read.
FILE_MODE = 0o600


def writer_lock_path(path: str) -> str:
    """The writer lock file of the filter file at ``path``."""
    return path + ".lock"


def writer_active(path: str) -> bool:
    """Whether a live process holds the writer lock of ``path`` now. Never creates
    the lock file (no lock file: no writer ever opened the file here) and never
    follows a symbolic link planted in its place."""
    try:
        fd = os.open(writer_lock_path(path), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def acquire_lock(lock_path: str, timeout: float) -> int | None:
    """Take an exclusive ``flock`` on the file at ``lock_path`` (created owner-only),
    waiting at most ``timeout`` seconds, polling with a growing back-off; return its
    descriptor, or None if another process kept it that long. Never follows a
    symbolic link there: OSError (ELOOP) instead. The lock is released when the
    descriptor is closed, or when its process dies."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def acquire_writer_lock(path: str, timeout: float) -> int:
    """Take the writer lock of ``path``, waiting at most ``timeout`` seconds; return
    its descriptor. FilterLockedError if another process keeps it; FilterFileError
    if the lock path is a symbolic link."""
    lock_path = writer_lock_path(path)
    try:
        fd = acquire_lock(lock_path, timeout)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise FilterFileError(
            f"{path}: writer lock {lock_path}: expected a regular file, found a symbolic "
            "link; refusing to follow it (remove the link; only the filter's writer "
            "should create this file)"
        ) from None
    if fd is None:
        raise FilterLockedError(
            f"{path}: another process is writing this filter (its lock "
            f"{lock_path} is held); open it read-only, or retry when that "
            f"writer has closed it"
        )
    return fd


def release_lock(fd: int | None) -> None:
    """Release a lock acquire_lock() took (None: nothing to release)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


#: The writer lock is released as any other.
release_writer_lock = release_lock
