"""Reading a fetched body into a diffable form (Staged): its units (lines, or the
entries of a structured format) read a block at a time and hashed in bulk; a unit
the source's normalization memo (urlguard.feeds.memo) knows, of a rule the source
lists, is resolved to its key as it is read, the others are spooled to disk and
then parsed and normalized into the accepted entries' expression keys; and saving
the memo for the next refresh."""

from __future__ import annotations

import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mmh3
import numpy as np

from urlguard.conf import conf
from urlguard.feeds import formats, memo
from urlguard.feeds.decoding import FeedError, line_blocks, line_start, open_text
from urlguard.feeds.outcome import RefreshResult, refuse
from urlguard.models import Source
from urlguard.writepath import allowlist
from urlguard.writepath.plan import Additions, entry_lines, read_entries
from urlguard.writepath.rulelists import pending_entry
from urlguard.writepath.rules import RuleError, normalize_rule, plain_expressions

__all__ = ["Diff", "Opened", "Staged", "member", "opened", "sorted_unique", "stage"]

# Units read from the spool together, and the most bytes such a read may span.
_SPAN_UNITS = 1 << 14
_SPAN_BYTES = 1 << 23


@dataclass
class Diff:
    """A body against what its source lists: `new` marks the entries to list (one
    per key the source lacks), `count` of them; `gone`: the listed keys the body no
    longer has, sorted."""

    new: np.ndarray
    count: int
    gone: np.ndarray


