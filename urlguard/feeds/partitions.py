"""A big body staged a partition at a time: what Staged holds whole in memory (the
memo, the listing, every unit's digests, the entries' keys and their sorted copy) is
kept on disk in runs partitioned by the top bits of a digest or of a key, and each
step works one partition at a time, so a refresh of ten million entries holds one
partition's arrays (at most about PARTITION_SIZE entries), not the feed's.

The steps: every unit is spooled with its digests as it is read (Staged spools only
the units its memo does not know: here the memo is looked up afterwards, a digest
partition at a time against the same partition of the memo file); a known unit's
key is checked against the listing a key partition at a time; the units left are
normalized in body order as Staged normalizes them; then, a key partition at a time,
the entries are diffed against the listing, and the next memo is merged a digest
partition at a time. What is held whole is a byte a unit (which are left to do), a
byte an old memo entry (which it keeps) and a byte a normalized entry (which are
new). Every file here is a temporary one of this process: a killed refresh leaves
nothing another would trust."""

from __future__ import annotations

import hashlib
import tempfile
from array import array
from collections.abc import Iterator
from typing import IO

import numpy as np

from urlguard.feeds import memo
from urlguard.feeds.outcome import RefreshResult
from urlguard.feeds.staging import Diff, Staged, expression_keys, member, unit_digests
from urlguard.models import Source
from urlguard.writepath import allowlist
from urlguard.writepath.plan import Additions, KeyFile, entry_lines, read_entries

__all__ = ["PARTITION_ENTRIES", "PARTITION_SIZE", "Partitioned", "estimate", "partitions_for"]

#: A body of more entries than this (as estimated before it is read) is staged in
#: partitions; below it, Staged's whole arrays are ~100 MB at most.
PARTITION_ENTRIES = 1 << 21
#: The entries a partition holds at most (while there are at most 2**_MAX_BITS
#: partitions): its arrays are a few tens of MB.
PARTITION_SIZE = 1 << 18
_MAX_BITS = 10
# Units a span of the body-order files holds (reading them back in order).
_SPAN = 1 << 14
# Records a Runs gathers before it sorts them into their partitions' files.
_GATHER = 1 << 16
# A unit's columns in body order: its end in the spool, line number, digests, category.
_END, _LINENO, _HIGH, _LOW, _CATEGORY = range(5)


def partitions_for(entries: int) -> int:
    """The partitions of a body of about `entries` entries: 1 (not partitioned) up to
    PARTITION_ENTRIES, else a power of two of at most PARTITION_SIZE each."""
    if entries <= PARTITION_ENTRIES:
        return 1
    bits = 1
    while entries > PARTITION_SIZE << bits and bits < _MAX_BITS:
        bits += 1
    return 1 << bits


