"""Exceptions raised by filterengine (and the one wording of a refused batch removal).

FilterFileError is a ValueError so that callers who only care about "bad input"
can catch ValueError; FilterLockedError narrows it to "another writer holds the
file", which a service usually reports rather than treats as corruption."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["FilterFileError", "FilterLockedError", "FilterSpaceError"]


class FilterFileError(ValueError):
    """A filter file (or serialized filter) is truncated, corrupt, of another
    format or version, or inconsistent with the parameters asked for.

    The message names the path (when there is one), the field, and the expected
    and found values, so the operator knows whether to rebuild or reconfigure."""


class FilterLockedError(FilterFileError):
    """A second writer tried to open a filter file that already has one.

    Only one process may write a filter file (an ``fcntl.flock`` on the sidecar
    ``<path>.lock``); readers are unlimited."""


class FilterSpaceError(FilterFileError):
    """The file system has no room for a filter file to grow (a new stage) or to be
    rebuilt. Nothing that readers map was touched: the old file is intact and
    readable, and a change that needed the room was refused before any counter
    moved. ``needed`` and ``free`` are in bytes (``free`` None if unknown)."""

    def __init__(self, path: str, needed: int, free: int | None, what: str) -> None:
        super().__init__(path, needed, free, what)  # args: pickles (Celery results)
        self.path = path
        self.needed = needed
        self.free = free
        self.what = what

    def __str__(self) -> str:
        free = "an unknown number of" if self.free is None else f"{self.free:,}"
        return (
            f"{self.path}: {self.what}: needs {self.needed:,} more bytes on its file "
            f"system, {free} bytes free; the filter file was not changed (free some "
            "space, or move the filter to a larger file system, then retry)"
        )


def removal_refused(keys: Sequence[object], why: str) -> KeyError:
    """The KeyError of a batch removal refused as a whole: why, and the first keys."""
    shown = ", ".join(repr(k) for k in keys[:5])
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    return KeyError(f"{why}: {shown}{more}; nothing was removed")