class Staged:
    """A body as units, in body order: its lines for a LINE_FORMATS body, its entries'
    texts (before normalization) for the others, each with its 128-bit digest.

    A unit the source's memo knows, whose rule the source lists now, is resolved as
    it is read (its key, from the memo) and kept as its digest and key only; the
    others ("to do") go to a spool file with their line numbers, a block at a time,
    for resolve() to parse and normalize. After resolve(): the accepted entries'
    keys (the known units' first, then those resolve() found, numbered on), and in
    a second spool the expressions of the entries resolve() normalized."""

    def __init__(
        self,
        fmt: str,
        source_category: str,
        remembered: memo.Memo | None = None,
        listed: np.ndarray | None = None,
    ) -> None:
        self.format = fmt
        self.by_line = fmt in formats.LINE_FORMATS
        self.source_category = source_category
        self._memo = remembered if remembered is not None and len(remembered) else None
        listed = listed if listed is not None else np.zeros(0, dtype=np.int64)
        self._listed = listed  # diff()'s other side
        # Whether a key from the memo must be looked up in the listing: not when the
        # source lists exactly the keys the memo was saved beside (all of its keys).
        self._listed_index: memo.Index | None = None
        if self._memo is not None and not (
            self._memo.listed and self._memo.listed == memo.listed_digest(listed)
        ):
            self._listed_index = memo.Index(listed)
        self._units = 0
        # Known units, a block at a time: their memo positions (their keys are the
        # memo's there), 4 bytes each where the memo allows.
        self._known: list[np.ndarray] = []
        self._at_type = (
            np.int32 if self._memo is not None and len(self._memo) < 1 << 31 else np.int64
        )
        # Units to do, a block at a time: digests, line numbers, ends in the spool.
        self._todo: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._end = 0
        self._pending: list[tuple[int, bytes, int]] = []  # add_entry's, not yet added
        self.category_of = array("H")  # each unit to do's category (not by_line)
        self.categories: list[str] = []
        self._category_index: dict[str, int] = {}
        # The known units' entries' places in the memo (resolve() puts their keys at
        # the head of `keys`; the next memo keeps those entries).
        self.known_at = np.zeros(0, dtype=np.int64)
        self._known_count = 0
        self.high = self.low = self.linenos = self.ends = np.zeros(0, dtype=np.int64)
        # Both closed by close(), which refresh_source always calls.
        self.units = tempfile.TemporaryFile("w+b", prefix="urlguard-entries-")  # noqa: SIM115
        self.expressions = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", prefix="urlguard-expressions-"
        )
        self.keys = np.zeros(0, dtype=np.int64)  # accepted entries, after resolve()
        self.unit_of = np.zeros(0, dtype=np.int64)  # of each entry resolve() found
        self.unique_keys = np.zeros(0, dtype=np.int64)  # sorted
        self.refused_units = np.zeros(0, dtype=np.int64)
        # Entries the allowlist refused, expression -> category (AllowlistRefusal).
        self.allowlisted: dict[str, str] = {}
        self.allowlist_digest = ""

    def __len__(self) -> int:
        return self._units

    @property
    def known(self) -> int:
        """Units resolved from the memo as they were read."""
        return self._known_count

    def add_block(
        self,
        first: int,
        block: str,
        *,
        comments: str = "",
        max_line: int = 0,
        max_units: int = 0,
        refuse: Callable[[int, str, str], None] = lambda lineno, raw, reason: None,
    ) -> None:
        """Stage the lines of `block` (whole lines, the first numbered `first`), less
        blank and comment lines; a line longer than `max_line` is refused, and more
        than `max_units` units fail the body."""
        # A run of blank lines is never split (a list of empty lines is 8 bytes a
        # byte of the block): the search below crosses it.
        if block.isascii() and "\n\n" not in block and block[:1] != "\n":
            lines = block.encode("ascii").split(b"\n")
            if not lines[-1]:
                lines.pop()
            # No line blank, led by white space or a comment character ("#", "!"):
            # every line's first byte sorts after "#", and so does the least line's.
            if (
                lines
                and min(lines)[:1] > b"#"
                and (not max_line or max(map(len, lines)) <= max_line)
            ):
                linenos = np.arange(first, first + len(lines), dtype=np.int64)
                self._add(lines, linenos, max_units)
                return
        # A line to skip or refuse: the lines to stage found by a search that
        # crosses blank and comment lines a run at a time, each looked at.
        lines = []
        numbers: list[int] = []
        lineno, position = first, 0
        for found in line_start(comments).finditer(block):
            start = found.start()
            lineno += block.count("\n", position, start)
            position = start
            stop = block.find("\n", start)
            line = block[start : stop if stop >= 0 else len(block)]
            if max_line and len(line.removesuffix("\r")) > max_line:
                refuse(lineno, line[:300], _too_long(max_line))
                continue
            lines.append(line.encode("utf-8", "surrogatepass"))
            numbers.append(lineno)
        linenos = np.array(numbers, dtype=np.int64)
        self._add(lines, linenos, max_units)

    def add_lines(
        self,
        lines: Iterable[tuple[int, str]],
        *,
        max_line: int = 0,
        max_units: int = 0,
        refuse: Callable[[int, str, str], None] = lambda lineno, raw, reason: None,
    ) -> None:
        """Stage each numbered line (blank and comment lines are left out before); a
        line longer than `max_line` is refused, and more than `max_units` lines fail
        the body."""
        texts: list[bytes] = []
        linenos: list[int] = []
        for lineno, line in lines:
            line = line.rstrip("\n")
            if max_line and len(line.removesuffix("\r")) > max_line:
                refuse(lineno, line[:300], _too_long(max_line))
                continue
            texts.append(line.encode("utf-8", "surrogatepass"))
            linenos.append(lineno)
            if len(texts) >= _BATCH:
                self._add(texts, np.array(linenos, dtype=np.int64), max_units)
                texts, linenos = [], []
        self._add(texts, np.array(linenos, dtype=np.int64), max_units)

    def add_entry(self, token: str, category: str, lineno: int, *, max_units: int = 0) -> None:
        index = self._category_index.get(category)
        if index is None:
            index = self._category_index[category] = len(self.categories)
            self.categories.append(category)
        self._pending.append((lineno, token.encode("utf-8", "surrogatepass"), index))
        if len(self._pending) >= _BATCH:
            self._add_pending(max_units)

    def _add_pending(self, max_units: int = 0) -> None:
        pending, self._pending = self._pending, []
        self._add(
            [text for _, text, _ in pending],
            np.array([lineno for lineno, _, _ in pending], dtype=np.int64),
            max_units,
            np.array([index for _, _, index in pending], dtype=np.uint16),
        )

    def _add(
        self,
        texts: list[bytes],
        linenos: np.ndarray,
        max_units: int,
        categories: np.ndarray | None = None,
    ) -> None:
        if not texts:
            return
        self._count_units(len(texts), max_units)
        high, low = unit_digests(texts)
        if self._memo is not None:
            found, at = self._memo.lookup(high, low)
            # A remembered rule this source no longer lists (a held refresh, a rule
            # deleted by hand) is added again, and adding needs its expression.
            if self._listed_index is not None:
                found &= self._listed_index.contains(self._memo.keys[at])
            if found.any():
                self._known.append(at[found].astype(self._at_type))
                todo = np.flatnonzero(~found)
                if len(todo) < len(texts):
                    texts = [texts[index] for index in todo.tolist()]
                    high, low, linenos = high[todo], low[todo], linenos[todo]
                    if categories is not None:
                        categories = categories[todo]
        if not texts:
            return
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        ends = self._end + np.cumsum(lengths)
        self.units.write(b"".join(texts))
        self._end = int(ends[-1])
        self._todo.append((high, low, linenos, ends))
        if categories is not None:
            self.category_of.extend(categories.tolist())

    def _count_units(self, count: int, max_units: int) -> None:
        if max_units and self._units + count > max_units:
            raise FeedError(
                f"the body lists more than {max_units:,} entries (FEED_MAX_ENTRIES): "
                "refused, nothing applied"
            )
        self._units += count

    def finish(self) -> None:
        """The end of the body: the units read become arrays."""
        self._add_pending()
        if self._known:
            self.known_at = np.concatenate(self._known)
            self._known = []
            self._known_count = len(self.known_at)
        if self._todo:
            # A column at a time, its blocks let go once joined: all four joined at
            # once held every unit twice (32 bytes a unit more at the peak).
            columns = [list(column) for column in zip(*self._todo, strict=True)]
            self._todo = []
            joined = []
            while columns:
                blocks = columns.pop(0)
                joined.append(np.concatenate(blocks))
                del blocks
            self.high, self.low, self.linenos, self.ends = joined
        self._known, self._todo = [], []

    def _texts(self, indices: np.ndarray, ends: np.ndarray) -> Iterator[tuple[int, str]]:
        """(index, text) of the units to do that `indices` (ascending) names. The
        spool is read a span of units at a time where they lie close together (a
        first load reads all of it in order), one unit at a time where they are
        scattered."""
        units = self.units
        for start in range(0, len(indices), _SPAN_UNITS):
            part = indices[start : start + _SPAN_UNITS]
            starts = np.where(part > 0, ends[np.maximum(part - 1, 0)], 0)
            stops = ends[part]
            begin, end = int(starts[0]), int(stops[-1])
            if end - begin <= _SPAN_BYTES:
                units.seek(begin)
                data = units.read(end - begin)
                starts -= begin
                stops -= begin
                for index, a, b in zip(part.tolist(), starts.tolist(), stops.tolist(), strict=True):
                    yield index, data[a:b].decode("utf-8", "surrogatepass")
                continue
            for index, a, b in zip(part.tolist(), starts.tolist(), stops.tolist(), strict=True):
                units.seek(a)
                yield index, units.read(b - a).decode("utf-8", "surrogatepass")

    def _spans(self) -> Iterator[tuple[int, list[str]]]:
        """(index of the first, texts) of all the units to do, in order, a span of
        the spool at a time."""
        ends = self.ends
        for first in range(0, len(ends), _SPAN_UNITS):
            stops = ends[first : first + _SPAN_UNITS]
            begin = int(ends[first - 1]) if first else 0
            self.units.seek(begin)
            data = self.units.read(int(stops[-1]) - begin)
            bounds = (stops - begin).tolist()
            texts = [
                data[a:b].decode("utf-8", "surrogatepass")
                for a, b in zip([0, *bounds[:-1]], bounds, strict=True)
            ]
            yield first, texts

    def resolve(self, protected: allowlist.Allowlist, result: RefreshResult) -> None:
        """Find the entries of every unit to do: by parsing the line (by_line) and
        normalizing the entries (then the allowlist). Units to do are numbered from
        0 in body order (unit_of); entries after the known units' (keys).

        A line of a URL list that is one plain URL (rules.plain_expressions) is
        read straight to its expression, as parse_line and normalize_rule would:
        most lines of a big list, at a fraction of the cost of the two."""
        self.allowlist_digest = protected.digest()
        unit_of = array("q")
        keys: list[np.ndarray] = []
        refused_units = array("q")  # never remembered: their refusals count each time
        self.units.flush()
        for first, texts in self._spans():
            stop = first + len(texts)
            expressions, categories = self._normalize(
                range(first, stop),
                texts,
                self.linenos[first:stop],
                self.category_of[first:stop],
                protected,
                result,
                unit_of,
                refused_units,
            )
            self.expressions.write(entry_lines(categories, expressions))
            keys.append(expression_keys(expressions))
        normalized = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        del keys
        # One array of every key, the known ones gathered straight into its head (none
        # known, as in a first load: the normalized keys are that array, not copied).
        if self.known:
            assert self._memo is not None  # units are known only from a memo
            self.keys = np.empty(self.known + len(normalized), dtype=np.int64)
            np.take(self._memo.keys, self.known_at, out=self.keys[: self.known], mode="clip")
            self.keys[self.known :] = normalized
        else:
            self.keys = normalized
        del normalized
        # The memo and the listing are the caller's from here (the memo's arrays are
        # most of a big refresh's memory: its caller drops them after saving the next).
        self._memo = self._listed_index = None
        self.unit_of = np.frombuffer(unit_of, dtype=np.int64)
        self.refused_units = np.frombuffer(refused_units, dtype=np.int64)
        self.unique_keys = sorted_unique(self.keys)
        result.refusals.sort(key=lambda refusal: refusal[0])

    def _normalize(
        self,
        numbers: Sequence[int],
        texts: list[str],
        linenos: Sequence[int] | np.ndarray,
        category_of: Sequence[int],
        protected: allowlist.Allowlist,
        result: RefreshResult,
        unit_of: array,
        refused_units: array,
    ) -> tuple[list[str], list[str]]:
        """(expressions, categories) of the accepted entries of the units `texts`
        (numbered `numbers`, with their line numbers and, not by_line, categories),
        each entry's unit number appended to `unit_of`, a unit with a refused entry's
        to `refused_units`."""
        screened = len(protected) > 0
        plain_lines = self.format == "urls"
        plain = plain_expressions(texts) if plain_lines else [None] * len(texts)
        if plain_lines and not screened and None not in plain:
            # Every line plain, no allowlist to ask: one entry each.
            unit_of.extend(numbers)
            return plain, [self.source_category] * len(plain)  # type: ignore[return-value]
        expressions: list[str] = []
        categories: list[str] = []
        for at, (text, expression) in enumerate(zip(texts, plain, strict=True)):
            index = numbers[at]
            entries: list[tuple[int, str, str, str | None, str | None]]
            if expression is not None:
                entries = [(0, text, self.source_category, None, expression)]
            elif self.by_line:
                entries = [
                    (parsed.lineno, parsed.token or "", parsed.category, parsed.error, None)
                    for parsed in formats.parse_line(
                        self.format, text, int(linenos[at]), self.source_category, pending_entry
                    )
                ]
            else:
                category = self.categories[category_of[at]]
                entries = [(int(linenos[at]), text, category, None, None)]
            for lineno, token, category, error, known in entries:
                if error is not None:
                    refuse(result, lineno, text, error)
                    refused_units.append(index)
                    continue
                try:
                    expression = known or normalize_rule(token)
                except RuleError as exc:
                    refuse(result, lineno, token, str(exc))
                    refused_units.append(index)
                    continue
                reason = protected.refusal(expression) if screened else None
                if reason is not None:
                    refuse(result, lineno or int(linenos[at]), token, reason)
                    refused_units.append(index)
                    self.allowlisted[expression] = category or self.source_category
                    continue
                expressions.append(expression)
                categories.append(category or self.source_category)
                unit_of.append(index)
        return expressions, categories

    def new_keys(self) -> np.ndarray:
        """The keys of the entries resolve() normalized (numbered from `known`)."""
        return self.keys[self.known :]

    def diff(self, listed: np.ndarray | None = None) -> Diff:
        """The entries new to a source that lists `listed` (keys, sorted; by default
        what it was staged against), and the keys it lists that this body no longer
        has. After resolve()."""
        listed = self._listed if listed is None else listed
        # The first entry of each key the source does not list yet: one resolve()
        # normalized (a unit resolved from the memo is of a listed rule).
        fresh = self.known + np.flatnonzero(~member(self.new_keys(), listed))
        if len(self.unique_keys) == len(self.keys):  # no key twice: each is its first
            first = np.arange(len(fresh))
        else:
            _, first = np.unique(self.keys[fresh], return_index=True)
        new = np.zeros(len(self.keys), dtype=bool)
        new[fresh[first]] = True
        return Diff(new, len(first), listed[~member(listed, self.unique_keys)])

    def remember(self, source_id: int, stamp: str, remembered: memo.Memo | None) -> None:
        """Save, as the source's memo, the key of every unit that gave one entry: the
        known units' entries of `remembered` (the memo they were found in) kept as
        they are, the others' merged in."""
        per_unit = np.bincount(self.unit_of, minlength=len(self.ends))
        per_unit[self.refused_units] = 0  # a line that also had a refused entry
        entries = per_unit[self.unit_of] == 1
        del per_unit
        units = self.unit_of[entries]
        high, low, keys = self.high[units], self.low[units], self.new_keys()[entries]
        listed = memo.listed_digest(self.unique_keys)  # all of the memo's keys
        if remembered is not None and self.known:
            parts = remembered.merged_parts(self.known_at, high, low, keys)
            memo.write(source_id, stamp, *parts, listed=listed)
        else:  # no unit was known
            memo.save(source_id, stamp, high, low, keys, listed)

    def has(self, keys: np.ndarray) -> np.ndarray:
        """keys[i] among the accepted entries' keys. After resolve()."""
        return member(keys, self.unique_keys)

    def forget_units(self) -> None:
        """Free the units' digests and places (what is left to do needs the entries)."""
        empty = np.zeros(0, dtype=np.int64)
        self.high = self.low = self.linenos = self.ends = empty
        self.known_at = empty

    def count(self) -> int:
        """Distinct accepted entries."""
        return len(self.unique_keys)

    def lines(self, picked: np.ndarray) -> Iterator[tuple[str, str]]:
        """(expression, category) of the entries `picked` marks, which must be among
        those resolve() normalized (an entry new to the source always is)."""
        for _, expression, category in self.entries(picked):
            yield expression, category

    def entries(
        self, picked: np.ndarray, *, whole_hosts: bool = False
    ) -> Iterator[tuple[int, str, str]]:
        """(index, expression, category) of the entries `picked` marks (see lines);
        `whole_hosts`: only those whose expression is a whole host ("host/")."""
        for index, expression, category, _ in self.rows(picked, whole_hosts=whole_hosts):
            yield index, expression, category

    def rows(
        self, picked: np.ndarray, *, whole_hosts: bool = False
    ) -> Iterator[tuple[int, str, str, int]]:
        """(index, expression, category, key) of the entries `picked` marks (see
        lines): the spool, an entry file (urlguard.writepath.plan), read a chunk of
        lines at a time, only the lines picked split."""
        return read_entries(
            self.expressions, self.known, self.keys, picked, whole_hosts=whole_hosts
        )

    def additions(self, picked: np.ndarray) -> Additions:
        """The entries `picked` marks as a plan's additions: this spool and these keys,
        not a copy (valid until close())."""
        return Additions(self.expressions, self.known, self.keys, picked)

    def close(self) -> None:
        self.units.close()
        self.expressions.close()


