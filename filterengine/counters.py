"""Packed 4-bit saturating counters: two per byte, the cells of counting filters.

Counter c lives in byte c >> 1, in the low nibble when c is even and the high
nibble when it is odd. A counter that reaches 15 is saturated: it is never
incremented past 15 (no wrap to 0, which would be a false negative) and never
decremented again (its true count is unknown, so a decrement could drop it to
0 while other keys still rely on it).

A counting filter stage is k slices of ``cells`` counters, slice i starting at
counter ``base + i * cells``. The functions here work on such a stage inside
any buffer: a numpy uint8 array for the batch paths (duplicate indices within
one batch are counted, not collapsed) and a bytearray/mmap for the scalar
paths (plain Python ints, no numpy scalars).
"""

from __future__ import annotations

import numpy as np

from .hashing import MASK64

__all__ = [
    "MAX_COUNT",
    "counter_value",
    "counter_values",
    "stage_add",
    "stage_contains",
    "stage_remove",
    "stage_counter_indices",
    "stage_contains_many",
    "stage_add_many",
    "stage_remove_check",
    "stage_remove_apply",
]

MAX_COUNT = 15
_U1 = np.uint64(1)


def counter_value(buf, c: int) -> int:
    """Value of counter ``c`` in a bytes-like buffer (scalar path)."""
    return (buf[c >> 1] >> ((c & 1) << 2)) & 15


