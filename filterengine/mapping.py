"""One consistent memory mapping of a filter file (its header, state, stage table
and the counters' views the lookups need), validated when it is made and swapped as
a whole when the file gains a stage or is replaced."""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from typing import NamedTuple

import numpy as np

from . import fileformat as ff
from .errors import FilterFileError
from .stage import Probe, Stage

__all__ = ["FileIdentity", "FileView"]

#: A file truncated under a mapping kills the process (SIGBUS) at the first touch of a
#: missing page, and Python cannot catch that signal. So every lookup first asks the
#: file's size with one ``lseek`` (cheaper than a 1-byte ``pread`` or an ``fstat``:
#: bench/faults.py) and compares it with the last byte the mapped stages need: an
#: operator's ``cp``, ``truncate`` or ``: >`` is then noticed before any page is
#: touched. What remains is the window between that check and the lookup's page
#: touches (a few microseconds). The same
#: check compares the generation and the state slots' write counters in place, so
#: an older copy of the file copied over it is refused rather than answered from.
_NOT_IN_PLACE = (
    "restore a filter file with `restore_filter`, or replace it with build(); "
    "never copy over it in place"
)
_STATE_RETRIES = 20  # a reader may catch the writer between two stores
_NATIVE_Q = struct.Struct("=Q")
_lseek = os.lseek
_SEEK_END = os.SEEK_END
#: Stands in for a header where there is no file (a closed filter).
_NO_HEADER = ff.Header(seed=0, capacity=1, error_rate=0.5, growth=2.0, tightening=0.5, generation=0)


class FileIdentity(NamedTuple):
    """Which file a filter maps: ``os.stat``'s device and inode of it (compare them
    with ``os.stat(path)`` to learn whether the path still names it) and the
    generation in its header (new for every file ``build`` writes)."""

    dev: int
    ino: int
    generation: int


