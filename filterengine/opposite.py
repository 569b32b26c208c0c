"""The opposite of a Bloom filter (Jeff Hodges): a bounded, lossy "have I seen this
key recently?" set that may answer "not seen" wrongly but never "seen" wrongly.

Use it to drop close duplicates (a click already recorded, a URL already confirmed
clean) where forgetting is cheap and a false "seen" would lose data."""

from __future__ import annotations

import threading
from collections.abc import Callable

import mmh3

__all__ = ["MAX_SIZE", "OppositeBloomFilter"]

#: Largest slot count, as in the original (1 << 30 slots of 8-byte pointers is 8 GiB).
MAX_SIZE = 1 << 30

KeyLike = str | bytes | bytearray | memoryview


#: Signed 32-bit murmur3, seed 0 (the builtin itself: no Python frame per call);
#: `& mask` on a negative Python int keeps the low bits, as in two's complement.
_default_hash: Callable[[str | bytes], int] = mmh3.hash


def _to_bytes(key: KeyLike) -> bytes:
    if isinstance(key, bytes):
        return key  # already immutable: storing it cannot be changed by the caller
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytearray, memoryview)):
        # Copy: the Go original stored the caller's slice, so mutating it later
        # changed the stored key and produced a false "seen".
        return bytes(key)
    raise TypeError(f"key must be str or bytes-like, not {type(key).__name__}")


def _stored_form(key: KeyLike) -> str | bytes:
    """What a slot stores for `key` (see contains_and_add)."""
    if type(key) is str and key.isascii():
        return key
    return _to_bytes(key)


class OppositeBloomFilter:
    """`size` slots (rounded up to a power of two), each holding the last key
    hashed to it. A key is "seen" only if its slot still holds that exact key.

    `hash_func` receives the key as ASCII str or as bytes and must hash text and
    its UTF-8 bytes alike (mmh3 does); the slot is its result & (size - 1)."""

    __slots__ = ("_acquire", "_hash", "_lock", "_mask", "_release", "_slots")

    def __init__(self, size: int, hash_func: Callable[[str | bytes], int] | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int, not {type(size).__name__}")
        if size <= 0:
            raise ValueError(f"size must be at least 1, got {size}")
        if size > MAX_SIZE:
            raise ValueError(f"size must be at most 2**30 ({MAX_SIZE}), got {size}")
        size = 1 << (size - 1).bit_length()
        self._mask = size - 1
        # None marks an empty slot; it never equals any key, including b"" (the
        # Go original's nil slice equalled an empty id: a false "seen").
        self._slots: list[str | bytes | None] = [None] * size
        self._hash = hash_func or _default_hash
        # Swap-and-compare must be one step: two threads racing on a slot would
        # otherwise both read the old key (harmless) or interleave arbitrarily.
        self._lock = threading.Lock()
        # Bound once: `with lock:` costs twice as much as these two calls.
        self._acquire, self._release = self._lock.acquire, self._lock.release

    @property
    def size(self) -> int:
        """Number of slots (a power of two)."""
        return self._mask + 1

    def __len__(self) -> int:
        return self._mask + 1

    def contains_and_add(self, key: KeyLike) -> bool:
        """Store `key`; return True only if it was already the key in its slot."""
        # The hot path: common key types inline, the rest through _to_bytes.
        # ASCII str (URLs) is hashed and stored as is: it is immutable, and mmh3
        # hashes it as its UTF-8 bytes. Other str is encoded first, because mmh3
        # crashes the interpreter on a lone surrogate.
        data: str | bytes
        if type(key) is str:
            data = key if key.isascii() else key.encode()
        elif type(key) is bytes:
            data = key
        else:
            data = _to_bytes(key)
        index = self._hash(data) & self._mask
        slots = self._slots
        self._acquire()
        try:
            old = slots[index]
            slots[index] = data
        finally:
            self._release()
        # An empty slot holds None, and None == b"" is False. A str never equals
        # bytes: the same text given once as str and once as bytes may be "not
        # seen", a false negative, which this structure always allows.
        return old == data

    def contains(self, key: KeyLike) -> bool:
        """True only if `key` is the key stored in its slot (nothing is written)."""
        data: str | bytes
        if type(key) is str:
            data = key if key.isascii() else key.encode()
        elif type(key) is bytes:
            data = key
        else:
            data = _to_bytes(key)
        # A single list read is atomic under the GIL; the stored value is immutable.
        return self._slots[self._hash(data) & self._mask] == data

    __contains__ = contains

    def add(self, key: KeyLike) -> None:
        """Store `key` in its slot, evicting whatever was there."""
        data = _stored_form(key)
        index = self._hash(data) & self._mask
        with self._lock:
            self._slots[index] = data

    def discard(self, key: KeyLike) -> None:
        """Forget `key` if its slot holds it (a false "not seen" is always allowed)."""
        data = _stored_form(key)
        index = self._hash(data) & self._mask
        with self._lock:
            if self._slots[index] == data:
                self._slots[index] = None

    def clear(self) -> None:
        """Forget everything (e.g. after a blocklist change invalidates cached answers)."""
        with self._lock:
            self._slots = [None] * (self._mask + 1)

    def __repr__(self) -> str:
        return f"OppositeBloomFilter(size={self._mask + 1})"