def estimate(body: IO[bytes], size: int, source: Source | None = None) -> int:
    """About how many entries a fetched body of `size` bytes holds: as many a byte as
    the source's last refresh had; else its lines, counted, or one each 64 bytes if
    that is more (a document of one line); a compressed body (gzip, zip) one each 16
    bytes, eight times over, as it expands."""
    if source is not None and source.last_bytes and source.last_entries:
        return size * source.last_entries // source.last_bytes
    head = body.read(4)
    body.seek(0)
    if head.startswith((b"\x1f\x8b", b"PK\x03\x04")):
        return size * 8 // 16
    lines = 0
    while block := body.read(1 << 23):
        lines += block.count(b"\n")
    body.seek(0)
    return max(lines + 1, size // 64)


class Runs:
    """Records of `width` int64s appended in any order, each to the run of its
    partition (the top bits of its first field), a temporary file a partition; read
    back a partition at a time."""

    def __init__(self, bits: int, width: int) -> None:
        self.bits, self.width = bits, width
        # Unbuffered: each write is a partition's share of _GATHER records at once, and
        # a buffer a file would be held a partition at a time.
        self.files = [
            tempfile.TemporaryFile(prefix="urlguard-run-", buffering=0)  # noqa: SIM115
            for _ in range(1 << bits)
        ]
        self._gathered: list[np.ndarray] = []
        self._count = 0

    def add(self, *columns: np.ndarray) -> None:
        if not len(columns[0]):
            return
        self._gathered.append(np.column_stack([np.asarray(c, dtype=np.int64) for c in columns]))
        self._count += len(columns[0])
        if self._count >= _GATHER:
            self._spill()

    def _spill(self) -> None:
        if not self._gathered:
            return
        records = np.concatenate(self._gathered)
        self._gathered, self._count = [], 0
        # A partition number of 16 bits: a stable sort of them is a radix sort.
        part = memo.top_bits(np.ascontiguousarray(records[:, 0]), self.bits).astype(np.uint16)
        order = np.argsort(part, kind="stable")
        records, part = records[order], part[order]
        edges = np.searchsorted(part, np.arange(len(self.files) + 1))
        for p in np.flatnonzero(np.diff(edges)).tolist():
            data = _bytes(records[edges[p] : edges[p + 1]]).cast("B")
            while data:  # an unbuffered write may take part of it
                data = data[self.files[p].write(data) :]

    def read(self, p: int) -> np.ndarray:
        """Partition `p`'s records, in the order they were added (rows of `width`)."""
        self._spill()
        file = self.files[p]
        file.flush()
        file.seek(0)
        records = np.fromfile(file, dtype="<i8").astype(np.int64, copy=False)
        file.truncate(0)  # read once: its disk space back
        file.seek(0)
        return records.reshape(-1, self.width)

    def close(self) -> None:
        self._gathered = []
        for file in self.files:
            file.close()


def _bounds(ordered: np.ndarray, bits: int) -> np.ndarray:
    """Where each partition of a sorted array begins, and its end."""
    if not bits:
        return np.array([0, len(ordered)], dtype=np.int64)
    tops = np.arange(1 << bits, dtype=np.uint64) << np.uint64(64 - bits)
    starts = (tops ^ np.uint64(1 << 63)).view(np.int64)
    return np.append(np.searchsorted(ordered, starts), len(ordered)).astype(np.int64)


class Partitioned(Staged):
    """A Staged whose arrays are on disk, partitioned (see the module). It is given
    the memo as a MemoFile and `listed` (sorted) at once, which it writes to disk:
    the caller need hold neither. Its entries are those resolve() normalized,
    numbered from 0; a unit the memo knows, of a listed rule, gives none (its rule
    is listed, so never added), only its key to the diff."""

    def __init__(
        self,
        fmt: str,
        source_category: str,
        parts: int,
        remembered: memo.MemoFile | None,
        listed: np.ndarray,
    ) -> None:
        super().__init__(fmt, source_category)
        self.bits = max(0, parts.bit_length() - 1)
        # Held open until forget_units() (the next memo merges it), closed then.
        self._memo_file = remembered if remembered is not None and len(remembered) else None
        if remembered is not None and self._memo_file is None:
            remembered.close()
        self._check_listed = self._memo_file is not None and not (
            self._memo_file.listed and self._memo_file.listed == memo.listed_digest(listed)
        )
        self._listing = tempfile.TemporaryFile(prefix="urlguard-listing-")  # noqa: SIM115
        self._listing.write(_bytes(listed))
        self._listing_bounds = _bounds(listed, self.bits)
        # Every unit in body order: its columns (_END ... _CATEGORY), 40 bytes each.
        self._columns = tempfile.TemporaryFile(prefix="urlguard-units-")  # noqa: SIM115
        self._digests = Runs(self.bits, 3)  # high, low, unit
        self._unique = tempfile.TemporaryFile(prefix="urlguard-keys-")  # noqa: SIM115
        self._unique_bounds = np.zeros((1 << self.bits) + 1, dtype=np.int64)
        self._key_file = tempfile.TemporaryFile(prefix="urlguard-entry-keys-")  # noqa: SIM115
        self._entries = 0
        self._count = 0
        self._kept = np.zeros(0, dtype=bool)
        self._diff = Diff(np.zeros(0, dtype=bool), 0, np.zeros(0, dtype=np.int64))
        self._candidates: Runs | None = None
        self._memo_bounds = np.zeros(0, dtype=np.int64)
        self.listed_digest = ""

    # -- reading ----------------------------------------------------------------------

    def _add(
        self,
        texts: list[bytes],
        linenos: np.ndarray,
        max_units: int,
        categories: np.ndarray | None = None,
    ) -> None:
        if not texts:
            return
        first = self._units
        self._count_units(len(texts), max_units)
        high, low = unit_digests(texts)
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        ends = self._end + np.cumsum(lengths)
        self.units.write(b"".join(texts))
        self._end = int(ends[-1])
        kinds = categories if categories is not None else np.zeros(len(texts), dtype=np.int64)
        self._columns.write(_bytes(np.column_stack((ends, linenos, high, low, kinds))))
        self._digests.add(high, low, np.arange(first, self._units, dtype=np.int64))

    def finish(self) -> None:
        self._add_pending()
        self.units.flush()
        self._columns.flush()

    def _span(self, first: int) -> np.ndarray:
        self._columns.seek(40 * first)
        return np.fromfile(self._columns, dtype="<i8", count=5 * _SPAN).reshape(-1, 5)

    def _listed_part(self, p: int) -> np.ndarray:
        start, stop = int(self._listing_bounds[p]), int(self._listing_bounds[p + 1])
        self._listing.seek(8 * start)
        return np.fromfile(self._listing, dtype="<i8", count=stop - start).astype(np.int64)

    # -- resolving --------------------------------------------------------------------

    def resolve(self, protected: allowlist.Allowlist, result: RefreshResult) -> None:
        """Look the units up in the memo, normalize the others, and diff the entries
        against the listing: every step a partition (or a span) at a time."""
        self.allowlist_digest = protected.digest()
        self._listing.flush()
        todo = np.ones(self._units, dtype=bool)
        entries = Runs(self.bits, 2)  # key, entry number (-1: a known unit's)
        self._known_units(todo, entries)
        self._normalize_todo(todo, entries, protected, result)
        del todo
        self._diff_entries(entries)
        entries.close()
        result.refusals.sort(key=lambda refusal: refusal[0])

    def _known_units(self, todo: np.ndarray, entries: Runs) -> None:
        """Clear `todo` for each unit the memo knows, of a listed rule, and add its key
        to `entries`; mark the memo entries kept (`_kept`)."""
        file = self._memo_file
        if file is None:
            self._digests.close()
            return
        self._memo_bounds = file.bounds(self.bits)
        self._kept = np.zeros(len(file), dtype=bool)
        known = Runs(self.bits, 3) if self._check_listed else None  # key, unit, memo place
        for p in range(1 << self.bits):
            run = self._digests.read(p)
            start, stop = int(self._memo_bounds[p]), int(self._memo_bounds[p + 1])
            if not len(run) or start == stop:
                continue
            part = file.part(start, stop)
            found, at = part.lookup(run[:, 0], run[:, 1])
            units, places = run[found, 2], at[found]
            keys = part.keys[places]
            del part, run, found, at
            if known is not None:
                known.add(keys, units, places + start)
            else:
                self._take_known(todo, entries, keys, units, places + start)
        self._digests.close()
        if known is None:
            return
        for q in range(1 << self.bits):
            run = known.read(q)
            if len(run):
                listed = member(run[:, 0], self._listed_part(q))
                self._take_known(todo, entries, run[listed, 0], run[listed, 1], run[listed, 2])
        known.close()

    def _take_known(
        self, todo: np.ndarray, entries: Runs, keys: np.ndarray, units: np.ndarray, at: np.ndarray
    ) -> None:
        todo[units] = False
        self._kept[at] = True
        self._known_count += len(units)
        entries.add(keys, np.full(len(keys), -1, dtype=np.int64))

    def _normalize_todo(
        self,
        todo: np.ndarray,
        entries: Runs,
        protected: allowlist.Allowlist,
        result: RefreshResult,
    ) -> None:
        """Normalize the units `todo` marks, in body order: their entries to the entry
        file and `entries`, and the digests and key of each unit of one entry to the
        next memo's candidates."""
        self._candidates = Runs(self.bits, 3)  # high, low, key
        for first in range(0, self._units, _SPAN):
            picked = np.flatnonzero(todo[first : first + _SPAN])
            if not len(picked):
                continue
            columns = self._span(first)
            ends = columns[:, _END]
            starts = np.concatenate(([self._end_before(first)], ends[:-1]))
            begin, end = int(starts[picked[0]]), int(ends[picked[-1]])
            self.units.seek(begin)
            data = self.units.read(end - begin)
            texts = [
                data[a - begin : b - begin].decode("utf-8", "surrogatepass")
                for a, b in zip(starts[picked].tolist(), ends[picked].tolist(), strict=True)
            ]
            unit_of, refused = array("q"), array("q")
            numbers = (first + picked).tolist()
            expressions, categories = self._normalize(
                numbers,
                texts,
                columns[picked, _LINENO].tolist(),
                columns[picked, _CATEGORY].tolist(),
                protected,
                result,
                unit_of,
                refused,
            )
            del texts, data
            self.expressions.write(entry_lines(categories, expressions))
            keys = expression_keys(expressions)
            self._key_file.write(_bytes(keys))
            numbered = np.arange(self._entries, self._entries + len(keys), dtype=np.int64)
            entries.add(keys, numbered)
            self._entries += len(keys)
            self._remember_single(columns, first, keys, unit_of, refused)

    def _end_before(self, first: int) -> int:
        """Where unit `first` begins in the spool."""
        if not first:
            return 0
        self._columns.seek(40 * (first - 1) + 8 * _END)
        return int(np.fromfile(self._columns, dtype="<i8", count=1)[0])

    def _remember_single(
        self, columns: np.ndarray, first: int, keys: np.ndarray, unit_of: array, refused: array
    ) -> None:
        """The units of this span that gave one entry and no refusal, as memo
        candidates (their entries are contiguous: the units' order)."""
        units = np.frombuffer(unit_of, dtype=np.int64)
        if not len(units):
            return
        single = np.ones(len(units), dtype=bool)
        same = units[1:] == units[:-1]
        single[1:] &= ~same
        single[:-1] &= ~same
        if len(refused):
            single &= ~np.isin(units, np.frombuffer(refused, dtype=np.int64))
        rows = units[single] - first
        assert self._candidates is not None
        self._candidates.add(columns[rows, _HIGH], columns[rows, _LOW], keys[single])

    def _diff_entries(self, entries: Runs) -> None:
        """A key partition at a time: the distinct keys (to disk, in key order, and
        the digest naming them), the listed keys the body lost, and the first entry
        of each key the source does not list."""
        new = np.zeros(self._entries, dtype=bool)
        gone: list[np.ndarray] = []
        digest = hashlib.blake2b(digest_size=16)
        count = new_count = 0
        for q in range(1 << self.bits):
            run = entries.read(q)
            listed = self._listed_part(q)
            order = np.argsort(run[:, 0], kind="stable")  # a key's first entry first
            keys = run[order, 0]
            firsts = np.ones(len(keys), dtype=bool)
            np.not_equal(keys[1:], keys[:-1], out=firsts[1:])
            unique = keys[firsts]
            numbers = run[order[firsts], 1]
            del run, order, keys, firsts
            self._unique.write(_bytes(unique))
            digest.update(np.ascontiguousarray(unique, dtype="<i8").data)
            count += len(unique)
            self._unique_bounds[q + 1] = count
            gone.append(listed[~_sorted_member(listed, unique)])
            fresh = numbers[(numbers >= 0) & ~_sorted_member(unique, listed)]
            new[fresh] = True
            new_count += len(fresh)
        self._count = count
        self.listed_digest = digest.hexdigest()
        self._diff = Diff(new, new_count, np.concatenate(gone) if gone else np.zeros(0, np.int64))
        self._listing.close()

    # -- after resolve() --------------------------------------------------------------

    def diff(self, listed: np.ndarray | None = None) -> Diff:
        """The diff against the listing this was staged against (resolve() made it)."""
        return self._diff

    def count(self) -> int:
        return self._count

    def sorted_keys(self) -> np.ndarray:
        """The distinct keys, sorted: a feed-sized array (Staged.unique_keys), which a
        refresh never makes; for checks and benchmarks."""
        self._unique.flush()
        self._unique.seek(0)
        return np.fromfile(self._unique, dtype="<i8", count=self._count).astype(np.int64)

    def has(self, keys: np.ndarray) -> np.ndarray:
        found = np.zeros(len(keys), dtype=bool)
        parts = memo.top_bits(np.asarray(keys, dtype=np.int64), self.bits)
        self._unique.flush()
        for q in np.unique(parts).tolist():
            start, stop = int(self._unique_bounds[q]), int(self._unique_bounds[q + 1])
            self._unique.seek(8 * start)
            unique = np.fromfile(self._unique, dtype="<i8", count=stop - start).astype(np.int64)
            found[parts == q] = member(keys[parts == q], unique)
        return found

    def remember(self, source_id: int, stamp: str, remembered: object = None) -> None:
        """Save the next memo: a digest partition at a time, the old memo's entries
        kept (of the units known) merged with the candidates, each column to a file
        of its own, then written as the memo."""
        columns = [tempfile.TemporaryFile(prefix="urlguard-memo-") for _ in range(3)]  # noqa: SIM115
        try:
            length = 0
            old = self._memo_file
            empty = np.zeros(0, dtype=np.int64)
            for p in range(1 << self.bits):
                candidates = self._candidates.read(p) if self._candidates else None
                high, low, keys = candidates.T if candidates is not None else (empty,) * 3
                if old is not None:
                    start, stop = int(self._memo_bounds[p]), int(self._memo_bounds[p + 1])
                    part = old.part(start, stop)
                    kept = np.flatnonzero(self._kept[start:stop])
                else:
                    part, kept = memo.Memo(empty, empty, empty), empty
                merged = part.merged_parts(kept, high, low, keys)
                length += len(merged[0])
                for file, column in zip(columns, merged, strict=True):
                    file.write(_bytes(column()))
            memo.write(
                source_id,
                stamp,
                *(memo.FileColumn(file, length) for file in columns),
                listed=self.listed_digest,
            )
        finally:
            for file in columns:
                file.close()

    def forget_units(self) -> None:
        self._kept = np.zeros(0, dtype=bool)
        if self._candidates is not None:
            self._candidates.close()
            self._candidates = None
        if self._memo_file is not None:
            self._memo_file.close()
            self._memo_file = None
        self._columns.close()

    def rows(
        self, picked: np.ndarray, *, whole_hosts: bool = False
    ) -> Iterator[tuple[int, str, str, int]]:
        return read_entries(self.expressions, 0, self._keys(), picked, whole_hosts=whole_hosts)

    def additions(self, picked: np.ndarray) -> Additions:
        return Additions(self.expressions, 0, self._keys(), picked)

    def _keys(self) -> KeyFile:
        return KeyFile(self._key_file, self._entries)

    def close(self) -> None:
        super().close()
        self.forget_units()
        self._digests.close()
        for file in (self._listing, self._unique, self._key_file):
            file.close()


def _bytes(values: np.ndarray) -> memoryview:
    """The bytes of an int64 array as a file holds them (little-endian), not copied
    when they are already so."""
    return np.ascontiguousarray(values, dtype="<i8").data


def _sorted_member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values[i] in `pool`, both sorted."""
    if not len(pool) or not len(values):
        return np.zeros(len(values), dtype=bool)
    at = np.searchsorted(pool, values)
    at[at == len(pool)] = 0
    return pool[at] == values