class FileView:
    """A mapping of one file. Old views stay valid after a swap (files only grow,
    and a replaced file stays mapped), so a thread that is mid-answer keeps using
    the view it started with.

    ``FileView()`` is the placeholder of a closed filter: its size check is always
    due and its layout never matches its word, so every lookup goes to the slow
    path, which refuses. ``FileView.map`` makes a real one."""

    __slots__ = (
        "array",
        "buf",
        "dev",
        "generation",
        "mapped_generation",
        "seen_seq",
        "slot_seqs",
        "fd",
        "header",
        "ino",
        "layout",
        "limit",
        "mm",
        "probes",
        "seed",
        "stages",
        "state",
        "torn_slot",
        "word",
        "__weakref__",
    )

    def __init__(self) -> None:
        self.fd = -1
        self.mm: mmap.mmap | None = None
        self.dev = self.ino = 0
        #: Bytes the stages below need: a file shorter than this was truncated.
        self.limit = 0
        #: The header's generation and the state slots' write counters, read in place
        #: (native order) before each answer: a writer never changes the first and
        #: only moves the second forward, so either going elsewhere means another
        #: file was copied over this one in place.
        self.generation = memoryview(bytes(8)).cast("Q")
        self.slot_seqs = (self.generation, self.generation)
        self.mapped_generation = 0
        self.seen_seq = (0, 0)
        self.buf = memoryview(b"")
        #: The layout word in native byte order: only ever compared with ``layout``.
        self.word = memoryview(bytes(8)).cast("Q")
        self.layout = -1
        self.header = _NO_HEADER
        self.seed = 0
        #: The newest valid state slot when the file was mapped.
        self.state = ff.State(stage_count=0, applied_seq=0, mem_seqnum=0, disk_seqnum=0, flags=0)
        #: Whether one of the two state slots failed its checksum then.
        self.torn_slot = False
        self.stages: list[Stage] = []
        self.array: np.ndarray = np.zeros(0, dtype=np.uint8)
        #: Per stage, newest first (it is the biggest and holds the most recent keys).
        self.probes: tuple[Probe, ...] = ()

    @property
    def closed(self) -> bool:
        return self.mm is None

    @property
    def identity(self) -> FileIdentity:
        return FileIdentity(self.dev, self.ino, self.header.generation)

    @classmethod
    def map(cls, fd: int, writable: bool, path: str) -> FileView:
        """Map ``fd`` and validate it. The view owns ``fd`` from here on: it is
        closed on failure and by release()."""
        view = cls()
        view.fd = fd
        try:
            view._load(writable, path)
        except BaseException:
            view.release()
            raise
        return view

    def _load(self, writable: bool, path: str) -> None:
        fd = self.fd
        size = os.fstat(fd).st_size
        if size < ff.DATA_OFFSET:
            # Validate before mapping: mmap of an empty file would fail obscurely.
            raise FilterFileError(
                f"{path}: file size: expected at least {ff.DATA_OFFSET} bytes, found "
                f"{size} bytes (the file is truncated or not a filter file)"
            )
        for attempt in range(_STATE_RETRIES):
            # The word before the slots: a writer publishes a stage in a slot and
            # then in the word, so a word read first never counts a stage that the
            # slot read next does not (a view must never settle on a layout that
            # hides a stage). The size last: the writer reserves a stage's space
            # before it counts the stage anywhere.
            word_bytes = os.pread(fd, 8, ff.LAYOUT_OFFSET)
            head = os.pread(fd, ff.TABLE_OFFSET, 0)
            stat = os.fstat(fd)
            header = ff.read_fixed(head, stat.st_size, path)
            first, second = ff.read_states(head)
            try:
                state = ff.read_state(head, path)
                ff.check_layout_word(int.from_bytes(word_bytes, "little"), state, path)
                break
            except FilterFileError:
                # Caught between the writer's stores (two state writes while we
                # read); a corrupt state stays corrupt through every retry.
                if attempt == _STATE_RETRIES - 1:
                    raise
                time.sleep(0.0005)
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        mm = self.mm = mmap.mmap(fd, stat.st_size, access=access)
        self.dev, self.ino = stat.st_dev, stat.st_ino
        self.buf = memoryview(mm)
        self.header = header
        self.seed = header.seed
        self.word = self.buf[ff.LAYOUT_OFFSET : ff.LAYOUT_OFFSET + 8].cast("Q")
        self.generation = self.buf[ff.GENERATION_OFFSET : ff.GENERATION_OFFSET + 8].cast("Q")
        at0, at1 = ff.SLOT_OFFSETS
        self.slot_seqs = (self.buf[at0 : at0 + 8].cast("Q"), self.buf[at1 : at1 + 8].cast("Q"))
        self.mapped_generation = self.generation[0]
        # Per slot (a writer alternates them, each only ever moves forward); a slot
        # that failed its checksum counts from 0 until the writer rewrites it.
        self.seen_seq = (first.seq if first else 0, second.seq if second else 0)
        self.state = state
        self.torn_slot = first is None or second is None
        self.layout = _NATIVE_Q.unpack(word_bytes)[0]
        entries = ff.read_entries(self.buf, state.stage_count, header, stat.st_size, path)
        self.stages = [Stage(index, entry) for index, entry in enumerate(entries)]
        self.limit = self.stages[-1].end
        self.array = np.frombuffer(mm, dtype=np.uint8)
        self.probes = tuple(stage.probe(self.buf) for stage in reversed(self.stages))

    def successor(self, path: str, writable: bool) -> FileView:
        """A new view of what readers must answer from now that the layout word
        moved: the file that replaced this one at ``path`` (superseded bit), or
        this file with its new stages. FilterFileError if another file was copied
        over this one in place (only a rebuild gives a new generation, and never
        in place)."""
        if self.word[0] & ff.SUPERSEDED:
            return FileView.map(os.open(path, os.O_RDONLY | os.O_CLOEXEC), False, path)
        fresh = FileView.map(os.dup(self.fd), writable, path)
        if fresh.header.generation != self.header.generation:
            fresh.release()
            raise FilterFileError(
                f"{path}: generation: expected {self.header.generation}, found "
                f"{fresh.header.generation}: another filter file was copied over "
                "this one in place; open it again (and bring it up to date: "
                "`restore_filter` is the supported way to restore a backup)"
            )
        return fresh

    def add_stage(self, stage: Stage) -> None:
        """Count a stage the writer has just appended (its space reserved, its
        entry written) in this fresh view of the grown file."""
        self.stages = [*self.stages, stage]
        self.limit = stage.end
        self.probes = (stage.probe(self.buf), *self.probes)
        self.layout = self.word[0]

    def current_state(self, path: str) -> ff.State:
        """The newest valid state slot now (retried like the one read at mapping)."""
        for attempt in range(_STATE_RETRIES):
            try:
                return ff.read_state(self.buf, path)
            except FilterFileError:
                if attempt == _STATE_RETRIES - 1:
                    raise
                time.sleep(0.0005)
        raise AssertionError("not reached")

    def check_file(self, path: str) -> None:
        """Before a lookup touches the mapping: FilterFileError if the file is now
        shorter than the stages mapped here (truncated under us: touching a missing
        page would kill the process), or holds another file's contents (copied over
        in place: another generation, or state slots older than already seen).

        The per-lookup part of every answer, so it is spelled for speed: the size
        by lseek (a syscall that reads no page: about half a 1-byte pread and a
        third of an fstat, bench/faults.py; within 1.2-1.6x of a syscall that
        does nothing, ``os.getpid``, bench/layouts.py, so no other kind of check
        is cheaper), a closed view found by the EBADF of its fd -1 rather than a
        test per call, and the slots' common case (unchanged) decided by two
        equalities; anything else goes to _slots_moved."""
        try:
            size = _lseek(self.fd, 0, _SEEK_END)
        except OSError:
            if self.fd < 0:
                raise ValueError(f"{path}: the filter is closed") from None
            raise
        if size < self.limit:
            raise FilterFileError(
                f"{path}: file size: expected at least {self.limit} bytes (the stages "
                f"this process maps), found {size} bytes: the file was truncated or "
                f"overwritten while mapped ({_NOT_IN_PLACE})"
            )
        # What was seen before what is read now: another thread may store newer
        # values meanwhile, never ones newer than the file held when we read.
        seen_first, seen_second = self.seen_seq
        first, second = self.slot_seqs
        if (
            first[0] != seen_first
            or second[0] != seen_second
            or self.generation[0] != self.mapped_generation
        ):
            self._slots_moved(path)

    def _slots_moved(self, path: str) -> None:
        """check_file's rare case: a writer moved a state slot on (remember it), or
        another file was copied over this one (FilterFileError)."""
        seen = self.seen_seq
        first, second = self.slot_seqs
        now_first, now_second = first[0], second[0]
        if (
            self.generation[0] != self.mapped_generation
            or now_first < seen[0]
            or now_second < seen[1]
        ):
            raise FilterFileError(
                f"{path}: another filter file was copied over this one in place while "
                f"it was mapped (generation or state went back); open it again "
                f"({_NOT_IN_PLACE})"
            )
        self.seen_seq = (now_first, now_second)

    def release(self) -> None:
        """Unmap and close the file (idempotent)."""
        # Every view into the mapping must go before mm.close(), which
        # refuses (BufferError) while one is exported.
        for first, regions, _ in self.probes:
            for region in (first, *regions):
                region.release()
        self.probes = ()
        for view in (self.word, self.generation, *self.slot_seqs, self.buf):
            with contextlib.suppress(BufferError, ValueError):
                view.release()
        self.array = np.zeros(0, dtype=np.uint8)
        if self.mm is not None:
            with contextlib.suppress(BufferError, ValueError):
                self.mm.close()
            self.mm = None
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # A remapped-away view is dropped, not released, because another thread
        # may still be answering from it; the last reference closes it here.
        with contextlib.suppress(Exception):
            self.release()
