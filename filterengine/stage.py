"""One stage of a scaling filter file: a counting Bloom filter over a range of the
file's counters, with its count and id range in the stage table.

The middle layer of the dablooms design (bitmap -> counting filter -> scaling
filter): counters.py knows packed nibbles, this module knows where a stage's
counters are and what its table entry holds, and growth.py (additions) and
removal.py (removals) decide which stage a key goes to. Every method takes the
buffer it works on (the mapping's memoryview for the scalar paths, its numpy array
for the batch paths), because a remap replaces the buffers while the stage's
geometry stays the same.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import fileformat as ff
from .counters import (
    RemovalPlan,
    UndoLog,
    restore_counters,
    saturated_counters,
    slice_nonzero,
    stage_add,
    stage_add_many,
    stage_contains_many,
    stage_remove_apply,
    stage_remove_check,
    stage_remove_many,
    stage_take,
    undo_removal,
)

__all__ = ["Probe", "RemovalPlan", "Stage"]

#: (first region, the other regions, cells per slice): what the scalar lookup
#: needs of one stage (see Stage.probe).
Probe = tuple[memoryview, tuple[memoryview, ...], int]


class Stage:
    """Stage ``index`` of a file: geometry from its table entry (fixed once the
    stage exists) and the operations on its counters and its mutable entry."""

    __slots__ = ("_base", "_dynamic_at", "capacity", "cells", "entry", "index", "k")

    def __init__(self, index: int, entry: ff.StageEntry) -> None:
        self.index = index
        self.entry = entry
        self.capacity = entry.capacity
        self.k = entry.k
        self.cells = entry.cells
        # Counter index of the stage's first counter (two per byte).
        self._base = entry.offset * 2
        self._dynamic_at = ff.entry_offset(index) + ff.DYNAMIC_OFFSET

    @property
    def end(self) -> int:
        """Byte after the stage's last counter."""
        return self.entry.end

    # -- the table entry: keys held and the id range they came with ----------
    def dynamic(self, buf: ff.ReadableBuffer) -> tuple[int, int, int]:
        """(count, first id, last id) as the table holds them now."""
        return ff.DYNAMIC.unpack_from(buf, self._dynamic_at)

    def count(self, buf: ff.ReadableBuffer) -> int:
        count: int = ff.DYNAMIC.unpack_from(buf, self._dynamic_at)[0]
        return count

    def room(self, buf: ff.ReadableBuffer) -> int:
        """Additions the stage still takes before it is full."""
        return self.capacity - self.count(buf)

    def holds_id(self, buf: ff.ReadableBuffer, id: int) -> bool:
        _, first, last = self.dynamic(buf)
        return first <= id <= last

    def took(self, buf: ff.WritableBuffer, n: int, low: int, high: int) -> None:
        """Record ``n`` additions with ids from ``low`` to ``high``."""
        count, first, last = self.dynamic(buf)
        ff.DYNAMIC.pack_into(buf, self._dynamic_at, count + n, min(first, low), max(last, high))

    def gave(self, buf: ff.WritableBuffer, n: int) -> None:
        """Record ``n`` removals (a negative ``n`` undoes them). The id range stays:
        it routes later removals of keys added more than once."""
        count, first, last = self.dynamic(buf)
        ff.DYNAMIC.pack_into(buf, self._dynamic_at, count - n, first, last)

    # -- scalar paths ------------------------------------------------------------
    def probe(self, buf: memoryview) -> Probe:
        """What the scalar lookup needs of the stage, resolved once per mapping: a
        view of each region of ``cells`` bytes holding a pair of slices (layout:
        counters.py), the first apart, and cells per slice. Slices come in pairs
        (plan_slices(paired=True) plans an even k, and read_entries checks every
        stage against that plan), so a pair is one region read under the fixed
        masks 0x0F then 0xF0. Indexing a region's own view saves an addition per
        probe (about 15% of a lookup, measured)."""
        if self.k & 1:
            raise AssertionError(
                f"stage of odd k={self.k}: the file passed validation "
                "but plan_slices(paired=True) gives an even k"
            )
        cells, offset = self.cells, self.entry.offset
        regions = tuple(
            buf[offset + j * cells : offset + (j + 1) * cells] for j in range(self.k >> 1)
        )
        return regions[0], regions[1:], cells

    def add(self, buf: memoryview, h1: int, h2: int) -> None:
        stage_add(buf, self._base, self.k, self.cells, h1, h2)

    def take(self, buf: memoryview, h1: int, h2: int) -> list[int] | None:
        """Remove one occurrence of a hashed key: the counters decremented (for
        ``put_back``), or None, with nothing changed, if the stage lacks the key."""
        return stage_take(buf, self._base, self.k, self.cells, h1, h2)

    @staticmethod
    def put_back(buf: memoryview, moved: list[int]) -> None:
        """Undo ``take``."""
        restore_counters(buf, moved)

    # -- batch paths -------------------------------------------------------------
    def contains_many(self, array: np.ndarray, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        return stage_contains_many(array, self._base, self.k, self.cells, h1, h2)

    def add_many(self, array: np.ndarray, h1: np.ndarray, h2: np.ndarray) -> None:
        stage_add_many(array, self._base, self.k, self.cells, h1, h2)

    def plan_removal(
        self, array: np.ndarray, h1: np.ndarray, h2: np.ndarray
    ) -> tuple[RemovalPlan, np.ndarray]:
        """(plan, short): see counters.stage_remove_check. Changes nothing."""
        return stage_remove_check(array, self._base, self.k, self.cells, h1, h2)

    @staticmethod
    def apply_removal(array: np.ndarray, plan: RemovalPlan) -> None:
        stage_remove_apply(array, plan)

    def remove_many(self, array: np.ndarray, h1: np.ndarray, h2: np.ndarray) -> UndoLog | None:
        """Take one occurrence of every key out of the counters, all or none
        (see counters.stage_remove_many); the log undoes it. The table entry's
        count is the caller's to update."""
        return stage_remove_many(array, self._base, self.k, self.cells, h1, h2)

    @staticmethod
    def undo_removal(array: np.ndarray, log: UndoLog) -> None:
        undo_removal(array, log)

    # -- measurements -------------------------------------------------------------
    def info(self, buf: ff.ReadableBuffer, array: np.ndarray) -> dict[str, Any]:
        """The stage's figures for ScalingCountingBloomFilter.info() (reads every
        counter of the stage)."""
        count, first, last = self.dynamic(buf)
        nonzero = slice_nonzero(array, self._base, self.k, self.cells)
        return {
            "index": self.index,
            "first_id": first if first != ff.NO_ID_FIRST else None,
            "last_id": last if last != ff.NO_ID_LAST else None,
            "count": count,
            "capacity": self.capacity,
            "k": self.k,
            "cells_per_slice": self.cells,
            "bytes": self.entry.nbytes,
            "error_rate": self.entry.error_rate,
            "fill": sum(nonzero) / (self.k * self.cells),
            "estimated_fpr": math.prod(x / self.cells for x in nonzero),
            "saturated": saturated_counters(array, self._base, self.k, self.cells),
        }

    def __repr__(self) -> str:
        return (
            f"<Stage {self.index} capacity={self.capacity} k={self.k} cells={self.cells} "
            f"at {self.entry.offset}>"
        )
