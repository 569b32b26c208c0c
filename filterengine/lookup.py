"""Answering from one checked view of a scaling filter file: the scalar lookup
(the per-redirect hot path) and the batch lookup. Both hash each key once and
probe the stages newest first (the newest is the biggest and holds the most
recent keys) from that one hash."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .hashing import (
    hash_pair,
    hash_pairs,
    hash_tuple,  # the scalar hot path calls mmh3 directly
)
from .mapping import FileView

__all__ = ["probe", "probe_many"]


def probe(view: FileView, key: str | bytes) -> bool:
    """The scalar lookup (contains, maybe_present)."""
    # hash_pair inlined: this is the per-redirect hot path.
    if type(key) is str:
        key = key.encode()
    elif type(key) is not bytes:
        hash_pair(key)  # raises the TypeError naming the type
    h1, h2 = hash_tuple(key, view.seed)
    # COUNTER_SCHEME positions (counters.py), one pair of slices per
    # region. The first pair is unrolled: most absent keys leave a stage
    # at its first probe, before h2 is even reduced. Measured (bench/
    # engine.py): a pair per loop turn with plain `% cells` beats a
    # (start, mask) tuple per slice; lazy map()/itemgetter pipelines and
    # generated per-stage functions were slower (method-wrapper and
    # function calls cost more than the bytecode they save).
    for first, regions, cells in view.probes:
        x = h1 % cells
        if not first[x] & 0x0F:
            continue
        step = h2 % cells
        x = (x + step) % cells
        if not first[x] & 0xF0:
            continue
        for region in regions:
            x = (x + step) % cells
            if not region[x] & 0x0F:
                break
            x = (x + step) % cells
            if not region[x] & 0xF0:
                break
        else:
            return True
    return False


def probe_many(view: FileView, keys: Iterable[str | bytes]) -> np.ndarray:
    """One bool per key, in order; keys found in a stage are not probed again."""
    h1, h2 = hash_pairs(keys, view.seed)
    result = np.zeros(len(h1), dtype=bool)
    todo = None  # indices of keys not found yet; None = all
    array = view.array
    for stage in reversed(view.stages):
        if todo is not None and not len(todo):
            break
        a1, a2 = (h1, h2) if todo is None else (h1[todo], h2[todo])
        hit = stage.contains_many(array, a1, a2)
        if todo is None:
            result |= hit
            todo = np.flatnonzero(~hit)
        else:
            result[todo[hit]] = True
            todo = todo[~hit]
    return result
