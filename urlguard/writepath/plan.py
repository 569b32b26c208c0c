"""A listing plan: what one source should list after a refresh, handed to the write
path as data only. The entries to list (an entry file on disk and arrays, never a
feed-sized list in memory), the keys of the listings to withdraw, the figures the change set counts,
and the allowlist the entries were screened against. Whoever made the plan
(urlguard.feeds) has already diffed, screened and held what needed holding;
urlguard.writepath.apply writes it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import IO

import numpy as np

from urlguard.models import ChangeSet, Source, expression_key

__all__ = [
    "Additions",
    "ChangePlan",
    "Entries",
    "KeyFile",
    "ListingPlan",
    "entry_lines",
    "read_entries",
]

# What a read of an entry file takes at once (bytes).
_READ = 1 << 23


def entry_lines(categories: Iterable[str], expressions: Iterable[str]) -> str:
    """Entries as an entry file holds them: "category<TAB>expression<LF>" each (a
    canonical expression and a category hold no tab or line end)."""
    return "".join([f"{c}\t{e}\n" for c, e in zip(categories, expressions, strict=True)])


class KeyFile:
    """An entry file's keys in a binary file of their own (little-endian int64s, by
    number from 0), read a block at a time: a first load's keys are 8 bytes an entry,
    80 MB at ten million."""

    def __init__(self, file: IO[bytes], length: int) -> None:
        self.file, self.length = file, length

    def __len__(self) -> int:
        return self.length

    def between(self, start: int, stop: int) -> np.ndarray:
        self.file.flush()
        self.file.seek(8 * start)
        return np.fromfile(self.file, dtype="<i8", count=max(0, min(stop, self.length) - start))


def _keys_between(keys: np.ndarray | KeyFile, start: int, stop: int) -> np.ndarray:
    return keys.between(start, stop) if isinstance(keys, KeyFile) else keys[start:stop]


def read_entries(
    file: IO[str],
    first: int,
    keys: np.ndarray | KeyFile,
    picked: np.ndarray,
    *,
    whole_hosts: bool = False,
) -> Iterator[tuple[int, str, str, int]]:
    """(number, expression, category, key) of the entries of an entry `file` (its
    lines the entries numbered `first`, `first` + 1, ...) that `picked` marks (by
    number), their keys from `keys` (by number): read a block of lines at a time,
    only the lines picked split. `whole_hosts`: only whole-host expressions ("host/")."""
    file.flush()
    file.seek(0)
    number = first
    while lines := file.readlines(_READ):
        chosen = np.flatnonzero(picked[number : number + len(lines)])
        if whole_hosts:  # a whole-host expression ends its line with its only "/"
            ends = [lines[at].endswith("/\n") for at in chosen.tolist()]
            chosen = chosen[np.array(ends, dtype=bool)] if ends else chosen
        if len(chosen):
            chosen_keys = _keys_between(keys, number, number + len(lines))[chosen].tolist()
            for at, key in zip(chosen.tolist(), chosen_keys, strict=True):
                category, expression = lines[at].rstrip("\n").split("\t", 1)
                if whole_hosts and expression.find("/") != len(expression) - 1:
                    continue
                yield number + at, expression, category, key
        number += len(lines)


@dataclass
class Additions:
    """The entries to list: those `picked` marks of an entry file (entry_lines; its
    lines the entries numbered `first` on), with their keys, `keys` (by number, in
    memory or a KeyFile). Distinct normalized rule expressions, none of which the
    source lists yet."""

    file: IO[str]
    first: int
    keys: np.ndarray | KeyFile
    picked: np.ndarray
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = int(np.count_nonzero(self.picked))

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str, int]]) -> Additions:
        """An entry file of its own holding `rows` ((expression, category, key) each),
        all of them picked."""
        file = tempfile.TemporaryFile("w+", encoding="utf-8", prefix="urlguard-additions-")  # noqa: SIM115
        keys: list[int] = []
        iterator = iter(rows)
        while block := list(islice(iterator, 1 << 14)):
            file.write(entry_lines((c for _, c, _ in block), (e for e, _, _ in block)))
            keys.extend(key for _, _, key in block)
        picked = np.ones(len(keys), dtype=bool)
        return cls(file, 0, np.array(keys, dtype=np.int64), picked)

    def rows(self) -> Iterator[tuple[str, str, int]]:
        """(expression, category, key) of each entry to list, in number order."""
        for _, expression, category, key in read_entries(
            self.file, self.first, self.keys, self.picked
        ):
            yield expression, category, key

    def close(self) -> None:
        self.file.close()


@dataclass
class ListingPlan:
    """What `source` lists after the apply: it gains `additions` and loses its
    listings of `withdrawals` (keys, sorted); a rule goes only when no source lists
    it any more. `listed`: how many it listed when the plan was made; `refused`: the
    entries refused while planning (the change set counts them); `allowlist_digest`:
    the allowlist the additions were screened against (a host allowlisted since is
    refused by the apply)."""

    source: Source
    reason: str
    additions: Additions
    withdrawals: np.ndarray
    listed: int
    refused: int = 0
    allowlist_digest: str = ""
    kind: str = ChangeSet.Kind.REFRESH


# A note's characters that would end its field or line in an entry file, escaped.
_NOTE_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NOTE_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def _unescape(note: str) -> str:
    if "\\" not in note:
        return note
    out, at = [], 0
    while (slash := note.find("\\", at)) >= 0:
        out.append(note[at:slash])
        out.append(_NOTE_UNESCAPES.get(note[slash + 1 : slash + 2], ""))
        at = slash + 2
    out.append(note[at:])
    return "".join(out)


@dataclass
class Entries:
    """Rules to list with their provenance, written outside a refresh (an import's,
    a revert's restorations): `label` names who lists them (the rule's and its log
    row's source; the Source of that name, or the manual source its part before ':'
    names, lists them), and each entry (expression, category, note) is a line of an
    entry file on disk with its key, never a list in memory. `picked`: the first
    entry of each key, so a normalized expression is listed once."""

    label: str
    file: IO[str]
    keys: np.ndarray
    picked: np.ndarray

    @property
    def count(self) -> int:
        """How many entries are to be listed."""
        return int(np.count_nonzero(self.picked))

    @classmethod
    def of(cls, label: str, rows: Iterable[tuple[str, str, str]]) -> Entries:
        """`rows` ((expression, category, note) each, normalized expressions) in an
        entry file of their own; an expression repeated is listed at its first row."""
        file = tempfile.TemporaryFile("w+", encoding="utf-8", prefix="urlguard-entries-")  # noqa: SIM115
        parts: list[np.ndarray] = []
        iterator = iter(rows)
        try:
            while block := list(islice(iterator, 1 << 14)):
                lines = [f"{c}\t{e}\t{n.translate(_NOTE_ESCAPES)}\n" for e, c, n in block]
                file.write("".join(lines))
                parts.append(np.array([expression_key(e) for e, _, _ in block], dtype=np.int64))
        except BaseException:
            file.close()
            raise
        keys = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        picked = np.zeros(len(keys), dtype=bool)
        picked[np.unique(keys, return_index=True)[1]] = True
        return cls(label, file, keys, picked)

    def rows(self) -> Iterator[tuple[str, str, int, str]]:
        """(expression, category, key, note) of each entry to list, in file order."""
        self.file.flush()
        self.file.seek(0)
        number = 0
        while lines := self.file.readlines(_READ):
            chosen = np.flatnonzero(self.picked[number : number + len(lines)]).tolist()
            keys = self.keys[number : number + len(lines)].tolist()
            for at in chosen:
                category, expression, note = lines[at].rstrip("\n").split("\t", 2)
                yield expression, category, keys[at], _unescape(note)
            number += len(lines)

    def close(self) -> None:
        self.file.close()


@dataclass
class ChangePlan:
    """Rules written outside a refresh, in one change set of `kind`: an import's
    (entries to list) or a revert's (rules to take away, then entries to restore).
    `withdrawals`: ids of rules `withdraw_from` no longer lists (removed when no
    source lists them any more); with no `withdraw_from`, removed outright, logged
    under `withdraw_label`. `refused`: the entries refused while planning (the
    change set counts them). `chunk_size`: rules per transaction, if the caller
    must have its own (otherwise the apply's, the bulk loader's on PostgreSQL)."""

    kind: str
    additions: list[Entries] = field(default_factory=list)
    withdrawals: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    withdraw_from: Source | None = None
    withdraw_label: str = "admin"
    refused: int = 0
    reason: str = ""
    chunk_size: int | None = None

    @property
    def total(self) -> int:
        return len(self.withdrawals) + sum(entries.count for entries in self.additions)

    def close(self) -> None:
        for entries in self.additions:
            entries.close()
