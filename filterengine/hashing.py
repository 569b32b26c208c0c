"""Key hashing and index geometry shared by every filter in filterengine.

Each key is hashed once with MurmurHash3 x64-128 (mmh3); its two 64-bit halves
(h1, h2) drive Kirsch–Mitzenmacher double hashing over partitioned slices of m
cells each. Two index schemes exist, each named by an id stored with the data:

- HASH_SCHEME (1), bit filters (BloomFilter and the variants built on it):
  slice i uses ((h1 + i*h2) mod 2**64) mod m, Guava's MURMUR128_MITZ_64 style.
- COUNTER_SCHEME (3), counting filters (counters.py, the scaling file):
  slice i uses (h1 + i*h2) mod m exactly. h1 and h2 are reduced mod m once and
  each next slice is one addition and a conditional subtraction, which keeps
  64-bit arithmetic and modulos off the per-probe path, scalar and numpy. The
  id also covers the counters' layout (slices paired in the two nibbles of a
  byte region, counters.py).

Both are exact in Python ints and in uint64 (the numpy paths never overflow),
so scalar and batch paths agree bit for bit, and slices of more than 2**32
cells (files over 4 GiB) index correctly.

Hashing once per key lets a multi-stage filter probe every stage from one hash.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import mmh3
import numpy as np

__all__ = [
    "HASH_SCHEME",
    "COUNTER_SCHEME",
    "HASH_SEED",
    "MASK64",
    "check_key",
    "hash_pair",
    "hash_tuple",
    "hash_pairs",
    "slice_index",
    "slice_indices",
    "plan_slices",
    "min_cells",
    "FLOOR_SHARE",
    "stage_error_rate",
]

#: Identifies "mmh3 x64-128, KM double hashing g_i = h1 + i*h2 mod 2**64, then
#: mod cells-per-slice, partitioned slices" in file headers. Bump it if any of
#: that changes: old files must then be refused, not silently misread.
HASH_SCHEME = 1
#: Counting filters' exact KM indices; see the module docstring.
COUNTER_SCHEME = 3
#: The seed written into new files. Files carry their own seed.
HASH_SEED = 0
MASK64 = (1 << 64) - 1

hash_tuple = mmh3.mmh3_x64_128_utupledigest  # unsigned (h1, h2) from bytes
_hash_bytes = mmh3.hash_bytes  # 16 little-endian bytes: h1 then h2


def _key_type_error(key: object) -> TypeError:
    return TypeError(f"filter keys must be str or bytes, not {type(key).__name__} ({key!r:.60})")


def check_key(key: object) -> bytes:
    """Return ``key`` as bytes (str is UTF-8 encoded); TypeError for anything else.

    Encoding here, not inside mmh3, matters: mmh3 5.x crashes the interpreter
    on a str holding a lone surrogate, whereas ``str.encode`` raises
    UnicodeEncodeError (a ValueError) that names the offending character."""
    cls = type(key)
    if cls is bytes:
        return key  # type: ignore[return-value]
    if cls is str:
        return key.encode()  # type: ignore[attr-defined,no-any-return]
    raise _key_type_error(key)


def hash_pair(key: str | bytes, seed: int = HASH_SEED) -> tuple[int, int]:
    """Hash one key: the unsigned 64-bit halves (h1, h2) of its MurmurHash3 x64-128."""
    cls = type(key)
    if cls is str:
        key = key.encode()  # type: ignore[union-attr]
    elif cls is not bytes:
        raise _key_type_error(key)
    return hash_tuple(key, seed)


def _hashable_keys(keys: Iterable[str | bytes]) -> Sequence[str | bytes]:
    """Materialise ``keys`` and make every entry safe to hand to mmh3 directly.

    ASCII str is hashed by mmh3 without a Python-level encode (that is the fast
    case: URLs); other str is encoded here for the reason given in check_key."""
    if not isinstance(keys, list | tuple):
        keys = list(keys)
    try:
        # The common case, all ASCII str (URLs), costs one pass; a non-str
        # key makes str.isascii raise TypeError and takes the general path.
        if all(map(str.isascii, keys)):
            return keys
    except TypeError:
        pass
    types = set(map(type, keys))
    if types <= {bytes}:
        return keys
    if types <= {str}:
        if all(map(str.isascii, keys)):  # O(1) per key in CPython: a flag test
            return keys
        return [key.encode() for key in keys]  # type: ignore[union-attr]
    if not types <= {str, bytes}:
        for key in keys:
            if type(key) is not str and type(key) is not bytes:
                raise _key_type_error(key)
    return [key.encode() if type(key) is str else key for key in keys]


def hash_pairs(keys: Iterable[str | bytes], seed: int = HASH_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Hash many keys: two uint64 arrays (h1, h2), one entry per key, in order."""
    keys = _hashable_keys(keys)
    n = len(keys)
    if seed == 0:
        digests = np.fromiter(map(_hash_bytes, keys), dtype="S16", count=n)
    else:
        digests = np.fromiter((_hash_bytes(key, seed) for key in keys), dtype="S16", count=n)
    # The S16 buffer holds the raw 16-byte digests (numpy only strips trailing
    # NULs when converting back to Python bytes), so a view reads h1, h2 exactly.
    pairs = digests.view("<u8").reshape(n, 2)
    if pairs.dtype != np.uint64:  # a big-endian machine: make them native
        pairs = pairs.astype(np.uint64)
    # Strided views, not copies: every consumer's first step makes a new array.
    return pairs[:, 0], pairs[:, 1]


