"""A persistent (immutable, structurally shared) Bloom filter after Bryce Nyeggen's
design: every version stays readable, and a new version costs only the blocks an
insert touched plus the tree nodes above them.

The bit array is cut into fixed-size blocks held at the leaves of a tree of fan-out
FANOUT. `add` copies the leaves whose bits change and the nodes on their paths;
every other node is shared, by identity, with the previous version. A transient
(batch) mode mutates in place the nodes it created itself, as Clojure's transients
do, so a batch of n keys copies each touched block once, not n times."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from filterengine.hashing import MASK64, hash_pair, plan_slices
from filterengine.opposite import KeyLike
from filterengine.opposite import _to_bytes as _key_bytes

__all__ = ["BLOCK_BYTES", "FANOUT", "PersistentBloomFilter", "TransientBloomFilter", "diff"]

# Chosen by measurement (bench/variants.py, "Persistent filter shape", CPU time, one
# add per version, every version kept). In CPython a node copy is one C-level list
# or bytearray copy, so the cost of an add is mostly the Python work per tree level:
# fewer levels win, and wide nodes are cheap (the original's 8 was tuned for the
# JVM). 1 KiB blocks add ~10% speed but double the bytes per version (k blocks are
# copied per add); 64-byte blocks save ~10% memory for ~15% speed. 32 x 256 B:
# 75k adds/s and 3.9 KB/version at capacity 100k (best 81k, 3.3 KB), 57k and
# 5.3 KB at 1M (best 70k, 4.2 KB).
FANOUT = 32
BLOCK_BYTES = 256


class _Node:
    __slots__ = ("children", "owner")

    # Children are _Node above the last level and _Leaf on it: typed Any so the
    # descent loops need no casts.
    def __init__(self, children: list[Any], owner: object) -> None:
        self.children = children
        self.owner = owner


class _Leaf:
    __slots__ = ("bits", "owner")

    def __init__(self, bits: bytearray, owner: object) -> None:
        self.bits = bits
        self.owner = owner


class _Shape:
    """The geometry shared, unchanged, by every version of one filter."""

    __slots__ = (
        "block_bits",
        "block_bytes",
        "block_shift",
        "blocks",
        "cells",
        "depth",
        "fanout",
        "fanout_shift",
        "k",
        "level_shifts",
        "offsets",
    )

    def __init__(self, capacity: int, error_rate: float, fanout: int, block_bytes: int) -> None:
        for name, value in (("fanout", fanout), ("block_bytes", block_bytes)):
            if value < 2 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 2, got {value}")
        self.k, self.cells = plan_slices(capacity, error_rate)
        self.offsets = [(i, i * self.cells) for i in range(self.k)]
        self.fanout, self.block_bytes = fanout, block_bytes
        self.fanout_shift = fanout.bit_length() - 1
        self.block_bits = block_bytes * 8
        self.block_shift = self.block_bits.bit_length() - 1
        total_bits = self.k * self.cells
        self.blocks = -(-total_bits // self.block_bits)
        depth = 1
        while fanout**depth < self.blocks:
            depth += 1
        self.depth = depth
        #: Shift of a block number for each level's child slot, root first.
        self.level_shifts = tuple(level * self.fanout_shift for level in range(depth - 1, -1, -1))

    def bits_of(self, key: KeyLike) -> list[int]:
        h1, h2 = hash_pair(_key_bytes(key))
        cells = self.cells
        return [base + ((h1 + i * h2) & MASK64) % cells for i, base in self.offsets]


def _empty_tree(shape: _Shape) -> _Node:
    # One shared zero leaf and one shared node per level: an empty filter of any
    # size costs a few objects, and real blocks appear only where bits are set.
    node = _Node([_Leaf(bytearray(shape.block_bytes), None)] * shape.fanout, None)
    for _ in range(shape.depth - 1):
        node = _Node([node] * shape.fanout, None)
    return node


def _set_bits(root: _Node, shape: _Shape, bits: list[int], owner: object) -> tuple[_Node, bool]:
    """Set `bits` under `root`, copying every node not owned by `owner` on the way.
    Returns the (possibly new) root and whether any bit changed. Nothing is copied
    for bits that are already set."""
    changed = False
    depth, fshift, fmask = shape.depth, shape.fanout_shift, shape.fanout - 1
    bshift, bmask = shape.block_shift, shape.block_bits - 1
    for bit in bits:
        block = bit >> bshift
        offset = bit & bmask
        byte, flag = offset >> 3, 1 << (offset & 7)
        # Read-only descent first: an already-set bit costs no copy at all.
        node: Any = root
        for level in range(depth - 1, -1, -1):
            node = node.children[(block >> (level * fshift)) & fmask]
        if node.bits[byte] & flag:
            continue
        changed = True
        if root.owner is not owner:
            root = _Node(root.children.copy(), owner)
        parent = root
        for level in range(depth - 1, 0, -1):
            slot = (block >> (level * fshift)) & fmask
            child = parent.children[slot]
            if child.owner is not owner:
                child = _Node(child.children.copy(), owner)
                parent.children[slot] = child
            parent = child
        slot = block & fmask
        leaf = parent.children[slot]
        if leaf.owner is not owner:
            leaf = _Leaf(bytearray(leaf.bits), owner)
            parent.children[slot] = leaf
        leaf.bits[byte] |= flag
    return root, changed


class PersistentBloomFilter:
    """An immutable Bloom filter: `add` and `add_many` return a new version and leave
    this one unchanged. Versions of one filter share every block neither touched."""

    __slots__ = ("_root", "_shape", "capacity", "count", "error_rate")

    def __init__(
        self,
        capacity: int,
        error_rate: float,
        *,
        fanout: int = FANOUT,
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        self._shape = _Shape(capacity, error_rate, fanout, block_bytes)
        self.capacity, self.error_rate = capacity, error_rate
        self._root = _empty_tree(self._shape)
        #: Keys added that set at least one new bit (a key already "present" is not counted).
        self.count = 0

    @classmethod
    def _version(
        cls, parent: PersistentBloomFilter, root: _Node, count: int
    ) -> PersistentBloomFilter:
        new = cls.__new__(cls)
        new._shape, new.capacity, new.error_rate = parent._shape, parent.capacity, parent.error_rate
        new._root, new.count = root, count
        return new

    def add(self, key: KeyLike) -> PersistentBloomFilter:
        """A new version that contains `key` (this one if the key's bits were all set)."""
        # A fresh owner token: nothing of an older version is owned by it, so every
        # node this add touches is copied, and the new nodes stay private to it.
        root, changed = _set_bits(self._root, self._shape, self._shape.bits_of(key), object())
        if not changed:
            return self
        return self._version(self, root, self.count + 1)

    def add_many(self, keys: Iterable[KeyLike]) -> PersistentBloomFilter:
        """One new version with every key added; each touched block is copied once."""
        transient = self.transient()
        for key in keys:
            transient.add(key)
        return transient.persistent()

    def transient(self) -> TransientBloomFilter:
        """A mutable builder starting from this version (which it never changes)."""
        return TransientBloomFilter(self)

    def contains(self, key: KeyLike) -> bool:
        shape = self._shape
        shifts, fmask = shape.level_shifts, shape.fanout - 1
        bshift, bmask = shape.block_shift, shape.block_bits - 1
        root = self._root
        for bit in shape.bits_of(key):
            block = bit >> bshift
            node: Any = root
            for shift in shifts:
                node = node.children[(block >> shift) & fmask]
            offset = bit & bmask
            if not node.bits[offset >> 3] & (1 << (offset & 7)):
                return False
        return True

    __contains__ = contains

    def blocks(self) -> list[bytes | bytearray]:
        """The bit array's blocks in order (shared objects: treat as read-only)."""
        out: list[bytes | bytearray] = []

        def walk(node: Any, level: int) -> None:
            if level == 0:
                out.append(node.bits)
            else:
                for child in node.children:
                    walk(child, level - 1)

        walk(self._root, self._shape.depth)
        return out[: self._shape.blocks]

    def to_bytes(self) -> bytes:
        """The whole bit array (slice after slice), e.g. to compare with a flat filter."""
        return b"".join(bytes(b) for b in self.blocks())

    def diff(self, other: PersistentBloomFilter) -> list[int]:
        return diff(self, other)

    def is_compatible(self, other: PersistentBloomFilter) -> bool:
        a, b = self._shape, other._shape
        return (a is b) or (
            (a.k, a.cells, a.fanout, a.block_bytes) == (b.k, b.cells, b.fanout, b.block_bytes)
        )

    def info(self) -> dict[str, int]:
        s = self._shape
        return {
            "k": s.k,
            "cells_per_slice": s.cells,
            "blocks": s.blocks,
            "depth": s.depth,
            "fanout": s.fanout,
            "block_bytes": s.block_bytes,
            "count": self.count,
        }

    def __repr__(self) -> str:
        return (
            f"PersistentBloomFilter(capacity={self.capacity}, error_rate={self.error_rate}, "
            f"count={self.count})"
        )


class TransientBloomFilter:
    """Batch mode: adds mutate, in place, the nodes this builder has copied; nodes
    it does not own (shared with the source version) are copied on first touch.
    `persistent()` seals the builder and returns the new immutable version."""

    __slots__ = ("_count", "_owner", "_root", "_source")

    def __init__(self, source: PersistentBloomFilter) -> None:
        self._source = source
        self._root = source._root
        self._count = source.count
        self._owner: object | None = object()

    def add(self, key: KeyLike) -> bool:
        """Add `key`; True if any bit changed."""
        if self._owner is None:
            raise RuntimeError("this transient was sealed by persistent(); start a new one")
        shape = self._source._shape
        self._root, changed = _set_bits(self._root, shape, shape.bits_of(key), self._owner)
        self._count += changed
        return changed

    def persistent(self) -> PersistentBloomFilter:
        # Dropping the owner token seals every node this builder made: later
        # versions cannot own them, so they will copy before writing.
        self._owner = None
        if self._root is self._source._root:
            return self._source
        return PersistentBloomFilter._version(self._source, self._root, self._count)


def diff(a: PersistentBloomFilter, b: PersistentBloomFilter) -> list[int]:
    """Indices of the blocks whose bits differ between `a` and `b`. Shared subtrees
    are skipped by identity, so diffing two close versions costs O(changes·depth)."""
    if not a.is_compatible(b):
        raise ValueError(f"cannot diff filters of different shapes: {a.info()} and {b.info()}")
    shape = a._shape
    fshift = shape.fanout_shift
    out: list[int] = []

    def walk(x: Any, y: Any, level: int, base: int) -> None:
        if x is y:
            return
        if level == 0:
            if x.bits != y.bits:
                out.append(base)
            return
        for i, (cx, cy) in enumerate(zip(x.children, y.children, strict=True)):
            walk(cx, cy, level - 1, (base << fshift) | i)

    walk(a._root, b._root, shape.depth, 0)
    return [i for i in out if i < shape.blocks]
