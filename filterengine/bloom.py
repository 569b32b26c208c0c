"""BloomFilter: a fixed-capacity, in-memory, partitioned Bloom filter of bits.

k slices of m bits each; a key sets one bit per slice (see hashing.py). The
bits live in a bytearray so the single-key path indexes bytes with Python ints
(no numpy scalars), while a numpy view of the same memory serves the batch
path. ``to_bytes``/``from_bytes`` use a self-describing little-endian format
with a header checksum and a payload checksum, shared with CountingBloomFilter.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .errors import FilterFileError
from .hashing import HASH_SCHEME, HASH_SEED, MASK64, hash_pair, hash_pairs, plan_slices

__all__ = ["BloomFilter"]

# Serialized layout (little-endian, 72 bytes, then the payload):
#   magic 8s | version u16 | kind u16 | hash scheme u32 | seed u32 | reserved u32
#   capacity u64 | error_rate f64 | k u64 | cells per slice u64 | count u64
#   payload length u64 | payload crc32 u32 | header crc32 u32 (of the bytes before it)
BLOB_MAGIC = b"FEFILTR\x00"
BLOB_VERSION = 1
KIND_BITS = 1
KIND_COUNTERS = 2
_BLOB = struct.Struct("<8sHHIIIQdQQQQI")
_BLOB_CRC = struct.Struct("<I")
BLOB_HEADER_SIZE = _BLOB.size + _BLOB_CRC.size


def pack_blob(
    *,
    kind: int,
    scheme: int = HASH_SCHEME,
    seed: int,
    capacity: int,
    error_rate: float,
    k: int,
    cells: int,
    count: int,
    payload: bytes | bytearray | memoryview,
) -> bytes:
    """Serialize a filter's parameters and cells (header + payload)."""
    head = _BLOB.pack(
        BLOB_MAGIC,
        BLOB_VERSION,
        kind,
        scheme,
        seed,
        0,
        capacity,
        error_rate,
        k,
        cells,
        count,
        len(payload),
        zlib.crc32(payload),
    )
    return head + _BLOB_CRC.pack(zlib.crc32(head)) + bytes(payload)


def unpack_blob(
    data: bytes | bytearray | memoryview,
    *,
    kind: int,
    payload_len: Callable[[int, int], int],
    scheme: int = HASH_SCHEME,
) -> dict[str, Any]:
    """Validate a serialized filter and return its fields; FilterFileError if bad.

    ``payload_len(k, cells)`` gives the payload size the header's geometry
    implies, so a header that lies about its geometry is refused."""
    data = memoryview(data).cast("B")
    what = "serialized filter"
    if len(data) < BLOB_HEADER_SIZE:
        raise FilterFileError(
            f"{what}: truncated header: expected at least {BLOB_HEADER_SIZE} bytes, "
            f"found {len(data)}"
        )
    fields = _BLOB.unpack_from(data)
    (
        magic,
        version,
        found_kind,
        found_scheme,
        seed,
        _reserved,
        capacity,
        error_rate,
        k,
        cells,
        count,
        length,
        payload_crc,
    ) = fields
    if magic != BLOB_MAGIC:
        raise FilterFileError(f"{what}: magic: expected {BLOB_MAGIC!r}, found {magic!r}")
    (header_crc,) = _BLOB_CRC.unpack_from(data, _BLOB.size)
    actual_crc = zlib.crc32(data[: _BLOB.size])
    if header_crc != actual_crc:
        raise FilterFileError(
            f"{what}: header checksum: expected {header_crc:#010x}, found {actual_crc:#010x}"
            " (the header is corrupt)"
        )
    if version != BLOB_VERSION:
        raise FilterFileError(f"{what}: version: expected {BLOB_VERSION}, found {version}")
    if found_kind != kind:
        names = {KIND_BITS: "BloomFilter", KIND_COUNTERS: "CountingBloomFilter"}
        raise FilterFileError(
            f"{what}: kind: expected {names.get(kind, kind)}, "
            f"found {names.get(found_kind, found_kind)}"
        )
    if found_scheme != scheme:
        raise FilterFileError(f"{what}: hash scheme: expected {scheme}, found {found_scheme}")
    if not (capacity > 0 and 0.0 < error_rate < 1.0 and k > 0 and cells > 0 and cells % 16 == 0):
        raise FilterFileError(
            f"{what}: parameters out of range: capacity={capacity}, error_rate={error_rate},"
            f" k={k}, cells per slice={cells}"
        )
    expected_len = payload_len(k, cells)
    if length != expected_len:
        raise FilterFileError(
            f"{what}: payload length: expected {expected_len} for k={k}, "
            f"{cells} cells per slice, found {length}"
        )
    if len(data) != BLOB_HEADER_SIZE + length:
        raise FilterFileError(
            f"{what}: size: expected {BLOB_HEADER_SIZE + length} bytes, found {len(data)}"
        )
    payload = data[BLOB_HEADER_SIZE:]
    if zlib.crc32(payload) != payload_crc:
        raise FilterFileError(
            f"{what}: payload checksum: expected {payload_crc:#010x}, "
            f"found {zlib.crc32(payload):#010x}"
        )
    return dict(
        seed=seed,
        capacity=capacity,
        error_rate=error_rate,
        k=k,
        cells=cells,
        count=count,
        payload=payload,
    )


