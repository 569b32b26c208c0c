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
readers see additions without reopening; before each answer a reader compares
the file's size with the last byte its stages need (one ``lseek``: a file
truncated or copied over in place is refused before a page is touched, not a
SIGBUS) and compares one header
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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

from . import fileformat as ff
from .atomicfile import remove_stale_temps
from .creation import build_file, create_file, restore_file
from .errors import FilterFileError
from .growth import newest_with_room, reserve_for
from .hashing import HASH_SEED, hash_pair, hash_pairs
from .ids import checked_id, id_array
from .locking import acquire_writer_lock, release_writer_lock
from .lookup import probe, probe_many
from .mapping import FileIdentity, FileView
from .removal import remove_batch, take_each, take_one
from .stage import Stage
from .writerstate import is_clean, take_over

__all__ = ["ScalingCountingBloomFilter", "DEFAULT_GROWTH", "DEFAULT_TIGHTENING"]

# A key as given: maybe_present answers str keys with str, bytes with bytes.
Key = TypeVar("Key", bound=str | bytes)

#: Chosen by the mean bytes per key over sizes, not at one size: bench/engine.py
#: prints the comparison (``sizing``) and its docstring says how it came out.
DEFAULT_GROWTH = 1.4
DEFAULT_TIGHTENING = 0.8

#: Only what the filter itself may pass to its constructor.
_PRIVATE = object()
#: A closed filter's view: every lookup takes the slow path, which refuses.
_CLOSED = FileView()


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
            self._st, self._seq = take_over(self._view)

    @classmethod
    def _attach(
        cls, path: str, fd: int, *, readonly: bool, lock_fd: int | None = None
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
        header = ff.make_header(
            capacity, error_rate, growth, tightening, seed=seed, generation=time.time_ns() // 1000
        )
        fd, lock_fd = create_file(path, header)
        try:
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
        header = ff.make_header(capacity, error_rate, growth, tightening, seed=seed, generation=0)
        return build_file(
            cls._attach,
            path,
            pairs,
            header,
            applied_seq=applied_seq,
            writer=writer,
            lock_timeout=lock_timeout,
        )

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
        return restore_file(
            cls._attach,
            os.fspath(path),
            os.fspath(source),
            catch_up=catch_up,
            lock_timeout=lock_timeout,
        )

    # -- the mapping ----------------------------------------------------------
    def _refresh(self) -> FileView:
        """Remap after a new stage or a replacement; returns the current view."""
        with self._remap_lock:
            view = self._view
            if view.closed:
                raise ValueError(f"{self.path}: the filter is closed")
            if view.word[0] == view.layout:
                return view  # another thread remapped already
            fresh = view.successor(self.path, not self.readonly)
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
        self._st, self._seq = take_over(self._view)
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

    def _grow_if_full(self) -> tuple[FileView, Stage, int]:
        view, stage, room = newest_with_room(self._view, self._header, self._st, self.path)
        self._view = view
        return view, stage, room

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
            view, stage, _ = self._grow_if_full()
            stage.add(view.buf, h1, h2)
            stage.took(view.buf, 1, id, id)
            self._modified = ok = True
        finally:
            self._end(ok)

    def remove(self, key: str | bytes, id: int) -> None:
        """Remove ``key`` added with ``id``. KeyError, nothing changed, if no
        stage holds it (removal.py says which stage gives it up)."""
        h1, h2 = hash_pair(key, self._header.seed)
        id = checked_id(id)
        self._begin()  # refuses a read-only or closed filter
        ok = False
        try:
            if take_one(self._view, h1, h2, id) is None:
                raise KeyError(f"{key!r} with id {id} is not in the filter; nothing was removed")
            self._modified = ok = True
        finally:
            self._end(ok)

    def contains(self, key: str | bytes) -> bool:
        """True if ``key`` may be present, False if it certainly is not."""
        view = self._view
        view.check_file(self.path)
        if view.word[0] != view.layout:
            view = self._refresh()
        return probe(view, key)

    __contains__ = contains

    def maybe_present(self, keys: Iterable[Key]) -> list[Key]:
        """The keys that may be present, in order: ``contains`` for a handful of
        keys (one URL's expressions) with one check of the file for them all.
        For many keys ``contains_many`` is faster."""
        view = self._live_view()
        return [key for key in keys if probe(view, key)]

    # -- batches --------------------------------------------------------------
    def contains_many(self, keys: Iterable[str | bytes]) -> np.ndarray:
        """One bool per key, in order (vectorised; each key hashed once)."""
        return probe_many(self._live_view(), keys)

    def add_many(self, keys: Iterable[str | bytes], ids: Iterable[int]) -> None:
        """Add every key with its id (one id per key), in order (vectorised)."""
        h1, h2 = hash_pairs(keys, self._header.seed)
        ids = id_array(ids, len(h1))
        self._writable()
        if not len(h1):
            return
        reserve_for(self._view, self._header, len(h1), self.path)
        with self.change():
            pos = 0
            while pos < len(h1):
                view, stage, room = self._grow_if_full()
                end = min(len(h1), pos + room)
                stage.add_many(view.array, h1[pos:end], h2[pos:end])
                self._modified = True
                part = ids[pos:end]
                stage.took(view.buf, end - pos, int(part.min()), int(part.max()))
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
        self._begin()
        ok = False
        try:
            if not remove_batch(view, h1, h2, ids):
                modified = self._modified
                try:
                    take_each(view, keys, h1, h2, ids)
                except KeyError:
                    self._modified = modified  # undone: nothing of this batch is left
                    raise
            self._modified = ok = True
        finally:
            self._end(ok)

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
        return is_clean(self._live_view().current_state(self.path))

    @property
    def count(self) -> int:
        """Keys held: additions minus removals over all stages."""
        view = self._live_view()
        return sum(stage.count(view.buf) for stage in view.stages)

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
        stages = [stage.info(view.buf, view.array) for stage in view.stages]
        miss_all = math.prod(1.0 - stage["estimated_fpr"] for stage in stages)
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
            "is_clean": is_clean(state),
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
