"""ScalableBloomFilter: a Bloom filter that grows with its contents while keeping a
fixed bound on the false-positive rate (Almeida, Baquero, Preguiça, Hutchison,
"Scalable Bloom Filters", 2007).

Stage i holds n0·s**i keys at error rate P0·r**i with P0 = P·(1 − r), so the rate
compounded over any number of stages, 1 − Π(1 − P0·r**i), stays below P. Only the
newest stage takes insertions; each key is hashed once for every stage."""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from filterengine.bloom import BloomFilter
from filterengine.errors import FilterFileError
from filterengine.hashing import hash_pair, hash_pairs, plan_slices, stage_error_rate
from filterengine.opposite import KeyLike
from filterengine.opposite import _to_bytes as _key_bytes

__all__ = ["ScalableBloomFilter"]

_MAGIC = b"FESCALE\x00"
_VERSION = 1
# magic | version u32 | stages u32 | initial_capacity u64 | error_rate f64 | growth f64
# | tightening f64 | header crc32 u32 | pad u32; then per stage: length u64 + BloomFilter bytes.
_HEADER = struct.Struct("<8sIIQddd")
_CRC = struct.Struct("<II")
_LEN = struct.Struct("<Q")


def _real_rate(keys: int, k: int, cells: int) -> float:
    """False-positive rate of a partitioned filter of k slices of `cells` cells
    holding `keys` keys, with the engine's Kirsch–Mitzenmacher indices.

    Two terms: the textbook rate, computed exactly rather than with the planner's
    e**(-n/m); and the double-hashing floor. Slice i's index is (h1 + i·h2) mod m,
    so a key whose (h1, h2) agree mod m with a stored key's collides in every
    slice: about keys/m**2, which no choice of k removes. For small m it dominates
    (one key in 16-cell slices: 1/256, against a planned 1e-11)."""
    return (1.0 - (1.0 - 1.0 / cells) ** keys) ** k + keys / cells**2


