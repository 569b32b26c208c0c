"""What another program may learn of a scaling filter file without mapping it:
its header, read once from the path (format version, generation, stage count,
change sequence numbers, clean or torn), and whether a writer holds its lock.

The file format is filterengine's business: callers (a service's registry, its
health checks) ask here instead of parsing headers or naming lock files."""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import fileformat as ff
from .locking import writer_active, writer_lock_path
from .writerstate import is_clean

__all__ = ["FileStatus", "file_status", "writer_active", "writer_lock_path"]


@dataclass(frozen=True, slots=True)
class FileStatus:
    """A filter file's header as it is on disk now (one read, no mapping)."""

    path: str
    #: The format version (a file of another version is refused, not described).
    version: int
    generation: int
    capacity: int
    error_rate: float
    stage_count: int
    applied_seq: int
    mem_seqnum: int
    disk_seqnum: int
    #: A writer found the file interrupted mid-change: dirty until rebuilt.
    torn: bool
    #: No change interrupted and everything flushed (``is_clean`` of an open filter).
    is_clean: bool


def file_status(path: str | os.PathLike[str]) -> FileStatus:
    """Read the header of the file at ``path``. OSError if it cannot be read,
    FilterFileError if it is not a valid filter file of this format version."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        head = f.read(ff.TABLE_OFFSET)
        size = os.fstat(f.fileno()).st_size
    header = ff.read_fixed(head, size, path)
    state = ff.read_state(head, path)
    return FileStatus(
        path=path,
        version=ff.VERSION,
        generation=header.generation,
        capacity=header.capacity,
        error_rate=header.error_rate,
        stage_count=state.stage_count,
        applied_seq=state.applied_seq,
        mem_seqnum=state.mem_seqnum,
        disk_seqnum=state.disk_seqnum,
        torn=bool(state.flags & ff.FLAG_TORN),
        is_clean=is_clean(state),
    )
