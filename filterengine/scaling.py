"""ScalingCountingBloomFilter: bitly's dablooms structure on a memory-mapped file.

A sequence of counting Bloom filter stages (packed 4-bit counters) in one file
(layout: fileformat.py). Only the newest stage takes additions; when its count
reaches its capacity a new stage is appended with ``growth`` times the capacity
and ``tightening`` times the error rate, so the error rates of all stages sum to
at most ``error_rate`` (Almeida et al.). Each stage records the smallest and
largest id it took; a removal goes to a stage whose recorded id range holds its
id and which holds the key. Unlike dablooms, ids that repeat or go backwards
never stop the filter from scaling: fullness is a count, not an id.

One writer per file (locking.py), any number of read-only openers in other
processes. They share the page cache through ``MAP_SHARED`` (mapping.py), so
readers see additions without reopening; before each answer a reader reads the
last byte its stages need (one ``pread``: a file truncated or copied over in
place is refused before a page is touched, not a SIGBUS) and compares one header
word (stage count + superseded bit) with the value it mapped, and remaps when a
stage was added or the file was replaced by ``build`` (atomicfile.py).

Crash safety follows dablooms: ``mem_seqnum`` is 0 while a change is being
applied and a fresh non-zero number after it; ``flush()`` msyncs the counters
and then records ``disk_seqnum = mem_seqnum``. A file is clean when no change
was interrupted and everything was flushed; a writer that opens an unclean
file marks it dirty for good, so only a rebuild makes it clean again.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

import numpy as np

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
from .counters import (
    MAX_COUNT,
    saturated_counters,
    slice_nonzero,
    stage_add,
    stage_add_many,
    stage_contains_many,
    stage_counters,
    stage_remove_apply,
    stage_remove_check,
)
from .errors import FilterFileError, removal_refused
from .hashing import (
    HASH_SEED,
    _hash_tuple,  # the scalar hot path calls mmh3 directly
    hash_pair,
    hash_pairs,
)
from .ids import checked_id, id_array
from .locking import acquire_writer_lock, release_writer_lock
from .mapping import FileIdentity, FileView, stage_probe
from .space import require_free, reserve

__all__ = ["ScalingCountingBloomFilter", "DEFAULT_GROWTH", "DEFAULT_TIGHTENING"]

#: Chosen by the mean bytes per key over sizes, not at one size: bench/engine.py
#: prints the comparison (``sizing``) and its docstring says how it came out.
DEFAULT_GROWTH = 1.4
DEFAULT_TIGHTENING = 0.8

_BUILD_CHUNK = 65_536
#: Only what the filter itself may pass to its constructor.
_PRIVATE = object()
#: A closed filter's view: every lookup takes the slow path, which refuses.
_CLOSED = FileView()


def _is_clean(state: ff.State) -> bool:
    return (
        not state.flags & ff.FLAG_TORN
        and state.mem_seqnum != 0
        and state.disk_seqnum == state.mem_seqnum
    )


def _probe(view: FileView, key: str | bytes) -> bool:
    """The scalar lookup in one checked view (contains, maybe_present)."""
    # hash_pair inlined: this is the per-redirect hot path.
    if type(key) is str:
        key = key.encode()
    elif type(key) is not bytes:
        hash_pair(key)  # raises the TypeError naming the type
    h1, h2 = _hash_tuple(key, view.seed)
    # COUNTER_SCHEME positions (counters.py), one pair of slices per
    # region. The first pair is unrolled: most absent keys leave a stage
    # at its first probe, before h2 is even reduced. Measured (bench/
    # engine.py): a pair per loop turn with plain `% cells` beats a
    # (start, mask) tuple per slice; lazy map()/itemgetter pipelines and
    # generated per-stage functions were slower (method-wrapper and
    # function calls cost more than the bytecode they save).
    for first, regions, cells in view.probes:
        x = h1 % cells
        if not first[x] & 0x0F:
            continue
        step = h2 % cells
        x = (x + step) % cells
        if not first[x] & 0xF0:
            continue
        for region in regions:
            x = (x + step) % cells
            if not region[x] & 0x0F:
                break
            x = (x + step) % cells
            if not region[x] & 0xF0:
                break
        else:
            return True
    return False


class ScalingCountingBloomFilter:
    """A scaling counting Bloom filter in a memory-mapped file (see the module doc).

    Open with ``create``, ``open`` or write one with ``build``; all keys are str
    (UTF-8) or bytes, all ids signed 64-bit ints (e.g. microsecond timestamps).
    Not thread-safe for writing; reading from many threads is safe."""

    __slots__ = (
        "_depth",
        "_header",
        "_lock_fd",
        "_modified",
        "_remap_lock",
        "_seq",
        "_st",
        "_view",
        "path",
        "readonly",
    )

    # -- opening ------------------------------------------------------------
    def __init__(
        self,
        path: str,
        fd: int,
        *,
        readonly: bool,
        lock_fd: int | None,
        _token: object = None,
    ) -> None:
        """Private: map ``fd`` (owned from here on) as the file at ``path``."""
        if _token is not _PRIVATE:
            raise TypeError("use ScalingCountingBloomFilter.create(), .open() or .build()")
        self.path = path
        self.readonly = readonly
        self._lock_fd = lock_fd
        self._remap_lock = threading.Lock()
        self._depth = 0
        self._modified = False
        self._view = FileView.map(fd, not readonly, path)
        self._header = self._view.header
        # The writer keeps the state block in memory (it is its only writer) and
        # writes it through, instead of decoding it per change.
        self._st = self._view.state
        self._seq = 0
        if not readonly:
            self._take_over()

    def _take_over(self) -> None:
        """A writer's first look at the file it mapped: keep an interrupted file
        dirty, and publish the layout word the state slots count."""
        view = self._view
        state = self._st = view.state
        self._seq = max(state.mem_seqnum, state.disk_seqnum)
        if view.torn_slot or state.mem_seqnum == 0 or state.mem_seqnum != state.disk_seqnum:
            # The last writer died mid-change, before flushing or mid state write
            # (or the state rotted): its counters may be torn. Keep the file dirty
            # until it is rebuilt, however cleanly this writer finishes.
            state.flags |= ff.FLAG_TORN
            if state.mem_seqnum == 0:
                state.mem_seqnum = self._seq = self._seq + 1
            # The next seq's slot is the other one: a broken slot is rewritten here.
            ff.write_state(view.buf, state)
        word = ff.layout_word(view.buf)
        if word & ~ff.SUPERSEDED != state.stage_count:
            # Killed between publishing a stage in its slot and in the word.
            ff.write_layout_word(view.buf, (word & ff.SUPERSEDED) | state.stage_count)
            view.layout = view.word[0]

    @classmethod
    def _attach(
        cls, path: str, fd: int, *, readonly: bool, lock_fd: int | None
    ) -> ScalingCountingBloomFilter:
        return cls(path, fd, readonly=readonly, lock_fd=lock_fd, _token=_PRIVATE)

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        capacity: int,
        error_rate: float,
        *,
        growth: float = DEFAULT_GROWTH,
        tightening: float = DEFAULT_TIGHTENING,
        seed: int = HASH_SEED,
    ) -> ScalingCountingBloomFilter:
        """Create a new, empty filter file at ``path`` and open it for writing.

        Raises FileExistsError if ``path`` exists (use ``build`` to replace a
        file atomically: overwriting one that readers map would crash them)."""
        path = os.fspath(path)
        ff.check_parameters(capacity, error_rate, growth, tightening)
        if os.path.exists(path):
            raise FileExistsError(f"{path}: already exists; open() it, or build() a replacement")
        lock_fd = acquire_writer_lock(path, 0.0)
        try:
            remove_stale_temps(path)
            header = ff.Header(
                seed=seed,
                capacity=capacity,
                error_rate=float(error_rate),
                growth=float(growth),
                tightening=float(tightening),
                generation=time.time_ns() // 1000,
            )
            tmp = write_empty(path, header, applied_seq=0)
            try:
                # link() refuses to replace: a file created meanwhile is kept.
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
            fsync_dir(path)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            return cls._attach(path, fd, readonly=False, lock_fd=lock_fd)
        except BaseException:
            release_writer_lock(lock_fd)
            raise

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        readonly: bool = False,
        *,
        capacity: int | None = None,
        error_rate: float | None = None,
        lock_timeout: float = 0.0,
    ) -> ScalingCountingBloomFilter:
        """Map an existing filter file: O(1), parameters come from its header.

        A writer (``readonly=False``) takes the file's lock, waiting at most
        ``lock_timeout`` seconds, else FilterLockedError. ``capacity`` and
        ``error_rate``, if given, must match the file's (FilterFileError)."""
        path = os.fspath(path)
        lock_fd = None if readonly else acquire_writer_lock(path, lock_timeout)
        try:
            fd = os.open(path, (os.O_RDONLY if readonly else os.O_RDWR) | os.O_CLOEXEC)
            self = cls._attach(path, fd, readonly=readonly, lock_fd=lock_fd)
        except BaseException:
            release_writer_lock(lock_fd)
            raise
        for name, wanted in (("capacity", capacity), ("error_rate", error_rate)):
            found = getattr(self._header, name)
            if wanted is not None and wanted != found:
                self.close()
                raise FilterFileError(
                    f"{path}: {name}: expected {wanted}, found {found} "
                    "(the file was made with other parameters)"
                )
        return self

    @classmethod
    def build(
        cls,
        path: str | os.PathLike[str],
        pairs: Iterable[tuple[str | bytes, int]],
        *,
        capacity: int,
        error_rate: float,
        applied_seq: int = 0,
        growth: float = DEFAULT_GROWTH,
        tightening: float = DEFAULT_TIGHTENING,
        seed: int = HASH_SEED,
        writer: ScalingCountingBloomFilter | None = None,
        lock_timeout: float = 30.0,
    ) -> int:
        """Write a complete new file from (key, id) pairs and atomically replace ``path``.

        The new file is written aside in the same directory, fsynced, moved over
        ``path`` with ``os.replace`` and the directory fsynced; then the old
        file is marked superseded so that readers mapping it reopen ``path``
        before their next answer. Safe while other processes read the old file.
        Holds the writer lock throughout: pass ``writer`` (this process's open
        writer of ``path``, which then follows the new file) or the lock is
        taken, waiting at most ``lock_timeout`` seconds. Returns the new
        file's generation."""
        path = os.fspath(path)
        ff.check_parameters(capacity, error_rate, growth, tightening)
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
            generation = max(time.time_ns() // 1000, generation_of(old_fd) + 1)
            header = ff.Header(
                seed=seed,
                capacity=capacity,
                error_rate=float(error_rate),
                growth=float(growth),
                tightening=float(tightening),
                generation=generation,
            )
            keys = len(pairs) if isinstance(pairs, Sized) else 0
            require_free(path, ff.file_size(header, keys), "rebuild (a new file beside it)")
            tmp = write_empty(path, header, applied_seq=applied_seq)
            fresh = cls._attach(
                tmp, os.open(tmp, os.O_RDWR | os.O_CLOEXEC), readonly=False, lock_fd=None
            )
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
                fresh.flush()
                os.fsync(fresh._view.fd)
            finally:
                fresh._close_mapping()
            os.replace(tmp, path)
            tmp = None
            fsync_dir(path)
            if old_fd is not None:
                mark_superseded(old_fd)
                old_fd = None
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

    def remove_stale_temps(self) -> list[str]:
        """Remove the temp files that killed builds of this path left beside it
        (each as large as a file: the room the next stage or rebuild needs); return
        their paths. A writer's method: under its lock no build of the path runs."""
        self._writable()
        return remove_stale_temps(self.path)

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        source: str | os.PathLike[str],
        *,
        catch_up: Callable[[ScalingCountingBloomFilter], None] | None = None,
        lock_timeout: float = 30.0,
    ) -> int:
        """Put a copy of the filter file ``source`` (a backup) at ``path``, atomically.

        The copy is written beside ``path`` and validated (FilterFileError for a
        file that does not parse or is not clean: a copy taken while a writer was
        mid-change; rebuild instead); ``catch_up(writer)``, if given, then brings
        the copy up to date (e.g. replays a change log after its applied_seq)
        before it is flushed, fsynced, given a new generation and moved over
        ``path`` as ``build`` does: readers of the old file follow it. Never
        writes into ``source`` or into the file at ``path``. Holds the writer lock
        throughout (waiting at most ``lock_timeout`` s). Returns the generation."""
        path, source = os.fspath(path), os.fspath(source)
        lock_fd = acquire_writer_lock(path, lock_timeout)
        tmp = None
        old_fd = None
        try:
            remove_stale_temps(path)
            tmp = copy_aside(path, source)
            copy = cls._attach(
                tmp, os.open(tmp, os.O_RDONLY | os.O_CLOEXEC), readonly=True, lock_fd=None
            )
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
            generation = max(time.time_ns() // 1000, generation_of(old_fd) + 1)
            set_generation(fd, generation, source)
            fresh = cls._attach(tmp, fd, readonly=False, lock_fd=None)
            fresh.path = path  # error messages name the file the caller asked for
            try:
                if catch_up is not None:
                    catch_up(fresh)
                fresh.flush()
                os.fsync(fresh._view.fd)
            finally:
                fresh._close_mapping()
            os.replace(tmp, path)
            tmp = None
            fsync_dir(path)
            if old_fd is not None:
                mark_superseded(old_fd)
                old_fd = None
            return generation
        finally:
            if old_fd is not None:
                os.close(old_fd)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            release_writer_lock(lock_fd)

    # -- the mapping ----------------------------------------------------------
    def _refresh(self) -> FileView:
        """Remap after a new stage or a replacement; returns the current view."""
        with self._remap_lock:
            view = self._view
            if view.closed:
                raise ValueError(f"{self.path}: the filter is closed")
            current = view.word[0]
            if current == view.layout:
                return view  # another thread remapped already
            if current & ff.SUPERSEDED:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                fresh = FileView.map(fd, False, self.path)
            else:
                fresh = FileView.map(os.dup(view.fd), not self.readonly, self.path)
                if fresh.header.generation != view.header.generation:
                    # Only build() gives a file a new generation, and never in
                    # place: another file was copied over this one.
                    fresh.release()
                    raise FilterFileError(
                        f"{self.path}: generation: expected {view.header.generation}, found "
                        f"{fresh.header.generation}: another filter file was copied over "
                        "this one in place; open it again (and bring it up to date: "
                        "`restore_filter` is the supported way to restore a backup)"
                    )
            self._view = fresh
            self._header = fresh.header
            # The old view is dropped, not closed: another thread may be
            # answering from it; it is unmapped when the last reference goes.
            return fresh

    def _follow_replacement(self) -> None:
        """Writer side of build(writer=self): map the new file at our path."""
        old = self._view
        self._view = FileView.map(os.open(self.path, os.O_RDWR | os.O_CLOEXEC), True, self.path)
        self._header = self._view.header
        self._take_over()
        old.release()

    def _writable(self) -> FileView:
        if self.readonly:
            raise PermissionError(
                f"{self.path}: opened read-only; open it with readonly=False to change it"
            )
        view = self._view
        if view.closed:
            raise ValueError(f"{self.path}: the filter is closed")
        view.check_file(self.path)  # a writer dies of a truncated file as a reader does
        return view

    def _dynamic(self, index: int) -> tuple[int, int, int]:
        return ff.DYNAMIC.unpack_from(self._view.buf, ff.entry_offset(index) + ff.DYNAMIC_OFFSET)

    def _set_dynamic(self, index: int, count: int, first: int, last: int) -> None:
        ff.DYNAMIC.pack_into(
            self._view.buf, ff.entry_offset(index) + ff.DYNAMIC_OFFSET, count, first, last
        )

    def _add_stage(self) -> FileView:
        """Append a stage (the newest is full): grow the file, then publish."""
        view = self._view
        index = len(view.stages)
        if index >= self._header.max_stages:
            raise FilterFileError(
                f"{self.path}: stage count: expected at most {self._header.max_stages}, "
                "found the table full; rebuild with a larger capacity"
            )
        entry = ff.stage_plan(self._header, index, ff.next_offset(view.stages[-1]))
        # Order matters for readers: the stage's space is reserved (so writing its
        # counters can never fault on a full disk) and its entry written before the
        # state slot and then the layout word count it. A FilterSpaceError here
        # leaves the file as it was.
        size = os.fstat(view.fd).st_size
        reserve(view.fd, size, entry.end - size, self.path, f"new stage {index}")
        fresh = FileView.map(os.dup(view.fd), True, self.path)
        ff.pack_entry(fresh.buf, index, entry)
        state = self._st
        state.stage_count = index + 1
        ff.write_state(fresh.buf, state)
        word = ff.layout_word(fresh.buf)
        ff.write_layout_word(fresh.buf, (word & ff.SUPERSEDED) | (index + 1))
        fresh.stages = [*fresh.stages, entry]
        fresh.limit = entry.end
        fresh.probes = (stage_probe(entry, fresh.buf), *fresh.probes)
        fresh.layout = fresh.word[0]
        self._view = fresh
        view.release()
        return fresh

    def _reserve_for(self, n: int) -> None:
        """Reserve the space of every stage that ``n`` more additions will open,
        before any counter moves: a full disk then refuses the whole batch with
        FilterSpaceError and the file stays as it was (and clean)."""
        view = self._view
        index = len(view.stages) - 1
        remaining = n - (view.stages[index].capacity - self._dynamic(index)[0])
        last = view.stages[-1]
        opened = 0
        while remaining > 0 and index + opened + 1 < self._header.max_stages:
            opened += 1
            last = ff.stage_plan(self._header, index + opened, ff.next_offset(last))
            remaining -= last.capacity
        if opened:
            size = os.fstat(view.fd).st_size
            what = f"{opened} new stage(s) for {n} additions"
            reserve(view.fd, size, last.end - size, self.path, what)

    def _newest_with_room(self) -> tuple[FileView, int, int]:
        """(view, index, room) of the stage that takes the next addition."""
        view = self._view
        index = len(view.stages) - 1
        count = self._dynamic(index)[0]
        room = view.stages[index].capacity - count
        if room <= 0:
            view = self._add_stage()
            index += 1
            room = view.stages[index].capacity
        return view, index, room

    # -- changes --------------------------------------------------------------
    @contextlib.contextmanager
    def change(self) -> Iterator[ScalingCountingBloomFilter]:
        """One multi-step change: ``mem_seqnum`` is 0 for its whole duration.

        ``with f.change(): f.add_many(...); f.remove_many(...); f.applied_seq = n``
        If the process dies inside, the file reopens with ``is_clean`` False.
        If an exception leaves the block after something was modified, the
        file is marked dirty for good (a partial change must not look applied
        after a flush); an exception before any modification leaves it clean."""
        self._begin()
        ok = False
        try:
            yield self
            ok = True
        finally:
            self._end(ok)

    def _begin(self) -> None:
        view = self._writable()
        if self._depth == 0:
            self._st.mem_seqnum = 0
            ff.write_state(view.buf, self._st)
            self._modified = False
        self._depth += 1

    def _end(self, ok: bool) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._seq += 1
            state = self._st
            state.mem_seqnum = self._seq
            if not ok and self._modified:
                state.flags |= ff.FLAG_TORN  # part of a change is in the counters
            self._view.check_file(self.path)
            ff.write_state(self._view.buf, state)

    @property
    def applied_seq(self) -> int:
        """High-water mark of the change log applied to this file (persisted)."""
        return self._live_view().current_state(self.path).applied_seq

    @applied_seq.setter
    def applied_seq(self, value: int) -> None:
        value = checked_id(value)
        if value < 0:
            raise ValueError(f"applied_seq must be >= 0, got {value}")
        with self.change():
            self._st.applied_seq = value  # written by the change's end
            self._modified = True

    def flush(self) -> None:
        """Make everything written so far durable: msync the counters, then
        record disk_seqnum = mem_seqnum (and msync the header). A reader's
        flush does nothing."""
        view = self._view
        mm = view.mm
        if self.readonly or mm is None:
            return
        view.check_file(self.path)
        mm.flush()
        state = self._st
        if state.mem_seqnum and state.disk_seqnum != state.mem_seqnum:
            state.disk_seqnum = state.mem_seqnum
            ff.write_state(view.buf, state)
            mm.flush(0, mmap.PAGESIZE)

    # -- single key -----------------------------------------------------------
    def add(self, key: str | bytes, id: int) -> None:
        """Add ``key`` with ``id`` (its timestamp) to the newest stage."""
        h1, h2 = hash_pair(key, self._header.seed)
        id = checked_id(id)
        # `with self.change()` spelled out (here and in remove): its generator-based
        # context manager adds ~2 µs to a ~9 µs add (measured).
        self._begin()
        ok = False
        try:
            view, index, _ = self._newest_with_room()
            stage = view.stages[index]
            stage_add(view.buf, stage.offset * 2, stage.k, stage.cells, h1, h2)
            count, first, last = self._dynamic(index)
            self._set_dynamic(index, count + 1, min(first, id), max(last, id))
            self._modified = ok = True
        finally:
            self._end(ok)

    def remove(self, key: str | bytes, id: int) -> None:
        """Remove ``key`` added with ``id``. KeyError, nothing changed, if no
        stage holds it (see _remove_hashed for which stage gives it up)."""
        h1, h2 = hash_pair(key, self._header.seed)
        id = checked_id(id)
        self._begin()  # refuses a read-only or closed filter
        ok = False
        try:
            if self._remove_hashed(h1, h2, id) is None:
                raise KeyError(f"{key!r} with id {id} is not in the filter; nothing was removed")
            self._modified = ok = True
        finally:
            self._end(ok)

    def _remove_hashed(self, h1: int, h2: int, id: int) -> tuple[int, list[int]] | None:
        """Take one occurrence of a hashed key out of a stage; None if none holds it.

        Stages whose recorded id range holds ``id`` come first, newest first.
        Only if none of them holds the key are the other stages tried: that
        happens when the same key was added more than once with different ids
        and an earlier removal took the occurrence filed under this id.
        Returns (stage index, counters decremented) so a batch can be undone."""
        view = self._view
        buf = view.buf
        ranged: list[int] = []
        others: list[int] = []
        for index in reversed(range(len(view.stages))):
            _, first, last = self._dynamic(index)
            (ranged if first <= id <= last else others).append(index)
        for index in ranged + others:
            stage = view.stages[index]
            counters = stage_counters(stage.offset * 2, stage.k, stage.cells, h1, h2)
            values = [(buf[c >> 1] >> ((c & 1) << 2)) & 15 for c in counters]
            if all(values):
                moved = [c for c, v in zip(counters, values, strict=True) if v != MAX_COUNT]
                for c in moved:
                    buf[c >> 1] -= 0x10 if c & 1 else 1
                count, first, last = self._dynamic(index)
                self._set_dynamic(index, count - 1, first, last)
                return index, moved
        return None

    def _undo_removals(self, done: list[tuple[int, list[int]]]) -> None:
        buf = self._view.buf
        for index, moved in reversed(done):
            for c in moved:
                buf[c >> 1] += 0x10 if c & 1 else 1
            count, first, last = self._dynamic(index)
            self._set_dynamic(index, count + 1, first, last)

    def contains(self, key: str | bytes) -> bool:
        """True if ``key`` may be present, False if it certainly is not."""
        view = self._view
        view.check_file(self.path)
        if view.word[0] != view.layout:
            view = self._refresh()
        return _probe(view, key)

    __contains__ = contains

    def maybe_present(self, keys: Iterable[str | bytes]) -> list[str | bytes]:
        """The keys that may be present, in order: ``contains`` for a handful of
        keys (one URL's expressions) with one check of the file for them all.
        For many keys ``contains_many`` is faster."""
        view = self._view
        view.check_file(self.path)
        if view.word[0] != view.layout:
            view = self._refresh()
        return [key for key in keys if _probe(view, key)]

    # -- batches --------------------------------------------------------------
    def contains_many(self, keys: Iterable[str | bytes]) -> np.ndarray:
        """One bool per key, in order (vectorised; each key hashed once)."""
        view = self._view
        view.check_file(self.path)
        if view.word[0] != view.layout:
            view = self._refresh()
        h1, h2 = hash_pairs(keys, view.seed)
        result = np.zeros(len(h1), dtype=bool)
        todo = None  # indices of keys not found yet; None = all
        for stage in reversed(view.stages):
            if todo is not None and not len(todo):
                break
            a1, a2 = (h1, h2) if todo is None else (h1[todo], h2[todo])
            hit = stage_contains_many(view.array, stage.offset * 2, stage.k, stage.cells, a1, a2)
            if todo is None:
                result |= hit
                todo = np.flatnonzero(~hit)
            else:
                result[todo[hit]] = True
                todo = todo[~hit]
        return result

    def add_many(self, keys: Iterable[str | bytes], ids: Iterable[int]) -> None:
        """Add every key with its id (one id per key), in order (vectorised)."""
        h1, h2 = hash_pairs(keys, self._header.seed)
        ids = id_array(ids, len(h1))
        self._writable()
        if not len(h1):
            return
        self._reserve_for(len(h1))
        with self.change():
            pos = 0
            while pos < len(h1):
                view, index, room = self._newest_with_room()
                end = min(len(h1), pos + room)
                stage = view.stages[index]
                stage_add_many(
                    view.array, stage.offset * 2, stage.k, stage.cells, h1[pos:end], h2[pos:end]
                )
                self._modified = True
                count, first, last = self._dynamic(index)
                part = ids[pos:end]
                self._set_dynamic(
                    index,
                    count + end - pos,
                    min(first, int(part.min())),
                    max(last, int(part.max())),
                )
                pos = end

    def remove_many(self, keys: Iterable[str | bytes], ids: Iterable[int]) -> None:
        """Remove every key added with its id, all or nothing.

        Stages are chosen as for ``remove``. KeyError naming the offending key,
        with nothing changed, if a key is not present or is removed more
        often than it was added."""
        keys = keys if isinstance(keys, list | tuple) else list(keys)
        h1, h2 = hash_pairs(keys, self._header.seed)
        ids = id_array(ids, len(h1))
        view = self._writable()
        if not len(h1):
            return
        owner = np.full(len(h1), -1, dtype=np.int64)
        for index in reversed(range(len(view.stages))):
            _, first, last = self._dynamic(index)
            todo = np.flatnonzero((owner < 0) & (ids >= first) & (ids <= last))
            if len(todo):
                stage = view.stages[index]
                hit = stage_contains_many(
                    view.array, stage.offset * 2, stage.k, stage.cells, h1[todo], h2[todo]
                )
                owner[todo[hit]] = index
        plans = self._removal_plans(view, owner, h1, h2)
        self._begin()
        ok = False
        try:
            if plans is not None:
                for index, plan, removed in plans:
                    stage_remove_apply(view.array, plan)
                    count, first, last = self._dynamic(index)
                    self._set_dynamic(index, count - removed, first, last)
            else:
                self._remove_one_by_one(keys, h1, h2, ids)
            self._modified = ok = True
        finally:
            self._end(ok)

    @staticmethod
    def _removal_plans(
        view: FileView, owner: np.ndarray, h1: np.ndarray, h2: np.ndarray
    ) -> list[tuple[int, list[tuple[np.ndarray, np.ndarray]], int]] | None:
        """remove_many's vectorised plan, (stage, counters, keys) per stage; None
        when some key has no owning stage or a stage holds it too few times."""
        if (owner < 0).any():
            return None
        plans = []
        for index in np.unique(owner).tolist():
            rows = np.flatnonzero(owner == index)
            stage = view.stages[index]
            plan, short = stage_remove_check(
                view.array, stage.offset * 2, stage.k, stage.cells, h1[rows], h2[rows]
            )
            if short.any():
                return None
            plans.append((index, plan, len(rows)))
        return plans

    def _remove_one_by_one(
        self, keys: Sequence[str | bytes], h1: np.ndarray, h2: np.ndarray, ids: np.ndarray
    ) -> None:
        """remove_many's exact path, when the vectorised plan cannot place every
        removal (a key with no stage by id range, or removed more often in the
        batch than one stage holds it): key by key, undone if one fails."""
        done: list[tuple[int, list[int]]] = []
        modified = self._modified
        for position, (a, b, id_) in enumerate(
            zip(h1.tolist(), h2.tolist(), ids.tolist(), strict=True)
        ):
            taken = self._remove_hashed(a, b, id_)
            if taken is None:
                self._undo_removals(done)
                self._modified = modified  # nothing of this batch is left
                raise removal_refused(
                    [keys[position]], "not present (or removed more often than added)"
                )
            done.append(taken)

    # -- state and measurements -----------------------------------------------
    def _live_view(self) -> FileView:
        view = self._view
        view.check_file(self.path)
        if view.word[0] != view.layout:
            view = self._refresh()
        return view

    @property
    def file_identity(self) -> FileIdentity:
        """(device, inode, generation) of the file the next answer comes from:
        compare (dev, ino) with ``os.stat(path)`` to learn whether the path still
        names it (a removed, moved-over or copied-over file is not followed)."""
        return self._live_view().identity

    def is_file_at_path(self) -> bool:
        """Whether ``path`` still names the file mapped here (one ``os.stat``)."""
        identity = self.file_identity
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (identity.dev, identity.ino)

    @property
    def generation(self) -> int:
        """Identity of the file now mapped: a rebuild gives a new, larger one."""
        return self._live_view().header.generation

    @property
    def capacity(self) -> int:
        return self._live_view().header.capacity

    @property
    def error_rate(self) -> float:
        return self._live_view().header.error_rate

    @property
    def growth(self) -> float:
        return self._live_view().header.growth

    @property
    def tightening(self) -> float:
        return self._live_view().header.tightening

    @property
    def is_clean(self) -> bool:
        """False if a writer died mid-change or before flushing (then rebuild).

        Also False while a live writer is between a change and its flush()."""
        return _is_clean(self._live_view().current_state(self.path))

    @property
    def count(self) -> int:
        """Keys held: additions minus removals over all stages."""
        view = self._live_view()
        return sum(self._dynamic_of(view, i)[0] for i in range(len(view.stages)))

    @staticmethod
    def _dynamic_of(view: FileView, index: int) -> tuple[int, int, int]:
        return ff.DYNAMIC.unpack_from(view.buf, ff.entry_offset(index) + ff.DYNAMIC_OFFSET)

    @property
    def nbytes(self) -> int:
        """Size of the file."""
        return self._live_view().stages[-1].end

    @property
    def stage_count(self) -> int:
        """Stages in the file now mapped (O(1), unlike info())."""
        return len(self._live_view().stages)

    def info(self) -> dict[str, Any]:
        """Parameters, state and per-stage figures. Reads every counter to
        measure the fill (O(size), unlike open)."""
        view = self._live_view()
        state = view.current_state(self.path)
        stages = []
        miss_all = 1.0
        for index, stage in enumerate(view.stages):
            count, first, last = self._dynamic_of(view, index)
            nonzero = slice_nonzero(view.array, stage.offset * 2, stage.k, stage.cells)
            fpr = math.prod(x / stage.cells for x in nonzero)
            miss_all *= 1.0 - fpr
            stages.append(
                {
                    "index": index,
                    "first_id": first if first != ff.NO_ID_FIRST else None,
                    "last_id": last if last != ff.NO_ID_LAST else None,
                    "count": count,
                    "capacity": stage.capacity,
                    "k": stage.k,
                    "cells_per_slice": stage.cells,
                    "bytes": stage.nbytes,
                    "error_rate": stage.error_rate,
                    "fill": sum(nonzero) / (stage.k * stage.cells),
                    "estimated_fpr": fpr,
                    "saturated": saturated_counters(
                        view.array, stage.offset * 2, stage.k, stage.cells
                    ),
                }
            )
        header = view.header
        return {
            "path": self.path,
            "generation": header.generation,
            "readonly": self.readonly,
            "capacity": header.capacity,
            "error_rate": header.error_rate,
            "growth": header.growth,
            "tightening": header.tightening,
            "seed": header.seed,
            "count": sum(s["count"] for s in stages),
            "bytes": view.stages[-1].end,
            "estimated_fpr": 1.0 - miss_all,
            "applied_seq": state.applied_seq,
            "is_clean": _is_clean(state),
            "mem_seqnum": state.mem_seqnum,
            "disk_seqnum": state.disk_seqnum,
            "stages": stages,
        }

    # -- closing --------------------------------------------------------------
    def _close_mapping(self) -> None:
        view = self._view
        self._view = _CLOSED
        view.release()

    def close(self) -> None:
        """Unmap and release the writer lock. A writer flushes first (unless a
        change is still open), so a clean close leaves a clean file."""
        if self._view.closed:
            return
        try:
            if not self.readonly and self._depth == 0:
                self.flush()
        finally:
            self._close_mapping()
            release_writer_lock(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> ScalingCountingBloomFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            view = getattr(self, "_view", None)
            if view is not None and not view.closed:
                self.close()

    def __repr__(self) -> str:
        if self._view.closed:
            return f"<ScalingCountingBloomFilter {self.path!r} closed>"
        mode = "read-only" if self.readonly else "writer"
        return (
            f"<ScalingCountingBloomFilter {self.path!r} {mode} "
            f"stages={len(self._view.stages)} generation={self._header.generation}>"
        )
