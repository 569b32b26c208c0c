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

__all__ = ["acquire_writer_lock", "release_writer_lock", "lock_path_of"]

#: Owner-only: the lock file and the filter files say nothing others need to read.
FILE_MODE = 0o600


def lock_path_of(path: str) -> str:
    return path + ".lock"


def acquire_writer_lock(path: str, timeout: float) -> int:
    """Take the writer lock of ``path``, waiting at most ``timeout`` seconds; return
    its descriptor. FilterLockedError if another process keeps it; FilterFileError
    if the lock path is a symbolic link."""
    lock_path = lock_path_of(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(lock_path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise FilterFileError(
            f"{path}: writer lock {lock_path}: expected a regular file, found a symbolic "
            "link; refusing to follow it (remove the link; only the filter's writer "
            "should create this file)"
        ) from None
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise FilterLockedError(
                    f"{path}: another process is writing this filter (its lock "
                    f"{lock_path} is held); open it read-only, or retry when that "
                    f"writer has closed it"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def release_writer_lock(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