# Units hashed, looked up and spooled together.
_BATCH = 1 << 14
# What a body is decoded and staged by (bytes).
_BLOCK = 1 << 18


# 128-bit MurmurHash3 (x64) of a unit's UTF-8 text: its high and low words.
_digest = mmh3.mmh3_x64_128_digest


def unit_digests(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The high and low words of each unit's digest, hashed in bulk."""
    digests = np.frombuffer(b"".join(map(_digest, texts)), dtype="<i8")
    return digests[0::2].astype(np.int64), digests[1::2].astype(np.int64)


def expression_keys(expressions: list[str]) -> np.ndarray:
    """[expression_key(e) for e in expressions] as an array, hashed in bulk."""
    if not expressions:
        return np.zeros(0, dtype=np.int64)
    # One encode of them all: an expression holds no line end (canonical; checked).
    encoded = "\n".join(expressions).encode("utf-8", "surrogatepass").split(b"\n")
    if len(encoded) != len(expressions):
        encoded = [e.encode("utf-8", "surrogatepass") for e in expressions]
    digests = np.frombuffer(b"".join(map(_digest, encoded)), dtype="<i8")
    return digests[0::2].astype(np.int64)


def _too_long(max_line: int) -> str:
    return f"longer than {max_line:,} characters (FEED_MAX_LINE)"


# Lines a LINE_FORMATS body may comment out: skipped before they are staged.
_COMMENTS = {"urls": "#", "hosts": "#", "adblock": "!"}


@dataclass
class Opened:
    """A body opened for reading: its format (sniffed, or the source's) and its text."""

    format: str
    text: Any


@contextmanager
def opened(body: Any, source: Source, result: RefreshResult) -> Iterator[Opened]:
    """`body` decoded (bounded by FEED_MAX_BYTES and FEED_MAX_LINE) and its format
    known, before any entry is read: the format says which memo to read."""
    with open_text(body, limit=conf.FEED_MAX_BYTES, max_line=conf.FEED_MAX_LINE) as text:
        fmt, stream = formats.sniff(text, source.format)  # type: ignore[arg-type]
        result.format = fmt
        yield Opened(fmt, stream)


def stage(
    body: Opened | Any,
    source: Source,
    result: RefreshResult,
    remembered: memo.Memo | None = None,
    listed: np.ndarray | None = None,
    *,
    into: Staged | None = None,
) -> Staged:
    """Read `body` (Opened, or a body not opened yet) into a Staged (or `into`, one
    made for it). `remembered`: the source's memo (None: none usable) and `listed`:
    the keys it lists now (sorted): the units these resolve are resolved as they are
    read."""
    if not isinstance(body, Opened):
        with opened(body, source, result) as text:
            return stage(text, source, result, remembered, listed, into=into)
    max_line, max_units = conf.FEED_MAX_LINE, conf.FEED_MAX_ENTRIES
    fmt, stream = body.format, body.text
    staged = into if into is not None else Staged(fmt, source.category, remembered, listed)
    try:
        if staged.by_line:
            comments = _COMMENTS.get(fmt, "")
            for first, block in line_blocks(stream, _BLOCK):
                staged.add_block(
                    first,
                    block,
                    comments=comments,
                    max_line=max_line,
                    max_units=max_units,
                    refuse=lambda lineno, raw, reason: refuse(result, lineno, raw, reason),
                )
        else:
            _, entries = formats.parse(stream, fmt, source.category, make=pending_entry)
            for parsed in entries:
                if parsed.error is not None:
                    refuse(result, parsed.lineno, parsed.raw, parsed.error)
                elif parsed.token is not None:
                    category = parsed.category or source.category
                    staged.add_entry(parsed.token, category, parsed.lineno, max_units=max_units)
        staged.finish()
    except BaseException:
        staged.close()
        raise
    return staged


def sorted_unique(values: np.ndarray) -> np.ndarray:
    # np.unique took its hash-table path here: 0.66 s a million keys (profiled); a sort
    # and a comparison of neighbours, a fraction of that.
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered if keep.all() else ordered[keep]  # most lists repeat no entry


def member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values[i] in `pool` (sorted): a binary search each (the values sorted a slice
    at a time, memo.search), where np.isin sorts both."""
    if not len(pool) or not len(values):
        return np.zeros(len(values), dtype=bool)
    at = memo.search(pool, values)
    at[at == len(pool)] = 0
    return pool[at] == values
