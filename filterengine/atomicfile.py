"""Writing a filter file aside and moving it into place: a new file is complete and
fsynced before ``os.replace`` (or ``os.link``) puts it at the path, so no process
ever maps a half-written file; the file it replaces is marked superseded so that
readers still mapping it reopen the path."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import stat
import struct
import tempfile

from . import fileformat as ff
from .errors import FilterFileError
from .space import reserve

__all__ = [
    "copy_aside",
    "fsync_dir",
    "generation_of",
    "mark_superseded",
    "open_existing",
    "remove_stale_temps",
    "set_generation",
    "write_empty",
]

_WORD = struct.Struct("<Q")


def _temp_name(path: str) -> tuple[str, str]:
    """(prefix, suffix) of the temp files written beside ``path``."""
    return f".{os.path.basename(path)}.", ".tmp"


def write_empty(path: str, header: ff.Header, *, applied_seq: int) -> str:
    """Write a complete one-stage file beside ``path``; return its temp path.

    The whole file is reserved first (FilterSpaceError, and no temp file left,
    if it does not fit): its counters are written through a mapping later."""
    prefix, suffix = _temp_name(path)
    directory = os.path.dirname(os.path.abspath(path))
    # mkstemp creates the file 0600: os.replace and os.link keep that mode.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    try:
        stage = ff.stage_plan(header, 0, ff.DATA_OFFSET)
        reserve(fd, 0, stage.end, path, "new filter file (written beside it)")
        head = bytearray(ff.DATA_OFFSET)
        head[0 : ff.FIXED_SIZE] = ff.pack_fixed(header)
        ff.init_state(
            head,
            ff.State(stage_count=1, applied_seq=applied_seq, mem_seqnum=1, disk_seqnum=1, flags=0),
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


def copy_aside(path: str, source: str) -> str:
    """Copy the file ``source`` beside ``path`` (a temp file that remove_stale_temps
    knows), fsynced; return its temp path. The room is reserved first
    (FilterSpaceError, and no temp file left, if it does not fit)."""
    prefix, suffix = _temp_name(path)
    directory = os.path.dirname(os.path.abspath(path))
    with open(source, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
        try:
            reserve(fd, 0, size, path, f"copy of {source} (written beside it)")
            with open(fd, "wb", closefd=False) as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
    os.close(fd)
    return tmp


def set_generation(fd: int, generation: int, path: str) -> None:
    """Give the (valid) file ``fd`` a new generation: a copy put in place is a new
    file to the readers that compare generations."""
    header = ff.read_fixed(os.pread(fd, ff.FIXED_SIZE, 0), os.fstat(fd).st_size, path)
    os.pwrite(fd, ff.pack_fixed(dataclasses.replace(header, generation=generation)), 0)


def remove_stale_temps(path: str) -> list[str]:
    """Remove the temp files that writes of ``path`` left behind (a build or
    create killed before it could clean up); return their paths. Call it only
    under the writer lock, when no write of ``path`` is under way."""
    prefix, suffix = _temp_name(path)
    # mkstemp's names: the prefix, 8 characters of [a-z0-9_], the suffix.
    pattern = re.compile(re.escape(prefix) + r"[a-z0-9_]{8}" + re.escape(suffix) + r"\Z")
    directory = os.path.dirname(os.path.abspath(path))
    removed = []
    for name in os.listdir(directory):
        if pattern.match(name):
            stale = os.path.join(directory, name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
                removed.append(stale)
    return removed


def fsync_dir(path: str) -> None:
    """Make a rename or link of ``path`` durable: fsync its directory."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_existing(path: str) -> int | None:
    """A read-write descriptor of the regular file at ``path``, or None if there is
    none (or the path is a symbolic link or something other than a file, which a
    build replaces without writing into)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


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
    """Set the superseded bit in the layout word of a replaced file that readers may
    still map, and close ``fd``.

    Any file long enough to have been mapped is marked, whether or not it still
    parses (a corrupt magic or state, another version): a reader that mapped it
    while it was valid checks only that word. Written through the file (pwrite),
    not a mapping: the page cache is shared, so readers' mappings see it at once."""
    try:
        if os.fstat(fd).st_size >= ff.DATA_OFFSET:
            (word,) = _WORD.unpack(os.pread(fd, 8, ff.LAYOUT_OFFSET))
            if not word & ff.SUPERSEDED:
                os.pwrite(fd, _WORD.pack(word | ff.SUPERSEDED), ff.LAYOUT_OFFSET)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
