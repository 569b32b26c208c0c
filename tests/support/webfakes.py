"""Test doubles for the guard's filter (shared by the WEB tests): a filter that
answers from a set, one that says "maybe" to everything (a forced false
positive), and one that fails like a corrupt file."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class SetFilter:
    """Answers like a Bloom filter with no false positives (or, with
    `everything=True`, like one that is all false positives)."""

    def __init__(self, keys: Iterable[str] = (), *, everything: bool = False) -> None:
        self.keys = set(keys)
        self.everything = everything
        self.applied_seq = 0
        self.generation = 1
        self.calls = 0
        self.path = "<memory>"

    def contains_many(self, keys):
        self.calls += 1
        return np.fromiter(
            (self.everything or k in self.keys for k in keys), dtype=bool, count=len(keys)
        )

    def contains(self, key: str) -> bool:
        self.calls += 1
        return self.everything or key in self.keys

    def add(self, key: str) -> None:
        self.keys.add(key)
        self.applied_seq += 1


class BrokenFilter:
    applied_seq = 0
    generation = 1

    def contains_many(self, keys):
        raise OSError("simulated: the mapped file went away")

    contains = contains_many
