"""Writing a filter file aside and moving it into place: a new file is complete and
fsynced before ``os.replace`` (or ``os.link``) puts it at the path, so no process
ever maps a half-written file; the file it replaces is marked superseded so that
readers still mapping it reopen the path."""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile

from . import fileformat as ff
from .errors import FilterFileError

__all__ = ["fsync_dir", "generation_of", "mark_superseded", "open_existing", "write_empty"]


def write_empty(path: str, header: ff.Header, *, applied_seq: int) -> str:
    """Write a complete one-stage file beside ``path``; return its temp path."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    # mkstemp creates the file 0600 (FILE_MODE): os.replace and os.link keep that.
    try:
        stage = ff.stage_plan(header, 0, ff.DATA_OFFSET)
        os.ftruncate(fd, stage.end)  # counters start as zeros (a sparse file)
        head = bytearray(ff.DATA_OFFSET)
        head[0 : ff.FIXED_SIZE] = ff.pack_fixed(header)
        ff.pack_state(
            head, ff.State(layout=1, applied_seq=applied_seq, mem_seqnum=1, disk_seqnum=1, flags=0)
        )
        ff.pack_entry(head, 0, stage)
        os.pwrite(fd, head, 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def fsync_dir(path: str) -> None:
    """Make a rename or link of ``path`` durable: fsync its directory."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_existing(path: str) -> int | None:
    """A read-write descriptor of the file at ``path``, or None if there is none."""
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def generation_of(fd: int | None) -> int:
    """The generation in the header of ``fd``'s file; 0 if there is none or it is bad."""
    if fd is None:
        return 0
    head = os.pread(fd, ff.FIXED_SIZE, 0)
    try:
        return ff.read_fixed(head, ff.DATA_OFFSET, "").generation
    except FilterFileError:
        return 0


def mark_superseded(fd: int) -> None:
    """Set the superseded bit in a replaced file that readers may still map, and
    close ``fd``.

    Written through the file (pwrite), not a mapping: the page cache is shared,
    so readers' mappings see it at once. Skipped for a file that is not ours."""
    try:
        head = bytearray(os.pread(fd, ff.TABLE_OFFSET, 0))
        if len(head) == ff.TABLE_OFFSET and head[0:8] == ff.MAGIC:
            state = ff.read_state(head, "")
            state.layout |= ff.SUPERSEDED
            ff.pack_state(head, state)
            os.pwrite(fd, bytes(head[ff.STATE_OFFSET : ff.TABLE_OFFSET]), ff.STATE_OFFSET)
    except FilterFileError:
        # A corrupt state block: nobody can have opened the file since it broke,
        # but someone who mapped it before may still check the layout word.
        os.pwrite(fd, struct.pack("<Q", ff.SUPERSEDED | 1), ff.STATE_OFFSET)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
