"""The guard's memory of canonical URLs the spam table confirmed clean after a filter
false positive, so that a popular false positive costs one query, not one per visit."""

from __future__ import annotations

import threading
from typing import Protocol

from cachetools import LRUCache

__all__ = ["CleanCache", "LRUCleanCache"]


class CleanCache(Protocol):
    """Canonical URLs the table confirmed clean after a filter false positive.

    It must never claim a URL it was not given (that would pass a listed URL);
    forgetting one is harmless (one more query). LRUCleanCache is the default;
    an OppositeBloomFilter has exactly these semantics and may replace it.
    """

    def __contains__(self, key: str) -> bool: ...
    def add(self, key: str) -> None: ...
    def clear(self) -> None: ...


class LRUCleanCache:
    """A bounded, thread-safe LRU set (runserver and async servers use threads)."""

    __slots__ = ("_data", "_lock")

    def __init__(self, maxsize: int = 10_000) -> None:
        self._data: LRUCache[str, bool] = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        with self._lock:
            # .get() refreshes the LRU position, so a popular URL stays cached.
            return self._data.get(key, False)

    def add(self, key: str) -> None:
        with self._lock:
            self._data[key] = True

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
