"""Time-to-live Bloom filters: a key added now is present for a time in (ttl, 1.5·ttl]
and then forgotten, without any per-key bookkeeping.

ContinuousBloomFilter follows Colin Surprenant's bloombroom (4-bit cells holding a clock
tick, a tick lasting ttl/2), with its two defects fixed: stale cells are swept when the
clock ticks, so the 4-bit clock's wrap-around cannot bring an untouched key back
("ghost") 15 ticks later; and every cell write happens under one lock, so a reset can
never wipe a concurrent add. RotatingBloomFilter is the simpler ring of N+1 plain
filters with the same window; bench/variants.py measures the two side by side."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from filterengine.bloom import BloomFilter
from filterengine.hashing import MASK64, hash_pair, plan_slices
from filterengine.opposite import KeyLike
from filterengine.opposite import _to_bytes as _key_bytes

__all__ = ["ContinuousBloomFilter", "RotatingBloomFilter"]

#: A key is present while its oldest cell is at most this many ticks old (bloombroom's
#: RESOLUTION_DIVISOR): with a tick of ttl/2 a key lives (ttl, 1.5·ttl].
_TICKS_ALIVE = 2
#: Usable tick values in a 4-bit cell: 1..15, 0 marks an empty cell.
_MAX_SLOT = 15


def _check_params(capacity: int, error_rate: float, ttl: float) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    if not (isinstance(error_rate, (int, float)) and 0.0 < error_rate < 1.0):
        raise ValueError(f"error_rate must be between 0 and 1 (exclusive), got {error_rate!r}")
    if not (isinstance(ttl, (int, float)) and math.isfinite(ttl) and ttl > 0):
        raise ValueError(f"ttl must be a positive number of clock units, got {ttl!r}")


def _sweep_table(slot: int) -> np.ndarray:
    """byte -> byte with every nibble zeroed that is too old once the clock reads `slot`."""
    nibble = np.arange(16)
    elapsed = (slot - nibble) % _MAX_SLOT
    keep = np.where((nibble != 0) & (elapsed <= _TICKS_ALIVE), nibble, 0)
    byte = np.arange(256)
    table: np.ndarray = (keep[byte & 0x0F] | (keep[byte >> 4] << 4)).astype(np.uint8)
    return table


# One table per clock value (indexed by it; 0, never a clock value, included to
# keep the index plain), built once: a sweep is then a single numpy gather.
_SWEEP = [_sweep_table(slot) for slot in range(_MAX_SLOT + 1)]


class _TickClock:
    """Turns an injectable clock into a monotonically advancing tick count.

    A clock that jumps backwards (a wall clock stepped by NTP, a test) shifts the
    origin instead of moving the tick back: nothing already expired can come back,
    and time keeps flowing from the new reading."""

    __slots__ = ("_clock", "_last", "_origin", "period")

    def __init__(self, clock: Callable[[], float], period: float) -> None:
        self._clock = clock
        self.period = period
        self._origin = self._last = float(clock())

    def tick(self) -> int:
        now = float(self._clock())
        if now < self._last:
            self._origin -= self._last - now
        self._last = now
        return int((now - self._origin) // self.period)


class _Indexer:
    """key -> the k cell indices, one in each of k partitions of `slice_size` cells."""

    __slots__ = ("_offsets", "_slice")

    def __init__(self, slice_size: int, k: int) -> None:
        self._slice = slice_size
        self._offsets = [(i, i * slice_size) for i in range(k)]

    def __call__(self, key: KeyLike) -> list[int]:
        # The engine's scheme (hashing.py): one mmh3 x64-128, then g_i = h1 + i*h2.
        h1, h2 = hash_pair(_key_bytes(key))
        s = self._slice
        return [base + ((h1 + i * h2) & MASK64) % s for i, base in self._offsets]


class _WindowFilter:
    """What both time-to-live filters share: one lock over every cell write, a tick
    clock, and the batch and reset operations built on their own ``add``/``_wipe``."""

    __slots__ = ("_clock", "_lock", "_tick", "capacity", "error_rate", "ttl")

    _lock: threading.Lock

    def add(self, key: KeyLike) -> bool:
        raise NotImplementedError

    def _wipe(self) -> None:
        """Forget every key; the caller holds the lock."""
        raise NotImplementedError

    def add_many(self, keys: Iterable[KeyLike]) -> None:
        for key in keys:
            self.add(key)

    def clear(self) -> None:
        with self._lock:
            self._wipe()


class ContinuousBloomFilter(_WindowFilter):
    """bloombroom's continuous filter: `capacity` is the number of keys present at
    once (those added during the last 1.5·ttl), `error_rate` the false-positive
    rate at that load, `ttl` in the units of `clock` (seconds by default)."""

    __slots__ = ("_cells", "_hasher", "_k", "_slice", "_slot", "_view")

    def __init__(
        self,
        capacity: int,
        error_rate: float,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_params(capacity, error_rate, ttl)
        self.capacity, self.error_rate, self.ttl = capacity, error_rate, float(ttl)
        self._k, self._slice = plan_slices(capacity, error_rate)
        self._hasher = _Indexer(self._slice, self._k)
        # Two 4-bit cells per byte; a bytearray for fast single-cell access from
        # Python, a numpy view of the same memory for the sweep.
        self._cells = bytearray((self._slice * self._k + 1) // 2)
        self._view = np.frombuffer(self._cells, dtype=np.uint8)
        self._clock = _TickClock(clock, self.ttl / _TICKS_ALIVE)
        self._tick = 0
        self._slot = 1
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return len(self._cells)

    def _advance(self) -> None:
        # Caller holds the lock. Ticks are counted in absolute terms, so several
        # missed ticks are one step here, and one sweep restores the invariant
        # "every non-empty cell is at most 2 ticks old" that makes the wrap harmless.
        tick = self._clock.tick()
        if tick <= self._tick:
            return
        steps = tick - self._tick
        self._tick = tick
        self._slot = tick % _MAX_SLOT + 1
        if steps > _TICKS_ALIVE:
            self._view[:] = 0  # everything is older than the window
        else:
            np.take(_SWEEP[self._slot], self._view, out=self._view)

    def add(self, key: KeyLike) -> bool:
        """Stamp `key` with the current tick; return True if it was not present."""
        indices = self._hasher(key)
        cells = self._cells
        with self._lock:
            self._advance()
            slot = self._slot
            present = True
            for i in indices:
                byte = cells[i >> 1]
                if i & 1:
                    present = present and (byte >> 4) != 0
                    cells[i >> 1] = (byte & 0x0F) | (slot << 4)
                else:
                    present = present and (byte & 0x0F) != 0
                    cells[i >> 1] = (byte & 0xF0) | slot
        return not present

    def contains(self, key: KeyLike) -> bool:
        """True if `key` was added within its window (or, rarely, falsely)."""
        indices = self._hasher(key)
        cells = self._cells
        with self._lock:
            self._advance()
            # After the sweep every non-empty cell is live: presence is "no zero cell".
            for i in indices:
                byte = cells[i >> 1]
                if not ((byte >> 4) if i & 1 else (byte & 0x0F)):
                    return False
        return True

    __contains__ = contains

    def _wipe(self) -> None:
        self._view[:] = 0

    def info(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            filled = int(np.count_nonzero(self._view & 0x0F) + np.count_nonzero(self._view >> 4))
            return {
                "cells": self._slice * self._k,
                "k": self._k,
                "bytes": len(self._cells),
                "fill": filled / (self._slice * self._k),
                "tick": self._tick,
                "slot": self._slot,
                "ttl": self.ttl,
            }

    def __repr__(self) -> str:
        return (
            f"ContinuousBloomFilter(capacity={self.capacity}, "
            f"error_rate={self.error_rate}, ttl={self.ttl})"
        )


class RotatingBloomFilter(_WindowFilter):
    """A ring of `slices` + 1 plain Bloom filters, each taking the additions of one
    period of ttl/slices; at each period the oldest is replaced by an empty one.
    A key lives (ttl, ttl + ttl/slices]: (ttl, 1.5·ttl] with the default 2 slices.

    Each filter is sized for the whole `capacity` at error_rate/(slices+1), because a
    lookup asks every live filter and their false positives add up."""

    __slots__ = ("_current", "_filters", "_per_filter", "_slices")

    def __init__(
        self,
        capacity: int,
        error_rate: float,
        ttl: float,
        slices: int = 2,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_params(capacity, error_rate, ttl)
        if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
            raise ValueError(f"slices must be a positive int, got {slices!r}")
        self.capacity, self.error_rate, self.ttl = capacity, error_rate, float(ttl)
        self._slices = slices
        self._per_filter = error_rate / (slices + 1)
        self._filters = [self._new_filter() for _ in range(slices + 1)]
        self._current = self._filters[0]
        self._clock = _TickClock(clock, self.ttl / slices)
        self._tick = 0
        self._lock = threading.Lock()

    def _new_filter(self) -> BloomFilter:
        return BloomFilter(self.capacity, self._per_filter)

    @property
    def nbytes(self) -> int:
        return sum(f.nbytes for f in self._filters)

    def _advance(self) -> None:
        # Caller holds the lock. Replacing (not clearing) a filter means a reader
        # that already holds a reference to it still sees a consistent object.
        tick = self._clock.tick()
        if tick <= self._tick:
            return
        ring = self._slices + 1
        for t in range(max(self._tick + 1, tick - ring + 1), tick + 1):
            self._filters[t % ring] = self._new_filter()
        self._tick = tick
        self._current = self._filters[tick % ring]

    def add(self, key: KeyLike) -> bool:
        """Add `key` to the current period; return True if it was not present."""
        h1, h2 = hash_pair(_key_bytes(key))  # once for every filter of the ring
        with self._lock:
            self._advance()
            present = any(f.contains_hashed(h1, h2) for f in self._filters)
            self._current.add_hashed(h1, h2)
        return not present

    def contains(self, key: KeyLike) -> bool:
        h1, h2 = hash_pair(_key_bytes(key))
        with self._lock:
            self._advance()
            filters = self._filters
        return any(f.contains_hashed(h1, h2) for f in filters)

    __contains__ = contains

    def _wipe(self) -> None:
        self._filters = [self._new_filter() for _ in self._filters]
        self._current = self._filters[self._tick % len(self._filters)]

    def info(self) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return {
                "filters": len(self._filters),
                "bytes": self.nbytes,
                "tick": self._tick,
                "ttl": self.ttl,
                "per_filter_error_rate": self._per_filter,
            }

    def __repr__(self) -> str:
        return (
            f"RotatingBloomFilter(capacity={self.capacity}, error_rate={self.error_rate}, "
            f"ttl={self.ttl}, slices={self._slices})"
        )
