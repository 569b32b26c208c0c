"""RCS-format differences (`diff -n`) between two renders of one export: the
differential patches of the ABP list (`! Diff-Path:`). Both renders list their lines
in the same order (the rules' order in the table), so a line present in both keeps
its place: one pass over each file, with 64-bit line hashes, never both files in
memory as text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mmh3
import numpy as np

__all__ = ["apply", "diff"]


def _hashes(path: Path) -> np.ndarray:
    with path.open("rb") as f:
        return np.fromiter((mmh3.hash64(line, signed=True)[0] for line in f), dtype=np.int64)


def diff(old: Path, new: Path) -> Iterator[bytes]:
    """The RCS commands that turn `old` into `new` (`dN M`: delete M lines from old
    line N; `aN M` and M lines: add them after old line N; ascending)."""
    a_array, b_array = _hashes(old), _hashes(new)
    b_in_a = np.isin(b_array, a_array).tolist()
    a, b = a_array.tolist(), b_array.tolist()
    i = 0
    adds: list[bytes] = []
    with new.open("rb") as lines:
        for j, line in enumerate(lines):
            if not b_in_a[j]:
                adds.append(line)
                continue
            start = i
            while i < len(a) and a[i] != b[j]:
                i += 1
            if i == len(a):
                raise ValueError(f"{old} and {new} list their lines in another order")
            yield from _hunk(start, i, adds)
            adds = []
            i += 1
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
