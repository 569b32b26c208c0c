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
    "stage_remove_many",
    "undo_removal",
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

    Only keys still possibly present go on to the next slice: an absent key
    usually fails within the first two, so the work is about 2n probes, not
    k*n. The first slice needs only h1, so h2 is reduced only for the keys that
    pass it (half of the absent ones in a full stage)."""
    n = len(h1)
    modulus = np.uint64(cells)
    start = base >> 1
    masks = (np.uint8(0x0F), np.uint8(0xF0))
    x = h1 % modulus
    hit = array[start : start + cells][x.view(np.int64)] & masks[0] != 0
    alive = None  # indices of keys still possibly present; None = all
    if hit.all():
        step = h2 % modulus
    else:
        alive = np.flatnonzero(hit)
        x, step = x[alive], h2[alive] % modulus
    for i in range(1, k):
        if alive is not None and not len(alive):
            break
        y = x + step
        x = np.minimum(y, y - modulus)
        region = array[start + (i >> 1) * cells : start + ((i >> 1) + 1) * cells]
        hit = region[x.view(np.int64)] & masks[i & 1] != 0
        if hit.all():
            continue
        alive = np.flatnonzero(hit) if alive is None else alive[hit]
        x, step = x[hit], step[hit]
    if alive is None:
        return np.ones(n, dtype=bool)
    result = np.zeros(n, dtype=bool)
    result[alive] = True
    return result


def stage_add_many(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> None:
    """Increment every key's k counters, saturating at 15, duplicates counted."""
    n = len(h1)
    if not n:
        return
    if n * 2 > cells:
        _add_dense(array, base, k, cells, h1, h2)
        return
    # Per slice: gather the touched bytes, add one (unless saturated) and scatter
    # them back. A position that occurs more than once in the batch would lose
    # all but one increment that way, so each slice first marks the keys whose
    # position another key of the batch also took (a scatter of key numbers
    # into a scratch array, read back: O(keys), no sort); they are few, and
    # counted exactly afterwards by _add_counted. Key numbers are 16-bit, in
    # parts of at most _PART keys: half the scratch array's cache footprint
    # of 32-bit ones, ~20% faster (measured).
    scratch = np.empty(cells, dtype=np.uint16)
    for at in range(0, n, _PART):
        _add_part(array, base >> 1, k, cells, h1[at : at + _PART], h2[at : at + _PART], scratch)


#: Keys numbered in one uint16 scratch array (stage_add_many, stage_remove_many).
_PART = 65_535


def _add_part(
    array: np.ndarray,
    start: int,
    k: int,
    cells: int,
    h1: np.ndarray,
    h2: np.ndarray,
    scratch: np.ndarray,
) -> None:
    n = len(h1)
    order = np.arange(n, dtype=np.uint16)
    for i, x in enumerate(slice_positions(cells, k, h1, h2)):
        xi = x.view(np.int64)
        region = array[start + (i >> 1) * cells : start + ((i >> 1) + 1) * cells]
        scratch[xi] = order
        sole = scratch[xi] == order
        # Every key adds one: the keys of a repeated position all read and write
        # the same byte value, so the scatter is consistent, and _add_counted
        # then adds what the repeats add beyond it.
        v = region[xi]
        if i & 1:
            region[xi] = v + ((v < np.uint8(0xF0)).view(np.uint8) << np.uint8(4))
        else:
            region[xi] = v + ((v & np.uint8(0x0F)) != np.uint8(0x0F)).view(np.uint8)
        if not sole.all():
            _add_counted(region, i & 1, xi[~sole])


def _add_counted(region: np.ndarray, high: int, x: np.ndarray) -> None:
    """Add to the nibbles at positions ``x`` of one slice how often each occurs."""
    u, counts = np.unique(x, return_counts=True)
    v = region[u]
    old = v >> np.uint8(4) if high else v & np.uint8(0x0F)
    new = np.minimum(old.astype(np.int64) + counts, MAX_COUNT).astype(np.uint8)
    if high:
        region[u] = (v & np.uint8(0x0F)) | (new << np.uint8(4))
    else:
        region[u] = (v & np.uint8(0xF0)) | new


