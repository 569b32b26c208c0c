"""How a scaling filter file grows: the writer appends a stage when the newest is
full, reserving its disk space first and publishing it to readers in the order
they rely on (entry, then state slot, then layout word). Growth never moves or
shrinks what readers map."""

from __future__ import annotations

import os

from . import fileformat as ff
from .errors import FilterFileError
from .mapping import FileView
from .space import reserve
from .stage import Stage

__all__ = ["append_stage", "newest_with_room", "reserve_for"]


def append_stage(view: FileView, header: ff.Header, state: ff.State, path: str) -> FileView:
    """Append a stage to the writer's file; return the view that maps it (``view``
    is released). ``state`` is the writer's own state, updated and written."""
    index = len(view.stages)
    if index >= header.max_stages:
        raise FilterFileError(
            f"{path}: stage count: expected at most {header.max_stages}, "
            "found the table full; rebuild with a larger capacity"
        )
    entry = ff.stage_plan(header, index, ff.next_offset(view.stages[-1].entry))
    # Order matters for readers: the stage's space is reserved (so writing its
    # counters can never fault on a full disk) and its entry written before the
    # state slot and then the layout word count it. A FilterSpaceError here
    # leaves the file as it was.
    size = os.fstat(view.fd).st_size
    reserve(view.fd, size, entry.end - size, path, f"new stage {index}")
    fresh = FileView.map(os.dup(view.fd), True, path)
    ff.pack_entry(fresh.buf, index, entry)
    state.stage_count = index + 1
    ff.write_state(fresh.buf, state)
    word = ff.layout_word(fresh.buf)
    ff.write_layout_word(fresh.buf, (word & ff.SUPERSEDED) | (index + 1))
    fresh.add_stage(Stage(index, entry))
    view.release()
    return fresh


def reserve_for(view: FileView, header: ff.Header, n: int, path: str) -> None:
    """Reserve the space of every stage that ``n`` more additions will open,
    before any counter moves: a full disk then refuses the whole batch with
    FilterSpaceError and the file stays as it was (and clean)."""
    newest = view.stages[-1]
    remaining = n - newest.room(view.buf)
    last = newest.entry
    opened = 0
    while remaining > 0 and newest.index + opened + 1 < header.max_stages:
        opened += 1
        last = ff.stage_plan(header, newest.index + opened, ff.next_offset(last))
        remaining -= last.capacity
    if opened:
        size = os.fstat(view.fd).st_size
        what = f"{opened} new stage(s) for {n} additions"
        reserve(view.fd, size, last.end - size, path, what)


def newest_with_room(
    view: FileView, header: ff.Header, state: ff.State, path: str
) -> tuple[FileView, Stage, int]:
    """(view, stage, room) of the stage that takes the next addition: the newest,
    or a new one appended when it is full."""
    stage = view.stages[-1]
    room = stage.room(view.buf)
    if room <= 0:
        view = append_stage(view, header, state, path)
        stage = view.stages[-1]
        room = stage.capacity
    return view, stage, room