def counter_values(array: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Values (uint8) of counters ``c`` (uint64 array) in a uint8 array."""
    return (array[c >> _U1] >> ((c & _U1) << np.uint64(2)).astype(np.uint8)) & np.uint8(15)


# -- scalar paths -------------------------------------------------------------
def stage_contains(buf, base: int, k: int, cells: int, h1: int, h2: int) -> bool:
    """Whether every one of the key's k counters in the stage is non-zero."""
    for i in range(k):
        c = base + ((h1 + i * h2) & MASK64) % cells
        if not (buf[c >> 1] >> ((c & 1) << 2)) & 15:
            return False
        base += cells
    return True


def stage_add(buf, base: int, k: int, cells: int, h1: int, h2: int) -> bool:
    """Increment the key's counters (saturating); True if any was zero before."""
    was_absent = False
    for i in range(k):
        c = base + ((h1 + i * h2) & MASK64) % cells
        b = c >> 1
        v = buf[b]
        if c & 1:
            if v < 0xF0:  # high nibble below 15
                if v < 0x10:
                    was_absent = True
                buf[b] = v + 0x10
        elif v & 15 != 15:
            if not v & 15:
                was_absent = True
            buf[b] = v + 1
        base += cells
    return was_absent


def stage_remove(buf, base: int, k: int, cells: int, h1: int, h2: int) -> bool:
    """Decrement the key's counters; False, with nothing changed, if any is 0.

    Saturated counters are left at 15 (see the module docstring)."""
    positions = []
    for i in range(k):
        c = base + ((h1 + i * h2) & MASK64) % cells
        v = (buf[c >> 1] >> ((c & 1) << 2)) & 15
        if not v:
            return False
        if v != 15:
            positions.append(c)
        base += cells
    for c in positions:
        buf[c >> 1] -= 0x10 if c & 1 else 1
    return True


# -- batch paths --------------------------------------------------------------
def stage_counter_indices(
    base: int, cells: int, i: int, h1: np.ndarray, h2: np.ndarray
) -> np.ndarray:
    """Global counter indices (uint64) of slice ``i`` for every hashed key."""
    with np.errstate(over="ignore"):
        g = h1 + np.uint64(i) * h2 if i else h1
    return g % np.uint64(cells) + np.uint64(base + i * cells)


def stage_contains_many(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> np.ndarray:
    """Bool per key: are all its k counters in the stage non-zero?

    Slices are probed two at a time, and only keys still possibly present go
    on: an absent key usually fails within the first pair, so the work is
    about 2n probes, not k*n, with few compactions."""
    n = len(h1)
    alive = None  # indices of keys still possibly present; None = all
    i = 0
    while i < k:
        hit = counter_values(array, stage_counter_indices(base, cells, i, h1, h2)) != 0
        if i + 1 < k:
            hit &= counter_values(array, stage_counter_indices(base, cells, i + 1, h1, h2)) != 0
        i += 2
        if hit.all():
            continue
        alive = np.flatnonzero(hit) if alive is None else alive[hit]
        if not len(alive):
            break
        h1, h2 = h1[hit], h2[hit]
    if alive is None:
        return np.ones(n, dtype=bool)
    result = np.zeros(n, dtype=bool)
    result[alive] = True
    return result


def _unique_counts(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct counter indices and how often each occurs in ``c``."""
    # Sorting a slice's indices (they fit in uint32 for slices under 4 G
    # counters, which sorts faster) is the cheapest way here to count
    # duplicates: np.add.at and bincount over a whole stage cost more.
    if len(c) and int(c.max()) < 2**32:
        c = c.astype(np.uint32)
    s = np.sort(c)
    if not len(s):
        return s.astype(np.uint64), np.zeros(0, dtype=np.int64)
    first = np.empty(len(s), dtype=bool)
    first[0] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, len(s)))
    return s[starts].astype(np.uint64), counts


def _store(array: np.ndarray, u: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` into the distinct counters ``u``.

    Low and high nibbles are written in two passes: within one pass every
    byte index is distinct, so no write to a byte loses another's nibble."""
    odd = (u & _U1).astype(bool)
    even = ~odd
    b = (u[even] >> _U1).astype(np.intp)
    array[b] = (array[b] & np.uint8(0xF0)) | values[even]
    b = (u[odd] >> _U1).astype(np.intp)
    array[b] = (array[b] & np.uint8(0x0F)) | (values[odd] << np.uint8(4))


def stage_add_many(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> None:
    """Increment every key's k counters, saturating at 15, duplicates counted."""
    if not len(h1):
        return
    if len(h1) * 8 < cells:
        # Few keys for the slice: count duplicates by sorting the touched counters.
        for i in range(k):
            u, counts = _unique_counts(stage_counter_indices(base, cells, i, h1, h2))
            old = counter_values(array, u)
            _store(array, u, np.minimum(old + counts, MAX_COUNT).astype(np.uint8))
        return
    # Many keys: count per counter with bincount and rewrite the whole slice,
    # O(keys + cells) of sequential work instead of a sort per slice.
    cells64 = np.uint64(cells)
    half = cells // 2
    with np.errstate(over="ignore"):
        g = h1.copy()
        for i in range(k):
            counts = np.bincount((g % cells64).astype(np.intp), minlength=cells)
            np.minimum(counts, MAX_COUNT, out=counts)
            counts = counts.astype(np.uint8)
            start = (base + i * cells) >> 1
            region = array[start:start + half]
            low = np.minimum((region & np.uint8(0x0F)) + counts[0::2], MAX_COUNT)
            high = np.minimum((region >> np.uint8(4)) + counts[1::2], MAX_COUNT)
            region[:] = low.astype(np.uint8) | (high.astype(np.uint8) << np.uint8(4))
            g += h2


def stage_remove_check(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Plan the removal of every key; change nothing.

    Returns (plan, short): ``plan`` holds per slice the distinct counters and
    their new values; ``short`` is a bool per key, True where the removal must
    be refused because one of its counters is 0 or would go below 0 counting
    the other removals of this batch. Saturated counters stay at 15."""
    plan = []
    short = np.zeros(len(h1), dtype=bool)
    for i in range(k):
        c = stage_counter_indices(base, cells, i, h1, h2)
        u, counts = _unique_counts(c)
        old = counter_values(array, u).astype(np.int64)
        saturated = old == MAX_COUNT
        lacking = ~saturated & (old < counts)
        if lacking.any():
            short |= np.isin(c, u[lacking])
        plan.append((u, np.where(saturated, MAX_COUNT, old - counts).astype(np.uint8)))
    return plan, short


def stage_remove_apply(array: np.ndarray, plan: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Apply a plan from stage_remove_check (only when nothing was short)."""
    for u, values in plan:
        _store(array, u, values)