def _add_dense(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> None:
    """stage_add_many for batches of the slice's order of size: count per counter
    with bincount and rewrite the slice's nibbles whole, O(keys + cells) of
    sequential work."""
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


#: Per slice: the bytes holding its distinct touched counters, which nibble (0
#: low, 1 high), and the counters' new values.
RemovalPlan = list[tuple[np.ndarray, int, np.ndarray]]


def stage_remove_check(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> tuple[RemovalPlan, np.ndarray]:
    """Plan the removal of every key; change nothing.

    Returns (plan, short): ``plan`` holds per slice the distinct counters and
    their new values; ``short`` is a bool per key, True where the removal must
    be refused because one of its counters is 0 or would go below 0 counting
    the other removals of this batch. Saturated counters stay at 15.

    Per slice, the positions are told apart as stage_add_many does: one entry
    per distinct position (the one whose key number a scatter into a scratch
    array kept) is planned at one removal, and the few positions that occur
    more than once are planned again, after it, at their full count."""
    n = len(h1)
    plan: RemovalPlan = []
    short = np.zeros(n, dtype=bool)
    if not n:
        return plan, short
    start = base >> 1
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    scratch = np.empty(cells, dtype=order.dtype)
    for i, x in enumerate(slice_positions(cells, k, h1, h2)):
        xi = x.view(np.int64)
        scratch[xi] = order
        sole = scratch[xi] == order
        every = sole.all()
        first = xi if every else xi[sole]
        offset = start + (i >> 1) * cells
        b = offset + first
        _, values, lacking = _planned(array, b, i & 1, 1)
        if lacking.any():
            short[order[sole][lacking] if not every else lacking] = True
        plan.append((b, i & 1, values))
        if not every:
            u, counts = np.unique(xi[~sole], return_counts=True)
            b = offset + u
            _, values, lacking = _planned(array, b, i & 1, counts + 1)
            if lacking.any():
                short |= np.isin(xi, u[lacking])
            plan.append((b, i & 1, values))
    return plan, short


def _planned(
    array: np.ndarray, b: np.ndarray, high: int, times: int | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the bytes' values now, new nibble values, lacking) for taking ``times``
    from the nibbles in bytes ``b``."""
    v = array[b]
    old = v >> np.uint8(4) if high else v & np.uint8(0x0F)
    saturated = old == np.uint8(MAX_COUNT)
    if isinstance(times, int):
        lacking = ~saturated & (old < np.uint8(times))
        values = np.where(saturated, old, old - np.uint8(times))
    else:
        lacking = ~saturated & (old < times)
        values = np.where(saturated, MAX_COUNT, old.astype(np.int64) - times)
    return v, values.astype(np.uint8), lacking


def stage_remove_apply(array: np.ndarray, plan: RemovalPlan) -> None:
    """Apply a plan from stage_remove_check (only when nothing was short).

    Entries are written one after the other: within one, every byte is
    distinct, and the other nibble of each byte is read back as it is now."""
    for b, high, values in plan:
        v = array[b]
        if high:
            array[b] = (v & np.uint8(0x0F)) | (values << np.uint8(4))
        else:
            array[b] = (v & np.uint8(0xF0)) | values


#: Bytes a removal wrote and what they held before, in order (for undo_removal).
UndoLog = list[tuple[np.ndarray, np.ndarray]]


def stage_remove_many(
    array: np.ndarray, base: int, k: int, cells: int, h1: np.ndarray, h2: np.ndarray
) -> UndoLog | None:
    """Remove every key at once if none is short (as stage_remove_check judges);
    return what undoes it. None, with every counter as it was, if one is.

    One pass: each slice is taken as it is planned, and undone if a later one
    comes out short, so no byte is read twice (stage_remove_check plus
    stage_remove_apply read each twice; refusals are the rare case)."""
    log: UndoLog = []
    scratch = np.empty(cells, dtype=np.uint16)
    for at in range(0, len(h1), _PART):
        # Parts in turn: each takes from the counters as the parts before left them.
        part = slice(at, at + _PART)
        if not _remove_part(array, base >> 1, k, cells, h1[part], h2[part], scratch, log):
            undo_removal(array, log)
            return None
    return log


def _remove_part(
    array: np.ndarray,
    start: int,
    k: int,
    cells: int,
    h1: np.ndarray,
    h2: np.ndarray,
    scratch: np.ndarray,
    log: UndoLog,
) -> bool:
    order = np.arange(len(h1), dtype=np.uint16)
    for i, x in enumerate(slice_positions(cells, k, h1, h2)):
        xi = x.view(np.int64)
        scratch[xi] = order
        sole = scratch[xi] == order
        offset = start + (i >> 1) * cells
        # Every key takes one (the keys of a repeated position write the same
        # byte value: a consistent scatter), the repeats then the rest.
        if not _take(array, offset + xi, i & 1, 1, log) or (
            not sole.all() and not _take_repeated(array, offset, xi[~sole], i & 1, log)
        ):
            return False
    return True


def _take_repeated(
    array: np.ndarray, offset: int, extra: np.ndarray, high: int, log: UndoLog
) -> bool:
    u, counts = np.unique(extra, return_counts=True)
    return _take(array, offset + u, high, counts, log)


def _take(
    array: np.ndarray, b: np.ndarray, high: int, times: int | np.ndarray, log: UndoLog
) -> bool:
    """Take ``times`` from the nibbles in distinct bytes ``b`` unless one lacks it
    (saturated ones stay at 15); log the bytes written. False, writing nothing,
    if one lacks it."""
    v, values, lacking = _planned(array, b, high, times)
    if lacking.any():
        return False
    log.append((b, v))
    if high:
        array[b] = (v & np.uint8(0x0F)) | (values << np.uint8(4))
    else:
        array[b] = (v & np.uint8(0xF0)) | values
    return True


def undo_removal(array: np.ndarray, log: UndoLog) -> None:
    """Put back what stage_remove_many wrote, newest first."""
    for b, v in reversed(log):
        array[b] = v
    log.clear()


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
