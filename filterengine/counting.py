"""CountingBloomFilter: an in-memory Bloom filter that supports removal.

Same partitioned geometry as BloomFilter, but each cell is a 4-bit saturating
counter (counters.py), so it takes four times the memory of the bit filter
for the same capacity and error rate.

Removing a key that is not present raises KeyError and changes nothing: a
silent decrement of other keys' counters would turn them into false negatives.
(A key that was never added but collides on every counter, a false positive,
cannot be told apart and is removed like a present one; callers remove only
keys they added.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from .bloom import KIND_COUNTERS, pack_blob, unpack_blob
from .counters import (
    saturated_counters,
    slice_nonzero,
    stage_add,
    stage_add_many,
    stage_bytes,
    stage_contains,
    stage_contains_many,
    stage_remove,
    stage_remove_apply,
    stage_remove_check,
)
from .errors import removal_refused
from .hashing import COUNTER_SCHEME, HASH_SEED, hash_pair, hash_pairs, plan_slices

__all__ = ["CountingBloomFilter"]


class CountingBloomFilter:
    """A counting Bloom filter of ``capacity`` keys at ``error_rate``.

    ``add``/``contains``/``in``/``add_many``/``contains_many`` as BloomFilter,
    plus ``remove``/``remove_many`` (KeyError for a key not present)."""

    __slots__ = ("capacity", "error_rate", "k", "cells", "seed", "count", "_buf", "_array")

    def __init__(self, capacity: int, error_rate: float, *, seed: int = HASH_SEED) -> None:
        self.k, self.cells = plan_slices(capacity, error_rate, paired=True)
        self.capacity = capacity
        self.error_rate = float(error_rate)
        self.seed = seed
        #: Additions minus removals (a key added twice counts twice).
        self.count = 0
        self._buf = bytearray(stage_bytes(self.k, self.cells))
        self._array = np.frombuffer(self._buf, dtype=np.uint8)

    # -- single key ---------------------------------------------------------
    def add(self, key: str | bytes) -> bool:
        """Add ``key``; True if it was not present before (some counter was 0)."""
        h1, h2 = hash_pair(key, self.seed)
        self.count += 1
        return stage_add(self._buf, 0, self.k, self.cells, h1, h2)

    def contains(self, key: str | bytes) -> bool:
        """True if ``key`` may be present; False if it certainly is not."""
        h1, h2 = hash_pair(key, self.seed)
        return stage_contains(self._buf, 0, self.k, self.cells, h1, h2)

    __contains__ = contains

    def remove(self, key: str | bytes) -> None:
        """Remove one occurrence of ``key``.

        Raises KeyError, with no counter changed, if the key is not present."""
        h1, h2 = hash_pair(key, self.seed)
        if not stage_remove(self._buf, 0, self.k, self.cells, h1, h2):
            raise KeyError(key)
        self.count -= 1

    # -- batches ------------------------------------------------------------
    def add_many(self, keys: Iterable[str | bytes]) -> None:
        """Add every key (vectorised; a key repeated in the batch is counted each time)."""
        h1, h2 = hash_pairs(keys, self.seed)
        stage_add_many(self._array, 0, self.k, self.cells, h1, h2)
        self.count += len(h1)

    def contains_many(self, keys: Iterable[str | bytes]) -> np.ndarray:
        """One bool per key, in order."""
        h1, h2 = hash_pairs(keys, self.seed)
        return stage_contains_many(self._array, 0, self.k, self.cells, h1, h2)

    def remove_many(self, keys: Iterable[str | bytes]) -> None:
        """Remove every key, all or nothing.

        Raises KeyError naming the offending keys, with no counter changed, if
        any key is not present, or is removed more often in the batch than its
        counters allow."""
        keys = keys if isinstance(keys, list | tuple) else list(keys)
        h1, h2 = hash_pairs(keys, self.seed)
        present = stage_contains_many(self._array, 0, self.k, self.cells, h1, h2)
        if not present.all():
            raise removal_refused([keys[i] for i in np.flatnonzero(~present)], "not present")
        plan, short = stage_remove_check(self._array, 0, self.k, self.cells, h1, h2)
        if short.any():
            raise removal_refused(
                [keys[i] for i in np.flatnonzero(short)], "removed more often than added"
            )
        stage_remove_apply(self._array, plan)
        self.count -= len(keys)

    # -- measurements -------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of counter storage."""
        return len(self._buf)

    def _slice_nonzero(self) -> list[int]:
        return slice_nonzero(self._array, 0, self.k, self.cells)

    def expected_fpp(self) -> float:
        """Probability, now, that a key not present is reported present."""
        return math.prod(x / self.cells for x in self._slice_nonzero())

    def approximate_count(self) -> int:
        """Distinct keys present, estimated from the non-zero counters."""
        m = self.cells
        estimates = [-m * math.log1p(-min(x, m - 1) / m) for x in self._slice_nonzero()]
        return round(sum(estimates) / len(estimates))

    def saturated(self) -> int:
        """How many counters are stuck at 15 (they can no longer be decremented)."""
        return saturated_counters(self._array, 0, self.k, self.cells)

    # -- serialization ------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Self-describing little-endian bytes; ``from_bytes`` reverses it."""
        return pack_blob(
            kind=KIND_COUNTERS,
            scheme=COUNTER_SCHEME,
            seed=self.seed,
            capacity=self.capacity,
            error_rate=self.error_rate,
            k=self.k,
            cells=self.cells,
            count=self.count,
            payload=self._buf,
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> CountingBloomFilter:
        """Rebuild a filter from ``to_bytes`` output; FilterFileError if it is bad."""
        fields = unpack_blob(
            data, kind=KIND_COUNTERS, scheme=COUNTER_SCHEME, payload_len=stage_bytes
        )
        self = cls.__new__(cls)
        for name in ("capacity", "error_rate", "k", "cells", "seed", "count"):
            setattr(self, name, fields[name])
        self._buf = bytearray(fields["payload"])
        self._array = np.frombuffer(self._buf, dtype=np.uint8)
        return self

    def __repr__(self) -> str:
        return (
            f"<CountingBloomFilter capacity={self.capacity} error_rate={self.error_rate}"
            f" k={self.k} bytes={self.nbytes} count={self.count}>"
        )
