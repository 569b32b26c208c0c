"""The on-disk layout of a ScalingCountingBloomFilter file, and its validation.

Everything is little-endian and 8-byte aligned::

    0     fixed header, 128 bytes, never rewritten after the file is made
          magic "FESCBF\\0\\1" | version u16 | header size u16 | hash scheme u32
          | seed u32 | max stages u32 | capacity u64 | error rate f64 | growth f64
          | tightening f64 | generation u64 | stage table offset u64
          | data offset u64 | (zeros) | crc32 of bytes 0..119 u32 | (zero) u32
    128   layout word u64: stage count, bit 63 = superseded by a rebuild
          | (zeros to 192)
    192   state slot 0, 64 bytes, and at 256 state slot 1, rewritten by the writer
          slot seq u64 | stage count u64 | applied_seq u64 | mem_seqnum u64
          | disk_seqnum u64 | flags u64 | (zero) u64 | crc32 of those 56 bytes u32
          | (zero) u32
    320   stage table: MAX_STAGES entries of 80 bytes
          capacity u64 | k u64 | cells per slice u64 | data offset u64
          | error rate f64 | crc32 of those 40 bytes u32 | (zero) u32
          | count u64 | first id i64 | last id i64 | (zero) u64
    data  each stage's packed 4-bit counters (k slices of ``cells``, paired in
          the two nibbles of ceil(k/2) regions of ``cells`` bytes: counters.py),
          starting on a page boundary; stages follow each other, newest last.

Room for the whole stage table is reserved up front, so adding a stage only
appends to the file and never moves data that readers map. The first/last id
of a stage are the smallest and largest id it ever took (ids may repeat or go
backwards); they route removals.

State slots (the LMDB/SQLite meta-page technique): the writer never rewrites
the state a reader may be using. Each update goes to the other slot with the
next slot seq, body first and checksum last; a reader takes the valid slot with
the higher seq. A writer killed between any two stores (or within one) leaves
that slot invalid and the previous state intact. The state written before a
change's end is the one that opened it (mem_seqnum 0), so falling back to it
reads as "interrupted": the file is dirty, never silently older. A writer that
opens a file with one invalid slot marks it dirty too (torn write or bit rot).

Layout word: the one word a reader checks before each answer. It is a single
aligned 8-byte store, published after the slot that counts the new stage (so
its stage count is the slot's, or one less after a kill between the two).
Superseded bit: before a rebuild ``os.replace``s a new file over this one it
sets bit 63 of the layout word of the file it replaces. Every reader maps that
old file and checks that one word before each answer, so it notices the
replacement without a ``stat()`` per lookup, and reopens the path.

Validation on open is O(stages), never O(counters): magic, version, checksums,
parameter ranges, and every stage's geometry and extent against the file size.
Each failure raises FilterFileError naming the path, the field, the expected
and the found value.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

from .counters import stage_bytes
from .errors import FilterFileError
from .hashing import COUNTER_SCHEME, plan_slices, stage_error_rate

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_STAGES",
    "PAGE",
    "FIXED_SIZE",
    "TABLE_OFFSET",
    "ENTRY_SIZE",
    "DATA_OFFSET",
    "LAYOUT_OFFSET",
    "SLOT_OFFSETS",
    "SUPERSEDED",
    "FLAG_TORN",
    "Header",
    "StageEntry",
    "State",
    "stage_plan",
    "pack_fixed",
    "read_fixed",
    "init_state",
    "write_state",
    "read_state",
    "read_states",
    "layout_word",
    "write_layout_word",
    "check_layout_word",
    "pack_entry",
    "read_entries",
    "entry_offset",
    "next_offset",
    "file_size",
    "check_parameters",
    "make_header",
    "DYNAMIC",
    "NO_ID_FIRST",
    "NO_ID_LAST",
]

MAGIC = b"FESCBF\x00\x01"
#: 3: two alternating state slots (a torn state write cannot break a file).
#: 2: stages planned with the double-hashing floor and even k (hashing.plan_slices).
#: Other versions are refused by version, with the way out: rebuild the file.
VERSION = 3
MAX_STAGES = 128
PAGE = 4096

_FIXED = struct.Struct("<8sHHIII QdddQQQ 40x")  # 120 bytes, crc follows
FIXED_SIZE = 128
#: Where _FIXED keeps the generation (8-byte aligned: readers compare it in place).
GENERATION_OFFSET = 56
LAYOUT_OFFSET = 128
SLOT_OFFSETS = (192, 256)
SLOT_SIZE = 64
_SLOT = struct.Struct("<QQQQQQQ")  # 56 bytes, crc follows
TABLE_OFFSET = 320
ENTRY_SIZE = 80
_ENTRY_STATIC = struct.Struct("<QQQQd")  # 40 bytes, crc follows
DYNAMIC = struct.Struct("<Qqq")  # count, first id, last id at entry + 48
DYNAMIC_OFFSET = 48
DATA_OFFSET = -(-(TABLE_OFFSET + MAX_STAGES * ENTRY_SIZE) // PAGE) * PAGE
_CRC = struct.Struct("<I")
_LAYOUT = struct.Struct("<Q")

#: What the packers write into and the readers read from: a file's bytes or mapping.
WritableBuffer = bytearray | memoryview
ReadableBuffer = bytes | bytearray | memoryview

SUPERSEDED = 1 << 63
FLAG_TORN = 1  # a writer found the file mid-change: dirty until rebuilt
NO_ID_FIRST = (1 << 63) - 1  # first id of a stage that took nothing yet
NO_ID_LAST = -(1 << 63)

#: Limits that keep a corrupt-but-checksummed header from asking for absurd
#: geometry (and the stage table from running out before 2**63 keys).
MIN_GROWTH, MAX_GROWTH = 1.25, 16.0
MIN_TIGHTENING, MAX_TIGHTENING = 0.1, 0.95


@dataclass(frozen=True, slots=True)
class Header:
    """The fixed header: the file's identity and parameters."""

    seed: int
    capacity: int
    error_rate: float
    growth: float
    tightening: float
    generation: int
    max_stages: int = MAX_STAGES


