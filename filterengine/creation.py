"""Making a scaling filter file at a path, safely for the processes that map
what is there: ``create`` (a new, empty file where there is none), ``build`` (a
new file from (key, id) pairs) and ``restore`` (a validated copy of a backup).
Every file is written aside first; build and restore then fsync it,
``os.replace`` it over the path and mark the old file superseded, so readers
follow at their next answer and nothing they map is ever truncated or
overwritten (atomicfile.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Sized
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from . import fileformat as ff
from .atomicfile import (
    copy_aside,
    fsync_dir,
    generation_of,
    mark_superseded,
    open_existing,
    remove_stale_temps,
    set_generation,
    write_empty,
)
from .errors import FilterFileError
from .ids import checked_id
from .locking import acquire_writer_lock, release_writer_lock
from .mapping import FileView
from .space import require_free

__all__ = ["build_file", "create_file", "restore_file"]

_BUILD_CHUNK = 65_536


class _Filter(Protocol):
    """What is used here of the filter being written (a ScalingCountingBloomFilter;
    named by its parts because scaling.py imports this module)."""

    path: str
    readonly: bool
    _lock_fd: int | None
    _view: FileView

    @property
    def is_clean(self) -> bool: ...
    def change(self) -> AbstractContextManager[Any]: ...
    def add_many(self, keys: list[str | bytes], ids: list[int]) -> None: ...
    def flush(self) -> None: ...
    def _close_mapping(self) -> None: ...
    def _follow_replacement(self) -> None: ...


F = TypeVar("F", bound=_Filter)
#: Maps a descriptor as a filter: (path, fd, readonly=...) -> filter.
Attach = Callable[..., F]


def _new_generation(old_fd: int | None) -> int:
    """Larger than the replaced file's, so readers can tell the files apart."""
    return max(time.time_ns() // 1000, generation_of(old_fd) + 1)


def _put_in_place(fresh: _Filter, tmp: str, path: str, old_fd: int | None) -> None:
    """Make the finished temp file durable, move it over ``path`` and tell the
    old file's readers (its superseded bit). Closes ``fresh``'s mapping; closes
    ``old_fd``."""
    try:
        fresh.flush()
        os.fsync(fresh._view.fd)
    finally:
        fresh._close_mapping()
    os.replace(tmp, path)
    fsync_dir(path)
    if old_fd is not None:
        mark_superseded(old_fd)


def create_file(path: str, header: ff.Header) -> tuple[int, int]:
    """Write a new, empty file at ``path`` (FileExistsError if there is one);
    return (its descriptor for writing, the writer lock's descriptor)."""
    if os.path.exists(path):
        raise FileExistsError(f"{path}: already exists; open() it, or build() a replacement")
    lock_fd = acquire_writer_lock(path, 0.0)
    try:
        remove_stale_temps(path)
        tmp = write_empty(path, header, applied_seq=0)
        try:
            # link() refuses to replace: a file created meanwhile is kept.
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
        fsync_dir(path)
        return os.open(path, os.O_RDWR | os.O_CLOEXEC), lock_fd
    except BaseException:
        release_writer_lock(lock_fd)
        raise


def build_file(
    attach: Attach[F],
    path: str,
    pairs: Iterable[tuple[str | bytes, int]],
    header: ff.Header,
    *,
    applied_seq: int,
    writer: F | None,
    lock_timeout: float,
) -> int:
    """ScalingCountingBloomFilter.build (see there); ``header`` without its
    generation yet. Returns the new file's generation."""
    applied_seq = checked_id(applied_seq)
    if applied_seq < 0:
        raise ValueError(f"applied_seq must be >= 0, got {applied_seq}")
    if writer is not None:
        if writer.readonly or writer.path != path or writer._lock_fd is None:
            raise ValueError(f"writer must be an open writer of {path}")
        lock_fd = None
    else:
        lock_fd = acquire_writer_lock(path, lock_timeout)
    tmp = None
    old_fd = None
    try:
        # Under the lock no other build of this path runs: every temp file
        # beside it is left over from a killed one (and may fill the disk).
        remove_stale_temps(path)
        old_fd = open_existing(path)
        generation = _new_generation(old_fd)
        header = dataclasses.replace(header, generation=generation)
        keys = len(pairs) if isinstance(pairs, Sized) else 0
        require_free(path, ff.file_size(header, keys), "rebuild (a new file beside it)")
        tmp = write_empty(path, header, applied_seq=applied_seq)
        fresh = attach(tmp, os.open(tmp, os.O_RDWR | os.O_CLOEXEC), readonly=False)
        fresh.path = path  # error messages name the file the caller asked for
        try:
            with fresh.change():
                chunk_keys: list[str | bytes] = []
                chunk_ids: list[int] = []
                for key, id_ in pairs:
                    chunk_keys.append(key)
                    chunk_ids.append(id_)
                    if len(chunk_keys) == _BUILD_CHUNK:
                        fresh.add_many(chunk_keys, chunk_ids)
                        chunk_keys, chunk_ids = [], []
                if chunk_keys:
                    fresh.add_many(chunk_keys, chunk_ids)
        except BaseException:
            fresh._close_mapping()
            raise
        _put_in_place(fresh, tmp, path, old_fd)
        tmp = old_fd = None
        if writer is not None:
            writer._follow_replacement()
        return generation
    finally:
        if old_fd is not None:
            os.close(old_fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        release_writer_lock(lock_fd)


def restore_file(
    attach: Attach[F],
    path: str,
    source: str,
    *,
    catch_up: Callable[[F], None] | None,
    lock_timeout: float,
) -> int:
    """ScalingCountingBloomFilter.restore (see there). Returns the generation."""
    lock_fd = acquire_writer_lock(path, lock_timeout)
    tmp = None
    old_fd = None
    try:
        remove_stale_temps(path)
        tmp = copy_aside(path, source)
        copy = attach(tmp, os.open(tmp, os.O_RDONLY | os.O_CLOEXEC), readonly=True)
        try:
            clean = copy.is_clean
        finally:
            copy._close_mapping()
        if not clean:
            raise FilterFileError(
                f"{source}: state: expected a clean file, found one a writer was "
                "changing when it was copied (or that it left dirty); its counters "
                "may be torn: rebuild the filter instead"
            )
        old_fd = open_existing(path)
        fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
        generation = _new_generation(old_fd)
        set_generation(fd, generation, source)
        fresh = attach(tmp, fd, readonly=False)
        fresh.path = path  # error messages name the file the caller asked for
        if catch_up is not None:
            try:
                catch_up(fresh)
            except BaseException:
                fresh._close_mapping()
                raise
        _put_in_place(fresh, tmp, path, old_fd)
        tmp = old_fd = None
        return generation
    finally:
        if old_fd is not None:
            os.close(old_fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        release_writer_lock(lock_fd)
