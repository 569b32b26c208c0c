"""Reading a fetched body into a diffable form (Staged): its units (lines, or the
entries of a structured format) spooled to disk with their digests, then resolved
into the accepted entries' expression keys, from the source's normalization memo
(urlguard.feeds.memo) where it knows a unit's text and by normalizing it otherwise;
and saving the memo for the next refresh."""

from __future__ import annotations

import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import mmh3
import numpy as np

from urlguard.conf import conf
from urlguard.feeds import formats, memo
from urlguard.feeds.decoding import FeedError, numbered, open_text
from urlguard.feeds.outcome import RefreshResult, refuse
from urlguard.models import Source, expression_key
from urlguard.writepath import allowlist
from urlguard.writepath.rulelists import pending_entry
from urlguard.writepath.rules import RuleError, normalize_rule

__all__ = ["Staged", "member", "sorted_unique", "stage"]

# Units read from the spool together, and the most bytes such a read may span.
_SPAN_UNITS = 1 << 14
_SPAN_BYTES = 1 << 23


class Staged:
    """A body as units, in body order: its lines for a LINE_FORMATS body, its entries'
    texts (before normalization) for the others. Before resolve(): each unit's text
    in a spool file, its 128-bit digest, line number and category. After: the
    accepted entries' keys with the unit each came from, and in a second spool the
    expressions of the entries resolve() normalized."""

    def __init__(self, fmt: str, source_category: str) -> None:
        self.format = fmt
        self.by_line = fmt in formats.LINE_FORMATS
        self.source_category = source_category
        self.high, self.low = array("q"), array("q")
        self.ends = array("q")  # where each unit's text ends in the spool
        self.linenos = array("q")  # each unit's line number
        self.category_of = array("H")
        self.categories: list[str] = []
        self._category_index: dict[str, int] = {}
        self._end = 0
        # Both closed by close(), which refresh_source always calls.
        self.units = tempfile.TemporaryFile("w+b", prefix="urlguard-entries-")  # noqa: SIM115
        self.expressions = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", prefix="urlguard-expressions-"
        )
        self.keys = np.zeros(0, dtype=np.int64)  # accepted entries, after resolve()
        self.unit_of = np.zeros(0, dtype=np.int64)
        self.unique_keys = np.zeros(0, dtype=np.int64)  # sorted
        self.refused_units = np.zeros(0, dtype=np.int64)
        # Entries the allowlist refused, expression -> category (AllowlistRefusal).
        self.allowlisted: dict[str, str] = {}
        self.allowlist_digest = ""

    def __len__(self) -> int:
        return len(self.ends)

    def add_lines(
        self,
        lines: Iterable[tuple[int, str]],
        *,
        max_line: int = 0,
        max_units: int = 0,
        refuse: Callable[[int, str, str], None] = lambda lineno, raw, reason: None,
    ) -> None:
        """Stage each numbered line (blank and comment lines are left out before:
        decoding.numbered); a line longer than `max_line` is refused, and more than
        `max_units` lines fail the body."""
        high_of, low_of, ends, units = self.high, self.low, self.ends, self.units
        linenos = self.linenos
        end = self._end
        for lineno, line in lines:
            if max_line and len(line.rstrip("\r\n")) > max_line:
                refuse(lineno, line[:300], f"longer than {max_line:,} characters (FEED_MAX_LINE)")
                continue
            if max_units and len(ends) >= max_units:
                raise FeedError(
                    f"the body lists more than {max_units:,} entries (FEED_MAX_ENTRIES): "
                    "refused, nothing applied"
                )
            data = line.encode("utf-8", "surrogatepass")
            high, low = mmh3.hash64(data, signed=True)
            high_of.append(high)
            low_of.append(low)
            units.write(data)
            end += len(data)
            ends.append(end)
            linenos.append(lineno)
        self._end = end

    def add_entry(self, token: str, category: str, lineno: int, *, max_units: int = 0) -> None:
        self.add_lines(((lineno, token),), max_units=max_units)
        index = self._category_index.get(category)
        if index is None:
            index = self._category_index[category] = len(self.categories)
            self.categories.append(category)
        self.category_of.append(index)

    def _texts(self, indices: np.ndarray, ends: np.ndarray) -> Iterator[tuple[int, str]]:
        """(index, text) of the units `indices` (ascending) names. The spool is read a
        span of units at a time where they lie close together (a first load reads
        all of it in order), one unit at a time where they are scattered."""
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

    def resolve(
        self,
        remembered: memo.Memo | None,
        listed: np.ndarray,
        protected: allowlist.Allowlist,
        result: RefreshResult,
    ) -> None:
        """Find every unit's entries: from the memo where it knows the unit's text and
        this source lists that rule now; by parsing the line (by_line) and
        normalizing the entries (then the allowlist) otherwise."""
        count = len(self)
        self.allowlist_digest = protected.digest()
        high = np.frombuffer(self.high, dtype=np.int64)
        low = np.frombuffer(self.low, dtype=np.int64)
        found = np.zeros(count, dtype=bool)
        known = np.zeros(count, dtype=np.int64)
        if remembered is not None and count:
            found, known = remembered.lookup(high, low)
        # A remembered rule this source no longer lists (a held refresh, a rule
        # deleted by hand) is added again, and adding needs its expression.
        found &= member(known, listed)
        known_units = np.flatnonzero(found)
        known_keys = known[found]
        todo = np.flatnonzero(~found)
        del found, known
        # Entries found here, numbered after the known ones.
        unit_of, keys = array("q"), array("q")
        refused_units = array("q")  # never remembered: their refusals count each time
        base = len(known_keys)
        ends = np.frombuffer(self.ends, dtype=np.int64)
        self.units.flush()
        for index, text in self._texts(todo, ends):
            if self.by_line:
                entries = [
                    (parsed.lineno, parsed.token or "", parsed.category, parsed.error)
                    for parsed in formats.parse_line(
                        self.format, text, self.linenos[index], self.source_category, pending_entry
                    )
                ]
            else:
                category = self.categories[self.category_of[index]]
                entries = [(self.linenos[index], text, category, None)]
            for lineno, token, category, error in entries:
                if error is not None:
                    refuse(result, lineno, text, error)
                    refused_units.append(index)
                    continue
                try:
                    expression = normalize_rule(token)
                except RuleError as exc:
                    refuse(result, lineno, token, str(exc))
                    refused_units.append(index)
                    continue
                reason = protected.refusal(expression)
                if reason is not None:
                    refuse(result, lineno, token, reason)
                    refused_units.append(index)
                    self.allowlisted[expression] = category or self.source_category
                    continue
                self.expressions.write(
                    f"{base + len(keys)}\t{category or self.source_category}\t{expression}\n"
                )
                keys.append(expression_key(expression))
                unit_of.append(index)
        self.keys = np.concatenate((known_keys, np.frombuffer(keys, dtype=np.int64)))
        del known_keys, keys
        self.unit_of = np.concatenate((known_units, np.frombuffer(unit_of, dtype=np.int64)))
        del known_units, unit_of
        self.refused_units = np.frombuffer(refused_units, dtype=np.int64)
        self.unique_keys = sorted_unique(self.keys)
        result.refusals.sort(key=lambda refusal: refusal[0])

    def remember(self, source_id: int, stamp: str) -> None:
        """Save, as the source's memo, the key of every unit that gave one entry."""
        per_unit = np.bincount(self.unit_of, minlength=len(self))
        per_unit[self.refused_units] = 0  # a line that also had a refused entry
        entries = per_unit[self.unit_of] == 1
        del per_unit
        units = self.unit_of[entries]
        # Handed over as temporaries that memo.save alone holds, so it frees each
        # array as it replaces it with the sorted one.
        memo.save(
            source_id,
            stamp,
            np.frombuffer(self.high, dtype=np.int64)[units],
            np.frombuffer(self.low, dtype=np.int64)[units],
            self.keys[entries],
        )

    def forget_units(self) -> None:
        """Free the units' digests and places (what is left to do needs the entries)."""
        self.high, self.low, self.ends = array("q"), array("q"), array("q")

    def count(self) -> int:
        """Distinct accepted entries."""
        return len(self.unique_keys)

    def lines(self, picked: np.ndarray) -> Iterator[tuple[str, str]]:
        """(expression, category) of the entries `picked` marks, which must be among
        those resolve() normalized (an entry new to the source always is)."""
        for _, expression, category in self.entries(picked):
            yield expression, category

    def entries(self, picked: np.ndarray) -> Iterator[tuple[int, str, str]]:
        """(index, expression, category) of the entries `picked` marks (see lines)."""
        self.expressions.flush()
        self.expressions.seek(0)
        for line in self.expressions:
            index, category, expression = line.rstrip("\n").split("\t", 2)
            if picked[int(index)]:
                yield int(index), expression, category

    def close(self) -> None:
        self.units.close()
        self.expressions.close()


