"""A listing plan: what one source should list after a refresh, handed to the write
path as data only. The entries to list (on disk, never a feed-sized list in
memory), the keys of the listings to withdraw, the figures the change set counts,
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

from urlguard.models import ChangeSet, Source

__all__ = ["Additions", "ListingPlan"]

# What a read of the additions takes at once (bytes), and a write (rows).
_READ = 1 << 22
_BLOCK = 1 << 14


def _spool() -> IO[str]:
    return tempfile.TemporaryFile("w+", encoding="utf-8", prefix="urlguard-additions-")


@dataclass
class Additions:
    """Entries to list, (expression, category, expression_key) each, one line of a
    file each in the order written: distinct normalized rule expressions (a canonical
    expression and a category hold no tab or line end)."""

    file: IO[str] = field(default_factory=_spool)
    count: int = 0

    def write(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Append `rows`, a block at a time."""
        iterator = iter(rows)
        while block := list(islice(iterator, _BLOCK)):
            self.file.write("".join([f"{e}\t{category}\t{key}\n" for e, category, key in block]))
            self.count += len(block)

    def rows(self) -> Iterator[tuple[str, str, int]]:
        """The entries, from the first, read a block of lines at a time."""
        self.file.flush()
        self.file.seek(0)
        while lines := self.file.readlines(_READ):
            for line in lines:
                expression, category, key = line.rstrip("\n").split("\t")
                yield expression, category, int(key)

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
