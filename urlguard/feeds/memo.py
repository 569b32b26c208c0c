"""A source's normalization memo: for each entry its last refresh accepted, a 128-bit
digest of the entry's text as the feed wrote it and the key of the rule expression
it normalized to. A refresh looks every entry up here and normalizes only what it
has not seen: a 1% churn of a million entries normalizes ~10,000 texts, not a
million.

It is a cache, in the DATA_DIR of the process that refreshes: missing, unreadable or
made under another normalizer or allowlist (its stamp differs), it is ignored and
the refresh normalizes everything, then writes a new one."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import idna
import numpy as np
import publicsuffixlist

from filterengine.atomicfile import remove_stale_temps, replacing
from urlguard.conf import conf

__all__ = ["Memo", "MemoFile", "load", "open_file", "prune", "save"]

# Raise when a line or an entry can give another expression than before: a change to
# normalize_rule, to a format's parser, or to rulelists.entry_text.
NORMALIZER_VERSION = 3
_SLICE = 1 << 16
#: One of a memo's arrays, made when called.
Part = Callable[[], np.ndarray]
#: A memo's temp file not written to for this long is of a save that died (a live
#: save writes to its own all along; it takes seconds for millions of entries).
STALE_TEMP_AGE = 600.0


def path_for(source_id: int) -> Path:
    return Path(conf.DATA_DIR) / "feeds" / f"source-{source_id}.memo.npz"


def stamp(fmt: str, allowlist_digest: str) -> str:
    """What a memo's keys depend on besides the text: the normalizer, the data it
    reads, the format the body was read as (each refuses other lines), the settings
    normalize_rule reads, and the allowlist."""
    return (
        f"normalizer {NORMALIZER_VERSION}; {normalizer_data()}; format {fmt}; "
        f"private addresses {conf.ALLOW_PRIVATE_ADDRESS_RULES}; "
        f"allowlist {allowlist_digest}"
    )


@functools.cache
def normalizer_data() -> str:
    """The public suffix list normalize_rule refuses rules by (a digest of the file
    this process's PublicSuffixList parsed: the package can update it in place) and
    the version of idna, which converts international names."""

    data = Path(publicsuffixlist.__file__).with_name("public_suffix_list.dat").read_bytes()
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    return f"public suffixes {digest}; idna {idna.__version__}"


@dataclass
class Memo:
    """Digests (high words sorted, low words beside them) and their expression keys."""

    high: np.ndarray
    low: np.ndarray
    keys: np.ndarray
    # listed_digest() of the keys the refresh that saved it read (a set that holds
    # every key here): a source that lists exactly these lists every key here.
    listed: str = ""
    _index: Index | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.high)

    def lookup(self, high: np.ndarray, low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, at) for the digests (high, low): where found[i], the entry at[i]
        (see keys) is the one of that digest."""
        if not len(self.high):
            return np.zeros(len(high), dtype=bool), np.zeros(len(high), dtype=np.int64)
        if self._index is None:
            self._index = Index(self.high)
        at = self._index.positions(high)
        at[at == len(self.high)] = 0
        found = (self.high[at] == high) & (self.low[at] == low)
        return found, at

    def merged_parts(
        self, kept: np.ndarray, high: np.ndarray, low: np.ndarray, keys: np.ndarray
    ) -> tuple[Merged, Merged, Merged]:
        """(high, low, keys), sorted, of this memo's entries at the positions `kept`
        and the entries (high, low, keys) besides them (in any order; one whose high
        word a kept entry has is left out): the next memo, without sorting the
        entries that stay. Each is a Merged, which write() writes a slice at a time:
        no array of the next memo is ever made whole."""
        keep = np.zeros(len(self.high), dtype=bool)
        keep[kept] = True
        high, low, keys = _sorted_unique(high, low, keys)
        # Each new entry's place in this memo (the high words are sorted and distinct).
        at = np.searchsorted(self.high, high)
        if len(self.high):
            near = np.minimum(at, len(self.high) - 1)
            new = ~((self.high[near] == high) & keep[near])
            high, low, keys, at = high[new], low[new], keys[new], at[new]
        length = int(np.count_nonzero(keep)) + len(high)
        return (
            Merged(self.high, keep, at, high, length),
            Merged(self.low, keep, at, low, length),
            Merged(self.keys, keep, at, keys, length),
        )


class Sliced:
    """An int64 array that write() writes a slice at a time, never made whole."""

    length: int

    def __len__(self) -> int:
        return self.length

    def slices(self) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def __call__(self) -> np.ndarray:
        return np.concatenate(list(self.slices()))


class Merged(Sliced):
    """One array of a next memo: `old` where `keep` is set, with `values` inserted, each
    before the old entry at its place in `at` (sorted; len(old): after them all), made
    a slice of `old` at a time by slices(), or whole by a call."""

    def __init__(
        self, old: np.ndarray, keep: np.ndarray, at: np.ndarray, values: np.ndarray, length: int
    ) -> None:
        self.old, self.keep, self.at, self.values, self.length = old, keep, at, values, length

    def slices(self) -> Iterator[np.ndarray]:
        done = 0  # values given out
        for start in range(0, len(self.old), _SLICE):
            stop = min(start + _SLICE, len(self.old))
            keep = self.keep[start:stop]
            part = self.old[start:stop][keep]
            upto = int(np.searchsorted(self.at, stop))  # the values placed in this slice
            if upto > done:
                before = np.zeros(len(keep) + 1, dtype=np.int64)  # kept entries before each
                np.cumsum(keep, out=before[1:])
                part = np.insert(part, before[self.at[done:upto] - start], self.values[done:upto])
                done = upto
            yield part
        yield self.values[done:]


class Gathered(Sliced):
    """`values[order]` where `keep` (by place in `order`) is set, a slice at a time."""

    def __init__(self, values: np.ndarray, order: np.ndarray, keep: np.ndarray) -> None:
        self.values, self.order, self.keep = values, order, keep
        self.length = int(np.count_nonzero(keep))

    def slices(self) -> Iterator[np.ndarray]:
        for start in range(0, len(self.order), _SLICE):
            stop = start + _SLICE
            yield self.values[self.order[start:stop][self.keep[start:stop]]]


def _sorted_unique_parts(
    high: np.ndarray, low: np.ndarray, keys: np.ndarray
) -> tuple[Gathered, Gathered, Gathered]:
    """_sorted_unique's arrays as Gathered: the order and a mask held, not the three
    sorted copies (24 bytes an entry at a first load's save)."""
    order = np.argsort(high)
    keep = np.ones(len(order), dtype=bool)
    last: int | None = None
    for start in range(0, len(order), _SLICE):
        part = high[order[start : start + _SLICE]]
        np.not_equal(part[1:], part[:-1], out=keep[start + 1 : start + len(part)])
        if last is not None and len(part):
            keep[start] = part[0] != last
        if len(part):
            last = int(part[-1])
    return Gathered(high, order, keep), Gathered(low, order, keep), Gathered(keys, order, keep)


class Index:
    """np.searchsorted(pool, values) for a sorted int64 `pool` of evenly spread values
    (digests, expression keys) and values in any order: the values' top bits pick a
    bucket of the pool from a table (about one entry a bucket), and a binary search
    of each bucket, all buckets at once, takes the rest. A few memory reads a value,
    where a binary search of the pool makes twenty (3-5x faster for a million). The
    table is 4 bytes a pool entry, at most 16 MB."""

    _MAX_BITS = 22

    def __init__(self, pool: np.ndarray) -> None:
        self.pool = pool
        self.bits = min(max(1, len(pool).bit_length()), self._MAX_BITS)
        self._shift = np.uint64(64 - self.bits)
        kind = np.int32 if len(pool) < 1 << 31 else np.int64
        buckets = 1 << self.bits
        self.table = np.empty(buckets + 1, dtype=kind)
        self.table[buckets] = len(pool)
        # Where each bucket's first value would go in the pool, a slice of buckets at
        # a time: no temporary the size of the pool.
        for first in range(0, buckets, _SLICE):
            tops = np.arange(first, min(first + _SLICE, buckets), dtype=np.uint64)
            starts = ((tops << self._shift) ^ np.uint64(1 << 63)).view(np.int64)
            self.table[first : first + len(tops)] = np.searchsorted(pool, starts)

    def _top(self, values: np.ndarray) -> np.ndarray:
        # The sign bit flipped: signed order as unsigned order.
        return ((values.view(np.uint64) ^ np.uint64(1 << 63)) >> self._shift).astype(np.int64)

    def positions(self, values: np.ndarray) -> np.ndarray:
        if not len(self.pool):
            return np.zeros(len(values), dtype=np.int64)
        out = np.empty(len(values), dtype=np.int64)
        last = len(self.pool) - 1
        for start in range(0, len(values), _SLICE):  # small temporaries
            part = values[start : start + _SLICE]
            top = self._top(part)
            lo = self.table[top].astype(np.int64)
            hi = self.table[top + 1].astype(np.int64)
            while True:
                active = lo < hi
                if not active.any():
                    break
                mid = (lo + hi) >> 1
                less = active & (self.pool[np.minimum(mid, last)] < part)
                lo = np.where(less, mid + 1, lo)
                hi = np.where(active & ~less, mid, hi)
            out[start : start + len(part)] = lo
        return out

    def contains(self, values: np.ndarray) -> np.ndarray:
        """values[i] in the pool."""
        if not len(self.pool):
            return np.zeros(len(values), dtype=bool)
        at = self.positions(values)
        at[at == len(self.pool)] = 0
        return self.pool[at] == values


def search(pool: np.ndarray, values: np.ndarray) -> np.ndarray:
    """np.searchsorted(pool, values) for values in any order, the values sorted first
    a slice at a time: a search for sorted values walks the pool in order (several
    times faster for a million random values), and the slices keep temporaries small."""
    at = np.empty(len(values), dtype=np.int64)
    for start in range(0, len(values), _SLICE):
        part = values[start : start + _SLICE]
        order = np.argsort(part)
        at[start + order] = np.searchsorted(pool, part[order])
    return at


def _sorted_unique(
    high: np.ndarray, low: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # One entry per high word: of two texts that share it (1 in 2**64), the other is
    # simply normalized again each time.
    order = np.argsort(high)
    high = high[order]
    keep = np.ones(len(high), dtype=bool)
    np.not_equal(high[1:], high[:-1], out=keep[1:])
    order = order[keep]
    return high[keep], low[order], keys[order]


def load(source_id: int, expected_stamp: str) -> Memo | None:
    try:
        # The file opened here: np.load leaves its own open when the zip is bad.
        with path_for(source_id).open("rb") as file, np.load(file, allow_pickle=False) as data:
            if str(data["stamp"]) != expected_stamp:
                return None
            listed = str(data["listed"]) if "listed" in data.files else ""
            memo = Memo(data["high"], data["low"], data["keys"], listed)
    except Exception:  # missing, empty, cut short, not ours: a cache miss
        return None
    if not (len(memo.high) == len(memo.low) == len(memo.keys)):
        return None
    return memo


_COLUMNS = ("high", "low", "keys")
# A zip member's local header: signature, versions and flags, sizes, then the lengths
# of its name and extra field (what lies between it and the member's bytes).
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")


class MemoFile:
    """A saved memo read a range of entries at a time (its members are stored, so
    each column's place in the file is known): a partitioned refresh reads one
    partition's entries of the high words' top bits, never the whole memo. The file
    is held open, so a save that replaces it meanwhile is not read half old, half
    new."""

    def __init__(self, file: Any, listed: str, length: int, offsets: dict[str, int]) -> None:
        self.file, self.listed, self.length, self.offsets = file, listed, length, offsets

    def __len__(self) -> int:
        return self.length

    def column(self, name: str, start: int, stop: int) -> np.ndarray:
        self.file.seek(self.offsets[name] + 8 * start)
        values = np.fromfile(self.file, dtype="<i8", count=stop - start)
        if len(values) != stop - start:
            raise ValueError(f"the memo {self.file.name} ends inside its {name} column")
        return values.astype(np.int64, copy=False)

    def part(self, start: int, stop: int) -> Memo:
        """The entries from `start` to `stop` (a range of high words)."""
        high, low, keys = (self.column(name, start, stop) for name in _COLUMNS)
        return Memo(high, low, keys)

    def bounds(self, bits: int) -> np.ndarray:
        """Where each partition of the high words' top `bits` begins, and the end."""
        counts = np.zeros(1 << bits, dtype=np.int64)
        for start in range(0, self.length, _SLICE * 16):
            high = self.column("high", start, min(start + _SLICE * 16, self.length))
            counts += np.bincount(top_bits(high, bits), minlength=1 << bits)
        bounds = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        return bounds

    def close(self) -> None:
        self.file.close()


def top_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """The partition of each value: its top `bits` bits, the sign bit flipped so that
    partitions follow signed order (a sorted array's partitions are ranges of it)."""
    if not bits:
        return np.zeros(len(values), dtype=np.intp)
    flipped = values.view(np.uint64) ^ np.uint64(1 << 63)
    return (flipped >> np.uint64(64 - bits)).astype(np.intp)


def open_file(source_id: int, expected_stamp: str) -> MemoFile | None:
    """The source's memo as a MemoFile (None: missing, unreadable, of another stamp)."""
    try:
        file = path_for(source_id).open("rb")
    except OSError:
        return None
    try:
        with zipfile.ZipFile(file) as zf:
            if _text(zf.read("stamp.npy")) != expected_stamp:
                raise ValueError("another stamp")
            members = {name: zf.getinfo(f"{name}.npy") for name in _COLUMNS}
            listed = zf.read("listed.npy") if "listed.npy" in zf.namelist() else b""
        offsets, lengths = {}, set()
        size = os.fstat(file.fileno()).st_size
        for name, info in members.items():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError("a compressed member")
            file.seek(info.header_offset)
            fields = _LOCAL_HEADER.unpack(file.read(_LOCAL_HEADER.size))
            file.seek(info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1])
            version = np.lib.format.read_magic(file)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(file)
            if dtype != np.dtype("<i8") or fortran or len(shape) != 1:
                raise ValueError("not an int64 column")
            offsets[name] = file.tell()
            lengths.add(shape[0])
            if offsets[name] + 8 * shape[0] > size:
                raise ValueError("cut short")
        if len(lengths) != 1:
            raise ValueError("columns of different lengths")
        return MemoFile(file, _text(listed) if listed else "", lengths.pop(), offsets)
    except Exception:  # missing, empty, cut short, not ours: a cache miss
        file.close()
        return None


def _text(member: bytes) -> str:
    return str(np.load(io.BytesIO(member), allow_pickle=False))


class FileColumn(Sliced):
    """An int64 column in a binary file of its own (little-endian), for write():
    read back a slice at a time."""

    def __init__(self, file: Any, length: int) -> None:
        self.file, self.length = file, length

    def __len__(self) -> int:
        return self.length

    def slices(self) -> Iterator[np.ndarray]:
        self.file.flush()
        self.file.seek(0)
        for _ in range(0, self.length, _SLICE):
            yield np.fromfile(self.file, dtype="<i8", count=_SLICE)


def listed_digest(keys: np.ndarray) -> str:
    """Names a sorted set of keys."""
    data = np.ascontiguousarray(keys, dtype="<i8").data  # the bytes, not a copy
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def save(
    source_id: int,
    the_stamp: str,
    high: np.ndarray,
    low: np.ndarray,
    keys: np.ndarray,
    listed: str = "",
) -> None:
    """Replace the memo with these digests and keys (in any order)."""
    write(source_id, the_stamp, *_sorted_unique_parts(high, low, keys), listed=listed)


def write(
    source_id: int,
    the_stamp: str,
    high: np.ndarray | Part | Sliced,
    low: np.ndarray | Part | Sliced,
    keys: np.ndarray | Part | Sliced,
    *,
    listed: str = "",
) -> None:
    """Replace the memo with these digests (sorted, high words distinct) and keys
    (written aside, then renamed; the temp files of saves that died are removed
    first); `listed`: listed_digest() of a set of keys that holds all of `keys`.
    Each array may be given as a Part, made when it is written and dropped after, or
    a Sliced, written a slice at a time."""
    path = path_for(source_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_temps(path, older_than=STALE_TEMP_AGE)
    arrays: list[tuple[str, np.ndarray | Part | Sliced]] = [
        ("stamp", np.array(the_stamp)),
        ("high", high),
        ("low", low),
        ("keys", keys),
        ("listed", np.array(listed)),
    ]
    # np.savez's file (one .npy a member, stored), written a member at a time.
    with (
        replacing(path) as out,
        zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf,
    ):
        while arrays:
            name, value = arrays.pop(0)
            with zf.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                if isinstance(value, Sliced):
                    _write_slices(member, value)
                else:
                    array = np.asanyarray(value() if callable(value) else value)
                    np.lib.format.write_array(member, array, allow_pickle=False)
                    del array
            del value


def _write_slices(out: Any, merged: Sliced) -> None:
    """`merged` as np.save writes an int64 array, a slice at a time."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype("<i8")),
        "fortran_order": False,
        "shape": (len(merged),),
    }
    np.lib.format.write_array_header_1_0(out, header)
    written = 0
    for part in merged.slices():
        out.write(np.ascontiguousarray(part, dtype="<i8").tobytes())
        written += len(part)
    if written != len(merged):
        raise ValueError(f"a merged memo array gave {written} entries, not {len(merged)}")


_MEMO_NAME = re.compile(r"source-([0-9]+)\.memo\.npz\Z")


def prune(existing: Callable[[], Iterable[int]]) -> list[int]:
    """Remove the memos of sources that `existing()` (the ids of the sources there are
    now) does not name: a deleted source's memo is a file of 24 bytes an entry that no
    refresh reads again, on every node that refreshed it. Returns the ids removed.
    The folder is listed before the sources are read, so a memo that a refresh of a
    source created meanwhile writes is never taken for a deleted source's."""
    folder = Path(conf.DATA_DIR) / "feeds"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = {int(m.group(1)): name for name in names if (m := _MEMO_NAME.match(name))}
    if not found:
        return []
    keep = set(existing())
    removed = []
    for source_id, name in sorted(found.items()):
        if source_id not in keep:
            with contextlib.suppress(OSError):
                (folder / name).unlink()
                removed.append(source_id)
    return removed
