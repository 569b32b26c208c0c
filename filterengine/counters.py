"""Packed 4-bit saturating counters: two per byte, the cells of counting filters.

A counter that reaches 15 is saturated: it is never incremented past 15 (no
wrap to 0, which would be a false negative) and never decremented again (its
true count is unknown, so a decrement could drop it to 0 while other keys
still rely on it).

Layout of a stage of k slices of ``cells`` counters, starting at counter index
``base`` (always even: a byte boundary): slices are stored in pairs. Slice 2j
is the low nibbles and slice 2j+1 the high nibbles of the same ``cells``
bytes (region j); an odd k (possible here, never planned: plan_slices(paired=True)
gives even k) leaves the last region's high nibbles unused. Counter index c names byte
c >> 1, low nibble if c is even, high if odd, so position x of slice i is
counter ``base + 2*((i >> 1)*cells + x) + (i & 1)``. Pairing means a probe
reads byte ``region + x`` and tests a mask fixed per slice: no per-probe
nibble arithmetic on either path.

Indices follow hashing.COUNTER_SCHEME: slice i of a key is (h1 + i*h2) mod
cells, exactly; h1 and h2 are reduced mod cells once per stage and each next
slice costs one addition and a conditional subtraction.

The functions work on a stage inside any buffer: a numpy uint8 array for the
batch paths (duplicate indices within one batch are counted, not collapsed)
and a bytearray/memoryview for the scalar paths (plain Python ints only).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = [
    "MAX_COUNT",
    "SLICE_MASKS",
    "stage_bytes",
    "counter_value",
    "counter_values",
    "stage_counters",
    "stage_contains",
    "stage_add",
    "stage_remove",
    "stage_take",
    "restore_counters",
    "slice_positions",
    "stage_counter_indices",
    "stage_contains_many",
    "stage_add_many",
    "stage_remove_check",
    "stage_remove_apply",
    "slice_nonzero",
    "saturated_counters",
]

MAX_COUNT = 15
#: Mask of slice i's nibble: SLICE_MASKS[i & 1].
SLICE_MASKS = (0x0F, 0xF0)
_U1 = np.uint64(1)


def stage_bytes(k: int, cells: int) -> int:
    """Bytes taken by a stage of k slices of ``cells`` counters."""
    return (k + 1) // 2 * cells


def counter_value(buf: bytes | bytearray | memoryview, c: int) -> int:
    """Value of counter ``c`` in a bytes-like buffer (scalar path)."""
    return (buf[c >> 1] >> ((c & 1) << 2)) & 15


def counter_values(array: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Values (uint8) of counters ``c`` (uint64 array) in a uint8 array."""
    values: np.ndarray = (array[c >> _U1] >> ((c & _U1) << np.uint64(2)).astype(np.uint8)) & (
        np.uint8(15)
    )
    return values


# -- scalar paths -------------------------------------------------------------
def stage_counters(base: int, k: int, cells: int, h1: int, h2: int) -> list[int]:
    """The key's k counter indices in the stage."""
    x = h1 % cells
    step = h2 % cells
    out = []
    for i in range(k):
        out.append(base + 2 * ((i >> 1) * cells + x) + (i & 1))
        x += step
        if x >= cells:
            x -= cells
    return out


def stage_contains(
    buf: bytes | bytearray | memoryview, base: int, k: int, cells: int, h1: int, h2: int
) -> bool:
    """Whether every one of the key's k counters in the stage is non-zero."""
    region = base >> 1
    x = h1 % cells
    step = h2 % cells
    for i in range(k):
        if not buf[region + x] & SLICE_MASKS[i & 1]:
            return False
        if i & 1:
            region += cells
        x += step
        if x >= cells:
            x -= cells
    return True


def stage_add(buf: bytearray | memoryview, base: int, k: int, cells: int, h1: int, h2: int) -> bool:
    """Increment the key's counters (saturating); True if any was zero before."""
    was_absent = False
    for c in stage_counters(base, k, cells, h1, h2):
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
    return was_absent


def stage_take(
    buf: bytearray | memoryview, base: int, k: int, cells: int, h1: int, h2: int
) -> list[int] | None:
    """Decrement the key's counters and return the ones decremented (for
    restore_counters); None, with nothing changed, if any is 0.

    Saturated counters are left at 15 (see the module docstring)."""
    positions = []
    for c in stage_counters(base, k, cells, h1, h2):
        v = (buf[c >> 1] >> ((c & 1) << 2)) & 15
        if not v:
            return None
        if v != MAX_COUNT:
            positions.append(c)
    for c in positions:
        buf[c >> 1] -= 0x10 if c & 1 else 1
    return positions


def stage_remove(
    buf: bytearray | memoryview, base: int, k: int, cells: int, h1: int, h2: int
) -> bool:
    """Decrement the key's counters; False, with nothing changed, if any is 0."""
    return stage_take(buf, base, k, cells, h1, h2) is not None


def restore_counters(buf: bytearray | memoryview, counters: list[int]) -> None:
    """Undo stage_take: increment the counters it decremented (none was saturated)."""
    for c in counters:
        buf[c >> 1] += 0x10 if c & 1 else 1