# Lines a LINE_FORMATS body may comment out: skipped before they are staged.
_COMMENTS = {"urls": "#", "hosts": "#", "adblock": "!"}


def stage(body: Any, source: Source, result: RefreshResult) -> Staged:
    max_line, max_units = conf.FEED_MAX_LINE, conf.FEED_MAX_ENTRIES
    with open_text(body, limit=conf.FEED_MAX_BYTES, max_line=max_line) as text:
        fmt, stream = formats.sniff(text, source.format)  # type: ignore[arg-type]
        result.format = fmt
        staged = Staged(fmt, source.category)
        try:
            if staged.by_line:
                staged.add_lines(
                    numbered(stream, _COMMENTS.get(fmt, "")),
                    max_line=max_line,
                    max_units=max_units,
                    refuse=lambda lineno, raw, reason: refuse(result, lineno, raw, reason),
                )
            else:
                _, entries = formats.parse(stream, fmt, source.category, make=pending_entry)  # type: ignore[arg-type]
                for parsed in entries:
                    if parsed.error is not None:
                        refuse(result, parsed.lineno, parsed.raw, parsed.error)
                    elif parsed.token is not None:
                        category = parsed.category or source.category
                        staged.add_entry(parsed.token, category, parsed.lineno, max_units=max_units)
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
    return ordered[keep]


def member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values[i] in `pool` (sorted): a binary search each, where np.isin sorts both."""
    inside = np.zeros(len(values), dtype=bool)
    if not len(pool):
        return inside
    for start in range(0, len(values), 1 << 16):  # small temporaries
        part = values[start : start + (1 << 16)]
        at = np.searchsorted(pool, part)
        at[at == len(pool)] = 0
        inside[start : start + len(part)] = pool[at] == part
    return inside