def slice_index(h1: int, h2: int, i: int, cells: int) -> int:
    """Index within slice ``i`` (0-based) of a slice of ``cells`` cells."""
    return ((h1 + i * h2) & MASK64) % cells


def slice_indices(h1: np.ndarray, h2: np.ndarray, i: int, cells: int) -> np.ndarray:
    """Vectorised slice_index: uint64 arithmetic wraps mod 2**64 like the scalar path."""
    with np.errstate(over="ignore"):
        g = h1 + np.uint64(i) * h2 if i else h1
    return g % np.uint64(cells)


#: Share of a filter's error rate set aside for the double-hashing floor (see
#: plan_slices): the cells' own rate is planned at (1 - FLOOR_SHARE) of it.
FLOOR_SHARE = 1 / 20


def min_cells(capacity: int, error_rate: float) -> int:
    """Fewest cells per slice that keep the double-hashing floor within its share.

    Every index scheme here derives all k slice positions from (h1 mod m,
    h2 mod m) (COUNTER_SCHEME exactly, HASH_SCHEME up to the rare 2**64 wrap),
    so a key whose pair matches a stored key's pair matches it in *every*
    slice, whatever k is: a false positive with probability ~ capacity / m**2
    that more slices cannot remove. Requiring capacity / m**2 <= FLOOR_SHARE *
    error_rate bounds it; it binds only for tiny or very strict filters
    (BloomFilter(10, 0.01) used 16 cells and measured 5% false positives)."""
    return math.isqrt(math.ceil(capacity / (FLOOR_SHARE * error_rate))) + 1


def plan_slices(capacity: int, error_rate: float, *, paired: bool = False) -> tuple[int, int]:
    """Geometry of a partitioned filter for ``capacity`` keys at ``error_rate``.

    Returns (k, cells_per_slice). With k slices of m cells, after n keys the
    false-positive rate is (1 - (1 - 1/m)**n)**k ~ (1 - e**(-n/m))**k, plus
    the double-hashing floor ~ n/m**2 (min_cells). The first term is planned at
    (1 - FLOOR_SHARE) * error_rate, m = -n / ln(1 - p**(1/k)), and m is raised
    to min_cells(), so the sum stays within error_rate. Every k up to
    ceil(log2(1/p)) is tried and the one needing fewest cells wins: usually one
    next to log2(1/p), a smaller one when the floor forces m up. ``paired``:
    counting slices share bytes in pairs (counters.py), and an odd k would pay
    for a half-empty pair while an even k of the same memory has a lower rate,
    so only even k are tried. m is rounded up to a multiple of 16, so a slice
    starts on a byte boundary when a cell is a bit and on an 8-byte boundary
    when it is a 4-bit counter."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity <= 0:
        raise ValueError(f"capacity must be a positive number of keys, got {capacity}")
    if isinstance(error_rate, bool) or not isinstance(error_rate, int | float):
        raise TypeError(f"error_rate must be a float, not {type(error_rate).__name__}")
    if not 0.0 < error_rate < 1.0 or math.isnan(error_rate):
        raise ValueError(f"error_rate must be strictly between 0 and 1, got {error_rate}")
    target = error_rate * (1.0 - FLOOR_SHARE)
    top = max(1, math.ceil(math.log2(1.0 / target)))
    floor = min_cells(capacity, error_rate)
    best: tuple[int, int, int] | None = None
    for k in range(2, top + 2, 2) if paired else range(1, top + 1):
        per_slice_fp = target ** (1.0 / k)
        # -log1p(-x) keeps precision when p**(1/k) is close to 0.
        cells = max(floor, math.ceil(capacity / -math.log1p(-per_slice_fp)))
        cells = max(16, -(-cells // 16) * 16)
        if best is None or k * cells < best[2]:
            best = (k, cells, k * cells)
    assert best is not None
    return best[0], best[1]


def stage_error_rate(error_rate: float, tightening: float, stage: int) -> float:
    """Error rate of stage ``stage`` (0-based) in a scaling filter.

    Stage i gets p_i = error_rate * (1 - r) * r**i (Almeida et al., "Scalable
    Bloom Filters", 2007). The bound, for any number S of stages: a key is a
    false positive if some stage says yes, so by the union bound the
    compounded rate is at most sum_{i<S} p_i = error_rate * (1 - r**S) <
    error_rate; each p_i already includes that stage's double-hashing floor
    (plan_slices). A stage still filling is below its p_i, so the bound holds
    at every size, not only at stage boundaries."""
    return error_rate * (1.0 - tightening) * tightening**stage