class BloomFilter:
    """A Bloom filter of ``capacity`` keys at false-positive rate ``error_rate``.

    Keys are str (hashed as UTF-8) or bytes. ``add`` returns whether any bit
    changed (Guava's ``put``): False means the key was probably present."""

    __slots__ = ("capacity", "error_rate", "k", "cells", "seed", "count", "_bits", "_array")

    def __init__(self, capacity: int, error_rate: float, *, seed: int = HASH_SEED) -> None:
        self.k, self.cells = plan_slices(capacity, error_rate)
        self.capacity = capacity
        self.error_rate = float(error_rate)
        self.seed = seed
        #: Number of ``add`` calls that changed the filter: an estimate of the
        #: distinct keys added, exact unless two keys collided on every slice.
        self.count = 0
        self._bits = bytearray(self.k * self.cells // 8)
        self._array = np.frombuffer(self._bits, dtype=np.uint8)

    # -- single key ---------------------------------------------------------
    def add(self, key: str | bytes) -> bool:
        """Add ``key``; return True if the filter changed (the key was new)."""
        h1, h2 = hash_pair(key, self.seed)
        return self.add_hashed(h1, h2)

    def add_hashed(self, h1: int, h2: int) -> bool:
        """``add`` of a key already hashed by ``hash_pair`` (with this filter's
        seed), so that a caller probing several filters hashes once."""
        bits = self._bits
        cells = self.cells
        changed = False
        base = 0
        for i in range(self.k):
            c = base + ((h1 + i * h2) & MASK64) % cells
            mask = 1 << (c & 7)
            if not bits[c >> 3] & mask:
                bits[c >> 3] |= mask
                changed = True
            base += cells
        if changed:
            self.count += 1
        return changed

    def contains(self, key: str | bytes) -> bool:
        """True if ``key`` may have been added; False if it certainly was not."""
        h1, h2 = hash_pair(key, self.seed)
        return self.contains_hashed(h1, h2)

    def contains_hashed(self, h1: int, h2: int) -> bool:
        """``contains`` of a key already hashed by ``hash_pair`` (see add_hashed)."""
        bits = self._bits
        cells = self.cells
        base = 0
        for i in range(self.k):
            c = base + ((h1 + i * h2) & MASK64) % cells
            if not bits[c >> 3] & (1 << (c & 7)):
                return False
            base += cells
        return True

    __contains__ = contains

    # -- batches ------------------------------------------------------------
    def add_many(self, keys: Iterable[str | bytes]) -> None:
        """Add every key (vectorised)."""
        h1, h2 = hash_pairs(keys, self.seed)
        if not len(h1):
            return
        fresh = ~self._contains_hashed(h1, h2)
        array = self._array
        cells = np.uint64(self.cells)
        with np.errstate(over="ignore"):
            g = h1.copy()
            for i in range(self.k):
                c = g % cells + np.uint64(i * self.cells)
                # bitwise_or.at, not |=: two keys may set bits in the same byte.
                np.bitwise_or.at(
                    array,
                    (c >> np.uint64(3)).astype(np.intp),
                    np.left_shift(1, (c & np.uint64(7)).astype(np.uint8)).astype(np.uint8),
                )
                g += h2
        # Keys absent before the batch; a key repeated within it counts once.
        self.count += int(np.count_nonzero(fresh)) - _batch_repeats(h1, fresh)

    def contains_many(self, keys: Iterable[str | bytes]) -> np.ndarray:
        """One bool per key, in order: True if the key may have been added."""
        h1, h2 = hash_pairs(keys, self.seed)
        return self._contains_hashed(h1, h2)

    def _contains_hashed(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        # Probe slice by slice, keeping only keys still possibly present: an
        # absent key usually fails within two slices, so the work is ~2n, not kn.
        result = np.zeros(len(h1), dtype=bool)
        alive = np.arange(len(h1))
        a1, a2 = h1, h2
        array = self._array
        cells = np.uint64(self.cells)
        with np.errstate(over="ignore"):
            for i in range(self.k):
                if not len(alive):
                    return result
                c = (a1 + np.uint64(i) * a2) % cells + np.uint64(i * self.cells)
                hit = (
                    array[(c >> np.uint64(3)).astype(np.intp)]
                    >> (c & np.uint64(7)).astype(np.uint8)
                ) & 1
                keep = hit.astype(bool)
                alive, a1, a2 = alive[keep], a1[keep], a2[keep]
        result[alive] = True
        return result

    # -- measurements -------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of bit storage."""
        return len(self._bits)

    def _slice_fill(self) -> list[int]:
        per = self.cells // 8
        return [
            int(np.bitwise_count(self._array[i * per : (i + 1) * per]).sum()) for i in range(self.k)
        ]

    def expected_fpp(self) -> float:
        """Probability that a key never added is reported present, now.

        For a partitioned filter this is exact given the bits: the product over
        slices of the fraction of that slice's bits that are set."""
        return math.prod(x / self.cells for x in self._slice_fill())

    def approximate_count(self) -> int:
        """Distinct keys added, estimated from the fill (Swamidass & Baldi):
        each slice is a one-hash filter, n ~ -m ln(1 - X/m); slices averaged."""
        m = self.cells
        estimates = [-m * math.log1p(-min(x, m - 1) / m) for x in self._slice_fill()]
        return round(sum(estimates) / len(estimates))

    def is_compatible(self, other: object) -> bool:
        """Whether ``other`` hashes keys to the same cells (same geometry and seed)."""
        return (
            isinstance(other, BloomFilter)
            and other.k == self.k
            and other.cells == self.cells
            and other.seed == self.seed
        )

    # -- serialization ------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Self-describing little-endian bytes; ``from_bytes`` reverses it."""
        return pack_blob(
            kind=KIND_BITS,
            seed=self.seed,
            capacity=self.capacity,
            error_rate=self.error_rate,
            k=self.k,
            cells=self.cells,
            count=self.count,
            payload=self._bits,
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> BloomFilter:
        """Rebuild a filter from ``to_bytes`` output; FilterFileError if it is bad."""
        fields = unpack_blob(data, kind=KIND_BITS, payload_len=lambda k, cells: k * cells // 8)
        self = cls.__new__(cls)
        self.capacity = fields["capacity"]
        self.error_rate = fields["error_rate"]
        self.k = fields["k"]
        self.cells = fields["cells"]
        self.seed = fields["seed"]
        self.count = fields["count"]
        self._bits = bytearray(fields["payload"])
        self._array = np.frombuffer(self._bits, dtype=np.uint8)
        return self

    def __repr__(self) -> str:
        return (
            f"<BloomFilter capacity={self.capacity} error_rate={self.error_rate} "
            f"k={self.k} bytes={self.nbytes} count={self.count}>"
        )


def _batch_repeats(h1: np.ndarray, fresh: np.ndarray) -> int:
    """How many of the ``fresh`` keys repeat an earlier fresh key of the batch."""
    # h1 alone identifies a key here: two distinct keys share a 64-bit h1 with
    # probability ~n**2 / 2**65, and then the count is off by one, not wrong.
    firsts = h1[fresh]
    return len(firsts) - len(np.unique(firsts))
