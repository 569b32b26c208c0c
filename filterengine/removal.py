"""Which stage gives up a removed key, for one key and for a batch.

A removal goes to a stage whose recorded id range holds the key's id and which
holds the key (the dablooms rule), newest first. Only if none of them holds it
are the other stages tried: that happens when the same key was added more than
once with different ids and an earlier removal took the occurrence filed under
this id. A batch is all or nothing: what it took is put back when a key has no
stage to give it up."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .counters import UndoLog
from .errors import removal_refused
from .mapping import FileView
from .stage import Stage

__all__ = ["Taken", "remove_batch", "take_each", "take_one", "undo"]

#: (stage index, counters decremented) of one removal, so a batch can be undone.
Taken = tuple[int, list[int]]


def take_one(view: FileView, h1: int, h2: int, id: int) -> Taken | None:
    """Take one occurrence of a hashed key out of the stage that gives it up;
    None, with nothing changed, if no stage holds it."""
    buf = view.buf
    ranged: list[Stage] = []
    others: list[Stage] = []
    for stage in reversed(view.stages):
        (ranged if stage.holds_id(buf, id) else others).append(stage)
    for stage in ranged + others:
        moved = stage.take(buf, h1, h2)
        if moved is not None:
            stage.gave(buf, 1)
            return stage.index, moved
    return None


def undo(view: FileView, done: list[Taken]) -> None:
    """Put back what take_one took, newest first."""
    buf = view.buf
    for index, moved in reversed(done):
        stage = view.stages[index]
        stage.put_back(buf, moved)
        stage.gave(buf, -1)


def remove_batch(view: FileView, h1: np.ndarray, h2: np.ndarray, ids: np.ndarray) -> bool:
    """Remove every key from the stage that owns it, vectorised, all or nothing.
    False, with every counter as it was, when some key has no stage by id range
    that holds it, or a stage holds a key fewer times than the batch removes it
    (then the caller goes key by key: take_each)."""
    buf, array = view.buf, view.array
    owner = np.full(len(h1), -1, dtype=np.int64)
    ranges = [(stage, *stage.dynamic(buf)[1:]) for stage in reversed(view.stages)]
    inside = [(ids >= first) & (ids <= last) for _, first, last in ranges]
    if (np.sum(inside, axis=0, dtype=np.int16) == 1).all():
        # One stage by id range for every key (ids that never repeat or go
        # backwards): that stage is the owner, and asking it first whether it
        # holds the key is unnecessary. A key it lacks has a zero counter, so
        # its removal below is refused and the exact path decides.
        for (stage, _, _), mask in zip(ranges, inside, strict=True):
            owner[mask] = stage.index
    else:
        for (stage, _, _), mask in zip(ranges, inside, strict=True):
            todo = np.flatnonzero((owner < 0) & mask)
            if len(todo):
                hit = stage.contains_many(array, h1[todo], h2[todo])
                owner[todo[hit]] = stage.index
    if (owner < 0).any():
        return False
    done: list[tuple[Stage, UndoLog, int]] = []
    for index in np.unique(owner).tolist():
        stage = view.stages[index]
        rows = np.flatnonzero(owner == index)
        log = stage.remove_many(array, h1[rows], h2[rows])
        if log is None:
            for earlier, earlier_log, _ in reversed(done):
                earlier.undo_removal(array, earlier_log)
            return False
        done.append((stage, log, len(rows)))
    for stage, _, removed in done:
        stage.gave(buf, removed)
    return True


def take_each(
    view: FileView, keys: Sequence[str | bytes], h1: np.ndarray, h2: np.ndarray, ids: np.ndarray
) -> None:
    """A batch removal key by key, when remove_batch cannot place every removal (a
    key with no stage by id range, or removed more often in the batch than one
    stage holds it): KeyError, with every removal of the batch undone, if one fails."""
    done: list[Taken] = []
    for position, (a, b, id_) in enumerate(
        zip(h1.tolist(), h2.tolist(), ids.tolist(), strict=True)
    ):
        taken = take_one(view, a, b, id_)
        if taken is None:
            undo(view, done)
            raise removal_refused(
                [keys[position]], "not present (or removed more often than added)"
            )
        done.append(taken)
