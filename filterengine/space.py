"""Disk space for filter files: reserve the blocks of a file's new part before
anything maps it, so that writing counters through a mapping can never meet a
full file system (the kernel's only answer then is SIGBUS, for the writer and for
every reader of the page), and say clearly when there is no room."""

from __future__ import annotations

import errno
import os

from .errors import FilterSpaceError

__all__ = ["free_bytes", "reserve", "require_free"]

#: The errors that mean "no room", whatever the limit was (space, quota, size).
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
#: The errors that mean "this file system or platform cannot reserve".
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of ``path``'s
    directory; None if the file system will not say."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def require_free(path: str, needed: int, what: str) -> None:
    """FilterSpaceError, before anything is written, if fewer than ``needed`` bytes
    are free beside ``path``."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise FilterSpaceError(path, needed, free, what)


def reserve(fd: int, offset: int, length: int, path: str, what: str) -> None:
    """Allocate bytes [offset, offset + length) of ``fd``'s file (growing it if
    needed); FilterSpaceError naming ``path``, the bytes and the free space if the
    file system has no room. The file's visible content is unchanged."""
    if length <= 0:
        return
    fallocate = getattr(os, "posix_fallocate", None)
    try:
        if fallocate is None:
            raise OSError(errno.ENOSYS, "posix_fallocate is not available")
        fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise FilterSpaceError(path, length, free_bytes(path), what) from None
        if exc.errno not in _UNSUPPORTED:
            raise
        # A platform or file system that cannot reserve: grow the file sparse, as
        # before reservations existed (a full disk can then still fault a writer).
        if os.fstat(fd).st_size < offset + length:
            os.ftruncate(fd, offset + length)