# -- batch paths --------------------------------------------------------------
def slice_positions(cells: int, k: int, h1: np.ndarray, h2: np.ndarray) -> Iterator[np.ndarray]:
    """Per slice i = 0..k-1, every key's position within the slice (uint64 < cells).

    x_{i+1} = x_i + step - cells when that does not wrap below zero: as both
    are below cells <= 2**63 the sum cannot overflow, and the unsigned
    subtraction wraps to a huge value exactly when it must not be taken, so
    np.minimum picks the right one without a comparison or a modulo."""
    modulus = np.uint64(cells)
    x = h1 % modulus
    step = h2 % modulus
    for i in range(k):
        yield x
        if i + 1 < k:
            y = x + step
            x = np.minimum(y, y - modulus)


def _global(base: int, cells: int, i: int, x: np.ndarray) -> np.ndarray:
    """Counter indices of positions ``x`` in slice ``i`` of a stage at ``base``."""
    return (x << _U1) + np.uint64(base + 2 * (i >> 1) * cells + (i & 1))


def stage_counter_indices(
    base: int, cells: int, i: int, h1: np.ndarray, h2: np.ndarray
) -> np.ndarray:
    """Counter indices (uint64) of slice ``i`` for every hashed key."""
    for j, x in enumerate(slice_positions(cells, i + 1, h1, h2)):
        if j == i:
            return _global(base, cells, i, x)
    raise AssertionError("unreachable")


def stage_contains_many(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> np.ndarray:
    """Bool per key: are all its k counters in the stage non-zero?

    Slices are probed two at a time (the two nibbles of one region), and only
    keys still possibly present go on: an absent key usually fails within the
    first pair, so the work is about 2n probes, not k*n, with few compactions."""
    n = len(h1)
    modulus = np.uint64(cells)
    start = base >> 1
    alive = None  # indices of keys still possibly present; None = all
    x = h1 % modulus
    step = h2 % modulus
    low, high = np.uint8(0x0F), np.uint8(0xF0)
    for i in range(0, k, 2):
        region = array[start + (i >> 1) * cells : start + ((i >> 1) + 1) * cells]
        hit = (region[x.view(np.int64)] & low).astype(bool)
        y = x + step
        x = np.minimum(y, y - modulus)
        if i + 1 < k:
            hit &= (region[x.view(np.int64)] & high).astype(bool)
            y = x + step
            x = np.minimum(y, y - modulus)
        if hit.all():
            continue
        alive = np.flatnonzero(hit) if alive is None else alive[hit]
        if not len(alive):
            break
        x, step = x[hit], step[hit]
    if alive is None:
        return np.ones(n, dtype=bool)
    result = np.zeros(n, dtype=bool)
    result[alive] = True
    return result


def _unique_counts(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct counter indices and how often each occurs in ``c``."""
    # Sorting (in uint32 when the indices fit, which sorts faster) is the
    # cheapest way to count duplicates among few keys; many keys take the
    # dense bincount path of stage_add_many instead.
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
        for i, x in enumerate(slice_positions(cells, k, h1, h2)):
            u, counts = _unique_counts(_global(base, cells, i, x))
            old = counter_values(array, u)
            _store(array, u, np.minimum(old + counts, MAX_COUNT).astype(np.uint8))
        return
    # Many keys: count per counter with bincount and rewrite the slice's
    # nibbles whole: O(keys + cells) of sequential work, no sort.
    start = base >> 1
    top = np.uint8(MAX_COUNT)
    for i, x in enumerate(slice_positions(cells, k, h1, h2)):
        counts = np.bincount(x.view(np.int64), minlength=cells)
        np.minimum(counts, MAX_COUNT, out=counts)
        counts = counts.astype(np.uint8)
        region = array[start + (i >> 1) * cells : start + ((i >> 1) + 1) * cells]
        # uint8 throughout: 15 + 15 cannot overflow, and saturates at 15.
        if i & 1:
            high = np.minimum((region >> np.uint8(4)) + counts, top)
            region[:] = (region & np.uint8(0x0F)) | (high << np.uint8(4))
        else:
            low = np.minimum((region & np.uint8(0x0F)) + counts, top)
            region[:] = (region & np.uint8(0xF0)) | low


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
    for i, x in enumerate(slice_positions(cells, k, h1, h2)):
        c = _global(base, cells, i, x)
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


# -- measurements -------------------------------------------------------------
def _slice_nibbles(array: np.ndarray, base: int, cells: int, i: int) -> np.ndarray:
    start = (base >> 1) + (i >> 1) * cells
    region = array[start : start + cells]
    return region >> np.uint8(4) if i & 1 else region & np.uint8(0x0F)


def slice_nonzero(array: np.ndarray, base: int, k: int, cells: int) -> list[int]:
    """Non-zero counters per slice (reads the whole stage)."""
    return [int(np.count_nonzero(_slice_nibbles(array, base, cells, i))) for i in range(k)]


def saturated_counters(array: np.ndarray, base: int, k: int, cells: int) -> int:
    """Counters stuck at 15 in the stage (they can no longer be decremented)."""
    return sum(
        int(np.count_nonzero(_slice_nibbles(array, base, cells, i) == MAX_COUNT)) for i in range(k)
    )
