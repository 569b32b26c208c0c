"""RCS-format differences (`diff -n`) between two renders of one export: the
differential patches of the ABP list (`! Diff-Path:`). Both renders list their lines
in the same order (the rules' order in the table), so a line present in both keeps
its place: one pass over each file with 64-bit line hashes (no longest common
subsequence), never both files in memory as text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["apply", "diff"]


def _hashes(path: Path) -> np.ndarray:
    # Python's own 64-bit hash: compared only within this process, and ~5x cheaper
    # per line than a call into mmh3.
    with path.open("rb") as f:
        return np.fromiter((hash(line) for line in f), dtype=np.int64)


def _positions(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """For each of `values`, its first index in `pool`, or -1 (a binary search of the
    sorted pool; np.isin takes seconds on a million 64-bit values)."""
    if not len(pool):
        return np.full(len(values), -1, dtype=np.int64)
    order = np.argsort(pool, kind="stable")
    ordered = pool[order]
    at = np.minimum(np.searchsorted(ordered, values), len(pool) - 1)
    return np.where(ordered[at] == values, order[at], -1)


def diff(old: Path, new: Path) -> Iterator[bytes]:
    """The RCS commands that turn `old` into `new` (`dN M`: delete M lines from old
    line N; `aN M` and M lines: add them after old line N; ascending). Lines in the
    same order in both are kept; any other is deleted and added (always correct, and
    small when, as for two renders of one list, the order is the same)."""
    a = _hashes(old)
    positions = _positions(_hashes(new), a).tolist()
    i = 0  # lines of old consumed
    adds: list[bytes] = []
    with new.open("rb") as lines:
        for j, line in enumerate(lines):
            at = positions[j]
            if at < i:
                adds.append(line)
                continue
            yield from _hunk(i, at, adds)
            adds = []
            i = at + 1
    yield from _hunk(i, len(a), adds)


def _hunk(start: int, end: int, adds: list[bytes]) -> Iterator[bytes]:
    if end > start:
        yield b"d%d %d\n" % (start + 1, end - start)
    if adds:
        yield b"a%d %d\n" % (end, len(adds))
        yield from adds


def apply(old: list[str], patch: str) -> list[str]:
    """`old` (lines) with an RCS patch applied, as a filter-list client does."""
    out: list[str] = []
    done = 0  # lines of old consumed
    lines = patch.splitlines()
    k = 0
    while k < len(lines):
        op, _, count = lines[k][1:].partition(" ")
        at, n = int(op), int(count)
        kind = lines[k][0]
        k += 1
        if kind == "d":
            out.extend(old[done : at - 1])
            done = at - 1 + n
        elif kind == "a":
            out.extend(old[done:at])
            done = max(done, at)
            out.extend(lines[k : k + n])
            k += n
        else:
            raise ValueError(f"not an RCS command: {lines[k - 1]!r}")
    out.extend(old[done:])
    return out
