"""The crash-safety state of a scaling filter file (the dablooms sequence
numbers): when a file counts as clean, and what a writer does on its first look
at a file so that an interrupted one stays dirty until it is rebuilt."""

from __future__ import annotations

from . import fileformat as ff
from .mapping import FileView

__all__ = ["is_clean", "take_over"]


def is_clean(state: ff.State) -> bool:
    """No change interrupted (mem_seqnum non-zero, no torn mark) and everything
    flushed (disk_seqnum caught up)."""
    return (
        not state.flags & ff.FLAG_TORN
        and state.mem_seqnum != 0
        and state.disk_seqnum == state.mem_seqnum
    )


def take_over(view: FileView) -> tuple[ff.State, int]:
    """A writer's first look at the file it mapped: keep an interrupted file
    dirty, and publish the layout word the state slots count. Returns the state
    the writer keeps (and writes through) and its last sequence number."""
    state = view.state
    seq = max(state.mem_seqnum, state.disk_seqnum)
    if view.torn_slot or state.mem_seqnum == 0 or state.mem_seqnum != state.disk_seqnum:
        # The last writer died mid-change, before flushing or mid state write
        # (or the state rotted): its counters may be torn. Keep the file dirty
        # until it is rebuilt, however cleanly this writer finishes.
        state.flags |= ff.FLAG_TORN
        if state.mem_seqnum == 0:
            state.mem_seqnum = seq = seq + 1
        # The next seq's slot is the other one: a broken slot is rewritten here.
        ff.write_state(view.buf, state)
    word = ff.layout_word(view.buf)
    if word & ~ff.SUPERSEDED != state.stage_count:
        # Killed between publishing a stage in its slot and in the word.
        ff.write_layout_word(view.buf, (word & ff.SUPERSEDED) | state.stage_count)
        view.layout = view.word[0]
    return state, seq
