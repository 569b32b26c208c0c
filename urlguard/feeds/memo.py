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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from filterengine.atomicfile import remove_stale_temps, replacing
from urlguard.conf import conf

__all__ = ["Memo", "load", "save"]

# Raise when a line or an entry can give another expression than before: a change to
# normalize_rule, to a format's parser, or to rulelists.entry_text.
NORMALIZER_VERSION = 3
_SLICE = 1 << 16
#: A memo's temp file not written to for this long is of a save that died (a live
#: save writes to its own all along; it takes seconds for millions of entries).
STALE_TEMP_AGE = 600.0


def path_for(source_id: int) -> Path:
    return Path(conf.DATA_DIR) / "feeds" / f"source-{source_id}.memo.npz"


def stamp(fmt: str, allowlist_digest: str) -> str:
    """What a memo's keys depend on besides the text: the normalizer, the format the
    body was read as (each refuses other lines), the settings normalize_rule reads,
    and the allowlist."""
    return (
        f"normalizer {NORMALIZER_VERSION}; format {fmt}; "
        f"private addresses {conf.ALLOW_PRIVATE_ADDRESS_RULES}; "
        f"allowlist {allowlist_digest}"
    )


@dataclass
class Memo:
    """Digests (high words sorted, low words beside them) and their expression keys."""

    high: np.ndarray
    low: np.ndarray
    keys: np.ndarray

    def __len__(self) -> int:
        return len(self.high)

    def lookup(self, high: np.ndarray, low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found, at) for the digests (high, low): where found[i], the entry at[i]
        (see keys) is the one of that digest."""
        if not len(self.high):
            return np.zeros(len(high), dtype=bool), np.zeros(len(high), dtype=np.int64)
        at = search(self.high, high)
        at[at == len(self.high)] = 0
        found = (self.high[at] == high) & (self.low[at] == low)
        return found, at

    def merged(
        self, kept: np.ndarray, high: np.ndarray, low: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(high, low, keys), sorted, of this memo's entries at the positions `kept`
        and the entries (high, low, keys) besides them (in any order; one whose high
        word a kept entry has is left out): the next memo, without sorting the
        entries that stay."""
        keep = np.zeros(len(self.high), dtype=bool)
        keep[kept] = True
        old_high = self.high[keep]
        high, low, keys = _sorted_unique(high, low, keys)
        if len(old_high):
            at = search(old_high, high)
            at[at == len(old_high)] = 0
            new = old_high[at] != high
            high, low, keys = high[new], low[new], keys[new]
        where = np.searchsorted(old_high, high)
        return (
            np.insert(old_high, where, high),
            np.insert(self.low[keep], where, low),
            np.insert(self.keys[keep], where, keys),
        )


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
            memo = Memo(data["high"], data["low"], data["keys"])
    except Exception:  # missing, empty, cut short, not ours: a cache miss
        return None
    if not (len(memo.high) == len(memo.low) == len(memo.keys)):
        return None
    return memo


def save(
    source_id: int, the_stamp: str, high: np.ndarray, low: np.ndarray, keys: np.ndarray
) -> None:
    """Replace the memo with these digests and keys (in any order)."""
    write(source_id, the_stamp, *_sorted_unique(high, low, keys))


def write(
    source_id: int, the_stamp: str, high: np.ndarray, low: np.ndarray, keys: np.ndarray
) -> None:
    """Replace the memo with these digests (sorted, high words distinct) and keys
    (written aside, then renamed; the temp files of saves that died are removed first)."""
    path = path_for(source_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_temps(path, older_than=STALE_TEMP_AGE)
    with replacing(path) as out:
        np.savez(out, stamp=np.str_(the_stamp), high=high, low=low, keys=keys)


def forget(source_id: int) -> None:
    with contextlib.suppress(OSError):
        path_for(source_id).unlink()