@dataclass(slots=True)
class State:
    """The writer-maintained state (one slot's content)."""

    stage_count: int
    applied_seq: int
    mem_seqnum: int
    disk_seqnum: int
    flags: int
    #: Slot sequence: which of the two slots is newer (write_state advances it).
    seq: int = 0


@dataclass(frozen=True, slots=True)
class StageEntry:
    """A stage's fixed geometry (its counts and ids live beside it, mutable)."""

    capacity: int
    k: int
    cells: int
    offset: int
    error_rate: float

    @property
    def nbytes(self) -> int:
        return stage_bytes(self.k, self.cells)

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def check_parameters(
    capacity: object, error_rate: object, growth: object, tightening: object
) -> None:
    """ValueError/TypeError naming the bad parameter (shared by create and open)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity <= 0:
        raise ValueError(f"capacity must be a positive number of keys, got {capacity}")
    for name, value, low, high in (
        ("growth", growth, MIN_GROWTH, MAX_GROWTH),
        ("tightening", tightening, MIN_TIGHTENING, MAX_TIGHTENING),
    ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a float, not {type(value).__name__}")
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    if isinstance(error_rate, bool) or not isinstance(error_rate, int | float):
        raise TypeError(f"error_rate must be a float, not {type(error_rate).__name__}")
    if not 0.0 < error_rate < 1.0 or math.isnan(error_rate):
        raise ValueError(f"error_rate must be strictly between 0 and 1, got {error_rate}")


def make_header(
    capacity: int,
    error_rate: float,
    growth: float,
    tightening: float,
    *,
    seed: int,
    generation: int,
) -> Header:
    """A new file's header from the caller's parameters (checked)."""
    check_parameters(capacity, error_rate, growth, tightening)
    return Header(
        seed=seed,
        capacity=capacity,
        error_rate=float(error_rate),
        growth=float(growth),
        tightening=float(tightening),
        generation=generation,
    )


def stage_plan(header: Header, index: int, offset: int) -> StageEntry:
    """Geometry of stage ``index`` (0-based) placed at byte ``offset``.

    Stage i holds ceil(capacity * growth**i) keys at error rate
    error_rate * (1 - tightening) * tightening**i, so the rates of all stages
    sum to at most error_rate (hashing.stage_error_rate)."""
    capacity = math.ceil(header.capacity * header.growth**index)
    rate = stage_error_rate(header.error_rate, header.tightening, index)
    k, cells = plan_slices(capacity, rate, paired=True)
    return StageEntry(capacity=capacity, k=k, cells=cells, offset=offset, error_rate=rate)


def file_size(header: Header, keys: int) -> int:
    """Bytes of a file whose stages, from the first, hold ``keys`` keys (at least
    the first stage; at most the stage table's worth)."""
    offset, held = DATA_OFFSET, 0
    for index in range(header.max_stages):
        stage = stage_plan(header, index, offset)
        held += stage.capacity
        if held >= keys:
            break
        offset = next_offset(stage)
    return stage.end


def next_offset(entry: StageEntry) -> int:
    """Where the stage after ``entry`` starts: the next page boundary."""
    return -(-entry.end // PAGE) * PAGE


def entry_offset(index: int) -> int:
    return TABLE_OFFSET + index * ENTRY_SIZE


# -- packing -------------------------------------------------------------------
def pack_fixed(h: Header) -> bytes:
    body = _FIXED.pack(
        MAGIC,
        VERSION,
        FIXED_SIZE,
        COUNTER_SCHEME,
        h.seed,
        h.max_stages,
        h.capacity,
        h.error_rate,
        h.growth,
        h.tightening,
        h.generation,
        TABLE_OFFSET,
        DATA_OFFSET,
    )
    return body + _CRC.pack(zlib.crc32(body)) + bytes(4)


def _put(buf: WritableBuffer, offset: int, data: bytes) -> None:
    """Every store of the state and the layout word goes through here, one call
    per store, so a test can stop a writer between (or within) any two."""
    buf[offset : offset + len(data)] = data


def _slot_bytes(s: State) -> tuple[bytes, bytes]:
    body = _SLOT.pack(s.seq, s.stage_count, s.applied_seq, s.mem_seqnum, s.disk_seqnum, s.flags, 0)
    return body, _CRC.pack(zlib.crc32(body)) + bytes(4)


def write_state(buf: WritableBuffer, s: State) -> None:
    """Advance ``s.seq`` and write ``s`` into the slot readers are not using: the
    body, then its checksum (which makes the slot the newest valid one)."""
    s.seq += 1
    at = SLOT_OFFSETS[s.seq & 1]
    body, crc = _slot_bytes(s)
    _put(buf, at, body)
    _put(buf, at + _SLOT.size, crc)


def init_state(buf: WritableBuffer, s: State) -> None:
    """A new file's state: both slots valid (seq 0 and 1) and the layout word."""
    for seq in (0, 1):
        s.seq = seq
        body, crc = _slot_bytes(s)
        buf[SLOT_OFFSETS[seq] : SLOT_OFFSETS[seq] + SLOT_SIZE] = body + crc
    buf[LAYOUT_OFFSET : LAYOUT_OFFSET + 8] = _LAYOUT.pack(s.stage_count)


def write_layout_word(buf: WritableBuffer, word: int) -> None:
    """Publish the layout word (one aligned 8-byte store)."""
    _put(buf, LAYOUT_OFFSET, _LAYOUT.pack(word))


def layout_word(buf: ReadableBuffer) -> int:
    """The layout word (little-endian, as stored)."""
    word: int = _LAYOUT.unpack_from(buf, LAYOUT_OFFSET)[0]
    return word


def pack_entry(buf: WritableBuffer, index: int, e: StageEntry) -> None:
    """Write stage ``index``'s geometry (with checksum) and empty counts."""
    at = entry_offset(index)
    static = _ENTRY_STATIC.pack(e.capacity, e.k, e.cells, e.offset, e.error_rate)
    buf[at : at + 48] = static + _CRC.pack(zlib.crc32(static)) + bytes(4)
    DYNAMIC.pack_into(buf, at + DYNAMIC_OFFSET, 0, NO_ID_FIRST, NO_ID_LAST)


# -- reading and validation ----------------------------------------------------
def _bad(path: str, field: str, expected: object, found: object, hint: str = "") -> FilterFileError:
    msg = f"{path}: {field}: expected {expected}, found {found}"
    return FilterFileError(msg + (f" ({hint})" if hint else ""))


def read_fixed(buf: ReadableBuffer, size: int, path: str) -> Header:
    """Validate and decode the fixed header. ``size`` is the file length."""
    if size < DATA_OFFSET:
        raise _bad(
            path,
            "file size",
            f"at least {DATA_OFFSET} bytes",
            f"{size} bytes",
            "the file is truncated or not a filter file",
        )
    magic = bytes(buf[0:8])
    if magic != MAGIC:
        raise _bad(
            path, "magic", repr(MAGIC), repr(magic), "not a filterengine scaling filter file"
        )
    (version,) = struct.unpack_from("<H", buf, 8)
    if version != VERSION:
        raise _bad(
            path,
            "format version",
            VERSION,
            version,
            "written by another filterengine version: rebuild the file",
        )
    (stored,) = _CRC.unpack_from(buf, 120)
    actual = zlib.crc32(buf[0:120])
    if stored != actual:
        raise _bad(
            path,
            "header checksum",
            f"{stored:#010x}",
            f"{actual:#010x}",
            "the header is corrupt: rebuild the file",
        )
    if any(buf[124:128]) or any(buf[LAYOUT_OFFSET + 8 : SLOT_OFFSETS[0]]):
        raise _bad(
            path,
            "reserved header bytes",
            "zeros",
            "non-zero bytes",
            "the header is corrupt: rebuild the file",
        )
    (
        _,
        _,
        header_size,
        scheme,
        seed,
        max_stages,
        capacity,
        error_rate,
        growth,
        tightening,
        generation,
        table_offset,
        data_offset,
    ) = _FIXED.unpack_from(buf, 0)
    for field, want, got in (
        ("header size", FIXED_SIZE, header_size),
        ("hash scheme", COUNTER_SCHEME, scheme),
        ("max stages", MAX_STAGES, max_stages),
        ("stage table offset", TABLE_OFFSET, table_offset),
        ("data offset", DATA_OFFSET, data_offset),
    ):
        if want != got:
            raise _bad(path, field, want, got)
    try:
        check_parameters(capacity, error_rate, growth, tightening)
    except (TypeError, ValueError) as exc:
        raise FilterFileError(f"{path}: parameters: {exc}") from None
    return Header(
        seed=seed,
        capacity=capacity,
        error_rate=error_rate,
        growth=growth,
        tightening=tightening,
        generation=generation,
        max_stages=max_stages,
    )


def read_states(buf: ReadableBuffer) -> tuple[State | None, State | None]:
    """Both slots decoded; None for a slot whose checksum is wrong."""
    found: list[State | None] = []
    for at in SLOT_OFFSETS:
        (stored,) = _CRC.unpack_from(buf, at + _SLOT.size)
        if stored != zlib.crc32(buf[at : at + _SLOT.size]) or any(
            buf[at + _SLOT.size + 4 : at + SLOT_SIZE]
        ):
            found.append(None)
            continue
        seq, count, applied, mem, disk, flags, reserved = _SLOT.unpack_from(buf, at)
        found.append(
            None
            if reserved
            else State(
                stage_count=count,
                applied_seq=applied,
                mem_seqnum=mem,
                disk_seqnum=disk,
                flags=flags,
                seq=seq,
            )
        )
    return found[0], found[1]


def read_state(buf: ReadableBuffer, path: str) -> State:
    """The newest valid state slot; FilterFileError if neither is valid.

    A reader can catch the writer between two of its stores into one slot, but
    never into both, so the other slot is valid then; the caller retries a
    failure a few times before believing it."""
    first, second = read_states(buf)
    if first is None and second is None:
        raise FilterFileError(
            f"{path}: state slots: expected at least one with a valid checksum, found "
            "none (the state is corrupt: rebuild the file)"
        )
    if first is None or (second is not None and second.seq > first.seq):
        assert second is not None
        return second
    return first


def check_layout_word(word: int, state: State, path: str) -> None:
    """The layout word must count the state's stages (or one less: a writer killed
    between publishing a stage in its slot and in the word), plus the superseded bit."""
    count = word & ~SUPERSEDED
    if count not in (state.stage_count, state.stage_count - 1):
        raise _bad(
            path,
            "layout word",
            f"stage count {state.stage_count} (or one less), optionally with bit 63",
            f"{word:#x}",
            "the header is corrupt: rebuild the file",
        )


def read_entries(
    buf: ReadableBuffer, count: int, header: Header, size: int, path: str
) -> list[StageEntry]:
    """All ``count`` stage entries, validated (O(count), no counter is read)."""
    if not 1 <= count <= header.max_stages:
        raise _bad(path, "stage count", f"1..{header.max_stages}", count)
    entries: list[StageEntry] = []
    offset = DATA_OFFSET
    for index in range(count):
        at = entry_offset(index)
        (stored,) = _CRC.unpack_from(buf, at + 40)
        actual = zlib.crc32(buf[at : at + 40])
        if stored != actual:
            raise _bad(
                path,
                f"stage {index} checksum",
                f"{stored:#010x}",
                f"{actual:#010x}",
                "the stage table is corrupt: rebuild the file",
            )
        found = StageEntry(*_ENTRY_STATIC.unpack_from(buf, at))
        expected = stage_plan(header, index, offset)
        if found != expected:
            raise _bad(
                path,
                f"stage {index} geometry",
                expected,
                found,
                "the stage table disagrees with the header's parameters",
            )
        if found.end > size:
            raise _bad(
                path,
                f"file size (stage {index} ends at byte {found.end})",
                f"at least {found.end} bytes",
                f"{size} bytes",
                "the file is truncated",
            )
        count, first, last = DYNAMIC.unpack_from(buf, at + DYNAMIC_OFFSET)
        if any(buf[at + 44 : at + 48]) or any(buf[at + 72 : at + ENTRY_SIZE]):
            raise _bad(path, f"stage {index} reserved bytes", "zeros", "non-zero bytes")
        if count > found.capacity:
            # The writer never lets a stage take more than its capacity.
            raise _bad(path, f"stage {index} count", f"at most {found.capacity}", count)
        # A reader may catch a new stage's first store (one of the two ids
        # still the "none yet" sentinel): only two real ids can disagree.
        if first != NO_ID_FIRST and last != NO_ID_LAST and first > last:
            raise _bad(path, f"stage {index} id range", "first id <= last id", f"{first} > {last}")
        entries.append(found)
        offset = next_offset(found)
    return entries
