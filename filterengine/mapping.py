"""One consistent memory mapping of a filter file (its header, state, stage table
and the counters' views the lookups need), validated when it is made and swapped as
a whole when the file gains a stage or is replaced."""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time

import numpy as np

from . import fileformat as ff
from .errors import FilterFileError

__all__ = ["FileView", "Probe", "stage_probe"]

#: (first region, the other regions, cells per slice): what the scalar lookup
#: needs of one stage (see stage_probe).
Probe = tuple[memoryview, tuple[memoryview, ...], int]

_STATE_RETRIES = 20  # a reader may catch the writer between two stores
_NATIVE_Q, _LE_Q = struct.Struct("=Q"), struct.Struct("<Q")
#: Stands in for a header where there is no file (a closed filter).
_NO_HEADER = ff.Header(seed=0, capacity=1, error_rate=0.5, growth=2.0, tightening=0.5, generation=0)


class FileView:
    """A mapping of one file. Old views stay valid after a swap (files only grow,
    and a replaced file stays mapped), so a thread that is mid-answer keeps using
    the view it started with.

    ``FileView()`` is the placeholder of a closed filter: its layout never matches
    its word, so every lookup goes to the slow path, which refuses. ``FileView.map``
    makes a real one."""

    __slots__ = (
        "array",
        "buf",
        "fd",
        "header",
        "layout",
        "mm",
        "probes",
        "seed",
        "size",
        "stages",
        "state",
        "word",
    )

    def __init__(self) -> None:
        self.fd = -1
        self.mm: mmap.mmap | None = None
        self.size = 0
        self.buf = memoryview(b"")
        #: The layout word in native byte order: only ever compared with ``layout``.
        self.word = memoryview(bytes(8)).cast("Q")
        self.layout = -1
        self.header = _NO_HEADER
        self.seed = 0
        #: The state block as it was when the file was mapped.
        self.state = ff.State(layout=0, applied_seq=0, mem_seqnum=0, disk_seqnum=0, flags=0)
        self.stages: list[ff.StageEntry] = []
        self.array: np.ndarray = np.zeros(0, dtype=np.uint8)
        #: Per stage, newest first (it is the biggest and holds the most recent keys).
        self.probes: tuple[Probe, ...] = ()

    @property
    def closed(self) -> bool:
        return self.mm is None

    @classmethod
    def map(cls, fd: int, writable: bool, path: str) -> FileView:
        """Map ``fd`` and validate it. The view owns ``fd`` from here on: it is
        closed on failure and by release()."""
        view = cls()
        view.fd = fd
        try:
            view._load(writable, path)
        except BaseException:
            view.release()
            raise
        return view

    def _load(self, writable: bool, path: str) -> None:
        size = os.fstat(self.fd).st_size
        if size < ff.DATA_OFFSET:
            # Validate before mapping: mmap of an empty file would fail obscurely.
            raise FilterFileError(
                f"{path}: file size: expected at least {ff.DATA_OFFSET} bytes, found "
                f"{size} bytes (the file is truncated or not a filter file)"
            )
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        mm = self.mm = mmap.mmap(self.fd, size, access=access)
        self.size = size
        self.buf = memoryview(mm)
        self.header = ff.read_fixed(self.buf, size, path)
        self.seed = self.header.seed
        self.word = self.buf[ff.STATE_OFFSET : ff.STATE_OFFSET + 8].cast("Q")
        for attempt in range(_STATE_RETRIES):
            try:
                state = ff.read_state(self.buf, path)
                break
            except FilterFileError:
                if attempt == _STATE_RETRIES - 1:
                    raise
                time.sleep(0.0005)
        self.state = state
        # The layout the stages below were read under, in the word's byte order.
        self.layout = _NATIVE_Q.unpack(_LE_Q.pack(state.layout))[0]
        self.stages = ff.read_entries(self.buf, state.stage_count, self.header, size, path)
        self.array = np.frombuffer(mm, dtype=np.uint8)
        self.probes = tuple(stage_probe(s, self.buf) for s in reversed(self.stages))

    def release(self) -> None:
        """Unmap and close the file (idempotent)."""
        # Every view into the mapping must go before mm.close(), which
        # refuses (BufferError) while one is exported.
        for first, regions, _ in self.probes:
            for region in (first, *regions):
                region.release()
        self.probes = ()
        for view in (self.word, self.buf):
            with contextlib.suppress(BufferError, ValueError):
                view.release()
        self.array = np.zeros(0, dtype=np.uint8)
        if self.mm is not None:
            with contextlib.suppress(BufferError, ValueError):
                self.mm.close()
            self.mm = None
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        # A remapped-away view is dropped, not released, because another thread
        # may still be answering from it; the last reference closes it here.
        with contextlib.suppress(Exception):
            self.release()


def stage_probe(stage: ff.StageEntry, buf: memoryview) -> Probe:
    """What the scalar lookup needs of a stage, resolved once per mapping: a
    view of each region of ``cells`` bytes holding a pair of slices (layout:
    counters.py), the first apart, and cells per slice. Slices come in pairs
    (plan_slices(paired=True) plans an even k, and read_entries checks every
    stage against that plan), so a pair is one region read under the fixed
    masks 0x0F then 0xF0. Indexing a region's own view saves an addition per
    probe (about 15% of a lookup, measured)."""
    if stage.k & 1:
        raise AssertionError(
            f"stage of odd k={stage.k}: the file passed validation "
            "but plan_slices(paired=True) gives an even k"
        )
    cells = stage.cells
    regions = tuple(
        buf[stage.offset + j * cells : stage.offset + (j + 1) * cells] for j in range(stage.k >> 1)
    )
    return regions[0], regions[1:], cells
