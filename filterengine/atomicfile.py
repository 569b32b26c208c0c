"""Writing a filter file aside and moving it into place: a new file is complete and
fsynced before ``os.replace`` (or ``os.link``) puts it at the path, so no process
ever maps a half-written file; the file it replaces is marked superseded so that
readers still mapping it reopen the path.

The same for any file written whole (replacing, write_aside): its temp file has the
name remove_stale_temps knows, so one left by a writer killed before it could clean
up (SIGKILL, a crash, power loss) is found and removed later."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import stat
import struct
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO

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
    "remove_stale_temps_in",
    "replacing",
    "set_generation",
    "write_aside",
    "write_empty",
]

_WORD = struct.Struct("<Q")


#: The names mkstemp gives with _temp_name's prefix and suffix: ".", the name of the
#: file written, ".", 8 characters of [a-z0-9_], ".tmp".
_ANY_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp\Z", re.DOTALL)


def _temp_name(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(prefix, suffix) of the temp files written beside ``path``."""
    return f".{os.path.basename(path)}.", ".tmp"


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A file to write ``path``'s new content to: a temp file beside it, fsynced and
    renamed to ``path`` when the block ends, removed if it raises. Readers see the old
    file or the whole new one, never half of it."""
    prefix, suffix = _temp_name(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    try:
        with open(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path)


def write_aside(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` as the new content of ``path`` (see replacing)."""
    with replacing(path) as out:
        for chunk in chunks:
            out.write(chunk)


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


def remove_stale_temps(
    path: str | os.PathLike[str], *, older_than: float | None = None
) -> list[str]:
    """Remove the temp files that writes of ``path`` left behind (a build or
    create killed before it could clean up); return their paths. Without
    ``older_than`` call it only under the writer lock, when no write of ``path`` is
    under way; with it, only temp files not written to for ``older_than`` seconds
    are removed (a live writer's keeps a recent mtime)."""
    prefix, suffix = _temp_name(path)
    # mkstemp's names: the prefix, 8 characters of [a-z0-9_], the suffix.
    pattern = re.compile(re.escape(prefix) + r"[a-z0-9_]{8}" + re.escape(suffix) + r"\Z")
    return _remove_matching(os.path.dirname(os.path.abspath(path)), pattern, older_than)


def remove_stale_temps_in(
    directory: str | os.PathLike[str], *, older_than: float | None = None
) -> list[str]:
    """Remove the temp files that writes of any file in ``directory`` left behind
    (as remove_stale_temps, for a directory whose files this module writes)."""
    return _remove_matching(os.fspath(directory), _ANY_TEMP, older_than)


def _remove_matching(
    directory: str, pattern: re.Pattern[str], older_than: float | None
) -> list[str]:
    cutoff = None if older_than is None else time.time() - older_than
    removed = []
    for name in os.listdir(directory):
        if not pattern.match(name):
            continue
        stale = os.path.join(directory, name)
        try:
            if cutoff is not None and os.lstat(stale).st_mtime > cutoff:
                continue
            os.unlink(stale)
        except FileNotFoundError:
            continue
        removed.append(stale)
    return removed


def fsync_dir(path: str | os.PathLike[str]) -> None:
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