class ScalableBloomFilter:
    """Grows by stages: `initial_capacity` keys in the first, `growth` times more in
    each next one, each stage `tightening` times stricter, so that the whole filter's
    false-positive rate stays at most `error_rate` however many keys it takes."""

    __slots__ = (
        "_budget",
        "_newest",
        "_stages",
        "error_rate",
        "growth",
        "initial_capacity",
        "tightening",
    )

    def __init__(
        self, initial_capacity: int, error_rate: float, growth: float = 2, tightening: float = 0.85
    ) -> None:
        if isinstance(initial_capacity, bool) or not isinstance(initial_capacity, int):
            raise TypeError(
                f"initial_capacity must be an int, not {type(initial_capacity).__name__}"
            )
        if initial_capacity < 1:
            raise ValueError(f"initial_capacity must be at least 1, got {initial_capacity}")
        if not (isinstance(error_rate, (int, float)) and 0.0 < error_rate < 1.0):
            raise ValueError(f"error_rate must be between 0 and 1 (exclusive), got {error_rate!r}")
        if not (isinstance(growth, (int, float)) and math.isfinite(growth) and growth >= 1):
            raise ValueError(f"growth must be a number >= 1, got {growth!r}")
        if not (isinstance(tightening, (int, float)) and 0.0 < tightening < 1.0):
            raise ValueError(f"tightening must be between 0 and 1 (exclusive), got {tightening!r}")
        self.initial_capacity, self.error_rate = initial_capacity, float(error_rate)
        self.growth, self.tightening = float(growth), float(tightening)
        self._stages: list[BloomFilter] = []
        self._newest = self._grow()

    def _stage_plan(self, i: int) -> tuple[int, int, float]:
        """(keys stage i takes, capacity and error rate to plan its filter with).

        The tiny-capacity guard: planned naively, a small stage's real rate
        (`_real_rate`) exceeds its share P0·r**i, so the compounded bound P no
        longer holds. The filter is planned larger (more cells per slice, for the
        double-hashing floor) and tighter (for rounding) until it meets its share."""
        keys = max(1, math.ceil(self.initial_capacity * self.growth**i))
        share = stage_error_rate(self.error_rate, self.tightening, i)
        capacity, planned = keys, share
        for _ in range(200):
            k, cells = plan_slices(capacity, planned)
            if _real_rate(keys, k, cells) <= share:
                return keys, capacity, planned
            if keys / cells**2 > share / 4:
                capacity = math.ceil(capacity * 1.25)
            else:
                planned *= 0.9
        raise ValueError(  # not reached with the engine's planner; never loop forever
            f"cannot size stage {i} for {keys} keys at error rate {share:.3g}"
        )

    def _grow(self) -> BloomFilter:
        keys, capacity, planned = self._stage_plan(len(self._stages))
        stage = BloomFilter(capacity, planned)
        self._budget = keys
        self._stages.append(stage)
        self._newest = stage
        return stage

    # -- keys ---------------------------------------------------------------
    def add(self, key: KeyLike) -> bool:
        """Add `key`; True if it was new (no stage reported it present)."""
        h1, h2 = hash_pair(_key_bytes(key))
        # Newest first: it is the largest, so a present key is most likely there.
        for stage in reversed(self._stages):
            if stage.contains_hashed(h1, h2):
                return False
        stage = self._newest
        if stage.count >= self._budget:
            stage = self._grow()
        stage.add_hashed(h1, h2)
        return True

    def contains(self, key: KeyLike) -> bool:
        h1, h2 = hash_pair(_key_bytes(key))
        for stage in reversed(self._stages):  # noqa: SIM110  (a loop beats any(genexpr) here)
            if stage.contains_hashed(h1, h2):
                return True
        return False

    __contains__ = contains

    def add_many(self, keys: Iterable[KeyLike]) -> int:
        """Add every key; return how many were new."""
        return sum(self.add(key) for key in keys)

    def contains_many(self, keys: Iterable[KeyLike]) -> np.ndarray:
        """One bool per key, in order (vectorised, hashed once for all stages)."""
        h1, h2 = hash_pairs([_key_bytes(k) for k in keys])
        found = np.zeros(len(h1), dtype=bool)
        for stage in self._stages:
            found |= stage._contains_hashed(h1, h2)
        return found

    # -- measurements -------------------------------------------------------
    def __len__(self) -> int:
        return sum(stage.count for stage in self._stages)

    @property
    def stages(self) -> int:
        return len(self._stages)

    @property
    def nbytes(self) -> int:
        return sum(stage.nbytes for stage in self._stages)

    def expected_fpp(self) -> float:
        """The compounded false-positive rate now, from the stages' actual fill."""
        return 1.0 - math.prod(1.0 - stage.expected_fpp() for stage in self._stages)

    def info(self) -> dict[str, Any]:
        return {
            "initial_capacity": self.initial_capacity,
            "error_rate": self.error_rate,
            "growth": self.growth,
            "tightening": self.tightening,
            "bytes": self.nbytes,
            "count": len(self),
            "expected_fpp": self.expected_fpp(),
            "stages": [
                {
                    "capacity": self._stage_plan(i)[0],
                    "error_rate": stage_error_rate(self.error_rate, self.tightening, i),
                    "count": s.count,
                    "k": s.k,
                    "cells_per_slice": s.cells,
                    "bytes": s.nbytes,
                }
                for i, s in enumerate(self._stages)
            ],
        }

    # -- serialization ------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Self-describing little-endian bytes; `from_bytes` reverses it."""
        head = _HEADER.pack(
            _MAGIC,
            _VERSION,
            len(self._stages),
            self.initial_capacity,
            self.error_rate,
            self.growth,
            self.tightening,
        )
        parts = [head, _CRC.pack(zlib.crc32(head), 0)]
        for stage in self._stages:
            blob = stage.to_bytes()
            parts += [_LEN.pack(len(blob)), blob]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ScalableBloomFilter:
        """Rebuild from `to_bytes` output; FilterFileError if it is truncated or corrupt."""
        data = memoryview(data).cast("B")
        fixed = _HEADER.size + _CRC.size
        if len(data) < fixed:
            raise FilterFileError(
                f"serialized scalable filter: truncated header: expected "
                f"at least {fixed} bytes, found {len(data)}"
            )
        magic, version, count, n0, p, s, r = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise FilterFileError(
                f"serialized scalable filter: magic: expected {_MAGIC!r}, found {bytes(magic)!r}"
            )
        crc, _ = _CRC.unpack_from(data, _HEADER.size)
        if crc != zlib.crc32(data[: _HEADER.size]):
            raise FilterFileError("serialized scalable filter: header checksum mismatch")
        if version != _VERSION:
            raise FilterFileError(
                f"serialized scalable filter: version: expected {_VERSION}, found {version}"
            )
        self = cls.__new__(cls)
        self.initial_capacity, self.error_rate, self.growth, self.tightening = n0, p, s, r
        self._stages = []
        offset = fixed
        for i in range(count):
            if offset + _LEN.size > len(data):
                raise FilterFileError(
                    f"serialized scalable filter: truncated at stage {i} of {count}"
                )
            (length,) = _LEN.unpack_from(data, offset)
            offset += _LEN.size
            if offset + length > len(data):
                raise FilterFileError(
                    f"serialized scalable filter: stage {i} needs {length} bytes, "
                    f"found {len(data) - offset}"
                )
            stage = BloomFilter.from_bytes(data[offset : offset + length])
            keys, capacity, planned = self._stage_plan(i)
            expected = (capacity, planned)
            if (stage.capacity, stage.error_rate) != expected:
                raise FilterFileError(
                    f"serialized scalable filter: stage {i} has capacity/error rate "
                    f"{(stage.capacity, stage.error_rate)}, expected {expected}"
                )
            self._stages.append(stage)
            offset += length
        if not self._stages or offset != len(data):
            raise FilterFileError(
                f"serialized scalable filter: {len(data) - offset} bytes after {count} stages"
                if self._stages
                else "serialized scalable filter: no stages"
            )
        self._newest = self._stages[-1]
        self._budget = keys
        return self

    def __repr__(self) -> str:
        return (
            f"ScalableBloomFilter(initial_capacity={self.initial_capacity}, "
            f"error_rate={self.error_rate}, growth={self.growth}, "
            f"tightening={self.tightening}) <{len(self._stages)} stages, {len(self)} keys>"
        )
